"""Measurements for the GPU fit of issue 11 that shared/cases/h200-microbench.yaml lacks:
the host side of eager training steps, matmul rates over small and skinny shapes in
bf16, TF32 and strict fp32, causal attention over sequence and head dimension, the
block's memory-bound kernels, the optimizer's foreach kernels and host AdamW by thread
count, and small pinned/pageable PCIe copies. zsim.validation.gpu_report runs them.

Owns how each figure is timed. A kernel's device time comes from CUDA events around
`reps` back-to-back calls queued behind a torch.cuda._sleep, so the host has queued them
all before the GPU starts and the figure excludes launch gaps; the host time per call is
the wall time the queueing took. On CPU both are the wall time per call. Bytes and FLOPs
follow zsim.analytic.compute's conventions (what each kernel reads and writes; backward =
2x forward), so a rate divided by the profile's peak is directly its efficiency.

The host sweep (`host_rank`) runs on the fake process group as rank 0 of N: nano models
(width 64, 16 tokens: their kernels cost microseconds) at several depths under each
program, timing the Python issue of a step without synchronising, the synchronised step,
its phases, and one profiled step for the ATen ops, kernel launches and device-busy time.
The slope over depth is the host cost per block; units of 1 and 4 blocks separate the
per-unit from the per-parameter cost of FSDP2's hooks. Imports torch.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

from zsim.backend import programs, training
from zsim.backend.reference_model import Transformer
from zsim.backend.runner import RankContext, sync_device
from zsim.spec.model import ModelSpec
from zsim.spec.plan import Plan

SLEEP_CYCLES = 20_000_000
"""GPU clock cycles of the torch.cuda._sleep queued before each timed batch of calls
(about 10 ms on an H200 at 1.98 GHz): longer than the host needs to queue the calls."""

KERNEL_FIELDS = ("kind", "dtype", "shape", "flops", "bytes", "device_s", "host_s",
                 "tflops", "gbps", "note")
"""Columns of kernels.csv: the rate is flops (or bytes) over device_s."""

HOST_FIELDS = ("config", "layers", "unit_size", "param_tensors", "steps", "host_issue_s",
               "step_s", "forward_s", "backward_s", "optimizer_s", "aten_ops", "launches",
               "kernels", "device_busy_s", "note")
"""Columns of host.csv, one row per (config, depth); times are medians per step."""


@dataclass(frozen=True, slots=True)
class Deadline:
    """A wall-clock limit (time.time() seconds, comparable across processes)."""

    at: float

    def left_s(self) -> float:
        """Seconds until the limit."""
        return self.at - time.time()

    def allows(self, need_s: float) -> bool:
        """Whether `need_s` more seconds fit before the limit."""
        return self.left_s() >= need_s


@dataclass(frozen=True, slots=True)
class Timing:
    """Per-call seconds of a timed function."""

    device_s: float
    host_s: float


def time_call(fn: Callable[[], Any], device: str, *, reps: int, warmup: int = 2,
              queue: bool = True) -> Timing:
    """Time `fn` (see the module docstring): device seconds per call from CUDA events
    around `reps` calls queued behind a sleep kernel (without `queue`, for calls that
    block the host, no sleep), host seconds per call to queue them; on CPU both are wall
    seconds per call."""
    for _ in range(warmup):
        fn()
    if not device.startswith("cuda"):
        start = time.perf_counter()
        for _ in range(reps):
            fn()
        per_call = (time.perf_counter() - start) / reps
        return Timing(device_s=per_call, host_s=per_call)
    torch.cuda.synchronize()
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    if queue:
        torch.cuda._sleep(SLEEP_CYCLES)
    host0 = time.perf_counter()
    begin.record()
    for _ in range(reps):
        fn()
    end.record()
    host_s = (time.perf_counter() - host0) / reps
    torch.cuda.synchronize()
    return Timing(device_s=begin.elapsed_time(end) * 1e-3 / reps, host_s=host_s)


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
_BYTES = {"bf16": 2, "tf32": 4, "fp32": 4}


def _reps(seconds_guess: float, device: str) -> int:
    """Calls per timing: about 5 ms of device work, between 3 and 50."""
    if not device.startswith("cuda"):
        return 3
    return max(3, min(50, math.ceil(5e-3 / max(seconds_guess, 1e-7))))


# ---------------------------------------------------------------------- kernel items
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
"""The 1.3B Llama of shared/cases/h200-fsdp2-runs.yaml."""

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


# ------------------------------------------------------------------------ host sweep
NANO_SEQ = 16
"""Tokens per step of the host sweep's nano models (micro-batch 1)."""

