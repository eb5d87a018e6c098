"""FSDP2 with gradient accumulation, reducing once per step (set_requires_gradient_sync
off until the last micro-batch) or after every micro-batch (fully_shard's default, as
torchtitan's loop runs it): calls, bytes and gradient memory worked out from the model."""

from __future__ import annotations

import pytest

from zsim.errors import ConfigError
from zsim.schedule.lower import lower
from zsim.simulate import simulate
from zsim.spec.hardware import HardwareProfile
from zsim.spec.model import ModelSpec
from zsim.spec.plan import Plan

ACCUM = 3


def _plan(grad_sync: str, **kw: object) -> Plan:
    return Plan.for_strategy("fsdp", gpus=8, seq_len=256, grad_accum=ACCUM,
                             grad_sync=grad_sync, **kw)


@pytest.mark.parametrize("grad_sync", ["last", "every"])
def test_reduce_scatters_and_unsharded_gradients_by_hand(
        tiny_model: ModelSpec, h100: HardwareProfile, grad_sync: str) -> None:
    plan = _plan(grad_sync, reduce_dtype="fp32")
    ops = lower(tiny_model, h100, plan).ops
    units = tiny_model.num_layers + 1  # one unit per block (unit_size 1) and the root
    reduces = [op for op in ops if op.kind == "reduce_scatter"]
    assert len(reduces) == units * (ACCUM if grad_sync == "every" else 1)
    grads = [(op.microbatch, buf) for op in ops for buf in op.allocs
             if buf.category == "gathered_grads"]
    # "last": micro-batch 0 allocates every unsharded gradient once, in the fp32 reduce
    # dtype the later micro-batches accumulate into; "every": each micro-batch allocates
    # bf16 gradients, and frees them in its own reduce-scatter copy-ins.
    if grad_sync == "last":
        assert {mb for mb, _ in grads} == {0}
        assert sum(b.bytes for _, b in grads) == tiny_model.num_params * 4
    else:
        assert {mb for mb, _ in grads} == set(range(ACCUM))
        assert sum(b.bytes for _, b in grads) == ACCUM * tiny_model.num_params * 2
        freed_in = {name: op.microbatch for op in ops for name in op.frees}
        assert all(freed_in[b.name] == mb for mb, b in grads)
    # Each reduced shard after the first is added into the sharded gradient, then freed.
    adds = [op for op in ops if "grad accumulate" in op.name]
    assert len(adds) == (units * (ACCUM - 1) if grad_sync == "every" else 0)


def test_every_micro_batch_trades_reduce_scatters_for_gradient_memory(
        h100: HardwareProfile) -> None:
    from zsim.spec.registry import resolve_model

    model = resolve_model("7b")
    runs = {s: simulate(model, h100, Plan.for_strategy("fsdp", gpus=64, seq_len=4096,
                                                       grad_accum=4, grad_sync=s,
                                                       reduce_dtype="fp32"))
            for s in ("last", "every")}
    # The model's fp32 unsharded gradients (4 B per parameter) no longer wait for the
    # last micro-batch; the reduce-scatters move four times the bytes.
    saved = runs["last"].peak_memory_bytes - runs["every"].peak_memory_bytes
    assert saved > 0.8 * model.num_params * 4
    assert runs["every"].comm_bus_bytes["reduce_scatter"] == pytest.approx(
        4 * runs["last"].comm_bus_bytes["reduce_scatter"], rel=0.01)


@pytest.mark.parametrize("kw", [dict(impl="fsdp1"), dict(offload="optimizer")])
def test_every_micro_batch_is_fsdp2s(kw: dict[str, object]) -> None:
    with pytest.raises(ConfigError) as e:
        _plan("every", **kw)
    assert e.value.field == "plan.grad_sync"
