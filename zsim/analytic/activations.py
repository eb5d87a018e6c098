"""Activation memory: what autograd saves per transformer block and around the loss.

Owns the list of tensors the reference training step (docs/modelling.md) keeps between a block's
forward and its backward, per recomputation policy, and the transient working memory of
the loss. Pure arithmetic on ModelSpec; imports nothing heavy. Kernel choices that move
memory (flash vs math attention, fused vs composite RMSNorm, GQA by enable_gqa or by
repeating k/v, fp32 logits, the dtype RoPE's tables reach the blocks in) are ModelSpec
knobs; the torch backend measures the same tensors with
`torch.autograd.graph.saved_tensors_hooks`.

References:
- What each aten op saves: derivatives.yaml in PyTorch (tools/autograd/derivatives.yaml).
- Flash attention saves q, k, v, the output and the log-sum-exp (Dao et al. 2022, Alg. 2).
- Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer
  Models", Eq. 2: 34*s*b*h + 5*a*s^2*b bytes per GPT layer without flash attention, a
  cross-check (tests), not the model.
- Autocast (torch.amp, the program DDP and ZeRO-1 run: fp32 parameters, bf16 matmuls):
  the op lists of torch/amp/autocast_mode.py and aten/src/ATen/autocast_mode.cpp. A
  matmul casts its fp32 weight to the compute dtype once per forward (autocast's weight
  cache) and its input on every call; the mm saves both casts. Ops outside the lists
  (add, mul, RMSNorm's decomposition) follow type promotion, so the residual stream and
  the norms stay fp32, and SDPA (lower-precision list) casts q, k, v itself.
- Selective recomputation follows torchtitan's op-level SAC policy
  (torchtitan/distributed/activation_checkpoint.py, `_op_sac_save_list`): outputs of
  matmuls and attention are saved, except every second matmul; everything else is
  recomputed in backward.
"""

from __future__ import annotations

from dataclasses import dataclass

from zsim.spec.model import ModelSpec
from zsim.units import FP32_BYTES

