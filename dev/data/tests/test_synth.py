"""synth.py on local parquet files in SYNTH's schema (the Hub path needs the network)."""
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

import synth
from chatml import DocTokenizer
from shards import read_regions, read_shard, regions_path
from synth_generator import generate


def test_synth_pipeline_local_parquet(small_tok, tmp_path):
    docs = list(generate(400, 9))
    for i, d in enumerate(docs):
        d["language"] = "fr" if i % 10 == 0 else "en"
    cols = synth.COLUMNS
    half = len(docs) // 2
    files = []
    for k, part in enumerate((docs[:half], docs[half:])):
        f = tmp_path / f"part{k}.parquet"
        pq.write_table(pa.table({c: [d[c] for d in part] for c in cols}), f)
        files.append(str(f))
    out = tmp_path / "out"
    summary = synth.main(["--tokenizer", small_tok.model_file, "--out", str(out), "--parquet", *files,
                          "--val-docs", "15", "--val-fraction", "0.1", "--workers", "2", "--batch-docs", "16",
                          "--shard-tokens", "5000", "--seed", "3"])
    kept = [d for d in docs if d["language"] == "en"]
    val_ids = [d["synth_id"] for d in kept if synth.is_val(d["synth_id"], 3, 0.1)][:15]
    assert summary["val"]["docs"] == len(val_ids) == 15
    assert summary["train"]["docs"] == len(kept) - 15
    dt = DocTokenizer(small_tok)
    for split, chosen in (("val", [d for d in kept if d["synth_id"] in val_ids]),
                          ("train", [d for d in kept if d["synth_id"] not in val_ids])):
        paths = sorted(out.glob(f"synth_{split}_*.bin"))
        ids = np.concatenate([read_shard(p) for p in paths]).tolist()
        regs = np.concatenate([read_regions(regions_path(p)) for p in paths]).tolist()
        want_ids, want_regs = [], []
        for d in chosen:  # same order as the files
            i, r = dt.encode(d["query"], d["synthetic_reasoning"], d["synthetic_answer"])
            want_ids += i
            want_regs += r
        assert ids == want_ids and regs == want_regs
    assert len(sorted(out.glob("synth_train_*.bin"))) > 1
