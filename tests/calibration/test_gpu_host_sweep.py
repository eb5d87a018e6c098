"""The GPU host sweep's fit (zsim.calibration.gpu_host_sweep.host_fit): least-squares lines
over depth, checked against rows built on exact lines (the sweep itself runs end to end
in tests/validation/test_gpu_report.py's quick report)."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from zsim.calibration import gpu_host_sweep


def test_host_fit_slopes() -> None:
    rows = [{"config": "fsdp", "layers": n, "host_issue_s": 0.001 + 0.0005 * n,
             "step_s": 0.002 + 0.0006 * n, "aten_ops": 10 + 100 * n, "launches": 100 * n,
             "kernels": 100 * n, "note": ""} for n in (4, 16, 32)]
    rows.append({"config": "plain", "layers": 4, "note": "skipped: time budget spent"})
    (fit,) = gpu_host_sweep.host_fit(rows)
    assert fit["config"] == "fsdp" and fit["depths"] == "4 16 32"
    assert fit["host_issue_s_per_block"] == pytest.approx(0.0005)
    assert fit["host_issue_s_base"] == pytest.approx(0.001)
    assert fit["host_s_per_aten_op"] == pytest.approx(0.0005 / 100)
