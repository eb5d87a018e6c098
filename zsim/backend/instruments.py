"""Measurements taken inside one training process: live tensor bytes (CPU peak memory),
saved-activation bytes per block, and per-unit forward/backward times.

Owns the instruments, not the training loop (zsim.backend.fsdp2 runs the step). Live
bytes follow torch.distributed._tools.mem_tracker.MemTracker's method: a
TorchDispatchMode sees every op's outputs, each new storage is held by a weak reference
whose callback subtracts its bytes when it dies, and UntypedStorage.resize_ (which FSDP2
uses to free all-gather buffers, and which no dispatch mode sees) is patched while the
tracker is active. Saved activations come from torch.autograd.graph.saved_tensors_hooks,
deduplicated by storage, parameters excluded. Imports torch.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.distributed.tensor import DTensor
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.weak import WeakIdKeyDictionary


class LiveMemory(TorchDispatchMode):
    """Bytes of tensor storage alive in this process, with a resettable peak.

    Storages created by ops while the mode is active are tracked automatically; storages
    that existed before (parameters, optimizer state) are added with `track()`. DTensor ops
    are left to desugar first, so the local shards are what is counted.
    """

    def __init__(self) -> None:
        super().__init__()
        self._refs: dict[int, weakref.ref[torch.UntypedStorage]] = {}
        self._size_bytes: dict[int, int] = {}
        self.live_bytes = 0
        """Bytes of storage alive now."""
        self.peak_bytes = 0
        """Highest live_bytes since the last reset_peak()."""
        self._orig_resize: Callable[..., Any] | None = None

    # ------------------------------------------------------------------ bookkeeping
    def _add(self, st: torch.UntypedStorage) -> None:
        # id() is safe as a key: the weakref callback drops it before the id can be reused.
        key = id(st)
        if st.device.type == "meta" or key in self._refs:
            return

        def _gone(_: object, key: int = key) -> None:
            self.live_bytes -= self._size_bytes.pop(key)
            self._refs.pop(key, None)

        self._refs[key] = weakref.ref(st, _gone)
        self._size_bytes[key] = st.nbytes()
        self._bump(st.nbytes())

    def _bump(self, delta_bytes: int) -> None:
        self.live_bytes += delta_bytes
        self.peak_bytes = max(self.peak_bytes, self.live_bytes)

    def reset_peak(self) -> None:
        self.peak_bytes = self.live_bytes

    # ------------------------------------------------------------------ mode
    def __enter__(self) -> LiveMemory:
        self._orig_resize = torch.UntypedStorage.resize_
        orig = self._orig_resize

        def resize_(st: torch.UntypedStorage, size: int) -> Any:
            out = orig(st, size)
            key = id(st)
            if key in self._size_bytes:
                old, new = self._size_bytes[key], st.nbytes()
                self._size_bytes[key] = new
                self._bump(new - old)
            return out

        torch.UntypedStorage.resize_ = resize_  # type: ignore[method-assign]
        super().__enter__()
        return self

    def __exit__(self, *args: Any) -> None:
        super().__exit__(*args)
        torch.UntypedStorage.resize_ = self._orig_resize  # type: ignore[method-assign]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        if any(t is DTensor for t in types):
            return NotImplemented
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and not isinstance(t, DTensor):
                self._add(t.untyped_storage())
        return out


@dataclass(frozen=True, slots=True, kw_only=True)
class SavedTensor:
    """One storage autograd keeps from forward to backward."""

    scope: str
    """Module that saved it first: "layers.<i>" for a block, "root" otherwise."""
    producer: str
    """The aten op that created the storage (e.g. "aten.mm.default")."""
    shape: tuple[int, ...]
    """Shape of the first tensor saved from this storage."""
    dtype: str
    """torch dtype name, e.g. "bfloat16"."""
    bytes: int
    """Storage size, bytes."""


class _Producers(TorchDispatchMode):
    """Remembers which op created each live storage (the last op whose output it was)."""

    def __init__(self) -> None:
        super().__init__()
        self.by_storage: WeakIdKeyDictionary = WeakIdKeyDictionary()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                st = t.untyped_storage()
                if st not in self.by_storage:
                    self.by_storage[st] = str(func)
        return out


@dataclass(slots=True)
class _Scope:
    name: str = "root"
    stack: list[str] = field(default_factory=list)


@contextmanager
def record_saved_tensors(model: nn.Module, block_names: list[str]) -> Iterator[list[SavedTensor]]:
    """Record every storage autograd saves during the forward run inside the context.

    Each storage is listed once, under the first block that saved it; parameter storages
    are skipped (they are weights, not activations). Blocks wrapped in full activation
    checkpointing save nothing through autograd: their kept inputs are recorded instead,
    with producer "checkpoint.input".

    Args:
        model: the model about to run forward.
        block_names: qualified names of the blocks to attribute tensors to.

    Yields:
        The list that fills with SavedTensor records as forward runs.
    """
    records: list[SavedTensor] = []
    seen: WeakIdKeyDictionary = WeakIdKeyDictionary()
    scope = _Scope()
    modules = dict(model.named_modules())
    producers = _Producers()

    def is_param(st: torch.UntypedStorage) -> bool:
        # Checked at save time: FSDP2 swaps unsharded parameters in only around a unit.
        return any(_local(p).untyped_storage() is st for p in model.parameters())

    def note(t: torch.Tensor, producer: str | None = None) -> None:
        # A DTensor (tensor parallelism saves them inside its linears) by its local shard.
        t = _local(t)
        st = t.untyped_storage()
        if st in seen or st.device.type == "meta" or is_param(st):
            return
        seen[st] = True
        records.append(SavedTensor(
            scope=scope.name, producer=producer or producers.by_storage.get(st, "input"),
            shape=tuple(t.shape), dtype=str(t.dtype).removeprefix("torch."),
            bytes=st.nbytes()))

    def pack(t: torch.Tensor) -> torch.Tensor:
        note(t)
        return t

    handles = []
    for name in block_names:
        mod = modules[name]

        def pre(m: nn.Module, a: Any, name: str = name) -> None:
            scope.stack.append(scope.name)
            scope.name = name
            if getattr(m, "_zsim_checkpointed", False):
                for t in tree_flatten(a)[0]:
                    if isinstance(t, torch.Tensor):
                        note(t, "checkpoint.input")

        def post(m: nn.Module, a: Any, o: Any) -> None:
            scope.name = scope.stack.pop()

        handles += [mod.register_forward_pre_hook(pre), mod.register_forward_hook(post)]
        policy = getattr(mod, "_zsim_sac_policy", None)
        if policy is not None:
            policy.on_save = lambda t, op: note(t, op)
    try:
        with producers, torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            yield records
    finally:
        for h in handles:
            h.remove()
        for name in block_names:
            policy = getattr(modules[name], "_zsim_sac_policy", None)
            if policy is not None:
                policy.on_save = None


def _local(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's local shard (the tensor itself otherwise), read from the DTensor rather
    than through to_local(): that would run a view op through the dispatch modes (the live
    tensor tracker's included) for every parameter each saved tensor is checked against."""
    return t._local_tensor if isinstance(t, DTensor) else t


