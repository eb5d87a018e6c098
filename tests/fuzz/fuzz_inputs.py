"""Generated inputs for every way a user feeds zsim, and the oracle each must satisfy
(the fuzz campaign; tests/fuzz/test_fuzz.py runs a small profile, bench/fuzz.py
the 10,000-input campaign).

Targets (TARGETS): ModelSpec mappings, HardwareProfile mappings (mutations of a shipped
profile), Plan mappings, valid (model, hardware, plan) triples through the simulator,
scenario YAML text, HuggingFace config.json text, and `zsim` command lines. Each oracle
takes one generated input and either returns how it ended ("valid" or "rejected") or
raises: an AssertionError when an invariant fails, `Hang` when it runs past its time
bound, anything else is a crash. The rules:

- invalid input raises ConfigError naming the field (non-empty, in the one-line message);
- a valid plan gives a Result within TIME_BOUND_S whose invariants hold: peak >= the
  state at rest, exposed communication <= communication busy, step >= compute; more GPUs
  never raise the sharded state at rest (master copy and optimizer states); a plan that
  fits at micro-batch 2 fits at 1;
- a command line exits 0 with output, or 2 with exactly one line on stderr, never a
  traceback.

Values are mostly valid, with a share of wrong types, signs, sizes and non-finite
numbers (WEIRD) mixed in where a user could type them.
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import math
import signal
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import yaml
from hypothesis import strategies as st

from zsim.errors import ConfigError
from zsim.result import Result
from zsim.schedule.lower import state_at_rest_bytes
from zsim.simulate import simulate
from zsim.spec.hardware import HardwareProfile
from zsim.spec.hf_config import read_hf_config
from zsim.spec.model import ModelSpec
from zsim.spec.plan import Plan

REPO = Path(__file__).resolve().parents[2]
H100_DICT: dict[str, Any] = yaml.safe_load(
    (REPO / "hardware_profiles" / "dgx-h100.yaml").read_text())
TIME_BOUND_S = 20.0
"""Longest any one input may take (a simulated plan answers in about a second; the
bound is for a shared 2-core machine)."""


class Hang(Exception):
    """An input ran past TIME_BOUND_S."""


@contextlib.contextmanager
def time_bound(seconds: float = TIME_BOUND_S) -> Iterator[None]:
    """Raise Hang in the caller once `seconds` of wall time have passed (SIGALRM)."""
    def on_alarm(_sig: int, _frame: object) -> None:
        raise Hang(f"no answer within {seconds} s")

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


# ---------------------------------------------------------------------- values
WEIRD = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 0), st.integers(10**12, 10**20),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=6),
    st.lists(st.integers(0, 9), max_size=2),
    st.dictionaries(st.text(max_size=3), st.integers(0, 9), max_size=2))
"""Values a user should never get a traceback for."""


def one_in(n: int) -> st.SearchStrategy[bool]:
    """True with probability about 1/n. Hypothesis favours small integers and the first
    elements of sampled_from, so True comes last."""
    return st.sampled_from([False] * (n - 1) + [True])


def mostly(valid: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """`valid` four times in five, a WEIRD value otherwise."""
    return st.one_of(valid, valid, valid, valid, WEIRD)


def _corrupt(d: st.DataObject, base: dict[str, Any], where: str) -> dict[str, Any]:
    """Up to two values replaced by WEIRD ones; sometimes a key dropped or an unknown one
    added. About a third of the results stay valid."""
    out = dict(base)
    for key in d.draw(st.lists(st.sampled_from(sorted(out)), max_size=2, unique=True),
                      label=f"{where} corrupted"):
        out[key] = d.draw(WEIRD, label=f"{where}.{key}")
    if out and d.draw(one_in(10), label=f"{where} drop?"):
        out.pop(d.draw(st.sampled_from(sorted(out)), label=f"{where} dropped"))
    if d.draw(one_in(10), label=f"{where} add?"):
        out[d.draw(st.sampled_from(["nmu_layers", "hbm", "Strategy", "x"]))] = 1
    return out


# ---------------------------------------------------------------------- models
HEADS = st.sampled_from([1, 2, 4, 8, 12, 16, 32, 40, 64, 128])
HEAD_DIMS = st.sampled_from([8, 16, 32, 64, 80, 128])


@st.composite
def valid_models(draw: st.DrawFn, *, max_layers: int = 96) -> ModelSpec:
    """A model the constructor accepts, from 1 block of width 8 to 96 blocks of 16,384."""
    heads = draw(HEADS)
    kv = draw(st.sampled_from([h for h in (1, 2, 4, 8, heads) if heads % h == 0]))
    return ModelSpec(
        name=draw(st.sampled_from(["m", "fuzz model"])),
        num_layers=draw(st.integers(1, max_layers)), d_model=heads * draw(HEAD_DIMS),
        num_heads=heads, num_kv_heads=kv, ffn_hidden=draw(st.integers(1, 53_248)),
        mlp=draw(st.sampled_from(["swiglu", "gelu"])),
        norm=draw(st.sampled_from(["rmsnorm", "layernorm"])), bias=draw(st.booleans()),
        qkv_bias=draw(st.booleans()), vocab_size=draw(st.integers(1, 256_000)),
        tied_embeddings=draw(st.booleans()), learned_pos_emb=draw(st.booleans()),
        max_seq_len=draw(st.integers(1, 131_072)),
        attention_kernel=draw(st.sampled_from(["flash", "math"])),
        norm_kernel=draw(st.sampled_from(["fused", "composite"])),
        gqa_impl=draw(st.sampled_from(["enable_gqa", "repeat_kv"])),
        logits_upcast=draw(st.booleans()), extra_params=draw(st.integers(0, 10**6)))


@st.composite
def model_dicts(draw: st.DrawFn) -> dict[str, Any]:
    """ModelSpec fields as a scenario's `model:` mapping, values mostly valid."""
    return _corrupt(draw(st.data()), draw(valid_models()).to_dict(), "model")


def check_model_dict(data: dict[str, Any]) -> str:
    return _expect_config_error(lambda: ModelSpec.from_dict(data, where="model"))


