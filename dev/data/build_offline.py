"""
Builds the default OFFLINE dataset (no network needed; 35 s measured on 2 shared cores):

  python dev/data/build_offline.py --out data/offline

  <out>/tokenizer.model, tokenizer.vocab   SentencePiece BPE (the SAN paper's settings, --vocab-size)
  <out>/tokenizer.bin                      the same, for llmc/data/tokenizer.h
  <out>/kjv/kjv_{train,val}_NNNNNN.bin     King James Bible chapters (Debian bible-kjv)
  <out>/synth/synth_{train,val}_NNNNNN.bin + .regions + .exercises   generated SYNTH-format documents
  <out>/eval/sanity_*.bin                  small SANITY eval sets (not benchmarks)
  with --knowledge (opt-in; the default build is unchanged), also, and the tokenizer trained on them too:
  <out>/dict/dict_{train,val}_NNNNNN.bin   dictionary entries (Debian dict-gcide, dict-wn, dict-foldoc,
                                           dict-jargon), one document per entry, val = held-out headwords
  <out>/knowledge/knowledge_{train,val}_NNNNNN.bin + .regions + .exercises   SYNTH-format exercises
                                           whose answers are dictionary facts (dev/data/knowledge.py)
  <out>/mixed/mixed_train_NNNNNN.bin + .regions + .exercises   the training entries and exercises
                                           interleaved in a seeded order: what a run trains on
  <out>/manifest.json                      what was built, with token counts
  <out>/.complete                          written last: the build format and region convention

Each document is BOS ... EOS. The world of the synthetic documents is shared between
train, val and the sanity sets (parametric recall needs that); the documents differ.

  python dev/data/build_offline.py --out data/offline --is-current   # exit 0 iff a complete build
                                                                     # of this format is there
"""
import argparse
import itertools
import json
import os
import random
import sys
import time

import kjv
import knowledge
from dictd import DEFAULT_DIR as DICTD_DIR
from chatml import DocTokenizer
from sanity_evals import build_all
from attnref.shards import OTHER, ShardWriter
from synth_generator import World, generate
from attnref.tokenizer import export_tokenizer_bin, tokenizer_fingerprint, train_sentencepiece

# Bump when the files a build writes change, so that older builds are rebuilt (scripts/demo.sh
# asks --is-current). 2: paper region convention by default, .exercises sidecars. 3: tokenizer
# and eval sets of version 2 (with a CRC), shards and sidecars with their CRC flag. 4: shards and
# eval sets record their tokenizer's fingerprint. 5: --knowledge builds write mixed/ (the
# training entries and exercises interleaved).
BUILD_FORMAT = 5
# The knowledge files' own format, in a --knowledge build's marker only (a default build stays
# current). 2: held out by headword group (shared WordNet glosses), no val fact in training
# lookups or distractors, facts counted by kind with bits (dev/data/knowledge.py).
KNOWLEDGE_FORMAT = 2
MARKER = ".complete"


KNOWLEDGE_ARGS = ("knowledge", "dictd_dir", "knowledge_train_docs", "knowledge_val_docs")


def marker_text(args) -> str:
    fields = {"build_format": BUILD_FORMAT, "region_convention": args.region_convention}
    if args.knowledge:  # only then: a default build's marker stays what it was
        fields["knowledge"] = True
        fields["knowledge_format"] = KNOWLEDGE_FORMAT
    return json.dumps(fields) + "\n"


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


def knowledge_lines(entries, exercise_docs):
    for e in entries:
        yield from (line for line in e["text"].split("\n") if line)
    for d in exercise_docs:
        for field in ("query", "synthetic_reasoning", "synthetic_answer"):
            yield from (line for line in d[field].split("\n") if line)


def clear_corpus(out: str, corpus: str) -> str:
    """<out>/<corpus>, emptied of an older build's shards (which could outnumber this build's)."""
    d = os.path.join(out, corpus)
    if os.path.isdir(d):
        for f in os.listdir(d):
            if f.startswith(corpus + "_"):
                os.remove(os.path.join(d, f))
    return d


