"""A whole pipeline-parallel step of the tiny 2-block model on the toy cluster, worked out
by hand: pp = 2 (one block per stage; the last stage also runs the output projection and
loss), GPipe over 2 micro-batches, one data-parallel rank (no FSDP communication)."""

from __future__ import annotations

import pytest
from test_fsdp_toy_timeline import hand_durations
from toy_cluster import make_toy_hw

from zsim.errors import ConfigError
from zsim.schedule.build import activation_sizes
from zsim.simulate import simulate
from zsim.spec.model import ModelSpec
from zsim.spec.plan import Plan


def test_gpipe_step_by_hand(tiny_model: ModelSpec) -> None:
    d = hand_durations()
    f0, b0 = d.fwd, d.bwd                    # stage 0: one block
    f1, b1 = d.fwd + d.head, d.bwd + 2 * d.head  # stage 1: one block + output and loss
    send = 256 * 256 * 2 / 100e9             # b x s x d bf16 over NVLink (one node)
    # Stage 1 runs F0, F1 back to back once F0 arrives (f1 > f0), then B0, B1; stage 0's
    # B1 waits for stage 1's B1 (b1 > b0): f0 + 2 f1 + 2 b1 + b0 + 2 sends.
    pipeline = f0 + 2 * f1 + 2 * b1 + b0 + 2 * send
    # Then rank 0's optimizer step over its block and the token embedding (foreach AdamW,
    # 86 B per parameter at 1 TB/s as in the FSDP toy: fp32 master, m, v, grad).
    block = 4 * 256 * 256 + 3 * 256 * 512 + 2 * 256
    opt0 = (block + 1000 * 256) * 86 / 1e12
    plan = Plan(strategy="fsdp", dp_shard=1, pp=2, grad_accum=2, pp_schedule="gpipe",
                seq_len=256)
    r = simulate(tiny_model, make_toy_hw(), plan)
    assert r.step_time_s == pytest.approx(pipeline + opt0, rel=1e-9)
    assert [st.rank for st in r.pipeline_stages] == [0, 1]
    # GPipe: (pp - 1) / (m + pp - 1) of the step idle, were the stages equal; here rank 0
    # is busy 2 (f0 + b0) of it.
    assert r.pipeline_stages[0].busy_s == pytest.approx(2 * (f0 + b0), rel=1e-12)
    assert r.pipeline_stages[0].in_flight_microbatches == 2
    # Tokens per GPU: 2 micro-batches of 256 tokens shared by the 2 stages.
    assert r.tokens_per_s_per_gpu == pytest.approx(256 / r.step_time_s)


def test_1f1b_holds_fewer_microbatches_than_gpipe(tiny_model: ModelSpec) -> None:
    hw = make_toy_hw()
    base = dict(strategy="fsdp", dp_shard=1, pp=2, grad_accum=8, seq_len=256)
    gpipe = simulate(tiny_model, hw, Plan(**base, pp_schedule="gpipe"))  # type: ignore[arg-type]
    ofob = simulate(tiny_model, hw, Plan(**base))  # type: ignore[arg-type]
    saved = activation_sizes(tiny_model, Plan(**base), autocast=False).saved_per_block  # type: ignore[arg-type]
    # Rank 0 holds every micro-batch under GPipe, pp = 2 of them under 1F1B: the
    # difference is 6 micro-batches of one block's saved tensors.
    g0, o0 = gpipe.pipeline_stages[0], ofob.pipeline_stages[0]
    assert (g0.in_flight_microbatches, o0.in_flight_microbatches) == (8, 2)
    assert g0.peak_memory_bytes - o0.peak_memory_bytes == 6 * saved


@pytest.mark.parametrize("strategy", ["fsdp", "ddp"])
def test_offload_with_a_pipeline_is_refused(tiny_model: ModelSpec, strategy: str) -> None:
    """The per-rank pipeline replay keeps every stage's state on the GPU: an offloaded
    pipeline is refused on plan.offload rather than simulated as if nothing moved."""
    plan = Plan(strategy=strategy, dp_shard=1, pp=2, grad_accum=2, seq_len=256,
                offload="optimizer")
    with pytest.raises(ConfigError) as err:
        simulate(tiny_model, make_toy_hw(), plan)
    assert (err.value.field, err.value.value) == ("plan.offload", "optimizer")
