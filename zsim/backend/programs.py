"""Which real program runs a plan: the backend's dispatch by the plan's parallel degrees
and its program, whose registry entry names its backend module
(zsim.spec.programs.ProgramEntry.backend), as it names its lowering for the simulator.

Owns `check_plan` and `prepare`: plans with pp > 1 go to zsim.backend.pipelining, other
plans with tp > 1 to zsim.backend.tensor_parallel, then to the program's module:
zsim.backend.deepspeed_zero (DeepSpeed), zsim.backend.fsdp1 (FSDP1) or zsim.backend.fsdp2
(FSDP2, DDP and ZeroRedundancyOptimizer). Each program module has a check_plan and a
prepare, builds a zsim.backend.training.Prepared and imports nothing from here, so the
imports stay acyclic. Imports torch (DeepSpeed only when a DeepSpeed plan is prepared).
"""

from __future__ import annotations

from dataclasses import replace
from importlib import import_module
from types import ModuleType

from zsim.backend import pipelining, tensor_parallel
from zsim.backend.reference_model import LossOutside
from zsim.backend.training import Prepared
from zsim.spec.model import ModelSpec
from zsim.spec.plan import Plan


def program_module(plan: Plan) -> ModuleType:
    """The backend module of the plan's program (ProgramEntry.backend): its check_plan
    and prepare run the plan without tensor or pipeline parallelism."""
    return import_module(plan.program.backend)


def check_plan(plan: Plan, world_size: int, spec: ModelSpec) -> None:
    """What the backend can run (the plan's library's own checks).

    Raises:
        ConfigError: see the check_plan of the program module the plan dispatches to.
    """
    if plan.pp > 1:
        pipelining.check_plan(plan, world_size, spec)
    elif plan.tp > 1:
        tensor_parallel.check_plan(plan, world_size, spec)
    else:
        program_module(plan).check_plan(plan, world_size, spec)


def prepare(spec: ModelSpec, plan: Plan, *, device: str, world_size: int) -> Prepared:
    """Build the model on `device` and apply `plan` with the library it names; with
    spec.loss_in_forward False, the step computes the loss around the wrapped model
    (LossOutside; a pipeline's schedule computes it on the last stage either way)."""
    if plan.pp > 1:
        return pipelining.prepare(spec, plan, device=device, world_size=world_size)
    prep = _prepare(spec, plan, device=device, world_size=world_size)
    if spec.loss_in_forward:
        return prep
    return replace(prep, model=LossOutside(prep.model, spec))


def _prepare(spec: ModelSpec, plan: Plan, *, device: str, world_size: int) -> Prepared:
    if plan.tp > 1:
        return tensor_parallel.prepare(spec, plan, device=device, world_size=world_size)
    prep: Prepared = program_module(plan).prepare(spec, plan, device=device,
                                                  world_size=world_size)
    return prep
