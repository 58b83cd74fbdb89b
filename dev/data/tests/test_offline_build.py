"""End to end: build a small offline dataset, check every file with the Python readers and
with the C++ readers (dev/data/datatool.cpp, compiled here), which must agree."""
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from conftest import REPO
from evalset import read_evalset
from shards import read_regions, read_shard, regions_path
from tokenizer import SPTokenizer


@pytest.fixture(scope="module")
def built(tmp_path_factory, kjv_chapters):
    out = tmp_path_factory.mktemp("offline")
    cmd = [sys.executable, os.path.join(REPO, "dev/data/build_offline.py"), "--out", str(out), "--vocab-size", "1000",
           "--synth-train-docs", "1500", "--synth-val-docs", "200", "--shard-tokens", "200000", "--eval-items", "30"]
    subprocess.run(cmd, check=True, capture_output=True)
    return out


@pytest.fixture(scope="module")
def datatool(tmp_path_factory):
    if shutil.which("g++") is None:
        pytest.skip("g++ not available")
    exe = tmp_path_factory.mktemp("bin") / "datatool"
    subprocess.run(["g++", "-std=c++17", "-O2", "-Wall", "-I.", "dev/data/datatool.cpp", "-o", str(exe)], cwd=REPO,
                   check=True)
    return str(exe)


def shards_of(out, corpus, split):
    return sorted((out / corpus).glob(f"{corpus}_{split}_*.bin"))


def test_files_and_round_trip(built, kjv_chapters):
    tok = SPTokenizer(built / "tokenizer.model")
    tok.check_specials()
    assert tok.vocab_size == 1000
    for corpus in ("kjv", "synth"):
        for split in ("train", "val"):
            assert shards_of(built, corpus, split), (corpus, split)
    # the KJV shards decode back to exactly the chapters, each wrapped in BOS/EOS
    import kjv
    train, val = kjv.split(kjv_chapters)
    ids = np.concatenate([read_shard(p) for p in shards_of(built, "kjv", "train")])
    assert len(shards_of(built, "kjv", "train")) >= 2
    starts = np.flatnonzero(ids == tok.bos_id)
    assert len(starts) == len(train) and starts[0] == 0
    docs = np.split(ids, starts[1:])
    for doc, ch in zip(docs, train):
        assert doc[-1] == tok.eos_id and tok.decode(doc[1:-1]) == ch["text"]
    # synth regions: same length as the shards, every label 0..3, all four present
    for p in shards_of(built, "synth", "train"):
        r = read_regions(regions_path(p))
        assert len(r) == len(read_shard(p)) and r.max() <= 3
        assert set(np.unique(r)) == {0, 1, 2, 3}


def test_sanity_evals(built):
    tok = SPTokenizer(built / "tokenizer.model")
    names = sorted(p.name for p in (built / "eval").glob("*.bin"))
    assert len(names) == 6 and all(n.startswith("sanity_") for n in names)
    for n in names:
        e = read_evalset(built / "eval" / n)
        assert e["description"].startswith("SANITY SET") and len(e["items"]) > 10
        for it in e["items"]:
            assert it["context"][0] == tok.bos_id
            if e["kind"] == 0:
                assert len(it["choices"]) == 4 and len({tuple(c) for c in it["choices"]}) == 4
            for c, nch in zip(it["choices"], it["choice_chars"]):
                assert len(tok.decode(c)) == nch


def test_cpp_readers_agree(built, datatool):
    tb = str(built / "tokenizer.bin")
    tok = SPTokenizer(built / "tokenizer.model")
    for p in shards_of(built, "kjv", "val") + shards_of(built, "synth", "val"):
        out = subprocess.run([datatool, "decode", tb, str(p)], check=True, capture_output=True).stdout
        assert out == tok.decode(read_shard(p)).encode("utf-8")
    p = shards_of(built, "synth", "val")[0]
    out = subprocess.run([datatool, "regions", str(p)], check=True, capture_output=True, text=True).stdout
    counts = dict(line.split() for line in out.strip().split("\n"))
    r = read_regions(regions_path(p))
    assert int(counts["tokens"]) == len(r)
    assert [int(counts[k]) for k in ("other", "query", "trace", "answer")] == np.bincount(r, minlength=4).tolist()
    e = read_evalset(built / "eval" / "sanity_synth_recall_mc.bin")
    out = subprocess.run([datatool, "eval", str(built / "eval" / "sanity_synth_recall_mc.bin")], check=True,
                         capture_output=True, text=True).stdout.strip().split("\n")
    assert out[0] == f"kind 0 items {len(e['items'])} vocab 1000"
    for line, it in zip(out[1:], e["items"]):
        want = f"{it['gold']} {len(it['context'])} " + " ".join(
            f"{len(c)}:{n}" for c, n in zip(it["choices"], it["choice_chars"]))
        assert line == want
    # the loader's first batch: windows of the val shard, regions and doc ids from BOS
    T = 64
    out = subprocess.run([datatool, "batch", str(p), "2", str(T), str(tok.bos_id)], check=True, capture_output=True,
                         text=True).stdout.strip().split("\n")
    ids = read_shard(p)
    for b, line in enumerate(out):
        toks, regs, docs = (list(map(int, part.split())) for part in line.split("|"))
        assert toks == ids[b * T:b * T + T + 1].tolist()
        assert regs == r[b * T:b * T + T + 1].tolist()
        assert docs == (np.cumsum(np.asarray(toks) == tok.bos_id) - (toks[0] == tok.bos_id)).tolist()
