"""
lm-evaluation-harness tasks over our eval sets (.bin, doc/formats.md "Eval sets"), for
models exported with attnref/export_hf.py: attn_sanity_mc (multiple choice: acc, acc_norm)
and attn_sanity_cloze (cloze: acc = greedy, perplexity), defined by the YAML files beside
this one. The set and its SentencePiece model are given as lm-eval metadata:

  lm_eval --model hf --model_args pretrained=OUTDIR,dtype=float32,add_bos_token=True \\
      --include_path dev/eval --tasks attn_sanity_mc \\
      --metadata '{"evalset": "data/offline/eval/sanity_kjv_mc.bin", "tokenizer": "data/offline/tokenizer.model"}'

The .bin holds token ids; lm-eval wants text. Each context and continuation is decoded back
to text (our SentencePiece decodes losslessly), and the loader checks that lm-eval's own
split (context.rstrip() moves trailing whitespace to the continuation; continuation ids =
encode(context + continuation) after encode(context)) gives the file's ids again, BOS
included, so lm-eval scores the same tokens as dev/eval/reference_eval.py. An item where it
would not is an error naming the item. BOS: add_bos_token=True makes lm-eval encode with
add_special_tokens=True, and the exported tokenizer's post-processor puts <s> first.
"""
from __future__ import annotations

from attnref.evalset import KIND_CLOZE, KIND_MC, read_evalset
from attnref.tokenizer import SPTokenizer


def lm_eval_split(tok, context, continuation):
    """lm-eval's (context ids, continuation ids) for a causal model whose tokenizer adds BOS."""
    n = len(context) - len(context.rstrip())
    if n:
        context, continuation = context[:-n], context[-n:] + continuation
    ctx = [tok.bos_id] + tok.encode(context)
    whole = [tok.bos_id] + tok.encode(context + continuation)
    return ctx, whole[len(ctx):]


def text_items(evalset, tokenizer, kind):
    """[{'context', 'choices', 'gold'}] of an eval set, as text, checked to re-tokenize exactly."""
    es = read_evalset(evalset)
    tok = SPTokenizer(tokenizer)
    if es["kind"] != kind:
        raise ValueError(f"{evalset}: a {'cloze' if es['kind'] == KIND_CLOZE else 'multiple-choice'} set; "
                         f"use the attn_sanity_{'cloze' if es['kind'] == KIND_CLOZE else 'mc'} task")
    if es["vocab_size"] != tok.vocab_size:
        raise ValueError(f"{evalset}: tokenized for vocab {es['vocab_size']}, {tokenizer} has {tok.vocab_size}")
    docs = []
    for i, it in enumerate(es["items"]):
        ctx = it["context"]
        if not es["bos"] or ctx[0] != tok.bos_id:
            raise ValueError(f"{evalset}: item {i}: the context does not start with BOS")
        context = tok.decode(ctx[1:])
        choices = [tok.decode(c) for c in it["choices"]]
        for c, ids in zip(choices, it["choices"]):
            if lm_eval_split(tok, context, c) != (ctx, ids):
                raise ValueError(f"{evalset}: item {i}: lm-eval would tokenize context + {c!r} differently from "
                                 f"the file (trailing whitespace in the context, or a token across the boundary)")
        docs.append({"context": context, "choices": choices, "gold": it["gold"]})
    return docs


def _dataset(docs):
    import datasets
    return datasets.DatasetDict({"test": datasets.Dataset.from_list(docs)})


def load_mc(evalset=None, tokenizer=None, **_):
    return _dataset(text_items(evalset, tokenizer, KIND_MC))


def load_cloze(evalset=None, tokenizer=None, **_):
    docs = text_items(evalset, tokenizer, KIND_CLOZE)
    return _dataset([{"context": d["context"], "continuation": d["choices"][0]} for d in docs])


def doc_to_text(doc):
    return doc["context"]


def doc_to_choice(doc):
    return doc["choices"]


def doc_to_target(doc):
    return doc["gold"]


def doc_to_continuation(doc):
    return doc["continuation"]
