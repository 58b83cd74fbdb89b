"""The Makefile's GPU targets without a GPU: the Makefile runs in a scratch tree with one trainer
source and fake nvcc and nvidia-smi, so that what is checked is the Makefile itself: the arch
it detects (the first GPU's compute capability, 90 without one), the machine code for each arch
of GPU_ARCHS plus the newest's PTX, a rebuild exactly when the arch changes (the flags stamp),
and the sm_80/sm_90 device-code checks (make test-all's, make test's only on a GPU machine; none
differs today: the last test keeps it so)."""
import os
import re
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# nvcc: records its command line, creates what -o names (answers --version: the build stamp asks;
# --list-gpu-code as CUDA 13.0's nvcc does: the Makefile checks GPU_ARCHS against it)
FAKE_NVCC = """#!/usr/bin/env bash
[ "$1" = --version ] && { echo "Build cuda_0.0 (a stand-in)"; exit 0; }
[ "$1" = --list-gpu-code ] && { printf 'sm_%s\\n' 75 80 86 87 88 89 90 100 110 103 120 121; exit 0; }  # CUDA 13.0's
echo "$*" >> "$FAKE_CALLS"
while [ $# -gt 0 ]; do
  if [ "$1" = -o ]; then touch "$2"; fi
  shift
done
"""


def write_program(path, text):
    with open(path, "w") as f:
        f.write(text)
    os.chmod(path, 0o755)


@pytest.fixture
def tree(tmp_path):
    root = tmp_path / "tree"
    root.mkdir()
    shutil.copy(os.path.join(ROOT, "Makefile"), root / "Makefile")
    (root / "train_x.cu").write_text("int main() { return 0; }\n")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    write_program(bin_dir / "nvcc", FAKE_NVCC)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPU_", "MAKE"))}
    env.update(PATH=f"{bin_dir}:{os.environ['PATH']}", FAKE_CALLS=str(tmp_path / "calls"))
    return root, env, tmp_path


def set_card(tmp, answer):
    """nvidia-smi answers the compute-capability query with `answer`, or fails (None)."""
    body = f"echo '{answer}'" if answer is not None else "exit 9"
    write_program(tmp / "bin" / "nvidia-smi", f"#!/bin/sh\n{body}\n")


def make(root, env, *args, check=True):
    proc = subprocess.run(["make", "--no-print-directory", "NVCC=" + str(root.parent / "bin" / "nvcc"), "CCACHE=",
                           "HAS_GPU=0", *args], cwd=root, env=env, capture_output=True, text=True, timeout=120)
    if check:
        assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def nvcc_calls(tmp):
    path = tmp / "calls"
    calls = path.read_text().splitlines() if path.exists() else []
    path.unlink(missing_ok=True)
    return calls


def archs_of(compile_line):
    """The (virtual arch, code) pairs of a compile's --generate-code flags."""
    return re.findall(r"--generate-code arch=compute_(\w+),code=(\w+)", compile_line)


@pytest.mark.parametrize("answer, arch", [("8.6", "86"), ("9.0", "90"), ("12.0", "120"), (None, "90"), ("N/A", "90")])
def test_the_arch_is_the_first_gpus(tree, answer, arch):
    root, env, tmp = tree
    set_card(tmp, answer)
    assert make(root, env, "-s", "print-GPU_ARCHS").stdout.strip() == arch


def test_a_changed_arch_rebuilds_and_nothing_else_does(tree):
    root, env, tmp = tree
    set_card(tmp, "8.6")
    make(root, env, "build/gpu-bf16/train_x")
    compile_line = [c for c in nvcc_calls(tmp) if " -c train_x.cu" in c][0]
    assert archs_of(compile_line) == [("86", "sm_86"), ("86", "compute_86")]
    make(root, env, "build/gpu-bf16/train_x")
    assert nvcc_calls(tmp) == []  # the same flags: nothing to do
    make(root, env, "build/gpu-bf16/train_x", "GPU_ARCHS=80 86 89 90")
    compile_line = [c for c in nvcc_calls(tmp) if " -c train_x.cu" in c][0]
    assert archs_of(compile_line) == [("80", "sm_80"), ("86", "sm_86"), ("89", "sm_89"), ("90", "sm_90"),
                                      ("90", "compute_90")]  # a fat binary: each arch's code, the newest's PTX
    make(root, env, "build/gpu-bf16/train_x", "GPU_ARCHS=80 86 89 90")
    assert nvcc_calls(tmp) == []
    make(root, env, "build/gpu-bf16/train_x")  # back to the card's
    assert any(" -c train_x.cu" in c for c in nvcc_calls(tmp))


def test_gpu_build_checks_the_trainers_for_sm_80_and_sm_90(tree):
    root, env, tmp = tree
    set_card(tmp, "8.6")
    make(root, env, "gpu-arch-check")
    calls = nvcc_calls(tmp)
    checks = sorted(re.search(r"-arch=(sm_\d+) -cubin train_x.cu", c).group(1) for c in calls)
    assert checks == ["sm_80", "sm_90"]
    # with -c: ccache takes an nvcc call without it for a link and never caches it
    assert all(" -c " in f" {c} " for c in calls), calls
    make(root, env, "gpu-arch-check", "GPU_ARCHS=80 90")  # built by the build itself: nothing more
    assert nvcc_calls(tmp) == []


