"""Tables: rows of records -> aligned text, CSV or JSON. No simulation, no pandas (the
planner's answer must come in well under a second)."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Collection, Mapping, Sequence


def _cell(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "NO"
    if isinstance(value, float):
        return f"{value:,.3g}" if abs(value) < 1000 else f"{value:,.0f}"
    return str(value)


def text_table(rows: Sequence[dict[str, object]], columns: Sequence[str], *,
               headers: Mapping[str, tuple[str, str]] | None = None,
               left: Collection[str] = ()) -> str:
    """An aligned text table of `columns`: the first and last columns and those in `left`
    left-aligned, the others (numbers) right-aligned. `headers` maps a column to a title
    and its unit, printed on two header lines (the unit under the title) instead of the
    column's name."""
    cells = [[_cell(r[c]) for c in columns] for r in rows]
    heads = [headers[c] if headers and c in headers else (c, "") for c in columns]
    widths = [max([len(t), len(u)] + [len(row[i]) for row in cells])
              for i, (t, u) in enumerate(heads)]
    lefts = {0, len(columns) - 1} | {i for i, c in enumerate(columns) if c in left}

    def line(values: Sequence[str]) -> str:
        parts = [v.ljust(w) if i in lefts else v.rjust(w)
                 for i, (v, w) in enumerate(zip(values, widths, strict=True))]
        return "  ".join(parts).rstrip()

    out = [line([t for t, _ in heads])]
    if any(u for _, u in heads):
        out.append(line([u for _, u in heads]))
    out.append(line(["-" * w for w in widths]))
    out += [line(row) for row in cells]
    return "\n".join(out)


def csv_text(rows: Sequence[dict[str, object]]) -> str:
    """CSV with a header of every key of the first row."""
    buf = io.StringIO()
    if rows:
        writer = csv.DictWriter(buf, fieldnames=list(rows[0]), lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
    return buf.getvalue()


def json_text(obj: object) -> str:
    """Deterministic JSON (sorted keys are not used: column order is meaningful)."""
    return json.dumps(obj, indent=2)
