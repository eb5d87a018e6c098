"""Expert parallelism (Plan.ep) lowered with FSDP2 as torchtitan runs it, checked against
closed forms worked out here: the all-to-alls per step and their bytes, the expert state
sharded over dp_shard / ep ranks, the gathered parameters EP saves, where each group sits
on the nodes, and the busiest rank's share under imbalance or a capacity factor."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from zsim.analytic.collectives import collective_time_s
from zsim.analytic.placement import place
from zsim.cli import app
from zsim.errors import ConfigError
from zsim.schedule.lower import lower
from zsim.simulate import simulate
from zsim.spec.consistency import check_plan
from zsim.spec.model import ModelSpec
from zsim.spec.moe import MoeSpec
from zsim.spec.plan import Plan
from zsim.spec.registry import resolve_hardware

HW = resolve_hardware("hgx-h200")
D, LAYERS, EXPERTS, TOP_K, FE, SEQ = 1024, 4, 8, 2, 3584, 1024
MOE = ModelSpec(name="tiny-moe", num_layers=LAYERS, d_model=D, num_heads=8, num_kv_heads=8,
                ffn_hidden=FE, vocab_size=32000, max_seq_len=SEQ,
                moe=MoeSpec(experts=EXPERTS, top_k=TOP_K, expert_ffn_hidden=FE))
EXPERT = 3 * D * FE
"""Parameters of one routed expert."""


def _plan(gpus: int, **knobs: object) -> Plan:
    return Plan.for_strategy("fsdp", gpus=gpus, seq_len=SEQ, **knobs)


def test_all_to_alls_per_step_and_their_bytes() -> None:
    """Four all-to-alls per MoE block (dispatch and combine, forward and backward), two
    more with full recomputation; each carries tokens x top_k x d in bf16, 7/8 of it to
    other ranks on a group of 8."""
    for ac, calls in (("none", 4), ("selective", 4), ("full", 6)):
        ops = [o for o in lower(MOE, HW, _plan(8, ep=8, recompute=ac)).ops
               if o.kind == "all_to_all"]
        assert len(ops) == calls * LAYERS, ac
        size = SEQ * TOP_K * D * 2
        assert {o.size_bytes for o in ops} == {size}
        assert {o.bus_bytes for o in ops} == {size * 7 / 8}
        assert {o.group for o in ops} == {"ep"}


def test_all_to_all_time_alone_is_its_bytes_over_the_links() -> None:
    """Inside a node: NCCL's base and one NVLink step, then 7/8 of the bytes over NVLink.
    Over two nodes (ep 16, 8 a node): 8 of 15 peers' slices leave through the NIC, which
    is the slower link, so the NIC sets the time."""
    size = SEQ * TOP_K * D * 2.0
    link = HW.intra_node
    one = place(_plan(8, ep=8), HW).group("ep")
    expected = (8.4e-6 + link.latency_s + size * 7 / 8 / link.achievable_bytes_per_s
                / link.kind_efficiency["all_gather"])
    assert collective_time_s("all_to_all", size, one, HW) == pytest.approx(expected)
    two = place(_plan(16, ep=16), HW).group("ep")
    nic = HW.inter_node
    expected = (8.4e-6 + link.latency_s + nic.latency_s + size * 15 / 16 * 8 / 15
                / nic.achievable_bytes_per_s / nic.kind_efficiency["all_gather"])
    assert collective_time_s("all_to_all", size, two, HW) == pytest.approx(expected)


def test_ep_groups_are_carved_innermost_from_the_shard_group() -> None:
    placement = place(_plan(64, ep=8), HW)
    ep, experts = placement.group("ep"), placement.group("expert_shard")
    assert (ep.ranks, ep.spans_nodes) == (8, False)
    # The ranks holding the same experts, 8 apart: one a node.
    assert (experts.ranks, experts.ranks_per_node) == (8, 1)


def test_expert_state_is_sharded_over_the_ranks_holding_those_experts() -> None:
    """The rank holds experts/ep of them, sharded over dp_shard/ep ranks: as many
    elements as without EP (the same state spread otherwise), and its gathered unit
    holds the dense part and only its own experts."""
    plain = lower(MOE, HW, _plan(16))
    ep = lower(MOE, HW, _plan(16, ep=8))
    state = {b.name: b.bytes for b in plain.baseline}
    assert {b.name: b.bytes for b in ep.baseline} == state
    # Two norms, q/k/v/o, and the router's 8 rows padded to one row on each of 16 ranks.
    dense = 2 * D + 4 * D * D + 16 * D
    gathers = [o for o in ep.ops if o.kind == "all_gather" and o.unit == 0
               and "forward" in o.name and o.microbatch == 0]
    dense_ag, expert_ag = gathers
    assert dense_ag.group == "shard" and expert_ag.group == "expert_shard"
    assert dense_ag.size_bytes == dense * 2
    assert expert_ag.size_bytes == EXPERTS // 8 * EXPERT * 2
    whole = next(o for o in plain.ops if o.kind == "all_gather" and o.unit == 0)
    assert whole.size_bytes == pytest.approx(MOE.params_per_block * 2, rel=1e-3)


def test_imbalance_and_capacity_set_the_busiest_ranks_share() -> None:
    """Dropless routing with imbalance 1.5 sends the busiest rank 1.5x the mean tokens
    and gives it 1.5x the expert GEMMs; a capacity factor pads every buffer to it."""
    base = lower(MOE, HW, _plan(8, ep=8))
    skewed = lower(MOE, HW, _plan(8, ep=8, expert_imbalance=1.5))
    capped = lower(MOE, HW, _plan(8, ep=8, expert_imbalance=1.5, capacity_factor=1.25))
    size = SEQ * TOP_K * D * 2
    a2a = {name: {o.size_bytes for o in s.ops if o.kind == "all_to_all"}
           for name, s in (("base", base), ("skewed", skewed), ("capped", capped))}
    assert a2a == {"base": {size}, "skewed": {1.5 * size}, "capped": {1.25 * size}}
    expert_flops = 2 * SEQ * TOP_K * EXPERT  # the forward of one block's routed GEMMs
    fwd = {name: next(o.flops for o in s.ops if o.name == "unit 0 forward (mb 0)")
           for name, s in (("base", base), ("skewed", skewed))}
    assert fwd["skewed"] - fwd["base"] == pytest.approx(0.5 * expert_flops)


def test_ep_shrinks_the_all_gathers_and_adds_all_to_alls_in_the_simulation() -> None:
    """What EP trades, as the engine plays it: the per-step all-gather bytes fall from
    every expert to the rank's own, and all-to-all bytes appear."""
    plain = simulate(MOE, HW, _plan(8))
    ep = simulate(MOE, HW, _plan(8, ep=8))
    assert "ep" not in plain.comm_bus_bytes and ep.comm_bus_bytes["ep"] > 0
    assert ep.comm_bus_bytes["all_gather"] < 0.5 * plain.comm_bus_bytes["all_gather"]
    assert ep.exposed_by_kind_s.get("all_to_all", 0.0) > 0


