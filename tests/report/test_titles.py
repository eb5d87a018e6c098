"""Figure titles: the context lines of a set of runs (zsim.report.titles.context_text),
worked out by hand from the scenario's YAML, and every report figure titled with them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from zsim.report.dataframes import sweep_frame
from zsim.report.files import report_figures
from zsim.report.titles import context_text
from zsim.scenario import REPORT_FIGURES, load_scenario, simulate_runs, simulate_timeline

# The toy model by hand (conftest.TOY: 2 blocks, d 256, 4 heads = 4 KV heads, SwiGLU 512,
# vocabulary 1000, RMSNorm, untied, no bias): a block has q, k, v, o (4 x 256^2 =
# 262,144), w1, w2, w3 (3 x 256 x 512 = 393,216) and two norms (512): 655,872; the root
# has the embedding and the output projection (2 x 1000 x 256) and the final norm (256):
# 512,256. 2 x 655,872 + 512,256 = 1,824,000.
TOY_MODEL = "tiny (1.82M parameters) on 16 GPUs of dgx-h100 (H100 SXM5 80GB)"


def load(tmp_path: Path, data: dict[str, Any]):  # type: ignore[no-untyped-def]
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return load_scenario(path)


def test_one_run_gives_every_setting_and_the_global_batch(
        tmp_path: Path, toy_data: dict[str, Any]) -> None:
    runs = load(tmp_path, toy_data).runs
    assert runs[0].model.num_params == 1_824_000
    # fsdp: micro-batch 1 on 16 data-parallel ranks of 512 tokens (the model's
    # max_seq_len, as the scenario sets none): 16 sequences, 8,192 tokens.
    assert context_text(runs[:1]) == (
        f"{TOY_MODEL}\nsequence 512 tokens · micro-batch 1 · global batch 16 sequences "
        "(8,192 tokens)")


def test_what_the_runs_vary_is_a_range_marked_varies(
        tmp_path: Path, toy_data: dict[str, Any]) -> None:
    # ddp-huge: micro-batch 8,192 on 16 ranks = 131,072 sequences.
    assert context_text(load(tmp_path, toy_data).runs) == (
        f"{TOY_MODEL}\nsequence 512 tokens · micro-batch 1–8,192 (varies) · global batch "
        "16–131,072 sequences (varies)")
    swept = {**toy_data, "plans": {"fsdp": {"strategy": "fsdp", "grad_accum": 4}},
             "sweep": {"gpus": [16, 8], "seq_len": [256, 512],
                       "inter_node_gb_per_s": [50, 12.5]}}
    # 4 micro-batches of 1 on 8 or 16 ranks: 32-64 sequences.
    assert context_text(load(tmp_path, swept).runs) == (
        "tiny (1.82M parameters) on 8–16 GPUs (varies) of dgx-h100 (H100 SXM5 80GB)\n"
        "inter-node 12.5–50 GB/s per GPU (varies) · sequence 256–512 tokens (varies) · "
        "micro-batch 1 · gradient accumulation 4 steps · global batch 32–64 sequences "
        "(varies)")
    assert context_text([]) == ""


@pytest.fixture(scope="module")
def every_figure(tmp_path_factory: pytest.TempPathFactory,
                 toy_data: dict[str, Any]) -> dict[str, Any]:
    """Every figure of REPORT_FIGURES drawn for the toy scenario, as `zsim report` would."""
    data = {**toy_data, "report": {"figures": list(REPORT_FIGURES), "gantt": "fsdp",
                              "memory_curves": ["fsdp", "hsdp"],
                              "heatmap": {"x": "plan_name", "y": "strategy",
                                          "value": "tokens_per_s_per_gpu"}}}
    scenario = load(tmp_path_factory.mktemp("all"), data)
    pairs = simulate_runs(scenario)
    return report_figures(scenario, sweep_frame(pairs),
                          {run.name: r.memory_curve for run, r in pairs},
                          simulate_timeline(scenario))


def test_every_report_figure_carries_the_context(every_figure: dict[str, Any]) -> None:
    assert list(every_figure) == list(REPORT_FIGURES)
    for key, fig in every_figure.items():
        # The title wraps to the figure's width (the toy's heatmap is narrow).
        title = " ".join(fig.get_suptitle().split())
        for needle in ("tiny", "16 GPUs", "dgx-h100", "H100 SXM5 80GB",
                       "sequence 512 tokens"):
            assert needle in title, (key, needle, title)
        # A figure of fsdp and hsdp alone (micro-batch 1 both) says so; one with
        # ddp-huge too says the micro-batch varies.
        one = key in ("memory_curve", "gantt")
        assert ("micro-batch 1 ·" in title) == one, (key, title)
        assert ("micro-batch 1–8,192 (varies)" in title) != one, (key, title)
