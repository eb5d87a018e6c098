"""Property tests for per-step communication volume (docs/validation.md, the ladder's invariants).

- One data-parallel rank => no data-parallel communication at all.
- FSDP (ZeRO-3) moves 1.5x DDP's bus bytes (3S vs 2S, ZeRO paper Sec. 7) when gradients
  are reduced in the parameter dtype (DDP's buckets are: a model cast to it) and there
  is one micro-batch per step, less the root's second gather: FSDP2 never reshards the
  root (embeddings, final norm, output: R of the P parameters) after forward, so it
  moves (3P - R) / 2P of DDP's.
- FSDP without resharding after forward skips the blocks' backward all-gather: 2P of
  FSDP's 3P - R.
"""

from __future__ import annotations

import math
from typing import Any

from hypothesis import given
from hypothesis import strategies as st
from plan_strategies import build_plan, models, plan_knobs

from zsim.analytic.comm import step_comm
from zsim.spec.model import ModelSpec
from zsim.spec.plan import STRATEGIES
from zsim.spec.registry import resolve_hardware

H100 = resolve_hardware("dgx-h100")


@given(model=models(), strategy=st.sampled_from(STRATEGIES), knobs=plan_knobs())
def test_one_data_parallel_rank_communicates_nothing(model: ModelSpec, strategy: str,
                                                     knobs: dict[str, Any]) -> None:
    comm = step_comm(model, build_plan(strategy=strategy, dp_shard=1, **knobs), H100)
    assert comm.total_bus_bytes == 0
    assert comm.total_time_s == 0
    assert all(v == 0 for v in comm.size_bytes.values())


def _same_dtype_single_micro_batch(knobs: dict[str, Any]) -> dict[str, Any]:
    dtype = knobs["param_dtype"]
    return {**knobs, "reduce_dtype": dtype, "master_dtype": dtype, "grad_accum": 1}


@given(model=models(), gpus=st.integers(2, 2048), knobs=plan_knobs())
def test_fsdp_moves_one_and_a_half_times_ddp(model: ModelSpec, gpus: int,
                                             knobs: dict[str, Any]) -> None:
    knobs = _same_dtype_single_micro_batch(knobs)
    ddp = step_comm(model, build_plan(strategy="ddp", dp_shard=1, dp_replicate=gpus,
                                      **knobs), H100)
    fsdp = step_comm(model, build_plan(strategy="fsdp", dp_shard=gpus, **knobs), H100)
    assert ddp.total_bus_bytes > 0
    p, r = model.num_params, model.root_params
    assert math.isclose(fsdp.total_bus_bytes, (3 * p - r) / (2 * p) * ddp.total_bus_bytes,
                        rel_tol=1e-12)


@given(model=models(), gpus=st.integers(2, 2048), knobs=plan_knobs())
def test_no_reshard_moves_two_thirds_of_fsdp(model: ModelSpec, gpus: int,
                                             knobs: dict[str, Any]) -> None:
    knobs = _same_dtype_single_micro_batch(knobs)
    fsdp = step_comm(model, build_plan(strategy="fsdp", dp_shard=gpus, **knobs), H100)
    keep = step_comm(model, build_plan(strategy="fsdp-no-reshard", dp_shard=gpus, **knobs),
                     H100)
    p, r = model.num_params, model.root_params
    assert math.isclose(keep.total_bus_bytes, 2 * p / (3 * p - r) * fsdp.total_bus_bytes,
                        rel_tol=1e-12)
