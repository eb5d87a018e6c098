"""zsim.calibration.program_overhead: the fit recovers overheads planted on top of what the
simulator gives the nano plans and floors a faster-than-simulated host at 0; the rank
measurement times every program a 2-rank CPU job can run, and the profile written with
it loads and lands the fitted figures on the step."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from zsim.backend.runner import RankContext, run_ranks
from zsim.calibration.nano import NanoBlock, nano_model, program_plans
from zsim.calibration.program_overhead import fit, program_steps_s
from zsim.simulate import simulate
from zsim.spec.hardware import HardwareProfile
from zsim.spec.registry import PROFILES_DIR

LAYERS = (2, 10)
PLANTED = {"forward_block": 400.0, "backward_block": 900.0, "step": 7000.0}
"""Microseconds."""


def _profile() -> dict[str, Any]:
    data = yaml.safe_load((PROFILES_DIR / "local-cpu.yaml").read_text())
    assert "program_overhead_us" not in data["host"]
    return data


def _measured(data: dict[str, Any], extra_us: dict[str, float],
              blocks: tuple[NanoBlock, ...] = ("llama",)) -> dict[str, dict[str, float]]:
    """What a host that is the simulator plus `extra_us` would measure with each nano
    block of `blocks` (TP: Llama's only): per block, the forward and backward figures, and
    per parameter tensor of a block the *_tensor ones (absent: 0); once, the step figure."""
    hw = HardwareProfile.from_dict(data, name="local-cpu")
    out = {}
    for program, plan in program_plans(2).items():
        times = {}
        timed: tuple[NanoBlock, ...] = blocks if program != "tp" else ("llama",)
        for block in timed:
            prefix = "" if block == "llama" else f"{block}_"
            tensors = len(nano_model(1, block=block).block_tensors())
            fwd, bwd = ((extra_us[f"{ph}_block"] + tensors * extra_us.get(f"{ph}_tensor", 0.0))
                        * 1e-6 for ph in ("forward", "backward"))
            for depth, n in zip(("lo", "hi"), LAYERS, strict=True):
                r = simulate(nano_model(n, block=block), hw, plan)
                times[f"{prefix}{depth}"] = (r.step_time_s + n * (fwd + bwd)
                                             + extra_us["step"] * 1e-6)
                # A host measures the wall time to the loss, its blocking collectives in.
                times[f"{prefix}{depth}_forward"] = r.time_to_loss_s + n * fwd
        out[program] = times
    return out


def test_the_fit_recovers_planted_overheads() -> None:
    data = _profile()
    measured = _measured(data, PLANTED)
    fitted = fit([measured, measured], data, world_size=2, layers=LAYERS)
    assert set(fitted) == set(program_plans(2)) and "tp" in fitted
    for program, parts in fitted.items():
        for part, us in parts.items():
            assert us == pytest.approx(PLANTED[part], rel=1e-6), (program, part)


def test_the_time_to_the_loss_takes_tps_blocking_all_reduces_in() -> None:
    """TP on a synchronous host runs its forward in series: the simulated time to the
    loss is every forward kernel plus every forward all-reduce (the embedding's, and 2 a
    block: attention's and the MLP's row-wise outputs), by hand from the spans; the
    forward's compute alone, which the fit used to take, falls short by the all-reduces.
    """
    hw = HardwareProfile.from_dict(_profile(), name="local-cpu")
    r = simulate(nano_model(2), hw, program_plans(2)["tp"], trace=True)
    forward = [sp for sp in r.spans if sp.rank == 0 and sp.end_s <= r.time_to_loss_s]
    all_reduces = [sp for sp in forward if sp.kind == "all_reduce"]
    assert len(all_reduces) == 1 + 2 * 2
    compute = sum(sp.duration_s for sp in forward if sp.stream == "compute")
    assert compute == pytest.approx(r.phase_time_s["forward"], rel=1e-9)
    assert r.time_to_loss_s == pytest.approx(
        compute + sum(sp.duration_s for sp in all_reduces), rel=1e-9)
    assert min(sp.duration_s for sp in all_reduces) > 0


def test_two_blocks_split_the_overhead_per_block_and_per_tensor() -> None:
    """Planted per block and per parameter tensor, measured on Llama's nano block (9
    tensors) and GPT's (16): the fit recovers both; TP, timed on Llama's alone, takes
    what its block costs in all (per tensor x 9 folded into its block figure)."""
    data = _profile()
    planted = {**PLANTED, "forward_tensor": 20.0, "backward_tensor": 50.0}
    fitted = fit([_measured(data, planted, blocks=("llama", "gpt"))], data, world_size=2,
                 layers=LAYERS)
    for program, parts in fitted.items():
        if program == "tp":
            assert set(parts) == {"forward_block", "backward_block", "step"}
            assert parts["forward_block"] == pytest.approx(400.0 + 9 * 20.0, rel=1e-6)
            assert parts["backward_block"] == pytest.approx(900.0 + 9 * 50.0, rel=1e-6)
            assert parts["step"] == pytest.approx(7000.0, rel=1e-6)
            continue
        assert set(parts) == set(planted), program
        for part, us in parts.items():
            assert us == pytest.approx(planted[part], rel=1e-6), (program, part)


def test_a_host_faster_than_the_simulation_gets_no_negative_overhead() -> None:
    data = _profile()
    fitted = fit([_measured(data, {"forward_block": -50.0, "backward_block": -50.0,
                                   "step": -500.0})], data, world_size=2, layers=LAYERS)
    assert fitted and all(v == 0.0 for parts in fitted.values() for v in parts.values())


def test_a_program_one_rank_did_not_time_is_left_out() -> None:
    data = _profile()
    full = _measured(data, PLANTED)
    partial = {k: v for k, v in full.items() if k != "tp"}
    assert "tp" not in fit([full, partial], data, world_size=2, layers=LAYERS)


def _steps(ctx: RankContext, layers: tuple[int, int]) -> dict[str, dict[str, float]]:
    return program_steps_s(ctx, layers, steps=2, warmup=1)


@pytest.mark.slow
def test_two_ranks_time_every_program_and_the_profile_charges_it() -> None:
    from zsim.calibration.bench_figures import RankBench
    from zsim.calibration.profile_writer import with_program_overhead

    ranks = run_ranks(_steps, (1, 2), nproc=2, timeout_s=600)
    for r in ranks:
        assert set(r) == set(program_plans(2))
        for program, t in r.items():
            assert 0 < t["lo_forward"] < t["lo"] and 0 < t["hi_forward"] < t["hi"], program
    data = _profile()
    with_program_overhead(data, [RankBench(program_step_s=r) for r in ranks], nproc=2,
                          layers=(1, 2))
    hw = HardwareProfile.from_dict(data, name="local-cpu")
    assert set(hw.program_overhead_s) == set(program_plans(2))
    assert "program_overhead" in data["host"]["source"]
    # The rest of the profile is what calibrate() wrote: only host gained a key.
    assert set(data["host"]) - set(_profile()["host"]) == {"program_overhead_us"}


def test_where_a_figure_floors_the_shallower_run_is_still_reproduced() -> None:
    """Forward grows 400 us a block, the whole step only 300 (a noisy backward, -100):
    backward floors at 0, and the step figure takes what the 2-block run has left once
    its blocks are charged 400 each, 7,600 - 800."""
    data = _profile()
    measured = _measured(data, {"forward_block": 400.0, "backward_block": -100.0,
                                "step": 7000.0})
    for parts in fit([measured], data, world_size=2, layers=LAYERS).values():
        assert parts["forward_block"] == pytest.approx(400.0, rel=1e-6)
        assert parts["backward_block"] == 0.0
        assert parts["step"] == pytest.approx(7600.0 - LAYERS[0] * 400.0, rel=1e-6)
