"""HardwareProfile: shipped profiles load and cite sources, strict schema errors name the
field, human units convert to SI once, and efficiencies match the measurements they cite."""

from __future__ import annotations

import copy
import statistics
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from zsim.errors import ConfigError
from zsim.spec.hardware import GLOO_THREADS, HardwareProfile
from zsim.spec.registry import PROFILES_DIR, hardware_names, resolve_hardware

SECTIONS = ("gpu", "node", "intra_node", "inter_node", "collectives", "efficiency")
REQUIRED_PROFILES = {"dgx-a100", "dgx-h100", "hgx-h200", "pcie-a100", "local-cpu"}

TOY: dict[str, Any] = {
    "name": "toy",
    "description": "round numbers",
    "gpu": {"name": "toy gpu", "hbm_gib": 80, "hbm_bandwidth_gb_per_s": 2000,
            "peak_tflops": {"bf16": 100, "fp32": 10}, "source": "made up"},
    "node": {"gpus_per_node": 8, "host_memory_gib": 1024, "pcie_gb_per_s": 32,
             "nvme_read_gb_per_s": 10, "nvme_write_gb_per_s": 5, "source": "made up"},
    "intra_node": {"name": "fast", "bandwidth_gb_per_s": 100, "latency_us": 5,
                   "efficiency": 0.5, "source": "made up",
                   "collective_efficiency": {"all_gather": 1, "reduce_scatter": 0.5,
                                             "all_reduce": 2}},
    "inter_node": {"name": "slow", "bandwidth_gb_per_s": 25, "latency_us": 0,
                   "efficiency": 1, "source": "made up",
                   "collective_efficiency": {"all_gather": 1, "reduce_scatter": 1,
                                             "all_reduce": 1}},
    "collectives": {"model": "nccl", "nvls_busbw_gb_per_s": 0, "source": "made up"},
    "efficiency": {"matmul": 0.5, "attention": 0.25, "memory_bound": 0.75, "pcie": 0.8,
                   "host_adam_params_per_s": 1000000, "comm_compute_slowdown": 0,
                   "compute_comm_slowdown": 0,
                   "kernel_overhead_us": 2.5,
                   "source": "made up"},
    "host": {"launch": "synchronous", "collective_overhead_us": 40, "rank_skew": 0.1,
             "fsdp_unit_overhead_us": 300,
             "checkpoint_overhead_us": {"full": {"forward": 10, "backward": 30},
                                        "selective": {"forward": 50, "backward": 80}},
             "source": "made up"},
}


def _raw(name: str) -> dict[str, Any]:
    return yaml.safe_load((PROFILES_DIR / f"{name}.yaml").read_text())


def _leaves(data: Any, path: str = "") -> list[tuple[str, Any]]:
    if isinstance(data, dict):
        return [leaf for k, v in data.items() for leaf in _leaves(v, f"{path}.{k}")]
    if isinstance(data, list):  # measured kernel rates: rows of numbers
        return [leaf for i, v in enumerate(data) for leaf in _leaves(v, f"{path}[{i}]")]
    return [(path, data)]


def test_required_profiles_ship() -> None:
    assert set(hardware_names()) >= REQUIRED_PROFILES


@pytest.mark.parametrize("name", hardware_names())
def test_profile_loads_and_is_sane(name: str) -> None:
    hw = resolve_hardware(name)
    assert hw.name == name == _raw(name)["name"]
    assert hw.hbm_bytes > 2**30 and hw.gpus_per_node >= 1
    assert "fp32" in hw.peak_flop_per_s and "bf16" in hw.peak_flop_per_s
    # Bus bandwidth never beats line rate in a ring model, and nodes are at least as well
    # connected inside as between.
    assert hw.intra_node.achievable_bytes_per_s <= hw.intra_node.bandwidth_bytes_per_s
    assert hw.intra_node.achievable_bytes_per_s >= hw.inter_node.achievable_bytes_per_s


@pytest.mark.parametrize("name", hardware_names())
def test_every_section_cites_a_source(name: str) -> None:
    raw = _raw(name)
    for section in SECTIONS:
        source = raw[section]["source"]
        assert isinstance(source, str) and len(source.strip()) > 10, (name, section)