INDEX_BYTES = 8
"""int64 token ids and labels."""
STATE_ALIASES = frozenset({"rope.cos_sin_buffers"})
"""Saved tensors that are the model's own buffers (ModelSpec.buffer_bytes): autograd
references them, but they are state, not new allocations."""
LOSS_PREFIX = "loss."
"""Names of the root's saved tensors that the loss saves (root_saved_tensors): its
backward frees them before the output projection's runs."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SavedTensor:
    """One tensor autograd keeps alive for the backward pass."""

    name: str
    """Module path and role, e.g. "feed_forward.w1.output"."""
    bytes: int
    """Size in bytes for the whole micro-batch."""


def _norm_saved(model: ModelSpec, prefix: str, bs: int, a: int, autocast: bool
                ) -> list[SavedTensor]:
    """What one norm over a (bs, d) activation saves.

    RMSNorm: fused (CUDA) saves its input (fp32 under autocast, where the residual stream
    is) and an fp32 rstd; composite (torch.nn.RMSNorm's CPU decomposition) upcasts and
    saves x.float() (not the input), rsqrt(mean(x^2)) and the fp32 normalised x for the
    weight multiply. LayerNorm is one native kernel on every device (native_layer_norm):
    its input, and a mean and rstd per token in the kernel's accumulate type, fp32 on
    CUDA, the input's dtype on CPU (the device of the composite knob; fp32 there under
    autocast, whose input is fp32)."""
    d = model.d_model
    res = FP32_BYTES if autocast else a
    if model.norm == "layernorm":
        stats = FP32_BYTES if autocast or model.norm_kernel == "fused" else a
        return [SavedTensor(name=f"{prefix}.input", bytes=bs * d * res),
                SavedTensor(name=f"{prefix}.mean", bytes=bs * stats),
                SavedTensor(name=f"{prefix}.rstd", bytes=bs * stats)]
    if model.norm_kernel == "composite":
        return [SavedTensor(name=f"{prefix}.input_fp32", bytes=bs * d * FP32_BYTES),
                SavedTensor(name=f"{prefix}.rstd", bytes=bs * FP32_BYTES),
                SavedTensor(name=f"{prefix}.normalized_fp32", bytes=bs * d * FP32_BYTES)]
    return [SavedTensor(name=f"{prefix}.input", bytes=bs * d * res),
            SavedTensor(name=f"{prefix}.rstd", bytes=bs * FP32_BYTES)]


def _block_all(model: ModelSpec, b: int, s: int, a: int, autocast: bool) -> list[SavedTensor]:
    """Every tensor a block saves with no recomputation, in forward order. A TP shard
    (ModelSpec.tp_shard) saves its heads' attention tensors and its slice of the MLP;
    the norms save the sequence shard with sequence parallelism, and the matmuls' inputs
    are whole (torch's SequenceParallel all-gathers them before the linears, which save
    the gathered input; Megatron-LM instead saves the shard and gathers it again)."""
    d, q, kv, f, h = model.d_model, model.q_dim, model.kv_dim, model.mlp_width, model.num_heads
    v = model.v_dim
    bs = b * s
    kv_saved = q if model.gqa_impl == "repeat_kv" else kv
    out: list[SavedTensor] = []

    def norm(prefix: str) -> None:
        out.extend(_norm_saved(model, prefix, bs // model.norm_tokens_divisor, a, autocast))

    def matmul_inputs(shared: str, names: tuple[str, ...]) -> None:
        """The saved input of matmuls reading one tensor: one shared tensor, or under
        autocast one compute-dtype cast per matmul (each nn.Linear casts on its own)."""
        if autocast:
            out.extend(SavedTensor(name=f"{n}.input_cast", bytes=bs * d * a) for n in names)
        else:
            out.append(SavedTensor(name=f"{shared}.input", bytes=bs * d * a))

    if autocast:
        # The compute-dtype copy of every weight, cached for the forward and saved by its
        # matmul (the fp32 parameter itself is not an activation).
        out += [SavedTensor(name=f"{n}.weight_cast", bytes=fan_in * fan_out * a)
                for n, fan_in, fan_out in model.block_matmuls()]
    norm("attention_norm")
    matmul_inputs("attention.wqkv", ("attention.wq", "attention.wk", "attention.wv"))
    if model.attention_kernel == "flash":
        out += [
            SavedTensor(name="attention.sdpa.q", bytes=bs * q * a),
            SavedTensor(name="attention.sdpa.k", bytes=bs * kv_saved * a),
            SavedTensor(name="attention.sdpa.v", bytes=bs * (v if model.mla else kv_saved) * a),
            SavedTensor(name="attention.sdpa.out", bytes=bs * v * a),
            SavedTensor(name="attention.sdpa.logsumexp", bytes=b * h * s * FP32_BYTES),
        ]
        # The flash kernel lays its output out as (b, s, h, d): the transpose back and
        # .contiguous() before wo are free, so wo's saved input is sdpa.out's storage.
    else:
        # Math kernel: q and k (scaled copies) for q @ k^T, the s x s softmax output,
        # and v for softmax @ v; GQA is done by expanding k and v to every head.
        out += [
            SavedTensor(name="attention.sdpa.q_scaled", bytes=bs * q * a),
            SavedTensor(name="attention.sdpa.k_scaled", bytes=bs * q * a),
            SavedTensor(name="attention.sdpa.softmax",
                        bytes=b * h * s * s * model.context_parallel * a),
            SavedTensor(name="attention.sdpa.v", bytes=bs * q * a),
            # (b, h, s, d) output: .contiguous() copies it before wo.
            SavedTensor(name="attention.wo.input", bytes=bs * q * a),
        ]
    norm("ffn_norm")
    if model.moe is not None and model.moe.input_sequence_sharded:
        # The router saves the rank's sequence shard of the MoE's input (no all-gather).
        out.append(SavedTensor(name="moe.router.gate.input",
                               bytes=bs // model.moe.token_shard * d * a))
    else:
        matmul_inputs("feed_forward.w1", ("feed_forward.w1", "feed_forward.w3")
                      if model.mlp == "swiglu" else ("feed_forward.w1",))
    if model.moe is not None:
        out += _moe_routing_saved(model, bs, a)
    out.append(SavedTensor(name="feed_forward.w1.output", bytes=bs * f * a))
    if model.mlp == "swiglu":
        out += [
            SavedTensor(name="feed_forward.silu.output", bytes=bs * f * a),
            SavedTensor(name="feed_forward.w3.output", bytes=bs * f * a),
        ]
    out.append(SavedTensor(name="feed_forward.w2.input", bytes=bs * f * a))
    return out


def _moe_routing_saved(model: ModelSpec, bs: int, a: int) -> list[SavedTensor]:
    """What an MoE layer saves beyond an MLP of its width (torchtitan's MoE): the router's
    fp32 scores over every expert, the token copies permuted to their top_k experts (the
    grouped GEMMs' input) and the experts' outputs before the weighted combine (its
    backward needs them for the scores' gradient). Of the rank's 1/token_shard of the
    tokens under EP with TP."""
    assert model.moe is not None
    k = model.moe.top_k
    bs = bs // model.moe.token_shard
    return [SavedTensor(name="moe.router.scores", bytes=bs * model.moe.experts * FP32_BYTES),
            SavedTensor(name="moe.routed_input", bytes=bs * k * model.d_model * a),
            SavedTensor(name="moe.experts.output", bytes=bs * k * model.d_model * a)]


def _block_selective(model: ModelSpec, b: int, s: int, a: int, autocast: bool
                     ) -> list[SavedTensor]:
    """torchtitan op-level SAC: the block input (checkpoint input; fp32 under autocast),
    attention outputs and the odd-numbered matmul outputs (wq, wv, w1, w2 in call order).
    Autocast's weight casts are not on the save list: they are recomputed."""
    bs = b * s
    res = FP32_BYTES if autocast else a
    out = [SavedTensor(name="block.input",
                       bytes=bs // model.norm_tokens_divisor * model.d_model * res)]
    out += [SavedTensor(name=f"{name}.output", bytes=bs * width * a)
            for name, _, width in model.block_matmuls()[::2]]
    if model.attention_kernel == "flash":
        out.append(SavedTensor(name="attention.sdpa.logsumexp",
                               bytes=b * model.num_heads * s * FP32_BYTES))
    out.append(SavedTensor(name="attention.sdpa.out", bytes=bs * model.v_dim * a))
    return out


def block_saved_tensors(model: ModelSpec, *, micro_batch: int, seq_len: int,
                        recompute: str, act_bytes: int = 2,
                        autocast: bool = False) -> list[SavedTensor]:
    """Tensors one block keeps from its forward until its backward.

    Args:
        model: the architecture and its kernel knobs.
        micro_batch: sequences per micro-batch.
        seq_len: tokens per sequence.
        recompute: "none", "selective" or "full".
        act_bytes: bytes per activation element (2 for bf16 compute, 4 for fp32).
        autocast: the execution mode. False: parameters are gathered or kept in the
            compute dtype and every activation is in it (FSDP2's MixedPrecisionPolicy).
            True: fp32 parameters under torch.autocast to act_bytes (DDP, ZeRO-1): each
            matmul also saves the compute-dtype cast of its weight and its own cast of
            its input, and the residual stream is fp32 (see the module docstring).

    Returns:
        The saved tensors, in forward order; sizes in bytes.
    """
    b, s, a = micro_batch, seq_len, act_bytes
    if recompute == "full":
        res = FP32_BYTES if autocast else a
        return [SavedTensor(name="block.input",
                            bytes=b * s // model.norm_tokens_divisor * model.d_model * res)]
    if recompute == "selective":
        return _block_selective(model, b, s, a, autocast)
    return _block_all(model, b, s, a, autocast)


def block_input_casts(model: ModelSpec, *, seq_len: int, act_bytes: int = 2,
                      casts_inputs: bool) -> list[SavedTensor]:
    """Copies one block keeps of its floating-point inputs when the program casts them
    to the compute dtype at the block's boundary (`casts_inputs`, Plan.casts_block_inputs:
    FSDP2's MixedPrecisionPolicy, cast_forward_inputs, in each fully_shard'ed block's
    pre-forward, outside the block's checkpoint). The residual stream arrives in the
    compute dtype already; RoPE's cos and sin tables do not when the model hands its
    blocks the fp32 buffers (ModelSpec.rope_table_dtype "fp32"): each block then gets a
    (s, head_dim) copy of each, which its checkpoint keeps as an input (full
    recomputation) or its rotation's products save, until the block's backward."""
    if not casts_inputs or model.learned_pos_emb or model.rope_table_dtype != "fp32":
        return []
    table = seq_len * model.head_dim * act_bytes
    return [SavedTensor(name="block.rope_cos_cast", bytes=table),
            SavedTensor(name="block.rope_sin_cast", bytes=table)]


def block_activation_bytes(model: ModelSpec, *, micro_batch: int, seq_len: int,
                           recompute: str, act_bytes: int = 2, autocast: bool = False) -> int:
    """Bytes one block keeps saved between its forward and backward (see
    block_saved_tensors for `autocast`)."""
    return sum(t.bytes for t in block_saved_tensors(
        model, micro_batch=micro_batch, seq_len=seq_len, recompute=recompute,
        act_bytes=act_bytes, autocast=autocast))


def block_recompute_bytes(model: ModelSpec, *, micro_batch: int, seq_len: int,
                          recompute: str, act_bytes: int = 2, autocast: bool = False) -> int:
    """Bytes re-materialised while one block's backward runs under recomputation: what
    "none" would have saved minus what the policy kept (0 without recomputation)."""
    if recompute == "none":
        return 0
    full = block_activation_bytes(model, micro_batch=micro_batch, seq_len=seq_len,
                                  recompute="none", act_bytes=act_bytes, autocast=autocast)
    kept = block_activation_bytes(model, micro_batch=micro_batch, seq_len=seq_len,
                                  recompute=recompute, act_bytes=act_bytes, autocast=autocast)
    return max(full - kept, 0)


def block_backward_working_bytes(model: ModelSpec, *, micro_batch: int, seq_len: int,
                                 act_bytes: int = 2) -> int:
    """Activation gradients alive at once inside one block's backward: the gradient
    flowing through the residual stream (b*s*d) plus, at the MLP, the gradients of the
    up-projection outputs (b*s*f each) -- the largest simultaneous set."""
    bs = micro_batch * seq_len
    n_up = 2 if model.mlp == "swiglu" else 1
    return bs * act_bytes * (2 * model.d_model + n_up * model.mlp_width)


def root_saved_tensors(model: ModelSpec, *, micro_batch: int, seq_len: int,
                       act_bytes: int = 2, autocast: bool = False) -> list[SavedTensor]:
    """Tensors saved outside the blocks: token ids, the position ids (learned positions)
    or the RoPE tables (a compute-dtype copy, or the fp32 buffers themselves under
    autocast or ModelSpec.rope_table_dtype "fp32"), final norm (see _norm_saved), output
    projection input, and the log-softmax of the loss (fp32 when logits are upcast, and
    always under autocast, where cross_entropy is on the fp32 list) over the vocabulary
    the loss reads (ModelSpec.loss_vocab: a TP rank's loss spans the whole one). Under `autocast`
    (see block_saved_tensors) the final norm's input is the fp32 residual stream and the
    output projection also saves its weight's compute-dtype cast."""
    b, s, d, a = micro_batch, seq_len, model.d_model, act_bytes
    bs = b * s
    logit_bytes = FP32_BYTES if model.logits_upcast or autocast else a
    out = [SavedTensor(name="tok_embeddings.indices", bytes=bs * INDEX_BYTES)]
    if model.learned_pos_emb:
        # The position ids, arange(s), one row per position shared by the micro-batch.
        out.append(SavedTensor(name="pos_embeddings.indices", bytes=s * INDEX_BYTES))
    elif autocast or model.rope_table_dtype == "fp32":
        # The model's fp32 RoPE buffers themselves (under autocast the tables' cast to
        # the fp32 activations is a no-op): every block saves a slice of them, whose
        # storage spans max_seq_len; a program that casts them per block keeps copies
        # (block_input_casts).
        out.append(SavedTensor(name="rope.cos_sin_buffers",
                               bytes=2 * model.max_seq_len * model.head_dim * FP32_BYTES))
    else:
        # RoPE cos and sin tables (s x head_dim each, compute dtype): built once per
        # step and saved by every block's rotation, one storage.
        out.append(SavedTensor(name="rope.cos_sin", bytes=2 * s * model.head_dim * a))
    out += _norm_saved(model, "norm", bs, a, autocast)
    if autocast:
        out += [SavedTensor(name="output.weight_cast", bytes=model.vocab_size * d * a),
                SavedTensor(name="output.input_cast", bytes=bs * d * a)]
    else:
        out.append(SavedTensor(name="output.input", bytes=bs * d * a))
    # Over the vocabulary the loss reads: the whole one under TP (replicated logits).
    out += [SavedTensor(name="loss.log_softmax", bytes=bs * model.loss_vocab * logit_bytes),
            SavedTensor(name="loss.labels", bytes=bs * INDEX_BYTES)]
    return out


def loss_forward_working_bytes(model: ModelSpec, *, micro_batch: int, seq_len: int,
                               act_bytes: int = 2) -> int:
    """Transient bytes of the loss's forward beside what it saves: the logits the
    log-softmax reads (their fp32 copy when upcast; the compute-dtype logits, freed once
    copied, never meet the saved log-softmax output, and the two together are less than
    copy and output). Over ModelSpec.loss_vocab, as loss_working_bytes."""
    logit = FP32_BYTES if model.logits_upcast else act_bytes
    return micro_batch * seq_len * model.loss_vocab * logit


def loss_working_bytes(model: ModelSpec, *, micro_batch: int, seq_len: int,
                       act_bytes: int = 2) -> int:
    """Transient bytes at the loss beyond what is saved: its backward's, which hold more
    than its forward's: the gradient of the log-softmax output and of its input (fp32
    when upcast) exist together, twice the logits the forward's log-softmax reads
    (loss_forward_working_bytes). Over the vocabulary the loss reads (ModelSpec.loss_vocab:
    the whole one on a TP rank, whose logits are all-gathered).
    """
    return 2 * loss_forward_working_bytes(model, micro_batch=micro_batch, seq_len=seq_len,
                                          act_bytes=act_bytes)


def head_backward_working_bytes(model: ModelSpec, *, micro_batch: int, seq_len: int,
                                act_bytes: int = 2) -> tuple[int, int]:
    """Transient bytes of the root's backward, in its two parts: the loss's (the
    gradients of the NLL and of the log-softmax output, fp32 when upcast, exist
    together; over ModelSpec.loss_vocab), then the output projection's (the gradient of
    its own logits in compute dtype and the final norm's output gradient)."""
    bs = micro_batch * seq_len
    logit = FP32_BYTES if model.logits_upcast else act_bytes
    return (2 * bs * model.loss_vocab * logit,
            bs * (model.vocab_size + model.d_model) * act_bytes)


def korthikanti_bytes_per_layer(*, seq_len: int, micro_batch: int, d_model: int,
                                num_heads: int) -> int:
    """Korthikanti et al. 2022, Eq. 2 (no recomputation, no tensor/sequence parallelism,
    fp16 activations, with dropout masks): 34*s*b*h + 5*a*s^2*b bytes for a GPT layer."""
    s, b, h, a = seq_len, micro_batch, d_model, num_heads
    return 34 * s * b * h + 5 * a * s * s * b
