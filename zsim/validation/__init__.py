"""Validation: how far the simulator's predictions are from real runs.

Modules: report (predicted vs measured per plan, and the CPU report over the grid with
its batches and re-prediction), gpu_report (the GPU validation report), gpu_phases (where
a real GPU step's time goes), published_runs and published_cases (published measurements
replayed in the simulator), error_budget (where the CPU batches' step-time error comes
from), profile_bands (every shipped profile's error bands from this evidence),
phase_rates (kernel rates read from profiled real steps).

Layering: validation builds on zsim.backend and zsim.calibration, and nothing under them
imports it; zsim's core reaches it only through zsim.api's functions, inside them.
Importing this package imports nothing; the modules that run or read real steps import
torch, the replays of published figures (published_runs, published_cases, error_budget,
profile_bands, phase_rates) do not.
"""
