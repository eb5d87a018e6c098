"""zsim.validation.evidence: the committed evidence folder is what its writer writes (read
back and written again, every table and batches.yaml is the same bytes), a batch
round-trips through to_dict/from_dict, and a bad batches.yaml is a ConfigError naming the
field."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from zsim.errors import ConfigError
from zsim.validation import evidence

EVIDENCE = Path(__file__).resolve().parents[2] / "reports" / "validation"


def test_the_committed_folder_is_what_the_writer_writes(tmp_path: Path) -> None:
    batches = evidence.read_batches(EVIDENCE)
    evidence.write(tmp_path, batches, evidence.by_batch(evidence.read_table(EVIDENCE)),
                   evidence.by_batch(evidence.read_runs(EVIDENCE)))
    for name in (evidence.TABLE, evidence.RUNS, evidence.BATCHES):
        assert (tmp_path / name).read_bytes() == (EVIDENCE / name).read_bytes(), name
    for b in batches:
        assert evidence.Batch.from_dict(b.to_dict()) == b


def _write(root: Path, batches: list[dict[str, Any]]) -> None:
    root.mkdir(exist_ok=True)
    (root / evidence.BATCHES).write_text(yaml.safe_dump({"batches": batches}))


GOOD = {"batch": "b", "report": "r", "bounds": "held", "cases": 1}


@pytest.mark.parametrize(("batches", "field", "needle"), [
    ([{**GOOD, "colour": "red"}], "batches.b", "unknown keys"),
    ([{k: v for k, v in GOOD.items() if k != "report"}], "batches.b", "missing keys"),
    ([{**GOOD, "bounds": "mostly"}], "batches.b.bounds", "must be one of"),
    ([{**GOOD, "bounds": "missed"}], "batches.b.why", "says why"),
    ([{**GOOD, "why": "because"}], "batches.b.why", "only such a batch"),
    ([GOOD, GOOD], "batches", "its own name"),
    ([{**GOOD, "batch": "a/b"}], "batch", "plain name"),
])
def test_bad_batches_are_config_errors(tmp_path: Path, batches: list[dict[str, Any]],
                                       field: str, needle: str) -> None:
    _write(tmp_path, batches)
    with pytest.raises(ConfigError) as e:
        evidence.read_batches(tmp_path)
    assert e.value.field == field and needle in e.value.reason


def test_rows_of_a_batch_not_listed_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"not in batches\.yaml"):
        evidence.write(tmp_path, [], {"ghost": [{"batch": "ghost"}]}, {})
    assert not tmp_path.joinpath(evidence.TABLE).exists()
