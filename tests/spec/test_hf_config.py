"""HuggingFace config.json -> ModelSpec (zsim.spec.hf_config): the released configs of
tests/data/hf_configs against their published parameter counts and against counts worked
by hand from the modules transformers builds for each model_type; the training sequence
length and where it came from; refusals (one line, exit 2, naming model_type and the key)
and warnings; and the loader's error contract on malformed files."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from typer.testing import CliRunner

from zsim.cli import app
from zsim.errors import ConfigError
from zsim.scenario import load_scenario
from zsim.spec.hf_config import read_hf_config
from zsim.spec.registry import resolve_model

CONFIGS = Path(__file__).resolve().parents[1] / "data" / "hf_configs"
"""Released config.json files, one folder per checkpoint (README.md there)."""

HARDWARE = str(Path(__file__).resolve().parents[2] / "hardware_profiles" / "dgx-h100.yaml")
"""This checkout's profile (the installed package may point at another checkout's)."""

LLAMA2_7B_CONFIG = {
    # meta-llama/Llama-2-7b-hf config.json (the keys the loader reads, plus extras it ignores).
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
    "hidden_size": 4096, "intermediate_size": 11008, "max_position_embeddings": 4096,
    "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 32,
    "rms_norm_eps": 1e-05, "tie_word_embeddings": False, "vocab_size": 32000,
}
LLAMA31_8B_CONFIG = {
    # meta-llama/Llama-3.1-8B config.json.
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
    "attention_bias": False, "mlp_bias": False, "head_dim": 128,
    "hidden_size": 4096, "intermediate_size": 14336, "max_position_embeddings": 131072,
    "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
    "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "rope_theta": 500000.0, "tie_word_embeddings": False, "vocab_size": 128256,
}


def _write(tmp_path: Path, cfg: dict, sub: str = "model") -> Path:
    folder = tmp_path / sub
    folder.mkdir()
    path = folder / "config.json"
    path.write_text(json.dumps(cfg))
    return path


def _released(name: str) -> dict:
    return json.loads((CONFIGS / name / "config.json").read_text())


def error_line(args: list[str]) -> str:
    """Run `zsim <args>`, check the failure contract, return the one error line."""
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


# ------------------------------------------------------------ released configs
def _llama_by_hand(c: dict, *, qkv_bias: bool) -> int:
    """LlamaForCausalLM / MistralForCausalLM / Qwen2ForCausalLM's parameters: per layer
    q_proj and o_proj (d x d), k_proj and v_proj (kv x d), gate/up/down (f x d), two RMSNorm
    weights, and with Qwen2's q/k/v biases d + 2 kv; embed_tokens, norm, lm_head."""
    d, f, v, layers = (c["hidden_size"], c["intermediate_size"], c["vocab_size"],
                       c["num_hidden_layers"])
    kv = c["num_key_value_heads"] * d // c["num_attention_heads"]
    layer = 2 * d * d + 2 * kv * d + 3 * d * f + 2 * d + (d + 2 * kv if qkv_bias else 0)
    return layers * layer + v * d + d + v * d


def _gpt_neox_by_hand(c: dict) -> int:
    """GPTNeoXForCausalLM's parameters: per layer query_key_value (3d x d + 3d), dense
    (d x d + d), dense_h_to_4h (f x d + f), dense_4h_to_h (d x f + d), two LayerNorms
    (2 x 2d); embed_in, final_layer_norm (2d), embed_out (untied, no bias)."""
    d, f, v = c["hidden_size"], c["intermediate_size"], c["vocab_size"]
    layer = (3 * d * d + 3 * d) + (d * d + d) + (f * d + f) + (d * f + d) + 4 * d
    return c["num_hidden_layers"] * layer + v * d + 2 * d + v * d


def _gpt2_by_hand(c: dict) -> int:
    """GPT2LMHeadModel's parameters: wte, wpe (n_positions rows), per layer ln_1, c_attn
    (d x 3d + 3d), attn.c_proj (d x d + d), ln_2, c_fc (d x 4d + 4d), mlp.c_proj (4d x d
    + d); ln_f; lm_head tied to wte."""
    d, v, p = c["n_embd"], c["vocab_size"], c["n_positions"]
    layer = 2 * d + (3 * d * d + 3 * d) + (d * d + d) + 2 * d + (4 * d * d + 4 * d) + \
        (4 * d * d + d)
    return v * d + p * d + c["n_layer"] * layer + 2 * d


