"""Compute: FLOPs, memory traffic and kernel counts of each part of the step, and their
time on a profile.

Owns per-block and per-root counts by kind of work and their time at the profile's
achievable rates: matmul and attention FLOPs at the compute peak, memory-bound kernels
(norms, RoPE, activations, residual adds, casts, the loss's softmax, the optimizer) at
the memory bandwidth, and a fixed cost per kernel launched (dispatch and launch overhead).
Per-op FLOP counts are an independent derivation of ModelSpec.flops_per_token (6N +
attention); a test checks they agree. Memory traffic and kernels do not enter model FLOPs
or MFU.

References:
- A matmul (m x k) @ (k x n) costs 2mkn FLOPs; backward costs twice forward (grad of
  input and grad of weight), Kaplan et al. 2020 Sec. 2.1.
- Causal attention: QK^T and AV each 2*b*s^2*d FLOPs forward, halved by the causal mask
  (flash attention skips masked tiles); backward counted as 2x forward like every op,
  the model-FLOPs convention of MFU (PaLM App. B). Flash attention's backward really
  runs 2.5x (it recomputes the scores); the profile's attention efficiency absorbs that.
- Memory-bound kernels of the reference block (zsim.backend.reference_model;
  docs/modelling.md, "The reference training step"): what each kernel reads and writes is
  listed in `_block_forward_kernels` and `_root_forward_kernels` (a roofline in the sense
  of Williams et al. 2009: a kernel with few FLOPs per byte runs at the memory bandwidth).
  Backward kernels move about twice the forward bytes (each elementwise op's backward
  reads the saved input and the output gradient and writes the input gradient; the matmul
  and attention kernels are counted as FLOPs), and launch about twice the forward kernels.
- AdamW: torch.optim.adam._multi_tensor_adam (foreach, the default on CUDA and used by
  the backend), per parameter tensor: _foreach_mul_ (weight decay), _foreach_lerp_,
  _foreach_mul_, _foreach_addcmul_, _foreach_sqrt, _foreach_div_, _foreach_add_,
  _foreach_addcdiv_; see `optimizer_flops`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from zsim.spec.hardware import HardwareProfile
from zsim.spec.model import ModelSpec
from zsim.units import FP32_BYTES

Gemm = tuple[int, int, int, float]
"""A weight matmul (m x k) @ (k x n) and how many times it runs: (m, k, n, count)."""

Attention = tuple[int, int, str, float]
"""Causal attention calls: (seq, head_dim, phase "forward"/"backward", forward FLOPs)."""

Traffic = tuple[str, str, float]
"""Memory-bound bytes read + written: (kernel class, pass, bytes); classes as
zsim.spec.kernel_rates.MEMORY_CLASSES and OPTIONAL_MEMORY_CLASSES (a class the profile
lacks runs at the flat memory-bound rate)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Flops:
    """Work of one pass over some ops, split by the rate it runs at. The totals drive the
    flat-efficiency time (profiles without measured kernel rates) and model FLOPs; the
    shapes (`gemms`, `attention_calls`, `traffic`) drive the time on a profile with
    measured kernel rates (zsim.spec.kernel_rates)."""

    matmul: float
    """Weight-matmul FLOPs."""
    attention: float
    """Attention-score and attention-value FLOPs."""
    memory_bytes: float = 0.0
    """Bytes read + written by memory-bound kernels (elementwise, norms, softmax, casts,
    the optimizer); matmul and attention kernels' own traffic is inside their FLOP rate."""
    kernels: float = 0.0
    """Kernels launched (each costs the profile's kernel_overhead_s)."""
    gemms: tuple[Gemm, ...] = ()
    """The matmuls behind `matmul`, by shape."""
    attention_calls: tuple[Attention, ...] = ()
    """The attention calls behind `attention`."""
    traffic: tuple[Traffic, ...] = ()
    """`memory_bytes` by kernel class and pass, where known (copies and casts other than
    FSDP2's reduce-scatter copy-in are not classed: they run at the flat memory-bound
    rate)."""
    matmul_dtype: str = ""
    """The dtype the matmuls run at when not the step's compute dtype ("fp8": torchao's
    Float8Linear, see with_float8_linears); "" = the compute dtype."""

    @property
    def total(self) -> float:
        """FLOPs (matmul + attention); memory traffic and kernels are not FLOPs."""
        return self.matmul + self.attention

    def __add__(self, other: Flops) -> Flops:
        dtypes = {f.matmul_dtype for f in (self, other) if f.matmul}
        if len(dtypes) > 1:
            raise ValueError(f"cannot add matmuls of different dtypes {sorted(dtypes)}")
        return Flops(matmul=self.matmul + other.matmul, attention=self.attention + other.attention,
                     memory_bytes=self.memory_bytes + other.memory_bytes,
                     kernels=self.kernels + other.kernels, gemms=self.gemms + other.gemms,
                     attention_calls=self.attention_calls + other.attention_calls,
                     traffic=self.traffic + other.traffic,
                     matmul_dtype=dtypes.pop() if dtypes else "")

    def scaled(self, factor: float) -> Flops:
        return Flops(matmul=self.matmul * factor, attention=self.attention * factor,
                     memory_bytes=self.memory_bytes * factor, kernels=self.kernels * factor,
                     gemms=tuple((m, k, n, c * factor) for m, k, n, c in self.gemms),
                     attention_calls=tuple((s, h, ph, f * factor)
                                           for s, h, ph, f in self.attention_calls),
                     traffic=tuple((c, ph, b * factor) for c, ph, b in self.traffic),
                     matmul_dtype=self.matmul_dtype)


