#!/usr/bin/env bash
# GPU speed figures, side by side in one run (issue 10's bar): train_san san20 bf16 tokens/s
# and MFU with the document mask off and on, the attention playgrounds' TFLOP/s for every
# kernel version (causal forward FLOPs = 2 B Hq T^2 hd, backward 2.5x), and train_gpt2 at
# GPT-2 124M with llm.c's batch (64 x 1024, 524,288 tokens a step). Runs on random tokens (no data files needed), from the bf16 GPU builds.
#   scripts/bench_gpu.sh [STEPS]      (default 30 steps per trainer run)
# The PyTorch side is train_san.py's speed path (bf16 autocast, torch.compile, SDPA flash or
# FlexAttention) on the same config, data and batch; the ratio of tokens/s is printed.
set -uo pipefail
cd "$(dirname "$0")/.."
steps=${1:-30}
python=${PYTHON:-python3}
nvidia-smi -L >/dev/null 2>&1 || { echo "bench_gpu: no NVIDIA GPU here (nvidia-smi -L failed)" >&2; exit 1; }
make -s --no-print-directory build/gpu-bf16/train_san build/gpu-bf16/train_gpt2 build/gpu-bf16/attention_forward \
  build/gpu-bf16/attention_backward PRECISION=BF16 || exit 1
dir=build/bench-data
mkdir -p "$dir"
# random token shards: vocab 16384 for san20, 50257 for GPT-2; 8 x 2049 x 40 tokens each
$python - "$dir" <<'PY' || exit 1
import sys
import numpy as np
from attnref.shards import write_shard
out = sys.argv[1]
rng = np.random.default_rng(0)
for name, vocab in (("san", 16384), ("gpt2", 50257)):
    tokens = rng.integers(3, vocab, size=8 * 2049 * 40)
    tokens[:: 1024] = 2 if name == "san" else 50256   # a document start every 1024 tokens
    write_shard(f"{out}/{name}_000000.bin", tokens)
PY
last_progress() {  # the trainer's last progress line (tokens/s, MFU)
  grep -E '^step +[0-9]+/' | tail -1
}
tokens_per_second() {  # the number before "tok/s" in a progress line
  sed -n 's/.* \([0-9.]*\) tok\/s.*/\1/p'
}
echo "== train_san san20, bf16, B 8 x T 2048, $steps steps: CUDA trainer vs the PyTorch speed path"
echo "   (train_san.py --attn-impl fast --autocast bf16 --compile 1: SDPA flash with the document mask"
echo "   off, FlexAttention with it on; same config, data, batch and optimizer; last step's figures)"
for mask in 0 1; do
  line=$(build/gpu-bf16/train_san --preset san20 --doc-mask $mask --train-data "$dir/san_*.bin" --batch-size 8 \
         --steps "$steps" --val-every 0 --sample-tokens 0 --log-every 1 --optimizer muon --run-dir "" | last_progress)
  echo "doc mask $mask, train_san:    $line"
  torch_line=$($python train_san.py --preset san20 --doc-mask $mask --train-data "$dir/san_*.bin" --batch-size 8 \
               --steps "$steps" --val-every 0 --optimizer muon --device cuda --attn-impl fast --autocast bf16 \
               --compile 1 2>&1 | last_progress)
  echo "doc mask $mask, train_san.py: ${torch_line:-(no progress line: the PyTorch run failed)}"
  ours=$(echo "$line" | tokens_per_second)
  theirs=$(echo "$torch_line" | tokens_per_second)
  if [ -n "$ours" ] && [ -n "$theirs" ]; then
    echo "doc mask $mask: train_san / PyTorch tokens/s = $(echo "scale=2; $ours / $theirs" | bc) (target >= 1.0, goal 1.5)"
  fi
done
# with the cudnn-frontend headers at hand (venv, or build/cudnn-frontend carried along) the
# playgrounds are built with USE_CUDNN=1 and add cuDNN as version 4
attention_dir=build/gpu-bf16
if [ -n "$(make -s print-CUDNN_FRONTEND USE_CUDNN=1 2>/dev/null)" ] &&
   make -s --no-print-directory USE_CUDNN=1 PRECISION=BF16 build/gpu-bf16-cudnn/attention_forward \
     build/gpu-bf16-cudnn/attention_backward; then
  attention_dir=build/gpu-bf16-cudnn
else
  echo "(cuDNN: not built here: no cudnn-frontend headers or the build failed; versions 1-3 only)"
fi
echo "== attention playgrounds (bf16; every version validates first, then the benchmark table)"
$attention_dir/attention_forward | sed -n '/^benchmark/,$p'
$attention_dir/attention_backward | sed -n '/^benchmark/,$p'
# llm.c's GPT-2 124M runs take micro-batches of 64 x 1024 and 524,288 tokens a step (-b 64 -t 1024
# -d 524288): the same here, so that the tokens/s and MFU compare with its figures; B 32 x 16 if
# B 64 does not fit the card's memory
echo "== train_gpt2 gpt2 (124M), bf16, B 64 x T 1024 x 8 micro-batches (524,288 tokens a step, as llm.c), $steps steps"
for batch in "64 8" "32 16"; do
  set -- $batch
  line=$(build/gpu-bf16/train_gpt2 --preset gpt2 --train-data "$dir/gpt2_*.bin" --batch-size $1 --grad-accum $2 \
         --steps "$steps" --val-every 0 --sample-tokens 0 --log-every 1 --run-dir "" | last_progress)
  [ -n "$line" ] && { echo "B $1 x T 1024 x $2: $line"; break; }
  echo "B $1 x T 1024 x $2: no progress line (out of memory?)"
done
# last, as the least important figures (a short lease may end here): 10 steps per optimizer
opt_steps=$(( steps < 10 ? steps : 10 ))
echo "== the optimizer's share of a step: train_san san20, bf16, B 8 x T 2048, $opt_steps steps each"
step_ms() {  # the number before "ms" in a progress line
  sed -n 's/.*| *\([0-9.]*\) ms |.*/\1/p'
}
adamw_ms=""
for optimizer in "adamw" "muon" "muon --ns-fp32 1"; do
  line=$(build/gpu-bf16/train_san --preset san20 --train-data "$dir/san_*.bin" --batch-size 8 --steps "$opt_steps" \
         --val-every 0 --sample-tokens 0 --log-every 1 --optimizer $optimizer | last_progress)
  ms=$(echo "$line" | step_ms)
  [ "$optimizer" = adamw ] && adamw_ms=$ms
  extra=""
  if [ -n "$ms" ] && [ -n "$adamw_ms" ] && [ "$optimizer" != adamw ]; then
    extra=" (+$(echo "scale=1; $ms - $adamw_ms" | bc) ms over AdamW)"
  fi
  echo "--optimizer $optimizer: ${ms:-?} ms/step$extra"
done
