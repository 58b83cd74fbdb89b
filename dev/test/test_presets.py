"""The presets and recipes (presets/NAME.conf, presets/recipes/NAME.conf), which the trainer compiles
in and the reference (attnref/san.py, train_san.py) and study/match.py read, against their
sources and against what the binary resolves.

- Parse check: every file reads (attnref/presets.py); a preset sets every model flag with a value
  the config takes; a bad file fails naming itself; each swept rate is the best its report names
  for that sweep arm; each recipe key is a flag of the trainer (and of the reference, but for the
  ones it lacks) or one of the recipe's own keys.
- The binary resolves every preset as the reference does (its banner), and its default rates
  (-h's table) as the reference's.
- The qwen presets are "Deconstructing Attention"'s Table 10 (appendix L: layers, width, heads,
  FFN width; MHA) with Qwen2.5's RoPE base, unscaled embedding and N(0, 0.02) init, in the
  trainer binary (its start-up banner), the reference (attnref/san.py) and study/match.py.
- A fresh model's output projections are drawn as --out-init says (the std of a checkpoint's
  W_o and W_down against 0.02 and 0.02 / sqrt(2L)).
- Every arm of every studies/*.toml: the model its command line gives (the trainer's banner)
  differs from its preset's only in fields that a model flag of the study or the arm sets
  (nothing changes the model implicitly); the
  Deconstructing Attention studies build on a qwen preset and change nothing of it but the
  attention kind, the layout and (the CPU grid's tokenizer) the vocabulary.
The banner is read from the binary's first lines and the process stopped there, so even the
1.7B preset costs no memory. The binary's tests need TRAIN_SAN_BIN (make test sets it); skipped
without it.
"""
import dataclasses
import glob
import math
import os
import re
import subprocess

import numpy as np
import pytest

from study import match
from study import runner as study
import train_san as ts
from attnref import presets, san
from attnref.shards import write_shard

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

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


def test_every_preset_file_reads_and_sets_every_model_flag():
    names = sorted(os.path.basename(p)[:-len(".conf")] for p in glob.glob(os.path.join(ROOT, "presets", "*.conf")))
    assert names and sorted(presets.load_presets()) == names == sorted(san.PRESETS) == sorted(match.PRESETS)
    every_flag = {san.training_flag(f.name) for f in dataclasses.fields(san.SANConfig)}
    for name, preset in presets.load_presets().items():
        assert set(preset.model) == every_flag, name
        san.SANConfig(**san.preset_config(preset))      # every value typed and valid
        assert preset.tuned_for in ("", "paper-setup"), name


with open(os.path.join(ROOT, "presets", "tiny.conf")) as f:   # its model lines
    FULL_PRESET = "".join(line for line in f if not line.startswith("swept-"))
SWEPT_HEAD = ("swept-by = a sweep\nswept-study = studies/x.toml\nswept-report = doc/study-runs/x.md\n"
              "swept-vocab-size = 8192\n")


@pytest.mark.parametrize("text, message", [
    ("n-layer 4\n", "line 1: expected `key = value`"),
    (FULL_PRESET + 'layout = "uniform\n', "the quoted value of layout has no closing quote"),
    (FULL_PRESET + "n-layer = 3\n", "n-layer is set twice"),
    (FULL_PRESET.replace("n-layer = 2\n", ""), "sets no n-layer: a preset sets every model flag"),
    (FULL_PRESET + "n-layers = 3\n", "unknown setting 'n-layers'"),
    (FULL_PRESET.replace("n-layer = 2", "n-layer = two"), "n-layer = 'two' is not a"),
    (FULL_PRESET + "swept-muon = 0.1\n", "has swept rates but no swept-by"),
    (FULL_PRESET + SWEPT_HEAD + "swept-muon = 0.1\n", "need muon, muon-other and adamw"),
    (FULL_PRESET + SWEPT_HEAD + "swept-sgd = 0.1\n", "unknown key 'swept-sgd'"),
])
def test_a_bad_preset_file_fails_naming_itself(tmp_path, text, message):
    path = tmp_path / "bad.conf"
    path.write_text(text)
    with pytest.raises(presets.PresetFileError, match=re.escape(message)) as e:
        san.preset_config(presets.read_preset(str(path)))
    assert str(path) in str(e.value)


