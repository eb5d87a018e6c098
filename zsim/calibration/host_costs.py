"""The profile's host costs from the nano model's per-block host times
(zsim.calibration.host_bench): the per-kernel overhead, FSDP2's per-unit hook time, what a
collective call costs beyond the fitted link model, and what checkpointing adds per
forward kernel; and how many of the nano runs' FSDP2 calls the simulator finds
synchronising, so that a call is not charged its synchronisation twice.
zsim.calibration.profile_writer writes them into the profile. Imports no torch.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

from zsim.analytic.compute import (
    BACKWARD_FACTOR,
    block_forward_flops,
    optimizer_flops,
    recompute_forward_flops,
)
from zsim.calibration.bench_figures import BLOCK_STEPS, RankBench
from zsim.calibration.collective_fit import AlphaBeta
from zsim.calibration.nano import NANO_TOKENS, nano_model, nano_plan
from zsim.schedule.build import synchronising
from zsim.schedule.lower import lower
from zsim.spec.hardware import CHECKPOINT_MODES, HardwareProfile
from zsim.units import dtype_bytes

FSDP2_RUNS: dict[str, tuple[str, int, int]] = {"fsdp": ("fsdp", 2, 1),
                                                 "fsdp_no_reshard": ("fsdp-no-reshard", 1, 1)}
"""The all-rank FSDP2 runs of BLOCK_STEPS: the strategy each applies, and its all-gathers
and reduce-scatters per block (resharding after forward gathers each block twice)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class HostCosts:
    kernel_s: float
    kernels_per_block: float
    fsdp_unit_s: float
    call_extra_s: dict[str, float]
    """Per FSDP2 run of FSDP2_RUNS, what its calls took per block beyond the link model."""
    fwd_kernels: float
    """Kernels of one block's forward, as zsim.analytic.compute counts them."""
    checkpoint_s: dict[str, dict[str, float]]
    """Per recompute mode and phase, seconds per forward kernel of a block."""

    def collective_s(self, synchronising: dict[str, float] | None = None,
                     sync_s: float = 0.0) -> float:
        """The cost of a call, mean over the FSDP2 runs: each run's extra time per block,
        less `sync_s` for each of its `synchronising` calls per block, over its calls
        (floored at 0: a difference of step times a noisy host can make negative)."""
        synced = synchronising or {}
        calls = {run: ag + rs for run, (_, ag, rs) in FSDP2_RUNS.items()}
        return max(statistics.mean((extra - synced.get(run, 0.0) * sync_s) / calls[run]
                                   for run, extra in self.call_extra_s.items()), 0.0)


def host_costs(ranks: list[RankBench], link: AlphaBeta, nproc: int,
                foreach: str) -> HostCosts:
    """Host costs from the nano model's per-block step times (RankBench.block_step_s,
    medians over ranks): the unsharded block's time over the kernels
    zsim.analytic.compute counts for it (forward, backward and its share of the AdamW
    step); FSDP2's extra time on a 1-rank mesh; and on all ranks, what each collective
    call costs beyond the fitted link model (hand-off, waiting for the other ranks,
    FSDP2's Python and copies around it), the mean over resharding after forward
    (2 all-gathers and a reduce-scatter per block) and not (1 + 1); what checkpointing
    a block adds in forward and in backward beyond the kernels it re-runs, per forward
    kernel of the block. `foreach`: how the device runs the AdamW step's foreach ops
    (HardwareProfile.foreach_kernels), which sets its kernels."""
    per = {k: statistics.median(r.block_step_s[k] for r in ranks) for k in BLOCK_STEPS}
    spec = nano_model(1)
    micro_batch, seq_len = NANO_TOKENS
    fwd = block_forward_flops(spec, micro_batch=micro_batch, seq_len=seq_len, act_bytes=2)
    opt = optimizer_flops(spec.params_per_block, optimizer="adamw",
                          tensors=len(spec.block_tensors()), master_bytes=2,
                          state_bytes_per_param=4, grad_bytes=2, param_copy_bytes=0,
                          foreach=foreach)
    kernels = fwd.kernels * (1 + BACKWARD_FACTOR) + opt.kernels
    plan = nano_plan("fsdp", nproc)
    params = spec.params_per_block
    ag_wire = link.predict_s("all_gather", params * dtype_bytes(plan.param_dtype), nproc)
    rs_wire = link.predict_s("reduce_scatter", params * dtype_bytes(plan.reduce_dtype), nproc)
    extra = {run: per[run] - per["fsdp_local"] - ag * ag_wire - rs * rs_wire
             for run, (_, ag, rs) in FSDP2_RUNS.items()}
    # Each figure is a difference of step times, which a noisy host can make negative:
    # floored at 0, as a profile's host costs must be.
    kernel_s = max(per["plain"], 0.0) / kernels
    plain_backward = per["plain"] - per["plain_forward"]
    checkpoint: dict[str, dict[str, float]] = {}
    for mode in CHECKPOINT_MODES:
        rerun = recompute_forward_flops(spec, recompute=mode, micro_batch=micro_batch,
                                        seq_len=seq_len, act_bytes=2).kernels * kernel_s
        forward = per[f"{mode}_forward"] - per["plain_forward"]
        backward = per[mode] - per[f"{mode}_forward"] - plain_backward - rerun
        checkpoint[mode] = {"forward": max(forward, 0.0) / fwd.kernels,
                            "backward": max(backward, 0.0) / fwd.kernels}
    return HostCosts(kernel_s=kernel_s, kernels_per_block=kernels,
                      fsdp_unit_s=max(per["fsdp_local"] - per["plain"], 0.0),
                      call_extra_s=extra,
                      fwd_kernels=fwd.kernels, checkpoint_s=checkpoint)


def synchronising_per_block(data: dict[str, Any], nproc: int,
                             layers: tuple[int, int]) -> dict[str, float]:
    """Per FSDP2 nano run of HostCosts.calls, the calls per block that the simulator's
    lowering of the same plan on the profile `data` (its YAML structure) finds
    synchronising (zsim.schedule.build.synchronising): the growth from `layers`[0] to
    `layers`[1] blocks."""
    hw = HardwareProfile.from_dict(data, name=str(data["name"]))
    lo, hi = layers
    out = {}
    for run, (strategy, _, _) in FSDP2_RUNS.items():
        plan = nano_plan(strategy, nproc)
        count = [sum(synchronising(lower(nano_model(n), hw, plan).ops)) for n in layers]
        out[run] = (count[1] - count[0]) / (hi - lo)
    return out
