"""How far 1 rank and 2 ranks apart at the default group count (--grad-groups = the rank count)
and with --grad-groups 2 on both (doc/multi-gpu.md "The same bits on any rank count").

Trains train_san (--preset, default tiny, on the test suite's toy corpus) with the same global batch
on 1 rank x B rows and on 2 ranks x B/2 rows, once with each run's default group count and once
with --grad-groups 2 on both, and prints the largest |difference| of the logged training losses
and the last validation loss. A bench run by hand, not a test (a few minutes on 2 cores):

    .venv/bin/python dev/bench/rank_counts.py build/host-bf16/train_san [--steps 200] [--preset demo]
"""
import argparse
import json
import os
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path[:0] = [ROOT, os.path.join(ROOT, "dev", "test")]  # run as a file: this checkout's attnref, trainer_cli
from trainer_cli import run_binary, write_pattern_corpus  # noqa: E402


def losses(log):
    """({step: training loss}, the last validation loss) of a JSONL log."""
    train, val = {}, None
    for line in open(log):
        r = json.loads(line)
        if "loss" in r and "step" in r:
            train[r["step"]] = r["loss"]
        if "val_loss" in r:
            val = r["val_loss"]
    return train, val


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("binary")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--rows", type=int, default=8, help="global rows per step (even)")
    ap.add_argument("--preset", default="tiny")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        data = write_pattern_corpus(tmp, {"toy_train_000000": 2000, "toy_val_000000": 200})
        common = ["--preset", a.preset, "--train-data", os.path.join(str(data), "toy_train_*.bin"),
                  "--val-data", os.path.join(str(data), "toy_val_*.bin"), "--val-every", a.steps // 4,
                  "--sample-tokens", "0", "--steps", a.steps, "--log-every", a.steps]
        for label, groups in (("default groups (1 rank: 1, 2 ranks: 2)", []), ("--grad-groups 2 on both", ["--grad-groups", 2])):
            runs = []
            for ranks in (1, 2):
                log = os.path.join(tmp, f"r{ranks}{len(groups)}.jsonl")
                run_binary(a.binary, common + groups + ["--batch-size", a.rows // ranks, "--log", log], ranks=ranks,
                           timeout=3600)
                runs.append(losses(log))
            (t1, v1), (t2, v2) = runs
            worst = max(t1, key=lambda s: abs(t1[s] - t2[s]))
            gap = abs(t1[worst] - t2[worst])
            where = (f"{gap:.4f} nats at step {worst} ({t1[worst]:.6f} vs {t2[worst]:.6f})" if gap > 0
                     else "none: every logged loss equal")
            print(f"{label}: --preset {a.preset}, {a.steps} steps of {a.rows} rows; largest |training loss difference| {where}; "
                  f"last validation loss {v1:.6f} vs {v2:.6f}", flush=True)


if __name__ == "__main__":
    main()