def load_knowledge(args) -> dict:
    """The knowledge corpus: entries per split, exercises per split, fact counts."""
    try:
        corpus = knowledge.load(args.dictd_dir)
    except (OSError, ValueError) as e:
        sys.exit(f"build_offline.py --knowledge: {e}")
    entries = {split: [d for d in corpus.documents if d["split"] == split] for split in ("train", "val")}
    exercises = {"train": list(knowledge.exercises(corpus, "train", args.knowledge_train_docs, args.seed)),
                 "val": list(knowledge.exercises(corpus, "val", args.knowledge_val_docs, args.seed + 1000003))}
    return {"entries": entries, "exercises": exercises, "facts": knowledge.fact_counts(corpus)}


ENTRY_EXERCISE = "dict_entry"  # the exercise name of a dictionary entry in mixed/ (its tokens: region other)
MIX_SEED_SALT = 7919  # mixed/'s order: Random(seed + this), apart from the generator's and the exercises' seeds


def mixed_order(n_entries: int, n_exercises: int, seed: int) -> list[tuple[str, int]]:
    """The order of mixed/: every training entry and exercise once, shuffled together."""
    order = [("entry", i) for i in range(n_entries)] + [("exercise", i) for i in range(n_exercises)]
    random.Random(seed + MIX_SEED_SALT).shuffle(order)
    return order


