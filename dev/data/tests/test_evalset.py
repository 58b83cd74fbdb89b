"""Eval .bin round trip and lm-eval-style (context, continuation) encoding."""
import struct

import pytest

from evalset import KIND_CLOZE, KIND_MC, encode_pair, make_item, read_evalset, write_evalset


def test_round_trip_and_layout(tmp_path):
    items = [{"context": [2, 10, 11], "choices": [[20, 21], [22], [23, 24, 25]], "choice_chars": [7, 3, 11], "gold": 1},
             {"context": [2, 9], "choices": [[30]], "choice_chars": [4], "gold": 0}]
    p = tmp_path / "e.bin"
    write_evalset(p, items, KIND_MC, 64, "SANITY SET x")
    data = p.read_bytes()
    h = struct.unpack("<256i", data[:1024])
    assert h[:9] == (20260313, 1, 2, KIND_MC, 64, 3, 6, 1, len("SANITY SET x"))
    assert data[1024:1036] == b"SANITY SET x"
    first = struct.unpack("<3i", data[1036:1048])
    assert first == (3, 1, 3)
    e = read_evalset(p)
    assert e["items"] == items and e["description"] == "SANITY SET x" and e["kind"] == KIND_MC
    with pytest.raises(ValueError):
        write_evalset(p, items, KIND_CLOZE, 64, "")  # a cloze item has one continuation
    with pytest.raises(ValueError):
        write_evalset(p, items, KIND_MC, 25, "")  # token 25 outside the vocabulary
    (tmp_path / "cut.bin").write_bytes(data[:-4])
    with pytest.raises(ValueError, match="truncated"):
        read_evalset(tmp_path / "cut.bin")


def test_encode_pair_lm_eval_split(small_tok):
    ctx, cont = encode_pair(small_tok, "In the beginning God created the ", "heaven")
    assert ctx[0] == small_tok.bos_id
    assert small_tok.decode(ctx[1:]) == "In the beginning God created the"
    assert small_tok.decode(cont) == " heaven"  # the trailing space moved to the continuation
    assert ctx[1:] + cont == small_tok.encode("In the beginning God created the heaven")
    it = make_item(small_tok, "Question: what?\nAnswer:", [" yes", " no way"], 1)
    assert it["choice_chars"] == [4, 7] and it["gold"] == 1
    assert [small_tok.decode(c) for c in it["choices"]] == [" yes", " no way"]
