"""What Open MPI's mpirun keeps when it is signalled itself (issue 53, targets 1 and 2): SIGTERM to
mpirun alone (not to the ranks) once the run has printed its first step, and kill -9 of rank 1,
with mpirun's default kill timeout and with `--mca odls_base_sigkill_timeout S`.

Runs train_san (the tiny preset, toy corpus) on 2 ranks under scripts/mpirun.sh and prints, per
trial, the exit status, the seconds from the signal to mpirun's exit, the checkpoints saved and
whether the trainer printed the command that continues. A bench run by hand, not a test:

    .venv/bin/python dev/bench/mpirun_stop.py build/host-bf16/train_san [--timeout 10] [--log-every 1] [--trials 3]
"""
import argparse
import glob
import os
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "test"))
from trainer_cli import MPIRUN, write_pattern_corpus  # noqa: E402


def rank_pids(mpirun_pid, rank):
    """The pids of mpirun's children that are rank `rank`."""
    kids = subprocess.run(["pgrep", "-P", str(mpirun_pid)], capture_output=True, text=True).stdout.split()
    return [int(k) for k in kids if f"OMPI_COMM_WORLD_RANK={rank}".encode() in open(f"/proc/{k}/environ", "rb").read()]


def trial(a, data, ckpt, how):
    mca = ["--mca", "odls_base_sigkill_timeout", str(a.timeout)] if a.timeout is not None else []
    cmd = [MPIRUN] + mca + ["-np", "2", a.binary, "--preset", "tiny", "--train-data", os.path.join(data, "toy_train_*.bin"),
                            "--sample-tokens", "0", "--steps", "100000", "--run-dir=", "--log-every", str(a.log_every),
                            "--checkpoint-dir", ckpt]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for line in p.stdout:
        if line.startswith("step"):
            break
    t0 = time.time()
    if how == "term":
        p.send_signal(signal.SIGTERM)
    else:
        os.kill(rank_pids(p.pid, 1)[0], signal.SIGKILL)
    out, _ = p.communicate(timeout=600)
    saved = sorted(os.path.basename(x) for x in glob.glob(os.path.join(ckpt, "*.bin")))
    return f"exit {p.returncode}, {time.time() - t0:.1f} s, saved {saved or 'nothing'}, hint {'continue with' in out}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("binary")
    ap.add_argument("--timeout", type=int, default=None, help="odls_base_sigkill_timeout (default: mpirun's own)")
    ap.add_argument("--log-every", type=int, default=1)
    ap.add_argument("--trials", type=int, default=3)
    a = ap.parse_args()
    a.binary = os.path.abspath(a.binary)
    with tempfile.TemporaryDirectory() as tmp:
        write_pattern_corpus(tmp, {"toy_train_000000": 400})
        for how in ("term", "kill"):
            for k in range(a.trials):
                what = "SIGTERM to mpirun" if how == "term" else "kill -9 of rank 1"
                print(f"{what}, timeout {a.timeout}, --log-every {a.log_every}: "
                      f"{trial(a, tmp, os.path.join(tmp, f'{how}{k}'), how)}", flush=True)


if __name__ == "__main__":
    main()
