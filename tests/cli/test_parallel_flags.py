"""`zsim simulate`'s model-parallel flags: each impossible combination is one
error line naming the field and value, exit code 2; the flags reach the Plan."""

from __future__ import annotations

import pytest
from test_bad_input import error_line

from zsim import api
from zsim.spec.presets import PRESETS
from zsim.spec.registry import resolve_hardware


def sim_args(*extra: str) -> list[str]:
    return ["simulate", "--model", "70b-3", "--gpus", "256", "--strategy", "fsdp",
            "--seq", "8192", *extra]


@pytest.mark.parametrize(("extra", "field", "value"), [
    (("--tp", "16"), "plan.tp", "16"),                       # 8 kv heads do not divide
    (("--tp", "3"), "gpus", "256"),                          # 256 not divisible by 3
    (("--tp", "16", "--gpus", "512"), "plan.tp", "16"),
    (("--pp", "3", "--gpus", "258"), "plan.pp", "3"),         # 80 layers
    (("--pp", "4", "--pp-schedule", "interleaved", "--virtual-stages", "3", "--grad-accum",
      "4"), "plan.virtual_stages", "3"),
    (("--pp", "4"), "plan.grad_accum", "1"),                  # 1F1B needs 4 micro-batches
    (("--sp",), "plan.sp", "True"),                           # SP without TP
    (("--tp", "8", "--async-tp"), "plan.async_tp", "True"),   # async TP without SP
    (("--cp", "2", "--seq", "8190"), "plan.seq_len", "8190"),
])
def test_impossible_combinations_are_one_line(extra: tuple[str, ...], field: str,
                                              value: str) -> None:
    args = sim_args()
    # A later flag of the same name wins (click keeps the last).
    line = error_line([*args, *extra])
    assert line.startswith(f"error: {field}={value}"), line


def test_ddp_with_cp_points_to_hsdp_over_the_cp_ranks() -> None:
    # torchtitan has no DDP beside CP: with cp > 1 it applies fully_shard over dp_shard x
    # cp, HSDP over (dp_replicate, cp) when dp_shard is 1 (parallelize.py).
    line = error_line(["simulate", "--model", "llama2-7b", "--gpus", "16", "--strategy", "ddp",
                       "--cp", "8"])
    assert line.startswith("error: plan.cp=8") and "--strategy hsdp --shard-group 1" in line


def test_tp_across_nodes_is_an_explicit_opt_in() -> None:
    line = error_line(["simulate", "--model", "llama2-7b", "--gpus", "64", "--strategy", "fsdp",
                       "--tp", "16"])
    assert line.startswith("error: plan.tp=16") and "tp_across_nodes" in line


def test_flags_reach_the_plan() -> None:
    spec = PRESETS["llama3-70b"]
    parallel = {"tp": 8, "pp": 4, "pp_schedule": "interleaved", "virtual_stages": 2,
                "sp": True}
    plan = api.build_plan(spec, gpus=256, strategy="hsdp",
                          shard_group=api.default_shard_group(8, 256, parallel), seq=8192,
                          micro_batch=1, grad_accum=8, ac="none", precision="bf16",
                          offload="none", parallel=parallel)
    assert (plan.tp, plan.pp, plan.cp, plan.sp) == (8, 4, 1, True)
    assert (plan.pp_schedule, plan.virtual_stages) == ("interleaved", 2)
    # HSDP's default shard group: the data-parallel ranks of one node (none beside TP=8).
    assert (plan.dp_shard, plan.dp_replicate) == (1, 8)
    assert plan.world_size == 256
    assert resolve_hardware("dgx-h100").gpus_per_node == 8


def test_no_trace_of_a_pipeline(tmp_path: object) -> None:
    line = error_line([*sim_args("--tp", "8", "--pp", "4", "--grad-accum", "4"), "--trace",
                       f"{tmp_path}/t.json"])
    assert line.startswith("error: trace=") and "pipeline" in line
