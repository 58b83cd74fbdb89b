"""End to end: build a small offline dataset, check every file with the Python readers and
with the C++ readers (dev/data/datatool.cpp, compiled here), which must agree."""
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from conftest import REPO
from attnref.evalset import read_evalset
from attnref.shards import exercises_path, read_exercises, read_regions, read_shard, regions_path
from attnref.tokenizer import SPTokenizer


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


def test_synth_exercises_and_paper_regions(built):
    """Every synth document carries its generator exercise on every token; the role headers
    are labelled as the paper's code does (the first tokens after <|im_start|> are query)."""
    from synth_generator import World, generate
    import json
    args = json.loads((built / "manifest.json").read_text())["args"]
    docs = list(generate(200, args["seed"] + 1000003, World(args["world_seed"]), "val", cover_world=False))
    ids = np.concatenate([read_shard(p) for p in shards_of(built, "synth", "val")])
    regs = np.concatenate([read_regions(regions_path(p)) for p in shards_of(built, "synth", "val")])
    names = []
    for p in shards_of(built, "synth", "val"):
        e, table = read_exercises(exercises_path(p))
        assert len(e) == len(read_shard(p))
        names += [table[i] for i in e]
    starts = np.flatnonzero(ids == 2).tolist() + [len(ids)]
    assert len(starts) - 1 == len(docs)
    for k, d in enumerate(docs):
        assert set(names[starts[k]:starts[k + 1]]) == {d["exercise"]}
        assert ids[starts[k] + 1] == 4 and regs[starts[k] + 2] == 1  # <|im_start|> then "user\n" as query
    assert {d["exercise"] for d in docs} == {"memorization", "recall", "mcq", "rag", "math"}


def test_build_marker(built):
    cmd = [sys.executable, os.path.join(REPO, "dev/data/build_offline.py"), "--out", str(built), "--is-current"]
    assert subprocess.run(cmd).returncode == 0
    assert subprocess.run(cmd + ["--region-convention", "legacy"]).returncode == 1
    marker = built / ".complete"
    text = marker.read_text()
    try:
        marker.write_text("")  # what older builds (and older demo scripts) left: rebuilt
        assert subprocess.run(cmd).returncode == 1
    finally:
        marker.write_text(text)


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
    out = subprocess.run([datatool, "exercises", str(p)], check=True, capture_output=True, text=True).stdout
    lines = out.strip().split("\n")
    e, names = read_exercises(exercises_path(p))
    assert lines[0] == f"tokens {len(e)}"
    assert lines[1:] == [f"{n} {c}" for n, c in zip(names, np.bincount(e, minlength=len(names)))]
    # the loader's first batch: windows of the val shard, regions, exercises and doc ids from BOS
    T = 64
    out = subprocess.run([datatool, "batch", str(p), "2", str(T), str(tok.bos_id)], check=True, capture_output=True,
                         text=True).stdout.strip().split("\n")
    ids = read_shard(p)
    for b, line in enumerate(out):
        toks, tgts, regs, exs, docs = (part.split() for part in line.split("|"))
        toks, tgts, regs, docs = (list(map(int, x)) for x in (toks, tgts, regs, docs))
        assert toks == ids[b * T:b * T + T + 1].tolist() and tgts == toks[1:]
        assert regs == r[b * T:b * T + T + 1].tolist()
        assert exs == [names[i] for i in e[b * T:b * T + T + 1]]
        assert docs == (np.cumsum(np.asarray(toks) == tok.bos_id) - (toks[0] == tok.bos_id)).tolist()


def test_cpp_whole_document_rows(built, datatool):
    """Whole-document rows of the real val data against a numpy packing of its documents."""
    tok = SPTokenizer(built / "tokenizer.model")
    paths = shards_of(built, "synth", "val")
    ids = np.concatenate([read_shard(p) for p in paths])
    starts = np.flatnonzero(ids == tok.bos_id).tolist() + [len(ids)]
    docs = [ids[a:b].tolist() for a, b in zip(starts, starts[1:])]
    T, B = 160, 4
    rows = []
    for d in docs:
        if len(d) > T + 1:
            continue
        if not rows or len(rows[-1]) + len(d) > T + 1:
            rows.append([])
        rows[-1] += d
    assert sum(len(d) > T + 1 for d in docs) > 0 and len(rows) >= B  # both paths taken
    pattern = str(built / "synth" / "synth_val_*.bin")
    out = subprocess.run([datatool, "batch", pattern, str(B), str(T), str(tok.bos_id), "whole"], check=True,
                         capture_output=True, text=True).stdout.strip().split("\n")
    for b, line in enumerate(out):
        toks, tgts = (list(map(int, part.split())) for part in line.split("|")[:2])
        row = rows[b]
        assert toks == row + [0] * (T + 1 - len(row))
        want = [row[t + 1] if t + 1 < len(row) and row[t + 1] != tok.bos_id else -1 for t in range(T)]
        assert tgts == want
