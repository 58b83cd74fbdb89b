"""
runner.py (`python -m study run|slurm|report`): runs a controlled study of train_san arms from
one TOML file (study/spec.py reads it) and reports on it (study/report.py).

    python -m study run STUDY.toml [--binary ./train_san] [--only i,j] [--dry-run]
    python -m study slurm STUDY.toml [--partition P] [--time 24:00:00] ...
    python -m study report STUDY.toml

`run` trains the runs one after another (mpirun for several GPUs), skipping finished runs and
resuming interrupted ones; `slurm` writes a job array, task i = `--only i`. A run's files
(OUT/runs/<id>/: command, logs, checkpoints, status.json, evaluations): doc/study.md.
"""
import argparse
import glob
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass, field

from study import ROOT, checkout_env, match
from study.runs import post_eval_log, post_eval_record, read_log, read_status, write_status
from study.spec import StudyError, load_study


class Interrupted(Exception):
    """SIGINT, SIGTERM or SIGUSR1 (Ctrl-C; Slurm at or before the time limit): the current run stops unfinished
    and resumes from its last checkpoint next time. `signum`: the signal, or None for a stop of
    the runner's own (study/gpu_lease.py's budget), which no trainer has seen."""

    def __init__(self, what, signum=None):
        super().__init__(what)
        self.signum = signum


def _interrupt(signum, frame):
    raise Interrupted(signal.Signals(signum).name, signum)


# What the trainer prints when a stop signal reaches it (llmc/train/stop_signal.h: the signal's
# name, then what the stop keeps; "... stopped after step N" at the end).
TRAINER_STOP_LINE = re.compile(r"^(Interrupt|Terminated|Hangup|User defined signal 1)( again)?: ")


# ----------------------------------------------------------------------------------------
# evaluations of a finished run (`--steps 0 --init-from final.bin`)

@dataclass
class PostEval:
    """An evaluation of a finished run's final checkpoint, `binary --steps 0 --init-from
    RUN/ckpt/final.bin FLAGS --log RUN/eval_NAME.jsonl` (run_files.post_eval_log). It is done
    when its record (RUN/eval_NAME.json) holds these flags: a study whose keys change
    evaluates again. `inputs`: files it reads; while one is missing it is skipped (said so),
    as the trainer would only fail on it."""
    name: str
    flags: list
    inputs: list = field(default_factory=list)


def post_evals(study, run):
    """The evaluations the study asks of the finished `run`."""
    evals = []
    if study.skip_eval and is_hybrid(run.arm):  # a hybrid without its variant layers (doc/deconstructing.md "skip")
        data = ["--preset", run.arm.preset] + study.flags + run.arm.flags + [
            "--seed", str(run.seed), "--batch-size", str(study.batch_size), "--seq-len", str(study.seq_len)]
        evals += [PostEval(f"skip-{mode}", data + ["--skip-nonstandard", mode]) for mode in ("attention", "block")]
    if study.context_eval:  # the Deconstructing paper's Table 4 (doc/study.md "Context-length evaluation")
        c = study.context_eval
        evals.append(PostEval("context", ["--eval-sets", ",".join(c["sets"]),
                                          "--eval-context", ",".join(str(n) for n in c["contexts"]),
                                          "--batch-size", str(study.batch_size), "--sample-tokens", "0"], c["sets"]))
    return evals


def post_eval_command(study, run, ev):
    return [study.binary, "--steps", "0", "--init-from", os.path.join(run.dir, "ckpt", "final.bin")] + ev.flags + [
        "--log", post_eval_log(run, ev.name)]


def post_eval_done(run, ev):
    try:
        with open(post_eval_record(run, ev.name)) as f:
            return json.load(f).get("flags") == ev.flags and os.path.exists(post_eval_log(run, ev.name))
    except (OSError, json.JSONDecodeError):
        return False


