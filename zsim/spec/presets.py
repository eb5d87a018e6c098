"""Named model presets. Shapes come from the papers and released configs cited per family;
parameter counts are derived by ModelSpec, never written here."""

from __future__ import annotations

from zsim.spec.model import ModelSpec
from zsim.spec.moe import MlaSpec, MoeSpec


def _gpt3(name: str, layers: int, d: int, heads: int) -> ModelSpec:
    # Brown et al. 2020, Table 2.1: ffn = 4d, vocab 50257, context 2048, GELU MLP,
    # LayerNorm, biases, learned positions, tied embeddings (as GPT-2).
    return ModelSpec(name=name, num_layers=layers, d_model=d, num_heads=heads,
                     num_kv_heads=heads, ffn_hidden=4 * d, mlp="gelu", norm="layernorm",
                     bias=True, vocab_size=50257, tied_embeddings=True,
                     learned_pos_emb=True, max_seq_len=2048,
                     seq_len_source="GPT-3's context (Brown et al. 2020)")


def _llama(name: str, layers: int, d: int, heads: int, kv: int, ffn: int, vocab: int,
           seq: int, source: str) -> ModelSpec:
    # Llama: SwiGLU, RMSNorm, no biases, RoPE, untied output.
    return ModelSpec(name=name, num_layers=layers, d_model=d, num_heads=heads,
                     num_kv_heads=kv, ffn_hidden=ffn, vocab_size=vocab, max_seq_len=seq,
                     seq_len_source=source)


_LLAMA2_CONTEXT = "Llama 2's training context (Touvron et al. 2023)"
_LLAMA3_CONTEXT = "Llama 3's pre-training context (Llama Team 2024)"


PRESETS: dict[str, ModelSpec] = {
    m.name: m
    for m in (
        # GPT-2 small as nanoGPT sizes it (no biases, tied): 124,337,664 parameters.
        ModelSpec(name="gpt2-124m", num_layers=12, d_model=768, num_heads=12,
                  num_kv_heads=12, ffn_hidden=3072, mlp="gelu", norm="layernorm",
                  vocab_size=50257, tied_embeddings=True, learned_pos_emb=True,
                  max_seq_len=1024, seq_len_source="GPT-2's context (n_positions)"),
        _gpt3("gpt3-125m", 12, 768, 12),
        _gpt3("gpt3-350m", 24, 1024, 16),
        # Table 2.1 lists 24 heads of 128 for XL, which does not multiply to 2048;
        # 16 heads of 128 keeps d_head = 128 as the table intends.
        _gpt3("gpt3-1.3b", 24, 2048, 16),
        _gpt3("gpt3-2.7b", 32, 2560, 32),
        _gpt3("gpt3-6.7b", 32, 4096, 32),
        # Table 2.1 prints d_model 5140, a typo for 5120 (40 heads x 128).
        _gpt3("gpt3-13b", 40, 5120, 40),
        _gpt3("gpt3-175b", 96, 12288, 96),
        # Touvron et al. 2023 (Llama 2) Table 1 and meta-llama/Llama-2-*-hf config.json.
        _llama("llama2-7b", 32, 4096, 32, 32, 11008, 32000, 4096, _LLAMA2_CONTEXT),
        _llama("llama2-13b", 40, 5120, 40, 40, 13824, 32000, 4096, _LLAMA2_CONTEXT),
        _llama("llama2-70b", 80, 8192, 64, 8, 28672, 32000, 4096, _LLAMA2_CONTEXT),
        # Llama Team 2024 (Llama 3 herd) Table 3 and meta-llama/Llama-3.1-*/config.json.
        _llama("llama3-8b", 32, 4096, 32, 8, 14336, 128256, 8192, _LLAMA3_CONTEXT),
        _llama("llama3-70b", 80, 8192, 64, 8, 28672, 128256, 8192, _LLAMA3_CONTEXT),
        _llama("llama3-405b", 126, 16384, 128, 8, 53248, 128256, 8192, _LLAMA3_CONTEXT),
        # Mixture of experts, as their released config.json files build them (the copies
        # in tests/data/hf_configs, read by zsim.spec.hf_config, must give the same spec).
        # Jiang et al. 2024 and mistralai/Mixtral-8x7B-v0.1: 8 experts, top-2.
        ModelSpec(name="mixtral-8x7b", num_layers=32, d_model=4096, num_heads=32,
                  num_kv_heads=8, ffn_hidden=14336, vocab_size=32000, max_seq_len=4096,
                  seq_len_source="default 4,096 (the config allows up to 32,768)",
                  moe=MoeSpec(experts=8, top_k=2, expert_ffn_hidden=14336)),
        # Qwen/Qwen3-30B-A3B: 128 experts of 768, top-8, q/k norms, 32 heads of 128.
        ModelSpec(name="qwen3-30b-a3b", num_layers=48, d_model=2048, num_heads=32,
                  num_kv_heads=4, head_width=128, qk_norm=True, ffn_hidden=6144,
                  vocab_size=151936, max_seq_len=4096,
                  seq_len_source="default 4,096 (the config allows up to 40,960)",
                  moe=MoeSpec(experts=128, top_k=8, expert_ffn_hidden=768)),
        # DeepSeek-AI 2024 (DeepSeek-V3 report, Sec. 2 and 4.2) and deepseek-ai/DeepSeek-V3:
        # MLA, 256 routed experts of 2048 and one shared, top-8, the first 3 layers dense,
        # pre-trained at 4K tokens.
        ModelSpec(name="deepseek-v3", num_layers=61, d_model=7168, num_heads=128,
                  num_kv_heads=128, ffn_hidden=18432, vocab_size=129280, max_seq_len=4096,
                  seq_len_source="DeepSeek-V3's pre-training context (DeepSeek-AI 2024)",
                  warnings=("deepseek-v3: its 3 dense layers are counted exactly; the "
                            "simulator runs every layer as an MoE layer",),
                  mla=MlaSpec(q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128,
                              qk_rope_head_dim=64, v_head_dim=128),
                  moe=MoeSpec(experts=256, top_k=8, expert_ffn_hidden=2048,
                              shared_ffn_hidden=2048, router_bias=True, dense_layers=3)),
    )
}

