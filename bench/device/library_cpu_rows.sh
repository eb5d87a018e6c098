#!/usr/bin/env bash
# Step time of the validation grid's library plans (DeepSpeed ZeRO-1/2/3, ZeRO-2 with the
# optimizer offloaded to the CPU, FSDP1 FULL_SHARD and SHARD_GRAD_OP) on a lent machine's
# CPU, which unlike the repository's host until 2026-11-30 has native bf16: gloo ranks on
# its cores, predicted with hardware profiles calibrated on that same host
# (zsim validate grid --calibrate-here). It runs on any host with native
# bf16: on the repository's 2-core host of 2026-12-01 the 12 n2 cases took 4-5 minutes
# (DeepSpeed's ops built in ~90 s, the n2 calibration with 1 round ~40 s).
#
# Usage:  OUT=/some/folder bash bench/device/library_cpu_rows.sh [BUDGET_S] [PATTERN...]
#   BUDGET_S  wall-clock seconds for everything (default 330); a batch that would not end
#             in what is left is skipped with a note.
#   PATTERN   run just these batches, each an --only pattern ("N|PATTERN": N cases, for
#             the budget check; default 1), instead of the priority list below.
#   Environment: OUT (required: results), PYTHON (python), STEPS (8), MIN_TIMED_S (3),
#   CAL_ROUNDS (1: one round of each calibration's benchmarks instead of three),
#   SCRATCH (a new /tmp folder: installed wheels, the zsim copy, DeepSpeed's built ops).
# Needs: the git-ignored .device_wheels/ carried along (python 3.12 wheels of DeepSpeed
# 0.19.8, its runtime dependencies, matplotlib, simpy, PyYAML, setuptools; CPython 3.12's
# headers, for a host without python3-dev) and a C++ compiler for DeepSpeed's JIT ops
# (without one the DeepSpeed cases are skipped, FSDP1's still run).
#
# Writes under $OUT, as it goes (a kill keeps what finished):
#   log.txt      every phase with the seconds since start, and every batch's output
#   env.txt      CPU (lscpu), memory, compiler, python/torch, 1-thread matmul GFLOP/s
#   batches.tsv  one row per batch: start s, pattern, status (done, failed, skipped),
#                wall s, note
#   validation/  an evidence folder (zsim.validation.evidence) holding the batch
#                validation-library-cpu16: validation.csv, step_time_runs.csv,
#                batches.yaml, profiles/validation-library-cpu16-n<N>.yaml, the figures,
#                host.txt = env.txt; merge the batch into reports/validation/ (its rows
#                of the two tables, its entry of batches.yaml, its profiles)
#
# Order: the n2 cases first (each program on llama-tiny, then on gpt-tiny), then n4, whose
# first batch calibrates n4. A batch is one `validate --only` run (its rows are written when
# all its cases are measured): ZeRO-1/2/3 together, the two FSDP1 plans together, the
# offload case alone (DeepSpeed's CPUAdam: the likeliest to fail).
#
# Time: estimates for the lent 16-core host with native bf16, and [what the repository's
# host until 2026-11-30 measured: 2 cores shared with other jobs, bf16 matmuls emulated at 0.9 GFLOP/s
# against 37 for fp32, so every bf16 figure there is 20-40x too slow]:
#   environment + 1-thread matmul rates                     ~5 s  [14 s]
#   wheel install (pip --target --no-compile)               ~5 s  [5-9 s, python 3.12]
#   DeepSpeed's 3 JIT ops at once (6 C++ compiles,         ~50 s  [290-380 s; 10-15 s to
#     ~90 s of one core each here)                                 load them once built]
#   calibration, 1 round (CAL_ROUNDS=1), n2 / n4      ~60 / ~90 s  [n2: 754 s, ~570 s of it
#                                                                  the bf16 matmuls; 3
#                                                                  rounds: 3x]
#   one case: ranks start, import torch and DeepSpeed, ~20 s n2   [llama-tiny zero1 n2,
#     2 memory steps, a warm-up, timed steps filling    ~30 s n4   4-5 s steps: 51 s with
#     MIN_TIMED_S, a profiled step                                 --no-time, 44-66 s with
#                                                                  --steps 1
#                                                                  --min-timed-s 0.5]
#   a batch's own start (python, torch, simulator, plots)   ~8 s
# So 330 s hold the fixed ~60 s, the n2 calibration and 8-11 of the 12 n2 cases; the n4
# half (its calibration and 12 cases) needs about 480 s more. Each estimate gives way to
# what the run measures: a calibration's time from its profile's mtime, a case's from its
# batch's wall time (n4 cases: 1.5x the n2 ones until an n4 batch is timed).
set -euo pipefail