def run_post_evals(study, runs, known_flags):
    """Runs the evaluations still to do of the finished (done) runs; returns the ids of those
    that failed (their eval_NAME.log says why; running the study again retries them)."""
    failed = []
    for run in runs:
        if (read_status(run) or {}).get("state") != "done":
            continue
        for ev in post_evals(study, run):
            if post_eval_done(run, ev):
                continue
            missing = [p for p in ev.inputs if not os.path.exists(p)]
            unknown = [f for f in ev.flags if f.startswith("--") and known_flags is not None and f not in known_flags]
            if missing or unknown:
                why = f"{', '.join(missing)} does not exist" if missing else f"{study.binary} has no {', '.join(unknown)}"
                print(f"[study {study.name}] {run.id}: eval {ev.name} skipped ({why})", flush=True)
                continue
            cmd = post_eval_command(study, run, ev)
            print(f"[study {study.name}] {run.id}: eval {ev.name}\n  $ " + " ".join(shlex.quote(c) for c in cmd),
                  flush=True)
            if os.path.exists(post_eval_log(run, ev.name)):  # a stale or partial one
                os.remove(post_eval_log(run, ev.name))
            with open(os.path.join(run.dir, f"eval_{ev.name}.log"), "w") as out:
                rc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT).returncode
            if rc != 0:
                print(f"[study {study.name}] {run.id}: eval {ev.name} failed (exit status {rc}; see "
                      f"{os.path.join(run.dir, f'eval_{ev.name}.log')})", flush=True)
                failed.append(f"{run.id} eval {ev.name}")
                continue
            tmp = post_eval_record(run, ev.name) + ".tmp"
            with open(tmp, "w") as f:
                json.dump({"flags": ev.flags}, f)
                f.write("\n")
            os.replace(tmp, post_eval_record(run, ev.name))
    return failed


# ----------------------------------------------------------------------------------------
# what the runs need before any starts: the trainer and their input files. A study that stops
# on its first run for a missing shard, or whose hint builds another binary, fails a newcomer
# who pasted it; so each missing thing is named with the command that makes it.

# the trainer's flags that name input files: flag -> whether its value is a comma-separated list
INPUT_FLAGS = {"--train-data": True, "--val-data": True, "--eval-sets": True, "--tokenizer": False, "--init-from": False}
OFFLINE_TIER = re.compile(r"(data/offline[\w.-]*)/")  # a dev/data/build_offline.py --out directory
OFFLINE_VOCAB = 8192  # build_offline.py's --vocab-size default


def make_command(binary):
    """The `make` command line that builds `binary` when it is one of this repository's builds
    (build/host-<precision>/NAME, build/gpu-<precision>/NAME, ./train_san ...), else None."""
    rel = os.path.relpath(os.path.abspath(binary), ROOT)
    m = re.fullmatch(r"build/(?:host|gpu)-(bf16|fp32)/(train_san|train_gpt2)", rel)
    make = ["make"] if os.path.abspath(os.getcwd()) == ROOT else ["make", "-C", ROOT]
    if m:  # the Makefile's build directory follows PRECISION: the target exists only with it
        return make + [rel, f"PRECISION={m.group(1).upper()}"]
    if rel in ("train_san", "train_gpt2"):
        return make + [rel]
    return None


def binary_exists(binary):
    return os.path.isfile(binary) and os.access(binary, os.X_OK) or (os.sep not in binary and shutil.which(binary))


def arm_inputs(study, arm):
    """The input files and globs that the arm's runs read (its last value of each input flag)."""
    flags = arm.common + arm.flags
    inputs = []
    for flag, is_list in INPUT_FLAGS.items():
        values = [flags[i + 1] for i in range(len(flags) - 1) if flags[i] == flag]
        if values and values[-1]:
            inputs += [v for v in values[-1].split(",") if v] if is_list else [values[-1]]
    return inputs


def missing_inputs(study, runs):
    """The inputs of these runs that match no file, in first-use order."""
    missing = []
    for arm in (a for a in study.arms if any(run.arm is a for run in runs)):
        for pattern in arm_inputs(study, arm):
            if pattern not in missing and not glob.glob(pattern):
                missing.append(pattern)
    return missing


def data_command(study, pattern):
    """The command that builds a missing input: study.data_build when the file says, else
    dev/data/build_offline.py for a directory of the offline tiers (with the study's vocabulary),
    else None."""
    if study.data_build:
        return study.data_build
    m = OFFLINE_TIER.match(os.path.relpath(os.path.abspath(pattern), os.getcwd()))
    if not m:
        return None
    vocab = {arm_flag(a, "--vocab-size") for a in study.arms if pattern in arm_inputs(study, a)} - {None}
    cmd = ["dev/data/build_offline.py", "--out", m.group(1)]
    if len(vocab) == 1 and vocab != {str(OFFLINE_VOCAB)}:  # (arms that disagree: the trainer will say so)
        cmd += ["--vocab-size", vocab.pop()]
    return cmd


