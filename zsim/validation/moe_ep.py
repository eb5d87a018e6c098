"""A measured batch of the expert-parallel MoE backend (zsim.backend.moe_ep) on gloo: a
few cases at world 2 and 4, each rank's all-to-all bytes and calls, routing, state,
peak memory and step time into ep.csv (units in every column name), with
provenance.yaml (host, torch, date, command).

Owns the cases, the table's columns and zsim's prediction of each case (`predicted`: the
same plan lowered for the local-cpu profile, its all-to-alls and its expert and dense
state); the measurement is the backend's. Imports torch (through the backend).
"""

from __future__ import annotations

import csv
import statistics
import time
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml

from zsim.backend.moe_ep import EpJob, MoeConfig, measure_rank, median_step_s, skewed_routing
from zsim.backend.runner import run_ranks
from zsim.calibration.machine import environment
from zsim.schedule.build import units
from zsim.schedule.lower import lower
from zsim.schedule.programs import fsdp2
from zsim.spec.model import ModelSpec
from zsim.spec.moe import MoeSpec
from zsim.spec.plan import Plan
from zsim.spec.registry import resolve_hardware


@dataclass(frozen=True, slots=True, kw_only=True)
class EpCase:
    """One run of the batch."""

    name: str
    world_size: int
    job: EpJob
    routing: str
    """"learned" (the router's top-k) or "skewed-<share>" (skewed_routing)."""


D, E, K, F_E, F_S = 64, 8, 2, 128, 128
"""d_model, experts, top-k, expert width, shared expert width of every case."""
B, S, LAYERS, VOCAB = 2, 64, 2, 256


def _case(world: int, ep: int, *, cf: float = 0.0, recompute: str = "none",
          hot_share: float | None = None, steps: int) -> EpCase:
    moe = MoeConfig(d_model=D, num_experts=E, top_k=K, expert_ffn=F_E, shared_expert_ffn=F_S,
                    ep=ep, capacity_factor=cf)
    routing = None if hot_share is None else skewed_routing(B * S, moe, hot_share)
    job = EpJob(moe=moe, num_layers=LAYERS, num_heads=4, vocab_size=VOCAB, seq_len=S,
                micro_batch=B, recompute=recompute, routing=routing,  # type: ignore[arg-type]
                steps=steps)
    name = (f"w{world}-ep{ep}" + (f"-cf{cf:g}" if cf else "")
            + ("-full-ac" if recompute == "full" else "")
            + ("" if hot_share is None else f"-skewed{hot_share:g}"))
    return EpCase(name=name, world_size=world, job=job,
                  routing="learned" if hot_share is None else f"skewed-{hot_share:g}")


def default_cases(steps: int) -> list[EpCase]:
    """World 2 at ep 2 and world 4 at ep 2 and 4: learned routing, a skewed table
    (half the tokens to experts 0 and 1), capacity factor 1.25, full recomputation."""
    return [_case(2, 2, steps=steps), _case(2, 2, hot_share=0.5, steps=steps),
            _case(4, 2, steps=steps), _case(4, 2, recompute="full", steps=steps),
            _case(4, 4, steps=steps), _case(4, 4, cf=1.25, hot_share=0.5, steps=steps)]


def case_model(case: EpCase) -> ModelSpec:
    """The case's model as zsim describes it: the backend's decoder with an MoE of its
    experts and shared expert in every block, fp32."""
    moe = case.job.moe
    return replace(case.job.spec(), moe=MoeSpec(
        experts=moe.num_experts, top_k=moe.top_k, expert_ffn_hidden=moe.expert_ffn,
        shared_ffn_hidden=moe.shared_expert_ffn))


def case_plan(case: EpCase) -> Plan:
    """The case's plan: FSDP2 over the world, EP of the backend's degree, fp32 throughout
    (the backend trains without mixed precision), balanced dropless routing or the case's
    capacity factor."""
    job = case.job
    return Plan(strategy="fsdp", dp_shard=case.world_size, ep=job.moe.ep,
                capacity_factor=job.moe.capacity_factor, seq_len=job.seq_len,
                micro_batch=job.micro_batch, recompute=job.recompute, param_dtype="fp32",
                grad_dtype="fp32", reduce_dtype="fp32", master_dtype="fp32")


