"""Schedules: the ops of one optimizer step (ops.py) and how plans lower to them (lower.py)."""
