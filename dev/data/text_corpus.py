"""
Plain-text corpora -> token shards, shared by fineweb.py and tinyshakespeare.py: documents
are wrapped as BOS + text + EOS (GPT-2, whose BOS and EOS are both <|endoftext|>, gets one
<|endoftext|> before each document, as GPT-2 training data does), tokenized in parallel
worker processes in order, with a progress bar.
"""
from __future__ import annotations

from multiprocessing import Pool

from attnref.shards import ShardWriter

_worker = {}


def wrap(tok, ids: list[int]) -> list[int]:
    if tok.bos_id == tok.eos_id:
        return [tok.bos_id] + ids
    return [tok.bos_id] + ids + [tok.eos_id]


def _init(spec: str) -> None:
    from attnref.tokenizer import load_tokenizer
    _worker["tok"] = load_tokenizer(spec)


def _encode(texts: list[str]) -> list[list[int]]:
    tok = _worker["tok"]
    return [wrap(tok, ids) for ids in tok.encode_batch(texts)]


def _chunks(texts, size):
    buf = []
    for t in texts:
        buf.append(t)
        if len(buf) == size:
            yield buf
            buf = []
    if buf:
        yield buf


def write_corpus(texts, tokenizer_spec: str, outdir, prefix: str, shard_tokens: int, val_tokens: int,
                 max_tokens: int = 0, workers: int = 1, chunk: int = 64) -> dict:
    """Tokenizes texts in order; the first val_tokens tokens' documents go to <prefix>_val_*,
    the rest to <prefix>_train_*. Stops after max_tokens (0 = all)."""
    from tqdm import tqdm

    from attnref.tokenizer import load_tokenizer, tokenizer_fingerprint
    tok = load_tokenizer(tokenizer_spec)
    w = {s: ShardWriter(outdir, prefix, s, shard_tokens, tok.vocab_size, tokenizer=tokenizer_fingerprint(tok))
         for s in ("train", "val")}
    bar = tqdm(total=max_tokens or None, unit="tok", unit_scale=True, desc=prefix)
    done = 0
    with Pool(workers, initializer=_init, initargs=(tokenizer_spec,)) as pool:
        for docs in pool.imap(_encode, _chunks(texts, chunk)):
            for ids in docs:
                w["val" if w["val"].total_tokens < val_tokens else "train"].add(ids)
                done += len(ids)
                bar.update(len(ids))
            if max_tokens and done >= max_tokens:
                pool.terminate()
                break
    bar.close()
    out = {}
    for s, wr in w.items():
        wr.close()
        out[s] = {"docs": wr.total_docs, "tokens": wr.total_tokens, "shards": len(wr.paths)}
    return out
