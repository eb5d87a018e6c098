"""Schedules: the ops of one optimizer step (ops.py), the builder every program shares
(build.py), how plans lower to them (lower.py, one module per program in programs/), and
a pipeline's order (pipeline_order.py) and stages' work (pipeline_work.py). "Program" and
"pipeline" as zsim's vocabulary (zsim/__init__.py) states them."""
