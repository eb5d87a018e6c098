"""Fixtures for engine tests: a tiny 2-layer model (the toy cluster is toy_cluster.py)."""

from __future__ import annotations

import pytest

from zsim.spec.model import ModelSpec


@pytest.fixture
def tiny_model() -> ModelSpec:
    """2 blocks, d=256, SwiGLU 512, vocab 1000, MHA."""
    return ModelSpec(name="tiny", num_layers=2, d_model=256, num_heads=4, num_kv_heads=4,
                     ffn_hidden=512, vocab_size=1000, max_seq_len=512)
