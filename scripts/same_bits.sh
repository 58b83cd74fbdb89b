#!/usr/bin/env bash
# Whether a change left train_san's numerics bit for bit as they were: a restructure's check.
#
#   scripts/same_bits.sh save DIR     before the change: train and keep the results in DIR
#   scripts/same_bits.sh check DIR    after it: the same runs, compared with DIR
#
# The runs: every attention kind, uniform and hybrid (standard: uniform only), the FFN arm
# (--ffn swiglu, standard and an mlp hybrid) and one sandwich-norm run, each 20 steps of the
# demo preset on the offline demo data (Muon, validation at steps 10 and 20, a 16-token
# sample), in both host precisions. Compared: final.bin (attnref/ckpt_diff.py: every tensor bit
# for bit and every key but run.*, which name the outputs' places: parameters,
# optimizer state, data position) and the run log's numbers without its clock readings
# (losses, gradient norms, validation, per-layer measurements, the sample). Each hybrid's
# checkpoint is also evaluated with --skip-nonstandard attention and block, and those
# losses compared.
#
# Environment: PRECISIONS (default "bf16 fp32"), DATA_DIR (default data/offline; built by
# `make demo`), JOBS (default 2). Builds build/host-{bf16,fp32}/train_san itself.
set -euo pipefail
cd "$(dirname "$0")/.."

usage() { echo "usage: scripts/same_bits.sh save|check DIR" >&2; exit 2; }
[ $# -eq 2 ] || usage
mode=$1 dir=$2
case "$mode" in save|check) ;; *) usage ;; esac
precisions=${PRECISIONS:-bf16 fp32}
data=${DATA_DIR:-data/offline}
jobs=${JOBS:-2}
[ -f "$data/tokenizer.bin" ] || { echo "same_bits: no demo data in $data (make demo builds it)" >&2; exit 1; }
if [ "$mode" = check ]; then
  [ -d "$dir" ] || { echo "same_bits: no saved results in $dir (run: scripts/same_bits.sh save $dir)" >&2; exit 1; }
fi

# name|flags
configs=("standard|")
for kind in mlp approximate nonapprox rndembqk fixedseqqk staticembqk; do
  configs+=("$kind-uniform|--attention $kind" "$kind-hybrid|--attention $kind --layout hybrid")
done
configs+=("ffn|--ffn swiglu" "ffn-mlp-hybrid|--ffn swiglu --attention mlp --layout hybrid"
          "sandwich-approximate-hybrid|--sandwich 1 --attention approximate --layout hybrid")

for p in $precisions; do
  make --no-print-directory -s "build/host-$p/train_san" PRECISION=$(echo "$p" | tr a-z A-Z) >/dev/null
done

# The run log without what a clock decides (times, rates, dates), one record per line.
numbers_of_log() {
  .venv/bin/python - "$1" <<'EOF'
import json, sys
clock = ("time", "ms", "tok_per_s", "tokens_per_s", "elapsed", "date", "mfu", "eta", "host", "pid", "wall")
def strip(v):
    if isinstance(v, dict):
        return {k: strip(x) for k, x in v.items() if not any(c in k for c in clock)}
    if isinstance(v, list):
        return [strip(x) for x in v]
    return v
for line in open(sys.argv[1]):
    print(json.dumps(strip(json.loads(line)), sort_keys=True))
EOF
}

# one configuration in one precision: train into $out, evaluate hybrids without their variants
run_one() {
  local p=$1 name=$2 flags=$3 out=$4
  local bin=build/host-$p/train_san
  rm -rf "$out" && mkdir -p "$out"
  # shellcheck disable=SC2086
  HOSTCUDA_THREADS=1 "$bin" --preset demo --train-data "$data/synth/synth_train_*.bin" \
    --val-data "$data/synth/synth_val_*.bin" --tokenizer "$data/tokenizer.bin" \
    --steps 20 --batch-size 4 --val-every 10 --val-batches 2 --sample-tokens 16 --log-every 10 \
    --log "$out/log.jsonl" --checkpoint-dir "$out" $flags >"$out/stdout" 2>&1 \
    || { echo "same_bits: $p $name failed:"; tail -5 "$out/stdout"; return 1; }
  numbers_of_log "$out/log.jsonl" >"$out/numbers"
  rm -f "$out/log.jsonl"
  if [[ $name == *hybrid* ]]; then
    for skip in attention block; do
      HOSTCUDA_THREADS=1 "$bin" --steps 0 --init-from "$out/final.bin" --skip-nonstandard $skip \
        --val-data "$data/synth/synth_val_*.bin" --tokenizer "$data/tokenizer.bin" --val-batches 2 \
        --sample-tokens 0 --log "$out/skip-$skip.jsonl" >"$out/skip-$skip.stdout" 2>&1 \
        || { echo "same_bits: $p $name --skip-nonstandard $skip failed:"; tail -5 "$out/skip-$skip.stdout"; return 1; }
      numbers_of_log "$out/skip-$skip.jsonl" >"$out/skip-$skip.numbers"
      rm -f "$out/skip-$skip.jsonl"
    done
  fi
}

target=$dir
[ "$mode" = check ] && target=$(mktemp -d)
pids=() labels=()
for p in $precisions; do
  for c in "${configs[@]}"; do
    name=${c%%|*} flags=${c#*|}
    run_one "$p" "$name" "$flags" "$target/$p/$name" &
    pids+=($!) labels+=("$p/$name")
    while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do sleep 0.2; done
  done
done
failed=0
for i in "${!pids[@]}"; do wait "${pids[$i]}" || failed=1; done
[ $failed = 0 ] || { echo "same_bits: a run failed (above)" >&2; exit 1; }

if [ "$mode" = save ]; then
  echo "same_bits: saved ${#labels[@]} runs in $dir"
  exit 0
fi
differ=0
for label in "${labels[@]}"; do
  for f in final.bin numbers skip-attention.numbers skip-block.numbers; do
    [ -f "$dir/$label/$f" ] || continue
    if [ "$f" = final.bin ]; then   # the state, bit for bit; not the run.* keys (where each wrote its outputs)
      same=$(.venv/bin/python -m attnref.ckpt_diff "$dir/$label/$f" "$target/$label/$f" >/dev/null && echo 1 || true)
    else
      same=$(cmp -s "$dir/$label/$f" "$target/$label/$f" && echo 1 || true)
    fi
    if [ -z "$same" ]; then
      echo "same_bits: DIFFERS: $label/$f"
      differ=1
    fi
  done
done
if [ $differ = 0 ]; then
  echo "same_bits: all ${#labels[@]} runs the same bit for bit (final.bin, logged numbers, skip evaluations)"
  rm -rf "$target"
else
  echo "same_bits: the new runs are in $target" >&2
  exit 1
fi
