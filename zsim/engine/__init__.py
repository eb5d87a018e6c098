"""Discrete-event engine: the SimPy replay of one step's schedule (replay.py) on its
resources (resources.py), the replay of a pipeline's per-rank orders (pipeline_replay.py),
the caching allocator (allocator.py, compiled_allocator.py) and trace records (trace.py).
"Replay" and "pipeline" as zsim's vocabulary (zsim/__init__.py) states them."""
