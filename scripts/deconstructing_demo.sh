#!/usr/bin/env bash
# A first look at "Deconstructing Attention" on a CPU (doc/deconstructing.md "Demo"): trains the
# small Qwen2.5-shaped preset (qwen-cpu: 4 layers, d 128, MHA, SwiGLU, RMSNorm) on the offline
# English corpus (King James Bible chapters) with standard attention, then each built variant
# uniform (every layer) and hybrid (variant in layers 1 and 3, standard in 2 and 4), evaluates
# each hybrid again without its variant sub-layers and without its variant blocks (the paper's
# "skip"), and prints a table of validation losses and, per kind, the attention-pattern indicators
# of standard, uniform and hybrid (a table per layer and radar plots, study/attention_patterns.py).
# Same data, seed and steps for every arm.
#
#   bash scripts/deconstructing_demo.sh            (13 runs of 100 steps of 4 rows and 12 evaluations:
#                                                   about 35 minutes on 2 cores; 9 runs took 24 minutes,
#                                                   measured with other jobs on the cores, doc/deconstructing.md)
#   KINDS=approximate STEPS=20 bash scripts/deconstructing_demo.sh   (3 runs, 2 evaluations: under a minute)
#   STEPS=400 BATCH=8 bash scripts/deconstructing_demo.sh   (8x the tokens: a less early look)
# Environment: DATA_DIR (data/offline), DEMO_DIR (logs/deconstructing), TRAIN_SAN (./train_san),
# STEPS (100), BATCH (rows of 128 tokens per step, 4), KINDS ("mlp approximate nonapprox rndembqk fixedseqqk staticembqk");
# extra arguments go to every training run.
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # this checkout's attnref and study, installed or not
python=.venv/bin/python
data_dir=${DATA_DIR:-data/offline}
demo_dir=${DEMO_DIR:-logs/deconstructing}
train_san=${TRAIN_SAN:-./train_san}
steps=${STEPS:-100}
batch=${BATCH:-4}
kinds=${KINDS:-"mlp approximate nonapprox rndembqk fixedseqqk staticembqk"}

if [ ! -x "$train_san" ]; then
  echo "deconstructing_demo: $train_san not found: run make first (or set TRAIN_SAN=path)" >&2
  exit 1
fi
if ! $python dev/data/build_offline.py --out "$data_dir" --is-current; then
  echo "deconstructing_demo: building the offline dataset in $data_dir"
  $python dev/data/build_offline.py --out "$data_dir"
fi
mkdir -p "$demo_dir"

data=(--train-data "$data_dir/kjv/kjv_train_*.bin" --val-data "$data_dir/kjv/kjv_val_*.bin"
      --tokenizer "$data_dir/tokenizer.bin")
common=(--preset qwen-cpu "${data[@]}" --optimizer adamw --lr 2e-3 --schedule cosine --steps "$steps"
        --batch-size "$batch" --val-every "$steps" --val-batches 16 --log-every 50 --sample-tokens 0 --seed 1)

# the last "step N: val loss X" of a run's output
val_loss() { awk '/^step [0-9]+: val loss/ {v = $5} END {print v}' "$1"; }

# train one arm: train NAME FLAGS...  (output in $demo_dir/NAME/, its val loss in $demo_dir/NAME/val)
train() {
  local name=$1; shift
  mkdir -p "$demo_dir/$name"
  echo "deconstructing_demo: training $name $*"
  "$train_san" "${common[@]}" --checkpoint-dir "$demo_dir/$name" --log "$demo_dir/$name/log.jsonl" "$@" \
    "${EXTRA[@]}" > "$demo_dir/$name/out.txt"
  val_loss "$demo_dir/$name/out.txt" > "$demo_dir/$name/val"
}
# evaluate a trained hybrid with --skip-nonstandard MODE
skip() {
  local name=$1 mode=$2
  "$train_san" --steps 0 --init-from "$demo_dir/$name/final.bin" "${data[@]}" --val-batches 16 --batch-size "$batch" \
    --sample-tokens 0 --skip-nonstandard "$mode" --log "$demo_dir/$name/skip-$mode.jsonl" > "$demo_dir/$name/skip-$mode.txt"
  val_loss "$demo_dir/$name/skip-$mode.txt"
}

EXTRA=("$@")
start=$(date +%s)
train standard
for kind in $kinds; do
  train "$kind-uniform" --attention "$kind"
  train "$kind-hybrid" --attention "$kind" --layout hybrid
done

{
  echo "validation loss (nats/token) after $steps steps of $batch x 128 tokens, qwen-cpu, kjv"
  printf '%-12s %9s %9s %13s %11s\n' kind uniform hybrid "skip-attn" "skip-block"
  printf '%-12s %9s %9s %13s %11s\n' standard "$(cat "$demo_dir/standard/val")" - - -
  for kind in $kinds; do
    printf '%-12s %9s %9s %13s %11s\n' "$kind" "$(cat "$demo_dir/$kind-uniform/val")" \
      "$(cat "$demo_dir/$kind-hybrid/val")" "$(skip "$kind-hybrid" attention)" "$(skip "$kind-hybrid" block)"
  done
  echo "($(( $(date +%s) - start )) s)"
  # (doc/deconstructing.md "Demo": after 100 steps of 4 rows every arm sat within 0.06 nats of the
  # others, what another seed moves them; fewer rows of training separate them less)
  if [ $(( steps * batch )) -le 400 ]; then
    echo "note: $steps steps of $batch rows cannot separate the arms: at 100 steps of 4 rows every arm sat within"
    echo "0.06 nats of the others, what another seed moves them (doc/deconstructing.md \"Demo\"), and the"
    echo "indicators below are as early; STEPS=400 BATCH=8 is a less early look"
  fi
} | tee "$demo_dir/table.txt"

# the attention-pattern indicators of the last validation (doc/deconstructing.md "Attention-pattern
# indicators"): per kind, standard vs the kind uniform vs hybrid, a table per layer and the radar
# and logit-distribution plots in $demo_dir/patterns-KIND/
for kind in $kinds; do
  echo
  echo "attention patterns: standard, $kind-uniform, $kind-hybrid (head means; '—': no attention matrix)"
  $python -m study patterns --out "$demo_dir/patterns-$kind" "standard=$demo_dir/standard/log.jsonl" \
    "$kind-uniform=$demo_dir/$kind-uniform/log.jsonl" "$kind-hybrid=$demo_dir/$kind-hybrid/log.jsonl"
done | tee "$demo_dir/patterns.txt"
