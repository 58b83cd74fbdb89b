"""
gpu_lease.py (`python -m study.gpu_lease`, run by scripts/gpu_study.sh): a rate sweep, then a
seeded study at each arm's best rate, as many runs as fit before a deadline in one GPU lease.

    python -m study.gpu_lease --sweep studies/mini_gpu_other.toml --main studies/mini_gpu.toml \
        --binary build/gpu-bf16/train_san --deadline EPOCH_SECONDS [--reserve 45] [--pack OUT] [--tiny]

The two study files are written to STUDY_OUT/lease/ (sharing study.out, so the main study's run
at an arm's best rate is the sweep's); the sweep runs middle rate first, every arm at each rate,
then the main study's other seeds. A run starts only when its predicted time (Clock) fits before
the deadline less the reserve, and is stopped there or at SLOW times its prediction. The sweep
table, the report and summary.txt are written whatever ran; --pack copies at most 8 files (PACKED).
--tiny (gpu_study.sh --host) shrinks the plan to seconds on the host backend, in STUDY_OUT-dry-run.
Manual: doc/gpu-runs/README.md "The GPU study".
"""
import argparse
import glob
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tarfile
import time
import tomllib

from study import checkout_env, match
from study import runner
from study.runs import read_log, read_status
from study.spec import StudyError, load_study, write_study

PRIOR_MS_FIXED = 1.5        # per step: launches, host-side work (issue 45: the embedding's bucket sort alone ~1.3 ms)
PRIOR_TFLOPS = 100.0        # effective bf16 rate of a d-256 model on an H100 (about 10% of its peak; a guess)
PRIOR_OVERHEAD_S = 6.0      # per run: process and CUDA start, data checks, validations, checkpoints
MAX_FAILURES = 3            # runs that fail one after another before the lease stops launching (a broken build, a bad flag)
SLOW, SLOW_FLOOR_S = 4.0, 120.0 # a run is stopped after max(SLOW x its prediction, SLOW_FLOOR_S) seconds
SAFETY = 1.25               # predicted wall time x SAFETY + MARGIN_S must fit before the stop
MARGIN_S = 3.0
PACKED = ("summary.txt", "report.md", "sweep.md", "final_loss.png", "loss_curves.png", "regions.png", "sweep.png",
          "logs.tar.gz")
TINY_STUDY = {"steps": 6, "batch_size": 2, "seq_len": 64, "val_every": 3, "save_every": 3}
TINY_FLAGS = {"--n-embd": "64", "--max-seq-len": "64", "--val-batches": "2", "--train-doc-eval": "8", "--log-every": "1"}


# ----------------------------------------------------------------------------------------
# study files

HEADER = "written by study/gpu_lease.py from a study file of studies/ (its header says what it is)"


def set_flag(flags, name, value):
    flags = list(flags)
    if name in flags[:-1]:
        flags[flags.index(name) + 1] = value
    else:
        flags += [name, value]
    return flags


