"""scripts/gpu_study.sh, the GPU study of one lease (doc/gpu-runs/README.md "The GPU study"), as
its host dry run: on a tiny corpus in the knowledge corpus's layout (written here), `--pack`
compresses it, `--host` unpacks it, runs the sweep (studies/mini_gpu_other.toml) and the seeds
at each arm's best rate (studies/mini_gpu.toml) at tiny sizes on the host build, and writes at
most 8 files; checked against the runs' own logs. Also: the shipped pair of study files, the
sweep's order, the budget rule (a budget too short for any run still writes the summary and says
why), a trainer that fails every run (three tried, the rest skipped), a run far slower than
predicted (stopped, its steps predicting the rest), and the GPU machine's path (a stand-in
nvidia-smi; the carried trainer taken when its -h runs). Needs TRAIN_SAN_FP32_BIN (build/host-fp32/train_san; make test sets it)."""
import json
import os
import subprocess
import sys
import tarfile
import time
import tomllib

import numpy as np
import pytest

from attnref.shards import write_exercises, write_regions, write_shard
from study import gpu_lease, spec
from study.spec import StudyError, load_study

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SCRIPT = os.path.join(ROOT, "scripts", "gpu_study.sh")
BIN = os.environ.get("TRAIN_SAN_FP32_BIN", os.path.join(ROOT, "build", "host-fp32", "train_san"))
needs_bin = pytest.mark.skipif(not os.path.exists(BIN), reason=f"{BIN} not built (make build/host-fp32/train_san PRECISION=FP32)")
CORPUS = "data/offline-knowledge-v2048"
EXERCISES = ["dict_define", "dict_pos", "dict_lookup"]


def documents(rng, n, lo, hi, regions):
    """n documents of lo..hi tokens (BOS 2 first), with query / trace / answer regions when asked."""
    toks, regs, exs = [], [], []
    for _ in range(n):
        k = int(rng.integers(lo, hi))
        toks += [2] + rng.integers(3, 2048, size=k - 1).tolist()
        if regions:
            q, t = k // 2, k // 4
            regs += [0] + [1] * (q - 1) + [2] * t + [3] * (k - q - t)
            exs += [int(rng.integers(1, len(EXERCISES) + 1))] * k
    return np.array(toks), np.array(regs, dtype=np.uint8), np.array(exs, dtype=np.uint8)


def write_corpus(work):
    rng = np.random.default_rng(5)
    base = os.path.join(work, CORPUS)
    for sub in ("mixed", "knowledge"):
        os.makedirs(os.path.join(base, sub), exist_ok=True)
    for corpus, n in (("mixed/mixed_train", 350), ("knowledge/knowledge_val", 60)):
        tokens, regions, exercises = documents(rng, n, 20, 60, regions=True)
        path = os.path.join(base, f"{corpus}_000000.bin")
        write_shard(path, tokens)
        write_regions(path.replace(".bin", ".regions"), regions)
        write_exercises(path.replace(".bin", ".exercises"), exercises, ["none"] + EXERCISES)
    with open(os.path.join(base, "manifest.json"), "w") as f:
        json.dump({"note": "a test corpus in the knowledge corpus's layout"}, f)


def gpu_study(*args, env=None, timeout=240):
    return subprocess.run(["bash", SCRIPT, *args], capture_output=True, text=True, timeout=timeout,
                          env=dict(os.environ, PYTHON=sys.executable, **(env or {})))


def final_loss(run_dir):
    val = [json.loads(x) for x in open(os.path.join(run_dir, "log.jsonl")) if '"val_loss"' in x]
    return val[-1]["val_loss"]


