"""Every executor gives the rows of one-at-a-time simulation (zsim.scenario.simulate_runs,
the serial reference), byte for byte in the results files: here alone, on forked workers,
and on a local Ray cluster. A run the simulator rejects stops the sweep with its error,
naming the run, as the serial reference does."""

from __future__ import annotations

import importlib.util
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

import zsim.simulate
from zsim.errors import ConfigError
from zsim.executor import CONNECT_TIMEOUT_S, RAY_INSTALL, check_ray_address, evaluate
from zsim.report.dataframes import rows_frame, sweep_frame, sweep_row
from zsim.report.files import RESULTS_CSV, RESULTS_PARQUET, results_files
from zsim.scenario import load_scenario, simulate_runs
from zsim.schedule.lower import lower
from zsim.simulate import simulate
from zsim.sweep import SweepRows, run_sweep

REPO = Path(__file__).resolve().parents[2]
RUNS = 4 * 2 * 3 * 2 * 2
"""Runs of the grid scenario (tests/sweep/conftest.py): plans x gpus x micro_batch x
recompute x unit_size."""


def files(done: SweepRows) -> dict[str, bytes]:
    return results_files(rows_frame(done.rows))


@pytest.fixture
def reference(grid_path: Path) -> tuple[dict[str, bytes], dict[str, tuple]]:
    scenario = load_scenario(grid_path)
    pairs = simulate_runs(scenario)
    curves = {run.name: r.memory_curve for run, r in pairs
              if run.name in scenario.memory_curves}
    return results_files(sweep_frame(pairs)), curves


def test_serial_and_forked_workers_match_one_at_a_time_simulation(
        grid_path: Path, reference: tuple[dict[str, bytes], dict[str, tuple]],
        monkeypatch: pytest.MonkeyPatch) -> None:
    scenario = load_scenario(grid_path)
    expected, curves = reference
    assert len(scenario.runs) == RUNS
    monkeypatch.setenv("ZSIM_WORKERS", "1")
    serial = run_sweep(scenario, curves=scenario.memory_curves)
    monkeypatch.setenv("ZSIM_WORKERS", "2")
    forked = run_sweep(scenario, curves=scenario.memory_curves)
    assert files(serial) == files(forked) == expected
    assert serial.curves == forked.curves == curves
    assert serial.simulated == forked.simulated == RUNS
    # Micro-batch 4000 without recomputation saves some 34·s·b·h = 18 GB per block
    # (Korthikanti et al. 2022), 71 GB for 4 blocks, plus 8 GB of fp32 logits: over the
    # floor, so skipped by the closed form, and the row says so; with full recomputation
    # (one block input, 1 GB per block) it is simulated.
    closed = {r["run"] for r in serial.rows if r["evaluated"] == "closed form"}
    assert closed == {r["run"] for r in serial.rows
                      if r["micro_batch"] == 4000 and r["recompute"] == "none"}
    assert len(closed) == RUNS // 6
    if importlib.util.find_spec("pyarrow"):
        assert RESULTS_PARQUET in expected
    assert expected[RESULTS_CSV].count(b"\n") == RUNS + 1


