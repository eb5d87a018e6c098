"""The ZeRO/FSDP card's tuning effects (docs/card.md, "Tuning" and "Trade-offs"), each
emerging from the simulation of plain plans: nothing in the lowering or the engine knows
about these statements."""

from __future__ import annotations

import bisect
import dataclasses

import pytest

from zsim.result import Result
from zsim.simulate import simulate
from zsim.spec.hardware import HardwareProfile, Link
from zsim.spec.plan import Plan
from zsim.spec.registry import resolve_hardware, resolve_model


@pytest.fixture(scope="module")
def h100() -> HardwareProfile:
    return resolve_hardware("dgx-h100")


def test_prefetch_hides_all_gathers(h100: HardwareProfile) -> None:
    model = resolve_model("13b")
    runs = {p: simulate(model, h100, Plan.for_strategy("fsdp", gpus=128, seq_len=8192,
                                                       recompute="selective", prefetch=p),
                        trace=True)
            for p in (0, 1)}
    exposed_ag = {p: r.exposed_by_kind_s.get("all_gather", 0.0) for p, r in runs.items()}
    # Without prefetch every all-gather sits on the critical path; the waits say why.
    assert exposed_ag[0] > 0.5 * runs[0].comm_busy_s["all_gather"]
    assert runs[0].exposed_by_reason_s["prefetch_too_shallow"] >= 0.9 * exposed_ag[0]
    # Issuing unit k+1's all-gather while unit k computes hides almost all of it.
    assert exposed_ag[1] < 0.05 * exposed_ag[0]
    assert runs[1].step_time_s < runs[0].step_time_s
    # ...at the price of one more gathered unit in flight while the units compute (the
    # step's peak, at the loss, holds none in flight either way).
    block_bf16_bytes = model.params_per_block * 2
    held = {p: _held_while_units_compute(r) for p, r in runs.items()}
    assert held[1] - held[0] > 0.9 * block_bf16_bytes
    assert runs[1].peak_memory_bytes >= runs[0].peak_memory_bytes


def _held_while_units_compute(r: Result) -> int:
    """The most memory allocated while a unit's forward or backward runs."""
    times = [t for t, _ in r.memory_curve]
    out = 0
    for sp in r.spans:
        if sp.stream == "compute" and sp.name.startswith("unit ") and " copy-" not in sp.name \
                and (" forward (mb" in sp.name or " backward (mb" in sp.name):
            lo = max(bisect.bisect_right(times, sp.start_s) - 1, 0)
            hi = bisect.bisect_left(times, sp.end_s)
            out = max(out, max(b for _, b in r.memory_curve[lo:hi]))
    return out


def test_small_units_are_latency_bound_and_large_units_raise_peak(h100: HardwareProfile) -> None:
    # GPT-3 1.3B (24 blocks of ~50M params) on 128 GPUs: a 100 MB all-gather over a
    # 128-rank ring on 16 nodes. NCCL's cheapest choice is LL128: 14 us + 112 NVLink
    # steps x 1.9 us + 15 network steps x 4.0 us = 287 us of latency, as long as its
    # bandwidth time (~100 MB / (0.92 x ~376 GB/s) = 287 us): it reaches 264 / 574 =
    # 0.46 of the ring's Simple bandwidth; a 4-block unit, 4x the bytes for the same
    # latency, 1055 / 1435 = 0.74. The host keeps ahead here: dgx-h100's FSDP2 issue cost
    # (4.4 ms a block forward at 128 ranks, fsdp2_block_host_us) would pace this small
    # model's step and hide its collectives (the effect is the links', not the host's).
    model = resolve_model("1.3b")
    ahead = dataclasses.replace(h100, fsdp2_block_host=None)
    runs = {u: simulate(model, ahead, Plan.for_strategy("fsdp", gpus=128, seq_len=2048,
                                                        unit_size=u))
            for u in (1, 4, 24)}
    achieved = {u: r.comm_bus_bytes["all_gather"] / r.comm_busy_s["all_gather"]
                for u, r in runs.items()}
    # Too small: the same bytes take longer (lower achieved bandwidth) and the step is
    # slower than with medium units.
    assert achieved[1] < 0.7 * achieved[4]
    assert achieved[4] < achieved[24]
    assert runs[1].step_time_s > runs[4].step_time_s
    # Too large: gathered units dominate, peak memory rises (and the first all-gather of
    # the whole model is exposed).
    assert runs[24].peak_memory_bytes > runs[4].peak_memory_bytes > runs[1].peak_memory_bytes
    assert runs[24].memory_at_peak["gathered_params"] > 3 * runs[4].memory_at_peak[
        "gathered_params"]
    assert runs[24].step_time_s > runs[4].step_time_s


