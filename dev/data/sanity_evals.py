"""
Small OFFLINE SANITY eval sets built from the offline corpora. They check that a model
trained on data/offline learns something measurable (and that the eval code works); they
are NOT benchmarks and their numbers must never be reported as such. Every file's
description starts with "SANITY SET".

  sanity_kjv_cloze        LAMBADA-like: held-out KJV verses, predict the last word
  sanity_kjv_mc           HellaSwag-like: first half of a held-out verse, pick its true
                          second half among 4 (the others from other held-out verses)
  sanity_synth_recall_cloze / _mc   parametric recall: a world person's attribute asked with
                          no context; the facts are stated only in training documents
  sanity_synth_context_mc in-context retrieval: the passage with the answer is in the prompt
  sanity_synth_math_cloze arithmetic over numbers in the prompt, reasoning trace included
"""
from __future__ import annotations

import random

from chatml import format_text
from attnref.evalset import KIND_CLOZE, KIND_MC, make_item, write_evalset
from synth_generator import (ATTR_QUESTION, ATTRS, World, gen_math, gen_rag, short_answer)
from attnref.tokenizer import tokenizer_fingerprint


def _chat_prefix(query: str) -> str:
    """The document text up to the assistant's answer, with no think block."""
    return format_text(query, "", "\x00").split("\x00")[0]


def kjv_items(tok, val_chapters, n: int, seed: int):
    rng = random.Random(seed)
    cloze, mc = [], []
    verses = [(c, i) for c in val_chapters for i in range(len(c["verses"]))]
    long_v = [(c, i) for c, i in verses if len(c["verses"][i].split()) >= 12]
    rng.shuffle(long_v)
    for c, i in long_v[:n]:
        words = c["verses"][i].split(" ")
        last = words[-1].rstrip(".,;:!?'\")")
        if not last.isalpha():
            continue
        before = "\n".join(c["verses"][max(0, i - 2):i] + [" ".join(words[:-1])])
        cloze.append(make_item(tok, before, [" " + last], 0))
    for c, i in long_v[n:2 * n]:
        words = c["verses"][i].split(" ")
        h = len(words) // 2
        ctx, true = " ".join(words[:h]), " " + " ".join(words[h:])
        others = []
        while len(others) < 3:
            oc, oi = rng.choice(long_v)
            ow = oc["verses"][oi].split(" ")
            cand = " " + " ".join(ow[len(ow) // 2:])
            if cand != true and cand not in others:
                others.append(cand)
        gold = rng.randrange(4)
        choices = others[:gold] + [true] + others[gold:]
        mc.append(make_item(tok, ctx, choices, gold))
    return cloze, mc


def synth_items(tok, world: World, n: int, seed: int):
    rng = random.Random(seed)
    recall_cloze, recall_mc, context_mc, math_cloze = [], [], [], []
    for _ in range(n):
        p = rng.choice(world.people)
        a = rng.choice(ATTRS)
        name, value = p["name"], p[a]
        prefix = _chat_prefix(rng.choice(ATTR_QUESTION[a]).format(n=name))
        ans = short_answer(a, name, value)
        # cloze: the answer sentence up to the value; target " value"
        cut = ans.rfind(" " + str(value))
        recall_cloze.append(make_item(tok, prefix + ans[:cut], [" " + str(value)], 0))
        opts = world.distractors(rng, a, value)
        gold = rng.randrange(4)
        opts = opts[:gold] + [value] + opts[gold:]
        recall_mc.append(make_item(tok, prefix, [short_answer(a, name, o) for o in opts], gold))
    for _ in range(n):
        q, _r, _a, meta = gen_rag(world, rng)
        a, name, value = meta["attr"], meta["person"], meta["value"]
        opts = world.distractors(rng, a, value)
        gold = rng.randrange(4)
        opts = opts[:gold] + [value] + opts[gold:]
        context_mc.append(make_item(tok, _chat_prefix(q), [short_answer(a, name, o) for o in opts], gold))
        q, r, a_text, meta = gen_math(world, rng)
        full = format_text(q, r, a_text)
        cut = full.rfind(" " + str(meta["value"]))
        math_cloze.append(make_item(tok, full[:cut], [" " + str(meta["value"])], 0))
    return recall_cloze, recall_mc, context_mc, math_cloze


def build_all(tok, outdir, val_chapters, world: World, n: int = 200, seed: int = 7) -> list[str]:
    """Writes the six sanity sets into outdir; returns their paths."""
    kc, km = kjv_items(tok, val_chapters, n, seed)
    rc, rm, cm, mc = synth_items(tok, world, n, seed + 1)
    sets = [
        ("sanity_kjv_cloze", kc, KIND_CLOZE, "held-out KJV verses, predict the last word (LAMBADA-like)"),
        ("sanity_kjv_mc", km, KIND_MC, "held-out KJV verse halves, pick the true ending of 4 (HellaSwag-like)"),
        ("sanity_synth_recall_cloze", rc, KIND_CLOZE, "generator world facts asked without context: parametric recall"),
        ("sanity_synth_recall_mc", rm, KIND_MC, "generator world facts asked without context, 4 choices: parametric recall"),
        ("sanity_synth_context_mc", cm, KIND_MC, "generator passages with the answer in the prompt, 4 choices: in-context"),
        ("sanity_synth_math_cloze", mc, KIND_CLOZE, "generator arithmetic with its reasoning in the prompt: in-context"),
    ]
    paths = []
    for name, items, kind, what in sets:
        path = f"{outdir}/{name}.bin"
        write_evalset(path, items, kind, tok.vocab_size,
                      f"SANITY SET (not a benchmark): {name}: {what}; {len(items)} items",
                      tokenizer=tokenizer_fingerprint(tok))
        paths.append(path)
    return paths
