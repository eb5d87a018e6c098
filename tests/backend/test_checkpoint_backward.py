"""What a checkpointed block's backward holds, in real FSDP2 with
torch.utils.checkpoint (non-reentrant, the backend's full recomputation) as rank 0 of 8 on
the fake process group. The gradient of the block's output (the residual stream's,
b*s*d in the compute dtype) is still alive when the block's forward has been recomputed,
that is while every recomputed tensor is alive at once: the simulator's backward script
holds it there (zsim.analytic.allocations._block_backward)."""

from __future__ import annotations

import weakref
from typing import Any

import pytest

pytest.importorskip("torch")

from zsim.backend.runner import RankContext, run_fake_rank
from zsim.spec.model import ModelSpec
from zsim.spec.plan import Plan

pytestmark = pytest.mark.slow

TINY = ModelSpec(name="tiny", num_layers=3, d_model=128, num_heads=2, num_kv_heads=2,
                 ffn_hidden=256, vocab_size=256, max_seq_len=128, norm_kernel="composite")
B, S = 2, 128


def _incoming_gradient_at_recompute(ctx: RankContext, payload: tuple[ModelSpec, Plan]
                                    ) -> dict[int, tuple[bool, int]]:
    """Per block of the second (steady-state) step: whether the gradient of the block's
    output was alive when the block's recomputation ended, and its size in bytes."""
    import torch

    from zsim.backend import programs, training

    spec, plan = payload
    prep = programs.prepare(spec, plan, device=ctx.device, world_size=ctx.world_size)
    phase = {"backward": False}
    incoming: dict[int, tuple[weakref.ref[Any], int]] = {}
    seen: dict[int, tuple[bool, int]] = {}

    for i, wrapper in enumerate(prep.inner.layers):
        inner = wrapper._checkpoint_wrapped_module

        def keep_gradient(g: torch.Tensor, i: int = i) -> None:
            storage = g.untyped_storage()
            incoming[i] = (weakref.ref(storage), storage.nbytes())

        def on_output(module: Any, args: Any, out: torch.Tensor,
                      keep: Any = keep_gradient) -> None:
            if not phase["backward"]:
                out.register_hook(keep)

        wrapper.register_forward_hook(on_output)
        forward = inner.forward

        def recorded(*args: Any, i: int = i, forward: Any = forward, **kwargs: Any) -> Any:
            # Called once in forward and once more by checkpoint's recomputation, which
            # stops early (at w2's input) by raising through here.
            try:
                return forward(*args, **kwargs)
            finally:
                if phase["backward"]:
                    ref, nbytes = incoming[i]
                    seen[i] = (ref() is not None, nbytes)

        inner.forward = recorded
    for step in range(2):
        (tokens, labels), = training.batches(spec, plan, device=ctx.device, rank=0, step=step)
        phase["backward"] = False
        loss = prep.model(tokens, labels)
        phase["backward"] = True
        prep.backward(loss, True)
        prep.step()
    return seen


def test_gradient_of_a_checkpointed_block_output_lives_through_its_recomputation() -> None:
    plan = Plan.for_strategy("fsdp", gpus=8, seq_len=S, micro_batch=B, recompute="full",
                             reduce_dtype="fp32")
    seen = run_fake_rank(_incoming_gradient_at_recompute, (TINY, plan), world_size=8)
    assert set(seen) == set(range(TINY.num_layers))
    bsd_bf16 = B * S * TINY.d_model * 2
    for block, (alive, nbytes) in seen.items():
        assert alive, f"block {block}: its output's gradient was freed before its recompute"
        assert nbytes == bsd_bf16, block
