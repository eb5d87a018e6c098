"""CUDA paths: the reference step under NCCL on one GPU, and rank 0 of 64 on the fake
process group with the caching allocator's figures. Skipped without CUDA."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from zsim.backend.measured_step import measure_fake_rank, measure_plan  # noqa: E402
from zsim.spec.model import ModelSpec  # noqa: E402
from zsim.spec.plan import Plan  # noqa: E402

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

SMALL = ModelSpec(name="small", num_layers=4, d_model=512, num_heads=8, num_kv_heads=2,
                  ffn_hidden=1376, vocab_size=4096, max_seq_len=512)


def test_fsdp_one_gpu_nccl_state_memory() -> None:
    plan = Plan.for_strategy("fsdp", gpus=1, seq_len=512, micro_batch=2)
    m = measure_plan(SMALL, plan, nproc=1, steps=2, backend="nccl")
    mem = m.ranks[0].memory
    # fp32 parameters + two AdamW moments; the allocator rounds each block up to 512 B.
    state = 12 * SMALL.num_params
    assert state <= mem.after_first_step_bytes <= state + 4 * 2**20
    assert mem.reserved_bytes >= mem.peak_bytes > mem.after_first_step_bytes


def test_rank0_of_64_on_cuda_fake_pg() -> None:
    plan = Plan.for_strategy("fsdp", gpus=64, seq_len=512, micro_batch=1)
    mem = measure_fake_rank(SMALL, plan)
    shard = sum(math.ceil(shape[0] / 64) * math.prod(shape[1:]) * 4
                for _, shape in SMALL.parameter_tensors())
    assert shard <= mem.after_init_bytes <= shard + 2 * 2**20
