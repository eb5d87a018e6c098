"""`zsim plan --model 13b --gpus 128 --hardware <profile>` runs end to end on each of the
profiles of issue 39 (dgx-b200, gb200-nvl72, mi300x)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from zsim.cli import app


@pytest.mark.parametrize("name", ["dgx-b200", "gb200-nvl72", "mi300x"])
def test_plan_13b_on_128_gpus(name: str) -> None:
    result = CliRunner().invoke(app, ["plan", "--model", "13b", "--gpus", "128",
                                      "--hardware", name])
    assert result.exit_code == 0, result.output
    assert f"x {name} (" in result.output
    assert "recommended" in result.output.lower()
