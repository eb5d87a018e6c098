"""A real gloo run of FSDP2 over torchtitan's flattened dp_shard x cp mesh: what
each of 4 ranks holds against what zsim predicts for the same plan (fsdp, dp_shard=2,
cp=2) and a count worked out here by hand.

torchtitan (parallel_dims.py, _build_mesh_without_ep) flattens the mesh's dp_shard and
cp axes into "dp_shard_cp" and parallelize_llama's apply_fsdp shards over it whenever cp
> 1, so the cp ranks of a sequence shard the model state with the data-parallel ones.
torch's context_parallel itself does not run on CPU (torch 2.13, gloo): SDPA dispatches
to aten._scaled_dot_product_flash_attention_for_cpu, which "does not have a sharding
strategy registered" (NotImplementedError), and with the math kernel the ring's
DTensors meet plain tensors in the residual add ("aten.add.Tensor got mixed
torch.Tensor and DTensor"). So each rank attends within its share of the sequence; the
model state, which is what this checks, does not depend on it.
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from _ranks import fsdp_over_dp_shard_cp

from zsim.backend.runner import run_ranks
from zsim.schedule.lower import state_at_rest_bytes
from zsim.schedule.programs.fsdp2 import state_shard_elems
from zsim.spec.model import ModelSpec
from zsim.spec.plan import Plan

SPEC = ModelSpec(name="tiny", num_layers=2, d_model=128, num_heads=4, num_kv_heads=2,
                 ffn_hidden=346, vocab_size=500, max_seq_len=64, norm_kernel="composite")
"""2 blocks, d 128, GQA 4/2 heads; an MLP 346 wide: w1 and w3 split 87 rows a rank on 4
ranks (the last holds 85 real ones), so the padding shows."""
PLAN = Plan(strategy="fsdp", dp_shard=2, cp=2, seq_len=64)

SHARD_ELEMS = 123_424
"""One rank's padded shard on 4 ranks, by hand: per block wq 32 x 128, wk and wv 16 x 128
(kv 64), wo 32 x 128, w1 and w3 87 x 128, w2 32 x 346, two norms 32 each = 45,696; two
blocks 91,392; the embedding and the output 125 x 128 each and the final norm 32 =
32,032."""


@pytest.mark.slow
def test_fsdp2_over_dp_shard_cp_holds_a_quarter_on_each_of_4_ranks() -> None:
    assert SPEC.kv_dim == 64
    ranks = run_ranks(fsdp_over_dp_shard_cp, (SPEC, PLAN), nproc=PLAN.world_size)
    # Every parameter and gradient is a DTensor sharded on dim 0 over all 4 ranks: the
    # flattened group, not the 2 data-parallel ranks, and the gradients were
    # reduce-scattered over it.
    for r in ranks:
        assert r["meshes"] == r["grad_meshes"] == [(4, True)]
    # Each rank trained on different tokens (its dp rank's sequence, its cp share).
    assert len({r["loss"] for r in ranks}) == 4
    # FSDP2 pads every rank's shard to the first chunk: fp32, the hand count, on each.
    assert {r["param_storage_bytes"] for r in ranks} == {4 * SHARD_ELEMS}
    # Rank 0 holds whole chunks; rank 3 has 2 rows fewer of w1 and w3 per block, which
    # its gradients and AdamW's two moments do not mirror.
    short = 2 * 2 * 2 * SPEC.d_model
    assert [r["grad_bytes"] for r in ranks] == [4 * SHARD_ELEMS] * 3 + [4 * (SHARD_ELEMS - short)]
    assert [r["moment_bytes"] for r in ranks] == (
        [8 * SHARD_ELEMS] * 3 + [8 * (SHARD_ELEMS - short)])
    # zsim: the plan's state at rest is the padded quarter (rank 0's, the largest).
    assert PLAN.dp_shard_cp == 4
    assert state_shard_elems(SPEC, PLAN.dp_shard_cp) == SHARD_ELEMS
    assert state_at_rest_bytes(SPEC, PLAN) == {"master_params": 4 * SHARD_ELEMS,
                                               "optimizer_states": 8 * SHARD_ELEMS}
    # Sharding over dp_shard alone (zsim's model once) would hold about twice.
    assert state_shard_elems(SPEC, PLAN.dp_shard) > 1.9 * SHARD_ELEMS
