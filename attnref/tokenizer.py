"""
Tokenizers for the data pipeline behind one small interface (encode, decode, special ids):
SentencePiece BPE as in the SAN paper (train_sentencepiece; CLI: dev/data/train_tokenizer.py)
and GPT-2 BPE through tiktoken; and the export of either to the tokenizer .bin that
llmc/data/tokenizer.h reads (doc/formats.md "Tokenizer", settings and special ids there).
"""
from __future__ import annotations

import os
import struct
import zlib
from pathlib import Path

import numpy as np

from attnref.header_crc import check_header_crc, file_crc

SPECIALS = ["<|im_start|>", "<|im_end|>", "<think>", "</think>"]  # ids 4, 5, 6, 7
PAD_ID, EOS_ID, BOS_ID, UNK_ID = 0, 1, 2, 3
IM_START_ID, IM_END_ID, THINK_ID, END_THINK_ID = 4, 5, 6, 7

TOKENIZER_MAGIC = 20260312
TOKENIZER_VERSION = 2         # written: header int [9] is the CRC-32 of the whole file but that int
TOKENIZER_VERSION_NO_CRC = 1  # still read, with a note
TOKENIZER_CRC_SLOT = 9
KIND_SENTENCEPIECE, KIND_TIKTOKEN = 1, 2
# piece types in the .bin
T_NORMAL, T_CONTROL, T_BYTE, T_USER, T_UNKNOWN, T_UNUSED = 0, 1, 2, 3, 4, 5
SP_SPACE = "\u2581"  # the SentencePiece space marker "▁"
SP_UNK_TEXT = " \u2047 "  # what SentencePiece's decoder prints for <unk>


def train_sentencepiece(sentences, model_prefix, vocab_size: int = 16384, num_threads: int | None = None,
                        input_sentence_size: int = 2_000_000, seed_sentencepiece_size: int = 1_000_000,
                        hard_vocab_limit: bool = True, quiet: bool = True) -> "SPTokenizer":
    """Trains the paper's tokenizer on an iterable of text lines; writes <prefix>.model/.vocab.

    Lines are SentencePiece's "sentences": newlines are never inside a piece, they encode
    through byte fallback as <0x0A>.
    """
    import sentencepiece as spm
    model_prefix = str(model_prefix)
    Path(model_prefix).parent.mkdir(parents=True, exist_ok=True)
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(sentences),
        model_prefix=model_prefix,
        model_type="bpe",
        vocab_size=vocab_size,
        byte_fallback=True,
        normalization_rule_name="identity",
        remove_extra_whitespaces=False,
        add_dummy_prefix=False,
        split_digits=False,
        allow_whitespace_only_pieces=True,
        character_coverage=0.9995,
        pad_id=PAD_ID, eos_id=EOS_ID, bos_id=BOS_ID, unk_id=UNK_ID,
        pad_piece="<pad>", eos_piece="</s>", bos_piece="<s>", unk_piece="<unk>",
        user_defined_symbols=SPECIALS,
        input_sentence_size=input_sentence_size,
        seed_sentencepiece_size=seed_sentencepiece_size,
        shuffle_input_sentence=True,
        hard_vocab_limit=hard_vocab_limit,
        num_threads=num_threads or os.cpu_count() or 1,
        minloglevel=2 if quiet else 0,
    )
    tok = SPTokenizer(model_prefix + ".model")
    tok.check_specials()
    return tok


