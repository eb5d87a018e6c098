"""A minimal mixture-of-experts layer with expert parallelism (EP) over all-to-all, as
torchtitan runs it, and a tiny MoE decoder trained with it under FSDP2 on gloo.

Owns the MoE layer (torchtitan torchtitan/models/common/moe/moe.py: MoE,
TokenChoiceTopKRouter, GroupedExperts' for-loop path, TokenReorderer) and its EP
exchange (torchtitan/distributed/expert_parallel.py: ExpertParallel._token_dispatch and
_token_combine, utils._permute). A token's router scores (softmax or sigmoid of a bias-free
d -> E linear, in fp32) pick its top-k experts; the token-expert slots are sorted by
expert; dropless, each rank first exchanges its per-expert counts (an all_to_all_single
of E integers), then sends each EP rank the rows of that rank's E/ep experts (variable
split sizes), which it permutes from source-rank-major to expert-major order, runs
through its experts' SwiGLU (w1, w3: [E_local, f_e, d]; w2: [E_local, d, f_e]) and sends
back the same way; the slots are unsorted and summed weighted by their scores. With a
capacity factor cf every expert gets a buffer of C = ceil(cf * T * k / E) rows per source
rank (DeepSpeed-MoE, Rajbhandari et al. 2022; GShard's capacity, Lepikhin et al. 2020):
slots past C in token order are dropped (they add nothing but the residual), the buffers
travel with equal splits and no count exchange. An optional shared expert is a dense
SwiGLU of width shared_expert_ffn. The all-to-alls are an autograd function of this
module's (the backward sends the gradients back along the reversed splits, as
all_to_all_single_autograd does), so that every call, forward, backward or recomputed,
is logged with its split sizes (A2aLog). The layer takes plain ints (MoeConfig) so a
ModelSpec can build it later.

The model is the reference Llama decoder (zsim.backend.reference_model) with each block's
MLP replaced by a MoE layer. Ranks form torchtitan's mesh ("dp_shard_mod_ep", "ep"), EP
innermost: an EP group is ep consecutive ranks, and the experts are fully_shard-ed over
dp_shard_mod_ep (world / ep ranks) with their gradients divided by the world size
(torchtitan apply_fsdp: set_gradient_divide_factor; on gloo, which has no PREMUL_SUM,
with a SUM reduce-scatter and the division after it), every other parameter over the
whole world, block by block, then the root. Full recomputation wraps each block before
sharding. Everything is fp32. Imports torch.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import fully_shard

from zsim.backend.instruments import LiveMemory
from zsim.backend.reference_model import Transformer
from zsim.backend.runner import RankContext
from zsim.errors import ConfigError
from zsim.spec.model import ModelSpec

Routing = tuple[tuple[int, ...], ...]
"""A fixed routing table: row t holds the top_k distinct experts of token t of a rank's
micro-batch (tokens flattened batch-major), the same on every rank and in every layer."""


@dataclass(frozen=True, slots=True, kw_only=True)
class MoeConfig:
    """One MoE layer and its expert parallelism."""

    d_model: int
    """Hidden size d."""
    num_experts: int
    """Routed experts E."""
    top_k: int
    """Experts per token k."""
    expert_ffn: int
    """Each routed expert's SwiGLU width f_e."""
    shared_expert_ffn: int = 0
    """The shared expert's SwiGLU width; 0 means no shared expert."""
    ep: int = 1
    """EP degree: ranks the experts are split over (E / ep each); 1 means no EP."""
    capacity_factor: float = 0.0
    """cf: expert buffers of ceil(cf * T * k / E) rows per source rank, overflow dropped;
    0 means dropless (variable split sizes)."""
    score_func: Literal["softmax", "sigmoid"] = "softmax"
    """The router's score function (torchtitan TokenChoiceTopKRouter.score_func)."""

    def __post_init__(self) -> None:
        for name in ("d_model", "num_experts", "top_k", "expert_ffn", "ep"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"moe.{name}", value, "must be a positive integer")
        if self.shared_expert_ffn < 0:
            raise ConfigError("moe.shared_expert_ffn", self.shared_expert_ffn,
                              "must be >= 0 (0: no shared expert)")
        if self.top_k > self.num_experts:
            raise ConfigError("moe.top_k", self.top_k,
                              f"must be <= num_experts={self.num_experts}")
        if self.num_experts % self.ep:
            raise ConfigError("moe.ep", self.ep,
                              f"must divide num_experts={self.num_experts}")
        if not (self.capacity_factor == 0 or self.capacity_factor > 0):
            raise ConfigError("moe.capacity_factor", self.capacity_factor,
                              "must be > 0, or 0 for dropless")
        if self.score_func not in ("softmax", "sigmoid"):
            raise ConfigError("moe.score_func", self.score_func, "softmax or sigmoid")

    @property
    def local_experts(self) -> int:
        """Experts per EP rank, E / ep."""
        return self.num_experts // self.ep

    def capacity(self, tokens: int) -> int:
        """C = ceil(cf * T * k / E) rows per expert and source rank (dropless: 0)."""
        return math.ceil(self.capacity_factor * tokens * self.top_k / self.num_experts)