RELEASED = {
    # folder: (published count, the same worked by hand from its config)
    "Llama-2-13b-hf": (13_015_864_320, lambda c: _llama_by_hand(c, qkv_bias=False)),
    "Mistral-7B-v0.1": (7_241_732_096, lambda c: _llama_by_hand(c, qkv_bias=False)),
    "Qwen2-7B": (7_615_616_512, lambda c: _llama_by_hand(c, qkv_bias=True)),
    "pythia-2.8b": (2_775_208_960, _gpt_neox_by_hand),
    "gpt2": (124_439_808, _gpt2_by_hand),
}
"""Published totals: README.md in tests/data/hf_configs names each source."""


@pytest.mark.parametrize("folder", sorted(RELEASED))
def test_released_config_has_its_published_parameter_count(folder: str) -> None:
    published, by_hand = RELEASED[folder]
    m = read_hf_config(CONFIGS / folder / "config.json")
    assert m.num_params == published == by_hand(_released(folder))
    assert m.name == folder


def test_pythia_non_embedding_count_is_the_model_cards() -> None:
    # Pythia model card, "Non-Embedding Params" of 2.8B (embed_in and embed_out excluded).
    m = read_hf_config(CONFIGS / "pythia-2.8b" / "config.json")
    assert m.num_params - 2 * m.vocab_size * m.d_model == 2_517_652_480
    assert (m.mlp, m.norm, m.bias, m.tied_embeddings, m.learned_pos_emb) == (
        "gelu", "layernorm", True, False, False)


def test_qwen2_biases_are_on_q_k_v_only() -> None:
    m = read_hf_config(CONFIGS / "Qwen2-7B" / "config.json")
    biases = {n for n, _ in m.block_tensors() if n.endswith(".bias")}
    assert biases == {"attention.wq.bias", "attention.wk.bias", "attention.wv.bias"}


@pytest.mark.parametrize(("folder", "seq", "source"), [
    ("Llama-2-13b-hf", 4096, "config max_position_embeddings"),
    ("Mistral-7B-v0.1", 4096, "default 4,096 (the config allows up to 32,768)"),
    ("Qwen2-7B", 4096, "default 4,096 (the config allows up to 131,072)"),
    ("pythia-2.8b", 2048, "config max_position_embeddings"),
    ("gpt2", 1024, "config n_positions, the learned position table's length"),
])
def test_sequence_length_and_where_it_came_from(folder: str, seq: int, source: str) -> None:
    m = read_hf_config(CONFIGS / folder / "config.json")
    assert (m.max_seq_len, m.seq_len_source) == (seq, source)


def test_rope_scaling_gives_the_training_length(tmp_path: Path) -> None:
    # Llama 3.1 was pre-trained at 8,192 tokens and extended to 131,072 (Llama Team 2024,
    # Sec. 3.4); its config says so in rope_scaling.
    m = read_hf_config(_write(tmp_path, LLAMA31_8B_CONFIG))
    assert m.max_seq_len == 8192
    assert m.seq_len_source == "config rope_scaling.original_max_position_embeddings"
    assert m.num_params == 8_030_261_248


@pytest.mark.parametrize("folder", sorted(RELEASED))
def test_plan_header_says_where_the_sequence_length_came_from(folder: str) -> None:
    m = read_hf_config(CONFIGS / folder / "config.json")
    result = CliRunner().invoke(app, ["plan", "--model", str(CONFIGS / folder / "config.json"),
                                      "--gpus", "8", "--hardware", HARDWARE])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0].startswith(f"{folder} ({m.num_params / 1e9:.2f}B params)")
    assert lines[1] == (f"sequence {m.max_seq_len:,} tokens: {m.seq_len_source}; change it "
                        f"with --seq N")


