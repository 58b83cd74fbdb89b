"""Ctrl-C as a user meets it (the host train_san of TRAIN_SAN_BIN; llmc/train/stop_signal.h):

- No thread but the one that waits for them can take SIGINT or SIGTERM: every thread of a
  training process blocks both (read from /proc). A signal handler that ran on a compute
  thread, inside oneDNN's GEMM kernels, lost gradients to NaN or corrupted the heap.
- The first Ctrl-C says at once, before the step in progress ends, which step the run stops
  after and which file it saves.
- A second Ctrl-C ends the process at once (killed by SIGINT), saying which steps are lost and
  the command that continues from the newest checkpoint, which then works.
- After a stop, the refusals agree: a fresh run into the run directory is refused with the
  one command that continues it (if a checkpoint exists), or told that nothing can be
  continued (if none was saved), never sent to a --resume that fails.
- `./train_san ... 2>&1 | tee train.log`, then Ctrl-C: the same Ctrl-C ends tee, so the
  trainer's output has no reader; it still saves and exits with 130 (not killed by SIGPIPE),
  and its --log holds every step up to the saved one.
- A closed terminal (SIGHUP) stops as SIGTERM does, saving, also when the hang-up comes twice
  (the shell passes its own on, and the kernel signals the foreground group); a run started
  under nohup (SIGHUP ignored) trains on through it.
Cost: 10 short runs of the tiny preset, ~30 s on 2 cores."""
import json
import os
import signal
import subprocess
import sys

import numpy as np
import pytest

from trainer_cli import BOS, ROOT, VOCAB, hangup_ends, run_binary
from attnref.shards import write_shard

BIN = os.environ.get("TRAIN_SAN_BIN")
pytestmark = [pytest.mark.skipif(not BIN, reason="TRAIN_SAN_BIN not set (make test sets it)"),
              pytest.mark.skipif(sys.platform != "linux", reason="reads /proc")]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    rng = np.random.default_rng(2)
    d = tmp_path_factory.mktemp("data")
    tokens = []
    for _ in range(4000):
        tokens += [BOS] + list(rng.integers(3, VOCAB, size=20))
    write_shard(d / "toy_train_000000.bin", np.array(tokens, dtype=np.int64))
    return d


def args(data, run_dir, batch=256, extra=()):
    """A run of steps long enough (~0.1-0.3 s) for a signal to land inside one."""
    return [str(a) for a in ["--preset", "tiny", "--train-data", data / "toy_train_*.bin", "--batch-size", batch,
                             "--sample-tokens", 0, "--val-every", 0, "--optimizer", "adamw", "--lr", "3e-3",
                             "--log-every", 1, "--steps", 400, "--run-dir", run_dir, *extra]]


class Trainer:
    """A training process whose stdout is read line by line."""

    def __init__(self, a, env=None, **kw):
        kw.setdefault("stderr", subprocess.PIPE)
        kw.setdefault("preexec_fn", hangup_ends)
        self.proc = subprocess.Popen([os.path.join(ROOT, BIN)] + a, cwd=ROOT, stdout=subprocess.PIPE,
                                     text=True, env=env, **kw)
        self.lines = []

    def read_until(self, predicate):
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))
            if predicate(self.lines[-1]):
                return self.lines[-1]
        raise AssertionError("the run ended first:\n" + "\n".join(self.lines) + self.proc.stderr.read())

    def finish(self):
        rest, err = self.proc.communicate(timeout=300)
        self.lines += rest.splitlines()
        return self.proc.returncode, "\n".join(self.lines), err


def is_step_line(line, n=None):
    return line.startswith("step ") and (n is None or line.split("/")[0].split()[-1] == str(n))


def thread_masks(pid):
    """[(thread id, the signals it blocks, whether it waits in sigwait)] from /proc/PID/task."""
    out = []
    for tid in sorted(os.listdir(f"/proc/{pid}/task"), key=int):
        try:
            with open(f"/proc/{pid}/task/{tid}/status") as f:
                mask = next(int(l.split()[1], 16) for l in f if l.startswith("SigBlk:"))
            with open(f"/proc/{pid}/task/{tid}/wchan") as f:
                waiting = "sigtimedwait" in f.read()
        except (FileNotFoundError, ProcessLookupError):
            continue  # (a thread that ended meanwhile)
        out.append((int(tid), {s for s in range(1, 65) if mask >> (s - 1) & 1}, waiting))
    return out


