"""
Eval sets: the .bin files that llmc/data/evalset.h reads (layout and the four item kinds:
doc/formats.md "Eval sets"), their writer and reader, and the lm-eval-style encoding of
(context, continuation) pairs, rolling windows and partial items.
"""
from __future__ import annotations

import os
import zlib
from pathlib import Path

import numpy as np

from attnref.header_crc import check_header_crc, file_crc
from attnref.shards import tokenizer_record

EVAL_MAGIC = 20260313
EVAL_VERSION = 2         # written: with a CRC
EVAL_VERSION_NO_CRC = 1  # still read, with a note
EVAL_CRC_SLOT = 9
EVAL_TOKENIZER_SLOT = 10  # the tokenizer's fingerprint; [11] its flag (1 = recorded)
ITEM_MIN_INTS = 7        # the smallest item: three counts, a context token, a choice's two counts and a token
KIND_MC, KIND_CLOZE, KIND_ROLLING, KIND_PARTIAL = 0, 1, 2, 3
KIND_NAMES = {KIND_MC: "multiple choice", KIND_CLOZE: "cloze", KIND_ROLLING: "rolling", KIND_PARTIAL: "partial"}
MULTI_CHOICE_KINDS = (KIND_MC, KIND_PARTIAL)  # the kinds whose items have several choices


def encode_pair(tok, context: str, continuation: str, bos: bool = True) -> tuple[list[int], list[int]]:
    """lm-eval's split: trailing spaces of the context move to the continuation; the
    continuation's ids are those of encode(context + continuation) after encode(context)'s,
    falling back to encoding the continuation alone where the two disagree."""
    n_spaces = len(context) - len(context.rstrip(" "))
    if n_spaces:
        continuation = context[-n_spaces:] + continuation
        context = context[:-n_spaces]
    ctx = tok.encode(context)
    whole = tok.encode(context + continuation)
    if whole[:len(ctx)] == ctx and len(whole) > len(ctx):
        cont = whole[len(ctx):]
    else:
        cont = tok.encode(continuation)
    if bos:
        ctx = [tok.bos_id] + ctx
    return ctx, cont


def make_item(tok, context: str, continuations: list[str], gold: int, bos: bool = True,
              norm_lengths: list[int] | None = None) -> dict:
    """An item of context + each continuation. norm_lengths: what acc_norm divides by, one per
    continuation (default: the continuations' character lengths)."""
    ctx = None
    choices = []
    for c in continuations:
        cx, ct = encode_pair(tok, context, c, bos)
        ctx = cx if ctx is None else ctx
        if cx != ctx:  # cannot happen with encode_pair (context encoding is independent of c)
            raise AssertionError("context encoding depends on the continuation")
        choices.append(ct)
    if norm_lengths is None:
        norm_lengths = [len(c) for c in continuations]
    if len(norm_lengths) != len(continuations):
        raise ValueError("one normalisation length per continuation")
    return {"context": ctx, "choices": choices, "choice_chars": [int(n) for n in norm_lengths], "gold": int(gold)}


def make_rolling_item(tok, text: str, words: int, bos: bool = True) -> dict:
    """A document scored whole by rolling windows: the prefix token (BOS) as context, the
    text's tokens (no BOS, as lm-eval encodes a loglikelihood_rolling string) as the one
    continuation, and its word count for the word perplexity."""
    ids = tok.encode(text)
    if not ids:
        raise ValueError("a rolling item needs a non-empty text")
    return {"context": [tok.bos_id], "choices": [ids], "choice_chars": [int(words)], "gold": 0}


def make_partial_item(tok, contexts: list[str], continuation: str, gold: int) -> dict:
    """A partial-evaluation item (lm-eval's Winogrande): the continuation scored after each of
    `contexts`, each request encoded as encode_pair does; BOS is the shared context, and each
    choice holds its context's tokens (counted in choice_chars) then the continuation's."""
    choices, own = [], []
    for c in contexts:
        cx, ct = encode_pair(tok, c, continuation, bos=True)
        choices.append(cx[1:] + ct)
        own.append(len(cx) - 1)
    return {"context": [tok.bos_id], "choices": choices, "choice_chars": own, "gold": int(gold)}


