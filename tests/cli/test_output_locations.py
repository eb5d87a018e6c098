"""Files only where the user says (issue 9): zsim installed non-editable into a fresh
virtual environment, every command that writes run from an empty folder, and nothing
appears anywhere but in the folder each command was given: not in the working folder,
not in HOME or TMPDIR, not in the installed package (where `zsim validate` used to drop
its CSV), not in the source it was installed from.

Caches of the libraries zsim uses (matplotlib's font cache; torch's inductor cache, which
torch creates under TMPDIR when FSDP2 is imported) go to XDG_CACHE_HOME, MPLCONFIGDIR and
TORCHINDUCTOR_CACHE_DIR, which the test points at a folder it does not check; bytecode is
off (PYTHONDONTWRITEBYTECODE), as Python, not zsim, writes it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest

pytest.importorskip("torch")

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
TINY_CONFIG = {"hidden_size": 64, "intermediate_size": 172, "num_attention_heads": 4,
               "num_hidden_layers": 2, "num_key_value_heads": 2, "vocab_size": 256,
               "max_position_embeddings": 64}
SCENARIO = """name: where
model: 125m
hardware: dgx-h100
gpus: 16
plans:
  fsdp: {strategy: fsdp}
  ddp: {strategy: ddp}
"""
CALIBRATE = """
import sys
from pathlib import Path
from zsim.calibrate.microbench import BenchConfig
from zsim.calibrate.profile import calibrate
quick = BenchConfig(sizes_bytes=(4096, 65536, 1 << 20, 4 << 20), iters_small=3,
                    iters_large=2, matmul_shapes=((256, 256, 256), (512, 256, 512)),
                    copy_bytes=8 << 20, adam_params=1 << 18, attention_shape=(1, 2, 128, 64),
                    elementwise_numels=(1 << 16,), sync_segments=(1, 4, 8),
                    host_layers=(1, 3), rounds=1)
calibrate("gloo", 2, Path(sys.argv[1]), config=quick, timeout_s=300)
"""
"""`zsim calibrate` with a short benchmark (the command's own takes minutes): the same
function the command calls, in the installed package."""


def _tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")} if root.exists() else set()


def _source_files() -> list[str]:
    """The checkout's files (git's view, untracked but not ignored included); without
    git, every file but build output and caches."""
    try:
        out = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=REPO,
                             capture_output=True, text=True, check=True).stdout
        names = out.splitlines()
    except (OSError, subprocess.CalledProcessError):
        skip = {".git", "build", "__pycache__", ".pytest_cache", ".hypothesis", ".ruff_cache"}
        names = [str(p.relative_to(REPO)) for p in REPO.rglob("*")
                 if not skip & set(p.relative_to(REPO).parts)
                 and not any(part.endswith(".egg-info") for part in p.parts)]
    return [f for f in names if (REPO / f).is_file()]


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(source copy, virtual environment) with zsim installed from the copy, not editable;
    the environment sees this interpreter's packages (torch, simpy, ...) beneath its own."""
    root = tmp_path_factory.mktemp("install")
    src = root / "src"
    for f in _source_files():
        (src / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / f, src / f)
    env_dir = root / "venv"
    venv.create(env_dir, system_site_packages=True, with_pip=False)
    python = env_dir / "bin" / "python"
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install",
                    "--quiet", "--no-deps", "--no-build-isolation", "--no-index", str(src)],
                   check=True, capture_output=True)
    shutil.rmtree(src / "build", ignore_errors=True)  # setuptools' own staging
    for info in src.glob("*.egg-info"):
        shutil.rmtree(info)
    where = subprocess.run([str(python), "-c", "import zsim; print(zsim.__file__)"],
                           cwd=root, capture_output=True, text=True, check=True).stdout
    assert Path(where.strip()).is_relative_to(env_dir), where
    return src, env_dir


def test_every_writing_command_writes_only_into_its_folder(
        installed: tuple[Path, Path], tmp_path: Path) -> None:
    src, env_dir = installed
    bin_dir = env_dir / "bin"
    run_dir, home, tmp, cache, inputs, out = (tmp_path / d for d in (
        "run", "home", "tmp", "cache", "inputs", "out"))
    for d in (run_dir, home, tmp, cache, inputs):
        d.mkdir()
    (inputs / "tiny").mkdir()
    (inputs / "tiny" / "config.json").write_text(json.dumps(TINY_CONFIG))
    (inputs / "where.yaml").write_text(SCENARIO)
    env = {**os.environ, "HOME": str(home), "TMPDIR": str(tmp), "XDG_CACHE_HOME": str(cache),
           "MPLCONFIGDIR": str(cache / "matplotlib"), "PYTHONDONTWRITEBYTECODE": "1",
           "TORCHINDUCTOR_CACHE_DIR": str(cache / "torchinductor"),
           "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    before = {d: _tree(d) for d in (env_dir, src, inputs)}
    commands = [
        ["zsim", "plan", "--model", "13b", "--gpus", "128"],
        ["zsim", "simulate", "--model", "13b", "--gpus", "128", "--strategy", "fsdp",
         "--trace", str(out / "trace" / "step.json")],
        ["zsim", "sweep", "--scenario", str(inputs / "where.yaml"), "--out",
         str(out / "sweep")],
        ["zsim", "validate", "--model", str(inputs / "tiny" / "config.json"), "--nproc", "2",
         "--strategy", "fsdp", "--seq", "32", "--steps", "1", "--out", str(out / "validate")],
        ["zsim", "validate", "--model", str(inputs / "tiny" / "config.json"), "--nproc", "2",
         "--strategy", "ddp", "--seq", "32", "--steps", "1"],
        [str(bin_dir / "python"), "-c", CALIBRATE, str(out / "calibrate" / "cpu.yaml")],
    ]
    for cmd in commands:
        proc = subprocess.run(cmd, cwd=run_dir, env=env, capture_output=True, text=True,
                              timeout=600)
        assert proc.returncode == 0, f"{cmd[:2]}: {proc.stderr[-2000:]}"
    parquet = subprocess.run([str(bin_dir / "python"), "-c", "import pyarrow"],
                             env=env, capture_output=True).returncode == 0
    assert _tree(out) == {
        "trace", "trace/step.json",
        "sweep", "sweep/where.csv", "sweep/where.md", "sweep/where-step-time.png",
        "sweep/where-memory.png", "sweep/where-memory-curve.png", "sweep/where-step-time.svg",
        "sweep/where-memory.svg", "sweep/where-memory-curve.svg", "sweep/journal.jsonl",
        "sweep/results.csv", *(["sweep/results.parquet"] if parquet else []),
        "validate", "validate/tiny-fsdp-n2.csv",
        "calibrate", "calibrate/cpu.yaml"}
    assert _tree(run_dir) == set()
    assert _tree(home) == set()
    assert _tree(tmp) == set()
    assert {d: _tree(d) for d in (env_dir, src, inputs)} == before
