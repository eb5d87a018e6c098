"""The shipped dgx-b200, gb200-nvl72 and mi300x profiles load with their datasheet
figures, and node.nvlink_domain_gpus and intra_node.mesh_link_gb_per_s are checked."""

from __future__ import annotations

import pytest

from zsim.errors import ConfigError
from zsim.spec.hardware import HardwareProfile
from zsim.spec.registry import PROFILES_DIR, resolve_hardware
from zsim.spec.yaml_file import read_yaml


@pytest.mark.parametrize(("name", "bf16_tflops", "hbm_tb_per_s", "nvlink_gb_per_s"), [
    ("dgx-b200", 2250, 8.0, 900), ("gb200-nvl72", 2500, 8.0, 900), ("mi300x", 1307.4, 5.3, 448)])
def test_profile_loads_with_its_datasheet_figures(name: str, bf16_tflops: float,
                                                  hbm_tb_per_s: float,
                                                  nvlink_gb_per_s: float) -> None:
    hw = resolve_hardware(name)
    assert hw.peak("bf16") == bf16_tflops * 1e12
    assert hw.hbm_bandwidth_bytes_per_s == hbm_tb_per_s * 1e12
    assert hw.intra_node.bandwidth_bytes_per_s == nvlink_gb_per_s * 1e9
    assert hw.kernels is None  # no measurements of our own: peak x efficiency
    assert hw.storage is not None and hw.error_bands is not None


def test_nvl72_domain_is_the_rack_and_hosts_are_trays() -> None:
    hw = resolve_hardware("gb200-nvl72")
    assert (hw.gpus_per_node, hw.domain_gpus, hw.domain_name) == (4, 72, "NVLink domain")
    b200 = resolve_hardware("dgx-b200")
    assert (b200.domain_gpus, b200.domain_name) == (8, "node")


def test_mi300x_mesh_gives_a_group_its_direct_links() -> None:
    link = resolve_hardware("mi300x").intra_node
    assert [link.group_bytes_per_s(r) / 1e9 for r in (1, 2, 4, 8)] == [448, 64, 192, 448]


def _data(name: str) -> dict:
    return read_yaml(PROFILES_DIR / f"{name}.yaml", field="hardware")


def test_a_domain_must_be_whole_hosts() -> None:
    data = _data("gb200-nvl72")
    data["node"]["nvlink_domain_gpus"] = 70
    with pytest.raises(ConfigError, match=r"node\.nvlink_domain_gpus.*multiple of "
                                          r"gpus_per_node=4"):
        HardwareProfile.from_dict(data, name="bad")


def test_mesh_link_belongs_to_intra_node_only() -> None:
    data = _data("mi300x")
    data["inter_node"]["mesh_link_gb_per_s"] = 64
    with pytest.raises(ConfigError, match=r"inter_node\.mesh_link_gb_per_s.*unknown key"):
        HardwareProfile.from_dict(data, name="bad")
