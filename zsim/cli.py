"""zsim command line: a thin Typer layer over zsim.api (plan, models, hardware, simulate,
sweep, report), zsim.run_api (`zsim run`), zsim.calibrate_api (`zsim calibrate
profile|bands|gpu-phases|phase-rates`) and zsim.validate_api (`zsim validate
plan|grid|gpu-report|published-runs|error-budget|checkpoint`).
Each command parses, calls one api function, and renders; a ZsimError becomes one line
on stderr and exit code 2."""

from __future__ import annotations

import atexit
import gc
import sys
from collections.abc import Callable, Iterable
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, TypeVar, get_args

import typer

from zsim import api, calibrate_api, validate_api
from zsim.analytic.checkpoint import METHODS, TARGETS
from zsim.engine.replay import Jitter
from zsim.errors import ZsimError
from zsim.progress import ProgressBar
from zsim.report.plan_text import plan_text
from zsim.report.run_text import run_text
from zsim.report.simulate_text import simulate_text
from zsim.report.tables import csv_text, json_text, text_table
from zsim.spec.plan import GRAD_SYNCS, PIPELINE_SCHEDULES, PRECISIONS, STRATEGIES
from zsim.spec.plan import Offload as OffloadLiteral
from zsim.spec.plan import Recompute as RecomputeLiteral
from zsim.spec.programs import program_names
from zsim.spec.registry import DEFAULT_HARDWARE

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Plan and simulate sharded data-parallel training (DDP, ZeRO, FSDP, HSDP).")

T = TypeVar("T")


class Format(str, Enum):
    table = "table"
    json = "json"
    csv = "csv"


def _run(fn: Callable[[], T]) -> T:
    """Call into the api; a user error becomes one line and exit code 2."""
    try:
        return fn()
    except ZsimError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(code=2) from None


ModelOpt = Annotated[str | None, typer.Option(
    help="Preset name (see `zsim models`), a preset's Hugging Face id "
         "(meta-llama/Llama-2-13b-hf) or a config.json path.")]
ParamsOpt = Annotated[float | None, typer.Option(
    help="Synthetic Llama-style model of exactly this many parameters, e.g. 7e9.")]
GpusOpt = Annotated[int, typer.Option(help="World size (number of GPUs).")]
HardwareOpt = Annotated[str, typer.Option(
    help="Hardware profile name (see `zsim hardware`) or YAML path.")]
SeqOpt = Annotated[int | None, typer.Option(
    help="Sequence length, tokens (default: the model's training length, else 4096).")]
MicroBatchOpt = Annotated[int, typer.Option(help="Sequences per micro-batch per GPU.")]
FormatOpt = Annotated[Format, typer.Option(help="Output format.")]
EpOpt = Annotated[int, typer.Option(
    help="Expert-parallel degree (MoE models), carved from the data-parallel ranks.")]
CapacityOpt = Annotated[float, typer.Option(
    help="Expert capacity factor (MoE; 0: dropless, as torchtitan).")]
ImbalanceOpt = Annotated[float, typer.Option(
    help="Routed tokens the busiest EP rank receives over the mean (MoE; 1: balanced).")]
RestartOpt = Annotated[float | None, typer.Option(
    help="Seconds from a failure to training again, without the checkpoint's load: your "
         "own figure in place of the fleet's (600 s, assumed).")]



