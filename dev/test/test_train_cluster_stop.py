"""A stop on a cluster saves (issue 53, targets 1 and 2; doc/multi-gpu.md "Stopping on a cluster";
the host train_san of TRAIN_SAN_BIN, which `make test` sets).

- SIGTERM to scripts/mpirun.sh alone, in the middle of a step of seconds on 2 ranks (skipped
  without MPI): the launcher passes the stop on as SIGUSR1, which mpirun does not follow with a
  kill; the step ends and is saved before any process is killed: step_K.bin, K >= 2, no .tmp,
  exit 143 and the command that continues. (Plain mpirun passes SIGTERM on and kills the ranks
  1 s later, in the middle of the step: nothing saved.) A second SIGTERM to the launcher stops at
  once, saving nothing.
- SIGUSR1 (Slurm's --signal=USR1@S, the launcher's copy) stops one process as SIGTERM does:
  the step is saved, exit 138; the note says whether the step and the last save fit in
  --stop-grace; a save longer than --stop-grace warns once; a --stop-grace below 0 is refused,
  naming it.
- The stop notes, set at every step, look up no file: a run of 12 steps makes as many path
  look-ups (open, stat, readlink, directory listings: strace) as one of 6 with the same saves
  (skipped without strace).
- A save killed with kill -9 in the middle leaves step_K.bin.tmp beside the whole checkpoint
  before it: the next start (here a resume of the directory) removes the .tmp, naming it, and
  continues from that checkpoint to the straight run's end.
- Ctrl-C of `python -m study run` of a `gpus = 2` study in the middle of a step of seconds: the
  runner passes the stop on to mpirun (a session of its own) as SIGUSR1; the step is saved and
  status.json names it.
Cost: a few runs of the tiny preset, three of a 3.6M-parameter model (a step of seconds), ~60 s."""
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from trainer_cli import MPIRUN, ROOT, run_binary, state_differences, write_pattern_corpus

BIN = os.environ.get("TRAIN_SAN_BIN")
pytestmark = pytest.mark.skipif(not BIN, reason="TRAIN_SAN_BIN not set (make test sets it)")
HAS_MPI = os.environ.get("HAS_MPIRUN", "1" if shutil.which("mpirun") else "0") == "1"

# 6 layers of d 384: 3.6M parameters, a step of a second or more over 2 ranks on 2 cores, and
# a 44 MB checkpoint (fp32 weights and two moments)
SLOW = ["--n-layer", "6", "--n-embd", "384", "--n-head", "6", "--n-kv-head", "6", "--seq-len", "64"]
# 2 of those layers: a 15 MB checkpoint, a save (fsync) of a fraction of a second here
MID = ["--n-layer", "2", "--n-embd", "384", "--n-head", "6", "--n-kv-head", "6", "--seq-len", "64"]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_pattern_corpus(tmp_path_factory.mktemp("data"), {"toy_train_000000": 400})


def args(data, ckpt, steps, *more):
    return [str(x) for x in ["--preset", "tiny", "--train-data", data / "toy_train_*.bin", "--sample-tokens", 0,
                             "--optimizer", "adamw", "--lr", "3e-3", "--save-minutes", 0, "--steps", steps,
                             "--checkpoint-dir", ckpt, "--run-dir=", *more]]


def start(cmd, **kw):
    return subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kw)


def until_step(proc, k):
    """Reads the output up to step k's progress line; returns what was read."""
    out = []
    for line in proc.stdout:
        out.append(line)
        if line.startswith(f"step {k:5d}/"):
            return "".join(out)
    raise AssertionError("".join(out))


@pytest.mark.skipif(not HAS_MPI, reason="mpirun or an MPI build missing")
def test_sigterm_to_the_launcher_alone_saves_a_step_of_seconds(data, tmp_path):
    ckpt = tmp_path / "ckpt"
    proc = start([MPIRUN, "-np", "2", os.path.join(ROOT, BIN)] + args(data, ckpt, 1000, *SLOW, "--batch-size", 32))
    out = until_step(proc, 1)
    time.sleep(0.3)  # (in the middle of step 2)
    step_ms = float(out.splitlines()[-1].split("|")[4].split()[0])
    signalled = time.time()
    proc.send_signal(signal.SIGTERM)
    rest, _ = proc.communicate(timeout=300)
    out += rest
    assert proc.returncode == 128 + signal.SIGTERM, out
    saved = [p.name for p in ckpt.iterdir() if p.name != ".lock"]
    assert len(saved) == 1 and saved[0].startswith("step_") and not saved[0].endswith(".tmp"), (saved, out)
    k = int(saved[0][len("step_"):-len(".bin")])
    assert k >= 2 and f"stopped after step {k} of 1000; continue with: mpirun -np 2 " in out, out
    if step_ms < 1500:  # (a machine this fast ends the step within mpirun's 1 s: nothing shown)
        pytest.skip(f"a step took {step_ms:.0f} ms here, within mpirun's 1 s")
    assert time.time() - signalled > 1.0, out