def python_command(cmd):
    """A command whose first word is a .py file runs with this Python (the venv that runs the study)."""
    if cmd[0].endswith(".py"):
        script = cmd[0] if os.path.exists(cmd[0]) else os.path.join(ROOT, cmd[0])
        return [sys.executable, script] + cmd[1:]
    return cmd


def from_here(path):
    """`path` as named from the working directory: relative below it, else absolute."""
    rel = os.path.relpath(path)
    return os.path.abspath(path) if rel.startswith("..") else rel


def shown(cmd):
    """A command as one pastes it (a .py file with this Python, both named as from the working
    directory: the script where python_command finds it)."""
    if cmd[0].endswith(".py"):
        cmd = [from_here(sys.executable), from_here(python_command(cmd)[1])] + cmd[1:]
    return " ".join(shlex.quote(c) for c in cmd)


def note_elsewhere(study):
    """One line when a study file of this repository runs from another directory with relative
    paths in it: they are taken from the working directory, not from the repository."""
    here = os.path.abspath(os.getcwd())
    if here == ROOT or os.path.relpath(os.path.abspath(study.path), ROOT).startswith(".."):
        return
    inputs = [p for a in study.arms for p in arm_inputs(study, a)]
    relative = [p for p in [study.binary, study.out] + inputs if not os.path.isabs(p) and os.sep in p]
    if relative:
        print(f"note: {study.path}'s relative paths ({', '.join(dict.fromkeys(relative[:3]))}, ...) are taken from the "
              f"working directory {here}, not from the repository {ROOT}; to use its builds and data, run from "
              f"there: cd {shlex.quote(from_here(ROOT))}", flush=True)


def check_needs(study, runs, build):
    """What these runs lack: a list of "what is missing: the command that makes it" lines, empty
    when nothing is. With build, first makes what it may without being asked: the trainer when it
    is a make target of this repository (seconds once ccache has seen it), the data when the study
    file says how (study.data_build); each announced with its command."""
    problems = []
    if not binary_exists(study.binary):
        make = make_command(study.binary)
        if build and make:
            print(f"study {study.name}: {study.binary} is missing; building it: {shown(make)}", flush=True)
            if subprocess.run(make, cwd=ROOT).returncode != 0:
                raise StudyError(f"{study.binary}: `{shown(make)}` failed (its output is above)")
        if not binary_exists(study.binary):
            problems.append(f"the trainer {study.binary} does not exist: " + (
                f"build it with `{shown(make)}`" if make else "build it, or give --binary PATH"))
    missing = missing_inputs(study, runs)
    if missing and build and study.data_build:
        print(f"study {study.name}: {', '.join(missing)} missing; building the data as the study file says "
              f"(study.data_build): {shown(study.data_build)}", flush=True)
        if subprocess.run(python_command(study.data_build), env=checkout_env()).returncode != 0:
            raise StudyError(f"{study.path}: study.data_build `{shown(study.data_build)}` failed (its output is above)")
        missing = missing_inputs(study, runs)
    by_command = {}  # (one line per command: a tier's train and val shards are built together)
    for pattern in missing:
        cmd = data_command(study, pattern)
        by_command.setdefault(tuple(cmd) if cmd else pattern, []).append(pattern)
    for cmd, patterns in by_command.items():
        problems.append(f"no file matches {', '.join(patterns)}: " + (
            f"build {'them' if len(patterns) > 1 else 'it'} with `{shown(list(cmd))}`" if isinstance(cmd, tuple) else
            "no recipe is known here (doc/data.md lists the datasets and their scripts; study.data_build can name one)"))
    return problems


# ----------------------------------------------------------------------------------------
# the binary

