"""scripts/gpu_check.sh --quick without a GPU: the script runs in a copy of the tree whose every
outside command is a fake (nvidia-smi, nvcc, make, compute-sanitizer, ncu, Python, the test
binaries, bench_gpu.sh), so that what is checked is the script itself: one make for everything it
builds, the stages in order, each stage's timeout drawn from what is left of the budget (a slow
stage is cut off, later ones are skipped, the whole run ends inside its budget), CUDA's tools found
beside nvcc when PATH lacks them, a stage it could not run shown as skipped and never passed (issue
55: a missing compute-sanitizer used to leave the kernel tests' row ok, and a failing nvcc
--version the machine's), and its output packed into at most 8 files under $OUT (the device tool
returns no more), as the README says. Also dev/gpu_profile.py, which turns the profile stage's
ncu CSV into the time per kernel."""
import os
import re
import shutil
import subprocess
import tarfile
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STAGES = ["machine", "build", "kernel-tests", "sanitizer", "debug-states", "train", "profile", "bench"]

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


# ncu [options] BINARY ARGS: writes a one-kernel CSV to --log-file, then runs the binary
FAKE_NCU = """#!/usr/bin/env bash
echo "ncu $*" >> "$FAKE_CALLS"
log=
while [ "${1#--}" != "$1" ]; do
  case $1 in --csv) shift ;; --log-file) log=$2; shift 2 ;; *) shift 2 ;; esac
done
[ -n "$log" ] && printf '"ID","Kernel Name","Metric Name","Metric Unit","Metric Value"\\n"0","k()","gpu__time_duration.sum","nsecond","1"\\n' > "$log"
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
    cuda_bin = tmp_path / "cuda" / "bin"  # CUDA's tools: beside nvcc ($NVCC), not on PATH
    cuda_bin.mkdir(parents=True)
    program = tmp_path / "fake_program"
    write_program(program, FAKE_PROGRAM)
    for name in ("nvidia-smi", "python3"):
        write_program(bin_dir / name, FAKE_PROGRAM)
    write_program(cuda_bin / "nvcc", FAKE_PROGRAM)
    write_program(bin_dir / "make", FAKE_MAKE)
    write_program(cuda_bin / "compute-sanitizer", FAKE_SANITIZER)
    write_program(cuda_bin / "ncu", FAKE_NCU)
    write_program(root / "scripts" / "bench_gpu.sh", FAKE_PROGRAM)
    # PATH without this machine's own CUDA tools, so that only the fakes can be found
    path = [bin_dir] + [d for d in os.environ["PATH"].split(":")
                        if not any(os.path.exists(os.path.join(d, t)) for t in ("nvcc", "compute-sanitizer", "ncu"))]
    env = {**os.environ, "PATH": ":".join(map(str, path)), "NVCC": str(cuda_bin / "nvcc"),
           "FAKE_CALLS": str(tmp_path / "calls"), "FAKE_PROGRAM": str(program), "PYTHON": str(bin_dir / "python3"),
           "OUT": str(tmp_path / "out")}
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
    assert any(c.startswith("nvcc --version") for c in calls)
    profiled = [c for c in calls if c.startswith("ncu ")]
    assert len(profiled) == 1 and "--metrics gpu__time_duration.sum " in profiled[0], profiled
    assert "build/gpu-bf16/train_san --preset san20" in profiled[0] and "--steps 2 " in profiled[0], profiled
    assert any(c.startswith("python3 dev/gpu_profile.py") and "profile.csv --steps 2" in c for c in calls)
    assert proc.stdout.rstrip().splitlines()[-2].endswith("all steps passed"), proc.stdout

    out = tmp / "out"
    files = returned_files(out)
    assert sorted(files) == ["gpu-check-logs.tar.gz", "profile.txt", "summary.txt"]
    assert len(files) <= 8 and all(re.fullmatch(r"[A-Za-z0-9._-]+", f) for f in files)
    assert summary_rows((out / "summary.txt").read_text()) == rows
    with tarfile.open(out / "gpu-check-logs.tar.gz") as tar:
        names = {os.path.relpath(n, "quick") for n in tar.getnames()}
    assert {f"{stage}.log" for stage in STAGES} | {"profile.csv", "profile.txt"} <= names, names
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
    assert "SOME STEPS FAILED, 2 skipped" in proc.stdout


def test_a_stage_whose_tool_is_missing_is_skipped_never_ok(tree):
    root, env, tmp = tree
    for tool in ("compute-sanitizer", "ncu"):
        os.remove(tmp / "cuda" / "bin" / tool)
    proc, _ = run_check(root, env)
    assert proc.returncode == 1, proc.stdout
    summary = (tmp / "out" / "summary.txt").read_text()
    rows = summary_rows(summary)
    assert rows["sanitizer"] == "skipped" and rows["profile"] == "skipped", summary
    assert {s for name, s in rows.items() if name not in ("sanitizer", "profile")} == {"ok"}, summary
    assert "compute-sanitizer not found" in summary and "ncu not found" in summary
    assert "all steps passed" not in summary and "2 STEPS SKIPPED (not checked)" in summary
    assert not any(c.startswith(("compute-sanitizer", "ncu")) for c in (tmp / "calls").read_text().splitlines())


def test_a_failing_nvcc_fails_the_machine_stage(tree):
    root, env, tmp = tree
    write_program(tmp / "cuda" / "bin" / "nvcc", "#!/bin/sh\necho 'nvcc: broken' >&2\nexit 3\n")
    proc, _ = run_check(root, env)
    assert proc.returncode == 1 and summary_rows(proc.stdout)["machine"] == "FAIL(3)", proc.stdout


def test_the_profile_table_sums_each_kernels_launches(tmp_path):
    """dev/gpu_profile.py on an ncu CSV written here: launches and times per kernel (template
    arguments kept, argument lists dropped), per step, slowest first, units converted."""
    csv_text = "\n".join([
        "==PROF== Connected to process 1",
        '"ID","Process ID","Kernel Name","Metric Name","Metric Unit","Metric Value"',
        '"0","1","void gemm_kernel<64, 2>(float *, int)","gpu__time_duration.sum","nsecond","3,000"',
        '"1","1","norm_kernel(float *)","gpu__time_duration.sum","usecond","1.5"',
        '"2","1","void gemm_kernel<64, 2>(float *, int)","gpu__time_duration.sum","nsecond","5000"',
        '"3","1","norm_kernel(float *)","gpu__time_duration.sum","usecond","2.5"',
    ])
    path = tmp_path / "profile.csv"
    path.write_text(csv_text)
    proc = subprocess.run([os.sys.executable, os.path.join(ROOT, "dev", "gpu_profile.py"), str(path), "--steps", "2"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    # gemm: 3 + 5 us = 0.008 ms over 2 launches (4 us each); norm: 1.5 + 2.5 us = 0.004 ms; all 0.012 ms
    assert lines[1].split() == ["gemm_kernel<64,", "2>", "2", "1.0", "0.008", "0.004", "4.00", "66.7%"], lines
    assert lines[2].split() == ["norm_kernel", "2", "1.0", "0.004", "0.002", "2.00", "33.3%"], lines
    assert lines[3].split() == ["all", "kernels", "4", "2.0", "0.012", "0.006", "100.0%"], lines
    path.write_text("no csv here\n")
    proc = subprocess.run([os.sys.executable, os.path.join(ROOT, "dev", "gpu_profile.py"), str(path)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and f"gpu_profile: {path}: no ncu CSV header" in proc.stderr, proc.stderr


def test_quick_check_without_a_gpu_says_so(tree):
    root, env, _ = tree
    write_program(os.path.join(env["PATH"].split(":")[0], "nvidia-smi"), "#!/bin/sh\nexit 9\n")
    proc, _ = run_check(root, env)
    assert proc.returncode == 1 and "no NVIDIA GPU here" in proc.stderr
