#!/usr/bin/env bash
# The knowledge-capacity study of one GPU lease (issue 57 target 6; the plan and its sizes:
# doc/study-runs/2026-12-07-capacity-gpu-plan.md). Run it on the GPU machine once
# scripts/gpu_check.sh --quick has passed on one:
#
#   scripts/capacity_gpu.sh
#
# The trainer (make build/gpu-bf16/train_san, or $BINARY), both worlds at once (dev/data/bios.py:
# the capacity world and its no-fact control), then the runs in an order that a cut leaves paired:
# the SAN / FFN-3 pair seed by seed (42, 43, 44), the pair at half its rates seed by seed, the
# control's pair seed by seed, then the iso-depth FFN-15; then the reports. Budget CAPACITY_GPU_BUDGET seconds from the start (default
# 540: the run tool's 600 less a minute), runs stopped CAPACITY_GPU_RESERVE (default 30) seconds
# before its end. Returned in $OUT (else logs/capacity-gpu-out): stages.txt, capacity.md,
# capacity_half.md, capacity_control.md, logs.tar.gz (each run's log.jsonl and status.json, the runner's output).
set -uo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo" || exit 2
start=$(date +%s)
budget=${CAPACITY_GPU_BUDGET:-540}
reserve=${CAPACITY_GPU_RESERVE:-30}
out=${OUT:-logs/capacity-gpu-out}
mkdir -p "$out" logs
if [ -n "${PYTHON:-}" ]; then python=$PYTHON
elif [ -x .venv/bin/python ]; then python=.venv/bin/python
else python=python3; fi
export PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
stages=$out/stages.txt
: > "$stages"
stage() { echo "[$(( $(date +%s) - start )) s] $*" | tee -a "$stages"; }
left() { echo $(( start + budget - reserve - $(date +%s) )); }

binary=${BINARY:-}
if [ -z "$binary" ]; then
  make --no-print-directory -j"$(nproc)" build/gpu-bf16/train_san PRECISION=BF16 NO_MULTI_GPU=1 \
    > logs/capacity-gpu-build.log 2>&1
  rc=$?
  stage "build: make build/gpu-bf16/train_san: exit $rc"
  [ $rc = 0 ] || { tail -n 30 logs/capacity-gpu-build.log; exit 1; }
  binary=build/gpu-bf16/train_san
fi
stage "trainer: $binary"

# the two worlds (about 45 s of one core each; written by their study files' data_build)
$python dev/data/bios.py --out data/capacity-n18000 --people 18000 --exposures 100 & a=$!
$python dev/data/bios.py --out data/capacity-n18000-control --people 18000 --exposures 100 --fresh-values & b=$!
wait $a; ra=$?; wait $b; rb=$?
stage "worlds: exit $ra (facts), $rb (control)"
[ $ra = 0 ] && [ $rb = 0 ] || exit 1

runs() {  # STUDY ONLY: the listed runs, in that order, within what is left
  local t
  t=$(left)
  if [ "$t" -lt 20 ]; then stage "skipped $1 --only $2: $t s left"; return; fi
  timeout "$t" $python -m study run "$1" --binary "$binary" --only "$2" >> logs/capacity-gpu-runs.log 2>&1
  stage "$1 --only $2: exit $? ($t s were left)"
}
runs studies/capacity_gpu.toml 0,3,1,4,2,5
runs studies/capacity_gpu_half.toml 0,3,1,4,2,5
runs studies/capacity_gpu_control.toml 0,3,1,4,2,5
runs studies/capacity_gpu.toml 6,7,8

$python -m study capacity studies/capacity_gpu.toml --out "$out/capacity.md" > /dev/null
$python -m study capacity studies/capacity_gpu_half.toml --out "$out/capacity_half.md" > /dev/null
$python -m study capacity studies/capacity_gpu_control.toml --out "$out/capacity_control.md" > /dev/null
tar czf "$out/logs.tar.gz" logs/capacity-gpu-runs.log logs/capacity-gpu*/runs/*/log.jsonl \
  logs/capacity-gpu*/runs/*/status.json 2> /dev/null
stage "reports: $(ls "$out" | tr '\n' ' ')"
