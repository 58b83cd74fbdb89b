"""What the trainers tell and refuse (issue 16), for train_san and train_gpt2 alike (the
host-backend builds named by TRAIN_SAN_BIN and TRAIN_GPT2_BIN; the latter defaults to the
train_gpt2 next to TRAIN_SAN_BIN): resume and init-from semantics, the start-of-run data
summary, the command-line vocabulary, valid UTF-8 samples, prompts and the KV cache.

Every test runs a tiny model for a few steps on a toy corpus or a small offline build; the
file takes about 70 s on 2 cores (a third of it the Python references starting up).
"""
import json
import os
import signal
import subprocess
import sys

import numpy as np
import pytest

from trainer_cli import BOS, ROOT, reference, run_binary, write_pattern_corpus, state_differences
from attnref.shards import write_shard

SAN = os.environ.get("TRAIN_SAN_BIN")
GPT2 = os.environ.get("TRAIN_GPT2_BIN") or (SAN and os.path.join(os.path.dirname(SAN), "train_gpt2"))
pytestmark = pytest.mark.skipif(not SAN, reason="TRAIN_SAN_BIN not set (make test sets it)")
TRAINERS = ["san", "gpt2"]


def binary(trainer):
    path = os.path.join(ROOT, SAN if trainer == "san" else GPT2)
    if not os.path.exists(path):
        pytest.skip(f"{path} not built")
    return path


def run(trainer, args, check=True):
    return run_binary(binary(trainer), args, check)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """Two training shards, one validation shard."""
    return write_pattern_corpus(tmp_path_factory.mktemp("data"),
                                {"toy_train_000000": 200, "toy_train_000001": 200, "toy_val_000000": 40})


def common(data, ckpt_dir=None):
    out = ["--preset", "tiny", "--train-data", data / "toy_train_*.bin", "--val-data", data / "toy_val_*.bin",
           "--batch-size", 4, "--sample-tokens", 0, "--val-batches", 2, "--optimizer", "adamw", "--lr", "2e-3"]
    return out + (["--checkpoint-dir", ckpt_dir] if ckpt_dir is not None else [])


def lrs(out):
    """{step: lr} of the progress lines."""
    rows = [line.split("|") for line in out.splitlines() if line.startswith("step ") and "| lr" in line]
    return {int(r[0].split()[1].split("/")[0]): float(r[2].split()[1]) for r in rows}


@pytest.fixture(scope="module")
def finished(data, tmp_path_factory):
    """A 10-step run of each trainer, with a checkpoint at step 6 and at the end; its WSD decay
    over the last 3 steps (0.3) lowers the rate of steps 9 and 10 (the first decay step runs at
    the peak: llmc/optim/schedule.h; the default 0.15 of 10 steps floors to 1 step, no decay)."""
    out = {}
    for trainer in TRAINERS:
        d = tmp_path_factory.mktemp(f"run_{trainer}")
        proc = run(trainer, common(data, d) + ["--steps", 10, "--save-every", 6, "--decay-frac", 0.3])
        out[trainer] = (d, proc.stdout)
    return out


# ---- resume and init-from ------------------------------------------------------------------

@pytest.mark.parametrize("trainer", TRAINERS)
def test_resume_takes_the_saved_settings(trainer, data, finished, tmp_path):
    """Without repeating --lr, a resume continues at the saved rate and schedule (it used to
    take the flags' defaults), over the saved total of steps."""
    d, straight = finished[trainer]
    proc = run(trainer, ["--resume", d / "step_6.bin", "--checkpoint-dir", tmp_path])
    assert lrs(proc.stdout) == {s: lr for s, lr in lrs(straight).items() if s > 6}, proc.stdout
    assert "continuing the run saved in" in proc.stdout


@pytest.mark.parametrize("trainer", TRAINERS)
def test_resume_refuses_flags_that_change_the_run(trainer, data, finished, tmp_path):
    d, _ = finished[trainer]
    proc = run(trainer, ["--resume", d / "step_6.bin", "--lr", "0.02", "--batch-size", 8, "--checkpoint-dir", tmp_path],
               check=False)
    assert proc.returncode != 0
    assert "--lr (lr 0.02; the saved run's 0.002)" in proc.stderr and "--batch-size" in proc.stderr, proc.stderr
    # the same value as saved is no change
    run(trainer, ["--resume", d / "step_6.bin", "--lr", "2e-3", "--checkpoint-dir", tmp_path])
    # an explicit override is accepted and printed
    proc = run(trainer, ["--resume", d / "step_6.bin", "--lr", "0.02", "--resume-override", 1,
                         "--checkpoint-dir", tmp_path])
    assert "--resume-override 1: --lr (lr 0.02; the saved run's 0.002)" in proc.stdout
    assert max(lrs(proc.stdout).values()) > 0.01


@pytest.mark.parametrize("trainer", TRAINERS)
def test_finished_run_is_extended_explicitly(trainer, data, finished, tmp_path):
    d, _ = finished[trainer]
    proc = run(trainer, ["--resume", d / "final.bin", "--steps", 15, "--checkpoint-dir", tmp_path], check=False)
    assert proc.returncode != 0 and "--extend-to" in proc.stderr, proc.stderr
    proc = run(trainer, ["--resume", d / "final.bin", "--checkpoint-dir", tmp_path], check=False)
    assert proc.returncode != 0 and "finished (10 of 10 steps)" in proc.stderr
    # extending in the directory it started from would overwrite final.bin: refused up front
    before = (d / "final.bin").read_bytes()
    proc = run(trainer, ["--resume", d / "final.bin", "--extend-to", 15, "--checkpoint-dir", d], check=False)
    assert proc.returncode != 0 and "over the checkpoint it starts from" in proc.stderr
    assert (d / "final.bin").read_bytes() == before
    proc = run(trainer, ["--resume", d / "final.bin", "--extend-to", 15, "--checkpoint-dir", tmp_path])
    assert "extend: 10 -> 15 steps" in proc.stdout, proc.stdout
    assert sorted(lrs(proc.stdout)) == [11, 12, 13, 14, 15]
    assert (tmp_path / "final.bin").exists()


