"""Scenario YAML: a named set of runs, each a (ModelSpec, HardwareProfile, Plan) triple.

Owns the strict scenario schema and its sweep language (grid and zip axes over any run
key, ranges, a `where:` filter, `--set key=value` overrides), and simulating every run in
order. Every bad key, value or expression (malformed YAML too) raises
zsim.errors.ConfigError naming its YAML field path, e.g. `plans.fsdp.unit_size`, and, from
load_scenario, the file. No pandas or matplotlib here (see zsim.report); results are
zsim.result.Result objects.

Schema (keys in `RUN_KEYS` may appear at the top level as defaults for every plan, inside
each plan, or as a sweep axis):

```yaml
name: seed-13b-128          # required; names the report files
description: ...            # optional text
source: ...                 # optional: where the scenario comes from
model: 13b                  # preset/alias, config.json path (relative to this file), a
                            # mapping of ModelSpec fields, or {params: 7.0e9} (a synthetic
                            # Llama-style model of exactly that many parameters)
hardware: dgx-h100          # profile name, profile YAML path (relative to this file) or
                            # a mapping in the hardware_profiles/ schema
gpus: 128                   # any RUN_KEY: default for every plan
plans:                      # required, non-empty: name -> RUN_KEYs (strategy required
  fsdp: {strategy: fsdp}    # unless a ds_config or fsdp_config gives it)
  hsdp: {strategy: hsdp, shard_group: 8}
  ours: {ds_config: configs/ds_zero3.json}
sweep:                      # optional grid: every plan runs once per combination of the
  unit_size: [1, 2]         # axes, named "fsdp unit_size=1 prefetch=0 ..." (file order)
  prefetch: [0, 1]          # an axis: a non-empty list, or a range:
  gpus: {from: 8, to: 4096, times: 2}     # 8, 16, ..., 4096 (times < 1 counts down)
  seq_len: {from: 2048, to: 8192, step: 2048}  # 2048, 4096, 6144, 8192
  zip:                      # one axis whose keys move together (equal lengths); a list of
    seq_len: [4096, 8192]   # such mappings gives one axis each
    micro_batch: [2, 1]
where: "gpus * unit_size <= 512"  # optional filter: a run is kept where it is true
run_days: 30                # optional: each run's row also says what the plan delivers over
fleet: llama3               # that many days of this fleet's failures (zsim.run_api.run_columns;
                            # or a fleet file beside this one, zsim.spec.failures)
restart_s: 300              # optional: your restart time in place of the fleet's (600 s, assumed)
report:                     # optional
  template: report.md       # markdown template (zsim.report.markdown), relative to this file
  memory_curves: [fsdp]     # runs whose memory curve is plotted (default: every run)
  figures: [scaling, pareto, heatmap, gantt]  # REPORT_FIGURES (default DEFAULT_FIGURES)
  heatmap: {x: gpus, y: inter_node_gb_per_s, value: tokens_per_s_per_gpu, plan: fsdp}
  gantt: fsdp gpus=64       # the run whose streams the gantt figure draws (default: the
                            # first memory curve's)
```

Precedence: `--set` > sweep value > plan value > top-level value > built-in default
(precision bf16, seq_len the model's max_seq_len). A key both swept and set in a plan is an
error. `where:` reads any RUN_KEY (zsim.spec.expression: numbers, strings, + - * / // %,
comparisons, and/or/not, parentheses); a key a run does not set reads Plan's default
(seq_len: the model's, inter_node_gb_per_s: the profile's; None where there is none).
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml

from zsim.analytic.placement import partial_node_warning
from zsim.errors import ConfigError
from zsim.result import Result
from zsim.spec.consistency import check_plan
from zsim.spec.expression import Expression, compile_expression
from zsim.spec.failures import FailureModel, failure_model
from zsim.spec.hardware import HardwareProfile
from zsim.spec.model import ModelSpec
from zsim.spec.plan import Plan, precision_knobs
from zsim.spec.presets import ALIASES, PRESETS
from zsim.spec.registry import resolve_hardware, resolve_model
from zsim.spec.yaml_file import read_yaml
from zsim.units import GB, MiB

RUN_KEYS: tuple[str, ...] = (
    "gpus", "seq_len", "precision", "strategy", "impl", "shard_group", "micro_batch",
    "grad_accum", "recompute", "unit_size", "prefetch", "bucket_mib", "optimizer", "offload",
    "param_dtype", "grad_dtype", "reduce_dtype", "master_dtype", "optimizer_state_dtype",
    "ds_config", "fsdp_config", "inter_node_gb_per_s", "tp", "pp", "cp", "sp", "async_tp",
    "tp_across_nodes", "pp_schedule", "virtual_stages", "grad_sync", "ep", "capacity_factor",
    "expert_imbalance",
)
"""Keys that describe one run. `bucket_mib` is Plan.bucket_bytes in MiB; `precision` sets
the five dtype fields (zsim.spec.plan.PRECISIONS), which explicit dtype keys override.
`ds_config` (a DeepSpeed JSON) or `fsdp_config` (an accelerate FSDP YAML), a path beside
the scenario, gives the plan as `zsim simulate --ds-config/--fsdp-config` reads it; the
run's strategy, micro_batch, grad_accum, precision, recompute and shard_group fill or must
agree with it, and its other keys change the plan it gives. `inter_node_gb_per_s`
replaces the hardware profile's inter-node link bandwidth (GB/s per GPU per direction),
every other number of the profile kept."""

TOP_KEYS: tuple[str, ...] = ("name", "description", "source", "model", "hardware", "plans",
                             "sweep", "where", "report", "run_days", "fleet", "restart_s",
                             *RUN_KEYS)
REQUIRED_TOP_KEYS: tuple[str, ...] = ("name", "model", "hardware", "plans")
REPORT_KEYS: tuple[str, ...] = ("template", "memory_curves", "figures", "heatmap", "gantt")
REPORT_FIGURES: tuple[str, ...] = ("step_time", "memory", "memory_curve", "pareto",
                                   "scaling", "exposed_comm", "heatmap", "gantt")
"""Figures a report can hold (zsim.report.files.FIGURES): step time and peak memory bars
per run, memory curves, the Pareto front of memory against throughput, scaling curves
against GPU count, exposed communication against unit size and prefetch, a heatmap of one
column over two swept keys, and the stream Gantt chart of one run."""
DEFAULT_FIGURES: tuple[str, ...] = ("step_time", "memory", "memory_curve")
HEATMAP_KEYS: tuple[str, ...] = ("x", "y", "value", "plan")
RANGE_KEYS: tuple[str, ...] = ("from", "to", "times", "step")
"""Keys of a range axis: from and to, and exactly one of times or step."""
MAX_AXIS_VALUES = 10_000
"""Most values one range may give."""
MAX_COMBINATIONS = 100_000
"""Most runs a scenario may describe before `where:` filters them (plans x combinations)."""

Axis = list[tuple[tuple[str, Any, str], ...]]
"""One sweep axis: its points, each a tuple of (run key, value, YAML field path)."""

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
    run_days: float | None = None
    """Days over which the run's row also gives tokens per day and goodput (None: not)."""
    failures: FailureModel | None = None
    """The failure statistics of those days, the scenario's fleet with its restart_s
    (zsim.spec.failures); None without run_days."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Heatmap:
    """A heatmap figure: `value` coloured over the swept columns `x` and `y`."""

    x: str
    """Column of zsim.report.dataframes.sweep_frame on the horizontal axis, e.g. gpus."""
    y: str
    """Column on the vertical axis."""
    value: str
    """Numeric column coloured, e.g. tokens_per_s_per_gpu."""
    plan: str | None = None
    """Only this plan's runs (its name under `plans:`); None: every run."""


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
    figures: tuple[str, ...] = DEFAULT_FIGURES
    """The report's figures, in order (REPORT_FIGURES)."""
    heatmap: Heatmap | None = None
    """What the heatmap figure shows; None without one."""
    gantt: str | None = None
    """Name of the run the gantt figure draws; None without one."""

    @property
    def run_names(self) -> tuple[str, ...]:
        return tuple(r.name for r in self.runs)


