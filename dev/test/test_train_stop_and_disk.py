"""A training run stopped by a signal, and checkpoints that cannot be written (the host
train_san of TRAIN_SAN_BIN, which `make test` sets; llmc/train/stop_signal.h, llmc/utils.h).

- SIGINT after the first steps: the run finishes its step, writes step_K.bin, exits with
  130; resumed from that file it ends byte for byte where an uninterrupted run ends (which
  saved nothing on the way) and prints the same samples after step K (attnref/ckpt_diff.py
  compares the final states too). SIGTERM: the same, exit 143; SIGHUP (a closed terminal):
  exit 129. Without --checkpoint-dir: a
  clean exit that says nothing was saved.
- Over 2 ranks (scripts/mpirun.sh; skipped without MPI): SIGTERM to mpirun and to every rank
  at once (what pkill, Slurm's time limit and a Ctrl-C to the process group do: each rank gets
  the signal twice, once from the launcher) saves step_K.bin with no .tmp left, the hint names
  `mpirun -np 2`, and the resumed run ends where the uninterrupted 2-rank run ends; SIGINT to
  rank 1 alone stops both ranks after the same step (exit 130, one checkpoint); kill -9 of one
  rank ends the job within seconds, naming the killed rank.
- A save has no side effect: with --save-every the samples and the final state are those
  of the run without it.
- A checkpoint directory that cannot be written is refused before training starts.
- A disk that fills up while a checkpoint is written (a small tmpfs where this process may
  mount one, else a file-size limit, RLIMIT_FSIZE) stops the run with the file and the
  reason named, leaves no partial file behind, and the checkpoint that was already under
  the final name is untouched.
- A log that fails midway (its disk full: a tmpfs sized to fill after a few records, skipped
  where this process may not mount one; or a pipe whose reader closed) with the default
  --save-every 0: the run saves step_K.bin of the steps it trained before it stops, names the
  log, the reason and the command that continues, which ends where the straight run ends; in
  the same log, the record the disk cut short stays a line of its own, and study/runs.py reads
  every step once (but step K, whose record did not fit).
- --save-minutes: a run killed with kill -9 (nothing saves on the way out) keeps its newest
  timed checkpoint, one file (each replaces the one before), which resumes to the straight
  run's end; a run that finishes keeps final.bin alone.
Cost: ~24 runs of a few tiny-preset steps each, ~30 s on 2 cores."""
import json
import math
import os
import resource
import sys
import shutil
import signal
import subprocess

import numpy as np
import pytest

from trainer_cli import BOS, MPIRUN, ROOT, VOCAB, hangup_ends, run_binary, state_differences
from attnref import ckpt_diff
from attnref.shards import write_shard

BIN = os.environ.get("TRAIN_SAN_BIN")
pytestmark = pytest.mark.skipif(not BIN, reason="TRAIN_SAN_BIN not set (make test sets it)")
# make sets HAS_MPIRUN=0 when mpirun or the MPI build is missing
HAS_MPI = os.environ.get("HAS_MPIRUN", "1" if shutil.which("mpirun") else "0") == "1"
needs_mpi = pytest.mark.skipif(not HAS_MPI, reason="mpirun or an MPI build missing")

STEPS = 12


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    rng = np.random.default_rng(1)
    d = tmp_path_factory.mktemp("data")
    tokens = []
    for _ in range(300):
        tokens += [BOS] + list(rng.integers(3, VOCAB, size=20))
    write_shard(d / "toy_train_000000.bin", np.array(tokens, dtype=np.int64))
    return d


def args(data, ckpt_dir, steps=STEPS):
    a = ["--preset", "tiny", "--train-data", str(data / "toy_train_*.bin"), "--batch-size", "4",
         "--sample-tokens", "0", "--optimizer", "adamw", "--lr", "3e-3", "--log-every", "1", "--steps", str(steps)]
    return a + (["--checkpoint-dir", str(ckpt_dir)] if ckpt_dir is not None else [])


def run(a, check=True, **kw):
    return run_binary(BIN, a, check, **kw)


