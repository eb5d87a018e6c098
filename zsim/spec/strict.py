"""Strict reading of a spec dataclass from a mapping (a scenario's plan, its DeepSpeed and
FSDP1 sections): every key must be a field, every field without a default must be given.
Owns that check, and the hint that names the known key nearest to a misspelt one (for
the readers of users' DeepSpeed and accelerate configs too); each dataclass checks its
values itself."""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from dataclasses import MISSING, fields
from typing import Any

from zsim.errors import ConfigError


def check_keys(cls: type, data: Any, *, where: str) -> dict[str, Any]:
    """`data` as the keyword arguments of dataclass `cls`.

    Raises:
        ConfigError: `data` is not a mapping, has a key that is no field of `cls`, or
            lacks a field without a default (each named as `where.key`).
    """
    if not isinstance(data, dict):
        raise ConfigError(where, data, "must be a mapping")
    known = {f.name for f in fields(cls)}
    for key in data:
        if key not in known:
            raise ConfigError(f"{where}.{key}", data[key],
                              f"unknown key; known keys: {', '.join(sorted(known))}")
    for f in fields(cls):
        if f.default is MISSING and f.default_factory is MISSING and f.name not in data:
            raise ConfigError(f"{where}.{f.name}", None, "missing required key")
    return data


def nearest_key(key: object, known: Iterable[str]) -> str:
    """"; did you mean 'KEY'?" naming the key of `known` nearest to `key` (difflib's
    similarity ratio, at least its default 0.6: "zero_optimisation" -> "zero_optimization"),
    or "" when none is near or `key` is not a string."""
    if not isinstance(key, str):
        return ""
    match = difflib.get_close_matches(key, sorted(known), n=1)
    return f"; did you mean {match[0]!r}?" if match else ""
