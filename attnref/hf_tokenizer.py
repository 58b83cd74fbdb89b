"""
Our SentencePiece tokenizer (attnref/tokenizer.py) as a Hugging Face fast tokenizer that
encodes and decodes token for token as SentencePiece does, so that AutoTokenizer and lm-eval
read exported models' text as ours (doc/export.md "Tokenizer"; why each piece matches: the
comments of sentencepiece_to_hf).
"""
from __future__ import annotations

from attnref.tokenizer import SP_SPACE, T_CONTROL, T_NORMAL, T_UNKNOWN, T_USER, SPTokenizer


def sentencepiece_to_hf(model_file, model_max_length=None):
    """A transformers PreTrainedTokenizerFast equivalent to the SentencePiece model."""
    from tokenizers import AddedToken, Tokenizer, decoders, normalizers, processors
    from tokenizers.models import BPE
    from transformers import PreTrainedTokenizerFast

    sp_tok = SPTokenizer(model_file)
    sp = sp_tok.sp
    if sp_tok.bos_id < 0:
        raise ValueError(f"{model_file}: the model has no BOS piece; every document here starts with one")
    pieces = [sp.id_to_piece(i) for i in range(sp_tok.vocab_size)]
    types = [sp_tok.piece_bytes(i)[0] for i in range(sp_tok.vocab_size)]
    vocab = {p: i for i, p in enumerate(pieces)}
    # merge rules: every split of a normal piece into two normal pieces, ranked by the merged
    # piece's score, highest first, then its id. SentencePiece BPE merges the adjacent pair whose
    # concatenation is the highest-scoring piece (leftmost on ties), so a BPE model with these
    # ranks makes the same choice at every step; characters outside the vocabulary become their
    # UTF-8 bytes (<0xAB> pieces) in both: byte fallback
    mergeable = {p for p, t in zip(pieces, types) if t == T_NORMAL}
    merges = []
    for i, p in enumerate(pieces):
        if types[i] != T_NORMAL:
            continue
        for k in range(1, len(p)):
            left, right = p[:k], p[k:]
            if left in mergeable and right in mergeable:
                merges.append((-sp.get_score(i), i, vocab[left], (left, right)))
    merges.sort(key=lambda m: m[:3])
    unk = pieces[sp_tok.unk_id] if sp_tok.unk_id >= 0 else None
    tok = Tokenizer(BPE(vocab=vocab, merges=[m[3] for m in merges], unk_token=unk, byte_fallback=True,
                        fuse_unk=True))
    # ours normalises nothing (no dummy prefix, no whitespace collapsing): space -> "▁" is the one rewrite
    tok.normalizer = normalizers.Replace(" ", SP_SPACE)
    tok.decoder = decoders.Sequence([decoders.Replace(SP_SPACE, " "), decoders.ByteFallback(), decoders.Fuse()])
    # BOS first, as add_special_tokens=True (the transformers default, and lm-eval's) asks: our
    # documents and eval contexts start with it; encode(text, add_special_tokens=False) is SentencePiece's
    bos = pieces[sp_tok.bos_id]
    tok.post_processor = processors.TemplateProcessing(single=f"{bos} $A", pair=f"{bos} $A {bos} $B",
                                                       special_tokens=[(bos, sp_tok.bos_id)])
    # control pieces and <unk> are special: SentencePiece never makes them from text and prints
    # nothing for them (hence split_special_tokens below: the text "<s>" is spelled out, not read
    # as BOS; skip_special_tokens=True drops them). The user pieces (the ChatML/think markers) are
    # matched in the raw text before BPE, as SentencePiece does, and kept on decode: added tokens.
    specials = [AddedToken(pieces[i], special=True, normalized=False)
                for i, t in enumerate(types) if t in (T_CONTROL, T_UNKNOWN)]
    users = [AddedToken(pieces[i], special=False, normalized=False, single_word=False, lstrip=False, rstrip=False)
             for i, t in enumerate(types) if t == T_USER]
    tok.add_special_tokens(specials)
    tok.add_tokens(users)
    names = {"bos_token": sp_tok.bos_id, "eos_token": sp_tok.eos_id, "pad_token": sp_tok.pad_id,
             "unk_token": sp_tok.unk_id}
    kw = {k: pieces[i] for k, i in names.items() if i >= 0}
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, split_special_tokens=True, clean_up_tokenization_spaces=False,
                                 add_bos_token=True, add_eos_token=False,
                                 model_max_length=model_max_length or int(1e30), **kw)
    return hf