@dataclass(frozen=True, slots=True, kw_only=True)
class Kernel:
    """One memory-bound kernel of a forward pass."""

    name: str
    read_bytes: float
    write_bytes: float

    @property
    def kernel_class(self) -> str:
        """Its class of memory-bound kernel (zsim.spec.kernel_rates.MEMORY_CLASSES)."""
        if self.name.startswith("rope."):
            return "rope"
        if self.name.split(".")[0].endswith("norm"):
            return "norm"
        if self.name in ("logits.float", "log_softmax", "nll_loss"):
            return "cross_entropy"
        if self.name == "feed_forward.gelu":
            return "gelu"
        return "elementwise"


BACKWARD_FACTOR = 2.0
"""Backward FLOPs, memory traffic and kernels per forward (see module docstring)."""


def _norm_kernels(model: ModelSpec, name: str, tokens: int, a: int) -> list[Kernel]:
    """RMSNorm/LayerNorm of a (tokens, d) activation. Fused (CUDA), and LayerNorm on every
    device (native_layer_norm has a CPU kernel): one kernel reads x and writes y.
    Composite (torch.nn.RMSNorm's CPU decomposition): x.float(), pow(2), mean(-1),
    rsqrt(+eps), x * rstd, .type_as(x), * weight."""
    x = tokens * model.d_model
    if model.norm_kernel == "fused" or model.norm == "layernorm":
        return [Kernel(name=name, read_bytes=x * a, write_bytes=x * a)]
    f = FP32_BYTES
    return [Kernel(name=f"{name}.float", read_bytes=x * a, write_bytes=x * f),
            Kernel(name=f"{name}.pow", read_bytes=x * f, write_bytes=x * f),
            Kernel(name=f"{name}.mean", read_bytes=x * f, write_bytes=tokens * f),
            Kernel(name=f"{name}.rsqrt", read_bytes=tokens * f, write_bytes=tokens * f),
            Kernel(name=f"{name}.mul_rstd", read_bytes=x * f, write_bytes=x * f),
            Kernel(name=f"{name}.type_as", read_bytes=x * f, write_bytes=x * a),
            Kernel(name=f"{name}.mul_weight", read_bytes=x * a, write_bytes=x * a)]


