"""Real gloo runs of tensor parallelism (zsim.backend.tensor_parallel): TP alone on 2
ranks (with and without sequence parallelism) and FSDP2 x TP on a 2 x 2 mesh of 4 ranks.
Model state, optimizer state and saved activations per rank against closed forms worked
out here from the model's shapes: which weights torchtitan's plan shards, on which dim."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

pytest.importorskip("torch")

from _runs import RealRuns

from zsim.backend.measured_step import PlanMeasurement, measure_plan
from zsim.backend.runner import RankContext, run_ranks
from zsim.backend.tensor_parallel import check_plan
from zsim.errors import ConfigError
from zsim.simulate import simulate
from zsim.spec.model import ModelSpec
from zsim.spec.plan import Plan
from zsim.spec.registry import resolve_hardware

TINY = ModelSpec(name="tiny", num_layers=2, d_model=128, num_heads=4, num_kv_heads=2,
                 ffn_hidden=344, vocab_size=500, max_seq_len=64, norm_kernel="composite")
"""The kernel knob as validate_plan() sets it on CPU (the real run does not read it), so the
TP run is test_validate's too."""
B, S, TP = 2, 48, 2
ROPE_BYTES = 2 * TINY.max_seq_len * TINY.head_dim * 4
"""The fp32 cos and sin tables, buffers of the root (whole on every rank)."""
BOOKKEEPING_BYTES = 64
"""Scalars beyond parameters and buffers at rest (DTensor's RNG state)."""
N_TENSORS = 2 * 9 + 3
"""Parameters: 4 attention projections, 3 MLP weights, 2 norms per block; embeddings,
final norm, output."""


