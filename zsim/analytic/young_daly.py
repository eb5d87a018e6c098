"""Closed forms for the checkpoint interval of a job that fails at random: Young's and
Daly's optimum intervals and the first-order goodput of an interval. Owns nothing but
these formulas; zsim.engine.run_replay simulates the same run event by event.

δ is the checkpoint's stall (seconds training is blocked per checkpoint), M the job's mean
time between failures, R the time from a failure to training again (restart plus load).

- Young, J. W. (1974). "A first order approximation to the optimum checkpoint interval."
  Communications of the ACM 17(9), 530-531: τ = sqrt(2 δ M).
- Daly, J. T. (2006). "A higher order estimate of the optimum checkpoint interval for
  restart dumps." Future Generation Computer Systems 22(3), 303-312:
  τ = sqrt(2 δ M) [1 + 1/3 sqrt(δ / (2M)) + δ / (9 · 2M)] - δ for δ < 2M, else τ = M.
"""

from __future__ import annotations

import math

from zsim.errors import ConfigError


def _check(name: str, value: float, *, positive: bool) -> None:
    ok = math.isfinite(value) and (value > 0 if positive else value >= 0)
    if not ok:
        raise ConfigError(name, value, "must be finite and " + ("> 0" if positive else ">= 0"))


def young_interval_s(stall_s: float, mtbf_s: float) -> float:
    """Young's optimum compute time between checkpoints, seconds: sqrt(2 δ M).

    Raises:
        ConfigError: stall_s not > 0, or mtbf_s not > 0.
    """
    _check("stall_s", stall_s, positive=True)
    _check("mtbf_s", mtbf_s, positive=True)
    return math.sqrt(2.0 * stall_s * mtbf_s)


def daly_interval_s(stall_s: float, mtbf_s: float) -> float:
    """Daly's higher-order optimum compute time between checkpoints, seconds (module
    docstring); M itself when the stall reaches 2M.

    Raises:
        ConfigError: stall_s not > 0, or mtbf_s not > 0.
    """
    young = young_interval_s(stall_s, mtbf_s)
    ratio = stall_s / (2.0 * mtbf_s)
    if ratio >= 1.0:
        return mtbf_s
    return young * (1.0 + math.sqrt(ratio) / 3.0 + ratio / 9.0) - stall_s


def first_order_goodput(interval_s: float, stall_s: float, mtbf_s: float,
                        recovery_s: float) -> float:
    """Useful fraction of wall time at `interval_s` compute seconds between checkpoints,
    to first order in δ/τ, τ/M and R/M: 1 - δ/τ - (τ/2 + R)/M (each failure loses half an
    interval on average, then the recovery R). Can be negative far from its domain.

    Raises:
        ConfigError: interval_s or mtbf_s not > 0, stall_s or recovery_s not >= 0.
    """
    _check("interval_s", interval_s, positive=True)
    _check("stall_s", stall_s, positive=False)
    _check("mtbf_s", mtbf_s, positive=True)
    _check("recovery_s", recovery_s, positive=False)
    return 1.0 - stall_s / interval_s - (interval_s / 2.0 + recovery_s) / mtbf_s
