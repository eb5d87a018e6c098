"""`zsim validate grid --calibrate-here --calibration-rounds N --min-timed-s SECONDS
--batch NAME --report REPORT`: the options reach regenerate_report through
zsim.validate_api.grid, and from there the calibration (every world size of the batch
calibrated on this host, none taken from --profile, with N rounds of benchmarks), the
timed runs and the batch's record in the evidence folder (zsim.validation.evidence: its
rows, profiles and pass). No processes are started: calibration and measurement are
stand-ins."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import yaml

pytest.importorskip("torch")

from zsim import validate_api
from zsim.backend.measured_step import PhaseMemory, PlanMeasurement, RankMeasurement
from zsim.errors import ConfigError
from zsim.spec.model import ModelSpec
from zsim.spec.plan import Plan
from zsim.spec.registry import PROFILES_DIR, resolve_hardware
from zsim.validation import evidence, figures, report


def _record_regenerate(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    calls: dict[str, Any] = {}

    def fake(profile: Any, **kwargs: Any) -> Path:
        calls.update(kwargs, profile=profile)
        return kwargs["out_dir"] / "validation.csv"

    monkeypatch.setattr(report, "regenerate_report", fake)
    monkeypatch.setattr(figures, "write_figures", lambda root: [])
    return calls


def test_calibrate_here_and_min_timed_s_reach_regenerate_report(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    calls = _record_regenerate(monkeypatch)
    validate_api.grid(out=tmp_path, calibrate_here=True, calibration_rounds=1,
                      min_timed_s=3, runs=1, only=["llama-tiny zero1* n2"], batch="b1",
                      report="r")
    assert calls["profile"] is None
    assert (calls["calibration_rounds"], calls["min_timed_s"]) == (1, 3.0)
    assert (calls["runs"], calls["only"], calls["keep_time"]) == (
        1, ("llama-tiny zero1* n2",), True)
    assert (calls["batch"], calls["report"]) == ("b1", "r")


def test_defaults_keep_the_committed_profile_and_timed_window(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    calls = _record_regenerate(monkeypatch)
    validate_api.grid(out=tmp_path)
    assert calls["profile"] == "local-cpu"
    assert (calls["min_timed_s"], calls["runs"]) == (report.MIN_TIMED_S, report.REPORT_RUNS)
    assert calls["calibration_rounds"] is None  # BenchConfig's default
    # The grid report's own batch, in a report of its name.
    assert (calls["batch"], calls["report"]) == ("validation", None)


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
    # local-cpu is measured at world 2: the batch names it; world 4 is calibrated into
    # the evidence folder's profiles/.
    given = report._profiles_per_world("local-cpu", [2, 4], tmp_path, "b", backend="gloo")
    assert calibrated == [4]
    assert given[2][0] == resolve_hardware("local-cpu")
    assert {n: ref for n, (_, ref) in given.items()} == {2: "local-cpu",
                                                        4: "profiles/b-n4.yaml"}
    calibrated.clear()
    here = report._profiles_per_world(None, [2, 4], tmp_path, "b", backend="gloo")
    assert calibrated == [2, 4]
    assert {n: (p.name, ref) for n, (p, ref) in here.items()} == {
        2: ("b-n2", "profiles/b-n2.yaml"), 4: ("b-n4", "profiles/b-n4.yaml")}
    # A profile given as a file is copied beside the batch's others.
    path = tmp_path / "mine.yaml"
    path.write_text((PROFILES_DIR / "local-cpu.yaml").read_text())
    copied = report._profiles_per_world(str(path), [2], tmp_path, "c", backend="gloo")
    assert copied[2][1] == "profiles/c-n2.yaml"
    assert (tmp_path / "profiles" / "c-n2.yaml").read_bytes() == path.read_bytes()


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
    report.regenerate_report(None, out_dir=tmp_path, batch="b", report="r", steps=1, runs=2,
                             min_timed_s=0.5, calibration_rounds=1,
                             only=("llama-tiny zero1* n2", "llama-tiny zero1* n4"))
    assert events == [("bench", 2, 1), ("bench", 4, 1), ("measure", 2, 0.5), ("measure", 4, 0.5),
                      ("bench", 2, 1), ("bench", 4, 1), ("measure", 2, 0.5), ("measure", 4, 0.5),
                      ("write", 2, [1, 5]), ("write", 4, [2, 6]),
                      ("compare", "b-n2"), ("compare", "b-n4")]
    (batch,) = evidence.read_batches(tmp_path)
    assert (batch.name, batch.report, batch.bounds, batch.cases) == ("b", "r", "not held", 2)
    assert batch.profiles == {2: "profiles/b-n2.yaml", 4: "profiles/b-n4.yaml"}
    (this,) = batch.passes
    assert this["min_timed_s_per_run"] == 0.5
    assert this["calibration"].startswith("1 round(s) of the benchmarks per world size "
                                          "before each of the 2 passes")
    for option in (" --batch b ", " --report r ", " --calibrate-here ",
                   " --calibration-rounds 1 ", " --min-timed-s 0.5 "):
        assert option in this["command"], option
    # The host, so that a batch from another machine shows as one: its cores and CPU model.
    assert f" {os.cpu_count()} cores, " in this["host"]
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        model = next((line.split(":", 1)[1].strip() for line in cpuinfo.read_text().splitlines()
                      if line.startswith("model name")), None)
        assert model is None or this["host"].endswith(model)
    # Every row names the batch and its pass, and carries the bound of its metric.
    rows = evidence.read_table(tmp_path)
    assert {(r["batch"], r["time_utc"], r["bound_pct"]) for r in rows} == {
        ("b", this["time_utc"], 15.0)}
    assert len(evidence.read_runs(tmp_path)) == 4  # 2 cases x 2 runs


def test_a_batch_of_some_cases_merges_into_its_batch_only(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """--only replaces its cases' rows in the batch named (the batch's other rows and
    every other batch's stay), adds its pass, and drops a pass none of whose rows is
    left; the batch keeps its report and what the tests hold it to."""
    monkeypatch.setattr(report, "calibrate", _fake_calibrate([]))
    monkeypatch.setattr(report, "measure_plan",
                        lambda spec, plan, **kwargs: _measurement(spec, plan))

    def run(only: tuple[str, ...], batch: str, minute: int) -> None:
        stamp = f"2026-01-01 10:{minute:02d}"
        monkeypatch.setattr(report, "_now", lambda: stamp)
        report.regenerate_report("local-cpu", out_dir=tmp_path, batch=batch, steps=1,
                                 runs=1, only=only, keep_time=False)

    run(("llama-tiny zero1* n2", "llama-tiny zero2 ac=none mb=2 n2"), "a", 1)
    run(("llama-tiny zero1* n2",), "other", 2)
    batches = evidence.read_batches(tmp_path)
    held = evidence.Batch(**{**{f: getattr(batches[0], f) for f in batches[0].__slots__},
                             "bounds": "held"})
    evidence.write(tmp_path, [held, batches[1]],
                   evidence.by_batch(evidence.read_table(tmp_path)), {})
    run(("llama-tiny zero1* n2",), "a", 3)
    run(("llama-tiny zero2 ac=none mb=2 n2",), "a", 4)
    a, other = evidence.read_batches(tmp_path)
    assert (a.bounds, a.report, a.cases) == ("held", "a", 2)
    assert (other.name, other.report, other.bounds) == ("other", "other", "not held")
    assert [p["time_utc"][-2:] for p in a.passes] == ["03", "04"]  # the 10:01 pass is gone
    rows = evidence.read_table(tmp_path)
    assert [(r["batch"], r["plan"].split()[0], r["time_utc"][-2:]) for r in rows
            if r["metric"] == "peak_memory_bytes"] == [
        ("a", "zero1", "03"), ("a", "zero2", "04"), ("other", "zero1", "02")]
    with pytest.raises(ConfigError, match="belongs to report a"):
        report.regenerate_report("local-cpu", out_dir=tmp_path, batch="a", report="x",
                                 steps=1, runs=1, only=("llama-tiny zero1* n2",),
                                 keep_time=False)


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
    report.regenerate_report(None, out_dir=tmp_path, steps=1, runs=2, keep_time=False,
                             calibration_rounds=2, only=("llama-tiny zero1* n2",))
    assert calibrated == [2] and rounds == [2]
