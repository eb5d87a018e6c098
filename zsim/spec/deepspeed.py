"""DeepSpeedZero: the settings of DeepSpeed's ZeRO that zsim models, with DeepSpeed 0.19's
defaults: zero_optimization's (deepspeed/runtime/zero/config.py, DeepSpeedZeroConfig) and
the two that change the ZeRO optimizer's step (gradient_clipping, bf16.check_grad_overflow).

Owns the knobs and their single-field checks: the options type of the deepspeed program
(Plan.options; under `ds` in a plan's YAML; zsim.spec.programs.ProgramOptions). The
lowering (zsim.schedule.programs.deepspeed) reads them, the config reader
(zsim.spec.ds_config) fills them from a user's ds_config.json. Imports only zsim.errors.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any, Literal

from zsim.errors import ConfigError
from zsim.spec.strict import check_keys

OffloadDevice = Literal["none", "cpu", "nvme"]

ZERO_STAGES: dict[str, int] = {"zero1": 1, "zero2": 2, "zero3": 3}
"""The ZeRO stage each zero strategy runs as under DeepSpeed."""


@dataclass(frozen=True, slots=True, kw_only=True)
class DeepSpeedZero:
    """ZeRO settings; sizes are in elements, as DeepSpeed counts them."""

    reduce_bucket_size: int = 500_000_000
    """Elements per gradient reduction bucket (the ipg bucket, a buffer of this many
    elements in the gradient dtype; two with overlap_comm)."""
    allgather_bucket_size: int = 500_000_000
    """ZeRO-1/2: elements per all-gather of the updated 16-bit parameters after the step,
    as the config says (the backend passes it on). DeepSpeed 0.19 uses it only where torch
    lacks all_gather_into_tensor; otherwise it makes one all-gather per parameter group,
    and so does the simulator."""
    overlap_comm: bool | None = None
    """Reduce gradients on a side stream while backward runs; None is DeepSpeed's default:
    true for stage 3, false for stages 1 and 2."""
    contiguous_gradients: bool = True
    """Copy each gradient into the bucket buffer (and the rank's partition into a
    contiguous buffer) as it is produced."""
    prefetch_bucket_size: int = 50_000_000
    """ZeRO-3 (stage3_prefetch_bucket_size): elements of parameters fetched ahead of use."""
    param_persistence_threshold: int = 100_000
    """ZeRO-3 (stage3_param_persistence_threshold): parameters with fewer elements are not
    partitioned: every rank keeps them whole."""
    max_live_parameters: int = 1_000_000_000
    """ZeRO-3 (stage3_max_live_parameters): elements gathered at once at most (caps the
    prefetch)."""
    max_reuse_distance: int = 1_000_000_000
    """ZeRO-3 (stage3_max_reuse_distance): a gathered parameter used again within this many
    elements of fetches is not released."""
    sub_group_size: int = 1_000_000_000
    """ZeRO-3: elements of the fp32 partition the optimizer steps on at a time (each
    sub-group's fp32 gradients are cast, stepped and released before the next)."""
    offload_device: OffloadDevice = "none"
    """Where offload_optimizer / offload_param put their state ("cpu" or "nvme"); "none"
    when the plan offloads nothing. The plan's `offload` says what is offloaded."""
    pin_memory: bool = False
    """offload_optimizer.pin_memory: host buffers page-locked; DeepSpeed's default is
    pageable memory, whose copies run at the profile's pageable PCIe rates."""
    gradient_clipping: float = 1.0
    """The config's top-level gradient_clipping (DeepSpeed 0.19's default 1.0, constants.py
    GRADIENT_CLIPPING_DEFAULT): above 0, stages 1 and 2 scale the fp32 gradient partition
    by the clip factor before the update (unscale_and_clip_grads, one pass over it; 0 skips
    it unless fp16's loss scale needs it); stage 3 scales it either way."""
    check_grad_overflow: bool = True
    """bf16.check_grad_overflow (default true): stages 1 and 2 scan every gradient of the
    partition for inf/NaN before the step and all-reduce the flag (fp16 always, fp32
    never; stage 3 only under fp16)."""

    def __post_init__(self) -> None:
        for f in ("reduce_bucket_size", "allgather_bucket_size", "prefetch_bucket_size",
                  "param_persistence_threshold", "max_live_parameters",
                  "max_reuse_distance", "sub_group_size"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ConfigError(f"plan.ds.{f}", v, "must be an integer >= 0")
        for f in ("reduce_bucket_size", "sub_group_size"):
            if getattr(self, f) == 0:
                raise ConfigError(f"plan.ds.{f}", 0, "must be > 0")
        if self.overlap_comm is not None and not isinstance(self.overlap_comm, bool):
            raise ConfigError("plan.ds.overlap_comm", self.overlap_comm, "must be true or false")
        for f in ("pin_memory", "check_grad_overflow"):
            if not isinstance(getattr(self, f), bool):
                raise ConfigError(f"plan.ds.{f}", getattr(self, f), "must be true or false")
        if not is_clipping(self.gradient_clipping):
            raise ConfigError("plan.ds.gradient_clipping", self.gradient_clipping,
                              "must be a number >= 0")
        if not isinstance(self.contiguous_gradients, bool):
            raise ConfigError("plan.ds.contiguous_gradients", self.contiguous_gradients,
                              "must be true or false")
        if self.offload_device not in ("none", "cpu", "nvme"):
            raise ConfigError("plan.ds.offload_device", self.offload_device,
                              "must be none, cpu or nvme")

    def scans_for_overflow(self, stage: int, param_dtype: str) -> bool:
        """Whether the step scans the gradients for inf/NaN and all-reduces the flag:
        under fp16 always, under bf16 in stages 1 and 2 unless check_grad_overflow is off
        (engine.py), never in fp32."""
        return param_dtype == "fp16" or (param_dtype == "bf16" and stage < 3
                                         and self.check_grad_overflow)

    def overlaps(self, stage: int) -> bool:
        """overlap_comm as DeepSpeed resolves it for `stage`."""
        return stage == 3 if self.overlap_comm is None else self.overlap_comm

    @property
    def pinned_host_buffers(self) -> bool:
        """Whether the offload buffers on the host are page-locked (pin_memory)."""
        return self.pin_memory

    def for_offload(self, offload: str) -> DeepSpeedZero:
        """The settings of a plan offloading `offload`: the offload device this one names
        (cpu where it names none), or none without offload."""
        device = self.offload_device if self.offload_device != "none" else "cpu"
        return replace(self, offload_device=device if offload != "none" else "none")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Any, *, where: str = "plan.ds") -> DeepSpeedZero:
        """Strict: unknown keys raise ConfigError naming the key."""
        return cls(**check_keys(cls, data, where=where))


def is_clipping(value: Any) -> bool:
    """A gradient_clipping DeepSpeed takes: a number >= 0 (0 turns clipping off)."""
    return not isinstance(value, bool) and isinstance(value, (int, float)) and value >= 0
