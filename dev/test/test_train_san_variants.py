"""End-to-end checks of the attention variants in the train_san binary (TRAIN_SAN_BIN, which
`make test` sets) and of the layout rules (doc/deconstructing.md):

- every built kind, uniform and hybrid, trains 2 steps on a toy corpus with a finite loss that
  falls, and writes a checkpoint that the trainer resumes from;
- bad combinations (an unknown kind, a layer out of range or listed twice, a layout without a
  variant, a variant that no layer would get, fixedseqqk on too little training data, a
  checkpoint without its fixed QK input) stop with a clear error;
- rndembqk / fixedseqqk keep their fixed input in the checkpoint (fixedseqqk's: the first
  seq_len training tokens), unchanged by training and by a resume; their validation logs
  max_logit and sampling recomputes the window;
- the named layouts at 24 layers are the paper's sets (written out here from the paper's text),
  and the trainer's layouts (its start-up line) equal attnref/variants.py's at several depths.
"""
import json
import math
import os
import re
import subprocess

import numpy as np
import pytest

from trainer_cli import BOS, ROOT, reference, run_binary, step_losses, write_pattern_corpus, state_differences
from attnref.shards import write_shard
from attnref.variants import KINDS, layer_kinds, standard_layers


BIN = os.environ.get("TRAIN_SAN_BIN")
needs_bin = pytest.mark.skipif(not BIN, reason="TRAIN_SAN_BIN not set (make test sets it)")

BUILT = ("mlp", "approximate", "nonapprox", "staticembqk", "rndembqk", "fixedseqqk")


def run(args, check=True):
    return run_binary(BIN, args, check)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_pattern_corpus(tmp_path_factory.mktemp("data"), {"toy_train_000000": 200, "toy_val_000000": 20})


def common(data, tmp):
    return ["--preset", "tiny", "--train-data", str(data / "toy_train_*.bin"), "--val-data", "",
            "--batch-size", "4", "--sample-tokens", "0", "--checkpoint-dir", str(tmp),
            "--optimizer", "adamw", "--lr", "3e-3", "--schedule", "constant", "--warmup-frac", "0",
            "--overwrite", "1"]  # (a test's runs share its directory: each replaces the last's final.bin)


losses = step_losses


@needs_bin
def test_reference_and_trainer_know_the_same_kinds():
    """The PyTorch reference's kinds (attnref.variants.KINDS) and the trainer's, as its -h lists
    them for --attention (llmc/mixers/attention_kinds.h, each built by llmc/mixers/registry.h; the
    test below trains every one of them), are the same, in the same order."""
    out = subprocess.run([BIN, "-h"], capture_output=True, text=True, check=True).stdout
    line = next(l for l in out.splitlines() if l.strip().startswith("--attention "))
    choices = line.split(None, 2)[2].split(" (")[0].split(" | ")
    assert tuple(choices) == KINDS


@needs_bin
@pytest.mark.parametrize("kind", BUILT)
@pytest.mark.parametrize("layout", ["uniform", "hybrid"])
def test_variant_trains_and_resumes(data, tmp_path, kind, layout):
    args = common(data, tmp_path) + ["--attention", kind, "--layout", layout, "--taylor-norm", "joint"]
    out = run(args + ["--steps", "2"]).stdout
    expect = ",".join(layer_kinds(kind, layout, 2))
    assert f"(layers: {expect})" in out, out
    loss = losses(out)
    assert len(loss) == 2 and all(np.isfinite(loss)) and loss[1] < loss[0], out
    # the checkpoint carries the kinds: a resume needs no flags, and continues the run
    resumed = run(["--resume", str(tmp_path / "final.bin"), "--train-data", str(data / "toy_train_*.bin"),
                   "--val-data", "", "--sample-tokens", "0", "--extend-to", "3"]).stdout
    assert f"(layers: {expect})" in resumed and len(losses(resumed)) == 1, resumed


@needs_bin
def test_taylor_separate_trains(data, tmp_path):
    out = run(common(data, tmp_path) + ["--attention", "approximate", "--taylor-norm", "separate", "--steps", "2"]).stdout
    assert "taylor_norm separate" in out
    assert all(np.isfinite(losses(out)))


@needs_bin
@pytest.mark.parametrize("args, message", [
    (["--attention", "sideways"], "option --attention: 'sideways' is not one of standard, mlp, approximate"),
    (["--attention", "mlp", "--layout", "1,3"], "--layout: layer 3 is out of range: the model has layers 1..2"),
    (["--attention", "mlp", "--layout", "2,2"], "layer 2 is listed twice"),
    (["--attention", "mlp", "--layout", "zigzag"], "'zigzag' is neither a named layout"),
    (["--layout", "hybrid"], "but --attention is standard"),
    (["--attention", "nonapprox", "--layout", "middle-simple"], "would be used nowhere"),
    (["--attention", "approximate", "--taylor-norm", "both"], "option --taylor-norm: 'both' is not one of joint, separate"),
])
def test_bad_combinations_fail_clearly(data, tmp_path, args, message):
    proc = run(common(data, tmp_path) + ["--steps", "1"] + args, check=False)
    assert proc.returncode != 0
    assert message in proc.stderr, proc.stderr


