"""A save that does not fit the launcher's grace (issue 53, target 2; doc/multi-gpu.md "Stopping on
a cluster"): trains a large model (default: train_gpt2's 124M GPT-2 with AdamW, B 1 x T 64 on the
toy corpus) with a save every step, prints how long the first saves took (from the step's progress
line to its "saved" line), then sends SIGTERM 1 s into step 3 and SIGKILL
--kill-wait seconds later (Slurm's KillWait), and shows what the stop said, what is on disk, and
what the next start (a resume of the directory) does with it. A bench run by hand, not a test:

    .venv/bin/python dev/bench/big_save_stop.py build/host-bf16/train_gpt2 [--preset gpt2] [--kill-wait 30] [--dir DIR]

DIR (default: a temporary directory beside the repository, on the disk the checkouts are on)
needs room for three checkpoints (~1.5 GB each for 124M).
"""
import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path[:0] = [ROOT, os.path.join(ROOT, "dev", "test")]
from trainer_cli import write_pattern_corpus  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("binary")
    ap.add_argument("--preset", default="gpt2")
    ap.add_argument("--kill-wait", type=float, default=30.0)
    ap.add_argument("--dir", default=None, help="where the checkpoints go (removed after)")
    a = ap.parse_args()
    work = tempfile.mkdtemp(prefix=".big_save_stop.", dir=a.dir or os.path.dirname(ROOT))
    try:
        write_pattern_corpus(work, {"toy_train_000000": 400})
        ckpt = os.path.join(work, "ckpt")
        cmd = [os.path.abspath(a.binary), "--preset", a.preset, "--train-data", os.path.join(work, "toy_train_*.bin"),
               "--batch-size", "1", "--seq-len", "64", "--steps", "5", "--save-every", "1", "--save-minutes", "0",
               "--sample-tokens", "0", "--run-dir=", "--checkpoint-dir", ckpt]
        p = subprocess.Popen(cmd + ["--stop-grace", str(a.kill_wait)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True)
        for line in p.stdout:
            if line.startswith("step "):
                stepped = time.time()
            if line.startswith("saved "):
                took = time.time() - stepped
                mb = os.path.getsize(line.split()[1]) / 1e6
                print(f"{os.path.basename(line.split()[1])}: saved in {took:.1f} s ({mb:.0f} MB, {mb / took:.0f} MB/s)",
                      flush=True)
            if line.startswith("warning: "):
                print(line.strip(), flush=True)
            if line.startswith("saved ") and line.rstrip().endswith("step_2.bin"):
                break
        time.sleep(1.0)  # (into step 3: the stop ends it, then saves it; Slurm's kill follows)
        t0 = time.time()
        p.send_signal(signal.SIGTERM)
        note = ""
        try:
            out, _ = p.communicate(timeout=a.kill_wait)
            killed = False
        except subprocess.TimeoutExpired:
            p.kill()
            out, _ = p.communicate()
            killed = True
        note = next((l for l in out.splitlines() if l.startswith("Terminated: ")), "")
        print(f"SIGTERM, then SIGKILL {a.kill_wait:g} s later: {'killed' if killed else 'ended'} "
              f"{time.time() - t0:.1f} s after the signal", flush=True)
        print("the stop said:", note, flush=True)
        print("on disk:", sorted(n for n in os.listdir(ckpt) if n != ".lock"), flush=True)
        # the next start: what it says up to its resume (then it is stopped: its steps are not the point)
        r = subprocess.Popen([os.path.abspath(a.binary), "--resume", ckpt, "--run-dir="], stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
        said = []
        for line in r.stdout:
            if line.startswith(("removed ", "resumed from ", "error")):
                said.append(line.strip())
            if line.startswith(("resumed from ", "error")):
                break
        print(f"next start (--resume {os.path.basename(ckpt)}):", *said, sep="\n  ", flush=True)
        print("on disk then:", sorted(n for n in os.listdir(ckpt) if n != ".lock"), flush=True)
        r.kill()
        r.communicate()
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
