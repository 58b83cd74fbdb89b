"""
PleIAs/SYNTH -> token shards + region sidecars (papers/SAN.md, "Data").

Streams the dataset's parquet files from the Hugging Face Hub one at a time (or reads
local ones with --parquet), keeps one language (--language, "all" for every language),
formats each document as ChatML wrapped in BOS/EOS with exact region labels
(dev/data/chatml.py), tokenizes in parallel worker processes with a progress bar, and
writes <out>/synth_{train,val}_NNNNNN.bin with .regions sidecars. Documents are assigned to
the validation pool by a seeded hash of their synth_id (about --val-fraction of them)
until --val-docs are in it; the rest go to train. Output order follows the file order.

  python dev/data/synth.py --tokenizer data/tok/sp16k.model --out data/synth --max-tokens 2000000000
  python dev/data/synth.py --tokenizer tok.model --parquet a.parquet b.parquet --out data/s   # local files
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from multiprocessing import Pool

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from shards import ShardWriter  # noqa: E402

COLUMNS = ["synth_id", "language", "exercise", "query", "synthetic_reasoning", "synthetic_answer"]

_worker = {}


def _init_worker(model_file: str) -> None:
    from chatml import DocTokenizer
    from tokenizer import SPTokenizer
    tok = SPTokenizer(model_file)
    tok.check_specials()
    _worker["dt"] = DocTokenizer(tok)


def tokenize_batch(docs: list[tuple[str, str, str, bool]]):
    """Worker: (query, reasoning, answer, is_val) -> (ids, regions, is_val) per document."""
    dt = _worker["dt"]
    return [(*dt.encode(q or "", r or "", a or ""), v) for q, r, a, v in docs]


def is_val(synth_id: str, seed: int, fraction: float) -> bool:
    h = hashlib.blake2b(f"{seed}:{synth_id}".encode(), digest_size=8).digest()
    return int.from_bytes(h, "little") / 2**64 < fraction


def iter_documents(files, language: str, open_file):
    """Yields SYNTH rows from the files in order, filtered by language."""
    from hf import iter_rows
    for f in files:
        for row in iter_rows(open_file(f), columns=COLUMNS):
            if language != "all" and row.get("language") != language:
                continue
            yield row


def batches(rows, seed, val_fraction, val_docs, max_docs, size):
    n_val = n = 0
    batch = []
    for row in rows:
        if max_docs and n >= max_docs:
            break
        v = n_val < val_docs and is_val(str(row.get("synth_id", n)), seed, val_fraction)
        n_val += v
        n += 1
        batch.append((row.get("query"), row.get("synthetic_reasoning"), row.get("synthetic_answer"), v))
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokenizer", required=True, help="SentencePiece .model with the SYNTH markers (ids 4..7)")
    ap.add_argument("--out", required=True, help="output directory")
    ap.add_argument("--parquet", nargs="*", default=None, help="local parquet files instead of the Hub")
    ap.add_argument("--repo", default="PleIAs/SYNTH", help="dataset repository on the Hub")
    ap.add_argument("--language", default="en", help="keep this language ('all' keeps every one)")
    ap.add_argument("--max-docs", type=int, default=0, help="stop after this many documents (0 = no limit)")
    ap.add_argument("--max-tokens", type=int, default=0, help="stop after this many train tokens (0 = no limit)")
    ap.add_argument("--val-docs", type=int, default=10000, help="size of the validation pool (documents)")
    ap.add_argument("--val-fraction", type=float, default=0.01, help="chance that a document goes to the pool")
    ap.add_argument("--seed", type=int, default=42, help="seed of the validation selection and the file order")
    ap.add_argument("--shard-tokens", type=int, default=100_000_000, help="tokens per shard")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="tokenizer processes")
    ap.add_argument("--batch-docs", type=int, default=256, help="documents per work item")
    args = ap.parse_args(argv)

    from tqdm import tqdm

    from tokenizer import SPTokenizer
    tok = SPTokenizer(args.tokenizer)
    tok.check_specials()
    if args.parquet is not None:
        files, open_file = list(args.parquet), (lambda f: f)
    else:
        from hf import download, list_files
        files = list_files(args.repo, ["*.parquet"])
        import random
        random.Random(args.seed).shuffle(files)
        open_file = lambda f: download(args.repo, f)  # noqa: E731
    writers = {s: ShardWriter(args.out, "synth", s, args.shard_tokens, tok.vocab_size, with_regions=True)
               for s in ("train", "val")}
    rows = iter_documents(files, args.language, open_file)
    work = batches(rows, args.seed, args.val_fraction, args.val_docs, args.max_docs, args.batch_docs)
    bar = tqdm(total=args.max_tokens or None, unit="tok", unit_scale=True, desc="synth")
    with Pool(args.workers, initializer=_init_worker, initargs=(args.tokenizer,)) as pool:
        for result in pool.imap(tokenize_batch, work):
            for ids, regs, v in result:
                writers["val" if v else "train"].add(ids, regs)
                if not v:
                    bar.update(len(ids))
            if args.max_tokens and writers["train"].total_tokens >= args.max_tokens:
                pool.terminate()
                break
    bar.close()
    summary = {}
    for s, w in writers.items():
        w.close()
        summary[s] = {"docs": w.total_docs, "tokens": w.total_tokens, "shards": len(w.paths)}
    with open(os.path.join(args.out, "synth_manifest.json"), "w") as f:
        json.dump({"args": vars(args), **summary}, f, indent=2)
    print(json.dumps(summary))
    return summary


if __name__ == "__main__":
    main()
