"""Plan: how one training step is parallelised, sharded, recomputed and batched.

Owns the plan fields and their single-field checks; cross-object rules (divisibility by the
model's heads, fitting the cluster) live in zsim.spec.consistency. Imports only zsim.errors,
zsim.units and zsim.spec (the program registry, zsim.spec.programs, and its options
types).

Degrees follow torchtitan: `dp_shard` ranks share one copy of the sharded state,
`dp_replicate` copies of it exist, world = dp_shard * dp_replicate * cp * tp * pp. With
context parallelism FSDP shards the state over dp_shard x cp ranks (`dp_shard_cp`,
torchtitan's flattened mesh of that name): the cp ranks of a sequence hold the same
parameters, so they shard them like data-parallel ranks. Ranks are
placed as torchtitan's ParallelDims builds its mesh (pp, dp_replicate, dp_shard, cp, tp,
outermost first): tensor parallelism innermost, inside a node, then context, pipeline and
data parallelism (zsim.analytic.placement gives each group its links).

Strategy (what is sharded) and program (Plan.impl: the library that runs it) as zsim's
vocabulary (zsim/__init__.py) states them. ZeRO stage -> FSDP2 mapping (cf. torchtitan
docs/fsdp.md):

| strategy        | sharded over dp_shard (x cp)  | FSDP2 equivalent                          |
|-----------------|-------------------------------|-------------------------------------------|
| ddp             | nothing (dp_shard = 1)        | DistributedDataParallel                   |
| zero1           | optimizer state (+ master)    | none exact: ZeroRedundancyOptimizer       |
| zero2           | + gradients                   | ~fully_shard(reshard_after_forward=False) |
| zero3           | + params, fetched per module  | ~fully_shard(reshard_after_forward=True)  |
| fsdp            | + params, regathered in bwd   | fully_shard(reshard_after_forward=True)   |
| fsdp-no-reshard | + params, gathered fwd -> bwd | fully_shard(reshard_after_forward=False)  |
| hsdp            | as fsdp in a shard group,     | 2-D DeviceMesh (replicate, shard) ~ MiCS  |
|                 | replicated across groups      |                                           |

The zero strategies run DeepSpeed's ZeRO by default (impl "deepspeed"); zero1 also runs as
torch's DDP + ZeroRedundancyOptimizer (impl "torch"); the fsdp strategies run FSDP2 by
default and FSDP1 (FullyShardedDataParallel: FULL_SHARD, SHARD_GRAD_OP, HYBRID_SHARD) with
impl "fsdp1". The program registry (zsim.spec.programs) states which program runs which
strategy, and what each asks of a plan (its options, offload, grad_sync, model
parallelism).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any, Literal, TypeVar, get_args

from zsim.errors import ConfigError
from zsim.spec.programs import (
    ProgramEntry,
    ProgramOptions,
    by_options_key,
    default_program,
    program_entry,
    programs,
    programs_for,
)
from zsim.spec.strict import check_keys
from zsim.units import DTYPES, MiB

Strategy = Literal["ddp", "zero1", "zero2", "zero3", "fsdp", "fsdp-no-reshard", "hsdp"]
STRATEGIES: tuple[str, ...] = get_args(Strategy)
Recompute = Literal["none", "selective", "full"]
Optimizer = Literal["adamw", "sgd", "adamw8bit"]
Offload = Literal["none", "optimizer", "params"]
GradSync = Literal["last", "every"]
GRAD_SYNCS: tuple[str, ...] = get_args(GradSync)
Precision = Literal["bf16", "fp16", "fp32", "tf32", "fp8"]
PipelineSchedule = Literal["1f1b", "interleaved", "gpipe"]
PIPELINE_SCHEDULES: tuple[str, ...] = get_args(PipelineSchedule)
OptionsT = TypeVar("OptionsT")
"""An options type (Plan.options_as)."""

OPTIMIZER_STATE_COPIES: dict[str, float] = {
    # AdamW (Loshchilov & Hutter 2019) keeps momentum and variance.
    "adamw": 2.0,
    # SGD with momentum keeps one buffer.
    "sgd": 1.0,
}
"""Optimizer state tensors per parameter, each in optimizer_state_dtype."""

ADAMW8BIT_BYTES_PER_PARAM = 2.0 + 2 * 4 / 2048
"""8-bit AdamW (Dettmers et al. 2022, "8-bit Optimizers via Block-wise Quantization",
Sec. 2): two uint8 states plus one fp32 absmax per 2048-element block for each."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Plan:
    """One parallel training plan for a fixed model and cluster."""

    strategy: Strategy
    """Data-parallel strategy; see the module table for its FSDP2 equivalent."""
    dp_shard: int
    """Ranks that share one sharded copy of the model state (1 for ddp)."""
    dp_replicate: int = 1
    """Replicas of the (sharded) state; gradients are all-reduced across them."""
    tp: int = 1
    """Tensor-parallel degree (1 means disabled)."""
    pp: int = 1
    """Pipeline-parallel degree (1 means disabled)."""
    cp: int = 1
    """Context-parallel degree: ring attention over cp ranks, each holding 1/cp of every
    sequence (1 means disabled)."""
    ep: int = 1
    """Expert-parallel degree (MoE models): each MoE layer's routed experts split over ep
    ranks carved from the dp_shard x cp ranks, as torchtitan's ParallelDims borrows them
    (the innermost ep of dp_shard_cp); tokens reach their experts by an all-to-all
    dispatch and return by an all-to-all combine. The experts' state is sharded by FSDP
    over the dp_shard x cp / ep ranks holding the same experts (torchtitan's
    dp_shard_mod_ep), the dense part over all of dp_shard x cp. 1 means none."""
    capacity_factor: float = 0.0
    """Tokens an expert takes, as a multiple of its even share (tokens x top_k / experts),
    the rest dropped, all-to-all buffers padded to it (DeepSpeed-MoE, GShard); 0 means
    dropless (torchtitan: each all-to-all carries the tokens routed)."""
    expert_imbalance: float = 1.0
    """Routed tokens the busiest EP rank receives over the mean (>= 1): its grouped GEMMs
    and its all-to-all set the step's pace (the slowest rank sets the step). 1 is
    perfectly balanced routing; dropless routing sends imbalance x the mean to that rank,
    a capacity factor caps it at the capacity."""
    sp: bool = False
    """Sequence parallelism with TP (Korthikanti et al. 2022): the norms and residual
    stream sharded on the sequence over the TP group, all-gather before and
    reduce-scatter after each attention and MLP instead of all-reduces; needs tp > 1."""
    async_tp: bool = False
    """Asynchronous TP (torch's micro-pipelined all-gather/reduce-scatter fused with the
    matmuls): TP collectives overlap the block's compute; needs sp."""
    tp_across_nodes: bool = False
    """Allow a TP group larger than a node (tp > gpus_per_node), its collectives on the
    inter-node fabric; without it such a plan is an error."""
    pp_schedule: PipelineSchedule = "1f1b"
    """Pipeline schedule (torch.distributed.pipelining): 1f1b (Schedule1F1B), interleaved
    (ScheduleInterleaved1F1B, `virtual_stages` per rank) or gpipe (ScheduleGPipe); the
    pipeline's micro-batches are `grad_accum`."""
    virtual_stages: int = 1
    """Pipeline stages per rank: >= 2 for the interleaved schedule, 1 otherwise."""
    micro_batch: int = 1
    """Sequences per micro-batch per data-parallel rank."""
    grad_accum: int = 1
    """Micro-batches per optimizer step (gradient accumulation steps)."""
    seq_len: int
    """Tokens per sequence."""
    recompute: Recompute = "none"
    """Activation checkpointing: none, selective (recompute cheap ops), full (keep block inputs)."""
    unit_size: int = 1
    """Transformer blocks per FSDP unit (one fully_shard call or FlatParameter). DDP and
    DeepSpeed have no units: their plans run block by block whatever it says."""
    prefetch: int = 1
    """Units all-gathered ahead of the one computing (0 disables prefetch; FSDP2 uses 1)."""
    bucket_bytes: int = 25 * MiB
    """Gradient bucket size for ddp/zero1/zero2 reduction, bytes (DDP default 25 MiB)."""
    param_dtype: str = "bf16"
    """Dtype of gathered parameters, of compute and of activations."""
    grad_dtype: str = "bf16"
    """Dtype gradients are stored in before the optimizer (ZeRO paper: fp16/bf16)."""
    reduce_dtype: str = "bf16"
    """Dtype of gradient reduce-scatter / all-reduce traffic (FSDP2 often uses fp32)."""
    master_dtype: str = "fp32"
    """Dtype of the master weights the optimizer updates; equal to param_dtype means none."""
    tf32: bool = False
    """fp32 matmuls run on TF32 tensor cores (torch.set_float32_matmul_precision("high")
    or allow_tf32); only meaningful with fp32 parameters."""
    fp8: bool = False
    """The blocks' linear layers in fp8 as torchao's Float8Linear runs them (bf16
    parameters; zsim.analytic.compute.with_float8_linears), and with FSDP2 their weights
    all-gathered in fp8 (enable_fsdp_float8_all_gather). The output projection stays
    bf16, as torchtitan leaves it."""
    optimizer: Optimizer = "adamw"
    """adamw (2 states), sgd (momentum, 1 state) or adamw8bit (block-quantised states)."""
    optimizer_state_dtype: str = "fp32"
    """Dtype of optimizer states (ignored by adamw8bit)."""
    offload: Offload = "none"
    """none, optimizer (states + master to host, CPU step), params (also parameters)."""
    grad_sync: GradSync = "last"
    """With gradient accumulation, when FSDP2 reduces gradients: "last"
    (set_requires_gradient_sync(False) until the last micro-batch: the unsharded
    gradients accumulate in the reduce dtype and are reduce-scattered once per step) or
    "every" (fully_shard's default, which torchtitan's training loop keeps: each
    micro-batch's backward reduce-scatters its gradients, and the sharded gradients
    accumulate)."""
    impl: str = ""
    """The program that runs the strategy (zsim.spec.programs): "torch" (DDP,
    ZeroRedundancyOptimizer), "fsdp2" (fully_shard), "fsdp1" (FullyShardedDataParallel),
    "deepspeed" (DeepSpeed ZeRO). "" means the strategy's default, filled in at
    construction."""
    options: ProgramOptions | None = None
    """The program's own settings, of its registry entry's options type: DeepSpeedZero
    (deepspeed: zero_optimization), Fsdp1Options (fsdp1: FullyShardedDataParallel's
    scheduling knobs); None for a program without any. None means the program's
    defaults, filled in at construction. In a plan's YAML or dict also under the
    program's key (ds, fsdp1)."""

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES:
            raise ConfigError("plan.strategy", self.strategy,
                              f"must be one of {', '.join(STRATEGIES)}")
        for f in ("dp_shard", "dp_replicate", "tp", "pp", "cp", "ep", "micro_batch",
                  "grad_accum",
                  "seq_len", "unit_size", "bucket_bytes", "virtual_stages"):
            v = getattr(self, f)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise ConfigError(f"plan.{f}", v, "must be a positive integer")
        if not isinstance(self.prefetch, int) or self.prefetch < 0:
            raise ConfigError("plan.prefetch", self.prefetch, "must be an integer >= 0")
        if not isinstance(self.tf32, bool):
            raise ConfigError("plan.tf32", self.tf32, "must be true or false")
        for f in ("fp8", "sp", "async_tp", "tp_across_nodes"):
            if not isinstance(getattr(self, f), bool):
                raise ConfigError(f"plan.{f}", getattr(self, f), "must be true or false")
        self._check_model_parallel()
        if self.fp8 and self.param_dtype != "bf16":
            raise ConfigError("plan.fp8", self.fp8,
                              f"fp8 linears train bf16 parameters, not {self.param_dtype}")
        for f in ("param_dtype", "grad_dtype", "reduce_dtype", "master_dtype",
                  "optimizer_state_dtype"):
            if getattr(self, f) not in DTYPES:
                raise ConfigError(f"plan.{f}", getattr(self, f),
                                  f"must be one of {', '.join(DTYPES)}")
        for f, choices in (("recompute", get_args(Recompute)),
                           ("optimizer", get_args(Optimizer)),
                           ("offload", get_args(Offload))):
            if getattr(self, f) not in choices:
                raise ConfigError(f"plan.{f}", getattr(self, f),
                                  f"must be one of {', '.join(choices)}")
        if self.strategy == "ddp" and self.dp_shard != 1:
            raise ConfigError("plan.dp_shard", self.dp_shard, "ddp shards nothing: must be 1")
        runs = programs_for(self.strategy)
        if self.impl == "":
            object.__setattr__(self, "impl", runs[0].name)  # frozen: the default, once
        elif self.impl not in [e.name for e in runs]:
            raise ConfigError("plan.impl", self.impl,
                              f"{self.strategy} runs as {' or '.join(e.name for e in runs)}")
        self._check_options()
        self._check_expert_parallel()
        program = self.program
        if self.grad_sync not in GRAD_SYNCS:
            raise ConfigError("plan.grad_sync", self.grad_sync,
                              f"must be one of {', '.join(GRAD_SYNCS)}")
        if self.grad_sync == "every" and (not program.grad_sync_every or self.pp > 1
                                          or self.offload != "none"):
            able = " or ".join(e.title for e in programs() if e.grad_sync_every)
            raise ConfigError("plan.grad_sync", self.grad_sync,
                              f"reducing every micro-batch is modelled for {able} without "
                              "pipelining (its stages reduce on the last) or offload")
        if not program.offload and self.offload != "none":
            instead = f": use impl {program.superseded_by}" if program.superseded_by else ""
            raise ConfigError("plan.offload", self.offload,
                              f"{program.title}'s offload is not modelled{instead}")

    def _check_options(self) -> None:
        """The options are of the program's options type (its defaults filled in)."""
        kind, key = self.program.options, self.program.options_key or "options"
        if kind is None:
            if self.options is not None:
                raise ConfigError("plan.options", self.options, f"{self.impl} takes no options")
        elif self.options is None:
            object.__setattr__(self, "options", kind())  # frozen: the defaults, once
        elif not isinstance(self.options, kind):
            raise ConfigError(f"plan.{key}", self.options,
                              f"must be {self.program.title} settings ({kind.__name__})")

    def _check_expert_parallel(self) -> None:
        """The EP degree fits the ranks it is carved from; the routing knobs are sane."""
        for f, low in (("capacity_factor", 0.0), ("expert_imbalance", 1.0)):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or v < low:
                raise ConfigError(f"plan.{f}", v, f"must be a number >= {low:g}")
        if self.expert_region % self.ep:
            raise ConfigError("plan.ep", self.ep, "expert parallelism is carved from the "
                              f"dp_shard x cp x tp = {self.expert_region} ranks: must "
                              "divide them")
        if self.ep > 1 and self.strategy not in self.program.expert_parallel:
            able = " and ".join(f"{e.title} ({', '.join(e.expert_parallel)})"
                                for e in programs() if e.expert_parallel)
            raise ConfigError("plan.ep", self.ep, f"expert parallelism is modelled with "
                              f"{able}, not {self.strategy} run by {self.impl}")
        if self.ep > 1 and self.offload != "none":
            raise ConfigError("plan.offload", self.offload,
                              "offload with expert parallelism is not modelled yet")

    def _check_model_parallel(self) -> None:
        """The TP, SP and pipeline-schedule fields that must agree with each other."""
        if self.sp and self.tp == 1:
            raise ConfigError("plan.sp", self.sp,
                              "sequence parallelism shards over the TP group: needs tp > 1")
        if self.async_tp and not self.sp:
            raise ConfigError("plan.async_tp", self.async_tp,
                              "async TP fuses SP's all-gather/reduce-scatter: needs sp")
        if self.pp_schedule not in PIPELINE_SCHEDULES:
            raise ConfigError("plan.pp_schedule", self.pp_schedule,
                              f"must be one of {', '.join(PIPELINE_SCHEDULES)}")
        interleaved = self.pp_schedule == "interleaved"
        if interleaved and self.pp == 1:
            raise ConfigError("plan.pp_schedule", self.pp_schedule,
                              "an interleaved schedule needs pp > 1")
        if interleaved and self.virtual_stages < 2:
            raise ConfigError("plan.virtual_stages", self.virtual_stages,
                              "the interleaved schedule needs >= 2 stages per rank")
        if not interleaved and self.virtual_stages != 1:
            raise ConfigError("plan.virtual_stages", self.virtual_stages,
                              f"{self.pp_schedule} runs one stage per rank: must be 1")

    # ------------------------------------------------------------------ derived
    @property
    def program(self) -> ProgramEntry:
        """The registry entry of the program that runs the plan (zsim.spec.programs)."""
        return program_entry(self.impl)

    def options_as(self, kind: type[OptionsT]) -> OptionsT:
        """The plan's options as `kind`, its program's options type (what the program's
        lowering and backend read)."""
        assert isinstance(self.options, kind), (self.impl, kind)
        return self.options

    @property
    def world_size(self) -> int:
        return self.dp_shard * self.dp_replicate * self.model_parallel

    @property
    def model_parallel(self) -> int:
        """Ranks that share one data-parallel rank's work: tp * cp * pp."""
        return self.tp * self.cp * self.pp

    @property
    def tp_enabled(self) -> bool:
        return self.tp > 1

    @property
    def pp_enabled(self) -> bool:
        return self.pp > 1

    @property
    def cp_enabled(self) -> bool:
        return self.cp > 1

    @property
    def dp_degree(self) -> int:
        """Data-parallel ranks: each sees different data."""
        return self.dp_shard * self.dp_replicate

    @property
    def routed_load(self) -> float:
        """Routed tokens the busiest rank computes and receives, over the mean share: the
        capacity factor when one is set (every expert's buffer padded to its capacity),
        else expert_imbalance under expert parallelism (without it every rank computes
        the experts of its own tokens: 1)."""
        if self.capacity_factor:
            return self.capacity_factor
        return self.expert_imbalance if self.ep > 1 else 1.0

    @property
    def dp_shard_cp(self) -> int:
        """Ranks one copy of the sharded model state is spread over: dp_shard x cp, the
        group FSDP's all-gathers and reduce-scatters run over (torchtitan's ParallelDims
        flattens the mesh's dp_shard and cp axes into "dp_shard_cp" and apply_fsdp
        shards over it, HSDP over (dp_replicate, dp_shard_cp); the cp ranks of one
        sequence hold the same parameters and so shard them, and their gradients are
        reduced together). dp_shard without context parallelism."""
        return self.dp_shard * self.cp

    @property
    def expert_region(self) -> int:
        """Ranks expert parallelism is carved from: dp_shard x cp x tp (torchtitan's
        ParallelDims: ep divides them; its sparse mesh is (pp, dp_replicate, efsdp, ep))."""
        return self.dp_shard_cp * self.tp

    @property
    def expert_shard_ranks(self) -> int:
        """Ranks that hold the same experts and shard their state: expert_region / ep
        (torchtitan's efsdp); 0 without expert parallelism."""
        return self.expert_region // self.ep if self.ep > 1 else 0

    @property
    def shards_params(self) -> bool:
        return self.strategy in ("zero3", "fsdp", "fsdp-no-reshard", "hsdp")

    @property
    def shards_grads(self) -> bool:
        return self.strategy != "ddp" and self.strategy != "zero1"

    @property
    def shards_optimizer(self) -> bool:
        return self.strategy != "ddp"

    @property
    def reshard_after_forward(self) -> bool:
        return self.strategy in ("zero3", "fsdp", "hsdp")

    @property
    def hsdp_enabled(self) -> bool:
        return self.dp_shard_cp > 1 and self.dp_replicate > 1 and self.shards_params

    @property
    def tokens_per_step(self) -> int:
        """Tokens the whole job trains on per optimizer step."""
        return self.micro_batch * self.grad_accum * self.seq_len * self.dp_degree

    @property
    def has_master_copy(self) -> bool:
        return self.master_dtype != self.param_dtype

    @property
    def casts_block_inputs(self) -> bool:
        """Whether the program casts each block's floating-point forward inputs to the
        compute dtype: FSDP2's MixedPrecisionPolicy (cast_forward_inputs, on by default)
        does in every fully_shard'ed module's pre-forward; FSDP1's MixedPrecision casts
        only the root's (cast_root_forward_inputs), DDP and DeepSpeed none
        (ProgramEntry.casts_block_inputs)."""
        return self.program.casts_block_inputs and self.param_dtype != "fp32"

    @property
    def runs_autocast(self) -> bool:
        """Whether the program computes under torch.autocast with master-dtype parameters
        (ProgramEntry.autocast: DDP and ZeroRedundancyOptimizer) and the plan has a master
        copy to keep them in."""
        return self.program.autocast and self.has_master_copy

    @property
    def pinned_host_buffers(self) -> bool:
        """Whether the program's offload buffers on the host are page-locked: FSDP2's
        CPUOffloadPolicy and FSDP1's CPUOffload pin them; DeepSpeed only with
        offload_optimizer.pin_memory (ProgramOptions.pinned_host_buffers)."""
        return True if self.options is None else self.options.pinned_host_buffers

    @property
    def compute_dtype(self) -> str:
        """The dtype matmuls run at: the parameters' dtype, or "tf32" for fp32 with TF32."""
        return "tf32" if self.tf32 and self.param_dtype == "fp32" else self.param_dtype

    # ------------------------------------------------------------------ builders
    @classmethod
    def for_strategy(cls, strategy: str, *, gpus: int, shard_group: int | None = None,
                     **knobs: Any) -> Plan:
        """Fill the data-parallel degrees a strategy implies on `gpus` GPUs: the GPUs left
        once the model-parallel degrees in `knobs` (tp, cp, pp; 1 by default) are taken,
        world / (tp * cp * pp).

        Args:
            strategy: a Strategy.
            gpus: world size.
            shard_group: hsdp only, its dp_shard (with context parallelism a shard
                group spans dp_shard x cp ranks); must divide the data-parallel size.
            knobs: any other Plan field.

        Raises:
            ConfigError: unknown strategy, model-parallel degrees that do not divide gpus,
                or a shard group that does not divide the data-parallel size.
        """
        if strategy not in STRATEGIES:
            raise ConfigError("strategy", strategy, f"must be one of {', '.join(STRATEGIES)}")
        if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus <= 0:
            raise ConfigError("gpus", gpus, "must be a positive integer")
        degrees = {f: knobs.get(f, 1) for f in ("tp", "cp", "pp")}
        for f, v in degrees.items():
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                raise ConfigError(f"plan.{f}", v, "must be a positive integer")
        model_parallel = degrees["tp"] * degrees["cp"] * degrees["pp"]
        if gpus % model_parallel:
            raise ConfigError("gpus", gpus, f"not divisible by tp*cp*pp = {degrees['tp']}*"
                                            f"{degrees['cp']}*{degrees['pp']} = {model_parallel}")
        dp = gpus // model_parallel
        if strategy == "hsdp":
            if shard_group is None:
                raise ConfigError("shard_group", None, "hsdp needs a shard group size")
            if (isinstance(shard_group, bool) or not isinstance(shard_group, int)
                    or shard_group <= 0 or dp % shard_group):
                raise ConfigError("shard_group", shard_group,
                                  f"must divide gpus={gpus}" if dp == gpus else
                                  f"must divide the data-parallel size {dp}")
            return cls(strategy="hsdp", dp_shard=shard_group,
                       dp_replicate=dp // shard_group, **knobs)
        if shard_group is not None:
            raise ConfigError("shard_group", shard_group,
                              f"only hsdp takes a shard group, not {strategy}")
        if strategy == "ddp":
            return cls(strategy="ddp", dp_shard=1, dp_replicate=dp, **knobs)
        return cls(strategy=strategy, dp_shard=dp, **knobs)  # type: ignore[arg-type]

    @property
    def accumulates_unsharded_grads(self) -> bool:
        """Micro-batches accumulate into unsharded gradients held until the last one
        reduces them (gradient accumulation with grad_sync "last")."""
        return self.grad_accum > 1 and self.grad_sync == "last"

    @property
    def label(self) -> str:
        """Short human name, e.g. "hsdp(8x16) ac=selective mb=2"; a program other than
        the strategy's default is named in brackets, e.g. "fsdp[fsdp1] ac=none mb=1"."""
        return (f"{self._layout_head} ac={self.recompute} mb={self.micro_batch}"
                f"{self._layout_tail}")

    @property
    def layout(self) -> str:
        """The label without its recomputation and micro-batch, e.g. "hsdp(8x16)[fsdp1]",
        "fsdp tp=2+sp pp=2(1f1b) sync=every": the strategy, program and parallel axes."""
        return self._layout_head + self._layout_tail

    @property
    def _layout_head(self) -> str:
        deg = f"({self.dp_shard}x{self.dp_replicate})" if self.strategy == "hsdp" else ""
        impl = f"[{self.impl}]" if self.impl != default_program(self.strategy).name else ""
        return f"{self.strategy}{deg}{impl}{self.parallel_label}"

    @property
    def _layout_tail(self) -> str:
        extra = f" offload={self.offload}" if self.offload != "none" else ""
        if self.grad_sync == "every" and self.grad_accum > 1:
            extra += " sync=every"
        return extra

    @property
    def parallel_label(self) -> str:
        """The model-parallel axes in a label, e.g. " tp=8+sp pp=4(interleaved x2) cp=2",
        " ep=8 cf=1.25";
        empty for a purely data-parallel plan."""
        out = ""
        if self.tp > 1:
            out += f" tp={self.tp}" + ("+async" if self.async_tp else "+sp" if self.sp else "")
        if self.pp > 1:
            sched = self.pp_schedule + (f" x{self.virtual_stages}"
                                        if self.virtual_stages > 1 else "")
            out += f" pp={self.pp}({sched})"
        if self.cp > 1:
            out += f" cp={self.cp}"
        if self.ep > 1:
            out += f" ep={self.ep}"
        if self.capacity_factor:
            out += f" cf={self.capacity_factor:g}"
        return out

    def with_(self, **changes: Any) -> Plan:
        """The plan with `changes` (dataclasses.replace); a change of program without
        options of its own takes the new program's defaults."""
        if changes.get("impl", self.impl) != self.impl and "options" not in changes:
            changes["options"] = None
        return replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any], *, where: str = "plan") -> Plan:
        """Strict: unknown keys and missing required keys raise ConfigError naming the key.
        The program's options go under `options` or under its key (ds, fsdp1: the fields
        Plan.ds and Plan.fsdp1 were); another program's key is checked against that
        program's options type and not read, as those fields were not."""
        if isinstance(data, dict):
            data = cls._options_from_keys(data, where=where)
        data = check_keys(cls, data, where=where)
        impl, options = cls._impl_of(data), data.get("options")
        if isinstance(options, dict) and impl is not None:
            kind = program_entry(impl).options
            if kind is None:
                raise ConfigError(f"{where}.options", options, f"{impl} takes no options")
            data = {**data, "options": kind.from_dict(options, where=f"{where}.options")}
        return cls(**data)

    @classmethod
    def _options_from_keys(cls, data: dict[str, Any], *, where: str) -> dict[str, Any]:
        """`data` with the options under a program's key (ProgramEntry.options_key) moved
        to `options` where that program runs the plan, and dropped (once checked) where
        another does."""
        out = dict(data)
        impl = cls._impl_of(data)
        for key in list(out):
            entry = by_options_key(key)
            if entry is None:
                continue
            value = out.pop(key)
            if entry.options is not None and not isinstance(value, entry.options):
                value = entry.options.from_dict(value, where=f"{where}.{key}")
            if entry.name != impl:
                continue
            if "options" in out:
                raise ConfigError(f"{where}.{key}", value,
                                  "the program's options are given under options already")
            out["options"] = value
        return out

    @staticmethod
    def _impl_of(data: dict[str, Any]) -> str | None:
        """The program a plan's dict names, else its strategy's default; None where
        neither is a known one (Plan's construction then says why)."""
        impl = data.get("impl") or ""
        if impl:
            return impl if impl in [e.name for e in programs()] else None
        strategy = data.get("strategy")
        if not isinstance(strategy, str) or strategy not in STRATEGIES:
            return None
        return default_program(strategy).name


