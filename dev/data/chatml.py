"""
SYNTH documents as ChatML (the SAN paper, "Data"), tokenized with exact region labels.

  <|im_start|>user\n{query}<|im_end|>\n<|im_start|>assistant\n<think>\n{reasoning}\n</think>\n{answer}<|im_end|>

wrapped in BOS ... EOS; the think block ("<think>\n{reasoning}\n</think>\n") is dropped
when the reasoning is empty. Each piece is tokenized on its own, so no token straddles
two regions and the labels are exact; the concatenated ids still decode to the formatted
text, and the ids do not depend on the region convention (only the labels do).

Region conventions (doc/data.md, "Region conventions"):
  paper   (default) as the paper's code labels them: the role header "user\n" belongs to
          the query, "assistant\n" and the newline after "</think>" to the answer, and the
          two newlines inside the think block to the trace;
  legacy  only the field texts are labelled (query = the user turn's body, trace = the
          reasoning text, answer = the assistant text after the think block); "user\n",
          "assistant\n" and every layout newline are "other".
In both, BOS, EOS, the four markers and the newline between the two turns are "other".
"""
from __future__ import annotations

from attnref.shards import ANSWER, OTHER, QUERY, TRACE

IM_START, IM_END, THINK, END_THINK = "<|im_start|>", "<|im_end|>", "<think>", "</think>"
CONVENTIONS = ("paper", "legacy")


def segments(query: str, reasoning: str, answer: str, convention: str = "paper") -> list[tuple[str, int]]:
    """The formatted document (without BOS/EOS) as (text, region) pieces in order."""
    if convention not in CONVENTIONS:
        raise ValueError(f"unknown region convention {convention!r} (expected one of {CONVENTIONS})")
    paper = convention == "paper"
    header_q, header_a = (QUERY, ANSWER) if paper else (OTHER, OTHER)
    think_nl, after_think_nl = (TRACE, ANSWER) if paper else (OTHER, OTHER)
    segs = [(IM_START, OTHER), ("user\n", header_q), (query, QUERY), (IM_END, OTHER), ("\n", OTHER),
            (IM_START, OTHER), ("assistant\n", header_a)]
    if reasoning:
        segs += [(THINK, OTHER), ("\n", think_nl), (reasoning, TRACE), ("\n", think_nl), (END_THINK, OTHER),
                 ("\n", after_think_nl)]
    segs += [(answer, ANSWER), (IM_END, OTHER)]
    return [(t, r) for t, r in segs if t]


def format_text(query: str, reasoning: str, answer: str) -> str:
    """The ChatML text of a document (no BOS/EOS, which are tokens without text)."""
    return "".join(t for t, _ in segments(query, reasoning, answer))


def char_regions(query: str, reasoning: str, answer: str, convention: str = "paper") -> list[int]:
    """One region label per character of format_text(...) (an independent reference for tests)."""
    out = []
    for t, r in segments(query, reasoning, answer, convention):
        out += [r] * len(t)
    return out


class DocTokenizer:
    """Tokenizes documents into (ids, regions) with a SentencePiece tokenizer that has the markers."""

    def __init__(self, tok, convention: str = "paper"):
        if convention not in CONVENTIONS:
            raise ValueError(f"unknown region convention {convention!r} (expected one of {CONVENTIONS})")
        self.tok = tok
        self.convention = convention
        self.marker_ids = {m: tok.sp.piece_to_id(m) for m in (IM_START, IM_END, THINK, END_THINK)}
        self._cache = {}  # ids of the fixed layout strings
        # the layout strings (role headers, newlines) are the same in every document
        self._layout = {t for t, _ in segments("q", "r", "a", "legacy") if t not in ("q", "r", "a")}

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
        for text, region in segments(query, reasoning, answer, self.convention):
            piece = self._enc(text, cacheable=text in self._layout)
            ids += piece
            regs += [region] * len(piece)
        ids.append(self.tok.eos_id)
        regs.append(OTHER)
        return ids, regs
