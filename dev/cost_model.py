"""A roofline model of one training step on a named GPU, from the host backend's cost counts
(llmc/hostcuda/cost.h; doc/gpu-runs/cost-model.md): for each kernel, the tensor-core and FMA
FLOPs and the device-memory bytes it reads and writes in one step, its launches, and its time
on the card if it ran at the card's peak rate or bandwidth, whichever binds. Usage:

    .venv/bin/python dev/cost_model.py --trainer build/host-bf16/train_san --preset san20 --card h100-sxm

It runs the host trainer three times on random tokens with HOSTCUDA_COST set: 1 and 2 steps at a
micro-batch of 1 row (a step's counts are the 2-step run's less the 1-step run's: the set-up's
launches cancel) and 1 step at 2 rows. Every count is affine in the batch (activations grow with
it, weights and optimizer state do not), so the two batches give it at --batch-size exactly; with
--layers L, the same at 1 and 2 layers, extrapolated to L (the layers are alike).
The model's blind spots: the scalar kernels' arithmetic is not counted (they are taken as bound
by their bytes); bytes are a launch's footprint (each byte once, whatever a GPU's caches miss);
launch gaps and the host's own time are not in the step time (launches per step are listed)."""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from attnref.shards import write_shard  # noqa: E402

# Peak dense rates and bandwidths. Datasheet figures (NVIDIA's H100, A100 and Ada whitepapers:
# bf16 tensor with fp32 accumulation, no sparsity; fp32 non-tensor; memory; host link), and the
# ceilings measured on this workplace's H100 (.library device KINDS.md, 2026-11-13: an 8192^3 bf16
# matmul at 798 TFLOP/s, a device-to-device copy at ~3.0 TB/s counting both directions).
CARDS = {
    "h100-sxm": dict(name="H100 SXM5 80GB (datasheet)", tensor=989.4e12, fma=66.9e12, memory=3.35e12, link=64e9),
    "h100-measured": dict(name="H100 80GB HBM3 (measured ceilings)", tensor=798e12, fma=66.9e12, memory=3.0e12,
                          link=64e9),
    "a100": dict(name="A100 SXM4 80GB (datasheet)", tensor=312e12, fma=19.5e12, memory=2.039e12, link=32e9),
    "4090": dict(name="RTX 4090 (datasheet)", tensor=165.2e12, fma=82.6e12, memory=1.008e12, link=32e9),
}
FIELDS = ("launches", "tensor_flops", "fma_flops", "read", "written")
COPIES = ("cudaMemcpy host to device", "cudaMemcpy device to host")


def read_counts(path):
    """{name: {field: int}} of a HOSTCUDA_COST file."""
    counts = {}
    with open(path) as f:
        for n, line in enumerate(f, 1):
            parts = line.rstrip("\n").split("\t")
            if len(parts) != 1 + len(FIELDS):
                raise ValueError(f"{path}:{n}: expected {1 + len(FIELDS)} tab-separated fields, got {len(parts)}")
            counts[parts[0]] = dict(zip(FIELDS, map(int, parts[1:])))
    return counts


def difference(later, earlier):
    """Per name, later - earlier (a name missing from one counts zero there)."""
    out = {}
    for name in set(later) | set(earlier):
        a, b = later.get(name, {}), earlier.get(name, {})
        d = {k: a.get(k, 0) - b.get(k, 0) for k in FIELDS}
        if any(d.values()):
            out[name] = d
    return out


def at_batch(step1, step2, batch):
    """Counts at `batch` rows from those at 1 and 2 rows, each affine in the batch (also used for
    the depth: counts at 1 and 2 layers to `batch` layers)."""
    out = {}
    for name in set(step1) | set(step2):
        a, b = step1.get(name, {}), step2.get(name, {})
        out[name] = {k: a.get(k, 0) + (b.get(k, 0) - a.get(k, 0)) * (batch - 1) for k in FIELDS}
    return out