@pytest.mark.parametrize("name", hardware_names())
def test_numbers_are_numbers(name: str) -> None:
    # PyYAML reads 7.7e8 as a string; every numeric field must load as int or float.
    # The error bands' programs and evidence are lists of words.
    text = {"name", "description", "source", "launch", "model", "foreach_kernels",
            "programs", "evidence"}
    for path, value in _leaves(_raw(name)):
        if path.rsplit(".", 1)[-1].split("[")[0] not in text:
            assert isinstance(value, (int, float)) and not isinstance(value, bool), (path, value)


def test_si_conversion(write_yaml: Callable[..., Path]) -> None:
    hw = HardwareProfile.from_yaml(write_yaml(TOY, "toy.yaml"))
    assert hw.name == "toy"
    assert hw.hbm_bytes == 80 * 2**30
    assert hw.hbm_bandwidth_bytes_per_s == 2000e9
    assert hw.peak("bf16") == 100e12 and hw.peak("fp32") == 10e12
    assert hw.host_memory_bytes == 1024 * 2**30
    assert hw.pcie_bytes_per_s == 32e9
    assert hw.nvme_read_bytes_per_s == 10e9 and hw.nvme_write_bytes_per_s == 5e9
    assert hw.intra_node.bandwidth_bytes_per_s == 100e9
    assert hw.intra_node.latency_s == pytest.approx(5e-6, rel=1e-12)
    assert hw.intra_node.achievable_bytes_per_s == 50e9
    assert hw.inter_node.latency_s == 0
    assert (hw.matmul_efficiency, hw.attention_efficiency, hw.memory_bound_efficiency,
            hw.pcie_efficiency, hw.comm_compute_slowdown) == (0.5, 0.25, 0.75, 0.8, 0.0)
    assert hw.host_adam_params_per_s == 1e6
    assert hw.kernel_overhead_s == pytest.approx(2.5e-6, rel=1e-12)  # 2.5 us
    assert hw.launch == "synchronous" and hw.rank_skew == 0.1
    assert hw.collective_overhead_s == pytest.approx(40e-6, rel=1e-12)
    assert hw.fsdp_unit_overhead_s == pytest.approx(300e-6, rel=1e-12)
    assert hw.sync_overhead_s == 0.0  # optional: absent, none
    data = _mutated(lambda d: d["host"].update({"sync_overhead_us": 850}))
    assert HardwareProfile.from_yaml(write_yaml(data)).sync_overhead_s == pytest.approx(
        850e-6, rel=1e-12)
    # collective_threads, optional: gloo's worker threads on a synchronous host, NCCL's
    # one stream on an async one, or what the profile says.
    assert hw.collective_threads == GLOO_THREADS
    data = _mutated(lambda d: d["host"].update({"launch": "async"}))
    assert HardwareProfile.from_yaml(write_yaml(data)).collective_threads == 1
    data = _mutated(lambda d: d["host"].update({"collective_threads": 4}))
    assert HardwareProfile.from_yaml(write_yaml(data)).collective_threads == 4


def test_gloo_threads_are_torch_s() -> None:
    torch_dist = pytest.importorskip("torch.distributed")
    assert torch_dist.ProcessGroupGloo._Options()._threads == GLOO_THREADS


def test_blas_workspace_is_optional_and_in_bytes(write_yaml: Callable[..., Path]) -> None:
    assert HardwareProfile.from_yaml(write_yaml(TOY)).blas_workspace_bytes == 0
    data = _mutated(lambda d: d["gpu"].update({"blas_workspace_mib": 32}))
    assert HardwareProfile.from_yaml(write_yaml(data)).blas_workspace_bytes == 32 * 2**20


def test_missing_peak_dtype_names_it(write_yaml: Callable[..., Path]) -> None:
    hw = HardwareProfile.from_yaml(write_yaml(TOY))
    with pytest.raises(ConfigError) as e:
        hw.peak("fp16")
    assert e.value.field == "hardware.gpu.peak_tflops.fp16"


@pytest.mark.parametrize(("section", "key", "field"), [
    # Each number is positive; their product is not a machine (fuzz: 5e-324 was a
    # ZeroDivisionError in the engine).
    ("inter_node", "collective_efficiency", "inter_node.collective_efficiency.all_gather"),
    ("efficiency", "matmul", "efficiency.matmul"),
    ("efficiency", "pcie", "efficiency.pcie"),
])
def test_a_rate_below_one_per_second_is_refused(write_yaml: Callable[..., Path], section: str,
                                               key: str, field: str) -> None:
    tiny = 5e-324
    value = {"all_gather": tiny, "reduce_scatter": 1.0, "all_reduce": 1.0} \
        if key == "collective_efficiency" else tiny
    data = _mutated(lambda d: d[section].update({key: value}))
    with pytest.raises(ConfigError) as e:
        HardwareProfile.from_yaml(write_yaml(data))
    assert e.value.field == field
    assert "below 1 per second" in e.value.reason


