"""The kernel measurements of the GPU fit (the hgx-h200 profile's kernel rates) that
tests/data/cases/h200-microbench.yaml lacks: matmul rates over small and skinny shapes in
bf16, TF32 and strict fp32, causal attention over sequence and head dimension, the block's
memory-bound kernels, the optimizer's foreach kernels and host AdamW by thread count, and
small pinned/pageable PCIe copies. The GPU validation report runs them
(zsim.validation.gpu_report) into kernels.csv.

Owns what each item measures and at which shapes (FULL on an H200, QUICK on CPU), each
call timed by zsim.calibration.timing.time_call (device time from CUDA events, host time
to queue). Bytes and FLOPs follow zsim.analytic.compute's conventions (what each kernel
reads and writes; backward = 2x forward), so a rate divided by the profile's peak is
directly its efficiency. An item that fails or finds the time budget spent gives a row
saying so and the rest run. Imports torch.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F

from zsim.backend.runner import Deadline
from zsim.calibration.timing import Timing, time_call
from zsim.spec.model import ModelSpec

KERNEL_FIELDS = ("kind", "dtype", "shape", "flops", "bytes", "device_s", "host_s",
                 "tflops", "gbps", "note")
"""Columns of kernels.csv: the rate is flops (or bytes) over device_s."""

def kernel_row(kind: str, dtype: str, shape: str, timing: Timing, *, flops: float = 0.0,
               nbytes: float = 0.0, note: str = "") -> dict[str, Any]:
    """One kernels.csv row (rates from device time)."""
    return {"kind": kind, "dtype": dtype, "shape": shape, "flops": flops, "bytes": nbytes,
            "device_s": timing.device_s, "host_s": timing.host_s,
            "tflops": flops / timing.device_s / 1e12 if flops else "",
            "gbps": nbytes / timing.device_s / 1e9 if nbytes else "", "note": note}


@contextmanager
def matmul_precision(dtype: str) -> Iterator[None]:
    """TF32 matmuls for "tf32", strict fp32 otherwise; restored on exit."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = dtype == "tf32"
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


_DTYPES = {"bf16": torch.bfloat16, "tf32": torch.float32, "fp32": torch.float32}


def _reps(seconds_guess: float, device: str) -> int:
    """Calls per timing: about 5 ms of device work, between 3 and 50."""
    if not device.startswith("cuda"):
        return 3
    return max(3, min(50, math.ceil(5e-3 / max(seconds_guess, 1e-7))))


@dataclass(frozen=True, slots=True)
class Sizes:
    """The shapes the kernel items run at (full on an H200, quick on CPU)."""

    matmul_m: tuple[int, ...]
    """Token counts (rows) of the matmul grid."""
    matmul_kn: tuple[tuple[int, int], ...]
    """(k, n) weight shapes of the grid (the 1.3B, 7B and 0.4B blocks and heads)."""
    matmul_wgrad: tuple[tuple[int, int, int], ...]
    """(m, k, n) weight-gradient shapes: the token count is the reduction dimension."""
    tf32_m: tuple[int, ...]
    fp32_shapes: tuple[tuple[int, int, int], ...]
    tokens: int
    """Tokens of the memory-bound kernels (micro-batch x sequence)."""
    widths: tuple[tuple[int, int, int, int], ...]
    """(d_model, ffn_hidden, heads, head_dim) of the memory-bound kernels."""
    vocabs: tuple[int, ...]
    attention: tuple[tuple[int, int, int, int, int], ...]
    """(batch, heads, kv_heads, seq, head_dim) of the attention grid."""
    adam_model: ModelSpec
    adam_worlds: tuple[int, ...]
    host_adam_params: int
    host_adam_threads: tuple[int, ...]
    copy_bytes: tuple[int, ...]


