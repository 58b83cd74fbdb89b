"""
fineweb-edu (HuggingFaceFW/fineweb-edu, sample-10BT, field "text") -> token shards, with
GPT-2 (tiktoken) or a SentencePiece model (e.g. the 16k SYNTH tokenizer). Needs the network.
The first --val-tokens tokens' documents form the validation split (fineweb_val_*.bin).

  python dev/data/fineweb.py --tokenizer gpt2 --out data/fineweb_gpt2 --max-tokens 1000000000
  python dev/data/fineweb.py --tokenizer data/tok/sp16k.model --out data/fineweb_sp16k
"""
import argparse
import json
import os



def texts(repo, files):
    from hf import download, iter_rows
    for f in files:
        for row in iter_rows(download(repo, f), columns=["text"]):
            yield row["text"]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokenizer", default="gpt2", help="'gpt2' or a SentencePiece .model")
    ap.add_argument("--out", required=True)
    ap.add_argument("--repo", default="HuggingFaceFW/fineweb-edu")
    ap.add_argument("--files", default="sample/10BT/*.parquet", help="glob of the data files in the repo")
    ap.add_argument("--max-files", type=int, default=0, help="read at most this many files (0 = all)")
    ap.add_argument("--max-tokens", type=int, default=0, help="stop after this many tokens (0 = all)")
    ap.add_argument("--val-tokens", type=int, default=100_000_000)
    ap.add_argument("--shard-tokens", type=int, default=100_000_000)
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    args = ap.parse_args()
    from attnref.tokenizer import load_tokenizer
    try:  # here, not first in the worker processes, so that a missing network is said once and plainly
        load_tokenizer(args.tokenizer)
    except RuntimeError as e:
        raise SystemExit(f"--tokenizer {args.tokenizer}: {e}")
    from text_corpus import write_corpus
    from hf import list_files
    try:  # listed here, as a failure inside the reading workers' feed would not stop them plainly
        files = list_files(args.repo, [args.files])[:args.max_files or None]
        summary = write_corpus(texts(args.repo, files), args.tokenizer, args.out, "fineweb", args.shard_tokens,
                               args.val_tokens, args.max_tokens, args.workers)
    except RuntimeError as e:
        raise SystemExit(f"fineweb: {e}")
    with open(os.path.join(args.out, "fineweb_manifest.json"), "w") as f:
        json.dump({"args": vars(args), **summary}, f, indent=2)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
