"""Fixtures for sweep tests: a 96-run scenario of a 4-layer model on dgx-h100 (four
programs x gpus x micro-batch x recomputation x unit size; micro-batch 4000 does not fit,
so a third of the runs come from the closed form), written under tmp_path."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

SWEEP: dict[str, Any] = {
    "name": "grid",
    "model": {"name": "tiny", "num_layers": 4, "d_model": 256, "num_heads": 4,
              "num_kv_heads": 4, "ffn_hidden": 512, "vocab_size": 1000, "max_seq_len": 512},
    "hardware": "dgx-h100",
    "plans": {"fsdp": {"strategy": "fsdp"}, "zero3": {"strategy": "zero3"},
              "ddp": {"strategy": "ddp"}, "hsdp": {"strategy": "hsdp", "shard_group": 8}},
    "sweep": {"gpus": [16, 32], "micro_batch": [1, 2, 4000], "recompute": ["none", "full"],
              "unit_size": [1, 2]},
    "report": {"memory_curves": ["fsdp gpus=16 micro_batch=1 recompute=none unit_size=1",
                                 "zero3 gpus=32 micro_batch=2 recompute=full unit_size=2"]},
}


@pytest.fixture
def grid_path(tmp_path: Path) -> Path:
    path = tmp_path / "grid.yaml"
    path.write_text(yaml.safe_dump(SWEEP, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def module_grid_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The grid scenario written once for a module (whose tests share a run of it)."""
    path = tmp_path_factory.mktemp("grid") / "grid.yaml"
    path.write_text(yaml.safe_dump(SWEEP, sort_keys=False))
    return path