def _rope_kernels(name: str, elems: int, a: int) -> list[Kernel]:
    """Rotate-half RoPE of one (tokens, width) tensor (zsim.backend.reference_model._rope):
    -x[..., half:] reads and writes half; cat reads and writes all; x * cos and
    rotated * sin each read and write all (the (s, head_dim) tables are negligible); the
    sum reads two and writes one."""
    e = elems * a
    return [Kernel(name=f"{name}.neg", read_bytes=e / 2, write_bytes=e / 2),
            Kernel(name=f"{name}.cat", read_bytes=e, write_bytes=e),
            Kernel(name=f"{name}.mul_cos", read_bytes=e, write_bytes=e),
            Kernel(name=f"{name}.mul_sin", read_bytes=e, write_bytes=e),
            Kernel(name=f"{name}.add", read_bytes=2 * e, write_bytes=e)]


def _block_forward_kernels(model: ModelSpec, *, micro_batch: int, seq_len: int,
                           act_bytes: int) -> list[Kernel]:
    """Memory-bound kernels of one block's forward, in call order, with the bytes each
    reads and writes (activations in `act_bytes` per element)."""
    t, a = micro_batch * seq_len, act_bytes
    d, q, kv, f = model.d_model, model.q_dim, model.kv_dim, model.mlp_width
    # The norms and residual adds run on the sequence shard with sequence parallelism.
    r = t // model.norm_tokens_divisor
    out = _norm_kernels(model, "attention_norm", r, a)
    if not model.learned_pos_emb:
        out += _rope_kernels("rope.q", t * q, a) + _rope_kernels("rope.k", t * kv, a)
    if model.gqa_impl == "repeat_kv" and kv < q:
        # k.repeat_interleave, v.repeat_interleave: read kv width, write full width.
        out += [Kernel(name=f"repeat_kv.{x}", read_bytes=t * kv * a, write_bytes=t * q * a)
                for x in ("k", "v")]
    # out.transpose(1, 2).reshape(b, s, d): a strided copy of the attention output.
    out.append(Kernel(name="attention.output_copy", read_bytes=t * q * a, write_bytes=t * q * a))
    out.append(Kernel(name="residual_add.attention", read_bytes=2 * r * d * a,
                      write_bytes=r * d * a))
    out += _norm_kernels(model, "ffn_norm", r, a)
    if model.moe is not None:
        # Token copies gathered into expert order, then the experts' outputs scattered
        # back and summed with their scores (torchtitan's MoE permute and combine).
        # Of the rank's 1/token_shard of the tokens under EP with TP.
        mine = t // model.moe.token_shard
        routed = mine * model.moe.top_k * d * a
        out += [Kernel(name="moe.permute", read_bytes=routed, write_bytes=routed),
                Kernel(name="moe.combine", read_bytes=routed, write_bytes=mine * d * a)]
    out.append(Kernel(name="feed_forward.gelu" if model.mlp == "gelu" else "feed_forward.silu",
                      read_bytes=t * f * a, write_bytes=t * f * a))
    if model.mlp == "swiglu":
        out.append(Kernel(name="feed_forward.gate_mul", read_bytes=2 * t * f * a,
                          write_bytes=t * f * a))
    out.append(Kernel(name="residual_add.ffn", read_bytes=2 * r * d * a, write_bytes=r * d * a))
    return out


def _root_forward_kernels(model: ModelSpec, *, micro_batch: int, seq_len: int,
                          act_bytes: int) -> list[Kernel]:
    """Memory-bound kernels of the root's forward: `_root_kernels`, then the loss's
    (`_loss_kernels`)."""
    kw = dict(micro_batch=micro_batch, seq_len=seq_len, act_bytes=act_bytes)
    return _root_kernels(model, **kw) + _loss_kernels(model, **kw)


