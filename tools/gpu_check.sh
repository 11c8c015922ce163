#!/bin/bash
# GPU checks of issue 23 in ONE run (at most ~7 minutes): mpidist's GPU test files at three launch
# shapes, and `python -m mpidist bench gpu` of this checkout against a baseline, interleaved in the
# same processes, at the same three shapes; plus the Python calls per allreduce of both.
#
#   BASELINE=/path/holding/baseline/mpidist  bash tools/gpu_check.sh [STEP...]
#
# Run from anywhere; it works in the checkout it belongs to. Environment:
#   BASELINE  a directory holding the baseline's `mpidist/` package (e.g. main at 946a629:
#             `git archive 946a629 mpidist | tar -x -C /tmp/base` then BASELINE=/tmp/base); unset:
#             made that way from the checkout's git history when there is one, else no baseline.
#   WHEELS    a directory of wheels (Open MPI, mpi4py, pytest-mpi) to install into /tmp/pfx and use
#             (a machine without network); default: .gpu/whl. SYSTEM_MPI=1: the machine's own MPI.
#   BUDGET    seconds for the whole run (default 400): a step gets at most what is left; the three
#             test launches run at the same time, after the benches.
#   FAKE=1    no GPU here: the tests run on the host fake of CuPy/NCCL, and so does the bench (its
#             times then mean nothing: this only checks that the script runs through), with the
#             ranks sharing one pretend GPU as on a one-GPU machine (MPITEST_FAKE_SHARED_GPU=1).
#   OUT       a directory for gpu_check.log and the ranks' logs (default /tmp/gpu-check).
# STEPs (default all, in this order): calls bench1 bench2x1 bench2 n1 n2x1 n2
#   calls     Python calls per steady-state allreduce (one array, ten), baseline and this checkout;
#   bench1    -n 1: NCCL vs raw CuPy NCCL (4 KB..256 MB), staged (mpi-staged) vs a hand-written loop;
#   bench2x1  -n 2, MPIDIST_LOCAL_SIZE=1: two one-rank nodes (nccl+mpi) vs the loop;
#   bench2    -n 2 on one GPU: NCCL refused with its reason, mpi-staged vs the loop;
#   n1, n2x1, n2: tests/mpi/test_*gpu*.py at those shapes (concurrently).
# On the lent GPU machine (after `mkdir -p .gpu && cp -r <shared>/gpu/. .gpu/`, the baseline in
# .gpu/base): one device call, command "BASELINE=.gpu/base bash tools/gpu_check.sh",
# carry [".gpu"], timeout_s 480. Everything is also in $OUT/gpu_check.log.
set -u
HERE=$(cd "$(dirname "$0")/.." && pwd)
cd "$HERE" || exit 1
O=${OUT:-/tmp/gpu-check}; mkdir -p "$O"
exec > >(tee "$O/gpu_check.log") 2>&1
START=$(date +%s); BUDGET=${BUDGET:-400}
STEPS=("$@"); [ ${#STEPS[@]} -eq 0 ] && STEPS=(calls bench1 bench2x1 bench2 n1 n2x1 n2)
want() { for s in "${STEPS[@]}"; do [ "$s" = "$1" ] && return 0; done; return 1; }
left() { echo $(( BUDGET - ($(date +%s) - START) )); }
step() {  # step LIMIT LABEL COMMAND...: run under `timeout` of min(LIMIT, time left)
  local limit=$1 label=$2 t; shift 2
  t=$(left); [ "$t" -gt "$limit" ] && t=$limit
  echo; echo "=== $(date +%T) $label [limit ${t}s]: $*"
  if [ "$t" -lt 15 ]; then echo "=== $label: SKIPPED, the budget of ${BUDGET}s is spent"; return; fi
  timeout "$t" "$@"; local rc=$?
  [ $rc = 124 ] && echo "=== $label: TIMED OUT after ${t}s"
  echo "=== $label: rc=$rc"
}

echo "mpidist GPU check of $(git rev-parse --short HEAD 2>/dev/null || echo 'this checkout') at $(date)"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | head -2
PY=${PYTHON:-python3}
# The wheels (PyPI Open MPI, mpi4py, pytest-mpi) whenever they are there, so that runs on machines
# with or without a system MPI compare alike (a lent machine once had Debian's Open MPI 4.1.6 and
# mpi4py but no pytest-mpi); SYSTEM_MPI=1 keeps the machine's own MPI when it has one.
W=${WHEELS:-$HERE/.gpu/whl}
if [ "${SYSTEM_MPI:-0}" != 1 ] || ! $PY -c "import mpi4py, pytest_mpi" 2>/dev/null; then
  if ls "$W"/*.whl >/dev/null 2>&1; then
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --prefix /tmp/pfx "$W"/*.whl 2>&1 | grep -v WARNING
    PYV=$($PY -c 'import sys;print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
    export PATH=/tmp/pfx/bin:$PATH PYTHONPATH=/tmp/pfx/lib/python$PYV/site-packages:${PYTHONPATH:-} \
      LD_LIBRARY_PATH=/tmp/pfx/lib:${LD_LIBRARY_PATH:-}
  else
    $PY -c "import mpi4py, pytest_mpi" 2>/dev/null || {
      echo "gpu_check: mpi4py or pytest_mpi cannot be imported and WHEELS ($W) holds no wheels"; exit 2; }
  fi
fi
export PYTHONPATH=$HERE:${PYTHONPATH:-} PYTHONUNBUFFERED=1 CUPY_CACHE_DIR=${CUPY_CACHE_DIR:-/tmp/cupy_cache}
[ "$(id -u)" = 0 ] && export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
$PY -c "import cupy, mpi4py; from cupy.cuda import nccl; print('CuPy', cupy.__version__, '| NCCL', nccl.get_version(), \
'| GPUs', cupy.cuda.runtime.getDeviceCount(), '| mpi4py', mpi4py.__version__, '|', __import__('mpi4py.MPI').MPI.Get_library_version().splitlines()[0][:60])" 2>&1 | tail -1

if [ -z "${BASELINE:-}" ] && git rev-parse --verify -q 946a629 >/dev/null 2>&1; then
  BASELINE=/tmp/gpu-check-baseline; rm -rf "$BASELINE"; mkdir -p "$BASELINE"
  git archive 946a629 mpidist | tar -x -C "$BASELINE"
fi
[ -n "${BASELINE:-}" ] && [ -d "$BASELINE" ] && BASELINE=$(cd "$BASELINE" && pwd)
BEFORE=(); CALLS_BEFORE=()
if [ -n "${BASELINE:-}" ] && [ -f "$BASELINE/mpidist/__init__.py" ]; then
  BEFORE=(--before "$BASELINE"); CALLS_BEFORE=(--before "$BASELINE"); echo "baseline: $BASELINE/mpidist"
else
  echo "baseline: none (set BASELINE to a directory holding the baseline's mpidist/)"
fi

MR="mpirun --oversubscribe --bind-to none"
if [ "${FAKE:-0}" = 1 ]; then  # the bench on the host fake (times mean nothing), all ranks on one pretend GPU
  export MPITEST_FAKE_SHARED_GPU=1
  BENCH=($PY -c "import sys; sys.path.insert(0, 'tests/mpi'); import fake_cupy; fake_cupy.install()
from mpidist.bench import gpu; code = gpu.main(sys.argv[1:]); fake_cupy.uninstall(); sys.exit(code)")
  CALLS=($PY -m tools.gpu_calls --fake); BENCH+=(--sizes 4KB,64KB --staged-sizes 4KB,64KB --seconds 0.05)
else
  BENCH=($PY -m mpidist bench gpu --seconds 0.4); CALLS=($PY -m tools.gpu_calls)
fi
T="$PY tests/mpi_pytest.py -q -rs --color=no --maxfail=40 --with-mpi"
GPU_TESTS=${GPU_TESTS:-$(ls tests/mpi/test_*gpu*.py | tr '\n' ' ')}

want calls && step 40 "calls, -n 1" $MR -n 1 "${CALLS[@]}" "${CALLS_BEFORE[@]}"
want bench1 && step 50 "bench, -n 1" $MR -n 1 "${BENCH[@]}" "${BEFORE[@]}"
want bench2x1 && step 50 "bench, -n 2 MPIDIST_LOCAL_SIZE=1 (two one-rank nodes)" \
  $MR -n 2 -x MPIDIST_LOCAL_SIZE=1 "${BENCH[@]}" "${BEFORE[@]}"
want bench2 && step 50 "bench, -n 2 on one GPU" \
  $MR -n 2 "${BENCH[@]}" "${BEFORE[@]}"
# The test launches share the GPU at once (correctness only; the benches above ran alone): each
# writes to its own file, shown when all are done.
pids=()
for shape in n1 n2x1 n2; do
  want $shape || continue
  case $shape in
    n1) args=(-n 1); label="tests, -n 1";;
    n2x1) args=(-n 2 -x MPIDIST_LOCAL_SIZE=1); label="tests, -n 2 MPIDIST_LOCAL_SIZE=1";;
    n2) args=(-n 2); label="tests, -n 2 on one GPU";;
  esac
  ( step 300 "$label" env MPITEST_LABEL=gpu-$shape $MR "${args[@]}" -x MPITEST_LABEL $T $GPU_TESTS \
      > "$O/tests-$shape.txt" 2>&1 ) &
  pids+=($!)
done
[ ${#pids[@]} -gt 0 ] && wait "${pids[@]}"
for shape in n1 n2x1 n2; do [ -f "$O/tests-$shape.txt" ] && want $shape && cat "$O/tests-$shape.txt"; done
cp tests/.logs/gpu-*.log "$O/" 2>/dev/null
echo; echo "gpu_check: done in $(( $(date +%s) - START ))s; log in $O/gpu_check.log"
