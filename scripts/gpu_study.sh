#!/usr/bin/env bash
# The GPU study of one lease (issue 44 item 5; doc/study-runs/2026-12-05-gpu-plan.md): the SAN vs
# its iso-depth / iso-FLOP / iso-param FFN partners on the knowledge corpus, each arm's AdamW side
# swept (studies/mini_gpu_other.toml), then seeds 43 and 44 at each arm's best
# (studies/mini_gpu.toml), as many runs as the budget allows, reports and at most 8 files in $OUT.
#
#   scripts/gpu_study.sh --pack          here, before the lease: build/gpu-study/knowledge-v2048.tar.xz
#                                        (the corpus's training and validation shards, compressed) and,
#                                        where nvcc is, build/gpu-study/train_san (sm_90, single-GPU)
#   scripts/gpu_study.sh [--steps N]     on the GPU machine: unpack, the trainer (the carried one if it
#                                        runs there, else one make), the runs, the reports, $OUT
#   scripts/gpu_study.sh --host          the same on the host backend at tiny sizes (the dry run;
#                                        dev/test/test_gpu_study.py runs it on a tiny corpus)
#   --work DIR      where data/, build/gpu-study/ and logs/ are (default: this checkout)
#   --out DIR       where the returned files go (default: $OUT, else logs/gpu-study-out)
#
# Budget: GPU_STUDY_BUDGET seconds from the start (default 510: the run tool's timeout_s 540 less
# 30 s), of which the runs stop GPU_STUDY_RESERVE (default 45) seconds before the end, for the
# reports and the packing. The device tool returns at most 8 files: summary.txt, report.md,
# sweep.md, four PNGs and logs.tar.gz (doc/gpu-runs/README.md "The GPU study").
set -uo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
mode=device work=$repo out=${OUT:-} steps=
while [ $# -gt 0 ]; do
  case $1 in
    --pack) mode=pack ;;
    --host) mode=host ;;
    --steps) steps=$2; shift ;;
    --work) work=$(cd "$2" && pwd) || exit 2; shift ;;
    --out) out=$2; shift ;;
    *) echo "gpu_study: unknown argument '$1' (see the header of $0)" >&2; exit 2 ;;
  esac
  shift
done
start=$(date +%s)
budget=${GPU_STUDY_BUDGET:-510}
reserve=${GPU_STUDY_RESERVE:-45}
deadline=$((start + budget))
corpus=data/offline-knowledge-v2048
archive=build/gpu-study/knowledge-v2048.tar.xz
carried_bin=build/gpu-study/train_san
if [ -n "${PYTHON:-}" ]; then python=$PYTHON
elif [ -x "$repo/.venv/bin/python" ]; then python=$repo/.venv/bin/python
else python=python3; fi
export PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
cd "$work" || exit 2
mkdir -p build/gpu-study logs
stages=logs/gpu-study-stages.txt
: > "$stages"
stage() { echo "$*" | tee -a "$stages"; }

# --- pack: what the lease carries (one path: build/gpu-study, under the 64 MiB a call takes)
if [ $mode = pack ]; then
  [ -f $corpus/manifest.json ] || { echo "gpu_study: $corpus is missing: build it with $python dev/data/build_offline.py --out $corpus --vocab-size 2048 --knowledge" >&2; exit 1; }
  files=$(cd $corpus && ls manifest.json mixed/mixed_train_* knowledge/knowledge_val_*) || exit 1
  t0=$(date +%s)
  if [ -f $archive ] && [ -z "$(cd $corpus && find $files -newer "$work/$archive")" ] &&
     [ "$(tar -tJf $archive | sort)" = "$(echo "$files" | tr ' ' '\n' | sort)" ]; then
    echo "gpu_study: $archive is up to date"
  else
  "$python" - "$corpus" "$archive" $files <<'PY' || exit 1
import os, sys, tarfile
corpus, archive, files = sys.argv[1], sys.argv[2], sys.argv[3:]
with tarfile.open(archive + ".tmp", "w:xz", preset=6) as tar:
    for name in files:  # fixed order, owner and time: the archive depends on the files alone
        info = tar.gettarinfo(os.path.join(corpus, name), arcname=name)
        info.uid = info.gid = 0; info.uname = info.gname = ""; info.mtime = 0
        with open(os.path.join(corpus, name), "rb") as f:
            tar.addfile(info, f)
