"""
Our SentencePiece tokenizer (attnref/tokenizer.py, doc/formats.md "Tokenizer") as a Hugging
Face fast tokenizer, so that AutoTokenizer.from_pretrained(DIR) encodes and decodes token for
token as SentencePiece does.

Why the pieces below reproduce SentencePiece exactly:
- normalisation: ours is the identity, and the only rewrite SentencePiece makes is space ->
  "▁" (no dummy prefix, no whitespace collapsing), so the normaliser is that one Replace;
- the model: SentencePiece BPE encodes by repeatedly merging the adjacent pair whose
  concatenation is the highest-scoring vocabulary piece (leftmost on ties). A BPE model
  with one merge rule per way of splitting each piece into two vocabulary pieces, ranked by
  the merged piece's score, makes the same choice at every step. Characters outside the
  vocabulary become their UTF-8 bytes (<0xAB> pieces: byte fallback), as in SentencePiece;
- user-defined pieces (<|im_start|>, <|im_end|>, <think>, </think>) are matched in the raw
  text before BPE, as SentencePiece does: they are added tokens, not "special" ones, so
  decoding keeps them;
- control pieces (<pad>, </s>, <s>) and <unk> are special tokens: SentencePiece never makes
  them from text and prints nothing for them, so the tokenizer is saved with
  split_special_tokens (the text "<s>" is spelled out, not read as BOS) and decode with
  skip_special_tokens=True drops them;
- the post-processor puts BOS in front of every encoded text (add_special_tokens=True, the
  transformers default and what lm-eval uses): our documents and eval contexts start with
  BOS. encode(text, add_special_tokens=False) is SentencePiece's encode(text).
The decoder maps "▁" back to a space and fuses byte pieces into UTF-8.
"""
from __future__ import annotations


from attnref.tokenizer import SP_SPACE, T_CONTROL, T_NORMAL, T_UNKNOWN, T_USER, SPTokenizer  # noqa: E402


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
    # merge rules: every split of a normal piece into two normal pieces; the rank order is
    # the merged piece's score, highest first (SentencePiece's choice), then its id
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
    tok.normalizer = normalizers.Replace(" ", SP_SPACE)
    tok.decoder = decoders.Sequence([decoders.Replace(SP_SPACE, " "), decoders.ByteFallback(), decoders.Fuse()])
    bos = pieces[sp_tok.bos_id]
    tok.post_processor = processors.TemplateProcessing(single=f"{bos} $A", pair=f"{bos} $A {bos} $B",
                                                       special_tokens=[(bos, sp_tok.bos_id)])
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
