"""The program registry: one entry per program (zsim's vocabulary, zsim/__init__.py), the
one place that names each program and states its facts as data: the strategies it runs
(and is the default program of), its options type and their YAML key, its keys in a
hardware profile's host.program_overhead_us, the modules that lower it and run it for
real, and what the checks and the closed forms ask of it.

Every reader goes through the functions below, which read REGISTRY when called: Plan
(zsim.spec.plan: its validation, default program and options), the hardware profile's
overhead keys (zsim.spec.hardware), the closed forms (zsim.analytic.comm), the lowering
(zsim.schedule.lower resolves `lowering`), the planner's (strategy, program) pairs
(zsim.planner), the real-run dispatch (zsim.backend.programs resolves `backend`), the
nano plans and the validation grid (zsim.calibration.nano, zsim.validation.grid), the
recommendation's complications (zsim.recommend) and the command line's --impl choices
(zsim.cli). Adding a program is adding its entry here plus its own modules
(docs/extending.md); tests/test_programs.py checks that the readers' key sets agree
and builds a program from one entry.

Modules are named by dotted path and imported where used: the lowering imports
zsim.schedule, above zsim.spec, and the backend imports torch. Imports only zsim.spec's
options types (zsim.spec.deepspeed, zsim.spec.fsdp1) and the standard library.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Protocol

from zsim.spec.deepspeed import DeepSpeedZero
from zsim.spec.fsdp1 import Fsdp1Options


class ProgramOptions(Protocol):
    """What a program's options type (ProgramEntry.options) provides: a frozen dataclass
    of the library's own knobs, strict to and from a mapping, that says how its host
    buffers are allocated and how a plan offloading state needs it set."""

    def to_dict(self) -> dict[str, Any]: ...

    @classmethod
    def from_dict(cls, data: Any, *, where: str) -> ProgramOptions:
        """Strict: unknown keys raise ConfigError naming `where`.key."""
        ...

    @property
    def pinned_host_buffers(self) -> bool:
        """Whether the program's offload buffers on the host are page-locked."""
        ...

    def for_offload(self, offload: str) -> ProgramOptions:
        """The options as a plan offloading `offload` (Plan.offload) runs them."""
        ...


CommPattern = Literal["ddp", "zero", "fsdp"]
"""Which closed form of zsim.analytic.comm.step_comm counts a program's data-parallel
collectives: ddp (a gradient all-reduce in buckets; zero1's updated partitions
all-gathered), zero (DeepSpeed's ZeRO stages), fsdp (all-gathers of each unit's
parameters, reduce-scatters of its gradients)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class OverheadKey:
    """One key of host.program_overhead_us (HardwareProfile.program_overhead_s): the plans
    of its program whose host time it holds, and the plan that measures it."""

    name: str
    """The key in the profile's YAML."""
    strategy: str
    """The strategy of the plan that measures it (zsim.calibration.nano.program_plans,
    zsim.validation.grid.library_plans), which reads it."""
    offload: str = "none"
    """That plan's offload; a plan offloading something else reads its strategy's key
    without offload."""
    also: tuple[str, ...] = ()
    """Other strategies whose plans read it (FSDP1's HYBRID_SHARD reads FULL_SHARD's)."""
    fallback: str | None = None
    """The key a plan reads where the profile lacks this one (a key of the same program)."""

    @property
    def strategies(self) -> tuple[str, ...]:
        return (self.strategy, *self.also)


@dataclass(frozen=True, slots=True, kw_only=True)
class ProgramEntry:
    """One program: its name (Plan.impl) and its facts."""

    name: str
    """Plan.impl, --impl on the command line, "strategy[name]" in a plan's label."""
    title: str
    """Its name in sentences ("FSDP1")."""
    strategies: tuple[str, ...]
    """The strategies (Plan.strategy) it runs."""
    lowering: str
    """The module whose PROGRAM (zsim.schedule.programs.Program) lowers it."""
    backend: str
    """The module whose check_plan and prepare run it for real (imports torch)."""
    comm: CommPattern
    """The closed form that counts its collectives (CommPattern)."""
    defaults: tuple[str, ...] = ()
    """The strategies it is the default program of (each strategy has one)."""
    ranked: tuple[str, ...] = ()
    """The strategies the planner ranks it under (zsim.planner.program_shapes)."""
    options: type[ProgramOptions] | None = None
    """The type of Plan.options for its plans (ProgramOptions); None: it takes none."""
    options_key: str | None = None
    """The key its options go under in a plan's YAML or dict, besides `options`."""
    overhead_keys: tuple[OverheadKey, ...] = ()
    """Its keys of host.program_overhead_us: the host time the simulator's other figures
    leave out, measured on the nano model (zsim.calibration.program_overhead)."""
    requires: str | None = None
    """The Python package its backend needs beyond torch (an optional dependency), whose
    absence leaves its nano plans unmeasured."""
    autocast: bool = False
    """It keeps the parameters in the master dtype and computes under torch.autocast
    (with a master copy: Plan.has_master_copy)."""
    casts_block_inputs: bool = False
    """It casts each block's floating-point forward inputs to the compute dtype (FSDP2's
    MixedPrecisionPolicy: Plan.casts_block_inputs)."""
    wraps_units: bool = True
    """It groups blocks into units (Plan.unit_size, prefetched Plan.prefetch ahead); one
    that does not runs block by block (zsim.schedule.lower.program_plan)."""
    offload: bool = True
    """Its offload (Plan.offload other than none) is modelled."""
    offload_variations: tuple[str, ...] = ()
    """The offloads the planner tries for a user's config of it
    (zsim.planner.config_variations); empty: the config's own and none."""
    grad_sync_every: bool = False
    """It can reduce gradients every micro-batch on request (Plan.grad_sync "every")."""
    reduces_each_micro_batch: bool = False
    """It reduces gradients every micro-batch whatever Plan.grad_sync says (FSDP1 without
    no_sync)."""
    model_parallel: tuple[str, ...] = ()
    """The strategies under which it composes with tensor and pipeline parallelism."""
    context_parallel: bool = False
    """It composes with context parallelism (its state sharded over dp_shard x cp)."""
    expert_parallel: tuple[str, ...] = ()
    """The strategies under which it composes with expert parallelism (Plan.ep):
    torchtitan's EP with fully_shard, DeepSpeed-MoE with ZeRO-1/2 (DeepSpeed runs no MoE
    under ZeRO-3)."""
    flat_state_dict: bool = False
    """Its sharded state dict is rebuilt from flat parameters: a checkpoint save
    all-gathers every parameter and optimizer state over the shard group, a load does it
    again (FSDP1's SHARDED_STATE_DICT; zsim.analytic.checkpoint)."""
    superseded_by: str | None = None
    """The program that replaces it; a plan running it asks a team for an older library
    (zsim.recommend.complications)."""