@pytest.mark.skipif(not HAS_MPI, reason="mpirun or an MPI build missing")
def test_a_second_stop_to_the_launcher_stops_at_once(data, tmp_path):
    ckpt = tmp_path / "ckpt"
    proc = start([MPIRUN, "-np", "2", os.path.join(ROOT, BIN)] + args(data, ckpt, 1000, *SLOW, "--batch-size", 32))
    out = until_step(proc, 1)
    step_ms = float(out.splitlines()[-1].split("|")[4].split()[0])
    time.sleep(0.3)  # (in the middle of step 2: past step 1's end, where the ranks look for a stop)
    proc.send_signal(signal.SIGTERM)
    time.sleep(0.2)
    signalled = time.time()
    proc.send_signal(signal.SIGTERM)  # (again: SIGTERM to mpirun, which kills the ranks 1 s later)
    out += proc.communicate(timeout=120)[0]
    assert proc.returncode != 0 and "SIGTERM again: stopping at once" in out, out
    # the kill lands 1 s after the second signal (mpirun's grace), itself 0.5 s into step 2: a step
    # of 1.8 s (a loaded machine) saved first once
    if step_ms < 2500:
        pytest.skip(f"a step took {step_ms:.0f} ms here: the kill may come after the step's save")
    # no finished checkpoint: killed in step 2, or inside its save where a step ran shorter than
    # the first (a loaded machine): a save killed midway leaves its .tmp, never renamed
    assert not [p.name for p in ckpt.glob("step_*") if not p.name.endswith(".tmp")], out
    assert time.time() - signalled < step_ms / 1e3, out


def test_sigusr1_saves_says_what_fits_and_a_slow_save_warns(data, tmp_path):
    ckpt = tmp_path / "ckpt"
    proc = start([os.path.join(ROOT, BIN)] + args(data, ckpt, 100000, "--save-every", 2))
    out = until_step(proc, 3)  # (step 2 was saved and timed)
    proc.send_signal(signal.SIGUSR1)
    rest, _ = proc.communicate(timeout=120)
    out += rest
    assert proc.returncode == 128 + signal.SIGUSR1, out
    k = max(int(p.name[len("step_"):-len(".bin")]) for p in ckpt.glob("step_*.bin"))
    assert f"User defined signal 1: stopped after step {k} of 100000; continue with: " in out, out
    assert "and the last save " in out and "within --stop-grace 30 s" in out, out
    # a grace no save fits in: said once at the first save, and again by the stop
    slow = tmp_path / "slow"
    proc = start([os.path.join(ROOT, BIN)] + args(data, slow, 100000, "--save-every", 2, "--stop-grace", 0))
    out = until_step(proc, 5)
    proc.send_signal(signal.SIGTERM)
    out += proc.communicate(timeout=120)[0]
    assert out.count("more than --stop-grace 0 s") == 1, out
    assert f"warning: saving {slow}/step_2.bin took " in out, out
    assert "MORE than --stop-grace 0 s (killed during the save, the run keeps " in out, out


def test_a_bad_stop_grace_is_refused_naming_the_flag(data, tmp_path):
    proc = run_binary(BIN, args(data, tmp_path / "ckpt", 2, "--stop-grace", "-1"), check=False)
    assert proc.returncode != 0 and "--stop-grace must be >= 0 seconds, got -1" in proc.stderr, proc.stderr
    assert not (tmp_path / "ckpt").exists()


def path_lookups(data, out, steps):
    """The path look-ups a run of `steps` steps makes (strace: the calls that take a file name, and
    directory listings), by call; the run saves the same five milestones whatever its steps, into
    a run directory (what the notes' command that continues names)."""
    trace = out / "trace.txt"
    a = args(data, out / "run", steps, "--milestones", 1)
    a[a.index("--run-dir=")] = f"--run-dir={out / 'run'}"
    cmd = ["strace", "-f", "-qq", "-e", "trace=%file,getdents64", "-o", str(trace), os.path.join(ROOT, BIN), *a]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    if proc.returncode != 0 and "ptrace" in proc.stderr:
        pytest.skip(f"strace cannot trace here: {proc.stderr.strip()}")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    calls = {}
    for line in trace.read_text().splitlines():
        name = line.split(None, 1)[1].split("(", 1)[0] if " " in line else ""
        calls[name] = calls.get(name, 0) + 1
    return calls


