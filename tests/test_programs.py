"""The program registry (zsim.spec.programs): every place that names a program
reads it, so their key sets agree, and a new program is its own modules plus one entry.

The expected tables below are zsim's behaviour before the registry (the hand-kept tables
it replaced: Plan's strategy -> programs, the planner's pairs, the profile's overhead
keys), which the programs' libraries fix: torch runs DDP (ddp) and
ZeroRedundancyOptimizer (zero1); DeepSpeed's ZeRO stages 1-3 are the zero strategies;
FSDP2's fully_shard and FSDP1's ShardingStrategy FULL_SHARD, SHARD_GRAD_OP and
HYBRID_SHARD the fsdp ones (torch/distributed/fsdp/api.py).
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

import zsim.spec.programs as registry
from zsim.backend.programs import program_module
from zsim.cli import Impl
from zsim.errors import ConfigError
from zsim.planner import candidate_plans, choose, program_shapes
from zsim.recommend import complications
from zsim.schedule.lower import program
from zsim.schedule.programs import Program
from zsim.simulate import simulate
from zsim.spec.deepspeed import DeepSpeedZero
from zsim.spec.fsdp1 import Fsdp1Options
from zsim.spec.hardware import HardwareProfile, overhead_keys, overhead_programs
from zsim.spec.model import ModelSpec
from zsim.spec.plan import STRATEGIES, Plan
from zsim.spec.programs import OverheadKey, program_entry, program_names, programs
from zsim.spec.registry import PROFILES_DIR
from zsim.validation.profile_bands import label_program

TINY = ModelSpec(name="tiny", num_layers=2, d_model=256, num_heads=4, num_kv_heads=4,
                 ffn_hidden=512, vocab_size=1000, max_seq_len=512)

RUNS_AS = {"ddp": ("torch",), "zero1": ("deepspeed", "torch"), "zero2": ("deepspeed",),
           "zero3": ("deepspeed",), "fsdp": ("fsdp2", "fsdp1"),
           "fsdp-no-reshard": ("fsdp2", "fsdp1"), "hsdp": ("fsdp2", "fsdp1")}
"""Strategy -> the programs that run it, the default first."""

PAIRS = (("ddp", "torch"), ("zero1", "deepspeed"), ("zero2", "deepspeed"),
         ("zero3", "deepspeed"), ("fsdp", "fsdp2"), ("fsdp", "fsdp1"),
         ("fsdp-no-reshard", "fsdp2"), ("fsdp-no-reshard", "fsdp1"), ("hsdp", "fsdp2"),
         ("hsdp", "fsdp1"))
"""The (strategy, program) pairs the planner ranks (torch's ZeroRedundancyOptimizer is
not among them)."""

OVERHEAD_KEYS = ("deepspeed-zero1", "deepspeed-zero2", "deepspeed-zero3",
                 "deepspeed-zero2-offload", "fsdp1", "fsdp1-no-reshard", "tp")
"""host.program_overhead_us's keys, in the order the profile lists them."""


def _plan(strategy: str, impl: str, **knobs: object) -> Plan:
    return Plan.for_strategy(strategy, gpus=8, seq_len=512, impl=impl,
                             shard_group=4 if strategy == "hsdp" else None, **knobs)


# ------------------------------------------------------------------ the key sets agree
def test_plan_runs_each_strategy_as_the_registry_says() -> None:
    assert {s: tuple(e.name for e in registry.programs_for(s)) for s in STRATEGIES} == RUNS_AS
    for strategy, impls in RUNS_AS.items():
        assert Plan.for_strategy(strategy, gpus=8, seq_len=512,
                                 shard_group=4 if strategy == "hsdp" else None).impl == impls[0]
        for impl in impls:
            assert _plan(strategy, impl).program.name == impl
        for other in set(program_names()) - set(impls):
            with pytest.raises(ConfigError) as e:
                _plan(strategy, other)
            assert e.value.field == "plan.impl"


def test_the_planners_pairs_are_the_registrys() -> None:
    assert program_shapes() == PAIRS
    pairs = {(p.strategy, p.impl) for p in candidate_plans(
        replace(_h100(), gpus_per_node=4), gpus=8, seq_len=512)}
    assert pairs == set(PAIRS)


def test_the_profiles_overhead_keys_are_the_registrys() -> None:
    assert overhead_keys() == OVERHEAD_KEYS
    for entry in programs():
        for key in entry.overhead_keys:
            # The plan that measures a key reads it first; its fallbacks are its own
            # program's keys.
            plan = _plan(key.strategy, entry.name, offload=key.offload)
            assert overhead_programs(plan)[0][0] == key.name
            assert set(key.strategies) <= set(entry.strategies)
            assert key.fallback in (None, *(k.name for k in entry.overhead_keys))
    data = _raw("local-cpu")
    data["host"]["program_overhead_us"] = {
        k: {"forward_block": 1, "backward_block": 1, "step": 1} for k in OVERHEAD_KEYS}
    assert set(HardwareProfile.from_dict(data, name="x").program_overhead_s) == \
        set(OVERHEAD_KEYS)


