"""Fixtures for scenario tests: a small scenario as the parsed-YAML dict, with an inline
2-layer model so that loading and simulating it takes milliseconds."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

TINY_MODEL: dict[str, Any] = {
    "name": "tiny", "num_layers": 2, "d_model": 256, "num_heads": 4, "num_kv_heads": 4,
    "ffn_hidden": 512, "vocab_size": 1000, "max_seq_len": 512}


@pytest.fixture
def toy() -> dict[str, Any]:
    """Two plans on 16 GPUs (2 nodes) of dgx-h100, no sweep."""
    return {"name": "toy", "model": dict(TINY_MODEL), "hardware": "dgx-h100", "gpus": 16,
            "plans": {"fsdp": {"strategy": "fsdp"},
                      "hsdp": {"strategy": "hsdp", "shard_group": 8}}}


@pytest.fixture
def write(tmp_path: Path):  # type: ignore[no-untyped-def]
    """write(data) -> path of a scenario YAML holding `data` (or `data` itself if a str)."""
    def _write(data: dict[str, Any] | str, name: str = "scenario.yaml") -> Path:
        path = tmp_path / name
        path.write_text(data if isinstance(data, str) else yaml.safe_dump(data, sort_keys=False))
        return path
    return _write
