"""One process as rank 0 of N on the fake process group: sharded state has exactly the
size FSDP2's Shard(0) gives rank 0, worked out per tensor from ModelSpec."""

from __future__ import annotations

import math

import pytest

pytest.importorskip("torch")

from zsim.backend.measured_step import measure_fake_rank
from zsim.schedule.lower import state_at_rest_bytes
from zsim.spec.model import ModelSpec
from zsim.spec.plan import Plan

pytestmark = pytest.mark.slow

TINY = ModelSpec(name="tiny", num_layers=2, d_model=128, num_heads=4, num_kv_heads=2,
                 ffn_hidden=344, vocab_size=500, max_seq_len=64)


def _rank0_shard_bytes(spec: ModelSpec, n: int) -> int:
    """fp32 bytes rank 0 holds: FSDP2 shards dim 0 like torch.chunk, so rank 0 gets
    ceil(dim0 / n) rows of every tensor (padding included)."""
    return sum(math.ceil(shape[0] / n) * math.prod(shape[1:]) * 4
               for _, shape in spec.parameter_tensors())


@pytest.mark.parametrize("world_size", [8, 64])
def test_rank0_state_at_world_size(world_size: int) -> None:
    plan = Plan.for_strategy("fsdp", gpus=world_size, seq_len=32, micro_batch=1)
    mem = measure_fake_rank(TINY, plan)
    shard = _rank0_shard_bytes(TINY, world_size)
    rope = 2 * TINY.max_seq_len * TINY.head_dim * 4
    # Beyond shards and buffers: bookkeeping scalars (DTensor RNG state), under 1 KiB.
    assert 0 <= mem.after_init_bytes - (shard + rope) < 1024
    # AdamW adds two moments of the (padded) shard and a 4-byte step per tensor.
    assert mem.after_first_step_bytes - mem.after_init_bytes == \
        2 * shard + 4 * len(TINY.parameter_tensors())
    assert mem.peak_bytes > mem.after_first_step_bytes
    # The simulator's state at rest (fp32 shard and moments, padded per parameter) is the
    # measured state, up to the bookkeeping scalars and AdamW's step counters.
    modelled = sum(state_at_rest_bytes(TINY, plan).values()) + rope
    assert 0 <= mem.after_first_step_bytes - modelled < 1024 + 4 * len(TINY.parameter_tensors())