def test_plans_that_lower_to_one_schedule_are_simulated_once_per_batch(
        grid_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "prefetch.yaml"
    path.write_text(yaml.safe_dump(yaml.safe_load(grid_path.read_text()) | {
        "sweep": {"gpus": [16], "micro_batch": [1, 2], "prefetch": [1, 2]}, "report": {}}))
    runs = load_scenario(path).runs
    keys = [lower(r.model, r.hardware, r.plan).key() for r in runs]
    # FSDP's prefetch depth changes its schedule; DDP and DeepSpeed's ZeRO have none, so
    # prefetch 1 and 2 lower alike there.
    alike = {r.plan.strategy for r, k, other in zip(runs[::2], keys[::2], keys[1::2],
                                                   strict=True) if k == other}
    assert alike == {"zero3", "ddp"}
    engine_runs: list[int] = []
    lowered: list[str] = []
    real, real_lower = zsim.simulate.run, zsim.simulate.lower

    def counted(schedule, **kwargs):  # type: ignore[no-untyped-def]
        engine_runs.append(len(schedule.ops))
        return real(schedule, **kwargs)

    def counted_lower(model, hw, plan):  # type: ignore[no-untyped-def]
        lowered.append(plan.label)
        return real_lower(model, hw, plan)

    monkeypatch.setattr(zsim.simulate, "run", counted)
    monkeypatch.setattr(zsim.simulate, "lower", counted_lower)
    batch = evaluate(runs, range(len(runs)), frozenset())
    # ddp and zero3 x 2 micro-batch sizes: lowered and simulated once for both depths.
    assert len(engine_runs) == len(set(keys)) == len(runs) - 2 * 2
    assert len(lowered) == len(runs) - 2 * 2
    monkeypatch.setattr(zsim.simulate, "run", real)
    monkeypatch.setattr(zsim.simulate, "lower", real_lower)
    assert [o.row for o in batch] == [
        sweep_row(r, simulate(r.model, r.hardware, r.plan)) for r in runs]


def test_progress_counts_every_run_once(grid_path: Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ZSIM_WORKERS", "2")
    calls: list[tuple[int, int, str]] = []
    run_sweep(load_scenario(grid_path), progress=lambda *a: calls.append(a))
    assert calls[0] == (0, RUNS, "")
    assert calls[-1][:2] == (RUNS, RUNS)
    done = [c[0] for c in calls]
    assert done == sorted(done) and len(set(done)) == len(done)


def test_a_rejected_run_stops_the_sweep_naming_it(
        grid_path: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    real = zsim.simulate.simulate

    def reject_zero3(model, hw, plan, **kwargs):  # type: ignore[no-untyped-def]
        if plan.strategy == "zero3" and plan.micro_batch == 2:
            raise ConfigError("plan.offload", "params", "not modelled")
        return real(model, hw, plan, **kwargs)

    monkeypatch.setattr(zsim.simulate, "simulate", reject_zero3)
    monkeypatch.setenv("ZSIM_WORKERS", "2")
    with pytest.raises(ConfigError) as info:
        run_sweep(load_scenario(grid_path), tmp_path / "out")
    # The first rejected run in scenario order, whichever worker met it first.
    assert str(info.value) == ("plan.offload='params': not modelled "
                               "(run 'zero3 gpus=16 micro_batch=2 recompute=none unit_size=1')")


def test_an_unknown_executor_is_a_config_error(grid_path: Path) -> None:
    with pytest.raises(ConfigError, match="executor='dask': must be one of local, ray"):
        run_sweep(load_scenario(grid_path), executor="dask")


def test_ray_local_cluster_matches_one_at_a_time_simulation(
        grid_path: Path, reference: tuple[dict[str, bytes], dict[str, tuple]],
        tmp_path: Path) -> None:
    # ray is in the `test` extra, so CI runs this; a dev install without it skips.
    ray = pytest.importorskip("ray")
    scenario = load_scenario(grid_path)
    expected, curves = reference
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             configure_logging=False)
    try:
        done = run_sweep(scenario, tmp_path / "out", curves=scenario.memory_curves,
                         executor="ray")
        again = run_sweep(scenario, tmp_path / "out", curves=scenario.memory_curves,
                          executor="ray")
    finally:
        ray.shutdown()
    assert files(done) == files(again) == expected
    assert done.curves == curves
    assert (done.simulated, again.simulated) == (RUNS, 0)  # resumed from the journal


def test_a_curve_asked_for_later_is_computed_again(grid_path: Path, tmp_path: Path) -> None:
    scenario = load_scenario(grid_path)
    first = run_sweep(scenario, tmp_path / "out")
    assert (first.simulated, first.curves) == (RUNS, {})
    again = run_sweep(scenario, tmp_path / "out", curves=scenario.memory_curves[:1])
    assert again.simulated == 1 and list(again.curves) == [scenario.memory_curves[0]]
    assert again.rows == first.rows


def _closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize("where", ["flag", "env"])
def test_a_ray_address_without_a_cluster_is_one_line_at_once(grid_path: Path,
                                                             where: str) -> None:
    """`--ray-address` at a closed port once printed an 88-line traceback (exit 1)
    and RAY_ADDRESS=bogus:1 hung past 60 s (Ray's client retries its connection 20 times):
    now one line naming the address and the reason, exit 2, within seconds."""
    pytest.importorskip("ray")
    address = f"127.0.0.1:{_closed_port()}" if where == "flag" else "bogus:1"
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    args = [sys.executable, "-m", "zsim", "sweep", "--scenario", str(grid_path),
            "--executor", "ray"]
    if where == "flag":
        args += ["--ray-address", address]
    else:
        env["RAY_ADDRESS"] = address
    start = time.monotonic()
    result = subprocess.run(args, capture_output=True, text=True, env=env, timeout=120)
    took_s = time.monotonic() - start
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr and len(result.stderr.splitlines()) == 1
    field = "ray_address" if where == "flag" else "RAY_ADDRESS"
    reason = ("connection refused: no Ray cluster listens there" if where == "flag"
              else "unknown host 'bogus'")
    assert result.stderr.startswith(f"error: {field}='{address}': {reason}"), result.stderr
    assert took_s < 30  # start-up and ray's import; the hang was minutes


def test_an_unanswered_ray_address_times_out(monkeypatch: pytest.MonkeyPatch) -> None:
    """A connection that nobody answers (an address that drops the packets) gives up after
    CONNECT_TIMEOUT_S: the timeout socket.create_connection is given, and its error."""
    asked: list[float] = []

    def silent(address: tuple[str, int], timeout: float) -> socket.socket:
        asked.append(timeout)
        raise TimeoutError("timed out")

    monkeypatch.setattr(socket, "create_connection", silent)
    with pytest.raises(ConfigError) as e:
        check_ray_address("ray_address", "ray://head.example:10001")
    assert asked == [CONNECT_TIMEOUT_S] == [5]
    assert str(e.value) == ("ray_address='ray://head.example:10001': no answer within 5 s "
                            "(connection timeout): no Ray cluster reachable there")
    for bad in ("head", "head:port", ":6379", "head:0", "head:70000"):
        with pytest.raises(ConfigError, match="must be HOST:PORT"):
            check_ray_address("ray_address", bad)


def test_ray_has_one_install_hint_everywhere(grid_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """The error without Ray, `zsim sweep --help` and the README give the same command,
    which installs the `ray` extra's requirement (pyproject.toml)."""
    tomllib = pytest.importorskip("tomllib")
    extra = tomllib.loads((REPO / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]["ray"]
    assert f"pip install '{extra[0]}'" == RAY_INSTALL and len(extra) == 1
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray raises ImportError
    with pytest.raises(ConfigError) as e:
        run_sweep(load_scenario(grid_path), executor="ray")
    assert str(e.value) == f"executor='ray': needs Ray: {RAY_INSTALL}"
    from typer.testing import CliRunner

    from zsim.cli import app

    output = CliRunner().invoke(app, ["sweep", "--help"]).output
    help_text = " ".join(output.replace("\u2502", " ").split())  # rich's box edges
    readme = " ".join((REPO / "README.md").read_text().split())
    for text in (help_text, readme):
        hints = {h.strip() for h in re.findall(r"pip install [^`)]*", text) if "ray" in h}
        assert hints == {RAY_INSTALL}
