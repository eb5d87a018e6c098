"""What the micro-benchmarks run and what they give: BenchConfig (sizes, repetitions,
rounds) and RankBench (one rank's figures), the vocabulary between the benchmarks
(zsim.calibration.microbench and the modules it runs) and the profile they become
(zsim.calibration.profile_writer). Imports no torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from zsim.calibration.collective_fit import CollectiveSample
from zsim.units import MiB

SIZES_BYTES: tuple[int, ...] = tuple(4096 * 4**i for i in range(9))
"""4 KiB to 256 MiB, x4 steps (nccl-tests' -b 4K -e 256M -f 4)."""

BLOCK_STEPS: tuple[str, ...] = ("plain", "plain_forward", "full", "full_forward",
                                "selective", "selective_forward", "fsdp_local", "fsdp",
                                "fsdp_no_reshard")
"""What zsim.calibration.host_bench.block_step_s times per block of the nano model (its
kernels cost almost nothing, so this is host time): "plain", a training step of the
unsharded bf16 model (forward, backward, AdamW); "full" and "selective", the same with
each block checkpointed (torch.utils.checkpoint, op-level SAC); "<x>_forward", the
forward alone; "fsdp_local", fully_shard per block on a 1-rank mesh (hooks, copies,
DTensor optimizer, no collectives); "fsdp", on all ranks (the same plus 2 all-gathers
and a reduce-scatter per block); "fsdp_no_reshard", on all ranks with
reshard_after_forward=False (1 + 1)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class BenchConfig:
    """What to run. The defaults take minutes on 2 CPU ranks, a round at 2 and one at 4
    ranks several minutes more (the times measured on the development host are in
    docs/log.md, 2026-12-02)."""

    sizes_bytes: tuple[int, ...] = SIZES_BYTES
    iters_small: int = 60
    """Timed calls for sizes up to 1 MiB. On a shared CPU host a share of gloo's small
    calls stall for milliseconds, so a call's time is bimodal: its median jumps between
    the two modes from one calibration to the next, while a step, which pays every call,
    sees their mean (docs/log.md, 2026-12-02). The figure is the mean of the calls less
    the slowest tenth (trimmed_mean), over enough calls to hold still."""
    iters_large: int = 7
    """Timed calls for larger sizes."""
    reduction_dtypes: tuple[str, ...] = ("bf16",)
    """Besides fp32, the element types the reducing collectives (reduce-scatter,
    all-reduce) are timed in, at the sizes up to reduction_dtype_max_bytes: the plans
    reduce their gradients in bf16, which gloo adds element by element through fp32, so a
    bf16 reduction of the same bytes takes longer (docs/log.md, 2026-12-02); an
    all-gather's time does not depend on the element type."""
    reduction_dtype_max_bytes: int = 64 * MiB
    matmul_shapes: tuple[tuple[int, int, int], ...] = (
        (1024, 1024, 1024), (2048, 512, 512), (2048, 512, 1376), (2048, 1376, 512),
        (2048, 1024, 1024), (2048, 1024, 2752), (512, 256, 256), (512, 256, 688),
        (512, 688, 256))
    """(m, k, n) of the timed matmuls: a square GEMM and block shapes (tokens x width),
    including those of the validation grid (512 tokens, d_model 256, ffn 688)."""
    gemm_linears: tuple[tuple[int, int, int], ...] = tuple(
        (512, *io) for w in (64, 128, 256, 344, 688, 896, 1024, 2048)
        for io in {(256, w), (w, 256)})
    """(tokens, in, out) of the linear layers whose three GEMMs
    (zsim.calibration.kernel_bench.gemm_shapes) are timed from a cold cache for the
    profile's kernels.matmul_tflops: the validation grid's
    (zsim.validation.grid: 512 tokens, width 256; its attention, GQA and MLP
    projections, their halves under TP, the 2,048-word output layer)."""
    cache_flush_bytes: int = 64 * MiB
    """Written before each cold GEMM and each host optimizer step
    (kernel_bench._step_rate) so that they read their operands from memory, as in a
    training step, where a layer's weights and activations were last touched a block or
    more before: more than a server CPU's L3 (32 MiB on the development host) and a Hopper
    GPU's L2 (50 MiB). GEMMs repeated on the same operands run faster than cold ones, and
    a step's GEMMs run at about the cold rate (docs/log.md, 2026-12-02)."""
    attention_shape: tuple[int, int, int, int] = (2, 4, 256, 64)
    """(batch, heads, seq, head_dim) of the timed attention: the validation grid's
    (zsim.validation.grid.grid_plans: micro-batch 2, seq 256, head_dim 64). On CPU the
    rate grows with seq (docs/log.md, 2026-12-02), so the shape is the grid's own."""
    elementwise_numels: tuple[int, ...] = (2**17, 2**19)
    """Elements per tensor of the timed memory-bound kernels: a (512, 256) activation and
    a (512, 1024)-sized one, the validation grid's sizes."""
    copy_bytes: int = 128 * MiB
    adam_params: int = 4 * 2**20
    sync_segments: tuple[int, ...] = (2, 8, 24, 48)
    """Lengths, in 256^3 matmuls, of the compute segments each followed by a tiny
    all-gather (rank_skew: the slope of the line fitted through them; sync_overhead_s:
    its intercept less the all-gather back to back)."""
    host_layers: tuple[int, int] = (2, 10)
    """Block counts of the two nano models whose plain and FSDP2 steps are timed."""
    programs: bool = True
    """Time the library programs on the nano model on a CPU host
    (zsim.calibration.program_overhead: DeepSpeed's ZeRO stages, FSDP1, DTensor TP), for the
    profile's host.program_overhead_us; off, or on CUDA (whose host runs ahead), the
    profile has none."""
    cores: int | None = None
    """CPU cores the ranks of a CPU host share (None: the cores this process may run on);
    with more ranks than cores the kernels are timed alone and shared (core_share)."""
    rounds: int = 3
    """Times the whole set runs; each figure is its median over the rounds. A shared host
    has slow spells of seconds to minutes (here a compute-only loop varied by +-8% from
    one second to the next, and one calibration in five came out 15% slow), so a figure
    timed within one spell can be off; rounds are about 45 s apart at 2 ranks here."""



@dataclass(slots=True)
class RankBench:
    """One rank's figures."""

    collectives: list[CollectiveSample] = field(default_factory=list)
    p2p_bytes_per_s: float = 0.0
    """Point-to-point send/recv bandwidth of a 64 MiB message (rank 0 -> 1)."""
    matmul_flop_per_s: dict[str, list[float]] = field(default_factory=dict)
    """Per dtype ("fp32", "bf16"), one rate per matmul shape, FLOP/s."""
    gemm_flop_per_s: dict[str, list[float]] = field(default_factory=dict)
    """Per dtype, one rate per shape of kernel_bench.gemm_shapes(config), each GEMM timed
    from a cold cache (BenchConfig.cache_flush_bytes), FLOP/s."""
    linear_flop_per_s: dict[str, list[float]] = field(default_factory=dict)
    """The same shapes as a linear layer's forward and backward (its three GEMMs: the
    output, the input gradient, the weight gradient, 6mkn FLOPs), as a block's matmuls
    run in a training step, FLOP/s."""
    attention_flop_per_s: float = 0.0
    """Causal SDPA forward + backward in bf16 from a cold cache, FLOP/s counted as
    zsim.analytic.compute counts them (3 x the forward's 4·b·h·s²·d/2), so the efficiency
    absorbs flash attention's recomputation in backward."""
    attention_pass_flop_per_s: dict[str, float] = field(default_factory=dict)
    """The same call's forward and backward apart ("forward", "backward"), each the
    forward's FLOPs (4·b·h·s²·d/2) per second of that pass, as the profile's
    kernels.attention rows hold them (see kernel_bench._attention)."""
    copy_bytes_per_s: float = 0.0
    """copy_ bytes read + written per second."""
    elementwise_bytes_per_s: float = 0.0
    """Bytes read + written per second by a mix of the block's memory-bound kernels in
    bf16 (the plans' compute dtype), total bytes over total time."""
    gelu_bytes_per_s: dict[str, float] = field(default_factory=dict)
    """GELU's rate by pass ("forward", "backward"), bytes per second as
    zsim.analytic.compute counts its traffic (see kernel_bench._gelu)."""
    adam_params_per_s: float = 0.0
    deepspeed_adam_params_per_s: float = 0.0
    """DeepSpeedCPUAdam's step on the same parameters (0: not timed; see
    kernel_bench.deepspeed_adam_params_per_s)."""
    comm_compute_slowdown: float = 0.0
    """Fraction of its rate a matmul loses while an all-reduce is in flight."""
    compute_comm_slowdown: float = 0.0
    """Fraction of its rate an all-reduce loses while matmuls run on every rank."""
    core_share: float = 1.0
    """The kernel rates above are a rank's alone divided by this (core_share): the ranks
    that share each of a CPU host's cores."""
    rank_skew: float = 0.0
    """Extra time of a tiny all-gather per second of compute before it (see
    comm_bench.synchronisation)."""
    sync_overhead_s: float = 0.0
    """What a tiny all-gather after compute takes beyond the same call back to back, less
    the rank_skew share (see comm_bench.synchronisation), seconds."""
    block_step_s: dict[str, float] = field(default_factory=dict)
    """Time per extra block of the nano model, by BLOCK_STEPS entry,
    seconds."""
    program_step_s: dict[str, dict[str, float]] = field(default_factory=dict)
    """The nano model's step and forward times under each library program, by program
    (zsim.calibration.program_overhead.program_steps_s), seconds."""
