"""Checkpoint bytes and times of a plan: what each library writes, per rank, and how long
saving, loading and converting it take on a profile's storage.

Owns the closed forms below; zsim.engine.run_replay charges their times to a run, and
zsim.backend.checkpoint_run measures the same saves for real.

What is written (read from the libraries; the real-run tests count the bytes on disk):
- DCP (torch.distributed.checkpoint.save of get_state_dict(model, optimizer), as torchtitan
  saves; FSDP2, FSDP1's SHARDED_STATE_DICT, DDP): every parameter in the dtype it is held
  in (the fp32 sharded parameter under FSDP's mixed precision, the fp32 parameter under
  DDP's autocast) and the optimizer's states, once each: replicated items (DDP, HSDP's
  replicas) are deduplicated by the coordinator's planner (DefaultSavePlanner,
  dedup_save_plans) and spread over the ranks holding them, so each rank writes about
  total / world, never less than its largest item. Every tensor item costs a torch.save
  container besides its data (DCP_ITEM_BYTES). FileSystemWriter writes one file per
  rank and thread (`__{rank}_{i}.distcp`) and the coordinator one `.metadata`.
- async DCP (async_save): the rank first copies its whole local state dict to host
  memory (staging: the training loop is blocked only for that), then writes as above in
  the background; host memory holds one staged copy per rank on the node.
- full (FSDP2 get_model_state_dict / get_optimizer_state_dict with full_state_dict=True,
  cpu_offload=True; FSDP1 FULL_STATE_DICT with rank0_only): every sharded tensor is
  all-gathered over its shard group, rank 0 keeps a host copy of all of it and writes one
  torch.save file with one thread. Rank 0's node must hold the whole state in host memory.
  Not under PP: rank 0 holds its own stage alone, and the other stages' gathered state is
  dropped (checkpoint_methods).
- DeepSpeed (engine.save_checkpoint): every rank writes its ZeRO partition of the fp32
  master weights and Adam moments (`*_optim_states.pt`); under ZeRO-1/2 data-parallel rank
  0 also writes the module's weights in their training dtype (`mp_rank_00_model_states.pt`),
  and on load every rank reads that file; ZeRO-3 writes a model-states file per rank
  holding only empty placeholders (no 16-bit weights at all). load_checkpoint reads the
  module file twice (state_dict_factory.py: SDLoaderBase.check_ckpt_list torch.load's the
  first file whole to check mp_world_size, then load reads it again). Its checkpoint engine
  torch.save's each file to its path without fsync: the save returns once the bytes are
  in the client's cache (Storage.stream_buffered_write), durable when written back.
- Offline conversion to one torch file (dcp_to_torch_save; DeepSpeed's zero_to_fp32),
  one process: reads the whole checkpoint, writes the fp32 weights (and, for DCP, the
  optimizer states).

Times: a rank's bytes go through one writer stream (Storage.stream_*: serialization and
the file system for one thread), a node's streams share its client link, and all nodes
the file system's aggregate rate; the slowest of the three sets the write. A load is a
restart's: a new process reads the same way, and what torch.load returns is new memory.
DCP reads each item into a temporary and copies it into the state dict it loads
(FileSystemReader.read_data), so the heap serves every item again except one of at least
Storage.fresh_item_bytes, which malloc maps afresh: fresh pages the read first-touches
(a copy into fresh memory, Storage.stage_bytes_per_s, less the copy itself,
Storage.copy_bytes_per_s; a one-off check of the rates is in docs/log.md). A whole file
torch.load'ed into one dict (a full state dict on rank 0, DeepSpeed's files, an offline
conversion) holds every tensor at once: in a new process all of it is fresh pages, and
what is kept as loaded (rank 0's full tensors, DeepSpeed's moments) skips the copy into
the state that DCP's read makes; DeepSpeed's second read of its module file reuses the
first's freed heap below that threshold. Under "full", rank 0 moves every full tensor to
its device before broadcasting it (_state_dict_utils._broadcast_tensors) and each rank
copies its part into its shards (_distribute_tensors). A program whose state dict is
rebuilt from flat parameters (ProgramEntry.flat_state_dict: FSDP1) all-gathers its whole
state on every sharded save and load (_flat_state_dict_s); FSDP2's and DeepSpeed's state
is saved as the shards it is held in. DCP's coordinator pays a host cost per item of the
global plan (Storage.plan_item_s x items x ranks) on a save whose plan is not cached; a
cached plan (DefaultSavePlanner enable_plan_caching, the PyTorch team's fix at 1,856
GPUs) pays it on the first save of each process only: after the job's start and after
every restart (zsim.engine.run_replay charges it there).
Not modelled: the training slow-down while a thread-based async write contends for the
GIL (a process-based async_save avoids it); the write-back after DeepSpeed's unsynced
save (a failure before it loses the checkpoint; a page cache slower to fill than the
measured buffered stream, as this host's disk is, makes the save slower); compression
and storage tiering.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Literal, NamedTuple, get_args

from zsim.analytic.collectives import CommGroup, collective_time_s
from zsim.analytic.placement import place
from zsim.errors import ConfigError
from zsim.spec.hardware import HardwareProfile
from zsim.spec.model import ModelSpec
from zsim.spec.plan import OPTIMIZER_STATE_COPIES, Plan
from zsim.spec.storage import Storage
from zsim.units import dtype_bytes

Method = Literal["dcp", "dcp-async", "full", "deepspeed"]
METHODS: tuple[str, ...] = get_args(Method)
Target = Literal["shared", "local"]
TARGETS: tuple[str, ...] = get_args(Target)

DCP_METHODS: tuple[str, ...] = ("dcp", "dcp-async", "full")
"""Methods of the torch programs (DDP, FSDP1, FSDP2); DeepSpeed runs its own."""

STEP_COUNTER_BYTES = 4
"""torch.optim.AdamW's per-parameter `step`: a 0-dim float32 tensor."""

