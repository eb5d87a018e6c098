"""The real tensors behind the schedule's aggregate buffers, as PyTorch's CUDA caching
allocator sees them (zsim.schedule.ops.Buffer.pieces; zsim.engine.allocator replays them).

Owns two things. Per-parameter pieces: FSDP2 and torch.optim hold one tensor per
parameter (a sharded parameter, each AdamW state, an unsharded parameter or gradient),
so a unit's gathered parameters are as many allocations as the unit has parameters, and
on many ranks each is small enough for the allocator's small pool. And the allocation
scripts of the reference training step (docs/modelling.md) where the aggregate hides the order
the allocator sees: a block's forward (what it saves, with the transients it frees on the
way: RoPE's halves and products, the attention and MLP outputs consumed by the residual
adds), a block's backward (the gradient of its output, alive throughout, its
recomputation under full checkpointing, the activation gradients, flash attention's
fp32 dq accumulator, what autograd frees as each node ends),
the output projection and loss, and FSDP2's all-gather copy-in (the shard cast to the
compute dtype, then the flat output). The scripts were read from the aten ops of
zsim.backend.reference_model's blocks and checked against the allocation traces of real FSDP2
steps on an H200 (torch 2.11: torch.cuda.memory._record_memory_history, one block's
forward and backward event by event). A script's entries follow Buffer.pieces: n >= 0
allocates n bytes, ~i frees entry i.

Scripts exist for the reference Llama block only (fused RMSNorm, flash attention with
RoPE and enable_gqa, SwiGLU, no biases, 16-bit activations, no autocast, no or full
recomputation); other models get their saved tensors one by one, in forward order, with
no transients. Pure arithmetic on ModelSpec and Plan.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import lru_cache

from zsim.analytic.activations import (
    LOSS_PREFIX,
    STATE_ALIASES,
    block_saved_tensors,
    root_saved_tensors,
)
from zsim.spec.model import ModelSpec
from zsim.spec.plan import Plan
from zsim.units import FP32_BYTES, dtype_bytes

Shape = tuple[int, ...]


# ---------------------------------------------------------------------- parameters
def module_order(model: ModelSpec) -> list[Shape]:
    """Every parameter tensor's shape in module registration order (what
    model.parameters() yields, the order of FSDP2's sharding and torch.optim's states):
    the embeddings, the blocks, then the final norm and the output."""
    root = model.root_tensors()
    embeddings = [s for n, s in root if n.endswith("embeddings.weight")]
    rest = [s for n, s in root if not n.endswith("embeddings.weight")]
    block = [s for _, s in model.block_tensors()]
    return embeddings + block * model.num_layers + rest


def shard_rows(shape: Shape, n: int) -> int:
    """Elements of rank 0's shard of one parameter on n ranks: dim 0 chunked, the first
    chunk ceil(dim0 / n) rows (FSDP2 pads every rank's shard to it)."""
    return -(-shape[0] // n) * math.prod(shape[1:])


@lru_cache(maxsize=64)
def sharded_pieces(shapes: tuple[Shape, ...], n: int, elem_bytes: int,
                   copies: int = 1) -> tuple[int, ...]:
    """One tensor per parameter shard (`copies` of them per parameter, as AdamW's
    exp_avg and exp_avg_sq), in order (cached: every block unit of a plan asks for the
    same)."""
    return tuple(shard_rows(s, n) * elem_bytes for s in shapes for _ in range(copies))


@lru_cache(maxsize=64)
def gathered_pieces(shapes: tuple[Shape, ...], n: int, elem_bytes: int) -> tuple[int, ...]:
    """FSDP2's unsharded parameters, one per parameter: n padded shards each
    (init_all_gather_outputs), in module order (cached, as sharded_pieces)."""
    return tuple(shard_rows(s, n) * n * elem_bytes for s in shapes)


@lru_cache(maxsize=64)
def gradient_pieces(shapes: tuple[Shape, ...], elem_bytes: int) -> tuple[int, ...]:
    """Unsharded gradients as autograd allocates them: one per parameter, in backward
    order (the reverse of module order; cached, as sharded_pieces)."""
    return tuple(math.prod(s) * elem_bytes for s in reversed(shapes))


def all_gather_pieces(shard_bytes: int, output_bytes: int) -> tuple[int, ...]:
    """FSDP2's all-gather copy-in (foreach_all_gather): the shards cast to the compute
    dtype in one flat tensor (_get_param_all_gather_inputs), the flat output, then the
    cast freed; `shard_bytes` 0 when no cast is made (no mixed precision)."""
    if not shard_bytes:
        return (output_bytes,)
    return (shard_bytes, output_bytes, ~0)


def net_bytes(pieces: Sequence[int]) -> int:
    """Bytes a script leaves allocated."""
    freed = {~p for p in pieces if p < 0}
    return sum(p for i, p in enumerate(pieces) if p >= 0 and i not in freed)


def chain(*scripts: Sequence[int]) -> tuple[int, ...]:
    """Scripts run one after the other (each one's frees refer to its own entries)."""
    out: list[int] = []
    for pieces in scripts:
        base = len(out)
        out += [p if p >= 0 else ~(~p + base) for p in pieces]
    return tuple(out)


def repeat(pieces: Sequence[int], times: int) -> tuple[int, ...]:
    """A script run `times` times in a row (a unit of several blocks)."""
    return chain(*[pieces] * times)


# ---------------------------------------------------------------------- scripts
class _Script:
    """Builds a Buffer.pieces script: alloc returns the entry's index, free frees it."""

    def __init__(self) -> None:
        self.entries: list[int] = []

    def alloc(self, nbytes: int) -> int:
        self.entries.append(nbytes)
        return len(self.entries) - 1

    def free(self, *indices: int | None) -> None:
        """Free entries; None stands for a tensor another buffer holds."""
        self.entries.extend(~i for i in indices if i is not None)


class _Sizes:
    """Bytes of the reference block's tensors for one micro-batch."""

    def __init__(self, model: ModelSpec, plan: Plan) -> None:
        a = dtype_bytes(plan.param_dtype)
        bs = plan.micro_batch * plan.seq_len
        self.d = bs * model.d_model * a
        """(b, s, d) activation."""
        self.kv = bs * model.kv_dim * a
        """(b, s, kv) activation: k and v."""
        self.f = bs * model.mlp_width * a
        """(b, s, f) activation: the MLP's hidden."""
        self.rstd = bs * FP32_BYTES
        """RMSNorm's saved fp32 rstd."""
        self.lse = plan.micro_batch * model.num_heads * plan.seq_len * FP32_BYTES
        """Flash attention's saved fp32 log-sum-exp."""
        self.logits = bs * model.loss_vocab
        """Logit elements the loss reads (ModelSpec.loss_vocab)."""
        self.elem_bytes = a
        """Bytes per activation element (the plan's param_dtype)."""


def _reference(model: ModelSpec, plan: Plan) -> bool:
    """Whether the scripts describe this model and plan (see the module docstring)."""
    return (model.norm == "rmsnorm" and model.norm_kernel == "fused"
            and model.attention_kernel == "flash" and model.mlp == "swiglu"
            and not model.bias and not model.qkv_bias and not model.learned_pos_emb
            and model.gqa_impl == "enable_gqa" and model.logits_upcast
            and plan.param_dtype in ("bf16", "fp16") and not plan.fp8
            and plan.recompute in ("none", "full"))


def _rope(s: _Script, size: int) -> int:
    """RoPE in rotate-half form: -x[..., half:], the cat, x*cos, rot*sin, their sum."""
    neg = s.alloc(size // 2)
    cat = s.alloc(size)
    s.free(neg)
    cos, sin = s.alloc(size), s.alloc(size)
    out = s.alloc(size)
    s.free(cos, sin, cat)
    return out


def _forward(s: _Script, z: _Sizes, *, grad: bool, to_output: bool = True
             ) -> dict[str, int | None]:
    """One block's forward after its input: with `grad` what autograd saves stays (the
    returned entries), else everything is freed as soon as it is dead (the no-grad
    forward of a checkpointed block). `to_output`: through w2 (the output itself is the
    next block's input); else up to w2's input, where a checkpoint's recomputation
    stops."""
    saved: dict[str, int | None] = {}
    n1, r1 = s.alloc(z.d), s.alloc(z.rstd)
    if not grad:
        s.free(r1)
    q, k, v = s.alloc(z.d), s.alloc(z.kv), s.alloc(z.kv)
    qr, kr = _rope(s, z.d), _rope(s, z.kv)
    s.free(k, q)
    out, lse = s.alloc(z.d), s.alloc(z.lse)
    if not grad:
        s.free(lse)
    wo = s.alloc(z.d)
    if not grad:
        s.free(qr, kr, v, out, n1)
    h = s.alloc(z.d)
    s.free(wo)
    n2, r2 = s.alloc(z.d), s.alloc(z.rstd)
    if not grad:
        s.free(r2)
    w1, silu = s.alloc(z.f), s.alloc(z.f)
    if not grad:
        s.free(w1)
    w3, prod = s.alloc(z.f), s.alloc(z.f)
    if not grad:
        s.free(silu, w3)
    if to_output:
        w2 = s.alloc(z.d)
        if not grad:
            s.free(prod, n2, h)
        s.free(w2)
    if grad:
        saved = dict(n1=n1, r1=r1, qr=qr, kr=kr, v=v, out=out, lse=lse, h=h, n2=n2, r2=r2,
                     w1=w1, silu=silu, w3=w3, prod=prod)
    return saved


def _backward(s: _Script, z: _Sizes, saved: dict[str, int | None],
              weights: dict[str, int] | None = None) -> None:
    """One block's backward after its recomputation: each activation gradient as
    autograd makes it, each saved tensor freed as its node ends (`saved` entries; missing
    ones belong to another buffer), and with `weights` (bytes by weight, `_weight_elems`
    names) each weight's gradient allocated by its node (else they are their own
    buffers). The residual stream's gradient (the incoming gradient, which
    `_block_backward` holds) takes each norm's input gradient in place (autograd's
    InputBuffer accumulates into a tensor it holds the last reference to), so those are
    freed once made."""
    def sv(name: str) -> int | None:
        return saved.get(name)

    def grad(*names: str) -> None:
        for name in names if weights else ():
            s.alloc(weights[name])

    grad("w2")
    g_prod = s.alloc(z.f)
    s.free(sv("prod"))
    g_silu, g_w3 = s.alloc(z.f), s.alloc(z.f)
    s.free(sv("silu"), sv("w3"), g_prod)
    grad("w3")
    g_n2a = s.alloc(z.d)
    s.free(g_w3)
    g_w1 = s.alloc(z.f)
    s.free(sv("w1"), g_silu)
    grad("w1")
    g_n2b = s.alloc(z.d)
    s.free(sv("n2"), g_w1)
    g_n2 = s.alloc(z.d)
    s.free(g_n2a, g_n2b)
    grad("ffn_norm")
    g_h = s.alloc(z.d)
    s.free(sv("r2"), sv("h"), g_n2, g_h)
    grad("wo")
    g_out = s.alloc(z.d)
    dq, dk, dv = s.alloc(z.d), s.alloc(z.kv), s.alloc(z.kv)
    s.free(s.alloc(z.d * FP32_BYTES // z.elem_bytes + z.lse))  # fp32 dq accumulator, softmax_d
    s.free(sv("out"), sv("lse"), sv("qr"), sv("kr"), sv("v"), g_out)
    g_q, g_k = _rope_backward(s, dq, z.d), _rope_backward(s, dk, z.kv)
    grad("wv")
    g_v1 = s.alloc(z.d)
    s.free(dv)
    grad("wk")
    g_k1 = s.alloc(z.d)
    s.free(g_k)
    g_sum = s.alloc(z.d)
    s.free(g_v1, g_k1)
    grad("wq")
    g_q1 = s.alloc(z.d)
    s.free(sv("n1"), g_q, g_q1)
    grad("attention_norm")
    g_x = s.alloc(z.d)
    s.free(sv("r1"), g_sum, g_x)


def _rope_backward(s: _Script, grad: int, size: int) -> int:
    """RoPE's backward: the products' gradients, the cat's slices, their sum."""
    t1, out = s.alloc(size), s.alloc(size)
    s.free(grad)
    s.free(s.alloc(size))
    half = s.alloc(size // 2)
    s.free(t1)
    t2 = s.alloc(size)
    s.free(half, t2)
    return out


def fitted(pieces: Sequence[int], nbytes: int) -> tuple[int, ...]:
    """`pieces` if they leave `nbytes` allocated, else () (one tensor of the buffer)."""
    return tuple(pieces) if net_bytes(pieces) == nbytes else ()


@lru_cache(maxsize=64)
def _block_script(model: ModelSpec, plan: Plan) -> tuple[int, ...]:
    """The reference block's saved buffer: its input, then its forward."""
    z, s = _Sizes(model, plan), _Script()
    s.alloc(z.d)  # the block's input, the previous block's output
    _forward(s, z, grad=plan.recompute == "none")
    return tuple(s.entries)


@lru_cache(maxsize=256)
def _scripted(model: ModelSpec, plan: Plan, saved_per_block: int) -> bool:
    """The scripts describe the program: the reference step, whose block saves what the
    program's does (a program under autocast saves more)."""
    return _reference(model, plan) and net_bytes(_block_script(model, plan)) == saved_per_block


def block_saved_pieces(model: ModelSpec, plan: Plan, *, saved_per_block: int,
                       blocks: int, input_casts: tuple[int, ...] = ()) -> tuple[int, ...]:
    """The saved buffer of a unit of `blocks` blocks (zsim.schedule.build.block_forward),
    each block keeping `input_casts` (its inputs cast at its boundary, made first) and
    saving `saved_per_block` bytes: the reference block's script per block, else the
    saved tensors (zsim.analytic.activations.block_saved_tensors) in forward order when
    they add up, else ()."""
    if _scripted(model, plan, saved_per_block):
        return repeat(chain(input_casts, _block_script(model, plan)), blocks)
    tensors = [t.bytes for t in block_saved_tensors(
        model, micro_batch=plan.micro_batch, seq_len=plan.seq_len,
        recompute=plan.recompute, act_bytes=dtype_bytes(plan.param_dtype))]
    return fitted(repeat([*input_casts, *tensors], blocks),
                  (saved_per_block + sum(input_casts)) * blocks)


def _block_backward(s: _Script, z: _Sizes, plan: Plan, saved: dict[str, int | None],
                    weights: dict[str, int] | None = None) -> None:
    """A block's backward as autograd runs it, from the gradient of the block's output
    on: that gradient (b*s*d, the residual stream's) is alive throughout, while a
    checkpointed block re-runs its forward (torch.utils.checkpoint, non-reentrant: the
    first unpack of a saved tensor, in w2's backward, recomputes the block up to w2's
    input, so every recomputed tensor is alive at once) and while the block's own
    gradients are made (`_backward`); the residual add passes it on to both branches,
    and the norms' input gradients are accumulated into it, so it is what leaves the
    block, freed here for the next block's backward to hold. Under "none" `saved` are the
    forward's tensors, else the recomputation's."""
    incoming = s.alloc(z.d)
    if plan.recompute == "full":
        saved = _forward(s, z, grad=True, to_output=False)
    _backward(s, z, saved, weights)
    s.free(incoming)


@lru_cache(maxsize=64)
def _backward_script(model: ModelSpec, plan: Plan) -> tuple[int, ...]:
    z, s = _Sizes(model, plan), _Script()
    _block_backward(s, z, plan, {})
    return tuple(s.entries)


def block_backward_pieces(model: ModelSpec, plan: Plan, *, saved_per_block: int,
                          blocks: int) -> tuple[int, ...]:
    """The backward working buffer of a unit of `blocks` blocks
    (zsim.schedule.build.block_backward): per block, the gradient of its output, under
    full recomputation the forward re-run up to w2's input, then the backward
    (`_block_backward`); () off the reference step."""
    if not _scripted(model, plan, saved_per_block):
        return ()
    return repeat(_backward_script(model, plan), blocks)


@lru_cache(maxsize=256)
def backward_transient_bytes(model: ModelSpec, plan: Plan, *, saved_per_block: int,
                             blocks: int, grad_bytes_per_param: float) -> int | None:
    """What a unit's backward (zsim.schedule.build.block_backward) holds at its most
    beyond its saved tensors and its weight gradients, both of which the ledger holds
    for the whole op: the peak of the blocks' scripts run in reverse (`_block_backward`:
    the gradient flowing in, the recomputation, the backward), each weight's
    gradient (`grad_bytes_per_param` per element, 0 when the program allocates none)
    made by its node and each saved tensor freed as its node ends, less those saved
    tensors and gradients; 0 when the ledger's whole-op view holds more than that peak.
    None off the reference step (the closed form applies)."""
    if not _scripted(model, plan, saved_per_block):
        return None
    z, s = _Sizes(model, plan), _Script()
    s.alloc(z.d)  # the block's input
    saved = _forward(s, z, grad=plan.recompute == "none")
    start = len(s.entries)
    weights = {n: round(e * grad_bytes_per_param) for n, e in _weight_elems(model).items()}
    _block_backward(s, z, plan, saved, weights)
    saved_bytes, grad_bytes = net_bytes(s.entries[:start]), sum(weights.values())
    peak = _peak_bytes(s.entries)
    # The unit's blocks run one after the other: the first holds the others' saved
    # tensors, the last the others' gradients.
    held = (blocks - 1) * max(saved_bytes, grad_bytes)
    return max(0, held + peak - blocks * (saved_bytes + grad_bytes))


def _weight_elems(model: ModelSpec) -> dict[str, int]:
    """Elements of one reference block's weights, by the names `_backward` uses."""
    d, kv, f = model.d_model, model.kv_dim, model.ffn_hidden
    return {"attention_norm": d, "wq": d * d, "wk": d * kv, "wv": d * kv, "wo": d * d,
            "ffn_norm": d, "w1": d * f, "w3": d * f, "w2": f * d}


def _peak_bytes(pieces: Sequence[int]) -> int:
    """The most a script holds at once."""
    live = peak = 0
    for p in pieces:
        live += p if p >= 0 else -pieces[~p]
        peak = max(peak, live)
    return peak


def root_saved_pieces(model: ModelSpec, plan: Plan, *, root_saved: int,
                      loss: bool) -> tuple[int, ...]:
    """What the root saves (zsim.analytic.activations.root_saved_tensors, the model's
    own buffers excluded), one tensor each, the RoPE tables two (cos, sin): the loss's
    tensors (`loss`) or the others; () unless they add up to `root_saved`."""
    out: list[int] = []
    for t in root_saved_tensors(model, micro_batch=plan.micro_batch, seq_len=plan.seq_len,
                                act_bytes=dtype_bytes(plan.param_dtype)):
        if t.name in STATE_ALIASES or t.name.startswith(LOSS_PREFIX) != loss:
            continue
        out += [t.bytes // 2, t.bytes - t.bytes // 2] if t.name == "rope.cos_sin" else [t.bytes]
    return fitted(out, root_saved)


def loss_forward_pieces(model: ModelSpec, plan: Plan, *,
                        saved_per_block: int) -> tuple[int, ...]:
    """The loss's forward working buffer, allocated before the root's saved tensors:
    the 16-bit logits, their fp32 copy, the 16-bit ones freed (the fp32 copy lives
    until the log-softmax, saved with the root, is made); () off the reference step."""
    if not _scripted(model, plan, saved_per_block):
        return ()
    z = _Sizes(model, plan)
    return (z.logits * z.elem_bytes, z.logits * FP32_BYTES, ~0)


def loss_backward_pieces(model: ModelSpec, plan: Plan, *,
                         saved_per_block: int) -> tuple[int, ...]:
    """The loss's backward working buffer: the fp32 gradients of the NLL and of the
    log-softmax; () off the reference step."""
    if not _scripted(model, plan, saved_per_block):
        return ()
    z, s = _Sizes(model, plan), _Script()
    g_nll, g_logsm = s.alloc(z.logits * FP32_BYTES), s.alloc(z.logits * FP32_BYTES)
    s.free(g_nll, g_logsm)
    return tuple(s.entries)


def output_backward_pieces(model: ModelSpec, plan: Plan, *,
                           saved_per_block: int) -> tuple[int, ...]:
    """The output projection's backward working buffer: the 16-bit logits' gradient
    (the loss's backward output), the final norm's output and input gradients; () off
    the reference step."""
    if not _scripted(model, plan, saved_per_block):
        return ()
    z, s = _Sizes(model, plan), _Script()
    g_logits = s.alloc(z.logits * z.elem_bytes)
    g_norm = s.alloc(z.d)
    s.free(g_logits)
    g_x = s.alloc(z.d)
    s.free(g_norm, g_x)
    return tuple(s.entries)
