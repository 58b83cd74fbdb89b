"""The paper's SentencePiece settings: special ids, atomic markers, lossless round trips on
the offline corpora, and the tokenizer .bin export (SentencePiece and tiktoken)."""
import struct
import zlib

import numpy as np
import pytest

from synth_generator import generate
from attnref.tokenizer import (SPECIALS, T_BYTE, T_CONTROL, T_USER, TiktokenTokenizer, decode_with_bin, export_tokenizer_bin,
                       read_tokenizer_bin)

ODD_TEXTS = ["  two leading spaces and trailing  ", "tabs\there\n\nblank lines\n", "naïve café – ☕ 日本語 🙂",
             "\n", " ", "x<|im_start|>y<think>z</think><|im_end|>", "<|im_start|", "a\r\nb"]


def test_special_ids(small_tok):
    sp = small_tok.sp
    assert (sp.pad_id(), sp.eos_id(), sp.bos_id(), sp.unk_id()) == (0, 1, 2, 3)
    assert [sp.id_to_piece(i) for i in range(4, 8)] == SPECIALS
    assert small_tok.vocab_size == 700


@pytest.mark.parametrize("marker", SPECIALS)
def test_markers_are_atomic(small_tok, marker):
    i = SPECIALS.index(marker) + 4
    assert small_tok.encode(marker) == [i]
    ids = small_tok.encode(f"text{marker}more {marker}\n{marker}")
    assert ids.count(i) == 3
    # no other piece contains (part of) a marker's text
    pieces = [small_tok.sp.id_to_piece(j) for j in range(small_tok.vocab_size) if j != i]
    assert not any(marker in p for p in pieces)


def test_whitespace_kept_and_bytes(small_tok):
    for t in ODD_TEXTS:
        assert small_tok.decode(small_tok.encode(t)) == t
    ids = small_tok.encode("a\nb")
    assert small_tok.sp.id_to_piece(ids[1]) == "<0x0A>"  # newline by byte fallback


def test_round_trip_offline_corpora(small_tok, kjv_chapters):
    text = "\n".join(c["text"] for c in kjv_chapters)
    assert small_tok.decode(small_tok.encode(text)) == text
    for d in generate(300, 5):
        for f in ("query", "synthetic_reasoning", "synthetic_answer"):
            assert small_tok.decode(small_tok.encode(d[f])) == d[f]


def test_export_decodes_like_sentencepiece(small_tok, tmp_path, kjv_chapters):
    p = tmp_path / "tok.bin"
    export_tokenizer_bin(small_tok, p)
    tb = read_tokenizer_bin(p)
    assert tb["vocab_size"] == small_tok.vocab_size
    assert (tb["bos"], tb["eos"], tb["pad"], tb["unk"]) == (2, 1, 0, 3)
    assert tb["pieces"][2][0] == T_CONTROL and tb["pieces"][4] == (T_USER, b"<|im_start|>")
    assert tb["pieces"][small_tok.sp.piece_to_id("<0x0A>")] == (T_BYTE, b"\n")
    assert not any("\u2581".encode() in b for _, b in tb["pieces"])  # no "▁" left
    texts = ODD_TEXTS + [c["text"] for c in kjv_chapters[:50]]
    for t in texts:
        ids = [small_tok.bos_id] + small_tok.encode(t) + [small_tok.eos_id]
        assert decode_with_bin(tb, ids) == small_tok.decode(ids).encode("utf-8") == t.encode("utf-8")


def test_tiktoken_export_offline(tmp_path):
    """The tiktoken path, with a tiny byte-level BPE built here (GPT-2's files need the network)."""
    import tiktoken
    ranks = {bytes([b]): b for b in range(256)}
    for i, m in enumerate([b"th", b"the", b" the", b"in", b" in"]):
        ranks[m] = 256 + i
    enc = tiktoken.Encoding("tiny", pat_str=r"""'s|'t| ?\w+| ?[^\s\w]+|\s+(?!\S)|\s+""", mergeable_ranks=ranks,
                            special_tokens={"<|endoftext|>": 261})
    tok = TiktokenTokenizer(enc)
    assert tok.vocab_size == 262 and tok.eos_id == tok.bos_id == 261
    p = tmp_path / "tt.bin"
    export_tokenizer_bin(tok, p)
    tb = read_tokenizer_bin(p)
    assert tb["kind"] == 2 and tb["pieces"][261][0] == T_CONTROL and tb["pieces"][258] == (0, b" the")
    text = "in the beginning the café ☕ was\n in"
    ids = [261] + tok.encode(text) + [261]
    assert 258 in ids
    assert decode_with_bin(tb, ids) == text.encode("utf-8")


def test_bin_reader_rejects_truncation(small_tok, tmp_path):
    p = tmp_path / "tok.bin"
    export_tokenizer_bin(small_tok, p)
    data = p.read_bytes()
    (tmp_path / "cut.bin").write_bytes(data[:-1])
    with pytest.raises(ValueError, match="cut.bin: checksum mismatch"):
        read_tokenizer_bin(tmp_path / "cut.bin")
    (tmp_path / "cut1.bin").write_bytes(as_version1(data)[:-1])
    with pytest.raises(ValueError, match="truncated"):
        read_tokenizer_bin(tmp_path / "cut1.bin")
    bad = np.frombuffer(data, dtype=np.uint8).copy()
    bad[0] ^= 1
    (tmp_path / "magic.bin").write_bytes(bad.tobytes())
    with pytest.raises(ValueError, match="magic"):
        read_tokenizer_bin(tmp_path / "magic.bin")


def as_version1(data):
    """The same tokenizer .bin as version 1: no CRC."""
    return data[:4] + struct.pack("<i", 1) + data[8:36] + bytes(4) + data[40:]


def test_bin_checksum_and_version_1(small_tok, tmp_path, capsys):
    """Version 2 carries the CRC-32 of everything after the header: a bos id flipped from 2 to 1
    (which would change training silently) or a zeroed CRC field is refused naming the file; a
    changed piece too; the same file as version 1 reads, with a note."""
    p = tmp_path / "tok.bin"
    export_tokenizer_bin(small_tok, p)
    data = p.read_bytes()
    h = struct.unpack("<256i", data[:1024])
    assert h[1] == 2 and h[9] & 0xFFFFFFFF == zlib.crc32(data[40:], zlib.crc32(data[:36])) and not any(h[10:])
    assert h[4] == 2  # bos
    for name, at, value in [("bos.bin", 16, 1), ("zeroed.bin", 36, 0), ("piece.bin", 1024 + 3 + 2, None)]:
        bad = bytearray(data)
        if value is None:
            bad[at] ^= 1  # a byte of the first piece's name
        else:
            bad[at:at + 4] = struct.pack("<i", value)
        (tmp_path / name).write_bytes(bytes(bad))
        with pytest.raises(ValueError, match=f"{name}: checksum mismatch: stored CRC32"):
            read_tokenizer_bin(tmp_path / name)
    (tmp_path / "v1.bin").write_bytes(as_version1(data))
    capsys.readouterr()
    assert read_tokenizer_bin(tmp_path / "v1.bin")["pieces"] == read_tokenizer_bin(p)["pieces"]
    assert "v1.bin is of version 1, without a checksum" in capsys.readouterr().err
