"""Checks of study/compare.py and study/to_tensorboard.py, the tools that read ad-hoc runs.

- Two real train_san runs (tiny, 12 steps, AdamW at two rates, region sidecars and a sample of
  training documents): compare.py's table holds each log's last validation record (overall, per
  region, on training documents), its step count and its rate; it writes the PNG where asked and,
  by default, beside the first run.
- The same logs as TensorBoard event files, read back with tensorboard's EventAccumulator: the
  same scalars at the same steps as the JSONL (to float32, TensorBoard's scalar type).
- Logs with the header record the trainers write (doc/formats.md "Training log"): the rates,
  tokens and provenance come from it; runs of the same name are told apart by their folders; a
  study's output directory stands for its runs.
- --follow: records appended to a log are picked up, and a resume record makes TensorBoard drop
  the superseded steps.
The trainer tests need TRAIN_SAN_BIN (make test sets it); the TensorBoard ones the tensorboard
package (requirements.txt). About 5 s.
"""
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from attnref.shards import ShardWriter

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

BIN = os.environ.get("TRAIN_SAN_BIN")
BIN = os.path.join(ROOT, BIN) if BIN else None  # relative to the repository root, as make test sets it
needs_bin = pytest.mark.skipif(not BIN, reason="TRAIN_SAN_BIN not set (make test sets it)")
PYTHON = sys.executable
COMPARE = ["-m", "study", "compare"]
TO_TENSORBOARD = ["-m", "study", "tensorboard"]
VOCAB, BOS, EOS = 250, 2, 1
RATES = (0.002, 0.0005)


def records(log):
    return [json.loads(line) for line in open(log)]


def last_val(log):
    return [r for r in records(log) if "val_loss" in r][-1]


def table_of(stdout):
    """{run: {column: cell}} of compare.py's table (columns two or more spaces apart)."""
    lines = stdout.splitlines()
    header = re.split(r"\s{2,}", lines[0].strip())
    assert set(lines[1].replace(" ", "")) == {"-"}
    rows = {}
    for line in lines[2:]:
        if not line.strip():
            break
        cells = re.split(r"\s{2,}", line.strip())
        assert len(cells) == len(header), line
        rows[cells[0]] = dict(zip(header, cells))
    return rows


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    """Two tiny SAN runs that differ in their AdamW rate: (directory of each)."""
    if not BIN:
        pytest.skip("TRAIN_SAN_BIN not set (make test sets it)")
    d = tmp_path_factory.mktemp("compare")
    rng = np.random.default_rng(0)
    patterns = [rng.integers(10, VOCAB, size=4) for _ in range(5)]
    for split, n in (("train", 400), ("val", 40)):
        w = ShardWriter(d / "data", "toy", split, 1 << 16, VOCAB, with_regions=True)
        for _ in range(n):
            k = rng.integers(len(patterns))
            query, answer = patterns[k], patterns[(k + 1) % len(patterns)][::-1]
            w.add([BOS] + list(query) + [4, 5] + list(answer) + [EOS], [0] + [1] * 4 + [2, 2] + [3] * 4 + [0])
        w.close()
    runs = []
    for lr in RATES:
        run = d / f"lr{lr:g}"
        run.mkdir()
        proc = subprocess.run([BIN, "--preset", "tiny", "--optimizer", "adamw", "--lr", f"{lr:g}", "--steps", "12",
                               "--batch-size", "4", "--seq-len", "32", "--val-every", "6", "--val-batches", "2",
                               "--train-doc-eval", "16", "--sample-tokens", "0",
                               "--train-data", str(d / "data" / "toy_train_*.bin"), "--val-data", str(d / "data" / "toy_val_*.bin"),
                               "--log", str(run / "log.jsonl"), "--checkpoint-dir", str(run / "ckpt")],
                              capture_output=True, text=True, timeout=120, cwd=ROOT)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        runs.append(run)
    return runs


