"""
SlimPajama (cerebras/SlimPajama-627B: the Deconstructing paper's pretraining data) -> token
shards, with GPT-2 (tiktoken), Pythia's tokenizer exported to SentencePiece, or any
SentencePiece model. The published files are zstandard-compressed JSON lines,
{"text": ..., "meta": {"redpajama_set_name": "RedPajamaC4" | ...}}, under train/chunk1..10/
and validation/ and test/ (the held-out sets). Validation shards come from the held-out
validation files, training shards from the training files, so no document is in both.
Needs the network, unless --local reads the same files from disk (also parquet copies such
as DKYoon/SlimPajama-6B, with --train-files/--val-files).

  python dev/data/slimpajama.py --tokenizer gpt2 --out data/slimpajama_gpt2 --max-tokens 1000000000
  python dev/data/slimpajama.py --tokenizer gpt2 --out DIR --local \\
      --train-files 'dl/train/chunk1/*.jsonl.zst' --val-files 'dl/validation/chunk1/*.jsonl.zst'
"""
import argparse
import glob
import json
import os


SOURCE_SETS = ["RedPajamaCommonCrawl", "RedPajamaC4", "RedPajamaGithub", "RedPajamaBook", "RedPajamaArXiv",
               "RedPajamaWikipedia", "RedPajamaStackExchange"]


def source_set(row) -> str:
    meta = row.get("meta") or {}
    if isinstance(meta, str):  # some parquet copies keep meta as a JSON string
        meta = json.loads(meta)
    return meta.get("redpajama_set_name", "")


def texts(paths, sets=None):
    """The "text" of every row of the files (in order), only of the given source sets if any."""
    from hf import iter_rows
    for path in paths:
        for row in iter_rows(path):
            if sets and source_set(row) not in sets:
                continue
            yield row["text"]


def data_files(pattern: str, local: bool, repo: str, max_files: int = 0):
    """Local paths of the files a glob names, on disk (--local) or in the repo; a repo file is
    downloaded only when the reader gets to it. Fails at once when none matches."""
    if local:
        files = sorted(glob.glob(pattern))
        if not files:
            raise SystemExit(f"no local file matches {pattern}")
        return files[:max_files or None]
    from hf import download, list_files
    try:
        names = list_files(repo, [pattern])[:max_files or None]
    except RuntimeError as e:
        raise SystemExit(f"slimpajama: {e}")
    return (download(repo, n) for n in names)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokenizer", default="gpt2", help="'gpt2' or a SentencePiece .model")
    ap.add_argument("--out", required=True)
    ap.add_argument("--repo", default="cerebras/SlimPajama-627B")
    ap.add_argument("--train-files", default="train/chunk*/*.jsonl.zst", help="glob of the training files")
    ap.add_argument("--val-files", default="validation/chunk*/*.jsonl.zst", help="glob of the held-out files")
    ap.add_argument("--local", action="store_true", help="the globs name files on disk, not in the repo")
    ap.add_argument("--sets", default="", help=f"comma list: keep only these sources ({', '.join(SOURCE_SETS)})")
    ap.add_argument("--max-files", type=int, default=0, help="read at most this many training files (0 = all)")
    ap.add_argument("--max-tokens", type=int, default=0, help="training tokens to write (0 = all)")
    ap.add_argument("--val-tokens", type=int, default=10_000_000, help="validation tokens to write (0: none)")
    ap.add_argument("--shard-tokens", type=int, default=100_000_000)
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    args = ap.parse_args(argv)
    sets = [s for s in args.sets.split(",") if s]
    unknown = [s for s in sets if s not in SOURCE_SETS]
    if unknown:
        raise SystemExit(f"--sets: unknown source {', '.join(unknown)}; SlimPajama's are {', '.join(SOURCE_SETS)}")
    from attnref.tokenizer import load_tokenizer
    try:  # here, not first in the worker processes, so that a missing network is said once and plainly
        load_tokenizer(args.tokenizer)
    except RuntimeError as e:
        raise SystemExit(f"--tokenizer {args.tokenizer}: {e}")
    from text_corpus import write_corpus
    summary = {}
    try:  # a download that fails inside the workers' feed arrives here as a RuntimeError
        if args.val_tokens > 0:  # everything read here goes to the val split (val_tokens above any count)
            val_files = data_files(args.val_files, args.local, args.repo)
            summary["val"] = write_corpus(texts(val_files, sets), args.tokenizer, args.out, "slimpajama",
                                          args.shard_tokens, 1 << 62, args.val_tokens, args.workers)["val"]
        train_files = data_files(args.train_files, args.local, args.repo, args.max_files)
        summary["train"] = write_corpus(texts(train_files, sets), args.tokenizer, args.out, "slimpajama",
                                        args.shard_tokens, 0, args.max_tokens, args.workers)["train"]
    except RuntimeError as e:
        raise SystemExit(f"slimpajama: {e}")
    with open(os.path.join(args.out, "slimpajama_manifest.json"), "w") as f:
        json.dump({"args": vars(args), **summary}, f, indent=2)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
