"""A change of what a binary is built with rebuilds it (issue 51): each build folder stamps its
compiler, flags and the libraries found (DIR/build-flags), and its binaries depend on the stamp.
The case that broke a fresh machine: `make demo` linked train_san before `make test`'s set-up
installed MPI, and no later make rebuilt it, so the "built without MPI ... install libopenmpi-dev
and rebuild" advice was false.

The checkout's Makefile runs in a scratch tree holding one small program (an MPI start-up through
llmc/parallel/comm.h), so a build takes seconds and the checkout's build/ is never touched. The
host side builds and runs for real; the GPU side uses a stand-in nvcc that records its calls.
"""
import os
import shutil
import subprocess

import pytest

from test_makefile_gpu_arch import FAKE_NVCC  # (the stand-in nvcc: records its calls)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HAS_MPI = os.environ.get("HAS_MPIRUN") == "1" or (shutil.which("mpicxx") and shutil.which("mpirun"))

PROGRAM = """#include "llmc/parallel/comm.h"
int main(int argc, char** argv) {
    Comm comm(&argc, &argv);
    printf("rank %d of %d\\n", comm.rank, comm.world);
    return 0;
}
"""
HOST_BIN = "build/host-bf16/test_ranks"
GPU_BIN = "build/gpu-bf16/test_ranks"


@pytest.fixture
def tree(tmp_path):
    root = tmp_path / "tree"
    (root / "dev" / "test").mkdir(parents=True)
    shutil.copy(os.path.join(ROOT, "Makefile"), root / "Makefile")
    shutil.copytree(os.path.join(ROOT, "llmc"), root / "llmc")
    (root / "dev" / "test" / "test_ranks.cu").write_text(PROGRAM)
    (tmp_path / "bin").mkdir()
    nvcc = tmp_path / "bin" / "nvcc"
    nvcc.write_text(FAKE_NVCC)
    nvcc.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MAKE", "NO_", "HOST_", "GPU_"))}
    env["FAKE_CALLS"] = str(tmp_path / "nvcc-calls")
    return root, env


def make(root, env, *args):
    proc = subprocess.run(["make", "--no-print-directory", "HAS_GPU=0", f"NVCC={root.parent / 'bin' / 'nvcc'}",
                           *args], cwd=root, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def built(root, path, since=None):
    """The binary's mtime (ns); with `since`, whether it is newer than that."""
    t = os.stat(root / path).st_mtime_ns
    return t if since is None else t != since


def mpirun(root, binary):
    return subprocess.run(["bash", os.path.join(ROOT, "scripts", "mpirun.sh"), "-np", "2", str(root / binary)],
                          capture_output=True, text=True, timeout=120)


@pytest.mark.skipif(not HAS_MPI, reason="MPI missing (apt-get install openmpi-bin libopenmpi-dev)")
def test_a_binary_built_without_mpi_is_rebuilt_with_it_and_the_advice_holds(tree):
    root, env = tree
    make(root, env, HOST_BIN, "NO_USE_MPI=1")
    refused = mpirun(root, HOST_BIN)
    assert refused.returncode != 0 and "built without MPI" in refused.stdout + refused.stderr
    assert "run make again" in refused.stdout + refused.stderr   # the advice, followed below

    before = built(root, HOST_BIN)
    make(root, env, HOST_BIN)   # MPI is there now: the advice's "make"
    assert built(root, HOST_BIN, since=before), "the binary built without MPI was not rebuilt"
    assert "-DUSE_MPI" in (root / "build/host-bf16/build-flags").read_text()
    ldd = subprocess.run(["ldd", str(root / HOST_BIN)], capture_output=True, text=True).stdout
    assert "libmpi" in ldd
    ran = mpirun(root, HOST_BIN)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert sorted(ran.stdout.split("\n")[:2]) == ["rank 0 of 2", "rank 1 of 2"]

    # and an unchanged configuration rebuilds nothing
    before = built(root, HOST_BIN)
    make(root, env, HOST_BIN)
    assert not built(root, HOST_BIN, since=before)


def test_every_switch_of_the_host_build_rebuilds_and_only_once(tree):
    root, env = tree
    steps = [["DEBUG_INFO=-g"], ["DEBUG_INFO=-g0"], []]   # each differs from the one before
    if make(root, env, "-s", "print-HOST_GEMM").stdout.strip() != "own":   # oneDNN or OpenBLAS is here
        steps += [["HOST_GEMM=own"], []]
    make(root, env, HOST_BIN, "NO_USE_MPI=1")
    for args in [["NO_USE_MPI=1"] + a for a in steps]:
        before = built(root, HOST_BIN)
        make(root, env, HOST_BIN, *args)
        assert built(root, HOST_BIN, since=before), f"{args}: not rebuilt"
        before = built(root, HOST_BIN)
        make(root, env, HOST_BIN, *args)
        assert not built(root, HOST_BIN, since=before), f"{args}: rebuilt a second time"


def test_the_gpu_build_is_rebuilt_when_a_library_appears(tree):
    root, env = tree
    calls = root.parent / "nvcc-calls"
    make(root, env, GPU_BIN, "NO_USE_MPI=1")
    first = calls.read_text()
    assert "test_ranks.cu" in first and "-DUSE_MPI" not in first
    make(root, env, GPU_BIN, "NO_USE_MPI=1")
    assert calls.read_text() == first, "rebuilt with nothing changed"
    make(root, env, GPU_BIN, "NO_MULTI_GPU=1")   # neither MPI nor NCCL
    second = calls.read_text()[len(first):]
    assert "test_ranks.cu" in second and "-DMULTI_GPU" not in second
    make(root, env, GPU_BIN)
    third = calls.read_text()[len(first) + len(second):]
    assert "test_ranks.cu" in third, "the GPU build did not rebuild when NCCL and MPI came back"
    if shutil.which("mpicxx"):
        assert "-DUSE_MPI" in third


def test_the_tests_built_in_bf16_only_compile_to_the_same_object_in_fp32():
    """make test builds PRECISION_FREE's kernel tests in BF16 only, since they never touch floatX:
    each compiles to the same object in both precisions (at -Og without debug information: a
    quarter quicker than -O1, which is quicker than the build's -O3; at -O0 an unused
    PRECISION_MODE constant is still emitted), so a test that starts to use floatX fails here."""
    names = subprocess.run(["make", "-s", "--no-print-directory", "print-PRECISION_FREE"], cwd=ROOT,
                           capture_output=True, text=True, check=True).stdout.split()
    assert names
    flags = subprocess.run(["make", "-s", "--no-print-directory", "print-HOST_CXXFLAGS"], cwd=ROOT,
                           capture_output=True, text=True, check=True).stdout.split()
    flags = [f for f in flags if f not in ("-MMD", "-MP") and not f.startswith(("-O", "-g", "-DENABLE_"))]
    compiler = ([shutil.which("ccache")] if shutil.which("ccache") else []) + ["g++"]
    for name in names:
        objects = []
        for precision in ("BF16", "FP32"):
            out = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"attn-{os.getpid()}-{name}-{precision}.o")
            subprocess.run(compiler + flags + ["-Og", "-g0", f"-DENABLE_{precision}", "-x", "c++", "-c",
                                               f"dev/test/{name}.cu", "-o", out], cwd=ROOT, check=True)
            objects.append(open(out, "rb").read())
            os.unlink(out)
        assert objects[0] == objects[1], f"{name} compiles to another object in FP32: take it out of PRECISION_FREE"
