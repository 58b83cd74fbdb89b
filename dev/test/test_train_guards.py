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
- (issue 53) A resume checks its first step against the saved run's recent losses (the
  checkpoint keeps the guard's window): resumed from the step_1.bin above, it stops at step 2
  as the run did (it used to start with an empty window and train on from the blown-up weights).
- A healthy run whose training data turns to another corpus (a shard of random tokens after the
  patterns, --shuffle 0) is stopped by the guard where the data changes, naming both shards and
  how to pass it (--spike-guard 0, with which it runs to its end).
Cost: 11 runs of a few tiny-preset steps, ~4 s."""
import json
import os
import sys

import pytest

import numpy as np

from attnref.shards import read_shard, write_shard
from trainer_cli import ROOT, VOCAB, run_binary, write_pattern_corpus
from study import runs as run_files

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


def test_the_first_step_after_a_resume_is_checked(data, tmp_path):
    # (issue 53: a resume began with an empty window, so a run resumed from step_1.bin of the run above
    # trained on from its blown-up weights: every step after it passed the guard, exit 0)
    assert run(args(data) + ["--lr", "1e3", "--save-every", "1", "--checkpoint-dir", tmp_path]).returncode == 1
    proc = run(["--resume", tmp_path])
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    assert "error: step 2: the training loss is " in proc.stderr and "the run diverged" in proc.stderr, proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_1.bin"]


STEPS_ON_A, ROWS, T = 13, 8, 64  # (the tiny preset's context)


def test_a_loss_jump_where_the_data_changes_says_how_to_pass_it(tmp_path):
    # a healthy run whose training data turns to another corpus: shard a (the toy patterns, exactly
    # STEPS_ON_A batches of ROWS windows of T + 1 tokens) in order, then shard b (random tokens)
    write_pattern_corpus(tmp_path, {"patterns": 400})
    a_tokens = read_shard(str(tmp_path / "patterns.bin"))[:STEPS_ON_A * ROWS * T + 1]
    write_shard(str(tmp_path / "a_train_000000.bin"), a_tokens)
    write_shard(str(tmp_path / "b_train_000001.bin"), np.random.default_rng(1).integers(3, VOCAB, size=4 * ROWS * T + 1))
    # (at this rate the patterns' loss falls to ~1.2 over shard a, and shard b's first step is at ~6.6: ~4.8 x)
    a = ["--preset", "tiny", "--train-data", tmp_path / "*_train_*.bin", "--sample-tokens", "0", "--optimizer", "adamw",
         "--lr", "0.01", "--lr-other", "0.01", "--shuffle", "0", "--batch-size", ROWS, "--spike-window", "8",
         "--steps", STEPS_ON_A + 4]
    proc = run(a)
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    assert (f"error: step {STEPS_ON_A + 1}: the training loss is " in proc.stderr and "stopped by the guard where the "
            f"data changes (this step read {tmp_path}/b_train_000001.bin, the step before {tmp_path}/a_train_000000.bin)"
            in proc.stderr and "pass it with --spike-guard 0" in proc.stderr), proc.stderr
    assert run(a + ["--spike-guard", "0"]).returncode == 0


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