def test_simulate_header_says_it_too() -> None:
    path = str(CONFIGS / "Qwen2-7B" / "config.json")
    result = CliRunner().invoke(app, ["simulate", "--model", path, "--gpus", "8",
                                      "--strategy", "fsdp", "--hardware", HARDWARE])
    assert result.exit_code == 0, result.output
    assert ("sequence 4,096 tokens: default 4,096 (the config allows up to 131,072); change "
            "it with --seq N") in result.stdout.splitlines()


def test_seq_flag_is_named_as_the_source() -> None:
    result = CliRunner().invoke(app, ["plan", "--model", str(CONFIGS / "gpt2" / "config.json"),
                                      "--gpus", "8", "--hardware", HARDWARE, "--seq", "512"])
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[1] == "sequence 512 tokens: from --seq"


# ------------------------------------------------------------ refusals
# Published totals and activated parameters, each also worked by hand below from the
# architecture transformers builds (modeling_mixtral.py, modeling_qwen2_moe.py,
# modeling_deepseek_v3.py), independently of ModelSpec's closed form.
MOE_PUBLISHED = {
    # Jiang et al. 2024, "Mixtral of Experts", Sec. 2: 47B total, 13B active
    # (Mistral's announcement: 46.7B total, 12.9B per token).
    "Mixtral-8x7B-v0.1": (46.7e9, 12.9e9, 0.002),
    # Qwen team 2024, Qwen1.5-MoE-A2.7B model card: 14.3B total, 2.7B activated.
    "Qwen1.5-MoE-A2.7B": (14.3e9, 2.7e9, 0.01),
    # Qwen team 2025, Qwen3-30B-A3B model card: 30.5B total, 3.3B activated.
    "Qwen3-30B-A3B": (30.5e9, 3.3e9, 0.005),
    # DeepSeek-AI 2024, DeepSeek-V3 Technical Report, Sec. 2: 671B total, 37B activated
    # per token (without the 14B multi-token-prediction module).
    "DeepSeek-V3": (671e9, 37e9, 0.02),
}


def _mixtral_by_hand() -> tuple[int, int]:
    d, kv, f, layers, vocab, experts, k = 4096, 1024, 14336, 32, 32000, 8, 2
    attention = 2 * d * d + 2 * d * kv
    expert = 3 * d * f
    other = attention + d * experts + 2 * d  # router, two RMSNorms
    root = 2 * vocab * d + d
    return (layers * (other + experts * expert) + root,
            layers * (other + k * expert) + root)


def _deepseek_v3_by_hand() -> tuple[int, int]:
    d, h, layers, dense, vocab = 7168, 128, 61, 3, 129280
    attention = (d * 1536 + 1536 + 1536 * h * 192          # wq_a, q_norm, wq_b
                 + d * (512 + 64) + 512 + 512 * h * 256    # wkv_a, kv_norm, wkv_b
                 + h * 128 * d)                            # wo
    expert = 3 * d * 2048
    moe_other = attention + 2 * d + 256 * d + 256 + expert  # norms, router + bias, shared
    dense_layer = attention + 2 * d + 3 * d * 18432
    root = 2 * vocab * d + d
    return (dense * dense_layer + (layers - dense) * (moe_other + 256 * expert) + root,
            dense * dense_layer + (layers - dense) * (moe_other + 8 * expert) + root)


def _qwen15_moe_by_hand() -> tuple[int, int]:
    d, layers, vocab, experts, k = 2048, 24, 151936, 60, 4
    attention = 4 * d * d + 3 * d  # q/k/v with biases, o without
    expert = 3 * d * 1408
    other = attention + 2 * d + experts * d + 3 * d * 5632 + d  # router, shared, its gate
    root = 2 * vocab * d + d
    return (layers * (other + experts * expert) + root,
            layers * (other + k * expert) + root)


def _qwen3_moe_by_hand() -> tuple[int, int]:
    d, q, kv, layers, vocab, experts, k = 2048, 32 * 128, 4 * 128, 48, 151936, 128, 8
    attention = 2 * d * q + 2 * d * kv + 2 * 128  # q/k/v/o, q_norm and k_norm
    expert = 3 * d * 768
    other = attention + 2 * d + experts * d  # norms, router
    root = 2 * vocab * d + d
    return (layers * (other + experts * expert) + root,
            layers * (other + k * expert) + root)