def load_scenario(path: Path, overrides: Sequence[str] = ()) -> Scenario:
    """Read and check a scenario YAML file, expanding its sweep into runs.

    Args:
        path: the scenario file; relative model, hardware and template paths inside it
            are resolved against its folder.
        overrides: `KEY=VALUE` settings applied over the file (apply_overrides).

    Returns:
        The Scenario, every run already checked with zsim.spec.consistency.check_plan.

    Raises:
        ConfigError: unreadable file, malformed YAML, a bad override, or any bad key,
            value or expression (the field path names where in the file, e.g.
            `plans.hsdp.shard_group` or `sweep.gpus`, and the reason ends with the file,
            or with the `--set` that gave the value).
    """
    path = Path(path)
    data = read_yaml(path, field="scenario")
    data = apply_overrides(data, overrides)
    try:
        return scenario_from_dict(data, base_dir=path.parent)
    except ConfigError as e:
        keys = [o.partition("=")[0].strip() for o in overrides]
        given = [k for k in keys if e.field == k or e.field.startswith(f"{k}.")]
        where = f"--set {given[-1]}" if given else f"in {path}"
        raise ConfigError(e.field, e.value, f"{e.reason} ({where})") from None


def apply_overrides(data: Any, overrides: Sequence[str]) -> Any:
    """The parsed scenario with each `KEY=VALUE` of `overrides` set, in order.

    KEY is a dotted field path (`seq_len`, `plans.fsdp.unit_size`, `sweep.gpus`), mappings
    on the way created where missing; VALUE is read as YAML (`4096`, `[8, 16]`, `fsdp`,
    `{from: 8, to: 64, times: 2}`). The scenario's own checks then apply to the result.

    Raises:
        ConfigError: field `--set`, for an override without `=` or a key, a VALUE that is
            not YAML, or a KEY through a value that is not a mapping.
    """
    if not overrides:
        return data
    if not isinstance(data, dict):
        raise ConfigError("scenario", data, "must be a mapping")
    out = copy.deepcopy(data)
    for text in overrides:
        key, eq, raw = text.partition("=")
        parts = key.strip().split(".")
        if not eq or not all(p.strip() for p in parts):
            raise ConfigError("--set", text, "must be KEY=VALUE, KEY a dotted field path "
                              "such as seq_len or plans.fsdp.unit_size")
        try:
            value = yaml.safe_load(raw) if raw.strip() else raw
        except yaml.YAMLError as e:
            raise ConfigError("--set", text, f"VALUE is not YAML ({e})") from None
        node = out
        for i, part in enumerate(parts[:-1]):
            node = node.setdefault(part.strip(), {})
            if not isinstance(node, dict):
                raise ConfigError("--set", text, f"{'.'.join(parts[:i + 1])} is not a "
                                  "mapping")
        node[parts[-1].strip()] = value
    return out


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
    swept_at = {key: path for axis in axes for key, _, path in axis[0]}
    total = len(plans) * math.prod(len(axis) for axis in axes)
    if total > MAX_COMBINATIONS:
        raise ConfigError("sweep", total, f"runs described (plans x combinations); at "
                          f"most {MAX_COMBINATIONS:,}")
    keep = (None if "where" not in data else
            compile_expression(data["where"], field="where", names=RUN_KEYS))
    run_days, failures = _run_days(data, base_dir)
    runs: list[Run] = []
    for plan_name, settings in plans.items():
        where = f"plans.{plan_name}"
        if not isinstance(plan_name, str) or not plan_name.strip():
            raise ConfigError("plans", plan_name, "plan names must be non-empty strings")
        _check_keys(settings, where, RUN_KEYS, ())
        for key in settings:
            if key in swept_at:
                raise ConfigError(f"{where}.{key}", settings[key],
                                  f"also swept by {swept_at[key]}; set it in one place")
        base = {**defaults, **{k: (v, f"{where}.{k}") for k, v in settings.items()}}
        for combo in itertools.product(*axes):
            points = [point for group in combo for point in group]
            swept = tuple((k, v) for k, v, _ in points)
            merged = {**base, **{k: (v, path) for k, v, path in points}}
            run_name = " ".join([plan_name, *(f"{k}={v}" for k, v in swept)])
            if keep is not None and not _kept(keep, merged, model, hw, run_name):
                continue
            runs.append(replace(_run(run_name, plan_name, swept, merged, model, hw, where,
                                     base_dir), run_days=run_days, failures=failures))
    if not runs:
        raise ConfigError("where", data.get("where"), "keeps no run")
    names = [r.name for r in runs]
    template, curves = _report(data.get("report"), base_dir, names)
    figures, heatmap, gantt = _figures(data.get("report") or {}, names, curves,
                                       list(plans))
    return Scenario(name=name, description=description, source=source, runs=tuple(runs),
                    template=template, memory_curves=curves, figures=figures,
                    heatmap=heatmap, gantt=gantt)


