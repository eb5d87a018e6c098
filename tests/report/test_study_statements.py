"""Each qualitative statement the shipped studies' prose makes (scenarios/*.template.md),
checked against their committed CSVs (which test_shipped_reports.py keeps equal to a fresh
regeneration): when the simulator changes so that a sentence no longer holds, this fails
and the prose must change with the numbers."""

from __future__ import annotations

import csv
from pathlib import Path

REPORTS = Path(__file__).resolve().parents[2] / "reports"


def rows(name: str) -> dict[str, dict[str, str]]:
    with (REPORTS / f"{name}.csv").open() as f:
        return {r["run"]: r for r in csv.DictReader(f)}


def num(row: dict[str, str], column: str) -> float:
    return float(row[column])


def test_scaling_study_statements() -> None:
    r = rows("scaling-7b-8-4096")
    gpus = [2**k for k in range(3, 13)]
    assert all(r[f"ddp gpus={g}"]["fits"] == "False" for g in gpus)  # DDP never fits
    for g in gpus:
        # ZeRO-1 and ZeRO-2: the same step time; ZeRO-2's peak lower.
        z1, z2 = r[f"zero1 gpus={g}"], r[f"zero2 gpus={g}"]
        assert num(z1, "step_time_s") == num(z2, "step_time_s")
        assert num(z2, "peak_memory_gib") < num(z1, "peak_memory_gib")
    mfu = [num(r[f"zero1 gpus={g}"], "mfu") for g in gpus]
    assert mfu[2] < min(mfu[:2])  # across nodes from 32 GPUs
    assert max(mfu[2:]) - min(mfu[2:]) < 0.01  # "nearly flat" from there
    assert max(mfu) - min(mfu) < 0.1 * max(mfu)
    for g in gpus[:5]:  # ZeRO-3 the fastest from 8 to 128 GPUs
        best = max(("zero1", "zero2", "zero3", "fsdp", "hsdp"),
                   key=lambda p: num(r[f"{p} gpus={g}"], "mfu"))
        assert best == "zero3", g
    zero3 = [num(r[f"zero3 gpus={g}"], "mfu") for g in gpus[4:]]
    assert zero3 == sorted(zero3, reverse=True)  # then falls
    assert num(r["zero3 gpus=4096"], "exposed_comm_s") > 0.5 * num(r["zero3 gpus=4096"],
                                                                   "step_time_s")
    assert num(r["hsdp gpus=4096"], "mfu") > num(r["fsdp gpus=4096"], "mfu")
    assert num(r["hsdp gpus=4096"], "peak_memory_gib") > num(r["fsdp gpus=4096"],
                                                             "peak_memory_gib")


def test_hsdp_against_fsdp_statements() -> None:
    r = rows("hsdp-vs-fsdp-bandwidth")

    def speed(plan: str, bw: float) -> float:
        return num(r[f"{plan} inter_node_gb_per_s={bw}"], "tokens_per_s_per_gpu")

    assert speed("fsdp", 50.0) > speed("hsdp", 50.0)
    for bw in (12.5, 6.25, 3.125, 1.5625):
        assert speed("hsdp", bw) > speed("fsdp", bw)
    for plan in ("fsdp", "hsdp"):  # slower as the link shrinks
        series = [speed(plan, bw) for bw in (50.0, 25.0, 12.5, 6.25, 3.125, 1.5625)]
        assert series == sorted(series, reverse=True)
    # At 50 GB/s both hide their collectives: the gap is HSDP's longer compute stream.
    fsdp, hsdp = r["fsdp inter_node_gb_per_s=50.0"], r["hsdp inter_node_gb_per_s=50.0"]
    gap = num(hsdp, "step_time_s") - num(fsdp, "step_time_s")
    assert num(hsdp, "compute_time_s") - num(fsdp, "compute_time_s") > 0.8 * gap
    assert num(hsdp, "peak_memory_gib") > num(fsdp, "peak_memory_gib")


def test_sequence_against_recomputation_statements() -> None:
    r = rows("seq-vs-recompute")

    def fits(policy: str, seq: int) -> bool:
        return r[f"fsdp recompute={policy} seq_len={seq}"]["fits"] == "True"

    assert [fits("none", s) for s in (2048, 4096, 8192, 16384, 32768)] == [
        True, True, True, False, False]
    assert [fits("selective", s) for s in (16384, 32768)] == [True, False]
    assert fits("full", 32768)
    speed = {p: num(r[f"fsdp recompute={p} seq_len=8192"], "tokens_per_s_per_gpu")
             for p in ("none", "selective", "full")}
    assert speed["none"] > speed["selective"] > speed["full"]


def test_card_memory_statements() -> None:
    r = rows("card-7b-64-memory")
    # The state at rest less the two 32 MiB cuBLAS workspaces of an H100 rank.
    workspaces = 2 * 32 * 2**20
    gb = {run: (num(row, "baseline_memory_gib") * 2**30 - workspaces) / 1e9
          for run, row in r.items()}
    # At rest: DeepSpeed ZeRO-1/2 hold 2 + 12/64 bytes per parameter, FSDP2 12/64.
    for run in ("zero1", "zero2"):
        assert abs(gb[run] - (2 + 12 / 64) * 7) < 0.05
    assert abs(gb["fsdp"] - 12 / 64 * 7) < 0.02
    assert gb["zero3"] > num(r["zero3"], "closed_form_model_state_gib") * 2**30 / 1e9