BUDGET_S=${1:-330}
shift $(( $# > 0 ? 1 : 0 ))
: "${OUT:?set OUT to the folder the results go to}"
PY=${PYTHON:-python}
STEPS=${STEPS:-8}
MIN_TIMED_S=${MIN_TIMED_S:-3}
CAL_ROUNDS=${CAL_ROUNDS:-1}
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
SCRATCH=${SCRATCH:-$(mktemp -d /tmp/zsim-device.XXXXXX)}
SITE=$SCRATCH/site
mkdir -p "$OUT" "$SITE"
OUT=$(cd "$OUT" && pwd)  # absolute: the batches run from $SCRATCH
REPORT=$OUT/validation
BATCH=validation-library-cpu16
LOG=$OUT/log.txt
TSV=$OUT/batches.tsv
mkdir -p "$REPORT"
[ -f "$TSV" ] || printf 'start_s\tbatch\tstatus\twall_s\tnote\n' > "$TSV"

log() { printf '[%4ds] %s\n' "$SECONDS" "$*" | tee -a "$LOG"; }
# Copy stdin to the log, each line stamped with the seconds since start.
stamp() { while IFS= read -r line; do printf '[%4ds]   %s\n' "$SECONDS" "$line"; done >> "$LOG"; }
left() { echo $(( BUDGET_S - SECONDS )); }
note() { printf '%s\t%s\t%s\t%s\t%s\n' "$@" >> "$TSV"; }  # start, batch, status, wall, note
trap 'log "exit status $? after ${SECONDS}s of ${BUDGET_S}s"' EXIT

# --- 1. Environment: what the rows were measured on ---------------------------------
log "phase environment: repo $REPO, scratch $SCRATCH, budget ${BUDGET_S}s"
{
  echo "date: $(date -u '+%F %T UTC'), host $(hostname), nproc $(nproc)"
  lscpu || true
  free -g || true
  ldd --version 2>&1 | head -1 || true
  c++ --version 2>&1 | head -1 || echo "c++: none"
  # Rates with one thread (each calibrated rank has several): bf16 about as fast as fp32,
  # or faster (AMX), means native bf16; an emulating host runs it ~40x slower.
  CUDA_VISIBLE_DEVICES="" "$PY" - <<'EOF' 2>&1 || true
import sys, sysconfig, time
import torch
print(f"python {sys.version.split()[0]} at {sys.executable}; Python.h dir "
      f"{sysconfig.get_paths()['include']}")
print(f"torch {torch.__version__}, cpu capability {torch.backends.cpu.get_cpu_capability()}, "
      f"cuda available {torch.cuda.is_available()}, threads {torch.get_num_threads()}")
torch.set_num_threads(1)
for dtype in (torch.float32, torch.bfloat16):
    a, b = (torch.randn(1024, 1024, dtype=dtype) for _ in range(2))
    a @ b
    calls, start = 0, time.perf_counter()
    while calls < 3 or time.perf_counter() - start < 0.5:
        a @ b
        calls += 1
    rate = 2 * 1024**3 * calls / (time.perf_counter() - start) / 1e9
    print(f"matmul 1024^3 {dtype}, 1 thread: {rate:.1f} GFLOP/s")
EOF
} > "$OUT/env.txt"
cp "$OUT/env.txt" "$REPORT/host.txt"
grep -E 'Model name|^CPU\(s\)|Flags|matmul|python|torch|c\+\+' "$OUT/env.txt" | cut -c1-400 | stamp \
  || true
log "phase environment done"

# --- 2. Wheels (.device_wheels: DeepSpeed, its runtime dependencies, matplotlib, simpy)
# into $SITE, never into the interpreter's site-packages (its CUDA torch stays as it is).
MODULES=(deepspeed hjson ninja cpuinfo msgpack pydantic pydantic_core annotated_types
         typing_inspection typing_extensions einops psutil packaging tqdm simpy yaml
         matplotlib contourpy cycler fontTools kiwisolver PIL pyparsing dateutil six
         setuptools)
WHEELS=(deepspeed hjson ninja py-cpuinfo msgpack pydantic pydantic-core annotated-types
        typing-inspection typing-extensions einops psutil packaging tqdm simpy pyyaml
        matplotlib contourpy cycler fonttools kiwisolver pillow pyparsing python-dateutil six)
# torch's JIT (torch.utils.cpp_extension) imports setuptools; torch's wheel requires it,
# so only a missing one is installed.
"$PY" -c 'import setuptools' 2> /dev/null || WHEELS+=(setuptools)
log "phase install"
if "$PY" -c 'import importlib.util as u, sys; sys.exit(any(u.find_spec(m) is None for m in sys.argv[1:]))' \
    "${MODULES[@]}"; then
  log "every module importable already: nothing installed"
elif "$PY" -m pip --version > /dev/null 2>&1; then
  "$PY" -m pip install --no-index --no-deps --no-compile --disable-pip-version-check \
    --find-links "$REPO/.device_wheels" --target "$SITE" "${WHEELS[@]}" 2>&1 | stamp \
    || log "pip install FAILED (see above); going on with what imports"
else
  # No pip: unpack the wheels that fit this interpreter (scripts to $SITE/bin).
  log "no pip: unpacking the wheels"
  "$PY" - "$REPO/.device_wheels" "$SITE" <<'EOF' 2>&1 | stamp
import glob, os, sys, zipfile
wheels, site = sys.argv[1:3]
cp = f"cp{sys.version_info.major}{sys.version_info.minor}"
for path in sorted(glob.glob(os.path.join(wheels, "*.whl"))):
    py, abi = os.path.basename(path)[:-4].split("-")[-3:-1]
    if py.startswith("cp") and cp not in py.split(".") and abi != "abi3":
        continue
    with zipfile.ZipFile(path) as whl:
        for info in whl.infolist():
            parts = info.filename.split("/")
            if parts[0].endswith(".data"):
                if len(parts) < 3 or parts[1] not in ("scripts", "purelib", "platlib"):
                    continue
                parts = (["bin"] if parts[1] == "scripts" else []) + parts[2:]
            if info.is_dir():
                continue
            dest = os.path.join(site, *parts)
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            with open(dest, "wb") as f:
                f.write(whl.read(info))
            os.chmod(dest, (info.external_attr >> 16) & 0o777 or 0o644)
    print("unpacked", os.path.basename(path))
EOF
fi
# zsim as an install lays it out (pyproject.toml: hardware_profiles/ is the package
# zsim.hardware_profiles), run from $SCRATCH so the checkout's zsim/ does not shadow it.
rm -rf "$SITE/zsim"
cp -r "$REPO/zsim" "$SITE/zsim"
cp -r "$REPO/hardware_profiles" "$SITE/zsim/hardware_profiles"
export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}" PATH="$SITE/bin:$PATH"
export DS_ACCELERATOR=cpu CUDA_VISIBLE_DEVICES=""
export TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-$SCRATCH/torch_extensions}
export MPLCONFIGDIR=$SCRATCH/matplotlib
cd "$SCRATCH"
"$PY" -c 'import zsim, zsim.hardware_profiles; print("zsim from", zsim.__file__)' 2>&1 | stamp
log "phase install done (PYTHONPATH $PYTHONPATH)"