@pytest.mark.parametrize(("folder", "by_hand"), [
    ("Mixtral-8x7B-v0.1", _mixtral_by_hand), ("Qwen1.5-MoE-A2.7B", _qwen15_moe_by_hand),
    ("Qwen3-30B-A3B", _qwen3_moe_by_hand), ("DeepSeek-V3", _deepseek_v3_by_hand)])
def test_moe_configs_count_total_and_activated_parameters(folder: str, by_hand) -> None:
    spec = read_hf_config(CONFIGS / folder / "config.json")
    total, active = by_hand()
    assert spec.moe is not None
    assert (spec.num_params, spec.active_params) == (total, active)
    assert sum(math.prod(s) for _, s in spec.parameter_tensors()) == total
    published_total, published_active, rel = MOE_PUBLISHED[folder]
    assert spec.num_params == pytest.approx(published_total, rel=rel)
    assert spec.active_params == pytest.approx(published_active, rel=max(rel, 0.02))


def test_moe_flops_per_token_count_the_routed_experts_only() -> None:
    """6 x activated matmul parameters: Mixtral's dense equivalent has 8 experts' worth of
    parameters but its tokens pass through 2 (12.9B of 46.7B)."""
    spec = read_hf_config(CONFIGS / "Mixtral-8x7B-v0.1" / "config.json")
    matmul_active = spec.active_params - spec.embedding_params  # the output projection counts
    assert spec.flops_per_token(4096) == pytest.approx(
        6 * matmul_active + spec.attention_flops_per_token(4096))
    assert spec.flops_per_token(4096) < 6 * 14e9


def test_a_head_width_other_than_hidden_over_heads_is_read(tmp_path: Path) -> None:
    """Mistral-Nemo's 32 heads of 128 on a 5120-wide model: q and o are 4096 wide."""
    spec = read_hf_config(_write(tmp_path, {**LLAMA2_7B_CONFIG, "hidden_size": 5120,
                                            "head_dim": 128}))
    assert (spec.head_dim, spec.q_dim) == (128, 4096)
    assert dict(spec.block_tensors())["attention.wo.weight"] == (5120, 4096)


def test_expert_parallel_share_keeps_the_whole_model_counts() -> None:
    spec = read_hf_config(CONFIGS / "DeepSeek-V3" / "config.json")
    share = spec.ep_share(64)
    expert = 3 * 7168 * 2048
    assert spec.num_params - share.num_params == 58 * (256 - 4) * expert
    assert (share.total_params, share.active_params) == (spec.num_params, spec.active_params)
    assert share.flops_per_token(4096) == spec.flops_per_token(4096)


def test_deepseek_v3_notes_what_it_does_not_simulate() -> None:
    spec = read_hf_config(CONFIGS / "DeepSeek-V3" / "config.json")
    (note,) = spec.warnings
    for key in ("num_nextn_predict_layers=1", "quantization_config", "auto_map",
                "first_k_dense_replace=3"):
        assert key in note
    assert spec.mla is not None and spec.head_dim == 192 and spec.v_dim == 128 * 128
    assert spec.max_seq_len == 4096


@pytest.mark.parametrize(("extra", "key"), [
    ({"num_experts": 64, "num_experts_per_tok": 8}, "num_experts"),  # Qwen2-MoE spelling
    ({"n_routed_experts": 160}, "n_routed_experts"),  # DeepSeek-V2 spelling
    ({"quantization_config": {"quant_method": "awq", "bits": 4}}, "quantization_config"),
    ({"auto_map": {"AutoModelForCausalLM": "modeling_x.XForCausalLM"}}, "auto_map"),
    ({"architectures": ["LlamaForSequenceClassification"]}, "architectures"),
    ({"attention_bias": True}, "attention_bias"),  # with mlp_bias false
])
def test_unmodelled_keys_are_refused_through_the_cli(tmp_path: Path, extra: dict,
                                                     key: str) -> None:
    path = _write(tmp_path, {**LLAMA2_7B_CONFIG, **extra})
    line = error_line(["plan", "--model", str(path), "--gpus", "8"])
    assert line.startswith(f"error: {path}:{key}=") and "'llama'" in line


