"""The MoE layer with expert parallelism (zsim.backend.moe_ep) on gloo at world 2 and 4:
its all-to-alls' bytes and calls, its state per rank and its routing imbalance against
closed forms worked out by hand, and its output and gradients against the same layer and
model without EP."""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

import pytest
from _ranks import moe_layer_vs_reference, moe_model_vs_reference

from zsim.backend.moe_ep import EpJob, MoeConfig, measure_rank
from zsim.backend.runner import run_ranks
from zsim.errors import ConfigError
from zsim.schedule.programs.fsdp2 import shard_elems

D, E, K, F_E, F_S, L, V = 16, 4, 2, 24, 8, 2, 64
"""d_model, experts, top-k, expert width, shared expert width, layers, vocabulary."""
T = 16
"""Tokens per rank and step: micro-batch 2 x sequence 8."""
SKEWED = ((0, 1),) * 12 + ((2, 3),) * 4
"""12 tokens to experts 0 and 1, 4 to experts 2 and 3: per rank and layer the experts get
12, 12, 4 and 4 slots, so max / mean = 12 / 8 = 1.5 over experts, and over EP ranks
too (24 vs 8 slots at ep 2; 12, 12, 4, 4 at ep 4)."""
ROW_BYTES = D * 4
"""One token's hidden state in fp32."""


def _job(ep: int, *, cf: float = 0.0, recompute: str = "none") -> EpJob:
    return EpJob(moe=MoeConfig(d_model=D, num_experts=E, top_k=K, expert_ffn=F_E,
                               shared_expert_ffn=F_S, ep=ep, capacity_factor=cf),
                 num_layers=L, vocab_size=V, recompute=recompute,  # type: ignore[arg-type]
                 routing=SKEWED, steps=1)


def _sent(calls: list[dict[str, Any]], kind: str, direction: str) -> int:
    """Bytes this rank sent to other ranks in the calls of `kind` and `direction`."""
    return sum((sum(c["send_rows"]) - c["send_rows"][c["own"]]) * c["row_bytes"]
               for c in calls if c["kind"] == kind and c["direction"] == direction)


def _expert_shapes(local: int) -> list[tuple[int, ...]]:
    return [(local, F_E, D), (local, D, F_E), (local, F_E, D)]


DENSE_BLOCK = [(D, D)] * 4 + [(D,)] * 2 + [(E, D), (F_S, D), (D, F_S), (F_S, D)]
"""wq wk wv wo (kv heads = heads), two norms, the router's gate, the shared expert."""
DENSE_ROOT = [(V, D), (D,), (V, D)]


@pytest.mark.slow
@pytest.mark.parametrize(("world", "ep", "cf", "recompute"), [
    (2, 2, 0.0, "none"), (4, 2, 0.0, "full"), (4, 4, 1.0, "none")],
    ids=["w2-ep2", "w4-ep2-full-ac", "w4-ep4-cf1"])
