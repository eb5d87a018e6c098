"""DDP's gradient buckets as torch forms them, checked against torch's own constants and
its own bucketing function (torch.distributed._compute_bucket_assignment_by_size, which
the reducer's rebuild_buckets runs after the first step on the gradients in the order
they became ready): the lowering's bucket all-reduces, in order and size, for a model's
fp32 gradients (torch.autocast keeps the parameters fp32). The order the real reducer
sees is checked on gloo in tests/backend/test_collective_calls.py."""

from __future__ import annotations

import math

import pytest

from zsim.schedule.lower import lower
from zsim.spec.model import ModelSpec
from zsim.spec.plan import Plan
from zsim.spec.registry import resolve_hardware, resolve_model

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
ddp_module = pytest.importorskip("torch.nn.parallel.distributed")


def _readiness_order(model: ModelSpec) -> list[int]:
    """Elements of each parameter tensor in the order backward completes its gradient,
    reverse module order within each part: the output projection and final norm, each
    block's tensors from the last block, the embeddings (a tied output projection's
    gradient completes with the embedding's)."""
    root = [(n, math.prod(s)) for n, s in reversed(model.root_tensors())]
    order = [numel for n, numel in root if n.startswith(("output.", "norm."))]
    order += [math.prod(s) for _, s in reversed(model.block_tensors())] * model.num_layers
    order += [numel for n, numel in root if n.endswith("embeddings.weight")]
    return order


def _torch_buckets(numels: list[int], limits: list[int]) -> list[int]:
    """Bytes of each bucket torch forms over fp32 tensors of these sizes."""
    tensors = [torch.empty(n, dtype=torch.float32, device="meta") for n in numels]
    indices, _ = dist._compute_bucket_assignment_by_size(tensors, limits)
    return [4 * sum(numels[i] for i in bucket) for bucket in indices]


def test_the_default_cap_is_torchs() -> None:
    # bucket_cap_mb=25 is 25 MiB: int(25 * 1024 * 1024) bytes.
    assert Plan.for_strategy("ddp", gpus=2, seq_len=128).bucket_bytes == \
        ddp_module._DEFAULT_BUCKET_CAP_MB * ddp_module._MB_TO_BYTES == 25 * 2**20


def _lowered_buckets(model: ModelSpec, cap: int) -> list[float]:
    plan = Plan.for_strategy("ddp", gpus=64, seq_len=1024, bucket_bytes=cap)
    ops = lower(model, resolve_hardware("dgx-h100"), plan).ops
    return [op.size_bytes for op in ops if op.kind == "all_reduce"]


@pytest.mark.parametrize(("name", "cap"), [("7b", 25 * 2**20), ("1.3b", 25 * 2**20),
                                           ("125m", 25 * 2**20), ("125m", 4 * 2**20)])
def test_buckets_are_torchs(name: str, cap: int) -> None:
    # The backend passes bucket_cap_mb, so every bucket's cap is it, the first one's too.
    model = resolve_model(name)
    assert _lowered_buckets(model, cap) == _torch_buckets(_readiness_order(model), [cap])


@pytest.mark.parametrize(("name", "same"), [("7b", True), ("1.3b", True), ("125m", False)])
def test_torchs_default_first_bucket(name: str, same: bool) -> None:
    """With bucket_cap_mb left None torch caps the first bucket at 1 MiB
    (dist._DEFAULT_FIRST_BUCKET_BYTES). The buckets are the same where the first
    gradients already reach 25 MiB (7b's output projection, 1.3b's last w2); on 125m its
    first bucket closes at the last block's w2 (9.4 MB), the buckets after it shift, and
    zsim, which models the cap the backend passes, differs from a DDP built with the
    default."""
    model = resolve_model(name)
    cap = 25 * 2**20
    first = dist._DEFAULT_FIRST_BUCKET_BYTES
    assert first == 2**20
    default = _torch_buckets(_readiness_order(model), [first, cap])
    lowered = _lowered_buckets(model, cap)
    assert (lowered == default) is same
    assert sum(lowered) == sum(default) == 4 * model.num_params
    if not same:
        assert first <= default[0] < cap <= lowered[0]
