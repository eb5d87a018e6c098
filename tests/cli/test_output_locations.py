"""Files only where the user says: zsim installed non-editable into a fresh
virtual environment, every command that writes run from an empty folder, and nothing
appears anywhere but in the folder each command was given: not in the working folder,
not in HOME or TMPDIR, not in the installed package (where `zsim validate plan` used to drop
its CSV), not in the source it was installed from. `zsim report --all` among them finds
the shipped studies (and their configs and report templates) in the installed package,
outside the repository.

Caches of the libraries zsim uses (matplotlib's font cache; torch's inductor cache, which
torch creates under TMPDIR when FSDP2 is imported; numba's machine code of the sweep's
compiled allocator replay, which zsim sends under XDG_CACHE_HOME) go to XDG_CACHE_HOME,
MPLCONFIGDIR and TORCHINDUCTOR_CACHE_DIR, which the test points at a folder it does not
check; bytecode is off (PYTHONDONTWRITEBYTECODE), as Python, not zsim, writes it.

The profile the installed `zsim calibrate profile` function writes there is also the suite's
end to end check of calibrate() (the benchmark takes half a minute; it runs once, here).
"""

from __future__ import annotations

import json
import os
import shutil
import site
import subprocess
import sys
import venv
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

torch = pytest.importorskip("torch")

from zsim.spec.hardware import HardwareProfile  # noqa: E402

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
TINY_CONFIG = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 172,
               "num_attention_heads": 4, "num_hidden_layers": 2, "num_key_value_heads": 2,
               "vocab_size": 256, "max_position_embeddings": 64}
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
from zsim.calibration.bench_figures import BenchConfig
from zsim.calibration.profile_writer import calibrate
quick = BenchConfig(sizes_bytes=(4096, 1 << 20, 8 << 20, 32 << 20), iters_small=3,
                    iters_large=2, matmul_shapes=((256, 256, 256), (512, 256, 512)),
                    gemm_linears=((512, 256, 512),), cache_flush_bytes=8 << 20,
                    copy_bytes=8 << 20, adam_params=1 << 18, attention_shape=(1, 2, 128, 64),
                    elementwise_numels=(1 << 16,), sync_segments=(1, 4, 8),
                    host_layers=(1, 3), programs=False, rounds=1)
calibrate("gloo", 2, Path(sys.argv[1]), config=quick, timeout_s=300)
"""
"""`zsim calibrate profile` with a short benchmark (the command's own takes minutes): the same
function the command calls, in the installed package. The library programs' timing is
left out: DeepSpeed would build its C++ ops afresh in this test's empty cache, minutes on
2 cores (tests/calibration/test_program_overhead.py times them on real ranks). Sizes up to
32 MiB: with 4 MiB at most, one round beside the other test worker's load once timed no
growth with size (no bandwidth to fit; CI of 2026-12-05); tens of milliseconds of
transfer stand above the scheduler's noise."""


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


def _environ() -> dict[str, str]:
    """This process's environment without PYTHONPATH, which would put a checkout's zsim
    before the installed one."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(source copy, virtual environment) with zsim installed from the copy, not editable,
    built as a user's `pip install` builds it (in an isolated environment with the
    setuptools pyproject.toml asks for, from the user's package index); the environment
    sees this interpreter's packages (torch, simpy, ...) beneath its own, through a .pth
    file naming this interpreter's site-packages (a virtual environment's
    system_site_packages would name the base interpreter's instead, which lack them when
    this interpreter is itself a virtual environment)."""
    root = tmp_path_factory.mktemp("install")
    src = root / "src"
    for f in _source_files():
        (src / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / f, src / f)
    env_dir = root / "venv"
    venv.create(env_dir, with_pip=False)
    python = env_dir / "bin" / "python"
    own = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path("
                          "'purelib'))"], capture_output=True, text=True, check=True,
                         env=_environ()).stdout.strip()
    (Path(own) / "outer.pth").write_text("".join(f"{d}\n" for d in site.getsitepackages()))
    # --ignore-installed: a zsim installed in this interpreter, seen through the .pth
    # file, is left alone.
    install = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install",
                              "--quiet", "--no-deps", "--ignore-installed", str(src)],
                             capture_output=True, text=True, env=_environ())
    assert install.returncode == 0, install.stderr[-3000:]
    shutil.rmtree(src / "build", ignore_errors=True)  # setuptools' own staging
    for info in src.glob("*.egg-info"):
        shutil.rmtree(info)
    where = subprocess.run([str(python), "-c", "import zsim; print(zsim.__file__)"],
                           cwd=root, capture_output=True, text=True, check=True,
                           env=_environ()).stdout
    assert Path(where.strip()).is_relative_to(env_dir), where
    return src, env_dir


