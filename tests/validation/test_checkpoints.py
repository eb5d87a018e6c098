"""The checkpoint model against a real DCP save and load on 2 gloo ranks, this host's
storage measured first (zsim.validation.checkpoints). Bytes must match the model to
0.1% (they are counted from the library's layout). Times are compared in the kept batch
(reports/validation/checkpoint), not here: on this shared disk three runs of this test
measured the stall at -70%, -34% and +63% of its prediction (docs/log.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from zsim.spec.model import ModelSpec
from zsim.spec.registry import resolve_hardware
from zsim.validation.checkpoints import validate_checkpoints

pytestmark = pytest.mark.slow

MODEL = ModelSpec(name="llama-30m", num_layers=2, d_model=512, num_heads=8, num_kv_heads=8,
                  ffn_hidden=1408, vocab_size=32000, max_seq_len=64, norm_kernel="composite")
"""About 40M parameters: 0.5 GB of state, enough for the bytes to set the time."""


def test_dcp_bytes_match_and_the_stall_is_within_the_bound(tmp_path: Path) -> None:
    r = validate_checkpoints(resolve_hardware("local-cpu"), tmp_path, spec=MODEL,
                             plans=(("fsdp", "fsdp2", ("dcp",)),))
    rows = {row["metric"]: row for row in r["rows"]}
    assert abs(rows["bytes_total"]["error_pct"]) < 0.1
    assert abs(rows["bytes_rank_max"]["error_pct"]) < 0.1
    assert rows["stall_s"]["predicted"] > 0 and rows["stall_s"]["measured"] > 0
    assert (tmp_path / "checkpoints.csv").read_text().startswith("program,strategy,method")
