"""Real checkpoint saves and loads of a prepared plan on gloo ranks: bytes each rank
writes (from the files on disk), save, stall, background and load times, and the offline
conversions to one file. The simulator's checkpoint model is checked against these rows.

`measure_checkpoints` prepares the plan as the backend does (zsim.backend.programs.
prepare), runs one training step so that the optimizer state exists, then for each method
saves into a fresh subfolder of `directory`; then, as a restart does, new rank processes
prepare the same plan afresh and load it. Each is barrier-timed (max over ranks). The
restart's ranks run under glibc's malloc defaults, as a GPU host's trainer's host memory
does: the backend's caching settings (zsim.backend.runner.HOST_MALLOC_ENV) stand in for
the CUDA caching allocator in training steps, and would hand a CPU rank's load the heap
its own preparation freed, which a GPU host's load never finds.

What each method writes, per rank (torch 2.13, DeepSpeed 0.19; the byte figures are the
tiny reference model's at world 2, measured by tests/backend/test_checkpoint_run.py):

- "dcp": torch.distributed.checkpoint.save (state_dict_saver.py `save`) of
  {"model", "optim"} from state_dict.py `get_state_dict(model, optimizer)`, as
  torchtitan's ModelWrapper/OptimizersContainer hand it over, with FileSystemWriter
  (filesystem.py; single_file_per_rank=True, thread_count=1, sync_files=True). Rank r
  writes one file `__{r}_0.distcp` (`__{r}_{i}` for thread i; write_data's gen_file)
  holding its items: every DTensor's local shard (model parameters, AdamW exp_avg and
  exp_avg_sq: FSDP2 shards dim 0, so ceil/floor rows of each tensor), plus the
  replicated items, which `_dedup_save_plans.dedup_save_plans` gives to one rank each,
  the one with the smallest plan so far (the 0-dim fp32 AdamW `step` tensors, 4 bytes
  each, and the pickled param_groups entries as BYTE_IO items, one per parameter and
  key). Each tensor item is written by `_write_item` as its own `torch.save(tensor,
  stream)` zip archive (SerializationFormat.TORCH_SAVE), so a file costs the raw bytes
  plus a per-item container overhead (zip local headers, the pickled tensor record, the
  byteorder/version records, 64-byte data alignment: ~1 KiB an item, measured in the
  test), then one fsync per file (`_write_files_from_queue`). The coordinator (rank 0)
  writes `.metadata` (pickled Metadata: every item's chunk offsets and sizes), fsync'd
  (FileSystemWriter.finish). bytes_per_rank counts the .distcp files only.
- "dcp-async": the same files from `async_save` with its default stager
  (DefaultStager(StagingOptions(False, False, False, False)): a synchronous copy of the
  state dict, here in the caller's thread) and the default
  AsyncCheckpointerType.THREAD executor (_async_thread_executor.py: `save` in one
  background thread), on a separate gloo group, as torchtitan does. stall_s is to the
  return of async_save, background_s from there to future.result().
- "full": `get_model_state_dict` / `get_optimizer_state_dict` with
  StateDictOptions(full_state_dict=True, cpu_offload=True): the ranks all-gather every
  tensor and only rank 0 keeps it (state_dict.py `_maybe_full_or_cpu_state_dict`); for
  FSDP1, FSDP's own FULL_STATE_DICT with FullStateDictConfig(rank0_only=True) and
  FSDP.optim_state_dict (what that call runs, but offload_to_cpu only for CUDA
  parameters: on CPU torch 2.13's FSDP1 fails there, see _fsdp1_full_state), then
  rank 0 alone torch.save's {"model",
  "optim"} to `full.pt` and fsyncs it (fsync added here, as DCP does). One file, about
  the full fp32 parameters + moments + steps + param_groups. Load: rank 0 torch.load,
  then set_model_state_dict / set_optimizer_state_dict with full_state_dict=True,
  broadcast_from_rank0=True (other ranks pass {}).
- "deepspeed": engine.save_checkpoint(dir, tag) (runtime/engine.py), each file one
  plain torch.save (checkpoint_engine/torch_checkpoint_engine.py: no fsync). The model
  file is written by `_save_checkpoint` where `save_non_zero_checkpoint`
  (`_configure_checkpointing`: the data-parallel writer, dp rank 0, for stage 1/2; every
  rank of the first weights partition group for stage 3): stage 1/2
  `mp_rank_00_model_states.pt` on rank 0 only: `module_state_dict()`, the 16-bit module
  parameters whole (2 x 494,208 = 988,416 B here; the RoPE tables are non-persistent
  buffers), plus `_common_checkpoint_state` metadata (param_shapes, ds_config, ...):
  995,225 B; stage 3 `zero_pp_rank_{r}_mp_rank_00_model_states.pt` on every rank,
  metadata only: its module state holds every parameter, persistent ones (numel <=
  stage3_param_persistence_threshold) included, as an empty placeholder (~11 KB here);
  stage 3 saves no 16-bit weights at all.
  `_save_zero_checkpoint` writes `{bf16_}zero_pp_rank_{r}_mp_rank_00_optim_states.pt`
  (`_get_zero_ckpt_prefix`: "bf16_" when bf16 is on) on every rank: the ZeRO
  optimizer's state_dict: stage 1/2 (zero/stage_1_and_2.py `state_dict`) the base
  optimizer's state (exp_avg, exp_avg_sq of the rank's flat fp32 partition, padding
  included, and step) and `single_partition_of_fp32_groups` without padding; stage 3
  (zero/stage3.py `_rigid_state_dict`) the base optimizer's state of
  `fp32_partitioned_groups_flat` and those flat fp32 partitions (`fp32_flat_groups`).
  Either way 3 x 4 bytes per parameter of the partition: 2,965,248 B + 4,453 B of pickle
  per rank here. Rank 0 also writes `latest` in `dir` and copies `zero_to_fp32.py` and
  `zero_to_torch.py` there (`_copy_recovery_script`); they count in bytes_total, not in
  any rank's bytes.

Measured here (tiny reference model, 494,208 parameters, world 2, fp32 shards and AdamW;
tests/backend/test_checkpoint_run.py pins them): "dcp" 3,064,599 and 3,113,552 B per
rank (2,965,248 B of shards each; 63 and 84 tensor items at 1,573-1,577 B of container
each; rank 1 also got the 21 steps and 12 pickled param_groups items, 15,836 B), .metadata
40.6 KB; "full" 5,954,663 B on rank 0 (5,930,580 B of tensors); DeepSpeed zero2
3,964,926 and 2,969,701 B, zero3 2,980,494 B per rank.

Conversions (`convert_checkpoint`, one process): "dcp" with
torch.distributed.checkpoint.format_utils.dcp_to_torch_save (all items into one
torch.save file), "deepspeed" with deepspeed.utils.zero_to_fp32.
convert_zero_checkpoint_to_fp32_state_dict (the fp32 master partitions merged into one
fp32 state dict, pytorch_model.bin). Imports torch; DeepSpeed only for DeepSpeed plans.
"""