class SPTokenizer:
    kind = KIND_SENTENCEPIECE

    def __init__(self, model_file):
        import sentencepiece as spm
        self.model_file = str(model_file)
        self.sp = spm.SentencePieceProcessor(model_file=self.model_file)
        self.vocab_size = self.sp.get_piece_size()
        self.bos_id, self.eos_id = self.sp.bos_id(), self.sp.eos_id()
        self.pad_id, self.unk_id = self.sp.pad_id(), self.sp.unk_id()

    def check_specials(self) -> None:
        """Fails unless the ids are the paper's: pad 0, eos 1, bos 2, unk 3, markers 4..7."""
        got = (self.pad_id, self.eos_id, self.bos_id, self.unk_id)
        if got != (PAD_ID, EOS_ID, BOS_ID, UNK_ID):
            raise ValueError(f"{self.model_file}: special ids (pad, eos, bos, unk) are {got}")
        for i, s in enumerate(SPECIALS):
            if self.sp.piece_to_id(s) != 4 + i:
                raise ValueError(f"{self.model_file}: {s} has id {self.sp.piece_to_id(s)}, expected {4 + i}")

    def encode(self, text: str) -> list[int]:
        return self.sp.encode(text)

    def encode_batch(self, texts: list[str], num_threads: int = 1) -> list[list[int]]:
        return self.sp.encode(texts, num_threads=num_threads)

    def decode(self, ids) -> str:
        return self.sp.decode([int(i) for i in ids])

    def piece_bytes(self, i: int) -> tuple[int, bytes]:
        """(type, bytes the piece decodes to; for control/unknown pieces their name)."""
        sp = self.sp
        piece = sp.id_to_piece(i)
        if sp.is_control(i):
            return T_CONTROL, piece.encode("utf-8")
        if sp.is_unknown(i):
            return T_UNKNOWN, piece.encode("utf-8")
        if sp.is_byte(i):  # pieces "<0xAB>"
            return T_BYTE, bytes([int(piece[3:5], 16)])
        if sp.is_unused(i):
            return T_UNUSED, piece.encode("utf-8")
        if piece in SPECIALS:
            return T_USER, piece.encode("utf-8")
        return T_NORMAL, piece.replace(SP_SPACE, " ").encode("utf-8")


class TiktokenTokenizer:
    """GPT-2 BPE via tiktoken (its BPE files need the network once, or TIKTOKEN_CACHE_DIR);
    <|endoftext|> (50256) serves as bos and eos, as in GPT-2."""
    kind = KIND_TIKTOKEN

    def __init__(self, enc=None):
        import tiktoken
        if enc is None:
            try:
                enc = tiktoken.get_encoding("gpt2")
            except Exception as e:  # noqa: BLE001 (requests' errors, or a broken cache)
                raise RuntimeError(f"tiktoken's GPT-2 encoding: cannot fetch its BPE files ({type(e).__name__}). This "
                                   f"needs the network once (tiktoken caches them, TIKTOKEN_CACHE_DIR), or give a "
                                   f"SentencePiece .model as the tokenizer") from e
        self.enc = enc
        self.vocab_size = self.enc.n_vocab
        self.eot = self.enc.eot_token
        self.bos_id = self.eos_id = self.eot
        self.pad_id = self.unk_id = -1
        self.special_ids = set(self.enc.special_tokens_set and
                               [self.enc.encode_single_token(s) for s in self.enc.special_tokens_set])

    def encode(self, text: str) -> list[int]:
        return self.enc.encode_ordinary(text)

    def encode_batch(self, texts: list[str], num_threads: int = 1) -> list[list[int]]:
        return self.enc.encode_ordinary_batch(texts, num_threads=num_threads)

    def decode(self, ids) -> str:
        return self.enc.decode([int(i) for i in ids])

    def piece_bytes(self, i: int) -> tuple[int, bytes]:
        b = self.enc.decode_single_token_bytes(i)
        return (T_CONTROL if i in self.special_ids else T_NORMAL), b


def load_tokenizer(spec: str):
    """'gpt2' -> tiktoken GPT-2; otherwise a SentencePiece .model path."""
    if spec == "gpt2":
        return TiktokenTokenizer()
    return SPTokenizer(spec)


def _tokenizer_header_and_body(tok) -> tuple[np.ndarray, bytes]:
    """The tokenizer .bin's header (without its CRC) and its pieces: per id uint8 type, uint16
    length, bytes."""
    entries = [tok.piece_bytes(i) for i in range(tok.vocab_size)]
    maxlen = max(len(b) for _, b in entries)
    if maxlen > 65535:
        raise ValueError("piece longer than 65535 bytes")
    h = np.zeros(256, dtype="<i4")
    h[0], h[1], h[2], h[3] = TOKENIZER_MAGIC, TOKENIZER_VERSION, tok.vocab_size, tok.kind
    h[4], h[5], h[6], h[7] = tok.bos_id, tok.eos_id, tok.pad_id, tok.unk_id
    h[8] = maxlen
    return h, b"".join(struct.pack("<BH", t, len(b)) + b for t, b in entries)


