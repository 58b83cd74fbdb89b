"""What a stop keeps under Open MPI's mpirun (issue 53, target 1; doc/multi-gpu.md "Stopping on a
cluster"): SIGTERM to the launcher alone, to the launcher and every rank (a time limit, the terminal's
Ctrl-C), and kill -9 of rank 1, 2 ranks under a launcher script (default scripts/mpirun.sh; give
another, e.g. an older version of it, with --launcher).

Runs train_san (the tiny preset, toy corpus; --slow makes it 3.6M parameters, a step of seconds
here) and signals each trial a random time (0..--jitter s) after its first progress line, mid-step.
What Slurm does after KillWait is done after --kill-wait seconds: SIGKILL to every process left. A
trial is kept when the step in progress was saved (step_N.bin, N >= 2) and the trainer printed the
command that continues. Prints per trial the exit status, the seconds from the signal to the end,
the checkpoints and what was kept, then the counts. A bench run by hand, not a test:

    .venv/bin/python dev/bench/mpirun_stop.py build/host-bf16/train_san --slow [--trials 10] [--how term,all]
    .venv/bin/python dev/bench/mpirun_stop.py OLD/train_san --launcher OLD/scripts/mpirun.sh --slow
"""
import argparse
import glob
import os
import random
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path[:0] = [ROOT, os.path.join(ROOT, "dev", "test")]
from trainer_cli import write_pattern_corpus  # noqa: E402

# 6 layers of d 384 (+ the tied embedding): 3.6M parameters, a step of a few seconds over 2 ranks here
SLOW = ["--n-layer", "6", "--n-embd", "384", "--n-head", "6", "--n-kv-head", "6", "--batch-size", "8", "--seq-len", "64"]


def descendants(pid):
    """Every process below `pid`."""
    out, todo = [], [pid]
    while todo:
        kids = subprocess.run(["pgrep", "-P", str(todo.pop())], capture_output=True, text=True).stdout.split()
        out += [int(k) for k in kids]
        todo += [int(k) for k in kids]
    return out


def rank_pids(launcher_pid):
    """{rank: pid} of the ranks below the launcher."""
    ranks = {}
    for p in descendants(launcher_pid):
        try:
            env = open(f"/proc/{p}/environ", "rb").read().split(b"\0")
        except OSError:
            continue
        for e in env:
            if e.startswith(b"OMPI_COMM_WORLD_RANK="):
                ranks[int(e.split(b"=")[1])] = p
    return ranks


def trial(a, data, ckpt, how):
    cmd = [a.launcher, "-np", "2", a.binary, "--preset", "tiny", "--train-data", os.path.join(data, "toy_train_*.bin"),
           "--sample-tokens", "0", "--steps", "100000", "--run-dir=", "--checkpoint-dir", ckpt,
           "--save-minutes", "0"] + (SLOW if a.slow else [])
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    for line in p.stdout:
        if line.startswith("step"):
            break
    time.sleep(random.uniform(0, a.jitter))
    ranks = rank_pids(p.pid)
    t0 = time.time()
    if how == "kill":
        os.kill(ranks[1], signal.SIGKILL)
    else:
        for pid in [p.pid] + (list(ranks.values()) if how == "all" else []):
            os.kill(pid, signal.SIGTERM)
    killed = False
    try:
        out, _ = p.communicate(timeout=a.kill_wait)
    except subprocess.TimeoutExpired:  # (Slurm's SIGKILL after KillWait)
        killed = True
        os.killpg(p.pid, signal.SIGKILL)
        for pid in descendants(p.pid):
            os.kill(pid, signal.SIGKILL)
        out, _ = p.communicate()
    took = time.time() - t0
    saved = sorted(os.path.basename(x) for x in glob.glob(os.path.join(ckpt, "*.bin")))
    kept = any(s.startswith("step_") for s in saved) and "continue with" in out
    verdict = "" if how == "kill" else ", kept" if kept else ", LOST"  # (kill -9: how soon the job ends)
    return kept, (f"exit {p.returncode}{' (killed after --kill-wait)' if killed else ''}, {took:.1f} s, "
                  f"saved {saved or 'nothing'}{verdict}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("binary")
    ap.add_argument("--launcher", default=os.path.join(ROOT, "scripts", "mpirun.sh"))
    ap.add_argument("--slow", action="store_true", help="3.6M parameters: a step of seconds")
    ap.add_argument("--how", default="term,all", help="term (the launcher alone), all (it and the ranks), kill (kill -9 of rank 1)")
    ap.add_argument("--trials", type=int, default=10)
    ap.add_argument("--jitter", type=float, default=1.0, help="the signal comes 0..S s after the first step line")
    ap.add_argument("--kill-wait", type=float, default=30.0, help="SIGKILL to every process this long after the signal")
    a = ap.parse_args()
    a.binary, a.launcher = os.path.abspath(a.binary), os.path.abspath(a.launcher)
    what = {"term": "SIGTERM to the launcher", "all": "SIGTERM to the launcher and every rank", "kill": "kill -9 of rank 1"}
    with tempfile.TemporaryDirectory() as tmp:
        write_pattern_corpus(tmp, {"toy_train_000000": 400})
        for how in a.how.split(","):
            kept = 0
            for k in range(a.trials):
                ok, text = trial(a, tmp, os.path.join(tmp, f"{how}{k}"), how)
                kept += ok
                print(f"{what[how]}, trial {k + 1}: {text}", flush=True)
            if how != "kill":
                print(f"{what[how]}: kept {kept} of {a.trials}, lost {a.trials - kept}", flush=True)


if __name__ == "__main__":
    main()
