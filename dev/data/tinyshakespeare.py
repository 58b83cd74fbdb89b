"""
Tiny Shakespeare (about 1 MB of plays, from the char-rnn repository) -> token shards with
GPT-2 or a SentencePiece model. Needs the network (or --input with a local copy). Each
blank-line-separated speech is a document; the first 10% of the text is validation.

  python dev/data/tinyshakespeare.py --tokenizer gpt2 --out data/shakespeare_gpt2
"""
import argparse
import json
import os
import urllib.request


URL = "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokenizer", default="gpt2", help="'gpt2' or a SentencePiece .model")
    ap.add_argument("--out", required=True)
    ap.add_argument("--input", default=None, help="local input.txt instead of downloading")
    ap.add_argument("--url", default=URL)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    if args.input:
        text = open(args.input, encoding="utf-8").read()
    else:
        try:
            with urllib.request.urlopen(args.url, timeout=60) as r:
                text = r.read().decode("utf-8")
        except OSError as e:  # URLError and socket errors
            raise SystemExit(f"cannot download {args.url} ({e}): this needs the network, or give --input input.txt")
    docs = [d for d in text.split("\n\n") if d.strip()]
    n_val_chars = len(text) // 10
    from text_corpus import write_corpus
    from attnref.tokenizer import load_tokenizer
    tok = load_tokenizer(args.tokenizer)
    # the token count of the first 10% of the documents decides the split
    chars = 0
    val_tokens = 0
    for d in docs:
        if chars >= n_val_chars:
            break
        chars += len(d)
        val_tokens += len(tok.encode(d)) + (1 if tok.bos_id == tok.eos_id else 2)
    summary = write_corpus(docs, args.tokenizer, args.out, "shakespeare", 1 << 30, val_tokens, workers=1)
    with open(os.path.join(args.out, "shakespeare_manifest.json"), "w") as f:
        json.dump({"args": vars(args), **summary}, f, indent=2)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
