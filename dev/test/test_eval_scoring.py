"""Eval-set scoring inside the trainers (--eval-sets, --eval-every; llmc/train/eval_scoring.h)
against an independent scoring of the same checkpoint and files by the PyTorch reference
(dev/eval/reference_eval.py): multiple choice (acc, acc_norm), cloze (acc, perplexity),
rolling (word and token perplexity, with documents longer than the window) and partial
(Winogrande's: each choice its own context, one continuation; acc), for train_san
and train_gpt2, fp32 host builds (TRAIN_SAN_FP32_BIN; train_gpt2 next to it).

Tolerance: perplexities rtol 1e-4 (the trainers' fp32 logits differ from PyTorch's by ~1e-6
relative; the measured relative differences are printed, below 1e-5); accuracies exactly,
after checking that no item of the reference is within 1e-3 of a tie (so that the same
decision is expected). About 25 s on 2 cores, most of it the two 30-step training runs.
"""
import json
import os
import subprocess

import numpy as np
import pytest

from attnref.evalset import KIND_CLOZE, KIND_MC, KIND_PARTIAL, KIND_ROLLING, read_evalset, write_evalset
from attnref.shards import write_shard

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SAN = os.environ.get("TRAIN_SAN_FP32_BIN")
pytestmark = pytest.mark.skipif(not SAN, reason="TRAIN_SAN_FP32_BIN not set (make test sets it)")
VOCAB, BOS, WINDOW = 250, 2, 16
RTOL = 1e-4


def binary(trainer):
    path = os.path.join(ROOT, SAN if trainer == "san" else os.path.join(os.path.dirname(SAN), "train_gpt2"))
    if not os.path.exists(path):
        pytest.skip(f"{path} not built")
    return path


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    """Training data of four repeated patterns, and eval sets of the four kinds drawn from them."""
    rng = np.random.default_rng(1)
    patterns = [list(rng.integers(3, VOCAB, size=n)) for n in (3, 4, 5, 6)]
    d = tmp_path_factory.mktemp("evaldata")
    for name, n_docs in (("toy_train_000000", 300), ("toy_val_000000", 20)):
        tokens = []
        for _ in range(n_docs):
            tokens += [BOS] + list(np.tile(patterns[rng.integers(4)], 6))
        write_shard(d / f"{name}.bin", np.array(tokens, dtype=np.int64))

    def doc(k, n):
        return list(np.tile(patterns[k], 20))[:n]
    mc, cloze, rolling = [], [], []
    for i in range(24):
        k = int(rng.integers(4))
        ctx = [BOS] + doc(k, int(rng.integers(2, 12)))
        true = doc(k, len(ctx) - 1 + 3)[len(ctx) - 1:]
        choices = [true] + [list(rng.integers(3, VOCAB, size=int(rng.integers(1, 5)))) for _ in range(3)]
        perm = rng.permutation(4)
        mc.append({"context": ctx, "choices": [choices[j] for j in perm], "gold": int(np.argmin(perm)),
                   "choice_chars": [int(rng.integers(1, 4)) for _ in range(4)]})
        n = int(rng.integers(2, 10))
        full = doc(k, n + int(rng.integers(1, 4)))
        # some targets follow the pattern (greedy hits), some are noise (misses)
        target = full[n:] if i % 3 else list(rng.integers(3, VOCAB, size=2))
        cloze.append({"context": [BOS] + full[:n], "choices": [target], "gold": 0, "choice_chars": [1]})
    for i in range(6):  # documents up to 3 windows long: first, full and partial windows
        n = int(rng.integers(1, 3 * WINDOW + 5))
        rolling.append({"context": [BOS], "choices": [doc(i % 4, n)], "gold": 0,
                        "choice_chars": [int(rng.integers(1, n + 1))]})
    partial = []
    for i in range(24):  # the pattern's continuation after its own prefix, or after noise of another length
        k, m = int(rng.integers(4)), int(rng.integers(2, 9))
        cont = doc(k, m + 3)[m:]
        own = [doc(k, m), list(rng.integers(3, VOCAB, size=int(rng.integers(1, 9))))]
        order = rng.permutation(2)
        partial.append({"context": [BOS], "choices": [own[j] + cont for j in order],
                        "choice_chars": [len(own[j]) for j in order], "gold": int(np.argmin(order))})
    sets = {"mc": (mc, KIND_MC), "cloze": (cloze, KIND_CLOZE), "rolling": (rolling, KIND_ROLLING),
            "partial": (partial, KIND_PARTIAL)}
    for name, (items, kind) in sets.items():
        write_evalset(d / f"{name}.bin", items, kind, VOCAB, f"test set {name}")
    return d