@pytest.mark.parametrize("trainer", TRAINERS)
def test_extending_a_decayed_wsd_run_hints_at_an_earlier_checkpoint(trainer, finished, tmp_path):
    """The 10-step WSD run decays over steps 9 and 10: extending final.bin raises the rate
    again, and a one-line hint says to extend from before the decay; step_6.bin is before it."""
    d, _ = finished[trainer]
    out = run(trainer, ["--resume", d / "final.bin", "--extend-to", 12, "--checkpoint-dir", tmp_path]).stdout
    hints = [line for line in out.splitlines() if line.startswith("hint: ")]
    assert len(hints) == 1 and "WSD" in hints[0] and "from step 9 of 10" in hints[0], out
    assert "before the decay" in hints[0] and "--save-every" in hints[0] and "--milestones" in hints[0]
    out = run(trainer, ["--resume", d / "step_6.bin", "--extend-to", 12, "--checkpoint-dir", tmp_path]).stdout
    assert "extend: 10 -> 12 steps" in out and "hint: " not in out, out


@pytest.mark.parametrize("trainer", TRAINERS)
def test_model_flags_contradicting_a_checkpoint_are_named(trainer, data, finished):
    d, _ = finished[trainer]
    ckpt = d / "final.bin"
    for start in (["--resume", ckpt, "--extend-to", 12], ["--init-from", ckpt, "--steps", 0]):
        proc = run(trainer, start + ["--n-layer", 8], check=False)
        assert proc.returncode != 0 and "--n-layer 8 (the checkpoint's 2)" in proc.stderr, proc.stderr
        proc = run(trainer, start + ["--preset", "demo"], check=False)
        assert proc.returncode != 0 and "--preset demo:" in proc.stderr and "n-layer 4" in proc.stderr
    if trainer == "san":
        proc = run(trainer, ["--init-from", ckpt, "--steps", 0, "--ffn", "swiglu"], check=False)
        assert proc.returncode != 0 and "--ffn swiglu (the checkpoint's none)" in proc.stderr
    # flags that agree with the file are fine, and --init-from says what it loaded
    proc = run(trainer, ["--init-from", ckpt, "--steps", 0, "--n-layer", 2] + common(data)[2:6])
    assert f"evaluation: the model of {ckpt} after 10 steps; no training" in proc.stdout


def test_checkpoints_name_their_trainer(finished):
    san_ckpt, gpt2_ckpt = finished["san"][0] / "final.bin", finished["gpt2"][0] / "final.bin"
    proc = run("san", ["--init-from", gpt2_ckpt, "--steps", 0], check=False)
    assert proc.returncode != 0 and "belongs to train_gpt2" in proc.stderr, proc.stderr
    proc = run("gpt2", ["--init-from", san_ckpt, "--steps", 0], check=False)
    assert proc.returncode != 0 and "belongs to train_san" in proc.stderr, proc.stderr


def test_changed_data_is_named_on_resume(data, finished, tmp_path):
    d, _ = finished["san"]
    proc = run("san", ["--resume", d / "step_6.bin", "--train-data", data / "toy_train_000000.bin",
                       "--resume-override", 1, "--checkpoint-dir", tmp_path], check=False)
    assert proc.returncode != 0 and "training shards: 1 now, 2 when saved" in proc.stderr, proc.stderr


# ---- what a run tells at the start ---------------------------------------------------------

def test_data_summary_and_overlap_warning(data, tmp_path):
    out = run("san", common(data) + ["--steps", 1]).stdout
    assert "train data: 2 shards" in out and "toy_train_000000.bin .. toy_train_000001.bin" in out, out
    assert "val data:   1 shard" in out and "warning" not in out
    out = run("san", common(data) + ["--steps", 1, "--val-data", data / "toy_*.bin"]).stdout
    assert f"warning: {data / 'toy_train_000000.bin'} is in both the training and the validation data" in out
    out = run("san", common(data) + ["--steps", 1, "--val-data", data / "toy_*.bin", "--print-config", 1]).stdout
    assert f"warning: {data / 'toy_train_000000.bin'} is in both the training and the validation data" in out


def file_errors(data, tmp_path):
    """(arguments, the error) for each file option: the flag, then the problem."""
    bogus = tmp_path / "bogus.bin"  # a file of neither kind: a header whose first int32 is 12345
    bogus.write_bytes((12345).to_bytes(4, "little") + bytes(1020))
    spm_named = tmp_path / "tok.model"  # (a stand-in: what matters is the .bin beside it)
    spm_named.write_bytes(b"\x0a\x0b not a tokenizer .bin")
    (tmp_path / "tok.bin").write_bytes(b"")
    train = ["--train-data", data / "toy_train_*.bin"]
    return [
        (train + ["--tokenizer", tmp_path / "nope.bin"], f"--tokenizer: no such file '{tmp_path / 'nope.bin'}'"),
        (train + ["--tokenizer", tmp_path], f"--tokenizer: '{tmp_path}' is a directory, not a file"),
        (["--train-data", tmp_path / "nope_*.bin"], f"--train-data: no file matches '{tmp_path / 'nope_*.bin'}'"),
        (["--train-data", data / "toy_train_000009.bin"], "--train-data: no such file"),
        (["--train-data", data], f"--train-data: '{data}' is a directory, not a token shard (a pattern of its shards, "
                                 f"quoted: '{data}/*_train_*.bin'?)"),  # (not */*.bin: that takes the val shard too)
        (train + ["--val-data", data], f"quoted: '{data}/*_val_*.bin'?)"),
        (train + ["--tokenizer", spm_named], f"--tokenizer {spm_named} is not a tokenizer .bin (a SentencePiece "
                                             f".model?): the trainers read the .bin written beside it: use --tokenizer "
                                             f"{tmp_path / 'tok.bin'}"),
        (["--train-data", bogus], "is not a token shard: magic number 12345, expected 20240520 (--train-data)"),
        (train + ["--val-data", tmp_path / "v_*.bin"], f"--val-data: no file matches '{tmp_path / 'v_*.bin'}'"),
        (["--init-from", tmp_path / "nope.bin", "--steps", 0], "--init-from: no such file"),
        (["--init-from", bogus, "--steps", 0], "not an attn.c tensor file (magic is not ATTNFILE) (--init-from)"),
        (["--resume", tmp_path / "nope.bin"], "--resume: no such file"),
        (train + ["--eval-sets", tmp_path / "e.bin"], f"--eval-sets: no such file '{tmp_path / 'e.bin'}'"),
        (train + ["--log", tmp_path / "no" / "log.jsonl"], f"--log: no such directory '{tmp_path / 'no'}'"),
        (train + ["--prompt", "hi"], "--prompt needs --tokenizer"),
    ]