@app.command()
def plan(
    model: ModelOpt = None,
    params: ParamsOpt = None,
    gpus: GpusOpt = 8,
    hardware: HardwareOpt = DEFAULT_HARDWARE,
    seq: SeqOpt = None,
    micro_batch: Annotated[int | None, typer.Option(
        help="Sequences per micro-batch per GPU (default 1, or the config's).")] = None,
    grad_accum: Annotated[int | None, typer.Option(
        help="Micro-batches per optimizer step (default 1, or the config's).")] = None,
    precision: Annotated[str | None, typer.Option(
        help="bf16 or fp16 (mixed, fp32 master) or fp32 (default bf16, or the "
             "config's).")] = None,
    ds_config: Annotated[Path | None, typer.Option(
        help="Rank your DeepSpeed ds_config.json and its variations (ZeRO stage x "
             "recomputation, every other setting kept).")] = None,
    fsdp_config: Annotated[Path | None, typer.Option(
        help="Rank your accelerate FSDP config and its variations (resharding, HSDP x "
             "recomputation, every other setting kept).")] = None,
    global_batch: Annotated[str | None, typer.Option(
        help="Global batch of the 2-D/3-D plan search: sequences (512) or tokens (4Mt); "
             "default one sequence per GPU.")] = None,
    tp: Annotated[int | None, typer.Option(help="Only 2-D/3-D plans with this TP.")] = None,
    pp: Annotated[int | None, typer.Option(help="Only 2-D/3-D plans with this PP.")] = None,
    cp: Annotated[int | None, typer.Option(help="Only 2-D/3-D plans with this CP.")] = None,
    ep: Annotated[int | None, typer.Option(
        help="Only plans with this expert-parallel degree (MoE models).")] = None,
    expert_imbalance: ImbalanceOpt = 1.0,
    capacity_factor: CapacityOpt = 0.0,
    run_days: Annotated[float | None, typer.Option(
        help="Also what each plan delivers over this many days: tokens per day, goodput, "
             "its best checkpoint (checkpoints, failures and restarts simulated).")] = None,
    fleet: Annotated[str, typer.Option(
        help="Failure statistics for --run-days: llama3, or a fleet file (.yaml: "
             "gpu_failures_per_gpu_day, node_failures_per_node_day, source, "
             "restart_s).")] = "llama3",
    restart_s: RestartOpt = None,
    format: FormatOpt = Format.table,
) -> None:
    """Rank candidate plans: memory per GPU, fit, communication, step time, and why each
    loses; for a model larger than one GPU on several nodes, an MoE model (expert
    parallelism), or with --global-batch, --tp, --pp, --cp, --ep, also the 2-D and 3-D
    plans."""
    fixed = {k: v for k, v in (("tp", tp), ("pp", pp), ("cp", cp), ("ep", ep))
             if v is not None}
    fixed |= {k: v for k, v, default in (("expert_imbalance", expert_imbalance, 1.0),
                                         ("capacity_factor", capacity_factor, 0.0))
              if v != default}
    result = _run(lambda: api.plan(model=model, params=params, gpus=gpus, hardware=hardware,
                                   seq=seq, micro_batch=micro_batch, grad_accum=grad_accum,
                                   precision=precision, ds_config=ds_config,
                                   fsdp_config=fsdp_config, global_batch=global_batch,
                                   parallel=fixed, run_days=run_days, fleet=fleet,
                                   restart_s=restart_s))
    for warning in result["warnings"]:
        typer.echo(f"warning: {warning}", err=True)
    if format is Format.json:
        typer.echo(json_text(result))
    elif format is Format.csv:
        typer.echo(csv_text(result["candidates"]), nl=False)
    else:
        typer.echo(plan_text(result))


@app.command()
def models() -> None:
    """List model presets and their parameter counts."""
    rows = _run(api.models)
    typer.echo(text_table(rows, ("name", "aliases", "params", "layers", "d_model", "heads",
                                 "kv_heads", "seq_len")))


@app.command()
def hardware() -> None:
    """List hardware profiles."""
    rows = _run(api.hardware)
    typer.echo(text_table(rows, ("name", "gpu", "hbm_gib", "gpus_per_node", "intra_node",
                                 "inter_node")))


def _choices(name: str, values: Iterable[str]) -> Any:
    """A str Enum of the allowed values of a plan field, so the CLI's choices can never
    drift from zsim.spec.plan's."""
    return Enum(name, [(v.replace("-", "_"), v) for v in values], type=str)


Strategy = _choices("Strategy", STRATEGIES)
Recompute = _choices("Recompute", get_args(RecomputeLiteral))
Precision = _choices("Precision", PRECISIONS)
Offload = _choices("Offload", get_args(OffloadLiteral))
Impl = _choices("Impl", sorted(program_names()))
PipelineSchedule = _choices("PipelineSchedule", PIPELINE_SCHEDULES)
GradSync = _choices("GradSync", GRAD_SYNCS)


PlanModelOpt = Annotated[str, typer.Option(help="Preset name or a config.json path.")]
StrategyOpt = Annotated[Strategy, typer.Option(help="Data-parallel strategy.")]
ShardGroupOpt = Annotated[int | None, typer.Option(help="HSDP shard group size.")]
GradAccumOpt = Annotated[int, typer.Option(help="Micro-batches per optimizer step.")]
AcOpt = Annotated[Recompute, typer.Option(help="Activation checkpointing.")]
PrecisionOpt = Annotated[Precision, typer.Option(
    help="Mixed bf16 or fp16 (fp32 master weights), plain fp32, or fp32 with TF32 "
         "matmuls (tf32).")]
OffloadOpt = Annotated[Offload, typer.Option(help="Offload to host memory.")]
ImplOpt = Annotated[Impl | None, typer.Option(
    help="The program that runs the strategy: torch (ddp; zero1 as DDP + "
         "ZeroRedundancyOptimizer), fsdp2 (fsdp, fsdp-no-reshard, hsdp), deepspeed (zero1, "
         "zero2, zero3). Default: the strategy's own.")]


