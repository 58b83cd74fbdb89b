"""The start-up card check (llmc/card_check.h) through the host backend's device emulation:
HOSTCUDA_DEVICE names the card, HOSTCUDA_GPU_ARCHS the archs a GPU build would have, and the
host's cudaFuncGetAttributes answers as the driver does (llmc/hostcuda/emulated_device.h).

- A build for sm_90 on an sm_80 card stops before its first kernel with one line naming the
  card, the build's archs and the make line to run (on a GPU the first kernel died with "no
  kernel image is available"); the test binaries do the same (their launches check too).
- A GPU_ARCHS=75 build on an sm_90 card runs its compute_75 PTX, where the tensor-core attention
  kernels are trap stubs: a run that asks for them gets the scalar ones, says why, and trains.
  (Before the check it took the tensor-core kernels and trapped in the first attention.)
- A pre-sm_80 card (a T4) trains, with one warning that says what runs without tensor cores.
Cost: a few one-step runs of the tiny preset, ~3 s."""
import os
import re

import pytest

from trainer_cli import run_binary, write_pattern_corpus

BIN = os.environ.get("TRAIN_SAN_BIN")
pytestmark = pytest.mark.skipif(not BIN, reason="TRAIN_SAN_BIN not set (make test sets it)")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_pattern_corpus(tmp_path_factory.mktemp("data"), {"toy_train_000000": 100})


def train(data, device, archs, *extra):
    env = {**os.environ, "HOSTCUDA_DEVICE": device}
    env.pop("HOSTCUDA_GPU_ARCHS", None)
    if archs is not None:
        env["HOSTCUDA_GPU_ARCHS"] = archs
    return run_binary(BIN, ["--preset", "tiny", "--train-data", data / "toy_train_*.bin", "--batch-size", "2",
                            "--steps", "1", "--val-every", "0", "--sample-tokens", "0", "--log-every", "1", *extra],
                      check=False, env=env)


def is_bf16(proc):
    return "bf16" in proc.stdout.split("\n", 1)[0]


def test_a_build_for_another_card_stops_before_its_first_kernel_and_says_what_to_run(data):
    proc = train(data, "sm_80", "90")
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, proc.stderr
    assert re.fullmatch(r'error: this GPU build has code for GPU_ARCHS="90" only; the GPU is host backend .* \(sm_80\), '
                        r"which runs none of it \(no kernel image for it\): rebuild for it with `make GPU_ARCHS=80` "
                        r'\(GPU_ARCHS="90 80" builds for both; .*\)', errors[0]), errors[0]
    assert not re.search(r"^step\s", proc.stdout, re.M), proc.stdout  # nothing trained


def test_a_test_binary_checks_the_card_too():
    binary = os.path.join(os.path.dirname(BIN), "test_mma")  # (one make test builds beside the trainer)
    if not os.path.exists(binary):
        pytest.skip(f"{binary} not built")
    env = {**os.environ, "HOSTCUDA_DEVICE": "sm_86", "HOSTCUDA_GPU_ARCHS": "89 90"}
    proc = run_binary(binary, ["mma_layout_a"], check=False, env=env)
    assert proc.returncode == 1 and 'GPU_ARCHS="89 90" only; the GPU is host backend' in proc.stderr, proc.stderr
    assert "(sm_86)" in proc.stderr and "`make GPU_ARCHS=86" in proc.stderr
    env["HOSTCUDA_GPU_ARCHS"] = "80 90"  # sm_80 machine code runs on an sm_86
    assert run_binary(binary, ["mma_layout_a"], check=False, env=env).returncode == 0


def test_machine_code_or_ptx_that_runs_passes_without_a_word(data):
    for device, archs in (("sm_86", "80"), ("sm_120", "90"), ("sm_90", "80 90"), ("sm_90", None)):
        proc = train(data, device, archs)
        assert proc.returncode == 0, (device, archs, proc.stderr)
        assert "warning" not in proc.stderr and "GPU_ARCHS" not in proc.stderr, (device, archs, proc.stderr)


def test_a_build_whose_tensor_core_kernels_are_stubs_never_takes_them(data):
    proc = train(data, "sm_90", "75", "--attention-kernels", "tensor-cores")
    if not is_bf16(proc):
        assert "needs a bf16 build" in proc.stderr
        pytest.skip("a bf16 build decides between the kernels")
    assert proc.returncode == 0, proc.stderr
    assert "scalar attention kernels" in proc.stdout, proc.stdout
    assert ("falling back to the scalar kernels (this build's code for the device (sm_90) is compute_75, where the "
            "tensor-core kernels are trap stubs") in proc.stderr, proc.stderr
    warnings = [line for line in proc.stderr.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and 'is compute_75 (GPU_ARCHS="75")' in warnings[0], proc.stderr
    assert "`make GPU_ARCHS=90` builds them" in warnings[0]


def test_a_card_older_than_sm_80_trains_with_one_warning(data):
    proc = train(data, "sm_75", "75")
    assert proc.returncode == 0, proc.stderr
    warnings = [line for line in proc.stderr.splitlines() if line.startswith("warning:")]
    if not is_bf16(proc):
        assert warnings == [], proc.stderr  # fp32 runs the same kernels on every card
        return
    assert len(warnings) == 1, proc.stderr
    assert "(sm_75), older than sm_80" in warnings[0] and "GEMMs run without tensor cores" in warnings[0]


def test_a_bad_emulated_build_is_refused(data):
    proc = train(data, "sm_90", "nine")
    assert proc.returncode != 0 and "HOSTCUDA_GPU_ARCHS='nine': expected compute capabilities" in proc.stderr