# ---------------------------------------------------------------------- hardware
def _hw_leaves(tree: dict[str, Any], prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    out: list[tuple[str, ...]] = []
    for k, v in tree.items():
        out += _hw_leaves(v, (*prefix, k)) if isinstance(v, dict) else [(*prefix, k)]
    return out


HW_LEAVES = _hw_leaves(H100_DICT)
AMOUNTS = st.one_of(st.floats(1e-9, 1e9), st.integers(0, 10**6))
"""Rates, sizes and times across 18 decades (0 where a key allows it)."""
FRACTIONS = st.floats(0.0, 1.0)
"""Efficiencies and slowdowns."""


@st.composite
def hardware_dicts(draw: st.DrawFn, *, valid_only: bool = False) -> dict[str, Any]:
    """The DGX H100 profile with 1-4 leaves changed (numbers across 18 decades, or WEIRD
    values unless `valid_only`), sometimes a key dropped or added."""
    data = copy.deepcopy(H100_DICT)
    for path in draw(st.lists(st.sampled_from(HW_LEAVES), min_size=1, max_size=4)):
        node = data
        for k in path[:-1]:
            node = node[k]
        old = node[path[-1]]
        if isinstance(old, (int, float)) and not isinstance(old, bool):
            numbers = FRACTIONS if old <= 1 else AMOUNTS
            value = draw(numbers if valid_only else mostly(numbers))
        elif path[-1] == "launch":
            value = draw(st.sampled_from(["async", "synchronous"]) if valid_only
                         else mostly(st.sampled_from(["async", "synchronous"])))
        else:
            value = old if valid_only else draw(mostly(st.just(old)))
        node[path[-1]] = value
    if valid_only or draw(st.booleans()):
        return data
    d = draw(st.data())
    section = draw(st.sampled_from(["", "gpu", "node", "intra_node", "efficiency", "host"]))
    if section:
        data[section] = _corrupt(d, data[section], section)
    else:
        data = _corrupt(d, data, "hardware")
    return data


def check_hardware_dict(data: dict[str, Any]) -> str:
    return _expect_config_error(lambda: HardwareProfile.from_dict(data, name="fuzz"))


@st.composite
def valid_hardware(draw: st.DrawFn) -> HardwareProfile:
    """A profile the loader accepts (draws it rejects are redrawn)."""
    for _ in range(20):
        try:
            return HardwareProfile.from_dict(draw(hardware_dicts(valid_only=True)),
                                             name="fuzz")
        except ConfigError:
            continue
    return HardwareProfile.from_dict(H100_DICT, name="dgx-h100")


# ---------------------------------------------------------------------- plans
STRATEGIES = ["ddp", "zero1", "zero2", "zero3", "fsdp", "fsdp-no-reshard", "hsdp"]
DTYPE_NAMES = ["bf16", "fp16", "fp32"]


@st.composite
def plan_knobs(draw: st.DrawFn, *, max_layers: int, max_accum: int = 8) -> dict[str, Any]:
    """Plan fields other than the strategy and degrees, across their whole valid ranges."""
    precision = draw(st.sampled_from(DTYPE_NAMES))
    return {
        "micro_batch": draw(st.one_of(st.integers(1, 4), st.integers(1, 10**6))),
        "grad_accum": draw(st.integers(1, max_accum)),
        "seq_len": draw(st.one_of(st.sampled_from([128, 2048, 4096, 8192]),
                                  st.integers(1, 10**6))),
        "recompute": draw(st.sampled_from(["none", "selective", "full"])),
        "unit_size": draw(st.integers(1, max_layers)),
        "prefetch": draw(st.integers(0, 4)),
        "bucket_bytes": draw(st.one_of(st.just(25 * 2**20), st.integers(1, 2**36))),
        "param_dtype": precision,
        "grad_dtype": precision,
        "reduce_dtype": draw(st.sampled_from(DTYPE_NAMES)),
        "master_dtype": draw(st.sampled_from(["fp32", precision])),
        "optimizer": draw(st.sampled_from(["adamw", "sgd", "adamw8bit"])),
        "optimizer_state_dtype": draw(st.sampled_from(DTYPE_NAMES)),
        "offload": draw(st.sampled_from(["none", "none", "optimizer", "params"])),
    }


@st.composite
def plan_dicts(draw: st.DrawFn) -> dict[str, Any]:
    """Plan fields as a mapping (Plan.from_dict), values mostly valid."""
    base = {"strategy": draw(st.sampled_from(STRATEGIES)),
            "dp_shard": draw(st.integers(1, 4096)), "dp_replicate": draw(st.integers(1, 64)),
            **draw(plan_knobs(max_layers=8))}
    return _corrupt(draw(st.data()), base, "plan")


def check_plan_dict(data: dict[str, Any]) -> str:
    return _expect_config_error(lambda: Plan.from_dict(data))


# ---------------------------------------------------------------------- simulation
GPU_COUNTS = st.one_of(st.sampled_from([1, 2, 8, 16, 64, 128, 1024, 65_536]),
                       st.integers(1, 2**24))


@st.composite
def triples(draw: st.DrawFn) -> tuple[ModelSpec, HardwareProfile, dict[str, Any]]:
    """(model, hardware, Plan.for_strategy arguments), each valid on its own; the
    combination may still break a cross-object rule (simulate raises ConfigError)."""
    model = draw(valid_models(max_layers=48))
    hw = draw(st.one_of(st.just(HardwareProfile.from_dict(H100_DICT, name="dgx-h100")),
                        valid_hardware()))
    gpus = draw(GPU_COUNTS)
    strategy = draw(st.sampled_from(STRATEGIES))
    group = None
    if strategy == "hsdp":
        group = draw(st.sampled_from([g for g in (1, 2, 4, 8, gpus) if gpus % g == 0]))
    knobs = draw(plan_knobs(max_layers=model.num_layers, max_accum=4))
    return model, hw, {"strategy": strategy, "gpus": gpus, "shard_group": group, **knobs}


def check_triple(triple: tuple[ModelSpec, HardwareProfile, dict[str, Any]]) -> str:
    model, hw, args = triple
    try:
        plan = Plan.for_strategy(**args)
        result = simulate(model, hw, plan)
    except ConfigError as e:
        _check_error(e)
        return "rejected"
    check_result(model, hw, plan, result)
    return "valid"


def check_result(model: ModelSpec, hw: HardwareProfile, plan: Plan, r: Result) -> None:
    """The invariants every Result holds."""
    assert r.peak_memory_bytes >= r.baseline_memory_bytes, "peak below the state at rest"
    assert r.fits == (r.oom is None)
    if r.simulated:
        assert r.step_time_s is not None and r.compute_time_s is not None
        assert r.exposed_comm_s is not None and r.comm_busy_total_s is not None
        eps = 1e-9 * r.step_time_s + 1e-12
        assert r.step_time_s >= r.compute_time_s - eps, "step shorter than its compute"
        assert 0 <= r.exposed_comm_s <= r.comm_busy_total_s + eps, \
            "exposed communication above communication busy"
        assert r.end_memory_bytes == r.baseline_memory_bytes
        assert math.isfinite(r.step_time_s) and r.step_time_s >= 0
    else:
        assert not r.fits and r.step_time_s is None
    if plan.shards_optimizer:
        # More GPUs in the shard group never raise the sharded state at rest (the master
        # copy and optimizer states; DeepSpeed's replicated flat parameters are padded to
        # 2 x N elements, which can grow with N on a model smaller than that).
        def sharded(p: Plan) -> float:
            state = state_at_rest_bytes(model, p)
            return state.get("master_params", 0.0) + state.get("optimizer_states", 0.0)

        assert sharded(plan.with_(dp_shard=plan.dp_shard * 2)) <= sharded(plan), \
            "more GPUs raised the sharded state"
    if plan.micro_batch == 2 and r.fits:
        smaller = simulate(model, hw, plan.with_(micro_batch=1), fit_only=True)
        assert smaller.fits, "fits at micro-batch 2 but not at 1"


# ---------------------------------------------------------------------- scenarios
SCENARIO = {"name": "fuzz", "model": "7b", "hardware": "dgx-h100", "gpus": 64,
            "seq_len": 2048, "plans": {"fsdp": {"strategy": "fsdp"},
                                       "hsdp": {"strategy": "hsdp", "shard_group": 8}},
            "sweep": {"micro_batch": [1, 2]}}
SCENARIO_TEXT = yaml.safe_dump(SCENARIO, sort_keys=False)


@st.composite
def scenario_texts(draw: st.DrawFn) -> str:
    """Scenario YAML: a valid one with valid settings and sweeps drawn, the same with
    values replaced, or its text cut, spliced and typo'd (broken YAML, duplicate keys,
    tabs, stray colons)."""
    if draw(st.booleans()):
        data = copy.deepcopy(SCENARIO)
        data["model"] = draw(st.sampled_from(["125m", "1.3b", "7b", "13b"]))
        data["gpus"] = draw(st.sampled_from([8, 16, 64]))
        data["plans"]["fsdp"].update(draw(st.fixed_dictionaries({}, optional={
            "unit_size": st.integers(1, 4), "prefetch": st.integers(0, 2),
            "recompute": st.sampled_from(["none", "selective", "full"]),
            "grad_accum": st.integers(1, 3), "offload": st.sampled_from(["none", "optimizer"]),
            "bucket_mib": st.floats(0.001, 1000)})))
        data["sweep"] = draw(st.dictionaries(
            st.sampled_from(["micro_batch", "seq_len", "precision"]),
            st.lists(st.sampled_from([1, 2, 512]), min_size=1, max_size=2, unique=True),
            min_size=1, max_size=2))
        if "precision" in data["sweep"]:
            data["sweep"]["precision"] = ["bf16", "fp32"]
        if draw(st.booleans()):  # the sweep language: a range, a zip group, a filter
            data["sweep"]["gpus"] = {"from": 8, "to": draw(st.sampled_from([8, 64, 100])),
                                     "times": 2}
            data["sweep"]["zip"] = {"prefetch": [0, 1], "unit_size": [1, 2]}
            data["where"] = draw(st.sampled_from(
                ["gpus >= 8", "gpus * unit_size <= 64 or strategy == 'fsdp'",
                 "not (prefetch == 0 and gpus > 8)", "micro_batch % 2 == 1 or gpus < 64"]))
        return yaml.safe_dump(data, sort_keys=False)
    if not draw(one_in(3)):
        data = copy.deepcopy(SCENARIO)
        for key in draw(st.lists(st.sampled_from(
                ["name", "model", "hardware", "gpus", "seq_len", "plans", "sweep", "report",
                 "precision", "unit_size", "bucket_mib", "description", "where",
                 "inter_node_gb_per_s"]), max_size=2)):
            data[key] = draw(st.one_of(WEIRD, st.sampled_from(
                ["13b", "nope", "x.json", "../../etc/passwd", "!!python/object:os.system",
                 "dgx-a100", "hw.yaml", {"micro_batch": [0, 1]}, {"gpus": [8, 8]},
                 {"fsdp": {"strategy": "zero4"}}, {"template": "../README.md"},
                 {"memory_curves": ["nope"]}, "gpus ** 999", "__import__('os')",
                 "gpus / (gpus - 64) > 0", "'a' * 99999999999 == ''", "gpus >\n 8",
                 {"gpus": {"from": 8, "to": 1e300, "times": 1.0000001}},
                 {"gpus": {"from": 1e-300, "to": 1e300, "times": 1e300}},
                 {"zip": [{"gpus": [8]}, {"gpus": [16]}]}, {"zip": {"prefetch": [[0]]}},
                 {"figures": ["heatmap"], "heatmap": {"x": "gpus", "y": [], "value": 1}},
                 {"gantt": "fsdp micro_batch=1", "figures": ["gantt"]}])), label=key)
        return yaml.safe_dump(data, sort_keys=False)
    text = SCENARIO_TEXT
    for _ in range(draw(st.integers(1, 3))):
        i = draw(st.integers(0, len(text)))
        edit = draw(st.sampled_from(["cut", "insert", "dup"]))
        if edit == "cut":
            text = text[:i] + text[i + draw(st.integers(1, 12)):]
        elif edit == "insert":
            text = text[:i] + draw(st.sampled_from(
                [":", "\t", "- ", "{", "]", "&a ", "*a", "!!python/name:os.system ", "\n  ",
                 "'", "gpus: 8\n", "0", "e9", "-1"])) + text[i:]
        else:
            line = draw(st.sampled_from(text.splitlines() or [""]))
            text = text[:i] + line + "\n" + text[i:]
    return text


def check_scenario_text(text: str) -> str:
    from zsim.scenario import load_scenario

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "fuzz.yaml"
        path.write_text(text)
        try:
            scenario = load_scenario(path)
        except ConfigError as e:
            _check_error(e)
            return "rejected"
    run = scenario.runs[0]
    check_result(run.model, run.hardware, run.plan,
                 simulate(run.model, run.hardware, run.plan))
    return "valid"


# ---------------------------------------------------------------------- HF config.json
LLAMA_CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
                "hidden_size": 4096,
                "intermediate_size": 11008, "num_attention_heads": 32,
                "num_hidden_layers": 32, "num_key_value_heads": 32, "vocab_size": 32000,
                "max_position_embeddings": 4096, "tie_word_embeddings": False,
                "attention_bias": False, "mlp_bias": False, "head_dim": 128}