@pytest.mark.parametrize("trainer", TRAINERS)
def test_file_errors_name_the_flag_before_the_model(trainer, data, tmp_path):
    """Each file option's error names the flag and the problem, and comes before the
    start-of-run summary (the data's used to come after nine lines of it)."""
    for args, message in file_errors(data, tmp_path):
        proc = run(trainer, ["--preset", "tiny"] + args, check=False)
        assert proc.returncode != 0 and message in proc.stderr, (args, proc.stderr)
        assert proc.stdout == "", (args, proc.stdout)  # not a line of the model's summary
    if trainer == "gpt2":
        proc = run(trainer, ["--init-from-llmc", tmp_path / "gpt2.bin"], check=False)
        assert proc.returncode != 0 and "--init-from-llmc: no such file" in proc.stderr, proc.stderr


@pytest.mark.parametrize("trainer", TRAINERS)
def test_init_from_a_directory_says_what_it_is_and_what_to_pass(trainer, finished, tmp_path):
    """--init-from DIR: a run directory is named with its newest checkpoint (and --resume DIR),
    a Hugging Face export with the import that makes a checkpoint of it."""
    d, _ = finished[trainer]
    proc = run(trainer, ["--init-from", d, "--steps", 0], check=False)
    assert proc.returncode == 1 and (f"--init-from: '{d}' is a run directory: pass one of its checkpoints, e.g. its "
                                     f"newest, --init-from {d}/final.bin (--resume {d} continues the run instead)"
                                     ) in proc.stderr, proc.stderr
    (tmp_path / "config.json").write_text("{}")
    proc = run(trainer, ["--init-from", tmp_path, "--steps", 0], check=False)
    assert proc.returncode == 1 and (f"--init-from: '{tmp_path}' is a Hugging Face model directory: turn it into a "
                                     f"checkpoint with `.venv/bin/python -m attnref.import_hf {tmp_path} CKPT`"
                                     ) in proc.stderr, proc.stderr


@pytest.mark.parametrize("trainer", TRAINERS)
def test_a_resume_echoes_the_temperature_as_given(trainer, data, tmp_path):
    """--temperature 0.8 (a float) comes back from the checkpoint as 0.8, not 0.800000011920929."""
    run(trainer, common(data, tmp_path) + ["--steps", 2, "--save-every", 1, "--temperature", "0.8"])
    (tmp_path / "final.bin").unlink()
    out = run(trainer, ["--resume", tmp_path / "step_1.bin"]).stdout
    said = [line for line in out.splitlines() if "--temperature" in line]
    assert said and all("--temperature 0.8," in line or line.endswith("--temperature 0.8") for line in said), out


@pytest.mark.parametrize("trainer", TRAINERS)
def test_a_finished_run_ends_with_a_summary_line(trainer, data, tmp_path):
    """The last line of a run (with no run directory; else the one before its contents): the
    steps, the time and the last training and validation losses, those of the progress and
    validation lines."""
    out = run(trainer, common(data) + ["--steps", 3, "--val-every", 0]).stdout
    last = out.splitlines()[-1]
    loss = [line.split("|")[1].split()[1] for line in out.splitlines() if line.startswith("step     3/3 |")][0]
    val = [line.split("val loss ")[1].split()[0] for line in out.splitlines() if line.startswith("step 3: val loss")][0]
    assert last.startswith("done: steps 1-3 of 3 in ") and last.endswith(
        f" s; training loss {loss} (step 3), val loss {val} (step 3)"), out


@pytest.mark.parametrize("trainer", TRAINERS)
def test_a_batch_too_large_for_memory_says_what_to_lower(trainer, data):
    """--batch-size past memory (here an 8 GB address-space limit; a GPU's memory alike) ended in
    a bare cudaMalloc error: it now names the flags behind the buffers, the logits' size and the
    way out (a smaller --batch-size, a larger --grad-accum)."""
    import resource

    def limited():
        resource.setrlimit(resource.RLIMIT_AS, (8 << 30, 8 << 30))
    proc = run_binary(binary(trainer), common(data) + ["--steps", 1, "--batch-size", 100000], check=False,
                      preexec_fn=limited)
    assert proc.returncode == 1 and "cudaMalloc of" in proc.stderr, proc.stderr
    assert "(allocating the model for --batch-size 100000 x --seq-len 64; its largest buffer, the logits, is " \
        "6.55 GB: rows x positions x vocabulary 256, fp32). Lower --batch-size and raise --grad-accum" in proc.stderr


