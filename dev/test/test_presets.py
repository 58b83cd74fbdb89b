"""The model presets against the papers, and every study file's arms against their presets.

- The qwen presets are "Deconstructing Attention"'s Table 10 (appendix L: layers, width, heads,
  FFN width; MHA) with Qwen2.5's RoPE base, unscaled embedding and N(0, 0.02) init, in the
  trainer binary (its start-up banner), the reference (attnref/san.py) and scripts/match.py.
- A fresh model's output projections are drawn as --out-init says (the std of a checkpoint's
  W_o and W_down against 0.02 and 0.02 / sqrt(2L)).
- Every arm of every studies/*.toml: the model its command line gives (the trainer's banner)
  differs from its preset's only in fields that a model flag of the study or the arm sets
  (nothing changes the model implicitly); the
  Deconstructing Attention studies build on a qwen preset and change nothing of it but the
  attention kind, the layout and (the CPU grid's tokenizer) the vocabulary.
The banner is read from the binary's first lines and the process stopped there, so even the
1.7B preset costs no memory. Needs TRAIN_SAN_BIN (make test sets it); skipped without it.
"""
import glob
import math
import os
import re
import subprocess
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
sys.path.insert(0, os.path.join(ROOT, "dev", "data"))
sys.path.insert(0, ROOT)
import match  # noqa: E402
import study  # noqa: E402
from attnref import san  # noqa: E402
from shards import write_shard  # noqa: E402

BIN = os.environ.get("TRAIN_SAN_BIN", "")
needs_bin = pytest.mark.skipif(not BIN or not os.path.exists(os.path.join(ROOT, BIN)),
                               reason="TRAIN_SAN_BIN not set (make test sets it)")

# "Deconstructing Attention", appendix L, Table 10: hidden size, FFN width, layers, heads (MHA).
TABLE_10 = {"qwen-70m": (512, 2048, 6, 8), "qwen-160m": (768, 3072, 12, 12), "qwen-500m": (896, 4864, 24, 14),
            "qwen3-1.7b": (2048, 6144, 28, 16)}

# The banner's model fields and the flag that sets each.
FLAG_OF_FIELD = {"n_layer": "--n-layer", "n_embd": "--n-embd", "n_head": "--n-head", "n_kv_head": "--n-kv-head",
                 "ffn": "--ffn", "d_ff": "--d-ff", "norm": "--norm", "qk_norm": "--qk-norm", "residual": "--residual",
                 "sandwich": "--sandwich", "rope_theta": "--rope-theta", "doc_mask": "--doc-mask",
                 "z_loss": "--z-loss", "embed_scale": "--embed-scale", "out_init": "--out-init",
                 "attention": "--attention", "layout": "--layout", "vocab_size": "--vocab-size",
                 "seq_len": "--max-seq-len", "bos_id": "--bos-id", "taylor_norm": "--taylor-norm"}
MODEL_FLAGS = set(FLAG_OF_FIELD.values())
# flags naming files (replaced by a small shard here) and what needs a checkpoint
FILE_FLAGS = {"--train-data", "--val-data", "--tokenizer", "--eval-sets", "--log", "--checkpoint-dir",
              "--init-from", "--resume"}


@pytest.fixture(scope="module")
def shard(tmp_path_factory):
    path = tmp_path_factory.mktemp("presets") / "train.bin"
    write_shard(str(path), np.arange(3, 3 + 4096) % 200 + 3)
    return str(path)


def banner(args, shard):
    """The model config the trainer resolves from `args`, as {field: text}: its start-up lines up
    to the parameter counts (printed before the model is built; the process is stopped there)."""
    cmd = [os.path.join(ROOT, BIN)] + args + ["--train-data", shard, "--val-data", shard, "--batch-size", "1",
                                              "--seq-len", "8", "--steps", "1", "--sample-tokens", "0",
                                              "--checkpoint-dir", os.path.join(os.path.dirname(shard), "ckpt")]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines = []
    try:
        for line in proc.stdout:        # the trainer's stdout is line-buffered
            lines.append(line)
            if line.startswith("parameters:"):
                break
    finally:
        proc.kill()
        err = proc.communicate(timeout=60)[1]
    text = "".join(lines)
    m = re.search(r"^model: L=(\d+) d=(\d+) heads (\d+)/(\d+) \(head_dim \d+\) (.*)$", text, re.M)
    a = re.search(r"^attention: (\S+), layout (\S+)", text, re.M)
    v = re.search(r"^vocab (\d+) \(padded \d+\), context (\d+), bos (\d+)$", text, re.M)
    assert m and a and v, f"{' '.join(cmd)}:\n{text}{err}"
    fields = dict(zip(("n_layer", "n_embd", "n_head", "n_kv_head"), m.groups()[:4]))
    fields.update(kv.split("=", 1) for kv in m.group(5).split())
    fields.update(attention=a.group(1), layout=a.group(2), vocab_size=v.group(1), seq_len=v.group(2),
                  bos_id=v.group(3))
    fields.setdefault("d_ff", "-")      # printed only with an FFN
    return fields


