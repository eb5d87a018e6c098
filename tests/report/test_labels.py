"""The words figures show: every sweep-frame column has a label in words with the unit its
name carries, and every memory category, strategy, op kind and stream has its words."""

from __future__ import annotations

from typing import get_args

from zsim.analytic.memory import CATEGORIES
from zsim.report import labels
from zsim.report.dataframes import sweep_frame
from zsim.result import Result
from zsim.scenario import Run
from zsim.schedule.ops import STREAMS, OpKind
from zsim.spec.plan import STRATEGIES

UNITS = {"_s": "s", "_gib": "GiB", "_mib": "MiB", "_gb_per_s": "GB/s"}
"""zsim's column suffixes (STYLE: units in names) and the unit a label shows for each."""


def test_every_frame_column_reads_as_words_with_its_unit(
        toy_pairs: list[tuple[Run, Result]]) -> None:
    for column in sweep_frame(toy_pairs).columns:
        q = labels.column_quantity(column)
        assert "_" not in q.label and q.name[:1].isupper(), column
        if column in labels.COLUMNS:
            continue
        suffix = max((s for s in UNITS if column.endswith(s)), key=len, default="")
        assert q.unit == UNITS.get(suffix, ""), column


def test_labels_by_hand() -> None:
    assert labels.column_quantity("step_time_s").label == "Step time (s)"
    assert labels.column_quantity("peak_memory_gib").label == "Peak memory per GPU (GiB)"
    assert labels.column_quantity("tokens_per_s_per_gpu").label == "Tokens/s per GPU"
    assert labels.column_quantity("mfu") == labels.Quantity("MFU", "%", 100.0)
    # Columns without an entry: words from the name, the unit from its suffix.
    assert labels.column_quantity("at_peak_activations_gib").label == (
        "At peak activations (GiB)")
    assert labels.column_quantity("all_gather_busy_s").unit == "s"
    assert labels.column_quantity("link_gb_per_s").label == "Link (GB/s)"
    assert labels.column_quantity("comm_latency_share").label == "Comm latency share"


def test_every_identifier_a_figure_shows_has_words() -> None:
    for table, keys in ((labels.CATEGORIES, CATEGORIES), (labels.STRATEGIES, STRATEGIES),
                        (labels.KINDS, get_args(OpKind)), (labels.STREAMS, STREAMS)):
        assert set(table) == set(keys)
        assert all("_" not in labels.words(k, table) for k in keys)
    assert labels.words("something_new", labels.KINDS) == "something new"
