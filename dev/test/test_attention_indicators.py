"""The attention-pattern indicators and the |logit| distribution the trainer logs at validation
(llmc/model/attention_indicators.h; doc/deconstructing.md "Attention-pattern indicators")
against an independent computation from the PyTorch reference's own queries and keys
(attnref/indicators.py), on the trainer's checkpoint and the same 4 validation rows:

- for standard attention (GQA, with and without the document mask), approximate (joint),
  nonapprox, the QK kinds (rndembqk and fixedseqqk in hybrids, staticembqk), an mlp hybrid
  and a skip evaluation: every indicator equal within the stated tolerance, null exactly
  where the layer's weights are no attention matrix (mlp, Taylor separate, skipped layers);
- the logits' quantiles equal and the histograms equal up to values on a bin edge;
- the keys are in every validation record of a training run (--val-every) and of a
  --steps 0 evaluation.

The trainer is the fp32 host build (TRAIN_SAN_FP32_BIN): its q, k differ from the reference's
by rounding only. The reference runs twice, in fp32 and in float64: the trainer must be within
the tolerance of the float64 values, widened where the fp32 reference itself strays from them
(a logit that a few steps of training left ill-conditioned: an AVX2 build's checkpoint had
median |logits| of 1.00417 (trainer), 1.004228 (fp32 reference), 1.0041346 (float64)).
"""
import copy
import json
import os

import numpy as np
import pytest
import torch

from trainer_cli import run_binary, write_pattern_corpus
from attnref.shards import read_shard
from attnref import indicators as ref
from attnref import san


BIN = os.environ.get("TRAIN_SAN_FP32_BIN")
pytestmark = pytest.mark.skipif(not BIN, reason="TRAIN_SAN_FP32_BIN not set (make test sets it)")

ROWS, T = 4, 64  # the measurement slice: 4 windows of min(257, seq_len) tokens; tiny's seq_len is 64
# Measured on these runs (fp32 trainer vs fp32 reference, both then in float64): indicators
# agree to <= 4.6e-6 relative, the rounding of the log's 6 significant digits; the
# histograms exactly. Beyond it, FP32_STRAY times the fp32 reference's own distance from the
# float64 one: the trainer's fp32 rounding, in other orders, is allowed as much again and more.
RTOL, ATOL, FP32_STRAY = 2e-5, 1e-7, 4.0


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_pattern_corpus(tmp_path_factory.mktemp("data"), {"toy_train_000000": 200, "toy_val_000000": 20})


def validation_records(log):
    return [r for r in map(json.loads, log.read_text().splitlines()) if "val_loss" in r]


def train_and_evaluate(data, tmp, flags, skip="none"):
    """Trains `flags` 4 steps (validation every 2), then evaluates final.bin (--steps 0);
    returns (the training log's validation records, the evaluation's record, the checkpoint)."""
    val = str(data / "toy_val_*.bin")
    train_log, eval_log = tmp / "train.jsonl", tmp / "eval.jsonl"
    run_binary(BIN, ["--preset", "tiny", "--train-data", str(data / "toy_train_*.bin"), "--val-data", val,
                     "--batch-size", 4, "--steps", 4, "--val-every", 2, "--val-batches", 1, "--sample-tokens", 0,
                     "--optimizer", "adamw", "--lr", "3e-3", "--checkpoint-dir", tmp, "--log", train_log] + flags)
    ckpt = tmp / "final.bin"
    run_binary(BIN, ["--steps", 0, "--init-from", ckpt, "--val-data", val, "--val-batches", 1, "--batch-size", 4,
                     "--sample-tokens", 0, "--log", eval_log] + ([] if skip == "none" else ["--skip-nonstandard", skip]))
    (record,) = validation_records(eval_log)
    return validation_records(train_log), record, ckpt


def measured(model, idx):
    """The reference's [(indicators, logits)] per layer, in fp32 and in float64: a pair of lists."""
    return ref.measure(model, idx), ref.measure(copy.deepcopy(model).double(), idx)


def reference(data, ckpt, skip):
    model, _, _, _ = san.load_checkpoint(str(ckpt))
    model.skip = skip
    tokens = read_shard(data / "toy_val_000000.bin").astype(np.int64)
    idx = torch.from_numpy(np.stack([tokens[r * T:(r + 1) * T] for r in range(ROWS)]))
    return model, measured(model, idx)


def close(got, want, exact):
    """got (the trainer's) against the reference's fp32 `want` and float64 `exact`."""
    got, want, exact = (np.array(x, dtype=float) for x in (got, want, exact))
    allowed = ATOL + RTOL * np.abs(exact) + FP32_STRAY * np.abs(want - exact)
    bad = np.abs(got - exact) > allowed
    assert not bad.any(), f"trainer {got[bad]}, reference fp32 {want[bad]}, float64 {exact[bad]}"


