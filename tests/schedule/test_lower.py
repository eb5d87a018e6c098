"""Lowering: op order per stream, communication volume and FLOPs against the closed forms
of zsim.analytic (independent derivations), and rejected plans."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import replace

import pytest

from zsim.analytic.collectives import CommGroup, choose, collective_time_s, ring_link_loads
from zsim.analytic.comm import step_comm
from zsim.analytic.compute import block_forward_flops, step_flops
from zsim.errors import ConfigError
from zsim.schedule.lower import lower
from zsim.schedule.ops import Schedule
from zsim.simulate import simulate
from zsim.spec.hardware import HardwareProfile
from zsim.spec.model import ModelSpec
from zsim.spec.plan import Plan
from zsim.spec.registry import resolve_model
from zsim.units import dtype_bytes


def _names(model: ModelSpec, hw: HardwareProfile, plan: Plan) -> dict[str, list[str]]:
    return {s: [op.name for op in ops] for s, ops in lower(model, hw, plan).by_stream().items()}


def test_fsdp_op_order_per_stream(tiny_model: ModelSpec, h100: HardwareProfile) -> None:
    plan = Plan.for_strategy("fsdp", gpus=8, seq_len=128)
    assert _names(tiny_model, h100, plan) == {
        # FSDP2 copies a gathered unit out of the flat buffer in the unit's own pre-forward
        # / pre-backward hook, on the compute stream, right before the unit runs; each
        # unit's gradients are copied into the flat reduce-scatter input right after its
        # backward (foreach_reduce runs the copy-in on the current stream).
        "compute": ["root copy-out forward (mb 0)", "embedding forward (mb 0)",
                    "unit 0 copy-out forward (mb 0)", "unit 0 forward (mb 0)",
                    "unit 1 copy-out forward (mb 0)", "unit 1 forward (mb 0)",
                    "output+loss forward (mb 0)", "loss backward (mb 0)",
                    "output backward (mb 0)",
                    "unit 1 copy-out backward (mb 0)", "unit 1 backward (mb 0)",
                    "unit 1 reduce-scatter copy-in",
                    "unit 0 copy-out backward (mb 0)", "unit 0 backward (mb 0)",
                    "unit 0 reduce-scatter copy-in", "embedding backward (mb 0)",
                    "root reduce-scatter copy-in", "optimizer step", "end of step"],
        # The all-gather copy-in (cast + copy into the flat buffer) precedes each
        # all-gather on its stream; the bf16 output is cast to the fp32 shard's dtype
        # after each reduce-scatter on its stream.
        "all_gather": ["root copy-in forward (mb 0)", "root all-gather forward (mb 0)",
                       "unit 0 copy-in forward (mb 0)", "unit 0 all-gather forward (mb 0)",
                       "unit 1 copy-in forward (mb 0)", "unit 1 all-gather forward (mb 0)",
                       "unit 1 copy-in backward (mb 0)", "unit 1 all-gather backward (mb 0)",
                       "unit 0 copy-in backward (mb 0)", "unit 0 all-gather backward (mb 0)"],
        "reduce_scatter": ["unit 1 reduce-scatter", "unit 1 grad cast",
                           "unit 0 reduce-scatter", "unit 0 grad cast",
                           "root reduce-scatter", "root grad cast"],
    }


def test_no_reshard_gathers_once_and_hsdp_adds_replica_all_reduce(
        tiny_model: ModelSpec, h100: HardwareProfile) -> None:
    no_reshard = _names(tiny_model, h100, Plan.for_strategy("fsdp-no-reshard", gpus=8,
                                                            seq_len=128))
    assert not any("backward" in n for n in no_reshard["all_gather"])
    hsdp = _names(tiny_model, h100, Plan.for_strategy("hsdp", gpus=16, shard_group=8,
                                                      seq_len=128))
    assert hsdp["all_reduce"] == ["unit 1 all-reduce (replicas)", "unit 0 all-reduce (replicas)",
                                  "root all-reduce (replicas)"]


@pytest.mark.parametrize("strategy,shard_group,impl", [
    ("ddp", None, "torch"), ("zero1", None, "torch"), ("fsdp", None, "fsdp2"),
    ("fsdp-no-reshard", None, "fsdp2"), ("hsdp", 8, "fsdp2")])
@pytest.mark.parametrize("grad_accum", [1, 3])
def test_comm_volume_matches_closed_form(tiny_model: ModelSpec, h100: HardwareProfile,
                                         strategy: str, shard_group: int | None, impl: str,
                                         grad_accum: int) -> None:
    # zsim.analytic.comm.step_comm counts each program's collectives (DDP's fp32
    # buckets, FSDP2's root gathered once per micro-batch); the lowering issues them call
    # by call. The one difference: padding.
    plan = Plan.for_strategy(strategy, gpus=32, shard_group=shard_group, seq_len=128,
                             grad_accum=grad_accum, bucket_bytes=100_000, impl=impl)
    ops = lower(tiny_model, h100, plan).ops
    expected = dict(step_comm(tiny_model, plan, h100).bus_bytes)
    n = plan.dp_shard
    if plan.shards_params:
        # FSDP2 pads each parameter's dim 0 to a multiple of n: on 32 ranks the two
        # 1000 x 256 vocabulary matrices gain 24 rows each (every other dim divides by 32).
        # The root is gathered once per micro-batch and reduced once.
        pad = 2 * (-tiny_model.vocab_size % n) * tiny_model.d_model
        expected["all_gather"] += grad_accum * pad * 2 * (n - 1) / n
        expected["reduce_scatter"] += pad * dtype_bytes(plan.reduce_dtype) * (n - 1) / n
    for kind in ("all_gather", "reduce_scatter", "all_reduce"):
        got = sum(op.bus_bytes for op in ops if op.kind == kind)
        assert got == pytest.approx(expected[kind], rel=1e-3), kind


def test_hardware_flops_match_closed_form(tiny_model: ModelSpec, h100: HardwareProfile) -> None:
    for recompute in ("none", "selective", "full"):
        plan = Plan.for_strategy("fsdp", gpus=8, seq_len=256, micro_batch=2, grad_accum=2,
                                 recompute=recompute)
        schedule = lower(tiny_model, h100, plan)
        model_flops, hw_flops = step_flops(tiny_model, micro_batch=2, seq_len=256,
                                           grad_accum=2, recompute=recompute)
        assert schedule.hardware_flops == pytest.approx(hw_flops, rel=1e-12)
        assert schedule.model_flops == model_flops


def test_ring_loads_reproduce_alpha_beta_where_the_ring_stays_on_one_link(
        h100: HardwareProfile) -> None:
    # Inside a node and one rank per node a 1 GB all-gather is a Simple ring (NCCL's
    # choice at that size): 8.4 us of base latency, one link latency per step and the
    # bus bytes at the link's rate; a ring over 8 GPUs per node for 16 nodes runs at
    # min(NVLink*8/7, 8*NIC) (C-NCCL maintainer figure: ~370-385 GB/s ring busbw on 8
    # NDR NICs per node).
    size = 1e9
    for group in (CommGroup(ranks=8, ranks_per_node=8), CommGroup(ranks=16, ranks_per_node=1)):
        assert choose("all_gather", size, group, h100).name == "ring/Simple"
        loads = ring_link_loads(group)
        caps = {"intra_node": h100.intra_node.achievable_bytes_per_s,
                "inter_node": h100.inter_node.achievable_bytes_per_s}
        rate = min(caps[k] / w for k, w in loads)
        link = h100.intra_node if group.ranks_per_node == 8 else h100.inter_node
        t = (8.4e-6 + (group.ranks - 1) * link.latency_s
             + (group.ranks - 1) / group.ranks * size / rate)
        assert t == pytest.approx(collective_time_s("all_gather", size, group, h100))
    spanning = dict(ring_link_loads(CommGroup(ranks=128, ranks_per_node=8)))
    rate = min(h100.intra_node.achievable_bytes_per_s / spanning["intra_node"],
               h100.inter_node.achievable_bytes_per_s / spanning["inter_node"])
    assert rate == pytest.approx(8 * 50e9 * 0.94)
    assert 370e9 <= rate <= 385e9


def test_ddp_buckets_cover_every_gradient_once(tiny_model: ModelSpec,
                                               h100: HardwareProfile) -> None:
    plan = Plan.for_strategy("ddp", gpus=16, seq_len=128, bucket_bytes=100_000)
    buckets = [op for op in lower(tiny_model, h100, plan).ops if op.kind == "all_reduce"]
    # fp32 buckets: the parameters' dtype under autocast.
    assert sum(op.size_bytes for op in buckets) == tiny_model.num_params * 4
    # DDP fills buckets with whole tensors in the order their gradients appear (the
    # output projection and final norm, blocks last to first in reverse module order,
    # the embedding) and closes one at the cap: every bucket but the last holds at least
    # 100,000 B, and every bucket boundary falls between two tensors.
    assert all(op.size_bytes >= 100_000 for op in buckets[:-1])
    root = dict(tiny_model.root_tensors())
    order = [math.prod(root[n]) * 4 for n in ("output.weight", "norm.weight")]
    order += [math.prod(s) * 4 for _, s in reversed(tiny_model.block_tensors())] * 2
    order.append(math.prod(root["tok_embeddings.weight"]) * 4)
    tensor_ends = set(itertools.accumulate(order))
    assert set(itertools.accumulate(op.size_bytes for op in buckets)) <= tensor_ends


def test_a_one_byte_bucket_holds_one_tensor(tiny_model: ModelSpec,
                                            h100: HardwareProfile) -> None:
    # The smallest cap gives one bucket per parameter tensor, never a bucket per element.
    for strategy in ("ddp", "zero1"):  # zero1: DDP's buckets under the ZeRO optimizer
        plan = Plan.for_strategy(strategy, gpus=16, seq_len=128, bucket_bytes=1,
                                 impl="torch")
        ops = lower(tiny_model, h100, plan).ops
        assert len([op for op in ops if op.kind == "all_reduce"]) == \
            len(tiny_model.parameter_tensors())
    gathers = [op for op in ops if op.kind == "all_gather"]  # zero1's post-step gather
    assert len(gathers) == len(tiny_model.parameter_tensors())


@pytest.mark.parametrize("strategy,change,field", [
    ("zero2", {"offload": "params"}, "plan.offload"),
    ("fsdp", {"unit_size": 3}, "plan.unit_size"),
    ("zero3", {"tp": 2, "dp_shard": 4}, "plan.tp"),       # TP is modelled with FSDP2 only
    ("fsdp", {"pp": 2, "dp_shard": 4, "grad_accum": 2}, "plan.pp"),
    ("zero3", {"cp": 2, "dp_shard": 4}, "plan.cp"),
    # torchtitan runs CP under fully_shard over dp_shard x cp only (its DDP takes a 1-D
    # mesh): DDP and FSDP1 with CP are refused.
    ("ddp", {"cp": 2}, "plan.cp"),
    ("fsdp", {"cp": 2, "dp_shard": 4, "impl": "fsdp1"}, "plan.cp")])
def test_unsupported_plans_raise_config_error(tiny_model: ModelSpec, h100: HardwareProfile,
                                              strategy: str, change: dict[str, object],
                                              field: str) -> None:
    plan = Plan.for_strategy(strategy, gpus=8, seq_len=128).with_(**change)
    with pytest.raises(ConfigError) as err:
        lower(tiny_model, h100, plan)
    assert err.value.field == field


def test_parameter_offload_copies_every_shard_in_and_every_gradient_out(
        tiny_model: ModelSpec, h100: HardwareProfile) -> None:
    # FSDP2 CPUOffloadPolicy: before each all-gather the fp32 shard crosses PCIe; blocks
    # are gathered twice per micro-batch, the root once; each gradient shard goes back
    # once, in the sharded parameter's dtype (fp32): foreach_reduce casts the
    # reduce-scatter output to it (_to_dtype_if_needed(reduce_output, orig_dtype)) before
    # new_sharded_grad.to("cpu") (torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py).
    n, accum = 8, 2
    plan = Plan.for_strategy("fsdp", gpus=n, seq_len=128, grad_accum=accum, offload="params")
    ops = lower(tiny_model, h100, plan).ops
    block_shard = math.ceil(tiny_model.params_per_block / n)
    root_shard = math.ceil(tiny_model.root_params / n)
    h2d = sum(op.bus_bytes for op in ops if op.kind == "h2d")
    assert h2d == accum * (2 * tiny_model.num_layers * block_shard + root_shard) * 4
    d2h = sum(op.bus_bytes for op in ops if op.kind == "d2h")
    assert d2h == (tiny_model.num_layers * block_shard + root_shard) * 4
    host = [op for op in ops if op.stream == "host"]
    # DGX H100 host (measured on the DGX H200's, the same CPUs): AdamW at 765,677,963
    # params/s a node with 16 threads, Amdahl serial fraction 0.066, 112 // 8 = 14 threads
    # a GPU; plus 53.8 us a DTensor parameter (FSDP2's) over the tiny model's 21 tensors
    # (9 a block, the embedding, the final norm, the output).
    def speedup(threads: int) -> float:
        return threads / (1 + 0.066 * (threads - 1))

    rate = 765_677_963 * speedup(14) / speedup(16)
    assert [op.compute_s for op in host] == [pytest.approx(
        tiny_model.num_params / n / rate + 21 * 53.8e-6)]


# ---------------------------------------------------------------------- memory of the programs
@pytest.mark.parametrize("strategy,impl,expected_per_param", [
    # FSDP2 (MixedPrecisionPolicy bf16): the fp32 sharded params are the master copy,
    # plus the two fp32 AdamW moments: (4 + 8) / N.
    ("fsdp", "fsdp2", {"master_params": 4 / 8, "optimizer_states": 8 / 8}),
    # DDP under autocast: fp32 params, fp32 reducer buckets (alive from construction),
    # fp32 moments; zero1 (ZeroRedundancyOptimizer) shards only the moments.
    ("ddp", "torch", {"master_params": 4, "grads": 4, "optimizer_states": 8}),
    ("zero1", "torch", {"master_params": 4, "grads": 4, "optimizer_states": 8 / 8}),
    # DeepSpeed ZeRO-1 and -2: the flat bf16 parameters on every rank, the fp32 master
    # partition and its AdamW moments (the tiny model divides into 2 x 8 exactly).
    ("zero1", "deepspeed", {"params": 2, "master_params": 4 / 8, "optimizer_states": 8 / 8}),
    ("zero2", "deepspeed", {"params": 2, "master_params": 4 / 8, "optimizer_states": 8 / 8}),
])
def test_state_at_rest_of_the_programs(tiny_model: ModelSpec, h100: HardwareProfile,
                                       strategy: str, impl: str,
                                       expected_per_param: dict) -> None:
    gpus = 1 if strategy == "ddp" else 8
    plan = Plan.for_strategy(strategy, gpus=gpus, seq_len=128, impl=impl)
    psi = tiny_model.num_params
    assert psi % 8 == 0  # shards cover the parameters exactly
    got = {b.name: b.bytes for b in lower(tiny_model, h100, plan).baseline}
    # Plus the module buffers: fp32 RoPE cos and sin, max_seq_len x head_dim each,
    # replicated on every rank.
    buffers = 2 * tiny_model.max_seq_len * tiny_model.head_dim * 4
    # And the two 32 MiB cuBLAS workspaces of an H100 (the forward's and autograd's).
    assert got == {**{f"state/{c}": psi * v for c, v in expected_per_param.items()},
                   "state/buffers": buffers, "state/blas_workspaces": 2 * 32 * 2**20}


def test_fsdp_grad_shards_are_fp32_and_live_until_the_optimizer(
        tiny_model: ModelSpec, h100: HardwareProfile) -> None:
    n = 8
    plan = Plan.for_strategy("fsdp", gpus=n, seq_len=128)
    ops = lower(tiny_model, h100, plan).ops
    rs = [op for op in ops if op.kind == "reduce_scatter"]
    # foreach_reduce: bf16 reduce-scatter output cast to the fp32 sharded param's dtype.
    shards = {b.name: b.bytes for op in rs for b in op.allocs if b.category == "grads"}
    assert sum(shards.values()) == tiny_model.num_params * 4 / n
    outputs = [b for op in rs for b in op.allocs if b.name.endswith("reduce_scatter_output")]
    assert [b.bytes for b in outputs] == [sh // 2 for sh in shards.values()]
    (opt,) = [op for op in ops if op.kind == "optimizer"]
    # (the optimizer also frees its own foreach temporary)
    assert set(opt.frees) - {b.name for b in opt.allocs} == set(shards)
    # The flat reduce-scatter input (bf16) is allocated by its copy-in, which frees the
    # unsharded gradients it read; one input is held until the next unit's copy-in
    # starts (FSDP2's reduce_scatter_states), the last one until the end of backward.
    copy_ins = [op for op in ops if op.name.endswith("reduce-scatter copy-in")]
    inputs = [next(b.name for b in op.allocs if b.name.endswith("reduce_scatter_input"))
              for op in copy_ins]
    assert all(op.frees and all(f.endswith("unsharded_grad") or "unsharded_grad/" in f
                                for f in op.frees) for op in copy_ins)
    for prev, op in zip(inputs, copy_ins[1:], strict=False):
        assert prev in op.frees_at_start
    assert inputs[-1] in rs[-1].frees


def test_ddp_gradients_are_never_allocated_in_the_step(tiny_model: ModelSpec,
                                                       h100: HardwareProfile) -> None:
    # gradient_as_bucket_view: backward writes into the reducer's buckets, which are
    # part of the state at rest; zero_grad(set_to_none) drops only the views.
    for strategy in ("ddp", "zero1"):
        ops = lower(tiny_model, h100, Plan.for_strategy(strategy, gpus=4, seq_len=128,
                                                        impl="torch")).ops
        assert not [b for op in ops for b in op.allocs if b.category == "grads"]


@pytest.mark.parametrize("strategy", ["fsdp", "ddp"])
@pytest.mark.parametrize("recompute", ["selective", "full"])
def test_checkpoint_host_time_lands_on_each_checkpointed_block(
        tiny_model: ModelSpec, h100: HardwareProfile, strategy: str, recompute: str) -> None:
    # Per forward kernel of a block: 3 us in forward, 7 us in backward for the mode
    # planned, something else for the other mode (must not be used).
    overhead = {m: {"forward": 3e-6, "backward": 7e-6} if m == recompute
                else {"forward": 1.0, "backward": 1.0} for m in ("full", "selective")}
    plan = Plan.for_strategy(strategy, gpus=8, seq_len=128, micro_batch=2,  # type: ignore[arg-type]
                             recompute=recompute, unit_size=2)
    kernels = block_forward_flops(tiny_model, micro_batch=2, seq_len=128, act_bytes=2).kernels

    def block_ops(hw: HardwareProfile) -> dict[str, float]:
        return {op.name: op.compute_s for op in lower(tiny_model, hw, plan).ops
                if op.name in ("unit 0 forward (mb 0)", "unit 0 backward (mb 0)")}

    sync = replace(h100, launch="synchronous")
    base = block_ops(sync)
    with_hooks = block_ops(replace(sync, checkpoint_overhead_s=overhead))
    assert base.keys() == with_hooks.keys() and len(base) == 2
    # FSDP: one unit of 2 blocks, each op pays for both. DDP has no units: it runs (and
    # is lowered) block by block whatever the plan's unit size.
    blocks = 2 if strategy == "fsdp" else 1
    for name, seconds in with_hooks.items():
        per_kernel_s = 3e-6 if " forward " in name else 7e-6
        assert seconds - base[name] == pytest.approx(blocks * kernels * per_kernel_s,
                                                     rel=1e-9)
    # An async host runs the hooks while the GPU works: nothing lands on the timeline.
    assert block_ops(replace(h100, checkpoint_overhead_s=overhead)) == block_ops(h100)



@pytest.mark.parametrize(("strategy", "kw", "all_gather", "reduce_scatter", "all_reduce"), [
    # FSDP2, one block per unit, n blocks: every unit and the root all-gather in forward
    # per micro-batch, every block again in backward (the root stays gathered); each
    # unit's gradients reduce-scatter once per step.
    ("fsdp", {"grad_accum": 2}, lambda n: 2 * (2 * n + 1), lambda n: n + 1, lambda n: 0),
    ("fsdp-no-reshard", {"grad_accum": 2}, lambda n: 2 * (n + 1), lambda n: n + 1,
     lambda n: 0),
    # HSDP adds one all-reduce of each reduced shard across replicas.
    ("hsdp", {"shard_group": 8}, lambda n: 2 * n + 1, lambda n: n + 1, lambda n: n + 1),
])
def test_calls_per_step(strategy: str, kw: dict[str, int], all_gather: Callable[[int], int],
                        reduce_scatter: Callable[[int], int], all_reduce: Callable[[int], int],
                        h100: HardwareProfile) -> None:
    model = resolve_model("125m")
    n = model.num_layers
    result = simulate(model, h100, Plan.for_strategy(strategy, gpus=16, seq_len=512, **kw))
    expected = {"all_gather": all_gather(n), "reduce_scatter": reduce_scatter(n),
                "all_reduce": all_reduce(n)}
    assert result.collective_calls == {k: v for k, v in expected.items() if v}
    assert sum(result.collective_algorithms.values()) == sum(expected.values())
    assert 0 < result.comm_latency_share < 1


@pytest.mark.parametrize(("strategy", "impl"), [("ddp", "torch"), ("zero1", "torch"),
                                                ("zero1", "deepspeed"), ("zero2", "deepspeed"),
                                                ("zero3", "deepspeed")])
def test_programs_without_units_ignore_the_unit_size(tiny_model: ModelSpec,
                                                     h100: HardwareProfile, strategy: str,
                                                     impl: str) -> None:
    # DDP and DeepSpeed wrap no units: their step is the same schedule whatever unit size
    # the plan names, one compute op per block; FSDP2's changes with it.
    def schedule(s: str, i: str, unit_size: int) -> Schedule:
        return lower(tiny_model, h100, Plan.for_strategy(
            s, gpus=8, seq_len=128, impl=i, unit_size=unit_size))  # type: ignore[arg-type]

    assert schedule(strategy, impl, 2).key() == schedule(strategy, impl, 1).key()
    assert schedule("fsdp", "fsdp2", 2).key() != schedule("fsdp", "fsdp2", 1).key()