def test_llmc_header_whose_sizes_wrap_64_bits_is_refused(tmp_path):
    """An llm.c model file whose header sizes make a parameter count that wraps around 2^64 to
    the file's own size (d = 180000001, L = 1565392063, Vp = 121589334, T = 1: 1024 bytes of
    "parameters", found by solving the count modulo 2^64) is refused by name: the count was
    taken modulo 2^64, matched the file, and the loader aborted (std::length_error, SIGABRT)."""
    d, L, Vp, T = 180000001, 1565392063, 121589334, 1
    numel = Vp * d + T * d + 2 * d + L * (12 * d * d + 13 * d)  # wte, wpe, ln_f, the layers (doc/formats.md)
    assert numel * 4 % 2**64 == 1024  # what the 64-bit sum made of it
    header = np.zeros(256, np.int32)
    header[:8] = [20240326, 3, T, 1000, L, d, d, Vp]  # head_dim 1
    path = tmp_path / "wrapped.llmc"
    path.write_bytes(header.tobytes() + bytes(1024))
    proc = run("gpt2", ["--init-from-llmc", path, "--steps", 0], check=False)
    assert proc.returncode == 1 and f"llm.c model file '{path}'" in proc.stderr, (proc.returncode, proc.stderr[-2000:])


def test_missing_saved_data_is_named_on_resume(tmp_path):
    """A resume reads the data of the saved run: a pattern that no longer matches names the
    flag and the checkpoint it came from, before the model is printed."""
    data = write_pattern_corpus(tmp_path, {"moved_train_000000": 40})
    run("san", ["--preset", "tiny", "--train-data", data / "moved_train_*.bin", "--batch-size", 2, "--steps", 2,
                "--save-every", 1, "--sample-tokens", 0, "--checkpoint-dir", tmp_path / "ckpt"])
    (data / "moved_train_000000.bin").unlink()
    proc = run("san", ["--resume", tmp_path / "ckpt" / "step_1.bin"], check=False)
    assert proc.returncode != 0, proc.stdout
    assert f"--train-data (saved in {tmp_path / 'ckpt' / 'step_1.bin'}): no file matches" in proc.stderr, proc.stderr
    assert "parameters:" not in proc.stdout, proc.stdout


@pytest.mark.parametrize("trainer", TRAINERS)
def test_command_line_vocabulary(trainer, data, tmp_path):
    # an unquoted glob the shell expanded into two files
    proc = run(trainer, ["--train-data", data / "toy_train_000000.bin", data / "toy_train_000001.bin"], check=False)
    assert proc.returncode != 0 and "unquoted glob" in proc.stderr and "quote it" in proc.stderr, proc.stderr
    # --flag=value
    out = run(trainer, [f"--train-data={data / 'toy_train_*.bin'}", "--steps=2"] + common(data)[4:]).stdout
    assert "training: 2 steps" in out
    # a mistyped preset lists the presets
    proc = run(trainer, ["--preset", "dmeo"], check=False)
    assert proc.returncode != 0 and "demo" in proc.stderr and "tiny" in proc.stderr
    # -h says whose defaults it shows and that --tokenizer sets the vocabulary
    usage = run(trainer, ["-h"]).stdout
    assert "preset 'tiny'" in usage and "--tokenizer FILE sets the vocabulary size" in usage
    assert "preset 'demo'" in run(trainer, ["--preset", "demo", "-h"]).stdout
    if trainer == "gpt2":  # no option that train_gpt2 refuses
        for muon_flag in ("--muon-order", "--muon-momentum", "--ns-steps", "--ns-fp32", "muon"):
            assert muon_flag not in usage


def usage_columns(usage):
    """The option rows of -h, and where its default and help columns start."""
    header = [l for l in usage.splitlines() if l.split() == ["option", "default"]][0]
    rows = [l for l in usage.splitlines() if l.startswith("  --") or l.startswith("  -h, --help")]
    at_default = header.index("default")
    at_help = at_default + max([len("default")] + [len(r[at_default:].split()[0]) for r in rows
                                                   if not r.startswith("  -h")]) + 1
    return rows, at_default, at_help


@pytest.mark.parametrize("trainer", TRAINERS)
def test_help_columns_stay_aligned(trainer):
    """Long option names (--deconstructing-setup, --resume-override, ...) no longer push their
    default and help out of the columns."""
    rows, at_default, at_help = usage_columns(run(trainer, ["-h"]).stdout)
    long_names = ["--resume-override", "--attention-kernels"] + (
        ["--skip-nonstandard", "--deconstructing-setup"] if trainer == "san" else [])
    for name in long_names:
        assert any(r.split()[0] == name for r in rows), name
    for r in rows:
        name = "-h, --help" if r.startswith("  -h") else r.split()[0]
        assert r[2:at_default].rstrip() == name and r[at_default - 1] == " ", r
        assert r[at_help - 1] == " " and r[at_help] != " ", r


def preset_rows(usage):
    """{preset: (layers, width, vocab, parameters)} of -h's preset table (two lines of title, a
    line of column names, a row per preset; the default rates follow the parameters)."""
    lines = usage.split("\npresets: ", 1)[1].splitlines()[3:]
    return {l.split()[0]: tuple(l.split()[1:5]) for l in lines if l.strip()}


@pytest.mark.parametrize("trainer", TRAINERS)
def test_help_lists_the_presets_with_their_sizes(trainer, data):
    """-h lists every preset with its layers, width, vocabulary and parameters, smallest first;
    the sizes are the ones a run of the preset prints."""
    rows = preset_rows(run(trainer, ["-h"]).stdout)
    listed = run(trainer, ["--preset", "no-such-preset"], check=False).stderr.split("presets: ", 1)[1]
    assert sorted(rows) == sorted(listed.rstrip().rstrip(")").split(", "))
    scale = {"K": 1e3, "M": 1e6, "B": 1e9}
    params = [float(p[:-1]) * scale[p[-1]] if p[-1] in scale else float(p) for _, _, _, p in rows.values()]
    assert params == sorted(params)
    for preset in ("tiny", "demo"):
        out = run(trainer, ["--preset", preset] + common(data)[2:] + ["--steps", 1, "--val-batches", 1]).stdout
        layers, width, vocab, total = rows[preset]
        assert f"L={layers} d={width} " in out, out
        banner = int([l for l in out.splitlines() if l.startswith("parameters: ")][0].split()[1])
        assert abs(banner - float(total[:-1]) * scale[total[-1]]) <= 0.01 * banner, (total, banner)


