"""scripts/gpu_check.sh --quick without a GPU: the script runs in a copy of the tree whose every
outside command is a fake (nvidia-smi, nvcc, make, compute-sanitizer, Python, the test binaries,
bench_gpu.sh), so that what is checked is the script itself: one make for everything it builds,
the stages in order, each stage's timeout drawn from what is left of the budget (a slow stage
is cut off, later ones are skipped, the whole run ends inside its budget), and its output packed
into at most 8 files under $OUT (the device tool returns no more), as the README says."""
import os
import re
import shutil
import subprocess
import tarfile
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STAGES = ["machine", "build", "kernel-tests", "debug-states", "train", "bench"]

# a program that says it ran, records its command line, and hangs when FAKE_SLOW names it
FAKE_PROGRAM = """#!/usr/bin/env bash
name=$(basename "$0")
echo "$name $*" >> "$FAKE_CALLS"
echo "fake $name: $*"
case " ${FAKE_SLOW:-} " in *" $name "*) sleep 1000 ;; esac
exit 0
"""

# make: print-VAR answers nothing (no cuDNN headers); targets become fake programs
FAKE_MAKE = """#!/usr/bin/env bash
echo "make $*" >> "$FAKE_CALLS"
for a in "$@"; do
  case $a in
    print-*) exit 0 ;;
    build/*) mkdir -p "$(dirname "$a")" && cp "$FAKE_PROGRAM" "$a" && chmod +x "$a" ;;
  esac
done
"""

# compute-sanitizer --tool T --error-exitcode 1 BINARY ARGS: runs the binary
FAKE_SANITIZER = """#!/usr/bin/env bash
echo "compute-sanitizer $*" >> "$FAKE_CALLS"
while [ "${1#--}" != "$1" ]; do shift 2; done
exec "$@"
"""


def write_program(path, text):
    with open(path, "w") as f:
        f.write(text)
    os.chmod(path, 0o755)


@pytest.fixture
def tree(tmp_path):
    """A tree with the real gpu_check.sh and run_tests.sh and fakes for everything else."""
    root = tmp_path / "tree"
    (root / "scripts").mkdir(parents=True)
    for script in ("gpu_check.sh", "run_tests.sh"):
        shutil.copy(os.path.join(ROOT, "scripts", script), root / "scripts" / script)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    program = tmp_path / "fake_program"
    write_program(program, FAKE_PROGRAM)
    for name in ("nvidia-smi", "nvcc", "python3"):
        write_program(bin_dir / name, FAKE_PROGRAM)
    write_program(bin_dir / "make", FAKE_MAKE)
    write_program(bin_dir / "compute-sanitizer", FAKE_SANITIZER)
    write_program(root / "scripts" / "bench_gpu.sh", FAKE_PROGRAM)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "FAKE_CALLS": str(tmp_path / "calls"),
           "FAKE_PROGRAM": str(program), "PYTHON": str(bin_dir / "python3"), "OUT": str(tmp_path / "out")}
    env.pop("FAKE_SLOW", None)
    return root, env, tmp_path


def run_check(root, env, timeout=120):
    start = time.monotonic()
    proc = subprocess.run(["bash", str(root / "scripts" / "gpu_check.sh"), "--quick", str(root / "logs" / "quick")],
                          cwd=root, env=env, capture_output=True, text=True, timeout=timeout)
    return proc, time.monotonic() - start


def summary_rows(text):
    """{stage: status} of the summary table, in order."""
    rows = {}
    for line in text.splitlines():
        words = line.split()
        if words and words[0] in STAGES:
            rows[words[0]] = words[1]
    return rows


def returned_files(out):
    return [os.path.relpath(os.path.join(d, f), out) for d, _, files in os.walk(out) for f in files]


def test_quick_check_builds_once_runs_the_stages_in_order_and_packs_its_logs(tree):
    root, env, tmp = tree
    proc, _ = run_check(root, env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = summary_rows(proc.stdout)
    assert list(rows) == STAGES and set(rows.values()) == {"ok"}, proc.stdout
    calls = (tmp / "calls").read_text().splitlines()
    builds = [c for c in calls if c.startswith("make ") and "build/" in c]
    assert len(builds) == 1, builds  # one make -j for every binary the stages run
    for binary in ("test_mma", "test_attention", "test_backend", "test_san", "test_gpt2", "train_san"):
        assert f"build/gpu-bf16/{binary} " in builds[0] + " "
        assert any(c.startswith(f"{binary} ") for c in calls), f"{binary} never ran"
    for binary in ("train_gpt2", "attention_forward", "attention_backward"):  # for bench_gpu.sh
        assert f"build/gpu-bf16/{binary} " in builds[0] + " "
    sanitized = [c for c in calls if c.startswith("compute-sanitizer")]
    assert [re.search(r"--tool (\w+)", c).group(1) for c in sanitized] == ["racecheck", "initcheck"]
    assert all(c.endswith("build/gpu-bf16/test_attention hd64") for c in sanitized), sanitized
    assert any(c.startswith("train_san --preset san20") and "--steps 20" in c for c in calls)

    out = tmp / "out"
    files = returned_files(out)
    assert sorted(files) == ["gpu-check-logs.tar.gz", "summary.txt"]
    assert len(files) <= 8 and all(re.fullmatch(r"[A-Za-z0-9._-]+", f) for f in files)
    assert summary_rows((out / "summary.txt").read_text()) == rows
    with tarfile.open(out / "gpu-check-logs.tar.gz") as tar:
        names = {os.path.relpath(n, "quick") for n in tar.getnames()}
    assert {f"{stage}.log" for stage in STAGES} <= names, names
    assert {"summary.txt", "test-logs/test_attention.log", "test-logs/test_san.log"} <= names, names


def test_quick_check_keeps_to_its_budget(tree):
    """A stage that hangs is cut off at what is left of the budget, the stages after it are
    skipped, the run ends inside its budget and still packs its logs."""
    root, env, tmp = tree
    budget, reserve = 24, 4
    env = {**env, "GPU_CHECK_BUDGET": str(budget), "GPU_CHECK_RESERVE": str(reserve), "FAKE_SLOW": "train_san"}
    proc, seconds = run_check(root, env)
    assert proc.returncode == 1, proc.stdout
    rows = summary_rows(proc.stdout)
    assert rows["kernel-tests"] == "ok" and rows["train"] == "TIMEOUT" and rows["bench"] == "skipped", proc.stdout
    assert "budget spent" in proc.stdout
    assert budget - reserve - 10 <= seconds <= budget + 3, seconds  # the train stage had most of the budget
    assert sorted(returned_files(tmp / "out")) == ["gpu-check-logs.tar.gz", "summary.txt"]


def test_quick_check_without_a_gpu_says_so(tree):
    root, env, _ = tree
    write_program(os.path.join(env["PATH"].split(":")[0], "nvidia-smi"), "#!/bin/sh\nexit 9\n")
    proc, _ = run_check(root, env)
    assert proc.returncode == 1 and "no NVIDIA GPU here" in proc.stderr
