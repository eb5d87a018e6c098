"""A figure's title: what it shows, then the context of the runs it draws.

Owns the context lines every report figure carries so that it can be pasted alone: the
model (and its parameter count), the GPU count, the hardware profile (and its GPU), the
sequence length, the micro-batch and the global batch, each taken from the runs (never
written by hand), and given as one value where the runs share it or as its range marked
"varies" where they do not. Reads zsim.scenario.Run objects; draws nothing but the title.
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence

from matplotlib.figure import Figure

from zsim.scenario import Run
from zsim.units import GB

TITLE_CHARS_PER_INCH = 12
"""Characters of the title's font (10 pt) that fit in an inch of figure width, about."""

VARIES = "varies"
"""The word a context line uses for a setting that differs between the figure's runs."""


def context_text(runs: Sequence[Run]) -> str:
    """Two lines naming what the runs share and what they vary, e.g.
    "llama2-13b (13.0B parameters) on 128 GPUs of dgx-h100 (H100 SXM5 80GB)" and
    "sequence 8,192 tokens · micro-batch 1–2 (varies) · global batch 128–256 sequences
    (varies)"; "" without runs.

    Args:
        runs: the runs the figure draws.
    """
    if not runs:
        return ""
    model = _text([f"{r.model.name} ({_count(r.model.num_params)} parameters)"
                   for r in runs], "model")
    hardware = _text([f"{r.hardware.name} ({r.hardware.gpu_name})" for r in runs],
                     "hardware")
    line1 = f"{model} on {_number([r.gpus for r in runs], 'GPUs')} of {hardware}"
    parts = []
    inter_node = [r.hardware.inter_node.bandwidth_bytes_per_s / GB for r in runs]
    if len(set(inter_node)) > 1:
        parts.append(f"inter-node {_number(inter_node, 'GB/s per GPU', '{:g}')}")
    parts += [f"sequence {_number([r.plan.seq_len for r in runs], 'tokens')}",
             f"micro-batch {_number([r.plan.micro_batch for r in runs], '')}"]
    if any(r.plan.grad_accum > 1 for r in runs):
        parts.append(f"gradient accumulation {_number([r.plan.grad_accum for r in runs], 'steps')}")
    sequences = [r.plan.micro_batch * r.plan.grad_accum * r.plan.dp_degree for r in runs]
    batch = _number(sequences, "sequences")
    tokens = {r.plan.tokens_per_step for r in runs}
    if len(tokens) == 1:
        batch += f" ({tokens.pop():,} tokens)"
    parts.append(f"global batch {batch}")
    return f"{line1}\n{' · '.join(parts)}"


def set_title(fig: Figure, what: str, context: str) -> None:
    """Title `fig` with `what` on the first line and the context lines (context_text)
    under it, each wrapped to the figure's width (TITLE_CHARS_PER_INCH)."""
    width = int(fig.get_figwidth() * TITLE_CHARS_PER_INCH)
    lines = [what, *(textwrap.fill(line, width, break_long_words=False)
                     for line in context.splitlines())]
    fig.suptitle("\n".join(lines), fontsize="medium")


def _number(values: Sequence[float], unit: str, fmt: str = "{:,}") -> str:
    """The runs' one value with its unit, or their range marked "(varies)"."""
    suffix = f" {unit}" if unit else ""
    lo, hi = min(values), max(values)
    if lo == hi:
        return fmt.format(lo) + suffix
    return f"{fmt.format(lo)}–{fmt.format(hi)}{suffix} ({VARIES})"


def _count(n: int) -> str:
    """A parameter count: 13.0B, 124M, or the number itself below a million."""
    if n >= 1e9:
        return f"{n / 1e9:.1f}B"
    return f"{n / 1e6:.3g}M" if n >= 1e6 else f"{n:,}"


def _text(values: Sequence[str], what: str) -> str:
    """The runs' one value, or "<what> varies"."""
    return values[0] if len(set(values)) == 1 else f"{what} {VARIES}"