TpOpt = Annotated[int, typer.Option(help="Tensor-parallel degree (inside a node).")]
PpOpt = Annotated[int, typer.Option(help="Pipeline-parallel degree (stages).")]
CpOpt = Annotated[int, typer.Option(help="Context-parallel degree (ring attention).")]
SpOpt = Annotated[bool, typer.Option(help="Sequence parallelism with TP.")]
AsyncTpOpt = Annotated[bool, typer.Option(help="Async TP: TP collectives overlap the matmuls "
                                                "(needs --sp).")]
TpAcrossNodesOpt = Annotated[bool, typer.Option(help="Allow a TP group larger than a node.")]
PpScheduleOpt = Annotated[PipelineSchedule, typer.Option(help="Pipeline schedule.")]
VirtualStagesOpt = Annotated[int, typer.Option(help="Pipeline stages per rank (interleaved).")]


def _parallel(*, tp: int, pp: int, cp: int, sp: bool, async_tp: bool, tp_across_nodes: bool,
              pp_schedule: Any, virtual_stages: int, ep: int = 1,
              capacity_factor: float = 0.0, expert_imbalance: float = 1.0) -> dict[str, Any]:
    """The model-parallel flags that differ from their defaults (zsim.api.PARALLEL_FIELDS)."""
    given = {"tp": tp, "pp": pp, "cp": cp, "sp": sp, "async_tp": async_tp,
             "tp_across_nodes": tp_across_nodes, "pp_schedule": pp_schedule.value,
             "virtual_stages": virtual_stages, "ep": ep, "capacity_factor": capacity_factor,
             "expert_imbalance": expert_imbalance}
    defaults = {"tp": 1, "pp": 1, "cp": 1, "sp": False, "async_tp": False,
                "tp_across_nodes": False, "pp_schedule": "1f1b", "virtual_stages": 1,
                "ep": 1, "capacity_factor": 0.0, "expert_imbalance": 1.0}
    return {k: v for k, v in given.items() if v != defaults[k]}


class SimFormat(str, Enum):
    table = "table"
    json = "json"


@app.command()
def simulate(
    model: PlanModelOpt,
    gpus: GpusOpt,
    strategy: Annotated[Strategy | None, typer.Option(
        help="Data-parallel strategy (taken from --ds-config when given).")] = None,
    shard_group: ShardGroupOpt = None,
    hardware: HardwareOpt = DEFAULT_HARDWARE,
    seq: SeqOpt = None,
    micro_batch: Annotated[int | None, typer.Option(
        help="Sequences per micro-batch per GPU (default 1, or the config's).")] = None,
    grad_accum: Annotated[int | None, typer.Option(
        help="Micro-batches per optimizer step (default 1, or the config's).")] = None,
    ac: AcOpt = Recompute.none,
    precision: Annotated[Precision | None, typer.Option(
        help="bf16 or fp16 (mixed, fp32 master) or fp32 (default bf16, or the "
             "config's).")] = None,
    offload: OffloadOpt = Offload.none,
    impl: ImplOpt = None,
    tp: TpOpt = 1,
    pp: PpOpt = 1,
    cp: CpOpt = 1,
    ep: EpOpt = 1,
    capacity_factor: CapacityOpt = 0.0,
    expert_imbalance: ImbalanceOpt = 1.0,
    sp: SpOpt = False,
    async_tp: AsyncTpOpt = False,
    tp_across_nodes: TpAcrossNodesOpt = False,
    pp_schedule: PpScheduleOpt = PipelineSchedule["1f1b"],
    virtual_stages: VirtualStagesOpt = 1,
    grad_sync: Annotated[GradSync, typer.Option(
        help="With --grad-accum, when FSDP2 reduces gradients: last (once per step; "
             "unsharded gradients accumulate) or every (each micro-batch, as "
             "torchtitan).")] = GradSync["last"],
    ds_config: Annotated[Path | None, typer.Option(
        help="A DeepSpeed ds_config.json: the ZeRO stage and its settings, batch sizes and "
             "precision come from it; flags fill its \"auto\" values.")] = None,
    fsdp_config: Annotated[Path | None, typer.Option(
        help="An accelerate config YAML with distributed_type FSDP: FSDP version, "
             "sharding strategy, prefetch, offload, recomputation and precision come from "
             "it.")] = None,
    trace: Annotated[Path | None, typer.Option(help="Write a Chrome/Perfetto trace here.")] = None,
    fit_only: Annotated[bool, typer.Option(
        help="Stop at the first allocation over HBM: whether it fits, and where not.")] = False,
    format: Annotated[SimFormat, typer.Option(help="Output format.")] = SimFormat.table,
) -> None:
    """Simulate one plan: step time, exposed communication, memory peak and breakdown."""
    r = _run(lambda: api.simulate(
        model=model, gpus=gpus, strategy=strategy.value if strategy else None,
        shard_group=shard_group, hardware=hardware, seq=seq, micro_batch=micro_batch,
        grad_accum=grad_accum, ac=ac.value, precision=precision.value if precision else None,
        offload=offload.value, impl=impl.value if impl else None, trace=trace,
        fit_only=fit_only, ds_config=ds_config, fsdp_config=fsdp_config,
        parallel=_parallel(tp=tp, pp=pp, cp=cp, sp=sp, async_tp=async_tp,
                           tp_across_nodes=tp_across_nodes, pp_schedule=pp_schedule,
                           virtual_stages=virtual_stages, ep=ep,
                           capacity_factor=capacity_factor,
                           expert_imbalance=expert_imbalance),
        grad_sync=grad_sync.value))
    for warning in r["warnings"]:
        typer.echo(f"warning: {warning}", err=True)
    if format is SimFormat.json:
        typer.echo(json_text(r))
    else:
        typer.echo(simulate_text(r))