@needs_bin
@pytest.mark.parametrize("preset", sorted(san.PRESETS))
def test_the_binary_resolves_each_preset_as_the_reference(preset, shard):
    """The trainer and the reference read the same file: every model setting of its banner is the
    reference's config of the preset."""
    c = san.SANConfig(**san.PRESETS[preset])
    want = dict(n_layer=c.n_layer, n_embd=c.n_embd, n_head=c.n_head, n_kv_head=c.n_kv_head, ffn=c.ffn,
                d_ff=c.d_ff if c.ffn != "none" else "-", norm=c.norm, qk_norm=int(c.qk_norm), residual=c.residual,
                sandwich=int(c.sandwich), rope_theta=f"{c.rope_theta:g}", doc_mask=int(c.doc_mask),
                z_loss=f"{c.z_loss:g}", embed_scale=c.embed_scale, out_init=c.out_init, attention=c.attention,
                layout=c.layout, vocab_size=c.vocab_size, seq_len=c.seq_len, bos_id=c.bos_id)
    assert banner(["--preset", preset], shard) == {k: str(v) for k, v in want.items()}


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


# ---------------------------------------------------------------------------------------------
# Default rates (issue 31, item 6): each small preset trains by default at the best rates of the
# committed CPU sweep (studies/preset_rates_cpu.toml, its report under doc/study-runs/), per arm and
# optimizer, as its preset file's swept-* lines say; any other model (a paper-size preset, or a
# small one with its size changed) at the SAN paper's locked rates for its arm. The reference
# resolves the same rates.

SWEEP_FILE = os.path.join(ROOT, "studies", "preset_rates_cpu.toml")
SWEEP_REPORT = os.path.join(ROOT, "doc", "study-runs", "2026-12-04-preset-rates-cpu.md")
PAPER_LOCKS = {("none", "muon"): 0.02, ("none", "adamw"): 6e-4, ("swiglu", "muon"): 0.04, ("swiglu", "adamw"): 2.4e-3}


def swept_best(report=SWEEP_REPORT):
    """{arm name: best rate} from the report's "- ARM: best RATE (LOSS)" lines."""
    with open(report) as f:
        return {m.group(1): float(m.group(2)) for m in re.finditer(r"^- (\S+): best ([^ ,(]+)", f.read(), re.M)}


def sweep_arms():
    """(arm name, trainer arguments without files and rate, the AdamW side it gives Muon or None) of
    the sweep's arms that set a default: the "-adamw" arms (AdamW's rate) and the "-muon-other"
    arms (Muon's matrix rate at the AdamW side they give); the first pass's "-muon" arms, with
    the AdamW side at 3e-4, set none."""
    s = study.load_study(SWEEP_FILE)
    out = []
    for arm in s.arms:
        if arm.name.endswith("-muon"):
            continue
        args = ["--preset", arm.preset] + s.flags + arm.flags
        args = [a for i, a in enumerate(args) if a not in FILE_FLAGS and (i == 0 or args[i - 1] not in FILE_FLAGS)]
        out.append((arm.name, args, arm.lr_others[0]))
    return out


def test_swept_rates_are_their_reports_best():
    """Each swept rate of a preset file is the best rate of its sweep arm in the report the file
    names (the "-adamw" arm: AdamW's rate; the "-muon-other" arm: Muon's, with the AdamW side it
    trained with), at the sweep's vocabulary; and every swept rate has its arm."""
    files = presets.load_presets()
    sweep = study.load_study(SWEEP_FILE)
    vocab = int(sweep.flags[sweep.flags.index("--vocab-size") + 1])
    checked = set()
    for arm in sweep.arms:
        if arm.name.endswith("-muon"):       # the first pass (AdamW side at 3e-4) sets none
            continue
        ffn = arm.flags[arm.flags.index("--ffn") + 1] if "--ffn" in arm.flags else files[arm.preset].model["ffn"]
        rates = [r for r in files[arm.preset].swept if r.ffn == ffn]
        assert len(rates) == 1, f"presets/{arm.preset}.conf has no swept rates for the arm {arm.name} (--ffn {ffn})"
        r = rates[0]
        assert (r.source["swept-study"], r.vocab_size) == (os.path.relpath(SWEEP_FILE, ROOT), vocab), arm.name
        best = swept_best(os.path.join(ROOT, r.source["swept-report"]))
        if arm.name.endswith("-adamw"):
            assert r.adamw == best[arm.name], arm.name
            checked.add((arm.preset, ffn, "adamw"))
        else:
            assert arm.name.endswith("-muon-other") and (r.muon, r.muon_other) == (best[arm.name], arm.lr_others[0])
            checked.add((arm.preset, ffn, "muon"))
    assert checked == {(name, r.ffn, k) for name, p in files.items() for r in p.swept for k in ("adamw", "muon")}