def adapt(raw, steps=None, tiny=False):
    """The study tables with the lease's changes: --steps N (validations every N/4, checkpoints
    every N/2) or the host dry run's tiny sizes. Either writes its runs to a folder of its own
    (OUT-Nsteps, OUT-dry-run): runs of other sizes under the same ids would pass for the study's."""
    s = dict(raw["study"])
    out = s.get("out", "logs/studies/" + s["name"]).rstrip("/")
    if steps:
        s.pop("tokens", None)
        s.update(steps=steps, val_every=max(1, steps // 4), save_every=max(1, steps // 2), out=f"{out}-{steps}steps")
    if tiny:
        s.pop("tokens", None)
        s.update(TINY_STUDY, out=f"{out}-dry-run")
        for name, value in TINY_FLAGS.items():
            s["flags"] = set_flag(s.get("flags", []), name, value)
    return dict(raw, study=s)


def check_pair(sweep, main):
    """The main study must be the sweep's arms with one lr_other each: the same study settings,
    arm names, presets, flags and Muon rates, so that its runs at a swept rate are the sweep's."""
    keys = ("out", "batch_size", "seq_len", "steps", "tokens", "val_every", "save_every", "milestones", "flags")
    problems = [f"study.{k} differs" for k in keys if sweep["study"].get(k) != main["study"].get(k)]
    a = [(x["name"], x["preset"], x.get("flags", []), x.get("lr")) for x in sweep["arm"]]
    b = [(x["name"], x["preset"], x.get("flags", []), x.get("lr")) for x in main["arm"]]
    if a != b:
        problems.append("the arms differ (name, preset, flags or lr)")
    if any(isinstance(x.get("lr_other"), list) for x in main["arm"]):
        problems.append("an arm of the main study has an lr_other grid (it takes the sweep's best)")
    if problems:
        raise StudyError("the sweep and the main study do not pair: " + "; ".join(problems))


# ----------------------------------------------------------------------------------------
# runs, their order, their predicted and measured times

def final_loss(run):
    if (read_status(run) or {}).get("state") != "done":
        return None
    _, val = read_log(os.path.join(run.dir, "log.jsonl"))
    return val[-1]["val_loss"] if val else None


def middle_out(values):
    """A grid's values, the middle one first, then alternately above and below it."""
    values = sorted(values)
    mid = (len(values) - 1) // 2
    order = [values[mid]]
    for k in range(1, len(values)):
        for i in (mid + k, mid - k):
            if 0 <= i < len(values) and values[i] not in order:
                order.append(values[i])
    return order


def sweep_order(study):
    grids = sorted({r.lr_other for r in study.runs}, key=lambda x: -1 if x is None else x)
    order = []
    for rate in middle_out(grids) if None not in grids else grids:
        order += [r for r in study.runs if r.lr_other == rate]
    return order


def median_ms(run):
    train, _ = read_log(os.path.join(run.dir, "log.jsonl"))
    ms = [r["ms"] for r in train[1:] if "ms" in r]  # the first step pays for warm-up
    return statistics.median(ms) if ms else None


class Clock:
    """Predicted wall seconds of a run, from what has run so far: an arm measured before, its wall
    time; else ms per step from a measured arm scaled by FLOPs per token, plus the mean start-up
    and evaluation time; before any measurement, PRIOR_MS_FIXED ms + the step's FLOPs at
    PRIOR_TFLOPS, plus PRIOR_OVERHEAD_S. A run stopped for being slow still measures its arm."""

    def __init__(self):
        self.wall = {}       # arm name -> wall seconds of its last finished run
        self.ms = {}         # arm name -> (ms per step, FLOPs per token)
        self.overhead = []   # wall - steps x ms of every finished run

    def observe(self, run, steps, wall):
        ms = median_ms(run)
        self.wall[run.arm.name] = wall
        if ms is not None:
            self.ms[run.arm.name] = (ms, match.flops_per_token(run.arm.model()))
            self.overhead.append(max(0.0, wall - steps * ms / 1e3))

    def observe_stopped(self, run):
        """A run stopped before its end still measured its steps (its log's ms)."""
        ms = median_ms(run)
        if ms is not None and run.arm.name not in self.ms:
            self.ms[run.arm.name] = (ms, match.flops_per_token(run.arm.model()))

    def predict(self, run, steps, tokens_per_step):
        if run.arm.name in self.wall:
            return self.wall[run.arm.name], "measured (this arm)"
        flops = match.flops_per_token(run.arm.model())
        overhead = statistics.mean(self.overhead) if self.overhead else PRIOR_OVERHEAD_S
        if run.arm.name in self.ms:
            return overhead + steps * self.ms[run.arm.name][0] / 1e3, "this arm's steps, measured in a stopped run"
        if self.ms:
            ms, ref = max(self.ms.values(), key=lambda x: x[1])  # scale from the heaviest arm measured
            return overhead + steps * ms * flops / ref / 1e3, "scaled by FLOPs from a measured arm"
        ms = PRIOR_MS_FIXED + flops * tokens_per_step / (PRIOR_TFLOPS * 1e12) * 1e3
        return overhead + steps * ms / 1e3, "prior"


class Budget(Exception):
    pass


def _stop(signum, frame):
    raise runner.Interrupted("the lease's budget")


def run_one(study, run, position, total, stop_at, limit, log):
    """Trains one run with the runner's own execute(); stopped (as SIGTERM stops a study) at
    stop_at (epoch seconds) or after `limit` seconds, whichever comes first."""
    left = stop_at - time.time()
    if left < 1:
        raise Budget()
    eta = runner.EtaModel(study)
    old = signal.signal(signal.SIGALRM, _stop)
    signal.setitimer(signal.ITIMER_REAL, min(left, limit))
    try:
        state = runner.execute(study, run, position, total, eta, [run])
        failed = runner.run_post_evals(study, [run], None)
        if failed:
            log(f"  evaluations failed: {', '.join(failed)}")
    except runner.Interrupted:
        state = "stopped (budget)" if left <= limit else f"stopped (over {limit:.0f} s)"
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    return state


# ----------------------------------------------------------------------------------------
# the lease

def main(argv=None):
    ap = argparse.ArgumentParser(description="A sweep, then a seeded study, as far as a deadline allows (doc/gpu-runs/README.md).")
    ap.add_argument("--sweep", required=True, help="the sweep's study file (one seed, lr_other grids)")
    ap.add_argument("--main", required=True, help="the main study file (the same arms, one lr_other each, several seeds)")
    ap.add_argument("--binary", required=True, help="the trainer")
    ap.add_argument("--deadline", type=float, required=True, help="epoch seconds by which everything, packing included, is done")
    ap.add_argument("--reserve", type=float, default=45.0, help="seconds kept before the deadline for the reports and packing")
    ap.add_argument("--steps", type=int, help="steps per run instead of the files' (validations every steps/4)")
    ap.add_argument("--tiny", action="store_true", help="the host dry run's sizes (6 steps of 2 x 64 tokens, d 64)")
    ap.add_argument("--pack", help="copy the returned files (at most 8) into this folder")
    ap.add_argument("--stages", help="a file of earlier stages' lines (unpacking, build) for summary.txt")
    args = ap.parse_args(argv)
    stop_at = args.deadline - args.reserve
    started = time.time()

    raw_sweep, raw_main = (adapt(tomllib.load(open(p, "rb")), args.steps, args.tiny) for p in (args.sweep, args.main))
    check_pair(raw_sweep, raw_main)
    out = raw_sweep["study"]["out"]
    lease_dir = os.path.join(out, "lease")
    os.makedirs(lease_dir, exist_ok=True)
    lease_log = open(os.path.join(lease_dir, "lease.log"), "a", buffering=1)

    def log(line):
        print(f"[gpu_lease] {line}", flush=True)
        lease_log.write(line + "\n")

    sweep_path = write_study(raw_sweep, os.path.join(lease_dir, "sweep.toml"), HEADER)
    sweep = load_study(sweep_path, args.binary)
    log(f"start: {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime(started))}; deadline in "
        f"{args.deadline - started:.0f} s, runs stop {args.reserve:.0f} s before it; {sweep.steps} steps x "
        f"{sweep.tokens_per_step:,} tokens per run; binary {args.binary}")
    problems = runner.check_needs(sweep, sweep.runs, build=False)
    if problems:
        raise StudyError("cannot run:\n  " + "\n  ".join(problems))
    if runner.binary_flags(args.binary) is None:
        raise StudyError(f"{args.binary}: `{args.binary} -h` fails")

    clock = Clock()
    rows = []  # (study name, run, state, wall, predicted, basis)
    failures = []  # consecutive failed runs: after MAX_FAILURES nothing more is launched

    def attempt(study, run, position, total):
        if runner.is_finished(run):
            rows.append((study.name, run, "done before", None, None, ""))
            return
        if len(failures) >= MAX_FAILURES:
            rows.append((study.name, run, f"skipped ({MAX_FAILURES} failed in a row)", None, None, ""))
            return
        predicted, basis = clock.predict(run, study.steps, study.tokens_per_step)
        left = stop_at - time.time()
        if predicted * SAFETY + MARGIN_S > left:
            log(f"skip {run.id}: predicted {predicted:.0f} s ({basis}), {left:.0f} s left before the stop")
            rows.append((study.name, run, "skipped (budget)", None, predicted, basis))
            return
        log(f"run {run.id}: predicted {predicted:.0f} s ({basis}), {left:.0f} s left")
        t0 = time.time()
        limit = max(SLOW * predicted, SLOW_FLOOR_S)  # a run far slower than predicted stops, its speed kept
        try:
            state = run_one(study, run, position, total, stop_at, limit, log)
        except Budget:
            state = "skipped (budget)"
        wall = time.time() - t0
        if state == "done":
            clock.observe(run, study.steps, wall)
        elif state.startswith("stopped"):
            clock.observe_stopped(run)
        if state == "failed":
            failures.append(run.id)
            if len(failures) == MAX_FAILURES:
                log(f"{MAX_FAILURES} runs failed in a row ({', '.join(failures)}): no more runs are launched")
        else:
            failures.clear()
        log(f"  {run.id}: {state} in {wall:.1f} s")
        rows.append((study.name, run, state, wall, predicted, basis))

    order = sweep_order(sweep)
    for k, run in enumerate(order):
        attempt(sweep, run, k + 1, len(order))

    best = {}
    for arm in sweep.arms:
        losses = {r.lr_other: final_loss(r) for r in sweep.runs if r.arm is arm}
        losses = {k: v for k, v in losses.items() if v is not None and math.isfinite(v)}
        if losses:
            best[arm.name] = min(losses, key=losses.get)
    log("best lr_other per arm: " + (", ".join(f"{a} {v:g}" for a, v in best.items()) or "none (no sweep run finished)"))
    for a in raw_main["arm"]:
        if a["name"] in best:
            a["lr_other"] = best[a["name"]]
    main_path = write_study(raw_main, os.path.join(lease_dir, "main.toml"), HEADER)
    main_study = load_study(main_path, args.binary)
    seeds = sorted({r.seed for r in main_study.runs})
    todo = [r for s in seeds for r in main_study.runs if r.seed == s and r.arm.name in best]
    for run in main_study.runs:
        if run.arm.name not in best:
            rows.append((main_study.name, run, "skipped (no sweep result)", None, None, ""))
    for k, run in enumerate(todo):
        attempt(main_study, run, k + 1, len(todo))

    # reports: each in its own process (a report that fails must not lose the others' files)
    env = checkout_env()
    report_logs = []
    for cmd in (["sweep", sweep_path], ["report", main_path, "--binary", args.binary]):
        proc = subprocess.run([sys.executable, "-m", "study"] + cmd, capture_output=True, text=True, env=env)
        report_logs.append(f"$ python -m study {' '.join(cmd)}  (exit {proc.returncode})\n{proc.stdout}{proc.stderr}")
        log(f"python -m study {cmd[0]}: exit {proc.returncode}")
    with open(os.path.join(lease_dir, "reports.log"), "w") as f:
        f.write("\n".join(report_logs))

    summary = write_summary(args, sweep, main_study, rows, best, started, report_logs)
    log(f"summary: {summary}")
    if args.pack:
        pack(args.pack, out, lease_dir, summary, args.stages)
        log(f"packed into {args.pack}: {', '.join(sorted(os.listdir(args.pack)))}")
    lease_log.close()
    done = [r for r in rows if r[2] == "done"]
    return 0 if done else 1


def write_summary(args, sweep, main_study, rows, best, started, report_logs):
    path = os.path.join(sweep.out, "lease", "summary.txt")
    lines = [f"GPU study lease: {sweep.name} then {main_study.name}, {sweep.steps} steps x {sweep.tokens_per_step:,} "
             f"tokens per run, binary {args.binary}" + (" (--tiny: the host dry run's sizes)" if args.tiny else ""),
             f"started {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime(started))}, finished after "
             f"{time.time() - started:.0f} s; deadline {args.deadline - started:.0f} s after the start, reserve "
             f"{args.reserve:.0f} s"]
    if args.stages and os.path.exists(args.stages):
        lines += ["", "stages before the runs:"] + ["  " + x for x in open(args.stages).read().splitlines()]
    lines += ["", "runs, in the order tried (wall: the run and its evaluations; predicted: before it started, "
              "with the basis; ms/step: median after the first step):",
              f"  {'study':<15} {'run':<34} {'state':<26} {'wall s':>7} {'pred s':>7} {'ms/step':>8} {'tok/s':>10} "
              f"{'final val':>9}  basis"]
    for name, run, state, wall, predicted, basis in rows:
        ms = median_ms(run) if state == "done" else None
        tps = f"{sweep.tokens_per_step / ms * 1e3:,.0f}" if ms else "-"
        loss = final_loss(run)
        lines.append(f"  {name:<15} {run.id:<34} {state:<26} {fmt(wall, 1):>7} {fmt(predicted, 0):>7} {fmt(ms, 2):>8} "
                     f"{tps:>10} {fmt(loss, 4):>9}  {basis}")
    lines += ["", "best lr_other per arm (sweep, seed 42): "
              + (", ".join(f"{a} {v:g}" for a, v in best.items()) or "none"),
              "(report.md reads the seeds' study alone, which has one lr_other per arm; the sweep that chose it "
              "is sweep.md; the Muon rates are the files', not swept)"]
    edge = [a.name for a in sweep.arms if a.name in best and len(a.lr_others) > 1
            and best[a.name] in (min(a.lr_others), max(a.lr_others))]
    if edge:
        lines.append("at the grid's edge (extend the grid before trusting the comparison): " + ", ".join(edge))
    counts = {}
    for _, _, state, *_ in rows:
        counts[state] = counts.get(state, 0) + 1
    lines += ["states: " + ", ".join(f"{v} {k}" for k, v in counts.items()), "", "reports:"]
    lines += ["  " + x for x in "\n".join(report_logs).splitlines()[-30:]]
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines), flush=True)
    return path


