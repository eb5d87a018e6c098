"""Host memory of the offloaded plans (zsim.schedule.lower.host_state_bytes), per rank and
per node: against DeepSpeed 0.19's own estimators for a 13B model on two 8-GPU nodes and
against DeepSpeed's partitioning code for the accumulation buffers; worked by hand for
FSDP2's CPUOffloadPolicy and torch's DDP. (The real DeepSpeed runs that measure the same
figure to the byte are tests/backend/test_deepspeed_offload_host.py.)"""

from __future__ import annotations

import math

import pytest

from zsim.schedule.lower import host_state_bytes
from zsim.schedule.programs import deepspeed
from zsim.spec.model import ModelSpec
from zsim.spec.plan import Plan
from zsim.spec.registry import resolve_model

GPUS, PER_NODE = 16, 8


def _13b_plan(strategy: str, offload: str, gpus: int = GPUS) -> Plan:
    return Plan.for_strategy(strategy, gpus=gpus, seq_len=4096, offload=offload)


def _largest(model: ModelSpec) -> int:
    return max(math.prod(shape) for _, shape in model.parameter_tensors())


@pytest.mark.parametrize(("offload", "estimated_per_param"), [("optimizer", 16),
                                                               ("params", 18)])
def test_zero3_node_is_deepspeeds_estimate_plus_the_gradient_partitions(
        offload: str, estimated_per_param: int) -> None:
    """estimate_zero3_model_states_mem_needs (zero_init, additional_buffer_factor 1): a
    node holds 16 Psi / nodes with offload_optimizer (fp32 master, fp32 gradients, Adam's
    two moments), 18 with offload_param (+ the 16-bit partitions). stage3.py also puts
    grad_partitions_flat_buffer on the optimizer's device, the host, in the gradient
    accumulation dtype (the engine's default: the model's, bf16; get_data_types), which
    the estimator predates: 2 Psi / nodes more. Every parameter is split in ceil(numel / N)
    elements: the padding is below 1e-6."""
    stage3 = pytest.importorskip("deepspeed.runtime.zero.stage3")
    model = resolve_model("13b")
    psi, nodes = model.num_params, GPUS // PER_NODE
    plan = _13b_plan("zero3", offload)
    cpu, gpu, largest_mem = stage3.estimate_zero3_model_states_mem_needs(
        psi, _largest(model), num_gpus_per_node=PER_NODE, num_nodes=nodes, cpu_offload=True,
        cpu_offload_params=offload == "params", zero_init=True, additional_buffer_factor=1)
    assert cpu == int(estimated_per_param * psi / nodes)
    per_node = PER_NODE * host_state_bytes(model, plan)
    assert per_node - 2 * psi / nodes == pytest.approx(cpu, rel=1e-6)
    # The device: the estimator's 16-bit partitions (2 Psi / N; none with offload_param)
    # beside its 4 x the largest layer gathered; zsim keeps the norms whole on every rank
    # (persistent), and the ipg bucket the estimator leaves out.
    state = deepspeed.state_at_rest_bytes(model, plan)
    assert state["params"] == pytest.approx(gpu - largest_mem, rel=1e-3, abs=1e6)
    assert state["comm_buffers"] == plan.options.reduce_bucket_size * 2
    assert set(state) == {"params", "comm_buffers"}  # no gradients or optimizer state


