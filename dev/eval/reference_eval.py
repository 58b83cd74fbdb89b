"""
Scores an eval set (.bin, doc/formats.md "Eval sets") with the PyTorch reference model of a
checkpoint: the trainer's own evaluation of a multiple-choice or cloze set, following
lm-evaluation-harness so that its numbers and lm-eval's on an exported model
(attnref/export_hf.py) can be compared item for item.

  python dev/eval/reference_eval.py CKPT EVALSET.bin [--limit N] [--max-len T]

Per continuation: the model reads context + continuation minus its last token (left-truncated
to the model's context, as lm-eval does) and the log-likelihood is the sum of the
continuation tokens' log-probabilities, softmax over the real vocabulary; "greedy" when every
continuation token is the argmax. The contexts in the file start with BOS already (header
field [7]), which is where lm-eval's tokenizer puts it (attnref/hf_tokenizer.py).
  multiple choice: acc = argmax log-likelihood is gold; acc_norm = argmax of
                   log-likelihood / the file's length of the choice (lm-eval's: its
                   characters without the target delimiter; first index on ties);
  partial:         each choice's own context, then the shared continuation (Winogrande);
                   acc = argmax of the continuation's log-likelihood is gold.
  cloze:           acc = greedy; perplexity = exp(-mean log-likelihood).
  rolling:         the document in lm-eval's rolling windows of the model's context
                   (evalset.rolling_requests); word_perplexity = exp(-sum log-likelihood /
                   sum words), token_perplexity = exp(-sum log-likelihood / sum tokens).
"""
from __future__ import annotations

import argparse
import math
import sys

import torch

from attnref.evalset import KIND_CLOZE, KIND_PARTIAL, KIND_ROLLING, partial_request, read_evalset, rolling_requests


@torch.no_grad()
def continuation_scores(model, vocab_size, max_len, context, continuation):
    """(log-likelihood, greedy) of continuation after context under model (ids -> (1,T,*) logits)."""
    toks = (list(context) + list(continuation))[-(max_len + 1):]
    inp = torch.tensor([toks[:-1]], dtype=torch.long)
    logits = model(inp)[0][0, :, :vocab_size].double()
    logp = torch.log_softmax(logits, dim=-1)[-len(continuation):]
    target = torch.tensor(continuation, dtype=torch.long)
    ll = logp.gather(-1, target[:, None]).sum().item()
    return ll, bool(torch.equal(logp.argmax(-1), target))


def score_evalset(model, vocab_size, max_len, es, limit=None):
    """{'acc', 'acc_norm' (multiple choice), 'acc' (partial), 'acc', 'perplexity' (cloze) or 'word_perplexity',
    'token_perplexity' (rolling), 'n', 'items': per item the (log-likelihood, greedy) of each
    choice (rolling: of the whole document)}."""
    items = es["items"][:limit] if limit else es["items"]
    if es["kind"] == KIND_ROLLING:
        per_item, ll_sum, words, tokens = [], 0.0, 0, 0
        for it in items:
            doc = it["choices"][0]
            res = [continuation_scores(model, vocab_size, max_len, c, t)
                   for c, t in rolling_requests(it["context"][0], doc, max_len)]
            ll = sum(r[0] for r in res)
            per_item.append([(ll, all(r[1] for r in res))])
            ll_sum += ll
            words += it["choice_chars"][0]
            tokens += len(doc)
        return {"n": len(items), "word_perplexity": math.exp(-ll_sum / words),
                "token_perplexity": math.exp(-ll_sum / tokens), "items": per_item}
    per_item, acc, acc_norm, lls = [], 0, 0, []
    for it in items:
        if es["kind"] == KIND_PARTIAL:  # each choice its own context, one continuation
            res = [continuation_scores(model, vocab_size, max_len, *partial_request(it, c)) for c in range(len(it["choices"]))]
        else:
            res = [continuation_scores(model, vocab_size, max_len, it["context"], c) for c in it["choices"]]
        per_item.append(res)
        if es["kind"] == KIND_CLOZE:
            acc += res[0][1]
            lls.append(res[0][0])
        else:
            ll = [r[0] for r in res]
            acc += max(range(len(ll)), key=lambda i: (ll[i], -i)) == it["gold"]
            if es["kind"] != KIND_PARTIAL:
                norm = [x / n for x, n in zip(ll, it["choice_chars"])]
                acc_norm += max(range(len(norm)), key=lambda i: (norm[i], -i)) == it["gold"]
    n = len(items)
    out = {"n": n, "acc": acc / n, "items": per_item}
    if es["kind"] == KIND_CLOZE:
        out["perplexity"] = math.exp(-sum(lls) / n)
    elif es["kind"] != KIND_PARTIAL:  # (partial: acc only, as lm-eval's winogrande)
        out["acc_norm"] = acc_norm / n
    return out


def load_reference(ckpt):
    """(model in eval mode, vocab size, context length) of a SAN or GPT-2 checkpoint."""
    from attnref import container, gpt2, san
    _, meta, _ = container.read_container(ckpt, container.KIND_CHECKPOINT)
    mod = gpt2 if meta.get("model") == "gpt2" else san
    model = mod.load_checkpoint(ckpt)[0].eval()
    return model, model.cfg.vocab_size, model.cfg.seq_len


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("checkpoint")
    ap.add_argument("evalset", help="eval set .bin (dev/data/evals.py, dev/data/sanity_evals.py)")
    ap.add_argument("--limit", type=int, default=None, help="score only the first N items")
    ap.add_argument("--max-len", type=int, default=0,
                    help="window of the model's inputs (0: its context; the trainers use their --seq-len)")
    args = ap.parse_args(argv)
    model, V, T = load_reference(args.checkpoint)
    if args.max_len:
        T = min(T, args.max_len)
    es = read_evalset(args.evalset)
    if es["vocab_size"] != V:
        print(f"error: {args.evalset} is tokenized for vocab {es['vocab_size']}, the model has {V}", file=sys.stderr)
        return 1
    r = score_evalset(model, V, T, es, args.limit)
    print(" ".join(f"{k} {v:.6f}" for k, v in r.items() if k not in ("n", "items")) + f" n {r['n']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