def test_no_reshard_trades_memory_for_a_third_less_communication(
        h100: HardwareProfile) -> None:
    model = resolve_model("13b")
    kw = dict(gpus=128, seq_len=4096, recompute="full")
    reshard = simulate(model, h100, Plan.for_strategy("fsdp", **kw))
    keep = simulate(model, h100, Plan.for_strategy("fsdp-no-reshard", **kw))
    bus = sum(reshard.comm_bus_bytes.values())
    bus_keep = sum(keep.comm_bus_bytes.values())
    # 3S -> 2S (the root is gathered once either way, so slightly under a third).
    assert bus_keep / bus == pytest.approx(2 / 3, abs=0.01)
    assert keep.comm_busy_total_s < reshard.comm_busy_total_s
    # Every unit stays gathered from its forward to its backward.
    gathered_model = model.num_params * 2
    assert keep.memory_at_peak["gathered_params"] >= 0.9 * gathered_model
    assert keep.peak_memory_bytes - reshard.peak_memory_bytes > 0.8 * gathered_model


def test_hsdp_keeps_all_gathers_on_nvlink(h100: HardwareProfile) -> None:
    model = resolve_model("13b")
    fsdp = simulate(model, h100, Plan.for_strategy(
        "fsdp", gpus=128, seq_len=8192, recompute="selective"), trace=True)
    hsdp = simulate(model, h100, Plan.for_strategy(
        "hsdp", gpus=128, shard_group=8, seq_len=8192, recompute="selective"), trace=True)
    links = {r: {sp.link for sp in res.spans if sp.kind == "all_gather"}
             for r, res in (("fsdp", fsdp), ("hsdp", hsdp))}
    assert links == {"fsdp": {"inter_node"}, "hsdp": {"intra_node"}}
    # Only the gradient reduction across replicas crosses nodes.
    assert {sp.link for sp in hsdp.spans if sp.kind == "all_reduce"} == {"inter_node"}
    assert hsdp.comm_busy_s["all_gather"] < fsdp.comm_busy_s["all_gather"]


def test_zero3_at_large_dp_across_slow_links_becomes_exposed(h100: HardwareProfile) -> None:
    # Same GPUs, a 100 Gb/s-per-GPU Ethernet fabric with 30 us hops (Simple protocol
    # only) instead of NDR IB. The host keeps ahead: dgx-h100's FSDP2 issue cost, its
    # per-rank slope (measured to 128 ranks) taken to 1024, would pace the step at 21 ms a
    # block forward and hide the links.
    slow = dataclasses.replace(h100, fsdp2_block_host=None, inter_node=dataclasses.replace(
        h100.inter_node, bandwidth_bytes_per_s=12.5e9, latency_s=30e-6,
        protocol_latency_s={}))
    model = resolve_model("13b")

    def exposed_fraction(strategy: str, gpus: int) -> float:
        plan = Plan.for_strategy(strategy, gpus=gpus, seq_len=4096, recompute="selective",
                                 shard_group=8 if strategy == "hsdp" else None)
        r = simulate(model, slow, plan)
        return r.exposed_comm_s / r.step_time_s

    one_node, large = exposed_fraction("fsdp", 8), exposed_fraction("fsdp", 1024)
    assert one_node < 0.02
    # At 1024 GPUs a unit's 650 MB all-gather takes ~14 ms on the slow ring (1/8 of the bus
    # bytes on each 11.75 GB/s NIC, plus 127 x 30 us + 895 x 3.4 us of latency); a unit
    # moves three such collectives per step against ~35 ms of compute per block, and in
    # backward the re-gather and the reduce-scatter share the NIC: a third or more of
    # the step waits on communication.
    assert large > 0.3
    # HSDP keeps the per-layer all-gathers inside the node and is the better choice there;
    # its gradient all-reduce across 128 replicas still crosses the slow fabric once per
    # step (2 x 13e9 x 2 B / 8 / 12.5 GB/s ~ 0.5 s), so some exposure remains.
    assert exposed_fraction("hsdp", 1024) < 0.85 * large