def tokenizer_fingerprint(tok) -> int:
    """What the data made with `tok` records (shards, eval sets: doc/formats.md), as
    llmc/data/tokenizer.h Tokenizer::fingerprint() computes it from the .bin: the CRC-32 of
    header ints [2..8] (vocabulary, kind, special ids, longest piece) and the pieces, so that the
    file's version and checksum do not change it. An int32 with the CRC's bits, as a header
    slot holds it."""
    h, body = _tokenizer_header_and_body(tok)
    crc = zlib.crc32(body, zlib.crc32(h[2:9].tobytes()))
    return int(np.array([crc], dtype="<u4").view("<i4")[0])


def export_tokenizer_bin(tok, path) -> None:
    """Writes the tokenizer .bin: 256-int32 header (with the file's CRC-32), then per id:
    uint8 type, uint16 length, bytes."""
    h, body = _tokenizer_header_and_body(tok)
    h[TOKENIZER_CRC_SLOT] = np.array([file_crc(h.tobytes() + body, TOKENIZER_CRC_SLOT)], dtype="<u4").view("<i4")[0]
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(h.tobytes())
        f.write(body)
    os.replace(tmp, path)



def read_tokenizer_bin(path) -> dict:
    """Reads a tokenizer .bin back (for tests and tools): header fields and (type, bytes) per id,
    checked as llmc/data/tokenizer.h checks them (the CRC of version 2, the piece count against
    the file's size, the special ids, the piece types and lengths)."""
    data = Path(path).read_bytes()
    if len(data) < 1024:
        raise ValueError(f"{path}: truncated header")
    h = [int(x) for x in np.frombuffer(data[:1024], dtype="<i4")]
    if h[0] != TOKENIZER_MAGIC or h[1] not in (TOKENIZER_VERSION_NO_CRC, TOKENIZER_VERSION):
        raise ValueError(f"{path}: bad magic/version {h[0]}/{h[1]}")
    check_header_crc(path, data, h, TOKENIZER_CRC_SLOT, h[1] == TOKENIZER_VERSION, "tokenizer", "export_tokenizer_bin")
    vocab = h[2]
    if not 0 < vocab <= (len(data) - 1024) // 3:  # each piece takes at least 3 bytes
        raise ValueError(f"{path}: {vocab} pieces announced, the {len(data) - 1024} bytes after the header hold at "
                         f"most {(len(data) - 1024) // 3}")
    if h[3] not in (KIND_SENTENCEPIECE, KIND_TIKTOKEN):
        raise ValueError(f"{path}: unknown kind {h[3]}")
    if any(not -1 <= i < vocab for i in h[4:8]):
        raise ValueError(f"{path}: special ids {h[4:8]} outside the vocabulary of {vocab}")
    pos, pieces = 1024, []
    for _ in range(vocab):
        if pos + 3 > len(data):
            raise ValueError(f"{path}: truncated")
        t, n = struct.unpack_from("<BH", data, pos)
        pos += 3
        if t > T_UNUSED or n > h[8]:
            raise ValueError(f"{path}: piece {len(pieces)}: type {t} / length {n} (types 0..{T_UNUSED}, "
                             f"longest {h[8]})")
        if pos + n > len(data):
            raise ValueError(f"{path}: truncated")
        pieces.append((t, data[pos:pos + n]))
        pos += n
    if pos != len(data):
        raise ValueError(f"{path}: {len(data) - pos} trailing bytes")
    return dict(vocab_size=int(h[2]), kind=int(h[3]), bos=int(h[4]), eos=int(h[5]), pad=int(h[6]),
                unk=int(h[7]), max_len=int(h[8]), pieces=pieces)


def decode_with_bin(tb: dict, ids) -> bytes:
    """Reference decoder over a read_tokenizer_bin() table, mirroring llmc/data/tokenizer.h."""
    out = bytearray()
    for i in ids:
        t, b = tb["pieces"][int(i)]
        if t == T_CONTROL or t == T_UNUSED:
            continue
        out += SP_UNK_TEXT.encode() if t == T_UNKNOWN else b
    return bytes(out)