DCP_ITEM_BYTES = 1_575
"""What FileSystemWriter writes per tensor item beyond its data: `_write_item` saves each
tensor as its own torch.save zip archive (headers, the pickled record, 64-byte alignment):
1,573-1,577 B measured per item on disk (zsim.backend.checkpoint_run, torch 2.13). A
sharded tensor is one item per rank holding a shard; a replicated one is written once."""


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckpointCost:
    """One checkpoint of one plan: bytes, files and seconds."""

    method: str
    target: str
    with_optimizer: bool
    bytes_total: float
    """Bytes of every file written."""
    bytes_per_rank_max: float
    """The most any rank writes (rank 0 under "full" and DeepSpeed ZeRO-1/2)."""
    files: int
    state_dict_s: float
    """Seconds the program spends turning its state into a sharded state dict before each
    save (in the stall; FSDP1's all-gathers, _flat_state_dict_s); 0 where its state is
    saved as the shards it is held in."""
    plan_s: float
    """DCP's coordinator planning time, seconds: in every save without a cached plan, in
    the first only with one (0 for the other methods)."""
    save_stall_s: float
    """Seconds the training loop is blocked per checkpoint."""
    save_background_s: float
    """Seconds the write goes on after training resumed (async only; 0 otherwise)."""
    load_s: float
    """Seconds to load it on restart (read, host-to-device, all ranks at once)."""
    convert_offline_s: float
    """Seconds one process takes to convert it to a single torch file (dcp_to_torch_save
    or zero_to_fp32), off the training job."""
    host_bytes_per_node: float
    """Host memory the save needs on its busiest node (async staging; the full state on
    rank 0's node under "full")."""
    fits_host: bool
    """host_bytes_per_node fits the node's host memory."""


@dataclass(frozen=True, slots=True, kw_only=True)
class _Layout:
    """Where the bytes of a checkpoint sit: per-rank write, per-rank local state."""

    total: float
    write_per_rank: float
    rank0_extra: float
    local_per_rank: float
    items_per_rank: int
    files: int
    read_per_rank: float
    """Bytes the busiest rank reads on a restart's load (rank 0's whole file under "full")."""
    fresh_per_rank: float
    """Of read_per_rank, bytes that land in fresh pages (module docstring)."""
    copied_per_rank: float
    """Of read_per_rank, bytes the loader copies on into the state it loads into."""


