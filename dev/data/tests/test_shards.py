"""Token shard and region sidecar round trips, parsed independently with struct."""
import struct
import zlib

import numpy as np
import pytest

from attnref import shards
from attnref.shards import ShardWriter, read_regions, read_shard, regions_path, write_regions, write_shard


def parse_raw(path, width_by_version={1: 2, 2: 4}):
    data = open(path, "rb").read()
    head = struct.unpack("<256i", data[:1024])
    return head, data[1024:]


@pytest.mark.parametrize("version,maxval", [(1, 65535), (2, 2**32 - 1)])
def test_shard_round_trip_and_layout(tmp_path, version, maxval):
    rng = np.random.default_rng(0)
    toks = rng.integers(0, maxval, size=1234, dtype=np.int64)
    toks[0] = maxval
    p = tmp_path / "x_train_000000.bin"
    write_shard(p, toks, version=version)
    head, body = parse_raw(p)
    assert head[:3] == (20240520, version, 1234)
    assert head[3] & 0xFFFFFFFF == zlib.crc32(body)  # the tokens' CRC-32, as the int32 of its bits
    assert head[4] == 1 and all(v == 0 for v in head[5:])  # the flag: the CRC is present
    fmt = "<%d%s" % (1234, "H" if version == 1 else "I")
    assert list(struct.unpack(fmt, body)) == toks.tolist()
    assert read_shard(p).tolist() == toks.tolist()


def test_version_choice_and_range(tmp_path):
    write_shard(tmp_path / "a.bin", [0, 65535])
    assert parse_raw(tmp_path / "a.bin")[0][1] == 1
    write_shard(tmp_path / "b.bin", [0, 65536])
    assert parse_raw(tmp_path / "b.bin")[0][1] == 2
    with pytest.raises(ValueError):
        write_shard(tmp_path / "c.bin", [70000], version=1)
    with pytest.raises(ValueError):
        write_shard(tmp_path / "d.bin", [-1])


def test_regions_round_trip(tmp_path):
    labels = np.arange(1000) % 4
    p = tmp_path / "x.regions"
    write_regions(p, labels)
    head, body = parse_raw(p)
    assert head[:3] == (shards.REGIONS_MAGIC, 1, 1000)
    assert head[3] & 0xFFFFFFFF == zlib.crc32(body) and head[4] == 1 and all(v == 0 for v in head[5:])
    assert list(body) == labels.tolist()
    assert read_regions(p).tolist() == labels.tolist()
    with pytest.raises(ValueError):
        write_regions(p, [4])
    assert regions_path("d/x_val_000003.bin").name == "x_val_000003.regions"


def test_readers_reject_bad_files(tmp_path):
    p = tmp_path / "s.bin"
    write_shard(p, list(range(100)))
    data = p.read_bytes()
    (tmp_path / "cut.bin").write_bytes(data[:-2])
    with pytest.raises(ValueError, match="cut.bin.*size"):
        read_shard(tmp_path / "cut.bin")
    (tmp_path / "hdr.bin").write_bytes(data[:100])
    with pytest.raises(ValueError, match="truncated"):
        read_shard(tmp_path / "hdr.bin")
    bad = bytearray(data)
    bad[0:4] = struct.pack("<i", 7)
    (tmp_path / "magic.bin").write_bytes(bytes(bad))
    with pytest.raises(ValueError, match="magic"):
        read_shard(tmp_path / "magic.bin")
    with pytest.raises(ValueError, match="magic"):
        read_regions(p)  # a shard is not a sidecar


