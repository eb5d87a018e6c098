"""Fixtures for schedule tests: the tiny 2-block model and the shipped DGX H100 profile."""

from __future__ import annotations

import pytest

from zsim.spec.hardware import HardwareProfile
from zsim.spec.model import ModelSpec
from zsim.spec.registry import resolve_hardware


@pytest.fixture
def tiny_model() -> ModelSpec:
    """2 blocks, d=256, SwiGLU 512, vocab 1000, MHA."""
    return ModelSpec(name="tiny", num_layers=2, d_model=256, num_heads=4, num_kv_heads=4,
                     ffn_hidden=512, vocab_size=1000, max_seq_len=512)


@pytest.fixture
def h100() -> HardwareProfile:
    return resolve_hardware("dgx-h100")