HOST_CONFIGS: tuple[str, ...] = ("plain", "fsdp", "fsdp_unit4", "fsdp_no_reshard",
                                 "fsdp_ac_full", "fsdp_ac_selective", "fsdp_offload")
"""Programs of the host sweep: "plain" is the unsharded bf16 model with AdamW(foreach);
the rest FSDP2 as the backend applies it (zsim.backend.fsdp2): per block, per 4
blocks, without resharding, with full or selective recomputation, with CPUOffloadPolicy.
(DDP cannot run on the fake process group: its communication hook gets no tensor back.)"""

QUICK_HOST_CONFIGS: tuple[str, ...] = ("plain", "fsdp", "fsdp_unit4")


def nano(num_layers: int) -> ModelSpec:
    """A reference Llama whose kernels cost almost nothing: width 64, 4 heads."""
    return ModelSpec(name=f"nano{num_layers}", num_layers=num_layers, d_model=64,
                     num_heads=4, num_kv_heads=4, ffn_hidden=128, vocab_size=256,
                     max_seq_len=NANO_SEQ)


@dataclass(frozen=True, slots=True, kw_only=True)
class HostJob:
    """What host_rank runs."""

    depths: tuple[int, ...]
    configs: tuple[str, ...]
    timed: int
    warmup: int
    deadline: Deadline
    log_path: str
    """JSON lines, one per measured row, written as they complete."""


def host_plan(config: str, world_size: int) -> Plan:
    """The Plan a host-sweep config runs (plain: its dtypes only)."""
    base = Plan.for_strategy("ddp" if config == "ddp" else "fsdp", gpus=world_size,
                             seq_len=NANO_SEQ, micro_batch=1)
    changes: dict[str, Any] = {
        "fsdp_unit4": {"unit_size": 4}, "fsdp_no_reshard": {"strategy": "fsdp-no-reshard"},
        "fsdp_ac_full": {"recompute": "full"}, "fsdp_ac_selective": {"recompute": "selective"},
        "fsdp_offload": {"offload": "params"}}.get(config, {})
    return replace(base, **changes)


def host_rank(ctx: RankContext, job: HostJob) -> int:
    """Rank function (fake process group): every (config, depth) of the job, shallowest
    depth first for every config (so a budget that runs out leaves fewer depths, not
    fewer configs), each row appended to job.log_path as it completes. Returns the number
    of rows written."""
    written = 0
    for depth in job.depths:
        for config in job.configs:
            if not job.deadline.allows(5.0):
                row: dict[str, Any] = {"config": config, "layers": depth,
                                       "note": "skipped: time budget spent"}
            else:
                try:
                    row = _host_row(ctx, config, depth, job)
                except Exception as e:  # a failed config must not end the sweep
                    row = {"config": config, "layers": depth,
                           "note": f"error: {type(e).__name__}: {e} | "
                                   + traceback.format_exc(limit=-3).replace("\n", " ")}
            append_jsonl(job.log_path, row)
            written += 1
            print(f"host: {config} layers={depth}: {row.get('note') or 'ok'}", flush=True)
    return written


def append_jsonl(path: str, row: dict[str, Any]) -> None:
    """Append one JSON line (a crash later in the process keeps the rows before it)."""
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(row) + "\n")


