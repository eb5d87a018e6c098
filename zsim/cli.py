"""zsim command line: a thin Typer layer over zsim.api. Each command parses, calls one
api function, and renders; a ZsimError becomes one line on stderr and exit code 2."""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum
from typing import Annotated, Any, TypeVar

import typer

from zsim import api
from zsim.errors import ZsimError
from zsim.report.tables import csv_text, json_text, text_table
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
    help="Preset name (see `zsim models`) or a config.json path.")]
ParamsOpt = Annotated[float | None, typer.Option(
    help="Synthetic Llama-style model of exactly this many parameters, e.g. 7e9.")]
GpusOpt = Annotated[int, typer.Option(help="World size (number of GPUs).")]
HardwareOpt = Annotated[str, typer.Option(
    help="Hardware profile name (see `zsim hardware`) or YAML path.")]
SeqOpt = Annotated[int | None, typer.Option(help="Sequence length, tokens (default: the model's).")]
MicroBatchOpt = Annotated[int, typer.Option(help="Sequences per micro-batch per GPU.")]
FormatOpt = Annotated[Format, typer.Option(help="Output format.")]

PLAN_COLUMNS = ("plan", "fits", "peak_gib", "model_state_gb", "activations_gib",
                "comm_gb_per_step", "step_time_s", "tokens_per_s", "mfu", "why")


@app.command()
def plan(
    model: ModelOpt = None,
    params: ParamsOpt = None,
    gpus: GpusOpt = 8,
    hardware: HardwareOpt = DEFAULT_HARDWARE,
    seq: SeqOpt = None,
    micro_batch: MicroBatchOpt = 1,
    grad_accum: Annotated[int, typer.Option(help="Micro-batches per optimizer step.")] = 1,
    precision: Annotated[str, typer.Option(help="bf16 (mixed, fp32 master) or fp32.")] = "bf16",
    format: FormatOpt = Format.table,
) -> None:
    """Rank candidate plans: memory per GPU, fit, communication, step time, and why each loses."""
    result = _run(lambda: api.plan(model=model, params=params, gpus=gpus, hardware=hardware,
                                   seq=seq, micro_batch=micro_batch, grad_accum=grad_accum,
                                   precision=precision))
    rows: list[dict[str, Any]] = result["candidates"]
    if format is Format.json:
        typer.echo(json_text(result))
    elif format is Format.csv:
        typer.echo(csv_text(rows), nl=False)
    else:
        typer.echo(f"{result['model']} ({result['num_params'] / 1e9:.2f}B params) on "
                   f"{result['gpus']} x {result['hardware']}, seq {result['seq_len']}, "
                   f"micro-batch {micro_batch}")
        typer.echo(text_table(rows, PLAN_COLUMNS))
        best = result["recommended"]
        typer.echo(f"\nrecommended: {best}" if best else "\nno candidate fits in HBM")


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
