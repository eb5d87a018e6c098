"""The GPU validation report command in its quick mode on CPU:
every section runs end to end and writes its files with the documented columns; the
wall-clock guard skips what the budget leaves no time for; --only keeps the named runs."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

pytest.importorskip("torch")
yaml = pytest.importorskip("yaml")

from zsim.calibration import gpu_host_sweep, gpu_kernel_bench  # noqa: E402
from zsim.calibration.nano import QUICK_SWEEP_CONFIGS  # noqa: E402
from zsim.validation import gpu_report, gpu_runs  # noqa: E402


def _read(path: Path) -> tuple[list[str], list[dict[str, str]]]:
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        return list(reader.fieldnames or []), list(reader)


@pytest.mark.slow
def test_quick_report_end_to_end(tmp_path: Path) -> None:
    gpu_report.run_report(tmp_path, quick=True, budget_s=900.0, hardware="local-cpu",
                          command="zsim validate gpu-report --quick")
    header, rows = _read(tmp_path / "validation.csv")
    # The comparison's columns (zsim.validation.comparison.FIELDS), then run and note.
    assert header == ["model", "plan", "nproc", "backend", "metric", "predicted",
                      "measured", "error_pct", "run", "note"]
    runs = [r for g in gpu_runs.groups(True, "cpu") for r in g.runs]
    runs += [r for g in gpu_runs.deepspeed_groups(True, "cpu") for r in g.runs]
    assert {r["run"] for r in rows} == {r.name for r in runs}
    for run in runs:
        got = {r["metric"]: r for r in rows if r["run"] == run.name}
        if "" in got:  # deepspeed missing: one row saying so
            assert got[""]["note"].startswith("skipped"), got[""]
            continue
        assert set(got) == set(gpu_report.MEASURED), run.name
        assert all(got[m]["measured"] for m in gpu_report.MEASURED), run.name
        # Saved activations match the simulator's to the byte on the blocks (4 bytes of
        # bookkeeping in the root), as in the CPU report.
        assert float(got["activation_bytes_blocks"]["error_pct"]) == 0.0, run.name
        assert abs(float(got["activation_bytes_root"]["error_pct"])) < 0.1, run.name
    assert {r["backend"] for r in rows} >= {"gloo", "fake"}
    assert {int(r["nproc"]) for r in rows} >= {1, 8, 64, 512}

    header, host = _read(tmp_path / "host.csv")
    assert header == list(gpu_host_sweep.HOST_FIELDS)
    assert {(r["config"], r["layers"]) for r in host if not r["note"]} == {
        (c, str(n)) for c in QUICK_SWEEP_CONFIGS for n in (4, 8)}
    header, fit = _read(tmp_path / "host_fit.csv")
    assert header == list(gpu_host_sweep.HOST_FIT_FIELDS)
    assert {r["config"] for r in fit} == set(QUICK_SWEEP_CONFIGS)
    assert all(float(r["aten_ops_per_block"]) > 0 for r in fit)

    header, kernels = _read(tmp_path / "kernels.csv")
    assert header == list(gpu_kernel_bench.KERNEL_FIELDS)
    assert not [r for r in kernels if r["note"].startswith(("error", "skipped"))]
    assert {r["kind"] for r in kernels} == {
        "matmul", "residual_add", "rmsnorm", "swiglu", "rope", "cast_fp32_bf16",
        "cross_entropy", "sdpa_causal", "adamw_foreach", "adamw_fused", "adamw_flat",
        "cpu_adamw"}
    assert {r["dtype"] for r in kernels if r["kind"] == "matmul"} == {"bf16", "tf32", "fp32"}

    provenance = yaml.safe_load((tmp_path / "provenance.yaml").read_text())
    assert provenance["quick"] is True and provenance["environment"]["torch"]
    assert "--quick" in provenance["command"]
    assert len(yaml.safe_load((tmp_path / "runs.yaml").read_text())["runs"]) == len(runs)
    assert "| run | backend |" in (tmp_path / "report.md").read_text()


def test_spent_budget_skips_everything_and_still_writes(tmp_path: Path) -> None:
    gpu_report.run_report(tmp_path, quick=True, budget_s=0.0, hardware="local-cpu")
    _, rows = _read(tmp_path / "validation.csv")
    assert rows and all(r["note"].startswith("skipped") for r in rows)
    _, kernels = _read(tmp_path / "kernels.csv")
    assert kernels and all(r["note"].startswith("skipped") for r in kernels)
    provenance = yaml.safe_load((tmp_path / "provenance.yaml").read_text())
    assert len(provenance["skipped"]) >= len(rows) + len(kernels)


def test_runs_filter_keeps_the_named_runs_in_their_groups() -> None:
    every = gpu_runs.groups(False, "cuda") + gpu_runs.deepspeed_groups(False, "cuda")
    kept = gpu_report.only_runs(every, frozenset({"1p3b_n8_sac", "1p3b_n8_offload"}))
    assert [(g.key, [r.name for r in g.runs]) for g in kept] == [
        ("n8", ["1p3b_n8_sac", "1p3b_n8_offload"])]
    with pytest.raises(gpu_report.ConfigError, match="nosuch"):
        gpu_report.only_runs(every, frozenset({"nosuch"}))