# ---- samples and prompts ---------------------------------------------------------------

@pytest.fixture(scope="module")
def offline(tmp_path_factory):
    """A small offline build (SentencePiece vocab 1000: a quarter of it byte pieces)."""
    out = tmp_path_factory.mktemp("offline")
    subprocess.run([sys.executable, os.path.join(ROOT, "dev/data/build_offline.py"), "--out", str(out), "--vocab-size",
                    "1000", "--synth-train-docs", "300", "--synth-val-docs", "60", "--shard-tokens", "200000",
                    "--eval-items", "10"], check=True, capture_output=True)
    return out


@pytest.fixture(scope="module")
def offline_models(offline, tmp_path_factory):
    """Each trainer's tiny model after 20 steps on the offline SYNTH data (vocab from the tokenizer)."""
    out = {}
    for trainer in TRAINERS:
        d = tmp_path_factory.mktemp(f"offline_{trainer}")
        run(trainer, ["--preset", "tiny", "--train-data", offline / "synth" / "synth_train_*.bin", "--tokenizer",
                      offline / "tokenizer.bin", "--steps", 20, "--batch-size", 4, "--sample-tokens", 0,
                      "--checkpoint-dir", d, "--optimizer", "adamw", "--lr", "3e-3"])
        out[trainer] = d / "final.bin"
    return out


@pytest.mark.parametrize("trainer", TRAINERS)
def test_samples_are_valid_utf8(trainer, offline, offline_models, tmp_path):
    """Random samples over a vocabulary that is a quarter byte pieces: the printed sample and
    the one in the JSONL log are valid UTF-8 (a lone byte piece of a longer character used
    to be printed as it was)."""
    for seed in (1, 2, 3):
        log = tmp_path / f"log{seed}.jsonl"
        proc = subprocess.run([binary(trainer), "--init-from", str(offline_models[trainer]), "--steps", "0",
                               "--tokenizer", str(offline / "tokenizer.bin"), "--sample-tokens", "200",
                               "--temperature", "2", "--seed", str(seed), "--log", str(log)],
                              cwd=ROOT, capture_output=True, timeout=300)
        assert proc.returncode == 0, proc.stderr
        proc.stdout.decode("utf-8")  # strict: raises on a broken sequence
        records = [json.loads(line) for line in log.read_bytes().decode("utf-8").splitlines()]
        samples = [r["sample"] for r in records if "sample" in r]
        assert len(samples) == 1 and samples[0]


def prompt_ids(out):
    line = [l for l in out.splitlines() if l.startswith("prompt: ")][0]
    return [int(t) for t in line.split(":", 2)[2].split()]


def test_prompt_encoding_matches_sentencepiece(offline, offline_models):
    """llmc/data/tokenizer.h's encoder against SentencePiece itself on documents of the offline
    corpus (SYNTH with its markers and newlines, and the KJV text)."""
    spm = pytest.importorskip("sentencepiece")
    sp = spm.SentencePieceProcessor(model_file=str(offline / "tokenizer.model"))
    from attnref.shards import read_shard
    texts = []
    for shard in (offline / "synth" / "synth_val_000000.bin", offline / "kjv" / "kjv_val_000000.bin"):
        tokens = np.asarray(read_shard(shard))
        docs = np.split(tokens, np.flatnonzero(tokens == BOS))
        texts += [sp.decode([int(t) for t in doc if t != BOS]) for doc in docs if len(doc) > 1][:3]
    texts.append("caf\u00e9 \u4e16\u754c \U0001F600 tabs\tand  spaces<|im_start|>user\n<think>x</think>")
    for text in texts:
        proc = run("san", ["--init-from", offline_models["san"], "--steps", 0, "--tokenizer",
                           offline / "tokenizer.bin", "--prompt", text, "--sample-tokens", 1])
        assert prompt_ids(proc.stdout) == sp.encode(text), text[:200]


def test_prompted_sample_continues_the_prompt(offline, offline_models):
    prompt = "<|im_start|>user\nWhat is"
    for trainer in TRAINERS:
        proc = run(trainer, ["--init-from", offline_models[trainer], "--steps", 0, "--tokenizer",
                             offline / "tokenizer.bin", "--prompt", prompt, "--sample-tokens", 8])
        assert proc.stdout.split("sample: ", 1)[1].startswith(prompt), proc.stdout
    proc = run("san", ["--init-from", offline_models["san"], "--steps", 0, "--prompt", "x"], check=False)
    assert proc.returncode != 0 and "--prompt needs --tokenizer" in proc.stderr


@pytest.fixture(scope="module")
def repeats(tmp_path_factory):
    """Documents that repeat 30 30 31 31 32: the next token depends on the tokens before, at
    relative positions the model must tell apart (after 30: 30 or 31)."""
    rng = np.random.default_rng(0)
    d = tmp_path_factory.mktemp("repeats")
    tokens = []
    for _ in range(300):
        tokens += [BOS] + [30, 30, 31, 31, 32] * int(rng.integers(3, 12))
    write_shard(d / "rep_train_000000.bin", np.array(tokens, dtype=np.int64))
    return d


