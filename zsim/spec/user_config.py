"""A user's own config as a Plan: a DeepSpeed JSON config (zsim.spec.ds_config) or an
accelerate FSDP config YAML (zsim.spec.fsdp_config), completed by the caller's values
where it leaves them open. Shared by `zsim simulate`/`zsim plan` (zsim.api) and scenario
runs (zsim.scenario); owns only the choice between the two readers and their defaults."""

from __future__ import annotations

from pathlib import Path

from zsim.errors import ConfigError
from zsim.spec.ds_config import ds_plan, read_ds_config
from zsim.spec.fsdp_config import fsdp_plan, read_fsdp_config
from zsim.spec.hardware import HardwareProfile
from zsim.spec.model import ModelSpec
from zsim.spec.plan import Plan


def config_plan(spec: ModelSpec, hw: HardwareProfile, *, ds_config: Path | None,
                fsdp_config: Path | None, gpus: int, where: str | None = None,
                strategy: str | None = None,
                shard_group: int | None = None, seq: int | None = None,
                micro_batch: int | None = None, grad_accum: int | None = None,
                ac: str = "none", precision: str | None = None,
                offload: str = "none") -> tuple[Plan, tuple[str, ...]]:
    """The plan of a user's DeepSpeed JSON (zsim.spec.ds_config) or accelerate FSDP YAML
    (zsim.spec.fsdp_config), the flags filling what it leaves "auto" (micro-batch 1, one
    micro-batch per step and bf16 by default), with the config's warnings (keys read but
    not modelled). Errors name the file as `where` (default: its path).

    Raises:
        ConfigError: both configs or neither, a bad config file, or a flag conflicting
            with it.
    """
    seq_len = seq if seq is not None else spec.max_seq_len
    if ds_config is not None and fsdp_config is not None:
        raise ConfigError("fsdp_config", str(fsdp_config), "give one config, not a DeepSpeed "
                          "and an FSDP config together")
    if fsdp_config is not None:
        return fsdp_plan(
            read_fsdp_config(fsdp_config), where=where or str(fsdp_config), gpus=gpus,
            gpus_per_node=hw.gpus_per_node, seq_len=seq_len, num_layers=spec.num_layers,
            strategy=strategy, micro_batch=1 if micro_batch is None else micro_batch,
            grad_accum=1 if grad_accum is None else grad_accum, precision=precision,
            recompute=ac, shard_group=shard_group)
    if ds_config is None:
        raise ConfigError("ds_config", None, "give a DeepSpeed or an FSDP config")
    config = read_ds_config(ds_config, hidden_size=spec.d_model)
    plan = ds_plan(config, where=where or str(ds_config), gpus=gpus, seq_len=seq_len,
                   strategy=strategy, micro_batch=micro_batch, grad_accum=grad_accum,
                   precision=precision, recompute=ac, offload=offload)
    return plan, config.warnings