from __future__ import annotations

import hashlib
import inspect
import os
import re
import shutil
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from zsim.backend import programs, training
from zsim.backend.runner import RankContext, run_ranks
from zsim.errors import ConfigError
from zsim.spec.model import ModelSpec
from zsim.spec.plan import Plan

METHODS = ("dcp", "dcp-async", "full", "deepspeed")
"""The checkpoint methods measured."""
TORCH_METHODS = ("dcp", "dcp-async", "full")
"""Methods of torch programs (FSDP2, FSDP1); "deepspeed" runs DeepSpeed plans only."""
WARMUP_SUFFIX = "-first"
"""The folder of each method's first (untimed for save_s) save, removed after it."""
DS_TAG = "ckpt"
"""The DeepSpeed checkpoint tag (its subfolder)."""
FULL_FILE = "full.pt"
"""The one file of a "full" checkpoint, written by rank 0."""


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckpointMeasurement:
    """One method's save and load of one plan's checkpoint, measured."""

    method: str
    program: str
    """The plan's program (Plan.impl: "fsdp2", "fsdp1", "deepspeed", ...)."""
    with_optimizer: bool
    world_size: int
    bytes_per_rank: tuple[int, ...]
    """Bytes of the files each rank wrote (see the module docstring), from file sizes."""
    bytes_total: int
    """All files of the checkpoint, metadata included."""
    files: int
    save_s: float
    """Barrier before the call to the write's completion, max over ranks: the second save
    of the process (the first pays one-off costs: first_save_s)."""
    stall_s: float
    """Time the training loop is blocked: save_s for a synchronous method, to the return
    of async_save for "dcp-async"."""
    background_s: float
    """"dcp-async": from async_save's return to future.result(); 0 otherwise."""
    load_s: float
    """Load into a freshly prepared model/optimizer in new rank processes (a restart's),
    barrier to barrier, max over ranks. The optimizer's state is created before it
    (torch programs: get_state_dict's _init_optim_state, an optimizer step with zero
    gradients, milliseconds on a GPU)."""
    loaded_equal: bool
    """Every rank's local parameter shards after load equal those saved (by digest)."""
    fresh_differed: bool
    """The fresh model's shards differed from those saved before the load (so the
    equality after it is the checkpoint's doing)."""
    path: str
    """The checkpoint's folder."""
    first_save_s: float = 0.0
    """The process's first save of this method, max over ranks."""
    convert_s: float | None = None
    """Offline conversion to one file (dcp_to_torch_save, zero_to_fp32), one process."""
    convert_bytes: int | None = None
    """Bytes the conversion wrote."""


