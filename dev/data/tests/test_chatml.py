"""ChatML formatting and exact region labels: every token's bytes fall inside one region of
the formatted text, and the query/trace/answer tokens decode to exactly those fields."""
import pytest

from chatml import DocTokenizer, char_regions, format_text
from shards import ANSWER, OTHER, QUERY, TRACE
from synth_generator import generate
from tokenizer import read_tokenizer_bin, export_tokenizer_bin


def test_layout_matches_paper():
    assert format_text("Q", "R", "A") == ("<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n"
                                          "<think>\nR\n</think>\nA<|im_end|>")
    assert format_text("Q", "", "A") == "<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\nA<|im_end|>"


def byte_regions(q, r, a):
    out = []
    for ch, reg in zip(format_text(q, r, a), char_regions(q, r, a)):
        out += [reg] * len(ch.encode("utf-8"))
    return out


DOCS = [("What is 2+2?", "2+2 is 4.", "4"), ("Empty reasoning", "", "answer"),
        ("  spaced  query\n\nwith lines ", " trace with ☕ and naïve ", "Ünïcödé answer 🙂\n"),
        ("x", "y", "z")]


@pytest.fixture(scope="module")
def table(small_tok, tmp_path_factory):
    p = tmp_path_factory.mktemp("t") / "tok.bin"
    export_tokenizer_bin(small_tok, p)
    return read_tokenizer_bin(p)


def check_doc(dt, table, q, r, a):
    ids, regs = dt.encode(q, r, a)
    tok = dt.tok
    assert len(ids) == len(regs)
    assert ids[0] == tok.bos_id and ids[-1] == tok.eos_id and regs[0] == regs[-1] == OTHER
    text = format_text(q, r, a)
    assert tok.decode(ids) == text
    want = byte_regions(q, r, a)
    pos = 0
    for i, reg in zip(ids, regs):
        _, b = table["pieces"][i]
        if i in (tok.bos_id, tok.eos_id):
            continue
        span = want[pos:pos + len(b)]
        assert len(span) == len(b) and all(x == reg for x in span), (i, b, reg, span)
        pos += len(b)
    assert pos == len(want)
    # each region's tokens decode to exactly its field
    for region, field in ((QUERY, q), (TRACE, r), (ANSWER, a)):
        assert tok.decode([i for i, g in zip(ids, regs) if g == region]) == field
    assert (6 in ids) == bool(r) and (7 in ids) == bool(r)  # think block dropped when empty
    assert ids.count(4) == 2 and ids.count(5) == 2
    assert all(g == OTHER for i, g in zip(ids, regs) if i < 8)


@pytest.mark.parametrize("doc", DOCS)
def test_regions_exact_handmade(small_tok, table, doc):
    check_doc(DocTokenizer(small_tok), table, *doc)


def test_regions_exact_generated(small_tok, table):
    dt = DocTokenizer(small_tok)
    n_empty = 0
    for d in generate(400, 3):
        check_doc(dt, table, d["query"], d["synthetic_reasoning"], d["synthetic_answer"])
        n_empty += d["synthetic_reasoning"] == ""
    assert n_empty > 0  # the drop-the-think-block path was exercised