@pytest.mark.parametrize(("model_type", "cfg"), [
    ("falcon", {"model_type": "falcon", "hidden_size": 4544, "num_attention_heads": 71,
                "num_hidden_layers": 32, "vocab_size": 65024, "parallel_attn": True}),
    ("gemma", {**LLAMA2_7B_CONFIG, "model_type": "gemma"}),
])
def test_unmodelled_model_type_is_refused(tmp_path: Path, model_type: str, cfg: dict) -> None:
    path = _write(tmp_path, cfg)
    line = error_line(["plan", "--model", str(path), "--gpus", "8"])
    assert line.startswith(f"error: {path}:model_type='{model_type}': not modelled")
    assert ("llama, mistral, qwen2, mixtral, qwen2_moe, qwen3_moe, deepseek_v3, gpt2, "
            "gpt_neox") in line


def test_missing_model_type_is_refused(tmp_path: Path) -> None:
    cfg = {k: v for k, v in LLAMA2_7B_CONFIG.items() if k != "model_type"}
    with pytest.raises(ConfigError) as e:
        read_hf_config(_write(tmp_path, cfg))
    assert e.value.field.endswith(":model_type") and e.value.value is None


def test_family_specific_refusals(tmp_path: Path) -> None:
    neox = {**_released("pythia-2.8b"), "attention_bias": False}
    with pytest.raises(ConfigError) as e:
        read_hf_config(_write(tmp_path, neox, "neox"))
    assert e.value.field.endswith(":attention_bias") and "'gpt_neox'" in e.value.reason
    gpt2 = {**_released("gpt2"), "add_cross_attention": True}
    with pytest.raises(ConfigError) as e:
        read_hf_config(_write(tmp_path, gpt2, "gpt2"))
    assert e.value.field.endswith(":add_cross_attention") and "'gpt2'" in e.value.reason


def test_mistral_window_refuses_a_longer_sequence() -> None:
    # Mistral-7B-v0.1 attends over a 4,096-token window (sliding_window): full causal
    # attention is exact up to it, and zsim models nothing else.
    path = str(CONFIGS / "Mistral-7B-v0.1" / "config.json")
    assert read_hf_config(Path(path)).sliding_window == 4096
    line = error_line(["plan", "--model", path, "--gpus", "8", "--seq", "8192",
                       "--hardware", HARDWARE])
    assert "seq_len=8192" in line and "sliding_window=4096" in line


def test_qwen2_window_only_with_use_sliding_window(tmp_path: Path) -> None:
    # Qwen2Config: sliding layers are those from max_window_layers on, and only with
    # use_sliding_window; Qwen2-7B uses neither.
    cfg = _released("Qwen2-7B")
    assert read_hf_config(_write(tmp_path, cfg, "a")).sliding_window == 0
    on = {**cfg, "use_sliding_window": True, "sliding_window": 8192}
    assert read_hf_config(_write(tmp_path, on, "b")).sliding_window == 0  # 28 of 28 full
    some = {**on, "max_window_layers": 20}
    assert read_hf_config(_write(tmp_path, some, "c")).sliding_window == 8192


# ------------------------------------------------------------ warnings
def test_released_configs_warn_about_what_is_not_modelled() -> None:
    pythia = read_hf_config(CONFIGS / "pythia-2.8b" / "config.json")
    assert len(pythia.warnings) == 1
    assert "use_parallel_residual=true" in pythia.warnings[0]
    assert "rotary_pct=0.25" in pythia.warnings[0]
    gpt2 = read_hf_config(CONFIGS / "gpt2" / "config.json")
    assert gpt2.warnings == ("gpt2: read but not modelled: resid_pdrop=0.1, embd_pdrop=0.1, "
                             "attn_pdrop=0.1 (simulated without dropout: no masks saved)",)
    for folder in ("Llama-2-13b-hf", "Mistral-7B-v0.1", "Qwen2-7B"):
        assert read_hf_config(CONFIGS / folder / "config.json").warnings == ()