@st.composite
def hf_config_texts(draw: st.DrawFn) -> str:
    """config.json text: Llama-2-7B's with values mostly replaced, or not JSON at all."""
    if draw(one_in(10)):
        return draw(st.one_of(st.text(max_size=40), st.just("[1, 2]"), st.just("")))
    data = dict(LLAMA_CONFIG)
    for key in draw(st.lists(st.sampled_from(sorted(LLAMA_CONFIG)), max_size=4)):
        data[key] = draw(st.one_of(WEIRD, st.integers(1, 300_000)), label=key)
    data = _corrupt(draw(st.data()), data, "config")
    return json.dumps(data, allow_nan=True)


def check_hf_config_text(text: str) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "config.json"
        path.write_text(text)
        return _expect_config_error(lambda: read_hf_config(path))


# ---------------------------------------------------------------------- command lines
def _flag(valid: list[str], invalid: list[str]) -> st.SearchStrategy[str]:
    """A flag's value: valid three times in four."""
    return st.one_of(st.sampled_from(valid), st.sampled_from(valid), st.sampled_from(valid),
                     st.sampled_from(invalid))


FLAG_VALUES: dict[str, st.SearchStrategy[str]] = {
    "--model": _flag(["13b", "7b", "70b", "125m", "1.3b"], ["nope", "", "x.json"]),
    "--params": _flag(["7e9", "1e8", "13000000000"],
                      ["1", "0", "-5", "nan", "inf", "1e30", "1.5", "x"]),
    "--gpus": _flag(["1", "8", "64", "128", "1024", "1048576"],
                    ["0", "-8", "1.5", "x", "99999999999999999999"]),
    "--strategy": _flag(STRATEGIES, ["zero4", ""]),
    "--shard-group": _flag(["8", "16"], ["1", "3", "0", "x"]),
    "--hardware": _flag(["dgx-h100", "dgx-a100", "pcie-a100", "hgx-h200"],
                        ["nope", "/dev/null.yaml"]),
    "--seq": _flag(["512", "2048", "4096", "8192"], ["1000000", "1", "0", "-1", "x"]),
    "--micro-batch": _flag(["1", "2", "4"], ["4096", "100000", "0", "x"]),
    "--grad-accum": _flag(["1", "2", "4"], ["0", "x"]),
    "--ac": _flag(["none", "selective", "full"], ["some"]),
    "--precision": _flag(["bf16", "fp32"], ["fp8"]),
    "--offload": _flag(["none", "optimizer", "params"], ["disk"]),
    "--format": _flag(["table", "json", "csv"], ["xml"]),
    "--fit-only": st.just(""),
    "--bogus": st.just("1"),
}
COMMAND_FLAGS = {
    "simulate": ["--model", "--gpus", "--strategy", "--shard-group", "--hardware", "--seq",
                 "--micro-batch", "--grad-accum", "--ac", "--precision", "--offload",
                 "--format", "--fit-only"],
    "plan": ["--model", "--params", "--gpus", "--hardware", "--seq", "--micro-batch",
             "--grad-accum", "--precision", "--format"],
}


