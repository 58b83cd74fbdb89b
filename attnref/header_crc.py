"""The CRC that the tokenizer and eval-set files (version 2) keep in one int of their 256-int
header (llmc/data/crc32.h crc32_without_slot), and the header checks their readers share."""
from __future__ import annotations

import sys
import zlib


def file_crc(data, slot: int) -> int:
    """The CRC-32 (zlib.crc32) of a file's bytes but the four of header int `slot`, which holds it."""
    view = memoryview(data)
    return zlib.crc32(view[4 * slot + 4:], zlib.crc32(view[:4 * slot]))


def check_header_crc(path, data, header: list[int], slot: int, checksummed: bool, what: str, writer: str,
                     fields_after: int = 0) -> None:
    """Checks a header read from `data`: the ints past the fields (and past the CRC slot and the
    `fields_after` it, when the version has one) are 0, and a checksummed file's CRC matches; a
    version without one is read with a note that names `what` and the `writer` that writes the
    checksummed version."""
    tail = slot + 1 + fields_after if checksummed else slot
    if any(header[tail:]):
        raise ValueError(f"{path}: header ints [{tail}..255] are not all 0 (corrupt header)")
    if checksummed:
        stored, computed = header[slot] & 0xFFFFFFFF, file_crc(data, slot)
        if stored != computed:
            raise ValueError(f"{path}: checksum mismatch: stored CRC32 {stored:08x}, computed {computed:08x} "
                             f"(the file is corrupt)")
    else:
        sys.stderr.write(f"note: {what} {path} is of version 1, without a checksum: its contents are not "
                         f"verified ({writer} writes version 2)\n")