def measure_checkpoints(spec: ModelSpec, plan: Plan, *, nproc: int, directory: str | Path,
                        methods: tuple[str, ...] | list[str], with_optimizer: bool = True,
                        convert: bool = False, warmup: bool = True,
                        timeout_s: float = 300.0) -> list[CheckpointMeasurement]:
    """Save and load a checkpoint of `plan` with each of `methods` on `nproc` gloo ranks.

    Args:
        directory: where each method's checkpoint goes, in a fresh subfolder
            "<index>-<method>" (which must not exist yet).
        methods: names from METHODS ("deepspeed" for DeepSpeed plans, the others for
            FSDP2 and FSDP1 plans).
        with_optimizer: save the optimizer state too (DeepSpeed always does).
        convert: also time the offline conversion of "dcp" and "deepspeed" checkpoints.
        warmup: save once more before the timed save, so that save_s is the steady state
            (first_save_s the first); without, one save (for tests that count bytes).

    Raises:
        ConfigError: an unknown method, or one the plan's program does not run.
        RankFailed: a rank failed (see zsim.backend.runner.run_ranks).
    """
    is_ds = plan.impl == "deepspeed"
    for m in methods:
        if m not in METHODS:
            raise ConfigError("methods", m, f"must be one of {', '.join(METHODS)}")
        if (m == "deepspeed") != is_ds or (not is_ds and plan.impl not in ("fsdp2", "fsdp1")):
            raise ConfigError("methods", m, f"does not run program {plan.impl}")
    if is_ds and not with_optimizer:
        raise ConfigError("with_optimizer", with_optimizer,
                          "DeepSpeed's save_checkpoint always saves the optimizer")
    root = Path(directory)
    paths = [root / f"{i}-{m}" for i, m in enumerate(methods)]
    for p in paths:
        if p.exists():
            raise ConfigError("directory", str(p), "a checkpoint folder must be fresh")
        p.mkdir(parents=True)
    jobs = [(m, str(p)) for m, p in zip(methods, paths, strict=True)]
    payload = (spec, plan, jobs, with_optimizer, warmup)
    ranks = run_ranks(checkpoint_rank, payload, nproc=nproc, timeout_s=timeout_s)
    saved = [r["saved"] for r in ranks]
    rows = []
    for i, (m, p) in enumerate(zip(methods, paths, strict=True)):
        per_rank, total, files = checkpoint_bytes(m, p, nproc)
        loads = run_ranks(restart_rank, (spec, plan, m, str(p), with_optimizer, saved),
                          nproc=nproc, timeout_s=timeout_s, malloc_env={})
        timings = [{**r["saves"][i], **load} for r, load in zip(ranks, loads, strict=True)]
        row = CheckpointMeasurement(
            method=m, program=plan.impl, with_optimizer=with_optimizer, world_size=nproc,
            bytes_per_rank=per_rank, bytes_total=total, files=files,
            save_s=max(t["save_s"] for t in timings),
            stall_s=max(t["stall_s"] for t in timings),
            background_s=max(t["background_s"] for t in timings),
            load_s=max(t["load_s"] for t in timings),
            loaded_equal=all(t["loaded_equal"] for t in timings),
            fresh_differed=all(t["fresh_differed"] for t in timings), path=str(p),
            first_save_s=max(t["first_save_s"] for t in timings))
        if convert and m in ("dcp", "deepspeed"):
            seconds, nbytes = convert_checkpoint(m, p, timeout_s=timeout_s)
            row = replace(row, convert_s=seconds, convert_bytes=nbytes)
        rows.append(row)
    return rows