@dataclass(frozen=True)
class Written:
    """Every writing command run once: where they were told to write, and the trees
    (relative paths) of the other folders, by name: env (the virtual environment), src
    (the source it was installed from), inputs, run (the working folder), home, tmp."""

    out: Path
    """The folder holding each command's own output folder."""
    before: dict[str, set[str]]
    """Trees before the commands ran (env, src and inputs; the others were empty)."""
    after: dict[str, set[str]]
    """Trees after the commands ran."""


@pytest.fixture(scope="module")
def written(installed: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory
            ) -> Written:
    """Every command that writes, run from an empty folder with HOME and TMPDIR empty."""
    src, env_dir = installed
    bin_dir = env_dir / "bin"
    root = tmp_path_factory.mktemp("written")
    run_dir, home, tmp, cache, inputs, out = (root / d for d in (
        "run", "home", "tmp", "cache", "inputs", "out"))
    for d in (run_dir, home, tmp, cache, inputs):
        d.mkdir()
    (inputs / "tiny").mkdir()
    (inputs / "tiny" / "config.json").write_text(json.dumps(TINY_CONFIG))
    (inputs / "where.yaml").write_text(SCENARIO)
    env = {**_environ(), "HOME": str(home), "TMPDIR": str(tmp), "XDG_CACHE_HOME": str(cache),
           "MPLCONFIGDIR": str(cache / "matplotlib"), "PYTHONDONTWRITEBYTECODE": "1",
           "TORCHINDUCTOR_CACHE_DIR": str(cache / "torchinductor"),
           "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    checked = {"env": env_dir, "src": src, "inputs": inputs, "run": run_dir, "home": home,
               "tmp": tmp}
    before = {name: _tree(checked[name]) for name in ("env", "src", "inputs")}
    commands = [
        ["zsim", "plan", "--model", "13b", "--gpus", "128"],
        ["zsim", "simulate", "--model", "13b", "--gpus", "128", "--strategy", "fsdp",
         "--trace", str(out / "trace" / "step.json")],
        ["zsim", "sweep", "--scenario", str(inputs / "where.yaml"), "--out",
         str(out / "sweep")],
        ["zsim", "validate", "plan", "--model", str(inputs / "tiny" / "config.json"),
         "--nproc", "2", "--strategy", "fsdp", "--seq", "32", "--steps", "1", "--out",
         str(out / "validate")],
        ["zsim", "validate", "plan", "--model", str(inputs / "tiny" / "config.json"),
         "--nproc", "2", "--strategy", "ddp", "--seq", "32", "--steps", "1"],
        [str(bin_dir / "python"), "-c", CALIBRATE, str(out / "calibrate" / "cpu.yaml")],
        ["zsim", "report", "--all", "--out", str(out / "report")],
    ]
    for cmd in commands:
        proc = subprocess.run(cmd, cwd=run_dir, env=env, capture_output=True, text=True,
                              timeout=600)
        assert proc.returncode == 0, f"{cmd[:2]}: {proc.stderr[-2000:]}"
    return Written(out=out, before=before,
                   after={name: _tree(d) for name, d in checked.items()})


def test_every_writing_command_writes_only_into_its_folder(
        installed: tuple[Path, Path], written: Written) -> None:
    _, env_dir = installed
    parquet = subprocess.run([str(env_dir / "bin" / "python"), "-c", "import pyarrow"],
                             capture_output=True).returncode == 0
    reports = {name for name in _tree(written.out) if name.startswith("report")}
    assert _tree(written.out) - reports == {
        "trace", "trace/step.json",
        "sweep", "sweep/where.csv", "sweep/where.md", "sweep/where-step-time.svg",
        "sweep/where-memory.svg", "sweep/where-memory-curve.svg", "sweep/journal.jsonl",
        "sweep/results.csv", *(["sweep/results.parquet"] if parquet else []),
        "validate", "validate/tiny-fsdp-n2.csv",
        "calibrate", "calibrate/cpu.yaml"}
    assert written.after["run"] == set()
    assert written.after["home"] == set()
    assert written.after["tmp"] == set()
    assert {name: written.after[name] for name in written.before} == written.before


