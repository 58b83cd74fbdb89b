"""--train-doc-eval N (the SAN paper's localisation over training documents; doc/san-model.md
"Validation and measurements") against independent computations, on a small offline SYNTH
build (three training shards, so documents cross shard ends):

- the logged "train_docs" decomposition (overall, per region, per exercise x region) equals
  the PyTorch reference's, evaluating each document alone in float64, over the documents a
  Python copy of the documented draw picks (reservoir sampling with SplitMix64 over the
  documents in file order; those longer than T+1 tokens skipped): the target counts exactly,
  the losses to 2e-6 relative (fp32 trainer vs float64 reference; measured: 7.2e-8 at most over
  the overall and region losses);
- the draw skips documents longer than T+1 (the sample drawn here holds some), is a function
  of --train-doc-seed (another seed draws other documents and logs other numbers), and takes
  every document when N is more than the data holds;
- training is untouched: with and without the flag the training losses, gradient norms,
  held-out validation and final parameters are identical; a resume continues the sample
  (same numbers at the same step, without giving the flag again) and the run exactly (every
  tensor and setting of the final checkpoint but where it was written);
- 2 ranks log the same decomposition as 1 (each rank its rows, the sums added);
- bad values fail naming the flag;
- --train-doc-draw paper (the SAN paper code's rule, which --paper-setup 1 sets with seed 3407)
  logs the decomposition of the documents a Python rendering of that rule with CPython's own
  `random` module picks (1 in 10 of the documents in file order, `random.Random(seed).random()
  < 0.1` once per document, those longer than T+1 skipped, until N are kept): the same counts
  printed and the same numbers logged; when the data ends first, every sampled one.
Runs the fp32 host build (TRAIN_SAN_FP32_BIN; `make test-python` sets it). About 15 s."""
import json
import os
import random
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch

from attnref import ops, san
from attnref.container import read_container
from attnref.shards import read_exercises, read_regions, read_shard
from trainer_cli import run_binary

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

BIN = os.environ.get("TRAIN_SAN_FP32_BIN")
pytestmark = pytest.mark.skipif(not BIN, reason="TRAIN_SAN_FP32_BIN not set (make test-python sets it)")

B, T, N, SEED = 4, 192, 40, 7  # T: the documents here have 160-224 tokens, so some are skipped
REGIONS = ("other", "query", "trace", "answer")


def run(args, check=True, ranks=1):
    return run_binary(BIN, args, check, ranks=ranks)


def read_log(path):
    return [json.loads(line) for line in open(path) if line.strip()]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """Vocabulary 1000; 300 training documents in shards of 8,000 tokens, 60 validation ones."""
    out = tmp_path_factory.mktemp("offline")
    subprocess.run([sys.executable, os.path.join(ROOT, "dev/data/build_offline.py"), "--out", str(out), "--vocab-size",
                    "1000", "--synth-train-docs", "300", "--synth-val-docs", "60", "--shard-tokens", "8000",
                    "--eval-items", "4"], check=True, capture_output=True)
    assert len(list((out / "synth").glob("synth_train_*.bin"))) >= 3
    return out


def flags(data, *more):
    return ["--preset", "tiny", "--train-data", data / "synth" / "synth_train_*.bin", "--val-data",
            data / "synth" / "synth_val_*.bin", "--tokenizer", data / "tokenizer.bin", "--batch-size", B,
            "--max-seq-len", T, "--seq-len", T, "--val-batches", 2, "--sample-tokens", 0, "--optimizer", "adamw", "--lr", "3e-3"] + list(more)


@pytest.fixture(scope="module")
def runs(data, tmp_path_factory):
    """4 steps validated at 2 and 4, with --train-doc-eval and without; checkpoints every 2."""
    d = tmp_path_factory.mktemp("runs")
    out = {}
    for name, more in (("with", ["--train-doc-eval", N, "--train-doc-seed", SEED]), ("without", [])):
        proc = run(flags(data, "--steps", 4, "--val-every", 2, "--save-every", 2, "--checkpoint-dir", d / name,
                         "--log", d / f"{name}.jsonl", *more))
        out[name] = (d / name, read_log(d / f"{name}.jsonl"), proc.stdout)
    return out


# ---- the documented draw, written again here --------------------------------------------

