"""Data that records its tokenizer (doc/formats.md "Token shards", "Eval sets"; the host
train_san of TRAIN_SAN_BIN; llmc/train/input_files.h check_data_tokenizers):

- the fingerprint dev/data/tokenizer.py computes from a SentencePiece model is the one of its
  exported .bin's fields and pieces, whatever the file's version (a version-1 rewrite of the
  same pieces has it too), and another tokenizer's differs;
- shards and eval sets written with the tokenizer train and score under it, with no note;
- training shards, validation shards or an eval set of another tokenizer are refused, naming
  the file and --tokenizer (or, without --tokenizer, the two data files that disagree);
  --check-tokenizer 0 lets them through;
- shards from before the field (nothing recorded) load with one note per flag;
- a checkpoint records the tokenizer of the tokens it was trained on (run.tokenizer_fingerprint):
  `--init-from CKPT` with validation shards or a --tokenizer of another is refused naming both
  files, also without --tokenizer (scored, the loss would mean nothing).
Cost: two small SentencePiece trainings and 11 one-step runs, ~15 s."""
import os
import zlib

import numpy as np
import pytest

from trainer_cli import run_binary
from attnref.shards import read_shard, shard_tokenizer, write_shard
from attnref.evalset import KIND_MC, read_evalset, write_evalset

BIN = os.environ.get("TRAIN_SAN_BIN")
needs_bin = pytest.mark.skipif(not BIN, reason="TRAIN_SAN_BIN not set (make test sets it)")


def train_tokenizer(directory, name, chapters):
    """A 400-piece tokenizer trained on `chapters` (two of them differ in their pieces only)."""
    from attnref.tokenizer import export_tokenizer_bin, train_sentencepiece
    lines = [line for c in chapters for line in c["text"].split("\n") if line]
    tok = train_sentencepiece(lines, directory / name, vocab_size=400, num_threads=2)
    export_tokenizer_bin(tok, directory / f"{name}.bin")
    return tok, directory / f"{name}.bin"


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory, kjv_chapters):
    d = tmp_path_factory.mktemp("tokenizers")
    return train_tokenizer(d, "toka", kjv_chapters[:120]), train_tokenizer(d, "tokb", kjv_chapters[400:520])


def fingerprint_of_bin(path):
    """Independently of tokenizer.py: the CRC-32 of header ints [2..8] and everything after the
    header, read from the file."""
    data = open(path, "rb").read()
    crc = zlib.crc32(data[1024:], zlib.crc32(data[8:36]))
    return int(np.array([crc], dtype="<u4").view("<i4")[0])


def test_the_fingerprint_is_the_pieces_not_the_file(tokenizers, tmp_path):
    from attnref.tokenizer import tokenizer_fingerprint
    (tok, path), (other, other_path) = tokenizers
    assert tokenizer_fingerprint(tok) == fingerprint_of_bin(path)
    assert tokenizer_fingerprint(other) == fingerprint_of_bin(other_path) != tokenizer_fingerprint(tok)
    # version 1 of the same file (no CRC in [9]): the same fingerprint
    data = bytearray(open(path, "rb").read())
    data[4:8] = np.array([1], dtype="<i4").tobytes()
    data[36:40] = bytes(4)
    (tmp_path / "v1.bin").write_bytes(bytes(data))
    assert fingerprint_of_bin(tmp_path / "v1.bin") == fingerprint_of_bin(path)


def test_shards_and_eval_sets_keep_what_they_were_given(tmp_path):
    write_shard(tmp_path / "a.bin", [2, 5, 7], tokenizer=-123)
    write_shard(tmp_path / "b.bin", [2, 5, 7])
    assert shard_tokenizer(tmp_path / "a.bin") == -123 and shard_tokenizer(tmp_path / "b.bin") is None
    assert list(read_shard(tmp_path / "a.bin")) == [2, 5, 7]
    items = [{"context": [2, 5], "choices": [[7], [8]], "gold": 1, "choice_chars": [1, 1]}]
    write_evalset(tmp_path / "e.bin", items, KIND_MC, 10, "t", tokenizer=77)
    assert read_evalset(tmp_path / "e.bin")["tokenizer"] == 77
    # a flag other than 0/1, or a fingerprint without its flag: a corrupt header
    for slot, value in ((6, 2), (5, 9)):
        data = bytearray((tmp_path / "b.bin").read_bytes())
        data[4 * slot:4 * slot + 4] = np.array([value], dtype="<i4").tobytes()
        (tmp_path / "c.bin").write_bytes(bytes(data))
        with pytest.raises(ValueError, match="corrupt header"):
            read_shard(tmp_path / "c.bin")


