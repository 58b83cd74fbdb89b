"""
PleIAs/SYNTH -> token shards + region sidecars (the SAN paper, "Data").

Streams the dataset's parquet files from the Hugging Face Hub one at a time (or reads
local ones with --parquet), keeps every language (or one: --language en), and formats
documents as the paper's code does: the query, reasoning and answer are stripped of
surrounding whitespace and a document whose query or answer is then empty is dropped.
Each is formatted as ChatML wrapped in BOS/EOS with exact region labels
(dev/data/chatml.py; --region-convention paper|legacy), tokenized in parallel worker
processes with a progress bar, and written to <out>/synth_{train,val}_NNNNNN.bin with
.regions and .exercises sidecars (the exercise column per token). Documents are assigned to
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
from multiprocessing import Pool

from attnref.shards import ShardWriter

COLUMNS = ["synth_id", "language", "exercise", "query", "synthetic_reasoning", "synthetic_answer"]

_worker = {}


def _init_worker(model_file: str, convention: str) -> None:
    from chatml import DocTokenizer
    from attnref.tokenizer import SPTokenizer
    tok = SPTokenizer(model_file)
    tok.check_specials()
    _worker["dt"] = DocTokenizer(tok, convention)


def tokenize_batch(docs: list[tuple[str, str, str, str, bool]]):
    """Worker: (query, reasoning, answer, exercise, is_val) -> (ids, regions, exercise, is_val) per document."""
    dt = _worker["dt"]
    return [(*dt.encode(q, r, a), e, v) for q, r, a, e, v in docs]


def clean_fields(row) -> tuple[str, str, str] | None:
    """(query, reasoning, answer) stripped as the paper's code does; None when the query or answer is empty."""
    q, r, a = ((row.get(c) or "").strip() for c in ("query", "synthetic_reasoning", "synthetic_answer"))
    return (q, r, a) if q and a else None


def exercise_of(row) -> str:
    """The document's exercise (task kind); 'unknown' where the column is empty."""
    e = (row.get("exercise") or "").strip()
    return e if e and e != "none" else "unknown"


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


def batches(rows, seed, val_fraction, val_docs, max_docs, size, dropped):
    """Work items of `size` kept documents; dropped["empty"] counts the documents left out."""
    n_val = n = 0
    batch = []
    for row in rows:
        if max_docs and n >= max_docs:
            break
        fields = clean_fields(row)
        if fields is None:
            dropped["empty"] += 1
            continue
        v = n_val < val_docs and is_val(str(row.get("synth_id", n)), seed, val_fraction)
        n_val += v
        n += 1
        batch.append((*fields, exercise_of(row), v))
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
    ap.add_argument("--language", default="all", help="keep only this language, e.g. en (default: all)")
    ap.add_argument("--region-convention", default="paper", choices=["paper", "legacy"],
                    help="how layout tokens are labelled (doc/data.md, 'Region conventions')")
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

    from attnref.tokenizer import SPTokenizer, tokenizer_fingerprint
    tok = SPTokenizer(args.tokenizer)
    tok.check_specials()
    if args.parquet is not None:
        files, open_file = list(args.parquet), (lambda f: f)
    else:
        from hf import download, list_files
        try:
            files = list_files(args.repo, ["*.parquet"])
        except RuntimeError as e:
            raise SystemExit(f"synth: {e}")
        import random
        random.Random(args.seed).shuffle(files)
        open_file = lambda f: download(args.repo, f)  # noqa: E731
    writers = {s: ShardWriter(args.out, "synth", s, args.shard_tokens, tok.vocab_size, with_regions=True,
                              with_exercises=True, tokenizer=tokenizer_fingerprint(tok))
               for s in ("train", "val")}
    rows = iter_documents(files, args.language, open_file)
    dropped = {"empty": 0}
    work = batches(rows, args.seed, args.val_fraction, args.val_docs, args.max_docs, args.batch_docs, dropped)
    bar = tqdm(total=args.max_tokens or None, unit="tok", unit_scale=True, desc="synth")
    with Pool(args.workers, initializer=_init_worker, initargs=(args.tokenizer, args.region_convention)) as pool:
        for result in pool.imap(tokenize_batch, work):
            for ids, regs, ex, v in result:
                writers["val" if v else "train"].add(ids, regs, ex)
                if not v:
                    bar.update(len(ids))
            if args.max_tokens and writers["train"].total_tokens >= args.max_tokens:
                pool.terminate()
                break
    bar.close()
    summary = {}
    for s, w in writers.items():
        w.close()
        summary[s] = {"docs": w.total_docs, "tokens": w.total_tokens, "shards": len(w.paths),
                      "exercises": w.exercise_docs}
    summary["dropped_empty"] = dropped["empty"]
    with open(os.path.join(args.out, "synth_manifest.json"), "w") as f:
        json.dump({"args": vars(args), **summary}, f, indent=2)
    print(json.dumps(summary))
    return summary


if __name__ == "__main__":
    main()