def simulate_timeline(scenario: Scenario) -> Result | None:
    """The gantt run of `scenario` simulated again with its op spans kept (trace=True), or
    None when the report has no gantt figure.

    Raises:
        ConfigError: field `report.gantt`, for a run not simulated (its memory floor
            exceeds HBM, so it has no timeline).
    """
    from zsim.simulate import simulate

    if scenario.gantt is None:
        return None
    run = next(r for r in scenario.runs if r.name == scenario.gantt)
    result = simulate(run.model, run.hardware, run.plan, trace=True)
    if not result.spans:
        raise ConfigError("report.gantt", run.name, "not simulated (its memory floor "
                          "exceeds HBM): there is no timeline to draw")
    return result


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
    if isinstance(value, dict) and list(value) == ["params"]:
        params = value["params"]
        try:
            # PyYAML reads 7.0e9 (no sign in the exponent) as a string: YAML 1.1's floats.
            return resolve_model(params=float(params) if isinstance(params, str) else params)
        except (ConfigError, TypeError, ValueError, OverflowError) as e:
            reason = e.reason if isinstance(e, ConfigError) else "must be a number"
            raise ConfigError("model.params", params, reason) from None
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


def _sweep_axes(sweep: Any) -> list[Axis]:
    """The sweep's axes in file order: one per grid key, one per zip group."""
    if sweep is None:
        return []
    _check_keys(sweep, "sweep", (*RUN_KEYS, "zip"), ())
    if not sweep:
        raise ConfigError("sweep", sweep, "must name at least one key to sweep")
    axes: list[Axis] = []
    seen: dict[str, str] = {}
    for key, values in sweep.items():
        if key != "zip":
            axes.append([((key, v, f"sweep.{key}"),)
                         for v in _axis_values(values, f"sweep.{key}")])
            seen[key] = f"sweep.{key}"
            continue
        groups = values if isinstance(values, list) else [values]
        if not groups:
            raise ConfigError("sweep.zip", values, "must be a mapping of key -> values "
                              "(or a list of them)")
        for i, group in enumerate(groups):
            where = "sweep.zip" if isinstance(values, dict) else f"sweep.zip[{i}]"
            _check_keys(group, where, RUN_KEYS, ())
            if not group:
                raise ConfigError(where, group, "must name at least one key")
            columns = {k: _axis_values(v, f"{where}.{k}") for k, v in group.items()}
            lengths = {k: len(v) for k, v in columns.items()}
            if len(set(lengths.values())) > 1:
                raise ConfigError(where, lengths, "zipped keys need as many values each")
            for k in columns:
                if k in seen:
                    raise ConfigError(f"{where}.{k}", group[k], f"also swept by {seen[k]}")
                seen[k] = f"{where}.{k}"
            axes.append([tuple((k, columns[k][j], f"{where}.{k}") for k in columns)
                         for j in range(next(iter(lengths.values())))])
    return axes