@pytest.mark.parametrize(("model", "knobs", "field"), [
    (MOE.__class__(**{**MOE.to_dict(), "moe": None}), {"ep": 2}, "plan.ep"),
    (MOE, {"ep": 16}, "plan.ep"),  # does not divide the 8 experts (dp 16 allows it)
])
def test_impossible_ep_plans_name_the_field(model: ModelSpec, knobs: dict,
                                            field: str) -> None:
    with pytest.raises(ConfigError) as e:
        check_plan(model, HW, _plan(16, **knobs), gpus=16)
    assert e.value.field == field


def test_ep_with_a_program_that_does_not_run_it_is_refused_in_one_line() -> None:
    with pytest.raises(ConfigError, match="expert parallelism is modelled with FSDP2"):
        Plan.for_strategy("zero3", gpus=8, seq_len=SEQ, ep=2)
    result = CliRunner().invoke(app, ["simulate", "--model", "7b", "--gpus", "8",
                                      "--strategy", "fsdp", "--ep", "2"])
    assert result.exit_code == 2
    assert result.output.strip().splitlines()[-1].startswith("error: plan.ep=2")


# ------------------------------------------------------------ DeepSpeed-MoE (ZeRO-1/2)
@pytest.mark.parametrize("strategy", ["zero1", "zero2"])
def test_deepspeed_moe_groups_its_experts_apart(strategy: str) -> None:
    """DeepSpeed-MoE under ZeRO-1/2 (stage_1_and_2.py _configure_moe_settings): the rank
    holds the dense parameters and its experts/ep in 16-bit; the experts are a parameter
    group of their own, partitioned over the dp_shard / ep expert-data-parallel ranks,
    their gradients all-reduced there and the updated flat all-gathered there; the
    all-to-alls as with FSDP2. Padding: each flat to a multiple of 2 x its ranks."""
    n, ep = 16, 8
    s = lower(MOE, HW, Plan.for_strategy(strategy, gpus=n, seq_len=SEQ, ep=ep))
    dense = MOE.num_params - LAYERS * EXPERTS * EXPERT
    local = LAYERS * EXPERTS // ep * EXPERT

    def pad(elems: int, ranks: int) -> int:
        return -(-elems // (2 * ranks)) * 2 * ranks

    state = {b.name: b.bytes for b in s.baseline}
    assert state["state/params"] == (pad(dense, n) + pad(local, n // ep)) * 2
    partition = pad(dense, n) // n + pad(local, n // ep) // (n // ep)
    assert state["state/master_params"] == partition * 4
    reduces = [o for o in s.ops if o.kind == "all_reduce" and o.name.startswith("bucket")]
    by_group = {g: sum(o.size_bytes for o in reduces if o.group == g)
                for g in ("shard", "expert_shard")}
    assert by_group == {"shard": dense * 2, "expert_shard": local * 2}
    gathers = {o.group: o.size_bytes for o in s.ops if o.name.startswith("param all-gather")}
    assert gathers == {"shard": pad(dense, n) * 2, "expert_shard": pad(local, n // ep) * 2}
    assert sum(o.kind == "all_to_all" for o in s.ops) == 4 * LAYERS


def test_deepspeed_moe_fits_where_replicated_experts_do_not() -> None:
    """What DeepSpeed-MoE is for, as the engine plays it: Mixtral under ZeRO-1 on 64
    GPUs holds all 8 experts' 16-bit weights and gradients on every rank without EP
    (past 139.8 GiB), one expert's with ep 8."""
    from zsim.spec.registry import resolve_model

    mixtral = resolve_model("mixtral")
    plain = simulate(mixtral, HW, Plan.for_strategy("zero1", gpus=64, seq_len=4096,
                                                    recompute="full"))
    ep = simulate(mixtral, HW, Plan.for_strategy("zero1", gpus=64, seq_len=4096,
                                                 recompute="full", ep=8))
    assert not plain.fits and ep.fits
    # 16-bit parameters and gradients: 2 + 2 bytes a parameter, 7/8 of the experts gone.
    saved = 4 * 32 * 7 * 3 * 4096 * 14336
    assert plain.baseline_memory_bytes - ep.baseline_memory_bytes == pytest.approx(
        saved / 2, rel=0.02)


@pytest.mark.parametrize(("strategy", "recompute"), [
    ("fsdp", "none"), ("fsdp", "full"), ("hsdp", "selective"), ("zero1", "none"),
    ("zero2", "full")])
def test_the_closed_form_counts_what_the_schedule_sends(strategy: str,
                                                        recompute: str) -> None:
    """zsim.analytic.comm.step_comm (the planner's comm/step) against the lowered
    schedule, kind by kind, under expert parallelism: the all-to-alls exactly, the
    collectives within FSDP2's and DeepSpeed's padding."""
    from zsim.analytic.comm import step_comm

    plan = Plan.for_strategy(strategy, gpus=16, seq_len=SEQ, ep=4, recompute=recompute,
                             shard_group=8 if strategy == "hsdp" else None)
    closed = step_comm(MOE, plan, HW).bus_bytes
    lowered: dict[str, float] = {}
    for op in lower(MOE, HW, plan).ops:
        if op.is_collective and op.group_ranks > 1:
            lowered[op.kind] = lowered.get(op.kind, 0.0) + op.bus_bytes
    assert closed["all_to_all"] == lowered["all_to_all"]
    for kind in ("all_gather", "reduce_scatter", "all_reduce"):
        assert closed[kind] == pytest.approx(lowered.get(kind, 0.0), rel=1e-3), kind


# ------------------------------------------------------------ EP with pipeline stages
def test_ep_inside_pipeline_stages_by_hand() -> None:
    """EP with PP (DeepSeek-V3's layout): each stage's experts split over the EP group
    carved from its data-parallel ranks. 16 GPUs, pp 2 (2 blocks a stage), dp_shard 8,
    ep 8, 4 micro-batches: a rank sends 2 blocks x 4 micro-batches x 4 all-to-alls of
    tokens x top_k x d in bf16, 7/8 of each to its peers, and they block its stages for
    as many calls alone; its state is the same as without EP and its gathered stage
    (FSDP2 keeps it gathered across micro-batches under PP) lacks 7 of each block's 8
    experts."""
    def pp_plan(ep: int) -> Plan:
        return Plan.for_strategy("fsdp", gpus=16, seq_len=SEQ, pp=2, grad_accum=4, ep=ep)

    plain, ep = simulate(MOE, HW, pp_plan(1)), simulate(MOE, HW, pp_plan(8))
    calls = 2 * 4 * 4
    size = SEQ * TOP_K * D * 2
    assert ep.comm_bus_bytes["ep"] == calls * size * 7 / 8
    assert "ep" not in plain.comm_bus_bytes
    a2a = collective_time_s("all_to_all", size, place(pp_plan(8), HW).group("ep"), HW, "bf16")
    assert ep.exposed_by_kind_s["all_to_all"] == pytest.approx(calls * a2a)
    assert ep.baseline_memory_bytes == plain.baseline_memory_bytes
    gathered = {r.plan_label: r.memory_at_peak["gathered_params"] for r in (plain, ep)}
    assert gathered[plain.plan_label] - gathered[ep.plan_label] == pytest.approx(
        2 * (EXPERTS - EXPERTS // 8) * EXPERT * 2)
    assert ep.step_time_s > plain.step_time_s  # the all-to-alls block; no gathers to save


def test_the_planner_searches_ep_with_pipeline_stages() -> None:
    """The 2-D/3-D search enumerates EP degrees inside pipeline stages, and every such
    plan's replay names its all-to-all time."""
    from zsim.parallel_planner import choose_parallel, parallel_plans

    plans = parallel_plans(MOE, HW, gpus=16, seq_len=SEQ, global_batch=64)
    both = [p for p in plans if p.pp > 1 and p.ep > 1]
    assert {p.ep for p in both} == {2, 4, 8}
    choices = choose_parallel(MOE, HW, [p for p in both if p.pp_schedule == "1f1b"])
    assert all(c.result is not None and c.result.exposed_by_kind_s["all_to_all"] > 0
               for c in choices if c.fits)


# ------------------------------------------------------------ EP with tensor parallelism
def _tp_plan(ep: int, **knobs: object) -> Plan:
    return Plan.for_strategy("fsdp", gpus=16, seq_len=SEQ, tp=2, sp=True, ep=ep, **knobs)


def test_ep_with_tp_routes_each_tp_ranks_sequence_shard() -> None:
    """EP with TP and SP as torchtitan's moe_sharding runs it: EP carved from dp_shard x
    tp (16 ranks: ep 8 innermost, the experts' state over the 2 ranks 8 apart that hold
    the same expert); experts whole, not TP-sharded; the MoE's input left
    sequence-sharded, so each TP rank routes its half of the tokens and, with no shared
    experts, the MLP has no TP collectives. By hand: all-to-alls of SEQ/2 x top_k x d in
    bf16, four a block; TP calls only the attention's all-gather and reduce-scatter."""
    placement = place(_tp_plan(8), HW)
    ep, experts = placement.group("ep"), placement.group("expert_shard")
    assert (ep.ranks, ep.spans_nodes) == (8, False)
    assert (experts.ranks, experts.ranks_per_node) == (2, 1)
    with_ep, tp_only = lower(MOE, HW, _tp_plan(8)), lower(MOE, HW, _tp_plan(1))
    a2a = [o for o in with_ep.ops if o.kind == "all_to_all"]
    assert len(a2a) == 4 * LAYERS
    assert {o.size_bytes for o in a2a} == {SEQ // 2 * TOP_K * D * 2}

    def tp_calls(s: object, phase: str) -> int:
        return sum(o.group == "tp" and o.unit == 0 and f" {phase} " in o.name
                   for o in s.ops)  # type: ignore[attr-defined]

    assert (tp_calls(with_ep, "forward"), tp_calls(tp_only, "forward")) == (2, 4)
    # One whole expert gathered per block (over its 2 ranks), against all 8 experts'
    # TP halves without EP.
    gathered = {o.size_bytes for o in with_ep.ops
                if o.kind == "all_gather" and o.group == "expert_shard"}
    assert gathered == {EXPERT * 2}
    # The same state: each rank holds 1/16 of the experts either way.
    assert ({b.name: b.bytes for b in with_ep.baseline}
            == {b.name: b.bytes for b in tp_only.baseline})


def test_ep_with_tp_keeps_the_routed_work_and_shrinks_what_it_saves() -> None:
    """Half the tokens at the whole width is the same routed work as all of them at half
    the width; the routing tensors saved for backward are of the rank's half."""
    from zsim.analytic.activations import block_saved_tensors
    from zsim.analytic.compute import routed_expert_flops
    from zsim.schedule.lower import rank_model

    shard_ep, shard_tp = rank_model(MOE, _tp_plan(8)), rank_model(MOE, _tp_plan(1))
    work = {name: routed_expert_flops(m, micro_batch=1, seq_len=SEQ, phase="forward").matmul
            for name, m in (("ep", shard_ep), ("tp", shard_tp))}
    assert work["ep"] == work["tp"] == 2 * SEQ // 2 * TOP_K * EXPERT
    saved = {t.name: t.bytes for t in block_saved_tensors(shard_ep, micro_batch=1,
                                                          seq_len=SEQ, recompute="none")}
    assert saved["moe.routed_input"] == SEQ // 2 * TOP_K * D * 2
    assert saved["moe.router.gate.input"] == SEQ // 2 * D * 2


def test_ep_with_tp_needs_sequence_parallelism() -> None:
    plan = Plan.for_strategy("fsdp", gpus=16, seq_len=SEQ, tp=2, ep=8)
    with pytest.raises(ConfigError) as e:
        check_plan(MOE, HW, plan, gpus=16)
    assert e.value.field == "plan.sp"


@pytest.mark.parametrize("knobs", [{"cp": 2}, {"tp": 2, "sp": True},
                                   {"cp": 2, "tp": 2, "sp": True}])
def test_the_closed_form_counts_each_ranks_sequence_shard(knobs: dict) -> None:
    """Under CP and TP a rank routes its sequence shard: the closed form's all-to-all
    bytes equal the schedule's."""
    from zsim.analytic.comm import step_comm

    plan = Plan.for_strategy("fsdp", gpus=16, seq_len=SEQ, ep=4, **knobs)
    lowered = sum(o.bus_bytes for o in lower(MOE, HW, plan).ops if o.kind == "all_to_all")
    assert step_comm(MOE, plan, HW).bus_bytes["all_to_all"] == lowered