def test_optimizer_offload_frees_hbm_and_waits_on_the_host(h100: HardwareProfile) -> None:
    # Seed card, "Offload (ZeRO-Infinity)": more memory, less throughput.
    model = resolve_model("13b")
    kw = dict(gpus=8, seq_len=4096, recompute="full")
    gpu = simulate(model, h100, Plan.for_strategy("fsdp", **kw))
    off = simulate(model, h100, Plan.for_strategy("fsdp", offload="optimizer", **kw))
    # At rest FSDP2 holds the fp32 sharded params (the master, 4 B) + AdamW moments (8 B);
    # ZeRO-Offload moves both to the host and keeps a bf16 shard (2 B) on the GPU:
    # 12 - 2 = 10 B per parameter, sharded over 8 GPUs.
    n, psi = 8, model.num_params
    moved = psi * 10 / n
    assert gpu.baseline_memory_bytes - off.baseline_memory_bytes == pytest.approx(moved, rel=1e-6)
    # The GPU run peaks in its optimizer step: fp32 shard (4) + moments (8) + fp32 gradient
    # shards (4) + foreach AdamW's exp_avg_sq_sqrt temporary (4) = 20 B/param/N; the
    # offloaded run never holds those on the GPU. Both keep the fp32 RoPE buffers and the
    # two 32 MiB cuBLAS workspaces.
    assert gpu.peak_op == "optimizer step"
    assert gpu.peak_memory_bytes == pytest.approx(
        psi * 20 / n + model.buffer_bytes + 2 * 32 * 2**20, rel=1e-9)
    assert gpu.peak_memory_bytes - off.peak_memory_bytes > moved
    # The CPU AdamW step on 1/8 of the parameters is on the critical path: the GPU idles
    # for it. dgx-h100's host (measured on the DGX H200's, the same CPUs): 765,677,963
    # params/s a node with 16 threads, Amdahl serial fraction 0.066, 112 // 8 = 14 threads
    # a GPU; plus 53.8 us a DTensor parameter over the 13B model's 363 (9 a block, 3 more).
    def speedup(threads: int) -> float:
        return threads / (1 + 0.066 * (threads - 1))

    rate = 765_677_963 * speedup(14) / speedup(16)
    host_s = model.num_params / 8 / rate + (9 * model.num_layers + 3) * 53.8e-6
    assert off.host_busy_s == pytest.approx(host_s)
    assert off.exposed_host_s == pytest.approx(host_s)
    assert off.step_time_s > gpu.step_time_s + 0.99 * host_s


def test_zero3_at_thousands_of_ranks_turns_latency_bound_as_the_micro_batch_shrinks() -> None:
    # GPT-3 175B under DeepSpeed ZeRO-3 at a fixed global batch of 4,096
    # sequences. Going from 1,024 A100s at micro-batch 4 to 4,096 at micro-batch 1 keeps
    # every call of the program (the same per-submodule fetches per micro-batch) but
    # quarters the compute that hides each, while every ring gets 4x longer: each of its
    # ~2,000 calls per micro-batch pays per-step latency over 4,095 steps.
    a100 = resolve_hardware("dgx-a100")
    model = resolve_model("175b")

    def run(hw: HardwareProfile, gpus: int, micro_batch: int) -> Result:
        return simulate(model, hw, Plan.for_strategy(
            "zero3", gpus=gpus, seq_len=2048, micro_batch=micro_batch, recompute="full"))

    wide, narrow = run(a100, 1024, 4), run(a100, 4096, 1)
    assert wide.collective_calls == narrow.collective_calls
    assert sum(narrow.collective_calls.values()) > 1000
    assert narrow.comm_latency_share > wide.comm_latency_share + 0.1
    # Wide, compute hides the fetches; what stays exposed is the step's tail, where
    # nothing hides it: two scalar all-reduces and, after the optimizer, one all-gather
    # per persistent tensor (norms and biases, ~10 a block), each a 1,023-step ring.
    assert wide.exposed_comm_s < 0.03 * wide.step_time_s
    assert narrow.exposed_comm_s > 0.2 * narrow.step_time_s
    assert narrow.tflops_per_gpu < 0.75 * wide.tflops_per_gpu

    # The loss is latency's: on links without start-up latency the narrow plan keeps
    # nearly all of its throughput.
    def no_latency(link: Link) -> Link:
        return dataclasses.replace(link, latency_s=0.0, protocol_latency_s={})

    ideal = dataclasses.replace(a100, collectives="ring", intra_node=no_latency(a100.intra_node),
                                inter_node=no_latency(a100.inter_node))
    assert run(ideal, 4096, 1).tflops_per_gpu > 0.95 * wide.tflops_per_gpu