_DCP_FILE = re.compile(r"__(\d+)_\d+\.distcp$")
_DS_RANK_FILE = re.compile(r"(?:bf16_)?zero_pp_rank_(\d+)_mp_rank_\d+_(model|optim)_states\.pt$")


def checkpoint_bytes(method: str, path: Path,
                     world_size: int) -> tuple[tuple[int, ...], int, int]:
    """(bytes each rank wrote, bytes of all files, number of files) of a checkpoint
    folder, by file name (see the module docstring)."""
    per_rank = [0] * world_size
    total = files = 0
    for f in sorted(path.rglob("*")):
        if not f.is_file():
            continue
        size = f.stat().st_size
        total += size
        files += 1
        rank = _writer(method, f.name)
        if rank is not None:
            per_rank[rank] += size
    return tuple(per_rank), total, files


def _writer(method: str, name: str) -> int | None:
    """The rank that wrote the file `name`, None for metadata."""
    if method in ("dcp", "dcp-async"):
        m = _DCP_FILE.match(name)
        return int(m.group(1)) if m else None
    if method == "full":
        return 0 if name == FULL_FILE else None
    m = _DS_RANK_FILE.match(name)
    if m:
        return int(m.group(1))
    return 0 if re.match(r"mp_rank_\d+_model_states\.pt$", name) else None


def checkpoint_rank(ctx: RankContext, payload: Any) -> dict[str, Any]:
    """Rank function of measure_checkpoints: one training step, then for each (method,
    folder) a timed save.

    Returns:
        {"saved": the digests of this rank's local parameters (digests), "saves": per
        method save_s, stall_s, background_s, first_save_s}.
    """
    spec, plan, jobs, with_optimizer, warmup = payload
    prep = programs.prepare(spec, plan, device=ctx.device, world_size=ctx.world_size)
    training.train_step(prep, training.batches(spec, plan, device=ctx.device,
                                               rank=ctx.rank, step=0))
    async_group = dist.new_group(backend="gloo") if any(
        m == "dcp-async" for m, _ in jobs) else None
    out = []
    for method, path in jobs:
        # The first save of a process also pays one-off costs (DCP's thread pools and
        # planner, DeepSpeed's engine state, the page cache's first touch of a file):
        # timed apart, in a folder removed after, so that save_s is a run's steady state.
        first_save_s = None
        if warmup:
            os.makedirs(path + WARMUP_SUFFIX, exist_ok=True)
            first_save_s = _save(method, prep, path + WARMUP_SUFFIX, with_optimizer,
                                 async_group)["save_s"]
            if ctx.rank == 0:
                shutil.rmtree(path + WARMUP_SUFFIX)
            training.barrier()
        row = _save(method, prep, path, with_optimizer, async_group)
        row["first_save_s"] = row["save_s"] if first_save_s is None else first_save_s
        out.append(row)
    return {"saved": digests(local_parameters(prep)), "saves": out}


def restart_rank(ctx: RankContext, payload: Any) -> dict[str, Any]:
    """Rank function of measure_checkpoints: a restart's load, in a new process, into a
    freshly prepared plan whose optimizer state exists (CheckpointMeasurement.load_s).

    Returns:
        load_s, fresh_differed, loaded_equal (against the saving ranks' digests).
    """
    spec, plan, method, path, with_optimizer, saved = payload
    fresh = programs.prepare(spec, plan, device=ctx.device, world_size=ctx.world_size)
    if not _is_deepspeed(fresh) and with_optimizer:  # DeepSpeed's exists from its init
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

        get_optimizer_state_dict(fresh.model, optimizer_of(fresh))  # _init_optim_state
    before = digests(local_parameters(fresh))
    load_s = _load(method, fresh, path, with_optimizer)
    return {"load_s": load_s, "fresh_differed": before != saved[ctx.rank],
            "loaded_equal": digests(local_parameters(fresh)) == saved[ctx.rank]}