@pytest.mark.parametrize("trainer", TRAINERS)
def test_kv_cache_greedy_samples_equal_recomputed_ones(trainer, repeats, tmp_path):
    """A model that learned the repeats, sampled greedily for 150 tokens (past the context of
    64: the cached steps, then the sliding window) with and without the KV cache: the same
    tokens. (Keys cached at the wrong position, a wrong document id or a stale row change
    them; checked by breaking the cache's RoPE offset.)"""
    run(trainer, ["--preset", "tiny", "--train-data", repeats / "rep_train_*.bin", "--steps", 100, "--batch-size", 8,
                  "--sample-tokens", 0, "--optimizer", "adamw", "--lr", "3e-3", "--schedule", "constant",
                  "--checkpoint-dir", tmp_path])
    samples = []
    for cache in (0, 1):
        out = run(trainer, ["--init-from", tmp_path / "final.bin", "--steps", 0, "--temperature", 0,
                            "--sample-tokens", 150, "--kv-cache", cache]).stdout
        samples.append([int(t) for t in out.split("sample: ", 1)[1].split()])
    assert samples[0] == samples[1]
    assert len(samples[0]) == 151 and len(set(samples[0])) >= 3, samples[0]


# ---- one vocabulary for C++ and Python -----------------------------------------------------

def region_losses(line):
    """{"val": x, "query": y, ...} of a "... val loss x | query y | ..." line."""
    parts = line.split("val loss", 1)[1].split("|")
    out = {"val": float(parts[0])}
    for p in parts[1:]:
        name, value = p.split()
        if name != "z-loss":
            out[name] = float(value)
    return out


def test_reference_prints_the_trainers_region_losses(offline, offline_models):
    """train_san.py reads the tokenizer .bin the C++ trainer reads, and prints the same
    validation and per-region losses for the same checkpoint with the same defaults
    (8 batches; rows of the model's context)."""
    ckpt, val = offline_models["san"], offline / "synth" / "synth_val_*.bin"
    out = run("san", ["--init-from", ckpt, "--steps", 0, "--val-data", val, "--sample-tokens", 0]).stdout
    cuda = region_losses([l for l in out.splitlines() if "val loss" in l][0])
    ref = reference("train_san.py", ["--load-checkpoint", ckpt, "--val-data", val, "--device", "cpu",
                                     "--tokenizer", offline / "tokenizer.bin", "--sample-tokens", 16])
    assert ref.returncode == 0, ref.stderr
    py = region_losses([l for l in ref.stdout.splitlines() if "val loss" in l][0])
    assert set(py) == set(cuda) and {"query", "trace", "answer"} <= set(py), (py, cuda)
    for key in py:  # the trainer ran in bf16 (the default build), the reference in fp32
        assert abs(py[key] - cuda[key]) <= 5e-3 * cuda[key], (key, py, cuda)
    assert "sample (text):" in ref.stdout


def test_reference_vocabulary(offline, offline_models, tmp_path):
    # the demo preset, the tokenizer .bin setting the vocabulary, --max-seq-len the context
    # and --seq-len the rows
    ref = reference("train_san.py", ["--preset", "demo", "--tokenizer", offline / "tokenizer.bin",
                                     "--max-seq-len", 32, "--seq-len", 16, "--n-layer", 1, "--device", "cpu",
                                     "--train-data", offline / "synth" / "synth_train_*.bin", "--steps", 1,
                                     "--batch-size", 2])
    assert ref.returncode == 0, ref.stderr
    assert "vocab_size=1000 seq_len=32 n_layer=1 n_embd=128" in ref.stdout
    assert "| 32 tok/s" not in ref.stdout and " tok/s" in ref.stdout
    # a SentencePiece .model given as the tokenizer: a clear error, not a protobuf trace
    ref = reference("train_san.py", ["--tokenizer", offline / "tokenizer.model"])
    assert ref.returncode == 1 and "not a readable tokenizer .bin" in ref.stderr, ref.stderr
    # the validation default is the C++ trainers' 8 batches
    import train_gpt2
    import train_san
    assert train_san.build_parser().parse_args([]).val_batches == 8
    assert train_gpt2.build_parser().parse_args([]).val_batches == 8
    # checkpoints say which trainer they belong to, in the references too
    ref = reference("train_san.py", ["--load-checkpoint", offline_models["gpt2"], "--device", "cpu"])
    assert ref.returncode == 1 and "belongs to train_gpt2" in ref.stderr, ref.stderr
    ref = reference("train_gpt2.py", ["--load-checkpoint", offline_models["san"], "--device", "cpu"])
    assert ref.returncode == 1 and "belongs to train_san" in ref.stderr, ref.stderr
    # --init-from: the model of a checkpoint, as in the trainers
    for script, trainer in (("train_san.py", "san"), ("train_gpt2.py", "gpt2")):
        ref = reference(script, ["--init-from", offline_models[trainer], "--device", "cpu", "--val-batches", 1,
                                 "--val-data", offline / "synth" / "synth_val_*.bin"])
        assert ref.returncode == 0 and "val loss" in ref.stdout, ref.stderr


# ---- outputs that do not collide; gpu_check without a GPU ------------------------------------

