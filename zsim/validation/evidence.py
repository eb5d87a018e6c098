"""The committed validation evidence (reports/validation/): every row that a batch
of real runs measured and the simulator predicted, in one long table, with the batches
that measured them and the profiles they are predicted with.

Owns the folder's layout and formats:

- `validation.csv` (TABLE_FIELDS): one row per batch, case and metric: the batch; the
  time of the pass of the batch that measured it (`time_utc`, a pass of batches.yaml);
  the case (model, plan label, world size `nproc`, backend, and for a GPU report's rows
  its run); the metric; its `predicted` and `measured` figures; `error_pct` (predicted /
  measured - 1, percent); `bound_pct`, the report's bound for the metric (empty where
  none holds); and a note (why a row has no prediction). Rows are grouped by batch, in
  batches.yaml's order.
- `step_time_runs.csv` (RUN_FIELDS): each timed run's median step time per case, the
  host's run-to-run spread.
- `batches.yaml`: each batch (Batch): the report it belongs to, what the tests hold it to
  (`bounds`), the profiles it is predicted with, and the passes that measured its rows
  (time, commit, host, command).
- `profiles/`: the profiles the batches calibrated.

A report is a series of batches of the same cases on one kind of host (the grid's
`validation`, `validation-cpu2` on the repository's 2-core host, ...); its own batch bears
its name, later ones another. Writing goes through zsim.atomic. Imports no torch.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, cast, get_args

import yaml

from zsim.atomic import write_files
from zsim.errors import ConfigError
from zsim.spec.hardware import HardwareProfile
from zsim.spec.registry import PROFILES_DIR
from zsim.spec.yaml_file import read_yaml

EVIDENCE_DIR = Path(__file__).resolve().parents[2] / "reports" / "validation"
"""The repository's evidence folder (in a checkout)."""

TABLE = "validation.csv"
RUNS = "step_time_runs.csv"
BATCHES = "batches.yaml"
PROFILES = "profiles"

TABLE_FIELDS = ("batch", "time_utc", "model", "plan", "nproc", "backend", "run", "metric",
                "predicted", "measured", "error_pct", "bound_pct", "note")
"""Columns of validation.csv."""
NUMBERS = ("predicted", "measured", "error_pct", "bound_pct")
"""Its numeric columns: read back as float, an empty cell as None."""
RUN_FIELDS = ("batch", "model", "plan", "nproc", "run", "steps", "step_time_s",
              "vs_median_run_pct")
"""Columns of step_time_runs.csv."""

Bounds = Literal["held", "missed", "not held"]
"""What the tests hold a batch to: every predicted row within its bound_pct (held); a
step-time row out of its bound, the other rows within (missed: an expected failure that
fails the suite once every row is within, so that the entry must then say held); or
nothing (not held: a batch kept to show how far batches of one host spread)."""

Row = dict[str, Any]