def interrupted_run(a, sig):
    """Starts the trainer, sends `sig` once the first step's progress line is out; returns
    (exit status, stdout, stderr)."""
    a = [str(x) for x in a]
    if not any(x.startswith("--run-dir") for x in a):
        a.append("--run-dir=")  # (as trainer_cli.run_binary: the outputs are the test's)
    proc = subprocess.Popen([os.path.join(ROOT, BIN)] + a, cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, preexec_fn=hangup_ends)
    out = []
    for line in proc.stdout:
        out.append(line)
        if line.startswith("step ") and "/" in line.split("|")[0]:
            proc.send_signal(sig)
            break
    rest, err = proc.communicate(timeout=300)
    return proc.returncode, "".join(out) + rest, err


def saved_step(out):
    """K of the step_K.bin the interrupted run names for --resume."""
    line = [l for l in out.splitlines() if "continue with: " in l and " --resume " in l]
    assert line, out
    name = os.path.basename(line[-1].split("--resume ")[1].strip())
    assert name.startswith("step_") and name.endswith(".bin"), line
    return int(name[len("step_"):-len(".bin")])


# a sample every 2 steps, drawn at temperature 1: each one uses the sampling RNG
SAMPLING = ["--sample-every", 2, "--sample-tokens", 8, "--temperature", 1]


def samples(log):
    """{step: sample text} of a run's JSONL log."""
    return {r["step"]: r["sample"] for r in map(json.loads, open(log)) if "sample" in r}


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_signal_saves_a_checkpoint_that_resumes_exactly(data, tmp_path, sig):
    stopped, straight, resumed = tmp_path / "stopped", tmp_path / "straight", tmp_path / "resumed"
    rc, out, err = interrupted_run(args(data, stopped) + SAMPLING, sig)
    assert rc == 128 + sig, (rc, out, err)
    k = saved_step(out)
    assert 1 <= k < STEPS, out
    assert f"stopped after step {k} of {STEPS}" in out
    assert sorted(p.name for p in stopped.iterdir()) == [f"step_{k}.bin"]  # nothing else, no .tmp
    if sig != signal.SIGINT:
        return  # the resume below is the same for both signals; once is enough
    run(args(data, straight) + SAMPLING + ["--log", tmp_path / "straight.jsonl"])
    proc = run(args(data, resumed) + SAMPLING + ["--resume", stopped / f"step_{k}.bin",
                                                 "--log", tmp_path / "resumed.jsonl"])
    assert f"resumed from {stopped / f'step_{k}.bin'} at step {k}" in proc.stdout
    assert state_differences(straight / "final.bin", resumed / "final.bin") == []
    after = samples(tmp_path / "resumed.jsonl")
    assert after and min(after) > k and all(after[s] == samples(tmp_path / "straight.jsonl")[s] for s in after)


def test_a_save_changes_nothing_of_the_run(data, tmp_path):
    run(args(data, tmp_path / "plain") + SAMPLING + ["--log", tmp_path / "plain.jsonl"])
    run(args(data, tmp_path / "saving") + SAMPLING + ["--save-every", 3, "--log", tmp_path / "saving.jsonl"])
    assert samples(tmp_path / "plain.jsonl") == samples(tmp_path / "saving.jsonl")
    assert len(samples(tmp_path / "plain.jsonl")) == STEPS // 2
    # the files differ in run.save_every and the outputs' places alone, which the comparison leaves out
    assert state_differences(tmp_path / "plain" / "final.bin", tmp_path / "saving" / "final.bin") == []
    keys = ckpt_diff.differences(tmp_path / "plain" / "final.bin", tmp_path / "saving" / "final.bin", all_keys=True)
    # (and in the provenance of each run: its command line, its config, its start time, its id)
    provenance = {"key run.command", "key run.config", "key run.started", "key run.id"}
    assert [k.split(":")[0] for k in keys if k.split(":")[0] not in provenance] == [
        "key run.checkpoint_dir", "key run.log", "key run.save_every"]


def test_signal_without_checkpoint_dir_stops_cleanly(data):
    rc, out, err = interrupted_run(args(data, None), signal.SIGINT)
    assert rc == 130, (rc, out, err)
    assert "no --checkpoint-dir, so nothing was saved" in out
    assert "error" not in err


def can_mount_tmpfs(tmp_path):
    if shutil.which("mount") is None or shutil.which("umount") is None:
        return False
    probe = tmp_path / "probe"
    probe.mkdir()
    ok = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(probe)], capture_output=True).returncode == 0
    if ok:
        subprocess.run(["umount", str(probe)], check=True)
    return ok