def checkpoint_cost(spec: ModelSpec, hw: HardwareProfile, plan: Plan, *, method: str,
                    target: str = "shared", with_optimizer: bool = True,
                    cached_plan: bool = True, pinned_staging: bool = False) -> CheckpointCost:
    """Bytes and seconds of one checkpoint of `plan` saved by `method` to `target`
    ("shared": the profile's file system; "local": each node's NVMe); with `cached_plan`
    the times are those of every save after the first (plan_s says what the first adds).
    `pinned_staging`: async_save stages into pinned host memory (torchtitan's
    async_with_pinned_mem) at the pinned copy rate; otherwise at the pageable one.

    Raises:
        ConfigError: an unknown method or target, a method the plan's program does not
            run, or a profile without a storage section.
    """
    _check(hw, plan, method, target, with_optimizer)
    storage = hw.storage
    assert storage is not None  # _check
    lay = _layout(spec, plan, method, with_optimizer, storage.fresh_item_bytes)
    ranks_per_node = min(plan.world_size, hw.gpus_per_node)
    write = _rates(hw, storage, target, write=True)
    read = _rates(hw, storage, target, write=False)
    pcie = hw.pcie_bytes_per_s * hw.pcie_efficiency
    stage = pcie if pinned_staging else storage.stage_bytes_per_s  # into fresh host memory
    # A CPU device's tensors are in host memory already: a save writes them as they are.
    on_host = hw.launch == "synchronous"
    d2h = math.inf if on_host else hw.pageable_pcie_bytes_per_s.get("d2h", pcie)
    h2d = math.inf if on_host else hw.pageable_pcie_bytes_per_s.get("h2d", pcie)
    fresh = storage.stage_bytes_per_s
    # Only a full state dict and a flat-parameter program gather their state.
    gathers = (_gathers_s(spec, hw, plan, with_optimizer)
               if method == "full" or plan.program.flat_state_dict else None)
    flat = (_flat_state_dict_s(hw, plan, gathers, on_host=on_host, fresh_bytes_per_s=fresh)
            if gathers is not None and plan.program.flat_state_dict else _NO_FLAT)
    flat_save, flat_load = (flat.save_s, flat.load_s) if method in ("dcp", "dcp-async") \
        else (0.0, 0.0)
    create_s = storage.file_create_s * (2 if method == "full" else 1)
    plan_s = (storage.plan_item_s * lay.items_per_rank * plan.world_size
              if method in ("dcp", "dcp-async") else 0.0)
    if method == "full":
        assert gathers is not None
        # Gathered (unit by unit from flat parameters) into fresh host memory on rank 0
        # (cpu_offload), then one torch.save.
        write_s = lay.total / write.stream
        gather_s = gathers.tp_full_s + (gathers.per_unit_s if plan.program.flat_state_dict
                                        else gathers.per_tensor_s)
        stall = gather_s + lay.total / stage + write_s + create_s
        background = 0.0
        load_s = _stream_read_s(lay, read.stream, storage) + lay.total / h2d \
            + _broadcast_s(hw, plan, lay.total) \
            + lay.local_per_rank / _device_copy_bytes_per_s(hw) \
            + flat.full_load_s
        host = lay.total
    else:
        busiest = lay.write_per_rank + lay.rank0_extra
        if method == "deepspeed" and target == "shared":
            # torch.save without fsync: done once the bytes are in the client's cache.
            write_s = busiest / storage.stream_buffered_write_bytes_per_s
        else:
            write_s = max(busiest / write.stream,
                          min(ranks_per_node, plan.world_size) * lay.write_per_rank
                          / write.client,
                          lay.total / write.aggregate * (1 if target == "shared" else 0))
        paid = 0.0 if cached_plan else plan_s
        if method == "dcp-async":
            stall = flat_save + lay.local_per_rank / stage
            background = paid + write_s + create_s
            host = lay.local_per_rank * ranks_per_node
        else:  # the writer copies tensors out ahead of the writes (_OverlappingCpuLoader)
            stall = paid + flat_save + max(lay.local_per_rank / d2h, write_s) + create_s
            background, host = 0.0, 0.0
        # A load first builds the state dict it reads into (get_state_dict), then sets it.
        load_s = flat_save + _load_s(lay, read, plan, ranks_per_node, target, storage) \
            + lay.local_per_rank / h2d + flat_load
    # One process loads the whole checkpoint into one state dict: all of it fresh.
    whole = replace(lay, read_per_rank=lay.total, fresh_per_rank=lay.total, copied_per_rank=0.0)
    convert = (_stream_read_s(whole, read.stream, storage)
               + _converted_bytes(spec, method, lay) / write.stream)
    return CheckpointCost(
        method=method, target=target, with_optimizer=with_optimizer, bytes_total=lay.total,
        bytes_per_rank_max=lay.total if method == "full"
        else lay.write_per_rank + lay.rank0_extra,
        files=lay.files, state_dict_s=flat_save, plan_s=plan_s, save_stall_s=stall,
        save_background_s=background,
        load_s=load_s, convert_offline_s=convert, host_bytes_per_node=host,
        fits_host=host <= hw.host_memory_bytes)


