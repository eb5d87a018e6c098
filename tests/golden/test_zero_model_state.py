"""Golden: model-state bytes per GPU and communication volume per strategy.

Sources:
- The ZeRO/FSDP card (docs/card.md, "Core explanation"): 7B parameters on 64 GPUs hold 112 / ~29 /
  ~15.5 / ~1.75 GB (DDP / ZeRO-1 / ZeRO-2 / ZeRO-3), communication 2S / 2S / 2S / 3S with
  S the bf16 size of the parameters; the programs zsim runs depart from the last where
  PROGRAM_COMM_S says.
- Rajbhandari et al. 2020 (ZeRO), Fig. 1 / Table 1 for Psi = 7.5B, transcribed in
  tests/data/cases/published.yaml as F-ZeRO-Table1-7.5B; read at test time.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from zsim.analytic.comm import step_comm
from zsim.analytic.memory import model_state_bytes
from zsim.spec.hardware import HardwareProfile
from zsim.spec.model import synthetic
from zsim.spec.plan import Plan
from zsim.units import GB

SEED_GB = {"ddp": "112", "zero1": "29.3", "zero2": "15.5", "fsdp": "1.75", "zero3": "1.75"}
"""Seed card, 7.0e9 parameters on 64 GPUs, decimal GB as printed."""

BLOCK_F = 202_383_360 - 2 * 4096
"""synthetic(7e9): a block's elements less its two norms, which DeepSpeed's ZeRO-3 keeps
whole (param_persistence_threshold 100,000)."""

PROGRAM_COMM_S = {
    # Card: all_reduce 2S. DDP all-reduces its buckets in the parameters' dtype, fp32
    # under torch.autocast: 2 x 4P bytes = 4S.
    "ddp": 4.0,
    # Card: reduce_scatter + all_gather = 2S. DeepSpeed 0.19 all-reduces each gradient
    # bucket whole (use_multi_rank_bucket_allreduce), each rank keeping its slice: 2S,
    # then gathers the updated 16-bit parameters: 1S.
    "zero1": 3.0, "zero2": 3.0,
    # Card: 3S. FSDP2 never reshards its root (embedding, final norm, output and the
    # synthetic model's 261,584,384 extra: 523,732,480 elements) after forward: gathered
    # once, not twice.
    "fsdp": 3 - 523_732_480 / 7e9,
    # Card: 3S. DeepSpeed's coordinator keeps blocks 28-31 gathered from forward to
    # backward (with the head, 4 x 202,383,360 + 131,076,096 elements fit in
    # max_live_parameters, 1e9, which the prefetch fills), so it gathers the
    # 32 + 28 blocks' partitioned tensors, the embedding and extra (392,656,384) twice,
    # the output (131,072,000) once and the 32 x 2 + 1 persistent norms once after the
    # step; and reduce-scatters S once.
    "zero3": 1 + (60 * BLOCK_F + 2 * 392_656_384 + 131_072_000 + 65 * 4096) / 7e9,
}
"""What each default program sends per step on 7e9 parameters over 64 GPUs, in units of
S (the bf16 model, 14 GB) as the card counts them (a ring all_gather of S = 1, an
all_reduce of S = 2), against the seed card's 2S / 2S / 2S / 3S (ZeRO paper, Sec. 7)."""

STEP_SCALAR_BYTES = {"zero1": 1 + 4, "zero2": 1 + 4, "zero3": 8}
"""DeepSpeed's step also all-reduces the gradient norm (fp32; stage 3 float64) and, in
stages 1/2 under bf16, the inf/NaN flag (1 byte)."""


@pytest.mark.parametrize("strategy", sorted(SEED_GB))
def test_seed_card_model_state_7b_on_64(
        strategy: str, matches_printed: Callable[[float, str], bool]) -> None:
    plan = Plan.for_strategy(strategy, gpus=64, seq_len=4096)
    total_gb = model_state_bytes(7_000_000_000, plan).total / GB
    assert matches_printed(total_gb, SEED_GB[strategy]), (strategy, total_gb)