def test_named_layouts_at_24_layers_are_the_papers():
    paper = {  # the layers that keep standard attention, from the paper's layout ablation
        "even": list(range(2, 25, 2)), "hybrid": list(range(2, 25, 2)), "odd": list(range(1, 24, 2)),
        "top-simple": list(range(1, 13)), "middle-simple": list(range(1, 7)) + list(range(19, 25)),
        "bottom-simple": list(range(13, 25)), "quarter": [4, 8, 12, 16, 20, 24], "first": [1], "last": [24],
        "bilateral": [1, 24], "uniform": [], "1,24": [1, 24],
    }
    for layout, layers in paper.items():
        assert standard_layers(layout, 24) == layers, layout


@needs_bin
@pytest.mark.parametrize("n_layer", [3, 6, 7])
def test_trainer_layouts_equal_the_references(data, tmp_path, n_layer):
    for layout in ("odd", "top-simple", "middle-simple", "bottom-simple", "quarter", "bilateral"):
        try:
            expect = ",".join(layer_kinds("mlp", layout, n_layer))
        except ValueError:
            continue  # (e.g. middle-simple at 3 layers keeps all; the error is tested above)
        out = run(common(data, tmp_path) + ["--n-layer", str(n_layer), "--attention", "mlp", "--layout", layout,
                                            "--steps", "1"]).stdout
        assert f"(layers: {expect})" in out, (layout, out)


def val_loss(out):
    return [float(line.split()[4]) for line in out.splitlines() if line.startswith("step ") and "val loss" in line][-1]


@needs_bin
@pytest.mark.parametrize("kind", ["nonapprox", "rndembqk", "fixedseqqk"])
def test_skip_evaluation(data, tmp_path, kind):
    """A trained FFN-arm hybrid evaluated whole, without its variant sub-layers, and without
    their whole blocks: three different losses (each removal changes the function)."""
    train = common(data, tmp_path) + ["--ffn", "swiglu", "--d-ff", "128", "--attention", kind, "--layout", "hybrid"]
    trained = run(train + ["--steps", "15"]).stdout
    ckpt = str(tmp_path / "final.bin")
    evaluate = ["--steps", "0", "--init-from", ckpt, "--val-data",
                str(data / "toy_val_*.bin"), "--val-batches", "1", "--batch-size", "4", "--sample-tokens", "0"]
    whole = val_loss(run(evaluate).stdout)
    out = run(evaluate + ["--skip-nonstandard", "attention", "--log", str(tmp_path / "skip.jsonl")]).stdout
    # the layers dropped are the ones the training banner lists as the variant's (1-based)
    kinds = re.search(r"\(layers: ([a-z,]+)\)", trained).group(1).split(",")
    dropped = [i + 1 for i, k in enumerate(kinds) if k != "standard"]
    assert dropped and len(dropped) < len(kinds)
    assert (f"evaluation without the attention sub-layers of layers {','.join(map(str, dropped))} ({kind}; "
            f"--skip-nonstandard attention): {len(dropped)} of {len(kinds)} layers") in out, out
    header = json.loads(open(tmp_path / "skip.jsonl").readline())["run"]
    assert header["skipped_layers"] == dropped and header["skip_nonstandard"] == "attention"
    no_attn = val_loss(out)
    no_block = val_loss(run(evaluate + ["--skip-nonstandard", "block"]).stdout)
    assert all(np.isfinite([whole, no_attn, no_block]))
    assert len({whole, no_attn, no_block}) == 3, (whole, no_attn, no_block)
    proc = run(evaluate + ["--skip-nonstandard", "sideways"], check=False)
    assert proc.returncode != 0 and "--skip-nonstandard must be none, attention or block" in proc.stderr


@needs_bin
def test_skip_needs_an_evaluation_of_a_variant(data, tmp_path):
    proc = run(common(data, tmp_path) + ["--attention", "mlp", "--steps", "1", "--skip-nonstandard", "block"],
               check=False)
    assert proc.returncode != 0 and "give --steps 0 --init-from CKPT" in proc.stderr
    run(common(data, tmp_path) + ["--steps", "1"])
    ckpt = str(tmp_path / "final.bin")
    proc = run(["--steps", "0", "--init-from", ckpt, "--val-data", str(data / "toy_val_*.bin"),
                "--skip-nonstandard", "attention"], check=False)
    assert proc.returncode != 0 and f"the model of {ckpt} has standard attention in every layer" in proc.stderr
    # a uniform variant: leaving its layers out would leave no attention at all
    run(common(data, tmp_path) + ["--attention", "mlp", "--steps", "1"])
    for skip in ["attention", "block"]:
        proc = run(["--steps", "0", "--init-from", ckpt, "--val-data", str(data / "toy_val_*.bin"),
                    "--skip-nonstandard", skip], check=False)
        assert proc.returncode == 1, proc.stdout
        assert (f"--skip-nonstandard {skip}: every layer of {ckpt} is mlp (layout uniform), so leaving them out would "
                "evaluate a model without attention") in proc.stderr