def write_knowledge(know: dict, tok, dt, args, manifest: dict) -> None:
    """dict/ (entries, no regions), knowledge/ (exercises with regions and exercises) and mixed/
    (the training entries and exercises interleaved) shards.

    mixed/ is what a run trains on: the data loader reads its shards one at a time (doc/data.md
    "Shuffling"), so a run that globs dict/ and knowledge/ sees whichever corpus its seed puts
    first, for as many tokens as a shard holds; in mixed/ every shard holds both in the corpus's
    proportions."""
    fingerprint = tokenizer_fingerprint(tok)
    entries = {split: [[tok.bos_id] + ids + [tok.eos_id]
                       for ids in tok.encode_batch([e["text"] for e in docs], num_threads=args.threads)]
               for split, docs in know["entries"].items()}
    exercises = {split: [(*dt.encode(d["query"], d["synthetic_reasoning"], d["synthetic_answer"]), d["exercise"])
                         for d in docs]
                 for split, docs in know["exercises"].items()}
    dict_dir = clear_corpus(args.out, "dict")
    for split, docs in entries.items():
        w = ShardWriter(dict_dir, "dict", split, args.shard_tokens, tok.vocab_size, tokenizer=fingerprint)
        for ids in docs:
            w.add(ids)
        w.close()
        manifest["corpora"][f"dict_{split}"] = {"docs": w.total_docs, "tokens": w.total_tokens, "shards": len(w.paths)}
    know_dir = clear_corpus(args.out, "knowledge")
    for split, docs in exercises.items():
        w = ShardWriter(know_dir, "knowledge", split, args.shard_tokens, tok.vocab_size, with_regions=True,
                        with_exercises=True, tokenizer=fingerprint)
        for ids, regions, name in docs:
            w.add(ids, regions, name)
        w.close()
        manifest["corpora"][f"knowledge_{split}"] = {"docs": w.total_docs, "tokens": w.total_tokens,
                                                     "shards": len(w.paths), "exercises": w.exercise_docs}
    mixed_dir = clear_corpus(args.out, "mixed")
    w = ShardWriter(mixed_dir, "mixed", "train", args.shard_tokens, tok.vocab_size, with_regions=True,
                    with_exercises=True, tokenizer=fingerprint)
    for kind, i in mixed_order(len(entries["train"]), len(exercises["train"]), args.seed):
        if kind == "entry":
            w.add(entries["train"][i], [OTHER] * len(entries["train"][i]), ENTRY_EXERCISE)
        else:
            w.add(*exercises["train"][i])
    w.close()
    manifest["corpora"]["mixed_train"] = {"docs": w.total_docs, "tokens": w.total_tokens, "shards": len(w.paths),
                                          "exercises": w.exercise_docs}
    manifest["knowledge_facts"] = know["facts"]


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
    ap.add_argument("--knowledge", action="store_true",
                    help="also build the knowledge corpus from the dictd dictionaries (dict/, knowledge/; doc/data.md)")
    ap.add_argument("--dictd-dir", default=DICTD_DIR,
                    help=f"where the dictd databases are (default {DICTD_DIR}, where the Debian packages put them)")
    ap.add_argument("--knowledge-train-docs", type=int, default=100000, help="dictionary exercises for training")
    ap.add_argument("--knowledge-val-docs", type=int, default=4000, help="dictionary exercises for validation")
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

    lines = tokenizer_lines(kjv_train, synth_train)
    if args.knowledge:
        know = load_knowledge(args)
        print(f"[{time.time() - t0:5.1f}s] knowledge: {len(know['entries']['train'])}+{len(know['entries']['val'])} "
              f"entries, {know['facts']['total']:,} distinct facts, {len(know['exercises']['train'])}+"
              f"{len(know['exercises']['val'])} exercises")
        lines = itertools.chain(lines, knowledge_lines(know["entries"]["train"], know["exercises"]["train"]))

    tok = train_sentencepiece(lines, os.path.join(out, "tokenizer"),
                              vocab_size=args.vocab_size, num_threads=args.threads)
    export_tokenizer_bin(tok, os.path.join(out, "tokenizer.bin"))
    print(f"[{time.time() - t0:5.1f}s] tokenizer: vocab {tok.vocab_size}")

    fingerprint = tokenizer_fingerprint(tok)  # (every shard and eval set records it)
    kjv_dir = clear_corpus(out, "kjv")
    manifest = {"vocab_size": tok.vocab_size, "bos_id": tok.bos_id, "eos_id": tok.eos_id, "corpora": {}}
    for split, chs in (("train", kjv_train), ("val", kjv_val)):
        w = ShardWriter(kjv_dir, "kjv", split, args.shard_tokens, tok.vocab_size, tokenizer=fingerprint)
        for ids in tok.encode_batch([c["text"] for c in chs], num_threads=args.threads):
            w.add([tok.bos_id] + ids + [tok.eos_id])
        w.close()
        manifest["corpora"][f"kjv_{split}"] = {"docs": w.total_docs, "tokens": w.total_tokens, "shards": len(w.paths)}
    dt = DocTokenizer(tok, args.region_convention)
    synth_dir = clear_corpus(out, "synth")
    for split, docs in (("train", synth_train), ("val", synth_val)):
        w = ShardWriter(synth_dir, "synth", split, args.shard_tokens, tok.vocab_size, with_regions=True,
                        with_exercises=True, tokenizer=fingerprint)
        for d in docs:
            w.add(*dt.encode(d["query"], d["synthetic_reasoning"], d["synthetic_answer"]), d["exercise"])
        w.close()
        manifest["corpora"][f"synth_{split}"] = {"docs": w.total_docs, "tokens": w.total_tokens, "shards": len(w.paths),
                                                 "exercises": w.exercise_docs}
    if args.knowledge:
        write_knowledge(know, tok, dt, args, manifest)
    else:  # an earlier --knowledge build's shards would not match this tokenizer
        for corpus in ("dict", "knowledge", "mixed"):
            if os.path.isdir(os.path.join(out, corpus)):
                clear_corpus(out, corpus)
    print(f"[{time.time() - t0:5.1f}s] shards: " + ", ".join(f"{k} {v['tokens']:,} tokens"
                                                         for k, v in manifest["corpora"].items()))

    paths = build_all(tok, os.path.join(out, "eval"), kjv_val, world, n=args.eval_items, seed=args.seed + 7)
    manifest["sanity_evals"] = [os.path.basename(p) for p in paths]
    # a default build's manifest stays what it was: the knowledge options only when used
    manifest["args"] = {k: v for k, v in vars(args).items() if args.knowledge or k not in KNOWLEDGE_ARGS}
    manifest["build_format"] = BUILD_FORMAT
    with open(os.path.join(out, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=2)
    with open(os.path.join(out, MARKER), "w") as f:
        f.write(marker_text(args))
    print(f"[{time.time() - t0:5.1f}s] sanity eval sets: {len(paths)} in {out}/eval; done")


if __name__ == "__main__":
    main()