def run(trainer, args):
    # (--run-dir '': the outputs are the test's, as trainer_cli.run_binary)
    p = subprocess.run([binary(trainer)] + [str(a) for a in args] + ["--run-dir="], cwd=ROOT, capture_output=True,
                       text=True, timeout=300)
    if p.returncode != 0:
        raise AssertionError(f"train_{trainer} failed ({p.returncode}):\n{p.stdout}\n{p.stderr}")
    return p


def eval_records(log):
    return {r["step"]: r["eval"] for r in map(json.loads, open(log)) if "eval" in r}


def eval_sets(toy):
    return ",".join(str(toy / f"{n}.bin") for n in ("mc", "cloze", "rolling", "partial"))


@pytest.fixture(scope="module")
def trained(toy, tmp_path_factory):
    """30 steps of each trainer with the sets scored every 15 steps and at the end."""
    out = {}
    for trainer in ("san", "gpt2"):
        d = tmp_path_factory.mktemp(f"evalrun_{trainer}")
        run(trainer, ["--preset", "tiny", "--train-data", toy / "toy_train_*.bin", "--val-data", toy / "toy_val_*.bin",
                      "--batch-size", 3, "--seq-len", WINDOW, "--steps", 30, "--val-every", 0, "--val-batches", 1,
                      "--optimizer", "adamw", "--lr", "3e-3", "--sample-tokens", 0, "--checkpoint-dir", d,
                      "--log", d / "log.jsonl", "--eval-sets", eval_sets(toy), "--eval-every", 15])
        out[trainer] = d
    return out


def reference_scores(ckpt, path):
    import reference_eval
    model, V, T = reference_eval.load_reference(str(ckpt))
    es = read_evalset(path)
    return es, reference_eval.score_evalset(model, V, min(T, WINDOW), es)


def acc_norm_with(es, ref, extra):
    """acc_norm if every length were `extra` characters longer (a normalisation mistake)."""
    hits = 0
    for it, res in zip(es["items"], ref["items"]):
        v = [r[0] / (n + extra) for r, n in zip(res, it["choice_chars"])]
        hits += max(range(len(v)), key=lambda i: (v[i], -i)) == it["gold"]
    return hits / len(es["items"])


def assert_no_near_ties(es, ref):
    for it, res in zip(es["items"], ref["items"]):
        if es["kind"] not in (KIND_MC, KIND_PARTIAL):
            continue
        ll = [r[0] for r in res]
        for vals in (ll, [x / n for x, n in zip(ll, it["choice_chars"])]) if es["kind"] == KIND_MC else (ll,):
            top = sorted(vals, reverse=True)
            assert top[0] - top[1] > 1e-3, "a near tie: choose another seed"


@pytest.mark.parametrize("trainer", ["san", "gpt2"])
def test_trainer_scores_equal_the_reference(trainer, trained, toy):
    records = eval_records(trained[trainer] / "log.jsonl")
    assert sorted(records) == [15, 30]  # --eval-every 15, and the end of the run
    final = records[30]
    worst = 0.0
    for name in ("mc", "cloze", "rolling", "partial"):
        es, ref = reference_scores(trained[trainer] / "final.bin", toy / f"{name}.bin")
        got = final[name]
        assert got["n"] == ref["n"]
        assert_no_near_ties(es, ref)
        for key in ("acc", "acc_norm"):
            if key in ref:
                assert got[key] == pytest.approx(ref[key], abs=1e-9), (name, key)
        for key in ("perplexity", "word_perplexity", "token_perplexity"):
            if key in ref:
                assert got[key] == pytest.approx(ref[key], rel=RTOL), (name, key)
                worst = max(worst, abs(got[key] / ref[key] - 1))
        assert set(got) - {"n"} == set(ref) - {"n", "items"}
        if name == "mc":  # the set tells lm-eval's length from the length with the delimiter counted
            assert acc_norm_with(es, ref, 0) == ref["acc_norm"] != acc_norm_with(es, ref, 1)
    print(f"{trainer}: largest relative perplexity difference to the reference {worst:.2e}")
    # a trained model is not at chance: the cloze targets that follow the pattern are greedy
    assert 0.2 < final["cloze"]["acc"] < 1 and final["mc"]["acc"] > 0.5 and final["partial"]["acc"] > 0.5
    assert set(final["partial"]) == {"n", "acc"}  # as lm-eval's winogrande
    assert records[15] != records[30]