@dataclass(slots=True)
class UnitTimes:
    """Forward and backward wall time per unit of one step, seconds."""

    forward_s: dict[str, float] = field(default_factory=dict)
    backward_s: dict[str, float] = field(default_factory=dict)


@contextmanager
def time_units(units: dict[str, nn.Module]) -> Iterator[UnitTimes]:
    """Time each unit's forward (pre- to post-forward hook) and backward (from the moment
    the gradient of its output is ready to the moment the gradient of its input is).

    The backward span includes any recomputation and the unit's reduce-scatter issue, as
    both happen inside it. Units whose input does not require grad (the first unit's
    token ids) have no backward entry.
    """
    times = UnitTimes()
    handles = []
    out_ready: dict[str, float] = {}
    for name, mod in units.items():

        def pre(m: nn.Module, a: Any, name: str = name) -> None:
            times.forward_s[name] = -time.perf_counter()
            for t in tree_flatten(a)[0]:
                if isinstance(t, torch.Tensor) and t.requires_grad:
                    t.register_hook(lambda g, name=name: _bw_end(name, g))
                    break

        def post(m: nn.Module, a: Any, o: Any, name: str = name) -> None:
            times.forward_s[name] += time.perf_counter()
            for t in tree_flatten(o)[0]:
                if isinstance(t, torch.Tensor) and t.requires_grad:
                    t.register_hook(lambda g, name=name: _bw_start(name, g))
                    break

        handles += [mod.register_forward_pre_hook(pre), mod.register_forward_hook(post)]

    def _bw_start(name: str, g: torch.Tensor) -> None:
        out_ready[name] = time.perf_counter()

    def _bw_end(name: str, g: torch.Tensor) -> None:
        if name in out_ready:
            times.backward_s[name] = time.perf_counter() - out_ready.pop(name)

    try:
        yield times
    finally:
        for h in handles:
            h.remove()
