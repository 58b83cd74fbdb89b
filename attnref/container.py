"""
The tensor container of both references' checkpoints and debug states (layout: doc/formats.md
"Model checkpoints"): header, config text, tensor table, then the tensors, 64-byte aligned,
with CRC-32s from version 2 (version 1 still reads, with a note). Also the config text <->
dataclass helpers, the checkpoint save and the parameter load.
"""

import math
import os
import struct
import sys
import zlib
from dataclasses import fields

import numpy as np
import torch

# -----------------------------------------------------------------------------------------
# Config text ("key=value" lines, see doc/formats.md)

def format_meta_value(v):
    if isinstance(v, bool):
        return "1" if v else "0"
    if isinstance(v, float):
        return repr(v)            # shortest text that parses back to the same double
    return str(v)


def parse_meta_value(text, typ, what):
    try:
        if typ in (bool, "bool"):
            if text not in ("0", "1"):
                raise ValueError
            return text == "1"
        if typ in (int, "int"):
            return int(text)
        if typ in (float, "float"):
            return float(text)
        return text
    except ValueError:
        raise ValueError(f"{what}: cannot parse {text!r} as {getattr(typ, '__name__', typ)}") from None


# Presets: the paper's arms (d512, 8 query / 4 kv heads, vocab 16384, T 2048) and tiny ones.
# iso-depth: same L with FFN; iso-param: L/5... -> 4 layers (one SwiGLU block has 4x the


def config_to_meta(model_name, cfg):
    """[(key, text)] of a model config: which trainer it belongs to (model=san|gpt2), every
    field, then the derived padded_vocab_size and head_dim (checked on load)."""
    out = [("model", model_name)]
    out += [(f.name, format_meta_value(getattr(cfg, f.name))) for f in fields(cfg)]
    out += [("padded_vocab_size", str(cfg.padded_vocab_size)), ("head_dim", str(cfg.head_dim))]
    return out


def config_from_meta(cls, meta, source):
    """The config dataclass `cls` from its meta keys; a missing key, a bad value or derived
    keys that disagree with the config raise a ValueError naming `source`."""
    kw = {}
    for f in fields(cls):
        if f.name not in meta:
            raise ValueError(f"{source}: config key '{f.name}' missing")
        kw[f.name] = parse_meta_value(meta[f.name], f.type, f"{source}: key '{f.name}'")
    cfg = cls(**kw)
    for key, val in (("padded_vocab_size", cfg.padded_vocab_size), ("head_dim", cfg.head_dim)):
        if key in meta and int(meta[key]) != val:
            raise ValueError(f"{source}: {key}={meta[key]} does not match the config ({val})")
    return cfg


# -----------------------------------------------------------------------------------------
# File container

FILE_MAGIC = b"ATTNFILE"
FILE_VERSION = 2          # what write_container writes: with CRC-32s (doc/formats.md)
FILE_VERSION_NO_CRC = 1   # still read: the same layout without them
HEADER_CRC_AT = 48        # u32 in the header
ENTRY_CRC_AT = 120        # u32 in each table entry
KIND_CHECKPOINT = 1
KIND_DEBUG_STATE = 2
KIND_NAMES = {KIND_CHECKPOINT: "checkpoint", KIND_DEBUG_STATE: "debug state"}
HEADER_BYTES = 64
ENTRY_BYTES = 128
NAME_BYTES = 64
MAX_NDIM = 4
ALIGN = 64
DT_FP32, DT_BF16, DT_INT32 = 0, 1, 2
DTYPE_ITEMSIZE = {DT_FP32: 4, DT_BF16: 2, DT_INT32: 4}
DTYPE_NAMES = {"fp32": DT_FP32, "bf16": DT_BF16, "int32": DT_INT32}


def _align(n):
    return (n + ALIGN - 1) // ALIGN * ALIGN


def header_crc(header, rest):
    """The CRC a version-2 header holds: over the 64 header bytes but the CRC field itself,
    then `rest`, the bytes between the header and the data (config text, tensor table, padding)."""
    c = zlib.crc32(header[:HEADER_CRC_AT])
    c = zlib.crc32(header[HEADER_CRC_AT + 4:HEADER_BYTES], c)
    return zlib.crc32(rest, c)


def fp32_to_bf16_bits(a):
    """fp32 array -> uint16 bf16 bits, round to nearest even (NaN kept quiet)."""
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    nan = np.isnan(a)
    rounded[nan] = ((u[nan] >> 16) | 0x40).astype(np.uint16)
    return rounded


def bf16_bits_to_fp32(b):
    return (b.astype(np.uint32) << 16).view(np.float32)


def _to_numpy(t):
    if isinstance(t, torch.Tensor):
        t = t.detach().cpu()
        if t.dtype in (torch.float64, torch.float16, torch.bfloat16):
            t = t.float()
        return t.numpy()
    return np.asarray(t)