def test_demo_arms_write_their_own_run_directories(offline, tmp_path):
    """Two demo arms (scripts/demo.sh, shortened to 2 steps) keep their logs and checkpoints
    apart: logs/demo/<arm> named from the arguments (they used to share logs/demo)."""
    env = dict(os.environ, DATA_DIR=str(offline), DEMO_DIR=str(tmp_path), TRAIN_SAN=os.path.join(ROOT, SAN))
    short = ["--steps", "2", "--val-every", "0", "--sample-tokens", "0"]
    for extra in ([], ["--ffn", "swiglu"]):
        proc = subprocess.run(["bash", os.path.join(ROOT, "scripts/demo.sh")] + extra + short, cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stdout + proc.stderr
    runs = sorted(p.name for p in tmp_path.iterdir())
    assert runs == ["ffn-swiglu_steps-2_val-every-0_sample-tokens-0", "steps-2_val-every-0_sample-tokens-0"], runs
    for run_dir in tmp_path.iterdir():
        assert (run_dir / "final.bin").exists() and (run_dir / "log.jsonl").exists()
    ffn_log = (tmp_path / runs[0] / "log.jsonl").read_text()
    assert (tmp_path / runs[1] / "log.jsonl").read_text() != ffn_log


def demo(offline, demo_dir, args, **kw):
    """scripts/demo.sh with ARGS `args`, its data the small offline build, its runs under demo_dir."""
    env = dict(os.environ, DATA_DIR=str(offline), DEMO_DIR=str(demo_dir), TRAIN_SAN=os.path.join(ROOT, SAN))
    cmd = ["bash", os.path.join(ROOT, "scripts/demo.sh")] + args
    if kw.pop("popen", False):   # in a session of its own: a signal to the group is a Ctrl-C at its terminal
        return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True)
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def test_demo_rerun_after_a_finished_run_trains_in_a_numbered_directory(offline, tmp_path):
    """`make demo` twice: the second run leaves the first one's outputs as they were, trains in
    logs/demo/san-2 and says so (it used to be refused, sent to --overwrite 1)."""
    short = ["--steps", "2", "--val-every", "0", "--sample-tokens", "0"]
    arm = "steps-2_val-every-0_sample-tokens-0"
    demo(offline, tmp_path, short)
    first = tmp_path / arm
    kept = {name: (first / name).read_bytes() for name in ("final.bin", "log.jsonl")}
    out = demo(offline, tmp_path, short)
    assert f"demo: {first} holds a finished run; this one trains in {first}-2\n" in out, out
    assert {name: (first / name).read_bytes() for name in kept} == kept
    assert (tmp_path / f"{arm}-2" / "final.bin").exists()
    out = demo(offline, tmp_path, short)
    assert f"{first}-2 holds a finished run; this one trains in {first}-3\n" in out, out
    # a run that stopped before its first checkpoint (kill -9 of the demo's step 1) has nothing to
    # continue; its log stays
    stopped = tmp_path / "ffn-swiglu_steps-2_val-every-0_sample-tokens-0"
    stopped.mkdir()
    (stopped / "log.jsonl").write_text('{"step": 1}\n')
    out = demo(offline, tmp_path, ["--ffn", "swiglu"] + short)
    assert f"demo: {stopped} holds a run stopped before its first checkpoint (nothing to continue); this one " \
           f"trains in {stopped}-2\n" in out, out
    assert (stopped / "log.jsonl").read_text() == '{"step": 1}\n'


def test_demo_rerun_continues_an_interrupted_run(offline, tmp_path):
    """Ctrl-C of `make demo` saves a checkpoint; `make demo` again continues that run from it
    (--resume) and ends where a run straight through ends: final.bin the same, bit for bit."""
    args = ["--steps", "12", "--val-every", "0", "--sample-tokens", "0", "--log-every", "1"]
    run_dir = tmp_path / "steps-12_val-every-0_sample-tokens-0_log-every-1"
    proc = demo(offline, tmp_path, args, popen=True)
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if line.startswith("step     3/12"):
            os.killpg(proc.pid, signal.SIGINT)
            break
    out = "".join(lines) + proc.communicate(timeout=120)[0]
    assert proc.returncode == 130 and not (run_dir / "final.bin").exists(), out
    saved = sorted(int(p.stem.split("_")[1]) for p in run_dir.glob("step_*.bin"))
    assert saved and 3 <= saved[-1] < 12, out
    out = demo(offline, tmp_path, args)
    assert f"demo: continuing the interrupted run in {run_dir} from step {saved[-1]}\n" in out, out
    assert f"resumed from {run_dir}/step_{saved[-1]}.bin" in out, out
    records = [json.loads(line) for line in (run_dir / "log.jsonl").read_text().splitlines()]
    steps = [r["step"] for r in records if "loss" in r]
    assert steps == list(range(1, 13)), steps   # one log, every step once
    out = demo(offline, tmp_path, args)   # now finished: the same run again, straight through, beside it
    assert f"this one trains in {run_dir}-2\n" in out, out
    assert state_differences(run_dir / "final.bin", tmp_path / f"{run_dir.name}-2" / "final.bin") == []


def test_demo_overwrite_replaces_the_run_in_the_arms_own_directory(offline, tmp_path):
    """`make demo ARGS="--overwrite 1"` trains anew in logs/demo/san, replacing the run there
    (it used to train in a directory named after the flag, logs/demo/overwrite-1); the flags
    that say what is kept are not part of a run directory's name."""
    short = ["--steps", "2", "--val-every", "0", "--sample-tokens", "0"]
    run_dir = tmp_path / "steps-2_val-every-0_sample-tokens-0"
    demo(offline, tmp_path, short)
    for overwrite in (["--overwrite", "1"], ["--overwrite=1"]):
        before = (run_dir / "final.bin").stat().st_ino
        out = demo(offline, tmp_path, overwrite + short)
        assert f"demo: --overwrite 1: this run replaces the one in {run_dir}\n" in out, out
        assert (run_dir / "final.bin").stat().st_ino != before   # written anew (a checkpoint is renamed into place)
    demo(offline, tmp_path, short + ["--save-every", "1", "--keep-last", "1"])
    assert sorted(p.name for p in tmp_path.iterdir()) == [run_dir.name, run_dir.name + "-2"]


