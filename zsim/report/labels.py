"""The words a reader of a figure sees in place of zsim's identifiers.

Owns the axis label (name and unit) of each sweep-frame column a figure can plot, and the
words for memory categories (zsim.analytic.memory.CATEGORIES), strategies, op kinds and
streams (zsim.schedule.ops) and the reasons the compute stream waits
(zsim.engine.trace.Wait.reason), so that no figure shows `step_time_s` or
`gathered_grads`. Pure data and string functions: no matplotlib, no pandas.
"""

from __future__ import annotations

from typing import NamedTuple


class Quantity(NamedTuple):
    """How a figure writes one column of zsim.report.dataframes.sweep_frame."""

    name: str
    """The quantity in words, capitalised, e.g. "Step time"."""
    unit: str = ""
    """Its unit as the figure shows it ("s", "GiB", "%"); "" for a count or a category."""
    scale: float = 1.0
    """Factor from the column's unit to the figure's (100 for a fraction shown in %)."""

    @property
    def label(self) -> str:
        """An axis label: the name, and the unit in brackets, e.g. "Step time (s)"."""
        return f"{self.name} ({self.unit})" if self.unit else self.name


COLUMNS: dict[str, Quantity] = {
    "run": Quantity("Run"),
    "plan_name": Quantity("Plan"),
    "plan": Quantity("Plan"),
    "strategy": Quantity("Strategy"),
    "impl": Quantity("Program"),
    "gpus": Quantity("GPUs"),
    "dp_shard": Quantity("Data-parallel shard degree"),
    "dp_replicate": Quantity("Data-parallel replicate degree"),
    "seq_len": Quantity("Sequence length", "tokens"),
    "micro_batch": Quantity("Micro-batch", "sequences per GPU"),
    "grad_accum": Quantity("Gradient accumulation steps"),
    "recompute": Quantity("Activation recomputation"),
    "unit_size": Quantity("FSDP unit size", "blocks per unit"),
    "prefetch": Quantity("Prefetch depth", "units ahead"),
    "bucket_mib": Quantity("Gradient bucket size", "MiB"),
    "param_dtype": Quantity("Parameter dtype"),
    "inter_node_gb_per_s": Quantity("Inter-node bandwidth per GPU", "GB/s"),
    "step_time_s": Quantity("Step time", "s"),
    "compute_time_s": Quantity("Compute time per step", "s"),
    "exposed_comm_s": Quantity("Exposed communication per step", "s"),
    "comm_busy_s": Quantity("Communication busy time per step", "s"),
    "all_gather_busy_s": Quantity("All-gather busy time per step", "s"),
    "reduce_scatter_busy_s": Quantity("Reduce-scatter busy time per step", "s"),
    "all_reduce_busy_s": Quantity("All-reduce busy time per step", "s"),
    "peak_memory_gib": Quantity("Peak memory per GPU", "GiB"),
    "reserved_memory_gib": Quantity("Peak reserved memory per GPU", "GiB"),
    "baseline_memory_gib": Quantity("Model state at rest per GPU", "GiB"),
    "closed_form_model_state_gib": Quantity("Model state per GPU, closed form", "GiB"),
    "hbm_gib": Quantity("HBM per GPU", "GiB"),
    "tokens_per_s": Quantity("Tokens/s, whole job"),
    "tokens_per_s_per_gpu": Quantity("Tokens/s per GPU"),
    "tflops_per_gpu": Quantity("Model TFLOP/s per GPU"),
    "mfu": Quantity("MFU", "%", 100.0),
}
"""Columns with a label of their own; any other column gets column_quantity's fallback."""

_UNIT_SUFFIXES: tuple[tuple[str, str], ...] = (
    ("_gb_per_s", "GB/s"), ("_bytes_per_s", "B/s"), ("_gib", "GiB"), ("_mib", "MiB"),
    ("_bytes", "bytes"), ("_s", "s"))
"""Column name endings that are a unit (zsim's naming rule), longest first."""

CATEGORIES: dict[str, str] = {
    "params": "Parameters",
    "grads": "Gradients",
    "master_params": "Master weights",
    "optimizer_states": "Optimizer states",
    "gathered_params": "Gathered (unsharded) parameters",
    "gathered_grads": "Unsharded gradients in flight",
    "activations": "Activations",
    "comm_buffers": "Communication buffers",
    "workspace": "cuBLAS workspace",
}
"""Memory category (zsim.analytic.memory.CATEGORIES) -> words."""

STRATEGIES: dict[str, str] = {
    "ddp": "DDP", "zero1": "ZeRO-1", "zero2": "ZeRO-2", "zero3": "ZeRO-3",
    "fsdp": "FSDP (full shard)", "fsdp-no-reshard": "FSDP (no reshard)", "hsdp": "HSDP",
}
"""Strategy (zsim.spec.plan.STRATEGIES) -> words."""

KINDS: dict[str, str] = {
    "forward": "Forward", "backward": "Backward", "optimizer": "Optimizer step",
    "sync": "Synchronisation", "all_gather": "All-gather", "reduce_scatter": "Reduce-scatter",
    "all_reduce": "All-reduce", "all_to_all": "All-to-all", "h2d": "Host-to-device copy",
    "d2h": "Device-to-host copy",
}
"""Op kind (zsim.schedule.ops.OpKind) -> words."""

STREAMS: dict[str, str] = {
    "compute": "Compute", "all_gather": "All-gather", "reduce_scatter": "Reduce-scatter",
    "all_reduce": "All-reduce", "tp": "Tensor parallel", "cp": "Context parallel",
    "ep": "Expert parallel",
    "h2d": "Host to device", "d2h": "Device to host", "host": "Host CPU",
}
"""Stream (zsim.schedule.ops.STREAMS) -> words."""

REASONS: dict[str, str] = {
    "prefetch_too_shallow": "prefetch too shallow", "queued": "queued behind another call",
    "critical_path": "on the critical path", "straggler": "another rank late",
    "blocking_call": "a blocking call", "host_optimizer": "the host optimizer step",
}
"""Why the compute stream waited (zsim.engine.trace.Wait.reason) -> words."""


def column_quantity(column: str) -> Quantity:
    """How a figure writes `column`: its entry in COLUMNS, or else its name in words with
    the unit its suffix names (`at_peak_activations_gib` -> "At peak activations (GiB)")."""
    if column in COLUMNS:
        return COLUMNS[column]
    unit = ""
    for suffix, name in _UNIT_SUFFIXES:
        if column.endswith(suffix) and len(column) > len(suffix):
            column, unit = column.removesuffix(suffix), name
            break
    words = column.replace("_", " ").strip()
    return Quantity(words[:1].upper() + words[1:], unit)


def words(key: str, table: dict[str, str]) -> str:
    """`key` in words from `table` (CATEGORIES, STRATEGIES, KINDS, STREAMS, REASONS), or
    its identifier with spaces for underscores where the table has none."""
    return table.get(key, key.replace("_", " "))
