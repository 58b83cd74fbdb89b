"""
The capacity world (doc/data.md "The capacity world"; the study: doc/study.md "Knowledge
capacity"): synthetic biographies as Allen-Zhu & Li's bioS (Physics of Language Models 3.3),
written here. N people; each has ATTRS, every value drawn uniformly and independently (one
random stream per attribute); each person is stated in exactly E biographies (exposures), each
a fresh order of the attribute sentences and a fresh choice among each attribute's paraphrase
templates. One token per word, so every value is one token and the model's loss on it is its
whole prediction of the attribute (study/capacity.py turns those losses into bits).

  train  capacity_train_*.bin      the N x E biographies, shuffled: BOS first last, then per
                                   attribute "w1 w2 w3 VALUE .", then EOS (BIO_TOKENS tokens);
                                   one EOS after the last
  val    capacity_val_*.bin + .regions + .exercises   probes: per person, attribute and
                                   template, "BOS first last w1 w2 w3 VALUE . EOS"; the value
                                   token is region answer, the document's exercise the attribute
  vocab.txt (one token a line, the id is the line), world.json (sizes, people), manifest.json

--fresh-values writes the control world: the same people, templates and counts, but every
biography draws its values anew, so no biography states a fact the others repeat; the probes
ask the world's values, which nothing in training fixes (a sound measure reads about 0 bits).

Every biography has BIO_TOKENS tokens, so --seq-len a multiple of it puts whole biographies in
every training window (the training data is one shard, and one EOS after the last biography
completes the last window): with N x E x BIO_TOKENS / seq-len windows a whole multiple of the
batch, an epoch shows each person exactly E times.

  python dev/data/bios.py --out data/capacity-n1000 --people 1000 --exposures 100
"""
from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys

from synth_generator import ANIMALS, COLOURS, FIRST, FIRST_END, LAST_A, LAST_B, PROFESSIONS, TOWN_A, TOWN_B

SPECIALS = ["<pad>", "<eos>", "<bos>"]  # ids 0, 1, 2 (train_san's --bos-id 2)
EOS, BOS = 1, 2
# attribute -> (values, paraphrase templates of three words each)
ATTRS = {
    "born": ([str(y) for y in range(1900, 1964)], ["was born in", "birth year is", "came along in"]),
    "hometown": (sorted(a + b for a in TOWN_A for b in TOWN_B)[:64], ["grew up in", "hails from town", "was raised in"]),
    "profession": ([p.replace(" ", "-") for p in PROFESSIONS], ["works as a", "by trade a", "earns living as"]),
    "colour": (list(COLOURS), ["favourite colour is", "likes best colour", "prefers the colour"]),
    "animal": (list(ANIMALS), ["keeps a pet", "companion animal is", "lives with a"]),
}
SENTENCE_TOKENS = 5  # three template words, the value, "."
BIO_TOKENS = 3 + SENTENCE_TOKENS * len(ATTRS) + 1


def bits_per_person() -> float:
    """What a person's attributes carry: sum of log2 of each value set's size."""
    return sum(math.log2(len(values)) for values, _ in ATTRS.values())


def name_pools(people: int) -> tuple[list[str], list[str]]:
    """First and last names, each pool ceil(sqrt(2 N)) long, so N distinct pairs exist."""
    k = math.ceil(math.sqrt(2 * people))
    first = [a + b for b in FIRST_END for a in FIRST][:k]
    last = [a + b for b in LAST_B for a in LAST_A][:k]
    if len(first) < k or len(last) < k:
        raise ValueError(f"--people {people}: more people than the name pools can name ({len(first)} x {len(last)})")
    return first, last


