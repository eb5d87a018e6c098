"""The terminal answer of `zsim plan`: what a user reads once and acts on.

Owns the rendering of zsim.api.plan's result as text that fits TERMINAL_COLUMNS: a
header with the model, cluster, sequence and global batch; one table per planner (1-D,
and 2-D/3-D where searched) whose rows are short enough not to wrap, memory in GiB with
the unit under each title; the recommended and tied plans marked; each row's reason on
its own numbered line below the tables; and the one recommendation. Pure formatting of
plain data: no simulation, no pandas.
"""

from __future__ import annotations

import textwrap
from typing import Any

from zsim.report.tables import text_table

TERMINAL_COLUMNS = 120
"""The width every line of the answer fits."""
PARALLEL_ROWS = 20
"""2-D/3-D plans the table shows (JSON and CSV give them all)."""

MARKS = {"recommended": "> ", "tied": "= ", "": "  "}
"""The plan column's mark of each tier (zsim.planner.to_record)."""

HEADERS: dict[str, tuple[str, str]] = {
    "n": ("#", ""), "plan": ("plan", ""), "ac": ("ac", ""), "batch": ("mb x ga", ""),
    "fits": ("fits", ""), "peak": ("peak", "GiB"), "state": ("state", "GiB"),
    "act": ("act/mb", "GiB"), "comm": ("comm/step", "GiB"), "step": ("step", "s"),
    "band": ("band", "%"), "tps": ("tok/s", "/GPU"), "mfu": ("MFU", ""),
    "bubble": ("bubble", ""),
}
"""Each column's title and unit."""
COLUMNS = ("n", "plan", "ac", "batch", "fits", "peak", "state", "act", "comm", "step",
           "band", "tps", "mfu")
PARALLEL_COLUMNS = ("n", "plan", "ac", "batch", "fits", "peak", "act", "step", "band",
                    "tps", "bubble")


def compact_band(rec: dict[str, Any]) -> str | None:
    """A row's step-time band in percent of its prediction: "±6" where symmetric,
    "-3..+70" otherwise; "*" marks a band widened beyond what was validated; "est." a
    2-D plan the pipeline replay estimated but the engine did not simulate (no band)."""
    step, low, high = rec["step_time_s"], rec["step_time_s_low"], rec["step_time_s_high"]
    if rec["evaluated"] == "estimate" and step is not None:
        return "est."
    if step is None or low is None or high is None:
        return None
    lo, hi = (round(100 * (b / step - 1)) for b in (low, high))
    text = f"±{hi}" if lo == -hi else f"{_signed(lo)}..{_signed(hi)}"
    return text + ("*" if rec.get("step_time_band_extrapolated") else "")


def _signed(pct: int) -> str:
    return f"{pct:+d}" if pct else "0"


def _row(n: int, rec: dict[str, Any]) -> dict[str, object]:
    mfu = rec.get("mfu")
    bubble = rec.get("bubble_fraction")
    return {
        "n": f"{n}{'*' if rec.get('yours') else ''}",
        "plan": MARKS[rec["tier"]] + rec["layout"],
        "ac": rec["recompute"],
        "batch": f"{rec['micro_batch']} x {rec['grad_accum']}",
        "fits": rec["fits"],
        "peak": rec["peak_gib"],
        "state": rec.get("model_state_gib"),
        "act": rec["saved_activations_gib_per_microbatch"],
        "comm": rec.get("comm_gib_per_step"),
        "step": rec["step_time_s"],
        "band": compact_band(rec),
        "tps": rec["tokens_per_s_per_gpu"],
        "mfu": None if mfu is None else f"{mfu:.0%}",
        "bubble": None if not bubble else f"{bubble:.0%}",
    }


def sequence_line(seq_len: int, source: str) -> str:
    """Where the sequence length came from, and how to change it."""
    if source == "--seq":
        return f"sequence {seq_len:,} tokens: from --seq"
    return f"sequence {seq_len:,} tokens: {source}; change it with --seq N"


def _wrapped(prefix: str, text: str) -> list[str]:
    return textwrap.wrap(text, TERMINAL_COLUMNS, initial_indent=prefix,
                         subsequent_indent=" " * len(prefix), break_on_hyphens=False)