@pytest.fixture
def mounted(tmp_path):
    """mounted(options) -> a fresh tmpfs directory with those mount options (unmounted after)."""
    points = []

    def mount(options):
        d = tmp_path / f"mnt{len(points)}"
        d.mkdir()
        subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(d)], check=True, capture_output=True)
        points.append(d)
        return d
    yield mount
    for d in points:
        subprocess.run(["umount", str(d)], check=False)


def test_unwritable_checkpoint_dir_is_refused_at_start(data, tmp_path, mounted):
    if can_mount_tmpfs(tmp_path):
        d = mounted("ro,size=64k")  # read-only even for root
    elif os.geteuid() != 0:
        d = tmp_path / "readonly"
        d.mkdir()
        d.chmod(0o555)
    else:
        pytest.skip("root without mount: no directory here is unwritable")
    proc = run(args(data, d), check=False)
    assert proc.returncode == 1
    assert f"--checkpoint-dir '{d}': cannot write there" in proc.stderr
    assert not [l for l in proc.stdout.splitlines() if l.startswith("step ")]  # refused before training


def test_full_disk_stops_and_keeps_the_previous_checkpoint(data, tmp_path, mounted):
    ref = tmp_path / "ref"
    run(args(data, ref, steps=2))
    size = (ref / "final.bin").stat().st_size
    previous = b"the checkpoint an earlier run left here\n"
    limit = size // 2
    if can_mount_tmpfs(tmp_path):
        d = mounted(f"size={limit}")
        preexec = None
    else:  # a file-size limit instead: writes past it fail with EFBIG (SIGXFSZ ignored)
        d = tmp_path / "limited"
        d.mkdir()

        def preexec():
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    (d / "final.bin").write_bytes(previous)
    # (--overwrite 1: a fresh run is refused a directory that holds a final.bin otherwise)
    proc = run(args(data, d, steps=2) + ["--overwrite", "1"], check=False, preexec_fn=preexec)
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    assert f"file '{d}/final.bin.tmp': failed to" in proc.stderr
    assert "No space left on device" in proc.stderr or "File too large" in proc.stderr, proc.stderr
    assert (d / "final.bin").read_bytes() == previous
    assert sorted(p.name for p in d.iterdir()) == ["final.bin"]  # the partial temporary file is gone
    assert f"(the run stops; it saved no checkpoint before: start it again with room under --checkpoint-dir {d})" \
        in proc.stderr, proc.stderr


def test_a_full_disk_at_a_later_checkpoint_names_the_command_that_continues(data, tmp_path, mounted):
    """Room for one checkpoint, not two: the second save fails, naming the first and the command
    that continues from it; that command, once the disk has room, ends where a straight run does."""
    ref = tmp_path / "ref"
    run(args(data, ref, steps=4))
    if not can_mount_tmpfs(tmp_path):
        pytest.skip("needs a tmpfs (mount)")
    d = mounted(f"size={(ref / 'final.bin').stat().st_size * 3 // 2}")
    proc = run(args(data, d, steps=4) + ["--save-every", "2"], check=False)
    assert proc.returncode == 1 and "No space left on device" in proc.stderr, (proc.stdout, proc.stderr)
    command = f"{os.path.join(ROOT, BIN)} --resume {d}/step_2.bin"
    assert f"(the run stops; once {d} has room, continue from {d}/step_2.bin with: {command})" in proc.stderr, proc.stderr
    shutil.move(d / "step_2.bin", tmp_path / "step_2.bin")  # (room: the checkpoint moves to a disk that has it)
    run(["--resume", tmp_path / "step_2.bin", "--checkpoint-dir", tmp_path / "rest"])
    assert state_differences(ref / "final.bin", tmp_path / "rest" / "final.bin") == []


LONG = 40  # (steps enough for a log of a few pages)


def step_files(d):
    return sorted(int(p.name[len("step_"):-len(".bin")]) for p in d.glob("step_*.bin"))