def _mutated(change: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    data = copy.deepcopy(TOY)
    change(data)
    return data


@pytest.mark.parametrize(("change", "field", "value"), [
    (lambda d: d["gpu"].update(hbm_tib=1), "gpu.hbm_tib", 1),
    (lambda d: d.update(extra="x"), "extra", "x"),
    (lambda d: d["efficiency"].update(flops=1), "efficiency.flops", 1),
], ids=["gpu", "top", "efficiency"])
def test_unknown_key_names_it(write_yaml: Callable[..., Path], change: Callable, field: str,
                              value: object) -> None:
    with pytest.raises(ConfigError) as e:
        HardwareProfile.from_yaml(write_yaml(_mutated(change)))
    assert (e.value.field, e.value.value) == (field, value)
    assert "unknown key" in e.value.reason


@pytest.mark.parametrize(("section", "key"), [("gpu", "hbm_gib"), ("node", "source"),
                                              ("intra_node", "latency_us"),
                                              ("efficiency", "matmul"), ("", "inter_node"),
                                              ("host", "launch"), ("", "collectives"),
                                              ("collectives", "model")])
def test_missing_key_names_it(write_yaml: Callable[..., Path], section: str, key: str) -> None:
    data = _mutated(lambda d: (d[section] if section else d).pop(key))
    with pytest.raises(ConfigError) as e:
        HardwareProfile.from_yaml(write_yaml(data))
    assert e.value.field == (f"{section}.{key}" if section else key)
    assert "missing" in e.value.reason


@pytest.mark.parametrize(("section", "key", "value"), [
    ("gpu", "hbm_gib", "80"),            # a quoted number
    ("gpu", "hbm_gib", "7.7e8"),         # what PyYAML makes of an unsigned-exponent float
    ("gpu", "hbm_bandwidth_gb_per_s", -1),
    ("gpu", "blas_workspace_mib", 0),
    ("node", "gpus_per_node", 8.5),
    ("node", "gpus_per_node", True),
    ("intra_node", "efficiency", 1.5),
    ("intra_node", "latency_us", -1),
    ("efficiency", "comm_compute_slowdown", 1),
    ("efficiency", "compute_comm_slowdown", -0.1),
    ("efficiency", "kernel_overhead_us", -1),
    ("host", "launch", "eager"),
    ("efficiency", "foreach_kernels", "fused"),
    ("host", "rank_skew", -0.1),
    ("host", "sync_overhead_us", -5),
    ("host", "collective_threads", 0),
    ("host", "collective_threads", 1.5),
    ("host", "fsdp_unit_overhead_us", "1 ms"),
    ("efficiency", "matmul", 0),
    ("gpu", "source", ""),
    ("inter_node", "name", 400),
    ("collectives", "model", "mpi"),
    ("collectives", "nvls_busbw_gb_per_s", -1),
    ("intra_node", "latency_us", {"LL": 0.6}),              # no Simple
    ("intra_node", "latency_us", {"Simple": 3.4, "LL256": 1}),
])
def test_wrong_type_or_range_names_field(write_yaml: Callable[..., Path], section: str, key: str,
                                         value: object) -> None:
    data = _mutated(lambda d: d[section].update({key: value}))
    with pytest.raises(ConfigError) as e:
        HardwareProfile.from_yaml(write_yaml(data))
    assert (e.value.field, e.value.value) == (f"{section}.{key}", value)


def test_collective_efficiency_names_the_kind_at_fault(write_yaml: Callable[..., Path]) -> None:
    data = _mutated(lambda d: d["intra_node"]["collective_efficiency"].pop("all_reduce"))
    with pytest.raises(ConfigError) as e:
        HardwareProfile.from_yaml(write_yaml(data))
    assert e.value.field == "intra_node.collective_efficiency"
    # 0.5 efficiency x 3 would pass the line rate
    data = _mutated(lambda d: d["intra_node"]["collective_efficiency"].update(all_gather=3))
    with pytest.raises(ConfigError) as e:
        HardwareProfile.from_yaml(write_yaml(data))
    assert (e.value.field, e.value.value) == ("intra_node.collective_efficiency.all_gather", 3)
    assert "line rate" in e.value.reason
    hw = HardwareProfile.from_yaml(write_yaml(TOY))
    # broadcast is optional: absent, it moves its bus bytes as an all_gather does.
    assert hw.intra_node.kind_efficiency == {"all_gather": 1.0, "reduce_scatter": 0.5,
                                             "all_reduce": 2.0, "broadcast": 1.0}
    data = _mutated(lambda d: d["intra_node"]["collective_efficiency"].update(broadcast=1.5))
    assert HardwareProfile.from_yaml(write_yaml(data)).intra_node.kind_efficiency[
        "broadcast"] == 1.5
    data = _mutated(lambda d: d["intra_node"]["collective_efficiency"].update(gather=1))
    with pytest.raises(ConfigError) as e:
        HardwareProfile.from_yaml(write_yaml(data))
    assert e.value.field == "intra_node.collective_efficiency"


def test_latency_per_protocol(write_yaml: Callable[..., Path]) -> None:
    """latency_us as a number is the Simple protocol's; as a mapping, each protocol's."""
    hw = HardwareProfile.from_yaml(write_yaml(_mutated(lambda d: d["intra_node"].update(
        latency_us={"LL": 0.5, "Simple": 4}))))
    assert hw.intra_node.latency_s == pytest.approx(4e-6)
    assert hw.intra_node.protocol_latency_s == {"LL": pytest.approx(0.5e-6)}
    assert hw.intra_node.offers("LL") and not hw.intra_node.offers("LL128")
    assert hw.inter_node.offers("Simple") and not hw.inter_node.offers("LL")
    data = _mutated(lambda d: d["intra_node"].update(latency_us={"LL": -1, "Simple": 4}))
    with pytest.raises(ConfigError) as e:
        HardwareProfile.from_yaml(write_yaml(data))
    assert (e.value.field, e.value.value) == ("intra_node.latency_us.LL", -1)


def test_checkpoint_overhead_names_the_mode_and_phase_at_fault(
        write_yaml: Callable[..., Path]) -> None:
    hw = HardwareProfile.from_yaml(write_yaml(TOY))
    assert hw.checkpoint_overhead_s == {
        "full": {"forward": pytest.approx(10e-6), "backward": pytest.approx(30e-6)},
        "selective": {"forward": pytest.approx(50e-6), "backward": pytest.approx(80e-6)}}
    data = _mutated(lambda d: d["host"]["checkpoint_overhead_us"].pop("full"))
    with pytest.raises(ConfigError) as e:
        HardwareProfile.from_yaml(write_yaml(data))
    assert e.value.field == "host.checkpoint_overhead_us"
    data = _mutated(lambda d: d["host"]["checkpoint_overhead_us"]["selective"].pop("backward"))
    with pytest.raises(ConfigError) as e:
        HardwareProfile.from_yaml(write_yaml(data))
    assert e.value.field == "host.checkpoint_overhead_us.selective"
    data = _mutated(lambda d: d["host"]["checkpoint_overhead_us"]["full"].update(forward=-1))
    with pytest.raises(ConfigError) as e:
        HardwareProfile.from_yaml(write_yaml(data))
    assert (e.value.field, e.value.value) == ("host.checkpoint_overhead_us.full.forward", -1)


def test_peak_tflops_must_be_a_mapping(write_yaml: Callable[..., Path]) -> None:
    data = _mutated(lambda d: d["gpu"].update(peak_tflops=989))
    with pytest.raises(ConfigError) as e:
        HardwareProfile.from_yaml(write_yaml(data))
    assert e.value.field == "gpu.peak_tflops"
    data = _mutated(lambda d: d["gpu"].update(peak_tflops={"bf16": "fast"}))
    with pytest.raises(ConfigError) as e:
        HardwareProfile.from_yaml(write_yaml(data))
    assert e.value.field == "gpu.peak_tflops.bf16"


def test_section_not_a_mapping(write_yaml: Callable[..., Path]) -> None:
    with pytest.raises(ConfigError) as e:
        HardwareProfile.from_yaml(write_yaml(_mutated(lambda d: d.update(node=[1, 2]))))
    assert e.value.field == "node"


def test_malformed_yaml(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("name: bad\ngpu: {hbm_gib: 80\nnode: [\n")
    with pytest.raises(ConfigError) as e:
        HardwareProfile.from_yaml(path)
    assert e.value.field == "hardware" and e.value.value == str(path)
    assert "malformed YAML at line" in e.value.reason


def test_empty_or_missing_file(tmp_path: Path) -> None:
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    with pytest.raises(ConfigError, match="must be a mapping"):
        HardwareProfile.from_yaml(empty)
    with pytest.raises(ConfigError, match="no such file"):
        HardwareProfile.from_yaml(tmp_path / "absent.yaml")
    with pytest.raises(ConfigError, match="cannot read"):
        HardwareProfile.from_yaml(tmp_path)


def test_unknown_profile_lists_known() -> None:
    with pytest.raises(ConfigError) as e:
        resolve_hardware("dgx-z900")
    assert e.value.field == "hardware" and e.value.value == "dgx-z900"
    for name in REQUIRED_PROFILES:
        assert name in e.value.reason


def test_profile_by_path(write_yaml: Callable[..., Path]) -> None:
    assert resolve_hardware(str(write_yaml(TOY, "mine.yaml"))).name == "mine"


# ------------------------------------------ efficiencies against the cited measurements
def test_h200_efficiencies_match_microbench(cases_dir: Path) -> None:
    bench = yaml.safe_load((cases_dir / "h200-microbench.yaml").read_text())["rows"]
    hw = resolve_hardware("hgx-h200")
    bf16 = hw.peak("bf16")
    gemm = statistics.median(r["tflops"] for r in bench
                             if r["kind"] == "matmul" and r["dtype"] == "bfloat16")
    attn = statistics.median(r["fwd_bwd_tflops"] for r in bench if r["kind"] == "sdpa_causal")
    copy_rw = next(r["gbps_rw"] for r in bench if r["kind"] == "d2d_copy")
    pinned = statistics.mean(r["gbps"] for r in bench
                             if r["kind"] in ("h2d", "d2h") and r["pinned"])
    adam = next(r["params_per_s"] for r in bench if r["kind"] == "cpu_adamw")
    assert hw.matmul_efficiency == pytest.approx(gemm * 1e12 / bf16, abs=0.01)
    assert hw.attention_efficiency == pytest.approx(attn * 1e12 / bf16, abs=0.01)
    assert hw.memory_bound_efficiency == pytest.approx(
        copy_rw * 1e9 / hw.hbm_bandwidth_bytes_per_s, abs=0.01)
    assert hw.pcie_efficiency == pytest.approx(pinned * 1e9 / hw.pcie_bytes_per_s, abs=0.01)
    assert hw.host_adam_params_per_s == pytest.approx(adam, rel=1e-6)
    # 139.8 GiB visible, as the microbench's source line states.
    assert hw.hbm_bytes == pytest.approx(139.8 * 2**30)


@pytest.mark.parametrize(("profile", "case", "key", "link"), [
    ("hgx-h200", "C-8xH200-allreduce-torch-vs-nccltests", "nvls_disabled_16GiB_busbw_GBps",
     "intra_node"),
    ("dgx-a100", "C-HGXA100-allreduce-1node-and-2node-4xHDR", "single_node_busbw_GBps",
     "intra_node"),
    ("dgx-a100", "C-NCCL-maintainer-multinode-reference-points",
     "dgx_a100_8x200G_IB_allreduce_busbw_GBps", "inter_node"),
])
def test_link_efficiency_matches_published_busbw(published_cases: dict, profile: str,
                                                 case: str, key: str, link: str) -> None:
    busbw_bytes_per_s = float(published_cases[case]["measured"][key]) * 1e9
    hw = resolve_hardware(profile)
    achievable = getattr(hw, link).achievable_bytes_per_s
    if link == "inter_node":  # a node-level ring figure: one NIC per GPU
        busbw_bytes_per_s /= hw.gpus_per_node
    assert achievable == pytest.approx(busbw_bytes_per_s, rel=0.01)


def test_offloaded_step_gets_its_share_of_the_node_cores() -> None:
    """Amdahl by hand: hgx-h200 measured 765.7M params/s with 16 threads and serial
    fraction 0.066; a rank of an 8-GPU node with 112 cores has 14 threads."""
    hw = resolve_hardware("hgx-h200")

    def speedup(t: int) -> float:
        return t / (1 + 0.066 * (t - 1))

    assert hw.rank_host_adam_params_per_s() == pytest.approx(
        765677963 * speedup(14) / speedup(16))
    # One rank alone on a 16-core host gets the rate as measured.
    alone = replace(hw, cpu_cores=16 * hw.gpus_per_node)
    assert alone.rank_host_adam_params_per_s() == pytest.approx(765677963)
    # Without the cores, the node's rate is shared by its GPUs.
    assert replace(hw, cpu_cores=0).rank_host_adam_params_per_s() == pytest.approx(
        765677963 / 8)


def test_deepspeeds_cpu_adam_takes_its_own_rate_shared_the_same_way() -> None:
    """efficiency.deepspeed_adam_params_per_s (optional): DeepSpeedCPUAdam's node rate,
    split over the node's GPUs and threads as torch's AdamW rate is; absent, DeepSpeed's
    offloaded step takes torch's rate."""
    data = _raw("hgx-h200")
    data["efficiency"]["deepspeed_adam_params_per_s"] = 3e9
    hw = HardwareProfile.from_dict(data, name="h200-ds")
    assert hw.deepspeed_adam_params_per_s == 3e9
    assert hw.rank_host_adam_params_per_s("deepspeed") == pytest.approx(
        hw.rank_host_adam_params_per_s() * 3e9 / 765677963)
    plain = resolve_hardware("hgx-h200")
    assert plain.rank_host_adam_params_per_s("deepspeed") == \
        plain.rank_host_adam_params_per_s()
    data["efficiency"]["deepspeed_adam_params_per_s"] = 0
    with pytest.raises(ConfigError, match=r"efficiency\.deepspeed_adam_params_per_s"):
        HardwareProfile.from_dict(data, name="h200-ds")


@pytest.mark.parametrize(("section", "key", "value", "field"), [
    ("node", "cpu_cores", 0, "node.cpu_cores"),
    ("efficiency", "host_adam_serial_fraction", 1.5, "efficiency.host_adam_serial_fraction"),
    ("host", "optimizer_tensor_us", {"plain": 1}, "host.optimizer_tensor_us"),
    ("host", "optimizer_tensor_us", {"plain": 1, "dtensor": -2},
     "host.optimizer_tensor_us.dtensor"),
    ("host", "program_overhead_us", {"megatron": {"forward_block": 1, "backward_block": 1,
                                                  "step": 1}}, "host.program_overhead_us"),
    ("host", "program_overhead_us", {"tp": {"forward_block": 1}}, "host.program_overhead_us.tp"),
    ("host", "program_overhead_us", {"tp": {"forward_block": 1, "backward_block": 1, "step": 1,
                                            "sideways_tensor": 1}},
     "host.program_overhead_us.tp"),
    ("host", "program_overhead_us", {"tp": {"forward_block": 1, "backward_block": -1,
                                            "step": 0}},
     "host.program_overhead_us.tp.backward_block"),
])
def test_bad_host_keys_name_the_field(section: str, key: str, value: Any, field: str) -> None:
    data = _raw("hgx-h200")
    data[section][key] = value
    with pytest.raises(ConfigError) as e:
        HardwareProfile.from_dict(data, name="hgx-h200")
    assert e.value.field == field


def test_program_overhead_in_seconds_for_the_programs_given() -> None:
    data = _raw("local-cpu")
    data["host"]["program_overhead_us"] = {
        "deepspeed-zero3": {"forward_block": 1500, "backward_block": 2500, "step": 4000},
        "deepspeed-zero1": {"forward_block": 1, "backward_block": 2, "forward_tensor": 3,
                            "backward_tensor": 4, "step": 5}}
    hw = HardwareProfile.from_dict(data, name="local-cpu")
    # The per-tensor parts are optional: 0 where left out.
    assert hw.program_overhead_s == {
        "deepspeed-zero3": {"forward_block": pytest.approx(1.5e-3),
                            "backward_block": pytest.approx(2.5e-3), "forward_tensor": 0.0,
                            "backward_tensor": 0.0, "step": pytest.approx(4e-3)},
        "deepspeed-zero1": {k: pytest.approx(v * 1e-6) for k, v in (
            ("forward_block", 1), ("backward_block", 2), ("forward_tensor", 3),
            ("backward_tensor", 4), ("step", 5))}}
    assert resolve_hardware("local-cpu").program_overhead_s == {}