Method = _choices("Method", METHODS)
Target = _choices("Target", TARGETS)


@app.command("run")
def run_(
    model: PlanModelOpt,
    gpus: GpusOpt,
    strategy: Annotated[Strategy | None, typer.Option(
        help="Data-parallel strategy (default: the plan `zsim plan` recommends).")] = None,
    shard_group: ShardGroupOpt = None,
    hardware: HardwareOpt = DEFAULT_HARDWARE,
    seq: SeqOpt = None,
    micro_batch: Annotated[int | None, typer.Option(
        help="Sequences per micro-batch per GPU (default 1, or the planner's).")] = None,
    grad_accum: Annotated[int | None, typer.Option(
        help="Micro-batches per optimizer step (default 1).")] = None,
    ac: AcOpt = Recompute.none,
    precision: Annotated[Precision | None, typer.Option(
        help="bf16 or fp16 (mixed, fp32 master) or fp32 (default bf16).")] = None,
    offload: OffloadOpt = Offload.none,
    impl: ImplOpt = None,
    tp: TpOpt = 1,
    pp: PpOpt = 1,
    cp: CpOpt = 1,
    days: Annotated[float, typer.Option(help="Wall time of each simulated run, days.")] = 30.0,
    fleet: Annotated[str, typer.Option(
        help="Failure statistics: llama3 (Llama 3's 54 days on 16,384 H100s), or a fleet "
             "file (.yaml: gpu_failures_per_gpu_day, node_failures_per_node_day, source, "
             "restart_s).")] = "llama3",
    restart_s: RestartOpt = None,
    checkpoint: Annotated[list[Method] | None, typer.Option(
        help="Checkpoint method to compare (repeatable; default every one the program "
             "saves with): dcp, dcp-async, full, deepspeed.")] = None,
    target: Annotated[Target, typer.Option(
        help="Where checkpoints go: the profile's shared file system, or each node's "
             "NVMe.")] = Target["shared"],
    interval_steps: Annotated[int | None, typer.Option(
        help="Also evaluate checkpointing every N steps (the table then shows it).")] = None,
    straggler_prob: Annotated[float, typer.Option(
        help="Probability that a rank is slow for a whole step (0: none).")] = 0.0,
    straggler_slowdown: Annotated[float, typer.Option(
        help="How much slower a straggler runs, as a fraction.")] = 0.2,
    jitter_cv: Annotated[float, typer.Option(
        help="Coefficient of variation of each kernel's time on each rank.")] = 0.0,
    seed: Annotated[int, typer.Option(help="Seeds failures and stragglers.")] = 0,
    plot: Annotated[Path | None, typer.Option(
        help="Write an SVG: goodput against checkpoint interval and against GPU "
             "count.")] = None,
    format: FormatOpt = Format.table,
) -> None:
    """A plan over days: checkpoints (sharded, async, full), failures and restarts,
    stragglers; tokens per day, goodput and where the rest goes, the best interval."""
    from zsim import run_api

    jitter = (Jitter(cv=jitter_cv, straggler_prob=straggler_prob,
                     straggler_slowdown=straggler_slowdown)
              if straggler_prob > 0 or jitter_cv > 0 else None)

    def go() -> dict[str, Any]:
        from zsim.spec.failures import failure_model

        failure_model(fleet, restart_s=restart_s)  # refused before the planner runs
        spec, hw, plan_, source = run_api.resolve_plan(
            model=model, gpus=gpus, hardware=hardware,
            strategy=strategy.value if strategy else None, seq=seq, micro_batch=micro_batch,
            grad_accum=grad_accum, ac=ac.value, precision=precision.value if precision else None,
            offload=offload.value, impl=impl.value if impl else None, shard_group=shard_group,
            parallel={k: v for k, v in (("tp", tp), ("pp", pp), ("cp", cp)) if v != 1})
        options = run_api.RunOptions(
            days=days, fleet=fleet, restart_s=restart_s,
            methods=tuple(m.value for m in checkpoint or ()),
            target=target.value, interval_steps=interval_steps, jitter=jitter, seed=seed,
            gpu_curve=plot is not None)
        return {**run_api.run(spec, hw, plan_, options, progress=ProgressBar(sys.stderr)),
                "plan_source": source}

    r = _run(go)
    if plot is not None:
        from zsim.atomic import write_files
        from zsim.report.plots import svg_bytes
        from zsim.report.run_plots import run_figure

        (written,) = write_files(plot.parent, {plot.name: svg_bytes(run_figure(r))})
        typer.echo(f"wrote {written}", err=True)
    if format is Format.json:
        typer.echo(json_text(r))
    elif format is Format.csv:
        typer.echo(csv_text([{k: v for k, v in m.items() if k != "curve"}
                             for m in r["methods"]]), nl=False)
    else:
        typer.echo(run_text(r))


