"""Eval .bin round trip, its checksum and bounded reading, and lm-eval-style (context,
continuation) encoding."""
import resource
import struct
import subprocess
import sys
import zlib

import pytest

from pathlib import Path

from attnref import evalset as evalset_module
from attnref.evalset import KIND_CLOZE, KIND_MC, encode_pair, make_item, read_evalset, write_evalset


def test_round_trip_and_layout(tmp_path):
    items = [{"context": [2, 10, 11], "choices": [[20, 21], [22], [23, 24, 25]], "choice_chars": [7, 3, 11], "gold": 1},
             {"context": [2, 9], "choices": [[30]], "choice_chars": [4], "gold": 0}]
    p = tmp_path / "e.bin"
    write_evalset(p, items, KIND_MC, 64, "SANITY SET x")
    data = p.read_bytes()
    h = struct.unpack("<256i", data[:1024])
    assert h[:9] == (20260313, 2, 2, KIND_MC, 64, 3, 6, 1, len("SANITY SET x"))
    assert h[9] & 0xFFFFFFFF == zlib.crc32(data[40:], zlib.crc32(data[:36])) and not any(h[10:])  # version 2: the file's CRC but its own int
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
    with pytest.raises(ValueError, match="cut.bin: checksum mismatch"):
        read_evalset(tmp_path / "cut.bin")
    (tmp_path / "cut1.bin").write_bytes(as_version1(data)[:-4])
    with pytest.raises(ValueError, match="truncated"):
        read_evalset(tmp_path / "cut1.bin")


def as_version1(data):
    """The same eval set as version 1: no CRC."""
    return struct.pack("<2i", 20260313, 1) + data[8:36] + bytes(4) + data[40:]


def test_checksum_and_version_1(tmp_path, capsys):
    """Version 2 carries a CRC of the whole file but its own int: a changed token, a changed
    header field or the CRC field set to 0 is refused naming the file; the same set as version 1 reads, with a note."""
    items = [{"context": [2, 10, 11], "choices": [[20, 21], [22]], "choice_chars": [7, 3], "gold": 1}]
    p = tmp_path / "e.bin"
    write_evalset(p, items, KIND_MC, 64, "d")
    data = p.read_bytes()
    changed = bytearray(data)
    changed[1024 + 1 + 4 * 4] ^= 1  # the context's second token 10 -> 11, still in the vocabulary
    (tmp_path / "changed.bin").write_bytes(bytes(changed))
    with pytest.raises(ValueError, match="changed.bin: checksum mismatch: stored CRC32"):
        read_evalset(tmp_path / "changed.bin")
    no_bos = bytearray(data)
    no_bos[28] = 0  # header [7]: contexts start with BOS -> not
    (tmp_path / "no_bos.bin").write_bytes(bytes(no_bos))
    with pytest.raises(ValueError, match="no_bos.bin: checksum mismatch: stored CRC32"):
        read_evalset(tmp_path / "no_bos.bin")
    zeroed = bytearray(data)
    zeroed[36:40] = bytes(4)
    (tmp_path / "zeroed.bin").write_bytes(bytes(zeroed))
    with pytest.raises(ValueError, match="zeroed.bin: checksum mismatch: stored CRC32 00000000"):
        read_evalset(tmp_path / "zeroed.bin")
    (tmp_path / "v1.bin").write_bytes(as_version1(data))
    capsys.readouterr()
    assert read_evalset(tmp_path / "v1.bin")["items"] == items
    assert "v1.bin is of version 1, without a checksum" in capsys.readouterr().err


def huge_count_file(path, where):
    """A small eval set whose header (or first item) announces 2^31 - 1 items, choices or
    context tokens, with a matching header so only the size can refuse it, or 2^31 - 1 items
    of a negative continuation length (which moved the old reader backwards: it never ended).
    Version 1: no CRC stands in the way."""
    h = [0] * 256
    h[:9] = [20260313, 1, 1, KIND_MC, 64, 2, 8, 1, 0]
    item = [2, 0, 2, 5, 6, 1, 1, 7, 1, 1, 8]  # 2 choices, gold 0, context [5, 6], choices [7], [8]
    big = 2**31 - 1
    if where == "items":
        h[2] = big
    elif where == "choices":
        h[5], item[0] = big, big
    elif where == "context":
        h[6], item[2] = big, big
    else:
        h[2], item = big, [1, 0, 1, 5, -6, 0]  # one choice of -6 tokens: back to the item's start
    path.write_bytes(struct.pack("<256i", *h) + struct.pack(f"<{len(item)}i", *item) * 400)


@pytest.mark.parametrize("where", ["items", "choices", "context", "negative"])
def test_reader_refuses_counts_beyond_the_file(tmp_path, where):
    """A count past what the file's bytes can hold, or outside its range, is refused at once: run
    in a child with 1 GiB of address space and 20 s (before the checks, 2^31 - 1 items with a
    negative continuation length ran past 60 s at 2.5 GB)."""
    p = tmp_path / f"huge_{where}.bin"
    huge_count_file(p, where)
    code = ("import sys; sys.path.insert(0, sys.argv[1]); from attnref import evalset\n"
            "try:\n    evalset.read_evalset(sys.argv[2])\nexcept ValueError as e:\n    print('refused:', e)\n")
    limit = lambda: resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))  # noqa: E731
    proc = subprocess.run([sys.executable, "-c", code, str(Path(evalset_module.__file__).parent.parent), str(p)],
                          capture_output=True, text=True, timeout=20, preexec_fn=limit)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith(f"refused: {p}:") and ("truncated" in proc.stdout or "outside" in proc.stdout)


def test_encode_pair_lm_eval_split(small_tok):
    ctx, cont = encode_pair(small_tok, "In the beginning God created the ", "heaven")
    assert ctx[0] == small_tok.bos_id
    assert small_tok.decode(ctx[1:]) == "In the beginning God created the"
    assert small_tok.decode(cont) == " heaven"  # the trailing space moved to the continuation
    assert ctx[1:] + cont == small_tok.encode("In the beginning God created the heaven")
    it = make_item(small_tok, "Question: what?\nAnswer:", [" yes", " no way"], 1)
    assert it["choice_chars"] == [4, 7] and it["gold"] == 1
    assert [small_tok.decode(c) for c in it["choices"]] == [" yes", " no way"]