def fmt(x, digits):
    return "-" if x is None else f"{x:.{digits}f}"


def pack(dest, out, lease_dir, summary, stages=None):
    """At most 8 files into dest: the summary, the reports' markdown and main figures, and one
    tarball of everything else a reader needs (no checkpoints)."""
    os.makedirs(dest, exist_ok=True)
    report_dir, sweep_dir = os.path.join(out, "report"), os.path.join(out, "report-sweep")
    picks = {"summary.txt": summary, "report.md": os.path.join(report_dir, "report.md"),
             "sweep.md": os.path.join(sweep_dir, "sweep.md"), "sweep.png": os.path.join(sweep_dir, "sweep.png")}
    for name in ("final_loss.png", "loss_curves.png", "regions.png"):
        picks[name] = os.path.join(report_dir, name)
    for name, src in picks.items():
        if os.path.exists(src):
            shutil.copyfile(src, os.path.join(dest, name))
    with tarfile.open(os.path.join(dest, "logs.tar.gz"), "w:gz") as tar:
        for path in sorted(glob.glob(os.path.join(out, "runs", "*", "*"))):
            if os.path.isfile(path):  # command, stdout/stderr, log.jsonl, status, evaluations; not ckpt/
                tar.add(path, arcname=os.path.relpath(path, out))
        for folder in (lease_dir, report_dir, sweep_dir):
            for path in sorted(glob.glob(os.path.join(folder, "*"))):
                if os.path.isfile(path):
                    tar.add(path, arcname=os.path.relpath(path, out))
        if stages:  # the shell script's own logs (stages, build, the carried trainer's check) beside it
            for path in sorted(glob.glob(os.path.join(os.path.dirname(stages), "gpu-study-*"))):
                tar.add(path, arcname=os.path.join("lease", os.path.basename(path)))
    assert set(os.listdir(dest)) <= set(PACKED), os.listdir(dest)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except StudyError as e:
        sys.stderr.write(f"gpu_lease: {e}\n")
        sys.exit(2)
