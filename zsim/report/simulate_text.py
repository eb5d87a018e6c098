"""The terminal answer of `zsim simulate`: one plan's step, read once.

Owns the rendering of zsim.api.simulate's result as text: the whole plan in its header
(data-parallel shard x replicate, tp, cp, pp, micro-batches, global tokens per step), where
the step's time goes (compute, exposed communication, the host's optimizer step of an
offload plan), throughput, device and host memory, communication per GPU split between
NVLink and the NIC, the collectives and what is live at the peak. Pure formatting of
plain data: no simulation, no pandas.
"""

from __future__ import annotations

import textwrap
from typing import Any

from zsim.report.plan_text import TERMINAL_COLUMNS, sequence_line
from zsim.report.tables import text_table
from zsim.spec.error_bands import band_pct

GIB = 2**30
VALUE_COLUMN = 16
"""Where each line's value starts, after its label ("step time       ")."""


def _nodes(gpus: int, per_node: int) -> str:
    if gpus <= per_node:
        return f"{gpus} GPU{'s' if gpus > 1 else ''}"
    nodes = gpus / per_node
    count = f"{nodes:.0f}" if nodes.is_integer() else f"{nodes:.2g}"
    return f"{gpus} GPUs ({count} nodes of {per_node})"


def _precision(p: dict[str, Any]) -> str:
    """E.g. "bf16 (fp32 master)", "fp32 with TF32 matmuls"."""
    compute = p["param_dtype"] + (" with TF32 matmuls" if p["tf32"] else "")
    if p["fp8"]:
        compute += ", fp8 linears"
    master = p["master_dtype"]
    return compute + (f" ({master} master)" if master != p["param_dtype"] else "")


def _expert_parallel(p: dict[str, Any]) -> str:
    """", ep 8 (busiest rank 1.2x the mean tokens)" for an expert-parallel plan."""
    if p["ep"] == 1:
        return ""
    load = (f"capacity factor {p['capacity_factor']:g}" if p["capacity_factor"]
            else f"busiest rank {p['expert_imbalance']:g}x the mean tokens")
    return f", ep {p['ep']} ({load})"


def _plan_lines(r: dict[str, Any]) -> list[str]:
    p = r["plan"]
    dp = p["dp_shard"] * p["dp_replicate"]
    offload = f", offload {p['offload']}" if p["offload"] != "none" else ""
    sequences = p["micro_batch"] * p["grad_accum"] * dp
    return [
        f"{r['model']} ({r['num_params'] / 1e9:.2f}B params) on "
        f"{_nodes(r['world_size'], r['gpus_per_node'])} x {r['hardware']}: "
        f"{p['strategy']} ({p['impl']}){offload}, ac={p['recompute']}, {_precision(p)}",
        f"plan            data parallel {dp} (shard {p['dp_shard']} x replicate "
        f"{p['dp_replicate']}), tp {p['tp']}, cp {p['cp']}, pp {p['pp']}"
        f"{_expert_parallel(p)}; micro-batch "
        f"{p['micro_batch']} x {p['grad_accum']} accumulated",
        f"batch           {sequences:,} sequences x {p['seq_len']:,} tokens = "
        f"{sequences * p['seq_len']:,} tokens per step",
        sequence_line(p["seq_len"], r["seq_len_source"]),
    ]


def _time_lines(r: dict[str, Any]) -> list[str]:
    if r["step_time_s"] is None:
        return [f"step time       not simulated ({r['evaluated']})"]
    step = r["step_time_s"]
    if r["step_time_s_low"] is not None:
        band = (f"{band_pct((r['step_time_s_low'], r['step_time_s_high']), step)}: real "
                f"{r['step_time_s_low']:.4g} to {r['step_time_s_high']:.4g} s")
    else:
        band = "no error band for this profile"
    out = [f"step time       {step:.4f} s ({band})"]
    if r.get("step_time_band_extrapolated"):
        out.append("  band widened  " + "; ".join(r["step_time_band_extrapolated"]))
    out.append(f"  compute       {r['compute_time_s']:.4f} s busy on the compute stream")
    by_kind = ", ".join(f"{k} {v:.4f} s" for k, v in r["exposed_comm_by_kind_s"].items()
                        if v > 0)
    out.append(f"  exposed comm  {r['exposed_comm_s']:.4f} s waiting on communication"
               + (f" ({by_kind})" if by_kind else ""))
    if r["host_busy_s"]:
        out.append(f"  host          {r['exposed_host_s']:.4f} s waiting on the host's "
                   f"optimizer step ({r['host_busy_s']:.4f} s on the CPU)")
    out.append(f"throughput      {r['tokens_per_s']:,.0f} tokens/s "
               f"({r['tokens_per_s_per_gpu']:,.0f} per GPU), MFU {r['mfu']:.1%}")
    return out


