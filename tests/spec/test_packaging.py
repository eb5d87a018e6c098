"""pyproject.toml lists zsim's packages by hand (the hardware profiles install from the
top-level hardware_profiles/ folder as zsim.hardware_profiles): the list must name every
package under zsim/, or an installed zsim misses it."""

from __future__ import annotations

from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # Python >= 3.11

REPO = Path(__file__).resolve().parents[2]


def test_every_package_under_zsim_is_listed() -> None:
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    on_disk = {".".join(p.parent.relative_to(REPO).parts)
               for p in (REPO / "zsim").rglob("__init__.py")}
    assert set(config["packages"]) == on_disk | {"zsim.hardware_profiles"}
    assert config["package-dir"] == {"zsim.hardware_profiles": "hardware_profiles"}
    assert (REPO / "hardware_profiles" / "__init__.py").is_file()
