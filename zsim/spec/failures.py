"""Failure models of training fleets: how often a job is interrupted, per GPU and per node,
and how long its re-launch takes. Owns `FailureModel`, the registry of named fleets built
from published statistics (`FLEETS`, `failure_model`), fleet files for one's own cluster
(FLEET_FILE_KEYS) and a job's failure rate (`job_failures_per_day`). Arithmetic, and the
reading of a fleet file; the run simulation (zsim.engine.run_replay) draws failures from
these rates.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path

from zsim.errors import ConfigError
from zsim.spec.yaml_file import read_yaml


def _non_negative(field: str, value: object) -> float:
    """`value`, a finite number >= 0 (not a bool), as a float.

    Raises:
        ConfigError: naming `field`.
    """
    if (isinstance(value, bool) or not isinstance(value, (int, float))
            or not (math.isfinite(value) and value >= 0)):
        raise ConfigError(field, value, "must be a finite number >= 0")
    return float(value)


@dataclass(frozen=True, slots=True, kw_only=True)
class FailureModel:
    """Rates of the failures that interrupt a training job, and its restart time. A job
    of g GPUs on n nodes fails at gpu_failures_per_gpu_day * g + node_failures_per_node_day
    * n per day, as a Poisson process over wall time."""

    gpu_failures_per_gpu_day: float
    """Interruptions caused by one GPU (faulty GPU, HBM, SRAM, ...) per GPU per day."""
    node_failures_per_node_day: float
    """Interruptions of host, network and other causes (software included) per node per
    day."""
    restart_s: float
    """Seconds from a failure to training again, without the checkpoint load (the caller
    adds it): re-launch of the job, re-init of the process groups and the data loader,
    warm-up steps."""
    source: str
    """Where the rates come from."""
    restart_assumed: bool = False
    """restart_s is an assumption, not a measured or published figure."""

    def __post_init__(self) -> None:
        for name in ("gpu_failures_per_gpu_day", "node_failures_per_node_day", "restart_s"):
            _non_negative(f"failures.{name}", getattr(self, name))


# Llama 3: Dubey et al. 2024, "The Llama 3 Herd of Models" (arXiv:2407.21783), Sec. 3.3.4,
# Table 5: 466 job interruptions in a 54-day snapshot of pre-training on 16,384 H100 GPUs
# (2,048 nodes of 8), 47 planned and 419 unexpected. The 419 by root cause (Table 5):
LLAMA3_GPUS = 16_384
LLAMA3_GPUS_PER_NODE = 8
LLAMA3_DAYS = 54
LLAMA3_UNEXPECTED = 419
LLAMA3_GPU_CAUSES: dict[str, int] = {
    "faulty GPU": 148, "GPU HBM3 memory": 72, "GPU SRAM memory": 19,
    "GPU system processor": 17, "silent data corruption": 6,
    "GPU thermal interface + sensor": 6}
"""Causes Table 5 files under the GPU (its "Component" column): charged per GPU, 268."""
LLAMA3_NODE_CAUSES: dict[str, int] = {
    "software bug": 54, "network switch/cable": 35, "host maintenance": 32, "NIC": 7,
    "NCCL watchdog timeouts": 7, "SSD": 3, "power supply": 3, "server chassis": 2,
    "IO expansion board": 2, "dependency": 2, "CPU": 2, "system memory": 2}
"""Host, network, software and other causes: charged per node, 151. Software bugs,
dependencies and NCCL timeouts are not node faults, but they scale with the job's size as
the node causes do, so they go here rather than into a constant per-job term."""

ASSUMED_RESTART_S = 600.0
"""Restart time the fleets below take: 10 minutes, an ASSUMPTION (neither source gives
the time from a failure to training again without the checkpoint load); failure_model's
restart_s (`--restart-s`, a scenario's `restart_s`) puts a measured figure in its
place."""

FLEETS: dict[str, FailureModel] = {
    "llama3": FailureModel(
        gpu_failures_per_gpu_day=sum(LLAMA3_GPU_CAUSES.values())
        / (LLAMA3_GPUS * LLAMA3_DAYS),
        node_failures_per_node_day=sum(LLAMA3_NODE_CAUSES.values())
        / (LLAMA3_GPUS // LLAMA3_GPUS_PER_NODE * LLAMA3_DAYS),
        restart_s=ASSUMED_RESTART_S, restart_assumed=True,
        source="Dubey et al. 2024, The Llama 3 Herd of Models, Sec. 3.3.4, Table 5: 419 "
               "unexpected interruptions in 54 days on 16,384 H100 GPUs (268 GPU causes "
               "per GPU, 151 other causes per 8-GPU node)"),
}
"""Named fleets. Kokolis et al. 2024 (Meta RSC-1/RSC-2, "Revisiting Reliability in
Large-Scale Machine Learning Research Clusters", arXiv:2410.21680) is left out: its
failure rates per 1000 node-days could not be confirmed from a source at hand."""


FLEET_FILE_KEYS: tuple[str, ...] = ("gpu_failures_per_gpu_day", "node_failures_per_node_day",
                                    "source", "restart_s")
"""Keys of a fleet file, the first three required: one's own cluster's rates, where they
come from, and optionally its restart time (else ASSUMED_RESTART_S, marked assumed)."""


def failure_model(name: str, *, restart_s: float | None = None) -> FailureModel:
    """The named fleet's failure model (FLEETS), or a fleet file's (a path ending in .yaml
    or .yml, FLEET_FILE_KEYS), with `restart_s` (seconds, the user's own figure) in place
    of its restart time where given.

    Raises:
        ConfigError: an unknown name (the message lists the known fleets); a bad fleet
            file (its key named); a restart_s that is not a finite number of seconds >= 0.
    """
    model = FLEETS.get(name)
    if model is None and isinstance(name, str) and name.endswith((".yaml", ".yml")):
        model = _fleet_file(Path(name))
    if model is None:
        raise ConfigError("failures", name, f"unknown fleet; known: {', '.join(FLEETS)}, "
                          "or a fleet file (.yaml)")
    if restart_s is None:
        return model
    return replace(model, restart_s=_non_negative("restart_s", restart_s),
                   restart_assumed=False)


def _fleet_file(path: Path) -> FailureModel:
    """A fleet from a YAML file of FLEET_FILE_KEYS."""
    data = read_yaml(path, field="fleet")
    if not isinstance(data, dict):
        raise ConfigError("fleet", str(path), "a fleet file is a mapping of "
                          f"{', '.join(FLEET_FILE_KEYS)}")
    for key, value in data.items():
        if key not in FLEET_FILE_KEYS:
            raise ConfigError(f"fleet.{key}", value, f"unknown key in {path}; known: "
                              f"{', '.join(FLEET_FILE_KEYS)}")
    for key in FLEET_FILE_KEYS[:3]:
        if key not in data:
            raise ConfigError(f"fleet.{key}", None, f"missing from {path}")
    if not isinstance(data["source"], str) or not data["source"].strip():
        raise ConfigError("fleet.source", data["source"], "must say where the rates come from")
    numbers = {k: _non_negative(f"fleet.{k}", data.get(k, ASSUMED_RESTART_S))
               for k in FLEET_FILE_KEYS if k != "source"}
    return FailureModel(**numbers, source=data["source"],
                        restart_assumed="restart_s" not in data)


def job_failures_per_day(model: FailureModel, gpus: int, gpus_per_node: int) -> float:
    """Interruptions per day of a job on `gpus` GPUs, `gpus_per_node` to a node (a partly
    filled last node counts as a node).

    Raises:
        ConfigError: gpus or gpus_per_node below 1.
    """
    for name, value in (("gpus", gpus), ("gpus_per_node", gpus_per_node)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(name, value, "must be an integer >= 1")
    nodes = -(-gpus // gpus_per_node)
    return model.gpu_failures_per_gpu_day * gpus + model.node_failures_per_node_day * nodes