def _axis_values(values: Any, where: str) -> list[Any]:
    """A sweep axis's values: a non-empty list without repeats, or a range mapping."""
    if isinstance(values, dict):
        return _range(values, where)  # strictly monotonic: no repeats
    if not isinstance(values, list) or not values:
        raise ConfigError(where, values, "must be a non-empty list of values or a range "
                          "{from: A, to: B, times: R} / {from: A, to: B, step: S}")
    for i, v in enumerate(values):
        if v in values[:i]:
            raise ConfigError(where, v, "listed twice")
    return values


def _range(spec: dict[Any, Any], where: str) -> list[Any]:
    """{from, to, times}: from, from*times, ... up to `to` (geometric); {from, to, step}:
    from, from+step, ... (arithmetic). `to` is included when the sequence meets it; floats
    are rounded to 12 significant digits so that 0.1 steps print as written."""
    _check_keys(spec, where, RANGE_KEYS, ("from", "to"))
    kinds = [k for k in ("times", "step") if k in spec]
    if len(kinds) != 1:
        raise ConfigError(where, spec, "give exactly one of times or step")
    kind = kinds[0]
    nums = {}
    for key in ("from", "to", kind):
        v = spec[key]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise ConfigError(f"{where}.{key}", v, "must be a finite number")
        nums[key] = v
    start, stop, by = nums["from"], nums["to"], nums[kind]
    if kind == "times" and (start <= 0 or by <= 0 or by == 1):
        raise ConfigError(where, spec, "a geometric range needs from > 0 and times > 0, "
                          "not 1")
    if kind == "step" and by == 0:
        raise ConfigError(f"{where}.step", by, "must not be 0")
    up = by > 1 if kind == "times" else by > 0
    if (stop < start) if up else (stop > start):
        raise ConfigError(where, spec, f"{kind} {by} never reaches to={stop} from {start}")
    slack = 1e-9 * max(abs(start), abs(stop))
    integral = all(isinstance(nums[k], int) for k in nums)
    out: list[Any] = []
    for i in range(MAX_AXIS_VALUES + 1):
        v = start * by ** i if kind == "times" else start + i * by
        if (v > stop + slack) if up else (v < stop - slack):
            return out
        if len(out) == MAX_AXIS_VALUES:
            break
        out.append(v if integral else float(f"{v:.12g}"))
    raise ConfigError(where, spec, f"gives more than {MAX_AXIS_VALUES:,} values")


