"""Benchmark of zsim's 2-D and 3-D planning speed (not a timed test):
the 405B plan search over every factorization on 16,384 GPUs (target under 10 s), one
interleaved pipeline with pp = 16 and 128 micro-batches simulated (target under 2 s), and
the MoE search of Mixtral 8x7B on 64 GPUs, EP crossed with TP, CP and PP (no target: a
figure to compare across changes).

Run: python bench/bench_parallel.py
"""

from __future__ import annotations

import time

from zsim.parallel_planner import choose_parallel, parallel_plans
from zsim.simulate import simulate
from zsim.spec.plan import Plan
from zsim.spec.registry import resolve_hardware, resolve_model


def main() -> None:
    hw = resolve_hardware("dgx-h100")
    big = resolve_model("405b")
    t0 = time.perf_counter()
    plans = parallel_plans(big, hw, gpus=16384, seq_len=8192, global_batch=16384)
    t1 = time.perf_counter()
    ranked = choose_parallel(big, hw, plans)
    t2 = time.perf_counter()
    simulated = sum(c.result is not None for c in ranked)
    print(f"405b on 16,384 x dgx-h100, seq 8192, global batch 16,384 sequences: "
          f"{len(plans)} factorizations enumerated in {t1 - t0:.3f} s, estimated and "
          f"ranked ({simulated} simulated) in {t2 - t1:.2f} s; total {t2 - t0:.2f} s "
          f"(target < 10 s); best: {ranked[0].plan.label}")
    # 80 layers = 16 stages x 5 virtual stages of one block.
    seventy = resolve_model("70b-3")
    plan = Plan(strategy="fsdp", dp_shard=1, tp=8, sp=True, pp=16,
                pp_schedule="interleaved", virtual_stages=5, grad_accum=128, seq_len=8192,
                recompute="full")
    best = float("inf")
    result = None
    for _ in range(3):
        t0 = time.perf_counter()
        result = simulate(seventy, hw, plan)
        best = min(best, time.perf_counter() - t0)
    assert result is not None
    print(f"70b-3 interleaved pp=16 x 5 virtual stages, 128 micro-batches, tp=8 "
          f"({plan.world_size} GPUs): simulated in {best:.3f} s (best of 3; target < 2 s); "
          f"step {result.step_time_s:.2f} s, worst bubble "
          f"{max(st.bubble_fraction for st in result.pipeline_stages):.1%}, "
          f"{result.events:,} pipeline actions")
    mixtral, h200 = resolve_model("mixtral-8x7b"), resolve_hardware("hgx-h200")
    t0 = time.perf_counter()
    plans = parallel_plans(mixtral, h200, gpus=64, seq_len=4096, global_batch=512)
    ranked = choose_parallel(mixtral, h200, plans)
    took = time.perf_counter() - t0
    crossed = sum(p.ep > 1 and (p.tp > 1 or p.pp > 1) for p in plans)
    print(f"mixtral-8x7b on 64 x hgx-h200, global batch 512: {len(plans):,} factorizations "
          f"({crossed:,} with EP and TP or PP) estimated and ranked in {took:.2f} s "
          f"({took / len(plans) * 1e3:.1f} ms each); best: {ranked[0].plan.label}")


if __name__ == "__main__":
    main()
