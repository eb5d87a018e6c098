"""The error bands of every shipped hardware profile, generated from the evidence that
covers it (the rules in zsim.spec.error_bands, for users in docs/error-bands.md).

Owns which evidence covers which profile (PROFILES), the replays that turn it into
residuals, and the `error_bands:` section they give:

- whole steps: a profile's own runs where they exist (hgx-h200: the 16 H200 runs;
  local-cpu: the CPU validation's batches); otherwise the runs of the nearest validated
  hardware replayed on the profile with what differs substituted (dgx-h100: the H200 runs
  with the H200's memory; dgx-a100: MosaicML's A100 runs), or
  borrowed as they are (pcie-a100: dgx-a100's, its own links unvalidated; dgx-b200,
  gb200-nvl72 and mi300x, which have no runs at all: hgx-h200's). The peak
  allocated memory of a GPU profile without memory figures of its own comes from the
  H200 runs replayed on it with the H200's memory and cuBLAS workspace;
- out of domain: a run on a variant of the profile's hardware that the profile does not
  model (dgx-h100: torchtitan's 8 H100 96GB HBM2e at a 500 W cap) is replayed and its
  residual stated in the evidence, but kept out of the ranges;
- collectives: the nccl-tests cases of the profile's hardware (published.yaml); a
  profile without any takes every case's range;
- programs: each program's mean error over the CPU validation's batches of
  zsim.validation.error_budget.BUDGET_REPORT (in reports/validation/), where every program
  ran on one host: what a program the profile's runs did not run may add.

    zsim calibrate bands [--profile NAME ...] [--write] [--cases DIR] [--cpu DIR]

prints each profile's section, or with --write puts it into hardware_profiles/NAME.yaml
(tests/golden/test_error_bands.py checks that the committed sections are what the current
model gives). Imports no torch.
"""

from __future__ import annotations

import json
import re
import statistics
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from zsim.errors import ConfigError
from zsim.spec.error_bands import (
    BAND_METRICS,
    OTHER_PROGRAM,
    ErrorBands,
    MetricBand,
    Range,
    band_ranges,
    pct_range,
)
from zsim.spec.hardware import HardwareProfile
from zsim.spec.plan import STRATEGIES
from zsim.spec.programs import default_program
from zsim.spec.registry import PROFILES_DIR, resolve_hardware
from zsim.spec.yaml_file import read_yaml
from zsim.validation import evidence
from zsim.validation import published_cases as pc
from zsim.validation.error_budget import BUDGET_REPORT
from zsim.validation.published_runs import load_runs, residuals

ROOT = Path(__file__).resolve().parents[2]
CASES_DIR = ROOT / "tests" / "data" / "cases"
"""published.yaml and h200-fsdp2-runs.yaml (in tests/data/cases)."""
CPU_DIR = evidence.EVIDENCE_DIR
"""The validation evidence, whose BUDGET_REPORT batches are the CPU validation's."""

H200_RUNS = "h200-fsdp2-runs.yaml"

Row = dict[str, Any]


@dataclass(frozen=True, slots=True, kw_only=True)
class Evidence:
    """What covers one profile: whole-step rows, collective rows, and what they are."""

    steps: list[Row]
    """Step rows (zsim.validation.published_cases.step_row), residuals as fractions."""
    world_size: int
    """The largest world whose communication the step rows validated on this profile's
    own links (1: none did)."""
    collectives: list[Row]
    parts: list[str]
    """Each part of the evidence in words (which runs, how many, on what)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Sources:
    """Where the evidence is read from, and the replays shared by several profiles."""

    cases: dict[str, dict[str, Any]]
    cases_dir: Path
    cpu_dir: Path
    """The evidence folder (zsim.validation.evidence) holding the CPU batches."""

    def h200_runs(self, hw: HardwareProfile, metrics: tuple[str, ...]) -> list[Row]:
        """The H200 runs' residuals of `metrics` replayed on `hw`."""
        rows = residuals(load_runs(self.cases_dir / H200_RUNS), hw)
        return [{k: v for k, v in r.items() if k not in BAND_METRICS or k in metrics}
                for r in rows]


