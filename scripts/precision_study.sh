#!/usr/bin/env bash
# What bf16 gradient accumulation and bf16 Newton-Schulz change in a short run, next to the
# seed-to-seed difference (doc/optimizers.md "Precision"). Five runs of the demo SAN on the
# offline SYNTH data (make demo builds it), Muon in the paper's order, 4 micro-batches per
# step so that accumulation matters; then the final validation losses and their differences.
#   scripts/precision_study.sh [STEPS] [OUT_DIR]        (defaults: 150, logs/precision)
# Uses ./train_san (the GPU build on a GPU machine, else the host build: ~2 min a run on 2 cores).
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-150}
out=${2:-logs/precision}
data=data/offline
[ -x ./train_san ] || { echo "precision_study: ./train_san missing: run make" >&2; exit 1; }
[ -f "$data/tokenizer.bin" ] || { echo "precision_study: $data missing: run make demo (or dev/data/build_offline.py)" >&2; exit 1; }
mkdir -p "$out"
run() {  # name, then flags
  local name=$1
  shift
  ./train_san --preset demo --train-data "$data/synth/synth_train_*.bin" --val-data "$data/synth/synth_val_*.bin" \
    --tokenizer "$data/tokenizer.bin" --steps "$steps" --batch-size 4 --grad-accum 4 --muon-order paper \
    --val-every 0 --val-batches 16 --sample-tokens 0 --log-every 50 --log "$out/$name.jsonl" \
    --overwrite 1 "$@" > "$out/$name.out"  # (a rerun replaces its logs)
  printf '%-24s %s\n' "$name" "$(grep -o '"val_loss": [0-9.]*' "$out/$name.jsonl" | tail -1 | cut -d' ' -f2)"
}
echo "final validation loss after $steps steps:"
run seed1_bf16 --seed 1
run seed2_bf16 --seed 2
run seed1_fp32_grads --seed 1 --grad-fp32 1
run seed1_fp32_ns --seed 1 --ns-fp32 1
run seed1_fp32_both --seed 1 --grad-fp32 1 --ns-fp32 1
head -1 "$out/seed1_bf16.out"
python3 - "$out" <<'PY'
import json, sys
out = sys.argv[1]
val = {}
for name in ("seed1_bf16", "seed2_bf16", "seed1_fp32_grads", "seed1_fp32_ns", "seed1_fp32_both"):
    rows = [json.loads(l) for l in open(f"{out}/{name}.jsonl") if "val_loss" in l]
    val[name] = rows[-1]["val_loss"]
base = val["seed1_bf16"]
print(f"seed-to-seed (bf16):          {abs(val['seed2_bf16'] - base):.4f}")
for name in ("seed1_fp32_grads", "seed1_fp32_ns", "seed1_fp32_both"):
    print(f"{name + ' vs bf16:':29s} {val[name] - base:+.4f}")
PY