def test_unknown_and_unmodelled_keys_warn(tmp_path: Path) -> None:
    cfg = {**LLAMA2_7B_CONFIG, "hidden_act": "gelu", "some_new_knob": 3}
    m = read_hf_config(_write(tmp_path, cfg, "m"))
    # LlamaMLP is gated (gate, up, down) whatever hidden_act is: same shapes, same count.
    assert m.num_params == 6_738_415_616
    assert m.warnings == ('m: read but not modelled: hidden_act="gelu" (simulated as SiLU)',
                          "m: not read (model_type 'llama' does not use them in zsim): "
                          "some_new_knob")


def test_model_warnings_reach_the_cli() -> None:
    result = CliRunner().invoke(app, ["plan", "--model", str(CONFIGS / "gpt2" / "config.json"),
                                      "--gpus", "8", "--hardware", HARDWARE])
    assert result.exit_code == 0
    assert result.stderr.startswith("warning: gpt2: read but not modelled: resid_pdrop=0.1")


def test_model_warnings_reach_a_scenarios_runs(tmp_path: Path) -> None:
    (tmp_path / "gpt2").mkdir()
    (tmp_path / "gpt2" / "config.json").write_text(
        (CONFIGS / "gpt2" / "config.json").read_text())
    (tmp_path / "s.yaml").write_text(f"name: s\nmodel: gpt2/config.json\nhardware: {HARDWARE}\n"
                                     "plans: {fsdp: {strategy: fsdp, gpus: 8}}\n")
    run = load_scenario(tmp_path / "s.yaml").runs[0]
    assert run.warnings == read_hf_config(CONFIGS / "gpt2" / "config.json").warnings


# ------------------------------------------------------------ names
@pytest.mark.parametrize("name", ["meta-llama/Llama-2-13b-hf", "Llama-2-13b", "LLAMA-2-13B-HF",
                                  "llama-2-13b-chat-hf"])
def test_hub_ids_of_a_preset_resolve_to_it(name: str) -> None:
    assert resolve_model(name).name == "llama2-13b"


def test_hub_ids_of_llama3_checkpoints() -> None:
    assert resolve_model("meta-llama/Llama-3.1-8B").name == "llama3-8b"
    assert resolve_model("meta-llama/Meta-Llama-3-70B-Instruct").name == "llama3-70b"
    assert resolve_model("meta-llama/Llama-3.1-405B").name == "llama3-405b"


def test_unknown_name_suggests_the_nearest_preset() -> None:
    line = error_line(["plan", "--model", "llama-2-13", "--gpus", "8"])
    assert line == ("error: model='llama-2-13': unknown model; nearest preset: llama2-13b; "
                    "give a preset (`zsim models` lists them) or a path to a Hugging Face "
                    "config.json")
    line = error_line(["plan", "--model", "mistral-7b", "--gpus", "8"])
    assert "nearest" not in line and "config.json" in line


# ------------------------------------------------------------ loader contract
@pytest.mark.parametrize(("cfg", "published"), [(LLAMA2_7B_CONFIG, 6_738_415_616),
                                                (LLAMA31_8B_CONFIG, 8_030_261_248)])
def test_hf_config_loads_offline(tmp_path: Path, cfg: dict, published: int) -> None:
    m = read_hf_config(_write(tmp_path, cfg, "Some-Model"))
    assert m.num_params == published
    assert m.name == "Some-Model"
    assert m.num_kv_heads == cfg["num_key_value_heads"]


def test_hf_config_kv_heads_default_to_heads(tmp_path: Path) -> None:
    cfg = {k: v for k, v in LLAMA2_7B_CONFIG.items() if k != "num_key_value_heads"}
    assert read_hf_config(_write(tmp_path, cfg)).num_kv_heads == 32


@pytest.mark.parametrize("key", ["num_hidden_layers", "hidden_size", "num_attention_heads",
                                 "intermediate_size", "vocab_size", "max_position_embeddings"])
def test_hf_config_missing_key_names_it(tmp_path: Path, key: str) -> None:
    cfg = {k: v for k, v in LLAMA2_7B_CONFIG.items() if k != key}
    with pytest.raises(ConfigError) as e:
        read_hf_config(_write(tmp_path, cfg))
    assert e.value.field.endswith(f":{key}")
    assert key in str(e.value)


