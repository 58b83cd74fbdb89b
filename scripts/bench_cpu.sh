#!/usr/bin/env bash
# The CPU bench: the host backend's trainers against PyTorch eager on the same CPU, measured
# side by side in one run (DESIGN.md, principle 1: the host backend is at least PyTorch's
# speed). Each arm trains the same config, data and seed in:
#   host-bf16   build/host-bf16/<trainer>   (what ./train_san is on a machine without a GPU)
#   host-fp32   build/host-fp32/<trainer>
#   torch       <trainer>.py --compile 0, fp32, torch's threads = HOSTCUDA_THREADS (the reference)
#   torch-compiled  the same with --compile 1 (with --compiled; reported, not compared)
# A run's figure is the median tok/s of its steps 10..STEPS (the first steps warm caches, and
# torch allocates); the arms run interleaved (A B C A B C ...) ROUNDS times and each arm's
# figure is the median over its rounds, so a change in the machine's load hits every arm.
# Printed first: the machine (CPU model, the best instruction set its cpuid reports, the GEMM
# kernels each side runs) and its limit, a 2048^3 fp32 GEMM through the host backend's GEMMs
# (dev/cuda/gemm_peak.cu) and through torch.mm, the fastest of which is the limit; then per
# config tok/s per arm and round, each arm's ratio to the reference, and its training GFLOP/s
# (tok/s x the trainer's MFLOPs/token) as a share of the limit.
#
#   scripts/bench_cpu.sh                 # the gating config: the demo SAN (V 8192, L 4, d 128,
#                                        # 4q/2kv heads, T 128, B 8, AdamW), 2 threads, 3 rounds
#   scripts/bench_cpu.sh --all           # and the FFN arm (--ffn swiglu) and GPT-2 (reported)
#   options: --rounds N (3)  --steps N (50)  --threads N (HOSTCUDA_THREADS, else nproc)
#            --compiled (also torch --compile 1)  --no-build (use the binaries as they are)
#            --isa avx2 (what a CPU without AVX-512 gets, on this one: the host builds with
#              -march=x86-64-v3 in build/host-<precision>-x86-64-v3, and every library capped at
#              AVX2: oneDNN, OpenBLAS, MKL and PyTorch's own kernels)
# Needs the full venv (PyTorch: bash scripts/setup.sh) and builds what it lacks (the offline
# dataset, the two host builds, gemm_peak). Takes ~2 minutes for the gating config on 2 cores, ~10 with
# --all --compiled.
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # this checkout's attnref and study, installed or not

rounds=3 steps=50 threads=${HOSTCUDA_THREADS:-$(nproc)} all=0 compiled=0 build=1 isa=native
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) rounds=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --all) all=1; shift ;;
    --compiled) compiled=1; shift ;;
    --no-build) build=0; shift ;;
    --isa) isa=$2; shift 2 ;;
    -h|--help) sed -n '2,25p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "bench_cpu: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
for v in rounds steps threads; do
  [[ ${!v} =~ ^[1-9][0-9]*$ ]] || { echo "bench_cpu: --$v must be a positive integer, not '${!v}'" >&2; exit 2; }
done
[ "$steps" -ge 12 ] || { echo "bench_cpu: --steps must be at least 12 (the figure is the median of steps 10..)" >&2; exit 2; }
case $isa in
  native) march=native ;;
  avx2) march=x86-64-v3
    export ONEDNN_MAX_CPU_ISA=AVX2 OPENBLAS_CORETYPE=Haswell MKL_ENABLE_INSTRUCTIONS=AVX2 ATEN_CPU_CAPABILITY=avx2 ;;
  *) echo "bench_cpu: --isa must be native or avx2, not '$isa'" >&2; exit 2 ;;
esac
suffix=$([ "$march" = native ] || echo "-$march")
bf16_dir=build/host-bf16$suffix fp32_dir=build/host-fp32$suffix
python=.venv/bin/python
"$python" -c "import torch" 2>/dev/null ||
  { echo "bench_cpu: no PyTorch in .venv; run: bash scripts/setup.sh" >&2; exit 1; }

data=${DATA_DIR:-data/offline}
if ! "$python" dev/data/build_offline.py --out "$data" --is-current; then
  "$python" dev/data/build_offline.py --out "$data"
fi
trainers=(train_san)
[ "$all" = 1 ] && trainers+=(train_gpt2)
if [ "$build" = 1 ]; then
  for t in "${trainers[@]}"; do
    make -s --no-print-directory "$bf16_dir/$t" PRECISION=BF16 HOST_MARCH=$march
    make -s --no-print-directory "$fp32_dir/$t" PRECISION=FP32 HOST_MARCH=$march
  done
  make -s --no-print-directory "$fp32_dir/gemm_peak" PRECISION=FP32 HOST_MARCH=$march
fi

export HOSTCUDA_THREADS=$threads OMP_NUM_THREADS=$threads MKL_NUM_THREADS=$threads
common=(--preset demo --train-data "$data/synth/synth_train_*.bin" --tokenizer "$data/tokenizer.bin"
        --lr 2e-3 --batch-size 8 --steps "$steps" --val-every 0 --sample-tokens 0 --seed 42)
host_only=(--log-every 1 --run-dir "")  # (no run directory: a bench writes nothing)

# the median of the numbers on stdin, one per line ("nan" for none)
median() {
  sort -g | awk '{ v[NR] = $1 } END { if (NR == 0) { print "nan" } else if (NR % 2) { print v[(NR + 1) / 2] } else { print (v[NR / 2] + v[NR / 2 + 1]) / 2 } }'
}
# median tok/s of steps 10.. of a run's output (both trainers print "step N/M | ... | X tok/s")
median_rate() { sed -n 's/^step *\([0-9]*\)\/[0-9]* .*| *\([0-9.]*\) tok\/s.*/\1 \2/p' | awk '$1 >= 10 { print $2 }' | median; }
median_of() { printf '%s\n' "$@" | median; }