def checkpoint_methods(plan: Plan) -> tuple[str, ...]:
    """The methods the plan's program saves with: DeepSpeed's own, else DCP's, and a full
    state dict without PP. Under PP a stage's ranks hold only its tensors, and
    get_model_state_dict(full_state_dict=True, cpu_offload=True) keeps the gathered state
    on global rank 0 alone (_state_dict_utils._iterate_state_dict, ranks_only=(0,)): the
    other stages' state is dropped."""
    if plan.program.name == "deepspeed":
        return ("deepspeed",)
    return DCP_METHODS if plan.pp == 1 else tuple(m for m in DCP_METHODS if m != "full")


def _check(hw: HardwareProfile, plan: Plan, method: str, target: str,
           with_optimizer: bool) -> None:
    if method not in METHODS:
        raise ConfigError("checkpoint", method, f"expected one of {', '.join(METHODS)}")
    if target not in TARGETS:
        raise ConfigError("checkpoint_target", target, f"expected one of {', '.join(TARGETS)}")
    if method not in checkpoint_methods(plan):
        if method == "full" and plan.pp > 1:
            raise ConfigError("checkpoint", method, f"pp={plan.pp}: a full state dict keeps "
                              "global rank 0's pipeline stage only; save sharded (dcp) and "
                              "convert offline")
        raise ConfigError("checkpoint", method, f"{plan.program.title} saves with "
                          f"{', '.join(checkpoint_methods(plan))}")
    if method == "deepspeed" and not with_optimizer:
        raise ConfigError("with_optimizer", False, "DeepSpeed's save_checkpoint always "
                          "writes the optimizer partitions")
    if hw.storage is None:
        raise ConfigError("hardware.storage", None, f"profile {hw.name} has no storage "
                          "section (see hardware_profiles/dgx-h100.yaml)")