# click's UsageError, whether typer vendors click (typer >= 0.29) or imports it.
_UsageError: type[Exception] = typer.BadParameter.__mro__[1]


def main() -> None:
    """Console entry point: like `app()`, but a usage error (unknown option, bad choice,
    unparsable value) is one line naming the option and value, with exit code 2."""
    # The process ends with the command: at exit, skip the interpreter's last full garbage
    # collection over every object still alive (30 ms of `zsim plan`'s wall time).
    atexit.unregister(gc.freeze)
    atexit.register(gc.freeze)
    command = typer.main.get_command(app)
    args = sys.argv[1:] or ["--help"]
    try:
        code = command.main(args=args, prog_name="zsim", standalone_mode=False)
    except _UsageError as e:
        # One line: click lays out some messages (choices of a missing option) on several.
        message = " ".join(e.format_message().split())  # type: ignore[attr-defined]
        if not message:  # a command group given no command: its help is shown already
            sys.exit(0)
        typer.echo(f"error: {message}", err=True)
        sys.exit(2)
    except (typer.Exit, typer.Abort) as e:
        sys.exit(getattr(e, "exit_code", 130))
    sys.exit(code if isinstance(code, int) else 0)


SetOpt = Annotated[list[str] | None, typer.Option(
    "--set", help="KEY=VALUE over the scenario file, KEY a dotted field path, VALUE YAML "
                  "(e.g. --set seq_len=4096 --set 'sweep.gpus=[8, 16]'); repeatable.")]

SWEEP_COLUMNS = ("run", "fits", "step_time_s", "exposed_comm_s", "peak_memory_gib",
                 "tokens_per_s_per_gpu", "mfu")


class Executor(str, Enum):
    local = "local"
    ray = "ray"


@app.command()
def sweep(
    scenario: Annotated[Path, typer.Option(help="Scenario YAML (plans and an optional sweep).")],
    out: Annotated[Path | None, typer.Option(
        help="Folder for journal.jsonl (an interrupted sweep resumes from it), "
             "results.csv/.parquet and the report: <name>.csv, <name>.md, "
             "<name>-*.svg.")] = None,
    format: FormatOpt = Format.table,
    set_: SetOpt = None,
    executor: Annotated[Executor, typer.Option(
        help="local: every core here (ZSIM_WORKERS=N caps them); ray: a Ray cluster "
             "(needs Ray: pip install 'ray>=2.40').")] = Executor.local,
    ray_address: Annotated[str | None, typer.Option(
        help="Ray cluster address (default: RAY_ADDRESS, else a local cluster).")] = None,
) -> None:
    """Simulate every run of a scenario (sweep expanded); print a table, write the report."""
    bar = ProgressBar(sys.stderr)
    r = _run(lambda: api.sweep(scenario, out, executor=executor.value,
                               ray_address=ray_address, progress=bar,
                               overrides=set_ or []))
    for warning in r["warnings"]:
        typer.echo(f"warning: {warning}", err=True)
    if format is Format.json:
        typer.echo(json_text(r["rows"]))
    elif format is Format.csv:
        typer.echo(r["csv"], nl=False)
    else:
        per_day = ("run_checkpoint", "run_goodput", "run_tokens_per_day") \
            if r["rows"] and "run_tokens_per_day" in r["rows"][0] else ()
        typer.echo(text_table(r["rows"], (*SWEEP_COLUMNS, *per_day)))
    if out is not None:
        resumed = len(r["rows"]) - r["simulated"]
        typer.echo(f"simulated {r['simulated']} runs, {resumed} read back from the journal",
                   err=True)
    for path in r["written"]:
        typer.echo(f"wrote {path}", err=True)