def test_shipped_files_pair():
    """mini_gpu.toml is mini_gpu_other.toml's arms with one lr_other each (so the seed-42 run at an
    arm's best rate is the sweep's), its lr_other inside the sweep's grid, three seeds; the sweep's
    grid is 2x-spaced and reaches the CPU optimum 3.84e-2; the partners are match.py's."""
    sweep, main = (tomllib.load(open(os.path.join(ROOT, "studies", n), "rb")) for n in ("mini_gpu_other.toml", "mini_gpu.toml"))
    gpu_lease.check_pair(sweep, main)
    s, m = (load_study(os.path.join(ROOT, "studies", n)) for n in ("mini_gpu_other.toml", "mini_gpu.toml"))
    assert m.seeds == [42, 43, 44] and s.seeds == [42]
    for arm, marm in zip(s.arms, m.arms):
        grid = sorted(arm.lr_others)
        assert all(abs(b / a - 2) < 1e-9 for a, b in zip(grid, grid[1:])) and 3.84e-2 in grid, arm.name
        assert marm.lr_others[0] in grid
    with pytest.raises(StudyError, match="arms differ"):
        bad = dict(main, arm=[dict(a, lr=0.01) for a in main["arm"]])
        gpu_lease.check_pair(sweep, bad)
    with pytest.raises(StudyError, match="study.steps differs"):
        gpu_lease.check_pair(sweep, dict(main, study=dict(main["study"], steps=801)))


def test_sweep_order_is_middle_out():
    assert gpu_lease.middle_out([0.0096, 0.0192, 0.0384]) == [0.0192, 0.0384, 0.0096]
    assert gpu_lease.middle_out([1, 2, 3, 4, 5]) == [3, 4, 2, 5, 1]
    s = load_study(os.path.join(ROOT, "studies", "mini_gpu_other.toml"))
    order = gpu_lease.sweep_order(s)
    assert [r.lr_other for r in order[:4]] == [0.0192] * 4 and [r.arm.name for r in order[:4]] == [a.name for a in s.arms]
    assert sorted(r.id for r in order) == sorted(r.id for r in s.runs)


def test_toml_round_trip(tmp_path):
    raw = tomllib.load(open(os.path.join(ROOT, "studies", "mini_gpu.toml"), "rb"))
    tiny = gpu_lease.adapt(raw, tiny=True)
    path = spec.write_study(tiny, str(tmp_path / "lease" / "main.toml"), gpu_lease.HEADER)
    assert tomllib.load(open(path, "rb")) == tiny
    flags = tiny["study"]["flags"]
    assert flags[flags.index("--n-embd") + 1] == "64" and tiny["study"]["steps"] == 6 and "tokens" not in tiny["study"]
    assert tiny["study"]["out"] == "logs/studies/mini-gpu-dry-run"  # never the study's own runs
    resized = gpu_lease.adapt(raw, steps=400)["study"]
    assert (resized["steps"], resized["val_every"], resized["out"]) == (400, 100, "logs/studies/mini-gpu-400steps")