def partial_request(item: dict, c: int) -> tuple[list[int], list[int]]:
    """(context, continuation) of choice c of a partial item."""
    k = item["choice_chars"][c]
    return list(item["context"]) + list(item["choices"][c][:k]), list(item["choices"][c][k:])


def rolling_requests(prefix: int, tokens: list[int], max_len: int) -> list[tuple[list[int], list[int]]]:
    """lm-eval's loglikelihood_rolling as (context, continuation) pairs for a model of context
    max_len (its rolling windows with context_len 1, each made disjoint): the first pair
    predicts the first min(max_len, n) tokens after the prefix token; each later pair
    predicts the next max_len tokens (fewer at the end) from the max_len tokens before its
    last one. Every token is predicted exactly once; scoring a pair reads (context +
    continuation)[-(max_len + 1):] as any other request does."""
    if max_len < 1:
        raise ValueError("max_len must be at least 1")
    n = len(tokens)
    if n == 0:
        return []
    first = min(max_len, n)
    pairs = [([prefix], list(tokens[:first]))]
    done = first
    while done < n:
        take = min(n - done, max_len)
        end = done + take
        window = list(tokens[end - max_len - 1:end - 1])  # the model's inputs
        pairs.append((window[:len(window) - take + 1], list(tokens[end - take:end])))
        done = end
    return pairs


def write_evalset(path, items: list[dict], kind: int, vocab_size: int, description: str,
                  bos: bool = True, tokenizer: int | None = None) -> None:
    """`tokenizer`: the fingerprint of the tokenizer that made the tokens
    (tokenizer.tokenizer_fingerprint), which the trainer compares with its --tokenizer."""
    if kind not in KIND_NAMES:
        raise ValueError("kind must be KIND_MC, KIND_CLOZE, KIND_ROLLING or KIND_PARTIAL")
    desc = description.encode("utf-8")
    h = np.zeros(256, dtype="<i4")
    h[0], h[1], h[2], h[3], h[4] = EVAL_MAGIC, EVAL_VERSION, len(items), kind, vocab_size
    h[5] = max((len(it["choices"]) for it in items), default=0)
    h[6] = max((len(it["context"]) + max(len(c) for c in it["choices"]) for it in items), default=0)
    h[7], h[8] = int(bos), len(desc)
    if tokenizer is not None:
        h[EVAL_TOKENIZER_SLOT], h[EVAL_TOKENIZER_SLOT + 1] = tokenizer, 1
    body = []
    for i, it in enumerate(items):
        nc = len(it["choices"])
        if nc < 1 or not 0 <= it["gold"] < nc or len(it["choice_chars"]) != nc:
            raise ValueError(f"item {i}: bad choices/gold")
        if kind not in MULTI_CHOICE_KINDS and nc != 1:
            raise ValueError(f"item {i}: a {KIND_NAMES[kind]} item has exactly one continuation")
        if kind == KIND_PARTIAL and not all(0 <= n < len(c) for c, n in zip(it["choices"], it["choice_chars"])):
            raise ValueError(f"item {i}: a partial choice's own context must leave a token to score")
        if kind == KIND_ROLLING and len(it["context"]) != 1:
            raise ValueError(f"item {i}: a rolling item's context is the one prefix token")
        toks = list(it["context"]) + [t for c in it["choices"] for t in c]
        if any(t < 0 or t >= vocab_size for t in toks):
            raise ValueError(f"item {i}: token id outside 0..{vocab_size - 1}")
        if not it["context"]:
            raise ValueError(f"item {i}: empty context")
        rec = [nc, it["gold"], len(it["context"])] + list(it["context"])
        for c, n in zip(it["choices"], it["choice_chars"]):
            if len(c) == 0:
                raise ValueError(f"item {i}: empty continuation")
            rec += [len(c), int(n)] + list(c)
        body.append(np.asarray(rec, dtype="<i4"))
    crc = file_crc(h.tobytes() + desc, EVAL_CRC_SLOT)
    for b in body:
        crc = zlib.crc32(b.data, crc)
    h[EVAL_CRC_SLOT] = np.array([crc], dtype="<u4").view("<i4")[0]
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(h.tobytes())
        f.write(desc)
        for b in body:
            f.write(b.tobytes())
    os.replace(tmp, path)



