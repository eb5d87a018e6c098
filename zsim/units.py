"""Units and dtype sizes. Internally zsim uses SI base units only (bytes, seconds, FLOPs);
human units (GB, GiB, us) appear only in YAML keys, CLI output and report columns, and are
converted here, once."""

from typing import Literal, get_args

GB = 1e9
"""Decimal gigabyte, bytes."""
GiB = 2**30
"""Binary gibibyte, bytes."""
MiB = 2**20
US = 1e-6
"""One microsecond, seconds."""
MS = 1e-3
"""One millisecond, seconds."""

Dtype = Literal["fp32", "bf16", "fp16", "int8"]
DTYPES: tuple[str, ...] = get_args(Dtype)
DTYPE_BYTES: dict[str, int] = {"fp32": 4, "bf16": 2, "fp16": 2, "int8": 1}
FP32_BYTES = DTYPE_BYTES["fp32"]
"""Bytes of one fp32 element (upcast logits, norm statistics, optimizer states)."""


def dtype_bytes(dtype: str) -> int:
    """Bytes per element of a dtype name ("fp32", "bf16", "fp16", "int8")."""
    return DTYPE_BYTES[dtype]
