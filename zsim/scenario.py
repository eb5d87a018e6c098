"""Scenario YAML: a named set of runs, each a (ModelSpec, HardwareProfile, Plan) triple.

Owns the strict scenario schema, the cartesian expansion of a `sweep:` mapping over the
plans, and simulating every run in order. Every bad key or value (malformed YAML too) raises
zsim.errors.ConfigError naming its YAML field path, e.g. `plans.fsdp.unit_size`. No pandas
or matplotlib here (see zsim.report); results are zsim.result.Result objects.

Schema (keys in `RUN_KEYS` may appear at the top level as defaults for every plan, inside
each plan, or as a sweep axis):

```yaml
name: seed-13b-128          # required; names the report files
description: ...            # optional text
source: ...                 # optional: where the scenario comes from
model: 13b                  # preset/alias, config.json path (relative to this file) or a
                            # mapping of ModelSpec fields
hardware: dgx-h100          # profile name, profile YAML path (relative to this file) or
                            # a mapping in the hardware_profiles/ schema
gpus: 128                   # any RUN_KEY: default for every plan
plans:                      # required, non-empty: name -> RUN_KEYs (strategy required
  fsdp: {strategy: fsdp}    # unless a ds_config or fsdp_config gives it)
  hsdp: {strategy: hsdp, shard_group: 8}
  ours: {ds_config: configs/ds_zero3.json}
sweep:                      # optional: RUN_KEY -> non-empty list; every plan runs once per
  unit_size: [1, 2]         # combination, named "fsdp unit_size=1 prefetch=0"
  prefetch: [0, 1]
report:                     # optional
  template: report.md       # markdown template (zsim.report.markdown), relative to this file
  memory_curves: [fsdp]     # runs whose memory curve is plotted (default: every run)
```

Precedence: sweep value > plan value > top-level value > built-in default (precision bf16,
seq_len the model's max_seq_len). A key both swept and set in a plan is an error.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from zsim.errors import ConfigError
from zsim.result import Result
from zsim.spec.hardware import HardwareProfile
from zsim.spec.model import ModelSpec
from zsim.spec.plan import Plan, precision_knobs
from zsim.spec.presets import ALIASES, PRESETS
from zsim.spec.registry import resolve_hardware, resolve_model
from zsim.spec.validate import validate
from zsim.spec.yaml_file import read_yaml
from zsim.units import MiB

RUN_KEYS: tuple[str, ...] = (
    "gpus", "seq_len", "precision", "strategy", "impl", "shard_group", "micro_batch",
    "grad_accum", "recompute", "unit_size", "prefetch", "bucket_mib", "optimizer", "offload",
    "param_dtype", "grad_dtype", "reduce_dtype", "master_dtype", "optimizer_state_dtype",
    "ds_config", "fsdp_config", "tp", "pp", "cp", "sp", "async_tp", "tp_across_nodes",
    "pp_schedule", "virtual_stages",
)
"""Keys that describe one run. `bucket_mib` is Plan.bucket_bytes in MiB; `precision` sets
the five dtype fields (zsim.spec.plan.PRECISIONS), which explicit dtype keys override.
`ds_config` (a DeepSpeed JSON) or `fsdp_config` (an accelerate FSDP YAML), a path beside
the scenario, gives the plan as `zsim simulate --ds-config/--fsdp-config` reads it; the
run's strategy, micro_batch, grad_accum, precision, recompute and shard_group fill or must
agree with it, and its other keys change the plan it gives."""

TOP_KEYS: tuple[str, ...] = ("name", "description", "source", "model", "hardware", "plans",
                             "sweep", "report", *RUN_KEYS)
REQUIRED_TOP_KEYS: tuple[str, ...] = ("name", "model", "hardware", "plans")
REPORT_KEYS: tuple[str, ...] = ("template", "memory_curves")

Progress = Callable[[int, int, str], None]
"""Called after each simulated run with (runs done, runs in total, run name)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Run:
    """One simulated configuration of a scenario."""

    name: str
    """Plan name, followed by "key=value" for each swept key (sweep order)."""
    plan_name: str
    """The key under `plans:` this run comes from."""
    swept: tuple[tuple[str, Any], ...]
    """(key, value) of each sweep axis for this run, in sweep order; () without a sweep."""
    model: ModelSpec
    hardware: HardwareProfile
    plan: Plan
    gpus: int
    """World size of the job."""
    warnings: tuple[str, ...] = ()
    """Keys of the run's ds_config / fsdp_config read but not modelled."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Scenario:
    """A loaded scenario file: its runs in file order, sweep combinations innermost."""

    name: str
    description: str
    source: str
    runs: tuple[Run, ...]
    template: str | None
    """Markdown report template text (zsim.report.markdown.render_report), or None."""
    memory_curves: tuple[str, ...]
    """Names of the runs whose memory curve the report plots."""

    @property
    def run_names(self) -> tuple[str, ...]:
        return tuple(r.name for r in self.runs)


def load_scenario(path: Path) -> Scenario:
    """Read and check a scenario YAML file, expanding its sweep into runs.

    Args:
        path: the scenario file; relative model, hardware and template paths inside it
            are resolved against its folder.

    Returns:
        The Scenario, every run already checked with zsim.spec.validate.validate.

    Raises:
        ConfigError: unreadable file, malformed YAML, or any bad key or value (the field
            path names where in the file, e.g. `plans.hsdp.shard_group` or `sweep.gpus`).
    """
    path = Path(path)
    data = read_yaml(path, field="scenario")
    return scenario_from_dict(data, base_dir=path.parent)


def scenario_from_dict(data: Any, *, base_dir: Path) -> Scenario:
    """Build a Scenario from the parsed YAML structure (see the module docstring).

    Raises:
        ConfigError: any bad key or value, naming its field path.
    """
    _check_keys(data, "scenario", TOP_KEYS, REQUIRED_TOP_KEYS)
    name = _text(data, "name")
    description = _text(data, "description") if "description" in data else ""
    source = _text(data, "source") if "source" in data else ""
    model = _model(data["model"], base_dir)
    hw = _hardware(data["hardware"], base_dir)
    defaults = {k: (v, k) for k, v in data.items() if k in RUN_KEYS}
    plans = data["plans"]
    if not isinstance(plans, dict) or not plans:
        raise ConfigError("plans", plans, "must be a non-empty mapping of name -> settings")
    axes = _sweep_axes(data.get("sweep"))
    runs: list[Run] = []
    for plan_name, settings in plans.items():
        where = f"plans.{plan_name}"
        if not isinstance(plan_name, str) or not plan_name.strip():
            raise ConfigError("plans", plan_name, "plan names must be non-empty strings")
        _check_keys(settings, where, RUN_KEYS, ())
        for key in settings:
            if key in axes:
                raise ConfigError(f"{where}.{key}", settings[key],
                                  f"also swept by sweep.{key}; set it in one place")
        base = {**defaults, **{k: (v, f"{where}.{k}") for k, v in settings.items()}}
        for combo in itertools.product(*axes.values()):
            swept = tuple(zip(axes, combo, strict=True))
            merged = {**base, **{k: (v, f"sweep.{k}") for k, v in swept}}
            run_name = " ".join([plan_name, *(f"{k}={v}" for k, v in swept)])
            runs.append(_run(run_name, plan_name, swept, merged, model, hw, where,
                             base_dir))
    names = [r.name for r in runs]
    template, curves = _report(data.get("report"), base_dir, names)
    return Scenario(name=name, description=description, source=source, runs=tuple(runs),
                    template=template, memory_curves=curves)


def simulate_runs(scenario: Scenario, *, progress: Progress | None = None
                  ) -> list[tuple[Run, Result]]:
    """Simulate every run of `scenario` in order (symmetric mode, one optimizer step).

    Args:
        scenario: the loaded scenario.
        progress: called after each run with (done, total, run name).

    Returns:
        (run, result) pairs in scenario order.

    Raises:
        ConfigError: a run the simulator does not model; the message names the run.
    """
    from zsim.simulate import simulate

    out = []
    for i, run in enumerate(scenario.runs, start=1):
        try:
            result = simulate(run.model, run.hardware, run.plan)
        except ConfigError as e:
            raise ConfigError(e.field, e.value, f"{e.reason} (run {run.name!r})") from None
        out.append((run, result))
        if progress is not None:
            progress(i, len(scenario.runs), run.name)
    return out


# ---------------------------------------------------------------------- sections
def _check_keys(data: Any, where: str, allowed: tuple[str, ...],
                required: tuple[str, ...]) -> None:
    if not isinstance(data, dict):
        raise ConfigError(where, data, "must be a mapping")
    for key in data:
        if key not in allowed:
            raise ConfigError(_path(where, key), data[key],
                              f"unknown key; known keys: {', '.join(allowed)}")
    for key in required:
        if key not in data:
            raise ConfigError(_path(where, key), None, "missing required key")


def _path(where: str, key: object) -> str:
    return str(key) if where == "scenario" else f"{where}.{key}"


def _text(data: dict[str, Any], key: str) -> str:
    value = data[key]
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(key, value, "must be a non-empty string")
    return value.strip()


def _model(value: Any, base_dir: Path) -> ModelSpec:
    if isinstance(value, dict):
        return ModelSpec.from_dict(value, where="model")
    if not isinstance(value, str) or not value.strip():
        raise ConfigError("model", value, "must be a preset name, a config.json path or a "
                          "mapping of ModelSpec fields")
    key = ALIASES.get(value.lower(), value.lower())
    if key in PRESETS or not value.endswith(".json"):
        return resolve_model(value)
    # A config.json path: beside the scenario, never looked up in the working folder.
    return resolve_model(str(base_dir / value))


def _hardware(value: Any, base_dir: Path) -> HardwareProfile:
    if isinstance(value, dict):
        name = value.get("name")
        try:
            return HardwareProfile.from_dict(value, name=name if isinstance(name, str) else "")
        except ConfigError as e:
            raise ConfigError(f"hardware.{e.field}", e.value, e.reason) from None
    if not isinstance(value, str) or not value.strip():
        raise ConfigError("hardware", value, "must be a profile name, a profile YAML path "
                          "or a mapping in the hardware_profiles/ schema")
    if value.endswith((".yaml", ".yml")):  # beside the scenario, not in the working folder
        return resolve_hardware(str(base_dir / value))
    return resolve_hardware(value)


def _sweep_axes(sweep: Any) -> dict[str, list[Any]]:
    if sweep is None:
        return {}
    _check_keys(sweep, "sweep", RUN_KEYS, ())
    if not sweep:
        raise ConfigError("sweep", sweep, "must name at least one key to sweep")
    for key, values in sweep.items():
        if not isinstance(values, list) or not values:
            raise ConfigError(f"sweep.{key}", values, "must be a non-empty list of values")
        for i, v in enumerate(values):
            if v in values[:i]:
                raise ConfigError(f"sweep.{key}", v, "listed twice")
    return dict(sweep)


def _report(report: Any, base_dir: Path, names: list[str]
            ) -> tuple[str | None, tuple[str, ...]]:
    if report is None:
        return None, tuple(names)
    _check_keys(report, "report", REPORT_KEYS, ())
    template = None
    if "template" in report:
        value = report["template"]
        if not isinstance(value, str) or not value.strip():
            raise ConfigError("report.template", value, "must be a file path")
        try:
            template = (base_dir / value).read_text()
        except OSError as e:
            raise ConfigError("report.template", value,
                              f"cannot read ({e.strerror or e})") from None
    curves = report.get("memory_curves", names)
    if not isinstance(curves, list) or not curves:
        raise ConfigError("report.memory_curves", curves, "must be a non-empty list of runs")
    for i, c in enumerate(curves):
        if c not in names:
            raise ConfigError(f"report.memory_curves[{i}]", c,
                              f"no such run; runs: {', '.join(names)}")
    return template, tuple(curves)


# ---------------------------------------------------------------------- one run
def _run(name: str, plan_name: str, swept: tuple[tuple[str, Any], ...],
         settings: dict[str, tuple[Any, str]], model: ModelSpec, hw: HardwareProfile,
         where: str, base_dir: Path) -> Run:
    """Build and validate one run; `settings` maps key -> (YAML value, YAML path)."""
    values = {k: v for k, (v, _) in settings.items()}
    origin = {k: p for k, (_, p) in settings.items()}
    configs = [k for k in ("ds_config", "fsdp_config") if k in values]
    if len(configs) > 1:
        raise ConfigError(origin["fsdp_config"], values["fsdp_config"],
                          "give a ds_config or an fsdp_config, not both")
    for key in ("gpus",) if configs else ("strategy", "gpus"):
        if key not in values:
            raise ConfigError(f"{where}.{key}", None, "missing required key (set it in the "
                              "plan, at the top level or in sweep)")
    knobs = {k: v for k, v in values.items()
             if k not in ("gpus", "precision", "strategy", "shard_group", "bucket_mib",
                          "seq_len", "ds_config", "fsdp_config")}
    warnings: tuple[str, ...] = ()
    try:
        if "bucket_mib" in values:
            knobs["bucket_bytes"] = _mib_to_bytes(values["bucket_mib"])
        seq_len = values.get("seq_len", model.max_seq_len)
        if configs:
            plan, warnings = _config_plan(configs[0], values, origin, knobs, model, hw,
                                          seq_len, base_dir)
        else:
            plan = Plan.for_strategy(
                values["strategy"], gpus=values["gpus"], shard_group=values.get("shard_group"),
                seq_len=seq_len, **{**precision_knobs(values.get("precision", "bf16")),
                                    **knobs})
        validate(model, hw, plan, gpus=values["gpus"])
    except ConfigError as e:
        key = e.field.removeprefix("plan.")
        key = "bucket_mib" if key == "bucket_bytes" else key
        if e.field in origin.values() or ":" in e.field:  # names its place already
            field, value = e.field, e.value
        elif key in origin:
            field, value = origin[key], values[key]
        else:
            field, value = f"{where}.{key}", e.value
        context = f" (run {name!r})" if swept else ""
        raise ConfigError(field, value, e.reason + context) from None
    return Run(name=name, plan_name=plan_name, swept=swept, model=model, hardware=hw,
               plan=plan, gpus=values["gpus"], warnings=warnings)


def _config_plan(key: str, values: dict[str, Any], origin: dict[str, str],
                 knobs: dict[str, Any], model: ModelSpec, hw: HardwareProfile, seq_len: int,
                 base_dir: Path) -> tuple[Plan, tuple[str, ...]]:
    """The plan a run's ds_config or fsdp_config gives (a path beside the scenario), with
    the run's own keys filling it or checked against it, then its other knobs applied."""
    from zsim.spec.user_config import config_plan

    value = values[key]
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(origin[key], value, "must be a path to the config file")
    path = base_dir / value
    plan, warnings = config_plan(
        model, hw, ds_config=path if key == "ds_config" else None,
        fsdp_config=path if key == "fsdp_config" else None, where=value, gpus=values["gpus"],
        strategy=values.get("strategy"), shard_group=values.get("shard_group"), seq=seq_len,
        micro_batch=values.get("micro_batch"), grad_accum=values.get("grad_accum"),
        ac=knobs.pop("recompute", "none"), precision=values.get("precision"),
        offload=values.get("offload", "none"))
    consumed = ("micro_batch", "grad_accum", "offload", "impl")
    rest = {k: v for k, v in knobs.items() if k not in consumed}
    if "impl" in values and values["impl"] != plan.impl:
        raise ConfigError(origin["impl"], values["impl"],
                          f"but {value} runs {plan.impl}")
    return (plan.with_(**rest) if rest else plan), warnings


def _mib_to_bytes(value: Any) -> int:
    if (isinstance(value, bool) or not isinstance(value, (int, float))
            or not math.isfinite(value) or value <= 0):
        raise ConfigError("bucket_mib", value, "must be a positive number of MiB")
    return max(1, round(value * MiB))