@needs_bin
def test_host_dry_run(tmp_path, monkeypatch):
    """--pack, then --host on the packed corpus: every sweep run and every seed at the best rates
    done, the best rates those of the runs' own logs, at most 8 files back, the tarball without
    checkpoints."""
    work = tmp_path / "work"
    write_corpus(str(work))
    packed = gpu_study("--pack", "--work", str(work), env={"GPU_STUDY_NO_BINARY": "1"})
    assert packed.returncode == 0, packed.stdout + packed.stderr
    assert (work / "build" / "gpu-study" / "knowledge-v2048.tar.xz").exists()
    os.rename(work / CORPUS, tmp_path / "original")  # so that the run unpacks the archive
    out = tmp_path / "out"
    os.makedirs(work / "build" / "host-fp32", exist_ok=True)
    proc = gpu_study("--host", "--work", str(work), "--out", str(out),
                     env={"GPU_STUDY_BUDGET": "400", "GPU_STUDY_RESERVE": "40"})
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert "unpack: build/gpu-study/knowledge-v2048.tar.xz" in proc.stdout
    for name in ("mixed/mixed_train_000000.bin", "knowledge/knowledge_val_000000.regions"):
        assert (work / CORPUS / name).read_bytes() == (tmp_path / "original" / name).read_bytes()

    files = sorted(os.listdir(out))
    assert files == sorted(gpu_lease.PACKED), files
    for png in (f for f in files if f.endswith(".png")):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    study_out = work / "logs" / "studies" / "mini-gpu-dry-run"
    monkeypatch.chdir(work)  # (study.out is relative to the working directory)
    sweep = load_study(str(study_out / "lease" / "sweep.toml"))
    main = load_study(str(study_out / "lease" / "main.toml"))
    assert sweep.steps == main.steps == 6 and sweep.tokens_per_step == 128
    for arm in sweep.arms:
        losses = {r.lr_other: final_loss(r.dir) for r in sweep.runs if r.arm is arm}
        assert main.arm(arm.name).lr_others == [min(losses, key=losses.get)], arm.name
    for run in sweep.runs + main.runs:
        assert json.load(open(os.path.join(run.dir, "status.json")))["state"] == "done", run.id
    summary = (out / "summary.txt").read_text()
    rows = [line.split() for line in summary.splitlines() if line.startswith("  mini-gpu")]
    assert [r[1] for r in rows] == [r.id for r in gpu_lease.sweep_order(sweep)] + [
        r.id for s in (42, 43, 44) for r in main.runs if r.seed == s], summary  # sweep middle-out, then seed by seed
    assert [" ".join(r[2:4]) for r in rows].count("done before") == len(main.arms)
    assert "unpack:" in summary and "states: 20 done, 4 done before" in summary
    report = (out / "report.md").read_text()
    for arm in main.arms:
        assert arm.name in report
    assert "gap" in report.lower()
    with tarfile.open(out / "logs.tar.gz") as tar:
        names = tar.getnames()
    assert not any("/ckpt/" in n for n in names)
    for run in sweep.runs + main.runs:
        assert f"runs/{run.id}/log.jsonl" in names
    assert "lease/main.toml" in names and "lease/lease.log" in names and "report/report.md" in names


@needs_bin
def test_budget_too_short_for_any_run(tmp_path):
    """No run fits: none is started, each is listed as skipped with its prediction, the main
    study's as without a sweep result, the summary still comes back, and the exit status is 1."""
    work = tmp_path / "work"
    write_corpus(str(work))
    out = tmp_path / "out"
    proc = gpu_study("--host", "--work", str(work), "--out", str(out),
                     env={"GPU_STUDY_BUDGET": "50", "GPU_STUDY_RESERVE": "45"})
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = (out / "summary.txt").read_text()
    assert "states: 12 skipped (budget), 12 skipped (no sweep result)" in summary, summary
    assert "best lr_other per arm (sweep, seed 42): none" in summary
    assert not os.path.exists(work / "logs" / "studies" / "mini-gpu-dry-run" / "runs")