def kernel_time(c, card, name=""):
    """(seconds, what binds) of one kernel's counts on `card` at its peaks."""
    if name in COPIES:
        return c["read"] / card["link"], "host link"
    times = {"tensor": c["tensor_flops"] / card["tensor"], "fma": c["fma_flops"] / card["fma"],
             "memory": (c["read"] + c["written"]) / card["memory"]}
    bound = max(times, key=times.get)
    return times[bound], bound


def table(counts, card, tokens):
    """The per-kernel table (markdown) and the step's totals."""
    rows = []
    for name, c in counts.items():
        seconds, bound = kernel_time(c, card, name)
        rows.append((seconds, name, c, bound))
    rows.sort(key=lambda r: (-r[0], r[1]))
    step = sum(r[0] for r in rows)
    launches = sum(c["launches"] for name, c in counts.items() if not name.startswith("cudaMem"))
    tensor = sum(c["tensor_flops"] for c in counts.values())
    fma = sum(c["fma_flops"] for c in counts.values())
    moved = sum(c["read"] + c["written"] for name, c in counts.items() if name not in COPIES)
    lines = ["| kernel | launches | tensor GFLOP | FMA GFLOP | MB read | MB written | bound | modelled ms | share |",
             "|---|---:|---:|---:|---:|---:|---|---:|---:|"]
    for seconds, name, c, bound in rows:
        lines.append(f"| {name} | {c['launches']} | {c['tensor_flops'] / 1e9:.2f} | {c['fma_flops'] / 1e9:.2f} | "
                     f"{c['read'] / 1e6:.1f} | {c['written'] / 1e6:.1f} | {bound} | {seconds * 1e3:.3f} | "
                     f"{100 * seconds / step if step else 0:.1f}% |")
    totals = dict(step_seconds=step, launches=launches, tensor_flops=tensor, fma_flops=fma, bytes=moved,
                  tokens_per_second=tokens / step if step else 0.0,
                  tensor_share=tensor / card["tensor"] / step if step else 0.0)
    return "\n".join(lines), totals