# --- 3. DeepSpeed's ops, JIT-built with ninja and g++ before anything is timed: fused
# Adam and the shared-memory comm op (every ZeRO case), CPUAdam (the offload case).
DS_OK=0
CPU_ADAM_OK=0
PY_INCLUDE=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
PY_VER=$("$PY" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
HEADERS=$REPO/.device_wheels/python$PY_VER-include.tar.gz
if [ ! -f "$PY_INCLUDE/Python.h" ] && [ -f "$HEADERS" ]; then
  # No python3-dev: the headers of another build of this minor version (CPython keeps its
  # C API within one; 3.12.1's from pyenv), found by the compiler through CPATH.
  mkdir -p "$SCRATCH/include"
  tar -xzf "$HEADERS" -C "$SCRATCH/include"
  log "no Python.h in $PY_INCLUDE: using $(basename "$HEADERS")"
  PY_INCLUDE=$SCRATCH/include/python$PY_VER
  export CPATH="$PY_INCLUDE${CPATH:+:$CPATH}"
fi
if ! command -v "${CXX:-c++}" > /dev/null; then  # torch's JIT compiles with $CXX or c++
  log "no C++ compiler (${CXX:-c++}): the DeepSpeed cases are skipped"
elif [ ! -f "$PY_INCLUDE/Python.h" ]; then
  log "no $PY_INCLUDE/Python.h (python3-dev): the DeepSpeed cases are skipped"
else
  log "phase DeepSpeed ops: building into $TORCH_EXTENSIONS_DIR ($(ninja --version 2>&1 || echo 'no ninja'))"
  declare -A BUILD
  for op in FusedAdamBuilder ShareMemCommBuilder CPUAdamBuilder; do
    timeout -k 5 $(( $(left) / 2 )) "$PY" -c '
import sys
from deepspeed.accelerator import get_accelerator
get_accelerator().create_op_builder(sys.argv[1]).load()' "$op" > "$OUT/build-$op.log" 2>&1 &
    BUILD[$op]=$!
  done
  declare -A BUILT
  for op in "${!BUILD[@]}"; do
    if wait "${BUILD[$op]}"; then
      BUILT[$op]=1
      log "built $op"
    else
      BUILT[$op]=0
      tail -5 "$OUT/build-$op.log" | stamp
      log "building $op FAILED (build-$op.log)"
    fi
  done
  if [ "${BUILT[FusedAdamBuilder]}${BUILT[ShareMemCommBuilder]}" = 11 ]; then DS_OK=1; fi
  if [ "$DS_OK${BUILT[CPUAdamBuilder]}" = 11 ]; then CPU_ADAM_OK=1; fi
  log "phase DeepSpeed ops done"
fi

# --- 4. Batches, most valuable first; the clock is checked before each.
BATCHES=(
  "3|llama-tiny zero[123] ac=none mb=2 n2"
  "2|llama-tiny fsdp*fsdp1* n2"
  "1|llama-tiny zero2 * offload=optimizer n2"
  "3|gpt-tiny zero[123] ac=none mb=2 n2"
  "2|gpt-tiny fsdp*fsdp1* n2"
  "1|gpt-tiny zero2 * offload=optimizer n2"
  "3|llama-tiny zero[123] ac=none mb=2 n4"
  "2|llama-tiny fsdp*fsdp1* n4"
  "1|llama-tiny zero2 * offload=optimizer n4"
  "3|gpt-tiny zero[123] ac=none mb=2 n4"
  "2|gpt-tiny fsdp*fsdp1* n4"
  "1|gpt-tiny zero2 * offload=optimizer n4"
)
[ $# -eq 0 ] || BATCHES=("$@")
declare -A CASE_S=([2]=20 [4]=30)  # seconds per case, replaced by what batches measure
declare -A CAL_S=([2]=60 [4]=90)   # seconds per calibration, likewise
declare -A SEEN=()                 # world sizes whose case time was measured
OVERHEAD_S=8                       # a batch's own start: python, torch, simulator, plots
MARGIN_S=5                         # kept for the summary

run_batch() {  # $1: "N|PATTERN" or "PATTERN"
  local cases=1 pattern=$1 world need start epoch wall rc cal_s=0 per status
  if [[ $pattern == *"|"* ]]; then cases=${pattern%%|*}; pattern=${pattern#*|}; fi
  world=${pattern##* n}
  if ! [[ $world =~ ^[0-9]+$ ]]; then
    note "$SECONDS" "$pattern" skipped 0 "no world size (a pattern ends with ' n<N>')"
    log "skip '$pattern': it does not end with ' n<N>'"; return 0
  fi
  : "${CASE_S[$world]:=${CASE_S[4]}}" "${CAL_S[$world]:=${CAL_S[4]}}"
  local profile=$REPORT/profiles/$BATCH-n$world.yaml prof=()
  if [[ $pattern == *offload* && $CPU_ADAM_OK = 0 ]]; then
    note "$SECONDS" "$pattern" skipped 0 "DeepSpeed's CPUAdam op did not build"
    log "skip '$pattern': no CPUAdam op"; return 0
  elif [[ $pattern == *zero* && $DS_OK = 0 ]]; then
    note "$SECONDS" "$pattern" skipped 0 "DeepSpeed's ops did not build"
    log "skip '$pattern': no DeepSpeed ops"; return 0
  fi
  if [ -f "$profile" ]; then
    prof=(--profile "$profile")
  else
    prof=(--calibrate-here --calibration-rounds "$CAL_ROUNDS")
    cal_s=${CAL_S[$world]}
  fi
  need=$(( cal_s + cases * CASE_S[$world] + OVERHEAD_S ))
  if (( need > $(left) - MARGIN_S )); then
    note "$SECONDS" "$pattern" skipped 0 "needs ~${need}s, $(left)s left"
    log "skip '$pattern': needs ~${need}s, $(left)s left"; return 0
  fi
  log "batch '$pattern': $cases case(s), ~${need}s expected, $(left)s left"
  start=$SECONDS
  epoch=$(date +%s)
  if timeout -k 10 $(( $(left) - MARGIN_S )) "$PY" -m zsim validate grid --out "$REPORT" \
      --batch "$BATCH" "${prof[@]}" --runs 1 --steps "$STEPS" --min-timed-s "$MIN_TIMED_S" \
      --only "$pattern" 2>&1 | stamp; then
    status="done"
  else
    rc=$?
    status=failed
    [ "$rc" -ne 124 ] || status="killed at the budget"
  fi
  wall=$(( SECONDS - start ))
  if (( cal_s > 0 )) && [ -f "$profile" ]; then  # calibration ended when it wrote its profile
    cal_s=$(( $(stat -c %Y "$profile") - epoch ))
    log "calibrated n$world in ${cal_s}s"
    if [ "$world" = 2 ]; then CAL_S[4]=$(( cal_s * 3 / 2 )); fi
  fi
  if [ "$status" = "done" ]; then
    per=$(( (wall - cal_s - OVERHEAD_S + cases - 1) / cases ))  # rounded up
    CASE_S[$world]=$(( per > 1 ? per : 1 ))
    SEEN[$world]=1
    if [ "$world" = 2 ] && [ -z "${SEEN[4]:-}" ]; then CASE_S[4]=$(( CASE_S[2] * 3 / 2 )); fi
  fi
  note "$start" "$pattern" "$status" "$wall" "calibration ${cal_s}s; ~${CASE_S[$world]}s per case"
  log "batch '$pattern' $status in ${wall}s"
}

log "phase batches: ${#BATCHES[@]}, steps $STEPS, min timed ${MIN_TIMED_S}s, calibration rounds $CAL_ROUNDS"
for batch in "${BATCHES[@]}"; do
  run_batch "$batch"
done

# --- 5. Summary -----------------------------------------------------------------------
log "phase summary"
stamp < "$TSV"
if [ -f "$REPORT/validation.csv" ]; then
  grep -c ',step_time_s,' "$REPORT/validation.csv" | sed 's/^/step_time_s rows: /' | stamp || true
  grep ',step_time_s,' "$REPORT/validation.csv" | stamp || true
fi
find "$REPORT" -maxdepth 1 -type f -printf '%10s %f\n' | sort -k2 | stamp