def _root_kernels(model: ModelSpec, *, micro_batch: int, seq_len: int,
                  act_bytes: int) -> list[Kernel]:
    """The root's kernels outside the loss: embedding gather (reads one row per token,
    writes the activation), with learned positions their gather (one row per position)
    and its broadcast add, and the final norm."""
    t, a, d = micro_batch * seq_len, act_bytes, model.d_model
    out = [Kernel(name="tok_embeddings", read_bytes=t * d * a, write_bytes=t * d * a)]
    if model.learned_pos_emb:
        rows = seq_len * d * a
        out += [Kernel(name="pos_embeddings", read_bytes=rows, write_bytes=rows),
                Kernel(name="pos_embeddings.add", read_bytes=t * d * a + rows,
                       write_bytes=t * d * a)]
    return out + _norm_kernels(model, "norm", t, a)


def _loss_kernels(model: ModelSpec, *, micro_batch: int, seq_len: int,
                  act_bytes: int) -> list[Kernel]:
    """The loss's kernels: logits.float() (when upcast), log_softmax over the vocabulary
    (reads and writes the logits), nll_loss (reads one value per token); over the
    vocabulary the loss reads (ModelSpec.loss_vocab: the whole one on a TP rank)."""
    t, a, v = micro_batch * seq_len, act_bytes, model.loss_vocab
    logit_bytes = FP32_BYTES if model.logits_upcast else a
    out: list[Kernel] = []
    if model.logits_upcast:
        out.append(Kernel(name="logits.float", read_bytes=t * v * a,
                          write_bytes=t * v * FP32_BYTES))
    out.append(Kernel(name="log_softmax", read_bytes=t * v * logit_bytes,
                      write_bytes=t * v * logit_bytes))
    out.append(Kernel(name="nll_loss", read_bytes=t * logit_bytes, write_bytes=FP32_BYTES))
    return out


def _traffic(kernels: list[Kernel]) -> float:
    return sum(k.read_bytes + k.write_bytes for k in kernels)


def _by_class(kernels: list[Kernel], phase: str, factor: float = 1.0) -> tuple[Traffic, ...]:
    """Bytes of `kernels` per kernel class, in first-seen class order, times `factor`."""
    out: dict[str, float] = {}
    for k in kernels:
        out[k.kernel_class] = out.get(k.kernel_class, 0.0) + k.read_bytes + k.write_bytes
    return tuple((c, phase, b * factor) for c, b in out.items())


def block_forward_flops(model: ModelSpec, *, micro_batch: int, seq_len: int,
                        act_bytes: int) -> Flops:
    """Forward work of one block for a micro-batch: its weight matmuls, causal attention
    scores and values, the memory-bound kernels of `_block_forward_kernels`, and one
    kernel per matmul and one for attention."""
    tokens = micro_batch * seq_len
    matmuls = model.block_matmuls()
    matmul = 2.0 * tokens * sum(k * n for _, k, n in matmuls)
    # QK^T and AV: 2 * b * s^2 * d each, half of the scores masked.
    # With context parallelism each of the rank's queries attends to cp x seq_len keys
    # (causal, load-balanced: torch's _HeadTailLoadBalancer gives every rank as much).
    attention = (2.0 * micro_batch * seq_len * seq_len * model.context_parallel
                 * (model.q_dim + model.v_dim)) / 2
    mem = _block_forward_kernels(model, micro_batch=micro_batch, seq_len=seq_len,
                                 act_bytes=act_bytes)
    return Flops(matmul=matmul, attention=attention, memory_bytes=_traffic(mem),
                 kernels=float(len(mem) + len(matmuls) + 1),
                 gemms=tuple((tokens, k, n, 1.0) for _, k, n in matmuls),
                 attention_calls=((seq_len, model.head_dim, "forward", attention),),
                 traffic=_by_class(mem, "forward"))


