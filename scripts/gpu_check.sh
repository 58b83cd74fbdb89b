#!/usr/bin/env bash
# The one command to run on a machine with an NVIDIA GPU: builds every .cu file for
# sm_$GPU_COMPUTE_CAPABILITY (default 90) in both precisions, runs every GPU test, runs
# compute-sanitizer on the test binaries (when installed), runs the benchmarks, writes all
# logs into LOG_DIR, and prints a summary table last. Exits 1 if any step failed.
#
#   scripts/gpu_check.sh [LOG_DIR]        default LOG_DIR: logs/gpu-check-<date-time>
#
# Needs nvcc and a GPU; does not need the network or the project's venv (it uses
# $PYTHON, default python3, for anything Python). Budget: well under 10 minutes on an H200.
set -uo pipefail
cd "$(dirname "$0")/.."
# without a GPU there is nothing to check: stop at once, saying why (make test runs the rest)
if ! command -v nvidia-smi >/dev/null 2>&1; then
  echo "gpu_check.sh: no NVIDIA GPU: nvidia-smi is not installed. This script runs the GPU tests; on this machine 'make test' runs every check it can." >&2
  exit 2
fi
if ! gpus=$(nvidia-smi -L 2>&1) || ! grep -q '^GPU' <<<"$gpus"; then
  echo "gpu_check.sh: no NVIDIA GPU: nvidia-smi -L lists none ($(head -n 1 <<<"$gpus")). This script runs the GPU tests; on this machine 'make test' runs every check it can." >&2
  exit 2
fi
if ! command -v "${NVCC:-nvcc}" >/dev/null 2>&1 && [ ! -x /usr/local/cuda/bin/nvcc ]; then
  echo "gpu_check.sh: nvcc not found (set NVCC or install the CUDA toolkit): the GPU builds need it" >&2
  exit 2
fi
log_dir=${1:-logs/gpu-check-$(date +%Y%m%d-%H%M%S)}
mkdir -p "$log_dir"
export PYTHON=${PYTHON:-python3}
jobs=$(nproc 2>/dev/null || echo 8)
summary=()
failed=0
check_start=$(date +%s)

# step NAME TIMEOUT_SECONDS COMMAND...: runs COMMAND with output in LOG_DIR/NAME.log
step() {
  local name=$1 limit=$2
  shift 2
  local start=$(date +%s.%N)
  echo "=== $name: $*"
  timeout "$limit" "$@" >"$log_dir/$name.log" 2>&1
  local rc=$?
  local secs=$(echo "$(date +%s.%N) - $start" | bc)
  local status=ok
  if [ $rc -ne 0 ]; then
    status="FAIL($rc)"
    [ $rc -eq 124 ] && status="TIMEOUT"
    failed=1
    tail -n 30 "$log_dir/$name.log"
  fi
  summary+=("$(printf '%-40s %-10s %8.1f' "$name" "$status" "$secs")")
}

step machine 60 bash -c 'nvidia-smi; nvcc --version; echo; uname -a; nproc'
# the PyTorch reference's debug states for test_san (needs torch in $PYTHON)
step debug-states 180 bash -c "$PYTHON dev/test/make_debug_states.py build/debug-states && touch build/debug-states/.complete"
step debug-states-gpt2 120 bash -c "$PYTHON dev/test/make_gpt2_debug_states.py build/debug-states-gpt2 && touch build/debug-states-gpt2/.complete"

for precision in BF16 FP32; do
  p=$(echo $precision | tr A-Z a-z)
  step "build-gpu-$p" 300 make --no-print-directory -j"$jobs" gpu PRECISION=$precision
  tests=$(make -s print-GPU_TEST_NAMES)
  step "tests-gpu-$p" 240 bash scripts/run_tests.sh "build/gpu-$p" $tests
done

if command -v compute-sanitizer >/dev/null 2>&1; then
  # memcheck on every test binary; race and sync checks on the backend tests, which
  # exercise shared memory and barriers
  # (the trainer tests run many steps: under memcheck they check one configuration)
  tests=$(make -s print-GPU_TEST_NAMES PRECISION=BF16 | tr ' ' '\n' | grep -v -E '^test_(san|gpt2)$' | tr '\n' ' ')
  step sanitizer-memcheck 300 env TEST_WRAPPER="compute-sanitizer --tool memcheck --error-exitcode 1" \
    bash scripts/run_tests.sh build/gpu-bf16 $tests
  step sanitizer-memcheck-test_san 200 compute-sanitizer --tool memcheck --error-exitcode 1 \
    build/gpu-bf16/test_san build/debug-states san
  step sanitizer-racecheck 200 compute-sanitizer --tool racecheck --error-exitcode 1 build/gpu-bf16/test_backend
  step sanitizer-synccheck 200 compute-sanitizer --tool synccheck --error-exitcode 1 build/gpu-bf16/test_backend
else
  summary+=("$(printf '%-40s %-10s %8s' compute-sanitizer "skipped" "-") (not installed)")
fi

# benchmarks: every dev/cuda program (each validates, then prints its timing table)
for precision in BF16 FP32; do
  p=$(echo $precision | tr A-Z a-z)
  for src in dev/cuda/*.cu; do
    name=$(basename "$src" .cu)
    step "bench-$name-$p" 120 "build/gpu-$p/$name"
  done
done

total=$(( $(date +%s) - check_start ))
echo
echo "gpu_check summary (logs in $log_dir; benchmark tables in its bench-*.log files)"
printf '%-40s %-10s %8s\n' step status seconds
for row in "${summary[@]}"; do echo "$row"; done
for log in "$log_dir"/bench-*.log; do
  [ -f "$log" ] || continue
  echo
  echo "--- $(basename "$log" .log)"
  grep -E "^(op|measure|executor|[a-z_]+ +[0-9])" "$log" || tail -n 5 "$log"
done
echo
echo "total ${total}s; $([ $failed -eq 0 ] && echo 'ALL OK' || echo 'SOME STEPS FAILED')"
exit $failed
