"""The storage section of a hardware profile: units, and bad input naming the key."""

from __future__ import annotations

from typing import Any

import pytest

from zsim.errors import ConfigError
from zsim.spec.registry import hardware_names, resolve_hardware
from zsim.spec.storage import KEYS, Storage

GOOD: dict[str, Any] = {
    "name": "fs", "aggregate_write_gb_per_s": 100, "aggregate_read_gb_per_s": 200,
    "client_write_gb_per_s": 10, "client_read_gb_per_s": 20, "stream_write_gb_per_s": 1,
    "stream_buffered_write_gb_per_s": 1.5,
    "stream_read_gb_per_s": 2, "stage_gb_per_s": 5, "file_create_ms": 2,
    "plan_item_us": 40, "source": "test"}


def test_units_convert_once() -> None:
    s = Storage.from_dict(GOOD)
    assert s.aggregate_write_bytes_per_s == 100e9
    assert s.stream_read_bytes_per_s == 2e9
    assert s.file_create_s == pytest.approx(2e-3)
    assert s.plan_item_s == pytest.approx(40e-6)
    # Without fresh_item_mib a host keeps glibc's default threshold, 32 MiB.
    assert s.fresh_item_bytes == 32 * 2**20
    assert Storage.from_dict({**GOOD, "fresh_item_mib": 1024}).fresh_item_bytes == 2**30
    # Without copy_gb_per_s a load's read and fresh pages are charged whole.
    assert s.copy_bytes_per_s == float("inf")
    assert Storage.from_dict({**GOOD, "copy_gb_per_s": 8}).copy_bytes_per_s == 8e9


@pytest.mark.parametrize("name", hardware_names())
def test_every_shipped_profile_has_storage(name: str) -> None:
    assert resolve_hardware(name).storage is not None


@pytest.mark.parametrize(("change", "field"), [
    ({"stream_write_gb_per_s": 0}, "storage.stream_write_gb_per_s"),
    ({"file_create_ms": "fast"}, "storage.file_create_ms"),
    ({"aggregate_write_gbps": 1}, "storage.aggregate_write_gbps"),
    ({"source": ""}, "storage.source"),
    ({"fresh_item_mib": -1}, "storage.fresh_item_mib"),
    ({"copy_gb_per_s": 0}, "storage.copy_gb_per_s"),
])
def test_bad_values_name_the_key(change: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError) as err:
        Storage.from_dict({**GOOD, **change})
    assert err.value.field == field


def test_a_missing_key_is_named() -> None:
    for key in KEYS:
        with pytest.raises(ConfigError, match=key):
            Storage.from_dict({k: v for k, v in GOOD.items() if k != key})
