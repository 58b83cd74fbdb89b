"""
An offline generator of SYNTH-format documents (columns as PleIAs/SYNTH: synth_id, language,
exercise, query, synthetic_reasoning, synthetic_answer), deterministic given its seeds, so
that demos and tests have reasoning-style data with query / trace / answer regions without
a network. Nothing here is taken from SYNTH; the texts are produced by templates.

The documents live in a fixed invented world (World, from --world-seed): people with five
attributes (hometown, profession, favourite colour, companion animal, birth year). Exercises:
  in-context (the answer is in the query):
    rag          a passage about freshly invented people (never world people) + a question
    math         a word problem over numbers given in the query, solved step by step
  parametric (the answer must be recalled from OTHER documents):
    memorization an encyclopedia-style entry about a world person: these documents are
                 where the world's facts are stated
    recall       a bare question about one attribute of a world person (no context)
    mcq          four options for one attribute of a world person
Some recall documents have empty reasoning, so the think block is dropped (as in SYNTH).

  python dev/data/synth_generator.py --docs 1000 --seed 1 --out docs.jsonl
"""
from __future__ import annotations

import argparse
import json
import random

FIRST = ["Ad", "Bel", "Cor", "Dar", "El", "Fen", "Gal", "Hal", "Ist", "Jor", "Kel", "Lor", "Mar", "Nev",
         "Or", "Pel", "Quin", "Ros", "Sel", "Tam", "Ul", "Vor", "Wen", "Yor", "Zan"]
FIRST_END = ["a", "en", "is", "ia", "on", "wyn", "eth", "ric", "ina", "o", "ard", "elle"]
LAST_A = ["Ash", "Brin", "Cold", "Dun", "Ever", "Fair", "Glen", "Holl", "Iron", "Kess", "Long", "Marr",
          "North", "Oak", "Pell", "Raven", "Stone", "Thorn", "Vale", "West"]
LAST_B = ["ford", "wick", "mere", "by", "ton", "well", "combe", "holt", "ridge", "field", "stead", "more"]
TOWN_A = ["Bright", "Elder", "Frost", "Gold", "High", "Low", "Mill", "Red", "Silver", "Storm", "Wind",
          "Amber", "Copper", "Moss", "Salt", "Swan"]
TOWN_B = ["haven", "port", "fall", "moor", "burg", "gate", "hollow", "crest", "water", "vale", "march"]
PROFESSIONS = ["cartographer", "glassblower", "beekeeper", "clockmaker", "ferryman", "herbalist",
               "lamplighter", "mason", "potter", "scribe", "shipwright", "tanner", "weaver", "astronomer",
               "baker", "blacksmith", "carpenter", "fisher", "miller", "physician", "rope maker",
               "saddler", "schoolteacher", "shepherd", "tailor", "tinker", "vintner", "archivist"]
COLOURS = ["amber", "crimson", "indigo", "ochre", "teal", "violet", "scarlet", "olive", "silver",
           "saffron", "cobalt", "emerald", "rust", "ivory", "charcoal"]
ANIMALS = ["badger", "heron", "fox", "hare", "otter", "raven", "tortoise", "goat", "falcon", "hound",
           "owl", "ferret", "donkey", "swan", "cat", "lizard"]
ATTRS = ["hometown", "profession", "colour", "animal", "born"]
ATTR_QUESTION = {
    "hometown": ["Which town does {n} come from?", "Where is {n} from?", "What is the hometown of {n}?"],
    "profession": ["What is the profession of {n}?", "What does {n} do for a living?", "What is {n}'s trade?"],
    "colour": ["What is the favourite colour of {n}?", "Which colour does {n} like best?"],
    "animal": ["What animal keeps {n} company?", "Which animal is {n}'s companion?"],
    "born": ["In which year was {n} born?", "When was {n} born?"],
}
ATTR_NAME = {"hometown": "hometown", "profession": "profession", "colour": "favourite colour",
             "animal": "companion animal", "born": "year of birth"}


def article(value) -> str:
    return "an" if str(value)[:1] in "aeiou" else "a"