@needs_bin
@pytest.mark.parametrize("preset", sorted(TABLE_10))
def test_qwen_presets_are_table_10(preset, shard):
    d, d_ff, layers, heads = TABLE_10[preset]
    qk_norm = preset.startswith("qwen3")                  # Qwen3's QK-norm, in the 1.7B only
    want = dict(n_layer=str(layers), n_embd=str(d), n_head=str(heads), n_kv_head=str(heads), ffn="swiglu",
                d_ff=str(d_ff), norm="rms", qk_norm=str(int(qk_norm)), residual="standard", rope_theta="1e+06",
                z_loss="0", embed_scale="1", out_init="plain", vocab_size="50257", seq_len="2048")
    got = banner(["--preset", preset], shard)
    assert {k: got[k] for k in want} == want
    ref = san.PRESETS[preset]
    assert (ref["n_embd"], ref["d_ff"], ref["n_layer"], ref["n_head"], ref["n_kv_head"]) == (d, d_ff, layers, heads,
                                                                                             heads)
    assert (ref["norm"], ref["residual"], ref["qk_norm"], ref["rope_theta"], ref["embed_scale"], ref["out_init"]) == \
        ("rms", "standard", qk_norm, 1e6, "1", "plain")
    arm = match.PRESETS[preset]
    assert (arm.n_embd, arm.d_ff, arm.n_layer, arm.n_head, arm.n_kv_head) == (d, d_ff, layers, heads, heads)


@needs_bin
@pytest.mark.parametrize("out_init", ["scaled", "plain"])
def test_output_projections_are_drawn_as_out_init_says(out_init, tmp_path, shard):
    """One step at rate 0 leaves the initial parameters in final.bin: W_o and W_down have std
    0.02 / sqrt(2L) (scaled) or 0.02 (plain), like every other matrix (W_q, W_gate)."""
    L = 3
    proc = subprocess.run([os.path.join(ROOT, BIN), "--preset", "tiny-ffn", "--n-layer", str(L), "--n-embd", "128",
                           "--d-ff", "512", "--out-init", out_init, "--optimizer", "adamw", "--lr", "0",
                           "--train-data", shard, "--batch-size", "1", "--seq-len", "8", "--steps", "1",
                           "--sample-tokens", "0", "--checkpoint-dir", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    model = san.load_checkpoint(tmp_path / "final.bin")[0]
    assert model.cfg.out_init == out_init
    P = dict(model.ordered_parameters())
    expected = 0.02 / math.sqrt(2 * L) if out_init == "scaled" else 0.02
    for n, p in P.items():
        if n.endswith("attn.wo") or n.endswith("ffn.w_down"):
            assert abs(p.std().item() / expected - 1) < 0.05, (n, p.std().item(), expected)
        elif n.endswith("attn.wq") or n.endswith("ffn.w_gate"):
            assert abs(p.std().item() / 0.02 - 1) < 0.05, (n, p.std().item())


def study_commands():
    """(study file, arm name, preset, trainer arguments) of every arm of every studies/*.toml: its
    first run's command as study.py builds it, without mpirun and the file flags."""
    out = []
    for path in sorted(glob.glob(os.path.join(ROOT, "studies", "*.toml"))):
        s = study.load_study(path)
        seen = set()
        for run in s.runs:
            if run.arm.name in seen:
                continue
            seen.add(run.arm.name)
            cmd = study.run_command(s, run)
            cmd = cmd[cmd.index(s.binary) + 1:]
            args, i = [], 0
            while i < len(cmd):
                if cmd[i] in FILE_FLAGS:
                    i += 2
                    continue
                args.append(cmd[i])
                i += 1
            out.append((os.path.basename(path), s.name, run.arm.name, run.arm.preset, args))
    return out


STUDY_ARMS = study_commands()


def model_flags_given(args):
    """{flag: value} of the model flags in args (the last one of a flag wins, as in the trainer)."""
    return {args[i]: args[i + 1] for i in range(len(args) - 1) if args[i] in MODEL_FLAGS}


@needs_bin
@pytest.mark.parametrize("file, name, arm, preset, args", STUDY_ARMS, ids=[f"{a[0]}:{a[2]}" for a in STUDY_ARMS])
def test_study_arms_are_their_presets(file, name, arm, preset, args, shard):
    got = banner(args, shard)
    base = banner(["--preset", preset], shard)
    given = model_flags_given(args)
    changed = {FLAG_OF_FIELD[k] for k in got if k in FLAG_OF_FIELD and got[k] != base[k]}
    if got["d_ff"] == str(4 * int(got["n_embd"])) and {"--ffn", "--n-embd"} & set(given) and "--d-ff" not in given:
        changed.discard("--d-ff")       # the SwiGLU's default width 4 d, of a new width or a new FFN
    # every change of the preset comes from a model flag of the study file (no recipe flag such as
    # --paper-setup or --deconstructing-setup changes the model)
    assert changed <= set(given), f"{file} arm {arm}: {sorted(changed - set(given))} changed without a flag"
    if name.startswith("deconstructing"):
        assert preset in san.PRESETS and preset.startswith(("qwen-", "qwen3-")), f"{file} arm {arm}: preset {preset}"
        allowed = {"--attention", "--layout", "--taylor-norm", "--vocab-size"}
        assert changed <= allowed, f"{file} arm {arm} changes {sorted(changed - allowed)} of {preset}"
