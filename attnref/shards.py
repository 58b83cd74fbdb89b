"""
Token shards and their region and exercise sidecars: the files the C++ data loader
(llmc/data/dataloader.h) reads (layouts: doc/formats.md "Token shards", "Region sidecars",
"Exercise sidecars"), one reader and writer of each for the data scripts and the references.
ShardWriter packs documents back to back into shards of a fixed size named
<prefix>_<split>_<index:06d>.bin, so that *_train_*.bin and *_val_*.bin tell the splits apart.
"""
from __future__ import annotations

import os
import sys
import zlib
from pathlib import Path

import numpy as np

HEADER_INTS = 256
HEADER_BYTES = HEADER_INTS * 4

SHARD_MAGIC = 20240520
SHARD_VERSION_U16 = 1
SHARD_VERSION_U32 = 2

REGIONS_MAGIC = 20260311
REGIONS_VERSION = 1
REGIONS_SUFFIX = ".regions"

# region labels, one uint8 per token
OTHER, QUERY, TRACE, ANSWER = 0, 1, 2, 3
REGION_NAMES = {OTHER: "other", QUERY: "query", TRACE: "trace", ANSWER: "answer"}

EXERCISES_MAGIC = 20260314
EXERCISES_VERSION = 1
EXERCISES_SUFFIX = ".exercises"
EXERCISE_NONE = "none"   # name 0 of every table: tokens that belong to no exercise
MAX_EXERCISES = 256      # ids are uint8


def regions_path(shard_path: str | os.PathLike) -> Path:
    """The sidecar that belongs to a shard: 'x_train_000001.bin' -> 'x_train_000001.regions'."""
    p = Path(shard_path)
    if p.suffix != ".bin":
        raise ValueError(f"shard file name must end in .bin: {p}")
    return p.with_suffix(REGIONS_SUFFIX)


def exercises_path(shard_path: str | os.PathLike) -> Path:
    """The exercise sidecar of a shard: 'x_train_000001.bin' -> 'x_train_000001.exercises'."""
    p = Path(shard_path)
    if p.suffix != ".bin":
        raise ValueError(f"shard file name must end in .bin: {p}")
    return p.with_suffix(EXERCISES_SUFFIX)


# the header slot of each file's CRC-32 (doc/formats.md); the slot after it is its flag
SHARD_CRC_SLOT = 3
SHARD_TOKENIZER_SLOT = 5  # the tokenizer's fingerprint; the slot after it is its flag (1 = recorded)
REGIONS_CRC_SLOT = 3
EXERCISES_CRC_SLOT = 5


def crc_slot_value(*payloads) -> int:
    """The CRC-32 (zlib.crc32) of the payloads back to back, as the int32 a header slot holds
    (arrays and memoryviews are read in place, not copied)."""
    c = 0
    for p in payloads:
        c = zlib.crc32(p if isinstance(p, (bytes, memoryview)) else np.ascontiguousarray(p).data, c)
    return int(np.array([c], dtype="<u4").view("<i4")[0])


def _header(magic: int, version: int, ntok: int, *extra: int) -> np.ndarray:
    h = np.zeros(HEADER_INTS, dtype="<i4")
    h[0], h[1], h[2] = magic, version, ntok
    for i, v in enumerate(extra):
        h[3 + i] = v
    return h