@needs_bin
def test_recipe_keys_are_flags_of_the_trainers():
    """A recipe sets flags of the trainer (-h lists them), for one preset as PRESET.flag, and the
    reference's flags but for REFERENCE_LACKS; its other keys are the recipe's own."""
    out = subprocess.run([os.path.join(ROOT, BIN), "-h"], cwd=ROOT, capture_output=True, text=True, timeout=60).stdout
    trainer = set(re.findall(r"^  (--[a-z0-9-]+) ", out, re.M))
    reference = {s for a in ts.build_parser()._actions for s in a.option_strings}
    recipes = sorted(glob.glob(os.path.join(ROOT, "presets", "recipes", "*.conf")))
    assert [os.path.basename(r) for r in recipes] == ["deconstructing-setup.conf", "paper-setup.conf"]
    for path in recipes:
        for key, value, line in presets.read_conf(path):
            if key in ts.RECIPE_OWN_KEYS:
                continue
            preset, _, flag = key.rpartition(".")
            assert not preset or preset in san.PRESETS, (path, line)
            assert "--" + flag in trainer, (path, line, key)
            assert "--" + flag in reference or flag in ts.REFERENCE_LACKS, (path, line, key)


def resolved_optimizer(args, shard):
    """The trainer's optimizer line for `args` (--print-config: nothing is trained or written)."""
    cmd = [os.path.join(ROOT, BIN)] + args + ["--train-data", shard, "--val-data", shard, "--batch-size", "1",
                                              "--seq-len", "8", "--steps", "1", "--print-config", "1", "--run-dir", ""]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, f"{' '.join(cmd)}:\n{proc.stderr}"
    return next(line for line in proc.stdout.splitlines() if line.startswith("optimizer:"))


def matrix_rate(line):
    """The peak rate of the matrices in an optimizer line (its first "lr X")."""
    return float(re.search(r"\blr ([^ ,]+)", line).group(1))


def reference_rates(args):
    """(lr, lr_other) as train_san.py resolves them for `args` (model and optimizer flags)."""
    import train_san as ts
    keep = []
    for i in range(0, len(args), 2):
        if args[i] in MODEL_FLAGS | {"--preset", "--optimizer"}:
            keep += args[i:i + 2]
    a = ts.parse_args(keep)
    oc = ts.opt_from_args(a, ts.config_from_args(a))
    return oc.lr, oc.lr_other


@needs_bin
@pytest.mark.parametrize("arm, args, other", sweep_arms(), ids=[a[0] for a in sweep_arms()])
def test_small_presets_default_to_their_swept_rates(arm, args, other, shard):
    best = swept_best()
    assert arm in best, f"{SWEEP_REPORT} has no best rate for arm {arm}"
    line = resolved_optimizer(args, shard)
    preset = args[1]
    assert matrix_rate(line) == pytest.approx(best[arm], rel=1e-6) and f"a CPU sweep of --preset {preset}" in line \
        and "at V 8192" in line, (arm, line)
    lr, lr_other = reference_rates(args)
    assert lr == pytest.approx(best[arm], rel=1e-12), arm
    if other is not None:  # Muon: its AdamW side is the one the arm trained with
        assert f"adamw on the rest lr {other:g} (default rates" in line, (arm, line)
        assert lr_other == pytest.approx(other, rel=1e-12), arm


@needs_bin
@pytest.mark.parametrize("args, ffn", [(["--preset", "demo", "--n-layer", "3"], "none"),
                                       (["--preset", "demo", "--vocab-size", "2048"], "none"),
                                       (["--preset", "tiny"], "none"),
                                       (["--preset", "tiny-ffn", "--d-ff", "256"], "swiglu"),
                                       (["--preset", "tiny", "--ffn", "swiglu"], "swiglu"),
                                       (["--preset", "qwen-cpu", "--qk-norm", "1", "--d-ff", "512"], "swiglu")])
