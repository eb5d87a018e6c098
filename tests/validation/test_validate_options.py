"""`zsim validate grid --calibrate-here --calibration-rounds N --min-timed-s SECONDS`: the
options reach regenerate_report through zsim.validate_api.grid, and from there the
calibration (every world size of the batch calibrated on this host, none taken from
--profile, with N rounds of benchmarks), the timed runs and the provenance. No processes
are started: calibration and measurement are stand-ins."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import yaml

pytest.importorskip("torch")

from zsim import validate_api
from zsim.backend.measured_step import PhaseMemory, PlanMeasurement, RankMeasurement
from zsim.spec.model import ModelSpec
from zsim.spec.plan import Plan
from zsim.spec.registry import PROFILES_DIR, resolve_hardware
from zsim.validation import report


def _record_regenerate(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    calls: dict[str, Any] = {}

    def fake(profile: Any, **kwargs: Any) -> Path:
        calls.update(kwargs, profile=profile)
        return kwargs["out_dir"] / "validation.csv"

    monkeypatch.setattr(report, "regenerate_report", fake)
    return calls


def test_calibrate_here_and_min_timed_s_reach_regenerate_report(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    calls = _record_regenerate(monkeypatch)
    validate_api.grid(out=tmp_path, calibrate_here=True, calibration_rounds=1,
                      min_timed_s=3, runs=1, only=["llama-tiny zero1* n2"])
    assert calls["profile"] is None
    assert (calls["calibration_rounds"], calls["min_timed_s"]) == (1, 3.0)
    assert (calls["runs"], calls["only"], calls["keep_time"]) == (
        1, ("llama-tiny zero1* n2",), True)


def test_defaults_keep_the_committed_profile_and_timed_window(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    calls = _record_regenerate(monkeypatch)
    validate_api.grid(out=tmp_path)
    assert calls["profile"] == resolve_hardware("local-cpu")
    assert (calls["min_timed_s"], calls["runs"]) == (report.MIN_TIMED_S, report.REPORT_RUNS)
    assert calls["calibration_rounds"] is None  # BenchConfig's default


def _fake_calibrate(calibrated: list[int], rounds: list[int | None] | None = None) -> Any:
    """calibrate() that records its world size (and its config's rounds in `rounds`) and
    writes local-cpu's figures."""
    def fake(backend: str, nproc: int, out: Path, *, config: Any = None) -> Path:
        calibrated.append(nproc)
        if rounds is not None:
            rounds.append(None if config is None else config.rounds)
        data = yaml.safe_load((PROFILES_DIR / "local-cpu.yaml").read_text())
        data["name"] = out.stem
        data["node"]["gpus_per_node"] = nproc
        out.write_text(yaml.safe_dump(data))
        return out
    return fake


def test_no_profile_calibrates_every_world_size(monkeypatch: pytest.MonkeyPatch,
                                                tmp_path: Path) -> None:
    calibrated: list[int] = []
    monkeypatch.setattr(report, "calibrate", _fake_calibrate(calibrated))
    local = resolve_hardware("local-cpu")  # measured at world 2
    given = report._profiles_per_world(local, [2, 4], tmp_path, backend="gloo")
    assert calibrated == [4] and given[2] is local
    calibrated.clear()
    here = report._profiles_per_world(None, [2, 4], tmp_path, backend="gloo")
    assert calibrated == [2, 4]
    assert {n: p.name for n, p in here.items()} == {2: "calibrated-gloo-n2",
                                                   4: "calibrated-gloo-n4"}


def _measurement(spec: ModelSpec, plan: Plan) -> PlanMeasurement:
    memory = PhaseMemory(after_init_bytes=1, after_first_step_bytes=2, peak_forward_bytes=3,
                         peak_backward_bytes=4, peak_optimizer_bytes=3, after_forward_bytes=3,
                         peak_bytes=4, reserved_bytes=4)
    ranks = [RankMeasurement(rank=i, step_times_s=[1.0], forward_s={}, backward_s={},
                             memory=memory, collective_busy_s={}, saved=[], loss=1.0)
             for i in range(plan.world_size)]
    return PlanMeasurement(spec=spec, plan=plan, backend="gloo", ranks=ranks)


def test_regenerate_report_passes_them_on(monkeypatch: pytest.MonkeyPatch,
                                          tmp_path: Path) -> None:
    """Calibrating here for timed runs, each world size gets --calibration-rounds rounds
    of the benchmarks before each pass over the cases (so the profiles sample the host
    over the minutes the runs take), and each profile is written once, from all of its
    sessions, before the runs are predicted."""
    events: list[tuple[Any, ...]] = []

    def bench(backend: str, nproc: int, *, config: Any) -> list[int]:
        events.append(("bench", nproc, config.rounds))
        return [len(events)] * nproc

    def write(sessions: list[Any], *, backend: str, nproc: int, out: Path, started: Any,
              config: Any) -> Path:
        events.append(("write", nproc, [s[0] for s in sessions]))
        return _fake_calibrate([])(backend, nproc, out)

    def measure(spec: ModelSpec, plan: Plan, **kwargs: Any) -> PlanMeasurement:
        events.append(("measure", plan.world_size, kwargs["min_timed_s"]))
        return _measurement(spec, plan)

    def compare(spec: ModelSpec, plan: Plan, profile: Any, measured: PlanMeasurement, *,
                times: bool = True) -> list[dict[str, Any]]:
        events.append(("compare", profile.name))
        return [{"model": spec.name, "plan": plan.label, "nproc": plan.world_size,
                 "backend": "gloo", "metric": "step_time_s", "predicted": 1.0,
                 "measured": 1.0, "error_pct": 0.0}]

    monkeypatch.setattr(report, "calibrate", _fake_calibrate([]))
    monkeypatch.setattr(report, "bench_ranks", bench)
    monkeypatch.setattr(report, "write_profile", write)
    monkeypatch.setattr(report, "measure_plan", measure)
    monkeypatch.setattr(report, "compare", compare)
    monkeypatch.setattr(report, "_plot", lambda rows, out_dir: None)
    report.regenerate_report(None, out_dir=tmp_path, steps=1, runs=2, min_timed_s=0.5,
                             calibration_rounds=1,
                             only=("llama-tiny zero1* n2", "llama-tiny zero1* n4"))
    assert events == [("bench", 2, 1), ("bench", 4, 1), ("measure", 2, 0.5), ("measure", 4, 0.5),
                      ("bench", 2, 1), ("bench", 4, 1), ("measure", 2, 0.5), ("measure", 4, 0.5),
                      ("write", 2, [1, 5]), ("write", 4, [2, 6]),
                      ("compare", "calibrated-gloo-n2"), ("compare", "calibrated-gloo-n4")]
    (batch,) = yaml.safe_load((tmp_path / "provenance.yaml").read_text())["batches"]
    assert batch["min_timed_s_per_run"] == 0.5
    assert batch["profiles"] == {2: "calibrated-gloo-n2", 4: "calibrated-gloo-n4"}
    assert batch["calibration"].startswith("1 round(s) of the benchmarks per world size "
                                           "before each of the 2 passes")
    assert " --calibrate-here " in batch["command"]
    assert " --calibration-rounds 1 " in batch["command"]
    assert " --min-timed-s 0.5 " in batch["command"]
    # The host, so that a batch from another machine shows as one: its cores and CPU model.
    assert f" {os.cpu_count()} cores, " in batch["machine"]
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        model = next((line.split(":", 1)[1].strip() for line in cpuinfo.read_text().splitlines()
                      if line.startswith("model name")), None)
        assert model is None or batch["machine"].endswith(model)


def test_untimed_batches_calibrate_once_before_the_runs(monkeypatch: pytest.MonkeyPatch,
                                                        tmp_path: Path) -> None:
    """Without step times (--no-time) nothing depends on when the host was benchmarked:
    each world size is calibrated once, up front, with --calibration-rounds rounds."""
    calibrated: list[int] = []
    rounds: list[int | None] = []
    monkeypatch.setattr(report, "calibrate", _fake_calibrate(calibrated, rounds))
    monkeypatch.setattr(report, "measure_plan",
                        lambda spec, plan, **kwargs: _measurement(spec, plan))
    monkeypatch.setattr(report, "compare", lambda *a, **k: [])
    monkeypatch.setattr(report, "_plot", lambda rows, out_dir: None)
    report.regenerate_report(None, out_dir=tmp_path, steps=1, runs=2, keep_time=False,
                             calibration_rounds=2, only=("llama-tiny zero1* n2",))
    assert calibrated == [2] and rounds == [2]
