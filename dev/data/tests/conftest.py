"""Shared fixtures for the data tests: import path and a small trained tokenizer (the KJV text: dev/conftest.py)."""
import os
import sys

import pytest

DATA_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REPO = os.path.dirname(os.path.dirname(DATA_DIR))
sys.path.insert(0, DATA_DIR)


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
