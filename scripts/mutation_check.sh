#!/usr/bin/env bash
# Builds the host-backend tests against deliberately broken backends and requires that
# they FAIL, and fail in the test cases that check the broken feature. A test suite that
# passes against a broken backend would prove nothing.
# Usage: scripts/mutation_check.sh "COMPILER FLAGS..." OUT_DIR
set -uo pipefail
compiler=$1
out=$2
mkdir -p "$out"
status=0
# mutation -> the test cases (name prefix) that must fail
for pair in SYNCTHREADS_NOOP:syncthreads_ SHFL_WRONG_LANE:shuffle_ ATOMICS_NONATOMIC:atomics_; do
  mutation=${pair%%:*}
  cases=${pair#*:}
  bin="$out/test_backend_$mutation"
  $compiler -DHOSTCUDA_MUTATION_$mutation -x c++ dev/test/test_backend.cu -o "$bin" -pthread || { status=1; continue; }
  # at least 2 workers, so that blocks really run in parallel for the atomics check
  log=$(HOSTCUDA_THREADS=4 timeout 300 "$bin" "$cases" 2>&1)
  rc=$?
  failed=$(grep -c '^  FAIL [a-z]' <<<"$log")
  if [ $rc -ne 0 ] && [ "$failed" -gt 0 ]; then
    echo "mutation $mutation: caught ($failed '$cases*' test cases failed)"
  else
    echo "mutation $mutation: NOT CAUGHT: the '$cases*' tests pass against a broken backend"
    echo "$log"
    status=1
  fi
done
exit $status