def routed_expert_flops(model: ModelSpec, *, micro_batch: int, seq_len: int,
                        phase: str, recompute: str = "none") -> Flops:
    """Work of one MoE block's routed-expert GEMMs for a micro-batch in `phase`
    ("forward", "recompute" or "backward"): the moe.experts matmuls of block_matmuls,
    their backward in backward, their re-run in the recompute of a block that
    recomputes them (full, or selective's every second matmul); none in a dense
    model."""
    if model.moe is None or (phase == "recompute" and recompute == "none"):
        return Flops(matmul=0.0, attention=0.0)
    matmuls = model.block_matmuls()
    if phase == "recompute" and recompute == "selective":
        matmuls = matmuls[1::2]
    experts = [(k, n) for name, k, n in matmuls if name.startswith("moe.experts.")]
    tokens = micro_batch * seq_len
    fwd = Flops(matmul=2.0 * tokens * sum(k * n for k, n in experts), attention=0.0,
                gemms=tuple((tokens, k, n, 1.0) for k, n in experts))
    return _backward_of(fwd) if phase == "backward" else fwd


def block_backward_flops(model: ModelSpec, *, micro_batch: int, seq_len: int,
                         act_bytes: int) -> Flops:
    """Backward work of one block (without recomputation): BACKWARD_FACTOR x forward in
    FLOPs, traffic and kernels; by shape, each matmul's input gradient (m x n) @ (n x k)
    and weight gradient (k x m) @ (m x n), and attention's backward kernel."""
    fwd = block_forward_flops(model, micro_batch=micro_batch, seq_len=seq_len,
                              act_bytes=act_bytes)
    return _backward_of(fwd)


def _backward_of(fwd: Flops) -> Flops:
    """The backward pass of a forward `fwd` (see block_backward_flops)."""
    twice = fwd.scaled(BACKWARD_FACTOR)
    return Flops(matmul=twice.matmul, attention=twice.attention,
                 memory_bytes=twice.memory_bytes, kernels=twice.kernels,
                 gemms=tuple(g for m, k, n, c in fwd.gemms
                             for g in ((m, n, k, c), (k, m, n, c))),
                 attention_calls=tuple((s, h, "backward", f)
                                       for s, h, _, f in fwd.attention_calls),
                 traffic=tuple((c, "backward", b * BACKWARD_FACTOR)
                               for c, _, b in fwd.traffic),
                 matmul_dtype=fwd.matmul_dtype)


def head_forward_flops(model: ModelSpec, *, micro_batch: int, seq_len: int,
                       act_bytes: int) -> Flops:
    """Forward work of the root: the output projection (the only matmul; embedding
    lookups do none) and the memory-bound kernels of `_root_forward_kernels`."""
    mem = _root_forward_kernels(model, micro_batch=micro_batch, seq_len=seq_len,
                                act_bytes=act_bytes)
    tokens = micro_batch * seq_len
    return Flops(matmul=2.0 * tokens * model.d_model * model.vocab_size,
                 attention=0.0, memory_bytes=_traffic(mem), kernels=float(len(mem) + 1),
                 gemms=((tokens, model.d_model, model.vocab_size, 1.0),),
                 traffic=_by_class(mem, "forward"))


def head_backward_flops(model: ModelSpec, *, micro_batch: int, seq_len: int,
                        act_bytes: int) -> tuple[Flops, Flops]:
    """Backward work of the root in the two parts autograd runs one after the other: the
    loss's (twice the traffic of `_loss_kernels`, down to the logits' gradient), then
    the rest (the output projection's input and weight gradients by shape, the final
    norm's and the embeddings' kernels). Together twice the root's forward."""
    kw = dict(micro_batch=micro_batch, seq_len=seq_len, act_bytes=act_bytes)
    loss = _loss_kernels(model, **kw)
    fwd = head_forward_flops(model, **kw)
    rest = _root_kernels(model, **kw)
    loss_fwd = Flops(matmul=0.0, attention=0.0, memory_bytes=_traffic(loss),
                     kernels=float(len(loss)), traffic=_by_class(loss, "forward"))
    rest_fwd = Flops(matmul=fwd.matmul, attention=0.0, memory_bytes=_traffic(rest),
                     kernels=float(len(rest) + 1), gemms=fwd.gemms,
                     traffic=_by_class(rest, "forward"))
    return _backward_of(loss_fwd), _backward_of(rest_fwd)