def test_without_a_gpu_the_arch_check_is_test_alls(tree):
    root, env, tmp = tree
    set_card(tmp, None)
    make(root, env, "gpu-build")  # make test's nvcc build: for sm_90, no arch check
    assert [c for c in nvcc_calls(tmp) if "-cubin" in c] == []
    make(root, env, "gpu-build", "TEST_ALL=1")  # make test-all's
    assert [re.search(r"-arch=(sm_\d+) -cubin", c).group(1) for c in nvcc_calls(tmp) if "-cubin" in c] == ["sm_80"]


def test_without_a_gpu_the_nvcc_build_proves_it_compiles_unoptimised(tree):
    root, env, tmp = tree
    set_card(tmp, None)
    make(root, env, "gpu-build")
    compile_line = [c for c in nvcc_calls(tmp) if " -c train_x.cu" in c][0]
    assert " -O0 " in compile_line and " -O3 " not in compile_line
    assert " -Xcicc -O0 -Xptxas -O0 " in compile_line  # the device code too: never run here
    make(root, env, "build/gpu-bf16/train_x")  # a user's build: optimised, so rebuilt (the flags stamp)
    compile_line = [c for c in nvcc_calls(tmp) if " -c train_x.cu" in c][0]
    assert " -O3 " in compile_line and " -O0 " not in compile_line and "-Xcicc" not in compile_line


def test_nvccs_O_leaves_the_device_code_as_it_is(tmp_path):
    """Why -O0 proves as much: nvcc's -O is the host code's; the fat binary (each arch's machine
    code and PTX) is the same byte for byte."""
    nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    if not os.path.exists(nvcc) or not shutil.which("objcopy"):
        pytest.skip("needs nvcc and objcopy")
    (tmp_path / "k.cu").write_text(
        "__global__ void axpy(float a, const float* x, float* y, int n) {\n"
        "    int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
        "    for (; i < n; i += gridDim.x * blockDim.x) { y[i] = a * x[i] + y[i] * y[i] / (1.0f + x[i]); }\n}\n"
        "int main() { axpy<<<1, 32>>>(2.0f, nullptr, nullptr, 0); return 0; }\n")
    fatbins = []
    for opt in ("-O0", "-O3"):
        obj, fatbin = tmp_path / f"k{opt}.o", tmp_path / f"k{opt}.fatbin"
        subprocess.run([nvcc, opt, "--generate-code", "arch=compute_90,code=sm_90", "-c", str(tmp_path / "k.cu"),
                        "-o", str(obj)], check=True, capture_output=True, timeout=300)
        subprocess.run(["objcopy", "-O", "binary", "--only-section=.nv_fatbin", str(obj), str(fatbin)], check=True)
        fatbins.append(fatbin.read_bytes())
    assert fatbins[0] and fatbins[0] == fatbins[1]


def test_no_code_path_differs_between_sm_80_and_sm_90():
    """Why make test (no GPU) builds device code for sm_90 alone: no source compares __CUDA_ARCH__
    with a value that tells sm_80 from sm_90. One that does needs the sm_80 check back in make
    test (Makefile, gpu-build)."""
    compare = re.compile(r"__CUDA_ARCH__\s*(>=|<=|==|!=|>|<)\s*(\d+)")
    tells = {">=": lambda v: 800 < v <= 900, "<": lambda v: 800 < v <= 900, ">": lambda v: 800 <= v < 900,
             "<=": lambda v: 800 <= v < 900, "==": lambda v: v in (800, 900), "!=": lambda v: v in (800, 900)}
    found = []
    for top, dirs, files in os.walk(ROOT):
        if top == ROOT:  # (not the venv, the builds, runs and datasets)
            dirs[:] = [d for d in dirs if d not in (".git", ".venv", "build", "logs", "data")]
        for name in files:
            if name.endswith((".cu", ".cuh", ".h")):
                path = os.path.join(top, name)
                for op, value in compare.findall(open(path, errors="replace").read()):
                    if tells[op](int(value)):
                        found.append(f"{os.path.relpath(path, ROOT)}: __CUDA_ARCH__ {op} {value}")
    assert found == [], "code that differs between sm_80 and sm_90: " + "; ".join(found)


def test_a_bad_arch_is_refused(tree):
    root, env, tmp = tree
    set_card(tmp, None)
    proc = make(root, env, "-s", "print-GPU_ARCHS", "GPU_ARCHS=8.6", check=False)
    assert proc.returncode != 0 and "GPU_ARCHS: '8.6' is not a compute capability" in proc.stderr


def test_an_arch_this_nvcc_cannot_build_is_named(tree):
    """(issue 55) CUDA 13 has no sm_70: `make GPU_ARCHS=70` for a V100 failed inside nvcc without
    saying so; the Makefile now names the arch, what this nvcc builds, and the CUDA 12 a V100 needs."""
    root, env, tmp = tree
    set_card(tmp, "7.0")
    proc = make(root, env, "build/gpu-bf16/train_x", check=False)
    assert proc.returncode != 0, proc.stdout
    assert "GPU_ARCHS: this nvcc" in proc.stderr and "cannot build sm_70; it builds sm_75 sm_80" in proc.stderr
    assert "a V100, sm_70, needs CUDA 12" in proc.stderr
    assert nvcc_calls(tmp) == []
    make(root, env, "build/gpu-bf16/train_x", "GPU_ARCHS=75 90a")  # (an 'a' arch is its base arch's)