def resumes_to_the_straight_end(data, tmp_path, ckpt, k, steps, log=None):
    """step_K.bin in `ckpt` resumed to the end (logging to `log`, or a file of its own): the
    straight run's final state."""
    run(["--resume", ckpt / f"step_{k}.bin", "--log", log or tmp_path / "rest.jsonl"])
    run(args(data, tmp_path / "straight", steps))
    return state_differences(tmp_path / "straight" / "final.bin", ckpt / "final.bin") == []


def test_a_full_disk_under_the_log_saves_the_steps_first(data, tmp_path, mounted):
    from study import runs as run_files
    if not can_mount_tmpfs(tmp_path):
        pytest.skip("cannot mount a tmpfs here (a full disk needs one; the closed pipe below fails the same write)")
    ckpt = tmp_path / "ckpt"
    # a disk that holds the log's first step records and not the whole log: its size after each
    # line, from the same run logged to a file (paths of the same length), in whole pages
    same = tmp_path / "same"
    run(args(data, same, LONG) + ["--log", same / "log.jsonl"])
    ends = [len(line) for line in open(same / "log.jsonl", "rb")]
    ends = [sum(ends[:i + 1]) for i in range(len(ends))]
    page = os.sysconf("SC_PAGE_SIZE")
    size = page * math.ceil(ends[3] / page)  # (the run record and 3 step records fit)
    assert size < ends[-1], f"the log ({ends[-1]} bytes) fits {size}: raise LONG"
    disk = mounted(f"size={size + page}")  # (and the log's lock file, .log.jsonl.lock, a page of its own)
    proc = run(args(data, ckpt, LONG) + ["--log", disk / "log.jsonl"], check=False)
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    (k,) = step_files(ckpt)
    logged = [json.loads(line)["step"] for line in open(disk / "log.jsonl") if line.endswith("}\n") and '"loss"' in line]
    assert k == logged[-1] + 1, (k, logged)  # step K's record is the one that did not fit
    assert (f"--log {disk}/log.jsonl: cannot write to the log: No space left on device; the run stops (its log would "
            f"be incomplete); continue from {ckpt}/step_{k}.bin with: {os.path.join(ROOT, BIN)} --resume "
            f"{ckpt}/step_{k}.bin --log {disk}/log.jsonl") in proc.stderr, proc.stderr  # (a log outside: named)
    # room again (the log copied off the full disk): the resume goes on in the log, after the
    # record the disk cut short, which stays a line of its own
    log = tmp_path / "log.jsonl"
    shutil.copy(disk / "log.jsonl", log)
    assert resumes_to_the_straight_end(data, tmp_path, ckpt, k, LONG, log)
    records = []
    for line in open(log):
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            records.append(None)
    assert records.count(None) <= 1 and sum(1 for r in records if r and "run" in r) == 2, records
    assert {"step": k, "resume": str(ckpt / f"step_{k}.bin")} in records
    # (every step once, but step K's record: the one the disk could not hold, after which K was
    # saved; or with it, when the disk filled on its newline alone: the resume ends that line)
    steps = [r["step"] for r in run_files.step_records(log) if "loss" in r]
    assert steps in ([s for s in range(1, LONG + 1) if s != k], list(range(1, LONG + 1))), (k, steps)


