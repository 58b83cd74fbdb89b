#!/usr/bin/env bash
# The one command to run on a machine with an NVIDIA GPU. Builds for the card it finds (the
# Makefile's GPU_ARCHS), runs the GPU tests, compute-sanitizer and the benchmarks, writes every
# log into LOG_DIR and prints a summary table last. Exits 1 if any stage failed.
#
#   scripts/gpu_check.sh --quick [LOG_DIR]          default LOG_DIR: doc/gpu-runs/<date>-quick
#   scripts/gpu_check.sh --stage NAME [LOG_DIR]     default LOG_DIR: logs/gpu-check-<date-time>-NAME
#   scripts/gpu_check.sh [LOG_DIR]                  every stage in turn (the full check)
#
# --quick is one command for one lease: a total budget of GPU_CHECK_BUDGET seconds (default 540,
# under the 10 minutes one device command may run), stages in this order, each one's timeout
# the smaller of its own cap and what is left of the budget (less GPU_CHECK_RESERVE, default 20 s,
# kept for packing), a stage with under 10 s left skipped; so a run cut short still says what
# works and still returns its logs:
#   machine      nvidia-smi, nvcc --version, the CUDA tools found (cap 20 s)
#   build        ONE make -j of every binary the later stages run (the cuDNN attention playgrounds
#                too where the cudnn-frontend headers are at hand), with the PyTorch debug states and
#                the training shard (dev/gpu_check_data.py) written beside it (cap 300 s)
#   kernel-tests test_mma, test_attention, test_backend (cap 120 s)
#   sanitizer    compute-sanitizer racecheck and initcheck on test_attention's hd 64 cases
#                (tensor-core kernels) (cap 90 s)
#   debug-states test_san and test_gpt2 against the PyTorch debug states (cap 90 s)
#   train        20 steps of train_san san20 (B 4 x T 2048, document mask) with --sync-check 1 (cap 90 s)
#   profile      ncu, one metric (gpu__time_duration.sum), every kernel of 2 steps of san20 (B 4 x
#                T 2048), then the time per kernel: profile.csv, profile.txt (dev/gpu_profile.py) (cap 150 s)
#   bench        scripts/bench_gpu.sh 10 (cap: what is left)
# A stage whose tool is missing (compute-sanitizer, ncu: looked for on PATH, beside nvcc and in
# /opt/nvidia) or whose budget is spent shows "skipped" in the summary, and the check then exits 1:
# it never passes by skipping. With OUT set (the device tool's folder of returned files), LOG_DIR
# is also packed into at most three files there: $OUT/summary.txt, $OUT/profile.txt and
# $OUT/gpu-check-logs.tar.gz (every stage's log, the per-test logs, the training log, the profile),
# since at most 8 files come back from a lease.
# The full check is cut into stages that each build what they run, for leases with a
# per-command limit:
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
# nvcc ($NVCC, on PATH or /usr/local/cuda/bin), and CUDA's tools beside it when PATH lacks them
nvcc=${NVCC:-$(command -v nvcc 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null)}
[ -n "$nvcc" ] && [ -x "$nvcc" ] || { echo "gpu_check: nvcc not found (PATH, /usr/local/cuda/bin or \$NVCC)" >&2; exit 1; }
export NVCC=$nvcc
cuda_bin=$(dirname "$(readlink -f "$nvcc")")
find_tool() {  # find_tool NAME: its path, or nothing
  command -v "$1" 2>/dev/null && return
  local candidate
  for candidate in "$cuda_bin/$1" "$(dirname "$cuda_bin")/$1/$1" "$(dirname "$cuda_bin")"/nsight-compute*/"$1" \
                   /opt/nvidia/nsight-compute/*/"$1"; do
    [ -x "$candidate" ] && { echo "$candidate"; return; }
  done
}
sanitizer=$(find_tool compute-sanitizer)
ncu=$(find_tool ncu)
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
skipped=0
check_start=$(date +%s)

# step NAME TIMEOUT_SECONDS COMMAND...: runs COMMAND with output in LOG_DIR/NAME.log
step() {
  local name=$1 limit=$2
  shift 2
  local start=$(date +%s.%N)
  echo "=== $name (timeout ${limit}s): $*"
  timeout --kill-after=5 "$limit" "$@" >"$log_dir/$name.log" 2>&1
  local rc=$?
  local secs=$(echo "$(date +%s.%N) - $start" | bc)
  local status=ok
  if [ $rc -ne 0 ]; then
    status="FAIL($rc)"
    [ $rc -eq 124 ] || [ $rc -eq 137 ] && status="TIMEOUT"
    failed=1
    tail -n 30 "$log_dir/$name.log"
  fi
  summary+=("$(printf '%-40s %-10s %8.1f' "$name" "$status" "$secs")")
}

# skip NAME WHY: a stage that did not run: "skipped" in the summary, and the check does not pass
skip() {
  summary+=("$(printf '%-40s %-10s %8s' "$1" "skipped" "-") ($2)")
  skipped=$(( skipped + 1 ))
}

print_summary() {
  local total=$(( $(date +%s) - check_start ))
  echo
  echo "gpu_check summary (logs in $log_dir)"
  printf '%-40s %-10s %8s\n' step status seconds
  for row in "${summary[@]}"; do echo "$row"; done
  local verdict="all steps passed"
  [ $skipped = 0 ] || verdict="$skipped STEPS SKIPPED (not checked)"
  [ $failed = 0 ] || verdict="SOME STEPS FAILED$([ $skipped = 0 ] || echo ", $skipped skipped")"
  echo "total ${total}s; $verdict"
}

if [ $quick = 1 ]; then
  budget=${GPU_CHECK_BUDGET:-540}
  reserve=${GPU_CHECK_RESERVE:-20}
  deadline=$(( check_start + budget ))
  # staged NAME CAP COMMAND...: step with the timeout drawn from what is left of the budget
  staged() {
    local name=$1 cap=$2 left
    shift 2
    left=$(( deadline - reserve - $(date +%s) ))
    if [ "$left" -lt 10 ]; then
      skip "$name" "budget spent"
      return
    fi
    step "$name" "$(( cap < left ? cap : left ))" "$@"
  }
  # everything the stages run, in one make -j; the cuDNN attention playgrounds where the
  # cudnn-frontend headers are at hand (bench_gpu.sh then finds them built)
  targets="test_mma test_attention test_backend test_san test_gpt2 train_san train_gpt2 attention_forward attention_backward"
  build_list=$(for t in $targets; do echo build/gpu-bf16/$t; done)
  if [ -n "$(make -s print-CUDNN_FRONTEND USE_CUDNN=1 2>/dev/null)" ]; then
    build_list="$build_list build/gpu-bf16-cudnn/attention_forward build/gpu-bf16-cudnn/attention_backward"
  fi
  echo "gpu_check --quick: budget ${budget}s (stages machine, build, kernel-tests, sanitizer, debug-states, train, profile, bench)"
  staged machine 20 bash -c 'set -e; nvidia-smi; nvidia-smi --query-gpu=name,compute_cap,memory.total --format=csv
    "$NVCC" --version; echo; uname -a; nproc
    echo "compute-sanitizer: '"${sanitizer:-not found}"'"; echo "ncu: '"${ncu:-not found}"'"'
  staged build 300 bash -c '
    mkdir -p build/debug-states build/debug-states-gpt2
    ('"$PYTHON"' dev/test/make_debug_states.py build/debug-states && touch build/debug-states/.complete &&
     '"$PYTHON"' dev/test/make_gpt2_debug_states.py build/debug-states-gpt2 && touch build/debug-states-gpt2/.complete &&
     '"$PYTHON"' dev/gpu_check_data.py build/gpu-check-data
    ) > '"$log_dir"'/debug-states-written.log 2>&1 &
    writer=$!
    make --no-print-directory -j'"$jobs"' PRECISION=BF16 '"$(echo $build_list)"'
    built=$?
    wait $writer || { echo "gpu_check: writing the debug states or the training shard failed (debug-states-written.log)"; exit 1; }
    exit $built'
  staged kernel-tests 120 bash scripts/run_tests.sh build/gpu-bf16 test_mma test_attention test_backend
  if [ -z "$sanitizer" ]; then
    skip sanitizer "compute-sanitizer not found on PATH, beside $NVCC or in /opt/nvidia"
  else
    staged sanitizer 90 bash -c '
      for tool in racecheck initcheck; do
        echo "--- compute-sanitizer --tool $tool test_attention hd64"
        "'"$sanitizer"'" --tool $tool --error-exitcode 1 build/gpu-bf16/test_attention hd64 || exit 1
      done'
  fi
  staged debug-states 90 bash scripts/run_tests.sh build/gpu-bf16 test_san test_gpt2
  staged train 90 build/gpu-bf16/train_san --preset san20 --train-data "build/gpu-check-data/san_*.bin" \
    --batch-size 4 --steps 20 --val-every 0 --sample-tokens 0 --log-every 1 --sync-check 1 --run-dir "" \
    --log "$log_dir/train.jsonl"
  if [ -z "$ncu" ]; then
    skip profile "ncu not found on PATH, beside $NVCC or in /opt/nvidia"
  else
    # one metric, every kernel of 2 steps (--launch-count bounds a run that launches more), the
    # card's own clocks (--clock-control none: ncu leaves them alone); then the time per kernel
    staged profile 150 bash -c '
      set -e
      "'"$ncu"'" --metrics gpu__time_duration.sum --clock-control none --print-units base --csv \
        --launch-count 6000 --log-file "'"$log_dir"'/profile.csv" \
        build/gpu-bf16/train_san --preset san20 --train-data "build/gpu-check-data/san_*.bin" --batch-size 4 \
        --steps 2 --val-every 0 --sample-tokens 0 --log-every 1 --run-dir ""
      '"$PYTHON"' dev/gpu_profile.py "'"$log_dir"'/profile.csv" --steps 2 | tee "'"$log_dir"'/profile.txt"'
  fi
  staged bench 600 bash scripts/bench_gpu.sh 10
  [ -d build/gpu-bf16/logs ] && cp -r build/gpu-bf16/logs "$log_dir/test-logs"
  print_summary | tee "$log_dir/summary.txt"
  if [ -n "${OUT:-}" ]; then  # at most 8 files come back from a lease: three
    mkdir -p "$OUT"
    cp "$log_dir/summary.txt" "$OUT/summary.txt"
    [ -f "$log_dir/profile.txt" ] && cp "$log_dir/profile.txt" "$OUT/profile.txt"
    tar -czf "$OUT/gpu-check-logs.tar.gz" -C "$(dirname "$log_dir")" "$(basename "$log_dir")"
    echo "gpu_check: packed into $OUT: $(cd "$OUT" && ls | tr '\n' ' ')"
  fi
  [ $failed = 0 ] && [ $skipped = 0 ]
  exit $?
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
  if [ -z "$sanitizer" ]; then
    skip compute-sanitizer "not found on PATH, beside $NVCC or in /opt/nvidia"
    return
  fi
  debug_states
  local tests
  tests=$(make -s print-GPU_TEST_NAMES PRECISION=BF16 | tr ' ' '\n' | grep -v -E '^test_(san|gpt2)$' | tr '\n' ' ')
  step build-gpu-bf16 360 make --no-print-directory -j"$jobs" PRECISION=BF16 \
    $(for t in $tests test_san; do echo build/gpu-bf16/$t; done)
  # memcheck on every test binary; race and sync checks on the backend tests, which exercise
  # shared memory and barriers; the trainer test runs many steps, so one configuration only
  step sanitizer-memcheck 240 env TEST_WRAPPER="$sanitizer --tool memcheck --error-exitcode 1" \
    bash scripts/run_tests.sh build/gpu-bf16 $tests
  step sanitizer-memcheck-test_san 150 "$sanitizer" --tool memcheck --error-exitcode 1 \
    build/gpu-bf16/test_san build/debug-states san
  step sanitizer-racecheck 60 "$sanitizer" --tool racecheck --error-exitcode 1 build/gpu-bf16/test_backend
  step sanitizer-synccheck 60 "$sanitizer" --tool synccheck --error-exitcode 1 build/gpu-bf16/test_backend
  # and the tensor-core attention kernels' shared memory and barriers, on small cases
  step sanitizer-racecheck-attention 120 "$sanitizer" --tool racecheck --error-exitcode 1 \
    build/gpu-bf16/test_attention mha_hd16_T_not_multiple
  step sanitizer-synccheck-attention 120 "$sanitizer" --tool synccheck --error-exitcode 1 \
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

step machine 60 bash -c 'set -e; nvidia-smi; "$NVCC" --version; echo; uname -a; nproc'
for stage in $stages; do
  case $stage in
    bf16) build_and_test BF16 ;;
    fp32) build_and_test FP32 ;;
    sanitizer) sanitizer_stage ;;
    bench) bench_stage ;;
  esac
done
print_summary | tee "$log_dir/summary.txt"
[ $failed = 0 ] && [ $skipped = 0 ]
exit $?