def test_every_thread_the_trainer_starts_blocks_the_stop_signals(data, tmp_path):
    # Two host-backend workers and two OpenMP threads for oneDNN. The thread in sigwait (which
    # unblocks what it waits for while it waits) is the first the trainer starts; the threads
    # before it are the libraries' own (OpenBLAS starts its pool when it loads), whose signal
    # the handler passes on. Thread ids grow in a fresh process.
    env = dict(os.environ, HOSTCUDA_THREADS="2", OMP_NUM_THREADS="2")
    t = Trainer(args(data, tmp_path / "run", batch=64), env=env)
    t.read_until(lambda l: is_step_line(l, 3))
    threads = thread_masks(t.proc.pid)
    t.proc.send_signal(signal.SIGINT)
    rc, out, err = t.finish()
    taker = [tid for tid, _, waiting in threads if waiting]
    assert len(taker) == 1, threads
    started = [(tid, mask) for tid, mask, _ in threads if tid > taker[0]]
    assert started, threads  # the host backend's worker at least
    assert all({signal.SIGINT, signal.SIGTERM} <= mask for _, mask in started), threads
    assert {signal.SIGINT, signal.SIGTERM} <= threads[0][1], threads  # the main thread
    assert rc == 128 + signal.SIGINT, (rc, out, err)


def test_the_first_ctrl_c_says_at_once_what_it_saves(data, tmp_path):
    run_dir = tmp_path / "run"
    t = Trainer(args(data, run_dir))
    t.read_until(lambda l: is_step_line(l, 2))
    t.proc.send_signal(signal.SIGINT)
    note = t.read_until(lambda l: l.strip() != "")
    rc, out, err = t.finish()
    assert rc == 128 + signal.SIGINT, (rc, out, err)
    # said when the signal came: during step 3 mostly, before that step's progress line (or
    # just after step 2's line, when the run stops after step 2), and the stop agrees
    assert note.startswith("Interrupt: stopping after step "), out
    n = int(note.split("stopping after step ")[1].split()[0])
    before = t.lines[:t.lines.index(note)]
    assert n >= 2 and not any(is_step_line(l, n + 1) for l in t.lines), out
    assert n == 2 or not any(is_step_line(l, n) for l in before), out
    assert not any(l.startswith("saved ") for l in before), out
    assert f"saving {run_dir}/step_{n}.bin" in note and "again: stop at once, without saving" in note
    assert f"stopped after step {n} of 400" in out and os.path.exists(run_dir / f"step_{n}.bin")


def test_a_second_ctrl_c_ends_at_once_and_says_what_is_lost(data, tmp_path):
    run_dir = tmp_path / "run"
    t = Trainer(args(data, run_dir, extra=["--save-every", 2]))
    t.read_until(lambda l: l.startswith(f"saved {run_dir}/step_2.bin"))
    t.proc.send_signal(signal.SIGINT)
    first = t.read_until(lambda l: "stopping after step" in l)
    n = int(first.split("stopping after step ")[1].split()[0])
    t.proc.send_signal(signal.SIGINT)
    rc, out, err = t.finish()
    if f"saved {run_dir}/step_{n}.bin" in out:
        pytest.skip("the step ended before the second signal came (a very fast machine)")
    assert rc == -signal.SIGINT, (rc, out, err)  # the signal's default action: killed by it
    saved = sorted(int(p.name[5:-4]) for p in run_dir.glob("step_*.bin"))
    assert saved and saved[-1] < n, saved
    k = saved[-1]
    lost = f"steps {k + 1}..{n} are lost" if n > k + 1 else f"step {n} is lost"
    note = next(l for l in t.lines if l.startswith("Interrupt again: "))
    assert note == (f"Interrupt again: stopped without saving; {lost}; continue from step {k} with: "
                    f"{os.path.join(ROOT, BIN)} --resume {run_dir}"), out
    # the command it gives continues the run from step k
    resumed = Trainer(note.split("with: ")[1].split()[1:])
    line = resumed.read_until(lambda l: l.startswith("resumed from "))
    resumed.proc.send_signal(signal.SIGTERM)
    resumed.finish()
    assert f"{run_dir}/step_{k}.bin at step {k}" in line, line