def fact_sentence(rng: random.Random, name: str, attr: str, value) -> str:
    """One sentence stating a fact (several phrasings)."""
    forms = {
        "hometown": ["{n} comes from {v}.", "{n} was raised in the town of {v}.", "{n} grew up in {v}."],
        "profession": ["{n} works as {a} {v}.", "By trade, {n} is {a} {v}.", "{n} earns a living as {a} {v}."],
        "colour": ["{n}'s favourite colour is {v}.", "{n} likes the colour {v} best.", "Of all colours, {n} prefers {v}."],
        "animal": ["{n} is always accompanied by {a} {v}.", "{n} keeps {a} {v} as a companion.", "{n} lives with {a} {v}."],
        "born": ["{n} was born in {v}.", "{n}'s birth year is {v}.", "{n} came into the world in {v}."],
    }[attr]
    return rng.choice(forms).format(n=name, v=value, a=article(value))


def short_answer(attr: str, name: str, value) -> str:
    return {
        "hometown": f"{name} comes from {value}.",
        "profession": f"{name} is {article(value)} {value}.",
        "colour": f"{name}'s favourite colour is {value}.",
        "animal": f"{name}'s companion is {article(value)} {value}.",
        "born": f"{name} was born in {value}.",
    }[attr]


def values_of(attr: str, towns: list[str]) -> list:
    return {"hometown": towns, "profession": PROFESSIONS, "colour": COLOURS, "animal": ANIMALS,
            "born": list(range(1700, 2000))}[attr]


def _name(rng: random.Random) -> str:
    return rng.choice(FIRST) + rng.choice(FIRST_END) + " " + rng.choice(LAST_A) + rng.choice(LAST_B)


class World:
    """The fixed invented world: people and their attributes, drawn from world_seed."""

    def __init__(self, world_seed: int = 1234, num_people: int = 300, num_towns: int = 40):
        rng = random.Random(world_seed)
        towns = set()
        while len(towns) < num_towns:
            towns.add(rng.choice(TOWN_A) + rng.choice(TOWN_B))
        self.towns = sorted(towns)
        names = set()
        while len(names) < num_people:
            names.add(_name(rng))
        self.people = []
        for n in sorted(names):
            self.people.append({"name": n, **{a: rng.choice(values_of(a, self.towns)) for a in ATTRS}})
        self.names = set(names)

    def fresh_name(self, rng: random.Random) -> str:
        """A name that is not one of the world's people (for in-context exercises)."""
        while True:
            n = _name(rng)
            if n not in self.names:
                return n

    def distractors(self, rng: random.Random, attr: str, gold, k: int = 3) -> list:
        pool = [v for v in values_of(attr, self.towns) if v != gold]
        return rng.sample(pool, k)


EXERCISE_WEIGHTS = [("memorization", 0.25), ("recall", 0.2), ("mcq", 0.1), ("rag", 0.25), ("math", 0.2)]


def gen_memorization(world, rng, person=None):
    p = person if person is not None else rng.choice(world.people)
    n = p["name"]
    q = rng.choice([f"Tell me about {n}.", f"Who is {n}?", f"Write a short encyclopedia entry about {n}."])
    attrs = ATTRS[:]
    rng.shuffle(attrs)
    reasoning = (f"The user asks about {n}. I should give the main facts: "
                 + ", ".join(ATTR_NAME[a] for a in attrs) + ".")
    answer = " ".join(fact_sentence(rng, n, a, p[a]) for a in attrs)
    return q, reasoning, answer, {"kind": "parametric", "person": n, "facts": {a: p[a] for a in ATTRS}}


def gen_recall(world, rng):
    p = rng.choice(world.people)
    a = rng.choice(ATTRS)
    n = p["name"]
    q = rng.choice(ATTR_QUESTION[a]).format(n=n)
    if rng.random() < 0.3:
        reasoning = ""
    else:
        reasoning = f"The question asks for the {ATTR_NAME[a]} of {n}. I recall that {fact_sentence(rng, n, a, p[a])}"
    return q, reasoning, short_answer(a, n, p[a]), {"kind": "parametric", "person": n, "attr": a, "value": p[a]}


def gen_mcq(world, rng):
    p = rng.choice(world.people)
    a = rng.choice(ATTRS)
    n = p["name"]
    opts = world.distractors(rng, a, p[a]) + [p[a]]
    rng.shuffle(opts)
    letters = "ABCD"
    gold = opts.index(p[a])
    q = (f"{ATTR_QUESTION[a][0].format(n=n)}\n"
         + "\n".join(f"{letters[i]}) {o}" for i, o in enumerate(opts)))
    reasoning = f"I need the {ATTR_NAME[a]} of {n}. {fact_sentence(rng, n, a, p[a])} That is option {letters[gold]}."
    return q, reasoning, f"{letters[gold]}) {p[a]}", {"kind": "parametric", "person": n, "attr": a, "value": p[a]}


