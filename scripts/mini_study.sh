#!/usr/bin/env bash
# The mini-study: both papers' main comparisons at toy scale, run end to end, then a report
# that says finding by finding whether the papers' qualitative results show at this scale.
#
#   scripts/mini_study.sh --cpu    studies/mini_cpu.toml on the host backend's fp32 build
#                                  (built here if missing; 13 minutes on 2 cores, measured,
#                                  doc/study.md)
#   scripts/mini_study.sh --gpu    studies/mini_gpu.toml on a GPU build, every arm at the file's
#                                  lr_other (the CPU optimum); a lease runs it with its sweep
#                                  through scripts/gpu_study.sh instead (doc/gpu-runs/README.md)
#   extra arguments go to `python -m study run` (e.g. --binary PATH, --only 0,1)
#
# Builds its data once (--cpu: the offline SYNTH-format corpus with a 2,048-piece tokenizer; --gpu:
# the knowledge corpus at V 2,048, doc/data.md), runs every unfinished run (an interrupted mini-study
# resumes), and writes logs/studies/mini-{cpu,gpu}/report/report.md.
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # this checkout's attnref and study, installed or not
python=.venv/bin/python
[ -x "$python" ] || { echo "mini_study: no .venv; run bash scripts/setup.sh first" >&2; exit 1; }

case "${1:-}" in
  # (--cpu trains with the fp32 host build: fp32 is a CPU's precision, and the host's fastest
  # build (scripts/bench_cpu.sh; bf16 pays conversions, and before 2026-12-02 also emulated
  # the tensor-core attention lane by lane, 2.8x slower then))
  --cpu) study=studies/mini_cpu.toml out=logs/studies/mini-cpu data=data/offline-v2048 build_args=(--vocab-size 2048)
         trainer=build/host-fp32/train_san make_trainer=(make --no-print-directory build/host-fp32/train_san PRECISION=FP32) ;;
  --gpu) study=studies/mini_gpu.toml out=logs/studies/mini-gpu data=data/offline-knowledge-v2048
         build_args=(--vocab-size 2048 --knowledge) trainer=./train_san make_trainer=() ;;
  *) echo "usage: scripts/mini_study.sh --cpu|--gpu [python -m study run options]" >&2; exit 2 ;;
esac
shift

# build_offline writes .complete last; the marker does not record the sizes, so these data
# directories belong to the mini-study alone
if ! $python dev/data/build_offline.py --out "$data" --is-current; then
  echo "mini_study: building $data"
  $python dev/data/build_offline.py --out "$data" "${build_args[@]}"
fi
if [[ " $* " != *" --binary "* ]]; then  # (the study file names the same trainer)
  if [ ${#make_trainer[@]} -gt 0 ]; then "${make_trainer[@]}"; fi
  if [ ! -x "$trainer" ]; then
    echo "mini_study: $trainer is missing: build it with make (or pass --binary PATH)" >&2
    exit 1
  fi
fi

report_args=()  # the report takes --binary (to tell which optional arms this trainer lacks)
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
  [ "${args[i]}" = --binary ] && report_args=(--binary "${args[i + 1]}")
done

start=$(date +%s)
status=0
$python -m study run "$study" "$@" || status=$?
$python -m study report "$study" "${report_args[@]}"
echo "mini_study: $(( ($(date +%s) - start) / 60 )) minutes"
report=$out/report/report.md
echo
sed -n '/^## Findings/,$p' "$report"
echo
echo "mini_study: the report is $report"
exit $status