def test_a_log_pipe_that_closes_saves_the_steps_first(data, tmp_path):
    ckpt, fifo = tmp_path / "ckpt", tmp_path / "log.fifo"
    os.mkfifo(fifo)
    proc = subprocess.Popen([os.path.join(ROOT, BIN)] + [str(x) for x in args(data, ckpt, LONG) + ["--log", fifo, "--run-dir="]],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    with open(fifo) as reader:  # (opens once the trainer opens its log)
        for line in reader:
            if '"loss"' in line and json.loads(line)["step"] == 3:
                break
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 1, (proc.returncode, out, err)  # (killed by SIGPIPE: -13, nothing saved)
    (k,) = step_files(ckpt)
    assert k >= 3 and f"cannot write to the log: Broken pipe; the run stops" in err, err
    assert f"; continue from {ckpt}/step_{k}.bin with: " in err, err
    assert resumes_to_the_straight_end(data, tmp_path, ckpt, k, LONG)


@needs_mpi
def test_a_log_pipe_that_closes_saves_the_steps_first_on_two_ranks(data, tmp_path):
    # (issue 53: over several ranks rank 0 stopped at once, saving nothing: the save is a collective)
    ckpt, fifo = tmp_path / "ckpt", tmp_path / "log.fifo"
    os.mkfifo(fifo)
    proc = subprocess.Popen([MPIRUN, "-np", "2", os.path.join(ROOT, BIN)]
                            + [str(x) for x in args(data, ckpt, LONG) + ["--log", fifo, "--run-dir="]],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    with open(fifo) as reader:
        for line in reader:
            if '"loss"' in line and json.loads(line)["step"] == 3:
                break
    out, err = proc.communicate(timeout=300)
    assert proc.returncode != 0, (out, err)
    (k,) = step_files(ckpt)  # every rank saved the step in which rank 0's write failed
    assert 3 <= k < LONG and "cannot write to the log: Broken pipe; the run stops" in err, err
    assert (f"; continue from {ckpt}/step_{k}.bin with: mpirun -np 2 {os.path.join(ROOT, BIN)} --resume "
            f"{ckpt}/step_{k}.bin --log {fifo}") in err, err
    resumed = run(["--resume", ckpt / f"step_{k}.bin", "--log", tmp_path / "rest.jsonl"], ranks=2)
    assert resumed.returncode == 0 and (ckpt / "final.bin").exists()


def test_timed_saves_bound_what_kill_9_loses(data, tmp_path):
    ckpt = tmp_path / "ckpt"
    every_step = ["--save-minutes", "1e-9"]  # (each step ends that long after the last save)
    proc = subprocess.Popen([os.path.join(ROOT, BIN)] + [str(x) for x in args(data, ckpt, LONG) + every_step + ["--run-dir="]],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for line in proc.stdout:
        if line.startswith("step ") and line.split("|")[0].split()[1] == f"6/{LONG}":  # step 5 is saved
            proc.kill()
            break
    proc.communicate(timeout=60)
    saved = step_files(ckpt)
    # the newest, and the one before it only while the newest was being written
    assert 1 <= len(saved) <= 2 and saved[0] >= 5, saved
    assert resumes_to_the_straight_end(data, tmp_path, ckpt, saved[-1], LONG)
    finished = run(args(data, tmp_path / "finished") + every_step)
    assert sorted(p.name for p in (tmp_path / "finished").iterdir()) == ["final.bin"]
    assert f"removed {tmp_path}/finished/step_{STEPS - 1}.bin (the timed save before final.bin)" in finished.stdout


def test_a_resumed_log_reads_as_the_straight_runs(data, tmp_path):
    """A run killed (SIGKILL: no save) after step 7 of 12, having saved at step 4, resumed from
    step_4.bin with the same --log: the log holds steps 5-7 twice, and the resume record makes
    study/runs.py read it as the straight run's log (losses, validations, samples)."""
    from study import runs as run_files
    a = args(data, tmp_path / "ckpt") + SAMPLING + ["--save-every", 4, "--val-every", 3, "--val-data",
                                                     str(data / "toy_train_*.bin"), "--val-batches", 1]
    proc = subprocess.Popen([os.path.join(ROOT, BIN)] + [str(x) for x in a + ["--log", tmp_path / "cut.jsonl"]],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for line in proc.stdout:
        if line.startswith("step ") and line.split("|")[0].split()[1] == f"8/{STEPS}":  # step 7's records are out
            proc.kill()
            break
    proc.communicate(timeout=60)
    cut = [json.loads(l) for l in open(tmp_path / "cut.jsonl")]
    assert max(r["step"] for r in cut if "step" in r) >= 7, cut[-3:]
    run(a[:a.index("--checkpoint-dir")] + SAMPLING + ["--resume", tmp_path / "ckpt" / "step_4.bin", "--checkpoint-dir",
        tmp_path / "ckpt2", "--log", tmp_path / "cut.jsonl"])
    run(a + ["--checkpoint-dir", tmp_path / "straight", "--log", tmp_path / "straight.jsonl"])
    raw = [json.loads(l) for l in open(tmp_path / "cut.jsonl")]
    assert {"step": 4, "resume": str(tmp_path / "ckpt" / "step_4.bin")} in raw
    assert sum(1 for r in raw if r.get("step") == 6 and "sample" in r) == 2     # logged twice ...
    without_clock = lambda recs: [{k: v for k, v in r.items() if k not in ("ms", "tok_s", "resume")}  # noqa: E731
                                  for r in recs if "resume" not in r]
    assert without_clock(run_files.step_records(tmp_path / "cut.jsonl")) == \
        without_clock(run_files.step_records(tmp_path / "straight.jsonl"))         # ... read once


# ---- stops over 2 ranks ---------------------------------------------------------------------
MPI_STEPS = 40  # (a stop lands after the first few steps: the signal goes out with step 1's line)


def descendants(pid):
    """The pids of every process below `pid` (scripts/mpirun.sh, then mpirun, then the ranks)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        try:
            kids = [int(k) for k in open(f"/proc/{p}/task/{p}/children").read().split()]
        except OSError:
            kids = []
        out += kids
        todo += kids
    return out


def rank_pids(launcher):
    """{rank: pid} of the ranks below the launcher (each with OMPI_COMM_WORLD_RANK)."""
    for _ in range(100):
        ranks = {}
        for pid in descendants(launcher.pid):
            try:
                env = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
            except OSError:
                continue
            rank = [e.split(b"=", 1)[1] for e in env if e.startswith(b"OMPI_COMM_WORLD_RANK=")]
            if rank:
                ranks[int(rank[0])] = pid
        if len(ranks) == 2:
            return ranks
    raise AssertionError(f"mpirun {launcher.pid}: ranks not found")


def interrupted_ranks(a, interrupt):
    """Starts a 2-rank run, calls interrupt(launcher, {rank: pid}) once step 1's progress line is
    out; returns (exit status, stdout, stderr)."""
    proc = subprocess.Popen([MPIRUN, "-np", "2", os.path.join(ROOT, BIN)] + [str(x) for x in a] + ["--run-dir="],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out = []
    for line in proc.stdout:
        out.append(line)
        if line.startswith("step ") and "/" in line.split("|")[0]:
            interrupt(proc, rank_pids(proc))
            break
    rest, err = proc.communicate(timeout=60)  # (a hang fails here)
    return proc.returncode, "".join(out) + rest, err


@needs_mpi
def test_sigterm_to_mpirun_and_every_rank_saves_and_resumes_exactly(data, tmp_path):
    stopped, straight, resumed = tmp_path / "stopped", tmp_path / "straight", tmp_path / "resumed"

    def everyone(launcher, ranks):
        for pid in [launcher.pid] + list(ranks.values()):
            os.kill(pid, signal.SIGTERM)
    rc, out, err = interrupted_ranks(args(data, stopped, MPI_STEPS), everyone)
    assert rc != 0, (rc, out, err)  # (mpirun, itself signalled, exits 1; an unfinished run in any case)
    k = saved_step(out)
    assert 1 <= k < MPI_STEPS, out
    assert f"continue with: mpirun -np 2 {os.path.join(ROOT, BIN)} --resume {stopped}/step_{k}.bin" in out
    assert sorted(p.name for p in stopped.iterdir()) == [f"step_{k}.bin"]  # complete, no .tmp
    run(args(data, straight, MPI_STEPS), ranks=2)
    run(args(data, resumed, MPI_STEPS) + ["--resume", stopped / f"step_{k}.bin"], ranks=2)
    assert state_differences(straight / "final.bin", resumed / "final.bin") == []


@needs_mpi
def test_sigint_to_one_rank_stops_both_after_the_same_step(data, tmp_path):
    rc, out, err = interrupted_ranks(args(data, tmp_path, MPI_STEPS), lambda _, ranks: os.kill(ranks[1], signal.SIGINT))
    assert rc == 130, (rc, out, err)
    k = saved_step(out)
    assert f"Interrupt: stopped after step {k} of {MPI_STEPS}; continue with: mpirun -np 2 " in out
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"step_{k}.bin"]
    assert "error" not in err


@needs_mpi
def test_kill_9_of_one_rank_ends_the_job_with_an_error(data, tmp_path):
    rc, out, err = interrupted_ranks(args(data, tmp_path, MPI_STEPS), lambda _, ranks: os.kill(ranks[1], signal.SIGKILL))
    assert rc != 0
    assert "rank 1" in out + err and "signal 9" in out + err, (out, err)
    # (no checkpoint was due: nothing half-written either; rank 0's lock file may stay, holding no lock)
    assert [p.name for p in tmp_path.iterdir() if p.name != ".lock"] == []