def test_zero2_node_is_deepspeeds_estimate_plus_the_16_bit_buffers() -> None:
    """estimate_zero2_model_states_mem_needs (additional_buffer_factor 1) with
    cpu_offload: Psi x max(4 x GPUs, 16) a node. Its 16 is the whole model's fp32 master,
    fp32 gradients and moments: on one node of 4 GPUs the node's, where zsim adds what
    stage_1_and_2.py allocates besides on the host: the 16-bit copy of each partition the
    updated parameters go back through (2 Psi) and each rank's staging buffer of the
    largest parameter's gradient (temp_grad_buffer_for_cpu_offload). Its 4 x GPUs is each
    process's fp32 model on the host before deepspeed.initialize partitions it (a loading
    peak, not the training state zsim counts): on 16 GPUs it is the whole figure, and
    the 16 (not divided by the nodes) is then the job's."""
    stage_1_and_2 = pytest.importorskip("deepspeed.runtime.zero.stage_1_and_2")
    model = resolve_model("13b")
    psi, staging = model.num_params, 2 * _largest(model)
    cpu, gpu = stage_1_and_2.estimate_zero2_model_states_mem_needs(
        psi, num_gpus_per_node=4, num_nodes=1, cpu_offload=True, additional_buffer_factor=1)
    node = 4 * host_state_bytes(model, _13b_plan("zero2", "optimizer", gpus=4))
    assert node - 2 * psi - 4 * staging == pytest.approx(cpu, rel=1e-6)
    # The device keeps the flat 16-bit parameters (the estimator's 2 Psi) and one staging
    # buffer of the largest parameter (temp_grad_buffer_for_gpu_offload).
    state = deepspeed.state_at_rest_bytes(model, _13b_plan("zero2", "optimizer", gpus=4))
    assert state == {"params": pytest.approx(gpu, rel=1e-6), "comm_buffers": staging}
    cpu16, _ = stage_1_and_2.estimate_zero2_model_states_mem_needs(
        psi, num_gpus_per_node=PER_NODE, num_nodes=GPUS // PER_NODE, cpu_offload=True,
        additional_buffer_factor=1)
    assert cpu16 == 4 * GPUS * psi
    job = GPUS * host_state_bytes(model, _13b_plan("zero2", "optimizer"))
    assert job - 2 * psi - GPUS * staging == pytest.approx(16 * psi, rel=1e-6)


@pytest.mark.parametrize("strategy", ["zero1", "zero2"])
def test_accumulation_adds_each_parameter_of_the_partition_whole(
        tiny_model: ModelSpec, strategy: str) -> None:
    """Stages 1/2 with cpu_offload and gradient accumulation keep a host buffer of each
    parameter of the rank's partition, the parameter's whole size in its dtype
    (async_accumulate_grad_in_cpu_via_gpu), from the first step on. The partition's
    parameters as DeepSpeed's get_partition_info finds them over the flat buffer in
    module order; zsim counts the rank holding the most. By hand, the tiny model on 8
    ranks (228,000 elements each): rank 1 holds the embedding's tail and every block-0
    tensor up to wo, 518,400 elements."""
    torch = pytest.importorskip("torch")
    zero12 = pytest.importorskip("deepspeed.runtime.zero.stage_1_and_2")
    from zsim.analytic.allocations import module_order

    n = 8
    plan = Plan.for_strategy(strategy, gpus=n, seq_len=128, offload="optimizer")
    tensors = [torch.empty(shape, device="meta") for shape in module_order(tiny_model)]
    part = tiny_model.num_params // n
    held = [sum(t.numel() for t in zero12.DeepSpeedZeroOptimizer.get_partition_info(
        None, tensors, part, rank)[0]) for rank in range(n)]
    assert held[1] == 256_000 + 256 + 4 * 256 * 256 == max(held)
    extra = (host_state_bytes(tiny_model, plan.with_(grad_accum=2))
             - host_state_bytes(tiny_model, plan))
    assert extra == max(held) * 2


@pytest.mark.parametrize(("strategy", "offload", "elems", "per_elem"), [
    # FSDP2 CPUOffloadPolicy: the fp32 sharded parameter (the master under
    # MixedPrecisionPolicy), its gradient in the same dtype (foreach_reduce casts the
    # reduce-scatter output to it before the copy to the host), AdamW's two fp32 moments
    # and foreach AdamW's exp_avg_sq_sqrt list during the step: 4 + 4 + 8 + 4.
    ("fsdp", "params", 1_824_000 // 8, 20),
    # zsim's optimizer-only offload keeps the bf16 shard on the GPU and copies the
    # gradients to the host in the grad dtype: 4 + 2 + 8 + 4.
    ("fsdp", "optimizer", 1_824_000 // 8, 18),
    # DDP with the optimizer on the host: every parameter's master, gradient, moments.
    ("ddp", "optimizer", 1_824_000, 18),
])
def test_torch_programs_host_by_hand(tiny_model: ModelSpec, strategy: str, offload: str,
                                     elems: int, per_elem: int) -> None:
    """Every dim 0 of the tiny model splits evenly on 8 ranks (no padding)."""
    assert tiny_model.num_params == 1_824_000
    plan = Plan.for_strategy(strategy, gpus=8, seq_len=128, offload=offload)
    assert host_state_bytes(tiny_model, plan) == elems * per_elem