def test_the_refusals_after_a_stop_agree(data, tmp_path):
    saved_dir, unsaved_dir = tmp_path / "saved", tmp_path / "unsaved"
    t = Trainer(args(data, saved_dir))
    t.read_until(lambda l: is_step_line(l, 1))
    t.proc.send_signal(signal.SIGINT)
    rc, out, _ = t.finish()
    assert rc == 128 + signal.SIGINT
    hint = next(l for l in out.splitlines() if "continue with: " in l).split("continue with: ")[1]
    assert hint == f"{os.path.join(ROOT, BIN)} --resume {saved_dir}"
    again = run_binary(BIN, args(data, saved_dir), check=False)
    assert again.returncode != 0 and f"continue it with: {hint};" in again.stderr, again.stderr
    # a run stopped before its first checkpoint (a second Ctrl-C): nothing to continue
    t = Trainer(args(data, unsaved_dir))
    t.read_until(lambda l: is_step_line(l, 1))
    t.proc.send_signal(signal.SIGINT)
    t.read_until(lambda l: "stopping after step" in l)
    t.proc.send_signal(signal.SIGINT)
    rc, out, _ = t.finish()
    if list(unsaved_dir.glob("step_*.bin")):
        pytest.skip("the step ended before the second signal came (a very fast machine)")
    assert rc == -signal.SIGINT and "(the run saved no checkpoint)" in out, out
    again = run_binary(BIN, args(data, unsaved_dir), check=False)
    assert again.returncode != 0 and "saved no checkpoint" in again.stderr and "--resume" not in again.stderr, \
        again.stderr


def saved_steps(run_dir):
    return sorted(int(p.name[len("step_"):-len(".bin")]) for p in run_dir.glob("step_*.bin"))


def logged_steps(log):
    return [r["step"] for r in map(json.loads, open(log)) if "loss" in r]


def test_ctrl_c_through_tee_still_saves(data, tmp_path):
    run_dir, log = tmp_path / "run", tmp_path / "log.jsonl"
    # `2>&1 | tee`: both streams into one pipe, whose reader the same Ctrl-C ends
    t = Trainer(args(data, run_dir, extra=["--log", log]), stderr=subprocess.STDOUT)
    t.read_until(lambda l: is_step_line(l, 2))
    t.proc.stdout.close()  # tee is gone: the stop's note is the first write without a reader
    t.proc.send_signal(signal.SIGINT)
    rc = t.proc.wait(timeout=300)
    assert rc == 128 + signal.SIGINT, rc  # (on a SIGPIPE: -13, and nothing saved)
    saved = saved_steps(run_dir)
    assert len(saved) == 1 and saved[0] >= 2, saved
    assert logged_steps(log) == list(range(1, saved[0] + 1))


def test_a_hangup_saves_also_when_it_comes_twice(data, tmp_path):
    run_dir = tmp_path / "run"
    t = Trainer(args(data, run_dir))
    t.read_until(lambda l: is_step_line(l, 2))
    t.proc.send_signal(signal.SIGHUP)
    note = t.read_until(lambda l: "stopping after step" in l)
    t.proc.send_signal(signal.SIGHUP)
    rc, out, err = t.finish()
    n = int(note.split("stopping after step ")[1].split()[0])
    assert note.startswith("Hangup: stopping after step "), out
    assert rc == 128 + signal.SIGHUP, (rc, out, err)
    assert saved_steps(run_dir) == [n], out
    assert f"Hangup: stopped after step {n} of 400; continue with: {os.path.join(ROOT, BIN)} --resume {run_dir}" in out


def test_a_run_under_nohup_trains_through_a_hangup(data, tmp_path):
    def nohup():
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
    t = Trainer(args(data, tmp_path / "run"), preexec_fn=nohup)
    t.read_until(lambda l: is_step_line(l, 2))
    t.proc.send_signal(signal.SIGHUP)
    t.read_until(lambda l: is_step_line(l, 4))  # (two steps later: the hang-up stopped nothing)
    t.proc.send_signal(signal.SIGINT)
    rc, out, err = t.finish()
    assert rc == 128 + signal.SIGINT and "Hangup" not in out, (rc, out, err)
