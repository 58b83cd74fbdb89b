#!/usr/bin/env bash
# Rehearses the README's two commands on a fresh machine as far as one machine can: a fresh
# clone of this checkout, an empty compiler cache, a venv root of its own (so the venv is built
# from nothing), and, for the first command, a PATH without MPI's compilers and launcher and
# without ccache, as if `make test`'s set-up installed them after `make demo` had built the
# trainer. Prints each command's wall time and the result; the logs stay in the work directory.
# Usage: scripts/rehearse_fresh_machine.sh [--cold-pip] [--interrupt-demo] [--test-only] [--isa avx2] [--keep-venv] [WORK_DIR]
#   --cold-pip        where set-up installs with pip (ATTN_SETUP_PIP=1, or uv cannot be had):
#                     download every package from PyPI again (PIP_NO_CACHE_DIR=1)
#   --interrupt-demo  Ctrl-C (SIGINT) the demo's training after its first progress line, then
#                     `make test`, then `make demo` again (a rerun after an interruption)
#   --test-only       `make test` alone, no demo before it
#   --isa avx2        as an AVX2-only CPU (Zen 3, Haswell): host builds -march=x86-64-v3
#                     (HOST_MARCH) and oneDNN, OpenBLAS and PyTorch capped at AVX2 (the clock
#                     and the caches stay this machine's)
#   --keep-venv       keep the venv (~6.5 GB) and uv's cache at the end; by default they are
#                     removed, the logs, the clone and the compiler cache stay
# What it cannot rehearse: Debian packages already installed stay installed (set-up's apt step
# then only checks them), and pip's cache is warm unless --cold-pip (uv's is empty: a cache of
# the work directory's). doc/testing.md says more.
set -uo pipefail
cd "$(dirname "$0")/.."
cold_pip=0; interrupt=0; test_only=0; work=""; isa=native; keep_venv=0
while [ $# -gt 0 ]; do
  arg=$1; shift
  case "$arg" in
    --isa) isa=${1:-}; shift
      [ "$isa" = avx2 ] || [ "$isa" = native ] || { echo "rehearse: --isa takes avx2 or native, not '$isa'" >&2; exit 2; } ;;
    --cold-pip) cold_pip=1 ;;
    --interrupt-demo) interrupt=1 ;;
    --test-only) test_only=1 ;;
    --keep-venv) keep_venv=1 ;;
    -h|--help) sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "rehearse: unknown option '$arg'" >&2; exit 2 ;;
    *) work=$arg ;;
  esac
done
work=${work:-$(mktemp -d /tmp/attn-fresh.XXXXXX)}
mkdir -p "$work"
echo "rehearse: machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores," \
  "$(grep -o -m1 -w 'avx512f' /proc/cpuinfo || echo 'no AVX-512') (AVX2: $(grep -q -m1 -w avx2 /proc/cpuinfo && echo yes || echo no))"
echo "rehearse: work directory $work (clone, ccache, venv root, logs)"
git clone -q . "$work/attn.c" || exit 1
export CCACHE_DIR=$work/ccache ATTN_VENV_ROOT=$work/venvs UV_CACHE_DIR=$work/uv-cache
[ "$cold_pip" = 1 ] && export PIP_NO_CACHE_DIR=1
if [ "$isa" = avx2 ]; then   # (the same caps as scripts/bench_cpu.sh --isa avx2)
  export HOST_MARCH=x86-64-v3 ONEDNN_MAX_CPU_ISA=AVX2 OPENBLAS_CORETYPE=Haswell MKL_ENABLE_INSTRUCTIONS=AVX2 ATEN_CPU_CAPABILITY=avx2
  echo "rehearse: as an AVX2-only CPU: HOST_MARCH=$HOST_MARCH, ONEDNN_MAX_CPU_ISA=$ONEDNN_MAX_CPU_ISA, ATEN_CPU_CAPABILITY=$ATEN_CPU_CAPABILITY"
fi

# a PATH without mpicxx, mpirun, mpiexec and ccache: every other program of PATH, linked
hidden=$work/path-without-optional-tools
mkdir -p "$hidden"
IFS=: read -r -a dirs <<< "$PATH"
for d in "${dirs[@]}"; do
  for f in "$d"/*; do
    name=$(basename "$f")
    case "$name" in mpicxx|mpic++|mpiCC|mpirun|mpiexec|orterun|ccache) continue ;; esac
    [ -e "$hidden/$name" ] || ln -s "$f" "$hidden/$name" 2>/dev/null
  done
done

timed() {  # NAME COMMAND...: runs it in the clone, logs to WORK/NAME.log, prints its time and status
  local name=$1; shift
  local start=$SECONDS
  (cd "$work/attn.c" && "$@") > "$work/$name.log" 2>&1
  local rc=$?
  printf 'rehearse: %-28s rc %-3s %5d s   (log: %s)\n' "$name" "$rc" $((SECONDS - start)) "$work/$name.log"
  return $rc
}
demo_interrupted() {  # the demo, Ctrl-C'd (its whole process group, as a terminal does) at its
  # first progress line, after the build and the dataset
  PATH=$hidden setsid make demo &
  local pid=$!
  while kill -0 $pid 2>/dev/null && ! grep -q '^step ' "$work/demo-interrupted.log" 2>/dev/null; do sleep 1; done
  kill -INT -- -$pid 2>/dev/null
  wait $pid
  return 0
}

status=0
if [ "$test_only" = 0 ]; then
  if [ "$interrupt" = 1 ]; then
    timed demo-interrupted demo_interrupted
  else
    timed demo env PATH="$hidden" make demo || status=1   # (no MPI, no ccache yet)
  fi
fi
timed test make test || status=1
grep -E "^make test: |FAILED|make: skipped|^SKIPPED" "$work/test.log" | sed 's/^/rehearse:   /'
if [ "$interrupt" = 1 ]; then timed demo-again make demo || status=1; fi
timed test-warm make test || status=1
if [ "$keep_venv" = 0 ]; then
  rm -rf "$ATTN_VENV_ROOT" "$UV_CACHE_DIR" &&
    echo "rehearse: removed the venv root $ATTN_VENV_ROOT and uv's cache (--keep-venv keeps them)"
fi
exit $status