def binary_flags(binary):
    """The --flags that `binary -h` lists, or None when the binary cannot run."""
    try:
        proc = subprocess.run([binary, "-h"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", proc.stdout + proc.stderr))


def arm_availability(study, known_flags):
    """{arm name: None if runnable, else why not}. An unknown flag in a required arm is an
    error; in an optional arm (a feature the trainer may not have yet) it makes the arm absent."""
    why = {}
    for arm in study.arms:
        unknown = [f for f in study.flags + arm.flags if f.startswith("--") and known_flags is not None
                   and f not in known_flags]
        if unknown and not arm.optional:
            raise StudyError(f"{study.path}: arm '{arm.name}': {study.binary} has no option {', '.join(unknown)}")
        why[arm.name] = (f"this train_san has no {', '.join(unknown)}" if unknown else None)
    return why


def run_command(study, run, resume=None):
    cmd = [study.binary, "--preset", run.arm.preset] + study.flags + run.arm.flags + [
        "--seed", str(run.seed), "--steps", str(study.steps), "--batch-size", str(study.batch_size),
        "--seq-len", str(study.seq_len)] + (
        ["--global-batch", str(study.global_batch)] if study.global_batch else ["--grad-accum", str(study.grad_accum)]) + [
        "--val-every", str(study.val_every), "--save-every", str(study.save_every),
        "--log", os.path.join(run.dir, "log.jsonl"), "--checkpoint-dir", os.path.join(run.dir, "ckpt")]
    if run.lr is not None:
        cmd += ["--lr", f"{run.lr:g}"]
    if run.lr_other is not None:
        cmd += ["--lr-other", f"{run.lr_other:g}"]
    if study.milestones:
        cmd += ["--milestones", "1"]
    if resume:
        cmd += ["--resume", resume]
    if study.gpus > 1:
        cmd = ["mpirun", "-np", str(study.gpus)] + cmd
    return cmd


# ----------------------------------------------------------------------------------------
# run state

def is_finished(run):
    status = read_status(run)
    return status is not None and status.get("state") in ("done", "diverged")


def latest_checkpoint(run):
    """(step, path) of the newest step_N.bin, or (0, None)."""
    best = (0, None)
    for path in glob.glob(os.path.join(run.dir, "ckpt", "step_*.bin")):
        m = re.fullmatch(r"step_(\d+)\.bin", os.path.basename(path))
        if m and int(m.group(1)) > best[0]:
            best = (int(m.group(1)), path)
    return best


def mean_ms_per_step(study, arm):
    ms = []
    for run in study.runs:
        if run.arm is arm:
            train, _ = read_log(os.path.join(run.dir, "log.jsonl"))
            ms += [r["ms"] for r in train[1:] if "ms" in r]  # the first step pays for warm-up
    return sum(ms) / len(ms) if ms else None


class EtaModel:
    """Milliseconds per step of each arm: measured where a log has steps, else scaled from a
    measured arm by FLOPs per token (the work per step is proportional to it)."""

    def __init__(self, study):
        self.study = study
        self.ms = {arm.name: mean_ms_per_step(study, arm) for arm in study.arms}

    def observe(self, arm, ms):
        old = self.ms.get(arm.name)
        self.ms[arm.name] = ms if old is None else 0.8 * old + 0.2 * ms

    def ms_per_step(self, arm):
        if self.ms.get(arm.name) is not None:
            return self.ms[arm.name]
        known = [(a, self.ms[a.name]) for a in self.study.arms if self.ms.get(a.name) is not None]
        if not known:
            return None
        ref, ms = known[0]
        return ms * match.flops_per_token(arm.model()) / match.flops_per_token(ref.model())

    def remaining_s(self, runs, current=None, current_done=0):
        total = 0.0
        for run in runs:
            ms = self.ms_per_step(run.arm)
            if ms is None:
                return None
            done = current_done if run is current else latest_checkpoint(run)[0]
            total += ms * (self.study.steps - done) / 1e3
        return total


def fmt_duration(seconds):
    if seconds is None:
        return "?"
    seconds = int(seconds)
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 60}m{seconds % 60:02d}s"


PROGRESS = re.compile(r"^step\s+(\d+)/(\d+) \|.*\|\s+([\d.]+) ms \|")


def copy_output(proc, out, tag, done, eta, pending, run):
    """The trainer's stdout into stdout.log, its progress (with the study's ETA), saves and stop
    lines onto the console."""
    for line in proc.stdout:
        out.write(line)
        line = line.rstrip("\n")
        m = PROGRESS.match(line)
        if m:
            step, ms = int(m.group(1)), float(m.group(3))
            if step > done + 1:
                eta.observe(run.arm, ms)
            left = eta.remaining_s(pending, current=run, current_done=step)
            print(f"{tag} {line} | study eta {fmt_duration(left)}", flush=True)
        elif TRAINER_STOP_LINE.match(line) or line.startswith(("step ", "saved ", "resumed ", "train_san", "parameters:",
                                                               "model:")):
            print(f"{tag} {line}", flush=True)


def wait_for_trainer(proc, launcher=False):
    """Waits for the trainer to exit, passing on each stop signal the runner gets; returns (its exit
    status, the Interrupted that stopped the study or None). From the terminal (Ctrl-C signals the
    whole foreground group) or a cluster (Slurm signals every process of the job) the trainer has
    the signal already, and takes the runner's copy for the same stop (llmc/train/stop_signal.h:
    a repeated signal from the parent counts only after a first from the parent), so its
    first-signal save finishes; sent to the runner alone (`kill RUNNER`), the copy is the stop. A
    stop of the runner's own (gpu_lease's budget) goes on as SIGTERM.
    `launcher`: proc is mpirun, which kills the ranks 1 s after passing on a SIGTERM, SIGINT or
    SIGHUP: the first stop goes to it as SIGUSR1, which it passes on to every rank without a kill
    (each saves after its step and stops), a second as SIGTERM (stop at once; doc/multi-gpu.md
    "Stopping on a cluster")."""
    stop, passed = None, 0
    while True:
        try:
            return proc.wait(), stop
        except Interrupted as e:
            stop = stop or e
            if proc.poll() is None:
                if launcher:
                    passed += 1
                    proc.send_signal(signal.SIGUSR1 if passed == 1 else signal.SIGTERM)
                else:
                    proc.send_signal(e.signum or signal.SIGTERM)


def stopped(run, rc, stop):
    """Records a run the study's stop ended (status "interrupted": the next `run` resumes it from
    its newest checkpoint) and raises `stop` with what was kept; a trainer that finished meanwhile
    is recorded as done first."""
    if rc == 0:
        return  # (recorded as done by the caller; the study stops before its next run)
    step, ckpt = latest_checkpoint(run)
    write_status(run, "interrupted", signal=str(stop), returncode=rc, step=step, checkpoint=ckpt)
    stop.kept = f"saved up to step {step} in {ckpt}" if ckpt else "no checkpoint saved: it starts over"
    raise stop


def execute(study, run, position, total, eta, pending):
    """Runs (or resumes) one run, streaming the trainer's progress; returns its state."""
    os.makedirs(os.path.join(run.dir, "ckpt"), exist_ok=True)
    if os.path.exists(os.path.join(run.dir, "status.json")):  # "failed" before: it is being retried
        os.remove(os.path.join(run.dir, "status.json"))
    done, resume = latest_checkpoint(run)
    if not resume and os.path.exists(os.path.join(run.dir, "log.jsonl")):
        # (an attempt that saved no checkpoint: the run starts over, and the trainer refuses to
        # write a fresh run's log over an earlier one)
        os.remove(os.path.join(run.dir, "log.jsonl"))
    if not resume:  # (nor a fresh run into a directory that holds an earlier attempt's milestones)
        for path in glob.glob(os.path.join(run.dir, "ckpt", "milestone_*.bin")):
            os.remove(path)
    cmd = run_command(study, run, resume)
    with open(os.path.join(run.dir, "command.txt"), "w") as f:
        f.write(" ".join(shlex.quote(c) for c in cmd) + "\n")
    remaining = eta.remaining_s(pending)
    print(f"[study {study.name}] run {position}/{total}: {run.id}"
          + (f" (resuming from step {done})" if resume else "") + f" | study eta {fmt_duration(remaining)}", flush=True)
    print("  $ " + " ".join(shlex.quote(c) for c in cmd), flush=True)
    tag = f"[{position}/{total} {run.id}]"
    mode = "a" if resume else "w"
    # line-buffered, so that `tail -f stdout.log` follows the run
    with open(os.path.join(run.dir, "stdout.log"), mode, buffering=1) as out, \
            open(os.path.join(run.dir, "stderr.log"), mode) as err:
        # mpirun (study.gpus > 1) in a session of its own, stdin from /dev/null: the terminal's Ctrl-C
        # and the process group's signals reach the runner alone, which passes the stop on as
        # SIGUSR1 (wait_for_trainer)
        launcher = study.gpus > 1
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True, bufsize=1,
                                start_new_session=launcher, stdin=subprocess.DEVNULL if launcher else None)
        # (a thread copies the output, so that all of it reaches stdout.log while a stop is waited for)
        reader = threading.Thread(target=copy_output, args=(proc, out, tag, done, eta, pending, run))
        reader.start()
        rc, stop = wait_for_trainer(proc, launcher)
        reader.join()
    if stop is not None:
        stopped(run, rc, stop)
    with open(os.path.join(run.dir, "stderr.log")) as f:
        stderr = f.read()
    if rc == 0:
        write_status(run, "done", steps=study.steps)
        if not study.keep_checkpoints:
            for path in glob.glob(os.path.join(run.dir, "ckpt", "step_*.bin")):
                os.remove(path)
        if stop is not None:  # (the signal came as the run finished: the next run waits for the next `run`)
            stop.kept = "it finished first"
            raise stop
        return "done"
    last = stderr.strip().splitlines()[-1] if stderr.strip() else f"exit status {rc}"
    sys.stderr.write(f"{tag} {last}\n")
    if "stopped by the guard" in stderr:
        # (a loss jump, finite: a divergence, or the data's; not a final state: running again retries
        # it, and --spike-guard 0 in the arm's flags passes it)
        m = re.search(r"step (\d+):", stderr)
        write_status(run, "guard", step=int(m.group(1)) if m else None, message=last)
        return "guard"
    if "diverged" in stderr:
        m = re.search(r"step (\d+):", stderr)
        write_status(run, "diverged", step=int(m.group(1)) if m else None, message=last)
        return "diverged"
    write_status(run, "failed", returncode=rc, message=last)
    return "failed"