def _layout(spec: ModelSpec, plan: Plan, method: str, with_optimizer: bool,
            fresh_item_bytes: float) -> _Layout:
    psi = float(spec.num_params)
    mp = plan.tp * plan.pp
    held_bytes = dtype_bytes(plan.master_dtype if plan.has_master_copy else plan.param_dtype)
    state_copies = OPTIMIZER_STATE_COPIES.get(plan.optimizer, 2)
    opt_bpp = (state_copies * dtype_bytes(plan.optimizer_state_dtype)
               if with_optimizer else 0.0)
    tensors = len(spec.parameter_tensors())
    tensors_per_rank = max(1, tensors // plan.pp)
    items_per_rank = tensors_per_rank * (1 + (state_copies + 1 if with_optimizer else 0))
    world = plan.world_size
    if method == "deepspeed":
        partitions = plan.dp_shard_cp * mp
        master = dtype_bytes(plan.master_dtype)
        optim = psi * (master + opt_bpp)
        module = psi * dtype_bytes(plan.param_dtype)
        per_rank = optim / partitions
        # A rank's optimizer file is loaded whole: all of it fresh in a new process; the
        # fp32 master partition is copied into the optimizer's, the moments kept as loaded.
        master_rank = psi * master / partitions
        if plan.shards_params:  # ZeRO-3's model-states files hold empty placeholders
            return _Layout(total=optim, write_per_rank=per_rank, rank0_extra=0.0,
                           local_per_rank=per_rank, items_per_rank=items_per_rank,
                           files=2 * world, read_per_rank=per_rank, fresh_per_rank=per_rank,
                           copied_per_rank=master_rank)
        # The module file is read twice (the second read reuses the first's small items)
        # and copied into the module once.
        module_rank = module / mp
        again_fresh = module_rank * _fresh_fraction(
            spec, [(dtype_bytes(plan.param_dtype), 1.0)], mp, fresh_item_bytes)
        return _Layout(total=optim + module, write_per_rank=per_rank, rank0_extra=module_rank,
                       local_per_rank=per_rank + module_rank, items_per_rank=items_per_rank,
                       files=world + mp, read_per_rank=per_rank + 2 * module_rank,
                       fresh_per_rank=per_rank + module_rank + again_fresh,
                       copied_per_rank=master_rank + module_rank)
    raw = psi * (held_bytes + opt_bpp)
    steps = tensors * (STEP_COUNTER_BYTES + DCP_ITEM_BYTES) if with_optimizer else 0
    sharded_items = (tensors * (1 + (state_copies if with_optimizer else 0))
                     * (plan.dp_shard_cp if plan.shards_params else 1) * plan.tp)
    total = raw + steps + (sharded_items * DCP_ITEM_BYTES if method != "full" else 0)
    shards = (plan.dp_shard_cp if plan.shards_params else 1) * mp
    local = total / shards
    largest = max(_numel(s) for _, s in spec.parameter_tensors()) * held_bytes / shards
    items = [(held_bytes, 1.0)] + ([(dtype_bytes(plan.optimizer_state_dtype), state_copies)]
                                   if with_optimizer else [])
    if method == "full":  # rank 0 loads the whole file into one dict, broadcast from it
        read, fresh, copied = total, total, 0.0
    else:  # each rank its shards, item by item, copied into its state dict
        read, fresh = local, local * _fresh_fraction(spec, items, shards, fresh_item_bytes)
        copied = read
    return _Layout(total=total, write_per_rank=max(total / world, largest), rank0_extra=0.0,
                   local_per_rank=local, items_per_rank=items_per_rank,
                   files=1 if method == "full" else world + 1, read_per_rank=read,
                   fresh_per_rank=fresh, copied_per_rank=copied)


def _fresh_fraction(spec: ModelSpec, items: list[tuple[float, float]], shards: int,
                    fresh_item_bytes: float) -> float:
    """Share of the bytes of every parameter's items ((bytes per element, items per
    parameter): the parameter, its optimizer states), each split `shards` ways, in items
    of at least `fresh_item_bytes`."""
    fresh = every = 0.0
    for _, shape in spec.parameter_tensors():
        for elem_bytes, count in items:
            size = _numel(shape) * elem_bytes / shards
            every += count * size
            fresh += count * size if size >= fresh_item_bytes else 0.0
    return fresh / every


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


@dataclass(frozen=True, slots=True)
class _Rates:
    stream: float
    client: float
    aggregate: float


def _rates(hw: HardwareProfile, storage: Storage, target: str, *, write: bool) -> _Rates:
    if target == "local":
        nvme = hw.nvme_write_bytes_per_s if write else hw.nvme_read_bytes_per_s
        return _Rates(stream=nvme, client=nvme, aggregate=float("inf"))
    if write:
        return _Rates(stream=storage.stream_write_bytes_per_s,
                      client=storage.client_write_bytes_per_s,
                      aggregate=storage.aggregate_write_bytes_per_s)
    return _Rates(stream=storage.stream_read_bytes_per_s,
                  client=storage.client_read_bytes_per_s,
                  aggregate=storage.aggregate_read_bytes_per_s)


def _load_s(lay: _Layout, read: _Rates, plan: Plan, ranks_per_node: int, target: str,
            storage: Storage) -> float:
    """Every rank reads its local state (a replica reads what another wrote: DCP loads
    by the plan, not by who saved), DeepSpeed ranks also the module file under ZeRO-1/2."""
    node = lay.read_per_rank * ranks_per_node
    everyone = lay.read_per_rank * plan.world_size
    return max(_stream_read_s(lay, read.stream, storage),
               node / read.client,
               everyone / read.aggregate if target == "shared" else 0.0)


def _stream_read_s(lay: _Layout, stream_bytes_per_s: float, storage: Storage) -> float:
    """One reader thread's seconds for the busiest rank's load: the read (its stream rate
    includes one copy on into existing memory, Storage.copy_bytes_per_s, which bytes not
    copied on do not pay), and the first touch of the fresh pages it lands in (a copy into
    fresh memory, less the copy)."""
    copy = storage.copy_bytes_per_s
    not_copied = lay.read_per_rank - lay.copied_per_rank
    return (lay.read_per_rank / stream_bytes_per_s - not_copied / copy
            + lay.fresh_per_rank * (1 / storage.stage_bytes_per_s - 1 / copy))


class _FlatCost(NamedTuple):
    """Seconds a rank spends between flat parameters and a state dict (_flat_state_dict_s)."""

    save_s: float
    load_s: float
    full_load_s: float


_NO_FLAT = _FlatCost(0.0, 0.0, 0.0)
"""A program whose state is saved as the shards it is held in."""


class _Gathers(NamedTuple):
    """Seconds a rank spends all-gathering its state over the shard group (_gathers_s)."""

    per_tensor_s: float
    """Every parameter and optimizer state, one call each."""
    unit_params_s: float
    """Every unit's flat parameter, one call each."""
    per_unit_s: float
    """Every unit's flat parameter and flat optimizer states, one call each."""
    tp_full_s: float
    """Every parameter and optimizer state, gathered whole over the tensor-parallel group
    once its data-parallel shards are (a full state dict of a 2-D DTensor)."""
    params_bytes: float
    """A rank's parameters, unsharded, in the dtype they are held in."""
    states_bytes: float
    """A rank's optimizer states, unsharded."""


def _gathers_s(spec: ModelSpec, hw: HardwareProfile, plan: Plan,
               with_optimizer: bool) -> _Gathers:
    """All-gathers of a rank's sharded state, tensor by tensor (FSDP2's full state dict,
    DTensor.full_tensor in _gather_state_dict) or unit by unit (FSDP1's flat parameters; a
    unit is a block, the rest one root unit), at the profile's collective cost over the
    shard group; a full state dict also gathers each tensor over the tensor-parallel
    group. A rank holds 1/tp of each tensor and its pipeline stage's units only."""
    n = plan.dp_shard_cp if plan.shards_params else 1
    held = dtype_bytes(plan.master_dtype if plan.has_master_copy else plan.param_dtype)
    copies = OPTIMIZER_STATE_COPIES.get(plan.optimizer, 2) if with_optimizer else 0
    state = dtype_bytes(plan.optimizer_state_dtype)
    units: dict[str, float] = {}
    for name, shape in spec.parameter_tensors():
        unit = ".".join(name.split(".")[:2]) if name.startswith("layers.") else ""
        units[unit] = units.get(unit, 0.0) + _numel(shape) / plan.tp
    numel = sum(units.values()) / plan.pp
    groups = place(plan, hw).groups
    times: dict[tuple[str, float], float] = {}  # a model's tensors come in a few sizes

    def gather(axis: str, nbytes: float) -> float:
        if (axis, nbytes) not in times:
            times[axis, nbytes] = collective_time_s("all_gather", nbytes, groups[axis], hw)
        return times[axis, nbytes]

    def per_tensor(axis: str, split: int) -> float:
        return sum(gather(axis, _numel(shape) / split * held)
                   + copies * gather(axis, _numel(shape) / split * state)
                   for _, shape in spec.parameter_tensors()) / plan.pp

    tp_full = per_tensor("tp", 1) if plan.tp > 1 else 0.0
    if n == 1:
        return _Gathers(0.0, 0.0, 0.0, tp_full, numel * held, numel * copies * state)
    unit_params = sum(gather("dp_shard_cp", u * held) for u in units.values())
    unit_states = sum(copies * gather("dp_shard_cp", u * state) for u in units.values())
    return _Gathers(per_tensor_s=per_tensor("dp_shard_cp", plan.tp),
                    unit_params_s=unit_params / plan.pp,
                    per_unit_s=(unit_params + unit_states) / plan.pp, tp_full_s=tp_full,
                    params_bytes=numel * held, states_bytes=numel * copies * state)


def _flat_state_dict_s(hw: HardwareProfile, plan: Plan, g: _Gathers, *, on_host: bool,
                       fresh_bytes_per_s: float) -> _FlatCost:
    """Seconds of FSDP1's SHARDED_STATE_DICT save and load, and of its FULL_STATE_DICT
    load (torch/distributed/fsdp/_state_dict_utils.py and _optim_utils.py,
    use_orig_params or not), per rank, its all-gathers `g`.

    Save: each unit's flat parameter is unsharded (one all-gather into a new buffer,
    _sharded_pre_state_dict_hook) and each parameter's chunk cloned (_ext_chunk_tensor);
    each unit's optimizer states are all-gathered into new buffers
    (_communicate_optim_state) and chunked the same way. Load: every parameter is
    all-gathered from its shards (_sharded_pre_load_state_dict_hook), then each unit
    unsharded once more to take them (_enter_unshard_params_ctx, writeback); every
    parameter's optimizer states are gathered (_gather_state_dict), flattened whole (a new
    copy) and their shard cloned (_flatten_optim_state_dict). A full load has every full
    tensor already (broadcast from rank 0): each unit is unsharded to take the parameters
    (_full_pre_load_state_dict_hook) and the states flattened and cloned as above. On a
    host device every new buffer is fresh memory (`fresh_bytes_per_s`, a copy into fresh
    memory); on a GPU the caching allocator reuses device memory and only the clones and
    the flattening are copies in HBM."""
    n = plan.dp_shard_cp if plan.shards_params else 1
    if n == 1:
        return _NO_FLAT
    params, states = g.params_bytes, g.states_bytes
    # The unsharded parameters, the flattened states and their shard's clone.
    full_copied = params + states + states / n
    if on_host:
        save_copy = (params + states) * (1 + 1 / n) / fresh_bytes_per_s
        load_copy = (params + states + full_copied) / fresh_bytes_per_s
        full_copy = full_copied / fresh_bytes_per_s
    else:
        hbm = _device_copy_bytes_per_s(hw)
        save_copy = (params + states) / n / hbm
        load_copy = (states + states / n) / hbm
        full_copy = full_copied / hbm
    return _FlatCost(save_s=g.per_unit_s + save_copy,
                     load_s=g.per_tensor_s + g.unit_params_s + load_copy,
                     full_load_s=g.unit_params_s + full_copy)


def _device_copy_bytes_per_s(hw: HardwareProfile) -> float:
    """A copy within device memory (HBM; host memory on a host device): it reads and
    writes every byte at the memory-bound rate."""
    return hw.hbm_bandwidth_bytes_per_s * hw.memory_bound_efficiency / 2


def _broadcast_s(hw: HardwareProfile, plan: Plan, total: float) -> float:
    """Rank 0 broadcasts every full tensor to all ranks, each keeping its part
    (set_state_dict broadcast_from_rank0: _broadcast_state_dict, one broadcast per
    tensor), at the profile's broadcast cost over the world."""
    world = CommGroup(ranks=plan.world_size,
                      ranks_per_node=min(plan.world_size, hw.domain_gpus))
    return collective_time_s("broadcast", total, world, hw)


def _converted_bytes(spec: ModelSpec, method: str, lay: _Layout) -> float:
    """What the offline conversion writes: zero_to_fp32 the fp32 weights, dcp_to_torch_save
    the whole checkpoint in one file."""
    if method == "deepspeed":
        return float(spec.num_params) * dtype_bytes("fp32")
    return lay.total