def compare(record, references):
    for l, ((ind, logits), (ind64, logits64)) in enumerate(zip(*references)):
        if ind is None:
            for key in ("attn_entropy", "attn_conc", "attn_sink", "attn_sink_doc", "attn_locfoc", "attn_headdiv"):
                assert record[key][l] is None, (l, key, record[key][l])
        else:
            for key in ("entropy", "conc", "sink", "sink_doc", "locfoc", "headdiv"):
                close(record["attn_" + key][l], ind[key], ind64[key])
        if logits is None:
            assert record["logit_abs_quantiles"][l] is None and record["logit_abs_hist"][l] is None
        else:
            close(record["logit_abs_quantiles"][l], logits["quantiles"], logits64["quantiles"])
            got, want = np.array(record["logit_abs_hist"][l]), np.array(logits["hist"])
            assert got.sum() == want.sum(), (l, got.sum(), want.sum())  # the same visible pairs
            assert np.abs(got - want).sum() <= 2e-3 * want.sum(), (l, got, want)  # moved across an edge


CASES = {
    "standard": (["--attention", "standard"], "none"),
    "standard-no-doc-mask": (["--attention", "standard", "--doc-mask", "0"], "none"),
    "approximate-joint": (["--attention", "approximate", "--taylor-norm", "joint"], "none"),
    "approximate-separate": (["--attention", "approximate", "--taylor-norm", "separate"], "none"),
    "nonapprox": (["--attention", "nonapprox"], "none"),
    "rndembqk-hybrid": (["--attention", "rndembqk", "--layout", "hybrid"], "none"),
    "fixedseqqk-hybrid": (["--attention", "fixedseqqk", "--layout", "hybrid"], "none"),
    "staticembqk": (["--attention", "staticembqk"], "none"),
    "mlp-hybrid": (["--attention", "mlp", "--layout", "hybrid"], "none"),
    "nonapprox-hybrid-skip": (["--attention", "nonapprox", "--layout", "hybrid"], "attention"),
}
# the layers (0-based) logged as null, by case: every other layer has every key
NULL_INDICATORS = {"approximate-separate": [0, 1], "mlp-hybrid": [0], "nonapprox-hybrid-skip": [0]}
NULL_LOGITS = {"mlp-hybrid": [0], "nonapprox-hybrid-skip": [0]}


@pytest.mark.parametrize("case", CASES)
def test_indicators_equal_the_references(data, tmp_path, case):
    flags, skip = CASES[case]
    train_records, record, ckpt = train_and_evaluate(data, tmp_path, flags, skip)
    # at every --val-every validation and in the --steps 0 evaluation
    assert [r["step"] for r in train_records] == [2, 4]
    for r in train_records + [record]:
        assert len(r["attn_entropy"]) == 2 and len(r["logit_abs_hist"]) == 2, r
    model, references = reference(data, ckpt, skip)
    expected = references[0]
    assert [l for l, (ind, _) in enumerate(expected) if ind is None] == NULL_INDICATORS.get(case, [])
    assert [l for l, (_, lg) in enumerate(expected) if lg is None] == NULL_LOGITS.get(case, [])
    compare(record, references)
    for ind, _ in expected:  # the matrices are row-stochastic: LocFoc and Sink within [0, 1]
        if ind is not None:
            assert all(0.0 <= x <= 1.0 for x in ind["sink"] + sum(ind["locfoc"], []))