# ----------------------------------------------------------------------------------------
# evaluations of a finished run's final checkpoint (train_san --steps 0 --init-from final.bin)

def arm_flag(arm, flag, default=None):
    """The value of `flag` as the run sees it (the arm's flags come after the study's)."""
    flags = arm.common + arm.flags
    values = [flags[i + 1] for i in range(len(flags) - 1) if flags[i] == flag]
    return values[-1] if values else default


def is_hybrid(arm):
    """Whether the arm mixes a variant with standard layers (train_san's --attention and --layout;
    a layout other than uniform keeps some layers standard)."""
    return arm_flag(arm, "--attention", "standard") != "standard" and arm_flag(arm, "--layout", "uniform") != "uniform"


def select(study, only):
    if not only:
        return study.runs
    picked = []
    for part in only.split(","):
        try:
            i = int(part)
        except ValueError:
            raise StudyError(f"--only: '{part}' is not a run index") from None
        if not 0 <= i < len(study.runs):
            raise StudyError(f"--only: run index {i} is outside 0..{len(study.runs) - 1}")
        picked.append(study.runs[i])
    return picked


def cmd_run(args):
    study = load_study(args.study, args.binary)
    runs = select(study, args.only)
    unfinished = [r for r in runs if not is_finished(r)]
    note_elsewhere(study)
    problems = check_needs(study, unfinished, build=not args.dry_run)
    if problems and not args.dry_run:
        raise StudyError(f"{study.path}: cannot run yet:\n  " + "\n  ".join(problems))
    known = binary_flags(study.binary)
    if known is None and not args.dry_run:
        raise StudyError(f"{study.binary}: cannot run it (`{study.binary} -h` fails; give another --binary)")
    why = arm_availability(study, known)
    todo = [r for r in unfinished if why[r.arm.name] is None]
    print(f"study {study.name}: {len(study.runs)} runs of {study.steps} steps x {study.tokens_per_step:,} tokens "
          f"({len(study.runs) - len([r for r in study.runs if not is_finished(r)])} finished); "
          f"{len(todo)} to run now in {study.out}")
    for arm in study.arms:
        if why[arm.name]:
            print(f"  arm {arm.name}: skipped ({why[arm.name]})")
    if args.dry_run:
        for run in todo:  # the index is what --only takes
            print(f"[{run.index}] {run.id}: " + " ".join(shlex.quote(c) for c in run_command(study, run, latest_checkpoint(run)[1])))
        for run in runs:
            for ev in (ev for ev in post_evals(study, run) if not post_eval_done(run, ev)):
                print(f"[{run.index}] {run.id} then eval {ev.name}: "
                      + " ".join(shlex.quote(c) for c in post_eval_command(study, run, ev)))
        if problems:
            print(f"study {study.name}: cannot run yet:\n  " + "\n  ".join(problems))
            return 1
        print(f"study {study.name}: the trainer and every input file are there")
        return 0
    eta = EtaModel(study)
    outcome = {}
    # set both explicitly: a shell's background job starts with SIGINT ignored
    signal.signal(signal.SIGINT, _interrupt)
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGUSR1, _interrupt)  # (Slurm's warning before the time limit: cmd_slurm)
    evals_failed = []
    for k, run in enumerate(todo):
        try:
            outcome[run.id] = execute(study, run, k + 1, len(todo), eta, todo[k:])
            evals_failed += run_post_evals(study, [run], known)
        except Interrupted as e:
            kept = f" ({e.kept})" if getattr(e, "kept", None) else ""
            print(f"study {study.name}: stopped by {e} during {run.id}{kept}; continue the study with: "
                  f"{continue_command(args)}", flush=True)
            return 130
    try:  # the runs that had finished before (a study given a new evaluation, or one that failed)
        evals_failed += run_post_evals(study, [r for r in runs if r not in todo], known)
    except Interrupted as e:
        print(f"study {study.name}: stopped by {e}; evaluate the rest with: {continue_command(args)}", flush=True)
        return 130
    if evals_failed:
        print(f"study {study.name}: evaluations failed: {', '.join(evals_failed)} (running again retries them)")
    failed = [r for r, state in outcome.items() if state == "failed"]
    diverged = [r for r, state in outcome.items() if state == "diverged"]
    guarded = [r for r, state in outcome.items() if state == "guard"]
    print(f"study {study.name}: {len(outcome) - len(failed) - len(diverged) - len(guarded)} runs done, "
          f"{len(diverged)} diverged" + (f" ({', '.join(diverged)})" if diverged else "")
          + (f", {len(guarded)} stopped by the guard ({', '.join(guarded)}: a loss jump, a divergence or the data's; "
             "see their stderr.log; --spike-guard 0 in the arm's flags passes it; running again retries them)"
             if guarded else "")
          + f", {len(failed)} failed"
          + (f" ({', '.join(failed)}: see their stderr.log; running again retries them)" if failed else ""))
    return 1 if failed or guarded or evals_failed else 0


