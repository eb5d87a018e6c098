"""torch DDP with tensor and pipeline parallelism (zsim.schedule.programs.torch_ddp,
zsim.schedule.pipeline_work): a rank's state, gradients and collectives for the tiny
2-block model, worked out by hand from its shapes. With one data-parallel rank the
parallelised model runs bare (no reducer: gradients come and go with each step, nothing
is all-reduced over data parallelism); with two, DDP all-reduces each TP rank's local
gradients over its data-parallel group."""

from __future__ import annotations

import pytest

from zsim.errors import ConfigError
from zsim.schedule.lower import lower, state_at_rest_bytes
from zsim.simulate import simulate
from zsim.spec.hardware import HardwareProfile
from zsim.spec.model import ModelSpec
from zsim.spec.plan import Plan

# tiny_model: 2 blocks, d 256, 4 heads (MHA), SwiGLU 512, vocab 1000. One rank of tp=2
# holds 2 heads (q, k, v widths 128), 256 MLP columns, 500 vocabulary rows, whole norms.
TP2_BLOCK = 2 * 256 + 3 * 128 * 256 + 256 * 128 + 3 * 256 * 256
TP2_ROOT = 2 * 500 * 256 + 256  # token embedding, output, final norm
TP2_PARAMS = 2 * TP2_BLOCK + TP2_ROOT
BLOCK = 2 * 256 + 4 * 256 * 256 + 3 * 256 * 512  # whole block (pipeline, tp 1)


def test_tp_without_data_parallelism_holds_its_shard_and_no_gradients(
        tiny_model: ModelSpec) -> None:
    plan = Plan(strategy="ddp", dp_shard=1, tp=2, seq_len=128)
    assert TP2_PARAMS == 912_640
    # fp32 parameters (autocast) and AdamW's two fp32 moments; no reducer buckets.
    assert state_at_rest_bytes(tiny_model, plan) == {
        "master_params": 4.0 * TP2_PARAMS, "optimizer_states": 8.0 * TP2_PARAMS}


def test_tp_without_data_parallelism_collectives_and_gradients(
        tiny_model: ModelSpec, h100: HardwareProfile) -> None:
    plan = Plan(strategy="ddp", dp_shard=1, tp=2, seq_len=128, grad_accum=2)
    ops = lower(tiny_model, h100, plan).ops
    # Megatron's f and g without SP, per micro-batch: forward, the embedding's output and
    # each block's attention and MLP outputs (1 + 2 x 2), then the logits all-gathered
    # for the loss (the output projection's replicated output); backward, the output
    # projection's input gradient and each block's two input gradients (1 + 2 x 2).
    tp = [op for op in ops if op.group == "tp"]
    assert [op.kind for op in tp] == (["all_reduce"] * 5 + ["all_gather"]
                                      + ["all_reduce"] * 5) * 2
    # b x s x d: the blocks' outputs are autocast's bf16 matmul outputs; the embedding's
    # output (a lookup in the fp32 table) and every input gradient (of the fp32 residual
    # stream's norms) are fp32.
    stream, matmul = 128 * 256 * 4, 128 * 256 * 2
    assert [op.size_bytes for op in tp[:11]] == ([stream] + [matmul] * 4 + [128 * 1000 * 2]
                                                 + [stream] * 5)
    # b x s x d and b x s x vocab (the whole vocabulary, 1000), bf16
    assert {op.size_bytes for op in tp if op.kind == "all_gather"} == {128 * 1000 * 2}
    assert {op.group_ranks for op in tp} == {2}
    assert not [op for op in ops if op.group == "replicate"]  # no DDP
    # Autograd's fp32 gradients of the local shard, allocated in the first micro-batch's
    # backward and freed by the step (set to None).
    grads = [buf for op in ops for buf in op.allocs if buf.category == "grads"]
    assert sum(buf.bytes for buf in grads) == 4 * TP2_PARAMS
    step = next(op for op in ops if op.kind == "optimizer")
    assert {buf.name for buf in grads} <= set(step.frees)


def test_tp_under_ddp_all_reduces_local_gradients_over_data_parallelism(
        tiny_model: ModelSpec, h100: HardwareProfile) -> None:
    plan = Plan(strategy="ddp", dp_shard=1, dp_replicate=2, tp=2, seq_len=128)
    assert state_at_rest_bytes(tiny_model, plan)["grads"] == 4.0 * TP2_PARAMS
    ops = lower(tiny_model, h100, plan).ops
    buckets = [op for op in ops if op.group == "replicate"]
    assert {op.kind for op in buckets} == {"all_reduce"}
    assert {op.group_ranks for op in buckets} == {2}
    # DDP's buckets hold the rank's fp32 gradients (autocast keeps fp32 parameters).
    assert sum(op.size_bytes for op in buckets) == 4 * TP2_PARAMS


def test_pipeline_without_data_parallelism_state_by_hand(
        tiny_model: ModelSpec, h100: HardwareProfile) -> None:
    plan = Plan(strategy="ddp", dp_shard=1, pp=2, grad_accum=2, seq_len=128)
    r = simulate(tiny_model, h100, plan)
    stage_params = [BLOCK + 1000 * 256, BLOCK + 1000 * 256 + 256]  # embedding; output, norm
    # One fp32 receive buffer (b, s, d) per micro-batch: rank 1 the activation from rank
    # 0, rank 0 its gradient from rank 1.
    recv = 2 * 128 * 256 * 4
    rank = int(r.peak_op.rsplit(" ", 1)[1])
    params = stage_params[rank]
    # Plus the H100's two 32 MiB cuBLAS workspaces.
    assert r.baseline_memory_bytes == (12 * params + recv + tiny_model.buffer_bytes
                                       + 2 * 32 * 2**20)
    at_peak = r.memory_at_peak
    assert at_peak["master_params"] == 4 * params
    assert at_peak["optimizer_states"] == 8 * params
    assert at_peak["grads"] == 4 * params  # whole fp32 gradients, no gathered copies
    assert at_peak["comm_buffers"] == recv
    assert "gathered_params" not in at_peak


@pytest.mark.parametrize("strategy,change", [
    ("zero1", {"tp": 2}), ("zero1", {"pp": 2, "grad_accum": 2})])
def test_zero_redundancy_optimizer_with_model_parallelism_is_refused(
        tiny_model: ModelSpec, h100: HardwareProfile, strategy: str,
        change: dict[str, int]) -> None:
    plan = Plan(strategy=strategy, dp_shard=2, impl="torch", seq_len=128, **change)  # type: ignore[arg-type]
    with pytest.raises(ConfigError) as err:
        simulate(tiny_model, h100, plan)
    assert err.value.field == f"plan.{next(iter(change))}"
