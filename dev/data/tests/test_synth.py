"""synth.py on local parquet files in SYNTH's schema (the Hub path needs the network):
formatting as the paper's code (fields stripped, documents with an empty query or answer
dropped, every language unless --language), regions and exercise sidecars."""
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import synth
from chatml import DocTokenizer
from attnref.shards import exercises_path, read_exercises, read_regions, read_shard, regions_path
from synth_generator import generate


def make_docs():
    docs = list(generate(400, 9))
    for i, d in enumerate(docs):
        d["language"] = "fr" if i % 10 == 0 else "en"
        if i % 7 == 1:  # whitespace around the fields, as in the raw dataset
            d["query"], d["synthetic_reasoning"] = "\n " + d["query"] + "  \n", " " + d["synthetic_reasoning"] + "\n"
            d["synthetic_answer"] = "\t" + d["synthetic_answer"] + "\n\n"
    docs[3]["query"] = "  \n "     # empty once stripped: dropped
    docs[4]["synthetic_answer"] = ""  # empty answer: dropped
    docs[5]["synthetic_answer"] = None
    docs[6]["synthetic_reasoning"] = " \n"  # empty reasoning: kept, without a think block
    return docs


def write_parquet(docs, tmp_path):
    files = []
    half = len(docs) // 2
    for k, part in enumerate((docs[:half], docs[half:])):
        f = tmp_path / f"part{k}.parquet"
        pq.write_table(pa.table({c: [d[c] for d in part] for c in synth.COLUMNS}), f)
        files.append(str(f))
    return files


def expected(dt, docs):
    """(ids, regions, exercise per token) of the documents, formatted by hand from the raw rows."""
    ids, regs, exs = [], [], []
    for d in docs:
        q, r, a = (d[c].strip() for c in ("query", "synthetic_reasoning", "synthetic_answer"))
        i, g = dt.encode(q, r, a)
        ids += i
        regs += g
        exs += [d["exercise"]] * len(i)
    return ids, regs, exs


def read_split(out, split):
    paths = sorted(out.glob(f"synth_{split}_*.bin"))
    ids = np.concatenate([read_shard(p) for p in paths]).tolist()
    regs = np.concatenate([read_regions(regions_path(p)) for p in paths]).tolist()
    exs = []
    for p in paths:
        e, names = read_exercises(exercises_path(p))
        exs += [names[i] for i in e]
    return paths, ids, regs, exs


@pytest.mark.parametrize("language", [None, "en"])
def test_synth_pipeline_local_parquet(small_tok, tmp_path, language):
    docs = make_docs()
    files = write_parquet(docs, tmp_path)
    out = tmp_path / "out"
    lang = ["--language", language] if language else []
    summary = synth.main(["--tokenizer", small_tok.model_file, "--out", str(out), "--parquet", *files,
                          "--val-docs", "15", "--val-fraction", "0.1", "--workers", "2", "--batch-docs", "16",
                          "--shard-tokens", "5000", "--seed", "3", *lang])
    in_lang = [d for d in docs if language is None or d["language"] == language]
    kept = [d for d in in_lang if (d["query"] or "").strip() and (d["synthetic_answer"] or "").strip()]
    assert len(in_lang) - len(kept) == summary["dropped_empty"] == 3
    assert language or any(d["language"] == "fr" for d in kept)  # every language by default
    val_ids = [d["synth_id"] for d in kept if synth.is_val(d["synth_id"], 3, 0.1)][:15]
    assert summary["val"]["docs"] == len(val_ids) == 15
    assert summary["train"]["docs"] == len(kept) - 15
    dt = DocTokenizer(small_tok)
    for split, chosen in (("val", [d for d in kept if d["synth_id"] in val_ids]),
                          ("train", [d for d in kept if d["synth_id"] not in val_ids])):
        paths, ids, regs, exs = read_split(out, split)
        assert (ids, regs, exs) == expected(dt, chosen)  # same order as the files
    assert len(sorted(out.glob("synth_train_*.bin"))) > 1


def test_synth_legacy_convention(small_tok, tmp_path):
    docs = [d for d in make_docs() if d["query"].strip() and (d["synthetic_answer"] or "").strip()][:60]
    files = write_parquet(docs, tmp_path)
    out = tmp_path / "out"
    synth.main(["--tokenizer", small_tok.model_file, "--out", str(out), "--parquet", *files, "--val-docs", "0",
                "--workers", "1", "--region-convention", "legacy"])
    _, ids, regs, exs = read_split(out, "train")
    assert (ids, regs, exs) == expected(DocTokenizer(small_tok, "legacy"), docs)
