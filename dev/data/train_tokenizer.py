"""
Trains the paper's SentencePiece BPE tokenizer (the SAN paper: vocab 16,384, byte fallback,
identity normalisation, whitespace kept, pad 0 / eos 1 / bos 2 / unk 3, <|im_start|> 4,
<|im_end|> 5, <think> 6, </think> 7 as atomic pieces) on text files, and exports it to the
tokenizer .bin read by llmc/data/tokenizer.h. With --gpt2, exports tiktoken's GPT-2 BPE instead
(needs the network or a TIKTOKEN_CACHE_DIR holding its files).

  python dev/data/train_tokenizer.py --input corpus.txt [more.txt ...] --vocab-size 16384 --out data/tok/sp16k
  python dev/data/train_tokenizer.py --gpt2 --out data/tok/gpt2
writes <out>.model, <out>.vocab and <out>.bin (only <out>.bin with --gpt2).
"""
import argparse
import os

from attnref.tokenizer import TiktokenTokenizer, export_tokenizer_bin, train_sentencepiece


def iter_lines(paths, max_bytes):
    seen = 0
    for p in paths:
        with open(p, encoding="utf-8") as f:
            for line in f:
                line = line.rstrip("\n")
                if line:
                    seen += len(line)
                    yield line
                    if max_bytes and seen >= max_bytes:
                        return


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--input", nargs="*", default=[], help="UTF-8 text files (one or more)")
    ap.add_argument("--out", required=True, help="output prefix (<out>.model, <out>.bin)")
    ap.add_argument("--vocab-size", type=int, default=16384, help="vocabulary size (default 16384)")
    ap.add_argument("--max-bytes", type=int, default=0, help="train on at most this many characters (0 = all)")
    ap.add_argument("--threads", type=int, default=os.cpu_count(), help="training threads")
    ap.add_argument("--gpt2", action="store_true", help="export tiktoken GPT-2 instead of training")
    args = ap.parse_args()
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    if args.gpt2:
        tok = TiktokenTokenizer()
    else:
        if not args.input:
            ap.error("--input is required unless --gpt2")
        tok = train_sentencepiece(iter_lines(args.input, args.max_bytes), args.out,
                                  vocab_size=args.vocab_size, num_threads=args.threads)
    export_tokenizer_bin(tok, args.out + ".bin")
    print(f"tokenizer: vocab {tok.vocab_size}, wrote {args.out}.bin")


if __name__ == "__main__":
    main()