def continue_command(args):
    """The `run` command as given, which skips the finished runs and resumes the interrupted one
    (with this Python: the venv's, which a bare `python` may not be)."""
    words = [from_here(sys.executable), "-m", "study", "run", args.study] + (["--binary", args.binary] if args.binary else []) + (
        ["--only", args.only] if args.only else [])
    return " ".join(shlex.quote(w) for w in words)


def _script_value(study, what, value):
    """`value` as one shell word for study.sbatch (shlex.quote), refusing control characters: a
    newline in a path or name would end an #SBATCH line or start a shell command of its own."""
    bad = [c for c in str(value) if ord(c) < 32 or 127 <= ord(c) < 160]
    if bad:
        raise StudyError(f"{study.path}: {what} {str(value)!r} holds a control character ({bad[0]!r}); "
                         f"python -m study slurm writes it into a shell script, so it must have none")
    return shlex.quote(str(value))


def cmd_slurm(args):
    if args.stop_warning < 0:
        raise StudyError(f"--stop-warning must be >= 0 seconds (0: none), got {args.stop_warning}")
    study = load_study(args.study, args.binary)
    known = binary_flags(study.binary)
    why = arm_availability(study, known) if known is not None else {a.name: None for a in study.arms}
    indices = [r.index for r in study.runs if why[r.arm.name] is None]
    if not indices:
        raise StudyError(f"{study.path}: no run can be scheduled")
    # every value from the study file or the command line goes into the script through q(), and is
    # checked before anything is written
    q = lambda what, value: _script_value(study, what, value)  # noqa: E731
    python = args.python or sys.executable
    script_dir = os.path.join(study.out, "slurm")
    lines = ["#!/bin/bash",
             f"# {q('study.name', study.name)}: one array task per run ({len(indices)} runs); written by "
             "python -m study slurm.",
             "# Each task runs `python -m study run --only <its run>`, which skips a finished run and resumes an",
             "# interrupted one, so resubmitting the script after a time-out continues the study.",
             f"#SBATCH --job-name={q('study.name', study.name)}",
             f"#SBATCH --array={_ranges(indices)}" + (f"%{args.max_parallel}" if args.max_parallel else ""),
             # one node per run; a task slot per GPU, so that the run's `mpirun -np gpus` fits
             "#SBATCH --nodes=1",
             f"#SBATCH --ntasks={study.gpus}",
             f"#SBATCH --gpus={study.gpus}",
             f"#SBATCH --cpus-per-task={args.cpus_per_task}",
             f"#SBATCH --time={q('--time', args.time)}",
             # Slurm signals the job's every process at the time limit, mpirun too, which then kills the
             # ranks 1 s later: SIGUSR1 to the runner (the batch shell, exec'd below) this long before
             # it, passed on to the ranks, makes them save and stop (doc/multi-gpu.md)
             *([f"#SBATCH --signal=B:USR1@{args.stop_warning}"] if args.stop_warning > 0 else []),
             f"#SBATCH --output={q('study.out', os.path.abspath(os.path.join(script_dir, '%A_%a.out')))}"]
    if args.partition:
        lines.append(f"#SBATCH --partition={q('--partition', args.partition)}")
    if args.account:
        lines.append(f"#SBATCH --account={q('--account', args.account)}")
    for x in args.sbatch:  # a whole directive as the user wrote it: checked, not quoted
        _script_value(study, "--sbatch", x)
        lines.append(f"#SBATCH {x}")
    lines += ["set -euo pipefail", f"cd {q('the working directory', os.getcwd())}",
              # this checkout's study package, whether or not it is installed on the nodes
              f"export PYTHONPATH={q('the repository', ROOT)}${{PYTHONPATH:+:$PYTHONPATH}}",
              f"exec {q('--python', python)} -m study run "
              f"{q('the study file', study.path)} --binary {q('the trainer', study.binary)} "
              "--only \"$SLURM_ARRAY_TASK_ID\""]
    os.makedirs(script_dir, exist_ok=True)
    script = os.path.join(script_dir, "study.sbatch")
    with open(script + ".tmp", "w") as f:
        f.write("\n".join(lines) + "\n")
    os.replace(script + ".tmp", script)
    print(f"wrote {script}: submit it with `sbatch {shlex.quote(script)}`; then "
          f"`python -m study report {shlex.quote(study.path)}`")
    return 0