@needs_bin
@pytest.mark.parametrize("preset, shape", [
    ("qwen-cpu", "L=4 d=128 heads 4/4 (head_dim 32) ffn=swiglu d_ff=640 norm=rms qk_norm=0 residual=standard"),
    ("qwen3-cpu", "L=4 d=128 heads 4/4 (head_dim 32) ffn=swiglu d_ff=384 norm=rms qk_norm=1 residual=standard"),
])
def test_qwen_shaped_presets_train_with_a_variant(data, tmp_path, preset, shape):
    args = common(data, tmp_path)
    args[args.index("tiny")] = preset
    out = run(args + ["--attention", "approximate", "--layout", "hybrid", "--steps", "2"]).stdout
    assert shape in out and "(layers: approximate,standard,approximate,standard)" in out, out
    loss = losses(out)
    assert len(loss) == 2 and loss[1] < loss[0], out


@pytest.fixture(scope="module")
def hybrid_checkpoint(data, tmp_path_factory):
    """kind -> final.bin of a hybrid of that kind trained 5 steps by the CUDA trainer (once per
    kind for the module: the three skip modes evaluate the same checkpoint)."""
    made = {}

    def checkpoint(kind):
        if kind not in made:
            out = tmp_path_factory.mktemp(f"hybrid-{kind}")
            run(common(data, out) + ["--ffn", "swiglu", "--d-ff", "128", "--attention", kind, "--layout",
                                     "hybrid", "--steps", "5"])
            made[kind] = str(out / "final.bin")
        return made[kind]
    return checkpoint


@needs_bin
@pytest.mark.parametrize("kind", ["staticembqk", "rndembqk", "fixedseqqk"])
@pytest.mark.parametrize("skip", ["none", "attention", "block"])
def test_reference_evaluates_the_trainers_variant_checkpoint(data, hybrid_checkpoint, skip, kind):
    """A hybrid trained by the CUDA trainer, evaluated by train_san.py and by the trainer itself,
    whole and with --skip-nonstandard: the same validation loss (one batch; the trainer runs in
    floatX, the reference in fp32). rndembqk / fixedseqqk: the reference reads the fixed input
    from the checkpoint."""
    ckpt, val = hybrid_checkpoint(kind), str(data / "toy_val_*.bin")
    out = run(["--steps", "0", "--init-from", ckpt, "--val-data", val, "--val-batches", "1", "--batch-size", "4",
               "--sample-tokens", "0"] + ([] if skip == "none" else ["--skip-nonstandard", skip])).stdout
    cuda_val = val_loss(out)
    ref = reference("train_san.py", ["--load-checkpoint", ckpt, "--val-data", val, "--val-batches", "1",
                                     "--batch-size", "4", "--device", "cpu", "--skip-nonstandard", skip])
    assert ref.returncode == 0, ref.stderr
    ref_val = float([l for l in ref.stdout.splitlines() if l.startswith("val loss")][-1].split()[2])
    assert abs(cuda_val - ref_val) <= 5e-3 * ref_val, (cuda_val, ref_val)


@needs_bin
@pytest.mark.parametrize("preset", ["qwen-cpu", "qwen3-cpu"])
def test_reference_counts_the_presets_as_the_trainer(data, tmp_path, preset):
    import train_san
    from attnref.san import SANConfig, count_parameters, flops_per_token
    for attention, layout in (("standard", "uniform"), ("mlp", "hybrid"), ("nonapprox", "uniform")):
        args = common(data, tmp_path)
        args[args.index("tiny")] = preset
        out = run(args + ["--attention", attention, "--layout", layout, "--steps", "1"]).stdout
        cfg = SANConfig(**dict(train_san.PRESETS[preset], attention=attention, layout=layout))
        total, nonemb = count_parameters(cfg)
        assert f"parameters: {total} total, {nonemb} non-embedding; {flops_per_token(cfg) / 1e6:.2f} MFLOPs/token" \
            in out, out


