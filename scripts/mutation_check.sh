#!/usr/bin/env bash
# Builds the host-backend tests against deliberately broken backends and requires that
# they FAIL, and fail in the test cases that check the broken feature. A test suite that
# passes against a broken backend would prove nothing. And it builds code with a host/device
# mix-up put in (the dies list) and requires that the backend's pointer checks stop it.
# Usage: scripts/mutation_check.sh "COMPILER FLAGS..." OUT_DIR
# Environment: MPI_LINK (the MPI link flags, for the multi-rank mutants), BLAS_LINK (the host
# GEMM's library, when the flags select OpenBLAS: -DHOSTCUDA_OPENBLAS), JOBS (compiles at
# once, default: the cores).
set -uo pipefail
compiler=$1
out=$2
mkdir -p "$out"
status=0
jobs_max=${JOBS:-$(nproc 2>/dev/null || echo 2)}

# mutation:test:cases -> the test cases (name prefix) of dev/test/TEST.cu that must fail.
# Backend mutants (llmc/hostcuda, -DHOSTCUDA_MUTATION_X):
backend=(SYNCTHREADS_NOOP:test_backend:syncthreads_ SHFL_WRONG_LANE:test_backend:shuffle_
         ATOMICS_NONATOMIC:test_backend:atomics_ MMA_A_LAYOUT:test_mma:mma_ LDMATRIX_TRANS:test_mma:ldmatrix_)
# Multi-rank mutants (llmc/parallel/comm.h, llmc/parallel/data_parallel.h, -DX), run as 2 ranks: a mean that
# forgets to divide by the rank count, a rank that skips its share of the Muon matrices, and
# ZeRO-1's per-owner reduction sent to the wrong rank. They need an MPI build (-DUSE_MPI in
# the flags) and mpirun.
multi_rank=(COMM_MUTATION_NO_AVERAGE:test_comm:avg_ DATA_PARALLEL_MUTATION_SKIP_MUON:test_data_parallel:muon_
            DATA_PARALLEL_MUTATION_REDUCE_ROOT:test_data_parallel:muon_zero1)
# Host/device mix-ups in the code the backend runs (-DX): the program must die with the
# backend's message (llmc/hostcuda/device_memory.h) instead of passing. mutation:source:message
dies=("KERNEL_MUTATION_HOST_BUFFER:dev/cuda/embedding.cu:kernel 'embedding_backward_kernel': pointer argument 2")
with_mpi=0
if [[ " $compiler " == *" -DUSE_MPI "* ]] && command -v mpirun >/dev/null 2>&1; then with_mpi=1; fi

# The compiles are most of the cost (~8 single-threaded compiles): all of them first, JOBS at once.
compile() {  # DEFINE TEST BINARY [LINK...]
  local define=$1 test=$2 bin=$3 source
  shift 3
  source=dev/test/$test.cu
  [[ $test == */* ]] && source=$test  # a path: the dies list
  while [ "$(jobs -rp | wc -l)" -ge "$jobs_max" ]; do wait -n; done
  rm -f "$bin"
  # (compiled, then linked: a compiler cache in $compiler serves only compiles)
  # shellcheck disable=SC2086  # BLAS_LINK is a list of flags
  { $compiler "-D$define" -x c++ -c "$source" -o "$bin.o" &&
    $compiler "$bin.o" -o "$bin" -pthread "$@" ${BLAS_LINK:-} && rm -f "$bin.o"; } &
}
for pair in "${backend[@]}"; do
  IFS=: read -r mutation test _ <<<"$pair"
  compile "HOSTCUDA_MUTATION_$mutation" "$test" "$out/${test}_$mutation"
done
for entry in "${dies[@]}"; do
  IFS=: read -r mutation source _ <<<"$entry"
  compile "$mutation" "$source" "$out/$(basename "$source" .cu)_$mutation"
done
if [ $with_mpi = 1 ]; then
  for pair in "${multi_rank[@]}"; do
    IFS=: read -r mutation test _ <<<"$pair"
    # shellcheck disable=SC2086  # MPI_LINK is a list of flags
    compile "$mutation" "$test" "$out/${test}_$mutation" ${MPI_LINK:-}
  done
fi
wait

check() {  # MUTATION TEST CASES WHERE COMMAND...: the command must fail in test cases CASES*
  local mutation=$1 test=$2 cases=$3 where=$4
  shift 4
  if [ ! -x "$out/${test}_$mutation" ]; then
    echo "mutation $mutation: $test did not compile with it"
    status=1
    return
  fi
  local log rc failed
  log=$(timeout 300 "$@" "$cases" 2>&1)
  rc=$?
  failed=$(grep -c '^  FAIL [a-z]' <<<"$log")
  if [ $rc -ne 0 ] && [ "$failed" -gt 0 ]; then
    echo "mutation $mutation: caught ($failed '$cases*' test cases of $test failed$where)"
  else
    echo "mutation $mutation: NOT CAUGHT: the '$cases*' tests of $test pass$where against it"
    echo "$log"
    status=1
  fi
}
for pair in "${backend[@]}"; do
  IFS=: read -r mutation test cases <<<"$pair"
  # (4 workers: blocks also run in parallel; the atomics mutation loses updates within a block anyway)
  check "$mutation" "$test" "$cases" "" env HOSTCUDA_THREADS=4 "$out/${test}_$mutation"
done
for entry in "${dies[@]}"; do
  IFS=: read -r mutation source message <<<"$entry"
  bin=$out/$(basename "$source" .cu)_$mutation
  if [ ! -x "$bin" ]; then
    echo "mutation $mutation: $source did not compile with it"
    status=1
    continue
  fi
  log=$(timeout 300 "$bin" 2>&1)
  rc=$?
  if [ $rc -ne 0 ] && grep -qF "$message" <<<"$log"; then
    echo "mutation $mutation: caught ($source died: $message)"
  else
    echo "mutation $mutation: NOT CAUGHT: $source exited $rc without saying: $message"
    echo "$log" | tail -20
    status=1
  fi
done
if [ $with_mpi = 1 ]; then
  for pair in "${multi_rank[@]}"; do
    IFS=: read -r mutation test cases <<<"$pair"
    check "$mutation" "$test" "$cases" " on 2 ranks" scripts/mpirun.sh -np 2 "$out/${test}_$mutation"
  done
else
  echo "mutation check: skipped the multi-rank mutations (needs an MPI build and mpirun)"
fi
exit $status
