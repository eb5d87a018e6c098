"""The model and DeepSpeed knobs of the real library runs (DeepSpeed ZeRO, FSDP1, their
collective calls): one definition for the tests that measure them, so that a run two
tests share (the real_runs fixture) is the same run."""

from __future__ import annotations

from zsim.spec.deepspeed import DeepSpeedZero
from zsim.spec.model import ModelSpec

TINY = ModelSpec(name="tiny", num_layers=2, d_model=128, num_heads=4, num_kv_heads=2,
                 ffn_hidden=344, vocab_size=512, max_seq_len=64, norm_kernel="composite")
"""2 blocks, d 128, GQA 4/2 heads; the kernel knob as validate_plan() sets it on CPU."""

ZERO3 = DeepSpeedZero(param_persistence_threshold=1_000, reduce_bucket_size=50_000,
                      prefetch_bucket_size=30_000)
"""ZeRO-3 on TINY: the norms whole, every matrix fetched, several buckets and prefetches."""