MTA_CHUNK_ELEMS = 65536
"""Elements a block of CUDA's multi_tensor_apply works on (kChunkSize,
aten/src/ATen/native/cuda/MultiTensorApply.cuh)."""
MTA_MAX_BLOCKS = 320
"""Chunks one multi_tensor_apply launch takes at most (depth_to_max_blocks)."""
MTA_MAX_TENSORS = {1: 110, 2: 64, 3: 48, 4: 36, 5: 30}
"""Tensors of each list one launch takes at most, by the op's number of tensor lists
(depth_to_max_tensors)."""

ADAMW_FOREACH_DEPTHS = (1, 2, 1, 3, 2, 1, 1, 3)
"""The CUDA foreach ops of torch.optim.adam._multi_tensor_adam (the step counts stay on
the host) by their lists of tensors: mul_(params) for weight decay, lerp_(m, g),
mul_(v), addcmul_(v, g, g), sqrt(v) into a new list, div_ and add_ on it, addcdiv_(p, m,
denom)."""


def foreach_launches(elems: float, tensors: int, depth: int, how: str) -> int:
    """Kernels one foreach op over `tensors` tensors of `elems` elements in all launches:
    one per tensor ("per_tensor"), or ("multi_tensor_apply") as many launches as its
    chunks (each tensor's last one partly filled: half a chunk per tensor on average)
    fill MTA_MAX_BLOCKS at a time, or as its tensors fill MTA_MAX_TENSORS[depth] at a
    time, whichever is more. Measured on an H200 (reports/validation/h200/phases): the
    AdamW step of 1.3B/8, 7B/8 and 13B/128 launched 72, 328 and 52 kernels, as
    ADAMW_FOREACH_DEPTHS gives."""
    if how == "per_tensor":
        return tensors
    chunks = math.ceil(elems / MTA_CHUNK_ELEMS + tensors / 2)
    return max(math.ceil(chunks / MTA_MAX_BLOCKS), math.ceil(tensors / MTA_MAX_TENSORS[depth]))


def optimizer_flops(local_params: float, *, optimizer: str, tensors: int, master_bytes: int,
                    state_bytes_per_param: float, grad_bytes: int,
                    param_copy_bytes: int, foreach: str = "per_tensor",
                    fused: bool = False) -> Flops:
    """Optimizer step on `local_params` parameters held in `tensors` tensors: memory
    traffic and kernels (no matmul FLOPs).

    AdamW (foreach), from the ops of torch.optim.adam._multi_tensor_adam, per parameter:
    weight decay p *= 1 - lr*wd (read + write p); lerp_(m, g) (read m, g, write m);
    v *= beta2 (read + write v); addcmul_(v, g, g) (read v, g, write v);
    denom = sqrt(v) (read v, write denom); denom /= bc2 and denom += eps (read + write
    denom, twice); addcdiv_(p, m, denom) (read p, m, denom, write p). That is 4 accesses of
    the master weight, 14 of state-dtype tensors (m, v, denom), 2 of the gradient: 80 B per
    parameter when all are fp32. Kernels (`foreach`, the device's
    HardwareProfile.foreach_kernels): per tensor, the 8 foreach ops plus the step-count
    increment (the CPU dispatches foreach ops tensor by tensor); with CUDA's
    multi_tensor_apply, the launches of the 8 ops (foreach_launches; the step counts are
    host tensors).
    AdamW `fused`, as DeepSpeed's FusedAdam runs it (deepspeed/ops/adam/fused_adam.py: the
    AdamW a DeepSpeed config names, unless offloaded or torch_adam): one pass that reads
    the gradient, the master weight and both moments and writes the master weight and the
    moments, 28 B per parameter when all are fp32 (multi_tensor_adam.cu's AdamFunctor on
    CUDA, the launches of one depth-4 multi_tensor_apply; on CPU ds_adam_step per tensor,
    csrc/cpu/adam/fused_adam.cpp).
    Other optimizers (sgd, adamw8bit): one pass that reads and writes the master weight
    and the states and reads the gradient, three kernels per tensor.
    A compute-dtype copy written after the step (`param_copy_bytes` > 0) adds a cast
    that reads the master and writes the copy (a two-list foreach copy).
    """
    if optimizer == "adamw" and fused:
        per_param = 2 * master_bytes + 2 * state_bytes_per_param + grad_bytes
        kernels = foreach_launches(local_params, tensors, 4, foreach)
    elif optimizer == "adamw" and foreach == "multi_tensor_apply":
        per_param = 4 * master_bytes + 14 * state_bytes_per_param / 2 + 2 * grad_bytes
        kernels = sum(foreach_launches(local_params, tensors, d, foreach)
                      for d in ADAMW_FOREACH_DEPTHS)
    elif optimizer == "adamw":
        per_param = 4 * master_bytes + 14 * state_bytes_per_param / 2 + 2 * grad_bytes
        kernels = 9 * tensors
    else:
        per_param = 2 * master_bytes + 2 * state_bytes_per_param + grad_bytes
        kernels = 3 * tensors
    if param_copy_bytes:
        per_param += master_bytes + param_copy_bytes
        kernels += foreach_launches(local_params, tensors, 2, foreach)
    return Flops(matmul=0.0, attention=0.0, memory_bytes=local_params * per_param,
                 kernels=float(kernels),
                 traffic=(("optimizer", "forward", local_params * per_param),))


