"""validate(): one real 2-rank run against the simulator, rows and CSV."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import pytest

pytest.importorskip("torch")

from zsim.calibrate.validate import validate
from zsim.spec.model import ModelSpec
from zsim.spec.plan import Plan
from zsim.spec.registry import resolve_hardware

pytestmark = pytest.mark.slow

TINY = ModelSpec(name="tiny", num_layers=2, d_model=128, num_heads=4, num_kv_heads=2,
                 ffn_hidden=344, vocab_size=500, max_seq_len=64)


def test_validate_rows_and_csv(tmp_path: Path) -> None:
    plan = Plan.for_strategy("fsdp", gpus=2, seq_len=48, micro_batch=2)
    rows = validate(TINY, plan, nproc=2, profile=resolve_hardware("local-cpu"), steps=1,
                    out_dir=tmp_path)
    metrics = {r["metric"] for r in rows}
    assert {"step_time_s", "peak_memory_bytes", "activation_bytes_blocks",
            "activation_bytes_root", "comm_busy_s"} <= metrics
    for r in rows:
        assert r["predicted"] > 0 and r["measured"] > 0
        assert math.isclose(r["error_pct"],
                            100 * (r["predicted"] - r["measured"]) / r["measured"],
                            abs_tol=0.01)
    with (tmp_path / "tiny-fsdp-n2.csv").open() as f:
        written = list(csv.DictReader(f))
    assert [w["metric"] for w in written] == [r["metric"] for r in rows]