def optimizer_of(prep: training.Prepared) -> torch.optim.Optimizer:
    """The optimizer a torch program's step closes over (fsdp2.stepper, fsdp1.prepare)."""
    found = inspect.getclosurevars(prep.step).nonlocals.get("optimizer")
    if not isinstance(found, torch.optim.Optimizer):
        raise TypeError(f"no optimizer in the step of {type(prep.model).__name__}")
    return found


def local_parameters(prep: training.Prepared) -> list[torch.Tensor]:
    """What this rank holds of the parameters: FSDP2 DTensors' local shards, FSDP1's
    local FlatParameter shards, DeepSpeed's 16-bit parameters (stage 3: their
    partitions, ds_tensor) and its fp32 master partitions."""
    from torch.distributed.tensor import DTensor

    if _is_deepspeed(prep):
        zero = prep.model.optimizer
        params = [p.ds_tensor if hasattr(p, "ds_tensor") else p
                  for p in prep.model.module.parameters()]
        masters = list(getattr(zero, "single_partition_of_fp32_groups", None)
                       or getattr(zero, "fp32_partitioned_groups_flat", []))
        return [t.detach() for t in params + masters]
    return [(p.to_local() if isinstance(p, DTensor) else p).detach()
            for p in prep.model.parameters()]


def _is_deepspeed(prep: training.Prepared) -> bool:
    return type(prep.model).__module__.startswith("deepspeed")


def digests(tensors: list[torch.Tensor]) -> list[tuple[tuple[int, ...], str]]:
    """Each tensor's shape and a digest of its bytes: equal digests, equal tensors (a
    rank's state passed between processes without its gigabytes)."""
    return [(tuple(t.shape), hashlib.blake2b(
        t.detach().contiguous().reshape(-1).view(torch.uint8).numpy()).hexdigest())
        for t in tensors]


def _state(prep: training.Prepared, with_optimizer: bool) -> dict[str, Any]:
    """{"model": ..., "optim": ...} as get_state_dict returns them (sharded)."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_state_dict

    if with_optimizer:
        model_sd, optim_sd = get_state_dict(prep.model, optimizer_of(prep))
        return {"model": model_sd, "optim": optim_sd}
    return {"model": get_model_state_dict(prep.model)}


def _save(method: str, prep: training.Prepared, path: str, with_optimizer: bool,
          async_group: Any) -> dict[str, Any]:
    """One timed save; returns save_s, stall_s, background_s of this rank."""
    import torch.distributed.checkpoint as dcp

    background = 0.0
    training.barrier()
    t0 = time.perf_counter()
    if method == "dcp":
        dcp.save(_state(prep, with_optimizer), storage_writer=dcp.FileSystemWriter(path))
    elif method == "dcp-async":
        future: Any = dcp.async_save(_state(prep, with_optimizer),
                                     storage_writer=dcp.FileSystemWriter(path),
                                     process_group=async_group)
        returned = time.perf_counter()
        # An AsyncSaveResponse (a stager that stages in the background) carries two.
        getattr(future, "upload_completion", future).result()
        background = time.perf_counter() - returned
    elif method == "full":
        _save_full(prep, path, with_optimizer)
    else:
        prep.model.save_checkpoint(path, tag=DS_TAG)
    elapsed = time.perf_counter() - t0
    training.barrier()
    stall = elapsed - background if method == "dcp-async" else elapsed
    return {"save_s": elapsed, "stall_s": stall, "background_s": background}


def _full_options(**kw: Any) -> Any:
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=True, **kw)


def _save_full(prep: training.Prepared, path: str, with_optimizer: bool) -> None:
    """Gather everything to rank 0 on the host; rank 0 writes one fsync'd file."""
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_optimizer_state_dict,
    )
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    if isinstance(prep.model, FSDP):
        state = _fsdp1_full_state(prep.model, optimizer_of(prep) if with_optimizer else None)
    else:
        options = _full_options(cpu_offload=True)
        state = {"model": get_model_state_dict(prep.model, options=options)}
        if with_optimizer:
            state["optim"] = get_optimizer_state_dict(prep.model, optimizer_of(prep),
                                                      options=options)
    if dist.get_rank() == 0:
        with open(os.path.join(path, FULL_FILE), "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())


def _fsdp1_full_state(model: Any, optimizer: torch.optim.Optimizer | None) -> dict[str, Any]:
    """FSDP1's FULL_STATE_DICT with rank0_only, straight from FSDP1: what
    get_model_state_dict(full_state_dict=True, cpu_offload=True) runs, except that
    offload_to_cpu is set only for CUDA parameters. With CPU parameters torch 2.13's
    FSDP1 fails there (_unshard_param_utils: handle.to_cpu() leaves the unsharded flat
    parameter without storage: "setStorage ... out of bounds for storage of size 0")."""
    from torch.distributed.fsdp import (
        FullOptimStateDictConfig,
        FullStateDictConfig,
        StateDictType,
    )
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    offload = next(model.parameters()).is_cuda
    with FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT,
                              FullStateDictConfig(offload_to_cpu=offload, rank0_only=True),
                              FullOptimStateDictConfig(offload_to_cpu=offload,
                                                       rank0_only=True)):
        state = {"model": model.state_dict()}
        if optimizer is not None:
            state["optim"] = FSDP.optim_state_dict(model, optimizer)
    return state


