"""MoeSpec and MlaSpec: the mixture-of-experts feed-forward and multi-head latent attention
of a ModelSpec's blocks, with their single-field checks.

Owns the description of the two block variants that are not the dense Llama block;
ModelSpec (zsim.spec.model) turns them into tensors, matmuls and closed-form counts.
Imports only zsim.errors and zsim.spec.strict.

References:
- Mixtral: Jiang et al. 2024, "Mixtral of Experts", Sec. 2 (8 experts, top-2, every layer).
- DeepSeekMoE (fine-grained and shared experts): Dai et al. 2024; DeepSeek-V3: DeepSeek-AI
  2024, "DeepSeek-V3 Technical Report", Sec. 2.1 (MLA, 256 routed + 1 shared expert,
  top-8, the first 3 layers dense) and its Table of 671B total / 37B activated parameters.
- Qwen1.5-MoE-A2.7B: Qwen team 2024 (60 experts, top-4, a shared expert with a sigmoid
  gate).
- torchtitan's MoE (torchtitan/models/moe): a router linear (d -> experts), GroupedExperts
  holding each projection of all its experts as one [experts, ...] tensor, shared experts
  as one MLP of their summed width.
"""

from __future__ import annotations

from dataclasses import dataclass

from zsim.errors import ConfigError
from zsim.spec.strict import check_keys


def _positive(where: str, value: object, *, zero: bool = False) -> None:
    ok = isinstance(value, int) and not isinstance(value, bool) and (value >= 0 if zero
                                                                     else value > 0)
    if not ok:
        raise ConfigError(where, value, "must be an integer >= 0" if zero
                          else "must be a positive integer")


@dataclass(frozen=True, slots=True, kw_only=True)
class MoeSpec:
    """The routed-expert feed-forward of a model's MoE layers."""

    experts: int
    """Routed experts per MoE layer (the whole model's, whatever `ep`)."""
    top_k: int
    """Routed experts each token is sent to."""
    expert_ffn_hidden: int
    """Inner width of one routed expert (SwiGLU: w1 and w3 up, w2 down)."""
    shared_ffn_hidden: int = 0
    """Summed inner width of the shared experts every token also passes through
    (DeepSeek: n_shared_experts x moe_intermediate_size; Qwen2-MoE:
    shared_expert_intermediate_size); 0 for none."""
    shared_expert_gate: bool = False
    """A sigmoid gate (a d -> 1 linear) scales the shared expert's output (Qwen2-MoE)."""
    router_bias: bool = False
    """The router carries one bias per expert used for selection only (DeepSeek-V3's
    auxiliary-loss-free e_score_correction_bias, a parameter of the checkpoint)."""
    dense_layers: int = 0
    """The first layers keep a dense MLP of the model's ffn_hidden (DeepSeek-V3's
    first_k_dense_replace); the others are MoE layers."""
    ep: int = 1
    """Expert-parallel degree this spec is one rank's share of (ModelSpec.ep_share): the
    rank holds experts / ep of them; 1 means all."""
    token_shard: int = 1
    """The routed path of this rank's share runs on 1/token_shard of the block's tokens:
    under expert parallelism with tensor and sequence parallelism each TP rank routes
    its own sequence shard, its experts whole (ModelSpec.tp_shard); 1 otherwise."""

    def __post_init__(self) -> None:
        for f in ("experts", "top_k", "expert_ffn_hidden", "ep", "token_shard"):
            _positive(f"model.moe.{f}", getattr(self, f))
        for f in ("shared_ffn_hidden", "dense_layers"):
            _positive(f"model.moe.{f}", getattr(self, f), zero=True)
        for f in ("shared_expert_gate", "router_bias"):
            if not isinstance(getattr(self, f), bool):
                raise ConfigError(f"model.moe.{f}", getattr(self, f), "must be true or false")
        if self.top_k > self.experts:
            raise ConfigError("model.moe.top_k", self.top_k,
                              f"must be <= experts={self.experts}")
        if self.experts % self.ep:
            raise ConfigError("model.moe.ep", self.ep,
                              f"must divide experts={self.experts}")

    @property
    def local_experts(self) -> int:
        """Routed experts one EP rank holds."""
        return self.experts // self.ep

    @property
    def input_sequence_sharded(self) -> bool:
        """The MoE works on the rank's sequence shard alone, its input never all-gathered
        over the TP group: under EP with TP (token_shard > 1) when no shared experts, the
        one TP-sharded MLP in the layer, need the whole sequence (torchtitan's
        moe_sharding)."""
        return self.token_shard > 1 and not self.shared_ffn_hidden

    @property
    def routed_width(self) -> int:
        """Inner width the routed experts compute per token of the block: top_k experts'
        widths, over token_shard when the routed path sees that share of the tokens
        (equal work: a 1/token_shard of the tokens at the whole width)."""
        return -(-self.top_k * self.expert_ffn_hidden // self.token_shard)

    @classmethod
    def from_dict(cls, data: object, *, where: str = "model.moe") -> MoeSpec:
        return cls(**check_keys(cls, data, where=where))


@dataclass(frozen=True, slots=True, kw_only=True)
class MlaSpec:
    """Multi-head latent attention (DeepSeek-V2/V3): queries and keys/values projected
    through low-rank latents; each head's query and key are a no-position part and a
    RoPE part, its value `v_head_dim` wide."""

    q_lora_rank: int
    """Query latent width (wq_a: d -> q_lora_rank, normed, wq_b up to the heads); 0 means
    a full-rank wq."""
    kv_lora_rank: int
    """Key/value latent width (wkv_a: d -> kv_lora_rank + qk_rope_head_dim, the latent
    normed, wkv_b up to every head's key no-position part and value)."""
    qk_nope_head_dim: int
    """Per-head query/key width without position encoding."""
    qk_rope_head_dim: int
    """Per-head query/key width with RoPE (the key's part shared by all heads)."""
    v_head_dim: int
    """Per-head value width (the attention output's)."""

    def __post_init__(self) -> None:
        _positive("model.mla.q_lora_rank", self.q_lora_rank, zero=True)
        for f in ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
            _positive(f"model.mla.{f}", getattr(self, f))

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @classmethod
    def from_dict(cls, data: object, *, where: str = "model.mla") -> MlaSpec:
        return cls(**check_keys(cls, data, where=where))