class SplitMix64:
    MASK = (1 << 64) - 1

    def __init__(self, seed):
        self.state = seed & self.MASK

    def next(self):
        self.state = (self.state + 0x9E3779B97F4A7C15) & self.MASK
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & self.MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & self.MASK
        return z ^ (z >> 31)

    def below(self, n):
        return (self.next() * n) >> 64


def training_tokens(data, globs=("synth/synth_train_*.bin",)):
    """The training shards back to back, sorted by path as the loader takes them: tokens, regions,
    exercise names per token (a shard without sidecars: region 0, exercise "none")."""
    toks, regs, exs = [], [], []
    for path in sorted(p for g in globs for p in data.glob(g)):
        toks.append(read_shard(path).astype(np.int64))
        side = str(path)[:-4]
        n = len(toks[-1])
        regs.append(read_regions(side + ".regions") if os.path.exists(side + ".regions") else np.zeros(n, np.uint8))
        if os.path.exists(side + ".exercises"):
            ids, names = read_exercises(side + ".exercises")
            exs.append(np.array(names, dtype=object)[ids])
        else:
            exs.append(np.array(["none"] * n, dtype=object))
    return np.concatenate(toks), np.concatenate(regs), np.concatenate(exs)


def draw(tokens, bos, n, seed):
    """(start, length) of the documents drawn, in file order, before the skip."""
    starts = list(np.flatnonzero(tokens == bos)) + [len(tokens)]
    rng, drawn = SplitMix64(seed), []
    for i, (a, b) in enumerate(zip(starts[:-1], starts[1:])):
        if i < n:
            drawn.append((a, b - a))
        elif (j := rng.below(i + 1)) < n:
            drawn[j] = (a, b - a)
    return sorted(drawn)


def exercise_draw(tokens, regions, bos, n, seed, longest):
    """--train-doc-draw exercises, written again: (the exercises it draws from, the drawn ones in
    file order), an exercise being a document of at most `longest` tokens with a query token."""
    starts = list(np.flatnonzero(tokens == bos)) + [len(tokens)]
    fits = [(a, b - a) for a, b in zip(starts[:-1], starts[1:]) if b - a <= longest and (regions[a:b] == 1).any()]
    return len(fits), draw_from(fits, n, seed)


def draw_from(documents, n, seed):
    """Reservoir sampling (SplitMix64) of n of the documents, returned in file order."""
    rng, drawn = SplitMix64(seed), []
    for i, doc in enumerate(documents):
        if i < n:
            drawn.append(doc)
        elif (j := rng.below(i + 1)) < n:
            drawn[j] = doc
    return sorted(drawn)


def paper_draw(tokens, bos, n, seed, longest):
    """The SAN paper code's rule, written again: (documents visited, sampled, kept), the kept as
    (start, length) in file order."""
    starts = list(np.flatnonzero(tokens == bos)) + [len(tokens)]
    rng, visited, sampled, kept = random.Random(seed), 0, 0, []
    for a, b in zip(starts[:-1], starts[1:]):
        if len(kept) == n:
            break
        visited += 1
        if rng.random() < 0.1:
            sampled += 1
            if b - a <= longest:
                kept.append((a, b - a))
    return visited, sampled, kept


def reference_decomposition(model, data, docs, globs=("synth/synth_train_*.bin",)):
    """The validation record's numbers over `docs`, each document evaluated alone in float64."""
    tokens, regions, exercises = training_tokens(data, globs)
    total, count = 0.0, 0
    by_region = {r: [0.0, 0] for r in REGIONS}
    by_exercise = {}
    for start, length in docs:
        doc = torch.from_numpy(tokens[start:start + length])
        with torch.no_grad():
            logits, _ = model(doc[None, :-1])
        logits = logits[0, :, : model.cfg.vocab_size].double()
        y = doc[1:]
        ce = (torch.logsumexp(logits, -1) - logits.gather(-1, y[:, None])[:, 0]).numpy()
        keep = ops.loss_mask(y[None], model.cfg)[0].numpy()
        for t in np.flatnonzero(keep):  # each target by its own region and exercise
            region, exercise = REGIONS[regions[start + 1 + t]], exercises[start + 1 + t]
            total, count = total + ce[t], count + 1
            for s in (by_region[region], by_exercise.setdefault(exercise, {}).setdefault(region, [0.0, 0]),
                      by_exercise[exercise].setdefault("all", [0.0, 0])):
                s[0] += ce[t]
                s[1] += 1
    mean = lambda s: s[0] / s[1]  # noqa: E731
    return {"val_loss": total / count, "val_tokens": count,
            **{f"val_loss_{r}": mean(s) for r, s in by_region.items() if s[1]},
            "val_exercise": {e: {k: mean(s) for k, s in d.items()} for e, d in by_exercise.items() if e != "none"}}