def _with_h200_memory(hw: HardwareProfile, *, bandwidth: bool) -> HardwareProfile:
    """`hw` with the H200's HBM capacity and cuBLAS workspace (and its HBM bandwidth, with
    the rates of the memory-bound kernel classes measured at it, where both profiles
    have them)."""
    h200 = resolve_hardware("hgx-h200")
    out = replace(hw, hbm_bytes=h200.hbm_bytes, blas_workspace_bytes=h200.blas_workspace_bytes)
    if not bandwidth:
        return out
    out = replace(out, hbm_bandwidth_bytes_per_s=h200.hbm_bandwidth_bytes_per_s)
    if out.kernels is None or h200.kernels is None:
        return out
    return replace(out, kernels=replace(
        out.kernels, memory_bytes_per_s=h200.kernels.memory_bytes_per_s))


def _count(rows: list[Row]) -> str:
    """"13 of C-A, 2 of C-B": rows by case, in order of appearance."""
    by_case = {r["case"]: 0 for r in rows}
    for r in rows:
        by_case[r["case"]] += 1
    return ", ".join(f"{n} of {case}" for case, n in by_case.items())


def _every_collective(src: Sources) -> list[Row]:
    """Every nccl-tests case, each on the profile of its hardware."""
    h100, h200, a100 = (resolve_hardware(n) for n in ("dgx-h100", "hgx-h200", "dgx-a100"))
    return (pc.dgx_h100_sweep(src.cases, h100) + pc.maintainer_ring(src.cases, h100, fabric="ndr")
            + pc.h200_sweep(src.cases, h200) + pc.hgx_a100(src.cases, a100)
            + pc.maintainer_ring(src.cases, a100, fabric="dgx_a100"))


def _hgx_h200(src: Sources, hw: HardwareProfile) -> Evidence:
    steps = src.h200_runs(hw, BAND_METRICS)
    coll = pc.h200_sweep(src.cases, hw) + pc.maintainer_ring(src.cases, hw, fabric="ndr")
    return Evidence(steps=steps, world_size=1, collectives=coll, parts=[
        f"{len(steps)} runs of {H200_RUNS} (one H200, FSDP2, rank 0 of a fake group: no "
        "communication)",
        f"collectives: {_count(coll)}"])


def _dgx_h100(src: Sources, hw: HardwareProfile) -> Evidence:
    h200 = src.h200_runs(_with_h200_memory(hw, bandwidth=True), BAND_METRICS)
    own = src.h200_runs(_with_h200_memory(hw, bandwidth=False), ("step_time_s",))
    low, high = pct_range([(1.0 + a["step_time_s"]) / (1.0 + b["step_time_s"]) - 1.0
                           for a, b in zip(own, h200, strict=True)])
    tt = pc.torchtitan_llama3_8b(src.cases, hw)
    coll = pc.dgx_h100_sweep(src.cases, hw) + pc.maintainer_ring(src.cases, hw, fabric="ndr")
    return Evidence(steps=h200, world_size=1, collectives=coll, parts=[
        f"{len(h200)} runs of {H200_RUNS} (one H200, no communication) replayed on "
        "dgx-h100 with the H200's HBM capacity, bandwidth, cuBLAS workspace and "
        "memory-bound kernel rates (the same GH100 die, clocks, power and host, so they "
        "check every rate dgx-h100 carries from the H200 but not its HBM bandwidth scaling)",
        f"not checked by any run: with dgx-h100's own HBM bandwidth and memory-bound rates "
        f"(the H200's x 3350 / 4800) the same runs are predicted {100 * low:+.1f}.."
        f"{100 * high:+.1f}% longer",
        *(f"out of domain, not in the ranges: 1 step of {r['run']} (torchtitan on 8 H100 "
          f"96GB HBM2e held to 500 W, not the 80GB HBM3 part at 700 W modelled here): step "
          f"time {100 * r['step_time_s']:+.1f}%" for r in tt),
        f"collectives: {_count(coll)}"])