def _kept(keep: Expression, settings: dict[str, tuple[Any, str]], model: ModelSpec,
          hw: HardwareProfile, run_name: str) -> bool:
    """Whether `where:` keeps the run with these settings (key -> (value, YAML path))."""
    values: dict[str, Any] = dict.fromkeys(RUN_KEYS)
    values |= {f.name: f.default for f in dataclasses.fields(Plan)
               if f.name in values and f.default is not dataclasses.MISSING}
    values |= {"precision": "bf16", "seq_len": model.max_seq_len,
               "bucket_mib": Plan.__dataclass_fields__["bucket_bytes"].default / MiB,
               "inter_node_gb_per_s": hw.inter_node.bandwidth_bytes_per_s / GB}
    values |= {k: v for k, (v, _) in settings.items()}
    result = keep.evaluate(values)
    if not isinstance(result, bool):
        raise ConfigError("where", keep.text, f"gives {result!r}, not true or false, for "
                          f"run {run_name!r}")
    return result


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


def _figures(report: dict[str, Any], names: list[str], curves: tuple[str, ...],
             plans: list[str]) -> tuple[tuple[str, ...], Heatmap | None, str | None]:
    """The report's figures, its heatmap and its gantt run (`report` already checked)."""
    figures = report.get("figures", list(DEFAULT_FIGURES))
    if not isinstance(figures, list) or not figures:
        raise ConfigError("report.figures", figures, "must be a non-empty list of: "
                          f"{', '.join(REPORT_FIGURES)}")
    for i, f in enumerate(figures):
        if f not in REPORT_FIGURES or f in figures[:i]:
            raise ConfigError(f"report.figures[{i}]", f, "listed twice" if f in figures[:i]
                              else f"unknown figure; figures: {', '.join(REPORT_FIGURES)}")
    heatmap = None
    if "heatmap" in figures or "heatmap" in report:
        spec = report.get("heatmap")
        _check_keys(spec, "report.heatmap", HEATMAP_KEYS, ("x", "y", "value"))
        for key in HEATMAP_KEYS:
            if key in spec and (not isinstance(spec[key], str) or not spec[key].strip()):
                raise ConfigError(f"report.heatmap.{key}", spec[key], "must be a name")
        if spec.get("plan", plans[0]) not in plans:
            raise ConfigError("report.heatmap.plan", spec["plan"],
                              f"no such plan; plans: {', '.join(plans)}")
        heatmap = Heatmap(x=spec["x"], y=spec["y"], value=spec["value"],
                          plan=spec.get("plan"))
    gantt = None
    if "gantt" in figures or "gantt" in report:
        gantt = report.get("gantt", curves[0])
        if gantt not in names:
            raise ConfigError("report.gantt", gantt, f"no such run; runs: {', '.join(names)}")
    return tuple(figures), heatmap, gantt