def test_each_programs_lowering_and_backend_are_its_own() -> None:
    for entry in programs():
        plan = _plan(entry.strategies[0], entry.name)
        lowering = program(plan)
        assert isinstance(lowering, Program) and lowering.name == entry.name
        backend = program_module(plan)
        assert backend.__name__ == entry.backend
        for name in ("check_plan", "prepare"):
            assert inspect.isfunction(getattr(backend, name))


def test_the_registry_is_consistent() -> None:
    names = program_names()
    assert len(set(names)) == len(names)
    assert sorted(v.value for v in Impl) == sorted(names)  # the CLI's --impl choices
    keys = [k.name for e in programs() for k in e.overhead_keys]
    assert len(set(keys)) == len(keys)
    option_keys = [e.options_key for e in programs() if e.options_key]
    assert len(set(option_keys)) == len(option_keys)
    assert set(option_keys).isdisjoint(f.name for f in Plan.__dataclass_fields__.values())
    for strategy in STRATEGIES:
        assert sum(strategy in e.defaults for e in programs()) == 1, strategy
    for e in programs():
        assert set(e.defaults) | set(e.ranked) | set(e.model_parallel) <= set(e.strategies)
        assert set(e.strategies) <= set(STRATEGIES)
        assert (e.options is None) == (e.options_key is None)
        assert e.superseded_by in (None, *names)


def test_the_programs_facts_reach_their_readers() -> None:
    """What each entry says is what the plan, the checks and the recommendation read."""
    fsdp1, fsdp2 = _plan("fsdp", "fsdp1"), _plan("fsdp", "fsdp2")
    assert complications(fsdp1) == ("FSDP1",) and complications(fsdp2) == ()
    assert fsdp2.casts_block_inputs and not fsdp1.casts_block_inputs
    assert _plan("ddp", "torch").runs_autocast and not fsdp2.runs_autocast
    assert fsdp2.with_(grad_accum=2, grad_sync="every").grad_sync == "every"
    with pytest.raises(ConfigError) as e:
        fsdp1.with_(grad_accum=2, grad_sync="every")
    assert e.value.field == "plan.grad_sync"
    with pytest.raises(ConfigError) as e:
        fsdp1.with_(offload="params")
    assert e.value.field == "plan.offload"


# ------------------------------------------------------------------ Plan.options
def test_options_are_the_programs_own() -> None:
    zero3 = _plan("zero3", "deepspeed")
    assert zero3.options == DeepSpeedZero() and _plan("fsdp", "fsdp1").options == Fsdp1Options()
    assert _plan("fsdp", "fsdp2").options is None
    with pytest.raises(ConfigError) as e:
        _plan("fsdp", "fsdp2", options=DeepSpeedZero())
    assert e.value.field == "plan.options"
    with pytest.raises(ConfigError) as e:
        _plan("zero3", "deepspeed", options=Fsdp1Options())
    assert e.value.field == "plan.ds"
    # Another program takes its own defaults; its options given, they stay.
    assert zero3.with_(strategy="fsdp", impl="fsdp1").options == Fsdp1Options()
    knobs = Fsdp1Options(limit_all_gathers=False)
    assert _plan("fsdp", "fsdp2").with_(impl="fsdp1", options=knobs).options == knobs


def test_the_yaml_keys_ds_and_fsdp1_still_read() -> None:
    zero3 = _plan("zero3", "deepspeed", options=DeepSpeedZero(prefetch_bucket_size=123))
    d = zero3.to_dict()
    assert d["options"]["prefetch_bucket_size"] == 123 and "ds" not in d
    assert Plan.from_dict(d) == zero3
    aliased = {k: v for k, v in d.items() if k != "options"} | {"ds": d["options"]}
    assert Plan.from_dict(aliased) == zero3
    fsdp1 = {"strategy": "fsdp", "dp_shard": 8, "seq_len": 512, "impl": "fsdp1",
             "fsdp1": {"backward_prefetch": "post"}}
    assert Plan.from_dict(fsdp1).options == Fsdp1Options(backward_prefetch="post")
    # A dict written when a plan held both (ds and fsdp1, each read by its own program):
    # the other program's key is checked, and not read.
    both = {**fsdp1, "ds": DeepSpeedZero().to_dict()}
    assert Plan.from_dict(both) == Plan.from_dict(fsdp1)
    with pytest.raises(ConfigError) as e:
        Plan.from_dict({**both, "ds": {"reduce_bucket_sise": 1}})
    assert e.value.field == "plan.ds.reduce_bucket_sise"
    with pytest.raises(ConfigError) as e:
        Plan.from_dict({**fsdp1, "options": {"backward_prefetch": "pre"}})
    assert e.value.field == "plan.fsdp1"
    with pytest.raises(ConfigError) as e:
        Plan.from_dict({"strategy": "fsdp", "dp_shard": 8, "seq_len": 512,
                        "options": {"backward_prefetch": "pre"}})
    assert e.value.field == "plan.options"