PRECISIONS: dict[str, dict[str, Any]] = {
    # Mixed precision as the ZeRO paper counts it (Sec. 3.1): 16-bit params and grads,
    # fp32 master weights and Adam states. FSDP2 users often set reduce_dtype=fp32.
    "bf16": {"param_dtype": "bf16", "grad_dtype": "bf16", "reduce_dtype": "bf16",
             "master_dtype": "fp32", "optimizer_state_dtype": "fp32"},
    # fp16 mixed precision (DeepSpeed's fp16 mode, torch.autocast with a GradScaler): as
    # bf16, with fp16 parameters, gradients and reduction.
    "fp16": {"param_dtype": "fp16", "grad_dtype": "fp16", "reduce_dtype": "fp16",
             "master_dtype": "fp32", "optimizer_state_dtype": "fp32"},
    "fp32": {"param_dtype": "fp32", "grad_dtype": "fp32", "reduce_dtype": "fp32",
             "master_dtype": "fp32", "optimizer_state_dtype": "fp32"},
    # fp32 storage throughout, matmuls on TF32 tensor cores (torch's
    # set_float32_matmul_precision("high")): fp32's memory at a tensor-core rate.
    "tf32": {"param_dtype": "fp32", "grad_dtype": "fp32", "reduce_dtype": "fp32",
             "master_dtype": "fp32", "optimizer_state_dtype": "fp32", "tf32": True},
    # bf16 mixed precision with the blocks' linear layers in fp8 (torchao Float8Linear,
    # FSDP2 all-gathers their weights in fp8).
    "fp8": {"param_dtype": "bf16", "grad_dtype": "bf16", "reduce_dtype": "bf16",
            "master_dtype": "fp32", "optimizer_state_dtype": "fp32", "fp8": True},
}
"""Dtype fields set by the CLI's --precision."""


def precision_knobs(precision: str) -> dict[str, Any]:
    """The Plan dtype fields for a --precision name.

    Raises:
        ConfigError: unknown precision name.
    """
    if not isinstance(precision, str) or precision not in PRECISIONS:
        raise ConfigError("precision", precision, f"must be one of {', '.join(PRECISIONS)}")
    return dict(PRECISIONS[precision])