@needs_bin
def test_compare_table_holds_the_logs_last_validation(two_runs, tmp_path):
    a, b = two_runs
    out = tmp_path / "curves.png"
    proc = subprocess.run([PYTHON, *COMPARE, str(a), str(b / "log.jsonl"), "--out", str(out)],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = table_of(proc.stdout)
    assert list(rows) == [a.name, b.name]
    for run, lr in zip(two_runs, RATES):
        row, val, log = rows[run.name], last_val(run / "log.jsonl"), records(run / "log.jsonl")
        assert row["steps"] == row["val at"] == "12" and val["step"] == 12
        assert row["val loss"] == f"{val['val_loss']:.4f}"
        for region in ("query", "trace", "answer"):
            assert row[region] == f"{val[f'val_loss_{region}']:.4f}"
            assert row[f"docs {region}"] == f"{val['train_docs'][f'val_loss_{region}']:.4f}"
        assert row["train docs"] == f"{val['train_docs']['val_loss']:.4f}"
        assert float(re.search(r"\d[\d.e-]*", row["rates"]).group(0)) == lr  # the --lr it ran with
        header = [r["run"] for r in log if "run" in r][-1]
        assert row["tokens"] == (f"{12 * 4 * 32:,}" if "config" in header else "?")
    assert rows[a.name]["val loss"] != rows[b.name]["val loss"]
    assert open(out, "rb").read(8) == b"\x89PNG\r\n\x1a\n"
    # without --out: beside the first run's log
    proc = subprocess.run([PYTHON, *COMPARE, str(a), str(b)], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0 and f"wrote {a / 'compare.png'}" in proc.stdout
    assert open(a / "compare.png", "rb").read(8) == b"\x89PNG\r\n\x1a\n"


def test_compare_reads_the_header_record(tmp_path, capsys):
    """Rates, tokens per step and what made the run come from the header record; two runs in
    folders of the same name are named by their parents; a RUN without a log is named."""
    from study import compare
    for parent, lr, batch in (("a", 6e-4, 8), ("b", 2.4e-3, 4)):
        run = tmp_path / parent / "tiny-san"
        run.mkdir(parents=True)
        header = {"run": {"executor": "host backend", "precision": "fp32", "program": "train_san",
                          "command": f"./train_san --preset tiny --lr {lr:g}", "git_commit": "0123456789ab", "git_dirty": True,
                          "ranks": 2, "config": {"batch-size": str(batch), "seq-len": "64", "grad-accum": "3", "lr": f"{lr:g}"},
                          "rates": {"optimizer": "muon", "lr": lr, "lr_other": 3e-4}}}
        if parent == "a":  # (b: a header from before the trainers counted them)
            header["run"].update(non_embedding=24834, flops_per_token=3393024)
        lines = [header] + [{"step": s, "loss": 5.0 - 0.1 * s, "lr": lr, "grad_norm": 1.0, "ms": 3.0} for s in range(1, 11)]
        lines += [{"step": 10, "val_loss": 4.0 + lr}]
        (run / "log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    assert compare.main([str(tmp_path / "a" / "tiny-san"), str(tmp_path / "b" / "tiny-san"), "--out",
                         str(tmp_path / "c.png")]) == 0
    stdout = capsys.readouterr().out
    rows = table_of(stdout)
    assert rows["a/tiny-san"]["rates"] == "muon 0.0006 (rest 0.0003)" and rows["b/tiny-san"]["rates"] == "muon 0.0024 (rest 0.0003)"
    assert rows["a/tiny-san"]["tokens"] == f"{10 * 8 * 3 * 2 * 64:,}" and rows["b/tiny-san"]["tokens"] == f"{10 * 4 * 3 * 2 * 64:,}"
    assert rows["a/tiny-san"]["val loss"] == f"{4.0 + 6e-4:.4f}"
    assert (rows["a/tiny-san"]["non-emb params"], rows["a/tiny-san"]["MFLOPs/token"]) == ("24,834", "3.39")
    assert (rows["b/tiny-san"]["non-emb params"], rows["b/tiny-san"]["MFLOPs/token"]) == ("?", "?")
    assert "a/tiny-san: commit 0123456789ab (dirty); host backend, fp32; 2 ranks\n  $ ./train_san --preset tiny --lr 0.0006" in stdout
    assert "curves against steps" not in stdout  # every header says its tokens per step
    assert compare.main([str(tmp_path / "a"), str(tmp_path / "nothing.jsonl")]) == 2
    assert f"{tmp_path / 'a'}: the directory holds no log.jsonl" in capsys.readouterr().err
    # a study's output directory: each of its runs (OUT/runs/<id>/log.jsonl)
    for run in ("san_s1", "ffn_s1"):
        (tmp_path / "study" / "runs" / run).mkdir(parents=True)
        (tmp_path / "study" / "runs" / run / "log.jsonl").write_text((tmp_path / "a" / "tiny-san" / "log.jsonl").read_text())
    assert compare.main([str(tmp_path / "study"), "--out", str(tmp_path / "s.png")]) == 0
    assert list(table_of(capsys.readouterr().out)) == ["ffn_s1", "san_s1"]


def scalars(logdir, tag):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    acc = EventAccumulator(str(logdir), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    return [(e.step, e.value) for e in acc.Scalars(tag)], acc


@needs_bin
def test_tensorboard_events_hold_the_logs_scalars(two_runs, tmp_path):
    pytest.importorskip("tensorboard", reason="the tensorboard package (requirements.txt; bash scripts/setup.sh)")
    out = tmp_path / "tb"
    proc = subprocess.run([PYTHON, *TO_TENSORBOARD] + [str(r) for r in two_runs] + ["--out", str(out)],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for run in two_runs:
        log = records(run / "log.jsonl")
        train = [r for r in log if "loss" in r and "val_loss" not in r]
        val = [r for r in log if "val_loss" in r]
        f32 = np.float32
        for tag, recs, get in (("train/loss", train, lambda r: r["loss"]), ("train/lr", train, lambda r: r["lr"]),
                               ("train/grad_norm", train, lambda r: r["grad_norm"]),
                               ("val/loss", val, lambda r: r["val_loss"]), ("val/loss_query", val, lambda r: r["val_loss_query"]),
                               ("train_docs/loss_answer", val, lambda r: r["train_docs"]["val_loss_answer"])):
            got, acc = scalars(out / run.name, tag)
            assert got == [(r["step"], float(f32(get(r)))) for r in recs], tag
        assert "run" in acc.Tags()["tensors"]  # the header, as text


def test_follow_picks_up_appended_records_and_drops_superseded_steps(tmp_path):
    """A log followed while it grows: the new steps appear; after a resume record at step 4, the
    steps logged after that checkpoint before the stop give way to the resumed run's."""
    pytest.importorskip("tensorboard", reason="the tensorboard package (requirements.txt; bash scripts/setup.sh)")
    import types

    from study import to_tensorboard
    log = tmp_path / "run" / "log.jsonl"
    log.parent.mkdir()

    def step(s, loss):
        return json.dumps({"step": s, "loss": loss, "lr": 1e-3, "grad_norm": 1.0, "ms": 2.0}) + "\n"

    log.write_text('{"run": {"executor": "host backend", "precision": "bf16"}}\n' + "".join(step(s, 10.0 - s) for s in range(1, 7))
                   + '{"step": 7, "lo')  # (a line still being written: left for the next read)
    follower = to_tensorboard.Follower(types.SimpleNamespace(path=str(log), name="run"), str(tmp_path / "tb"))
    follower.convert_existing()
    assert scalars(tmp_path / "tb" / "run", "train/loss")[0] == [(s, 10.0 - s) for s in range(1, 7)]
    with open(log, "a") as f:  # the run finishes step 7 and stops; resumed from its step-4 checkpoint
        f.write('ss": 3.0, "lr": 0.001, "grad_norm": 1.0, "ms": 2.0}\n')
        f.write('{"run": {"executor": "host backend", "precision": "bf16"}}\n{"step": 4, "resume": "ckpt/step_4.bin"}\n')
        f.write("".join(step(s, 20.0 - s) for s in range(5, 9)))
    assert follower.poll() == 7
    follower.writer.close()
    want = [(s, 10.0 - s) for s in range(1, 5)] + [(s, 20.0 - s) for s in range(5, 9)]
    assert scalars(tmp_path / "tb" / "run", "train/loss")[0] == want


def test_tensorboard_events_carry_the_logs_times(tmp_path):
    """Each event is at the time the log gives its record: the header's start (UTC) plus the
    step times so far; a resumed run's records from its own header's start (they all carried the
    conversion's time, so TensorBoard's time axes showed nothing)."""
    pytest.importorskip("tensorboard", reason="the tensorboard package (requirements.txt; bash scripts/setup.sh)")
    import calendar
    import types

    from study import to_tensorboard
    log = tmp_path / "run" / "log.jsonl"
    log.parent.mkdir()

    def step(s):
        return json.dumps({"step": s, "loss": 5.0 - 0.1 * s, "lr": 1e-3, "grad_norm": 1.0, "ms": 250.0}) + "\n"
    log.write_text('{"run": {"started": "2026-12-01T10:00:00Z"}}\n' + step(1) + step(2)
                   + json.dumps({"step": 2, "val_loss": 4.5}) + "\n" + step(3) + step(4)
                   + '{"run": {"started": "2026-12-01T11:00:00Z"}}\n{"step": 2, "resume": "ckpt/step_2.bin"}\n'
                   + "".join(step(s) for s in range(3, 5)))
    follower = to_tensorboard.Follower(types.SimpleNamespace(path=str(log), name="run"), str(tmp_path / "tb"))
    follower.convert_existing()
    follower.writer.close()
    first, second = (calendar.timegm((2026, 12, 1, h, 0, 0, 0, 0, 0)) for h in (10, 11))
    _, acc = scalars(tmp_path / "tb" / "run", "train/loss")
    assert [(e.step, e.wall_time) for e in acc.Scalars("train/loss")] == [
        (1, first + 0.25), (2, first + 0.5), (3, second + 0.25), (4, second + 0.5)]
    assert [(e.step, e.wall_time) for e in acc.Scalars("val/loss")] == [(2, first + 0.5)]
