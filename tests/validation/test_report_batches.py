"""The validation report's grid and its batches (`zsim validate grid --only`):
case names are unique, a batch's rows replace its cases' old rows, rows of cases that left
the grid go, and the report keeps the grid's order. No processes are started."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from zsim.validation.grid import case_key, grid
from zsim.validation.report import _merge


def _row(key: str, metric: str, value: float) -> dict[str, object]:
    model, rest = key.split(" ", 1)
    plan, nproc = rest.rsplit(" n", 1)
    return {"model": model, "plan": plan, "nproc": int(nproc), "metric": metric,
            "measured": value}


def test_case_names_are_unique_and_cover_both_blocks() -> None:
    keys = [case_key(spec, plan) for spec, plan in grid()]
    assert len(keys) == len(set(keys))
    for model in ("llama-tiny", "gpt-tiny"):
        for n in (2, 4):
            for program in ("zero1", "zero2", "zero3", "zero2 ac=none mb=2 offload=optimizer",
                            "fsdp[fsdp1]", "fsdp-no-reshard[fsdp1]"):
                assert any(k.startswith(f"{model} {program}") and k.endswith(f" n{n}")
                           for k in keys), (model, program, n)


def test_a_batch_replaces_its_cases_and_keeps_the_grid_order() -> None:
    order = ["m a n2", "m b n2", "m c n2"]
    old = [_row("m a n2", "x", 1), _row("m a n2", "y", 1), _row("m b n2", "x", 1),
           _row("m gone n2", "x", 1), _row("m c n2", "x", 1)]
    new = [_row("m b n2", "x", 2), _row("m b n2", "y", 2)]
    merged = _merge(old, new, order, {"m b n2"})
    assert [(r["plan"], r["metric"], r["measured"]) for r in merged] == [
        ("a", "x", 1), ("a", "y", 1), ("b", "x", 2), ("b", "y", 2), ("c", "x", 1)]