# ---------------------------------------------------------------------- one run
def _run_days(data: dict[str, Any], base_dir: Path
              ) -> tuple[float | None, FailureModel | None]:
    """The top-level run_days (a positive number of days, or absent) and the failure
    model of its fleet (a name, or a fleet file's path relative to `base_dir`, the
    scenario's folder) with its restart_s (seconds, or absent), None without run_days."""
    days = data.get("run_days")
    if days is not None and (isinstance(days, bool) or not isinstance(days, (int, float))
                             or not 0 < days < math.inf):
        raise ConfigError("run_days", days, "must be a positive number of days")
    fleet = data.get("fleet", "llama3")
    if not isinstance(fleet, str):
        raise ConfigError("fleet", fleet, "must be a fleet name or a fleet file")
    if fleet.endswith((".yaml", ".yml")):
        fleet = str(base_dir / fleet)
    failures = failure_model(fleet, restart_s=data.get("restart_s"))
    return (None, None) if days is None else (float(days), failures)


def _run(name: str, plan_name: str, swept: tuple[tuple[str, Any], ...],
         settings: dict[str, tuple[Any, str]], model: ModelSpec, hw: HardwareProfile,
         where: str, base_dir: Path) -> Run:
    """Build one run and check its plan (check_plan); `settings` maps key -> (YAML value,
    YAML path)."""
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
                          "seq_len", "ds_config", "fsdp_config", "inter_node_gb_per_s")}
    warnings: tuple[str, ...] = ()
    try:
        if "bucket_mib" in values:
            knobs["bucket_bytes"] = _mib_to_bytes(values["bucket_mib"])
        if "inter_node_gb_per_s" in values:
            hw = _with_inter_node_bandwidth(hw, values["inter_node_gb_per_s"])
        seq_len = values.get("seq_len", model.max_seq_len)
        if configs:
            plan, warnings = _config_plan(configs[0], values, origin, knobs, model, hw,
                                          seq_len, base_dir)
        else:
            plan = Plan.for_strategy(
                values["strategy"], gpus=values["gpus"], shard_group=values.get("shard_group"),
                seq_len=seq_len, **{**precision_knobs(values.get("precision", "bf16")),
                                    **knobs})
        check_plan(model, hw, plan, gpus=values["gpus"])
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
    partial = partial_node_warning(values["gpus"], hw)
    return Run(name=name, plan_name=plan_name, swept=swept, model=model, hardware=hw,
               plan=plan, gpus=values["gpus"],
               warnings=(*model.warnings, *warnings, partial) if partial
               else (*model.warnings, *warnings))


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


def _with_inter_node_bandwidth(hw: HardwareProfile, gb_per_s: Any) -> HardwareProfile:
    """`hw` with its inter-node link's line rate replaced (GB/s per GPU per direction);
    latency and efficiency kept."""
    if (isinstance(gb_per_s, bool) or not isinstance(gb_per_s, (int, float))
            or not math.isfinite(gb_per_s) or gb_per_s <= 0):
        raise ConfigError("inter_node_gb_per_s", gb_per_s, "must be a positive number of "
                          "GB/s")
    link = dataclasses.replace(hw.inter_node, bandwidth_bytes_per_s=gb_per_s * GB)
    return dataclasses.replace(hw, inter_node=link)


def _mib_to_bytes(value: Any) -> int:
    if (isinstance(value, bool) or not isinstance(value, (int, float))
            or not math.isfinite(value) or value <= 0):
        raise ConfigError("bucket_mib", value, "must be a positive number of MiB")
    return max(1, round(value * MiB))
