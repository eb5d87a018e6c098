"""zsim.planner.choose: closed-form prune, then the simulator ranks the survivors."""

from __future__ import annotations

from dataclasses import replace

from zsim.planner import choose, explain, to_record
from zsim.schedule.lower import memory_floor_bytes
from zsim.simulate import simulate
from zsim.spec.presets import PRESETS
from zsim.spec.registry import resolve_hardware

H100 = resolve_hardware("dgx-h100")
MODEL = PRESETS["llama2-13b"]


def test_only_plans_whose_memory_floor_cannot_fit_skip_the_engine() -> None:
    choices = choose(MODEL, H100, gpus=128, seq_len=8192)
    for ch in choices:
        floor = sum(memory_floor_bytes(MODEL, ch.plan, H100).values())
        assert (ch.result.evaluated == "closed form") == (floor > H100.hbm_bytes), ch.plan.label
        assert ch.result.peak_memory_bytes >= floor * (1 - 1e-12)
    # DDP keeps 16 bytes per parameter: 208 GB > 80 GB before any activation.
    assert all(ch.result.evaluated == "closed form" for ch in choices
               if ch.plan.strategy == "ddp")


def test_ranking_follows_the_simulation() -> None:
    choices = choose(MODEL, H100, gpus=128, seq_len=8192)
    fitting = [ch for ch in choices if ch.fits]
    assert fitting and choices[: len(fitting)] == fitting
    speeds = [ch.result.tokens_per_s_per_gpu for ch in fitting]
    assert speeds == sorted(speeds, reverse=True)
    # The table's figures are the simulator's, not the closed form's.
    best = choices[0]
    again = simulate(MODEL, H100, best.plan)
    record = to_record(MODEL, best, why="recommended", tier="recommended")
    assert record["step_time_s"] == round(again.step_time_s, 4)
    assert record["peak_gib"] == round(again.peak_memory_bytes / 2**30, 3)


def test_a_simulated_plan_that_runs_out_of_memory_says_where() -> None:
    # HBM between fsdp ac=selective's floor (29.0 GiB) and its simulated peak (29.8 GiB):
    # the floor lets it through, the simulation finds where it runs out.
    small = replace(H100, hbm_bytes=29.4 * 2**30)
    choices = choose(MODEL, small, gpus=128, seq_len=8192)
    oom = [ch for ch in choices if ch.result.simulated and not ch.fits]
    assert "fsdp ac=selective mb=1" in [ch.plan.label for ch in oom]
    for ch in oom:
        why = explain(ch, choices[0])
        assert why.startswith("does not fit: peak") and "OOM at" in why