def test_hf_config_malformed_json(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text('{"hidden_size": 4096,')
    with pytest.raises(ConfigError) as e:
        read_hf_config(path)
    assert e.value.field == "model" and e.value.value == str(path)
    assert "not valid JSON" in e.value.reason


def test_hf_config_not_an_object_or_missing(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text("[1, 2]")
    with pytest.raises(ConfigError, match="JSON object"):
        read_hf_config(path)
    with pytest.raises(ConfigError, match="no such file"):
        read_hf_config(tmp_path / "absent.json")


def test_hf_config_wrong_type_names_the_config_key(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as e:
        read_hf_config(_write(tmp_path, {**LLAMA2_7B_CONFIG, "hidden_size": "4096"}))
    assert e.value.field.endswith("config.json:hidden_size") and e.value.value == "4096"
    # A string where JSON has booleans would be truthy: refused, not read as true.
    with pytest.raises(ConfigError) as e:
        read_hf_config(_write(tmp_path, {**LLAMA2_7B_CONFIG, "tie_word_embeddings": "false"},
                              "b"))
    assert e.value.field.endswith(":tie_word_embeddings")
    # fuzz: an object where a number belongs was a TypeError.
    with pytest.raises(ConfigError) as e:
        read_hf_config(_write(tmp_path, {**LLAMA2_7B_CONFIG, "head_dim": {}}, "d"))
    assert e.value.field.endswith(":head_dim") and e.value.value == {}
    # A cross-field rule of ModelSpec is reported under the config's own key.
    with pytest.raises(ConfigError) as e:
        read_hf_config(_write(tmp_path, {**LLAMA2_7B_CONFIG, "num_key_value_heads": 3}, "c"))
    assert e.value.field.endswith(":num_key_value_heads") and e.value.value == 3
    with pytest.raises(ConfigError) as e:
        read_hf_config(_write(tmp_path, {**LLAMA2_7B_CONFIG, "rope_scaling": 8}, "e"))
    assert e.value.field.endswith(":rope_scaling")


def test_hf_config_biases_everywhere_are_counted(tmp_path: Path) -> None:
    cfg = {**LLAMA2_7B_CONFIG, "attention_bias": True, "mlp_bias": True}
    m = read_hf_config(_write(tmp_path, cfg))
    d, f = 4096, 11008
    assert m.num_params == 6_738_415_616 + 32 * (4 * d + 2 * f + d)


@pytest.mark.parametrize(("preset", "folder"), [
    ("mixtral-8x7b", "Mixtral-8x7B-v0.1"), ("qwen3-30b-a3b", "Qwen3-30B-A3B"),
    ("deepseek-v3", "DeepSeek-V3")])
def test_moe_presets_are_their_released_configs(preset: str, folder: str) -> None:
    """The preset and the config.json give the same architecture (their names, where
    the sequence length came from and the notes aside)."""
    ignore = {"name", "seq_len_source", "warnings"}
    a = {k: v for k, v in resolve_model(preset).to_dict().items() if k not in ignore}
    b = {k: v for k, v in read_hf_config(CONFIGS / folder / "config.json").to_dict().items()
         if k not in ignore}
    assert a == b


def test_a_scenario_sweeps_the_expert_parallel_degree(tmp_path: Path) -> None:
    (tmp_path / "s.yaml").write_text(
        f"name: s\nmodel: mixtral\nhardware: {HARDWARE}\nseq_len: 1024\n"
        "plans: {fsdp: {strategy: fsdp, gpus: 16, expert_imbalance: 1.2}}\n"
        "sweep: {ep: [1, 8]}\n")
    plans = [run.plan for run in load_scenario(tmp_path / "s.yaml").runs]
    assert [(p.ep, p.routed_load) for p in plans] == [(1, 1.0), (8, 1.2)]
    (tmp_path / "bad.yaml").write_text(
        f"name: s\nmodel: 7b\nhardware: {HARDWARE}\n"
        "plans: {fsdp: {strategy: fsdp, gpus: 16, ep: 2}}\n")
    with pytest.raises(ConfigError) as e:
        load_scenario(tmp_path / "bad.yaml")
    assert e.value.field.endswith("ep") and "mixture-of-experts" in e.value.reason
