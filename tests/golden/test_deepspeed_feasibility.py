"""Golden: which DeepSpeed plans fit on 32 GB V100s, as DeepSpeed's tutorials and examples
report them (tests/data/cases/published.yaml, read at test time):

- DS-TUT-ZeRO1-ZeRO2-Offload-feasibility-V100 (docs/_tutorials/zero.md, zero-offload.md):
  Megatron GPT-2 1.5B on 8 GPUs without ZeRO runs out of memory and trains with ZeRO-1; a
  10B on 32 GPUs trains with ZeRO-2 and recomputation; the 10B trains on one GPU with
  ZeRO-2 and the optimizer offloaded (ZeRO-Offload), micro-batch 10.
- DS-HF-GPT2XL-DDP-OOM-vs-ZeRO123-16xV100 (DeepSpeedExamples autotuning/hf): GPT2-XL on 16
  GPUs, micro-batch 1 at sequence 1024: DDP "not runnable", ZeRO-1 trains.

A feasibility check reads memory only. The V100 is dgx-a100's profile with the V100's
memory and peaks (32 GB HBM2: torch sees 31.75 GiB, less about 0.5 GiB of CUDA context;
fp16 tensor 125 TFLOP/s): its rates are not the V100's and are not used. The models are
GPT-2's block (LayerNorm, GELU MLP, learned positions, tied embeddings) at sequence 1024
with unfused attention (the scores materialised, as Megatron-LM 1.1.5 and HF's GPT-2 of
the time ran it), fp16 with fp32 master weights.
"""

from __future__ import annotations

from typing import Any

import pytest

from zsim.simulate import simulate
from zsim.spec.hardware import HardwareProfile
from zsim.spec.model import ModelSpec
from zsim.spec.plan import Plan
from zsim.spec.registry import PROFILES_DIR
from zsim.spec.yaml_file import read_yaml

V100_USABLE_GIB = 31.2
"""torch.cuda's 31.75 GiB of a 32 GB V100 less about 0.5 GiB of CUDA context."""


@pytest.fixture(scope="module")
def v100() -> HardwareProfile:
    data = read_yaml(PROFILES_DIR / "dgx-a100.yaml", field="hardware")
    data["gpu"].update(name="V100-SXM3 32GB", hbm_gib=V100_USABLE_GIB,
                       hbm_bandwidth_gb_per_s=900, peak_tflops={"fp16": 125, "fp32": 15.7},
                       blas_workspace_mib=8.125)
    data["node"]["gpus_per_node"] = 16  # DGX-2
    return HardwareProfile.from_dict(data, name="v100-memory-only")


def _gpt2(name: str, layers: int, d: int, heads: int) -> ModelSpec:
    return ModelSpec(name=name, num_layers=layers, d_model=d, num_heads=heads,
                     num_kv_heads=heads, ffn_hidden=4 * d, mlp="gelu", norm="layernorm",
                     bias=True, vocab_size=50257, tied_embeddings=True, learned_pos_emb=True,
                     max_seq_len=1024, attention_kernel="math")


GPT2_1P5B = _gpt2("megatron-gpt2-1.5b", 48, 1600, 16)
GPT2_10B = _gpt2("megatron-gpt2-10b", 50, 4096, 32)
GPT2_XL = _gpt2("gpt2-xl", 48, 1600, 25)


def _fits(model: ModelSpec, hw: HardwareProfile, strategy: str, gpus: int,
          **kw: Any) -> bool:
    plan = Plan.for_strategy(strategy, gpus=gpus, seq_len=1024, param_dtype="fp16",
                             grad_dtype="fp16", reduce_dtype="fp16", **kw)
    return simulate(model, hw, plan, reserved=False).fits


def test_the_models_are_the_published_sizes(published_cases: dict[str, Any]) -> None:
    assert GPT2_XL.num_params == pytest.approx(1.56e9, rel=0.005)
    rows = published_cases["DS-TUT-ZeRO1-ZeRO2-Offload-feasibility-V100"]["measured"]["rows"]
    assert {r["model"] for r in rows} == {"1.5B", "10B"}
    assert GPT2_1P5B.num_params == pytest.approx(1.5e9, rel=0.05)
    assert GPT2_10B.num_params == pytest.approx(10e9, rel=0.05)


def test_tutorial_zero_plans_train(published_cases: dict[str, Any],
                                   v100: HardwareProfile) -> None:
    rows = published_cases["DS-TUT-ZeRO1-ZeRO2-Offload-feasibility-V100"]["measured"]["rows"]
    assert [r["result"] for r in rows[1:]] == ["trains", "trains",
                                               "trains on one 32GB V100"]
    assert _fits(GPT2_1P5B, v100, "zero1", 8)
    assert _fits(GPT2_10B, v100, "zero2", 32, recompute="full")
    # ZeRO-Offload: the 10B's fp16 parameters (19 GiB) stay on the GPU, its gradients go
    # to the host bucket by bucket and Adam runs there (before zsim kept a 19 GiB
    # gradient partition on the GPU and called it out of memory).
    assert _fits(GPT2_10B, v100, "zero2", 1, micro_batch=10, recompute="full",
                 offload="optimizer")
    assert not _fits(GPT2_10B, v100, "zero2", 1, micro_batch=10, recompute="full")


def test_hf_gpt2_xl_needs_zero_on_16_gpus(published_cases: dict[str, Any],
                                          v100: HardwareProfile) -> None:
    measured = published_cases["DS-HF-GPT2XL-DDP-OOM-vs-ZeRO123-16xV100"]["measured"]
    assert measured["ddp_mbs1"].startswith("OOM") and measured["zero1_mbs1_samples_per_s"]
    assert not _fits(GPT2_XL, v100, "ddp", 16)
    assert _fits(GPT2_XL, v100, "zero1", 16)


@pytest.mark.xfail(strict=True, reason="zsim fits it with 31.14 of 31.2 GiB: the dropout "
                   "masks Megatron GPT-2 saves (about 1 GiB here) are not modelled")
def test_tutorial_1p5b_without_zero_runs_out_of_memory(v100: HardwareProfile) -> None:
    assert not _fits(GPT2_1P5B, v100, "ddp", 8)
