"""train_gpt2's presets (presets/gpt2/NAME.conf), which the trainer compiles in and the reference
(attnref/gpt2.py, train_gpt2.py) reads.

- Parse check: every file reads, sets every model flag of train_gpt2 with a value GPT2Config takes and
  nothing else; a bad file fails naming itself.
- The binary resolves every preset as the reference does: its --print-config lines of the model
  flags and its model line are the reference's config of the preset, and -h lists the same names.
The binary's tests need TRAIN_GPT2_BIN (make test sets it); skipped without it.
"""
import dataclasses
import glob
import os
import re
import subprocess

import numpy as np
import pytest

from attnref import gpt2, presets
from attnref.shards import write_shard

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.environ.get("TRAIN_GPT2_BIN", "")
needs_bin = pytest.mark.skipif(not BIN or not os.path.exists(os.path.join(ROOT, BIN)),
                               reason="TRAIN_GPT2_BIN not set (make test sets it)")
FILES = sorted(glob.glob(os.path.join(ROOT, "presets", "gpt2", "*.conf")))


def test_every_preset_file_reads_and_sets_every_model_flag():
    names = sorted(os.path.basename(p)[:-len(".conf")] for p in FILES)
    assert names == sorted(gpt2.PRESETS) and "tiny" in names     # tiny: the trainers' default preset
    every_flag = {presets.flag_of_field(f.name) for f in dataclasses.fields(gpt2.GPT2Config)}
    assert every_flag == {"vocab-size", "max-seq-len", "n-layer", "n-embd", "n-head", "bos-id"}
    for path in FILES:
        preset = presets.read_preset(path)
        assert set(preset.model) == every_flag, path
        gpt2.GPT2Config(**gpt2.preset_config(preset))     # every value typed and valid


with open(os.path.join(ROOT, "presets", "gpt2", "tiny.conf")) as f:
    TINY = f.read()


@pytest.mark.parametrize("text, message", [
    ("n-layer 4\n", "line 1: expected `key = value`"),
    (TINY + "n-layer = 3\n", "n-layer is set twice"),
    (TINY.replace("n-head = 4\n", ""), "sets no n-head: a preset sets every model flag"),
    (TINY + "ffn = none\n", "unknown setting 'ffn'"),
    (TINY.replace("n-embd = 64", "n-embd = wide"), "n-embd = 'wide' is not a"),
    (TINY + "tuned-for = paper-setup\n", "unknown setting tuned-for"),
    (TINY + "swept-by = a sweep\n", "has swept rates but no swept-study"),
])
def test_a_bad_preset_file_fails_naming_itself(tmp_path, text, message):
    path = tmp_path / "bad.conf"
    path.write_text(text)
    with pytest.raises(presets.PresetFileError, match=re.escape(message)) as e:
        gpt2.preset_config(presets.read_preset(str(path)))
    assert str(path) in str(e.value)


@pytest.fixture(scope="module")
def shard(tmp_path_factory):
    path = tmp_path_factory.mktemp("gpt2_presets") / "train.bin"
    write_shard(str(path), np.arange(3, 3 + 4096) % 200 + 3)
    return str(path)


def print_config(args, shard):
    cmd = [os.path.join(ROOT, BIN)] + args + ["--train-data", shard, "--batch-size", "1", "--seq-len", "8",
                                              "--print-config", "1", "--run-dir", ""]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, f"{' '.join(cmd)}:\n{proc.stdout}{proc.stderr}"
    return proc.stdout


@needs_bin
@pytest.mark.parametrize("preset", sorted(gpt2.PRESETS))
def test_the_binary_resolves_each_preset_as_the_reference(preset, shard):
    """The trainer and the reference read the same file: its resolved flags and its model line."""
    out = print_config(["--preset", preset], shard)
    resolved = dict(re.findall(r"^([a-z0-9-]+) += (.*)$", out, re.M))
    ref = gpt2.PRESETS[preset]
    assert {presets.flag_of_field(k): resolved[presets.flag_of_field(k)] for k in ref} == \
        {presets.flag_of_field(k): str(v) for k, v in ref.items()}
    c = gpt2.GPT2Config(**ref)
    assert (f"model: GPT-2 L={c.n_layer} d={c.n_embd} heads {c.n_head} (head_dim {c.head_dim}), vocab {c.vocab_size} "
            f"(padded {c.padded_vocab_size}), context {c.seq_len}, bos {c.bos_id}\n") in out


@needs_bin
def test_help_names_every_preset():
    out = subprocess.run([os.path.join(ROOT, BIN), "-h"], cwd=ROOT, capture_output=True, text=True, timeout=60).stdout
    line = next(line for line in out.splitlines() if line.lstrip().startswith("--preset"))
    listed = re.findall(r"([a-z0-9-]+)(?: \(\d+M\))?[,;]", line.split("model preset:")[1])
    assert sorted(listed) == sorted(gpt2.PRESETS), line


@needs_bin
def test_the_default_rate_is_the_rates_files(shard):
    """train_gpt2 and train_gpt2.py default to presets/rates/gpt2.conf's AdamW rate, with its source."""
    import train_gpt2
    rates = presets.read_rates("gpt2", "gpt2")
    assert train_gpt2.build_parser().parse_args([]).lr == rates.adamw
    out = print_config(["--preset", "gpt2"], shard)
    assert f"optimizer: adamw lr {rates.adamw:g} (other {rates.adamw:g}) (default rates of {rates.source});" in out, out