def _memory_lines(r: dict[str, Any]) -> list[str]:
    verdict = "fits" if r["fits"] else "DOES NOT FIT"
    hbm = f"of {r['hbm_bytes'] / GIB:.2f} GiB HBM -> {verdict}"
    if r["evaluated"] == "closed form":
        out = [f"peak memory     at least {r['peak_memory_bytes'] / GIB:.2f} GiB {hbm}"]
    elif r["reserved_memory_bytes"] is None:
        out = [f"peak memory     {r['peak_memory_bytes'] / GIB:.2f} GiB allocated {hbm}"]
    else:
        out = [f"peak memory     {r['peak_memory_bytes'] / GIB:.2f} GiB allocated, "
               f"{r['reserved_memory_bytes'] / GIB:.2f} GiB reserved {hbm}"]
    if r["oom"]:
        out.append(f"out of memory   {r['oom']}")
    elif (r["reserved_memory_bytes"] or 0) > r["hbm_bytes"]:
        out.append(f"fragmentation   the caching allocator holds "
                   f"{r['reserved_memory_bytes'] / GIB:.2f} GiB > {r['hbm_bytes'] / GIB:.2f} "
                   f"GiB HBM even after releasing its unused cached segments: the step may "
                   f"end out of memory (PyTorch's remedy: "
                   f"PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True)")
    if r["host_memory_bytes_per_node"]:
        out.append(f"host memory     {r['host_memory_bytes_per_node'] / GIB:.1f} GiB per node "
                   f"({r['ranks_per_node']} GPUs x {r['host_memory_bytes_per_gpu'] / GIB:.2f} "
                   f"GiB of offloaded state)")
    return out


def _comm_lines(r: dict[str, Any]) -> list[str]:
    if not r["collective_calls"]:
        return []
    links = r["comm_bytes_by_link"]
    kinds = ", ".join(f"{k} {v / GIB:.2f}" for k, v in r["comm_bus_bytes"].items()
                      if k not in ("h2d", "d2h"))
    calls = ", ".join(f"{k} {n:,}" for k, n in r["collective_calls"].items())
    algos = ", ".join(f"{k} {n:,}" for k, n in r["collective_algorithms"].items())
    return [f"communication   per GPU per step {links['intra_node'] / GIB:.2f} GiB over "
            f"NVLink, {links['inter_node'] / GIB:.2f} GiB over the NIC (GiB by kind: "
            f"{kinds})",
            f"collectives     {sum(r['collective_calls'].values()):,} calls/step ({calls}); "
            f"latency {r['comm_latency_share']:.0%} of their time alone",
            f"algorithms      {algos}"]


def _wrapped(line: str) -> list[str]:
    """A line of the summary within TERMINAL_COLUMNS, continued under its value."""
    return textwrap.wrap(line, TERMINAL_COLUMNS, subsequent_indent=" " * VALUE_COLUMN,
                         break_on_hyphens=False) or [""]


def simulate_text(r: dict[str, Any]) -> str:
    """The answer of zsim.api.simulate as text, every line within TERMINAL_COLUMNS (but
    the pipeline ranks' table)."""
    lines = [*_plan_lines(r), *_time_lines(r), *_memory_lines(r), *_comm_lines(r)]
    out = [w for line in lines for w in _wrapped(line)]
    rows = [{"category": k, "gib_at_peak": v / GIB} for k, v in r["memory_at_peak"].items()]
    out.append(text_table(rows, ("category", "gib_at_peak"),
                          headers={"category": ("memory at peak", ""),
                                   "gib_at_peak": ("", "GiB")}))
    if r.get("pipeline_stages"):
        stages = [{**st, "stages": ",".join(map(str, st["stages"])),
                   "peak_gib": st["peak_memory_bytes"] / GIB}
                  for st in r["pipeline_stages"]]
        out.append("\n" + text_table(stages, ("rank", "stages", "step_time_s", "busy_s",
                                              "bubble_fraction", "in_flight_microbatches",
                                              "peak_gib")))
    return "\n".join(out)
