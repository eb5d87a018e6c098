"""The per-phase profile command (zsim.validation.gpu_phases): its quick mode end to end on
CPU (tiny model, rank 0 of 8 on the fake process group), the budget guard, the run list
against tests/data/cases/h200-fsdp2-runs.yaml (reading the profile: test_kernel_trace.py)."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

pytest.importorskip("torch")
yaml = pytest.importorskip("yaml")

from zsim.validation import gpu_phases, kernel_trace  # noqa: E402


def _read(path: Path) -> tuple[list[str], list[dict[str, str]]]:
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        return list(reader.fieldnames or []), list(reader)


@pytest.mark.slow
def test_quick_mode_end_to_end(tmp_path: Path) -> None:
    gpu_phases.run_phases(tmp_path, quick=True, budget_s=120.0,
                          command="zsim calibrate gpu-phases --quick")
    names = [r.name for r in gpu_phases.runs(True, "cpu")]
    steps = gpu_phases.QUICK_STEPS.profiled

    header, phases = _read(tmp_path / "phases.csv")
    assert header == list(gpu_phases.PHASE_FIELDS)
    assert {(r["run"], r["step"], r["phase"]) for r in phases} == {
        (n, str(k), p) for n in names for k in range(steps)
        for p in (*kernel_trace.PHASES, "step")}
    for r in phases:
        where = (r["run"], r["step"], r["phase"])
        assert r["note"] == "" and r["device"] == "cpu", where
        assert float(r["wall_s"]) > 0 and float(r["profiled_wall_s"]) > 0, where
        assert float(r["host_issue_s"]) <= float(r["wall_s"]), where
        busy, wall = float(r["device_busy_s"]), float(r["profiled_wall_s"])
        assert 0 < busy <= wall, where
        assert float(r["device_idle_s"]) == pytest.approx(wall - busy, abs=1e-5), where
        assert int(r["kernels"]) > 0 and int(r["aten_ops"]) >= int(r["kernels"]), where
        assert float(r["compute_busy_s"]) <= busy + 1e-9, where
    # The phases partition the step.
    for name in names:
        for k in range(steps):
            got = {r["phase"]: r for r in phases if r["run"] == name and r["step"] == str(k)}
            assert sum(int(got[p]["kernels"]) for p in kernel_trace.PHASES) == int(
                got["step"]["kernels"])
            assert sum(float(got[p]["profiled_wall_s"]) for p in kernel_trace.PHASES) <= float(
                got["step"]["profiled_wall_s"])

    header, classes = _read(tmp_path / "kernel_classes.csv")
    assert header == list(gpu_phases.CLASS_FIELDS)
    for r in phases:
        mine = [c for c in classes
                if (c["run"], c["step"], c["phase"]) == (r["run"], r["step"], r["phase"])]
        assert [c["kernel_class"] for c in mine] == list(kernel_trace.KERNEL_CLASSES)
        assert sum(int(c["kernels"]) for c in mine) == int(r["kernels"])
    by_class = {(c["run"], c["phase"], c["kernel_class"]): int(c["kernels"])
                for c in classes if c["step"] == "0"}
    for name in names:
        assert by_class[(name, "forward", "gemm")] > 0  # aten::linear
        assert by_class[(name, "backward", "gemm")] > 0  # aten::mm
        assert by_class[(name, "forward", "attention")] > 0
        assert by_class[(name, "optimizer", "optimizer")] > 0  # AdamW's foreach ops
        assert by_class[(name, "forward", "copies")] > 0  # FSDP2's all-gather copy-in/out

    header, kernels = _read(tmp_path / "kernel_names.csv")
    assert header == list(gpu_phases.KERNEL_FIELDS)
    # Every kernel of a phase, by stream and launching op: they add up to its classes.
    for r in phases:
        if r["phase"] == "step":
            continue
        where = (r["run"], r["step"], r["phase"])
        mine = [x for x in kernels if (x["run"], x["step"], x["phase"]) == where]
        assert sum(int(x["calls"]) for x in mine) == int(r["kernels"]), where
        for cls in kernel_trace.KERNEL_CLASSES:
            (c,) = [c for c in classes if (c["run"], c["step"], c["phase"]) == where
                    and c["kernel_class"] == cls]
            assert sum(float(x["device_s"]) for x in mine if x["kernel_class"] == cls) == \
                pytest.approx(float(c["device_s"]), rel=1e-4, abs=1e-6), (where, cls)
    assert any(x["aten_op"] == "aten::mm" for x in kernels)

    header, gemms = _read(tmp_path / "gemm_shapes.csv")
    assert header == list(gpu_phases.GEMM_FIELDS)
    assert all(float(g["device_s"]) > 0 and float(g["flops"]) > 0 for g in gemms)
    for k in range(steps):
        flops = {p: sum(float(g["flops"]) for g in gemms if g["run"] == "tiny_n8"
                        and g["step"] == str(k) and g["phase"] == p) for p in kernel_trace.PHASES}
        # Every forward matmul has a data-gradient and a weight-gradient matmul of its size.
        assert flops["forward"] > 0 and flops["optimizer"] == 0
        assert flops["backward"] == pytest.approx(2 * flops["forward"], rel=1e-4)

    provenance = yaml.safe_load((tmp_path / "provenance.yaml").read_text())
    assert provenance["state"] == "done" and provenance["quick"] is True
    assert "--quick" in provenance["command"] and provenance["environment"]["torch"]
    assert [(r["run"], r["status"]) for r in provenance["results"]] == [
        (n, "ok") for n in names]


def test_spent_budget_skips_every_run_and_still_writes(tmp_path: Path) -> None:
    gpu_phases.run_phases(tmp_path, quick=True, budget_s=0.0)
    provenance = yaml.safe_load((tmp_path / "provenance.yaml").read_text())
    assert provenance["state"] == "done" and provenance["failures"]
    assert {r["status"] for r in provenance["results"]} == {"skipped"}
    assert not (tmp_path / "phases.csv").exists()


def test_run_list_matches_the_published_runs(cases_dir: Path) -> None:
    published = {r["name"]: r for r in yaml.safe_load(
        (cases_dir / "h200-fsdp2-runs.yaml").read_text())["runs"]}
    planned = gpu_phases.runs(False, "cuda")
    assert [r.name for r in planned] == [
        "1p3b_n8", "1p3b_n64", "7b_n8", "13b_n128_mb1", "1p3b_n8_ac", "1p3b_n8_raf0",
        "1p3b_n8_fp32", "1p3b_n8_offload"]
    for run in planned:
        case, spec, plan = published[run.published], run.spec, run.plan
        assert run.published == run.name
        assert (spec.num_layers, spec.d_model, spec.num_heads, spec.num_kv_heads,
                spec.ffn_hidden, spec.vocab_size) == tuple(case["model"][k] for k in (
                    "layers", "d_model", "heads", "kv_heads", "ffn_hidden", "vocab"))
        assert (plan.world_size, plan.seq_len, plan.micro_batch, plan.param_dtype,
                plan.reshard_after_forward) == (
            case["plan"]["world_size"], case["plan"]["seq"], case["plan"]["micro_batch"],
            case["plan"]["precision"], case["plan"]["reshard_after_forward"]), run.name
        # The fp32 run has TF32 matmuls (the file's setup.fp32_case).
        assert run.tf32 == (case["plan"]["precision"] == "fp32")
        assert plan.recompute == {"none": "none", "full": "full"}[
            case["plan"]["activation_checkpointing"]]
        assert (plan.offload != "none") == case["plan"]["cpu_offload"]
        assert plan.strategy in ("fsdp", "fsdp-no-reshard")
    groups = gpu_phases.by_world_size(planned)
    assert all(g.backend == "fake" for g in groups)
    assert [(g.world_size, [r.name for r in g.runs]) for g in groups] == [
        (8, ["1p3b_n8", "7b_n8", "1p3b_n8_ac", "1p3b_n8_raf0", "1p3b_n8_fp32",
             "1p3b_n8_offload"]),
        (64, ["1p3b_n64"]),
        (128, ["13b_n128_mb1"])]