def _host_row(ctx: RankContext, config: str, depth: int, job: HostJob) -> dict[str, Any]:
    spec = nano(depth)
    plan = host_plan(config, ctx.world_size)
    prep = _plain(spec, ctx.device) if config == "plain" else programs.prepare(
        spec, plan, device=ctx.device, world_size=ctx.world_size)
    micro = training.batches(spec, plan, device=ctx.device, rank=ctx.rank, step=0)
    for _ in range(job.warmup):
        timed_step(prep, micro, ctx.device, phases=False)
    issue = [timed_step(prep, micro, ctx.device, phases=False) for _ in range(job.timed)]
    phased = [timed_step(prep, micro, ctx.device, phases=True) for _ in range(job.timed)]
    try:
        counts: dict[str, Any] = {**profile_counts(prep, micro, ctx.device), "note": ""}
    except Exception as e:  # the timings stand without the op counts
        counts = {"note": f"profile failed: {type(e).__name__}: {e}"}
    row = {"config": config, "layers": depth, "unit_size": plan.unit_size,
           "param_tensors": len(spec.parameter_tensors()), "steps": job.timed,
           **{k: statistics.median(s[k] for s in issue) for k in ("host_issue_s", "step_s")},
           **{k: statistics.median(s[k] for s in phased)
              for k in ("forward_s", "backward_s", "optimizer_s")},
           **counts}
    del prep
    return row


def _plain(spec: ModelSpec, device: str) -> training.Prepared:
    """The unsharded bf16 model with AdamW(foreach): the host cost without any wrapper."""
    torch.manual_seed(0)
    with torch.device(device):
        inner = Transformer(spec)
    inner.init_weights()
    inner = inner.to(torch.bfloat16)
    opt = torch.optim.AdamW(inner.parameters(), lr=1e-4, foreach=True)

    def step() -> None:
        opt.step()
        opt.zero_grad(set_to_none=True)

    units: dict[str, torch.nn.Module] = {f"layers.{i}": b for i, b in enumerate(inner.layers)}
    units["root"] = inner
    return training.Prepared(model=inner, inner=inner, units=units,
                             backward=lambda loss, last: loss.backward(), step=step)


def _autocast(prep: training.Prepared, device: str) -> AbstractContextManager[Any]:
    if prep.autocast_dtype is None:
        return nullcontext()
    return torch.autocast(device.split(":")[0], dtype=prep.autocast_dtype)


def timed_step(prep: training.Prepared, micro: list[tuple[torch.Tensor, torch.Tensor]],
               device: str, *, phases: bool) -> dict[str, float]:
    """One training step, timed. Unlike zsim.backend.training.train_step it never reads
    the loss back, so without `phases` nothing waits for the device until the end:
    host_issue_s is how long Python took to queue the step, step_s when the device
    finished it. With `phases`, the device is synchronised after the forward, after the
    backward and after the optimizer step, giving forward_s, backward_s and optimizer_s
    (summed over micro-batches) and step_s."""
    sync_device(device)
    start = time.perf_counter()
    fwd = bwd = 0.0
    mark = start
    for i, (tokens, labels) in enumerate(micro):
        last = i == len(micro) - 1
        with prep.sync(last):
            with _autocast(prep, device):
                loss = prep.model(tokens, labels)
            if phases:
                sync_device(device)
                now = time.perf_counter()
                fwd, mark = fwd + now - mark, now
            prep.backward(loss, last)
            if phases:
                sync_device(device)
                now = time.perf_counter()
                bwd, mark = bwd + now - mark, now
    prep.step()
    issued = time.perf_counter()
    sync_device(device)
    end = time.perf_counter()
    if phases:
        return {"forward_s": fwd, "backward_s": bwd, "optimizer_s": end - mark,
                "step_s": end - start}
    return {"host_issue_s": issued - start, "step_s": end - start}


_LAUNCHES = ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernelEx")


def profile_counts(prep: training.Prepared, micro: list[tuple[torch.Tensor, torch.Tensor]],
                   device: str) -> dict[str, float]:
    """One step under torch.profiler: ATen ops called (nested ones included), kernel
    launches, device kernels and their summed duration (device-busy seconds)."""
    activities = [ProfilerActivity.CPU]
    if device.startswith("cuda"):
        activities.append(ProfilerActivity.CUDA)
    with profile(activities=activities) as prof:
        timed_step(prep, micro, device, phases=False)
    aten = launches = kernels = 0
    busy_us = 0.0
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            kernels += 1
            busy_us += event.time_range.elapsed_us()
        elif event.name.startswith("aten::"):
            aten += 1
        elif event.name in _LAUNCHES:
            launches += 1
    return {"aten_ops": aten, "launches": launches, "kernels": kernels,
            "device_busy_s": busy_us * 1e-6}


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The rows a child process appended (none if it wrote none)."""
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]