@st.composite
def command_lines(draw: st.DrawFn) -> list[str]:
    """`zsim simulate|plan` with a random subset of its flags (and a misspelt one)."""
    command = draw(st.sampled_from(sorted(COMMAND_FLAGS)))
    flags = draw(st.lists(st.sampled_from(COMMAND_FLAGS[command]), unique=True, max_size=5))
    if draw(one_in(20)):
        flags.append("--bogus")
    required = ["--model", "--gpus", "--strategy"] if command == "simulate" else ["--gpus"]
    for flag in required:
        if flag not in flags and not draw(one_in(10)):
            flags.append(flag)
    argv = [command]
    for flag in flags:
        value = draw(FLAG_VALUES[flag])
        argv += [flag] if flag == "--fit-only" else [flag, value]
    return argv


def check_command_line(argv: list[str]) -> str:
    """Run the console entry point in this process; exit 0 with output, or exit 2 with
    one line on stderr."""
    from zsim.cli import main

    out, err = io.StringIO(), io.StringIO()
    saved = sys.argv
    sys.argv = ["zsim", *argv]
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            main()
        code: object = 0
    except SystemExit as e:
        code = e.code
    finally:
        sys.argv = saved
    stderr = err.getvalue()
    assert "Traceback" not in stderr, stderr
    if code == 0:
        assert out.getvalue().strip(), f"{argv}: exit 0 without output"
        return "valid"
    assert code == 2, f"{argv}: exit {code}: {stderr}"
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), f"{argv}: {stderr!r}"
    return "rejected"