def plan_text(result: dict[str, Any]) -> str:
    """The whole answer of zsim.api.plan as text, every line within TERMINAL_COLUMNS."""
    gpus, per_node = result["gpus"], result["gpus_per_node"]
    nodes = gpus / per_node
    nodes_text = (f"{gpus} GPUs" if gpus <= per_node else
                  f"{nodes:.0f} nodes of {per_node}" if nodes.is_integer() else
                  f"{nodes:.2g} nodes of {per_node}")
    out = _wrapped("", f"{result['model']} ({result['num_params'] / 1e9:.2f}B params) on "
                       f"{nodes_text} x {result['hardware']} ({result['hbm_gib']:.1f} GiB "
                       f"HBM per GPU)")
    out += _wrapped("", sequence_line(result["seq_len"], result["seq_len_source"]))
    out += _wrapped("", f"global batch {result['global_batch_sequences']:,} sequences = "
                        f"{result['global_batch_tokens']:,} tokens per step; change it with "
                        f"--global-batch N (sequences) or Nt (tokens)")
    why: list[tuple[int, str]] = []
    n = 0
    tables = [("1-D plans: data parallelism over all GPUs", result["candidates"], COLUMNS)]
    searched = result.get("parallel")
    if searched:
        shown = searched["candidates"][:PARALLEL_ROWS]
        tables.append(("2-D and 3-D plans: FSDP2 or DDP over the data-parallel ranks with "
                       "tensor, context or pipeline parallelism", shown, PARALLEL_COLUMNS))
    for title, records, columns in tables:
        if not records:
            continue
        rows = []
        for rec in records:
            n += 1
            rows.append(_row(n, rec))
            why.append((n, rec["why"]))
        out += ["", title, text_table(rows, columns, headers=HEADERS,
                                      left=("plan", "ac", "batch"))]
    if searched and len(searched["candidates"]) > PARALLEL_ROWS:
        out.append(f"... {len(searched['candidates']) - PARALLEL_ROWS} more 2-D/3-D plans "
                   f"(--format json lists them all)")
    tolerance = result.get("tie_tolerance_pct")
    scatter = f" (±{tolerance:.0f}%)" if tolerance and tolerance >= 1 else ""
    out.append("")
    out += _wrapped("", f"> recommended, = tied: predicted within the scatter of this "
                        f"profile's validation runs{scatter} of the fastest plan; among tied "
                        f"plans zsim prefers one that fits at the top of its memory band, "
                        f"then the simplest, then the one with the least memory")
    out += _wrapped("", "act/mb: what one micro-batch saves for backward; comm/step: what "
                        "each GPU sends per step; band: where the real step time lies, in % "
                        "of the prediction, from this profile's validation runs; * widened "
                        "where the plan goes beyond them (--format json: "
                        "step_time_band_extrapolated); est.: the pipeline replay's estimate, "
                        "not simulated")
    if result.get("yours"):
        out += _wrapped("", f"*: your config, {result['yours']}")
    out += ["", "why:"]
    width = len(str(n))
    for i, text in why:
        out += _wrapped(f"{i:>{width}}  ", text)
    out.append("")
    out += _per_day_lines(result)
    if result["recommended"] is None:
        out += _wrapped("", result["recommendation"])
    else:
        out += _wrapped("", f"recommended: {result['recommended']}, {_accumulation(result)} "
                            f"({result['recommended_table']} table): "
                            f"{result['recommendation']}")
    return "\n".join(out)


PER_DAY_ROWS = 10
"""Plans the per-day table of `--run-days` lists, most tokens per day first."""


def _per_day_lines(result: dict[str, Any]) -> list[str]:
    """With --run-days: the plans that deliver the most tokens per day, and their
    checkpoint; [] without."""
    run = result.get("run")
    if not run:
        return []
    records = [r for r in [*result["candidates"],
                           *(result["parallel"] or {}).get("candidates", [])]
               if r.get("run_tokens_per_day") is not None]
    records.sort(key=lambda r: -r["run_tokens_per_day"])
    rows = [{"plan": r["plan"], "ac": r["recompute"], "step": f"{r['step_time_s']:.3g}",
             "checkpoint": r["run_checkpoint"],
             "every": f"{r['run_checkpoint_interval_min']:.3g}",
             "goodput": f"{100 * r['run_goodput']:.1f}",
             "tokens/day": f"{r['run_tokens_per_day'] / 1e9:,.1f}"}
            for r in records[:PER_DAY_ROWS]]
    if not rows:
        return []
    headers = {"step": ("step", "s"), "every": ("every", "min"), "goodput": ("goodput", "%"),
               "tokens/day": ("tokens/day", "B")}
    restart = ("" if run.get("restart_s") is None
               else f", restart {run['restart_s']:g} s + the load")
    out = ["", f"over {run['days']:g} days ({run['fleet']} failure rates{restart}, each "
               f"plan's best checkpoint at Young's interval; zsim run searches the "
               f"interval):",
           text_table(rows, list(rows[0]), headers=headers, left=("plan", "ac", "checkpoint")),
           ""]
    most = records[0]
    picked = next((r for r in records if r["tier"] == "recommended"), None)
    text = f"most tokens per day: {most['plan']}"
    if picked is not None and picked is not most:
        gap = 100 * (1 - picked["run_tokens_per_day"] / most["run_tokens_per_day"])
        tolerance = result.get("tie_tolerance_pct") or 0.0
        text += (f"; the recommended plan delivers {gap:.1f}% fewer"
                 + (f", within the ±{tolerance:.0f}% scatter: a tie" if gap <= tolerance
                    else ""))
    out += _wrapped("", text)
    return out


def _accumulation(result: dict[str, Any]) -> str:
    """The recommended plan's gradient accumulation, e.g. "4 micro-batches"."""
    records = [*result["candidates"], *(result["parallel"] or {}).get("candidates", [])]
    ga = next(r["grad_accum"] for r in records if r["tier"] == "recommended")
    return f"{ga} micro-batch{'es' if ga > 1 else ''} per step"
