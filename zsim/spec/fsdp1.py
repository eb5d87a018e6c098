"""Fsdp1Options: the FullyShardedDataParallel (FSDP1) constructor arguments zsim models,
with torch's defaults (torch/distributed/fsdp/fully_sharded_data_parallel.py).

Owns the knobs and their single-field checks: the options type of the fsdp1 program
(Plan.options; under `fsdp1` in a plan's YAML; zsim.spec.programs.ProgramOptions). The
lowering (zsim.schedule.programs.fsdp1) reads them, the accelerate config reader
(zsim.spec.fsdp_config) fills them. The sharding
strategy is the plan's (fsdp: FULL_SHARD, fsdp-no-reshard: SHARD_GRAD_OP, hsdp:
HYBRID_SHARD). Imports only zsim.errors.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal

from zsim.errors import ConfigError
from zsim.spec.strict import check_keys

BackwardPrefetch = Literal["pre", "post", "none"]
BACKWARD_PREFETCH: tuple[str, ...] = ("pre", "post", "none")


@dataclass(frozen=True, slots=True, kw_only=True)
class Fsdp1Options:
    """FSDP1's scheduling knobs."""

    backward_prefetch: BackwardPrefetch = "pre"
    """BackwardPrefetch.BACKWARD_PRE (torch's default: the next unit's all-gather is
    issued in the current unit's pre-backward, before its gradient computation),
    BACKWARD_POST (after it, in the post-backward hook) or None ("none": each unit
    all-gathers in its own pre-backward)."""
    forward_prefetch: bool = False
    """Issue the next unit's all-gather in the current unit's pre-forward."""
    limit_all_gathers: bool = True
    """The rate limiter: the host blocks before an all-gather while two freed units'
    frees have not completed (_FreeEventQueue, at most 2 in flight)."""

    def __post_init__(self) -> None:
        if self.backward_prefetch not in BACKWARD_PREFETCH:
            raise ConfigError("plan.fsdp1.backward_prefetch", self.backward_prefetch,
                              f"must be one of {', '.join(BACKWARD_PREFETCH)}")
        for f in ("forward_prefetch", "limit_all_gathers"):
            if not isinstance(getattr(self, f), bool):
                raise ConfigError(f"plan.fsdp1.{f}", getattr(self, f), "must be true or false")

    @property
    def pinned_host_buffers(self) -> bool:
        """FSDP1's CPUOffload pins its host buffers (offload is not modelled for FSDP1)."""
        return True

    def for_offload(self, offload: str) -> Fsdp1Options:
        """The knobs do not depend on offload."""
        return self

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Any, *, where: str = "plan.fsdp1") -> Fsdp1Options:
        """Strict: unknown keys raise ConfigError naming the key."""
        return cls(**check_keys(cls, data, where=where))