def compute_time_s(flops: Flops, hw: HardwareProfile, dtype: str) -> float:
    """Time of `flops` on one device, seconds: matmul and attention FLOPs at the profile's
    achievable rates, memory-bound bytes at its achievable memory bandwidth, plus the
    fixed cost of each kernel. The terms add (kernels of one stream run one after
    another). A profile with measured kernel rates (hw.kernels) times each matmul,
    attention call and class of memory traffic at its measured rate instead; work without
    a shape (or a dtype the rates lack) keeps the flat efficiencies. Matmuls run at
    `flops.matmul_dtype` where it is set (fp8), everything else at `dtype`.

    Raises:
        ConfigError: the profile has no peak for the dtype (zsim.spec.hardware).
    """
    peak = hw.peak(dtype)
    mm_dtype = flops.matmul_dtype or dtype
    flat_matmul = hw.peak(mm_dtype) * hw.matmul_efficiency
    flat_attention = peak * hw.attention_efficiency
    flat_memory = hw.hbm_bandwidth_bytes_per_s * hw.memory_bound_efficiency
    rates = hw.kernels
    if rates is None:
        return (flops.matmul / flat_matmul + flops.attention / flat_attention
                + flops.memory_bytes / flat_memory + flops.kernels * hw.kernel_overhead_s)
    seconds, matmul, attention, memory = 0.0, flops.matmul, flops.attention, flops.memory_bytes
    for m, k, n, count in flops.gemms:
        rate = rates.matmul_flop_per_s(m, k, n, _matmul_dtype(mm_dtype))
        if rate is not None:
            work = 2.0 * m * k * n * count
            seconds += work / rate
            matmul -= work
    for seq, head_dim, phase, work in flops.attention_calls:
        rate = rates.attention_flop_per_s(seq, head_dim, phase, _matmul_dtype(dtype))
        if rate is not None:
            seconds += work / rate
            attention -= work * (1.0 if phase == "forward" else BACKWARD_FACTOR)
    for cls, phase, nbytes in flops.traffic:
        by_pass = rates.memory_rates(cls)
        if by_pass is not None:
            seconds += nbytes / by_pass[phase]
            memory -= nbytes
    return (seconds + max(matmul, 0.0) / flat_matmul + max(attention, 0.0) / flat_attention
            + max(memory, 0.0) / flat_memory + flops.kernels * hw.kernel_overhead_s)