def gen_rag(world, rng):
    k = rng.randint(2, 4)
    people = []
    for _ in range(k):
        people.append({"name": world.fresh_name(rng), **{a: rng.choice(values_of(a, world.towns)) for a in ATTRS}})
    sentences = []
    for p in people:
        for a in rng.sample(ATTRS, 3):
            sentences.append((p, a))
    rng.shuffle(sentences)
    passage = " ".join(fact_sentence(rng, p["name"], a, p[a]) for p, a in sentences)
    p, a = rng.choice(sentences)
    n = p["name"]
    question = rng.choice(ATTR_QUESTION[a]).format(n=n)
    q = f"Read the passage and answer the question.\n\n{passage}\n\nQuestion: {question}"
    reasoning = (f"The passage mentions {n}. It states the {ATTR_NAME[a]}: {p[a]}. "
                 f"So the answer is {p[a]}.")
    return q, reasoning, short_answer(a, n, p[a]), {"kind": "context", "person": n, "attr": a, "value": p[a]}


def gen_math(world, rng):
    n = world.fresh_name(rng)
    item = rng.choice(["apples", "nails", "candles", "books", "bottles", "coins", "stones"])
    kind = rng.randrange(3)
    if kind == 0:
        a, b, c = rng.randint(2, 12), rng.randint(3, 25), rng.randint(1, 20)
        total = a * b
        q = (f"{n} has {a} boxes with {b} {item} in each box, then gives away {c} {item}. "
             f"How many {item} does {n} have now?")
        reasoning = f"{a} boxes times {b} {item} is {a} * {b} = {total}. Giving away {c} leaves {total} - {c} = {total - c}."
        ans = total - c
    elif kind == 1:
        a, b, c = rng.randint(10, 99), rng.randint(10, 99), rng.randint(10, 99)
        q = f"{n} collected {a} {item} on Monday, {b} on Tuesday and {c} on Wednesday. How many in total?"
        reasoning = f"First {a} + {b} = {a + b}. Then {a + b} + {c} = {a + b + c}."
        ans = a + b + c
    else:
        b = rng.randint(2, 9)
        ans = rng.randint(3, 30)
        a = b * ans
        q = f"{n} shares {a} {item} equally among {b} friends. How many {item} does each friend get?"
        reasoning = f"Each friend gets {a} / {b}. Since {b} * {ans} = {a}, the answer is {ans}."
    return q, reasoning, f"The answer is {ans}.", {"kind": "context", "value": ans}


GENERATORS = {"memorization": gen_memorization, "recall": gen_recall, "mcq": gen_mcq, "rag": gen_rag,
              "math": gen_math}


def generate(num_docs: int, seed: int, world: World | None = None, id_prefix: str = "gen",
             cover_world: bool = True):
    """Yields num_docs documents (dicts with SYNTH's columns plus 'meta'), deterministic in seed.

    cover_world: every world person gets at least one memorization document (when num_docs
    allows), spread evenly over the stream, so every recall question is answerable from
    training data; the rest is drawn by EXERCISE_WEIGHTS.
    """
    world = world or World()
    rng = random.Random(seed)
    names = [e for e, _ in EXERCISE_WEIGHTS]
    weights = [w for _, w in EXERCISE_WEIGHTS]
    cover = list(range(len(world.people))) if cover_world else []
    rng.shuffle(cover)
    stride = max(1, num_docs // max(1, len(cover)))
    for i in range(num_docs):
        if cover and i % stride == 0 and i // stride < len(cover):
            ex = "memorization"
            q, r, a, meta = gen_memorization(world, rng, world.people[cover[i // stride]])
        else:
            ex = rng.choices(names, weights)[0]
            q, r, a, meta = GENERATORS[ex](world, rng)
        yield {"synth_id": f"{id_prefix}_{seed}_{i}", "language": "en", "exercise": ex, "query": q,
               "synthetic_reasoning": r, "synthetic_answer": a, "meta": meta}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--docs", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--world-seed", type=int, default=1234)
    ap.add_argument("--out", required=True, help="output .jsonl")
    args = ap.parse_args()
    with open(args.out, "w", encoding="utf-8") as f:
        for d in generate(args.docs, args.seed, World(args.world_seed)):
            f.write(json.dumps(d) + "\n")


if __name__ == "__main__":
    main()
