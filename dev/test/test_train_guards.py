"""Failures a run must not pass over in silence (issue 41; the fp32 host train_san of
TRAIN_SAN_FP32_BIN, which `make test` sets: the diverging runs below need its exact numbers).

- A log that cannot be written (--log /dev/full: every write fails with ENOSPC) stops the run
  with exit 1, naming the file and the reason (it used to end with exit 0 and no log).
- The divergence guard (--spike-guard K, default 3; llmc/train/run_log.h DivergenceGuard):
  AdamW at --lr 1e3 takes the training loss from ~5.5 to ~1e10 at step 2; the run stops at
  step 2, names it, and saves nothing of it (step_1.bin alone is there). At --lr 1e6 the
  training loss stays finite but the validation loss at step 4 is NaN: the run stops at
  step 4 before saving step_4.bin.
- With the guard off (--spike-guard 0) the same NaN validation is logged as JSON null with
  "nonfinite": true (every line parses as strict JSON, and study/runs.py reads the
  record), --keep-last 1 keeps step_2.bin (the newest with a finite validation loss) beside
  step_4.bin, and --resume DIR passes over step_4.bin for step_2.bin, saying so.
Cost: 6 runs of a few tiny-preset steps, ~2 s."""
import json
import os
import sys

import pytest

from trainer_cli import ROOT, run_binary, write_pattern_corpus
from study import runs as run_files  # noqa: E402

BIN = os.environ.get("TRAIN_SAN_FP32_BIN")
pytestmark = pytest.mark.skipif(not BIN, reason="TRAIN_SAN_FP32_BIN not set (make test sets it)")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_pattern_corpus(tmp_path_factory.mktemp("data"), {"toy_train_000000": 400, "toy_val_000000": 40})


def args(data, steps=12):
    return ["--preset", "tiny", "--train-data", data / "toy_train_*.bin", "--val-data", data / "toy_val_*.bin",
            "--sample-tokens", "0", "--optimizer", "adamw", "--log-every", "1", "--steps", steps]


def run(a, check=False):
    return run_binary(BIN, a, check)


def test_a_log_that_cannot_be_written_stops_the_run(data):
    proc = run(args(data, steps=3) + ["--log", "/dev/full"])
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    assert "--log /dev/full: cannot write to the log: No space left on device" in proc.stderr


def test_a_training_loss_spike_stops_before_saving(data, tmp_path):
    proc = run(args(data) + ["--lr", "1e3", "--save-every", "1", "--checkpoint-dir", tmp_path])
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    assert "error: step 2: the training loss is " in proc.stderr and "the run diverged" in proc.stderr
    assert f"stopped before saving; the last checkpoint written is {tmp_path}/step_1.bin (step 1)" in proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_1.bin"]


# (AdamW at 1e6: the training loss stays at ~5.52, but the validation loss after step 4 is NaN)
NAN_AT_4 = ["--lr", "1e6", "--lr-other", "1e6", "--val-every", "2", "--save-every", "2", "--keep-last", "1"]


def test_a_nonfinite_validation_stops_before_saving(data, tmp_path):
    proc = run(args(data) + NAN_AT_4 + ["--checkpoint-dir", tmp_path])
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    assert "error: step 4: the validation loss is " in proc.stderr and "not finite" in proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_2.bin"]


def test_without_the_guard_nonfinite_values_are_null_and_the_good_checkpoint_stays(data, tmp_path):
    ckpt, log = tmp_path / "ckpt", tmp_path / "log.jsonl"
    proc = run(args(data) + NAN_AT_4 + ["--spike-guard", "0", "--checkpoint-dir", ckpt, "--log", log])
    assert proc.returncode == 1 and "step 5: the loss is" in proc.stderr, (proc.stdout, proc.stderr)

    def strict(constant):
        raise ValueError(f"{constant} is not JSON")
    lines = open(log).read().splitlines()
    records = [json.loads(line, parse_constant=strict) for line in lines]  # every line, strict JSON
    val = [r for r in records if "val_loss" in r]
    assert [(r["step"], r["val_loss"] is None, r.get("nonfinite")) for r in val] == [(2, False, None), (4, True, True)]
    assert [r["step"] for r in run_files.read_log(log)[1]] == [2, 4]
    # --keep-last 1 kept step_2.bin, the newest with a finite validation loss
    assert sorted(p.name for p in ckpt.iterdir()) == ["step_2.bin", "step_4.bin"]
    proc = run(args(data) + ["--resume", ckpt, "--print-config", "1"])
    assert f"resume: passing over {ckpt}/step_4.bin: saved after a validation loss that is not finite" in proc.stdout
    assert f"resume: {ckpt}/step_2.bin (the newest checkpoint of {ckpt})" in proc.stdout, proc.stdout + proc.stderr


def test_spike_guard_values(data):
    for bad in ("1", "-2", "0.5"):
        proc = run(args(data, steps=2) + ["--spike-guard", bad])
        assert proc.returncode == 1 and "--spike-guard must be 0 (off) or a factor > 1" in proc.stderr, proc.stderr
