"""Calibration: measure this machine and fit a hardware profile from the measurements.

Modules: microbench (the micro-benchmarks every rank runs at once, round by round), with
bench_figures (what they run and give), comm_bench (collectives, point-to-point,
interference, rank skew), kernel_bench (compute kernels, optimizer steps, core sharing)
and host_bench (the nano model's per-block host time); timing (how a call is timed);
nano (the nano model and its plans); program_overhead (the library programs' host time,
fitted against the simulator); collective_fit (alpha-beta fit of collective timings);
host_costs (the profile's host figures); machine (what a measurement ran on);
profile_writer (`calibrate`: the figures as a profile YAML); gpu_kernel_bench and
gpu_host_sweep (the GPU fit's kernel measurements and host sweep, which the GPU
validation report runs).

Layering: calibration builds on zsim.backend (the reference model, the programs, the
runner, the step timer) and imports nothing from zsim.validation; zsim's core reaches it
only through zsim.calibrate_api and zsim.validate_api, inside their functions
(tests/test_layers.py). Importing this package imports nothing; most of its modules
import torch (bench_figures, collective_fit, host_costs and nano do not).
"""
