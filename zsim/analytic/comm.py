"""Per-step communication of a plan: the process groups a plan's collectives run over
and the closed-form volume and time of its collectives per optimizer step.

One call's bytes, links, algorithm and time live in zsim.analytic.collectives.

References:
- ZeRO communication: Rajbhandari et al. 2020, Sec. 7 (2 Psi for DDP and ZeRO-1/2,
  3 Psi for ZeRO-3, Psi the 16-bit model). The programs depart from it where step_comm
  says: torch DDP all-reduces fp32 buckets under autocast (2 x 2 Psi), DeepSpeed's
  ZeRO-1/2 all-reduce their buckets (3 Psi with the gather), FSDP gathers its root once
  per micro-batch and DeepSpeed's ZeRO-3 keeps some parameters gathered between uses.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from zsim.analytic.collectives import CommGroup, bus_bytes, collective_time_s
from zsim.analytic.placement import place
from zsim.spec.deepspeed import ZERO_STAGES, DeepSpeedZero
from zsim.spec.hardware import COLLECTIVES, HardwareProfile
from zsim.spec.model import ModelSpec
from zsim.spec.plan import Plan
from zsim.units import dtype_bytes


def shard_group(plan: Plan, hw: HardwareProfile) -> CommGroup:
    """The group a model-state shard is spread over: the dp_shard x cp ranks of FSDP's
    flattened dp_shard_cp group (Plan.dp_shard_cp; consecutive ranks of a purely
    data-parallel plan, tp ranks apart with CP, tp * pp apart with PP,
    zsim.analytic.placement)."""
    return place(plan, hw).group("dp_shard_cp")


def replicate_group(plan: Plan, hw: HardwareProfile) -> CommGroup:
    """Ranks holding the same shard in different replicas: one per shard group, so one
    per node once a shard group fills a node."""
    return place(plan, hw).group("dp_replicate")


def ddp_bucket_dtype(plan: Plan) -> str:
    """The dtype of torch DDP's gradient buckets, and so of its all-reduces (impl
    "torch": ddp, and zero1's DDP under ZeroRedundancyOptimizer): the parameters' own.
    The reducer allocates each bucket in its parameters' dtype and the gradients must
    match it (torch/csrc/distributed/c10d/reducer.cpp, initialize_buckets and
    check_grad_layout); the all-reduce runs on the bucket. The module's parameters are
    the master weights (plan.master_dtype): fp32 under torch.autocast, whatever the
    compute dtype, and the compute dtype only for a model cast to it (master_dtype equal
    to param_dtype). DDP has no reduce dtype of its own, so plan.reduce_dtype is not read:
    a bucket cast down in flight (the bf16_compress_hook / fp16_compress_hook comm hooks)
    or DDP's private _MixedPrecision (buckets in its param_dtype, all-reduced in its
    reduce_dtype) is not modelled."""
    return plan.master_dtype


@dataclass(frozen=True, slots=True, kw_only=True)
class StepComm:
    """Per-rank communication of one optimizer step, by collective and group."""

    size_bytes: dict[str, float]
    """Full tensor bytes through each collective kind per step (nccl-tests 'size')."""
    bus_bytes: dict[str, float]
    """Bytes each rank puts on the wire per collective kind per step."""
    time_s: dict[str, float]
    """Alpha-beta time per collective kind, if each ran alone (no overlap), seconds."""

    @property
    def total_bus_bytes(self) -> float:
        return sum(self.bus_bytes.values())

    @property
    def total_time_s(self) -> float:
        return sum(self.time_s.values())


def step_comm(model: ModelSpec, plan: Plan, hw: HardwareProfile) -> StepComm:
    """Data-parallel communication per rank per optimizer step, as the plan's program
    issues it, by the closed form its registry entry names (ProgramEntry.comm,
    zsim.spec.programs.CommPattern); zsim.schedule.programs lowers the same collectives
    call by call, and the two agree kind by kind (tests/schedule/test_comm_closed_form.py)
    but for padding and ZeRO-3's gathers (_zero3_gathered_elems). P = parameters; a =
    param-dtype bytes, r = reduce-dtype bytes, g = ddp_bucket_dtype bytes.

    - ddp (torch: ddp, zero1 = DDP + ZeroRedundancyOptimizer): all_reduce of P x g over
      the data-parallel group once per step (no_sync before the last micro-batch): fp32
      under autocast, so 2 (n-1)/n 4P bytes where the ZeRO paper (Sec. 7) counts 2
      (n-1)/n 2P for 16-bit gradients. zero1 also sends each rank's updated partition to
      the others: an all_gather of P x g (zsim's stand-in for torch's broadcasts).
    - zero (deepspeed), stages 1/2: all_reduce of P x r in buckets (DeepSpeed 0.19's
      use_multi_rank_bucket_allreduce, the default: each bucket all-reduced whole and
      each rank keeping its partition's slice, not reduce-scattered) once per step for
      stage 1 and every micro-batch for stage 2, then all_gather of the flat 16-bit
      parameters (P x a). r is communication_data_type, which defaults to the 16-bit
      dtype in bf16 and fp16 mode. Every stage's step also all-reduces its gradient
      norm and, where it checks, its inf/NaN flag (a few bytes each).
    - zero, stage 3: all_gather per micro-batch of the fetched parameters in forward and
      of those not kept gathered again by their recomputation or backward, and of the
      persistent ones once after the step (_zero3_gathered_elems); reduce_scatter of
      P x r every micro-batch.
    - fsdp (fsdp2, fsdp1): all_gather per micro-batch of each block unit in forward and,
      when resharding after forward, again in backward, and of the root (embeddings,
      final norm, output) once (never resharded after forward); reduce_scatter of P x r
      over the shard group once per step (FSDP2 with grad_sync "last") or per
      micro-batch (grad_sync "every"; FSDP1 without no_sync:
      ProgramEntry.reduces_each_micro_batch); hsdp also all-reduces the P/dp_shard shard
      across replicas as often. With context parallelism the shard group is the
      dp_shard x cp ranks (shard_group), as torchtitan's FSDP over dp_shard_cp, and the
      replicas all-reduce the P/(dp_shard x cp) shard.
    """
    a, r = dtype_bytes(plan.param_dtype), dtype_bytes(plan.reduce_dtype)
    mbs = plan.grad_accum
    kinds = (*COLLECTIVES, "all_to_all") if plan.ep > 1 else COLLECTIVES
    sizes: dict[str, float] = dict.fromkeys(kinds, 0.0)
    bus: dict[str, float] = dict.fromkeys(kinds, 0.0)
    time: dict[str, float] = dict.fromkeys(kinds, 0.0)

    def add(kind: str, size: float, group: CommGroup, dtype: str, times: int = 1) -> None:
        if group.ranks <= 1 or size == 0:
            return
        sizes[kind] += times * size
        bus[kind] += times * bus_bytes(kind, size, group.ranks)
        time[kind] += times * collective_time_s(kind, size, group, hw, dtype)

    shard, repl = shard_group(plan, hw), replicate_group(plan, hw)
    # Expert parallelism: the rank's routed experts are reduced and gathered over their
    # own group (the ranks holding the same experts), the rest over the shard group.
    experts = expert_elems(model, plan)
    n_params = model.ep_share(plan.ep).num_params - experts
    expert_group = place(plan, hw).group("expert_shard")
    if experts:
        _expert_parallel_comm(model, plan, hw, experts, expert_group, add)
    if plan.program.comm == "ddp":
        bucket = ddp_bucket_dtype(plan)
        g = n_params * dtype_bytes(bucket)
        add("all_reduce", g, repl if plan.strategy == "ddp" else shard, bucket)
        if plan.strategy == "zero1":
            add("all_gather", g, shard, bucket)
    elif plan.program.comm == "zero":
        stage = ZERO_STAGES[plan.strategy]
        # The step's scalars: the inf/NaN flag (1 B) where it checks, the gradient norm
        # (an fp32 sum; stage 3's a float64 one).
        if plan.options_as(DeepSpeedZero).scans_for_overflow(stage, plan.param_dtype):
            add("all_reduce", 1, shard, "fp32")
        add("all_reduce", 8 if stage == 3 else 4, shard, "fp32")
        if stage < 3:
            add("all_reduce", n_params * r, shard, plan.reduce_dtype,
                times=mbs if stage == 2 else 1)
            add("all_gather", n_params * a, shard, plan.param_dtype)
        else:
            per_mb, after_step = _zero3_gathered_elems(model, plan)
            add("all_gather", per_mb * a, shard, plan.param_dtype, times=mbs)
            add("all_gather", after_step * a, shard, plan.param_dtype)
            add("reduce_scatter", n_params * r, shard, plan.reduce_dtype, times=mbs)
    else:
        blocks = n_params - model.root_params
        gathers = 2 if plan.reshard_after_forward else 1
        if experts:
            add("all_gather", experts * a, expert_group, plan.param_dtype,
                times=gathers * mbs)
        add("all_gather", blocks * a, shard, plan.param_dtype, times=gathers * mbs)
        add("all_gather", model.root_params * a, shard, plan.param_dtype, times=mbs)
        reductions = (mbs if plan.program.reduces_each_micro_batch or plan.grad_sync == "every"
                      else 1)
        add("reduce_scatter", n_params * r, shard, plan.reduce_dtype, times=reductions)
        if experts:
            add("reduce_scatter", experts * r, expert_group, plan.reduce_dtype,
                times=reductions)
        shard_elems = (n_params / plan.dp_shard_cp
                       + (experts / plan.expert_shard_ranks if experts else 0.0))
        add("all_reduce", shard_elems * r, repl, plan.reduce_dtype, times=reductions)
    return StepComm(size_bytes=sizes, bus_bytes=bus, time_s=time)


def expert_elems(model: ModelSpec, plan: Plan) -> int:
    """Elements of the routed experts one rank holds under expert parallelism (every
    block's: the simulator runs each as an MoE block); 0 without EP."""
    if plan.ep == 1 or model.moe is None:
        return 0
    return model.num_layers * model.moe.experts // plan.ep * model.expert_params


def _expert_parallel_comm(model: ModelSpec, plan: Plan, hw: HardwareProfile, experts: int,
                          group: CommGroup, add: Callable[..., None]) -> None:
    """What expert parallelism adds, as zsim.schedule.build.expert_parallel and the
    programs issue it: the all-to-alls (four per MoE block and micro-batch, six with full
    recomputation; tokens x top_k x d_model x the busiest rank's load each), and for
    DeepSpeed-MoE (ZeRO-1/2) its expert group's gradient all-reduce and parameter
    all-gather (FSDP2's expert collectives are added with its own)."""
    assert model.moe is not None
    a, r = dtype_bytes(plan.param_dtype), dtype_bytes(plan.reduce_dtype)
    calls = 4 + (2 if plan.recompute == "full" else 0)
    # Each CP and TP rank routes its sequence shard (zsim.schedule.build.ep_bytes).
    tokens = plan.micro_batch * plan.seq_len // (plan.cp * plan.tp)
    size = tokens * model.moe.top_k * model.d_model * a * plan.routed_load
    add("all_to_all", size, place(plan, hw).group("ep"), plan.param_dtype,
        times=calls * model.num_layers * plan.grad_accum)
    if plan.program.comm == "zero":
        stage = ZERO_STAGES[plan.strategy]
        add("all_reduce", experts * r, group, plan.reduce_dtype,
            times=plan.grad_accum if stage == 2 else 1)
        add("all_gather", experts * a, group, plan.param_dtype)


def _zero3_gathered_elems(model: ModelSpec, plan: Plan) -> tuple[float, float]:
    """DeepSpeed ZeRO-3's all-gathered elements: (per micro-batch, once after the step).

    A parameter of at most param_persistence_threshold elements stays whole on every
    rank: never fetched, its partition gathered once after the step (_post_step). Every
    other one is fetched (its padded partitions, ceil(numel / N) x N elements) by the
    first submodule call that uses it in a micro-batch and again by a later call unless
    it was kept gathered in between. zsim.schedule.programs.deepspeed_fetch replays the
    coordinator call by call; counted here a block at a time, it keeps a parameter
    (partitioned_param_coordinator.py) when
    - its next use comes within max_reuse_distance elements of the trace: block i's
      forward use is next followed, after the head's two calls, by 2 (L-1-i) blocks'
      calls (3 (L-1-i) with recomputation, whose re-run forward then comes straight
      before the backward); or
    - the prefetch has already gathered it for that use: the coordinator prefetches, in
      trace order, until max_live_parameters elements are gathered, skipping over what
      is gathered already, and does not release a parameter it has passed a later use
      of. Block i's backward (or re-run) use is passed once blocks i..L-1 and the head
      fit in max_live_parameters at once; the embedding's is not from the first call,
      where the prefetch has gathered only prefetch_bucket_size elements ahead.
    The output projection is reused at once (its forward and backward calls are
    adjacent), a recomputed block's backward likewise. Granularity (a block kept in part)
    leaves the replay a little apart from this.
    """
    n, ds = plan.dp_shard, plan.options_as(DeepSpeedZero)

    def sizes(shapes: list[tuple[int, ...]]) -> tuple[int, int, int]:
        """(all elements, padded elements fetched, elements persistent)."""
        total = fetch = keep = 0
        for shape in shapes:
            numel = math.prod(shape)
            total += numel
            if numel <= ds.param_persistence_threshold:
                keep += numel
            else:
                fetch += -(-numel // n) * n
        return total, fetch, keep

    def kept(distance: int, distinct: int) -> bool:
        return distance < ds.max_reuse_distance or distinct <= ds.max_live_parameters

    block_all, block_f, block_keep = sizes([s for _, s in model.block_tensors()])
    root = model.root_tensors()
    head_all, head_f, head_keep = sizes([s for name, s in root
                                         if name.startswith(("norm.", "output."))])
    emb_all, emb_f, emb_keep = sizes([s for name, s in root
                                      if not name.startswith(("norm.", "output."))])
    if model.tied_embeddings:  # the output call uses the embedding too
        head_all += model.vocab_size * model.d_model
    layers, recompute = model.num_layers, plan.recompute != "none"
    blocks_all = layers * block_all
    per_mb = float(emb_f + block_f * layers + head_f)  # forward
    for i in range(layers):
        later = layers - 1 - i
        distance = (3 if recompute else 2) * later * block_all + 2 * head_all
        if not kept(distance, (later + 1) * block_all + head_all):
            per_mb += block_f  # gathered again by its recomputation or backward
    ahead = ds.prefetch_bucket_size
    tied = sizes([(model.vocab_size, model.d_model)])[1] if model.tied_embeddings else 0
    if tied:
        # The shared matrix: embedding -> output projection (the prefetch reaches it from
        # the first call only within prefetch_bucket_size), then output -> embedding.
        if not (blocks_all < ds.max_reuse_distance or layers * block_f < ahead):
            per_mb += tied
        if not kept(blocks_all, blocks_all + head_all + emb_all):
            per_mb += tied
    if emb_f - tied and not (2 * blocks_all + 2 * head_all < ds.max_reuse_distance
                             or layers * block_f + head_f < ahead):
        per_mb += emb_f - tied  # embedding forward -> embedding backward
    return per_mb, float(block_keep * layers + head_keep + emb_keep)