def _write_atomic(path: Path, header: np.ndarray, *payloads) -> None:
    """Writes header+payloads to path.tmp and renames it, so readers never see half a file."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(header.tobytes())
        for p in payloads:
            f.write(p if isinstance(p, bytes) else p.tobytes())
    os.replace(tmp, path)


def shard_version_for_vocab(vocab_size: int) -> int:
    """uint16 tokens when every id fits, else uint32."""
    return SHARD_VERSION_U16 if vocab_size <= 65536 else SHARD_VERSION_U32


def write_shard(path, tokens, version: int | None = None, tokenizer: int | None = None) -> None:
    """Writes one token shard. version None picks uint16 when every token fits; `tokenizer`: the
    fingerprint of the tokenizer that made the tokens (tokenizer.tokenizer_fingerprint), which
    the trainer compares with its --tokenizer (None: not recorded)."""
    toks = np.asarray(tokens)
    if toks.ndim != 1:
        raise ValueError("tokens must be one-dimensional")
    if toks.size and (toks.min() < 0):
        raise ValueError("negative token id")
    maxtok = int(toks.max()) if toks.size else 0
    if version is None:
        version = SHARD_VERSION_U16 if maxtok < 65536 else SHARD_VERSION_U32
    if version == SHARD_VERSION_U16:
        if maxtok >= 65536:
            raise ValueError(f"token id {maxtok} does not fit a uint16 shard (version 1)")
        payload = toks.astype("<u2")
    elif version == SHARD_VERSION_U32:
        if maxtok >= 2**32:
            raise ValueError(f"token id {maxtok} does not fit uint32")
        payload = toks.astype("<u4")
    else:
        raise ValueError(f"unknown shard version {version}")
    recorded = (tokenizer, 1) if tokenizer is not None else (0, 0)
    _write_atomic(Path(path), _header(SHARD_MAGIC, version, toks.size, crc_slot_value(payload), 1, *recorded), payload)


def write_regions(path, regions) -> None:
    """Writes one region sidecar (path should be regions_path(shard))."""
    r = np.asarray(regions)
    if r.ndim != 1:
        raise ValueError("regions must be one-dimensional")
    if r.size and (r.min() < 0 or r.max() > ANSWER):
        raise ValueError("region labels must be in 0..3")
    labels = r.astype(np.uint8)
    _write_atomic(Path(path), _header(REGIONS_MAGIC, REGIONS_VERSION, r.size, crc_slot_value(labels), 1), labels)


def _check_exercise_names(names) -> bytes:
    """The name table as bytes; checks that name 0 is "none" and names are unique, non-empty, NUL-free."""
    names = list(names)
    if not names or names[0] != EXERCISE_NONE:
        raise ValueError(f"exercise name 0 must be {EXERCISE_NONE!r} (got {names[:1]})")
    if len(names) > MAX_EXERCISES:
        raise ValueError(f"{len(names)} exercise names, more than the {MAX_EXERCISES} a uint8 id can index")
    if len(set(names)) != len(names):
        raise ValueError(f"exercise names repeat: {names}")
    for n in names:
        if not n or "\0" in n:
            raise ValueError(f"bad exercise name {n!r} (empty or with a NUL)")
    return b"".join(n.encode("utf-8") + b"\0" for n in names)


def write_exercises(path, ids, names) -> None:
    """Writes one exercise sidecar (path should be exercises_path(shard)): ids index names."""
    table = _check_exercise_names(names)
    e = np.asarray(ids)
    if e.ndim != 1:
        raise ValueError("exercise ids must be one-dimensional")
    if e.size and (e.min() < 0 or e.max() >= len(names)):
        raise ValueError(f"exercise ids must be in 0..{len(names) - 1}")
    ids = e.astype(np.uint8)
    h = _header(EXERCISES_MAGIC, EXERCISES_VERSION, e.size, len(names), len(table), crc_slot_value(table, ids), 1)
    _write_atomic(Path(path), h, table, ids)


def _read_header(path: Path, data: bytes, magic: int, versions: tuple, fields: int) -> np.ndarray:
    """The header, checked: magic, version, token count, and the slots from `fields` on are 0."""
    if len(data) < HEADER_BYTES:
        raise ValueError(f"{path}: file is truncated: {len(data)} bytes, less than the {HEADER_BYTES}-byte header")
    h = np.frombuffer(data[:HEADER_BYTES], dtype="<i4")
    if h[0] != magic:
        raise ValueError(f"{path}: bad magic number {h[0]} (expected {magic})")
    if h[1] not in versions:
        raise ValueError(f"{path}: unsupported version {h[1]} (expected one of {versions})")
    if h[2] < 0:
        raise ValueError(f"{path}: negative token count {h[2]}")
    nonzero = np.flatnonzero(h[fields:])
    if nonzero.size:
        k = fields + int(nonzero[0])
        raise ValueError(f"{path}: header int [{k}] is {h[k]}, must be 0 (corrupt header)")
    return h


_NOTED_UNCHECKED: set[str] = set()


def _check_crc(path: Path, what: str, header: np.ndarray, slot: int, body) -> None:
    """A header's CRC slot against the data; the slot after it is its flag (module docstring)."""
    stored, flag = int(header[slot]), int(header[slot + 1])
    if flag not in (0, 1):
        raise ValueError(f"{path}: header int [{slot + 1}] (checksum flag) is {flag}, must be 0 or 1 (corrupt header)")
    if flag == 0 and stored == 0:
        if str(path) not in _NOTED_UNCHECKED:
            _NOTED_UNCHECKED.add(str(path))
            sys.stderr.write(f"note: {path} carries no checksum (written before there were any, or by llm.c): "
                             f"its {what} are not verified\n")
        return
    computed = crc_slot_value(body)
    if computed != stored:
        raise ValueError(f"{path}: checksum mismatch in the {what}: stored CRC32 {stored & 0xFFFFFFFF:08x}, "
                         f"computed {computed & 0xFFFFFFFF:08x} (the file is corrupt)")