def test_shard_writer_packs_documents(tmp_path):
    rng = np.random.default_rng(1)
    docs = [rng.integers(0, 500, size=rng.integers(1, 300)).tolist() for _ in range(200)]
    regs = [[(t + i) % 4 for i, t in enumerate(d)] for d in docs]
    w = ShardWriter(tmp_path, "c", "train", shard_tokens=1000, vocab_size=500, with_regions=True)
    for d, r in zip(docs, regs):
        w.add(d, r)
    paths = w.close()
    total = sum(len(d) for d in docs)
    assert len(paths) == -(-total // 1000)
    assert [p.name for p in paths] == [f"c_train_{i:06d}.bin" for i in range(len(paths))]
    got = np.concatenate([read_shard(p) for p in paths]).tolist()
    assert got == [t for d in docs for t in d]
    got_r = np.concatenate([read_regions(regions_path(p)) for p in paths]).tolist()
    assert got_r == [x for r in regs for x in r]
    assert all(len(read_shard(p)) == 1000 for p in paths[:-1])
    assert w.total_docs == 200 and w.total_tokens == total
    with pytest.raises(ValueError):
        w.add([500])  # outside the vocabulary
    with pytest.raises(ValueError):
        ShardWriter(tmp_path, "c", "test", 10, 10)


def test_exercises_round_trip_and_layout(tmp_path):
    names = ["none", "math", "rag", "mémorisation"]
    ids = np.arange(500) % 4
    p = tmp_path / "x.exercises"
    shards.write_exercises(p, ids, names)
    head, body = parse_raw(p)
    table = b"none\0math\0rag\0" + "mémorisation".encode() + b"\0"
    assert head[:5] == (shards.EXERCISES_MAGIC, 1, 500, 4, len(table))
    assert head[5] & 0xFFFFFFFF == zlib.crc32(body)  # over the name table and the ids
    assert head[6] == 1 and all(v == 0 for v in head[7:])
    assert body[:len(table)] == table and list(body[len(table):]) == ids.tolist()
    got, got_names = shards.read_exercises(p)
    assert got.tolist() == ids.tolist() and got_names == names
    assert shards.exercises_path("d/x_val_000003.bin").name == "x_val_000003.exercises"
    with pytest.raises(ValueError, match="0..3"):
        shards.write_exercises(p, [4], names)
    with pytest.raises(ValueError, match="name 0"):
        shards.write_exercises(p, [0], ["math", "none"])
    with pytest.raises(ValueError, match="repeat"):
        shards.write_exercises(p, [0], ["none", "a", "a"])
    data = p.read_bytes()
    (tmp_path / "cut.exercises").write_bytes(data[:-1])
    with pytest.raises(ValueError, match="cut.exercises.*size"):
        shards.read_exercises(tmp_path / "cut.exercises")
    with pytest.raises(ValueError, match="magic"):
        read_regions(p)  # an exercise sidecar is not a region sidecar


def test_shard_writer_exercise_tables(tmp_path):
    """Each document's tokens carry its exercise; a name keeps its id in later shards."""
    rng = np.random.default_rng(2)
    kinds = ["rag", "math", "recall", "mcq"]
    docs = [(rng.integers(0, 50, size=rng.integers(1, 120)).tolist(), kinds[min(3, i // 40)]) for i in range(160)]
    w = ShardWriter(tmp_path, "e", "val", shard_tokens=700, vocab_size=50, with_exercises=True)
    for d, k in docs:
        w.add(d, exercise=k)
    paths = w.close()
    assert len(paths) > 4
    want = [k for d, k in docs for _ in d]
    got = []
    tables = []
    for p in paths:
        ids, names = shards.read_exercises(shards.exercises_path(p))
        assert len(ids) == len(read_shard(p))
        got += [names[i] for i in ids]
        tables.append(names)
    assert got == want
    for a, b in zip(tables, tables[1:]):  # tables only grow, keeping earlier ids
        assert b[:len(a)] == a
    assert tables[-1] == ["none"] + kinds
    assert w.exercise_docs == {k: 40 for k in kinds}
    with pytest.raises(ValueError, match="exercise"):
        w.add([1, 2])  # every document names its exercise
    with pytest.raises(ValueError, match="none"):
        w.add([1, 2], exercise="none")


def test_readers_refuse_a_changed_byte_and_read_crc_0(tmp_path, capsys):
    """A byte changed in the data of a shard, region or exercise sidecar is refused naming the
    file and both CRCs; in a header int without a field too; a CRC slot set to 0 is refused like
    any other wrong CRC (the flag after it says the file has one), a flag other than 0/1 too;
    with both 0 (a file from before the checksums) the same file reads, with a note."""
    shard, reg, ex = tmp_path / "s.bin", tmp_path / "s.regions", tmp_path / "s.exercises"
    write_shard(shard, list(range(100)))
    write_regions(reg, np.arange(100) % 4)
    shards.write_exercises(ex, np.arange(100) % 2, ["none", "rag"])
    for path, read, slot, what in [(shard, read_shard, 3, "tokens"), (reg, read_regions, 3, "region labels"),
                                   (ex, shards.read_exercises, 5, "exercise names and ids")]:
        raw = bytearray(path.read_bytes())
        bad = bytearray(raw)
        bad[-1] ^= 1  # the last token / label / id, still a valid value
        path.write_bytes(bytes(bad))
        with pytest.raises(ValueError, match=f"{path}: checksum mismatch in the {what}: stored CRC32 "):
            read(path)
        good_crc = raw[4 * slot:4 * slot + 4]
        zeroed = bytearray(raw)
        zeroed[4 * slot:4 * slot + 4] = bytes(4)
        path.write_bytes(bytes(zeroed))
        with pytest.raises(ValueError, match=f"{path}: checksum mismatch in the {what}: stored CRC32 00000000"):
            read(path)
        flag = bytearray(raw)
        flag[4 * slot + 4] = 2
        path.write_bytes(bytes(flag))
        with pytest.raises(ValueError, match=rf"{path}: header int \[{slot + 1}\] \(checksum flag\) is 2"):
            read(path)
        bad[4 * slot:4 * slot + 8] = bytes(8)
        path.write_bytes(bytes(bad))
        capsys.readouterr()
        read(path)
        assert f"note: {path} carries no checksum" in capsys.readouterr().err
        assert good_crc != bytes(4)
        bad = bytearray(raw)
        bad[4 * 200] = 1
        path.write_bytes(bytes(bad))
        with pytest.raises(ValueError, match=rf"{path}: header int \[200\] is 1, must be 0"):
            read(path)