def _a100_memory(src: Sources, hw: HardwareProfile) -> list[Row]:
    return src.h200_runs(_with_h200_memory(hw, bandwidth=False), ("peak_memory_bytes",))


def _dgx_a100(src: Sources, hw: HardwareProfile) -> Evidence:
    mpt = pc.mpt7b_a100(src.cases, hw)
    memory = _a100_memory(src, hw)
    coll = pc.hgx_a100(src.cases, hw) + pc.maintainer_ring(src.cases, hw, fabric="dgx_a100")
    return Evidence(steps=mpt + memory, world_size=max(r["world_size"] for r in mpt),
                    collectives=coll, parts=[
        f"{len(mpt)} steps of MOS-MPT7B-FSDP-8xA100-80-noAC and "
        "MOS-MPT7B-FSDP-scaling-A100-40-RoCE (llm-foundry, FSDP1 on 8-128 A100, with "
        "communication; step time only)",
        f"{len(memory)} runs of {H200_RUNS} replayed on dgx-a100 with the H200's HBM "
        "capacity and cuBLAS workspace (peak memory only)",
        f"collectives: {_count(coll)}"])


def _pcie_a100(src: Sources, hw: HardwareProfile) -> Evidence:
    mpt = pc.mpt7b_a100(src.cases, resolve_hardware("dgx-a100"))
    memory = _a100_memory(src, hw)
    coll = _every_collective(src)
    return Evidence(steps=mpt + memory, world_size=1, collectives=coll, parts=[
        f"{len(mpt)} steps of the MPT-7B A100 SXM cases replayed on dgx-a100, the nearest "
        "validated profile (same GPU; pcie-a100's PCIe links and NICs have no runs: its "
        "communication is not validated; step time only)",
        f"{len(memory)} runs of {H200_RUNS} replayed on pcie-a100 with the H200's HBM "
        "capacity and cuBLAS workspace (peak memory only)",
        f"collectives: no nccl-tests case on this hardware; every case's range "
        f"({_count(coll)})"])


def _local_cpu(src: Sources, hw: HardwareProfile) -> Evidence:
    rows = cpu_rows(src.cpu_dir)
    coll = _every_collective(src)
    batches = len({r["run"].split(" ")[0] for r in rows})
    return Evidence(steps=rows, world_size=max(r["world_size"] for r in rows),
                    collectives=coll, parts=[
        f"{len(rows)} steps of {batches} batches of {BUDGET_REPORT} (gloo on the "
        "repository's 2-core hosts, world 2 and 4, each batch with its own calibrated "
        "profile: zsim validate error-budget)",
        f"collectives: no nccl-tests case on this hardware; every case's range "
        f"({_count(coll)})"])


def _unmeasured(src: Sources, hw: HardwareProfile) -> Evidence:
    """A profile with no runs of its own (dgx-b200, gb200-nvl72, mi300x): hgx-h200's runs
    as hgx-h200 predicts them (its efficiencies are the H200's, carried as fractions), the
    H200 runs replayed on the profile with the H200's memory for peak memory, and every
    collective case's range. World size 1: any multi-GPU plan is extrapolated."""
    steps = src.h200_runs(resolve_hardware("hgx-h200"), ("step_time_s",))
    memory = src.h200_runs(_with_h200_memory(hw, bandwidth=False), ("peak_memory_bytes",))
    coll = _every_collective(src)
    return Evidence(steps=steps + memory, world_size=1, collectives=coll, parts=[
        f"no run on this hardware: {len(steps)} runs of {H200_RUNS} as hgx-h200 predicts "
        f"them, whose measured efficiencies {hw.name} carries as fractions of its own peaks "
        "(step time only; its own GPU, links and host are not validated)",
        f"{len(memory)} runs of {H200_RUNS} replayed on {hw.name} with the H200's HBM "
        "capacity and cuBLAS workspace (peak memory only)",
        f"collectives: no nccl-tests or rccl-tests case on this hardware; every case's range "
        f"({_count(coll)})"])


