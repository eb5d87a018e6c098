"""Figure titles: the context lines of a set of runs (zsim.report.titles.context_text),
worked out by hand from the scenario's YAML."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from zsim.report.titles import context_text
from zsim.scenario import load_scenario

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