def test_steps_0_init_from_scores_the_checkpoint(trained, toy, tmp_path):
    """--steps 0 --init-from: the same numbers as the end of the run that wrote the checkpoint:
    the same counts, and real numbers up to rounding (the batch size differs, and OpenBLAS, the
    host GEMM, may sum a row's products in another order when a product has another number
    of rows: 2e-9 relative measured; a checkpoint read wrongly moves them by far more)."""
    log = tmp_path / "eval.jsonl"
    p = run("san", ["--steps", 0, "--init-from", trained["san"] / "final.bin", "--seq-len", WINDOW,
                    "--batch-size", 5, "--eval-sets", eval_sets(toy), "--log", log, "--sample-tokens", 0])
    assert "eval rolling (6 items): word_perplexity" in p.stdout
    # the evaluation is logged at the checkpoint's step; its scores are those the training run logged last
    got, want = eval_records(log), {30: eval_records(trained["san"] / "log.jsonl")[30]}
    assert got.keys() == want.keys() and got[30].keys() == want[30].keys()
    for name, scores in want[30].items():
        assert got[30][name].keys() == scores.keys(), name
        for key, value in scores.items():
            if isinstance(value, float):
                assert got[30][name][key] == pytest.approx(value, rel=1e-6), (name, key)
            else:
                assert got[30][name][key] == value, (name, key)


def test_bad_eval_options_are_named(toy, tmp_path):
    p = subprocess.run([binary("san"), "--run-dir=", "--preset", "tiny", "--train-data", str(toy / "toy_train_*.bin"), "--steps", "1",
                        "--eval-every", "5"], capture_output=True, text=True, timeout=60)
    assert p.returncode != 0 and "--eval-every 5: no --eval-sets" in p.stderr
    write_evalset(tmp_path / "v.bin", [{"context": [2], "choices": [[5]], "gold": 0, "choice_chars": [1]}], KIND_CLOZE,
                  300, "")
    p = subprocess.run([binary("san"), "--run-dir=", "--preset", "tiny", "--train-data", str(toy / "toy_train_*.bin"), "--steps", "1",
                        "--eval-sets", str(tmp_path / "v.bin")], capture_output=True, text=True, timeout=60)
    assert p.returncode != 0 and "vocabulary of 300; the model has 250" in p.stderr



CONTEXTS = (4, 9, WINDOW)  # shorter windows than the run's, and the run's own


@pytest.mark.parametrize("trainer", ["san", "gpt2"])
def test_eval_context_scores_rolling_sets_in_windows_of_n(trainer, trained, toy, tmp_path):
    """--eval-context 4,9,16: each rolling score at N equals the reference's rolling windows of N
    tokens (evalset.rolling_requests); at N = T it is today's number; the other kinds are untouched."""
    import reference_eval
    log = tmp_path / "context.jsonl"
    ckpt = trained[trainer] / "final.bin"
    p = run(trainer, ["--steps", 0, "--init-from", ckpt, "--seq-len", WINDOW, "--batch-size", 3,
                      "--eval-sets", eval_sets(toy), "--eval-context", ",".join(map(str, CONTEXTS)), "--log", log,
                      "--sample-tokens", 0])
    assert "eval rolling at context 4: word_perplexity@4" in p.stdout
    (got,) = eval_records(log).values()  # (one evaluation, at the checkpoint's step)
    model, V, _ = reference_eval.load_reference(str(ckpt))
    es = read_evalset(toy / "rolling.bin")
    ref = {n: reference_eval.score_evalset(model, V, n, es) for n in CONTEXTS}
    for n in CONTEXTS:
        for key in ("word_perplexity", "token_perplexity"):
            assert got["rolling"][f"{key}@{n}"] == pytest.approx(ref[n][key], rel=RTOL), (n, key)
    # the windows matter: a 4-token window sees less of the repeated pattern than 16 tokens
    assert abs(ref[4]["token_perplexity"] / ref[WINDOW]["token_perplexity"] - 1) > 100 * RTOL
    # at N = T the same requests as the score at --seq-len, and the number the training run logged
    # (no --eval-context there; the same batch size, so the same sums)
    final = eval_records(trained[trainer] / "log.jsonl")[30]
    for key in ("word_perplexity", "token_perplexity"):
        assert got["rolling"][f"{key}@{WINDOW}"] == got["rolling"][key]
        assert got["rolling"][key] == pytest.approx(final["rolling"][key], rel=1e-6)
    assert set(got["rolling"]) == set(final["rolling"]) | {f"{k}@{n}" for k in ("word_perplexity", "token_perplexity")
                                                           for n in CONTEXTS}
    for name in ("mc", "cloze"):  # scored at --seq-len only, as without the flag
        assert got[name].keys() == final[name].keys()
        for key, value in final[name].items():
            assert got[name][key] == pytest.approx(value, rel=1e-6), (name, key)