# bench NAME TRAINER EXTRA_ARGS...: one config, every arm, interleaved rounds
bench() {
  local name=$1 trainer=$2; shift 2
  local arms=(host-bf16 host-fp32 torch) arm round out rate
  [ "$compiled" = 1 ] && [ "$trainer" = train_san ] && arms+=(torch-compiled)  # (train_gpt2.py has no --compile)
  declare -A rates=()
  echo "== $name: $trainer $* (${steps} steps, threads $threads, $rounds rounds)"
  for round in $(seq "$rounds"); do
    for arm in "${arms[@]}"; do
      case $arm in
        host-bf16) out=$("$bf16_dir/$trainer" "${common[@]}" "${host_only[@]}" "$@" 2>&1) ;;
        host-fp32) out=$("$fp32_dir/$trainer" "${common[@]}" "${host_only[@]}" "$@" 2>&1) ;;
        torch) out=$("$python" "$trainer.py" "${common[@]}" $([ "$trainer" = train_san ] && echo --compile 0) "$@" 2>&1) ;;
        torch-compiled) out=$("$python" "$trainer.py" "${common[@]}" --compile 1 "$@" 2>&1) ;;
      esac || { echo "$out" | tail -5; echo "bench_cpu: the $arm run of $name failed" >&2; exit 1; }
      rate=$(echo "$out" | median_rate)
      rates[$arm]="${rates[$arm]:-} $rate"
      printf '  round %d  %-15s %9.0f tok/s\n' "$round" "$arm" "$rate"
    done
  done
  local ref mflops banner
  ref=$(median_of ${rates[torch]})
  banner=$("$fp32_dir/$trainer" "${common[@]}" "${host_only[@]}" "$@" --steps 1 2>&1)
  mflops=$(echo "$banner" | sed -n 's/.*; \([0-9.]*\) MFLOPs\/token.*/\1/p' | head -1)
  echo "  host GEMM: $(echo "$banner" | sed -n 's/.*; GEMM: \(.*\))$/\1/p' | head -1); $mflops MFLOPs/token"
  for arm in "${arms[@]}"; do
    local m
    m=$(median_of ${rates[$arm]})
    printf '  %-15s median %9.0f tok/s   %5.2fx torch   %6.1f GFLOP/s, %4.1f%% of the limit%s\n' "$arm" "$m" \
      "$(awk -v a="$m" -v b="$ref" 'BEGIN { print a / b }')" \
      "$(awk -v r="$m" -v f="${mflops:-nan}" 'BEGIN { print r * f / 1e3 }')" \
      "$(awk -v r="$m" -v f="${mflops:-nan}" -v p="$limit" 'BEGIN { print 100 * r * f / 1e3 / p }')" \
      "$([ "$arm" = torch-compiled ] && echo " (reported, not compared)" || true)"
  done
}

# The machine, and its limit: the best GFLOP/s of a large fp32 GEMM on the same threads
cpu_isa() { "$fp32_dir/gemm_peak" 1 | head -1 | sed -n 's/.*(CPU: \([a-z0-9_]*\)).*/\1/p'; }
echo "bench_cpu: $(date -u +%Y-%m-%dT%H:%MZ), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores, best ISA $(cpu_isa), load average $(cut -d' ' -f1-3 /proc/loadavg)"
[ "$isa" = native ] || echo "  (--isa $isa: host builds -march=$march; ONEDNN_MAX_CPU_ISA=$ONEDNN_MAX_CPU_ISA MKL_ENABLE_INSTRUCTIONS=$MKL_ENABLE_INSTRUCTIONS ATEN_CPU_CAPABILITY=$ATEN_CPU_CAPABILITY)"
[ -n "${OPENBLAS_CORETYPE:-}" ] && echo "  (OPENBLAS_CORETYPE=$OPENBLAS_CORETYPE is set in this environment)"
echo "== the limit: a 2048 x 2048 x 2048 fp32 GEMM, best of 5, $threads threads"
peaks=$("$fp32_dir/gemm_peak" 2048)
echo "$peaks" | sed 's/^gemm_peak /  host   /'
torch_peak=$("$python" - "$threads" <<'PY'
import sys, time, torch
torch.set_num_threads(int(sys.argv[1]))
a, b = torch.rand(2048, 2048), torch.rand(2048, 2048)
torch.mm(a, b)
best = min((lambda t0: (torch.mm(a, b), time.perf_counter() - t0)[1])(time.perf_counter()) for _ in range(5))
blas = next((w.split("=")[1] for w in torch.__config__.show().replace(",", " ").split() if w.startswith("BLAS_INFO=")), "?")
print(f"torch {torch.__version__} mm ({blas}, {torch.backends.cpu.get_cpu_capability()} kernels) | 2048 | {2 * 2048**3 / best / 1e9:.1f} GFLOP/s")
PY
)
echo "  $torch_peak"
limit=$(printf '%s\n%s\n' "$peaks" "$torch_peak" | sed -n 's/.*| *\([0-9.]*\) GFLOP\/s/\1/p' | sort -g | tail -1)
echo "  the limit: $limit GFLOP/s"

bench "SAN demo (gating)" train_san --optimizer adamw
if [ "$all" = 1 ]; then
  bench "FFN arm (reported)" train_san --optimizer adamw --ffn swiglu
  bench "GPT-2 demo (reported)" train_gpt2
fi
