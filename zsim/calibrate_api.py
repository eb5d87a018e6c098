"""The entry points of `zsim calibrate`: measure this machine into a hardware profile, and
turn measurements and validation evidence into a profile's figures. cli.py calls these as
it calls zsim.api (resolve names, run, return plain data; no printing).

Commands and what they call: `profile` (zsim.calibration.profile_writer: micro-benchmarks
on N ranks -> a profile YAML), `bands` (zsim.validation.profile_bands: every shipped
profile's error bands from its evidence), `gpu-phases` (zsim.validation.gpu_phases: where
a published GPU step's time goes), `phase-rates` (zsim.validation.phase_rates: kernel
rates read from those phases). Imports no torch (an optional extra of zsim): the modules
it calls, inside its functions, do.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from zsim.errors import ConfigError


def profile(*, backend: str, nproc: int, out: Path) -> Path:
    """Benchmark this machine's collectives and kernels on `nproc` ranks and write a
    hardware profile YAML (with provenance) to `out`.

    Raises:
        ConfigError: unknown backend, nproc < 2, or nccl without as many CUDA devices.
        RankFailed: a benchmark rank failed or hung.
    """
    if backend not in ("gloo", "nccl"):
        raise ConfigError("backend", backend, "must be gloo or nccl")
    if nproc < 1:
        raise ConfigError("nproc", nproc, "must be a positive integer")
    from zsim.calibration.profile_writer import calibrate

    return calibrate(backend, nproc, Path(out))


def bands(*, profiles: Sequence[str] = (), write: bool = False, cases: Path | None = None,
          cpu: Path | None = None) -> dict[str, Any]:
    """Each shipped profile's `error_bands:` section as its evidence gives it
    (zsim.validation.profile_bands); with `write`, put into the profile's YAML.

    Args:
        profiles: shipped profile names (none: every one with evidence listed).
        write: replace each profile's section in its file.
        cases: the folder of published.yaml and h200-fsdp2-runs.yaml (None: tests/data/cases).
        cpu: the validation evidence folder holding the CPU batches
            (zsim.validation.evidence; None: reports/validation).

    Returns:
        {"sections": {name: the section's YAML text}, "written": the paths written}.

    Raises:
        ConfigError: a profile with no evidence listed, or unreadable evidence.
    """
    from zsim.validation import profile_bands as pb

    names = list(profiles) or list(pb.PROFILES)
    sections = {name: pb.section_yaml(pb.profile_bands(
        name, cases_dir=cases or pb.CASES_DIR, cpu_dir=cpu or pb.CPU_DIR)) for name in names}
    written = [str(pb.write_section(n, text)) for n, text in sections.items()] if write else []
    return {"sections": sections, "written": written}


def gpu_phases(*, out: Path, quick: bool = False, budget_s: float = 135.0) -> dict[str, Any]:
    """Profile the published FSDP2 runs phase by phase within `budget_s` seconds
    (zsim.validation.gpu_phases; `quick`: a tiny model on CPU, a smoke test).

    Returns:
        {"written": the phases.csv path}.

    Raises:
        ConfigError: a negative budget.
    """
    if budget_s < 0:
        raise ConfigError("budget_s", budget_s, "must be >= 0")
    from zsim.validation.gpu_phases import run_phases

    command = (f"zsim calibrate gpu-phases --out {out} --budget-s {budget_s:g}"
               + (" --quick" if quick else ""))
    return {"written": str(run_phases(Path(out), quick=quick, budget_s=budget_s,
                                      command=command))}


def phase_rates(*, phases: Path, cases: Path) -> dict[str, Any]:
    """The profile figures read from profiled real steps (zsim.validation.phase_rates):
    attention's rates by pass, the kernel gap per launch, FSDP2's copy-in rate.

    Returns:
        {"text": the figures with the measurements they come from}.

    Raises:
        ConfigError: `phases` is not a gpu-phases output folder, or `cases` not a runs
            file.
    """
    from zsim.validation.phase_rates import rates_text

    return {"text": rates_text(Path(phases), Path(cases))}