def test_failing_trainer_stops_after_three(tmp_path, monkeypatch):
    """A trainer that fails every run: three are tried, the rest skipped and said why, the summary
    still written, exit status 1."""
    work = tmp_path / "work"
    write_corpus(str(work))
    fake = tmp_path / "train_san"
    fake.write_text("#!/bin/sh\necho 'error: no GPU here (a test trainer)' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.chdir(work)
    proc = subprocess.run([sys.executable, "-m", "study.gpu_lease", "--sweep", os.path.join(ROOT, "studies", "mini_gpu_other.toml"),
                           "--main", os.path.join(ROOT, "studies", "mini_gpu.toml"), "--binary", str(fake), "--tiny",
                           "--deadline", str(time.time() + 300), "--pack", str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=120, env=dict(os.environ, PYTHONPATH=ROOT))
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = (tmp_path / "out" / "summary.txt").read_text()
    assert "states: 3 failed, 9 skipped (3 failed in a row), 12 skipped (no sweep result)" in summary, summary
    assert "no GPU here" in (work / "logs" / "studies" / "mini-gpu-dry-run" / "runs" / "san_lr0.04_lo0.0192_s42" / "stderr.log").read_text()


def test_a_run_far_slower_than_predicted_is_stopped_and_measures_its_arm(tmp_path, monkeypatch):
    """A run past SLOW x its prediction is stopped (the trainer too), and the step time it logged
    predicts the runs after it: here far over the budget, so they are skipped, not tried."""
    work = tmp_path / "work"
    write_corpus(str(work))
    slow = tmp_path / "train_san"  # logs 2 steps of 500 s each, then hangs
    slow.write_text("#!/bin/bash\n[ \"$1\" = -h ] && exit 0\n"
                    "while [ $# -gt 0 ]; do [ \"$1\" = --log ] && log=$2; shift; done\n"
                    "for s in 1 2; do echo \"{\\\"step\\\": $s, \\\"loss\\\": 7.0, \\\"ms\\\": 500000.0}\" >> \"$log\"; done\n"
                    "exec sleep 60\n")
    slow.chmod(0o755)
    monkeypatch.chdir(work)
    monkeypatch.setattr(gpu_lease, "SLOW", 0.01)
    monkeypatch.setattr(gpu_lease, "SLOW_FLOOR_S", 2.0)
    t0 = time.time()
    rc = gpu_lease.main(["--sweep", os.path.join(ROOT, "studies", "mini_gpu_other.toml"), "--main",
                         os.path.join(ROOT, "studies", "mini_gpu.toml"), "--binary", str(slow), "--tiny",
                         "--deadline", str(time.time() + 200), "--reserve", "0", "--pack", str(tmp_path / "out")])
    assert rc == 1 and time.time() - t0 < 60
    summary = (tmp_path / "out" / "summary.txt").read_text()
    assert "states: 1 stopped (over 2 s), 11 skipped (budget), 12 skipped (no sweep result)" in summary, summary
    lease_log = (work / "logs" / "studies" / "mini-gpu-dry-run" / "lease" / "lease.log").read_text()
    assert "skip san_lr0.04_lo0.0384_s42: predicted " in lease_log and "stopped run" in lease_log, lease_log
    status = work / "logs" / "studies" / "mini-gpu-dry-run" / "runs" / "san_lr0.04_lo0.0192_s42" / "status.json"
    assert not status.exists() or json.loads(status.read_text())["state"] == "interrupted"   # (resumed by a later run)


def test_device_mode_takes_the_carried_trainer_when_it_runs(tmp_path):
    """On the GPU machine (here: a stand-in nvidia-smi) the script names the card, takes the
    carried build/gpu-study/train_san when its -h runs, and writes the summary into $OUT even
    when every run fails (the stand-in trainer fails them)."""
    work = tmp_path / "work"
    write_corpus(str(work))
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "nvidia-smi").write_text("#!/bin/sh\necho 'NVIDIA H100 80GB HBM3, 9.0, 81559 MiB, 580.159.04'\n")
    carried = work / "build" / "gpu-study" / "train_san"
    carried.parent.mkdir(parents=True)
    carried.write_text("#!/bin/sh\n[ \"$1\" = -h ] && exit 0\necho 'error: a stand-in trainer' >&2\nexit 1\n")
    for f in (bindir / "nvidia-smi", carried):
        f.chmod(0o755)
    out = tmp_path / "out"
    proc = gpu_study("--work", str(work), env={"OUT": str(out), "PATH": f"{bindir}:{os.environ['PATH']}"})
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = (out / "summary.txt").read_text()
    assert "machine: NVIDIA H100 80GB HBM3, 9.0, 81559 MiB" in summary, summary
    assert "trainer: the carried build/gpu-study/train_san runs here" in summary
    assert f"binary {carried}" in summary and "states: 3 failed, 9 skipped (3 failed in a row)" in summary
    assert "800 steps x 16,384 tokens per run" in summary  # the study's own sizes, not the dry run's