@pytest.mark.parametrize("value, message", [
    ("0", "--eval-context '0': 0 is outside 1..16, the run's --seq-len"),
    ("4,17", "--eval-context '4,17': 17 is outside 1..16"),
    ("4,x", "--eval-context '4,x': 'x' is not a whole number of tokens"),
    ("4,", "--eval-context '4,': '' is not a whole number of tokens"),
    ("8,4,8", "--eval-context '8,4,8': 8 is listed twice"),
])
def test_bad_eval_context_is_named(trained, toy, value, message):
    p = subprocess.run([binary("san"), "--run-dir=", "--steps", "0", "--init-from", str(trained["san"] / "final.bin"), "--seq-len",
                        str(WINDOW), "--eval-sets", str(toy / "rolling.bin"), "--eval-context", value],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode != 0 and message in p.stderr, p.stderr


def test_eval_context_needs_a_rolling_set(trained, toy):
    base = [binary("san"), "--run-dir=", "--steps", "0", "--init-from", str(trained["san"] / "final.bin"), "--eval-context", "8"]
    p = subprocess.run(base, capture_output=True, text=True, timeout=60)
    assert p.returncode != 0 and "--eval-context 8: no --eval-sets to score" in p.stderr, p.stderr
    p = subprocess.run(base + ["--eval-sets", f"{toy / 'mc.bin'},{toy / 'cloze.bin'}"], capture_output=True, text=True,
                       timeout=60)
    assert p.returncode != 0 and "--eval-context: none of the --eval-sets is a rolling set" in p.stderr, p.stderr


def test_eval_sets_are_scored_at_the_milestones(toy, tmp_path):
    """--milestones 1 (what --paper-setup 1 turns on): the eval sets are scored at each milestone
    checkpoint too (0/25/50/75% of 20 steps: 0, 5, 10, 15; the SAN paper reports LAMBADA and SciQ
    at an intermediate checkpoint), once a step where --eval-every scores them already (10), and
    at the end; each milestone's scores are those of its checkpoint (the reference scoring
    milestone_NNN.bin; the multiple-choice and cloze sets at 25% and 75%).
    --milestone-evals 0: only --eval-every's and the end's."""
    base = ["--preset", "tiny", "--train-data", toy / "toy_train_*.bin", "--val-data", toy / "toy_val_*.bin",
            "--batch-size", 3, "--seq-len", WINDOW, "--steps", 20, "--val-every", 0, "--val-batches", 1,
            "--optimizer", "adamw", "--lr", "3e-3", "--sample-tokens", 0, "--milestones", 1,
            "--eval-sets", eval_sets(toy), "--eval-every", 10]
    on, off = tmp_path / "on", tmp_path / "off"
    run("san", base + ["--checkpoint-dir", on, "--log", on / "log.jsonl"])
    run("san", base + ["--checkpoint-dir", off, "--log", off / "log.jsonl", "--milestone-evals", 0])
    records = eval_records(on / "log.jsonl")
    steps = [r["step"] for r in map(json.loads, open(on / "log.jsonl")) if "eval" in r]
    assert steps == [0, 5, 10, 15, 20]  # (each once)
    assert sorted(eval_records(off / "log.jsonl")) == [10, 20]
    for step, percent in ((5, 25), (15, 75)):
        for name in ("mc", "cloze"):
            _, ref = reference_scores(on / f"milestone_{percent:03d}.bin", toy / f"{name}.bin")
            for key in ("acc", "acc_norm", "perplexity", "word_perplexity"):
                if key in ref:
                    assert records[step][name][key] == pytest.approx(ref[key], rel=RTOL, abs=1e-9), (step, name, key)
    assert records[5] != records[15]