def write_container(path, kind, meta, tensors):
    """meta: [(key, value-text)]; tensors: [(name, array-like, dtype-name)] with dtype-name
    in fp32 | bf16 | int32. Written atomically (path.tmp, then rename)."""
    text = "".join(f"{k}={v}\n" for k, v in meta).encode("ascii")
    for k, v in meta:
        if "=" in k or "\n" in k or "\n" in str(v) or not k:
            raise ValueError(f"bad meta entry {k!r}={v!r}")
    entries, blobs, offset = [], [], 0
    names = set()
    for name, arr, dt in tensors:
        code = DTYPE_NAMES[dt]
        a = _to_numpy(arr)
        if code == DT_FP32:
            data = np.ascontiguousarray(a, dtype="<f4")
        elif code == DT_INT32:
            if a.size and (a.min() < -2**31 or a.max() >= 2**31):
                raise ValueError(f"tensor {name} does not fit int32")
            data = np.ascontiguousarray(a, dtype="<i4")
        else:
            data = fp32_to_bf16_bits(np.asarray(a, dtype=np.float32)).astype("<u2")
        nb = name.encode("ascii")
        if len(nb) >= NAME_BYTES or name in names:
            raise ValueError(f"tensor name {name!r} too long or repeated")
        if data.ndim > MAX_NDIM:
            raise ValueError(f"tensor {name} has {data.ndim} dims (max {MAX_NDIM})")
        names.add(name)
        shape = list(data.shape) + [0] * (MAX_NDIM - data.ndim)
        blob = data.tobytes()
        entries.append(struct.pack("<64sII4QQQI4x", nb, code, data.ndim, *shape, offset, data.nbytes,
                                   zlib.crc32(blob)))
        blobs.append((offset, blob))
        offset = _align(offset + data.nbytes)
    data_offset = _align(HEADER_BYTES + len(text) + ENTRY_BYTES * len(entries))
    data_bytes = offset
    rest = text + b"".join(entries)
    rest += b"\0" * (data_offset - HEADER_BYTES - len(rest))
    header = struct.pack("<8sIIQQQQ16x", FILE_MAGIC, FILE_VERSION, kind, len(text), len(entries),
                         data_offset, data_bytes)
    header = header[:HEADER_CRC_AT] + struct.pack("<I", header_crc(header, rest)) + header[HEADER_CRC_AT + 4:]
    assert len(header) == HEADER_BYTES and all(len(e) == ENTRY_BYTES for e in entries)
    tmp = str(path) + ".tmp"
    with open(tmp, "wb") as f:
        f.write(header)
        f.write(rest)
        for off, blob in blobs:
            f.write(b"\0" * (data_offset + off - f.tell()))
            f.write(blob)
        f.write(b"\0" * (data_offset + data_bytes - f.tell()))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class ContainerError(ValueError):
    pass


