"""The figure of `zsim run --plot`: goodput against the checkpoint interval, per checkpoint
method, and against the job's GPU count.

Owns one two-panel figure drawn from zsim.run_api.run's result: left, each method's mean
simulated goodput at the intervals searched (log minutes), Young's first-order optimum
marked on each curve; right, the goodput at each method's best interval as the same plan
scales out (more failures per hour, the same checkpoint per GPU). Titled with the plan's
context so that it can be pasted alone; matplotlib's object API only.
"""

from __future__ import annotations

from typing import Any

from matplotlib.figure import Figure

from zsim.report.titles import set_title


def run_figure(r: dict[str, Any]) -> Figure:
    """The figure for result `r` (zsim.run_api.run with its GPU curve)."""
    fig = Figure(figsize=(11, 4.6))
    left, right = fig.subplots(1, 2)
    for m in r["methods"]:
        xs = [c["interval_min"] for c in m["curve"]]
        ys = [100 * c["goodput"] for c in m["curve"]]
        label = m["method"] + ("" if m["fits_host"] else " (does not fit host memory)")
        (line,) = left.plot(xs, ys, marker="o", label=label)
        left.axvline(m["young_interval_min"], color=line.get_color(), linestyle=":",
                     linewidth=1)
    left.set_xscale("log")
    left.set_xlabel("checkpoint interval, minutes (dotted: Young's optimum)")
    left.set_ylabel("goodput, % of wall time training (mean of the seeds)")
    left.legend(loc="lower left", fontsize=8)
    left.grid(alpha=0.3)
    methods = [m["method"] for m in r["methods"]]
    for method in methods:
        points = [p for p in r["by_gpus"] if p["method"] == method and p["fits"]]
        if points:
            right.plot([p["gpus"] for p in points], [100 * p["goodput"] for p in points],
                       marker="o", label=method)
    right.set_xscale("log", base=2)
    right.set_xlabel("GPUs (the same plan, data parallelism scaled)")
    right.set_ylabel("goodput at the best interval, %")
    right.axvline(r["gpus"], color="grey", linestyle="--", linewidth=1)
    right.legend(loc="lower left", fontsize=8)
    right.grid(alpha=0.3)
    context = (f"{r['model']} ({r['num_params'] / 1e9:.1f}B parameters), {r['plan_label']} on "
               f"{r['gpus']:,} GPUs of {r['hardware']}; failures: {r['fleet']['name']} fleet, "
               f"restart {r['fleet']['restart_s']:g} s"
               f"{' (assumed)' if r['fleet']['restart_assumed'] else ''}, "
               f"{r['days']:g} days per run")
    set_title(fig, "Goodput against checkpoint interval and job size", context)
    fig.tight_layout()
    return fig
