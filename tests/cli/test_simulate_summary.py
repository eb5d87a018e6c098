"""`zsim simulate`'s summary states the whole plan, where the step's time goes (the host's
optimizer step of an offload plan included), the host memory an offload plan needs per
node, and communication split between NVLink and the NIC, each against a figure worked out
by hand or from DeepSpeed's own estimator."""

from __future__ import annotations

import json
from typing import Any

import pytest
from typer.testing import CliRunner

from zsim import api
from zsim.cli import app
from zsim.schedule.lower import host_state_bytes
from zsim.spec.plan import Plan
from zsim.spec.presets import PRESETS


def simulate(*args: str) -> tuple[str, dict[str, Any]]:
    """The table and the JSON of one `zsim simulate` command."""
    runner = CliRunner()
    text = runner.invoke(app, ["simulate", *args])
    assert text.exit_code == 0, text.output
    data = runner.invoke(app, ["simulate", *args, "--format", "json"])
    assert data.exit_code == 0, data.output
    return text.stdout, json.loads(data.stdout)


def test_the_header_states_the_whole_plan() -> None:
    out, _ = simulate("--model", "7b", "--gpus", "64", "--strategy", "hsdp", "--grad-accum",
                      "4", "--micro-batch", "2")
    lines = out.splitlines()
    assert lines[0].startswith("llama2-7b (6.74B params) on 64 GPUs (8 nodes of 8) x dgx-h100:"
                               " hsdp (fsdp2), ac=none, bf16 (fp32 master)")
    assert lines[1] == ("plan            data parallel 64 (shard 8 x replicate 8), tp 1, cp 1, "
                        "pp 1; micro-batch 2 x 4 accumulated")
    # 64 ranks x 2 x 4 sequences of 4,096 tokens.
    assert lines[2] == ("batch           512 sequences x 4,096 tokens = 2,097,152 tokens "
                        "per step")


def test_an_offload_step_shows_the_host_and_its_memory() -> None:
    out, r = simulate("--model", "13b", "--gpus", "16", "--strategy", "zero3", "--offload",
                      "optimizer")
    # The step is the compute stream's busy time plus its waits; the host's optimizer step
    # is most of what it waits for, and the summary says so.
    parts = r["compute_time_s"] + r["exposed_comm_s"] + r["exposed_host_s"]
    assert r["step_time_s"] == pytest.approx(parts, rel=1e-6)
    assert r["exposed_host_s"] > 0.5 * r["step_time_s"]
    host = next(line for line in out.splitlines() if line.startswith("  host "))
    assert f"{r['exposed_host_s']:.4f} s waiting on the host's optimizer step" in host
    # Host memory: every rank of a node keeps its offloaded state there.
    plan = Plan.for_strategy("zero3", gpus=16, seq_len=4096, offload="optimizer")
    per_gpu = host_state_bytes(PRESETS["llama2-13b"], plan)
    assert r["host_memory_bytes_per_gpu"] == per_gpu > 0
    assert r["host_memory_bytes_per_node"] == 8 * per_gpu
    assert f"host memory     {8 * per_gpu / 2**30:.1f} GiB per node (8 GPUs x" in out


def test_without_offload_there_is_no_host_line() -> None:
    out, r = simulate("--model", "7b", "--gpus", "16", "--strategy", "fsdp")
    assert r["host_memory_bytes_per_node"] == 0 and r["host_busy_s"] == 0
    assert "host memory" not in out and "  host " not in out


def test_hsdp_keeps_its_gathers_on_nvlink() -> None:
    # By hand: HSDP shards within a node, so its all-gathers and reduce-scatters never
    # leave it; only the replicas' all-reduce crosses nodes, one rank per node, every
    # byte over the NIC.
    _, r = simulate("--model", "13b", "--gpus", "128", "--strategy", "hsdp")
    bus, links = r["comm_bus_bytes"], r["comm_bytes_by_link"]
    assert links["inter_node"] == pytest.approx(bus["all_reduce"], rel=1e-12)
    assert links["intra_node"] == pytest.approx(bus["all_gather"] + bus["reduce_scatter"],
                                                rel=1e-12)
    # FSDP's ring over 128 GPUs, 8 a node: NCCL runs one ring per NIC, rotated, so each
    # GPU sends 1/8 of its bus bytes over its own NIC and the rest over NVLink.
    _, f = simulate("--model", "13b", "--gpus", "128", "--strategy", "fsdp")
    total = sum(f["comm_bus_bytes"].values())
    assert f["comm_bytes_by_link"]["inter_node"] == pytest.approx(total / 8, rel=1e-12)
    assert f["comm_bytes_by_link"]["inter_node"] > links["inter_node"]


def test_the_summary_splits_communication_by_link() -> None:
    out, r = simulate("--model", "13b", "--gpus", "128", "--strategy", "hsdp")
    gib = 2**30
    line = next(x for x in out.splitlines() if x.startswith("communication"))
    assert (f"{r['comm_bytes_by_link']['intra_node'] / gib:.2f} GiB over NVLink, "
            f"{r['comm_bytes_by_link']['inter_node'] / gib:.2f} GiB over the NIC") in line


def test_api_and_cli_agree_on_the_host_figures() -> None:
    r = api.simulate(model="13b", gpus=16, strategy="zero2", hardware="dgx-h100",
                     offload="optimizer")
    plan = Plan.for_strategy("zero2", gpus=16, seq_len=4096, offload="optimizer")
    assert r["host_memory_bytes_per_gpu"] == host_state_bytes(PRESETS["llama2-13b"], plan)
    assert r["ranks_per_node"] == 8
