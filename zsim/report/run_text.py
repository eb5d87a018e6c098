"""The terminal answer of `zsim run`: what a plan delivers per day, read once.

Owns the rendering of zsim.run_api.run's result as text: the plan and its step, the
fleet's failures, one row per checkpoint method (bytes, stall, background write, load,
host memory, Young's and the simulated best interval, goodput and where the rest of the
wall time goes, tokens per day), the pick, and what a user must know about the methods
that lose (a full state dict that does not fit the host, the offline conversion). Pure
formatting of plain data.
"""

from __future__ import annotations

import textwrap
from typing import Any

from zsim.report.plan_text import TERMINAL_COLUMNS
from zsim.report.tables import text_table

COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("checkpoint", "", ""),
    ("total", "GB", "{:,.0f}"),
    ("rank", "GB", ""),
    ("stall", "s", ""),
    ("write", "s", ""),
    ("load", "s", ""),
    ("host", "GiB/node", "{:,.0f}"),
    ("young", "min", ""),
    ("best", "min", ""),
    ("goodput", "%", "{:.1f}"),
    ("ckpt", "%", "{:.2f}"),
    ("lost", "%", "{:.2f}"),
    ("restart", "%", "{:.2f}"),
    ("slow", "%", "{:.2f}"),
    ("tokens/day", "B", "{:,.1f}"),
)
"""(heading, unit line, format; "": about three significant digits) of the methods
table."""


def _figure(v: float) -> str:
    """About three significant digits, thousands separated, never an exponent."""
    if v >= 100:
        return f"{v:,.0f}"
    return f"{v:.1f}" if v >= 10 else f"{v:.2f}" if v >= 1 else f"{v:.3g}"


def _row(m: dict[str, Any], best: str) -> list[str]:
    values = (
        ("> " if m["method"] == best else "  ") + m["method"],
        m["bytes_total_gb"], m["bytes_per_rank_max_gb"], m["save_stall_s"],
        m["save_background_s"] or None, m["load_s"],
        m["host_gib_per_node"] or None, m["young_interval_min"], m["best_interval_min"],
        100 * m["goodput"], 100 * (m["checkpoint_stall_frac"] + m["checkpoint_wait_frac"]),
        100 * m["lost_work_frac"], 100 * m["restart_frac"], 100 * m["straggler_frac"],
        m["tokens_per_day"] / 1e9)
    out = []
    for (_, _, fmt), v in zip(COLUMNS, values, strict=True):
        out.append("-" if v is None else v if isinstance(v, str)
                   else fmt.format(v) if fmt else _figure(v))
    if not m["fits_host"]:
        out[6] += " NO"
    return out


def _head(r: dict[str, Any]) -> list[str]:
    nodes = -(-r["gpus"] // r["gpus_per_node"])
    step = r["step"]
    fleet = r["fleet"]
    if step["jitter"] is None:
        slow = "no stragglers modelled (--straggler-prob and --jitter-cv add them)"
    else:
        j = step["jitter"]
        slow = (f"stragglers p50 x{step['p50_factor']:.3f}, p99 x{step['p99_factor']:.3f} "
                f"(each rank slow by {100 * j['straggler_slowdown']:.0f}% with probability "
                f"{j['straggler_prob']:g} per step, kernel cv {j['cv']:g})")
    mtbf = "never" if r["mtbf_h"] is None else f"MTBF {r['mtbf_h']:,.1f} h"
    return [
        f"{r['model']} ({r['num_params'] / 1e9:.2f}B params) on {r['gpus']:,} GPUs "
        f"({nodes:,} nodes of {r['gpus_per_node']}) x {r['hardware']}: {r['plan_label']} "
        f"({r['plan_source']})",
        f"step        {step['time_s']:.4g} s, {step['tokens']:,} tokens; {slow}",
        f"failures    {r['failures_per_day']:.3g} per day at this size ({mtbf}), fleet "
        f"{fleet['name']}",
        f"restart     {fleet['restart_s']:.0f} s"
        f"{' (assumed: --restart-s sets it)' if fleet['restart_assumed'] else ''} + the "
        "checkpoint's load",
        f"run         {r['days']:g} days simulated per interval, checkpoints to "
        f"{'the shared file system' if r['target'] == 'shared' else 'local NVMe'}",
    ]


def _notes(r: dict[str, Any]) -> list[str]:
    best = next(m for m in r["methods"] if m["method"] == r["best_method"])
    out = [f"> {best['method']}: {best['tokens_per_day'] / 1e9:,.1f}B tokens per day, "
           f"goodput {100 * best['goodput']:.1f}%, a checkpoint every "
           f"{best['best_interval_min']:.3g} min (Young's first-order optimum "
           f"{best['young_interval_min']:.3g} min)"]
    planning = [m for m in r["methods"] if m["first_save_planning_s"] > 1]
    for m in r["methods"]:
        if not m["fits_host"]:
            out.append(f"{m['method']}: {m['host_gib_per_node']:,.0f} GiB on one node's host "
                       f"exceeds its memory: save sharded and convert offline")
        if m["method"] in ("dcp", "deepspeed") and m["convert_offline_s"]:
            out.append(f"{m['method']}: one full file, when needed, by converting offline: "
                       f"{m['convert_offline_s'] / 60:,.1f} min on one host, off the job")
        if m["save_background_s"]:
            out.append(f"{m['method']}: training goes on during the "
                       f"{m['save_background_s']:.3g} s write; a thread-based async_save "
                       f"slows it meanwhile (GIL contention, not modelled: use the "
                       f"process-based one)")
    rebuilt = [m for m in r["methods"] if m["state_dict_s"] > 0]
    if rebuilt:
        out.append(f"{', '.join(m['method'] for m in rebuilt)}: each save spends "
                   f"{rebuilt[0]['state_dict_s']:.3g} s rebuilding the sharded state dict "
                   f"from flat parameters (all-gathers of the whole state); FSDP2 saves its "
                   f"shards as held")
    if planning:
        out.append(f"{', '.join(m['method'] for m in planning)}: the first save after the "
                   f"start and after each restart plans for "
                   f"{planning[0]['first_save_planning_s']:,.0f} s more (DCP's coordinator; "
                   f"later saves reuse the cached plan), charged in the run")
    out.append("rank: the most one rank writes; stall: training blocked per checkpoint; "
               "write: the async save's background write; young, best: Young's and the "
               "simulated best interval; ckpt, lost, restart, slow: wall time in checkpoint "
               "stalls, work rolled back by failures, restarts and loads, and stragglers")
    return out


def run_text(r: dict[str, Any]) -> str:
    """The text `zsim run` prints for zsim.run_api.run's result `r` (with "plan_source")."""
    rows = [_row(m, r["best_method"]) for m in r["methods"]]
    names = [c for c, _, _ in COLUMNS]
    shown = [c for c in names if c != "slow" or r["step"]["jitter"] is not None]
    table = text_table([dict(zip(names, row, strict=True)) for row in rows], shown,
                       headers={c: (c, u) for c, u, _ in COLUMNS})
    wrap = textwrap.TextWrapper(width=TERMINAL_COLUMNS, subsequent_indent="  ")
    notes = [line for n in _notes(r) for line in wrap.wrap(n)]
    return "\n".join([*_head(r), "", table, "", *notes])