def test_report_all_finds_the_installed_studies(written: Written) -> None:
    """`zsim report --all`, run outside the repository, reported every shipped study
    (scenarios/*.yaml, by their names), each through its own template (its title line)
    and the configs configs-13b-64 reads."""
    for path in sorted((REPO / "scenarios").glob("*.yaml")):
        scenario = yaml.safe_load(path.read_text())
        md = written.out / "report" / f"{scenario['name']}.md"
        assert (written.out / "report" / f"{scenario['name']}.csv").is_file()
        template = (scenario.get("report") or {}).get("template")
        if template:
            title = (path.parent / template).read_text().splitlines()[0]
            assert title.startswith("# ") and title in md.read_text().splitlines()
    runs = (written.out / "report" / "configs-13b-64.csv").read_text()
    assert "ds-zero3-offload" in runs and "accelerate-fsdp2" in runs


def test_the_installed_calibrate_writes_a_loadable_profile_with_provenance(
        written: Written) -> None:
    out = written.out / "calibrate" / "cpu.yaml"
    hw = HardwareProfile.from_yaml(out)
    assert hw.name == "cpu"
    assert hw.gpus_per_node == 2
    assert set(hw.peak_flop_per_s) == {"fp32", "bf16"}
    assert hw.intra_node.latency_s >= 0
    assert 0 < hw.intra_node.efficiency <= 1
    text = out.read_text()
    assert f"torch {torch.__version__}" in text
    assert "--backend gloo --nproc 2" in text
    # The compute model's memory-bound and per-kernel terms are measured, not defaulted:
    # a bf16 elementwise mix below the copy rate, and a per-kernel cost of a CPU dispatch
    # (microseconds: more than 100 ns, far less than a millisecond).
    assert 0 < hw.memory_bound_efficiency <= 1
    assert 1e-7 < hw.kernel_overhead_s < 1e-3
    assert "kernel_overhead" in text and "log_softmax" in text
    # CPU ranks run their kernels on the calling thread; the host costs are measured:
    # FSDP2's hooks take host time per unit (under a second; this one-round calibration,
    # under the other xdist worker's load, measured the difference of step times it comes
    # from at or below 0 once, 2026-12-05, and the writer floors it at 0), and
    # reduce_scatter (an all-reduce of the whole buffer in gloo) has its own fitted rate.
    assert hw.launch == "synchronous"
    assert 0.0 <= hw.fsdp_unit_overhead_s < 1.0
    assert hw.rank_skew >= 0 and hw.collective_overhead_s >= 0 and hw.sync_overhead_s >= 0
    # GELU timed by pass, at a rate of bytes per second.
    assert hw.kernels is not None and hw.kernels.memory_rates("gelu") is not None
    assert all(v > 0 for v in hw.kernels.memory_rates("gelu").values())
    assert set(hw.intra_node.kind_efficiency) == {"all_gather", "reduce_scatter", "all_reduce",
                                                  "broadcast"}
    assert hw.intra_node.kind_efficiency["all_gather"] == 1.0
    # gloo's broadcast, timed too, within the line rate.
    assert 0 < hw.intra_node.kind_efficiency["broadcast"] * hw.intra_node.efficiency <= 1
    # Selective recomputation runs every op of a block through SAC's Python dispatch
    # mode in forward: microseconds per kernel, far below a millisecond. A one-round
    # quick calibration beside the other test worker's load can floor the difference of
    # two timings at 0 (seen on 2026-12-05, as with the unit overhead above).
    assert 0.0 <= hw.checkpoint_overhead_s["selective"]["forward"] < 1e-3
    assert all(v >= 0 for phases in hw.checkpoint_overhead_s.values() for v in phases.values())
