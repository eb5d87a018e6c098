"""Two choices of the training program that move FSDP2's memory, each
run for real (rank 0 of 8 on the fake process group, CPU, bf16 with fp32 reduction, full
recomputation) and simulated, the difference each makes against the reference program
(zsim.backend.reference_model's defaults):

- ModelSpec.rope_table_dtype "fp32": the model hands its blocks RoPE's fp32 buffers, and
  FSDP2's MixedPrecisionPolicy (cast_forward_inputs) casts them in every block's
  pre-forward: one bf16 (s, head_dim) cos and sin per block, kept by the block's
  checkpoint until its backward, instead of one pair cast once and shared.
- ModelSpec.loss_in_forward False: the model returns its logits and the step computes
  the loss (torchtitan): FSDP2's root post-forward (freeing the last block's all-gather
  output) comes before the loss's forward, and the root's pre-backward (prefetching the
  last block's all-gather) after the loss's backward, whose two fp32 vocabulary-wide
  gradients are the backward's peak here.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

pytest.importorskip("torch")

from zsim.backend.measured_step import PhaseMemory, measure_fake_rank
from zsim.result import Result
from zsim.simulate import simulate
from zsim.spec.model import ModelSpec
from zsim.spec.plan import Plan
from zsim.spec.registry import resolve_hardware

pytestmark = pytest.mark.slow

L, D, F, V, S = 4, 256, 512, 4096, 256
BASE = ModelSpec(name="tiny", num_layers=L, d_model=D, num_heads=2, num_kv_heads=2,
                 ffn_hidden=F, vocab_size=V, max_seq_len=S, norm_kernel="composite")
"""The norm knob as validate_plan() sets it on CPU; a vocabulary wide enough for the loss's
backward to be the step's peak."""
PLAN = Plan.for_strategy("fsdp", gpus=8, seq_len=S, micro_batch=1, recompute="full",
                         reduce_dtype="fp32")


def _run(spec: ModelSpec) -> tuple[PhaseMemory, Result]:
    return measure_fake_rank(spec, PLAN), simulate(spec, resolve_hardware("local-cpu"), PLAN)


@pytest.fixture(scope="module")
def base() -> tuple[PhaseMemory, Result]:
    return _run(BASE)


def test_fp32_rope_tables_cost_a_bf16_copy_per_block(base: tuple[PhaseMemory, Result]
                                                      ) -> None:
    measured, predicted = _run(replace(BASE, rope_table_dtype="fp32"))
    base_measured, base_predicted = base
    # L copies of cos and sin (s x head_dim, bf16) instead of one shared pair.
    extra = (L - 1) * 2 * S * (D // 2) * 2
    assert measured.after_forward_bytes - base_measured.after_forward_bytes == extra
    assert measured.peak_backward_bytes - base_measured.peak_backward_bytes == extra
    assert (predicted.phase_peak_bytes["forward"]
            - base_predicted.phase_peak_bytes["forward"]) == extra
    assert predicted.peak_memory_bytes - base_predicted.peak_memory_bytes == extra


def test_loss_outside_the_model_prefetches_the_last_block_after_the_loss_backward(
        base: tuple[PhaseMemory, Result]) -> None:
    measured, predicted = _run(replace(BASE, loss_in_forward=False))
    base_measured, base_predicted = base
    gathered_block = (4 * D * D + 3 * D * F + 2 * D) * 2  # one block's bf16 parameters
    assert base_predicted.peak_op == predicted.peak_op == "loss backward (mb 0)"
    # The last block's all-gather output, prefetched beside the loss's gradients with
    # the loss in the model, is not there yet with the loss outside it.
    assert measured.peak_backward_bytes - base_measured.peak_backward_bytes == \
        -gathered_block
    assert (predicted.phase_peak_bytes["backward"]
            - base_predicted.phase_peak_bytes["backward"]) == -gathered_block
    # In forward the last block's all-gather output (FSDP2's AllGatherState) is freed
    # by the root's post-forward, before the loss's forward. Both peaks to within the
    # bookkeeping scalars.
    assert predicted.phase_peak_bytes["forward"] == pytest.approx(
        measured.peak_forward_bytes, abs=1024)
    assert predicted.peak_memory_bytes == pytest.approx(measured.peak_backward_bytes,
                                                        abs=1024)