def tokenizer_record(path, header, slot: int) -> int | None:
    """The tokenizer fingerprint a header records at `slot` (its flag after it), or None for a
    file from before the field (both 0)."""
    value, flag = int(header[slot]), int(header[slot + 1])
    if flag not in (0, 1):
        raise ValueError(f"{path}: header int [{slot + 1}] (tokenizer flag) is {flag}, must be 0 or 1 (corrupt header)")
    if flag == 0 and value != 0:
        raise ValueError(f"{path}: header int [{slot}] is {value} with no tokenizer recorded ([{slot + 1}] 0): must be 0 "
                         f"(corrupt header)")
    return value if flag else None


def shard_tokenizer(path) -> int | None:
    """The fingerprint of the tokenizer a shard records (header only), or None."""
    path = Path(path)
    with open(path, "rb") as f:
        data = f.read(HEADER_BYTES)
    h = _read_header(path, data, SHARD_MAGIC, (SHARD_VERSION_U16, SHARD_VERSION_U32), SHARD_TOKENIZER_SLOT + 2)
    return tokenizer_record(path, h, SHARD_TOKENIZER_SLOT)


def read_shard(path) -> np.ndarray:
    """Reads a token shard, checking magic, version and size; returns uint16 or uint32 array."""
    path = Path(path)
    data = path.read_bytes()
    h = _read_header(path, data, SHARD_MAGIC, (SHARD_VERSION_U16, SHARD_VERSION_U32), SHARD_TOKENIZER_SLOT + 2)
    tokenizer_record(path, h, SHARD_TOKENIZER_SLOT)
    dtype = "<u2" if h[1] == SHARD_VERSION_U16 else "<u4"
    width = np.dtype(dtype).itemsize
    expect = HEADER_BYTES + int(h[2]) * width
    if len(data) != expect:
        raise ValueError(f"{path}: size {len(data)} bytes but the header says {h[2]} tokens ({expect} bytes)")
    _check_crc(path, "tokens", h, SHARD_CRC_SLOT, memoryview(data)[HEADER_BYTES:])
    return np.frombuffer(data[HEADER_BYTES:], dtype=dtype)


def read_regions(path) -> np.ndarray:
    path = Path(path)
    data = path.read_bytes()
    h = _read_header(path, data, REGIONS_MAGIC, (REGIONS_VERSION,), REGIONS_CRC_SLOT + 2)
    expect = HEADER_BYTES + int(h[2])
    if len(data) != expect:
        raise ValueError(f"{path}: size {len(data)} bytes but the header says {h[2]} labels ({expect} bytes)")
    _check_crc(path, "region labels", h, REGIONS_CRC_SLOT, memoryview(data)[HEADER_BYTES:])
    return np.frombuffer(data[HEADER_BYTES:], dtype=np.uint8)


def read_exercises(path) -> tuple[np.ndarray, list[str]]:
    """Reads an exercise sidecar: (uint8 id per token, names), checking header, table and sizes."""
    path = Path(path)
    data = path.read_bytes()
    h = _read_header(path, data, EXERCISES_MAGIC, (EXERCISES_VERSION,), EXERCISES_CRC_SLOT + 2)
    k, nbytes = int(h[3]), int(h[4])
    if not 1 <= k <= MAX_EXERCISES or nbytes < 0:
        raise ValueError(f"{path}: bad name table: {k} names in {nbytes} bytes")
    expect = HEADER_BYTES + nbytes + int(h[2])
    if len(data) != expect:
        raise ValueError(f"{path}: size {len(data)} bytes but the header says {expect}")
    _check_crc(path, "exercise names and ids", h, EXERCISES_CRC_SLOT, memoryview(data)[HEADER_BYTES:])
    raw = data[HEADER_BYTES:HEADER_BYTES + nbytes]
    if not raw.endswith(b"\0") or raw.count(b"\0") != k:
        raise ValueError(f"{path}: the name table does not hold {k} NUL-ended names")
    names = [n.decode("utf-8") for n in raw[:-1].split(b"\0")]
    _check_exercise_names(names)
    ids = np.frombuffer(data[HEADER_BYTES + nbytes:], dtype=np.uint8)
    if ids.size and ids.max() >= k:
        raise ValueError(f"{path}: exercise id {ids.max()} outside the table of {k} names")
    return ids, names


