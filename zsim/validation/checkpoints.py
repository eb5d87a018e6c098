"""Checkpoint predictions against real saves and loads on this machine.

Owns `validate_checkpoints`: for each plan, measure this host's storage the way a
checkpoint uses it (zsim.calibration.storage_bench: the folder's file system with as many
writer threads as ranks, one thread's torch.save / torch.load / fresh-copy streams),
put those figures in the local profile's storage section, predict the plan's checkpoint
(zsim.analytic.checkpoint), then save and load it for real on gloo ranks
(zsim.backend.checkpoint_run) and compare: bytes written (total and by the busiest
rank), the time training is blocked, an async save's background write, and the load.
The storage is measured right before each plan's saves (a shared disk's rate drifts
within minutes), after the plan before's files have been removed and its dirty pages
written back, and never fitted to them. Checkpoints go to a temporary folder inside
`directory`: this host's disk by default, a tmpfs (/dev/shm) to check the model without
the disk's drift.
"""

from __future__ import annotations

import csv
import io
import os
import shutil
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from zsim.analytic.checkpoint import checkpoint_cost
from zsim.atomic import write_files
from zsim.spec.hardware import HardwareProfile
from zsim.spec.model import ModelSpec
from zsim.spec.plan import Plan
from zsim.spec.storage import FRESH_ITEM_MIB_DEFAULT, Storage

VALIDATION_MODEL = ModelSpec(name="llama-117m", num_layers=4, d_model=1024, num_heads=8,
                             num_kv_heads=8, ffn_hidden=2816, vocab_size=32000,
                             max_seq_len=64, norm_kernel="composite")
"""117M parameters: 1.4 GB of fp32 state and AdamW moments, so that a save's bytes, not
its fixed costs, set its time on this machine's disk (a save of the backend's tiny
model takes tens of milliseconds, all of them fixed)."""

PLAN_METHODS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("fsdp", "fsdp2", ("dcp", "dcp-async", "full")),
    ("fsdp", "fsdp1", ("dcp", "full")),
    ("zero2", "deepspeed", ("deepspeed",)),
    ("zero3", "deepspeed", ("deepspeed",)),
)
"""(strategy, program, methods) measured."""

PLAN_ITEM_US = 37.0
"""DCP's coordinator cost per plan item (docs/log.md, 2026-12-05): not measured again."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Row:
    """One compared figure."""

    program: str
    strategy: str
    method: str
    metric: str
    predicted: float
    measured: float

    @property
    def error_pct(self) -> float:
        return 100.0 * (self.predicted - self.measured) / self.measured


def measured_storage(directory: Path, *, ranks: int, name: str) -> dict[str, object]:
    """This host's storage section (zsim.calibration.storage_bench.storage_section): the
    disk with `ranks` writer threads, and the streams measured in `ranks` processes at
    once, started as the backend's ranks are, the slowest rank's figures. fresh_item_mib
    is glibc's default: the loads it predicts run in restart processes under glibc's
    defaults (zsim.backend.checkpoint_run)."""
    from zsim.backend.runner import run_ranks
    from zsim.calibration.storage_bench import measure_storage, slowest_streams, storage_section

    disk = measure_storage(directory / "disk", threads=ranks, files=4 * ranks)
    streams = slowest_streams(run_ranks(_streams_rank, str(directory / "streams"),
                                        nproc=ranks))
    return storage_section(disk, streams, plan_item_us=PLAN_ITEM_US,
                           fresh_item_mib=FRESH_ITEM_MIB_DEFAULT, name=name,
                           source="zsim validate checkpoint on this host")


def _streams_rank(ctx: Any, directory: str) -> Any:
    """Rank function of measured_storage: this rank's stream figures, in its own folder."""
    from zsim.calibration.storage_bench import measure_streams

    return measure_streams(Path(directory) / f"rank{ctx.rank}")


def validate_checkpoints(hw: HardwareProfile, out: Path, *, nproc: int = 2,
                         spec: ModelSpec = VALIDATION_MODEL,
                         plans: tuple[tuple[str, str, tuple[str, ...]], ...] = PLAN_METHODS,
                         directory: Path | None = None,
                         timeout_s: float = 600.0) -> dict[str, Any]:
    """Per plan: measure storage, predict, save and load for real, compare (module
    docstring); write checkpoints.csv and storage.yaml into `out`. `directory`: where the
    checkpoints go (a temporary folder inside it, removed after); None: the system's
    temporary folder.

    Returns:
        {"storage": [{"program", "strategy", "storage": the section measured before the
        plan}], "rows": [Row as a dict with error_pct], "written": [paths]}.
    """
    import yaml

    from zsim.backend.checkpoint_run import measure_checkpoints

    storage: list[dict[str, object]] = []
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="zsim-checkpoint-", dir=directory) as tmp:
        for i, (strategy, program, methods) in enumerate(plans):
            os.sync()  # the plan before's unsynced (DeepSpeed) writes, written back
            section = measured_storage(
                Path(tmp) / f"storage{i}", ranks=nproc,
                name=f"{directory}'s file system" if directory else "this host's disk")
            storage.append({"program": program, "strategy": strategy, "storage": section})
            local = replace(hw, storage=Storage.from_dict(section))
            plan = Plan.for_strategy(strategy, gpus=nproc, seq_len=32, micro_batch=1,
                                     impl=program)
            measured = measure_checkpoints(spec, plan, nproc=nproc,
                                           directory=Path(tmp) / f"plan{i}", methods=methods,
                                           timeout_s=timeout_s)
            for m in measured:
                rows += _compare(spec, local, plan, m)
            # Counted and timed: gone, so that the next plan's saves do not find memory
            # (a tmpfs) or the page cache full of this one's files.
            shutil.rmtree(Path(tmp) / f"plan{i}")
    table = [{**{k: getattr(r, k) for k in ("program", "strategy", "method", "metric",
                                             "predicted", "measured")},
              "error_pct": round(r.error_pct, 2)} for r in rows]
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(table[0]), lineterminator="\n")
    writer.writeheader()
    writer.writerows(table)
    written = write_files(out, {
        "checkpoints.csv": buf.getvalue().encode(),
        "storage.yaml": yaml.safe_dump({"storage_by_plan": storage},
                                       sort_keys=False).encode()})
    return {"storage": storage, "rows": table, "written": [str(p) for p in written]}


def _compare(spec: ModelSpec, hw: HardwareProfile, plan: Plan, m: Any) -> list[Row]:
    cost = checkpoint_cost(spec, hw, plan, method=m.method)
    figures = [("bytes_total", cost.bytes_total, m.bytes_total),
               ("bytes_rank_max", cost.bytes_per_rank_max, max(m.bytes_per_rank)),
               ("stall_s", cost.save_stall_s, m.stall_s),
               ("load_s", cost.load_s, m.load_s)]
    if m.method == "dcp-async":
        figures.append(("background_s", cost.save_background_s, m.background_s))
    return [Row(program=plan.impl, strategy=plan.strategy, method=m.method, metric=k,
                predicted=float(p), measured=float(v)) for k, p, v in figures]