def test_sink_is_the_papers_formula_under_the_document_mask(data, tmp_path):
    """Sink is the paper's A[:,1]/L literally, the mean weight on the row's first token, also
    under the document mask (where later documents give it 0); the document-aware variant is
    logged beside it as attn_sink_doc. Both against a plain float64 softmax of the model's own
    q and k, written here apart from attnref.indicators."""
    _, record, ckpt = train_and_evaluate(data, tmp_path, ["--attention", "standard"])
    model, _, _, _ = san.load_checkpoint(str(ckpt))
    tokens = read_shard(data / "toy_val_000000.bin").astype(np.int64)
    idx = torch.from_numpy(np.stack([tokens[r * T:(r + 1) * T] for r in range(ROWS)]))
    for l, (q, k, mask) in enumerate(ref.layer_queries_keys(model, idx)):
        q, k = q.double().numpy(), k.double().numpy()
        k = np.repeat(k, q.shape[1] // k.shape[1], axis=1)
        x = q @ k.transpose(0, 1, 3, 2) / np.sqrt(q.shape[-1])         # (B, H, T, T)
        vis = np.broadcast_to(mask.numpy().reshape(mask.shape[0], 1, T, T), x.shape)
        e = np.where(vis, np.exp(x - np.where(vis, x, -np.inf).max(-1, keepdims=True)), 0.0)
        A = e / e.sum(-1, keepdims=True)
        literal = A[..., 0].mean(axis=(0, 2))                             # per head
        first = vis.argmax(-1)                                            # each query's first visible key
        doc_aware = np.take_along_axis(A, first[..., None], -1)[..., 0].mean(axis=(0, 2))
        close(record["attn_sink"][l], literal, literal)
        close(record["attn_sink_doc"][l], doc_aware, doc_aware)
        assert (doc_aware > 2 * literal).all(), (l, doc_aware, literal)  # documents of ~30 tokens in rows of 64


def test_reference_indicators_of_known_matrices():
    """The reference's indicators on matrices whose values follow by hand: uniform causal
    attention over L keys (row t: 1/(t+1) each) and attention on the diagonal (the identity)."""
    L = 5
    mask = torch.ones(L, L, dtype=torch.bool).tril()[None, None, None]
    uniform = (mask[0, 0].double() / torch.arange(1, L + 1, dtype=torch.float64)[:, None]).expand(1, 2, L, L)
    got = ref.indicators(uniform, mask)
    H = sum(1.0 / (t + 1) * np.log(t + 1) * (t + 1) for t in range(L))   # sum_t log(t+1)
    np.testing.assert_allclose(got["entropy"], [H, H])
    np.testing.assert_allclose(got["conc"], [np.sqrt(sum(1.0 / (t + 1) for t in range(L)))] * 2)
    np.testing.assert_allclose(got["sink"], [np.mean([1.0 / (t + 1) for t in range(L)])] * 2)
    np.testing.assert_allclose(got["locfoc"][1], [np.mean([1.0 / (t + 1) for t in range(1, L)])] * 2)
    assert got["headdiv"] == 0.0  # the heads agree
    eye = torch.stack([torch.eye(L, dtype=torch.float64), uniform[0, 0]])[None]
    got = ref.indicators(eye, mask)
    assert got["entropy"][0] == 0.0 and got["locfoc"][0][0] == 1.0 and got["locfoc"][1][0] == 0.0
    # the std of two values is half their distance: over the L (L + 1) / 2 causal entries
    diff = (eye[0, 0] - eye[0, 1]).abs()[mask[0, 0, 0]]
    np.testing.assert_allclose(got["headdiv"], (diff / 2).sum() * 2 / (L * (L + 1)))


def reference_over(data, ckpt, window):
    """The reference's indicators over the first ROWS validation windows of `window` tokens."""
    model, _, _, _ = san.load_checkpoint(str(ckpt))
    tokens = read_shard(data / "toy_val_000000.bin").astype(np.int64)
    return measured(model, torch.from_numpy(np.stack([tokens[r * window:(r + 1) * window] for r in range(ROWS)])))


def test_indicator_context(tmp_path):
    """--indicator-context L: the indicators and logit distribution over 4 windows of L tokens
    (the reference's over the same windows), the effective ranks and max_logit still over the
    257-token slice; --deconstructing-setup 1 measures over the training context (here 300 > 257)
    and prints what that costs; without either, min(257, T) as before."""
    (tmp_path / "data").mkdir()
    data = write_pattern_corpus(tmp_path / "data", {"toy_train_000000": 200, "toy_val_000000": 80})
    common = ["--preset", "tiny", "--max-seq-len", 300, "--train-data", str(data / "toy_train_*.bin"),
              "--val-data", str(data / "toy_val_*.bin"), "--batch-size", 4, "--val-batches", 1, "--sample-tokens", 0]
    runs = {}
    for name, more in (("default", []), ("setup", ["--deconstructing-setup", "1"]), ("24", ["--indicator-context", 24])):
        d = tmp_path / name
        out = run_binary(BIN, common + ["--steps", 1, "--checkpoint-dir", d, "--log", d / "log.jsonl"] + more).stdout
        runs[name] = (validation_records(d / "log.jsonl")[-1], d / "final.bin", out)
    for name, window in (("default", 257), ("setup", 300), ("24", 24)):
        record, ckpt, out = runs[name]
        compare(record, reference_over(data, ckpt, window))
        printed = f"attention-pattern indicators: {ROWS} windows of {window} tokens" in out
        assert printed == (window != 257), out
    assert "(--indicator-context 0: the training context; the effective ranks and max_logit stay on 2 of 257)" in runs["setup"][2]
    # the same model evaluated at L = 24 and at the default: other indicators, the same effective ranks
    logs = {}
    for name, more in (("default", []), ("24", ["--indicator-context", 24])):
        logs[name] = tmp_path / f"eval{name}.jsonl"
        run_binary(BIN, ["--steps", 0, "--init-from", runs["default"][1], "--val-data", str(data / "toy_val_*.bin"),
                         "--val-batches", 1, "--batch-size", 4, "--sample-tokens", 0, "--log", logs[name]] + more)
    (at_24,), (at_257,) = validation_records(logs["24"]), validation_records(logs["default"])
    assert at_24["erank"] == at_257["erank"] and at_24["max_logit"] == at_257["max_logit"]
    assert at_24["attn_entropy"] != at_257["attn_entropy"]
    compare(at_24, reference_over(data, runs["default"][1], 24))
    bad = run_binary(BIN, common + ["--steps", 1, "--indicator-context", -1], check=False)
    assert bad.returncode != 0 and "option --indicator-context: must be >= 0" in bad.stderr, bad.stderr