# ---------------------------------------------------------------------- user configs
CONFIG_DIR = REPO / "scenarios" / "configs"
CONFIG_MODEL = "125m"
"""The model a config is simulated with (its hidden size, 768, resolves the "auto"s)."""
CONFIG_SEQ = 512
CONFIG_GPUS = st.sampled_from([8, 16, 64, 1, 2, 12, 4096])
MAX_MESSAGE = 2000
"""Longest error message a config may cause (a YAML alias bomb must not be spelt out)."""
SIZES = st.one_of(st.sampled_from([500_000_000, 5e8, 2e8, 1e9, 50_000_000, 1e7]),
                  st.integers(1, 2**40))
"""Element counts as ds_config.json spells them (integral floats included)."""
GARBAGE = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-9, 9), st.text(max_size=4)),
    lambda inner: st.one_of(st.lists(inner, max_size=3),
                            st.dictionaries(st.text(max_size=4), inner, max_size=3)),
    max_leaves=8)
"""Nested lists and mappings where a value or a section belongs."""
MAX_ACCUM = 64
"""Most micro-batches per step a generated DeepSpeed config asks for. The simulator
lowers every micro-batch (about 15 ms each for the 125m model: 1,000 take 16 s, past
TIME_BOUND_S), with or without a config (`zsim simulate --grad-accum 1000`): a limit of
the engine, not of the readers, so batch keys never get huge values here."""
NOT_SIZES = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 0), st.text(max_size=6),
    st.sampled_from([float("nan"), float("inf"), -1.5, 0.5]),
    st.lists(st.integers(0, 9), max_size=2))
"""WEIRD values that are not positive numbers."""
BOUNDED_WEIRD = {
    "train_batch_size": st.one_of(NOT_SIZES, st.integers(1, MAX_ACCUM)),
    "train_micro_batch_size_per_gpu": st.one_of(NOT_SIZES, st.integers(1, MAX_ACCUM)),
    "gradient_accumulation_steps": st.one_of(NOT_SIZES, st.integers(1, MAX_ACCUM)),
    "allgather_bucket_size": st.one_of(NOT_SIZES, st.integers(1, 10**20)),
}
"""What replaces the values of DeepSpeed keys whose huge or tiny numbers would run into
the engine's limit above (MAX_ACCUM)."""
ConfigCase = tuple[str | bytes, int]
"""A config file's content (bytes where it is not UTF-8) and the GPUs it runs on."""