PROFILES: dict[str, Callable[[Sources, HardwareProfile], Evidence]] = {
    "dgx-h100": _dgx_h100, "hgx-h200": _hgx_h200, "dgx-a100": _dgx_a100,
    "pcie-a100": _pcie_a100, "local-cpu": _local_cpu, "dgx-b200": _unmeasured,
    "gb200-nvl72": _unmeasured, "mi300x": _unmeasured}
"""Every shipped profile and the evidence that covers it."""


_LABEL = re.compile(r"^(?P<strategy>[a-z0-9-]+?)(?:\(\d+x\d+\))?(?:\[(?P<impl>[\w-]+)\])?"
                    r"(?P<axes>(?: (?:tp|pp|cp)=\S+)*) ac=(?P<ac>\w+) mb=(?P<mb>\d+)"
                    r"(?P<extra>.*)$")


def label_program(label: str) -> tuple[str, str, int]:
    """(program, kind, micro-batch) of a plan label (zsim.spec.plan.Plan.label) of the
    CPU validation, whose plans are bf16: zsim.spec.error_bands.program_of and plan_kind
    read back from it.

    Raises:
        ConfigError: a label that is not a plan's.
    """
    m = _LABEL.match(label)
    if m is None or m["strategy"] not in STRATEGIES:
        raise ConfigError("plan", label, "is not a plan label")
    impl = m["impl"] or default_program(m["strategy"]).name
    axes = "".join(f"+{a.strip()[:2]}" for a in m["axes"].split(" ") if a.strip())
    kind = "offload" if "offload=" in m["extra"] else (
        "recompute" if m["ac"] != "none" else "plain")
    return f"{m['strategy']}[{impl}]{axes}", kind, int(m["mb"])


def cpu_rows(folder: Path, report: str = BUDGET_REPORT) -> list[Row]:
    """Every row of the CPU validation's batches (those of `report` in the evidence
    folder `folder`, zsim.validation.evidence) as a step row with communication, one per
    (batch, case, world size), with the residual of each BAND_METRICS figure it has.

    Raises:
        ConfigError: a report with no batch there.
    """
    names = [b.name for b in evidence.read_batches(folder) if b.report == report]
    if not names:
        raise ConfigError("report", report, f"has no batch in {folder}")
    table = evidence.by_batch(evidence.read_table(folder))
    by_run: dict[str, Row] = {}
    for r in (r for name in names for r in table.get(name, [])):
        if r["metric"] not in BAND_METRICS or r["error_pct"] is None:
            continue
        key = f"{r['batch']} {evidence.case_key(r)}"
        if key not in by_run:
            program, kind, mb = label_program(r["plan"])
            by_run[key] = {"run": key, "kind": kind, "program": program,
                           "world_size": r["nproc"], "micro_batch": mb,
                           "communication": True}
        by_run[key][r["metric"]] = r["error_pct"] / 100.0
    return list(by_run.values())


def program_errors(rows: list[Row], metric: str) -> dict[str, Range]:
    """Per program, the range of its cases' mean error of `metric` over the batches (a
    case: one model and plan at one world size), and OTHER_PROGRAM: all of them."""
    by_case: dict[tuple[str, int, str], list[float]] = {}
    for r in rows:
        if metric in r:
            case = r["run"].split(" ", 1)[1]
            by_case.setdefault((r["program"], r["world_size"], case), []).append(r[metric])
    means: dict[str, list[float]] = {}
    for (program, _, _), errors in sorted(by_case.items()):
        means.setdefault(program, []).append(statistics.mean(errors))
    out = {p: pct_range(v) for p, v in sorted(means.items())}
    out[OTHER_PROGRAM] = pct_range([m for v in means.values() for m in v])
    return out