def test_all_to_all_bytes_calls_state_and_imbalance(world: int, ep: int, cf: float,
                                                    recompute: str) -> None:
    job = _job(ep, cf=cf, recompute=recompute)
    ranks = run_ranks(measure_rank, job, nproc=world, timeout_s=240)
    local = E // ep
    n_edp = world // ep
    for r in ranks:
        me = r["ep_rank"]
        mine = range(me * local, (me + 1) * local)
        if cf:
            # C = ceil(1.0 * 16 * 2 / 4) = 8 rows per expert and source; every call moves
            # E x C rows, of which the (ep - 1) x local x C of the other ranks leave.
            cap = math.ceil(cf * T * K / E)
            assert cap == 8
            out_rows = in_rows = (ep - 1) * local * cap
            # Experts 0 and 1 get 12 slots each and keep 8: 2 x 4 dropped per layer.
            assert r["dropped_slots"] == L * 2 * 4
        else:
            # Dropless: the slots whose expert lives on another EP rank go out, and every
            # other rank's slots for this rank's experts come in (the same table there).
            out_rows = sum(e not in mine for row in SKEWED for e in row)
            in_rows = (ep - 1) * sum(e in mine for row in SKEWED for e in row)
        if (world, ep) == (2, 2):  # by hand: rank 0 sends 8 rows, rank 1 sends 24
            assert (out_rows, in_rows) == ((8, 24) if me == 0 else (24, 8))
        calls = r["calls"]
        # Dispatch sends out_rows and combine sends back in_rows; backward reverses both.
        for direction in ("forward", "backward"):
            sent = _sent(calls, "dispatch", direction) + _sent(calls, "combine", direction)
            want = L * (out_rows + in_rows) * ROW_BYTES * (2 if recompute == "full" and
                                                           direction == "forward" else 1)
            assert sent == want, (direction, r["rank"])
        # Calls per step: per layer 2 forward + 2 backward, + 2 recomputed under full AC;
        # dropless adds one count exchange per forward (and recomputation).
        per_layer = {("dispatch", "forward", "forward"): 1, ("combine", "forward", "forward"): 1,
                     ("dispatch", "backward", "backward"): 1,
                     ("combine", "backward", "backward"): 1}
        if recompute == "full":
            per_layer |= {("dispatch", "forward", "backward"): 1,
                          ("combine", "forward", "backward"): 1}
        if not cf:
            per_layer[("counts", "forward", "forward")] = 1
            if recompute == "full":
                per_layer[("counts", "forward", "backward")] = 1
        got = Counter((c["kind"], c["direction"], c["phase"]) for c in calls)
        assert got == {key: L * n for key, n in per_layer.items()}
        token_calls = sum(n for (kind, _, _), n in got.items() if kind != "counts")
        assert token_calls == L * (4 + (2 if recompute == "full" else 0))
        # State per rank: experts (E / ep) x 3 f_e d x 4 bytes over world / ep FSDP ranks,
        # the rest sharded over the world (FSDP2's dim-0 chunks, padded).
        expert = 4 * L * shard_elems(_expert_shapes(local), n_edp)
        assert expert == 4 * L * local * 3 * F_E * D // n_edp
        dense = 4 * (L * shard_elems(DENSE_BLOCK, world) + shard_elems(DENSE_ROOT, world))
        assert r["param_bytes"] == {"expert": expert, "dense": dense}
        assert r["grad_bytes"] == r["param_bytes"]  # no padding at these sizes
        tensors = {"expert": 3 * L, "dense": len(DENSE_BLOCK) * L + len(DENSE_ROOT)}
        assert r["optimizer_bytes"] == {p: 2 * r["param_bytes"][p] + 4 * tensors[p]
                                        for p in tensors}
        assert r["peak_memory_bytes"] > sum(r["param_bytes"].values())
        assert len(r["step_times_s"]) == 1 and r["step_times_s"][0] > 0
        # Routing: every layer's forward saw the table's counts.
        assert r["tokens_per_expert"] == [[12, 12, 4, 4]] * L
    per_expert = [sum(r["tokens_per_expert"][0][e] for r in ranks) for e in range(E)]
    assert max(per_expert) / (sum(per_expert) / E) == 1.5
    per_ep_rank = [sum(per_expert[g * local:(g + 1) * local]) for g in range(ep)]
    assert max(per_ep_rank) / (sum(per_ep_rank) / ep) == 1.5


@pytest.mark.slow
@pytest.mark.parametrize(("world", "cfg"), [
    (2, MoeConfig(d_model=D, num_experts=E, top_k=K, expert_ffn=F_E, ep=2,
                  score_func="sigmoid")),
    (4, MoeConfig(d_model=D, num_experts=8, top_k=K, expert_ffn=F_E, shared_expert_ffn=F_S,
                  ep=4, capacity_factor=1.0)),
], ids=["w2-ep2-dropless", "w4-ep4-cf1-shared"])
def test_ep_layer_equals_the_layer_without_ep(world: int, cfg: MoeConfig) -> None:
    for r in run_ranks(moe_layer_vs_reference, (cfg, T), nproc=world, timeout_s=120):
        for key in ("output", "input_grad", "dense_grad", "expert_grad"):
            assert r[key] < 1e-5, (key, r)


@pytest.mark.slow
def test_ep_model_under_fsdp_equals_one_process() -> None:
    """World 4, ep 2: experts on dp_shard_mod_ep 2, gradients divided by 4."""
    job = EpJob(moe=MoeConfig(d_model=D, num_experts=E, top_k=K, expert_ffn=F_E,
                              shared_expert_ffn=F_S, ep=2), num_layers=L, vocab_size=V)
    for r in run_ranks(moe_model_vs_reference, job, nproc=4, timeout_s=120):
        assert r["loss"] < 1e-5 and r["grad"] < 1e-6 < r["grad_norm"], r


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"num_experts": 4, "ep": 3}, "moe.ep"),
    ({"num_experts": 4, "top_k": 5}, "moe.top_k"),
    ({"num_experts": 0}, "moe.num_experts"),
    ({"capacity_factor": -1.0}, "moe.capacity_factor"),
    ({"shared_expert_ffn": -8}, "moe.shared_expert_ffn"),
    ({"score_func": "relu"}, "moe.score_func"),
])
def test_bad_config_names_the_field(kwargs: dict[str, Any], field: str) -> None:
    args = {"d_model": D, "num_experts": E, "top_k": K, "expert_ffn": F_E} | kwargs
    with pytest.raises(ConfigError) as err:
        MoeConfig(**args)
    assert err.value.field == field


@pytest.mark.parametrize("routing", [SKEWED[:-1], ((0, 0),) * T, ((0, 4),) * T])
def test_bad_routing_table_names_the_field(routing: tuple[tuple[int, ...], ...]) -> None:
    with pytest.raises(ConfigError) as err:
        EpJob(moe=MoeConfig(d_model=D, num_experts=E, top_k=K, expert_ffn=F_E),
              routing=routing)
    assert err.value.field == "routing"