def test_gpu_check_stops_at_once_without_a_gpu(tmp_path):
    has_gpu = subprocess.run("nvidia-smi -L", shell=True, capture_output=True).returncode == 0
    if has_gpu:
        pytest.skip("this machine has a GPU")
    proc = subprocess.run(["bash", os.path.join(ROOT, "scripts/gpu_check.sh"), str(tmp_path / "logs")], cwd=ROOT,
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode != 0 and "no NVIDIA GPU" in proc.stderr, proc.stderr
    assert not (tmp_path / "logs").exists()  # nothing started


@pytest.mark.parametrize("trainer", TRAINERS)
def test_reference_and_trainer_have_the_same_presets(trainer):
    proc = run(trainer, ["--preset", "no-such-preset"], check=False)
    listed = proc.stderr.split("presets: ", 1)[1].rstrip().rstrip(")").split(", ")
    import train_gpt2
    import train_san
    assert sorted(listed) == sorted((train_san if trainer == "san" else train_gpt2).PRESETS)


def test_resume_in_the_run_directory(data, finished, tmp_path):
    """A killed run resumed in its own checkpoint directory (as study/runner.py does, with
    the whole command line repeated) writes the later checkpoints next to the one it started
    from and ends where the uninterrupted run ended."""
    d, _ = finished["san"]
    (tmp_path / "step_6.bin").write_bytes((d / "step_6.bin").read_bytes())
    run("san", common(data, tmp_path) + ["--steps", 10, "--save-every", 6, "--resume", tmp_path / "step_6.bin"])
    assert state_differences((tmp_path / "final.bin"), (d / "final.bin")) == []


@pytest.mark.parametrize("trainer", ["san", "gpt2"])
def test_the_stop_hint_continues_the_run_to_its_outputs(trainer, offline, tmp_path):
    """Ctrl-C prints a command; pasted verbatim (its words alone, from the same directory), it
    continues the run to the outputs of the run that went straight through: the checkpoints in
    the run's directory, the same log (read as the straight run's: study/runs.py), the
    samples decoded by the run's tokenizer, the eval set scored."""
    import shlex
    import signal
    from attnref import ckpt_diff
    from study import runs as run_files

    def flags(out):
        return ["--preset", "tiny", "--train-data", str(offline / "synth" / "synth_train_*.bin"),
                "--val-data", str(offline / "synth" / "synth_val_*.bin"), "--tokenizer", str(offline / "tokenizer.bin"),
                "--steps", "12", "--batch-size", "2", "--val-every", "6", "--val-batches", "1", "--sample-every", "4",
                "--sample-tokens", "8", "--eval-sets", str(offline / "eval" / "sanity_kjv_mc.bin"),
                "--log", str(out / "log.jsonl"), "--checkpoint-dir", str(out)]
    stopped, straight = tmp_path / "stopped", tmp_path / "straight"
    proc = subprocess.Popen([binary(trainer)] + flags(stopped), cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    out = []
    for line in proc.stdout:
        out.append(line)
        if line.startswith("step ") and line.split("|")[0].split()[1] == "2/12":
            proc.send_signal(signal.SIGINT)
            break
    out = "".join(out) + proc.communicate(timeout=300)[0]
    hint = [l.split("continue with: ", 1)[1] for l in out.splitlines() if "continue with: " in l]
    assert len(hint) == 1, out
    cont = subprocess.run(shlex.split(hint[0]), cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert cont.returncode == 0, cont.stdout + cont.stderr
    assert "resume: outputs as the saved run's: --checkpoint-dir" in cont.stdout
    run(trainer, flags(straight))
    assert ckpt_diff.differences(stopped / "final.bin", straight / "final.bin") == []
    clockless = lambda recs: [{k: v for k, v in r.items() if k != "ms"} for r in recs if "resume" not in r]  # noqa: E731
    resumed, whole = (run_files.step_records(d / "log.jsonl") for d in (stopped, straight))
    assert clockless(resumed) == clockless(whole)
    samples = [r["sample"] for r in whole if "sample" in r]
    assert len(samples) == 3 and all(not s.replace(" ", "").isdigit() for s in samples)   # text, not token ids
    assert any("eval" in r for r in resumed if r["step"] == 12)


def test_a_corrupt_shard_is_refused_unless_verify_data_0(data, tmp_path):
    """A token of a shard changed to another valid id (the shard's CRC no longer matches):
    the run refuses it before its first step, naming the shard and both CRCs; --verify-data 0
    (for corpora too large to read at start) trains on it; its CRC slot set to 0 is refused like
    any other wrong CRC (the flag after it says the shard has one); a shard written before the
    checksums (CRC slot and flag 0) trains, with a note that it is not verified."""
    from attnref import shards
    good = shards.read_shard(data / "toy_train_000000.bin")
    raw = bytearray((data / "toy_train_000000.bin").read_bytes())
    assert int.from_bytes(raw[12:16], "little") != 0, "write_shard fills the CRC slot"
    raw[1024 + 2 * 5] ^= 1  # token 5, still in the vocabulary
    bad = tmp_path / "bad_train_000000.bin"
    bad.write_bytes(bytes(raw))
    args = ["--preset", "tiny", "--train-data", bad, "--val-data", "", "--batch-size", 2, "--seq-len", 16,
            "--steps", 1, "--sample-tokens", 0]
    proc = run("san", args, check=False)
    assert proc.returncode == 1 and f"token shard '{bad}': checksum mismatch in the tokens: stored CRC32" in proc.stderr, \
        proc.stderr
    assert "step 1" not in proc.stdout
    run("san", args + ["--verify-data", 0])
    with pytest.raises(ValueError, match="checksum mismatch in the tokens"):
        shards.read_shard(bad)
    raw[12:16] = bytes(4)  # the CRC slot zeroed, its flag kept
    bad.write_bytes(bytes(raw))
    proc = run("san", args, check=False)
    assert proc.returncode == 1 and "checksum mismatch in the tokens: stored CRC32 00000000" in proc.stderr, proc.stderr
    raw[16:20] = bytes(4)  # no CRC and no flag: as written before the checksums
    bad.write_bytes(bytes(raw))
    proc = run("san", args)
    assert f"note: 1 file of data '{bad}' carries no checksum" in proc.stderr, proc.stderr
    assert np.count_nonzero(shards.read_shard(bad) != good) == 1