def _ranges(indices):
    parts, start = [], None
    for i, x in enumerate(indices):
        if start is None:
            start = x
        if i + 1 == len(indices) or indices[i + 1] != x + 1:
            parts.append(str(start) if start == x else f"{start}-{x}")
            start = None
    return ",".join(parts)


def cmd_report(args):
    from study import report as study_report  # matplotlib is imported only for reports
    study = load_study(args.study, args.binary)
    known = binary_flags(study.binary)
    why = {a.name: None for a in study.arms}
    if known is not None:
        try:
            why = arm_availability(study, known)
        except StudyError:
            pass
    path = study_report.write_report(study, why, args.out)
    print(f"wrote {path}")
    return 0


def main(argv=None):
    ap = argparse.ArgumentParser(description="Runs, schedules and reports a study of train_san arms (doc/study.md).")
    sub = ap.add_subparsers(dest="command", required=True)
    for name, help_text in (("run", "run every unfinished run, one after another"),
                            ("slurm", "write an sbatch job-array script (one task per run)"),
                            ("report", "write report.md and PNG plots from the runs' logs")):
        p = sub.add_parser(name, help=help_text)
        p.add_argument("study", help="the study file (TOML)")
        p.add_argument("--binary", help="the trainer (default: study.binary, else ./train_san)")
        if name == "run":
            p.add_argument("--only", help="comma-separated run indices (0-based, in the study's order)")
            p.add_argument("--dry-run", action="store_true",
                           help="check that the trainer and every input file are there (exit 1 naming what is missing "
                                "and the command that makes it), print the commands, run nothing")
        if name == "slurm":
            p.add_argument("--partition")
            p.add_argument("--account")
            p.add_argument("--time", default="24:00:00", help="per task")
            p.add_argument("--cpus-per-task", type=int, default=8)
            p.add_argument("--max-parallel", type=int, help="at most this many tasks at once")
            p.add_argument("--python", help="the Python on the compute nodes (default: this one)")
            p.add_argument("--sbatch", action="append", default=[], help="an extra #SBATCH line (repeatable)")
            p.add_argument("--stop-warning", type=int, default=120, metavar="S",
                           help="Slurm sends SIGUSR1 S seconds before the time limit: the run saves and stops "
                                "(0: none; the SIGTERM at the limit then has KillWait to save)")
        if name == "report":
            p.add_argument("--out", help="report directory (default: OUT/report)")
    args = ap.parse_args(argv)
    try:
        return {"run": cmd_run, "slurm": cmd_slurm, "report": cmd_report}[args.command](args)
    except StudyError as e:
        sys.stderr.write(f"python -m study: {e}\n")
        return 2


if __name__ == "__main__":
    sys.exit(main())