def _attention_grid(tokens: int, width: int, seqs: tuple[int, ...],
                    head_dims: tuple[int, ...]) -> tuple[tuple[int, int, int, int, int], ...]:
    out = [(tokens // s, width // d, width // d, s, d) for s in seqs for d in head_dims]
    s, d = seqs[len(seqs) // 2], head_dims[-1]
    out.append((tokens // s, width // d, width // d // 4, s, d))  # GQA, 4 heads per kv head
    return tuple(out)


P1B3 = ModelSpec(name="1p3b", num_layers=24, d_model=2048, num_heads=16, num_kv_heads=16,
                 ffn_hidden=5632, vocab_size=32000, max_seq_len=2048)
"""The 1.3B Llama of tests/data/cases/h200-fsdp2-runs.yaml."""

FULL = Sizes(
    matmul_m=(16, 64, 256, 1024, 4096),
    matmul_kn=((1024, 1024), (1024, 2816), (2816, 1024), (2048, 2048), (2048, 5632),
               (5632, 2048), (4096, 4096), (4096, 11008), (11008, 4096), (2048, 32000),
               (1024, 128256)),
    matmul_wgrad=((2048, 8192, 2048), (2048, 8192, 5632), (5632, 8192, 2048),
                  (4096, 4096, 11008), (1024, 4096, 2816), (2048, 8192, 32000)),
    tf32_m=(256, 1024, 4096),
    fp32_shapes=((8192, 2048, 2048), (8192, 2048, 5632), (2048, 4096, 4096)),
    tokens=8192, widths=((2048, 5632, 16, 128), (4096, 11008, 32, 128)),
    vocabs=(32000, 128256),
    attention=_attention_grid(8192, 2048, (512, 1024, 2048, 4096, 8192), (64, 128)),
    adam_model=P1B3, adam_worlds=(1, 8, 64, 512), host_adam_params=16 * 2**20,
    host_adam_threads=(1, 2, 4, 8, 16), copy_bytes=(2**16, 2**20, 2**24, 2**28))

QUICK = Sizes(
    matmul_m=(16, 128), matmul_kn=((64, 176), (176, 64)), matmul_wgrad=((64, 256, 176),),
    tf32_m=(128,), fp32_shapes=((128, 64, 64),), tokens=256, widths=((64, 176, 4, 16),),
    vocabs=(512,), attention=_attention_grid(256, 64, (64, 128), (16,)),
    adam_model=ModelSpec(name="tiny", num_layers=2, d_model=64, num_heads=4, num_kv_heads=2,
                         ffn_hidden=176, vocab_size=512, max_seq_len=64),
    adam_worlds=(1, 8), host_adam_params=2**18, host_adam_threads=(1, 2),
    copy_bytes=(2**16,))


Item = tuple[str, Callable[[], list[dict[str, Any]]]]
"""A named unit of work returning kernels.csv rows."""


def kernel_items(sizes: Sizes, device: str) -> list[Item]:
    """Every kernel measurement, in the order they run (most wanted first)."""
    items: list[Item] = []
    for m in sizes.matmul_m:
        for k, n in sizes.matmul_kn:
            items.append((f"matmul bf16 {m}x{k}x{n}", partial(_matmul, m, k, n, "bf16", device)))
    for m, k, n in sizes.matmul_wgrad:
        items.append((f"matmul bf16 {m}x{k}x{n}", partial(_matmul, m, k, n, "bf16", device)))
    for m in sizes.tf32_m:
        for k, n in sizes.matmul_kn:
            items.append((f"matmul tf32 {m}x{k}x{n}", partial(_matmul, m, k, n, "tf32", device)))
    for m, k, n in sizes.fp32_shapes:
        items.append((f"matmul fp32 {m}x{k}x{n}", partial(_matmul, m, k, n, "fp32", device)))
    t = sizes.tokens
    for d, f, h, hd in sizes.widths:
        items += [(f"memory-bound kernels d={d}", partial(_memory_bound, t, d, f, h, hd, device))]
    for v in sizes.vocabs:
        items.append((f"cross-entropy vocab={v}", partial(_cross_entropy, t, v, device)))
    for shape in sizes.attention:
        items.append((f"sdpa {shape}", partial(_attention, shape, device)))
    for n in sizes.adam_worlds:
        items.append((f"adamw foreach 1/{n} of {sizes.adam_model.name}",
                      partial(_adam_shards, sizes.adam_model, n, device)))
    items.append(("host adamw by threads",
                  partial(_host_adam, sizes.host_adam_params, sizes.host_adam_threads)))
    if device.startswith("cuda"):
        items.append(("h2d/d2h copies", partial(_copies, sizes.copy_bytes)))
    return items


def _matmul(m: int, k: int, n: int, dtype: str, device: str) -> list[dict[str, Any]]:
    a = torch.randn(m, k, dtype=_DTYPES[dtype], device=device)
    b = torch.randn(k, n, dtype=_DTYPES[dtype], device=device)
    flops = 2.0 * m * k * n
    with matmul_precision(dtype):
        timing = time_call(lambda: a @ b, device, reps=_reps(flops / 4e14, device))
    return [kernel_row("matmul", dtype, f"m={m} k={k} n={n}", timing, flops=flops,
                       note="tf32: fp32 storage, TF32 tensor cores" if dtype == "tf32" else "")]


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE as zsim.backend.reference_model runs it."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


def _fwd_bwd(fn: Callable[..., torch.Tensor], *inputs: torch.Tensor) -> Callable[[], None]:
    """A call of fn's forward and backward (gradients of every input that requires one)."""
    def call() -> None:
        out = fn(*inputs)
        out.backward(torch.ones_like(out))
        for x in inputs:
            x.grad = None

    return call


def _memory_bound(t: int, d: int, f: int, heads: int, head_dim: int,
                  device: str) -> list[dict[str, Any]]:
    """The block's memory-bound kernels in bf16, forward and forward + backward, with the
    bytes zsim.analytic.compute counts for them (forward + backward: 3x forward)."""
    bf = torch.bfloat16
    a = 2
    x, y = (torch.randn(t, d, dtype=bf, device=device, requires_grad=True) for _ in range(2))
    weight = torch.ones(d, dtype=bf, device=device, requires_grad=True)
    g1, g3 = (torch.randn(t, f, dtype=bf, device=device, requires_grad=True) for _ in range(2))
    q = torch.randn(t // 2048 or 1, heads, min(t, 2048), head_dim, dtype=bf, device=device,
                    requires_grad=True)
    cos, sin = (torch.randn(q.shape[-2], head_dim, dtype=bf, device=device) for _ in range(2))
    x32 = torch.randn(t, d, device=device)

    def norm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (d,), w, 1e-5)

    def swiglu(g1: torch.Tensor, g3: torch.Tensor) -> torch.Tensor:
        return F.silu(g1) * g3

    def rope(q: torch.Tensor) -> torch.Tensor:
        return _rope(q, cos, sin)

    cases: list[tuple[str, str, Callable[..., torch.Tensor], tuple[torch.Tensor, ...], float]] = [
        ("residual_add", f"t={t} d={d}", torch.add, (x, y), 3.0 * t * d * a),
        ("rmsnorm", f"t={t} d={d}", norm, (x, weight), 2.0 * t * d * a),
        ("swiglu", f"t={t} f={f}", swiglu, (g1, g3), 5.0 * t * f * a),
        ("rope", f"q={tuple(q.shape)}", rope, (q,), 10.0 * q.numel() * a),
    ]
    rows = []
    for kind, shape, fn, inputs, nbytes in cases:
        with torch.no_grad():
            fwd = time_call(lambda fn=fn, inputs=inputs: fn(*inputs), device,
                            reps=_reps(nbytes / 4e12, device))
        rows.append(kernel_row(kind, "bf16", shape, fwd, nbytes=nbytes, note="forward"))
        both = time_call(_fwd_bwd(fn, *inputs), device, reps=_reps(3 * nbytes / 4e12, device))
        rows.append(kernel_row(kind, "bf16", shape, both, nbytes=3 * nbytes,
                               note="forward + backward (bytes: 3x forward)"))
    cast = time_call(lambda: x32.to(bf), device, reps=_reps(6.0 * t * d / 4e12, device))
    rows.append(kernel_row("cast_fp32_bf16", "fp32", f"t={t} d={d}", cast, nbytes=6.0 * t * d,
                           note="FSDP2's parameter cast before the all-gather"))
    return rows


def _cross_entropy(t: int, vocab: int, device: str) -> list[dict[str, Any]]:
    """The loss as the reference model computes it: cross_entropy(logits.float()); bytes
    of zsim.analytic.compute (logits.float, log_softmax, nll_loss)."""
    logits = torch.randn(t, vocab, dtype=torch.bfloat16, device=device, requires_grad=True)
    labels = torch.randint(0, vocab, (t,), device=device)

    def loss(z: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(z.float(), labels)

    nbytes = t * vocab * (2 + 4) + 2.0 * t * vocab * 4 + 4.0 * t + 4
    shape = f"t={t} vocab={vocab}"
    with torch.no_grad():
        fwd = time_call(lambda: loss(logits), device, reps=_reps(nbytes / 4e12, device))
    both = time_call(_fwd_bwd(loss, logits), device, reps=_reps(3 * nbytes / 4e12, device))
    return [kernel_row("cross_entropy", "bf16", shape, fwd, nbytes=nbytes, note="forward"),
            kernel_row("cross_entropy", "bf16", shape, both, nbytes=3 * nbytes,
                       note="forward + backward (bytes: 3x forward)")]


def _attention(shape: tuple[int, int, int, int, int], device: str) -> list[dict[str, Any]]:
    """Causal SDPA in bf16; FLOPs as zsim.analytic.compute counts them (forward
    4*b*h*s^2*d/2, forward + backward 3x that)."""
    b, h, kv, s, d = shape
    q = torch.randn(b, h, s, d, dtype=torch.bfloat16, device=device, requires_grad=True)
    k, v = (torch.randn(b, kv, s, d, dtype=torch.bfloat16, device=device, requires_grad=True)
            for _ in range(2))

    def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=kv != h)

    flops = 4.0 * b * h * s * s * d / 2
    text = f"b={b} h={h} kv={kv} s={s} d={d}"
    with torch.no_grad():
        fwd = time_call(lambda: sdpa(q, k, v), device, reps=_reps(flops / 4e14, device))
    both = time_call(_fwd_bwd(sdpa, q, k, v), device, reps=_reps(3 * flops / 4e14, device))
    return [kernel_row("sdpa_causal", "bf16", text, fwd, flops=flops, note="forward"),
            kernel_row("sdpa_causal", "bf16", text, both, flops=3 * flops,
                       note="forward + backward (FLOPs: 3x forward)")]


def _adam_shards(spec: ModelSpec, world: int, device: str) -> list[dict[str, Any]]:
    """AdamW on rank 0's FSDP2 shards of `spec` at world size `world` (one fp32 tensor per
    parameter, ceil(dim0 / world) rows), foreach and fused; and foreach on the same
    elements as one flat tensor (the per-tensor cost is the difference). Bytes: 80 per
    parameter (zsim.analytic.compute.optimizer_flops, fp32 grads)."""
    shapes = [(math.ceil(s[0] / world), *s[1:]) for _, s in spec.parameter_tensors()]
    numel = sum(math.prod(s) for s in shapes)
    rows = []
    for how in ("foreach", "fused", "flat"):
        params = ([torch.nn.Parameter(torch.randn(numel, device=device))] if how == "flat"
                  else [torch.nn.Parameter(torch.randn(s, device=device)) for s in shapes])
        for p in params:
            p.grad = torch.randn_like(p)
        opt = torch.optim.AdamW(params, lr=1e-4, **({"fused": True} if how == "fused"
                                                      else {"foreach": True}))
        timing = time_call(opt.step, device, reps=3, warmup=1)
        rows.append(kernel_row(f"adamw_{how}", "fp32",
                               f"{spec.name}/{world}: {numel} params in {len(params)} tensors",
                               timing, nbytes=80.0 * numel))
        del opt, params
    return rows


def _host_adam(numel: int, threads: tuple[int, ...]) -> list[dict[str, Any]]:
    """torch.optim.AdamW(foreach) on the host CPU with 1..N threads (what a rank's cores
    give FSDP2's CPUOffloadPolicy step), one fp32 tensor."""
    saved = torch.get_num_threads()
    p = torch.nn.Parameter(torch.randn(numel))
    p.grad = torch.randn_like(p)
    opt = torch.optim.AdamW([p], lr=1e-4, foreach=True)
    rows = []
    try:
        for n in threads:
            if n > (os.cpu_count() or 1):
                continue
            torch.set_num_threads(n)
            timing = time_call(opt.step, "cpu", reps=2, warmup=1)
            rows.append(kernel_row("cpu_adamw", "fp32", f"params={numel} threads={n}", timing,
                                   nbytes=80.0 * numel,
                                   note=f"{numel / timing.device_s:.4g} params/s"))
    finally:
        torch.set_num_threads(saved)
    return rows


def _copies(sizes: tuple[int, ...]) -> list[dict[str, Any]]:
    """Host <-> device copies of `sizes` bytes, pinned (non_blocking) and pageable."""
    rows = []
    for nbytes in sizes:
        dev = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
        for pinned in (True, False):
            host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=pinned)
            reps = max(3, min(50, 2**26 // nbytes))
            h2d = time_call(lambda h=host, d=dev, p=pinned: d.copy_(h, non_blocking=p), "cuda",
                            reps=reps, queue=pinned)
            d2h = time_call(lambda h=host, d=dev, p=pinned: h.copy_(d, non_blocking=p), "cuda",
                            reps=reps, queue=pinned)
            note = "pinned" if pinned else "pageable"
            rows += [kernel_row("h2d", "uint8", f"bytes={nbytes}", h2d, nbytes=nbytes, note=note),
                     kernel_row("d2h", "uint8", f"bytes={nbytes}", d2h, nbytes=nbytes, note=note)]
    return rows


def run_items(items: list[Item], deadline: Deadline, *, need_s: float,
              log: Callable[[str], None]) -> list[dict[str, Any]]:
    """Run items until the deadline, one failure never stopping the rest: an item that
    raises gives an "error" row, one with less than `need_s` left a "skipped" row."""
    rows: list[dict[str, Any]] = []
    for name, fn in items:
        if not deadline.allows(need_s):
            rows.append(_status_row(name, "skipped: time budget spent"))
            continue
        start = time.time()
        try:
            rows += fn()
            log(f"kernels: {name} ({time.time() - start:.1f} s)")
        except Exception as e:  # one failed measurement must not end the run
            rows.append(_status_row(name, f"error: {type(e).__name__}: {e}"))
            log(f"kernels: {name} FAILED: {type(e).__name__}: {e}")
        finally:
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
    return rows


def _status_row(name: str, note: str) -> dict[str, Any]:
    return {**dict.fromkeys(KERNEL_FIELDS, ""), "kind": name, "note": note}
