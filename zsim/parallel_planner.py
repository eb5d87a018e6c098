"""Planner of 2-D and 3-D plans: every factorization of a world into tensor, context,
pipeline and data parallelism (sharded, or sharded and replicated), with the micro-batches
a global batch gives each, ranked, with one line on why each loses.

Owns the enumeration (`parallel_plans`), the estimate of each factorization, the
simulation of the best few and the ranking (`choose_parallel`). An estimate replays the
plan's pipeline (zsim.engine.pipeline_replay; a plan without PP is a one-stage pipeline) with
each stage's work (zsim.schedule.pipeline_work) and takes its memory from the program's
floor (zsim.schedule.lower.memory_floor_bytes) or, with PP, from each pipeline rank's
peak; a pipeline's estimate is its simulation (zsim.simulate.simulate replays the same
pipeline); without PP the best `top` fitting estimates then run through the engine
(zsim.simulate.simulate); simulated plans rank first, by throughput. No I/O.

Every plan runs FSDP2 (fully_shard on a 2-D or 3-D mesh, as torchtitan composes it) or
torch DDP (the state replicated over the data-parallel ranks, as Megatron-LM runs without
its distributed optimizer) over the data-parallel axes, with sequence parallelism
whenever tp > 1 (torchtitan's Llama plan), TP inside a node, a global batch fixed in
sequences so that every plan trains the same tokens per step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from zsim.engine.pipeline_replay import run_pipeline
from zsim.errors import ConfigError
from zsim.multicore import fan_out, simulate_all
from zsim.recommend import Ranked
from zsim.result import Result
from zsim.schedule.lower import (
    check_modelled,
    fixed_bytes,
    memory_floor_bytes,
    rank_model,
    rank_plan,
    saved_activation_bytes,
)
from zsim.schedule.pipeline_order import rank_actions
from zsim.schedule.pipeline_work import pipeline_work
from zsim.simulate import pipeline_result, with_bands
from zsim.spec.consistency import check_plan
from zsim.spec.error_bands import band_pct
from zsim.spec.hardware import HardwareProfile
from zsim.spec.model import ModelSpec
from zsim.spec.plan import Plan
from zsim.units import GiB, dtype_bytes

RECOMPUTE: tuple[str, ...] = ("none", "selective", "full")
CP_DEGREES: tuple[int, ...] = (1, 2, 4, 8)
"""Context-parallel degrees enumerated."""
MAX_PP = 32
"""Largest pipeline degree enumerated."""
EP_MAX = 256
"""Largest expert-parallel degree enumerated (DeepSeek-V3's 256 experts, one a rank)."""
TOP = 3
"""Fitting plans simulated in full (by estimated throughput)."""
ROUNDS = 4
"""Rounds of TOP simulations at most, while simulated plans turn out not to fit or a plan
estimated faster than the fastest simulated one is left."""


def parse_global_batch(text: str, seq_len: int) -> int:
    """A --global-batch value in sequences: "512" is 512 sequences; "4M tokens",
    "4194304t" or "4Mt" are tokens (K = 2^10, M = 2^20), divided by the sequence length.

    Raises:
        ConfigError: not a positive count, or tokens that do not divide into sequences.
    """
    raw = text.strip().lower().replace(" ", "")
    suffix = next((x for x in ("tokens", "tok", "t") if raw.endswith(x)), "")
    tokens = bool(suffix)
    digits = raw[:len(raw) - len(suffix)]
    scale = 1
    if digits[-1:] in ("k", "m"):
        scale = 2**10 if digits[-1] == "k" else 2**20
        digits = digits[:-1]
    if not digits.isdigit() or int(digits) <= 0:
        raise ConfigError("global_batch", text, "must be a positive number of sequences, "
                          "or of tokens with a t suffix (e.g. 512, 4Mt)")
    count = int(digits) * scale
    if not tokens:
        return count
    if count % seq_len:
        raise ConfigError("global_batch", text, f"{count} tokens do not divide into "
                          f"sequences of {seq_len}")
    return count // seq_len


MAX_MICRO_BATCH = 16
"""Largest micro-batch the 2-D/3-D search tries when none is fixed."""


def parallel_plans(model: ModelSpec, hw: HardwareProfile, *, gpus: int, seq_len: int,
                   global_batch: int, micro_batch: int | None = 1,
                   **knobs: object) -> list[Plan]:
    """Every factorization of `gpus` the simulator models (degree_problem: tp dividing a
    node and the heads, cp one of CP_DEGREES (without PP) with the sequence in 2 cp
    chunks, pp dividing the layers up to MAX_PP), 1F1B and (where the layers allow 2
    stages per rank) interleaved 1F1B; FSDP over the data-parallel ranks, HSDP sharding
    over one node's data-parallel ranks, and DDP replicating over them (with CP the state
    is sharded over dp_shard x cp, Plan.dp_shard_cp, so HSDP's shard group is one node's
    data- and context-parallel ranks, the CP ranks alone when they fill it: torchtitan's
    HSDP over (dp_replicate, cp); DDP is left out); each recomputation
    policy; each micro-batch (`micro_batch`, or with None every divisor up to
    MAX_MICRO_BATCH of the sequences the global batch leaves each data-parallel rank);
    grad_accum the micro-batches the global batch (sequences) leaves each
    data-parallel rank, their gradients reduced
    after every micro-batch as torchtitan's loop does (grad_sync "every"), except under
    pipelining, whose stages reduce on the last, and with DDP, run with no_sync until the
    last. Invalid combinations are left out."""
    out: list[Plan] = []
    for tp in range(1, hw.domain_gpus + 1):
        for cp in CP_DEGREES:
            for pp in range(1, MAX_PP + 1):
                if degree_problem(model, hw, gpus=gpus, seq_len=seq_len, tp=tp, cp=cp, pp=pp):
                    continue
                dp = gpus // (tp * cp * pp)
                if global_batch % dp:
                    continue
                per_rank = global_batch // dp
                sizes = [micro_batch] if micro_batch is not None else [
                    b for b in range(1, min(per_rank, MAX_MICRO_BATCH) + 1)
                    if per_rank % b == 0]
                for mb in sizes:
                    if per_rank % mb:
                        continue
                    m = per_rank // mb
                    if pp > 1 and m < pp:
                        continue
                    out += _variants(model, hw, tp=tp, cp=cp, pp=pp, dp=dp, m=m,
                                     seq_len=seq_len, micro_batch=mb, knobs=knobs)
    return out


def degree_problem(model: ModelSpec, hw: HardwareProfile, *, gpus: int, seq_len: int,
                   tp: int = 1, cp: int = 1, pp: int = 1) -> str | None:
    """Why parallel_plans has no plan of these degrees whatever the batch, in words; None
    where it enumerates them."""
    fixed = {name: d for name, d in (("tp", tp), ("cp", cp), ("pp", pp)) if d > 1}
    product = tp * cp * pp
    if gpus % product:
        degrees = " x ".join(fixed)
        what = f"{degrees} = {product}" if len(fixed) > 1 else f"{degrees}={product}"
        return f"{gpus} is not divisible by {what}"
    if hw.domain_gpus % tp:
        return (f"tp={tp} does not divide a {hw.name} {hw.domain_name}'s {hw.domain_gpus} GPUs "
                f"(tensor parallelism stays inside a {hw.domain_name})")
    if model.num_heads % tp or model.num_kv_heads % tp:
        return (f"tp={tp} does not divide {model.name}'s {model.num_heads} attention heads "
                f"and {model.num_kv_heads} key/value heads")
    if cp not in CP_DEGREES:
        return (f"cp={cp} is not a context-parallel degree the planner enumerates "
                f"({', '.join(map(str, CP_DEGREES))})")
    if cp > 1 and seq_len % (2 * cp):
        return (f"a sequence of {seq_len} does not split into 2 x cp = {2 * cp} chunks "
                "(load-balanced ring attention)")
    if pp > MAX_PP:
        return f"pp={pp} exceeds the {MAX_PP} pipeline stages the planner enumerates"
    if model.num_layers % pp:
        return f"pp={pp} does not divide {model.name}'s {model.num_layers} layers"
    if cp > 1 and pp > 1:
        return "the planner does not combine context and pipeline parallelism"
    return None


def _variants(model: ModelSpec, hw: HardwareProfile, *, tp: int, cp: int, pp: int, dp: int,
              m: int, seq_len: int, micro_batch: int, knobs: dict[str, object]) -> list[Plan]:
    schedules: list[tuple[str, int]] = [("1f1b", 1)]
    if pp > 1 and model.num_layers % (2 * pp) == 0 and m % max(1, m // pp) == 0:
        schedules.append(("interleaved", 2))
    group = max(1, hw.gpus_per_node // (tp * cp * pp))  # dp_shard filling a node
    shardings = [("fsdp", dp, 1)]
    if group * cp > 1 and group < dp and dp % group == 0:
        shardings.append(("hsdp", group, dp // group))
    shardings.append(("ddp", 1, dp))
    fixed_ep = knobs.pop("ep", None)
    out = []
    for strategy, shard, repl in shardings:
        eps = ([fixed_ep] if fixed_ep is not None
               else ep_degrees(model, shard * cp * tp) if strategy != "ddp" else [1])
        for ep in eps:
            for schedule, virtual in schedules:
                for rc in RECOMPUTE:
                    try:
                        plan = Plan(strategy=strategy, dp_shard=shard, dp_replicate=repl,  # type: ignore[arg-type]
                                    tp=tp, cp=cp, pp=pp, ep=ep, sp=tp > 1,  # type: ignore[arg-type]
                                    pp_schedule=schedule, virtual_stages=virtual,  # type: ignore[arg-type]
                                    micro_batch=micro_batch, grad_accum=m, seq_len=seq_len,
                                    recompute=rc,  # type: ignore[arg-type]
                                    grad_sync="every" if pp == 1 and m > 1
                                    and strategy != "ddp" else "last",
                                    **knobs)  # type: ignore[arg-type]
                        check_plan(model, hw, plan)
                        check_modelled(plan)  # DDP with context parallelism is not
                    except ConfigError:
                        continue
                    out.append(plan)
    return out


def ep_degrees(model: ModelSpec, ranks: int) -> list[int]:
    """The expert-parallel degrees enumerated for an MoE model carved from `ranks`
    (Plan.expert_region, dp_shard x cp x tp): 1 and every power of two dividing both
    them and the experts, up to EP_MAX; [1] for a dense model."""
    if model.moe is None:
        return [1]
    return [ep for ep in (2 ** i for i in range(EP_MAX.bit_length()))
            if ep <= EP_MAX and ranks % ep == 0 and model.moe.experts % ep == 0]


@dataclass(frozen=True, slots=True, kw_only=True)
class Estimate:
    """A factorization's replayed step and memory before the full simulation."""

    plan: Plan
    step_time_s: float
    peak_bytes: float
    hbm_bytes: float
    bubble_fraction: float
    """Share of the step the slowest pipeline rank is idle (0 without PP)."""
    result: Result | None = None
    """With PP, the replay's Result (its simulation: zsim.simulate.pipeline_result)."""

    @property
    def fits(self) -> bool:
        return self.peak_bytes <= self.hbm_bytes

    @property
    def tokens_per_s_per_gpu(self) -> float:
        p = self.plan
        return p.micro_batch * p.seq_len * p.grad_accum / p.model_parallel / self.step_time_s


def estimate(model: ModelSpec, hw: HardwareProfile, plan: Plan) -> Estimate:
    """Replay the plan's pipeline (one stage without PP) on its stages' work; its memory
    floor, or with PP the highest pipeline rank's peak."""
    local, lp = rank_model(model, plan), rank_plan(plan)
    work = pipeline_work(local, hw, lp)
    forward, backward = work.forward_s, work.backward_s
    if plan.pp == 1:
        # Without PP, FSDP2 gathers every unit again each micro-batch (twice when it
        # reshards after forward), overlapping the pass's compute at best.
        regather = work.gather_s
        forward = [max(f, regather) for f in forward]
        backward = [max(b, regather if plan.reshard_after_forward else 0.0)
                    for b in backward]
    actions = [rank_actions(lp, r) for r in range(lp.pp)]
    t = run_pipeline(actions, forward_s=forward, backward_s=backward, send_s=work.send_s)
    ends = [t.spans[r][-1][2] + work.tail_s[r] for r in range(lp.pp)]
    step = max(work.head_s) + max(ends)
    slowest = max(range(lp.pp), key=lambda r: ends[r])
    if plan.pp > 1:
        peak = (max(sum(m.values()) for m in work.memory_bytes)
                + sum(fixed_bytes(local, hw).values()))
    else:
        # The floor, and the unsharded gradients FSDP2 accumulates across micro-batches
        # when only the last one reduces them.
        grads = local.num_params * (dtype_bytes(plan.reduce_dtype)
                                    if plan.accumulates_unsharded_grads else 0)
        peak = sum(memory_floor_bytes(model, plan, hw).values()) + grads
    return Estimate(plan=plan, step_time_s=step, peak_bytes=peak, hbm_bytes=hw.hbm_bytes,
                    bubble_fraction=t.bubble_fraction(slowest) if plan.pp > 1 else 0.0,
                    result=(with_bands(pipeline_result(local, hw, plan, work, t), hw, plan)
                            if plan.pp > 1 else None))


@dataclass(frozen=True, slots=True, kw_only=True)
class ParallelChoice:
    """A factorization after both stages: its estimate, and its Result when simulated."""

    estimate: Estimate
    result: Result | None

    @property
    def plan(self) -> Plan:
        return self.estimate.plan

    @property
    def fits(self) -> bool:
        return self.result.fits if self.result is not None else self.estimate.fits

    @property
    def tokens_per_s_per_gpu(self) -> float | None:
        if self.result is not None:
            return self.result.tokens_per_s_per_gpu
        return self.estimate.tokens_per_s_per_gpu if self.estimate.fits else None

    @property
    def peak_bytes(self) -> float:
        return float(self.result.peak_memory_bytes if self.result is not None
                     else self.estimate.peak_bytes)

    @property
    def bubble_fraction(self) -> float:
        return self.estimate.bubble_fraction


def choose_parallel(model: ModelSpec, hw: HardwareProfile, plans: list[Plan], *,
                    top: int = TOP) -> list[ParallelChoice]:
    """Estimate every plan, simulate the fastest fitting estimates until `top` of them fit
    and none left is estimated faster than the fastest simulated (at most ROUNDS x `top`
    simulations), rank: the simulated fitting plans by simulated
    throughput, then the other fitting estimates by estimated throughput, then the rest
    by peak. Ties keep the order of `plans`."""
    estimates = fan_out(lambda p: estimate(model, hw, p), plans)
    # A pipeline's simulation is the replay its estimate already ran: every fitting PP
    # plan keeps its Result. Without PP the engine runs the fastest fitting estimates.
    results: dict[int, Result] = {
        id(e): e.result for e in estimates if e.result is not None and e.fits}
    fitting = sorted((e for e in estimates if e.fits and e.plan.pp == 1),
                     key=lambda e: -e.tokens_per_s_per_gpu)
    # The floor is a lower bound: simulate in rounds of `top` until `top` fit and the
    # fastest of them beats every estimate left (at most ROUNDS rounds), so the
    # recommendation is a simulated plan and no plan estimated faster goes unsimulated.
    engine: dict[int, Result] = {}
    for start in range(0, min(len(fitting), ROUNDS * top), top):
        batch = fitting[start:start + top]
        engine.update(zip((id(e) for e in batch),
                          simulate_all(model, hw, [e.plan for e in batch]), strict=True))
        done = [r for r in engine.values() if r.fits and r.tokens_per_s_per_gpu]
        left = fitting[start + top:start + top + 1]
        if len(done) >= top and (not left or max(r.tokens_per_s_per_gpu or 0.0 for r in done)
                                 >= left[0].tokens_per_s_per_gpu):
            break
    results.update(engine)
    choices = [ParallelChoice(estimate=e, result=results.get(id(e))) for e in estimates]

    def key(c: ParallelChoice) -> tuple[int, float]:
        if c.fits and c.result is not None:
            return (0, -(c.tokens_per_s_per_gpu or 0.0))
        if c.fits:
            return (1, -(c.tokens_per_s_per_gpu or 0.0))
        return (2, c.peak_bytes)

    return sorted(choices, key=key)


def explain_parallel(choice: ParallelChoice, fastest: Ranked | None) -> str:
    """One line on why `choice`, not tied with the fastest fitting plan, is not
    recommended: it does not fit, or how much slower than `fastest` (a plan of either
    table) it is and why."""
    if not choice.fits:
        return (f"does not fit: peak {choice.peak_bytes / GiB:.1f} GiB > "
                f"{choice.estimate.hbm_bytes / GiB:.1f} GiB HBM")
    assert fastest is not None  # a fitting plan exists
    mine, theirs = choice.tokens_per_s_per_gpu or 0.0, fastest.tokens_per_s_per_gpu or 0.0
    slower = theirs / mine - 1 if mine else math.inf
    if choice.result is None and slower <= 0:
        return (f"estimated {-slower:.1%} faster, not simulated: ranked after the "
                f"simulated plans")
    p, b = choice.plan, fastest.plan
    causes = []
    if choice.bubble_fraction > fastest.bubble_fraction + 0.01:
        causes.append(f"pipeline bubble {choice.bubble_fraction:.0%}")
    if p.recompute != b.recompute and p.recompute != "none":
        causes.append(f"recomputation ({p.recompute})")
    r, rb = choice.result, fastest.result
    if r is not None and rb is not None:
        more = (r.exposed_comm_s or 0.0) - (rb.exposed_comm_s or 0.0)
        if more > 0.001 * (rb.step_time_s or 0.0):
            causes.append(f"{more:.3f} s more exposed communication")
        work, best_work = _compute_per_token_s(r), _compute_per_token_s(rb)
        if work > best_work * 1.01:
            causes.append(f"{work / best_work - 1:.0%} more compute per token")

    where = "simulated" if choice.result is not None else "estimated"
    return (f"slower than the fastest by {slower:.1%} ({where})"
            + (f": {', '.join(causes)}" if causes else ""))


def expert_note(p: Plan, r: Result | None) -> str:
    """What expert parallelism costs plan `p`, for its reason: the all-to-all's exposed
    time (simulated plans that fit) and the busiest EP rank's share of routed tokens (the
    imbalance assumed, or the capacity padding); "" without EP."""
    if p.ep == 1:
        return ""
    load = (f"buffers padded to capacity factor {p.capacity_factor:g}" if p.capacity_factor
            else f"busiest EP rank routed {p.expert_imbalance:g}x the mean tokens"
            + (" (assumed balanced: --expert-imbalance)" if p.expert_imbalance == 1 else ""))
    if r is None or not r.step_time_s:
        return f"EP {p.ep}: {load}"
    a2a = r.exposed_by_kind_s.get("all_to_all", 0.0)
    share = a2a / r.step_time_s if r.step_time_s else 0.0
    return f"EP {p.ep}: all-to-all exposed {a2a:.3f} s ({share:.0%} of the step), {load}"


def _compute_per_token_s(r: Result) -> float:
    """Compute-stream busy time per token a GPU trains (TP/CP collectives that block it
    and recomputation included)."""
    tokens = (r.tokens_per_s_per_gpu or 0.0) * (r.step_time_s or 0.0)
    return (r.compute_time_s or 0.0) / tokens if tokens else 0.0


def parallel_record(model: ModelSpec, choice: ParallelChoice, *, why: str,
                    tier: str = "") -> dict[str, object]:
    """One flat row, units in the keys (see zsim.planner.to_record for `tier` and `why`,
    and for saved_activations_gib_per_microbatch: here a rank's, of its TP shard, CP
    share and pipeline stage)."""
    p, e, r = choice.plan, choice.estimate, choice.result
    step = r.step_time_s if r is not None else (e.step_time_s if e.fits else None)
    tps = choice.tokens_per_s_per_gpu
    band = None if r is None else r.step_time_band_s
    return {
        "plan": p.label, "layout": p.layout, "tp": p.tp, "cp": p.cp, "pp": p.pp, "ep": p.ep,
        "pp_schedule": p.pp_schedule if p.pp > 1 else "-",
        "dp_shard": p.dp_shard, "dp_replicate": p.dp_replicate, "recompute": p.recompute,
        "micro_batch": p.micro_batch, "grad_accum": p.grad_accum,
        "evaluated": "simulated" if r is not None else "estimate",
        "tier": tier,
        "fits": choice.fits, "peak_gib": round(choice.peak_bytes / GiB, 2),
        "saved_activations_gib_per_microbatch": round(
            saved_activation_bytes(model, p) / GiB, 3),
        "step_time_s": None if step is None else round(step, 3),
        "step_time_band_pct": band_pct(band, step),
        "step_time_s_low": None if band is None else round(band[0], 4),
        "step_time_s_high": None if band is None else round(band[1], 4),
        "step_time_band_extrapolated": "" if r is None else "; ".join(
            r.step_time_band_extrapolated),
        "step_time_band_source": None if r is None else r.step_time_band_source,
        "tokens_per_s_per_gpu": None if tps is None else round(tps, 1),
        "mfu": None if r is None or r.mfu is None else round(r.mfu, 4),
        "bubble_fraction": round(e.bubble_fraction, 3),
        "all_to_all_exposed_s": None if r is None else round(
            r.exposed_by_kind_s.get("all_to_all", 0.0), 4),
        "why": why,
    }