@pytest.mark.skipif(not shutil.which("strace"), reason="strace missing")
def test_the_stop_notes_of_each_step_look_up_no_file(data, tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    short, long = path_lookups(data, tmp_path / "a", 6), path_lookups(data, tmp_path / "b", 12)
    assert short == long, {c: (short.get(c), long.get(c)) for c in set(short) | set(long) if short.get(c) != long.get(c)}


def test_a_save_killed_midway_is_removed_at_the_next_start(data, tmp_path):
    ckpt = tmp_path / "ckpt"
    a = args(data, ckpt, 3, *MID, "--batch-size", 2, "--save-every", 1)
    for _ in range(5):  # (the kill may come as the save ends: then again)
        shutil.rmtree(ckpt, ignore_errors=True)
        proc = start([os.path.join(ROOT, BIN)] + a)
        until_step(proc, 2)  # (step_1.bin is whole; step 2's save follows)
        while proc.poll() is None and not (ckpt / "step_2.bin.tmp").exists():
            time.sleep(0.002)
        proc.kill()
        proc.communicate(timeout=60)
        if (ckpt / "step_2.bin.tmp").exists() and not (ckpt / "step_2.bin").exists():
            break
    else:
        pytest.fail("no kill landed during step 2's save")
    resumed = run_binary(BIN, ["--resume", ckpt])
    assert f"removed {ckpt}/step_2.bin.tmp: a save that a killed run did not finish" in resumed.stdout, resumed.stdout
    assert f"resumed from {ckpt}/step_1.bin at step 1" in resumed.stdout
    assert not list(ckpt.glob("*.tmp"))
    run_binary(BIN, args(data, tmp_path / "straight", 3, *MID, "--batch-size", 2, "--save-every", 1))
    assert state_differences(tmp_path / "straight" / "final.bin", ckpt / "final.bin") == []


@pytest.mark.skipif(not HAS_MPI, reason="mpirun or an MPI build missing")
def test_ctrl_c_of_a_two_gpu_study_saves_a_step_of_seconds(data, tmp_path):
    """`python -m study run` of a `gpus = 2` study, Ctrl-C (SIGINT to the terminal's group: here a
    session of its own) in the middle of a step of seconds: the runner passes the stop on to mpirun
    as SIGUSR1 (mpirun itself, in a session of its own, does not get the SIGINT, which it would
    follow with a kill 1 s later), the step is saved and status.json says what was kept. `mpirun`
    is this machine's (a script first on PATH adds what scripts/mpirun.sh adds, then execs it)."""
    real = shutil.which("mpirun")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "mpirun").write_text(f'#!/bin/sh\nexec {real} --allow-run-as-root --oversubscribe '
                                    f'--mca mpi_yield_when_idle 1 "$@"\n')
    (bin_dir / "mpirun").chmod(0o755)
    flags = ", ".join(f'"{x}"' for x in ["--train-data", f"{data}/toy_train_*.bin", "--sample-tokens", "0",
                                         "--optimizer", "adamw", "--save-minutes", "0"] + SLOW[:-2])
    path = tmp_path / "toy.toml"
    path.write_text(f"""
[study]
name = "toy"
out = "{tmp_path / 'out'}"
seeds = [7]
gpus = 2
batch_size = 16
seq_len = 64
steps = 1000
val_every = 0
save_every = 0
flags = [{flags}]

[[arm]]
name = "san"
preset = "tiny"
""")
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}")
    proc = subprocess.Popen([sys.executable, "-m", "study", "run", path, "--binary", os.path.join(ROOT, BIN)],
                            stdout=subprocess.PIPE, text=True, cwd=ROOT, env=env, start_new_session=True)
    for line in proc.stdout:
        if "] step" in line:  # step 1 is done
            time.sleep(0.3)
            os.killpg(proc.pid, signal.SIGINT)
            break
    out = line + proc.stdout.read()
    assert proc.wait(timeout=300) == 130, out
    run_dir = tmp_path / "out" / "runs" / "san_s7"
    status = json.load(open(run_dir / "status.json"))
    assert status["state"] == "interrupted" and status["checkpoint"], (status, out)
    assert os.path.exists(status["checkpoint"]) and status["step"] >= 1, status
    log = (run_dir / "stdout.log").read_text()
    assert f"User defined signal 1: stopped after step {status['step']} of 1000; continue with: mpirun -np 2 " in log, log
