#!/usr/bin/env bash
# The one command to run on a machine with an NVIDIA GPU. Builds for sm_$GPU_COMPUTE_CAPABILITY
# (default 90), runs the GPU tests, compute-sanitizer (when installed) and the benchmarks,
# writes every log into LOG_DIR and prints a summary table last. Exits 1 if any step failed.
#
#   scripts/gpu_check.sh --quick [LOG_DIR]          default LOG_DIR: doc/gpu-runs/<date>-quick
#   scripts/gpu_check.sh --stage NAME [LOG_DIR]     default LOG_DIR: logs/gpu-check-<date-time>-NAME
#   scripts/gpu_check.sh [LOG_DIR]                  every stage in turn (the full check)
#
# --quick fits a short lease (8 minutes on an H200 from a clean tree): the bf16 build of
# only what it runs, the GPU tests test_mma, test_backend, test_attention, test_san and
# test_gpt2, then scripts/bench_gpu.sh. Its logs go under doc/gpu-runs/ to be committed.
# The full check is cut into stages that each build what they run and finish in 9 minutes
# on an H200 from a clean tree, so a lease with a per-command limit runs it stage by stage:
#   bf16        every .cu file built in bf16, every GPU test
#   fp32        the same in fp32
#   sanitizer   compute-sanitizer memcheck on the bf16 tests, racecheck/synccheck on the backend
#   bench       every dev/cuda playground's timing table in both precisions, then bench_gpu.sh
# Needs nvcc and a GPU; does not need the network or the project's venv (it uses
# $PYTHON, default python3, for anything Python).
set -uo pipefail
cd "$(dirname "$0")/.."
stages="bf16 fp32 sanitizer bench"
quick=0
if [ "${1:-}" = "--quick" ]; then
  quick=1
  shift
elif [ "${1:-}" = "--stage" ]; then
  case " $stages " in
    *" ${2:-} "*) stages=$2 ;;
    *) echo "gpu_check: --stage must be one of: $stages (got '${2:-}')" >&2; exit 2 ;;
  esac
  shift 2
fi
if ! nvidia-smi -L >/dev/null 2>&1; then
  echo "gpu_check: no NVIDIA GPU here (nvidia-smi -L failed): nothing to check; make test covers the CPU" >&2
  exit 1
fi
command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ] || { echo "gpu_check: nvcc not found" >&2; exit 1; }
if [ $quick = 1 ]; then
  log_dir=${1:-doc/gpu-runs/$(date +%Y-%m-%d)-quick}
else
  log_dir=${1:-logs/gpu-check-$(date +%Y%m%d-%H%M%S)$([ "$stages" = "bf16 fp32 sanitizer bench" ] || echo "-$stages")}
fi
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

print_summary() {
  local total=$(( $(date +%s) - check_start ))
  echo
  echo "gpu_check summary (logs in $log_dir)"
  printf '%-40s %-10s %8s\n' step status seconds
  for row in "${summary[@]}"; do echo "$row"; done
  echo "total ${total}s; $([ $failed = 0 ] && echo 'all steps passed' || echo 'SOME STEPS FAILED')"
}

if [ $quick = 1 ]; then
  quick_tests="test_mma test_backend test_attention test_san test_gpt2"
  step machine 60 bash -c 'nvidia-smi; nvcc --version; echo; uname -a; nproc'
  step debug-states 180 bash -c "$PYTHON dev/test/make_debug_states.py build/debug-states && touch build/debug-states/.complete"
  step debug-states-gpt2 120 bash -c "$PYTHON dev/test/make_gpt2_debug_states.py build/debug-states-gpt2 && touch build/debug-states-gpt2/.complete"
  step build-gpu-bf16 240 make --no-print-directory -j"$jobs" PRECISION=BF16 \
    $(for t in $quick_tests train_san train_gpt2 attention_forward attention_backward; do echo build/gpu-bf16/$t; done)
  step tests-gpu-bf16 150 bash scripts/run_tests.sh build/gpu-bf16 $quick_tests
  step bench 150 bash scripts/bench_gpu.sh 20
  print_summary | tee "$log_dir/summary.txt"
  exit $failed
fi

debug_states() {  # the PyTorch references' debug states for test_san and test_gpt2 (needs torch)
  [ -e build/debug-states/.complete ] ||
    step debug-states 180 bash -c "$PYTHON dev/test/make_debug_states.py build/debug-states && touch build/debug-states/.complete"
  [ -e build/debug-states-gpt2/.complete ] ||
    step debug-states-gpt2 120 bash -c "$PYTHON dev/test/make_gpt2_debug_states.py build/debug-states-gpt2 && touch build/debug-states-gpt2/.complete"
}

# build_and_test PRECISION: every .cu file in that precision, then every GPU test
build_and_test() {
  local precision=$1 p
  p=$(echo "$precision" | tr A-Z a-z)
  debug_states
  step "build-gpu-$p" 360 make --no-print-directory -j"$jobs" gpu PRECISION="$precision"
  step "tests-gpu-$p" 240 bash scripts/run_tests.sh "build/gpu-$p" $(make -s print-GPU_TEST_NAMES)
}

sanitizer_stage() {
  if ! command -v compute-sanitizer >/dev/null 2>&1; then
    summary+=("$(printf '%-40s %-10s %8s' compute-sanitizer "skipped" "-") (not installed)")
    return
  fi
  debug_states
  local tests
  tests=$(make -s print-GPU_TEST_NAMES PRECISION=BF16 | tr ' ' '\n' | grep -v -E '^test_(san|gpt2)$' | tr '\n' ' ')
  step build-gpu-bf16 360 make --no-print-directory -j"$jobs" PRECISION=BF16 \
    $(for t in $tests test_san; do echo build/gpu-bf16/$t; done)
  # memcheck on every test binary; race and sync checks on the backend tests, which exercise
  # shared memory and barriers; the trainer test runs many steps, so one configuration only
  step sanitizer-memcheck 240 env TEST_WRAPPER="compute-sanitizer --tool memcheck --error-exitcode 1" \
    bash scripts/run_tests.sh build/gpu-bf16 $tests
  step sanitizer-memcheck-test_san 150 compute-sanitizer --tool memcheck --error-exitcode 1 \
    build/gpu-bf16/test_san build/debug-states san
  step sanitizer-racecheck 60 compute-sanitizer --tool racecheck --error-exitcode 1 build/gpu-bf16/test_backend
  step sanitizer-synccheck 60 compute-sanitizer --tool synccheck --error-exitcode 1 build/gpu-bf16/test_backend
}

# every dev/cuda program validates, then prints its timing table; then the side-by-side bench
bench_stage() {
  local precision p src name
  for precision in BF16 FP32; do
    p=$(echo "$precision" | tr A-Z a-z)
    step "build-playgrounds-$p" 240 make --no-print-directory -j"$jobs" PRECISION="$precision" \
      $(for src in dev/cuda/*.cu; do echo "build/gpu-$p/$(basename "$src" .cu)"; done)
    for src in dev/cuda/*.cu; do
      name=$(basename "$src" .cu)
      step "bench-$name-$p" 60 "build/gpu-$p/$name"
    done
  done
  step bench-trainers 180 bash scripts/bench_gpu.sh 20
}

step machine 60 bash -c 'nvidia-smi; nvcc --version; echo; uname -a; nproc'
for stage in $stages; do
  case $stage in
    bf16) build_and_test BF16 ;;
    fp32) build_and_test FP32 ;;
    sanitizer) sanitizer_stage ;;
    bench) bench_stage ;;
  esac
done
print_summary | tee "$log_dir/summary.txt"
exit $failed