@pytest.fixture(scope="module")
def data(tmp_path_factory, tokenizers, kjv_chapters):
    """Shards of KJV chapters tokenized by each tokenizer (train and val), and an eval set."""
    from attnref.tokenizer import tokenizer_fingerprint
    d = tmp_path_factory.mktemp("data")
    for tok, path in tokenizers:
        name = path.stem
        fp = tokenizer_fingerprint(tok)
        for split, chapters in (("train", kjv_chapters[200:260]), ("val", kjv_chapters[260:270])):
            tokens = [t for c in chapters for t in [tok.bos_id] + tok.encode(c["text"]) + [tok.eos_id]]
            write_shard(d / f"{name}_{split}_000000.bin", np.array(tokens), tokenizer=fp)
            write_shard(d / f"{name}old_{split}_000000.bin", np.array(tokens))  # (from before the field)
        items = [{"context": [tok.bos_id] + tok.encode("In the beginning"), "choices": [tok.encode(" God"),
                                                                                       tok.encode(" man")],
                  "gold": 0, "choice_chars": [4, 4]}]
        write_evalset(d / f"{name}_mc.bin", items, KIND_MC, tok.vocab_size, "t", tokenizer=fp)
    return d


def train(data, tokenizer, train_name, val_name=None, evals=None, extra=()):
    a = ["--preset", "tiny", "--steps", 1, "--batch-size", 2, "--sample-tokens", 0,
         "--train-data", data / f"{train_name}_train_*.bin"]
    a += ["--tokenizer", tokenizer] if tokenizer else []
    a += ["--val-data", data / f"{val_name}_val_*.bin", "--val-batches", 1] if val_name else ["--val-data", ""]
    a += ["--eval-sets", evals] if evals else []
    return run_binary(BIN, a + list(extra), check=False)


@needs_bin
def test_matching_data_trains_without_a_note(data, tokenizers):
    (_, tok_bin), _ = tokenizers
    proc = train(data, tok_bin, "toka", "toka", evals=data / "toka_mc.bin")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "tokenizer" not in proc.stderr, proc.stderr


@needs_bin
@pytest.mark.parametrize("case", ["train", "val", "eval set"])
def test_data_of_another_tokenizer_is_refused_naming_both(data, tokenizers, case):
    (_, tok_bin), _ = tokenizers
    names = {"train": ("tokb", "toka", None), "val": ("toka", "tokb", None),
             "eval set": ("toka", "toka", data / "tokb_mc.bin")}[case]
    proc = train(data, tok_bin, *names)
    flag, file = {"train": ("--train-data", data / "tokb_train_000000.bin"),
                  "val": ("--val-data", data / "tokb_val_000000.bin"),
                  "eval set": ("--eval-sets", data / "tokb_mc.bin")}[case]
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert f"{flag} {file} was made with another tokenizer" in proc.stderr
    assert f"than --tokenizer {tok_bin} (" in proc.stderr
    assert train(data, tok_bin, *names, extra=["--check-tokenizer", 0]).returncode == 0


@needs_bin
def test_without_a_tokenizer_the_data_must_agree_with_itself(data):
    proc = train(data, None, "toka", "tokb")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert (f"--val-data {data / 'tokb_val_000000.bin'} was made with another tokenizer" in proc.stderr
            and f"than --train-data {data / 'toka_train_000000.bin'} (" in proc.stderr), proc.stderr


@needs_bin
def test_data_from_before_the_field_loads_with_a_note(data, tokenizers):
    (_, tok_bin), _ = tokenizers
    proc = train(data, tok_bin, "tokaold", "toka")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (f"note: 1 of 1 files of --train-data record no tokenizer (written before the field, 2026-12-05): not "
            f"compared with --tokenizer {tok_bin}") in proc.stderr


@needs_bin
def test_a_checkpoint_is_not_scored_on_another_tokenizers_data(data, tokenizers, tmp_path):
    _, (_, other_bin) = tokenizers
    # no --tokenizer: the model learns the data's tokens (the tokenizers' 400 pieces)
    trained = train(data, None, "toka", extra=["--checkpoint-dir", tmp_path, "--vocab-size", 400])
    assert trained.returncode == 0, trained.stdout + trained.stderr
    ckpt = tmp_path / "final.bin"

    def evaluate(val, extra=()):
        return run_binary(BIN, ["--steps", 0, "--init-from", ckpt, "--val-data", data / f"{val}_val_*.bin",
                                "--val-batches", 1, "--sample-tokens", 0, *extra], check=False)
    same = evaluate("toka")
    assert same.returncode == 0 and "tokenizer" not in same.stderr, same.stdout + same.stderr
    other = evaluate("tokb")
    assert other.returncode == 1, other.stdout + other.stderr
    assert (f"--val-data {data / 'tokb_val_000000.bin'} was made with another tokenizer" in other.stderr
            and f"than --init-from {ckpt} (" in other.stderr), other.stderr
    told = evaluate("toka", ["--tokenizer", other_bin])  # (the same vocabulary size: only the pieces differ)
    assert told.returncode == 1, told.stdout + told.stderr
    assert f"--init-from {ckpt} was made with another tokenizer" in told.stderr and f"than --tokenizer {other_bin} (" \
        in told.stderr, told.stderr
