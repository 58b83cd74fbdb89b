#!/usr/bin/env bash
# The main job, run by `make demo` after set-up and build: builds the default offline
# dataset (once) and trains a small SAN on its SYNTH-format part (on the GPU when there is
# one, else on the CPU through the host backend), printing falling train and validation
# losses (per token region: query / trace / answer) and a sample. Extra arguments go to
# train_san (e.g. `make demo ARGS="--ffn swiglu"` trains the FFN control arm). Each arm
# writes its own run directory, named from its arguments: logs/demo/san without any,
# logs/demo/ffn-swiglu for `--ffn swiglu` (log.jsonl, final.bin); flags that only say what is
# kept (--overwrite, --save-every, --save-minutes, --keep-last) are not part of the name.
# A rerun continues the arm's interrupted run (Ctrl-C saves a checkpoint) from its newest
# checkpoint, or, when the directory holds a finished run, trains in the next numbered one
# (logs/demo/san-2, -3, ...); with --overwrite 1 it trains anew in logs/demo/san.
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # this checkout's attnref and study, installed or not
python=.venv/bin/python
data_dir=${DATA_DIR:-data/offline}
demo_dir=${DEMO_DIR:-logs/demo}     # where the arms' run directories go
train_san=${TRAIN_SAN:-./train_san}  # the trainer (make copies the best build there)

if [ -f dev/data/build_offline.py ]; then
  # the builder writes $data_dir/.complete last, with its format version: older builds are rebuilt
  if ! $python dev/data/build_offline.py --out "$data_dir" --is-current; then
    echo "demo: building the offline dataset in $data_dir"
    $python dev/data/build_offline.py --out "$data_dir"
  else
    echo "demo: offline dataset already in $data_dir"
  fi
fi

# the arm's name: "san", or the arguments ("--ffn swiglu --n-layer 2" -> ffn-swiglu_n-layer-2) without
# those that change what is kept rather than what is trained (a rerun with --overwrite 1 is the same arm)
named=() overwrite=0 skip=
for a in "$@"; do
  if [ -n "$skip" ]; then   # the value of one of those flags
    [ "$skip" = --overwrite ] && overwrite=$a
    skip=; continue
  fi
  case "$a" in
    --overwrite|--save-every|--save-minutes|--keep-last) skip=$a ;;
    --overwrite=*) overwrite=${a#*=} ;;
    --save-every=*|--save-minutes=*|--keep-last=*) ;;
    *) named+=("$a") ;;
  esac
done
arm=san
if [ ${#named[@]} -gt 0 ]; then
  arm=$(printf '%s ' "${named[@]}" | sed -e 's/ *$//' -e 's/^--//' -e 's/ --/_/g' -e 's/=/-/g' -e 's/ /-/g' -e 's/[^A-Za-z0-9._-]/_/g')
fi

# Which run directory, and whether to continue the run in it: the first of $arm, $arm-2, $arm-3, ...
# that holds no run, or a run stopped with a checkpoint (continued from its newest one). A finished
# run (final.bin) is kept, and so is one stopped before its first checkpoint (its log is one run's)
# and one still running (it holds the directory's lock).
newest_step() {  # the largest N of DIR/step_N.bin, or nothing
  local f n best=
  for f in "$1"/step_*.bin; do
    n=${f##*/step_}; n=${n%.bin}
    case "$n" in ''|*[!0-9]*) continue ;; esac
    if [ -z "$best" ] || [ "$n" -gt "$best" ]; then best=$n; fi
  done
  printf '%s' "$best"
}
run_dir=$demo_dir/$arm resume=() kept=()
if [ "$overwrite" = 1 ]; then
  if [ -e "$run_dir/final.bin" ] || [ -s "$run_dir/log.jsonl" ]; then
    echo "demo: --overwrite 1: this run replaces the one in $run_dir"
  fi
else
  n=1
  while :; do
    if [ -e "$run_dir/.lock" ] && ! flock -n "$run_dir/.lock" true; then
      kept+=("$run_dir is in use by a run still training")
    elif [ -e "$run_dir/final.bin" ]; then
      kept+=("$run_dir holds a finished run")
    else
      step=$(newest_step "$run_dir")
      if [ -n "$step" ]; then
        resume=(--resume "$run_dir/step_$step.bin")
        break
      elif [ ! -s "$run_dir/log.jsonl" ]; then
        break
      fi
      kept+=("$run_dir holds a run stopped before its first checkpoint (nothing to continue)")
    fi
    n=$((n + 1)); run_dir=$demo_dir/$arm-$n
  done
  kept_line=$(printf '%s; ' "${kept[@]}")
  if [ ${#resume[@]} -gt 0 ]; then
    [ ${#kept[@]} -eq 0 ] || echo "demo: ${kept_line%; }"
    echo "demo: continuing the interrupted run in $run_dir from step $step"
  elif [ ${#kept[@]} -gt 0 ]; then
    echo "demo: ${kept_line}this one trains in $run_dir"
  fi
fi
mkdir -p "$run_dir"
echo "demo: run directory $run_dir"
"$train_san" --preset demo \
  --train-data "$data_dir/synth/synth_train_*.bin" --val-data "$data_dir/synth/synth_val_*.bin" \
  --tokenizer "$data_dir/tokenizer.bin" \
  --optimizer adamw --steps 300 --lr 2e-3 --batch-size 8 --val-every 100 --val-batches 8 --log-every 10 \
  --sample-tokens 64 --temperature 0.8 \
  --log "$run_dir/log.jsonl" --checkpoint-dir "$run_dir" "$@" "${resume[@]}"
