#!/usr/bin/env bash
# The one command to run on a machine with an NVIDIA GPU. Builds for sm_$GPU_COMPUTE_CAPABILITY
# (default 90), runs the GPU tests, compute-sanitizer (when installed) and the benchmarks,
# writes every log into LOG_DIR and prints a summary table last. Exits 1 if any step failed.
#
#   scripts/gpu_check.sh --quick [LOG_DIR]          default LOG_DIR: doc/gpu-runs/<date>-quick
#   scripts/gpu_check.sh --stage NAME [LOG_DIR]     default LOG_DIR: logs/gpu-check-<date-time>-NAME
#   scripts/gpu_check.sh [LOG_DIR]                  every stage in turn (the full check)
#
# --quick fits a short lease (8 minutes on an H200 from a clean tree, by the estimate it
# prints first), cheapest proof first, so that a run cut short still says what works:
#   1. test_mma: the tensor-core fragment layouts the host backend emulates, against the hardware
#   2. test_attention, then the dev/cuda attention harnesses (every kernel version against the
#      CPU reference), then compute-sanitizer racecheck and synccheck on one small
#      tensor-core test_attention case (when compute-sanitizer is installed)
#   3. two train_san steps with the sync check (--sync-check 1: a fault names its kernel),
#      on the tensor-core attention and again on the scalar one
#   4. the rest of the GPU tests: test_backend, test_backend_misuse, test_san, test_gpt2,
#      test_comm and test_data_parallel (one rank: NCCL is not started)
# The benchmarks are not in --quick (scripts/bench_gpu.sh, or --stage bench). Its logs go
# under doc/gpu-runs/ to be committed.
# The full check is cut into stages that each build what they run and finish in 9 minutes
# on an H200 from a clean tree, so a lease with a per-command limit runs it stage by stage:
#   bf16        every .cu file built in bf16, every GPU test
#   fp32        the same in fp32
#   sanitizer   compute-sanitizer memcheck on the bf16 tests, racecheck/synccheck on the backend
#               and on a small tensor-core test_attention case
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
  # seconds each step is expected to take on an H200 with 16 cores from a clean tree (guesses
  # until a first run replaces them: nvcc compiles of the attention tests ~1.5 min, of the
  # trainer binaries ~2.5 min, built in parallel); the timeouts are 2x
  estimates=(machine:5 build-kernels:90 test_mma:5 test_attention:15 attention-harnesses:20
             sanitizer-attention:60 debug-states:45 build-trainers:150 trainer-step-sync-check:30 tests-rest:60)
  total=0
  for e in "${estimates[@]}"; do total=$(( total + ${e#*:} )); done
  echo "gpu_check --quick: $(( ${#estimates[@]} )) steps, estimated $(( total / 60 )) min $(( total % 60 )) s (H200, clean tree)"
  limit() { local e; for e in "${estimates[@]}"; do [ "${e%%:*}" = "$1" ] && echo $(( 2 * ${e#*:} )); done; }
  rest_tests="test_backend test_backend_misuse test_san test_gpt2 test_comm test_data_parallel"
  step machine "$(limit machine)" bash -c 'nvidia-smi; nvcc --version; echo; uname -a; nproc'
  # 1-2: the tensor-core primitives, then the attention kernels built on them
  step build-kernels "$(limit build-kernels)" make --no-print-directory -j"$jobs" PRECISION=BF16 \
    build/gpu-bf16/test_mma build/gpu-bf16/test_attention build/gpu-bf16/attention_forward build/gpu-bf16/attention_backward
  step test_mma "$(limit test_mma)" build/gpu-bf16/test_mma
  step test_attention "$(limit test_attention)" build/gpu-bf16/test_attention
  step attention-harnesses "$(limit attention-harnesses)" bash -c 'build/gpu-bf16/attention_forward && build/gpu-bf16/attention_backward'
  if command -v compute-sanitizer >/dev/null 2>&1; then
    # one small case on the tensor-core kernels (hd 16, T 150: two tiles, a partial one)
    step sanitizer-attention "$(limit sanitizer-attention)" bash -c '
      compute-sanitizer --tool racecheck --error-exitcode 1 build/gpu-bf16/test_attention mha_hd16_T_not_multiple &&
      compute-sanitizer --tool synccheck --error-exitcode 1 build/gpu-bf16/test_attention mha_hd16_T_not_multiple'
  else
    summary+=("$(printf '%-40s %-10s %8s' sanitizer-attention "skipped" "-") (compute-sanitizer not installed)")
  fi
  # 3: one trainer, a few launches of every kernel it uses, each waited for
  step debug-states "$(limit debug-states)" bash -c "$PYTHON dev/test/make_debug_states.py build/debug-states && touch build/debug-states/.complete &&
    $PYTHON dev/test/make_gpt2_debug_states.py build/debug-states-gpt2 && touch build/debug-states-gpt2/.complete"
  step build-trainers "$(limit build-trainers)" make --no-print-directory -j"$jobs" PRECISION=BF16 \
    build/gpu-bf16/train_san $(for t in $rest_tests; do echo build/gpu-bf16/$t; done)
  step trainer-step-sync-check "$(limit trainer-step-sync-check)" bash -c '
    set -e
    mkdir -p build/gpu-check-data
    '"$PYTHON"' - <<PY
import numpy as np
from attnref.shards import write_shard
rng = np.random.default_rng(0)
tokens = rng.integers(3, 16384, size=4 * 2049 * 4)
tokens[::1024] = 2  # a document start every 1024 tokens
write_shard("build/gpu-check-data/san_000000.bin", tokens)
PY
    for kernels in tensor-cores scalar; do
      echo "--- train_san san20, 2 steps, --sync-check 1 --attention-kernels $kernels"
      build/gpu-bf16/train_san --preset san20 --train-data "build/gpu-check-data/san_*.bin" --batch-size 4 \
        --steps 2 --val-every 0 --sample-tokens 0 --log-every 1 --sync-check 1 --attention-kernels $kernels \
        --log "'"$log_dir"'/trainer-step-$kernels.jsonl"
    done'
  step tests-rest "$(limit tests-rest)" bash scripts/run_tests.sh build/gpu-bf16 $rest_tests
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
  # and the tensor-core attention kernels' shared memory and barriers, on small cases
  step sanitizer-racecheck-attention 120 compute-sanitizer --tool racecheck --error-exitcode 1 \
    build/gpu-bf16/test_attention mha_hd16_T_not_multiple
  step sanitizer-synccheck-attention 120 compute-sanitizer --tool synccheck --error-exitcode 1 \
    build/gpu-bf16/test_attention mha_hd16_T_not_multiple
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
