"""Fixtures for report tests: a toy scenario (inline 2-layer model, dgx-h100, three plans,
one of them out of memory) written under tmp_path, and its simulated runs."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from zsim.result import Result
from zsim.scenario import Run, load_scenario, simulate_runs

TOY: dict[str, Any] = {
    "name": "toy",
    "description": "A 2-layer model on 16 H100s.",
    "model": {"name": "tiny", "num_layers": 2, "d_model": 256, "num_heads": 4,
              "num_kv_heads": 4, "ffn_hidden": 512, "vocab_size": 1000, "max_seq_len": 512},
    "hardware": "dgx-h100",
    "gpus": 16,
    "plans": {"fsdp": {"strategy": "fsdp"},
              "hsdp": {"strategy": "hsdp", "shard_group": 8},
              # 8192 sequences of 512 tokens per GPU: activations exceed HBM.
              "ddp-huge": {"strategy": "ddp", "micro_batch": 8192}},
}


@pytest.fixture(scope="module")
def toy_data() -> dict[str, Any]:
    """The toy scenario's YAML as data, a copy to change."""
    return copy.deepcopy(TOY)


@pytest.fixture
def toy_path(tmp_path: Path) -> Path:
    path = tmp_path / "toy.yaml"
    path.write_text(yaml.safe_dump(TOY, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def toy_pairs(tmp_path_factory: pytest.TempPathFactory) -> list[tuple[Run, Result]]:
    path = tmp_path_factory.mktemp("toy") / "toy.yaml"
    path.write_text(yaml.safe_dump(TOY, sort_keys=False))
    return simulate_runs(load_scenario(path))
