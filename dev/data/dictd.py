"""
Reads dictd databases (the format of Debian's dict-* packages: <name>.index + <name>.dict.dz)
into entries, one per definition block.

  <name>.index    one line per headword: "headword<TAB>offset<TAB>length", offset and length
                  in dictd's base64 (digits A-Za-z0-9+/, most significant first), counting
                  bytes of the uncompressed .dict; several headwords may point at one block.
  <name>.dict.dz  the blocks back to back, gzip-compressed (dictzip adds a random-access
                  table in a gzip extra field, which plain gzip decompression ignores);
                  a plain <name>.dict is read as well.

Headwords starting with "00-database-" (or "00database") are the database's own
metadata (licence, URL) and are left out. The whole file is decompressed at once
(GCIDE: 40 MB), which is faster than dictzip's chunked access when every block is read.
"""
from __future__ import annotations

import gzip
import os
from dataclasses import dataclass, field

B64_DIGITS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
_B64_VALUE = {c: i for i, c in enumerate(B64_DIGITS)}
DEFAULT_DIR = "/usr/share/dictd"


def b64_decode_number(text: str) -> int:
    """dictd's base64 number ("B" = 1, "BA" = 64)."""
    if not text:
        raise ValueError("empty base64 number")
    value = 0
    for c in text:
        if c not in _B64_VALUE:
            raise ValueError(f"{text!r} is not a dictd base64 number (bad digit {c!r})")
        value = value * 64 + _B64_VALUE[c]
    return value


def b64_encode_number(value: int) -> str:
    """The inverse of b64_decode_number (for writing fixtures)."""
    if value < 0:
        raise ValueError("negative offset")
    digits = ""
    while True:
        digits = B64_DIGITS[value % 64] + digits
        value //= 64
        if value == 0:
            return digits


@dataclass
class Entry:
    """One definition block: its headwords (in index order) and its text."""
    source: str
    offset: int
    headwords: list[str] = field(default_factory=list)
    text: str = ""


def is_metadata(headword: str) -> bool:
    return headword.startswith("00-database-") or headword.startswith("00database")


def decode_block(raw: bytes) -> str:
    """UTF-8, or Windows-1252 for the few blocks of older databases that are not."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return raw.decode("cp1252", errors="replace")


def database_paths(directory: str, name: str) -> tuple[str, str]:
    """(index path, dict path) of database name in directory; a clear error when missing."""
    index = os.path.join(directory, name + ".index")
    for suffix in (".dict.dz", ".dict"):
        data = os.path.join(directory, name + suffix)
        if os.path.exists(data):
            break
    else:
        raise FileNotFoundError(f"{directory}: no {name}.dict.dz or {name}.dict (install the Debian package "
                                f"dict-{name}: bash scripts/setup.sh does)")
    if not os.path.exists(index):
        raise FileNotFoundError(f"{index}: missing (the index of {data})")
    return index, data


def read_database(directory: str, name: str) -> list[Entry]:
    """The entries of database name, in the order of their first headword in the index."""
    index_path, data_path = database_paths(directory, name)
    opener = gzip.open if data_path.endswith(".dz") else open
    with opener(data_path, "rb") as f:
        data = f.read()
    blocks: dict[tuple[int, int], Entry] = {}
    with open(index_path, "rb") as f:
        for lineno, line in enumerate(f, 1):
            parts = line.rstrip(b"\r\n").decode("utf-8", errors="replace").split("\t")
            if len(parts) < 3:
                raise ValueError(f"{index_path}:{lineno}: expected 'headword<TAB>offset<TAB>length'")
            headword = parts[0]
            try:
                offset, length = b64_decode_number(parts[1]), b64_decode_number(parts[2])
            except ValueError as e:
                raise ValueError(f"{index_path}:{lineno}: {e}") from None
            if offset + length > len(data):
                raise ValueError(f"{index_path}:{lineno}: block {offset}+{length} runs past the end of "
                                 f"{data_path} ({len(data)} bytes uncompressed)")
            if is_metadata(headword):
                continue
            entry = blocks.get((offset, length))
            if entry is None:
                entry = blocks[(offset, length)] = Entry(name, offset, text=decode_block(data[offset:offset + length]))
            if headword not in entry.headwords:
                entry.headwords.append(headword)
    return list(blocks.values())
