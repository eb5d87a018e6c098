"""Validation: how far the simulator's predictions are from real runs, and the profile
figures that come from that evidence.

Modules: comparison (predicted vs measured for one plan), grid (the cases of the CPU
report), report (the CPU report over the grid, its batches and its re-prediction),
gpu_runs and gpu_report (the GPU validation report: the runs one GPU can host, and the
report with the GPU fit's measurements), budgeted_runs (runs of one world size per
process within a wall-clock budget, for both GPU commands), gpu_phases and kernel_trace
(where a real GPU step's time goes, and reading its profile), published_runs and
published_cases (published measurements replayed in the simulator), error_budget (where
the CPU batches' step-time error comes from), profile_bands (every shipped profile's
error bands from this evidence), phase_rates (kernel rates read from profiled real
steps). The last two write or print a profile's figures, so their commands are under
`zsim calibrate`; they live here because they read validation's evidence.

Layering: validation builds on zsim.backend and zsim.calibration, and nothing under them
imports it; zsim's core reaches it only through zsim.calibrate_api and zsim.validate_api,
inside their functions (tests/test_layers.py). Importing this package imports nothing;
the modules that run or read real steps import torch, the replays of published figures
and the analyses of committed batches (published_runs, published_cases, error_budget,
profile_bands, phase_rates) do not.
"""
