"""The compute micro-benchmarks every rank runs at once: matmul (alone, as linear layers
forward + backward, and the validation grid's GEMMs from a cold cache), attention by pass,
memory copy and the block's memory-bound kernels, GELU by pass, and the optimizer steps on
the host (AdamW, DeepSpeedCPUAdam), and how they are shared when a CPU host has more ranks
than cores (core_share).

Owns how each kernel is timed: medians of calls timed on their own after warm-ups
(zsim.calibration.timing), cold where a step reads its operands from memory (a cache
flush before each call), FLOPs and bytes as zsim.analytic.compute counts them. Imports
torch.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from zsim.backend.reference_model import GELU_APPROXIMATE
from zsim.backend.runner import RankContext, sync_device
from zsim.calibration.bench_figures import BenchConfig, RankBench
from zsim.calibration.timing import median_call_s
from zsim.cores import usable_cores

KERNEL_RATES = ("matmul_flop_per_s", "linear_flop_per_s", "gemm_flop_per_s",
                "attention_flop_per_s", "attention_pass_flop_per_s", "copy_bytes_per_s",
                "elementwise_bytes_per_s", "gelu_bytes_per_s")
"""The RankBench figures that kernel_rates fills: rates of compute kernels, which a rank
runs on a core of its own or on a share of one."""


def core_share(world_size: int, cores: int) -> float:
    """The ranks that share each core when `world_size` CPU ranks, one thread each, run at
    once on `cores` cores (at least 1): a rank's kernels take this many times their time
    alone (as measured with 2 and 4 ranks on 2 cores: docs/log.md, 2026-12-03)."""
    return max(1.0, world_size / cores)


def host_core_share(world_size: int, cfg: BenchConfig) -> float:
    """core_share of `world_size` CPU ranks on cfg.cores (None: the CPUs this process may
    run on)."""
    return core_share(world_size, cfg.cores or usable_cores())


def kernel_rates(ctx: RankContext, cfg: BenchConfig, out: RankBench) -> None:
    """Time the compute kernels into `out` (KERNEL_RATES) as the ranks run them in a step.
    With no more ranks than cores (or on CUDA) every rank times its own at once. With more
    (core_share > 1), a call shorter than the scheduler's slice mostly runs on a core it
    holds, so the median of calls on every rank at once leaves out the time a rank waits
    for a core, which a step pays (short GEMMs timed at their unshared time while a
    step's forward took the share: docs/log.md, 2026-12-03). Then rank 0 times them
    alone, the others waiting off the cores, and every rank takes its rates divided by
    the share."""
    share = host_core_share(ctx.world_size, cfg) if ctx.device == "cpu" else 1.0
    if share == 1.0:
        _time_kernels(ctx, cfg, out)
        return
    alone = [RankBench()]
    if ctx.rank == 0:
        _time_kernels(ctx, cfg, alone[0])
    dist.broadcast_object_list(alone, src=0)
    for name in KERNEL_RATES:
        setattr(out, name, _divided(getattr(alone[0], name), share))
    out.core_share = share


def _divided(value: Any, by: float) -> Any:
    """`value` (a rate, or a list or dict of them) divided by `by`."""
    if isinstance(value, dict):
        return {k: _divided(v, by) for k, v in value.items()}
    if isinstance(value, list):
        return [_divided(v, by) for v in value]
    return value / by


def _time_kernels(ctx: RankContext, cfg: BenchConfig, out: RankBench) -> None:
    """Time every compute kernel of KERNEL_RATES on this rank into `out`."""
    for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        rates, linear = [], []
        for m, k, nn in cfg.matmul_shapes:
            a = torch.randn(m, k, dtype=dtype, device=ctx.device)
            b = torch.randn(k, nn, dtype=dtype, device=ctx.device)
            rates.append(2 * m * k * nn / median_call_s(lambda a=a, b=b: a @ b, 7))
            linear.append(6 * m * k * nn / _linear_s(a, b.t().contiguous()))
        out.matmul_flop_per_s[name] = rates
        out.linear_flop_per_s[name] = linear
        out.gemm_flop_per_s[name] = _cold_gemms(ctx, gemm_shapes(cfg), dtype,
                                                cfg.cache_flush_bytes)
    out.attention_flop_per_s, out.attention_pass_flop_per_s = _attention(
        ctx, cfg.attention_shape, cfg.cache_flush_bytes)
    out.copy_bytes_per_s = _copy_rate(ctx, cfg.copy_bytes)
    out.elementwise_bytes_per_s = _elementwise(ctx, cfg.elementwise_numels)
    out.gelu_bytes_per_s = _gelu(ctx, max(cfg.elementwise_numels))


def gemm_shapes(cfg: BenchConfig) -> tuple[tuple[int, int, int], ...]:
    """(m, k, n) of the three GEMMs of each of cfg.gemm_linears, as
    zsim.analytic.compute counts a linear layer's: the output (t, in, out), the input
    gradient (t, out, in) and the weight gradient (in, t, out); each shape once, sorted."""
    return tuple(sorted({g for t, i, o in cfg.gemm_linears
                         for g in ((t, i, o), (t, o, i), (i, t, o))}))


def _cold_gemms(ctx: RankContext, shapes: tuple[tuple[int, int, int], ...],
                dtype: torch.dtype, flush_bytes: int) -> list[float]:
    """FLOP/s of (m x k) @ (k x n) in `dtype` for each shape, the median of 9 calls, each
    after writing `flush_bytes` so that it reads its operands from memory."""
    flush = _cache_flush(ctx.device, flush_bytes)
    rates = []
    for m, k, n in shapes:
        a = torch.randn(m, k, dtype=dtype, device=ctx.device)
        b = torch.randn(k, n, dtype=dtype, device=ctx.device)

        def call(a: torch.Tensor = a, b: torch.Tensor = b) -> None:
            a @ b
            sync_device(ctx.device)

        rates.append(2 * m * k * n / median_call_s(call, 9, before=flush))
    return rates


def _cache_flush(device: str, nbytes: int) -> Callable[[], None]:
    """What to run before a timed call so that it reads its operands from memory: write
    `nbytes` on `device` (BenchConfig.cache_flush_bytes) and wait for it."""
    buffer = torch.empty(nbytes // 4, device=device)

    def flush() -> None:
        buffer.zero_()
        sync_device(device)

    return flush


def _linear_s(x: torch.Tensor, weight: torch.Tensor) -> float:
    """Seconds of F.linear(x, weight) forward and backward (gradients of both)."""
    x = x.detach().requires_grad_()
    weight = weight.detach().requires_grad_()

    def step() -> None:
        y = F.linear(x, weight)
        y.backward(torch.ones_like(y))
        x.grad = weight.grad = None

    return median_call_s(step, 7)


def _copy_rate(ctx: RankContext, nbytes: int) -> float:
    """copy_ bytes read + written per second on `nbytes` fp32 tensors."""
    x = torch.randn(nbytes // 4, device=ctx.device)
    y = torch.empty_like(x)
    return 2 * nbytes / median_call_s(lambda: y.copy_(x), 3)



def _elementwise(ctx: RankContext, numels: tuple[int, ...]) -> float:
    """Bytes per second of the block's memory-bound kernels in bf16 at each size: residual
    add (reads 2, writes 1), SwiGLU product (2, 1), SiLU (1, 1), RoPE's cat (1, 1), an
    upcast to fp32 and the fp32 log-softmax of the loss; total bytes over total time, so
    each kernel weighs by its time as in a real step."""
    total_bytes, total_s = 0.0, 0.0
    for n in numels:
        x, y = (torch.randn(n, dtype=torch.bfloat16, device=ctx.device) for _ in range(2))
        xf = x.float().view(-1, 256)
        calls: list[tuple[Callable[[], Any], int]] = [
            (lambda x=x, y=y: x + y, 3 * 2 * n),
            (lambda x=x, y=y: x * y, 3 * 2 * n),
            (lambda x=x: F.silu(x), 2 * 2 * n),
            (lambda x=x, h=n // 2: torch.cat((x[h:], x[:h])), 2 * 2 * n),
            (lambda x=x: x.float(), (2 + 4) * n),
            (lambda xf=xf: torch.log_softmax(xf, dim=-1), 2 * 4 * n),
        ]
        for fn, nbytes in calls:
            total_s += median_call_s(fn, 5)
            total_bytes += nbytes
    return total_bytes / total_s


def _gelu(ctx: RankContext, numel: int) -> dict[str, float]:
    """GELU as the reference model's GELU MLP calls it (GELU_APPROXIMATE) on `numel` bf16
    elements, by pass: the forward reads and writes each element once; its backward
    (aten gelu_backward: reads the gradient and the input, writes the input's gradient)
    is counted as zsim.analytic.compute counts backward traffic, twice the forward's.
    Bytes so counted per second (medians of 7 calls). On a CPU GELU is not bound by
    memory: it ran well below SiLU's rate per byte (docs/log.md, 2026-12-02), so it has a
    rate of its own."""
    x = torch.randn(numel, dtype=torch.bfloat16, device=ctx.device)
    grad = torch.randn_like(x)
    forward_bytes = 2 * 2 * numel
    return {"forward": forward_bytes / median_call_s(
                lambda: F.gelu(x, approximate=GELU_APPROXIMATE), 7),
            "backward": 2 * forward_bytes / median_call_s(
                lambda: torch.ops.aten.gelu_backward(grad, x, approximate=GELU_APPROXIMATE),
                7)}


def _attention(ctx: RankContext, shape: tuple[int, int, int, int],
               flush_bytes: int) -> tuple[float, dict[str, float]]:
    """Causal SDPA in bf16 at `shape` (b, h, s, d): (forward + backward FLOP/s as
    RankBench.attention_flop_per_s counts them, {pass: the forward's FLOPs per second of
    that pass}). The forward alone (building the graph, as in training) and forward +
    backward are each the median of 7 calls, each after writing `flush_bytes`: in a step
    attention reads q, k, v (and in backward the saved output) from memory, not from the
    cache a loop of calls leaves warm (cold calls match what the profiler reads inside a
    step: docs/log.md, 2026-12-02). The backward is the difference, at least the
    forward's time (it does twice the forward's FLOPs, flash attention's backward more:
    2.5x on a GPU, several times more on a CPU)."""
    b, h, s, d = shape
    q, k, v = (torch.randn(b, h, s, d, dtype=torch.bfloat16, device=ctx.device,
                           requires_grad=True) for _ in range(3))
    flush = _cache_flush(ctx.device, flush_bytes)

    def forward() -> torch.Tensor:
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        sync_device(ctx.device)
        return out

    def forward_backward() -> None:
        torch.autograd.grad(forward().sum(), (q, k, v))
        sync_device(ctx.device)

    forward_s = median_call_s(forward, 7, before=flush)
    both_s = median_call_s(forward_backward, 7, before=flush)
    # Forward 2 matmuls of 2bhs²d, halved by the causal mask; the fwd+bwd rate counts
    # the backward as twice the forward (zsim.analytic.compute's convention), the pass
    # rates the forward's FLOPs per second of each pass (the kernels.attention schema).
    flops = 4 * b * h * s * s * d / 2
    return 3 * flops / both_s, {"forward": flops / forward_s,
                                "backward": flops / max(both_s - forward_s, forward_s)}


def _step_rate(numel: int, optimizer: Callable[[list[torch.nn.Parameter]], Any],
               flush_bytes: int) -> float:
    """Parameters per second of `optimizer`'s step on `numel` fp32 parameters in host
    memory (where an offloaded step runs), the median of 5 steps, each after writing
    `flush_bytes` so that it reads the parameters, gradients and moments from memory, as
    in a training step, where the forward and backward streamed through the caches since
    the last step (DeepSpeedCPUAdam's in-step rate is close to the cold one, about half
    the hot one: docs/log.md, 2026-12-02)."""
    p = torch.nn.Parameter(torch.randn(numel))
    p.grad = torch.randn_like(p)
    return numel / median_call_s(optimizer([p]).step, 5, before=_cache_flush("cpu", flush_bytes))


def adam_params_per_s(numel: int, flush_bytes: int) -> float:
    return _step_rate(numel, lambda ps: torch.optim.AdamW(ps, lr=1e-4, foreach=True),
                      flush_bytes)


def deepspeed_adam_params_per_s(numel: int, flush_bytes: int) -> float:
    """DeepSpeedCPUAdam's step (AdamW mode: what ZeRO's offload_optimizer runs on the host,
    its own vectorised kernel) on `numel` fp32 parameters, parameters per second; 0 where
    DeepSpeed does not import. Its op is built the first time (DeepSpeed's JIT)."""
    if importlib.util.find_spec("deepspeed") is None:
        return 0.0
    from deepspeed.ops.adam import DeepSpeedCPUAdam

    return _step_rate(numel, lambda ps: DeepSpeedCPUAdam(ps, lr=1e-4, adamw_mode=True),
                      flush_bytes)