# ---------------------------------------------------------------------- the log
@dataclass(frozen=True, slots=True, kw_only=True)
class A2aCall:
    """One all_to_all_single this rank made."""

    layer: int
    kind: Literal["counts", "dispatch", "combine"]
    """What moved: the per-expert token counts, the tokens out, or their outputs back."""
    direction: Literal["forward", "backward"]
    """The autograd direction: the layer's forward (also when recomputed) or backward."""
    phase: str
    """The step's phase when it ran (A2aLog.phase): "forward", "backward" (where a
    forward-direction call is a recomputation) or "reference"."""
    send_rows: tuple[int, ...]
    """Rows sent to each EP rank of the group, by group rank (own rank included)."""
    row_bytes: int
    """Bytes per row: d x element bytes for tokens, 8 for an int64 count."""
    own: int
    """This rank's rank in its EP group."""

    @property
    def sent_bytes(self) -> int:
        """Bytes sent to the other ranks of the group."""
        return (sum(self.send_rows) - self.send_rows[self.own]) * self.row_bytes

    @property
    def kept_bytes(self) -> int:
        """Bytes this rank "sends" to itself (a local copy)."""
        return self.send_rows[self.own] * self.row_bytes


@dataclass(slots=True)
class A2aLog:
    """The all-to-all calls and routing of one rank, appended to as the model runs."""

    phase: str = "forward"
    """Set by the step around its phases; stamped on every call."""
    calls: list[A2aCall] = field(default_factory=list)
    tokens_per_expert: list[list[int]] = field(default_factory=list)
    """Per layer forward (not recomputation): this rank's slots routed to each expert."""
    dropped_slots: int = 0
    """Token-expert slots over capacity, over the logged forwards."""

    def clear(self) -> None:
        self.calls.clear()
        self.tokens_per_expert.clear()
        self.dropped_slots = 0


