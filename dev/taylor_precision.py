#!/usr/bin/env python3
"""
taylor_precision.py: how far a trained `approximate` model's fp32 forward is from its float64
forward, and how ill-conditioned its Taylor layers' first-order denominators are (the
measurement behind doc/deconstructing.md "approximate").

    python dev/taylor_precision.py CKPT [CKPT ...] --val-data PATTERN [--batches 4] [--batch-size 16]

For each train_san checkpoint: the PyTorch reference (attnref) runs the same validation batches
once in float32 and once in float64 (the same weights, widened); it prints the largest
|logit difference|, the two mean losses, and, per approximate layer of the float64 run, the
condition number kappa = sum|x| / |sum x| of each query row's Z_1 = sum x (x = q.k / sqrt(hd)
over the keys the row sees): its median, its largest, and the share of rows above 1e3 and 1e6.
A relative perturbation u of the inputs (fp32: 6e-8 per rounding) moves the separate form's
A_1 = sum x v / Z_1 by up to about kappa u relative. (The joint form's denominator sum f(x) has
positive terms, f >= 1/2: its kappa is 1.)
"""
import argparse
import copy
import math
import sys

import torch

import attnref.san as san
from attnref.data import ShardLoader

kappas = []  # (layer index, kappa per row) of the run being recorded; None: not recording


def recording_taylor(original):
    """taylor_attention that also records each call's row condition numbers (float64 run only)."""
    def taylor(q, k, v, mask, norm="joint"):
        if kappas is not None and q.dtype == torch.float64:
            G = q.shape[1] // k.shape[1]
            kk = k.repeat_interleave(G, dim=1)
            x = torch.where(mask, q @ kk.transpose(-1, -2) / math.sqrt(q.shape[-1]), torch.zeros((), dtype=q.dtype))
            kappas.append((x.abs().sum(-1) / x.sum(-1).abs()).flatten())
        return original(q, k, v, mask, norm)
    return taylor


def measure(path, pattern, batches, batch_size):
    global kappas
    model, step, _, _ = san.load_checkpoint(path)
    cfg = model.cfg
    model.eval()
    wide = copy.deepcopy(model).double()
    loader = ShardLoader(pattern, batch_size, cfg.seq_len, cfg.vocab_size)
    worst, losses, kappas_all = 0.0, {torch.float32: 0.0, torch.float64: 0.0}, []
    with torch.no_grad():
        for _ in range(batches):
            x, y = loader.next_batch()
            kappas = None
            logits32, loss32 = model(x, y)
            kappas = []
            logits64, loss64 = wide(x, y)
            kappas_all.append(kappas)
            worst = max(worst, float((logits32.double() - logits64)[..., :cfg.vocab_size].abs().max()))
            losses[torch.float32] += float(loss32[1]) / batches
            losses[torch.float64] += float(loss64[1]) / batches
    print(f"{path} (step {step}, attention {cfg.attention}, layout {cfg.layout}, taylor_norm {cfg.taylor_norm}):")
    print(f"  max |logit fp32 - logit float64| {worst:.3g}; val loss fp32 {losses[torch.float32]:.6f}, "
          f"float64 {losses[torch.float64]:.6f} ({batches} batches of {batch_size} x {cfg.seq_len})")
    for i in range(len(kappas_all[0])):
        kap = torch.cat([calls[i] for calls in kappas_all])
        print(f"  Taylor layer #{i + 1}: kappa of Z_1 median {float(kap.median()):.3g}, max {float(kap.max()):.3g}, "
              f"rows > 1e3: {float((kap > 1e3).double().mean()):.2%}, > 1e6: {float((kap > 1e6).double().mean()):.2%}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].strip())
    ap.add_argument("checkpoints", nargs="+", help="train_san checkpoints (final.bin)")
    ap.add_argument("--val-data", required=True, help="token shard pattern of the validation data")
    ap.add_argument("--batches", type=int, default=4)
    ap.add_argument("--batch-size", type=int, default=16)
    args = ap.parse_args(argv)
    if args.batches < 1 or args.batch_size < 1:
        ap.error("--batches and --batch-size must be >= 1")
    san.taylor_attention = recording_taylor(san.taylor_attention)
    for path in args.checkpoints:
        measure(path, args.val_data, args.batches, args.batch_size)
    return 0


if __name__ == "__main__":
    sys.exit(main())