os.replace(archive + ".tmp", archive)
PY
  fi
  raw=$(cd $corpus && du -cb $files | tail -n 1 | cut -f1)
  size=$(stat -c %s $archive)
  echo "gpu_study: $archive: $(echo "$files" | wc -w) files, $raw bytes -> $size bytes ($(( $(date +%s) - t0 )) s)"
  if [ "${GPU_STUDY_NO_BINARY:-0}" != 1 ] && { command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; }; then
    (cd "$repo" && nice -n 5 make --no-print-directory build/gpu-bf16/train_san PRECISION=BF16 GPU_ARCHS=90 NO_MULTI_GPU=1) || exit 1
    cp "$repo/build/gpu-bf16/train_san" $carried_bin
    echo "gpu_study: $carried_bin (sm_90, single-GPU; the lease uses it when it runs there, else builds its own)"
  fi
  total=$(du -cb build/gpu-study/* | tail -n 1 | cut -f1)
  echo "gpu_study: build/gpu-study holds $total bytes in all (a call carries at most 64 MiB with the checkout)"
  [ "$total" -lt $((56 * 1024 * 1024)) ] || { echo "gpu_study: build/gpu-study is too large to carry" >&2; exit 1; }
  exit 0
fi

# --- the data: unpacked from the carried archive unless it is there
if [ ! -f $corpus/manifest.json ]; then
  [ -f $archive ] || { echo "gpu_study: neither $corpus nor $archive is here (run scripts/gpu_study.sh --pack before the lease and carry build/gpu-study)" >&2; exit 1; }
  t0=$(date +%s)
  mkdir -p $corpus
  "$python" -c "import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2], filter='data')" $archive $corpus || exit 1
  stage "unpack: $archive into $corpus in $(( $(date +%s) - t0 )) s"
else
  stage "data: $corpus is here"
fi

# --- the trainer
if [ $mode = host ]; then
  host_dir=$(cd "$repo" && make -s --no-print-directory print-HOST_DIR PRECISION=FP32) || exit 1   # (build/host-fp32[-march])
  binary=$host_dir/train_san
  if [ ! -x "$repo/$binary" ]; then
    (cd "$repo" && nice -n 5 make --no-print-directory $binary PRECISION=FP32) || exit 1
  fi
  binary=$repo/$binary
  stage "trainer: $binary (host backend, fp32)"
else
  nvidia-smi --query-gpu=name,compute_cap,memory.total,driver_version --format=csv,noheader 2>&1 | sed 's/^/machine: /' | tee -a "$stages"
  binary=
  if [ -x $carried_bin ] && timeout 60 $carried_bin -h >/dev/null 2>logs/gpu-study-carried-bin.log; then
    binary=$work/$carried_bin
    stage "trainer: the carried $carried_bin runs here"
  else
    [ -x $carried_bin ] && stage "trainer: the carried $carried_bin does not run here ($(tail -n 1 logs/gpu-study-carried-bin.log)); building"
    t0=$(date +%s)
    left=$((deadline - reserve - t0 - 60))
    (cd "$repo" && timeout $((left > 30 ? left : 30)) make --no-print-directory -j"$(nproc)" build/gpu-bf16/train_san PRECISION=BF16 NO_MULTI_GPU=1) > logs/gpu-study-build.log 2>&1
    rc=$?
    stage "build: make build/gpu-bf16/train_san: exit $rc in $(( $(date +%s) - t0 )) s"
    [ $rc = 0 ] || { tail -n 30 logs/gpu-study-build.log; binary=; }
    [ $rc = 0 ] && binary=$repo/build/gpu-bf16/train_san
  fi
  if [ -z "$binary" ]; then
    if [ -n "$out" ]; then mkdir -p "$out"; cp "$stages" "$out/summary.txt"; tail -n 200 logs/gpu-study-build.log >> "$out/summary.txt" 2>/dev/null; fi
    echo "gpu_study: no trainer; nothing ran" >&2
    exit 1
  fi
fi

# --- the runs, the reports, the returned files
out=${out:-logs/gpu-study-out}
args=(--sweep "$repo/studies/mini_gpu_other.toml" --main "$repo/studies/mini_gpu.toml" --binary "$binary"
      --deadline "$deadline" --reserve "$reserve" --pack "$out" --stages "$stages")
[ $mode = host ] && args+=(--tiny)
[ -n "$steps" ] && args+=(--steps "$steps")
"$python" -m study.gpu_lease "${args[@]}"
rc=$?
echo "gpu_study: exit $rc after $(( $(date +%s) - start )) s; returned files in $out: $(ls "$out" 2>/dev/null | tr '\n' ' ')"
exit $rc