def _tree_paths(tree: dict[Any, Any], prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """The key path of every value in a nest of mappings, sections included."""
    out: list[tuple[Any, ...]] = []
    for k, v in tree.items():
        out.append((*prefix, k))
        if isinstance(v, dict):
            out += _tree_paths(v, (*prefix, k))
    return out


@st.composite
def _mutated(draw: st.DrawFn, tree: dict[str, Any], *,
             impossible: st.SearchStrategy[Any], unknown: list[tuple[tuple[str, ...], Any]],
             bounded: dict[str, st.SearchStrategy[Any]] | None = None) -> dict[str, Any]:
    """`tree` with one to three edits: a value replaced by a WEIRD, impossible or nested
    garbage one (drawn from `bounded` for its keys), a key dropped, or an unknown key
    added (where its section exists)."""
    out = copy.deepcopy(tree)
    for _ in range(draw(st.integers(1, 3))):
        edit = draw(st.sampled_from(["weird", "impossible", "impossible", "garbage", "drop",
                                     "unknown"]))
        if edit == "unknown":
            section, key = draw(st.sampled_from(unknown))
            node: Any = out
            for k in section:
                node = node.get(k) if isinstance(node, dict) else None
            if isinstance(node, dict):
                node[key] = draw(st.one_of(st.just(1), WEIRD))
            continue
        paths = _tree_paths(out)
        if not paths:
            continue
        path = draw(st.sampled_from(paths))
        parent = out
        for k in path[:-1]:
            parent = parent[k]
        if edit == "drop":
            del parent[path[-1]]
        elif bounded and path[-1] in bounded:
            parent[path[-1]] = draw(bounded[path[-1]])
        else:
            parent[path[-1]] = draw({"weird": WEIRD, "impossible": impossible,
                                     "garbage": GARBAGE}[edit])
    return out


@st.composite
def _mangled(draw: st.DrawFn, text: str, inserts: list[str]) -> str:
    """`text` cut, spliced with `inserts` and with lines duplicated, one to three times."""
    for _ in range(draw(st.integers(1, 3))):
        i = draw(st.integers(0, len(text)))
        edit = draw(st.sampled_from(["cut", "insert", "dup", "truncate"]))
        if edit == "cut":
            text = text[:i] + text[i + draw(st.integers(1, 12)):]
        elif edit == "insert":
            text = text[:i] + draw(st.sampled_from(inserts)) + text[i:]
        elif edit == "dup":
            line = draw(st.sampled_from(text.splitlines() or [""]))
            text = text[:i] + line + "\n" + text[i:]
        else:
            text = text[:i]
    return text


BROKEN_FILES = st.sampled_from([
    "", " ", "null", "[]", "1", '"FSDP"', b"\xff\xfe{\x00", b'{"a": "\xc3\x28"}'])
"""Contents no config reader can use: empty, not a mapping, not UTF-8."""


def _config_case(draw: st.DrawFn, valid: Callable[[int], st.SearchStrategy[dict[str, Any]]],
                 invalid: Callable[[dict[str, Any]], st.SearchStrategy[dict[str, Any]]],
                 dump: Callable[[dict[str, Any]], str],
                 text: Callable[[str], st.SearchStrategy[str | bytes]]) -> ConfigCase:
    """A config on a GPU count: valid half the time, else mutated, else broken text."""
    gpus = draw(CONFIG_GPUS)
    config = draw(valid(gpus))
    mode = draw(st.sampled_from(["valid", "valid", "valid", "mutated", "mutated", "text"]))
    if mode == "valid":
        return dump(config), gpus
    if mode == "mutated":
        return dump(draw(invalid(config))), gpus
    return draw(st.one_of(text(dump(config)), BROKEN_FILES)), gpus


# DeepSpeed JSON
DS_OFFLOAD = st.fixed_dictionaries(
    {"device": st.sampled_from(["cpu", "nvme", "none"])},
    optional={"pin_memory": st.booleans(), "nvme_path": st.just("/local_nvme"),
              "buffer_count": st.integers(1, 8), "fast_init": st.booleans()})
DS_PRECISION = {
    "bf16": {"bf16": {"enabled": True}},
    "fp16": {"fp16": {"enabled": True, "loss_scale": 0, "initial_scale_power": 16}},
    "fp32": {"bf16": {"enabled": False}, "fp16": {"enabled": False}},
    "auto": {"bf16": {"enabled": "auto"}, "fp16": {"enabled": "auto", "hysteresis": 2}},
    "unset": {},
}
"""How configs spell each precision (the HF guide's "auto" for both)."""
DS_IMPOSSIBLE = st.sampled_from([4, -1, 0, "3", 2.5, "auto", "gpu", 1e30, float("nan"),
                                 10**30, True, "bf16", {"device": "gpu"}, [], {}])
DS_UNKNOWN: list[tuple[tuple[str, ...], Any]] = [
    ((), "zero_optimisation"), ((), "activation_checkpointing"),
    (("zero_optimization",), "stage3_prefetch_bucket"),
    (("zero_optimization",), "offload_params"), (("zero_optimization",), "cpu_offload"),
    (("zero_optimization",), "zero_hpz_partition_size"),
    (("zero_optimization", "offload_optimizer"), "devices"),
    (("zero_optimization", "offload_param"), "ratio"), (("bf16",), "enable"),
    (("fp16",), "loss_scale_window"), (("optimizer",), "type")]
"""Keys a config may gain (a typo, an unmodelled or unknown key), by section."""


@st.composite
def ds_config_dicts(draw: st.DrawFn, gpus: int) -> dict[str, Any]:
    """A ds_config.json as users write them: stages 0-3 (0 is refused), bucket sizes,
    overlap_comm, offload to cpu/nvme, "auto" values, bf16/fp16, batch sizes that mostly
    agree with `gpus`."""
    stage = draw(st.sampled_from([2, 3, 1, 0]))
    zero: dict[str, Any] = {"stage": stage, **draw(st.fixed_dictionaries({}, optional={
        "reduce_bucket_size": st.one_of(SIZES, st.just("auto")),
        "allgather_bucket_size": st.one_of(SIZES, st.just(1)),
        "overlap_comm": st.booleans(),
        "contiguous_gradients": st.booleans(), "reduce_scatter": st.just(True),
        "round_robin_gradients": st.booleans(), "sub_group_size": SIZES,
        "stage3_gather_16bit_weights_on_model_save": st.booleans()}))}
    if stage == 3:
        zero.update(draw(st.fixed_dictionaries({}, optional={
            "stage3_prefetch_bucket_size": st.one_of(SIZES, st.just("auto")),
            "stage3_param_persistence_threshold": st.one_of(st.integers(0, 10**7),
                                                            st.just("auto")),
            "stage3_max_live_parameters": SIZES, "stage3_max_reuse_distance": SIZES})))
    if draw(one_in(3)):
        zero["offload_optimizer"] = draw(DS_OFFLOAD)
        if stage == 3 and draw(st.booleans()):
            zero["offload_param"] = draw(DS_OFFLOAD)
    config: dict[str, Any] = {"zero_optimization": zero}
    config.update(DS_PRECISION[draw(st.sampled_from(sorted(DS_PRECISION)))])
    micro = draw(st.sampled_from(["auto", 1, 2, 4, None]))
    accum = draw(st.sampled_from(["auto", 1, 2, None]))
    for key, value in (("train_micro_batch_size_per_gpu", micro),
                       ("gradient_accumulation_steps", accum)):
        if value is not None:
            config[key] = value
    train = draw(st.sampled_from(["unset", "auto", "product", "any"]))
    if train == "auto":
        config["train_batch_size"] = "auto"
    elif train == "product":
        config["train_batch_size"] = ((micro if isinstance(micro, int) else 1)
                                      * (accum if isinstance(accum, int) else 1) * gpus)
    elif train == "any":
        config["train_batch_size"] = draw(st.integers(1, MAX_ACCUM))
    config.update(draw(st.fixed_dictionaries({}, optional={
        "optimizer": st.fixed_dictionaries(
            {"type": st.sampled_from(["AdamW", "Adam", "SGD", "Lion"]),
             "params": st.just({"lr": "auto", "weight_decay": "auto"})}),
        "communication_data_type": st.sampled_from(["fp32", "bf16", "fp16", "bfp16"]),
        "gradient_clipping": st.sampled_from(["auto", 1.0]),
        "steps_per_print": st.integers(1, 2000), "wall_clock_breakdown": st.booleans()})))
    return config


def _ds_text(text: str) -> st.SearchStrategy[str | bytes]:
    """A config's JSON broken: cut, spliced, nested past any parser's depth."""
    return st.one_of(
        _mangled(text, [",", "}", "{", "]", '"', ":", "NaN", "-Infinity", "1e999", "//",
                        '"stage": 3,', "\x00", "\ud800"]),
        st.just('{"zero_optimization": ' * 100_000), st.just("[" * 100_000 + "]" * 100_000))


@st.composite
def ds_config_cases(draw: st.DrawFn) -> ConfigCase:
    """A DeepSpeed config file's content and the GPUs it is simulated on."""
    return _config_case(
        draw, ds_config_dicts,
        lambda c: _mutated(c, impossible=DS_IMPOSSIBLE, unknown=DS_UNKNOWN,
                           bounded=BOUNDED_WEIRD),
        lambda c: json.dumps(c, allow_nan=True), _ds_text)


def check_ds_config_case(case: ConfigCase) -> str:
    return _check_config_file("ds_config", "ds_config.json", *case)


# accelerate FSDP YAML
FSDP_IMPOSSIBLE = st.sampled_from([
    "DEEPSPEED", 3, 0, -1, 2.0, "ZERO3", "NO_SHARD", "HYBRID_SHARD_ZERO2", "BACKWARD_AFTER",
    "sometimes", "fp8", "yes", True, None, 10**30, float("inf"), {"fsdp_version": 2}, []])
FSDP_UNKNOWN: list[tuple[tuple[str, ...], Any]] = [
    ((), "fsdp_confg"), ((), "fsdp_version"), ((), "deepspeed_config"), ((), 7),
    (("fsdp_config",), "fsdp_limit_all_gather"), (("fsdp_config",), "sharding_strategy"),
    (("fsdp_config",), 1), (("fsdp_config",), None),
    (("parallelism_config",), "parallelism_config_tp_size")]
"""Keys a config may gain: top-level (accelerate rejects them), under fsdp_config
(ignored, warned), non-string keys."""
FSDP_FLAGS = st.sampled_from([False, True, "true", "false"])
"""accelerate writes booleans; `accelerate launch` passes them on as strings."""


@st.composite
def fsdp_config_dicts(draw: st.DrawFn, gpus: int) -> dict[str, Any]:
    """An accelerate FSDP config as `accelerate config` writes it: FSDP1 with a sharding
    strategy (by name, number or under fsdp_reshard_after_forward) and prefetch, FSDP2
    with reshard_after_forward, offload, recomputation, wrap policy, mixed precision,
    sometimes parallelism_config's replicas and keys without the fsdp_ prefix."""
    version = draw(st.sampled_from([1, 2, None]))
    fsdp: dict[str, Any] = {} if version is None else {"fsdp_version": version}
    if version == 2:
        fsdp.update(draw(st.fixed_dictionaries({}, optional={
            "fsdp_reshard_after_forward": FSDP_FLAGS,
            "fsdp_offload_params": st.booleans()})))
    else:
        key = draw(st.sampled_from(["fsdp_sharding_strategy", "fsdp_reshard_after_forward",
                                    "unset"]))
        if key != "unset":
            fsdp[key] = draw(st.sampled_from(["FULL_SHARD", "SHARD_GRAD_OP", "HYBRID_SHARD",
                                              "full_shard", 1, 2, 4, "NO_SHARD"]))
        fsdp.update(draw(st.fixed_dictionaries({}, optional={
            "fsdp_backward_prefetch": st.sampled_from(["BACKWARD_PRE", "BACKWARD_POST",
                                                       "NO_PREFETCH", "backward_pre"]),
            "fsdp_forward_prefetch": FSDP_FLAGS})))
    fsdp.update(draw(st.fixed_dictionaries({}, optional={
        "fsdp_activation_checkpointing": FSDP_FLAGS,
        "fsdp_auto_wrap_policy": st.sampled_from(["TRANSFORMER_BASED_WRAP", "SIZE_BASED_WRAP",
                                                  "NO_WRAP"]),
        "fsdp_transformer_layer_cls_to_wrap": st.just("LlamaDecoderLayer"),
        "fsdp_min_num_params": st.integers(0, 10**8),
        "fsdp_state_dict_type": st.sampled_from(["SHARDED_STATE_DICT", "FULL_STATE_DICT"]),
        "fsdp_use_orig_params": st.booleans(), "fsdp_cpu_ram_efficient_loading": st.booleans(),
        "fsdp_sync_module_states": st.booleans(),
        "fsdp_activation_checkpointing_offload": st.booleans()})))
    if draw(one_in(5)):
        fsdp = {k.removeprefix("fsdp_"): v for k, v in fsdp.items()}
    config: dict[str, Any] = {"compute_environment": "LOCAL_MACHINE",
                              "distributed_type": "FSDP", "fsdp_config": fsdp}
    config.update(draw(st.fixed_dictionaries({}, optional={
        "mixed_precision": st.sampled_from(["bf16", "no", "fp16"]),
        "num_processes": st.sampled_from([gpus, 8, 1]), "num_machines": st.integers(1, 4),
        "machine_rank": st.just(0), "debug": st.booleans(), "downcast_bf16": st.just("no"),
        "main_training_function": st.just("main"),
        "rdzv_backend": st.sampled_from(["static", "c10d"]), "same_network": st.booleans(),
        "tpu_env": st.just([]), "use_cpu": st.just(False),
        "main_process_port": st.integers(1024, 65535)})))
    if draw(one_in(4)):
        config["parallelism_config"] = {
            "parallelism_config_dp_replicate_size": draw(st.sampled_from([1, 2, 4, 3, 8])),
            "parallelism_config_dp_shard_size": draw(st.sampled_from([1, 2, 8]))}
    return config


YAML_ALIAS_BOMB = "".join(
    f"  {k}: &{k} [{', '.join([f'*{p}' if p else 'lol'] * 9)}]\n"
    for p, k in zip(["", *"abcdef"], "abcdefg", strict=True))
"""Anchors nesting nine to the seventh power strings in seven indented lines (an alias
is a reference: it loads at once, and spelt out takes 28 MB)."""


def _fsdp_text(text: str) -> st.SearchStrategy[str | bytes]:
    """A config's YAML broken: cut and spliced (tabs, anchors, tags, non-string and
    unhashable keys), nested past the parser's depth, or aliases expanding to 4.8 million values."""
    return st.one_of(
        _mangled(text, [":", "\t", "- ", "{", "]", "&a ", "*a", "!!python/name:os.system ",
                        "\n  ", "'", "? [1, 2]\n: 3\n", "1: x\n", "<<: *a\n", "~", "yes",
                        "fsdp_version: 2\n", "distributed_type: FSDP\n", "\x85", "\ufeff"]),
        st.just(text + "lol:\n" + YAML_ALIAS_BOMB),
        st.just("distributed_type: FSDP\ntpu_env:\n" + YAML_ALIAS_BOMB + "fsdp_config: *g\n"),
        st.just("distributed_type: FSDP\nfsdp_config: " + "[" * 600 + "]" * 600 + "\n"))


@st.composite
def fsdp_config_cases(draw: st.DrawFn) -> ConfigCase:
    """An accelerate FSDP config file's content and the GPUs it is simulated on."""
    return _config_case(
        draw, fsdp_config_dicts,
        lambda c: _mutated(c, impossible=FSDP_IMPOSSIBLE, unknown=FSDP_UNKNOWN),
        lambda c: yaml.safe_dump(c, sort_keys=False), _fsdp_text)


def check_fsdp_config_case(case: ConfigCase) -> str:
    return _check_config_file("fsdp_config", "accelerate.yaml", *case)


def _check_config_file(flag: str, name: str, content: str | bytes, gpus: int) -> str:
    """Read a config as `zsim simulate --ds-config/--fsdp-config` does and simulate its
    plan: rejected with a ConfigError naming the field and the file in one short line,
    or a Result whose invariants hold."""
    from zsim.spec.registry import resolve_hardware, resolve_model
    from zsim.spec.user_config import config_plan

    model, hw = resolve_model(CONFIG_MODEL), resolve_hardware("dgx-h100")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / name
        path.write_bytes(content.encode(errors="surrogatepass") if isinstance(content, str)
                         else content)
        configs = {"ds_config": None, "fsdp_config": None, flag: path}
        try:
            plan, _ = config_plan(model, hw, gpus=gpus, seq=CONFIG_SEQ, **configs)
        except ConfigError as e:
            _check_error(e)
            assert str(path) in str(e), f"the file is not named: {e}"
            assert len(str(e)) <= MAX_MESSAGE, f"a {len(str(e)):,}-character message"
            return "rejected"
    check_result(model, hw, plan, simulate(model, hw, plan))
    return "valid"


# command lines with configs
CONFIG_FILE = "@config"
"""Stands in a command line for the generated config file (written by the oracle)."""
CONFIG_FLAG_VALUES: dict[str, st.SearchStrategy[str]] = {
    **FLAG_VALUES,
    "--model": _flag(["125m", "1.3b", "7b"], ["nope", "x.json"]),
    "--gpus": _flag(["8", "16", "64", "1"], ["0", "-8", "x"]),
    "--impl": _flag(["torch", "deepspeed", "fsdp1", "fsdp2"], ["fsdp3", "", "DeepSpeed"]),
    "--strategy": _flag(["zero3", "zero3", *STRATEGIES], ["zero4", ""]),
    "--precision": _flag(["bf16", "fp16", "fp32"], ["fp8"]),
    "--shard-group": _flag(["8", "4"], ["3", "0"]),
}
SHIPPED = {"--ds-config": sorted(str(p) for p in CONFIG_DIR.glob("ds_*.json")),
           "--fsdp-config": sorted(str(p) for p in CONFIG_DIR.glob("accelerate_*.yaml"))}
CONFIG_COMMAND_FLAGS = {
    "simulate": ["--strategy", "--impl", "--micro-batch", "--grad-accum", "--precision",
                 "--offload", "--ac", "--shard-group", "--seq", "--format", "--fit-only"],
    "plan": ["--micro-batch", "--grad-accum", "--precision", "--format"],
}
ConfigCommand = tuple[list[str], str | bytes | None]
"""A command line and the content of the config file it names as CONFIG_FILE."""


@st.composite
def config_command_lines(draw: st.DrawFn) -> ConfigCommand:
    """`zsim simulate` (with --impl, --strategy zero3 and the plan flags) or, one time in
    ten, `zsim plan`, given a DeepSpeed or accelerate config: a generated one, a shipped
    example, the other kind's example, a missing file or a folder; sometimes both
    configs, or neither."""
    command = draw(st.sampled_from(["simulate"] * 9 + ["plan"]))
    argv = [command, "--model", draw(CONFIG_FLAG_VALUES["--model"]),
            "--gpus", draw(CONFIG_FLAG_VALUES["--gpus"]), "--seq", "512"]
    content: str | bytes | None = None
    kinds = draw(st.sampled_from([["--ds-config"], ["--fsdp-config"]] * 6
                                 + [[], ["--ds-config", "--fsdp-config"]]))
    for kind in kinds:
        source = draw(st.sampled_from(["generated", "generated", "shipped", "other",
                                       "missing", "folder"]))
        if source == "generated" and content is None:
            cases = ds_config_cases() if kind == "--ds-config" else fsdp_config_cases()
            content = draw(cases)[0]
            path = CONFIG_FILE
        elif source == "other":
            path = draw(st.sampled_from(SHIPPED["--fsdp-config" if kind == "--ds-config"
                                                else "--ds-config"]))
        else:
            path = {"missing": str(CONFIG_DIR / "nope.json"), "folder": str(CONFIG_DIR)}.get(
                source, draw(st.sampled_from(SHIPPED[kind])))
        argv += [kind, path]
    for flag in draw(st.lists(st.sampled_from(CONFIG_COMMAND_FLAGS[command]), unique=True,
                              max_size=4)):
        argv += [flag] if flag == "--fit-only" else [flag, draw(CONFIG_FLAG_VALUES[flag])]
    return argv, content


def check_config_command_line(case: ConfigCommand) -> str:
    """check_command_line, with the generated config written where the line names it."""
    argv, content = case
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "config"
        if content is not None:
            path.write_bytes(content.encode(errors="surrogatepass")
                             if isinstance(content, str) else content)
        return check_command_line([str(path) if a == CONFIG_FILE else a for a in argv])


# ---------------------------------------------------------------------- shared
def _check_error(e: ConfigError) -> None:
    """A user error names its field on one line."""
    message = str(e)
    assert e.field and e.field in message, f"no field named: {message!r}"
    assert "\n" not in message, f"more than one line: {message!r}"


def _expect_config_error(build: Callable[[], object]) -> str:
    try:
        build()
    except ConfigError as e:
        _check_error(e)
        return "rejected"
    return "valid"


TARGETS: dict[str, tuple[st.SearchStrategy[Any], Callable[[Any], str]]] = {
    "model": (model_dicts(), check_model_dict),
    "hardware": (hardware_dicts(), check_hardware_dict),
    "plan": (plan_dicts(), check_plan_dict),
    "simulate": (triples(), check_triple),
    "scenario": (scenario_texts(), check_scenario_text),
    "hf_config": (hf_config_texts(), check_hf_config_text),
    "cli": (command_lines(), check_command_line),
    "ds_config": (ds_config_cases(), check_ds_config_case),
    "fsdp_config": (fsdp_config_cases(), check_fsdp_config_case),
    "cli_config": (config_command_lines(), check_config_command_line),
}
"""Target name -> (input strategy, oracle)."""
