"""The torch reference model against ModelSpec's independent parameter enumeration and
closed-form count, and the autograd bookkeeping of the measurement tools."""

from __future__ import annotations

from dataclasses import replace

import pytest

torch = pytest.importorskip("torch")

from zsim.backend.instruments import LiveMemory, record_saved_tensors  # noqa: E402
from zsim.backend.reference_model import FeedForward, Transformer, scale_model  # noqa: E402
from zsim.errors import ConfigError  # noqa: E402
from zsim.spec.model import ModelSpec  # noqa: E402
from zsim.spec.presets import PRESETS  # noqa: E402

TINY = ModelSpec(name="tiny", num_layers=2, d_model=128, num_heads=4, num_kv_heads=2,
                 ffn_hidden=344, vocab_size=500, max_seq_len=64)


def test_parameters_match_spec_enumeration_and_closed_form() -> None:
    model = Transformer(TINY)
    got = [(n, tuple(p.shape)) for n, p in model.named_parameters()]
    assert sorted(got) == sorted(TINY.parameter_tensors())
    assert sum(p.numel() for p in model.parameters()) == TINY.num_params


@pytest.mark.parametrize("spec", [
    replace(TINY, qkv_bias=True),  # Qwen2: q, k, v biased; o and the MLP not
    replace(TINY, mlp="gelu", norm="layernorm", bias=True),  # GPT-NeoX: RoPE, untied
], ids=["qwen2", "gpt-neox"])
def test_hf_families_parameters_match_spec(spec: ModelSpec) -> None:
    model = Transformer(spec)
    got = [(n, tuple(p.shape)) for n, p in model.named_parameters()]
    assert sorted(got) == sorted(spec.parameter_tensors())
    assert sum(p.numel() for p in model.parameters()) == spec.num_params
    biased = {n.removeprefix("layers.0.") for n, _ in got
              if n.startswith("layers.0.") and n.endswith(".bias")}
    if spec.qkv_bias:
        assert biased == {"attention.wq.bias", "attention.wk.bias", "attention.wv.bias"}


def test_scaled_llama3_keeps_layers_and_gqa_ratio() -> None:
    big = PRESETS["llama3-8b"]
    small = scale_model(big, d_model=256, vocab_size=1024, max_seq_len=256)
    assert small.num_layers == big.num_layers
    assert small.num_heads // small.num_kv_heads == big.num_heads // big.num_kv_heads
    assert small.ffn_hidden == round(14336 * 256 / 4096)
    with pytest.raises(ConfigError, match="d_model"):
        scale_model(big, d_model=100)


@pytest.mark.parametrize("name", ["gpt3-125m", "gpt2-124m"])
def test_gpt_parameters_match_spec(name: str) -> None:
    # GPT-3: LayerNorm and projections with biases; GPT-2 as nanoGPT sizes it: no biases
    # (LayerNorm without bias too). Both learned positions and tied embeddings.
    spec = scale_model(PRESETS[name], d_model=128, vocab_size=512, max_seq_len=64)
    model = Transformer(spec)
    got = [(n, tuple(p.shape)) for n, p in model.named_parameters()]
    assert sorted(got) == sorted(spec.parameter_tensors())
    assert sum(p.numel() for p in model.parameters()) == spec.num_params
    assert model.output.weight is model.tok_embeddings.weight
    assert not hasattr(model, "rope_cos")


def test_untied_gpt_has_its_own_output() -> None:
    spec = replace(scale_model(PRESETS["gpt3-125m"], d_model=128, vocab_size=512,
                               max_seq_len=64), tied_embeddings=False)
    model = Transformer(spec)
    assert model.output.weight is not model.tok_embeddings.weight
    assert sorted((n, tuple(p.shape)) for n, p in model.named_parameters()) == sorted(
        spec.parameter_tensors())


def test_synthetic_extra_params_are_refused() -> None:
    with pytest.raises(ConfigError, match=r"model\.extra_params"):
        Transformer(replace(TINY, extra_params=10))


def test_gpt_trains_and_ties_gradients() -> None:
    spec = scale_model(PRESETS["gpt3-125m"], d_model=128, vocab_size=512, max_seq_len=64)
    model = Transformer(spec)
    model.init_weights()
    tokens = torch.randint(0, 512, (2, 32))
    model(tokens, tokens).backward()
    # One gradient for the shared weight: the lookup's rows plus the output projection's.
    assert model.tok_embeddings.weight.grad is not None
    assert model.pos_embeddings.weight.grad[32:].abs().sum() == 0  # positions >= s unused


def test_live_memory_counts_allocations_frees_and_resize() -> None:
    with LiveMemory() as mem:
        base = mem.live_bytes
        a = torch.empty(1000, dtype=torch.float32)
        assert mem.live_bytes - base == 4000
        a.untyped_storage().resize_(0)
        assert mem.live_bytes == base
        a.untyped_storage().resize_(4000)
        b = torch.ones(250, dtype=torch.bfloat16)
        assert mem.live_bytes - base == 4500
        assert mem.peak_bytes - base == 4500
        del a, b
        assert mem.live_bytes == base
        assert mem.peak_bytes - base == 4500


def test_swiglu_saves_input_and_four_intermediates() -> None:
    # Autograd's rules: mm saves its input (x for w1 and w3, one storage), silu saves its
    # input (w1 x), mul saves both factors (silu(w1 x), w3 x), w2's mm saves the product.
    # So 1 tensor of b*s*d plus 4 of b*s*f, all bf16; the weights are not activations.
    b, s, d, f = 2, 16, 128, 344
    ffn = FeedForward(TINY).to(torch.bfloat16)
    wrapper = torch.nn.Sequential(ffn)
    x = torch.randn(b, s, d, dtype=torch.bfloat16, requires_grad=True)
    with record_saved_tensors(wrapper, ["0"]) as saved:
        wrapper(x).sum().backward()
    assert sum(t.bytes for t in saved) == 2 * (b * s * d + 4 * b * s * f)
    assert all(t.scope == "0" and t.dtype == "bfloat16" for t in saved)


def test_gelu_mlp_saves_input_and_two_intermediates() -> None:
    # addmm saves its input (x) as mm does, GELU its input (w1's output), w2's addmm the
    # GELU output: 1 tensor of b*s*d plus 2 of b*s*f, bf16; weights and biases are not
    # activations, and the tanh approximation saves what the exact form saves.
    b, s = 2, 16
    spec = scale_model(PRESETS["gpt3-125m"], d_model=128, vocab_size=512, max_seq_len=64)
    d, f = spec.d_model, spec.ffn_hidden
    wrapper = torch.nn.Sequential(FeedForward(spec).to(torch.bfloat16))
    x = torch.randn(b, s, d, dtype=torch.bfloat16, requires_grad=True)
    with record_saved_tensors(wrapper, ["0"]) as saved:
        wrapper(x).sum().backward()
    assert sum(t.bytes for t in saved) == 2 * (b * s * d + 2 * b * s * f)