def run_trainer(trainer, args, out_path, env):
    proc = subprocess.run([trainer] + args, env={**env, "HOSTCUDA_COST": out_path}, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{trainer} {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return read_counts(out_path)


def step_counts(trainer, base, workdir, tag, env):
    """One step's counts at batches 1 and 2 from three runs: 1 and 2 steps at batch 1 (their
    difference: a step), 1 step at batch 2 (less the set-up and end, which the batch does not change)."""
    def run(batch, steps):
        return run_trainer(trainer, base + ["--batch-size", str(batch), "--steps", str(steps)],
                           os.path.join(workdir, f"cost-{tag}-b{batch}-s{steps}.tsv"), env)
    once, twice, wide = run(1, 1), run(1, 2), run(2, 1)
    step1 = difference(twice, once)
    setup = difference(once, step1)
    step2 = difference(wide, setup)
    for name, c in list(step1.items()) + list(step2.items()):
        if any(v < 0 for v in c.values()):
            raise RuntimeError(f"{name}: a step's counts came out negative ({c}): the runs are not a set-up plus "
                               "equal steps")
    return step1, step2


def measure(trainer, preset, vocab, extra, workdir, layers=None):
    """A step's counts at batches 1 and 2 (their difference is what one more row costs). With
    `layers`, measured at 1 and 2 layers and extrapolated to `layers` (every count is affine in the
    depth too: the layers are alike)."""
    rng = np.random.default_rng(0)
    tokens = rng.integers(3, vocab, size=4 * 4097 * 8)
    write_shard(os.path.join(workdir, "cost_000000.bin"), tokens)
    base = ["--preset", preset, "--train-data", os.path.join(workdir, "cost_*.bin"), "--val-every", "0",
            "--sample-tokens", "0", "--log-every", "1", "--run-dir", ""] + extra
    env = dict(os.environ)
    if layers is None:
        return step_counts(trainer, base, workdir, "as-given", env)
    one = step_counts(trainer, base + ["--n-layer", "1"], workdir, "l1", env)
    two = step_counts(trainer, base + ["--n-layer", "2"], workdir, "l2", env)
    return at_batch(one[0], two[0], layers), at_batch(one[1], two[1], layers)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trainer", required=True, help="a host-backend trainer (build/host-bf16/train_san, ...)")
    parser.add_argument("--preset", required=True, help="the trainer's preset (san20, gpt2, ...)")
    parser.add_argument("--batch-size", type=int, nargs="+", default=[8], help="rows per micro-batch of the modelled "
                        "step (several: a section each)")
    parser.add_argument("--seq-len", type=int, required=True, help="tokens per row (the preset's context)")
    parser.add_argument("--vocab", type=int, required=True, help="the tokens drawn are below it (the preset's vocabulary)")
    parser.add_argument("--layers", type=int, help="the preset's layers: measure at 1 and 2 and extrapolate (faster)")
    parser.add_argument("--card", choices=sorted(CARDS), action="append", help="card(s) to model (default h100-sxm)")
    parser.add_argument("--out", help="also write the report (markdown) here")
    parser.add_argument("--save-counts", help="write a step's counts at batches 1 and 2 (JSON) here")
    parser.add_argument("--from-counts", help="model from such a file instead of running the trainer")
    parser.add_argument("extra", nargs="*", help="more trainer flags, after --")
    args = parser.parse_args(argv)
    if min(args.batch_size) < 1:
        parser.error(f"--batch-size must be at least 1 (got {min(args.batch_size)})")
    if args.from_counts:
        try:
            with open(args.from_counts) as f:
                step1, step2 = json.load(f)["steps"]
        except (OSError, ValueError, KeyError) as e:
            parser.error(f"--from-counts {args.from_counts}: {e}")
    else:
        if not os.access(args.trainer, os.X_OK):
            parser.error(f"--trainer {args.trainer}: not an executable (build it: make {args.trainer})")
        with tempfile.TemporaryDirectory() as workdir:
            step1, step2 = measure(args.trainer, args.preset, args.vocab, args.extra, workdir, args.layers)
    if args.save_counts:
        tmp = args.save_counts + ".tmp"
        with open(tmp, "w") as f:
            json.dump({"trainer": os.path.basename(args.trainer), "preset": args.preset, "extra": args.extra,
                       "layers": args.layers, "steps": [step1, step2]}, f, indent=1, sort_keys=True)
        os.replace(tmp, args.save_counts)
    report = [f"# Cost model: {os.path.basename(args.trainer)} --preset {args.preset} {' '.join(args.extra)}".rstrip(),
              "", "From the host backend's counts (dev/cost_model.py; doc/gpu-runs/cost-model.md says what they count "
              "and miss)."]
    for batch in args.batch_size:
        counts = at_batch(step1, step2, batch)
        tokens = batch * args.seq_len
        for key in args.card or ["h100-sxm"]:
            card = CARDS[key]
            text, t = table(counts, card, tokens)
            report += ["", f"## B {batch} x T {args.seq_len} ({tokens} tokens a step) on {card['name']}: "
                       f"{card['tensor'] / 1e12:.0f} TFLOP/s bf16 tensor, {card['fma'] / 1e12:.1f} TFLOP/s fp32, "
                       f"{card['memory'] / 1e12:.2f} TB/s", "",
                       f"Modelled step: {t['step_seconds'] * 1e3:.2f} ms ({t['tokens_per_second'] / 1e6:.3f}M "
                       f"tokens/s); {t['launches']} kernel launches; {t['tensor_flops'] / 1e12:.3f} TFLOP on tensor "
                       f"cores, {t['fma_flops'] / 1e12:.3f} TFLOP FMA, {t['bytes'] / 1e9:.2f} GB moved; the tensor "
                       f"cores busy {100 * t['tensor_share']:.0f}% of the modelled step.", "", text]
    text = "\n".join(report) + "\n"
    print(text, end="")
    if args.out:
        tmp = args.out + ".tmp"
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, args.out)


if __name__ == "__main__":
    main()
