"""The 2-D and 3-D plan search: factorizations, global batch, ranking,
and `zsim plan`'s table."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from test_bad_input import error_line
from typer.testing import CliRunner

from zsim.cli import app
from zsim.errors import ConfigError
from zsim.parallel_planner import choose_parallel, parallel_plans, parse_global_batch
from zsim.schedule.lower import memory_floor_bytes
from zsim.simulate import simulate
from zsim.spec.consistency import check_plan
from zsim.spec.presets import PRESETS
from zsim.spec.registry import resolve_hardware

H100 = resolve_hardware("dgx-h100")
LLAMA2_7B = PRESETS["llama2-7b"]   # 32 layers, 32 heads


@pytest.mark.parametrize(("text", "sequences"), [("512", 512), ("4Mt", 512),
                                                 ("4194304 tokens", 512), ("64K tok", 8)])
def test_global_batch_in_sequences_or_tokens(text: str, sequences: int) -> None:
    assert parse_global_batch(text, 8192) == sequences


@pytest.mark.parametrize("text", ["0", "-4", "many", "1000t"])
def test_bad_global_batch(text: str) -> None:
    with pytest.raises(ConfigError) as e:
        parse_global_batch(text, 8192)
    assert (e.value.field, e.value.value) == ("global_batch", text)


def test_factorizations_cover_every_axis_and_keep_the_batch() -> None:
    plans = parallel_plans(LLAMA2_7B, H100, gpus=32, seq_len=4096, global_batch=64)
    assert {p.tp for p in plans} == {1, 2, 4, 8}
    assert {p.pp for p in plans} >= {1, 2, 4, 8}
    assert {p.cp for p in plans} >= {1, 2, 4}
    assert {p.pp_schedule for p in plans if p.pp > 1} == {"1f1b", "interleaved"}
    for p in plans:
        check_plan(LLAMA2_7B, H100, p, gpus=32)
        assert p.sp == (p.tp > 1)
        # Every plan trains the same tokens per step: 64 sequences.
        assert p.tokens_per_step == 64 * 4096
        assert not (p.cp > 1 and p.pp > 1)
    # The data-parallel ranks are sharded (fsdp), sharded within a node and replicated
    # across (hsdp), or replicated (ddp), the last with TP and PP but without CP, which
    # is modelled with FSDP2 only.
    assert {p.strategy for p in plans} == {"fsdp", "hsdp", "ddp"}
    ddp = [p for p in plans if p.strategy == "ddp"]
    assert {(p.tp, p.pp) for p in ddp} >= {(1, 1), (2, 2), (8, 4)}
    assert all(p.dp_shard == 1 and p.dp_replicate == 32 // (p.tp * p.pp) and p.cp == 1
               for p in ddp)
    # HSDP shards over one node's dp_shard x cp ranks (torchtitan's dp_shard_cp), or
    # over the CP ranks alone when they and TP fill a node or more (HSDP over
    # (dp_replicate, cp), what torchtitan runs for data parallelism beside CP).
    hsdp = [p for p in plans if p.strategy == "hsdp"]
    assert {p.cp for p in hsdp} == {1, 2, 4, 8}
    for p in hsdp:
        assert p.dp_shard * p.model_parallel == 8 or (
            p.dp_shard == 1 and p.cp > 1 and p.model_parallel >= 8), p.label


def test_cp_shards_the_state_so_7b_fits_131k_tokens_on_one_node() -> None:
    # At cp=8 on 8 GPUs dp_shard is 1, and the state once stayed whole (12 bytes x
    # 6.74B, 75 GiB, the activations on top: "no 2-D/3-D plan fits"). torchtitan shards
    # it over dp_shard x cp = 8 ranks: 12 bytes x P / 8 of fp32 master and Adam state
    # (every sharded dim of llama2-7b, 4096, 11008, 32000, divides by 8: no padding).
    plans = [p for p in parallel_plans(LLAMA2_7B, H100, gpus=8, seq_len=131072,
                                       global_batch=8) if p.cp == 8]
    assert plans and {(p.strategy, p.dp_shard, p.dp_shard_cp) for p in plans} == {
        ("fsdp", 1, 8)}
    for p in plans:
        floor = memory_floor_bytes(LLAMA2_7B, p, H100)
        assert floor["master_params"] + floor["optimizer_states"] == \
            12 * 6_738_415_616 / 8
    best = choose_parallel(LLAMA2_7B, H100, plans)[0]
    assert best.result is not None and best.fits, best.plan.label


def test_ranking_puts_a_simulated_fitting_plan_first() -> None:
    plans = parallel_plans(LLAMA2_7B, H100, gpus=32, seq_len=4096, global_batch=32)
    ranked = choose_parallel(LLAMA2_7B, H100, plans)
    best = ranked[0]
    assert best.result is not None and best.fits
    simulated = [c for c in ranked if c.result is not None and c.fits]
    speeds = [c.tokens_per_s_per_gpu for c in simulated]
    assert speeds == sorted(speeds, reverse=True)
    # A pipeline's estimate is its simulation.
    pipe = next(c for c in ranked if c.plan.pp > 1 and c.result is not None)
    again = simulate(LLAMA2_7B, H100, pipe.plan)
    assert pipe.estimate.step_time_s == pytest.approx(again.step_time_s, rel=1e-12)


def test_no_plan_estimated_faster_than_the_pick_goes_unsimulated() -> None:
    """The engine runs more plans while one left is estimated faster than the fastest
    simulated one (estimates are optimistic or pessimistic, never bounds): within the
    simulation budget (ROUNDS x TOP), every unsimulated fitting plan is estimated no
    faster than the pick."""
    from zsim.parallel_planner import ROUNDS, TOP

    plans = parallel_plans(LLAMA2_7B, H100, gpus=32, seq_len=4096, global_batch=64)
    ranked = choose_parallel(LLAMA2_7B, H100, plans)
    engine = [c for c in ranked if c.result is not None and c.plan.pp == 1]
    unsimulated = [c for c in ranked if c.result is None and c.fits]
    if len(engine) < ROUNDS * TOP:
        assert all(c.estimate.tokens_per_s_per_gpu <= ranked[0].tokens_per_s_per_gpu
                   for c in unsimulated)


def test_zsim_plan_prints_the_2d_3d_table() -> None:
    result = CliRunner().invoke(app, ["plan", "--model", "7b", "--gpus", "16", "--seq",
                                      "4096", "--global-batch", "16", "--tp", "2",
                                      "--format", "json"])
    assert result.exit_code == 0, result.output
    answer = json.loads(result.stdout)
    out = answer["parallel"]
    assert out["global_batch_sequences"] == 16
    assert out["candidates"] and {r["tp"] for r in out["candidates"]} == {2}
    # One recommendation over both tables, first in its own table.
    table = out if answer["recommended_table"] == "2-D" else answer
    assert table["candidates"][0]["plan"] == answer["recommended"]
    assert table["candidates"][0]["tier"] == "recommended"
    assert table["candidates"][0]["why"].startswith("recommended: ")


def test_zsim_plan_bad_global_batch_is_one_line() -> None:
    line = error_line(["plan", "--model", "7b", "--gpus", "16", "--global-batch", "lots"])
    assert line.startswith("error: global_batch='lots'")


@pytest.mark.parametrize(("fixed", "why"), [
    (("--cp", "3"), "with cp=3: 16 is not divisible by cp=3"),
    (("--tp", "3", "--pp", "2"), "with tp=3 and pp=2: 16 is not divisible by tp x pp = 6"),
    (("--tp", "2", "--pp", "8", "--cp", "2"),
     "with tp=2, pp=8 and cp=2: 16 is not divisible by tp x cp x pp = 32"),
    (("--tp", "16"), "with tp=16: tp=16 does not divide a dgx-h100 node's 8 GPUs"),
    (("--pp", "16"), "with pp=16: pp=16 does not divide llama2-13b's 40 layers"),
    (("--cp", "16"), "with cp=16: cp=16 is not a context-parallel degree the planner "
                     "enumerates (1, 2, 4, 8)"),
    (("--cp", "2", "--pp", "2"), "the planner does not combine context and pipeline"),
])
def test_no_factorization_says_why_in_words(fixed: tuple[str, ...], why: str) -> None:
    """`--cp 3` on 16 GPUs once printed the dict {'cp': 3}. The error names the
    degrees in words and the first reason no plan has them (16 = 2^4 has no factor 3;
    Llama-2-13B has 40 layers, 8 KV heads; a DGX H100 node 8 GPUs)."""
    result = subprocess.run([sys.executable, "-m", "zsim", "plan", "--model", "13b",
                             "--gpus", "16", *fixed], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 2 and result.stdout == "", result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.splitlines()) == 1
    assert result.stderr.startswith("error: gpus=16: no 2-D or 3-D factorization of 16 GPUs")
    assert why in result.stderr and "{" not in result.stderr
