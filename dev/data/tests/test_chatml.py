"""ChatML formatting and exact region labels: every token's bytes fall inside one region of
the formatted text, and the query/trace/answer tokens decode to exactly what each region
convention assigns them (written out here by hand: the paper's code adds the role headers
and the think block's newlines; the legacy labels are the fields alone)."""
import pytest

from chatml import DocTokenizer, char_regions, format_text
from attnref.shards import ANSWER, OTHER, QUERY, TRACE
from synth_generator import generate
from attnref.tokenizer import read_tokenizer_bin, export_tokenizer_bin


def test_layout_matches_paper():
    assert format_text("Q", "R", "A") == ("<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n"
                                          "<think>\nR\n</think>\nA<|im_end|>")
    assert format_text("Q", "", "A") == "<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\nA<|im_end|>"


def byte_regions(q, r, a, convention):
    out = []
    for ch, reg in zip(format_text(q, r, a), char_regions(q, r, a, convention)):
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


def region_texts(q, r, a, convention):
    """What the query, trace and answer tokens of a document decode to, per convention."""
    if convention == "legacy":
        return {QUERY: q, TRACE: r, ANSWER: a}
    return {QUERY: "user\n" + q, TRACE: f"\n{r}\n" if r else "", ANSWER: "assistant\n" + ("\n" if r else "") + a}


def check_doc(dt, table, q, r, a):
    ids, regs = dt.encode(q, r, a)
    tok = dt.tok
    assert len(ids) == len(regs)
    assert ids[0] == tok.bos_id and ids[-1] == tok.eos_id and regs[0] == regs[-1] == OTHER
    text = format_text(q, r, a)
    assert tok.decode(ids) == text
    want = byte_regions(q, r, a, dt.convention)
    pos = 0
    for i, reg in zip(ids, regs):
        _, b = table["pieces"][i]
        if i in (tok.bos_id, tok.eos_id):
            continue
        span = want[pos:pos + len(b)]
        assert len(span) == len(b) and all(x == reg for x in span), (i, b, reg, span)
        pos += len(b)
    assert pos == len(want)
    # each region's tokens decode to exactly what the convention gives it
    for region, text in region_texts(q, r, a, dt.convention).items():
        assert tok.decode([i for i, g in zip(ids, regs) if g == region]) == text
    assert (6 in ids) == bool(r) and (7 in ids) == bool(r)  # think block dropped when empty
    assert ids.count(4) == 2 and ids.count(5) == 2
    assert all(g == OTHER for i, g in zip(ids, regs) if i < 8)


@pytest.mark.parametrize("convention", ["paper", "legacy"])
@pytest.mark.parametrize("doc", DOCS)
def test_regions_exact_handmade(small_tok, table, doc, convention):
    check_doc(DocTokenizer(small_tok, convention), table, *doc)


def test_paper_convention_is_default_and_changes_labels_only(small_tok):
    q, r, a = DOCS[0]
    paper, legacy = DocTokenizer(small_tok), DocTokenizer(small_tok, "legacy")
    assert paper.convention == "paper"
    ids_p, regs_p = paper.encode(q, r, a)
    ids_l, regs_l = legacy.encode(q, r, a)
    assert ids_p == ids_l  # the convention never changes the tokens
    tok = small_tok
    # the tokens labelled differently are exactly "user\n", "assistant\n" and the three layout newlines
    moved = [i for i, (x, y) in enumerate(zip(regs_p, regs_l)) if x != y]
    assert tok.decode([ids_p[i] for i in moved]) == "user\nassistant\n\n\n\n"
    assert all(regs_l[i] == OTHER for i in moved)
    with pytest.raises(ValueError, match="region convention"):
        DocTokenizer(small_tok, "other")


@pytest.mark.parametrize("convention", ["paper", "legacy"])
def test_regions_exact_generated(small_tok, table, convention):
    dt = DocTokenizer(small_tok, convention)
    n_empty = 0
    for d in generate(400, 3):
        check_doc(dt, table, d["query"], d["synthetic_reasoning"], d["synthetic_answer"])
        n_empty += d["synthetic_reasoning"] == ""
    assert n_empty > 0  # the drop-the-think-block path was exercised
