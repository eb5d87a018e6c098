"""Apply a zsim Plan with pipeline parallelism (plan.pp > 1): the reference Llama model cut
into plan.pp stages, one per rank, run by torch.distributed.pipelining, and its step.

The cut (torchtitan's pipeline_llama, manual split): stage k holds blocks
[k L/pp, (k+1) L/pp) under their own names ("layers.<i>"), the first stage also the token
embedding, the last also the final norm and the output projection; every stage keeps the
RoPE tables. Each rank wraps its stage module in a PipelineStage (shapes inferred from
the first micro-batch) and runs plan.pp_schedule: "1f1b" (Schedule1F1B) or "gpipe"
(ScheduleGPipe), with plan.grad_accum micro-batches of plan.micro_batch sequences: the
step's batch goes to the schedule whole and it splits it (zsim.backend.training.batches),
loss = cross_entropy(logits.float(), labels) per micro-batch on the last stage, gradients
scaled by the micro-batch count, outputs not kept (return_outputs=False). One data-
parallel rank (the stages' parameters whole, fp32, each stage's forward under bf16
autocast as the DDP runner), AdamW (foreach) per stage. The step protocol of
zsim.backend.measured_step sees a pipeline step as one micro-batch: its forward phase spans the
whole schedule (forwards and backwards interleave), its saved tensors are every
micro-batch's; its timing scopes (the stage's blocks, and the stage module as "root")
time the last micro-batch's forward. Recomputation wraps the blocks before the cut.
Imports torch.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe
from torch.distributed.pipelining.schedules import PipelineScheduleSingle

from zsim.backend.fsdp2 import LEARNING_RATE, TORCH_DTYPES, apply_recompute, stepper
from zsim.backend.reference_model import Transformer, init_parameters, rope_inputs, rope_tables
from zsim.backend.training import Prepared
from zsim.errors import ConfigError
from zsim.spec.model import ModelSpec
from zsim.spec.plan import Plan

SCHEDULES: dict[str, type[PipelineScheduleSingle]] = {
    "1f1b": Schedule1F1B, "gpipe": ScheduleGPipe}
"""plan.pp_schedule -> the torch schedule class this backend runs."""


def check_plan(plan: Plan, world_size: int, spec: ModelSpec) -> None:
    """What this backend runs with pipeline parallelism.

    Raises:
        ConfigError: tp > 1, more than one data-parallel rank, a world size that differs
            from the plan's, a schedule other than 1f1b and gpipe, layers not divisible
            by pp, fewer micro-batches than stages under 1f1b, a GPT-style model (learned
            positions or tied embeddings), or an optimizer other than adamw.
    """
    if plan.tp != 1:
        raise ConfigError("plan.tp", plan.tp, "the pipeline backend runs no TP (tp 1)")
    if plan.dp_degree != 1 or plan.strategy != "ddp":
        raise ConfigError("plan.strategy", plan.label,
                          "the pipeline backend runs one data-parallel rank (ddp, 1)")
    if plan.world_size != world_size:
        raise ConfigError("plan.world_size", plan.world_size,
                          f"must equal the number of processes ({world_size})")
    if plan.pp_schedule not in SCHEDULES:
        raise ConfigError("plan.pp_schedule", plan.pp_schedule,
                          f"the pipeline backend runs {' or '.join(SCHEDULES)}")
    if spec.num_layers % plan.pp:
        raise ConfigError("plan.pp", plan.pp, f"must divide num_layers={spec.num_layers}")
    if plan.pp_schedule == "1f1b" and plan.grad_accum < plan.pp:
        raise ConfigError("plan.grad_accum", plan.grad_accum,
                          f"1f1b needs at least pp={plan.pp} micro-batches")
    if spec.learned_pos_emb or spec.tied_embeddings:
        raise ConfigError("model.tied_embeddings" if spec.tied_embeddings
                          else "model.learned_pos_emb", True,
                          "the pipeline backend cuts the Llama model (RoPE, untied output)")
    if plan.optimizer != "adamw":
        raise ConfigError("plan.optimizer", plan.optimizer,
                          "the pipeline backend runs adamw")


class StageModule(nn.Module):
    """One pipeline stage of the reference Transformer: its blocks (named "layers.<i>" as
    in the whole model), the token embedding on the first stage, the final norm and the
    output on the last. forward(tokens or hidden) -> hidden, or logits on the last."""

    def __init__(self, whole: Transformer, stage: int, num_stages: int) -> None:
        super().__init__()
        self.spec = whole.spec
        per = len(whole.layers) // num_stages
        first, last = stage == 0, stage == num_stages - 1
        self.tok_embeddings = whole.tok_embeddings if first else None
        self.layers = nn.ModuleDict({str(i): whole.layers[i]
                                     for i in range(stage * per, (stage + 1) * per)})
        self.norm = whole.norm if last else None
        self.output = whole.output if last else None
        self.register_buffer("rope_cos", whole.rope_cos, persistent=False)
        self.register_buffer("rope_sin", whole.rope_sin, persistent=False)
        self.autocast_dtype: torch.dtype | None = None
        """Dtype of bf16/fp16 autocast around forward (fp32 parameters), else None."""

    def init_weights(self) -> None:
        """Initialise in place after `to_empty` (as Transformer.init_weights)."""
        init_parameters(self)
        with torch.no_grad():
            cos, sin = rope_tables(self.spec)
            self.rope_cos.copy_(cos)
            self.rope_sin.copy_(sin)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Autocast inside the stage's forward only: the schedule runs the backward too.
        dtype = self.autocast_dtype
        with torch.autocast(x.device.type, dtype=dtype or torch.bfloat16,
                            enabled=dtype is not None):
            h = self.tok_embeddings(x) if self.tok_embeddings is not None else x
            s = h.shape[1]
            rope = rope_inputs(self.spec, self.rope_cos, self.rope_sin, s, h.dtype)
            for layer in self.layers.values():
                h = layer(h, rope)
            if self.norm is None or self.output is None:
                return h
            logits = self.output(self.norm(h))
        return logits.float() if self.spec.logits_upcast else logits


def loss_fn(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The reference loss on one micro-batch's logits (the last stage's output)."""
    return F.cross_entropy(logits.flatten(0, 1), labels.flatten(0, 1))