ALIASES: dict[str, str] = {
    "125m": "gpt3-125m",
    "350m": "gpt3-350m",
    "1.3b": "gpt3-1.3b",
    "2.7b": "gpt3-2.7b",
    "6.7b": "gpt3-6.7b",
    "13b-gpt": "gpt3-13b",
    "175b": "gpt3-175b",
    "7b": "llama2-7b",
    "13b": "llama2-13b",
    "70b": "llama2-70b",
    "8b": "llama3-8b",
    "70b-3": "llama3-70b",
    "405b": "llama3-405b",
    "mixtral": "mixtral-8x7b",
    "qwen3-moe": "qwen3-30b-a3b",
    "dsv3": "deepseek-v3",
}


def _hub_ids() -> dict[str, str]:
    """Hugging Face hub ids (lowercase, with and without the organisation) of the released
    checkpoints each preset describes: the base and chat/instruct models of one size
    share their shapes."""
    ids = {}
    for size in ("7b", "13b", "70b"):
        for suffix in ("", "-hf", "-chat", "-chat-hf"):
            ids[f"meta-llama/llama-2-{size}{suffix}"] = f"llama2-{size}"
    for size in ("8b", "70b", "405b"):
        for base in ("meta-llama-3", "meta-llama-3.1", "llama-3.1"):
            if not (base == "meta-llama-3" and size == "405b"):
                for suffix in ("", "-instruct"):
                    ids[f"meta-llama/{base}-{size}{suffix}"] = f"llama3-{size}"
    ids["meta-llama/llama-3.3-70b-instruct"] = "llama3-70b"
    return ids | {hub_id.split("/", 1)[1]: name for hub_id, name in ids.items()}


HF_IDS: dict[str, str] = _hub_ids()
"""Hub id ("meta-llama/llama-2-13b-hf", or "llama-2-13b-hf") -> preset name."""