@app.command()
def report(
    out: Annotated[Path, typer.Option(
        help="Folder for each report: <name>.csv, <name>.md, <name>-*.svg.")],
    scenario: Annotated[list[Path] | None, typer.Option(
        help="Scenario YAML; repeatable.")] = None,
    all_: Annotated[bool, typer.Option(
        "--all", help="Every shipped study (the repository's scenarios/*.yaml, installed "
                      "with zsim): `zsim report --all --out reports` regenerates "
                      "reports/.")] = False,
    set_: SetOpt = None,
) -> None:
    """Simulate scenarios and write their markdown reports with tables and figures."""
    def progress(name: str, done: int, total: int, run: str) -> None:
        typer.echo(f"{name} [{done}/{total}] {run}", err=True)

    r = _run(lambda: api.report(scenario or [], out, shipped=all_, overrides=set_ or [],
                                progress=progress))
    for path in r["written"]:
        typer.echo(f"wrote {path}")


# ------------------------------------------------------------------------ zsim calibrate
calibrate_app = typer.Typer(
    no_args_is_help=True,
    help="Measure this machine into a hardware profile, and read measurements and "
         "validation evidence into a profile's figures.")
app.add_typer(calibrate_app, name="calibrate")


@calibrate_app.command("profile")
def calibrate_profile(
    out: Annotated[Path, typer.Option(help="Where to write the fitted hardware profile YAML.")],
    backend: Annotated[str, typer.Option(help="gloo (CPU) or nccl (CUDA GPUs).")] = "gloo",
    nproc: Annotated[int, typer.Option(help="Processes (ranks) to benchmark.")] = 2,
) -> None:
    """Fit a hardware profile from collective and kernel micro-benchmarks on this machine."""
    path = _run(lambda: calibrate_api.profile(backend=backend, nproc=nproc, out=out))
    typer.echo(f"wrote {path}")


@calibrate_app.command("bands")
def calibrate_bands(
    profile: Annotated[list[str] | None, typer.Option(
        help="A shipped profile (repeatable; default: every one).")] = None,
    write: Annotated[bool, typer.Option(
        help="Put each section into its hardware_profiles/NAME.yaml.")] = False,
    cases: Annotated[Path | None, typer.Option(
        help="Folder of published.yaml and h200-fsdp2-runs.yaml "
             "(default: tests/data/cases).")] = None,
    cpu: Annotated[Path | None, typer.Option(
        help="The validation evidence folder holding the CPU batches "
             "(default: reports/validation).")] = None,
) -> None:
    """Every shipped profile's error bands from the evidence that covers it: print each
    `error_bands:` section, or with --write put it into the profile."""
    r = _run(lambda: calibrate_api.bands(profiles=profile or [], write=write, cases=cases,
                                         cpu=cpu))
    if write:
        for path in r["written"]:
            typer.echo(f"wrote {path}")
        return
    for name, section in r["sections"].items():
        typer.echo(f"# {name}\n{section}")


@calibrate_app.command("gpu-phases")
def calibrate_gpu_phases(
    out: Annotated[Path, typer.Option(help="Output folder.")],
    quick: Annotated[bool, typer.Option(
        help="A tiny model at world 8 (a smoke test; runs on CPU).")] = False,
    budget_s: Annotated[float, typer.Option(
        help="Wall-clock budget, seconds.")] = 135.0,
) -> None:
    """Where the time of published FSDP2 steps goes on this GPU: per-phase GPU-busy vs
    host-bound time and kernel classes (rank 0 of N on the fake process group)."""
    r = _run(lambda: calibrate_api.gpu_phases(out=out, quick=quick, budget_s=budget_s))
    typer.echo(f"wrote {r['written']}")


@calibrate_app.command("phase-rates")
def calibrate_phase_rates(
    phases: Annotated[Path, typer.Option(
        help="A gpu-phases output folder (reports/validation/h200/phases).")],
    cases: Annotated[Path, typer.Option(
        help="The runs it profiled (tests/data/cases/h200-fsdp2-runs.yaml).")],
) -> None:
    """The profile's attention rates, kernel gap and copy-in rate read from profiled
    steps, with the measurements they come from."""
    r = _run(lambda: calibrate_api.phase_rates(phases=phases, cases=cases))
    typer.echo(r["text"])


# ------------------------------------------------------------------------- zsim validate
validate_app = typer.Typer(
    no_args_is_help=True,
    help="How far the simulator is from real runs: run plans for real and compare, "
         "replay published runs, and take the error apart.")
