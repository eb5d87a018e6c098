"""The real execution backend: runs a zsim plan on torch.distributed (gloo on CPU, NCCL on
GPUs) with the library it names, and measures the steps.

Modules: reference_model (the reference Llama and GPT decoders), training (a prepared
program and its step), programs (which program runs a plan), fsdp2 (FSDP2, DDP,
ZeroRedundancyOptimizer), fsdp1, deepspeed_zero, tensor_parallel, pipelining
(torch.distributed.pipelining), runner (N processes, the fake process group, deadlines),
instruments (live memory, saved tensors, per-unit times), measured_step (one plan's
measured run: the protocol and its figures), step_timing (a step's host and device time).

Layering: backend imports nothing from zsim.calibration or zsim.validation, which build on
it; zsim's core reaches it only through zsim.api's functions, inside them. Importing this
package imports nothing; its modules import torch (an optional extra of zsim).
"""
