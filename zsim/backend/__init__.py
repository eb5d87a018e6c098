"""The real execution backend: runs a zsim plan on torch.distributed (gloo on CPU, NCCL on
GPUs) with the library it names, and measures the steps.

Modules: reference_model (the reference Llama and GPT decoders), training (a prepared
program and its step, with hooks around each phase), programs (which program runs a
plan), fsdp2 (FSDP2, DDP, ZeroRedundancyOptimizer), fsdp1, deepspeed_zero,
tensor_parallel, pipelining (torch.distributed.pipelining), moe_ep (a MoE layer with
expert parallelism over all-to-all, and a tiny MoE decoder under FSDP2), runner (N
processes, the fake process group, wall-clock deadlines, results appended as they
complete), instruments (live memory, saved tensors, per-unit times), step_timing (a
step's host and device time, by phase), measured_step (one plan's measured run: the
protocol and its figures).

Layering: backend imports nothing from zsim.calibration or zsim.validation, which build on
it; zsim's core reaches it only through zsim.calibrate_api and zsim.validate_api, inside
their functions (tests/test_layers.py). Importing this package imports nothing; its
modules import torch (an optional extra of zsim).
"""