def assert_close(logged, want, rel=2e-6):
    assert logged["val_tokens"] == want["val_tokens"]
    keys = [k for k in want if k.startswith("val_loss")]
    assert sorted(k for k in logged if k.startswith("val_loss")) == sorted(keys)
    for k in keys:
        assert abs(logged[k] - want[k]) <= rel * want[k], (k, logged[k], want[k])
    assert sorted(logged["val_exercise"]) == sorted(want["val_exercise"])
    for e, d in want["val_exercise"].items():
        assert sorted(logged["val_exercise"][e]) == sorted(d), e
        for k, v in d.items():
            assert abs(logged["val_exercise"][e][k] - v) <= rel * v, (e, k, logged["val_exercise"][e][k], v)


# ---- the tests ------------------------------------------------------------------------

def test_decomposition_equals_the_reference_over_the_drawn_documents(data, runs):
    d, log, stdout = runs["with"]
    model, _, _, _ = san.load_checkpoint(str(d / "final.bin"))
    model = model.double().eval()
    tokens, _, _ = training_tokens(data)
    drawn = draw(tokens, model.cfg.bos_id, N, SEED)
    kept = [(a, n) for a, n in drawn if n <= T + 1]
    assert len(drawn) == N and 0 < len(drawn) - len(kept) < N // 2  # the skip matters here
    assert f"{N} drawn, {N - len(kept)} longer than {T + 1} tokens skipped, {len(kept)} packed" in stdout, stdout
    assert "(training documents) step 4: val loss" in stdout
    final = [r for r in log if "val_loss" in r][-1]
    assert final["step"] == 4
    assert_close(final["train_docs"], reference_decomposition(model, data, kept))
    # the held-out validation beside it is another set of documents
    assert final["val_tokens"] != final["train_docs"]["val_tokens"]


def test_sample_is_a_function_of_the_seed(data, runs, tmp_path):
    d, log, _ = runs["with"]
    logged = [r for r in log if "val_loss" in r][-1]["train_docs"]
    model, _, _, _ = san.load_checkpoint(str(d / "final.bin"))
    model = model.double().eval()
    tokens, _, _ = training_tokens(data)
    bos = model.cfg.bos_id
    assert draw(tokens, bos, N, SEED + 1) != draw(tokens, bos, N, SEED)
    # the same seed again, evaluated by --steps 0: the same numbers; another seed: its own documents
    for seed in (SEED, SEED + 1):
        path = tmp_path / f"eval{seed}.jsonl"
        run(flags(data, "--steps", 0, "--init-from", d / "final.bin", "--train-doc-eval", N, "--train-doc-seed", seed,
                  "--log", path))
        again = read_log(path)[-1]["train_docs"]
        if seed == SEED:
            assert again == logged
        else:
            assert again != logged
            kept = [(a, n) for a, n in draw(tokens, bos, N, seed) if n <= T + 1]
            assert_close(again, reference_decomposition(model, data, kept))
    # more than the data holds: every document of at most T+1 tokens once (each scores its
    # targets but the first, the BOS)
    path = tmp_path / "all.jsonl"
    out = run(flags(data, "--steps", 0, "--init-from", d / "final.bin", "--train-doc-eval", 100000, "--log", path)).stdout
    every = draw(tokens, bos, 10 ** 9, 0)
    kept = [(a, n) for a, n in every if n <= T + 1]
    assert f"{len(every)} drawn, {len(every) - len(kept)} longer" in out
    assert read_log(path)[-1]["train_docs"]["val_tokens"] == sum(n - 1 for _, n in kept)