def test_seed_card_exact_bytes_per_param() -> None:
    # By hand, 16 bytes/param split as 2 param + 2 grad + 4 master + 8 Adam:
    # ZeRO-1 4 + 12/64, ZeRO-2 2 + 14/64, ZeRO-3 16/64 bytes per parameter.
    exact = {"ddp": 16.0, "zero1": 4 + 12 / 64, "zero2": 2 + 14 / 64, "fsdp": 16 / 64}
    for strategy, per_param in exact.items():
        plan = Plan.for_strategy(strategy, gpus=64, seq_len=4096)
        got = model_state_bytes(7_000_000_000, plan).total
        assert math.isclose(got, per_param * 7e9, rel_tol=1e-12), strategy


@pytest.mark.parametrize("strategy", sorted(PROGRAM_COMM_S))
def test_seed_card_communication_7b_on_64(strategy: str, toy_hw: HardwareProfile) -> None:
    model = synthetic(7_000_000_000)
    plan = Plan.for_strategy(strategy, gpus=64, seq_len=4096)
    s_bytes = 7e9 * 2  # bf16
    # A ring moves (n-1)/n of the tensor per rank per all_gather / reduce_scatter.
    expected = (PROGRAM_COMM_S[strategy] * s_bytes
                + 2 * STEP_SCALAR_BYTES.get(strategy, 0)) * (63 / 64)
    assert math.isclose(step_comm(model, plan, toy_hw).total_bus_bytes, expected,
                        rel_tol=1e-12)


def test_ddp_all_reduce_7b_on_64_by_hand(toy_hw: HardwareProfile) -> None:
    # 2 (n-1)/n x 4 bytes x 7e9 fp32 gradients = 55.125 GB per rank per step.
    plan = Plan.for_strategy("ddp", gpus=64, seq_len=4096)
    bus = step_comm(synthetic(7_000_000_000), plan, toy_hw).bus_bytes
    assert bus == {"all_gather": 0.0, "reduce_scatter": 0.0, "all_reduce": 55.125e9}


def _zero_case(cases_dir: Path) -> dict:
    # BaseLoader keeps every scalar as the printed string, so the table's precision
    # ("35.62", "0.469") is known.
    cases = yaml.load((cases_dir / "published.yaml").read_text(),
                      Loader=yaml.BaseLoader)["cases"]
    (case,) = [c for c in cases if c["id"] == "F-ZeRO-Table1-7.5B"]
    return case


ZERO_COLUMNS = {"baseline_dp_gb": "ddp", "pos_gb": "zero1", "pos_g_gb": "zero2",
                "pos_g_p_gb": "fsdp"}
"""Table 1 columns -> zsim strategy: P_os = ZeRO-1, P_os+g = ZeRO-2, P_os+g+p = ZeRO-3."""


def test_zero_paper_table1_every_row(matches_printed: Callable[[float, str], bool],
                                     cases_dir: Path) -> None:
    case = _zero_case(cases_dir)
    psi = 7_500_000_000  # the case's model: "generic 7.5B-parameter model (Psi=7.5e9)"
    rows = case["measured"]["model_state_gb_per_gpu"]
    assert sorted(int(r["Nd"]) for r in rows) == [1, 4, 16, 64, 256, 1024]
    mismatches = []
    for row in rows:
        nd = int(row["Nd"])
        for column, strategy in ZERO_COLUMNS.items():
            # fp16 params and grads, K = 12 (fp32 master, momentum, variance), as the paper.
            plan = Plan.for_strategy(strategy, gpus=nd, seq_len=1024, param_dtype="fp16",
                                     grad_dtype="fp16", reduce_dtype="fp16")
            got_gb = model_state_bytes(psi, plan).total / GB
            if not matches_printed(got_gb, row[column]):
                mismatches.append((nd, column, got_gb, row[column]))
    assert mismatches == []