@pytest.mark.parametrize("optimizer", ["muon", "adamw"])
def test_other_models_default_to_the_paper_locks(args, ffn, optimizer, shard):
    """A small preset with its size, form or vocabulary changed (tiny's own is 250, the sweep's
    8192) is no longer the model the sweep tuned: the paper's rates for its arm, and the source
    says so."""
    line = resolved_optimizer(args + ["--optimizer", optimizer], shard)
    lock = PAPER_LOCKS[(ffn, optimizer)]
    arm = "FFN" if ffn == "swiglu" else "SAN"
    assert matrix_rate(line) == pytest.approx(lock, rel=1e-6) and f"(default rates of the SAN paper's {arm} arm)" in line, line
    assert reference_rates(args + ["--optimizer", optimizer])[0] == pytest.approx(lock, rel=1e-12)


@needs_bin
def test_help_lists_each_presets_rates_as_the_trainer_uses_them(shard):
    out = subprocess.run([os.path.join(ROOT, BIN), "-h"], cwd=ROOT, capture_output=True, text=True, timeout=60).stdout
    rows = {m.group(1): (float(m.group(2)), float(m.group(3)), float(m.group(4)), m.group(5))
            for m in re.finditer(r"^  (\S+) +\d+ +\d+ +\d+ +\S+ +(\S+) +(\S+) +(\S+)  (.+)$", out, re.M)}
    assert set(rows) == set(san.PRESETS), sorted(rows)
    for preset, (muon, other, adamw, source) in rows.items():   # the reference's defaults
        want = ts.default_rates(san.SANConfig(**san.PRESETS[preset]))
        assert (muon, adamw, other) == pytest.approx(want, rel=1e-6), preset
    for preset in ("tiny", "demo", "qwen-cpu", "ffn4"):
        muon, other, adamw, source = rows[preset]
        for optimizer, rate in (("muon", muon), ("adamw", adamw)):
            line = resolved_optimizer(["--preset", preset, "--optimizer", optimizer], shard)
            assert matrix_rate(line) == pytest.approx(rate, rel=1e-6) and f"(default rates of {source})" in line, (preset, line)
            if optimizer == "muon":
                assert f"adamw on the rest lr {other:g} " in line, (preset, line)


def test_the_rates_files_hold_the_paper_locks():
    """presets/rates/: san-paper.conf holds the SAN paper's locked rates per arm (PAPER_LOCKS, its Muon
    side 3e-4), gpt2.conf train_gpt2's AdamW rate and no Muon."""
    assert sorted(os.listdir(presets.RATES_DIR)) == ["gpt2.conf", "san-paper.conf"]
    for ffn, arm in (("none", "san"), ("swiglu", "ffn")):
        r = presets.read_rates("san-paper", arm)
        assert (r.muon, r.adamw, r.muon_other) == (PAPER_LOCKS[(ffn, "muon")], PAPER_LOCKS[(ffn, "adamw")], 3e-4)
        assert r.source == f"the SAN paper's {arm.upper()} arm"
    g = presets.read_rates("gpt2", "gpt2")
    assert (g.adamw, g.muon, g.muon_other) == (6e-4, None, None)


RATES = "a-source = x\na-muon = 0.02\na-muon-other = 3e-4\na-adamw = 6e-4\n"


@pytest.mark.parametrize("text, arm, message", [
    (RATES + "a-sgd = 0.1\n", "a", "line 5: unknown key 'a-sgd'"),
    (RATES + "a-adamw = 0.1\n", "a", "line 5: a-adamw is set twice"),
    (RATES.replace("a-adamw = 6e-4\n", ""), "a", "the arm a needs a-source and a-adamw"),
    (RATES.replace("a-muon-other = 3e-4\n", ""), "a", "one of a-muon, a-muon-other without the other"),
    (RATES.replace("6e-4", "six"), "a", "a-adamw = 'six' is not a number"),
    (RATES, "b", "has no rates for the arm b"),
])
def test_a_bad_rates_file_fails_naming_itself(tmp_path, text, arm, message):
    (tmp_path / "bad.conf").write_text(text)
    with pytest.raises(presets.PresetFileError, match=re.escape(message)) as e:
        presets.read_rates("bad", arm, directory=str(tmp_path))
    assert str(tmp_path / "bad.conf") in str(e.value)
