"""Generated inputs for every way a user feeds zsim, and the oracle each must satisfy
(issue 9's fuzz campaign; tests/fuzz/test_fuzz.py runs a small profile, bench/fuzz.py
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
        vocab_size=draw(st.integers(1, 256_000)),
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
        return yaml.safe_dump(data, sort_keys=False)
    if not draw(one_in(3)):
        data = copy.deepcopy(SCENARIO)
        for key in draw(st.lists(st.sampled_from(
                ["name", "model", "hardware", "gpus", "seq_len", "plans", "sweep", "report",
                 "precision", "unit_size", "bucket_mib", "description"]), max_size=2)):
            data[key] = draw(st.one_of(WEIRD, st.sampled_from(
                ["13b", "nope", "x.json", "../../etc/passwd", "!!python/object:os.system",
                 "dgx-a100", "hw.yaml", {"micro_batch": [0, 1]}, {"gpus": [8, 8]},
                 {"fsdp": {"strategy": "zero4"}}, {"template": "../README.md"},
                 {"memory_curves": ["nope"]}])), label=key)
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
LLAMA_CONFIG = {"architectures": ["LlamaForCausalLM"], "hidden_size": 4096,
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
        return _expect_config_error(lambda: ModelSpec.from_hf_config(path))


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
}
"""Target name -> (input strategy, oracle)."""
