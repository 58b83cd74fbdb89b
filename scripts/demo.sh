#!/usr/bin/env bash
# The main job, run by `make demo` after set-up and build: builds the default offline
# dataset (once) and trains a small SAN on its SYNTH-format part (on the GPU when there is
# one, else on the CPU through the host backend), printing falling train and validation
# losses (per token region: query / trace / answer) and a sample. Extra arguments go to
# train_san (e.g. `make demo ARGS="--ffn swiglu"` trains the FFN control arm). Each arm
# writes its own run directory, named from its arguments: logs/demo/san without any,
# logs/demo/ffn-swiglu for `--ffn swiglu` (log.jsonl, final.bin).
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

# the run directory: "san", or the arguments as a name ("--ffn swiglu --n-layer 2" -> ffn-swiglu_n-layer-2)
arm=san
if [ $# -gt 0 ]; then
  arm=$(printf '%s ' "$@" | sed -e 's/ *$//' -e 's/^--//' -e 's/ --/_/g' -e 's/=/-/g' -e 's/ /-/g' -e 's/[^A-Za-z0-9._-]/_/g')
fi
run_dir=$demo_dir/$arm
mkdir -p "$run_dir"
echo "demo: run directory $run_dir"
"$train_san" --preset demo \
  --train-data "$data_dir/synth/synth_train_*.bin" --val-data "$data_dir/synth/synth_val_*.bin" \
  --tokenizer "$data_dir/tokenizer.bin" \
  --optimizer adamw --steps 300 --lr 2e-3 --batch-size 8 --val-every 100 --val-batches 8 --log-every 10 \
  --sample-tokens 64 --temperature 0.8 \
  --log "$run_dir/log.jsonl" --checkpoint-dir "$run_dir" "$@"
