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
# mutation:test -> the test cases (name prefix) of dev/test/TEST.cu that must fail
for pair in SYNCTHREADS_NOOP:test_backend:syncthreads_ SHFL_WRONG_LANE:test_backend:shuffle_ \
            ATOMICS_NONATOMIC:test_backend:atomics_ MMA_A_LAYOUT:test_mma:mma_ LDMATRIX_TRANS:test_mma:ldmatrix_; do
  IFS=: read -r mutation test cases <<<"$pair"
  bin="$out/${test}_$mutation"
  $compiler -DHOSTCUDA_MUTATION_$mutation -x c++ "dev/test/$test.cu" -o "$bin" -pthread || { status=1; continue; }
  # (4 workers: blocks also run in parallel; the atomics mutation loses updates within a block anyway)
  log=$(HOSTCUDA_THREADS=4 timeout 300 "$bin" "$cases" 2>&1)
  rc=$?
  failed=$(grep -c '^  FAIL [a-z]' <<<"$log")
  if [ $rc -ne 0 ] && [ "$failed" -gt 0 ]; then
    echo "mutation $mutation: caught ($failed '$cases*' test cases of $test failed)"
  else
    echo "mutation $mutation: NOT CAUGHT: the '$cases*' tests of $test pass against a broken backend"
    echo "$log"
    status=1
  fi
done
# Multi-rank mutations (llmc/comm.h, llmc/data_parallel.h), run as 2 ranks: a mean that
# forgets to divide by the rank count, a rank that skips its share of the Muon matrices, and
# ZeRO-1's per-owner reduction sent to the wrong rank.
# Needs an MPI build (-DUSE_MPI in the flags) and mpirun; ~35 s of compiling on 2 cores.
if [[ " $compiler " == *" -DUSE_MPI "* ]] && command -v mpirun >/dev/null 2>&1; then
  for pair in COMM_MUTATION_NO_AVERAGE:test_comm:avg_ DATA_PARALLEL_MUTATION_SKIP_MUON:test_data_parallel:muon_ \
              DATA_PARALLEL_MUTATION_REDUCE_ROOT:test_data_parallel:muon_zero1; do
    IFS=: read -r mutation test cases <<<"$pair"
    bin="$out/${test}_$mutation"
    $compiler -D$mutation -x c++ "dev/test/$test.cu" -o "$bin" -pthread ${MPI_LINK:-} || { status=1; continue; }
    log=$(timeout 300 scripts/mpirun.sh -np 2 "$bin" "$cases" 2>&1)
    rc=$?
    failed=$(grep -c '^  FAIL [a-z]' <<<"$log")
    if [ $rc -ne 0 ] && [ "$failed" -gt 0 ]; then
      echo "mutation $mutation: caught ($failed '$cases*' test cases of $test failed on 2 ranks)"
    else
      echo "mutation $mutation: NOT CAUGHT: the '$cases*' tests of $test pass on 2 ranks against it"
      echo "$log"
      status=1
    fi
  done
else
  echo "mutation check: skipped the multi-rank mutations (needs an MPI build and mpirun)"
fi
exit $status
