"""Scenario keys for 2-D and 3-D plans: tp, pp, cp and the schedule knobs
reach the Plan, sweep like any key, and a bad value names its field path."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from zsim.errors import ConfigError
from zsim.scenario import load_scenario, simulate_runs


def test_tp_and_pp_runs_and_sweeps(toy: dict[str, Any], write: Any) -> None:
    toy["plans"] = {"tp": {"strategy": "fsdp", "tp": 2, "sp": True},
                    "pp": {"strategy": "fsdp", "pp": 2, "grad_accum": 2}}
    toy["sweep"] = {"pp_schedule": ["1f1b", "gpipe"]}
    loaded = load_scenario(write(toy))
    plans = {run.name: run.plan for run in loaded.runs}
    assert len(plans) == 4
    tp = next(p for n, p in plans.items() if n.startswith("tp"))
    assert (tp.tp, tp.sp, tp.dp_shard, tp.world_size) == (2, True, 8, 16)
    pipe = [p for n, p in plans.items() if n.startswith("pp")]
    assert {p.pp_schedule for p in pipe} == {"1f1b", "gpipe"}
    assert all(p.dp_shard == 8 and p.pp == 2 for p in pipe)
    results = simulate_runs(loaded)
    assert all(r.step_time_s and r.step_time_s > 0 for _, r in results)
    assert all(len(r.pipeline_stages) == 2 for run, r in results if run.plan.pp == 2)


def test_bad_parallel_value_names_its_path(toy: dict[str, Any], write: Any) -> None:
    toy["plans"]["fsdp"].update(pp=4, grad_accum=4)   # 2 layers
    with pytest.raises(ConfigError) as e:
        load_scenario(write(toy))
    assert (e.value.field, e.value.value) == ("plans.fsdp.pp", 4)


def test_cp_key(toy: dict[str, Any], tmp_path: Path, write: Any) -> None:
    toy["plans"] = {"cp": {"strategy": "fsdp", "cp": 2, "seq_len": 512}}
    run = load_scenario(write(toy)).runs[0]
    assert (run.plan.cp, run.plan.dp_shard) == (2, 8)