def read_container(path, expect_kind=None):
    """Returns (kind, meta dict, {name: numpy array}) with tensors in file order; bf16 is
    returned as float32. Every check failure names the file and what is wrong."""
    def fail(msg):
        raise ContainerError(f"{path}: {msg}")
    try:
        with open(path, "rb") as f:
            buf = f.read()
    except OSError as e:
        raise ContainerError(f"{path}: cannot read ({e.strerror})") from None
    if len(buf) < HEADER_BYTES:
        fail(f"file is {len(buf)} bytes, shorter than the {HEADER_BYTES}-byte header")
    magic, version, kind, meta_bytes, n_tensors, data_offset, data_bytes = \
        struct.unpack_from("<8sIIQQQQ", buf, 0)
    if magic != FILE_MAGIC:
        fail(f"bad magic {magic!r}, expected {FILE_MAGIC!r} (not an attn.c checkpoint/debug state)")
    if version not in (FILE_VERSION, FILE_VERSION_NO_CRC):
        fail(f"unsupported version {version}, this reader knows versions {FILE_VERSION_NO_CRC} and {FILE_VERSION}")
    checksums = version == FILE_VERSION
    if kind not in KIND_NAMES:
        fail(f"unknown kind {kind}")
    if expect_kind is not None and kind != expect_kind:
        fail(f"is a {KIND_NAMES[kind]}, expected a {KIND_NAMES[expect_kind]}")
    table_end = HEADER_BYTES + meta_bytes + ENTRY_BYTES * n_tensors
    if data_offset % ALIGN or data_offset < table_end:
        fail(f"data offset {data_offset} is not a multiple of {ALIGN} at or after the table end {table_end}")
    if len(buf) != data_offset + data_bytes:
        fail(f"size is {len(buf)} bytes, header says {data_offset + data_bytes}")
    # reserved bytes are zero (version 2: those after the CRC), so a version-2 file whose
    # version turned into 1 is refused rather than read unchecked
    reserved = buf[HEADER_CRC_AT + 4 if checksums else HEADER_CRC_AT:HEADER_BYTES]
    if any(reserved):
        fail("reserved header bytes 48..63 are not zero (corrupt header)")
    if checksums:
        stored, = struct.unpack_from("<I", buf, HEADER_CRC_AT)
        computed = header_crc(buf[:HEADER_BYTES], buf[HEADER_BYTES:data_offset])
        if stored != computed:
            fail(f"checksum mismatch in the header, config text or tensor table: stored CRC32 {stored:08x}, "
                 f"computed {computed:08x} (the file is corrupt)")
    try:
        text = buf[HEADER_BYTES:HEADER_BYTES + meta_bytes].decode("ascii")
    except UnicodeDecodeError:
        fail("config text is not ASCII")
    meta = {}
    for line in text.split("\n")[:-1] if text else []:
        key, sep, val = line.partition("=")
        if not sep or not key:
            fail(f"config line {line!r} is not key=value")
        if key in meta:
            fail(f"config key {key!r} repeated")
        meta[key] = val
    if text and not text.endswith("\n"):
        fail("config text does not end with a newline")
    tensors = {}
    cursor = 0  # version 2: where the next tensor must start
    for i in range(n_tensors):
        e = struct.unpack_from("<64sII4QQQII", buf, HEADER_BYTES + meta_bytes + i * ENTRY_BYTES)
        raw_name, code, ndim, shape, offset, nbytes, crc, spare = e[0], e[1], e[2], e[3:7], e[7], e[8], e[9], e[10]
        name = raw_name.split(b"\0", 1)[0].decode("ascii", "replace")
        if b"\0" not in raw_name or not name:
            fail(f"tensor {i}: name is empty or not NUL-terminated")
        if code not in DTYPE_ITEMSIZE:
            fail(f"tensor {name}: unknown dtype code {code}")
        if ndim > MAX_NDIM or any(shape[ndim:]):
            fail(f"tensor {name}: bad ndim {ndim} / shape {shape}")
        shp = tuple(int(s) for s in shape[:ndim])
        if nbytes != math.prod(shp) * DTYPE_ITEMSIZE[code]:
            fail(f"tensor {name}: {nbytes} bytes does not match shape {shp}")
        if offset % ALIGN or offset + nbytes > data_bytes:
            fail(f"tensor {name}: offset {offset} (+{nbytes}) outside the data section ({data_bytes} bytes)")
        if spare or (crc and not checksums):
            fail(f"tensor {name}: reserved bytes of its table entry are not zero")
        if name in tensors:
            fail(f"tensor {name} repeated")
        start = data_offset + offset
        if checksums:
            if offset != cursor:
                fail(f"tensor {name}: data at {offset}, expected {cursor} (tensors follow each other in table order)")
            computed = zlib.crc32(memoryview(buf)[start:start + nbytes])
            if crc != computed:
                fail(f"tensor {name}: checksum mismatch: stored CRC32 {crc:08x}, computed {computed:08x} "
                     f"(its data are corrupt)")
            cursor = _align(offset + nbytes)
            if any(buf[start + nbytes:data_offset + min(cursor, data_bytes)]):
                fail(f"nonzero padding after the data of tensor {name} (corrupt file)")
        np_dt = {DT_FP32: "<f4", DT_BF16: "<u2", DT_INT32: "<i4"}[code]
        a = np.frombuffer(buf, dtype=np_dt, count=math.prod(shp), offset=start).reshape(shp).copy()
        tensors[name] = bf16_bits_to_fp32(a) if code == DT_BF16 else a
    if checksums and cursor != data_bytes:
        fail(f"the data section has {data_bytes} bytes, its tensors end at {cursor} (corrupt file)")
    if not checksums:
        print(f"note: {path} is an attn.c tensor file of version 1, without checksums: its contents are not "
              f"verified (files written now are version 2)", file=sys.stderr)
    return kind, meta, tensors


# -----------------------------------------------------------------------------------------
# Model parameters in and out of the container (both models have cfg and ordered_parameters)

def param_tensors(model):
    """[(name, parameter, "fp32")] in canonical order, as write_container takes them."""
    return [(n, p, "fp32") for n, p in model.ordered_parameters()]


def load_params_into(model, tensors, source):
    """Copy every canonical parameter from tensors (checks presence and shape)."""
    with torch.no_grad():
        for n, p in model.ordered_parameters():
            if n not in tensors:
                raise ContainerError(f"{source}: parameter '{n}' missing")
            a = np.asarray(tensors[n], dtype=np.float32)
            if tuple(a.shape) != tuple(p.shape):
                raise ContainerError(f"{source}: parameter '{n}' has shape {tuple(a.shape)}, "
                                     f"expected {tuple(p.shape)}")
            p.copy_(torch.from_numpy(a))


def save_checkpoint(path, model, step=0, optimizer=None):
    """A checkpoint of either model: its config, the step, the parameters and, when an
    optimizer is given, its settings and state (restore with load_state_tensors)."""
    meta = model.cfg.to_meta() + [("step", str(step)), ("has_optimizer", "1" if optimizer else "0")]
    # model state that is not a parameter (train_san's rndembqk / fixedseqqk fixed input)
    tensors = param_tensors(model) + (model.state_tensors() if hasattr(model, "state_tensors") else [])
    if optimizer is not None:
        meta += optimizer.oc.to_meta()
        tensors += [(n, t, "fp32") for n, t in optimizer.state_tensors().items()]
    write_container(path, KIND_CHECKPOINT, meta, tensors)