# ------------------------------------------------------------------ one entry
TWIN_LOWERING = '''"""FSDP2 under another name: its own lowering, which runs fsdp2's."""
from dataclasses import replace

from zsim.schedule.programs import fsdp2


def _lower(b, root, blocks):
    fsdp2.PROGRAM.lower(b, root, blocks)


PROGRAM = replace(fsdp2.PROGRAM, name="fsdp2-twin", lower=_lower)
'''
"""The twin's lowering module: the one file a new program brings to the simulator."""

TWIN = replace(program_entry("fsdp2"), name="fsdp2-twin", title="FSDP2 twin", defaults=(),
               lowering="fsdp2_twin",
               overhead_keys=(OverheadKey(name="fsdp2-twin", strategy="fsdp",
                                          also=("fsdp-no-reshard", "hsdp")),))
"""A new program: FSDP2's facts under another name, not the default of any strategy,
with a key of its own in the profile's program overhead."""


@pytest.fixture
def twin(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """The twin registered: its lowering module written, its entry added to the registry,
    and nothing else touched."""
    (tmp_path / "fsdp2_twin.py").write_text(TWIN_LOWERING)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(registry, "REGISTRY", (*registry.REGISTRY, TWIN))
    yield
    sys.modules.pop("fsdp2_twin", None)


def test_a_program_unregistered_is_refused() -> None:
    with pytest.raises(ConfigError) as e:
        _plan("fsdp", "fsdp2-twin")
    assert e.value.field == "plan.impl"


@pytest.mark.usefixtures("twin")
def test_one_entry_makes_a_program() -> None:
    # Plan accepts it, labels it and round-trips it.
    plan = _plan("fsdp", "fsdp2-twin", grad_accum=2)
    assert plan.label == "fsdp[fsdp2-twin] ac=none mb=1"
    assert Plan.from_dict(plan.to_dict()) == plan
    # simulate runs it through its own lowering, as FSDP2 (whose facts it shares).
    h100, fsdp2 = _h100(), plan.with_(impl="fsdp2")
    assert program(plan).name == "fsdp2-twin"
    ours, theirs = simulate(TINY, h100, plan), simulate(TINY, h100, fsdp2)
    assert ours.step_time_s == theirs.step_time_s
    assert ours.peak_memory_bytes == theirs.peak_memory_bytes
    # A profile's program overhead keys it, and the step pays it on a synchronous host.
    data = _raw("local-cpu")
    data["host"]["program_overhead_us"] = {
        "fsdp2-twin": {"forward_block": 0, "backward_block": 0, "step": 5000}}
    cpu = HardwareProfile.from_dict(data, name="local-cpu-twin")
    plain = HardwareProfile.from_dict(_raw("local-cpu"), name="local-cpu")
    extra = simulate(TINY, cpu, plan).step_time_s - simulate(TINY, plain, plan).step_time_s
    assert extra == pytest.approx(5e-3)
    assert simulate(TINY, cpu, fsdp2).step_time_s == simulate(TINY, plain, fsdp2).step_time_s
    # The planner ranks it beside FSDP2, and the real run dispatches to its backend.
    assert ("fsdp", "fsdp2-twin") in program_shapes()
    choices = {(c.plan.strategy, c.plan.impl, c.plan.recompute): c
               for c in choose(TINY, h100, gpus=8, seq_len=512)}
    for rc in ("none", "full"):
        twin_choice, fsdp2_choice = (choices[("fsdp", impl, rc)]
                                     for impl in ("fsdp2-twin", "fsdp2"))
        assert twin_choice.result is not None and fsdp2_choice.result is not None
        assert twin_choice.result.step_time_s == fsdp2_choice.result.step_time_s
    assert program_module(plan).__name__ == "zsim.backend.fsdp2"
    # The error bands read its runs' labels back.
    assert label_program(plan.label) == ("fsdp[fsdp2-twin]", "plain", 1)


def _raw(name: str) -> dict[str, object]:
    data: dict[str, object] = yaml.safe_load((PROFILES_DIR / f"{name}.yaml").read_text())
    return data


def _h100() -> HardwareProfile:
    return HardwareProfile.from_dict(_raw("dgx-h100"), name="dgx-h100")