class _AllToAll(torch.autograd.Function):
    """all_to_all_single of rows with given split sizes; the backward sends the gradient
    back along the reversed splits (torch's all_to_all_single_autograd, logged)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, out_splits: list[int], in_splits: list[int],
                group: dist.ProcessGroup, log: A2aLog, tag: tuple[int, str]) -> torch.Tensor:
        ctx.splits, ctx.group, ctx.log, ctx.tag = (out_splits, in_splits), group, log, tag
        return _exchange(x, out_splits, in_splits, group, log, tag, "forward")

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        out_splits, in_splits = ctx.splits
        back = _exchange(grad, in_splits, out_splits, ctx.group, ctx.log, ctx.tag, "backward")
        return back, None, None, None, None, None


def _exchange(x: torch.Tensor, out_splits: list[int], in_splits: list[int],
              group: dist.ProcessGroup, log: A2aLog, tag: tuple[int, str],
              direction: Literal["forward", "backward"]) -> torch.Tensor:
    out = x.new_empty((sum(out_splits), *x.shape[1:]))
    dist.all_to_all_single(out, x.contiguous(), out_splits, in_splits, group=group)
    log.calls.append(A2aCall(
        layer=tag[0], kind=tag[1], direction=direction, phase=log.phase,  # type: ignore[arg-type]
        send_rows=tuple(in_splits), row_bytes=math.prod(x.shape[1:]) * x.element_size(),
        own=dist.get_rank(group)))
    return out


# ---------------------------------------------------------------------- the layer
class GroupedExperts(nn.Module):
    """This rank's routed experts as grouped weights (torchtitan GroupedExperts, its
    for-loop path: one SwiGLU per expert over its contiguous rows)."""

    def __init__(self, num_experts: int, d: int, f: int) -> None:
        super().__init__()
        self.w1 = nn.Parameter(torch.empty(num_experts, f, d))
        self.w2 = nn.Parameter(torch.empty(num_experts, d, f))
        self.w3 = nn.Parameter(torch.empty(num_experts, f, d))

    def forward(self, x: torch.Tensor, rows: list[int]) -> torch.Tensor:
        outs = []
        for e, xe in enumerate(torch.split(x, rows)):
            h = F.silu(xe @ self.w1[e].t()) * (xe @ self.w3[e].t())
            outs.append(h @ self.w2[e].t())
        return torch.cat(outs)


class SwiGLU(nn.Module):
    """A dense SwiGLU MLP (the shared expert)."""

    def __init__(self, d: int, f: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(d, f, bias=False)
        self.w2 = nn.Linear(f, d, bias=False)
        self.w3 = nn.Linear(d, f, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class MoE(nn.Module):
    """Router, this rank's routed experts, the optional shared expert, and the EP
    exchange (see the module docstring). With ep 1 no collective runs: the reference.

    Args:
        cfg: the layer.
        layer: its index (for the log).
        group: the EP process group (None when cfg.ep is 1).
        log: where every all-to-all and the routing are recorded.
        routing: a fixed routing table (None: the router's top-k).
    """

    def __init__(self, cfg: MoeConfig, *, layer: int, group: dist.ProcessGroup | None,
                 log: A2aLog, routing: Routing | None = None) -> None:
        super().__init__()
        if (cfg.ep > 1) != (group is not None):
            raise ConfigError("moe.ep", cfg.ep, "an EP group is needed exactly when ep > 1")
        self.cfg, self.layer, self.group, self.log = cfg, layer, group, log
        self.routing = None if routing is None else torch.tensor(routing, dtype=torch.long)
        self.gate = nn.Linear(cfg.d_model, cfg.num_experts, bias=False)
        self.experts = GroupedExperts(cfg.local_experts, cfg.d_model, cfg.expert_ffn)
        self.shared = (SwiGLU(cfg.d_model, cfg.shared_expert_ffn)
                       if cfg.shared_expert_ffn else None)

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(top_scores [T, k], experts [T, k]): the scores of the chosen experts, gathered
        from the router's (so a fixed table still trains the router, as torchtitan's
        _debug_force_load_balance)."""
        logits = self.gate(x.float())
        scores = logits.softmax(-1) if self.cfg.score_func == "softmax" else logits.sigmoid()
        if self.routing is None:
            chosen = scores.topk(self.cfg.top_k, dim=-1).indices
        else:
            if self.routing.shape[0] != x.shape[0]:
                raise ConfigError("routing", f"{self.routing.shape[0]} rows",
                                  f"must have one row per token of a rank ({x.shape[0]})")
            chosen = self.routing.to(x.device)
        return scores.gather(1, chosen), chosen

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        top_scores, chosen = self.route(x)
        k, n_e = self.cfg.top_k, self.cfg.num_experts
        flat = chosen.reshape(-1)
        order = torch.argsort(flat, stable=True)  # slots sorted by expert
        counts = torch.bincount(flat, minlength=n_e)
        if self.log.phase != "backward":  # not a recomputation
            self.log.tokens_per_expert.append(counts.tolist())
        routed = x[order // k]
        if self.cfg.capacity_factor:
            out_sorted = self._capacity(routed, flat[order], counts)
        else:
            out_sorted = self._dropless(routed, counts)
        slots = out_sorted[torch.argsort(order)].view(-1, k, shape[-1])
        out = (slots * top_scores.unsqueeze(-1).to(slots.dtype)).sum(1)
        if self.shared is not None:
            out = out + self.shared(x)
        return out.view(shape)

    def _a2a(self, x: torch.Tensor, out_splits: list[int], in_splits: list[int],
             kind: str) -> torch.Tensor:
        if self.group is None:
            return x
        return _AllToAll.apply(x, out_splits, in_splits, self.group, self.log,
                               (self.layer, kind))

    def _dropless(self, routed: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """Variable splits: counts exchanged first, then the rows (ExpertParallel)."""
        ep, local = self.cfg.ep, self.cfg.local_experts
        if self.group is None:
            received = counts.view(1, local)
        else:
            # Each rank's counts for every rank's experts, [ep, E_local] from each source.
            recv = _exchange(counts, [local] * ep, [local] * ep, self.group, self.log,
                             (self.layer, "counts"), "forward")
            received = recv.view(ep, local)
        in_splits = counts.view(ep, local).sum(1).tolist()
        out_splits = received.sum(1).tolist()
        rows = self._a2a(routed, out_splits, in_splits, "dispatch")
        perm = _expert_major(received)
        y = self.experts(rows[perm], received.sum(0).tolist())
        back = y[torch.argsort(perm)]
        return self._a2a(back, in_splits, out_splits, "combine")

    def _capacity(self, routed: torch.Tensor, experts_sorted: torch.Tensor,
                  counts: torch.Tensor) -> torch.Tensor:
        """Equal splits: each expert's first C slots in a buffer of C rows, the rest
        dropped (DeepSpeed-MoE's capacity)."""
        ep, local, n_e = self.cfg.ep, self.cfg.local_experts, self.cfg.num_experts
        cap = self.cfg.capacity(routed.shape[0] // self.cfg.top_k)
        starts = torch.cumsum(counts, 0) - counts
        pos = torch.arange(routed.shape[0], device=routed.device) - starts[experts_sorted]
        keep = pos < cap
        if self.log.phase != "backward":
            self.log.dropped_slots += int((~keep).sum())
        dest = experts_sorted * cap + pos
        buf = routed.new_zeros(n_e * cap, routed.shape[1]).index_copy(
            0, dest[keep], routed[keep])
        splits = [local * cap] * ep
        rows = self._a2a(buf, splits, splits, "dispatch")
        d = routed.shape[1]
        by_expert = rows.view(ep, local, cap, d).transpose(0, 1).reshape(-1, d)
        y = self.experts(by_expert, [ep * cap] * local)
        back = y.view(local, ep, cap, d).transpose(0, 1).reshape(-1, d)
        combined = self._a2a(back, splits, splits, "combine")
        return combined[dest.clamp(max=n_e * cap - 1)] * keep.unsqueeze(1).to(combined.dtype)


def _expert_major(received: torch.Tensor) -> torch.Tensor:
    """Row indices that reorder rows received source-rank-major ([ep, E_local] counts:
    source 0's rows for expert 0, 1, ..., then source 1's) into expert-major order
    (torchtitan utils._generate_permute_indices, without padding)."""
    ep, local = received.shape
    starts = (torch.cumsum(received.reshape(-1), 0) - received.reshape(-1)).view(ep, local)
    return torch.cat([torch.arange(int(starts[r, e]), int(starts[r, e] + received[r, e]))
                      for e in range(local) for r in range(ep)]).long()


# ---------------------------------------------------------------------- the model
LEARNING_RATE = 1e-4
"""AdamW learning rate; any small value, the step's cost does not depend on it."""


@dataclass(frozen=True, slots=True, kw_only=True)
class EpJob:
    """A tiny MoE decoder trained with expert parallelism, and what to run of it."""

    moe: MoeConfig
    """Every block's MoE layer (moe.d_model is the model's)."""
    num_layers: int = 2
    num_heads: int = 2
    vocab_size: int = 64
    seq_len: int = 8
    micro_batch: int = 2
    recompute: Literal["none", "full"] = "none"
    """Full recomputation of every block (torch.utils.checkpoint), or none."""
    routing: Routing | None = None
    """A fixed routing table (None: the router's own top-k)."""
    steps: int = 2
    """Timed steps, after the warm-up step and the measured one."""

    def __post_init__(self) -> None:
        for name in ("num_layers", "num_heads", "vocab_size", "seq_len", "micro_batch"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(name, value, "must be a positive integer")
        if self.steps < 0:
            raise ConfigError("steps", self.steps, "must be >= 0")
        if self.recompute not in ("none", "full"):
            raise ConfigError("recompute", self.recompute, "none or full")
        if self.moe.d_model % self.num_heads:
            raise ConfigError("num_heads", self.num_heads,
                              f"must divide moe.d_model={self.moe.d_model}")
        if self.routing is not None:
            check_routing(self.routing, self.tokens, self.moe)

    @property
    def tokens(self) -> int:
        """Tokens per rank and step, T = micro_batch x seq_len."""
        return self.micro_batch * self.seq_len

    def spec(self) -> ModelSpec:
        """The dense part as a reference-model spec (its MLP width unused: replaced)."""
        return ModelSpec(name="moe-tiny", num_layers=self.num_layers,
                         d_model=self.moe.d_model, num_heads=self.num_heads,
                         num_kv_heads=self.num_heads, ffn_hidden=self.moe.expert_ffn,
                         vocab_size=self.vocab_size, max_seq_len=self.seq_len,
                         norm_kernel="composite")


def check_routing(routing: Routing, tokens: int, moe: MoeConfig) -> None:
    """A routing table has one row per token of k distinct experts in [0, E).

    Raises:
        ConfigError: it does not.
    """
    if len(routing) != tokens:
        raise ConfigError("routing", f"{len(routing)} rows",
                          f"must have one row per token of a rank ({tokens})")
    for row in routing:
        if (len(row) != moe.top_k or len(set(row)) != moe.top_k
                or not all(0 <= e < moe.num_experts for e in row)):
            raise ConfigError("routing", row, f"each row: {moe.top_k} distinct experts "
                                              f"in [0, {moe.num_experts})")


def skewed_routing(tokens: int, moe: MoeConfig, hot_share: float) -> Routing:
    """A table sending the first round(hot_share x tokens) tokens to experts 0..k-1 and
    the rest round-robin over all experts (torchtitan's _debug_force_load_balance order:
    slot j of token t to expert (t k + j) mod E); hot_share 0 is the balanced table."""
    hot = round(hot_share * tokens)
    k, n_e = moe.top_k, moe.num_experts
    return tuple(tuple(range(k)) if t < hot else tuple((t * k + j) % n_e for j in range(k))
                 for t in range(tokens))


def ep_mesh(world_size: int, ep: int, device: str = "cpu") -> DeviceMesh:
    """torchtitan's ("dp_shard_mod_ep", "ep") mesh: EP groups of ep consecutive ranks.

    Raises:
        ConfigError: ep does not divide the world size.
    """
    if world_size % ep:
        raise ConfigError("moe.ep", ep, f"must divide the world size ({world_size})")
    return init_device_mesh(device.split(":")[0], (world_size // ep, ep),
                            mesh_dim_names=("dp_shard_mod_ep", "ep"))


def build_model(job: EpJob, *, group: dist.ProcessGroup | None, ep_rank: int,
                log: A2aLog) -> Transformer:
    """The reference decoder with MoE layers, on the CPU, initialised the same on every
    rank (dense weights N(0, 0.02) from seed 0; each layer's experts drawn whole from their
    own seed, this EP rank's E/ep of them kept), so that an ep-1 build on one process is
    the same model."""
    torch.manual_seed(0)
    model = Transformer(job.spec())
    cfg = job.moe
    for i, block in enumerate(model.layers):
        block.feed_forward = MoE(cfg, layer=i, group=group, log=log, routing=job.routing)
    model.init_weights()
    mine = slice(ep_rank * cfg.local_experts, (ep_rank + 1) * cfg.local_experts)
    with torch.no_grad():
        for i, block in enumerate(model.layers):
            g = torch.Generator().manual_seed(1_000 + i)
            for name in ("w1", "w2", "w3"):
                w = getattr(block.feed_forward.experts, name)
                whole = torch.randn((cfg.num_experts, *w.shape[1:]), generator=g) * 0.02
                w.copy_(whole[mine])
    return model


def parallelize(model: Transformer, job: EpJob, mesh: DeviceMesh) -> None:
    """Recompute and fully_shard as torchtitan's apply_ac and apply_fsdp with EP: each
    layer's experts over dp_shard_mod_ep, gradients divided by the world size; each block
    over the whole world (its experts left to their own unit); the root last, not
    resharded after forward."""
    world = mesh.size()
    dp = mesh["dp_shard_mod_ep", "ep"]._flatten("dp")
    for i, block in enumerate(model.layers):
        experts = fully_shard(block.feed_forward.experts, mesh=mesh["dp_shard_mod_ep"])
        experts.set_gradient_divide_factor(world)
        # Gloo has no PREMUL_SUM, FSDP2's op for a factor other than the group's size:
        # a SUM reduce-scatter, then the division.
        experts.set_force_sum_reduction_for_comms(True)
        if job.recompute == "full":
            model.layers[i] = checkpoint_wrapper(block, preserve_rng_state=False)
        fully_shard(model.layers[i], mesh=dp)
    fully_shard(model, mesh=dp, reshard_after_forward=False)


def batch(job: EpJob, rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Random tokens and labels of one rank and step, seeded by both."""
    g = torch.Generator().manual_seed(1_000_003 * step + rank)
    tokens = torch.randint(0, job.vocab_size, (job.micro_batch, job.seq_len + 1), generator=g)
    return tokens[:, :-1].clone(), tokens[:, 1:].clone()


def _bytes_by_part(named: Sequence[tuple[str, torch.Tensor]], *,
                   storage: bool) -> dict[str, int]:
    """Bytes of local tensors split into "expert" and "dense" by name (a DTensor by its
    local shard; `storage`: the padded storage FSDP2 allocates, else the real elements)."""
    out = {"expert": 0, "dense": 0}
    for name, t in named:
        local = t.to_local() if hasattr(t, "to_local") else t
        size = (local.untyped_storage().nbytes() if storage
                else local.numel() * local.element_size())
        out["expert" if ".experts." in name else "dense"] += size
    return out


def measure_rank(ctx: RankContext, job: EpJob) -> dict[str, Any]:
    """On one rank: build, parallelize, one warm-up step, one step measured (live memory
    peak, state bytes by part, every all-to-all and the routing), then `job.steps` timed
    steps.

    Returns:
        A plain dict: "rank", "ep_rank", "loss" (the measured step's), "calls" (A2aCall
        fields, as dicts), "tokens_per_expert" (per layer), "dropped_slots",
        "param_bytes", "grad_bytes", "optimizer_bytes" (each {"expert", "dense"}),
        "peak_memory_bytes", "step_times_s".
    """
    mesh = ep_mesh(ctx.world_size, job.moe.ep, ctx.device)
    ep_rank = mesh.get_local_rank("ep")
    log = A2aLog()
    tracker = LiveMemory()
    with tracker:
        model = build_model(job, group=mesh["ep"].get_group() if job.moe.ep > 1 else None,
                            ep_rank=ep_rank, log=log)
        parallelize(model, job, mesh)
        optimizer = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE, foreach=True)
        _step(model, optimizer, batch(job, ctx.rank, 0), log)
        log.clear()
        tracker.reset_peak()
        tokens, labels = batch(job, ctx.rank, 1)
        log.phase = "forward"
        loss = model(tokens, labels)
        log.phase = "backward"
        loss.backward()
        named = list(model.named_parameters())
        grads = _bytes_by_part([(n, p.grad) for n, p in named if p.grad is not None],
                               storage=False)
        log.phase = "optimizer"
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        peak = tracker.peak_bytes
    names = {id(p): n for n, p in named}
    state = [(names[id(p)], t) for p, s in optimizer.state.items() for t in s.values()]
    out = {"rank": ctx.rank, "ep_rank": ep_rank, "loss": float(loss.detach()),
           "calls": [_call_dict(c) for c in log.calls],
           "tokens_per_expert": [list(c) for c in log.tokens_per_expert],
           "dropped_slots": log.dropped_slots,
           "param_bytes": _bytes_by_part(named, storage=True), "grad_bytes": grads,
           "optimizer_bytes": _bytes_by_part(state, storage=False),
           "peak_memory_bytes": peak}
    times = []
    for step in range(job.steps):
        dist.barrier()
        start = time.perf_counter()
        _step(model, optimizer, batch(job, ctx.rank, 2 + step), log)
        times.append(time.perf_counter() - start)
    out["step_times_s"] = times
    return out


def _call_dict(c: A2aCall) -> dict[str, Any]:
    return {"layer": c.layer, "kind": c.kind, "direction": c.direction, "phase": c.phase,
            "send_rows": list(c.send_rows), "row_bytes": c.row_bytes, "own": c.own}


def _step(model: nn.Module, optimizer: torch.optim.Optimizer,
          data: tuple[torch.Tensor, torch.Tensor], log: A2aLog) -> None:
    log.phase = "forward"
    loss = model(*data)
    log.phase = "backward"
    loss.backward()
    log.phase = "optimizer"
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    log.clear()


def median_step_s(result: dict[str, Any]) -> float:
    """A rank's median timed step, seconds (NaN without timed steps)."""
    times = result["step_times_s"]
    return statistics.median(times) if times else math.nan