class World:
    """N people: distinct (first, last) pairs, and per attribute a value drawn uniformly by the
    attribute's own generator (seeded by the world seed and the attribute), so no attribute's
    draws depend on another's."""

    def __init__(self, people: int, seed: int):
        if people < 1:
            raise ValueError(f"--people must be positive, not {people}")
        first, last = name_pools(people)
        rng = random.Random(seed)
        pairs = rng.sample(range(len(first) * len(last)), people)
        self.names = [(first[p // len(last)], last[p % len(last)]) for p in pairs]
        self.values = {}
        for attr, (values, _) in ATTRS.items():
            r = random.Random(f"{seed}/{attr}")
            self.values[attr] = [r.randrange(len(values)) for _ in range(people)]  # indices into values
        self.first, self.last = first, last

    def vocab(self) -> list[str]:
        words = set(self.first) | set(self.last) | {"."}
        for values, templates in ATTRS.values():
            words |= set(values)
            for t in templates:
                words |= set(t.split())
        return SPECIALS + sorted(words)


def sentence(attr: str, template: int, value: str) -> list[str]:
    return ATTRS[attr][1][template].split() + [value, "."]


def biography(world: World, person: int, rng: random.Random, fresh: bool = False) -> list[str]:
    """One exposure: the name, then every attribute once, in a fresh order, each in a fresh template;
    fresh: each value drawn anew from rng instead of the person's (the control world)."""
    words = list(world.names[person])
    order = list(ATTRS)
    rng.shuffle(order)
    for attr in order:
        values = ATTRS[attr][0]
        value = rng.randrange(len(values)) if fresh else world.values[attr][person]
        words += sentence(attr, rng.randrange(len(ATTRS[attr][1])), values[value])
    return words


def probes(world: World):
    """(words, attribute) for every person, attribute and template: the value is words[-2]."""
    for person, name in enumerate(world.names):
        for attr, (values, templates) in ATTRS.items():
            for t in range(len(templates)):
                yield list(name) + sentence(attr, t, values[world.values[attr][person]]), attr


def build(out: str, people: int, exposures: int, seed: int, fresh: bool = False) -> dict:
    from attnref.shards import ANSWER, OTHER, ShardWriter
    if exposures < 1:
        raise ValueError(f"--exposures must be positive, not {exposures}")
    world = World(people, seed)
    vocab = world.vocab()
    ids = {w: i for i, w in enumerate(vocab)}
    os.makedirs(out, exist_ok=True)
    rng = random.Random(f"{seed}/biographies")
    order = [p for p in range(people) for _ in range(exposures)]
    rng.shuffle(order)
    total = len(order) * BIO_TOKENS + 1
    w = ShardWriter(out, "capacity", "train", total, len(vocab))  # one shard: no window lost at a shard end
    for person in order:
        w.add([BOS] + [ids[x] for x in biography(world, person, rng, fresh)] + [EOS])
    w.add([EOS])  # the last window's last target: windows of T + 1 tokens at k T then cover every biography
    w.close()
    v = ShardWriter(out, "capacity", "val", 1 << 20, len(vocab), with_regions=True, with_exercises=True)
    for words, attr in probes(world):
        toks = [BOS] + [ids[x] for x in words] + [EOS]
        regions = [OTHER] * len(toks)
        regions[-3] = ANSWER  # the value (then "." and EOS)
        v.add(toks, regions, attr)
    v.close()
    sizes = {attr: len(values) for attr, (values, _) in ATTRS.items()}
    manifest = {"people": people, "exposures": exposures, "seed": seed, "fresh_values": fresh, "vocab_size": len(vocab),
                "bio_tokens": BIO_TOKENS, "biographies": len(order), "train_tokens": w.total_tokens,
                "val_docs": v.total_docs, "val_tokens": v.total_tokens, "values": sizes,
                "templates": {a: len(t) for a, (_, t) in ATTRS.items()},
                "bits_per_person": bits_per_person(), "bits": people * bits_per_person()}
    _write_json(os.path.join(out, "world.json"), {"names": [" ".join(n) for n in world.names],
                                                  "values": world.values, "value_names": {a: v for a, (v, _) in ATTRS.items()}})
    with open(os.path.join(out, "vocab.txt.tmp"), "w", encoding="utf-8") as f:
        f.write("\n".join(vocab) + "\n")
    os.replace(os.path.join(out, "vocab.txt.tmp"), os.path.join(out, "vocab.txt"))
    _write_json(os.path.join(out, "manifest.json"), manifest)  # last: a build with one is complete
    return manifest


def _write_json(path: str, obj) -> None:
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=1)
    os.replace(path + ".tmp", path)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="output directory")
    ap.add_argument("--people", type=int, default=1000, help="N, people in the world")
    ap.add_argument("--exposures", type=int, default=100, help="biographies per person in the training data")
    ap.add_argument("--seed", type=int, default=1, help="seed of the world and of the biographies")
    ap.add_argument("--fresh-values", action="store_true",
                    help="the control world: every biography draws its values anew (no fact to store)")
    args = ap.parse_args(argv)
    try:
        m = build(args.out, args.people, args.exposures, args.seed, args.fresh_values)
    except ValueError as e:
        sys.exit(f"bios.py: {e}")
    print(f"{args.out}: {m['people']:,} people x {m['exposures']} exposures = {m['biographies']:,} biographies, "
          f"{m['train_tokens']:,} tokens; {m['val_docs']:,} probes; {m['bits']:,.0f} bits (vocab {m['vocab_size']})")


if __name__ == "__main__":
    main()