def _local_shapes(spec: ModelSpec, tp: int) -> list[tuple[int, ...]]:
    """Each parameter's shape on one rank of a TP group under torchtitan's Llama plan: a
    ColwiseParallel weight (out, in) keeps out/tp rows, a RowwiseParallel weight in/tp
    columns; the embedding (RowwiseParallel on an nn.Embedding) keeps vocab/tp rows; the
    output (ColwiseParallel) vocab/tp rows; norms are whole."""
    d, kv, f, v = spec.d_model, spec.kv_dim, spec.ffn_hidden, spec.vocab_size
    block = [(d // tp, d), (kv // tp, d), (kv // tp, d), (d, d // tp),  # wq wk wv wo
             (f // tp, d), (f // tp, d), (d, f // tp),                 # w1 w3 w2
             (d,), (d,)]                                               # two norms
    return block * spec.num_layers + [(v // tp, d), (d,), (v // tp, d)]


def _fsdp_numel(shape: tuple[int, ...], dp: int) -> int:
    """Elements of the storage of one FSDP2 shard of a tensor of `shape`: dim 0 split in
    ceil(n/dp) rows on every rank (fully_shard pads dim 0 to a multiple of dp)."""
    return -(-shape[0] // dp) * math.prod(shape[1:])


def _fsdp_real_numel(shape: tuple[int, ...], dp: int, dp_rank: int) -> int:
    """Elements of the shard itself, without the padding: the rows of dim 0 that fall on
    `dp_rank` (what the sharded parameter's local tensor, and so AdamW's state, holds)."""
    rows = -(-shape[0] // dp)
    return max(0, min(rows, shape[0] - dp_rank * rows)) * math.prod(shape[1:])


def _block_saved_bf16(spec: ModelSpec, b: int, s: int, tp: int) -> int:
    """What one block saves on one TP rank with bf16 parameters (FSDP2's mixed precision)
    on CPU, op by op. Each composite RMSNorm (whole, replicated) keeps its fp32 input
    copy, the fp32 rstd, the fp32 normalised input and its bf16 output (the projections'
    input), over the whole sequence. Attention keeps q, k (after RoPE), v and the output
    of its heads/tp heads and the fp32 log-sum-exp per head and token; SwiGLU keeps
    w1 x, w3 x, silu(w1 x) and their product, f/tp wide."""
    d, kv, f, h = spec.d_model, spec.kv_dim, spec.ffn_hidden, spec.num_heads
    norm = 4 * b * s * d + 4 * b * s + 4 * b * s * d + 2 * b * s * d
    attention = (2 * b * s * d + 2 * 2 * b * s * kv + 2 * b * s * d) // tp + 4 * b * h * s // tp
    mlp = 4 * 2 * b * s * f // tp
    return 2 * norm + attention + mlp


def _block_saved_autocast(spec: ModelSpec, b: int, s: int, tp: int, *, sp: bool) -> int:
    """What one block saves on one TP rank with fp32 parameters under bf16 autocast (TP
    without FSDP): autocast keeps a bf16 copy of each local weight and of each linear's
    input (wq, wk, wv and w1, w3 cast the norm's fp32 output, or with SP its all-gather,
    separately: whole sequence); each composite RMSNorm keeps the fp32 residual stream,
    the fp32 rstd and the fp32 normalised input over its tokens (s/tp with SP);
    attention and SwiGLU as with bf16 parameters, over 1/tp."""
    d, kv, f, h = spec.d_model, spec.kv_dim, spec.ffn_hidden, spec.num_heads
    weights = 2 * (2 * d * d + 2 * d * kv + 3 * d * f) // tp
    tokens = b * s // tp if sp else b * s
    norm = 4 * tokens * d + 4 * tokens + 4 * tokens * d
    casts = 5 * 2 * b * s * d
    attention = (2 * b * s * d + 2 * 2 * b * s * kv + 2 * b * s * d) // tp + 4 * b * h * s // tp
    mlp = 4 * 2 * b * s * f // tp
    return weights + 2 * norm + casts + attention + mlp


def _check_common(m: PlanMeasurement, *, param_bytes: int, moment_bytes: list[int],
                  autocast: bool) -> None:
    """Finite losses equal within each TP group (one data shard per group), model state
    at rest = parameters + RoPE tables, AdamW adds two fp32 moments (`moment_bytes` per
    rank each) and a step per tensor; `autocast`: fp32 parameters under bf16 autocast
    (TP without FSDP)."""
    tp = m.plan.tp
    for group in range(len(m.ranks) // tp):
        losses = {m.ranks[group * tp + i].loss for i in range(tp)}
        assert len(losses) == 1 and all(math.isfinite(x) for x in losses)
    for r in m.ranks:
        assert 0 <= r.memory.after_init_bytes - (param_bytes + ROPE_BYTES) <= BOOKKEEPING_BYTES
        assert r.memory.after_first_step_bytes - r.memory.after_init_bytes == \
            2 * moment_bytes[r.rank] + 4 * N_TENSORS
        assert r.memory.peak_bytes > r.memory.after_first_step_bytes
    # The rotary tables are saved first inside layers.0: cast once per step to bf16 (S
    # rows), or under autocast (an fp32 residual stream) the fp32 buffers themselves.
    rope_saved = ROPE_BYTES if autocast else 2 * S * TINY.head_dim * 2
    assert m.saved_block_bytes("layers.0") - m.saved_block_bytes("layers.1") == rope_saved


@pytest.mark.slow
def test_tp2_shards_the_projections_and_saves_a_tp_slice_of_attention_and_mlp(
        real_runs: RealRuns) -> None:
    plan = Plan(strategy="ddp", dp_shard=1, tp=TP, seq_len=S, micro_batch=B)
    m = real_runs.measure(TINY, plan, nproc=TP, steps=1)
    param_bytes = 4 * sum(math.prod(s) for s in _local_shapes(TINY, TP))
    _check_common(m, param_bytes=param_bytes, moment_bytes=[param_bytes] * TP,
                  autocast=True)
    assert m.saved_block_bytes("layers.1") == _block_saved_autocast(TINY, B, S, TP, sp=False)
    # Row-wise outputs and the embedding lookup all-reduce; the logits all-gather.
    assert set(m.ranks[0].collective_busy_s) == {"all_reduce", "all_gather"}
    assert m.step_time_s > 0
    # The calls the simulator lowers are the calls the program made: per block 2
    # all-reduces forward (wo, w2) and 2 backward (one per module input its column-wise
    # projections share), the embedding's forward and the output's input gradient, and
    # the logits' all-gather: 4 x 2 + 2 and 1.
    sim = simulate(TINY, resolve_hardware("local-cpu"), plan).collective_calls
    assert sim == {"all_reduce": 4 * TINY.num_layers + 2, "all_gather": 1}
    assert all(r.collective_calls == sim for r in m.ranks)


@pytest.mark.slow
def test_tp2_with_sequence_parallelism_shards_the_norms_on_the_sequence() -> None:
    plan = Plan(strategy="ddp", dp_shard=1, tp=TP, sp=True, seq_len=S, micro_batch=B)
    m = measure_plan(TINY, plan, nproc=TP, steps=0, warmup_steps=0)  # memory steps only
    param_bytes = 4 * sum(math.prod(s) for s in _local_shapes(TINY, TP))
    _check_common(m, param_bytes=param_bytes, moment_bytes=[param_bytes] * TP,
                  autocast=True)
    assert m.saved_block_bytes("layers.1") == _block_saved_autocast(TINY, B, S, TP, sp=True)


@pytest.mark.slow
def test_fsdp2_x_tp2_on_a_2d_mesh_halves_the_tp_shards_again() -> None:
    # An MLP 346 wide: each TP rank's w1 and w3 have 173 rows, which fully_shard pads
    # to 2 x 87 over the dp axis.
    spec = replace(TINY, ffn_hidden=346)
    plan = Plan(strategy="fsdp", dp_shard=2, tp=TP, seq_len=S, micro_batch=B)
    m = measure_plan(spec, plan, nproc=4, steps=0, warmup_steps=0)  # memory steps only
    shapes = _local_shapes(spec, TP)
    param_bytes = 4 * sum(_fsdp_numel(s, 2) for s in shapes)
    # Mesh (dp, tp): ranks 0, 1 are dp rank 0, ranks 2, 3 dp rank 1, which holds 86 real
    # rows of w1 and w3 and a padding row its optimizer state does not mirror.
    moments = [4 * sum(_fsdp_real_numel(s, 2, rank // TP) for s in shapes)
               for rank in range(4)]
    assert moments[0] == param_bytes > moments[2]
    _check_common(m, param_bytes=param_bytes, moment_bytes=moments, autocast=False)
    # The two data-parallel groups (ranks 0-1 and 2-3) train on different data.
    assert m.ranks[0].loss != m.ranks[2].loss
    assert m.saved_block_bytes("layers.1") == _block_saved_bf16(spec, B, S, TP)


@pytest.mark.parametrize(("plan", "field"), [
    (Plan(strategy="ddp", dp_shard=1, tp=3, seq_len=S), "plan.tp"),
    (Plan(strategy="ddp", dp_shard=1, dp_replicate=2, tp=2, seq_len=S), "plan.dp_replicate"),
    (Plan(strategy="zero3", dp_shard=2, tp=2, seq_len=S), "plan.strategy"),
    (Plan(strategy="fsdp", dp_shard=2, tp=2, pp=2, seq_len=S), "plan.pp"),
])
def test_check_plan_names_the_field(plan: Plan, field: str) -> None:
    with pytest.raises(ConfigError) as err:
        check_plan(plan, plan.world_size, TINY)
    assert err.value.field == field


_FUNCTIONAL = {"all_reduce": "all_reduce", "all_gather_into_tensor": "all_gather",
               "reduce_scatter_tensor": "reduce_scatter"}
"""DTensor's functional collectives (_c10d_functional::<op>) and the kinds they are."""
_ELEMENT_BYTES = {"float": 4, "c10::BFloat16": 2}


def _tp_calls(ctx: RankContext, plan: Plan) -> list[tuple[str, int]]:
    """(kind, bytes of the whole tensor) of each collective DTensor issues in the forward
    and backward of one step (after one step untimed), from the profiler's input shapes
    and dtypes: an all-gather's input is one rank's shard, so it counts tp times. The
    optimizer step is left out: with SP, AdamW's foreach ops all-reduce each norm
    weight's partial gradient every time they read it (3 calls a weight), which the
    simulator does not lower."""
    from torch.profiler import ProfilerActivity, profile

    from zsim.backend import programs, training

    prep = programs.prepare(TINY, plan, device=ctx.device, world_size=ctx.world_size)
    micro = training.batches(TINY, plan, device=ctx.device,
                             rank=training.data_rank(plan, ctx.rank), step=0)
    training.train_step(prep, micro)
    ((tokens, labels),) = micro
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        training.forward_backward(prep, tokens, labels, last=True)
    prep.step()
    out = []
    for event in prof.events():
        kind = _FUNCTIONAL.get(event.name.removeprefix("_c10d_functional::"))
        if kind is None or not event.name.startswith("_c10d_functional::"):
            continue
        nbytes = math.prod(event.input_shapes[0]) * _ELEMENT_BYTES[event.input_dtypes[0]]
        out.append((kind, nbytes * (plan.tp if kind == "all_gather" else 1)))
    return out


@pytest.mark.slow
@pytest.mark.parametrize("sp", [False, True], ids=["tp2", "tp2-sp"])
def test_tp_collectives_move_the_dtypes_the_simulator_gives_them(sp: bool) -> None:
    """Each TP collective of a real step, by kind and bytes, is one the simulator lowers.
    Under autocast the residual stream stays fp32: the embedding's output and every
    input gradient (and with SP the norms' outputs gathered) move in fp32, the row-wise
    projections' outputs and the logits in bf16."""
    from collections import Counter

    from zsim.schedule.lower import lower

    plan = Plan(strategy="ddp", dp_shard=1, tp=TP, sp=sp, seq_len=S, micro_batch=B)
    real = run_ranks(_tp_calls, plan, nproc=TP)
    ops = lower(TINY, resolve_hardware("local-cpu"), plan).ops
    sim = Counter((op.kind, int(op.size_bytes)) for op in ops if op.group == "tp")
    assert {nbytes for _, nbytes in sim} == (
        {B * S * TINY.d_model * 4, B * S * TINY.d_model * 2, B * S * TINY.vocab_size * 2})
    assert all(Counter(calls) == sim for calls in real), (real[0], sim)
