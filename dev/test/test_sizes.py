"""attnref/sizes.py, the one place that counts parameters and FLOPs, against what does not use it:
the torch modules' own parameters (sum of numel), and the parameter counts and MFLOPs/token that
the C++ trainers print (their own ParamSpec lists). And study/match.py, which counts with it,
runs where torch cannot be imported.

The trainers' checks need TRAIN_SAN_BIN / TRAIN_GPT2_BIN (make test sets them); skipped without."""
import dataclasses
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from attnref import gpt2, san, sizes
from attnref.presets import flag_of_field
from attnref.shards import write_shard
from study import match

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def binary(var):
    path = os.environ.get(var)
    return os.path.join(ROOT, path) if path else None


SAN_BIN, GPT2_BIN = binary("TRAIN_SAN_BIN"), binary("TRAIN_GPT2_BIN")

# every field that changes the SAN's parameter list, each away from the default at least once, and
# the attention kinds whose tensors differ (mlp) or whose FLOPs do (mlp, nonapprox)
SAN_CONFIGS = [
    dict(),
    dict(ffn="swiglu"),
    dict(ffn="swiglu", d_ff=96, sandwich=True, residual="rezero", qk_norm=False),
    dict(ffn="swiglu", residual="standard", n_kv_head=4, vocab_size=1000),
    dict(residual="none", sandwich=True, n_layer=3, n_embd=96, n_head=6, n_kv_head=3),
    dict(attention="mlp", layout="hybrid", n_layer=4),
    dict(attention="mlp", layout="first", n_layer=3, ffn="swiglu", n_head=8, n_kv_head=2),
    dict(attention="nonapprox", n_layer=3),
    dict(attention="approximate", layout="odd", n_layer=3, ffn="swiglu"),
    dict(attention="rndembqk", layout="last", n_layer=2),
    dict(attention="staticembqk", layout="even", n_layer=4, qk_norm=False),
]


def numel_counts(model):
    """(total, non-embedding) from the module's parameters (the embeddings: wte, and GPT-2's wpe)."""
    params = dict(model.named_parameters())
    total = sum(p.numel() for p in params.values())
    return total, total - sum(params[n].numel() for n in ("wte", "wpe") if n in params)


@pytest.mark.parametrize("fields", SAN_CONFIGS, ids=lambda f: ",".join(f"{k}={v}" for k, v in f.items()) or "default")
def test_san_counts_equal_the_modules_parameters(fields):
    cfg = san.SANConfig(**fields)
    assert sizes.san_parameter_counts(cfg) == numel_counts(san.SAN(cfg))
    assert [n for n, _ in sizes.san_parameter_spec(cfg)] == [n for n, _ in san.SAN(cfg).ordered_parameters()]
    if cfg.attention == "standard":  # match's Arm (no attention field) counts the same model
        arm = match.Arm(**{f.name: getattr(cfg, f.name) for f in dataclasses.fields(match.Arm)})
        assert match.parameter_counts(arm) == sizes.san_parameter_counts(cfg)
        assert match.flops_per_token(arm) == sizes.san_flops_per_token(cfg)


@pytest.mark.parametrize("preset", ["tiny", "tiny-wide", "demo"])
def test_gpt2_counts_equal_the_modules_parameters(preset):
    cfg = gpt2.GPT2Config(**gpt2.PRESETS[preset])
    assert sizes.gpt2_parameter_counts(cfg) == numel_counts(gpt2.GPT2(cfg))


def printed_sizes(binary_path, flags, tmp_path):
    """(total, non-embedding, 'MFLOPs with two decimals') that a trainer prints for these flags."""
    shard = tmp_path / "sizes_train.bin"
    write_shard(str(shard), np.arange(64) % 200 + 3)
    proc = subprocess.run([binary_path, *flags, "--train-data", str(shard), "--print-config", "1", "--run-dir="],
                          capture_output=True, text=True, timeout=60, cwd=ROOT)
    m = re.search(r"^parameters: (\d+) total, (\d+) non-embedding; ([\d.]+) MFLOPs/token$", proc.stdout, re.M)
    assert proc.returncode == 0 and m, proc.stdout + proc.stderr
    return int(m.group(1)), int(m.group(2)), m.group(3)