def read_evalset(path) -> dict:
    """Reads an eval .bin back (for tests and tools), validating it as llmc/data/evalset.h does:
    header fields, the CRC (version 2), every count against its range and the ints left before
    anything is taken, token ids against the vocabulary, nothing after the last item."""
    data = Path(path).read_bytes()
    if len(data) < 1024:
        raise ValueError(f"{path}: truncated header")
    h = [int(x) for x in np.frombuffer(data[:1024], dtype="<i4")]
    if h[0] != EVAL_MAGIC:
        raise ValueError(f"{path}: bad magic {h[0]}")
    if h[1] not in (EVAL_VERSION_NO_CRC, EVAL_VERSION):
        raise ValueError(f"{path}: unsupported version {h[1]} (this reader knows {EVAL_VERSION_NO_CRC} and {EVAL_VERSION})")
    n_items, kind, vocab, max_choices, max_tokens, desc_len = h[2], h[3], h[4], h[5], h[6], h[8]
    if kind not in KIND_NAMES:
        raise ValueError(f"{path}: unknown kind {kind}")
    if min(n_items, max_choices, max_tokens, desc_len) < 0 or vocab <= 0:
        raise ValueError(f"{path}: bad header (items {n_items}, vocab {vocab}, choices {max_choices}, "
                         f"tokens {max_tokens}, description {desc_len})")
    check_header_crc(path, data, h, EVAL_CRC_SLOT, h[1] == EVAL_VERSION, "eval set", "write_evalset", fields_after=2)
    tokenizer = tokenizer_record(path, h, EVAL_TOKENIZER_SLOT) if h[1] == EVAL_VERSION else None
    pos = 1024 + desc_len
    if pos > len(data) or (len(data) - pos) % 4 or n_items * ITEM_MIN_INTS > (len(data) - pos) // 4:
        raise ValueError(f"{path}: truncated or corrupt: the header announces {n_items} items and a "
                         f"{desc_len}-byte description, the file has {len(data) - 1024} bytes after its header")
    desc = data[1024:pos].decode("utf-8")
    v = np.frombuffer(data[pos:], dtype="<i4")
    j, items = 0, []

    def count(what, lo, hi):
        nonlocal j
        if j >= len(v):
            raise ValueError(f"{path}: truncated in item {len(items)}")
        x = int(v[j])
        j += 1
        if not lo <= x <= hi:
            raise ValueError(f"{path}: item {len(items)}: {what} is {x}, outside {lo}..{hi}")
        return x

    def tokens(n, what):
        nonlocal j
        if j + n > len(v):
            raise ValueError(f"{path}: truncated in item {len(items)}: {n} tokens of {what} announced, "
                             f"{len(v) - j} ints left")
        out = v[j:j + n]
        j += n
        if n and (out.min() < 0 or out.max() >= vocab):
            raise ValueError(f"{path}: item {len(items)}: a token in its {what} is outside the vocabulary ({vocab})")
        return out.tolist()

    for _ in range(n_items):
        nc = count("number of choices", 1, max_choices)
        if kind not in MULTI_CHOICE_KINDS and nc != 1:
            raise ValueError(f"{path}: {KIND_NAMES[kind]} item {len(items)} has {nc} continuations")
        if nc * 3 > len(v) - j:
            raise ValueError(f"{path}: truncated or corrupt in item {len(items)}: {nc} choices announced, "
                             f"{len(v) - j} ints left")
        gold = count("gold index", 0, nc - 1)
        nctx = count("context length", 1, 1 if kind == KIND_ROLLING else max_tokens)
        ctx = tokens(nctx, "context")
        choices, chars = [], []
        for _c in range(nc):
            nt = count("continuation length", 1, max_tokens - nctx)
            chars.append(count("continuation characters", 0, 1 << 30))
            choices.append(tokens(nt, "continuation"))
            if kind == KIND_PARTIAL and chars[-1] >= nt:
                raise ValueError(f"{path}: partial item {len(items)}: {chars[-1]} context tokens of a {nt}-token "
                                 "choice leave nothing to score")
        items.append({"context": ctx, "choices": choices, "choice_chars": chars, "gold": gold})
    if j != len(v):
        raise ValueError(f"{path}: {len(v) - j} trailing int32 after the last item")
    return {"kind": kind, "vocab_size": vocab, "max_choices": max_choices, "max_tokens": max_tokens,
            "bos": bool(h[7]), "description": desc, "items": items, "tokenizer": tokenizer}
