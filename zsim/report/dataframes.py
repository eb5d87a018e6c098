"""Simulated runs -> pandas DataFrames: one summary row per run, and the memory curves.

Owns the report's column names (snake_case with units: `step_time_s`, `peak_memory_gib`,
`at_peak_activations_gib`, ...). Imports pandas, so only the sweep path imports this
module; the simulator and `zsim plan` never do. Never simulates.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pandas as pd

from zsim.analytic.memory import CATEGORIES, model_state_bytes
from zsim.result import Result
from zsim.scenario import Run
from zsim.units import GB, GiB, MiB

DP_STREAMS: tuple[str, ...] = ("all_gather", "reduce_scatter", "all_reduce")
"""The data-parallel collectives' streams, a busy-time column each."""


def sweep_frame(pairs: Sequence[tuple[Run, Result]]) -> pd.DataFrame:
    """One row per run, in scenario order.

    Columns: the run's settings (run, plan_name (its key under `plans:`), plan, strategy,
    impl, gpus, dp_shard, dp_replicate, seq_len, micro_batch, grad_accum, recompute,
    unit_size, prefetch, bucket_mib, param_dtype, inter_node_gb_per_s), fits, evaluated
    (zsim.result.EVALUATED) and oom ("" when it fits), times
    in seconds (step, compute, exposed communication, busy time per collective kind; empty
    for a run not simulated to the end of its step), memory in GiB (peak allocated,
    estimated reserved, model state at rest, the closed-form model state of
    zsim.analytic.memory.model_state_bytes (gradients included), HBM, and what is live at
    the peak per category of zsim.analytic.memory.CATEGORIES), the op that made the peak, and
    throughput (job tokens/s, tokens/s per GPU, model TFLOP/s per GPU, MFU).
    """
    return rows_frame([sweep_row(run, r) for run, r in pairs])


def rows_frame(rows: Sequence[dict[str, object]]) -> pd.DataFrame:
    """The sweep table from its rows (sweep_row's, or the same read back from a sweep's
    journal), in the order given."""
    return pd.DataFrame(list(rows))


def sweep_row(run: Run, r: Result) -> dict[str, object]:
    """One run's row of sweep_frame: plain Python values (str, int, float, bool, None), so
    it crosses process boundaries and a JSON journal (zsim.journal) unchanged."""
    p = run.plan
    row: dict[str, object] = {
        "run": run.name, "plan_name": run.plan_name, "plan": p.label,
        "strategy": p.strategy, "impl": p.impl, "gpus": run.gpus,
        "dp_shard": p.dp_shard, "dp_replicate": p.dp_replicate, "seq_len": p.seq_len,
        "micro_batch": p.micro_batch, "grad_accum": p.grad_accum,
        "recompute": p.recompute, "unit_size": p.unit_size, "prefetch": p.prefetch,
        "bucket_mib": p.bucket_bytes / MiB, "param_dtype": p.param_dtype,
        "inter_node_gb_per_s": run.hardware.inter_node.bandwidth_bytes_per_s / GB,
        "fits": r.fits, "evaluated": r.evaluated, "oom": r.oom or "",
        "step_time_s": r.step_time_s, "compute_time_s": r.compute_time_s,
        "exposed_comm_s": r.exposed_comm_s, "comm_busy_s": r.comm_busy_total_s,
    }
    for kind in DP_STREAMS:
        row[f"{kind}_busy_s"] = r.comm_busy_s.get(kind, 0.0) if r.simulated else None
    row |= {
        "peak_memory_gib": r.peak_memory_bytes / GiB,
        "reserved_memory_gib": (None if r.reserved_memory_bytes is None
                                else r.reserved_memory_bytes / GiB),
        "baseline_memory_gib": r.baseline_memory_bytes / GiB,
        "closed_form_model_state_gib":
            model_state_bytes(run.model.num_params, p).total / GiB,
        "hbm_gib": r.hbm_bytes / GiB, "peak_op": r.peak_op,
    }
    for cat in CATEGORIES:
        row[f"at_peak_{cat}_gib"] = r.memory_at_peak.get(cat, 0) / GiB
    row |= {"tokens_per_s": r.tokens_per_s, "tokens_per_s_per_gpu": r.tokens_per_s_per_gpu,
            "tflops_per_gpu": r.tflops_per_gpu, "mfu": r.mfu}
    if run.run_days is not None:
        row |= _per_day(run, r)
    return row


def _per_day(run: Run, r: Result) -> dict[str, object]:
    """The scenario's run_days columns (zsim.run_api.run_columns); None where the run has
    no step to run."""
    from zsim.run_api import run_columns

    if not r.fits or r.step_time_s is None:
        return {"run_checkpoint": None, "run_checkpoint_interval_min": None,
                "run_goodput": None, "run_tokens_per_day": None}
    assert run.run_days is not None and run.failures is not None
    return run_columns(run.model, run.hardware, run.plan, r.step_time_s, days=run.run_days,
                       failures=run.failures)


def memory_curve_frame(curves: Mapping[str, Sequence[tuple[float, int]]],
                       runs: Sequence[str]) -> pd.DataFrame:
    """The allocated-memory curve of each run named in `runs` (in that order).

    Args:
        curves: run name -> its Result.memory_curve ((time_s, allocated_bytes) points).
        runs: the runs to include, each a key of `curves`.

    Returns:
        Columns run, time_s (simulated time of the change) and allocated_gib (allocated
        HBM after it), one row per allocation or free (the model state is allocated at
        time 0).
    """
    rows = []
    for name in runs:
        rows += [{"run": name, "time_s": t, "allocated_gib": b / GiB}
                 for t, b in curves[name]]
    return pd.DataFrame(rows, columns=["run", "time_s", "allocated_gib"])


def csv_text(frame: pd.DataFrame) -> str:
    """The frame as CSV: no index, "\\n" line ends, floats to 6 significant digits (so a
    regeneration diffs cleanly and is byte-identical for the same scenario)."""
    return str(frame.to_csv(index=False, float_format="%.6g", lineterminator="\n"))