def config_of_flags(config_cls, presets, flags):
    """The config a trainer builds from `--preset P` and model flags (field types from the preset's)."""
    assert flags[0] == "--preset"
    fields = dict(presets[flags[1]])
    by_flag = {"--" + flag_of_field(name): name for name in fields}
    for flag, text in zip(flags[2::2], flags[3::2]):
        name = by_flag[flag]
        fields[name] = type(fields[name])(int(text) if isinstance(fields[name], (bool, int)) else text)
    return config_cls(**fields)


@pytest.mark.skipif(not SAN_BIN, reason="TRAIN_SAN_BIN not set (make test sets it)")
@pytest.mark.parametrize("flags", [
    ["--preset", "tiny"],
    ["--preset", "tiny-ffn", "--d-ff", "96", "--sandwich", "1", "--residual", "rezero", "--qk-norm", "0"],
    ["--preset", "demo", "--residual", "none", "--n-kv-head", "4"],
    ["--preset", "demo", "--attention", "mlp", "--layout", "hybrid"],
    ["--preset", "demo", "--attention", "nonapprox"],
    ["--preset", "qwen-cpu", "--attention", "approximate", "--layout", "first"],
    ["--preset", "qwen3-cpu", "--attention", "staticembqk", "--layout", "odd"],
    ["--preset", "san20"], ["--preset", "ffn9"], ["--preset", "qwen-500m", "--attention", "mlp", "--layout", "hybrid"]],
    ids=" ".join)
def test_san_sizes_equal_train_san(flags, tmp_path):
    cfg = config_of_flags(san.SANConfig, san.PRESETS, flags)
    total, nonemb, mflops = printed_sizes(SAN_BIN, flags, tmp_path)
    assert (total, nonemb) == sizes.san_parameter_counts(cfg)
    assert mflops == f"{sizes.san_flops_per_token(cfg) / 1e6:.2f}"


@pytest.mark.skipif(not GPT2_BIN, reason="TRAIN_GPT2_BIN not set (make test sets it)")
@pytest.mark.parametrize("flags", [["--preset", "tiny"], ["--preset", "demo", "--n-layer", "3"], ["--preset", "gpt2"],
                                   ["--preset", "gpt2-xl"]], ids=" ".join)
def test_gpt2_sizes_equal_train_gpt2(flags, tmp_path):
    cfg = config_of_flags(gpt2.GPT2Config, gpt2.PRESETS, flags)
    total, nonemb, mflops = printed_sizes(GPT2_BIN, flags, tmp_path)
    assert (total, nonemb) == sizes.gpt2_parameter_counts(cfg)
    assert mflops == f"{sizes.gpt2_flops_per_token(cfg) / 1e6:.2f}"


def test_match_runs_without_torch():
    """`python -m study match` with torch unimportable prints, for the arm and each partner, the
    parameter counts of the torch model those fields build."""
    no_torch = "import runpy, sys; sys.modules['torch'] = None; "
    run_study = no_torch + "sys.argv[0] = 'study'; runpy.run_module('study', run_name='__main__', alter_sys=True)"
    argv = ["match", "--preset", "demo", "--n-layer", "6", "--vocab-size", "1000"]
    proc = subprocess.run([sys.executable, "-c", run_study, *argv], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    arm = dataclasses.replace(match.PRESETS["demo"], n_layer=6, vocab_size=1000)
    models = [arm] + list(match.partners(arm).values())
    printed = re.findall(r"^  ([\d,]+) parameters, ([\d,]+) non-embedding;", proc.stdout, re.M)
    assert len(printed) == len(models) == 4, proc.stdout
    for model, (total, nonemb) in zip(models, printed):
        cfg = san.SANConfig(**{f.name: getattr(model, f.name) for f in dataclasses.fields(match.Arm)})
        assert (int(total.replace(",", "")), int(nonemb.replace(",", ""))) == numel_counts(san.SAN(cfg))
    # and torch was really out of reach: the same code fails where a module needs it
    proc = subprocess.run([sys.executable, "-c", no_torch + "import attnref.san"], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)
    assert proc.returncode != 0 and "torch" in proc.stderr, proc.stderr