def _load(method: str, prep: training.Prepared, path: str, with_optimizer: bool) -> float:
    """One timed load into `prep`; this rank's seconds, barrier to barrier."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        set_model_state_dict,
        set_optimizer_state_dict,
        set_state_dict,
    )

    training.barrier()
    t0 = time.perf_counter()
    if method in ("dcp", "dcp-async"):
        state = _state(prep, with_optimizer)
        dcp.load(state, storage_reader=dcp.FileSystemReader(path))
        if with_optimizer:
            set_state_dict(prep.model, optimizer_of(prep), model_state_dict=state["model"],
                           optim_state_dict=state["optim"])
        else:
            set_model_state_dict(prep.model, state["model"])
    elif method == "full":
        state = (torch.load(os.path.join(path, FULL_FILE), weights_only=False)
                 if dist.get_rank() == 0 else {"model": {}, "optim": {}})
        options = _full_options(broadcast_from_rank0=True)
        set_model_state_dict(prep.model, state["model"], options=options)
        if with_optimizer:
            set_optimizer_state_dict(prep.model, optimizer_of(prep), state["optim"],
                                     options=options)
    else:
        prep.model.load_checkpoint(path, tag=DS_TAG, load_optimizer_states=True,
                                   load_lr_scheduler_states=False)
    training.barrier()
    return time.perf_counter() - t0


def convert_checkpoint(method: str, path: str | Path, *,
                       timeout_s: float = 300.0) -> tuple[float, int]:
    """Time the offline conversion of a "dcp" or "deepspeed" checkpoint to one file, in
    one fresh process; returns (seconds, bytes written). The output goes to
    `<path>-converted`."""
    out = Path(f"{path}-converted")
    out.mkdir(parents=True, exist_ok=False)
    seconds = run_ranks(_convert_rank, (method, str(path), str(out)), nproc=1,
                        timeout_s=timeout_s)[0]
    nbytes = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    return seconds, nbytes


def _convert_rank(ctx: RankContext, payload: tuple[str, str, str]) -> float:
    method, path, out = payload
    if method == "dcp":
        from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

        t0 = time.perf_counter()
        dcp_to_torch_save(path, os.path.join(out, "model.pt"))
        return time.perf_counter() - t0
    if method != "deepspeed":
        raise ConfigError("method", method, "converts only dcp and deepspeed checkpoints")
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    # convert_zero_checkpoint_to_fp32_state_dict does this and torch.save, but shards
    # its output with huggingface_hub, which this environment does not have.
    t0 = time.perf_counter()
    state = get_fp32_state_dict_from_zero_checkpoint(path, tag=DS_TAG)
    torch.save(state, os.path.join(out, "pytorch_model.bin"))
    return time.perf_counter() - t0