class ShardWriter:
    """Packs documents into fixed-size shards <outdir>/<prefix>_<split>_<i:06d>.bin.

    with_regions: also write a .regions sidecar per shard (every document must then come
    with labels). with_exercises: also write a .exercises sidecar per shard (every document
    must then name its exercise); each shard's table holds the names seen so far, in order of
    first appearance after "none", so a name keeps its id in all later shards.
    vocab_size picks the token width (uint16 up to 65536 ids); tokenizer: the fingerprint every
    shard records (write_shard).
    """

    def __init__(self, outdir, prefix: str, split: str, shard_tokens: int, vocab_size: int,
                 with_regions: bool = False, with_exercises: bool = False, tokenizer: int | None = None):
        if split not in ("train", "val"):
            raise ValueError("split must be 'train' or 'val'")
        self.outdir = Path(outdir)
        self.outdir.mkdir(parents=True, exist_ok=True)
        self.prefix, self.split = prefix, split
        self.shard_tokens = int(shard_tokens)
        self.version = shard_version_for_vocab(vocab_size)
        self.vocab_size = vocab_size
        self.tokenizer = tokenizer
        self.with_regions = with_regions
        self.dtype = np.uint16 if self.version == SHARD_VERSION_U16 else np.uint32
        self.buf = np.empty(self.shard_tokens, dtype=self.dtype)
        self.rbuf = np.empty(self.shard_tokens, dtype=np.uint8) if with_regions else None
        self.with_exercises = with_exercises
        self.ebuf = np.empty(self.shard_tokens, dtype=np.uint8) if with_exercises else None
        self.exercise_names = [EXERCISE_NONE]
        self.exercise_docs: dict[str, int] = {}  # documents per exercise
        self.fill = 0
        self.index = 0
        self.paths: list[Path] = []
        self.total_tokens = 0
        self.total_docs = 0

    def exercise_id(self, name: str) -> int:
        """The id of an exercise name, added to the table on first use."""
        if not name or name == EXERCISE_NONE:
            raise ValueError(f"a document's exercise must be a name other than {EXERCISE_NONE!r} (got {name!r})")
        if name not in self.exercise_names:
            _check_exercise_names(self.exercise_names + [name])
            self.exercise_names.append(name)
        return self.exercise_names.index(name)

    def add(self, tokens, regions=None, exercise: str | None = None) -> None:
        toks = np.asarray(tokens)
        if toks.size and (toks.min() < 0 or toks.max() >= self.vocab_size):
            raise ValueError(f"token id out of range 0..{self.vocab_size - 1}")
        if self.with_regions:
            if regions is None or len(regions) != len(toks):
                raise ValueError("with_regions: each document needs one region label per token")
            regs = np.asarray(regions, dtype=np.uint8)
        if self.with_exercises:
            if exercise is None:
                raise ValueError("with_exercises: each document needs its exercise name")
            ex = self.exercise_id(exercise)
            self.exercise_docs[exercise] = self.exercise_docs.get(exercise, 0) + 1
        pos = 0
        n = len(toks)
        while pos < n:
            take = min(n - pos, self.shard_tokens - self.fill)
            self.buf[self.fill:self.fill + take] = toks[pos:pos + take]
            if self.with_regions:
                self.rbuf[self.fill:self.fill + take] = regs[pos:pos + take]
            if self.with_exercises:
                self.ebuf[self.fill:self.fill + take] = ex
            self.fill += take
            pos += take
            if self.fill == self.shard_tokens:
                self._flush()
        self.total_tokens += n
        self.total_docs += 1

    def _flush(self) -> None:
        if self.fill == 0:
            return
        path = self.outdir / f"{self.prefix}_{self.split}_{self.index:06d}.bin"
        write_shard(path, self.buf[:self.fill], version=self.version, tokenizer=self.tokenizer)
        if self.with_regions:
            write_regions(regions_path(path), self.rbuf[:self.fill])
        if self.with_exercises:
            write_exercises(exercises_path(path), self.ebuf[:self.fill], self.exercise_names)
        self.paths.append(path)
        self.index += 1
        self.fill = 0

    def close(self) -> list[Path]:
        self._flush()
        return self.paths