class ScheduleStep(nn.Module):
    """What the step calls: model(tokens, labels) runs one schedule step (every
    micro-batch's forward and backward) on this rank's stage and returns the mean loss
    of the micro-batches on the last stage, NaN on the others (they see no loss)."""

    def __init__(self, stage: StageModule, schedule: PipelineScheduleSingle, *,
                 is_first: bool, is_last: bool) -> None:
        super().__init__()
        self.stage = stage
        self.schedule = schedule
        self.is_first, self.is_last = is_first, is_last

    def forward(self, tokens: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        losses: list[torch.Tensor] = []
        args = (tokens,) if self.is_first else ()
        target = labels if self.is_last else None
        self.schedule.step(*args, target=target, losses=losses if self.is_last else None,
                           return_outputs=False)
        if not losses:
            return torch.tensor(math.nan)
        return torch.stack([x.detach() for x in losses]).mean()


def prepare(spec: ModelSpec, plan: Plan, *, device: str, world_size: int) -> Prepared:
    """Build this rank's stage (on the meta device, then allocated and initialised on
    `device`), its PipelineStage and schedule, and AdamW over its parameters.

    Raises:
        ConfigError: see check_plan.
    """
    check_plan(plan, world_size, spec)
    torch.manual_seed(0)
    rank = dist.get_rank()
    with torch.device("meta"):
        whole = Transformer(spec)
    apply_recompute(whole, plan)
    module = StageModule(whole, rank, plan.pp)
    module.to_empty(device=device)
    module.init_weights()
    dtype = TORCH_DTYPES[plan.param_dtype]
    module.autocast_dtype = None if dtype == torch.float32 else dtype
    stage = PipelineStage(module, rank, plan.pp, torch.device(device))
    schedule = SCHEDULES[plan.pp_schedule](stage, n_microbatches=plan.grad_accum,
                                           loss_fn=loss_fn)
    optimizer = torch.optim.AdamW(module.parameters(), lr=LEARNING_RATE, foreach=True)
    units: dict[str, nn.Module] = {f"layers.{i}": b for i, b in module.layers.items()}
    units["root"] = module
    return Prepared(model=ScheduleStep(module, schedule, is_first=rank == 0,
                                       is_last=rank == plan.pp - 1),
                    inner=module, units=units, backward=lambda loss, last: None,
                    step=stepper(optimizer))