def profile_bands(name: str, *, cases_dir: Path = CASES_DIR,
                  cpu_dir: Path = CPU_DIR) -> ErrorBands:
    """The error bands the evidence gives profile `name` (a PROFILES key).

    Raises:
        ConfigError: a profile with no evidence listed.
    """
    if name not in PROFILES:
        raise ConfigError("profile", name, f"has no evidence listed; one of {', '.join(PROFILES)}")
    cases = {c["id"]: c for c in read_yaml(cases_dir / "published.yaml", field="cases")["cases"]}
    src = Sources(cases=cases, cases_dir=cases_dir, cpu_dir=cpu_dir)
    ev = PROFILES[name](src, resolve_hardware(name))
    cpu = cpu_rows(cpu_dir)
    cpu_batches = len({r["run"].split(" ")[0] for r in cpu})
    metrics = {}
    for metric in BAND_METRICS:
        rows = [r for r in ev.steps if metric in r]
        metrics[metric] = MetricBand(
            kinds=band_ranges(rows, metric),
            micro_batches=(min(r["micro_batch"] for r in rows),
                           max(r["micro_batch"] for r in rows)),
            programs=tuple(sorted({r["program"] for r in rows})),
            program_errors=program_errors(cpu, metric),
            world_size=ev.world_size if metric == "step_time_s" else None)
    parts = [*ev.parts, f"programs not run here: each program's mean error over the "
                        f"{cpu_batches} batches of {BUDGET_REPORT}"]
    return ErrorBands(metrics=metrics,
                      collectives=pct_range([r["residual"] for r in ev.collectives]),
                      runs=len({r["run"] for r in ev.steps}), evidence=tuple(parts),
                      source=f"zsim calibrate bands --profile {name}")


def section_yaml(bands: ErrorBands) -> str:
    """The profile's `error_bands:` section (YAML, flow style inside each metric)."""
    d = bands.to_dict()

    def flow(v: Any) -> str:
        if isinstance(v, dict):
            return "{" + ", ".join(f"{json.dumps(k)}: {flow(x)}" for k, x in v.items()) + "}"
        return json.dumps(v)

    lines = ["error_bands:",
             f"  # Generated from the evidence below by: {bands.source} --write",
             "  # (not edited by hand). Ranges: residuals predicted / measured - 1, percent, per",
             "  # kind of plan; the domain the runs covered, and how a plan outside it widens",
             "  # its band: zsim.spec.error_bands, docs/error-bands.md.",
             f"  runs: {d['runs']}"]
    for metric in BAND_METRICS:
        lines.append(f"  {metric}:")
        lines += [f"    {k}: {flow(v)}" for k, v in d[metric].items()]
    lines.append(f"  collectives: {flow(d['collectives'])}")
    lines.append("  evidence:")
    lines += [f"    - {json.dumps(e)}" for e in d["evidence"]]
    lines.append(f"  source: {d['source']}")
    return "\n".join(lines) + "\n"


def with_section(text: str, section: str) -> str:
    """A profile's YAML text with its `error_bands:` section replaced by `section` (or
    `section` appended), the rest kept byte for byte."""
    lines = text.splitlines(keepends=True)
    start = next((i for i, line in enumerate(lines) if line.startswith("error_bands:")), None)
    if start is None:
        return text + ("" if text.endswith("\n") else "\n") + section
    end = next((i for i in range(start + 1, len(lines))
                if lines[i].strip() and not lines[i].startswith((" ", "#"))), len(lines))
    return "".join(lines[:start]) + section + "".join(lines[end:])


def write_section(name: str, section: str) -> Path:
    """Put `section` into the shipped profile NAME's YAML (zsim.spec.registry.PROFILES_DIR),
    the rest of the file kept byte for byte.

    Returns:
        The profile's path.
    """
    path = PROFILES_DIR / f"{name}.yaml"
    path.write_text(with_section(path.read_text(), section))
    return path