def with_float8_linears(work: Flops, forward: Flops, *, phase: str) -> Flops:
    """`work` (a block's forward, backward or recomputed forward, whose forward matmul
    shapes are `forward.gemms`) with its linear layers as torchao's Float8Linear runs
    them (tensorwise dynamic scaling, the default Float8LinearConfig): the matmuls in fp8
    (torch._scaled_mm, bf16 output), plus the casts they need, each an amax reduction
    (read the bf16 tensor) and a scaled cast (read it, write 1 byte per element): 5 bytes
    per element cast. Forward (m x k) @ (k x n): the input and the weight, 5 (mk + kn).
    Backward: the output gradient, and the input and weight cast again from the bf16
    copies autograd saved (Float8Linear saves the high-precision tensors), each used
    transposed for one of the two matmuls (a 1-byte read + write): 7 mn + 7 mk + 5 kn.
    Kernels: 2 per cast (+1 per transpose)."""
    casts = kernels = 0.0
    for m, k, n, count in forward.gemms:
        if phase == "forward":
            casts += count * 5.0 * (m * k + k * n)
            kernels += count * 4
        else:
            casts += count * (7.0 * m * n + 7.0 * m * k + 5.0 * k * n)
            kernels += count * 8
    return replace(work, matmul_dtype="fp8", memory_bytes=work.memory_bytes + casts,
                   kernels=work.kernels + kernels,
                   traffic=(*work.traffic, ("elementwise", phase, casts)))


def _matmul_dtype(dtype: str) -> str:
    """The table of rates a compute dtype runs on: fp16 runs at bf16's rates (same tensor
    cores and peak)."""
    return "bf16" if dtype == "fp16" else dtype


def step_flops(model: ModelSpec, *, micro_batch: int, seq_len: int, grad_accum: int,
               recompute: str) -> tuple[float, float]:
    """(model FLOPs, hardware FLOPs) per rank per optimizer step. Hardware FLOPs add the
    recomputed forward (see recompute_forward_flops). FLOPs do not depend on the
    activation dtype; 2 bytes are passed for the (unused) traffic counts."""
    kw = dict(micro_batch=micro_batch, seq_len=seq_len, act_bytes=2)
    fwd = block_forward_flops(model, **kw)
    bwd = block_backward_flops(model, **kw)
    head = head_forward_flops(model, **kw)
    model_flops = model.num_layers * (fwd + bwd).total + 3 * head.total
    extra = recompute_forward_flops(model, recompute=recompute, **kw).total
    hw_flops = model_flops + model.num_layers * extra
    return model_flops * grad_accum, hw_flops * grad_accum


def recompute_forward_flops(model: ModelSpec, *, micro_batch: int, seq_len: int,
                            recompute: str, act_bytes: int) -> Flops:
    """Work re-run inside one block's backward: the whole forward for "full"; for
    "selective" (torchtitan op SAC) the matmuls whose outputs are not saved, every second
    one in call order (wk, wo, w3 for SwiGLU), and every memory-bound kernel (only matmul
    and attention outputs are on the save list); attention outputs are saved."""
    if recompute == "none":
        return Flops(matmul=0.0, attention=0.0)
    kw = dict(micro_batch=micro_batch, seq_len=seq_len, act_bytes=act_bytes)
    fwd = block_forward_flops(model, **kw)
    if recompute == "full":
        return fwd
    recomputed = model.block_matmuls()[1::2]
    mem = _block_forward_kernels(model, **kw)
    tokens = micro_batch * seq_len
    return Flops(matmul=2.0 * tokens * sum(k * n for _, k, n in recomputed),
                 attention=0.0, memory_bytes=_traffic(mem),
                 kernels=float(len(mem) + len(recomputed)),
                 gemms=tuple((tokens, k, n, 1.0) for _, k, n in recomputed),
                 traffic=_by_class(mem, "forward"))