def test_training_is_untouched(runs):
    (dw, with_, _), (dn, without, _) = runs["with"], runs["without"]
    # (the header records differ in the command and config that made each run)
    strip = lambda log: [{k: v for k, v in r.items() if k not in ("ms", "train_docs")} for r in log if "run" not in r]  # noqa: E731
    assert strip(with_) == strip(without)
    assert [r["step"] for r in with_ if "train_docs" in r] == [2, 4] and all("train_docs" not in r for r in without)
    for name in ("step_2.bin", "final.bin"):
        _, meta_w, tensors_w = read_container(str(dw / name))
        _, meta_n, tensors_n = read_container(str(dn / name))
        assert list(tensors_w) == list(tensors_n)
        for k in tensors_w:
            assert np.array_equal(tensors_w[k], tensors_n[k]), k
        # (where each run wrote, and what made it: not a number of it)
        outputs = ("run.train_doc_", "run.log", "run.checkpoint_dir", "run.command", "run.config", "run.started", "run.id")
        assert ({k: v for k, v in meta_w.items() if not k.startswith(outputs)}
                == {k: v for k, v in meta_n.items() if not k.startswith(outputs)})
        assert meta_w["run.train_doc_eval"] == str(N) and meta_w["run.train_doc_seed"] == str(SEED)


def test_resume_continues_the_sample(data, runs, tmp_path):
    d, log, _ = runs["with"]
    run(flags(data, "--resume", d / "step_2.bin", "--checkpoint-dir", tmp_path, "--log", tmp_path / "log.jsonl"))
    resumed = [r for r in read_log(tmp_path / "log.jsonl") if "val_loss" in r]
    assert resumed[-1]["step"] == 4 and resumed[-1]["train_docs"] == [r for r in log if "val_loss" in r][-1]["train_docs"]
    _, meta_r, tensors_r = read_container(str(tmp_path / "final.bin"))
    _, meta_s, tensors_s = read_container(str(d / "final.bin"))
    assert list(tensors_r) == list(tensors_s) and all(np.array_equal(tensors_r[k], tensors_s[k]) for k in tensors_s)
    outputs = ("run.log", "run.checkpoint_dir", "run.command", "run.config", "run.started")  # (where each run wrote, what made it)
    assert {k: v for k, v in meta_r.items() if k not in outputs} == {k: v for k, v in meta_s.items() if k not in outputs}


@pytest.mark.skipif(os.environ.get("HAS_MPIRUN", "1") == "0" or shutil.which("mpirun") is None,
                    reason="no mpirun")
def test_two_ranks_log_the_same_decomposition(data, runs, tmp_path):
    d, log, _ = runs["with"]
    want = [r for r in log if "val_loss" in r][-1]["train_docs"]
    path = tmp_path / "two.jsonl"
    run(flags(data, "--steps", 0, "--init-from", d / "final.bin", "--batch-size", B // 2, "--train-doc-eval", N,
              "--train-doc-seed", SEED, "--log", path), ranks=2)
    assert_close(read_log(path)[-1]["train_docs"], want, rel=1e-6)


@pytest.mark.parametrize("more, message", [
    (["--train-doc-eval", -1], "--train-doc-eval must be >= 0 (training documents to evaluate; 0: none), got -1"),
    (["--train-doc-eval", 5, "--val-data", ""], "--train-doc-eval 5 evaluates documents of --train-data at each "
                                                "validation: it needs --train-data and --val-data"),
    (["--train-doc-eval", 5, "--seq-len", 2], "holds no whole document of at most 3 tokens (5 skipped as longer) "
                                              "(--train-doc-eval 5)"),
])
def test_bad_values_name_the_flag(data, more, message):
    proc = run(flags(data, "--steps", 1) + more, check=False)
    assert proc.returncode != 0 and message in proc.stderr, proc.stderr


