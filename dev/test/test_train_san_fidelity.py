"""The CUDA trainer's recipe and measurements (issue 9) against independent computations:
validation is token-weighted cross-entropy without the z-loss, per-region and per-exercise
losses label each target by its own region and leave out targets whose context was cut,
the logged gates / effective ranks / attention-logit maxima equal what the PyTorch
reference's parameters, hidden states (NumPy SVD) and explicit attention scores give,
milestone checkpoints land at 0/25/50/75/100%, loss spikes are the steps whose z-score is
above the threshold, a divergence names the first non-finite tensor, and the rates and
the paper setup resolve as documented.

Runs the host-backend binaries named by TRAIN_SAN_BIN (bf16) and TRAIN_SAN_FP32_BIN (fp32,
for the comparisons that need fp32 agreement); `make test-python` sets both."""
import json
import math
import os
import re
import subprocess
import sys

import numpy as np
import pytest
import torch

import train_san as ts
from attnref import container, ops, san, training
from attnref.data import ShardLoader
from attnref.shards import read_exercises, read_regions, read_shard

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

BIN = os.environ.get("TRAIN_SAN_BIN")
BIN32 = os.environ.get("TRAIN_SAN_FP32_BIN")
pytestmark = pytest.mark.skipif(not (BIN and BIN32), reason="TRAIN_SAN_BIN / TRAIN_SAN_FP32_BIN not set (make test sets them)")

B, T, VAL_BATCHES = 8, 64, 3
STEPS = 12


