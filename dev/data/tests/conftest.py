"""Shared fixtures for the data tests: a small trained tokenizer (the KJV text and the import
path of dev/data's modules: dev/conftest.py)."""
import os

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


@pytest.fixture(scope="session")
def small_tok(tmp_path_factory, kjv_chapters):
    """A SentencePiece tokenizer with the paper's settings, small vocab, trained on little text."""
    from synth_generator import generate
    from attnref.tokenizer import train_sentencepiece
    lines = []
    for c in kjv_chapters[:150]:
        lines += c["text"].split("\n")
    for d in generate(600, 11):
        for f in ("query", "synthetic_reasoning", "synthetic_answer"):
            lines += [x for x in d[f].split("\n") if x]
    prefix = tmp_path_factory.mktemp("tok") / "small"
    return train_sentencepiece(lines, prefix, vocab_size=700, num_threads=2)