def test_paper_draw_equals_a_python_rendering_of_the_rule(data, runs, tmp_path):
    d, _, _ = runs["with"]
    model, _, _, _ = san.load_checkpoint(str(d / "final.bin"))
    model = model.double().eval()
    tokens, _, _ = training_tokens(data)
    bos, n = model.cfg.bos_id, 16
    for seed, more in ((3407, ["--train-doc-draw", "paper", "--train-doc-seed", 3407]), (3407, ["--paper-setup", "1"]),
                       (2 ** 40 + 5, ["--train-doc-draw", "paper", "--train-doc-seed", 2 ** 40 + 5])):
        visited, sampled, kept = paper_draw(tokens, bos, n, seed, T + 1)
        assert len(kept) == n and sampled > n and visited < 300  # the head, and the skip matters
        path = tmp_path / f"paper{seed}{more[0]}.jsonl"
        out = run(flags(data, "--steps", 0, "--init-from", d / "final.bin", "--train-doc-eval", n, "--log", path,
                        *more)).stdout
        assert (f"(--train-doc-eval {n}, --train-doc-draw paper, seed {seed}): 1 in 10 of the first {visited} documents: "
                f"{sampled} sampled, {sampled - n} longer than {T + 1} tokens skipped, {n} packed") in out, out
        assert_close(read_log(path)[-1]["train_docs"], reference_decomposition(model, data, kept))
    # not the uniform draw's documents
    assert kept != [(a, m) for a, m in draw(tokens, bos, n, seed) if m <= T + 1][:n]
    # more than the data holds: every sampled document of at most T+1 tokens
    visited, sampled, kept = paper_draw(tokens, bos, 10 ** 6, 3407, T + 1)
    path = tmp_path / "paper_all.jsonl"
    out = run(flags(data, "--steps", 0, "--init-from", d / "final.bin", "--train-doc-eval", 10 ** 6, "--log", path,
                    "--train-doc-draw", "paper", "--train-doc-seed", 3407)).stdout
    assert (f"1 in 10 of the first {visited} documents: {sampled} sampled, {sampled - len(kept)} longer than {T + 1} "
            f"tokens skipped, {len(kept)} packed") in out and "(the data ends before that many are kept)" in out, out
    assert read_log(path)[-1]["train_docs"]["val_tokens"] == sum(m - 1 for _, m in kept)


def test_exercise_draw_packs_n_exercises(data, runs, tmp_path):
    """--train-doc-draw exercises on data that mixes exercises with other documents (the KJV
    chapters of the build, no regions, beside the SYNTH exercises, as the knowledge build's mixed/
    interleaves entries and exercises): N exercises are evaluated, drawn uniformly from those of at
    most T+1 tokens, where the uniform draw packs fewer (issue 57: 31 of 256 on the knowledge build);
    the decomposition equals the reference's over a Python rendering of the draw."""
    d, _, _ = runs["with"]
    model, _, _, _ = san.load_checkpoint(str(d / "final.bin"))
    model = model.double().eval()
    globs = ("kjv/kjv_train_*.bin", "synth/synth_train_*.bin")
    tokens, regions, _ = training_tokens(data, globs)
    bos = model.cfg.bos_id
    uniform = [(a, m) for a, m in draw(tokens, bos, N, SEED) if m <= T + 1]
    assert sum((regions[a:a + m] == 1).any() for a, m in uniform) < N  # what the uniform draw would evaluate
    starts = list(np.flatnonzero(tokens == bos)) + [len(tokens)]
    short_other = [a for a, b in zip(starts[:-1], starts[1:]) if b - a <= T + 1 and not (regions[a:b] == 1).any()]
    assert short_other  # documents that fit but hold no question: the draw must pass them over
    drawable, drawn = exercise_draw(tokens, regions, bos, N, SEED, T + 1)
    assert len(drawn) == N and not set(a for a, _ in drawn) & set(short_other)
    path = tmp_path / "exercises.jsonl"
    train = ",".join(str(data / g) for g in globs)
    args = flags(data, "--steps", 0, "--init-from", d / "final.bin", "--train-doc-eval", N, "--train-doc-seed", SEED,
                 "--train-doc-draw", "exercises", "--log", path)
    args[args.index("--train-data") + 1] = train
    out = run(args).stdout
    assert (f"(--train-doc-eval {N}, --train-doc-draw exercises, seed {SEED}): {N} drawn of the {drawable} exercises "
            f"of at most {T + 1} tokens (a query token)") in out, out
    assert_close(read_log(path)[-1]["train_docs"], reference_decomposition(model, data, drawn, globs))
    # data without a question anywhere: a clear error naming the flag
    args[args.index("--train-data") + 1] = str(data / "kjv" / "kjv_train_*.bin")
    proc = run(args, check=False)
    assert proc.returncode != 0 and "--train-doc-eval" in proc.stderr and "no exercise to draw" in proc.stderr, proc.stderr
