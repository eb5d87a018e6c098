"""User-facing errors. The CLI turns any ZsimError into one line and exit code 2; anything
else is a bug and keeps its traceback."""

from __future__ import annotations


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
        super().__init__(f"{field}={value!r}: {reason}")

    def __reduce__(self) -> tuple[type[ConfigError], tuple[str, object, str]]:
        # Rebuilt from its fields, so it crosses process boundaries (zsim.fanout).
        return (ConfigError, (self.field, self.value, self.reason))