@dataclass(frozen=True, slots=True, kw_only=True)
class Batch:
    """One batch of batches.yaml."""

    name: str
    """The batch's name (its rows' `batch`)."""
    report: str
    """The report it belongs to (the name of that report's own batch)."""
    bounds: Bounds
    why: str = ""
    """For bounds missed: how the batch falls short, and why."""
    about: str = ""
    """What the batch ran: its cases, code and host, in words."""
    cases: int
    """Cases (model, plan, world size) with rows."""
    kernel_knobs: dict[str, Any] = field(default_factory=dict)
    """ModelSpec kernel knobs of its runs (zsim.validation.comparison.backend_knobs)."""
    profiles: dict[int, str] = field(default_factory=dict)
    """World size -> the profile its cases are predicted with: a shipped profile's name,
    or a path relative to the evidence folder; none for rows predicted where they ran
    (a GPU report's), which are not predicted again."""
    passes: tuple[dict[str, Any], ...] = ()
    """The passes that measured its rows, each with time_utc (the rows' time_utc),
    commit (None: not recorded), host, command and torch, and what it ran."""

    def __post_init__(self) -> None:
        if self.bounds not in get_args(Bounds):
            raise ConfigError(f"batches.{self.name}.bounds", self.bounds,
                              f"must be one of {', '.join(get_args(Bounds))}")
        if (self.bounds == "missed") != bool(self.why):
            raise ConfigError(f"batches.{self.name}.why", self.why or None,
                              "a batch that misses its bounds says why, and only such a batch")
        check_name(self.name)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"batch": self.name, "report": self.report,
                               "bounds": self.bounds}
        if self.why:
            out["why"] = self.why
        if self.about:
            out["about"] = self.about
        return out | {"cases": self.cases, "kernel_knobs": self.kernel_knobs,
                      "profiles": self.profiles, "passes": list(self.passes)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Batch:
        """Raises: ConfigError: a missing or unknown key."""
        name = str(data.get("batch"))
        need = {"batch", "report", "bounds", "cases"}
        missing = sorted(need - set(data))
        unknown = sorted(set(data) - need - {"why", "about", "kernel_knobs", "profiles",
                                             "passes"})
        if missing or unknown:
            raise ConfigError(f"batches.{name}", missing or unknown,
                              "missing keys" if missing else "unknown keys")
        return cls(name=name, report=str(data["report"]), bounds=data["bounds"],
                   why=str(data.get("why", "")), about=str(data.get("about", "")),
                   cases=int(data["cases"]), kernel_knobs=dict(data.get("kernel_knobs") or {}),
                   profiles={int(n): str(p) for n, p in (data.get("profiles") or {}).items()},
                   passes=tuple(dict(p) for p in data.get("passes") or ()))


def check_name(name: str) -> None:
    """A batch's name is a plain word of the table (it names its profiles' files).

    Raises:
        ConfigError: an empty name, or one with a '/', a ',' or a leading '.'.
    """
    if not name or any(c in name for c in "/,\n") or name.startswith("."):
        raise ConfigError("batch", name, "must be a plain name (no '/', ',' or leading '.')")


def case_key(row: Mapping[str, Any]) -> str:
    """A row's case as zsim.validation.grid.case_key names it: '<model> <plan> n<N>'."""
    return f"{row['model']} {row['plan']} n{row['nproc']}"


def read_batches(root: Path) -> list[Batch]:
    """The batches of the evidence folder `root`, in order.

    Raises:
        ConfigError: `root` is not a folder, it has no batches.yaml, or a bad batch.
    """
    if not Path(root).is_dir():
        raise ConfigError("folder", str(root), "is not a folder")
    data = read_yaml(Path(root) / BATCHES, field="batches")
    if not isinstance(data, dict) or not isinstance(data.get("batches"), list):
        raise ConfigError("batches", str(Path(root) / BATCHES), "must be a mapping with a "
                          "list of batches under 'batches'")
    out = [Batch.from_dict(b) for b in data["batches"]]
    names = [b.name for b in out]
    if len(set(names)) < len(names):
        raise ConfigError("batches", sorted({n for n in names if names.count(n) > 1}),
                          "each batch needs its own name")
    return out


def batch_of(batches: Iterable[Batch], name: str) -> Batch:
    """The batch called `name`.

    Raises:
        ConfigError: none is.
    """
    every = list(batches)
    for b in every:
        if b.name == name:
            return b
    raise ConfigError("batch", name, f"no such batch; known: {', '.join(b.name for b in every)}")


def read_table(root: Path) -> list[Row]:
    """validation.csv's rows: nproc an int, the NUMBERS floats (an empty cell None), the
    rest strings; none if the file does not exist."""
    rows = _read_csv(Path(root) / TABLE)
    for row in rows:
        row["nproc"] = int(row["nproc"])
        for k in NUMBERS:
            row[k] = float(row[k]) if row[k] != "" else None
    return rows


def read_runs(root: Path) -> list[Row]:
    """step_time_runs.csv's rows, as strings (none if the file does not exist)."""
    return _read_csv(Path(root) / RUNS)


def profile_path(root: Path, ref: str) -> Path:
    """The YAML of a batch's profile reference: a shipped profile's name, or a path
    relative to the evidence folder `root`."""
    return Path(root) / ref if ref.endswith(".yaml") else PROFILES_DIR / f"{ref}.yaml"


def batch_profiles(root: Path, batch: Batch) -> dict[int, HardwareProfile]:
    """The profiles the batch predicts with, by world size.

    Raises:
        ConfigError: a profile file that is missing or bad.
    """
    return {n: HardwareProfile.from_yaml(profile_path(root, ref))
            for n, ref in batch.profiles.items()}


def by_batch(rows: Iterable[Row]) -> dict[str, list[Row]]:
    """Rows grouped by their batch, each group in its order."""
    out: dict[str, list[Row]] = {}
    for row in rows:
        out.setdefault(row["batch"], []).append(row)
    return out


def write(root: Path, batches: Sequence[Batch], rows: Mapping[str, Sequence[Row]],
          runs: Mapping[str, Sequence[Row]]) -> list[Path]:
    """Write batches.yaml, validation.csv and step_time_runs.csv into `root` together
    (zsim.atomic), the rows of each batch (by name in `rows` and `runs`) in the order of
    `batches`.

    Raises:
        ConfigError: rows of a batch that `batches` does not list.
    """
    names = [b.name for b in batches]
    for grouped in (rows, runs):
        unknown = sorted(set(grouped) - set(names))
        if unknown:
            raise ConfigError("batch", unknown, "has rows but is not in batches.yaml")
    text = yaml.safe_dump({"batches": [b.to_dict() for b in batches]}, sort_keys=False,
                          width=100, allow_unicode=True)
    return write_files(Path(root), {
        BATCHES: (_HEADER + text).encode(),
        TABLE: _csv([r for n in names for r in rows.get(n, ())], TABLE_FIELDS),
        RUNS: _csv([r for n in names for r in runs.get(n, ())], RUN_FIELDS)})


_HEADER = """\
# The validation batches: every row of validation.csv names its batch, and its time_utc
# the pass below that measured it. Schema and meaning: zsim.validation.evidence.Batch;
# where the evidence lives: docs/validation.md. Written by `zsim validate grid`; bounds,
# why and about are a person's (tests/validation/test_validation_report.py reads them).
"""


def _read_csv(path: Path) -> list[Row]:
    if not path.is_file():
        return []
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def _csv(rows: Iterable[Row], fields: tuple[str, ...]) -> bytes:
    """Rows with the `fields` columns, in order; None is an empty cell, a float its
    shortest repr (so a row read back and written again is the same bytes)."""
    text = io.StringIO(newline="")
    writer = csv.DictWriter(text, fieldnames=fields)
    writer.writeheader()
    for row in rows:
        writer.writerow({k: "" if row.get(k) is None else row[k] for k in fields})
    return cast(str, text.getvalue()).encode()
