"""
SYNTH documents as ChatML (papers/SAN.md, "Data"), tokenized with exact region labels.

  <|im_start|>user\n{query}<|im_end|>\n<|im_start|>assistant\n<think>\n{reasoning}\n</think>\n{answer}<|im_end|>

wrapped in BOS ... EOS; the think block ("<think>\n{reasoning}\n</think>\n") is dropped
when the reasoning is empty. Regions: query = the user turn's body, trace = the
reasoning text inside the think block, answer = the assistant text after it; everything
else (BOS, EOS, the markers, "user\n", "assistant\n" and the newlines of the layout) is
"other". Each piece is tokenized on its own, so no token straddles two regions and the
labels are exact; the concatenated ids still decode to the formatted text.
"""
from __future__ import annotations

from shards import ANSWER, OTHER, QUERY, TRACE

IM_START, IM_END, THINK, END_THINK = "<|im_start|>", "<|im_end|>", "<think>", "</think>"


def segments(query: str, reasoning: str, answer: str) -> list[tuple[str, int]]:
    """The formatted document (without BOS/EOS) as (text, region) pieces in order."""
    segs = [(IM_START, OTHER), ("user\n", OTHER), (query, QUERY), (IM_END, OTHER), ("\n", OTHER),
            (IM_START, OTHER), ("assistant\n", OTHER)]
    if reasoning:
        segs += [(THINK, OTHER), ("\n", OTHER), (reasoning, TRACE), ("\n", OTHER), (END_THINK, OTHER),
                 ("\n", OTHER)]
    segs += [(answer, ANSWER), (IM_END, OTHER)]
    return [(t, r) for t, r in segs if t]


def format_text(query: str, reasoning: str, answer: str) -> str:
    """The ChatML text of a document (no BOS/EOS, which are tokens without text)."""
    return "".join(t for t, _ in segments(query, reasoning, answer))


def char_regions(query: str, reasoning: str, answer: str) -> list[int]:
    """One region label per character of format_text(...) (an independent reference for tests)."""
    out = []
    for t, r in segments(query, reasoning, answer):
        out += [r] * len(t)
    return out


class DocTokenizer:
    """Tokenizes documents into (ids, regions) with a SentencePiece tokenizer that has the markers."""

    def __init__(self, tok):
        self.tok = tok
        self.marker_ids = {m: tok.sp.piece_to_id(m) for m in (IM_START, IM_END, THINK, END_THINK)}
        self._cache = {}  # ids of the fixed layout strings

    def _enc(self, text: str, cacheable: bool) -> list[int]:
        if text in self.marker_ids:
            return [self.marker_ids[text]]
        if cacheable:
            ids = self._cache.get(text)
            if ids is None:
                ids = self._cache[text] = self.tok.encode(text)
            return ids
        return self.tok.encode(text)

    def encode(self, query: str, reasoning: str, answer: str) -> tuple[list[int], list[int]]:
        ids, regs = [self.tok.bos_id], [OTHER]
        for text, region in segments(query, reasoning, answer):
            piece = self._enc(text, cacheable=(region == OTHER))
            ids += piece
            regs += [region] * len(piece)
        ids.append(self.tok.eos_id)
        regs.append(OTHER)
        return ids, regs