def run(binary, args, check=True):
    # (--run-dir '': the outputs are the test's, as trainer_cli.run_binary)
    proc = subprocess.run([os.path.join(ROOT, binary)] + [str(a) for a in args] + ["--run-dir="], cwd=ROOT, capture_output=True,
                          text=True, timeout=600)
    if check and proc.returncode != 0:
        raise AssertionError(f"train_san failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


def read_log(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """A small offline build: SentencePiece vocab 1000, SYNTH shards with region and exercise sidecars."""
    out = tmp_path_factory.mktemp("offline")
    subprocess.run([sys.executable, os.path.join(ROOT, "dev/data/build_offline.py"), "--out", str(out), "--vocab-size",
                    "1000", "--synth-train-docs", "600", "--synth-val-docs", "120", "--shard-tokens", "200000",
                    "--eval-items", "10"], check=True, capture_output=True)
    return out


def data_flags(data):
    return ["--train-data", data / "synth" / "synth_train_*.bin", "--val-data", data / "synth" / "synth_val_*.bin",
            "--tokenizer", data / "tokenizer.bin"]


@pytest.fixture(scope="module")
def trained(data, tmp_path_factory):
    """A tiny SAN (z-loss 0.01, so that the z term would show in a validation loss) trained
    for a few steps in fp32 with milestones; then evaluated with --steps 0 --init-from."""
    d = tmp_path_factory.mktemp("run")
    run(BIN32, ["--preset", "tiny", "--z-loss", "0.01", "--batch-size", B, "--steps", STEPS, "--val-every", 0,
                "--val-batches", VAL_BATCHES, "--sample-tokens", 0, "--checkpoint-dir", d, "--milestones", 1,
                "--optimizer", "adamw", "--lr", "3e-3"] + data_flags(data))
    proc = run(BIN32, ["--steps", 0, "--init-from", d / "final.bin", "--batch-size", B, "--val-batches", VAL_BATCHES,
                       "--sample-tokens", 0, "--log", d / "eval.jsonl"] + data_flags(data))
    record = read_log(d / "eval.jsonl")[-1]
    model, _, _, _ = san.load_checkpoint(str(d / "final.bin"))
    return d, model.double().eval(), record, proc.stdout


def val_rows(data, n_batches, rows=B, length=T):
    """The validation windows the trainer evaluates: shard order, windows [kT, kT+T]."""
    path = sorted((data / "synth").glob("synth_val_*.bin"))[0]
    tokens = read_shard(path).astype(np.int64)
    regions = read_regions(str(path)[:-4] + ".regions")
    exercise_ids, names = read_exercises(str(path)[:-4] + ".exercises")
    n = n_batches * rows
    idx = np.arange(n)[:, None] * length + np.arange(length + 1)[None, :]
    return tokens[idx], regions[idx], exercise_ids[idx], names


def per_token_ce(model, windows):
    x = torch.from_numpy(windows[:, :-1])
    y = torch.from_numpy(windows[:, 1:])
    with torch.no_grad():
        logits, _ = model(x)
    logits = logits[..., : model.cfg.vocab_size].double()
    ce = torch.logsumexp(logits, -1) - logits.gather(-1, y[..., None])[..., 0]
    return ce.numpy(), ops.loss_mask(y, model.cfg).numpy()


def test_validation_is_token_weighted_cross_entropy(data, trained):
    _, model, record, _ = trained
    windows, _, _, _ = val_rows(data, VAL_BATCHES)
    ce, mask = per_token_ce(model, windows)
    expected = (ce * mask).sum() / mask.sum()
    assert record["val_tokens"] == int(mask.sum())
    assert abs(record["val_loss"] - expected) < 2e-5 * expected, (record["val_loss"], expected)
    # the z-loss term is reported apart: its coefficient times the mean lse^2
    x = torch.from_numpy(windows[:, :-1])
    with torch.no_grad():
        lse = torch.logsumexp(model(x)[0][..., : model.cfg.vocab_size].double(), -1).numpy()
    z = model.cfg.z_loss * (lse ** 2 * mask).sum() / mask.sum()
    assert abs(record["val_z_loss"] - z) < 1e-4 * z
    # the reference's evaluator gives the same number for the same batches
    loader = ShardLoader(str(data / "synth" / "synth_val_*.bin"), B, T, model.cfg.vocab_size)
    assert abs(training.evaluate(model, loader, VAL_BATCHES) - expected) < 1e-9


def test_region_and_exercise_losses_label_targets_by_their_own_region(data, trained):
    _, model, record, stdout = trained
    windows, regions, exercises, names = val_rows(data, VAL_BATCHES)
    ce, mask = per_token_ce(model, windows)
    bos = model.cfg.bos_id
    # a target's context is whole once its row has passed a document start (or began with one)
    whole = np.cumsum(windows[:, :-1] == bos, axis=1) > 0
    keep = mask & whole
    target_region = regions[:, 1:]          # the region of the target token itself
    target_exercise = exercises[:, 1:]
    labels = {0: "other", 1: "query", 2: "trace", 3: "answer"}
    checked = 0
    for g, name in labels.items():
        sel = keep & (target_region == g)
        if sel.sum() == 0:
            continue
        expected = ce[sel].mean()
        assert abs(record[f"val_loss_{name}"] - expected) < 2e-5 * expected, (name, record[f"val_loss_{name}"], expected)
        checked += 1
    assert checked >= 3
    # the region of the input token instead (an off-by-one) gives other numbers
    shifted = keep & (regions[:, :-1] == 3)
    assert abs(ce[shifted].mean() - record["val_loss_answer"]) > 1e-3
    for e, name in enumerate(names):
        sel = keep & (target_exercise == e)
        if e == 0 or sel.sum() == 0:
            continue
        assert abs(record["val_exercise"][name]["all"] - ce[sel].mean()) < 2e-5 * ce[sel].mean(), name
        for g, region in labels.items():
            both = sel & (target_region == g)
            if both.sum():
                assert abs(record["val_exercise"][name][region] - ce[both].mean()) < 2e-5 * ce[both].mean()
    assert "answer" in stdout and "z-loss" in stdout


def test_measurements_against_reference(data, trained):
    _, model, record, _ = trained
    cfg = model.cfg
    # gates from the parameters
    params = dict(model.ordered_parameters())
    gates = [torch.sigmoid(params[f"layers.{l}.attn_gate"]).item() for l in range(cfg.n_layer)]
    np.testing.assert_allclose(record["gate_attn"], gates, rtol=1e-5)
    assert abs(record["gate_attn_mean"] - np.mean(gates)) < 1e-5
    # the measurement slice: 2 windows of min(257, T) tokens
    windows, _, _, _ = val_rows(data, 1, rows=2, length=min(257, T))
    x = torch.from_numpy(windows[:, :-1])
    hidden, scores = [], []
    # (a block returns its output and the fixed-QK stream, None for this kind)
    hooks = [layer.register_forward_hook(lambda m, i, o: hidden.append(o[0].detach())) for layer in model.layers]
    original = san.gqa_attention  # the name the SAN's attention sub-layer calls

    def recording_attention(q, k, v, mask):
        G = q.shape[1] // k.shape[1]
        s = torch.einsum("bhtd,bhsd->bhts", q, k.repeat_interleave(G, dim=1)) / math.sqrt(q.shape[-1])
        scores.append(s.masked_fill(~mask[:, :, 0], 0.0).abs().max().item())
        return original(q, k, v, mask)

    san.gqa_attention = recording_attention
    try:
        with torch.no_grad():
            model(x)
    finally:
        san.gqa_attention = original
        for h in hooks:
            h.remove()
    eranks = []
    for h in hidden:
        H = h.reshape(-1, cfg.n_embd).numpy()
        H = H - H.mean(axis=0, keepdims=True)
        s = np.linalg.svd(H, compute_uv=False)
        p = s / s.sum()
        p = p[p > 0]
        eranks.append(float(np.exp(-(p * np.log(p)).sum())))
    np.testing.assert_allclose(record["erank"], eranks, rtol=1e-4)
    np.testing.assert_allclose(record["max_logit"], scores, rtol=1e-4)


def test_milestones(trained):
    d = trained[0]
    for percent in (0, 25, 50, 75, 100):
        path = d / f"milestone_{percent:03d}.bin"
        _, step, _, _ = san.load_checkpoint(str(path))
        assert step == math.floor(percent * STEPS / 100 + 0.5), (percent, step)


def test_loss_spikes_are_the_steps_above_the_threshold(data, tmp_path):
    window, threshold = 4, 0.5  # a short window, a low bar and a noisy run: several spikes in 40 steps
    log = tmp_path / "log.jsonl"
    run(BIN, ["--preset", "tiny", "--batch-size", 4, "--steps", 40, "--val-every", 0, "--sample-tokens", 0,
              "--optimizer", "adamw", "--lr", "0.05", "--schedule", "constant", "--log", log,
              "--spike-window", window, "--spike-z", threshold] + data_flags(data))
    steps = [r for r in read_log(log) if "loss" in r]
    losses = [r["loss"] for r in steps]
    expected = set()
    for i in range(window, len(losses)):
        prev = np.array(losses[i - window:i])
        sd = prev.std()
        if sd > 0 and (losses[i] - prev.mean()) / sd > threshold:
            expected.add(steps[i]["step"])
    flagged = {r["step"] for r in steps if "loss_spike_z" in r}
    assert expected, "the threshold is low enough that a 40-step run has spikes"
    assert flagged == expected


def test_divergence_names_the_first_nonfinite_tensor(data, trained, tmp_path):
    model, _, _, _ = san.load_checkpoint(str(trained[0] / "final.bin"))
    with torch.no_grad():
        dict(model.ordered_parameters())["layers.1.attn.wk"][3, 5] = float("nan")
    bad = tmp_path / "nan.bin"
    container.save_checkpoint(str(bad), model, 0)
    proc = run(BIN, ["--init-from", bad, "--steps", 2, "--batch-size", 4, "--sample-tokens", 0] + data_flags(data),
               check=False)
    assert proc.returncode != 0
    assert "step 1: the loss is nan" in proc.stderr and "parameter 'layers.1.attn.wk'" in proc.stderr, proc.stderr


def optimizer_line(stdout):
    return next(line for line in stdout.splitlines() if line.startswith("optimizer:"))


# The SAN paper's locked rates per arm, for models other than the small presets' own (those have
# swept rates: dev/test/test_presets.py); 3 layers make the tiny presets such a model.
@pytest.mark.parametrize("preset, optimizer, lr, lr_other", [
    ("tiny", "muon", 0.02, 3e-4), ("tiny-ffn", "muon", 0.04, 3e-4),
    ("tiny", "adamw", 6e-4, 6e-4), ("tiny-ffn", "adamw", 2.4e-3, 2.4e-3)])
def test_default_rates_per_arm(data, tmp_path, preset, optimizer, lr, lr_other):
    model = ["--preset", preset, "--n-layer", "3", "--optimizer", optimizer]
    proc = run(BIN, model + ["--steps", 1, "--batch-size", 2, "--sample-tokens", 0, "--val-every", 0] + data_flags(data))
    line = optimizer_line(proc.stdout)
    assert f"lr {lr:g}" in line and (f"lr {lr_other:g}" in line or f"other {lr_other:g}" in line), line
    # the reference resolves the same rates
    args = ts.parse_args(model)
    oc = ts.opt_from_args(args, ts.config_from_args(args))
    assert (oc.lr, oc.lr_other) == pytest.approx((lr, lr_other), rel=1e-12)


def test_paper_setup_resolves_and_explicit_flags_win(data, trained):
    ckpt = trained[0] / "final.bin"
    # (--print-config: the resolved optimizer without a step)
    common = ["--print-config", 1, "--steps", 1, "--milestones", 0, "--val-batches", 1, "--sample-tokens", 0] + data_flags(data)
    out = run(BIN, ["--paper-setup", 1] + common).stdout
    line = optimizer_line(out)
    assert "paper order" in line and "NS steps in fp32" in line, line
    assert f"lr {0.02 * math.sqrt(8):g}" in line and f"lr {3e-4 * 8:g}" in line, line
    assert "schedule wsd (warmup 0.05, decay 0.15, final 0.05)" in line
    assert re.search(r"batch: 512 rows per step = 64 micro-batches x 8 rows .* accumulated in fp32", out), out
    out = run(BIN, ["--paper-setup", 1, "--muon-order", "keller", "--lr", "0.01", "--batch-size", 16] + common).stdout
    line = optimizer_line(out)
    # an explicit --lr is a per-device rate like the defaults: scaled as for 8 devices too
    assert "keller order" in line and f"lr {0.01 * math.sqrt(8):g}" in line, line
    assert "batch: 512 rows per step = 32 micro-batches x 16 rows" in out
    proc = run(BIN, ["--paper-setup", 1, "--grad-accum", 3] + common, check=False)
    assert proc.returncode != 0 and "--grad-accum 3 contradicts --global-batch 512" in proc.stderr
    # the reference resolves the same recipe
    args = ts.parse_args(["--paper-setup", "1", "--preset", "tiny"])
    oc = ts.opt_from_args(args, ts.config_from_args(args))
    assert args.grad_accum == 64 and oc.muon_order == "paper" and oc.lr == pytest.approx(0.02 * math.sqrt(8))