def predicted(case: EpCase) -> dict[str, float]:
    """zsim's figures for one rank of `case` (zsim.schedule.lower on the local-cpu
    profile), under the columns the measurement has: all-to-all calls and bytes sent to
    other ranks per step (routing taken as balanced: what a rank sends on average), and
    the rank's expert and dense parameter bytes (FSDP2's padded shards)."""
    model, plan = case_model(case), case_plan(case)
    schedule = lower(model, resolve_hardware("local-cpu"), plan)
    a2a = [op for op in schedule.ops if op.kind == "all_to_all"]
    local = model.ep_share(plan.ep)
    root, blocks = units(local, plan, fsdp2.shard_elems)
    expert = sum(u.expert_shard for u in blocks)
    dense = root.shard + sum(u.shard for u in blocks) - expert
    return {"a2a_calls_per_step": float(len(a2a)),
            "a2a_sent_bytes_per_step": sum(op.bus_bytes for op in a2a),
            "expert_param_bytes": float(expert * 4), "dense_param_bytes": float(dense * 4)}


def rows_of(case: EpCase, ranks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per rank of a measured case (the measured step's figures; step time the
    median of the timed steps)."""
    job, moe = case.job, case.job.moe
    per_expert = [sum(r["tokens_per_expert"][layer][e] for r in ranks
                      for layer in range(job.num_layers)) for e in range(moe.num_experts)]
    local = moe.local_experts
    per_ep_rank = [sum(per_expert[g * local:(g + 1) * local]) for g in range(moe.ep)]
    rows = []
    for r in ranks:
        tokens = [c for c in r["calls"] if c["kind"] != "counts"]
        counts = [c for c in r["calls"] if c["kind"] == "counts"]
        calls = Counter("recompute" if c["direction"] == "forward" and c["phase"] == "backward"
                        else c["direction"] for c in tokens)
        rows.append({
            "case": case.name, "world_size": case.world_size, "ep": moe.ep,
            "dp_shard_mod_ep": case.world_size // moe.ep,
            "capacity_factor": moe.capacity_factor, "recompute": job.recompute,
            "routing": case.routing, "num_layers": job.num_layers, "d_model": moe.d_model,
            "num_experts": moe.num_experts, "top_k": moe.top_k, "expert_ffn": moe.expert_ffn,
            "shared_expert_ffn": moe.shared_expert_ffn, "tokens_per_rank": job.tokens,
            "rank": r["rank"], "ep_rank": r["ep_rank"],
            "a2a_sent_bytes_per_step": sum(_sent(c) for c in tokens),
            "a2a_kept_bytes_per_step": sum(c["send_rows"][c["own"]] * c["row_bytes"]
                                           for c in tokens),
            "a2a_calls_per_step": len(tokens),
            "a2a_forward_calls_per_step": calls["forward"],
            "a2a_backward_calls_per_step": calls["backward"],
            "a2a_recompute_calls_per_step": calls["recompute"],
            "a2a_count_calls_per_step": len(counts),
            "a2a_count_sent_bytes_per_step": sum(_sent(c) for c in counts),
            "routed_slots_per_step": sum(map(sum, r["tokens_per_expert"])),
            "dropped_slots_per_step": r["dropped_slots"],
            "imbalance_experts_max_over_mean": max(per_expert) / statistics.mean(per_expert),
            "imbalance_ep_ranks_max_over_mean": max(per_ep_rank) / statistics.mean(per_ep_rank),
            "expert_param_bytes": r["param_bytes"]["expert"],
            "dense_param_bytes": r["param_bytes"]["dense"],
            "expert_grad_bytes": r["grad_bytes"]["expert"],
            "dense_grad_bytes": r["grad_bytes"]["dense"],
            "expert_optimizer_bytes": r["optimizer_bytes"]["expert"],
            "dense_optimizer_bytes": r["optimizer_bytes"]["dense"],
            "peak_memory_bytes": r["peak_memory_bytes"],
            "step_time_s": round(median_step_s(r), 6), "loss": round(r["loss"], 6)})
    return rows


def _sent(call: dict[str, Any]) -> int:
    """Bytes a call sent to the other ranks of its EP group."""
    return (sum(call["send_rows"]) - call["send_rows"][call["own"]]) * call["row_bytes"]


def measure_batch(out: Path, *, steps: int = 5, command: str = "",
                  cases: list[EpCase] | None = None) -> dict[str, Any]:
    """Run every case on gloo, write ep.csv and provenance.yaml into `out`.

    Returns:
        {"rows": the CSV's rows, "written": [paths]}.

    Raises:
        RankFailed: a run crashed or hung.
    """
    out.mkdir(parents=True, exist_ok=True)
    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    rows: list[dict[str, Any]] = []
    for case in cases if cases is not None else default_cases(steps):
        rows += rows_of(case, run_ranks(measure_rank, case.job, nproc=case.world_size,
                                        timeout_s=600))
    table = out / "ep.csv"
    with table.open("w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    provenance = out / "provenance.yaml"
    provenance.write_text(yaml.safe_dump(
        {"command": command, "time_utc": started, "timed_steps": steps,
         "environment": environment()}, sort_keys=False), encoding="utf-8")
    return {"rows": rows, "written": [str(table), str(provenance)]}