def test_reference_taylor_joint_is_based_linear_attention():
    """approximate (joint) written as the reference's masked quadratic form equals Based's
    linear attention with the feature map phi(z) = [1, z / d^(1/4), (z (x) z) / (sqrt(2) sqrt(d))]
    and causal prefix sums (doc/deconstructing.md): phi(q).phi(k) = 1 + x + x^2/2."""
    import torch
    from attnref.ops import attention_mask
    from attnref.variants import taylor_attention
    g = torch.Generator().manual_seed(0)
    B, Hq, Hkv, T, hd = 2, 4, 2, 9, 6
    q = torch.randn(B, Hq, T, hd, generator=g, dtype=torch.float64)
    k = torch.randn(B, Hkv, T, hd, generator=g, dtype=torch.float64)
    v = torch.randn(B, Hkv, T, hd, generator=g, dtype=torch.float64)
    out = taylor_attention(q, k, v, attention_mask(T, None, "cpu"), "joint")

    def phi(z):
        outer = (z[..., :, None] * z[..., None, :]).flatten(-2) / (math.sqrt(2) * math.sqrt(hd))
        return torch.cat([torch.ones_like(z[..., :1]), z / hd ** 0.25, outer], dim=-1)
    kk, vv = k.repeat_interleave(Hq // Hkv, dim=1), v.repeat_interleave(Hq // Hkv, dim=1)
    fq, fk = phi(q), phi(kk)
    state = torch.cumsum(fk[..., :, None] * vv[..., None, :], dim=2)       # sum_{tau <= t} phi(k) v^T
    norm = torch.cumsum(fk, dim=2)
    based = (fq[..., None, :] @ state).squeeze(-2) / (fq * norm).sum(-1, keepdim=True)
    assert torch.allclose(out, based, rtol=1e-10, atol=1e-12)


def test_reference_nonapprox_is_a_running_average():
    """nonapprox from the reference's T x T weights equals the running softmax-weighted average
    written as two cumulative sums (no mask: one document)."""
    import torch
    from attnref.ops import attention_mask
    from attnref.variants import nonapprox_attention
    g = torch.Generator().manual_seed(1)
    B, Hq, Hkv, T, hd = 2, 4, 1, 11, 8
    q = torch.randn(B, Hq, T, hd, generator=g, dtype=torch.float64)
    k = torch.randn(B, Hkv, T, hd, generator=g, dtype=torch.float64)
    v = torch.randn(B, Hkv, T, hd, generator=g, dtype=torch.float64)
    out = nonapprox_attention(q, k, v, attention_mask(T, None, "cpu"))
    kk, vv = k.repeat_interleave(Hq, dim=1), v.repeat_interleave(Hq, dim=1)
    w = torch.exp((q * kk).sum(-1, keepdim=True) / math.sqrt(hd))
    running = torch.cumsum(w * vv, dim=2) / torch.cumsum(w, dim=2)
    assert torch.allclose(out, running, rtol=1e-10, atol=1e-12)


@needs_bin
def test_deconstructing_recipe_in_both_trainers(data, tmp_path):
    """--deconstructing-setup 1 (doc/deconstructing.md "Recipe"): the same settings in the trainer
    and the reference, flags on top win. The schedule is the paper's cosine scaled to --steps: a
    horizon of steps x 120,000 / 28,611 and steps x 2,000 / 28,611 warmup steps (as a fraction of
    the horizon), unless --schedule-steps / --warmup-frac are given; the rates the trainer logs are
    the reference's."""
    import json
    import train_san
    from attnref.optim import floor_steps, group_lrs, lr_multiplier
    args = ["--preset", "tiny", "--train-data", str(data / "toy_train_*.bin"), "--val-data", "", "--sample-tokens",
            "0", "--checkpoint-dir", str(tmp_path), "--deconstructing-setup", "1", "--steps", "2", "--batch-size", "4",
            "--global-batch", "8", "--overwrite", "1"]  # (its runs share the directory)
    out = run(args + ["--log", str(tmp_path / "log.jsonl")]).stdout
    # 2 steps: a horizon of round(8.39) = 8 steps, warmup 2 x 2000 / 28611 = 0.14 steps (as 0.14 / 8 of them)
    assert "optimizer: adamw lr 0.0004 (other 0.0004); wd 0.1 (embeddings too) clip 1, schedule cosine (warmup 0.0174758, " \
           "decay 0.15, final 0.1; over 8 steps)" in out, out
    assert "recipe: Deconstructing Attention's setup" in out and "batch: 8 rows per step" in out
    assert "adamw betas 0.9/0.9999 eps 1e-08" in out, out  # the paper's Table 9
    a = train_san.parse_args(["--deconstructing-setup", "1", "--steps", "2"])
    oc = train_san.opt_from_args(a, train_san.config_from_args(a))
    logged = [r["lr"] for r in map(json.loads, (tmp_path / "log.jsonl").read_text().splitlines()) if "loss" in r]
    assert logged == pytest.approx([group_lrs(oc, s, 2)[0] for s in range(2)], rel=1e-6)
    assert "adamw betas 0.9/0.999 " in run(args + ["--beta2", "0.999"]).stdout  # a flag given wins
    given = run(args + ["--schedule-steps", "50"]).stdout  # the warmup follows the horizon given
    assert f"(warmup {2 * 2000 / 28611 / 50:g}, decay 0.15, final 0.1; over 50 steps)" in given, given
    a = train_san.parse_args(["--deconstructing-setup", "1", "--steps", "4000", "--lr", "1e-3"])
    assert (a.optimizer, a.lr, a.weight_decay, a.decay_embedding, a.grad_clip, a.schedule, a.final_frac, a.global_batch,
            a.beta2, a.schedule_steps) == ("adamw", 1e-3, 0.1, 1, 1.0, "cosine", 0.1, 256, 0.9999, 16777)
    assert "(embeddings too)" not in run(args + ["--decay-embedding", "0"]).stdout  # a flag given wins
    assert floor_steps(a.warmup_frac, a.schedule_steps) == 279  # 4000 x 2000 / 28611 = 279.6, floored
    # at the paper's own length: its 120,000-step horizon and 2,000 warmup steps, and the rate
    # at the last step still near 0.89x peak (the cosine has fallen to 0.88 of its span)
    a = train_san.parse_args(["--deconstructing-setup", "1", "--steps", "28611"])
    assert a.schedule_steps == 120000 and floor_steps(a.warmup_frac, a.schedule_steps) == 2000
    end = lr_multiplier(28610, 28611, "cosine", a.warmup_frac, 0.15, a.final_frac, horizon=a.schedule_steps)
    assert 0.1 + 0.9 * 0.87 < end < 0.1 + 0.9 * 0.89, end
    a = train_san.parse_args(["--deconstructing-setup", "1", "--steps", "100", "--schedule-steps", "1000"])
    assert a.schedule_steps == 1000 and a.warmup_frac == pytest.approx(100 * 2000 / 28611 / 1000)
    a = train_san.parse_args(["--deconstructing-setup", "1", "--steps", "100", "--warmup-frac", "0.1"])
    assert a.schedule_steps == 419 and a.warmup_frac == 0.1
    proc = run(["--paper-setup", "1", "--deconstructing-setup", "1"], check=False)
    assert proc.returncode != 0 and "two recipes" in proc.stderr
    # Table 9: peak 3e-4 for Qwen3-1.7B, 4e-4 for the other sizes (--print-config: nothing is built)
    for preset, lr in (("qwen3-1.7b", 3e-4), ("qwen-500m", 4e-4)):
        out = run(["--preset", preset, "--train-data", str(data / "toy_train_*.bin"), "--val-data", "",
                   "--deconstructing-setup", "1", "--steps", "2", "--print-config", "1"]).stdout
        assert f"optimizer: adamw lr {lr:g} (other {lr:g})" in out, out
        a = train_san.parse_args(["--preset", preset, "--deconstructing-setup", "1", "--steps", "2"])
        assert train_san.opt_from_args(a, train_san.config_from_args(a)).lr == lr


@needs_bin
@pytest.mark.parametrize("optimizer", [["--optimizer", "adamw", "--lr", "1e-2"],
                                       ["--optimizer", "muon", "--lr-other", "1e-2"]])
def test_decay_embedding_decays_the_embedding_only(data, tmp_path, optimizer):
    """--decay-embedding 1 (Deconstructing Attention's recipe, Hugging Face-style: every matrix
    decays, the tied embedding included; doc/deconstructing.md "Recipe"): one step from the same
    init on the same batch with it on and off differs in wte alone, by exactly the decay
    -lr x wd x wte_0 of wte's group rate (the gradient's part of the update is the same); gains
    and gates do not decay, matrices decay either way. The flag is saved and a resume that
    changes it is refused; the reference decays the same tensors (a step with zero gradient)."""
    import torch
    from attnref.optim import OptConfig, Optimizer
    from attnref.san import PRESETS, SAN, SANConfig
    lr, wd = 1e-2, 0.5
    common = ["--train-data", str(data / "toy_train_*.bin"), "--val-data", "", "--batch-size", "4", "--sample-tokens",
              "0", "--steps", "1", "--schedule", "constant", "--warmup-frac", "0", "--weight-decay", str(wd)] + optimizer
    # from a model one step in (the tiny preset's gains and gates start at 0, which decay leaves alone)
    run(["--preset", "tiny", "--checkpoint-dir", str(tmp_path / "base")] + common)
    start = read_checkpoint(tmp_path / "base" / "final.bin")[1]
    ends = {}
    for on in (0, 1):
        out = tmp_path / f"on{on}"
        run(["--init-from", str(tmp_path / "base" / "final.bin"), "--checkpoint-dir", str(out), "--decay-embedding",
             str(on)] + common)
        ends[on] = read_checkpoint(out / "final.bin")
    (meta_off, off), (meta_on, on) = ends[0], ends[1]
    assert "opt.decay_embedding" not in meta_off and meta_on["opt.decay_embedding"] == "1"
    names = [n for n in on if not n.startswith("opt.") and not n.startswith("fixed_qk.")]
    assert "wte" in names and all(np.all(start[n] != 0) for n in names if n.endswith(("_norm.weight", "_gate")))
    for n in names:
        if n == "wte":
            assert not np.array_equal(on[n], off[n])
            np.testing.assert_allclose(on[n] - off[n], -lr * wd * start[n], rtol=0, atol=2e-8)
        else:  # gains and gates never decay; matrices always do
            assert np.array_equal(on[n], off[n]), n
    proc = run(["--resume", str(tmp_path / "on1" / "final.bin"), "--extend-to", "2", "--decay-embedding", "0",
                "--checkpoint-dir", str(tmp_path / "no")], check=False)
    assert proc.returncode != 0 and "--decay-embedding (decay_embedding 0; the saved run's 1)" in proc.stderr, proc.stderr
    # the reference: with zero gradients only the decay moves a tensor
    model = SAN(SANConfig(**PRESETS["tiny"]))
    before = {n: p.detach().clone() for n, p in model.ordered_parameters()}
    opt = Optimizer(model, OptConfig(optimizer="adamw", lr=lr, lr_other=lr, weight_decay=wd, decay_embedding=1))
    opt.step(lr, lr)
    for n, p in model.ordered_parameters():
        decayed = p.dim() == 2
        assert decayed == (n == "wte" or n in opt.matrix), n
        assert torch.equal(p.detach(), before[n] * (1 - lr * wd) if decayed else before[n]), n


@pytest.mark.parametrize("kw, message", [
    (dict(attention="mlp", layout="1,3"), "layer 3 is out of range"),
    (dict(attention="mlp", layout="2,2"), "listed twice"),
    (dict(layout="hybrid"), "but attention is standard"),
    (dict(attention="nonapprox", layout="middle-simple"), "would be used nowhere"),
    (dict(attention="approximate", taylor_norm="both"), "taylor_norm must be joint|separate"),
])
def test_reference_refuses_bad_combinations(kw, message):
    from attnref.san import PRESETS, SANConfig
    with pytest.raises(ValueError, match=message):
        SANConfig(**dict(PRESETS["tiny"], **kw))


def read_checkpoint(path):
    from attnref.container import KIND_CHECKPOINT, read_container
    return read_container(path, KIND_CHECKPOINT)[1:]


@needs_bin
@pytest.mark.parametrize("kind", ["rndembqk", "fixedseqqk"])
def test_fixed_input_is_model_state(data, tmp_path, kind):
    """The fixed QK input sits in the checkpoint (rndembqk: eps of seq_len x d with std 0.02 sqrt(d) at tiny's sqrt-d embedding scale;
    fixedseqqk: the first seq_len tokens of the training shard), is not counted as a parameter,
    and neither training nor a resume changes it; validation logs a max_logit per layer (the
    fixed q . k the real rows used) and sampling (no KV cache for these kinds) works."""
    from attnref.shards import read_shard
    log = tmp_path / "log.jsonl"
    out = run(common(data, tmp_path) + ["--attention", kind, "--steps", "2", "--val-data", str(data / "toy_val_*.bin"),
                                        "--val-batches", "1", "--log", str(log), "--sample-tokens", "8"]).stdout
    assert f"fixed QK input ({kind})" in out and "not a parameter" in out, out
    meta, tensors = read_checkpoint(tmp_path / "final.bin")
    if kind == "rndembqk":
        eps = tensors["fixed_qk.input"]
        assert eps.shape == (64, 64) and abs(eps.std() - 0.02 * 8) < 0.01, eps.std()
        state = eps
    else:
        state = tensors["fixed_qk.tokens"]
        assert state.shape == (64,)
        assert list(state) == list(read_shard(str(data / "toy_train_000000.bin"))[:64])
    names = {n for n in tensors if not n.startswith("opt.")}
    from attnref.san import SANConfig, count_parameters, parameter_spec
    cfg = SANConfig.from_meta(meta)
    assert names == {n for n, _ in parameter_spec(cfg)} | {"fixed_qk.input" if kind == "rndembqk" else "fixed_qk.tokens"}
    assert f"parameters: {count_parameters(cfg)[0]} total" in out
    import json
    records = [json.loads(l) for l in log.read_text().splitlines() if "max_logit" in l]
    assert records and all(len(r["max_logit"]) == 2 and min(r["max_logit"]) > 0 for r in records), records
    assert "\nsample: " in out, out
    run(["--resume", str(tmp_path / "final.bin"), "--sample-tokens", "0", "--extend-to", "3", "--checkpoint-dir",
         str(tmp_path / "resumed")])
    again = read_checkpoint(tmp_path / "resumed" / "final.bin")[1]
    key = "fixed_qk.input" if kind == "rndembqk" else "fixed_qk.tokens"
    assert again[key].tobytes() == state.tobytes()
    assert not np.array_equal(again["layers.0.attn.wq"], tensors["layers.0.attn.wq"])  # (training went on)


@needs_bin
@pytest.mark.parametrize("embed_scale, sigma", [("sqrt-d", 0.02 * 8), ("1", 0.02)])
def test_rndembqk_sigma_as_printed_is_as_drawn(data, tmp_path, embed_scale, sigma):
    """The start-up line's sigma of rndembqk's eps (doc/deconstructing.md "Decision (sigma)": 0.02
    times the embedding multiplier, sqrt(d) = 8 for tiny or 1) is the std of the eps in a fresh
    checkpoint (the 0% milestone, before any step): 4,096 draws, so the sample std is within 5% of
    sigma (its relative sd is 1/sqrt(2 x 4096) = 1.1%)."""
    import re
    out = run(common(data, tmp_path) + ["--attention", "rndembqk", "--embed-scale", embed_scale, "--steps", "1",
                                        "--milestones", "1"]).stdout
    printed = float(re.search(r"eps ~ N\(0, ([0-9.e+-]+)\^2\)", out).group(1))
    eps = read_checkpoint(tmp_path / "milestone_000.bin")[1]["fixed_qk.input"]
    assert abs(printed - sigma) <= 1e-6 * sigma, (printed, sigma)
    assert abs(eps.std() - printed) <= 0.05 * printed, (eps.std(), printed)


@needs_bin
def test_fixedseqqk_needs_enough_training_data(tmp_path):
    write_shard(tmp_path / "short_train_000000.bin", np.array([BOS] + list(range(3, 23)), dtype=np.int64))
    args = ["--preset", "tiny", "--attention", "fixedseqqk", "--train-data", str(tmp_path / "short_train_*.bin"),
            "--val-data", "", "--steps", "1", "--sample-tokens", "0", "--batch-size", "1", "--seq-len", "16"]
    proc = run(args, check=False)
    assert proc.returncode != 0 and "21 tokens, fewer than the 64 fixed tokens of fixedseqqk" in proc.stderr, proc.stderr
    import train_san
    assert train_san.main(args[:6] + ["--device", "cpu", "--steps", "1", "--batch-size", "1"]) == 1


@needs_bin
@pytest.mark.parametrize("kind, name", [("rndembqk", "fixed_qk.input"), ("fixedseqqk", "fixed_qk.tokens")])
def test_checkpoint_without_its_fixed_input_is_refused(data, tmp_path, kind, name):
    """Both readers name the file and the missing tensor (or its wrong shape)."""
    from attnref.container import KIND_CHECKPOINT, read_container, write_container
    run(common(data, tmp_path) + ["--attention", kind, "--steps", "1"])
    _, meta, tensors = read_container(tmp_path / "final.bin", KIND_CHECKPOINT)
    for broken, message in (("missing.bin", f"missing tensor '{name}'"), ("short.bin", f"tensor '{name}' has")):
        items = [(n, t, "int32" if t.dtype.kind == "i" else "fp32") for n, t in tensors.items()
                 if broken == "short.bin" or n != name]
        if broken == "short.bin":
            items = [(n, t[:10] if n == name else t, dt) for n, t, dt in items]
        write_container(tmp_path / broken, KIND_CHECKPOINT, list(meta.items()), items)
        proc = run(["--steps", "0", "--init-from", str(tmp_path / broken), "--val-data", str(data / "toy_val_*.bin"),
                    "--val-batches", "1"], check=False)
        assert proc.returncode != 0 and str(tmp_path / broken) in proc.stderr and message in proc.stderr, proc.stderr
        ref = reference("train_san.py", ["--load-checkpoint", tmp_path / broken, "--device", "cpu"])
        assert ref.returncode != 0 and str(tmp_path / broken) in ref.stderr and name in ref.stderr, ref.stderr


@pytest.mark.parametrize("kind, layout", [("rndembqk", "uniform"), ("fixedseqqk", "hybrid")])
def test_reference_fixed_qk_maps_are_input_independent(kind, layout):
    """The reference's rndembqk / fixedseqqk (attnref/san.py): every real row of a variant layer
    attends with the same q, k, those of the fixed stream alone (a batch of other tokens gives the
    same ones), while the values and so the outputs follow the input; the fixed input is state
    (no gradient), while W_q, W_k of the variant layer get one (through the fixed stream)."""
    import torch
    from attnref.san import PRESETS, SAN, SANConfig
    cfg = SANConfig(**dict(PRESETS["tiny-ffn"], attention=kind, layout=layout))
    model = SAN(cfg).init_weights(3).double()
    attn = model.layers[0].attn
    original = attn.forward
    seen = []

    def capture(u, cos, sin, mask, impl="explicit", u0=None, qk=None):
        seen.append((u.shape[0], qk))
        return original(u, cos, sin, mask, impl, u0, qk)
    attn.forward = capture
    g = torch.Generator().manual_seed(0)
    runs = []
    for _ in range(2):
        seen.clear()
        idx = torch.randint(3, cfg.vocab_size, (3, 16), generator=g)
        logits, _ = model(idx)
        (q_real, k_real), = [qk for rows, qk in seen if rows == 3]
        (q_fixed, k_fixed), = [qk for rows, qk in seen if rows == 1]
        assert torch.equal(q_real, q_fixed.expand_as(q_real)) and torch.equal(k_real, k_fixed.expand_as(k_real))
        runs.append((q_fixed.detach(), logits.detach()))
    assert torch.equal(runs[0][0], runs[1][0])            # the maps do not depend on the input
    assert not torch.allclose(runs[0][1], runs[1][1])     # the outputs do
    attn.forward = original
    idx = torch.randint(3, cfg.vocab_size, (2, 16), generator=g)
    _, (loss, _, _) = model(idx, torch.roll(idx, -1, 1))
    loss.backward()
    assert float(attn.wq.grad.abs().max()) > 0 and float(attn.wk.grad.abs().max()) > 0
    assert all(not t.requires_grad for _, t, _ in model.state_tensors())


@needs_bin
@pytest.mark.parametrize("kind", ["rndembqk", "fixedseqqk"])
def test_fixed_qk_resume_is_exact(data, tmp_path, kind):
    """6 steps of 2 micro-batches straight, and resumed from the step-3 checkpoint: byte-identical
    final checkpoints (parameters, optimizer state, the fixed input, the data position)."""
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    args = ["--attention", kind, "--layout", "hybrid", "--grad-accum", "2", "--steps", "6"]
    run(common(data, straight) + args + ["--save-every", "3"])
    run(common(data, resumed) + args + ["--resume", str(straight / "step_3.bin")])
    assert state_differences((straight / "final.bin"), (resumed / "final.bin")) == []


def test_taylor_separate_has_a_pole_not_a_precision_problem():
    """doc/deconstructing.md "approximate": the paper's separate form (Eq. 14-17) is evaluated
    accurately in float64 (the reference's output equals exact rational arithmetic on the same
    float64 inputs to 1e-9 relative at the worst-conditioned row, kappa > 1e3; measured 2.6e-13
    at kappa 7.0e3), and still fails: its first-order normaliser Z_1 = sum_tau x is negative in
    about half the rows of zero-mean q, k (measured 51%), and where it nears 0 the output leaves
    the range of the values by orders of magnitude (a pole; measured |o| 2,591 with |v| <= 2.7),
    which no arithmetic removes. hd = 4, so the scale 1/sqrt(hd) = 1/2 is exact."""
    from fractions import Fraction
    import torch
    from attnref.variants import taylor_attention
    g = torch.Generator().manual_seed(0)
    B, H, T, hd = 4, 2, 64, 4
    q, k, v = (torch.randn(B, H, T, hd, generator=g, dtype=torch.float64) for _ in range(3))
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    out = taylor_attention(q, k, v, mask, norm="separate")
    x = torch.where(mask, torch.einsum("bhtd,bhsd->bhts", q, k) / 2.0, torch.zeros((), dtype=torch.float64))
    z1 = x.sum(-1)
    assert 0.3 < float((z1[..., 1:] < 0).double().mean()) < 0.7  # (row 0 sees itself only: x >= 0 there)
    kappa = x.abs().sum(-1) / z1.abs()
    b, h, t = np.unravel_index(int(kappa.argmax()), kappa.shape)
    assert kappa[b, h, t] > 1e3
    xs = [sum(Fraction(float(q[b, h, t, c])) * Fraction(float(k[b, h, s, c])) for c in range(hd)) / 2 for s in range(t + 1)]
    exact = []
    for c in range(hd):
        vs = [Fraction(float(v[b, h, s, c])) for s in range(t + 1)]
        terms = ([Fraction(1)] * len(xs), xs, [z * z / 2 for z in xs])  # f_0, f_1, f_2, each normalised alone
        exact.append(float(sum(sum(w * vv for w, vv in zip(f, vs)) / sum(f) for f in terms)))
    got = out[b, h, t].tolist()
    assert max(abs(a - e) for a, e in zip(got, exact)) <= 1e-9 * max(abs(e) for e in exact), (got, exact)
    assert max(abs(a) for a in got) > 100 * float(v[b, h, : t + 1].abs().max())