_FSDP = ("fsdp", "fsdp-no-reshard", "hsdp")
_ZERO = ("zero1", "zero2", "zero3")

REGISTRY: tuple[ProgramEntry, ...] = (
    ProgramEntry(
        name="torch", title="torch DDP", strategies=("ddp", "zero1"), defaults=("ddp",),
        ranked=("ddp",), lowering="zsim.schedule.programs.torch_ddp",
        backend="zsim.backend.fsdp2", comm="ddp", autocast=True, wraps_units=False,
        model_parallel=("ddp",)),
    ProgramEntry(
        name="fsdp2", title="FSDP2", strategies=_FSDP, defaults=_FSDP, ranked=_FSDP,
        lowering="zsim.schedule.programs.fsdp2", backend="zsim.backend.fsdp2", comm="fsdp",
        casts_block_inputs=True, grad_sync_every=True, model_parallel=_FSDP,
        context_parallel=True, expert_parallel=_FSDP),
    ProgramEntry(
        name="deepspeed", title="DeepSpeed ZeRO", strategies=_ZERO, defaults=_ZERO,
        ranked=_ZERO, options=DeepSpeedZero, options_key="ds",
        overhead_keys=(
            OverheadKey(name="deepspeed-zero1", strategy="zero1"),
            OverheadKey(name="deepspeed-zero2", strategy="zero2"),
            OverheadKey(name="deepspeed-zero3", strategy="zero3"),
            OverheadKey(name="deepspeed-zero2-offload", strategy="zero2", offload="optimizer",
                        fallback="deepspeed-zero2")),
        lowering="zsim.schedule.programs.deepspeed", backend="zsim.backend.deepspeed_zero",
        requires="deepspeed", comm="zero", wraps_units=False,
        offload_variations=("none", "optimizer", "params"),
        expert_parallel=("zero1", "zero2")),
    ProgramEntry(
        name="fsdp1", title="FSDP1", strategies=_FSDP, ranked=_FSDP, options=Fsdp1Options,
        options_key="fsdp1",
        overhead_keys=(
            OverheadKey(name="fsdp1", strategy="fsdp", also=("hsdp",)),
            OverheadKey(name="fsdp1-no-reshard", strategy="fsdp-no-reshard",
                        fallback="fsdp1")),
        lowering="zsim.schedule.programs.fsdp1", backend="zsim.backend.fsdp1", comm="fsdp",
        offload=False, reduces_each_micro_batch=True, flat_state_dict=True,
        superseded_by="fsdp2"),
)
"""Every program, in the order listings follow (the profile's overhead keys, the nano and
validation plans). Tests extend it by replacing it (monkeypatch); nothing changes it at
run time."""


def programs() -> tuple[ProgramEntry, ...]:
    """Every program's entry, in REGISTRY's order."""
    return REGISTRY


def program_names() -> tuple[str, ...]:
    """Every Plan.impl value, in REGISTRY's order."""
    return tuple(e.name for e in REGISTRY)


def program_entry(name: str) -> ProgramEntry:
    """The entry of program `name` (KeyError where there is none: callers check names
    with program_names first)."""
    for e in REGISTRY:
        if e.name == name:
            return e
    raise KeyError(name)


def programs_for(strategy: str) -> tuple[ProgramEntry, ...]:
    """The programs that run `strategy`, its default first, the others in REGISTRY's
    order."""
    runs = [e for e in REGISTRY if strategy in e.strategies]
    return tuple(sorted(runs, key=lambda e: strategy not in e.defaults))


def default_program(strategy: str) -> ProgramEntry:
    """The program a plan of `strategy` runs when it names none."""
    return programs_for(strategy)[0]


def by_options_key(key: str) -> ProgramEntry | None:
    """The program whose options go under `key` in a plan's YAML or dict, or None."""
    return next((e for e in REGISTRY if e.options_key == key), None)


def overhead_chain(entry: ProgramEntry, strategy: str, offload: str) -> tuple[str, ...]:
    """The keys of host.program_overhead_us a plan of `entry` with this strategy and
    offload reads, in order of preference: the key of its strategy and offload (else of
    its strategy without offload), then that key's fallbacks; empty where the program
    has none for the strategy."""
    keys = [k for k in entry.overhead_keys if strategy in k.strategies]
    key = (next((k for k in keys if k.offload == offload), None)
           or next((k for k in keys if k.offload == "none"), None))
    chain: list[str] = []
    while key is not None:
        chain.append(key.name)
        key = next((k for k in entry.overhead_keys if k.name == key.fallback), None)
    return tuple(chain)
