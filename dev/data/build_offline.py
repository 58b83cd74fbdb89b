"""
Builds the default OFFLINE dataset (no network needed; 35 s measured on 2 shared cores):

  python dev/data/build_offline.py --out data/offline

  <out>/tokenizer.model, tokenizer.vocab   SentencePiece BPE (the SAN paper's settings, --vocab-size)
  <out>/tokenizer.bin                      the same, for llmc/data/tokenizer.h
  <out>/kjv/kjv_{train,val}_NNNNNN.bin     King James Bible chapters (Debian bible-kjv)
  <out>/synth/synth_{train,val}_NNNNNN.bin + .regions + .exercises   generated SYNTH-format documents
  <out>/eval/sanity_*.bin                  small SANITY eval sets (not benchmarks)
  <out>/manifest.json                      what was built, with token counts
  <out>/.complete                          written last: the build format and region convention

Each document is BOS ... EOS. The world of the synthetic documents is shared between
train, val and the sanity sets (parametric recall needs that); the documents differ.

  python dev/data/build_offline.py --out data/offline --is-current   # exit 0 iff a complete build
                                                                     # of this format is there
"""
import argparse
import json
import os
import sys
import time

import kjv  # noqa: E402
from chatml import DocTokenizer  # noqa: E402
from sanity_evals import build_all  # noqa: E402
from attnref.shards import ShardWriter  # noqa: E402
from synth_generator import World, generate  # noqa: E402
from attnref.tokenizer import export_tokenizer_bin, train_sentencepiece  # noqa: E402

# Bump when the files a build writes change, so that older builds are rebuilt (scripts/demo.sh
# asks --is-current). 2: paper region convention by default, .exercises sidecars. 3: tokenizer
# and eval sets of version 2 (with a CRC), shards and sidecars with their CRC flag.
BUILD_FORMAT = 3
MARKER = ".complete"


def marker_text(args) -> str:
    return json.dumps({"build_format": BUILD_FORMAT, "region_convention": args.region_convention}) + "\n"


def is_current(args) -> bool:
    """True when args.out holds a complete build of this format with the same region convention."""
    try:
        with open(os.path.join(args.out, MARKER)) as f:
            return f.read() == marker_text(args)
    except OSError:
        return False


def tokenizer_lines(kjv_train, synth_docs):
    for c in kjv_train:
        yield from c["text"].split("\n")
    for d in synth_docs:
        for field in ("query", "synthetic_reasoning", "synthetic_answer"):
            for line in d[field].split("\n"):
                if line:
                    yield line


def clear_corpus(out: str, corpus: str) -> str:
    """<out>/<corpus>, emptied of an older build's shards (which could outnumber this build's)."""
    d = os.path.join(out, corpus)
    if os.path.isdir(d):
        for f in os.listdir(d):
            if f.startswith(corpus + "_"):
                os.remove(os.path.join(d, f))
    return d


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="data/offline", help="output directory (default data/offline)")
    ap.add_argument("--vocab-size", type=int, default=8192, help="tokenizer vocabulary (paper: 16384)")
    ap.add_argument("--synth-train-docs", type=int, default=20000, help="generated training documents")
    ap.add_argument("--synth-val-docs", type=int, default=1000, help="generated validation documents")
    ap.add_argument("--seed", type=int, default=1, help="generator seed (val uses seed + 1000003)")
    ap.add_argument("--world-seed", type=int, default=1234, help="seed of the invented world")
    ap.add_argument("--shard-tokens", type=int, default=1 << 20, help="tokens per shard")
    ap.add_argument("--eval-items", type=int, default=200, help="items per sanity eval set")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--region-convention", default="paper", choices=["paper", "legacy"],
                    help="how layout tokens of the SYNTH documents are labelled (doc/data.md)")
    ap.add_argument("--is-current", action="store_true",
                    help="build nothing; exit 0 if --out holds a complete build of this format, else 1")
    args = ap.parse_args()
    if args.is_current:
        sys.exit(0 if is_current(args) else 1)
    t0 = time.time()
    out = args.out
    os.makedirs(out, exist_ok=True)
    if os.path.exists(os.path.join(out, MARKER)):
        os.remove(os.path.join(out, MARKER))  # an interrupted rebuild must not look complete

    chapters = kjv.chapters()
    kjv_train, kjv_val = kjv.split(chapters)
    world = World(args.world_seed)
    synth_train = list(generate(args.synth_train_docs, args.seed, world, "train"))
    synth_val = list(generate(args.synth_val_docs, args.seed + 1000003, world, "val", cover_world=False))
    print(f"[{time.time() - t0:5.1f}s] corpora: KJV {len(kjv_train)}+{len(kjv_val)} chapters, "
          f"synth {len(synth_train)}+{len(synth_val)} documents")

    tok = train_sentencepiece(tokenizer_lines(kjv_train, synth_train), os.path.join(out, "tokenizer"),
                              vocab_size=args.vocab_size, num_threads=args.threads)
    export_tokenizer_bin(tok, os.path.join(out, "tokenizer.bin"))
    print(f"[{time.time() - t0:5.1f}s] tokenizer: vocab {tok.vocab_size}")

    kjv_dir = clear_corpus(out, "kjv")
    manifest = {"vocab_size": tok.vocab_size, "bos_id": tok.bos_id, "eos_id": tok.eos_id, "corpora": {}}
    for split, chs in (("train", kjv_train), ("val", kjv_val)):
        w = ShardWriter(kjv_dir, "kjv", split, args.shard_tokens, tok.vocab_size)
        for ids in tok.encode_batch([c["text"] for c in chs], num_threads=args.threads):
            w.add([tok.bos_id] + ids + [tok.eos_id])
        w.close()
        manifest["corpora"][f"kjv_{split}"] = {"docs": w.total_docs, "tokens": w.total_tokens, "shards": len(w.paths)}
    dt = DocTokenizer(tok, args.region_convention)
    synth_dir = clear_corpus(out, "synth")
    for split, docs in (("train", synth_train), ("val", synth_val)):
        w = ShardWriter(synth_dir, "synth", split, args.shard_tokens, tok.vocab_size, with_regions=True,
                        with_exercises=True)
        for d in docs:
            w.add(*dt.encode(d["query"], d["synthetic_reasoning"], d["synthetic_answer"]), d["exercise"])
        w.close()
        manifest["corpora"][f"synth_{split}"] = {"docs": w.total_docs, "tokens": w.total_tokens, "shards": len(w.paths),
                                                 "exercises": w.exercise_docs}
    print(f"[{time.time() - t0:5.1f}s] shards: " + ", ".join(f"{k} {v['tokens']:,} tokens"
                                                         for k, v in manifest["corpora"].items()))

    paths = build_all(tok, os.path.join(out, "eval"), kjv_val, world, n=args.eval_items, seed=args.seed + 7)
    manifest["sanity_evals"] = [os.path.basename(p) for p in paths]
    manifest["args"] = vars(args)
    manifest["build_format"] = BUILD_FORMAT
    with open(os.path.join(out, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=2)
    with open(os.path.join(out, MARKER), "w") as f:
        f.write(marker_text(args))
    print(f"[{time.time() - t0:5.1f}s] sanity eval sets: {len(paths)} in {out}/eval; done")


if __name__ == "__main__":
    main()
