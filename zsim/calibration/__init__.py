"""Calibration: measure this machine and fit a hardware profile from the measurements.

Modules: microbench (the micro-benchmarks every rank runs at once, and their rounds),
collective_fit (alpha-beta fit of collective timings), program_overhead (the library
programs' host time, fitted against the simulator), profile_writer (`calibrate`: the
figures as a profile YAML), gpu_bench (the GPU fit's kernel and host measurements).

Layering: calibration builds on zsim.backend (the reference model, the programs, the
runner) and imports nothing from zsim.validation; zsim's core reaches it only through
zsim.api's functions, inside them. Importing this package imports nothing; the
benchmark modules import torch.
"""
