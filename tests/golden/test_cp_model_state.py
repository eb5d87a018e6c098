"""Golden: context parallelism shards the model state over dp_shard x cp.

Source: torchtitan's ParallelDims flattens the mesh's dp_shard and cp axes into
"dp_shard_cp" and parallelize_llama applies fully_shard over it (HSDP over
(dp_replicate, dp_shard_cp)) whenever cp > 1: the cp ranks of one sequence hold the same
parameters, shard them and reduce their gradients together
(torchtitan/distributed/parallel_dims.py, torchtitan/models/llama3/infra/parallelize.py
at f64bbad). So llama2-13b with FSDP on 16 GPUs holds the same state per GPU at cp=8
(dp_shard=2) as at cp=1 (dp_shard=16): bytes per parameter x P / 16, worked out here by
hand. llama2-13b's every sharded dim (5120, 13824, 32000) divides by 16: no padding.
"""

from __future__ import annotations

import pytest

from zsim.analytic.comm import step_comm
from zsim.analytic.memory import model_state_bytes
from zsim.schedule.lower import state_at_rest_bytes
from zsim.simulate import simulate
from zsim.spec.plan import Plan
from zsim.spec.registry import resolve_hardware, resolve_model

M13B = resolve_model("13b")
P = 13_015_864_320
"""llama2-13b's parameters (40 blocks of d=5120, SwiGLU 13824, vocab 32000, untied)."""
H100 = resolve_hardware("dgx-h100")


def _plan(cp: int, strategy: str = "fsdp", **knobs: object) -> Plan:
    return Plan.for_strategy(strategy, gpus=16, cp=cp, seq_len=8192, recompute="full",
                             **knobs)


def test_13b_has_the_parameters_counted_here() -> None:
    assert M13B.num_params == P


@pytest.mark.parametrize("cp", [1, 8])
def test_fsdp_state_is_16_bytes_per_parameter_over_16_gpus(cp: int) -> None:
    plan = _plan(cp)
    assert (plan.dp_shard, plan.dp_shard_cp) == (16 // cp, 16)
    # The ZeRO paper's accounting (bf16 params and grads, fp32 master, Adam's two fp32
    # states: 16 bytes per parameter), sharded 16 ways.
    closed = model_state_bytes(P, plan)
    assert closed.total == 16 * P / 16
    assert closed.master_params == 4 * P / 16
    # FSDP2 at rest: the fp32 master shard and Adam's two states, 12 bytes per parameter.
    assert state_at_rest_bytes(M13B, plan) == {"master_params": 4 * P / 16,
                                               "optimizer_states": 8 * P / 16}


def test_simulated_state_at_cp8_is_cp1s_and_the_peak_is_not_higher() -> None:
    one, eight = simulate(M13B, H100, _plan(1)), simulate(M13B, H100, _plan(8))
    for r in (one, eight):
        assert r.memory_at_peak["master_params"] == 4 * P // 16
        assert r.memory_at_peak["optimizer_states"] == 8 * P // 16
    # Each CP rank holds 1/8 of the activations: the 16.9 GiB peak can only fall.
    assert eight.fits and eight.peak_memory_bytes < one.peak_memory_bytes


def test_fsdp_collectives_run_over_the_16_ranks_of_dp_shard_cp() -> None:
    # Two all-gathers of the blocks (forward, backward), one of the root (never resharded
    # after forward) and a reduce-scatter of the bf16 parameters per step, each rank
    # moving 15/16 of them (ring), over the same 16 ranks (8 per node) at cp=8 as at cp=1.
    s = 2 * P
    gathered = 2 * (2 * (P - M13B.root_params) + M13B.root_params)
    for cp in (1, 8):
        comm = step_comm(M13B, _plan(cp), H100)
        assert comm.bus_bytes["all_gather"] == gathered * 15 / 16
        assert comm.bus_bytes["reduce_scatter"] == s * 15 / 16
    assert step_comm(M13B, _plan(8), H100) == step_comm(M13B, _plan(1), H100)


def test_hsdp_over_replicas_of_the_cp_group() -> None:
    # torchtitan with dp_replicate=2, dp_shard=1, cp=8 runs HSDP over (dp_replicate,
    # dp_shard_cp): the state sharded over the 8 CP ranks, each shard all-reduced
    # across the 2 replicas.
    plan = _plan(8, "hsdp", shard_group=1)
    assert (plan.dp_shard, plan.dp_replicate, plan.dp_shard_cp) == (1, 2, 8)
    assert model_state_bytes(P, plan).total == 16 * P / 8
    comm = step_comm(M13B, plan, H100)
    assert comm.size_bytes["all_reduce"] == 2 * P / 8
    assert comm.bus_bytes["all_reduce"] == 2 * (2 * P / 8) * 1 / 2