app.add_typer(validate_app, name="validate")


@validate_app.command("plan")
def validate_plan(
    model: PlanModelOpt,
    nproc: Annotated[int, typer.Option(help="Processes to run the plan on.")],
    strategy: StrategyOpt,
    shard_group: ShardGroupOpt = None,
    seq: SeqOpt = None,
    micro_batch: MicroBatchOpt = 1,
    grad_accum: GradAccumOpt = 1,
    ac: AcOpt = Recompute.none,
    precision: PrecisionOpt = Precision.bf16,
    offload: OffloadOpt = Offload.none,
    impl: ImplOpt = None,
    profile: Annotated[str, typer.Option(help="Calibrated hardware profile.")] = "local-cpu",
    steps: Annotated[int | None, typer.Option(
        help="Timed steps of the real run (default: 3, or more to fill 6 s).")] = None,
    out: Annotated[Path | None, typer.Option(
        help="Folder to write the rows to as a CSV (nothing is written without it).")] = None,
    format: Annotated[SimFormat, typer.Option(help="Output format.")] = SimFormat.table,
) -> None:
    """Run a plan for real (torch.distributed) and in the simulator; print the error."""
    r = _run(lambda: validate_api.plan(
        model=model, nproc=nproc, strategy=strategy.value, shard_group=shard_group,
        profile=profile, seq=seq, micro_batch=micro_batch, grad_accum=grad_accum,
        ac=ac.value, precision=precision.value, offload=offload.value,
        impl=impl.value if impl else None, steps=steps, out=out))
    if r["written"]:
        typer.echo(f"wrote {r['written']}", err=True)
    if format is SimFormat.json:
        typer.echo(json_text(r))
        return
    typer.echo(f"{r['model']} {r['plan']} on {nproc} processes, profile {r['profile']}")
    typer.echo(text_table(r["rows"], ("metric", "predicted", "measured", "error_pct",
                                      "bound_pct")))


@validate_app.command("grid")
def validate_grid(
    out: Annotated[Path, typer.Option(
        help="The validation evidence folder (the repository's is reports/validation).")],
    profile: Annotated[str | None, typer.Option(
        help="Calibrated hardware profile (name or YAML path) of its world size; the "
             "batch's other world sizes are calibrated here (default local-cpu).")] = None,
    calibrate_here: Annotated[bool, typer.Option(
        help="Calibrate every world size of the batch on this host (into --out) instead "
             "of using --profile: for a host other than the committed profiles'.")] = False,
    only: Annotated[list[str] | None, typer.Option(
        help="Measure only the cases whose '<model> <plan label> n<N>' matches this "
             "fnmatch pattern (repeatable); their rows replace theirs in the batch.")] = None,
    no_time: Annotated[bool, typer.Option(
        help="Keep only host-independent metrics (memory, state, activations).")] = False,
    runs: Annotated[int | None, typer.Option(help="Runs of each case (default 3).")] = None,
    steps: Annotated[int, typer.Option(help="Timed steps per run, at least.")] = 8,
    calibration_rounds: Annotated[int | None, typer.Option(
        help="Rounds of the benchmarks of each profile calibrated here (default: 1 before "
             "each pass over the cases when timed, else the benchmarks' own, once).")] = None,
    min_timed_s: Annotated[float | None, typer.Option(
        help="Time more steps until each run's timed steps fill this many seconds "
             "(default 6).")] = None,
    repredict: Annotated[bool, typer.Option(
        help="Measure nothing: predict the batches' rows again with the simulator as it "
             "is now, each with its own profiles, keeping their measured figures.")] = False,
    batch: Annotated[str | None, typer.Option(
        help="The batch to measure into (default: validation, the grid report's own; a "
             "new name starts a batch), or with --repredict the one to predict again "
             "(default: every batch).")] = None,
    report: Annotated[str | None, typer.Option(
        help="The report a new batch joins (default: a report of its own name).")] = None,
) -> None:
    """Measure a batch of the CPU validation report over the grid of cases (every case, or
    those --only names) into the evidence folder, or predict its batches again
    (--repredict); then draw its figures again."""
    r = _run(lambda: validate_api.grid(
        out=out, profile=profile, calibrate_here=calibrate_here, only=only or [],
        no_time=no_time, runs=runs, steps=steps, calibration_rounds=calibration_rounds,
        min_timed_s=min_timed_s, repredict=repredict, batch=batch, report=report))
    typer.echo(f"wrote {r['written']}")
    for path in r["figures"]:
        typer.echo(f"wrote {path}", err=True)


