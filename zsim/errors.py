"""User-facing errors. The CLI turns any ZsimError into one line and exit code 2; anything
else is a bug and keeps its traceback."""

from __future__ import annotations

import reprlib

_VALUE = reprlib.Repr()
_VALUE.maxlevel = 2
_VALUE.maxlist = _VALUE.maxtuple = _VALUE.maxdict = _VALUE.maxset = 6
_VALUE.maxstring, _VALUE.maxlong, _VALUE.maxother = 400, 100, 200
"""How an error spells the offending value: in full when short, else elided with "..."
(a YAML alias can make a value of millions of elements from a few lines)."""


class ZsimError(Exception):
    """Base of every error a user can cause with their input."""


class ConfigError(ZsimError):
    """A field of a model, hardware profile, plan or scenario has a bad value.

    The message names the field path and the offending value.
    """

    def __init__(self, field: str, value: object, reason: str) -> None:
        self.field = field
        self.value = value
        self.reason = reason
        super().__init__(f"{field}={_VALUE.repr(value)}: {reason}")

    def __reduce__(self) -> tuple[type[ConfigError], tuple[str, object, str]]:
        # Rebuilt from its fields, so it crosses process boundaries (zsim.multicore).
        return (ConfigError, (self.field, self.value, self.reason))
