"""The peak of a step under full recomputation, worked out by hand for a
3-block reference model (FSDP2 on 8 ranks, bf16 with fp32 reduction, each block
checkpointed with torch.utils.checkpoint, non-reentrant) from what torch and FSDP2 hold
at that moment, against the simulated ledger.

The moment: unit 1's backward (the middle block), in the backward of the product
silu(w1 x) * w3 x. What is alive, and why:

- Model state: fp32 shards of every parameter, AdamW's two fp32 moments, the model's fp32
  RoPE buffers, two cuBLAS workspaces (the profile's blas_workspace_mib each).
- The root's bf16 parameters (not resharded until the end of backward) and the gradients
  its backward made: the output projection's and the final norm's (bf16, unsharded).
- Unit 2 (reduced before this block's backward): its fp32 reduce-scatter input, held by
  FSDP2 until the next post-backward (reduce_scatter_state), and its fp32 gradient shard
  (a view of the reduce-scatter output, the sharded parameter's dtype).
- Unit 1's bf16 unsharded parameters (its pre-backward) and unit 0's all-gather output
  (prefetched by that pre-backward, copied out only in unit 0's own pre-backward).
- Blocks 0 and 1's checkpoint inputs (b*s*d each; unit 2's was freed with its backward).
- The gradient of block 1's output, which the residual add handed to both branches and
  which waits for the norms' input gradients to be added into it.
- Block 1's recomputed tensors: its forward re-run by the first unpack (w2's backward) up
  to w2's input, every saved tensor alive at once (checkpoint's early stop), less the
  product, freed when w2's backward ended: the attention norm's input is the checkpoint
  input; its rstd, q and k after RoPE, v, the attention output and log-sum-exp, the
  residual h, the ffn norm's output and rstd, w1 x, silu(w1 x), w3 x.
- The backward so far: w2's weight gradient, the product's gradient, and the two the
  product's backward is making (for silu(w1 x) and w3 x).
"""

from __future__ import annotations

from zsim.simulate import simulate
from zsim.spec.model import ModelSpec
from zsim.spec.plan import Plan
from zsim.spec.registry import resolve_hardware
from zsim.units import MiB

L, D, F, V, S, N = 3, 256, 512, 256, 1024, 8
HEADS = 2  # head_dim 128
TINY = ModelSpec(name="tiny", num_layers=L, d_model=D, num_heads=HEADS, num_kv_heads=HEADS,
                 ffn_hidden=F, vocab_size=V, max_seq_len=S)
PLAN = Plan.for_strategy("fsdp", gpus=N, seq_len=S, micro_batch=1, recompute="full",
                         reduce_dtype="fp32")
BF16, FP32 = 2, 4


def test_full_recomputation_peak_is_what_torch_holds_in_the_middle_block() -> None:
    hw = resolve_hardware("hgx-h200")
    block = 4 * D * D + 3 * D * F + 2 * D            # wq wk wv wo, w1 w3 w2, 2 norms
    root = 2 * V * D + D                             # embedding, output, final norm
    params = L * block + root                        # every dim divides by N: no padding
    shards = params // N * FP32 * 3                  # fp32 shard, exp_avg, exp_avg_sq
    rope, workspaces = 2 * S * (D // HEADS) * FP32, 2 * 32 * MiB
    root_grads = (V * D + D) * BF16                  # output projection, final norm
    unit2 = block * FP32 + block // N * FP32         # reduce-scatter input, grad shard
    gathered = block * BF16 + block * BF16           # unit 1 unsharded, unit 0 prefetched
    d_act, f_act = S * D * BF16, S * F * BF16        # (b, s, d) and (b, s, f), bf16
    rstd, lse = S * FP32, HEADS * S * FP32
    inputs = 2 * d_act                               # checkpoint inputs of blocks 0, 1
    incoming = d_act                                 # the gradient of block 1's output
    # n1, q and k after RoPE, v, attention output, h, n2 (kv = d here); both rstd; lse;
    # w1 x, silu(w1 x), w3 x.
    recomputed = 7 * d_act + 2 * rstd + lse + 3 * f_act
    backward = D * F * BF16 + 3 * f_act              # w2's grad; product, silu, w3 grads
    hand = (shards + rope + workspaces + root * BF16 + root_grads + unit2 + gathered
            + inputs + incoming + recomputed + backward)

    r = simulate(TINY, hw, PLAN)
    assert r.peak_op == "unit 1 backward (mb 0)"
    assert r.peak_memory_bytes == hand
    at = r.memory_at_peak
    assert at["master_params"] + at["optimizer_states"] == shards
    assert (at["params"], at["workspace"]) == (rope, workspaces)
    assert at["gathered_params"] == root * BF16 + block * BF16
    assert at["comm_buffers"] == block * FP32 + block * BF16
    assert at["grads"] == block // N * FP32
    # The ledger holds unit 1's weight gradients whole for the op, and the transient as
    # the rest of the moment: together they are what the moment holds.
    assert at["activations"] + at["gathered_grads"] == (
        inputs + incoming + recomputed + backward + root_grads)