@validate_app.command("figures")
def validate_figures(
    out: Annotated[Path, typer.Option(
        help="The validation evidence folder (the repository's is reports/validation).")],
) -> None:
    """Draw every figure of the validation evidence from its tables (SVG), and the error
    budget's tables."""
    r = _run(lambda: validate_api.figures(out=out))
    for path in r["written"]:
        typer.echo(f"wrote {path}")


@validate_app.command("gpu-report")
def validate_gpu_report(
    out: Annotated[Path, typer.Option(help="Output folder.")],
    quick: Annotated[bool, typer.Option(
        help="Tiny models and shapes (a smoke test; runs on CPU).")] = False,
    budget_s: Annotated[float, typer.Option(help="Wall-clock budget, seconds.")] = 360.0,
    only: Annotated[list[str] | None, typer.Option(
        help="A validation run's name: run only these (repeatable), and no other "
             "section (to redo runs that failed).")] = None,
    hardware: Annotated[str | None, typer.Option(
        help="Hardware profile of the predictions (default hgx-h200 with CUDA, local-cpu "
             "without).")] = None,
) -> None:
    """The GPU validation report: the rows one GPU can host against the simulator, plus
    the host, matmul, attention and memory-bound measurements of the GPU fit."""
    r = _run(lambda: validate_api.gpu_report(out=out, quick=quick, budget_s=budget_s,
                                             only=only or [], hardware=hardware))
    typer.echo(f"wrote {r['written']}")


@validate_app.command("checkpoint")
def validate_checkpoint(
    out: Annotated[Path, typer.Option(help="Folder for checkpoints.csv and storage.yaml.")],
    profile: Annotated[str, typer.Option(
        help="The profile whose storage section is replaced by this host's, measured "
             "first.")] = "local-cpu",
    nproc: Annotated[int, typer.Option(help="Ranks (gloo processes).")] = 2,
    directory: Annotated[Path | None, typer.Option(
        "--dir", help="Folder the checkpoints go to (a temporary folder inside it); "
                      "default the system's temporary folder. /dev/shm checks the model "
                      "without the disk.")] = None,
) -> None:
    """Checkpoint saves and loads for real (DCP sync and async, full state dict,
    DeepSpeed) against the checkpoint model, the storage measured before each plan."""
    r = _run(lambda: validate_api.checkpoint(out=out, profile=profile, nproc=nproc,
                                             directory=directory))
    typer.echo(text_table(r["rows"], ("program", "strategy", "method", "metric", "predicted",
                                      "measured", "error_pct")))
    for path in r["written"]:
        typer.echo(f"wrote {path}", err=True)


@validate_app.command("moe-ep")
def validate_moe_ep(
    out: Annotated[Path, typer.Option(help="Folder for ep.csv and provenance.yaml.")],
    steps: Annotated[int, typer.Option(help="Timed steps per run.")] = 5,
) -> None:
    """The expert-parallel MoE layer for real on gloo (world 2 and 4): all-to-all bytes
    and calls, routing imbalance, state, peak memory and step time per rank."""
    r = _run(lambda: validate_api.moe_ep(out=out, steps=steps,
                                         command=" ".join(["zsim", *sys.argv[1:]])))
    typer.echo(text_table(r["rows"], ("case", "rank", "a2a_sent_bytes_per_step",
                                      "a2a_calls_per_step", "imbalance_experts_max_over_mean",
                                      "peak_memory_bytes", "step_time_s")))
    for path in r["written"]:
        typer.echo(f"wrote {path}", err=True)


@validate_app.command("published-runs")
def validate_published_runs(
    cases: Annotated[Path, typer.Option(
        help="The runs file (tests/data/cases/h200-fsdp2-runs.yaml).")],
    hardware: HardwareOpt = "hgx-h200",
) -> None:
    """The published H200 runs replayed in the simulator: each run's error per metric."""
    r = _run(lambda: validate_api.published_runs(cases=cases, hardware=hardware))
    typer.echo(r["text"])


@validate_app.command("error-budget")
def validate_error_budget(
    folder: Annotated[Path, typer.Argument(
        help="The validation evidence folder (the repository's is reports/validation).")],
    report: Annotated[str | None, typer.Option(
        help="The report whose batches to take (default: validation-cpu2).")] = None,
    out: Annotated[Path | None, typer.Option(
        help="Where to write (default: the evidence folder).")] = None,
    bound_pct: Annotated[float | None, typer.Option(
        help="The step-time bound, percent (default 15).")] = None,
) -> None:
    """Where the CPU batches' step-time error comes from: each case's bias, each
    calibration's shift, and the rest."""
    r = _run(lambda: validate_api.error_budget(folder=folder, report=report, out=out,
                                               bound_pct=bound_pct))
    for path in r["written"]:
        typer.echo(f"wrote {path}", err=True)
    typer.echo(r["summary"])
