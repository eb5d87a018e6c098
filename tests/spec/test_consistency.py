"""check_plan(): the cross-object rules, each with a passing and a failing case."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zsim.errors import ConfigError
from zsim.spec.consistency import check_plan
from zsim.spec.hardware import HardwareProfile
from zsim.spec.model import ModelSpec
from zsim.spec.plan import Plan
from zsim.spec.presets import PRESETS
from zsim.spec.registry import resolve_hardware

H100 = resolve_hardware("dgx-h100")
CPU = resolve_hardware("local-cpu")
LLAMA2_7B = PRESETS["llama2-7b"]      # 32 layers, 32 heads, 32 kv heads, RoPE
GPT3_13B = PRESETS["gpt3-13b"]        # 40 layers, 40 heads, learned positions, 2048 rows


def _fsdp(**knobs: object) -> Plan:
    return Plan(**{"strategy": "fsdp", "dp_shard": 64, "seq_len": 4096, **knobs})


def _error(model: ModelSpec = LLAMA2_7B, hw: HardwareProfile = H100, plan: Plan | None = None,
           gpus: object = 64) -> ConfigError:
    with pytest.raises(ConfigError) as e:
        check_plan(model, hw, plan or _fsdp(), gpus=gpus)  # type: ignore[arg-type]
    return e.value


def test_valid_triple_passes() -> None:
    assert check_plan(LLAMA2_7B, H100, _fsdp(), gpus=64) is None
    assert check_plan(LLAMA2_7B, H100, _fsdp()) is None


def test_world_size_must_equal_gpus() -> None:
    e = _error(plan=_fsdp(dp_shard=32), gpus=64)
    assert (e.field, e.value) == ("gpus", 64)
    assert "32" in e.reason
    # Without gpus the world-size rule is skipped.
    assert check_plan(LLAMA2_7B, H100, _fsdp(dp_shard=32)) is None


def test_world_size_counts_every_degree() -> None:
    plan = Plan(strategy="fsdp", dp_shard=8, dp_replicate=2, tp=2, pp=2, grad_accum=2,
                seq_len=4096)
    assert check_plan(LLAMA2_7B, H100, plan, gpus=64) is None
    assert _error(plan=plan, gpus=128).field == "gpus"


@pytest.mark.parametrize("gpus", [0, -64, 64.0, True])
def test_gpus_must_be_a_positive_integer(gpus: object) -> None:
    e = _error(gpus=gpus)
    assert (e.field, e.value) == ("gpus", gpus)


def test_hsdp_group_may_span_nodes() -> None:
    # 16-rank shard groups on 8-GPU nodes: allowed (the all-gathers then cross the NIC).
    plan = Plan.for_strategy("hsdp", gpus=64, shard_group=16, seq_len=4096)
    assert check_plan(LLAMA2_7B, H100, plan, gpus=64) is None


@pytest.mark.parametrize(("shard", "tp", "gpus", "ok"), [
    (16, 1, 64, True),    # two whole nodes
    (4, 1, 12, True),     # inside a node (the world is 1.5 nodes: a warning, not this rule)
    (4, 2, 24, True),     # tp x dp_shard = 8: one node
    (6, 1, 24, False),    # ranks 6-11 and 12-17 would each hold ranks of two nodes
    (12, 1, 24, False),   # 1.5 nodes: ranks 12-23 straddle nodes 1 and 2
    (6, 2, 24, False),    # tp x dp_shard = 12
])
def test_hsdp_shard_groups_must_not_straddle_nodes(shard: int, tp: int, gpus: int,
                                                   ok: bool) -> None:
    """zsim places each shard group as consecutive ranks and models its
    collectives inside a node when it holds no more than a node; a group size that
    neither divides a node nor is whole nodes would put some groups on two nodes (by rank
    numbers: group k holds ranks [k*s, (k+1)*s))."""
    plan = Plan.for_strategy("hsdp", gpus=gpus, shard_group=shard, tp=tp, seq_len=4096)
    span = shard * tp
    groups_in = {n: {r // span for r in range(8 * n, min(8 * n + 8, gpus))}
                 for n in range(-(-gpus // 8))}
    straddles = any(len(nodes) > 1 and any(len(groups_in[n]) > 1 for n in nodes)
                    for nodes in ({r // 8 for r in range(k * span, (k + 1) * span)}
                                  for k in range(gpus // span)))
    assert straddles != ok
    if ok:
        assert check_plan(LLAMA2_7B, H100, plan, gpus=gpus) is None
        return
    e = _error(plan=plan, gpus=gpus)
    assert (e.field, e.value) == ("plan.dp_shard", shard)
    assert f"an HSDP shard group spans {span} GPUs" in e.reason
    assert f"{span / 8:g} nodes of 8 (dgx-h100)" in e.reason


def test_hsdp_group_must_divide_gpus() -> None:
    plan = Plan(strategy="hsdp", dp_shard=3, dp_replicate=2, seq_len=4096)
    e = _error(plan=plan, gpus=8)
    assert (e.field, e.value) == ("plan.dp_shard", 3)
    assert "gpus=8" in e.reason


@pytest.mark.parametrize(("name", "tp", "ok"), [
    ("llama2-7b", 8, True), ("llama2-7b", 3, False),
    ("llama2-70b", 8, True), ("llama2-70b", 16, False),   # 64 heads divide, 8 kv heads do not
    ("gpt3-13b", 5, True), ("gpt3-13b", 16, False),
])
def test_heads_and_kv_heads_divide_by_tp(name: str, tp: int, ok: bool) -> None:
    model = PRESETS[name]
    # Across nodes allowed, so that only the head rules are at stake.
    plan = Plan(strategy="fsdp", dp_shard=8, tp=tp, seq_len=2048, tp_across_nodes=True)
    if ok:
        assert check_plan(model, H100, plan, gpus=8 * tp) is None
        return
    e = _error(model=model, plan=plan, gpus=8 * tp)
    assert (e.field, e.value) == ("plan.tp", tp)
    kind = "num_kv_heads" if model.num_heads % tp == 0 else "num_heads"
    assert f"model.{kind}=" in e.reason


@pytest.mark.parametrize(("pp", "ok"), [(2, True), (4, True), (3, False), (5, False)])
def test_layers_divide_by_pp(pp: int, ok: bool) -> None:
    plan = Plan(strategy="zero1", dp_shard=8, pp=pp, grad_accum=pp, seq_len=4096)
    if ok:
        assert check_plan(LLAMA2_7B, H100, plan, gpus=8 * pp) is None
        return
    e = _error(plan=plan, gpus=8 * pp)
    assert (e.field, e.value) == ("plan.pp", pp)
    assert "num_layers=32" in e.reason


def test_unit_size_at_most_layers() -> None:
    assert check_plan(LLAMA2_7B, H100, _fsdp(unit_size=32), gpus=64) is None
    assert check_plan(LLAMA2_7B, H100, _fsdp(unit_size=3), gpus=64) is None  # uneven last unit
    e = _error(plan=_fsdp(unit_size=33))
    assert (e.field, e.value) == ("plan.unit_size", 33)


def test_learned_positions_bound_seq_len() -> None:
    assert check_plan(GPT3_13B, H100, _fsdp(seq_len=2048), gpus=64) is None
    e = _error(model=GPT3_13B, plan=_fsdp(seq_len=4096))
    assert (e.field, e.value) == ("plan.seq_len", 4096)
    assert "max_seq_len=2048" in e.reason
    # RoPE models train past their default length.
    assert check_plan(LLAMA2_7B, H100, _fsdp(seq_len=32768), gpus=64) is None


def test_compute_dtype_needs_a_peak() -> None:
    assert check_plan(LLAMA2_7B, CPU, _fsdp(dp_shard=2), gpus=2) is None
    e = _error(hw=CPU, plan=_fsdp(dp_shard=2, param_dtype="fp16"), gpus=2)
    assert (e.field, e.value) == ("plan.param_dtype", "fp16")
    assert "local-cpu" in e.reason and "bf16" in e.reason


def test_micro_batch_times_seq_positive_is_guaranteed_by_plan() -> None:
    # check_plan() relies on Plan refusing non-positive sizes at construction.
    for field in ("micro_batch", "seq_len"):
        with pytest.raises(ConfigError) as e:
            dataclasses.replace(_fsdp(), **{field: 0})
        assert e.value.field == f"plan.{field}"


@settings(max_examples=200, deadline=None)
@given(tp=st.integers(1, 16), pp=st.integers(1, 8), dp=st.integers(1, 16),
       unit=st.integers(1, 40), across=st.booleans(), accum=st.integers(1, 8))
def test_rules_match_arithmetic(tp: int, pp: int, dp: int, unit: int, across: bool,
                                accum: int) -> None:
    """check_plan() passes exactly when every divisibility rule holds (GPT-3 13B: 40 layers,
    40 heads; H100 nodes of 8 GPUs; 1F1B needs pp micro-batches)."""
    plan = Plan(strategy="fsdp", dp_shard=dp, tp=tp, pp=pp, unit_size=unit, seq_len=2048,
                tp_across_nodes=across, grad_accum=accum)
    ok = (GPT3_13B.num_heads % tp == 0 and GPT3_13B.num_layers % pp == 0
          and unit <= 40 // pp and (across or 8 % tp == 0) and (pp == 1 or accum >= pp))
    if ok:
        assert check_plan(GPT3_13B, H100, plan, gpus=dp * tp * pp) is None
    else:
        with pytest.raises(ConfigError):
            check_plan(GPT3_13B, H100, plan, gpus=dp * tp * pp)


# ---------------------------------------------------------------- 2-D and 3-D plans
def test_world_counts_cp() -> None:
    plan = _fsdp(dp_shard=8, tp=4, cp=2)
    assert check_plan(LLAMA2_7B, H100, plan, gpus=64) is None
    e = _error(plan=_fsdp(dp_shard=16, tp=4, cp=2), gpus=64)
    assert e.field == "gpus" and "cp*tp*pp" in e.reason and "= 128" in e.reason


def test_tp_across_nodes_needs_saying_so() -> None:
    plan = _fsdp(dp_shard=4, tp=16)
    e = _error(plan=plan)
    assert (e.field, e.value) == ("plan.tp", 16)
    assert "tp_across_nodes" in e.reason and "8 GPUs" in e.reason
    assert check_plan(LLAMA2_7B, H100, _fsdp(dp_shard=4, tp=16, tp_across_nodes=True),
                    gpus=64) is None


def test_tp_must_not_straddle_a_node() -> None:
    # tp=4 of llama2-7b's 32 heads, on H100 nodes of 8: fine; tp=32 across 8-GPU nodes and
    # a made-up 12-GPU node, where tp=8 would straddle two nodes: not without saying so.
    assert check_plan(LLAMA2_7B, H100, _fsdp(dp_shard=16, tp=4)) is None
    twelve = dataclasses.replace(H100, gpus_per_node=12)
    e = _error(hw=twelve, plan=_fsdp(dp_shard=8, tp=8))
    assert (e.field, e.value) == ("plan.tp", 8)
    assert "gpus_per_node=12" in e.reason


@pytest.mark.parametrize(("pp", "virtual", "ok"), [(2, 2, True), (4, 4, True), (8, 4, True),
                                                     (8, 8, False), (2, 3, False), (4, 3, False)])
def test_layers_divide_by_pp_times_virtual_stages(pp: int, virtual: int, ok: bool) -> None:
    # llama2-7b: 32 layers.
    plan = _fsdp(dp_shard=64 // pp, pp=pp, pp_schedule="interleaved", virtual_stages=virtual,
                 grad_accum=pp)
    if ok:
        assert check_plan(LLAMA2_7B, H100, plan) is None
        return
    e = _error(plan=plan)
    assert (e.field, e.value) == ("plan.virtual_stages", virtual)
    assert "num_layers=32" in e.reason


def test_unit_fits_in_a_stage() -> None:
    assert check_plan(LLAMA2_7B, H100, _fsdp(dp_shard=16, pp=4, grad_accum=4, unit_size=8)) is None
    e = _error(plan=_fsdp(dp_shard=16, pp=4, grad_accum=4, unit_size=9))
    assert (e.field, e.value) == ("plan.unit_size", 9)
    assert "8 layers of a pipeline stage" in e.reason


def test_1f1b_needs_pp_microbatches() -> None:
    e = _error(plan=_fsdp(dp_shard=16, pp=4, grad_accum=3))
    assert (e.field, e.value) == ("plan.grad_accum", 3)
    assert "pp=4" in e.reason
    # GPipe runs any number of micro-batches.
    assert check_plan(LLAMA2_7B, H100, _fsdp(dp_shard=16, pp=4, pp_schedule="gpipe")) is None


def test_interleaved_microbatches_divide_into_rounds() -> None:
    # torch's ScheduleInterleaved1F1B: rounds = max(1, m // pp); m % rounds == 0.
    ok = _fsdp(dp_shard=16, pp=4, pp_schedule="interleaved", virtual_stages=2, grad_accum=8)
    assert check_plan(LLAMA2_7B, H100, ok) is None
    assert check_plan(LLAMA2_7B, H100, dataclasses.replace(ok, grad_accum=10)) is None
    e = _error(plan=dataclasses.replace(ok, grad_accum=9))
    assert (e.field, e.value) == ("plan.grad_accum", 9)
    assert "2 rounds" in e.reason


@pytest.mark.parametrize(("cp", "seq", "ok"), [(2, 4096, True), (4, 4096, True),
                                               (2, 4094, False), (4, 4100, False)])
def test_sequence_divides_into_2cp_chunks(cp: int, seq: int, ok: bool) -> None:
    plan = _fsdp(dp_shard=64 // cp, cp=cp, seq_len=seq)
    if ok:
        assert check_plan(LLAMA2_7B, H100, plan) is None
        return
    e = _error(plan=plan)
    assert (e.field, e.value) == ("plan.seq_len", seq)
    assert f"2 x cp = {2 * cp}" in e.reason


def test_sequence_parallel_divides_the_sequence() -> None:
    assert check_plan(LLAMA2_7B, H100, _fsdp(dp_shard=8, tp=8, sp=True)) is None
    e = _error(plan=_fsdp(dp_shard=8, tp=8, sp=True, seq_len=4100))
    assert (e.field, e.value) == ("plan.seq_len", 4100)


def test_fp32_rope_tables_need_a_program_that_casts_them() -> None:
    """FSDP2 casts each block's inputs (Plan.casts_block_inputs), autocast computes the
    rotation in fp32 anyway, fp32 compute needs no cast; FSDP1 and DeepSpeed in bf16
    would rotate q and k in fp32 (not modelled)."""
    fp32_tables = dataclasses.replace(LLAMA2_7B, rope_table_dtype="fp32")
    assert check_plan(fp32_tables, H100, _fsdp()) is None
    assert check_plan(fp32_tables, H100, _fsdp(param_dtype="fp32", grad_dtype="fp32")) is None
    assert check_plan(fp32_tables, H100, Plan.for_strategy("ddp", gpus=8, seq_len=4096)) is None
    for plan in (_fsdp(impl="fsdp1"), Plan.for_strategy("zero3", gpus=64, seq_len=4096)):
        e = _error(model=fp32_tables, plan=plan)
        assert (e.field, e.value) == ("model.rope_table_dtype", "fp32")
    assert check_plan(dataclasses.replace(GPT3_13B, rope_table_dtype="fp32"), H100,
                    _fsdp(impl="fsdp1", seq_len=2048)) is None  # no RoPE
