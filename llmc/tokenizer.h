/*
Tokenizer decoder: reads the tokenizer .bin written by dev/data/tokenizer.py (SentencePiece
or tiktoken GPT-2; doc/formats.md, "Tokenizer") and turns token ids back into text, e.g.
to print samples. Host-only C++17.

The file stores, for every id, its type and the bytes it decodes to: SentencePiece's "▁"
is already a space and byte-fallback pieces (<0x0A>) are already the raw byte, so decoding
is concatenation. Control tokens (pad, BOS, EOS, GPT-2's <|endoftext|>) decode to nothing
unless asked for (then their name, e.g. "<s>"); <unk> decodes to " ⁇ " as SentencePiece's does.
A byte-fallback token alone may be part of a UTF-8 character: decode sequences, not ids,
when the text matters.
*/
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "utils.h"

constexpr int TOKENIZER_MAGIC = 20260312;
constexpr int TOKENIZER_VERSION = 1;
enum TokenizerKind { TOKENIZER_SENTENCEPIECE = 1, TOKENIZER_TIKTOKEN = 2 };
enum PieceType : uint8_t { PIECE_NORMAL = 0, PIECE_CONTROL = 1, PIECE_BYTE = 2, PIECE_USER = 3,
                           PIECE_UNKNOWN = 4, PIECE_UNUSED = 5 };

class Tokenizer {
public:
    Tokenizer() = default;
    explicit Tokenizer(const std::string& path) { load(path); }

    void load(const std::string& path) {
        CheckedFile f(path, "rb");
        long size = f.size();
        if (size < 1024) { fatal("tokenizer file '%s' is truncated: %ld bytes, shorter than its header", path.c_str(), size); }
        std::vector<int32_t> h;
        f.read_vector(h, 256, "header");
        if (h[0] != TOKENIZER_MAGIC) {
            fatal("file '%s' is not a tokenizer .bin: magic number %d, expected %d", path.c_str(), h[0], TOKENIZER_MAGIC);
        }
        if (h[1] != TOKENIZER_VERSION) { fatal("tokenizer '%s': unsupported version %d", path.c_str(), h[1]); }
        vocab_size = h[2];
        kind = h[3];
        bos_id = h[4]; eos_id = h[5]; pad_id = h[6]; unk_id = h[7];
        int max_len = h[8];
        if (vocab_size <= 0) { fatal("tokenizer '%s': bad vocabulary size %d", path.c_str(), vocab_size); }
        if (kind != TOKENIZER_SENTENCEPIECE && kind != TOKENIZER_TIKTOKEN) {
            fatal("tokenizer '%s': unknown kind %d", path.c_str(), kind);
        }
        for (int id : {bos_id, eos_id, pad_id, unk_id}) {
            if (id < -1 || id >= vocab_size) { fatal("tokenizer '%s': special id %d out of range", path.c_str(), id); }
        }
        types_.resize(vocab_size);
        pieces_.resize(vocab_size);
        for (int i = 0; i < vocab_size; i++) {
            uint8_t type = f.read_value<uint8_t>("piece type");
            uint16_t len = f.read_value<uint16_t>("piece length");
            if (type > PIECE_UNUSED) { fatal("tokenizer '%s': piece %d has unknown type %d", path.c_str(), i, type); }
            if (len > max_len) {
                fatal("tokenizer '%s': piece %d is %d bytes, longer than the header's maximum %d", path.c_str(), i,
                      len, max_len);
            }
            types_[i] = type;
            pieces_[i].resize(len);
            if (len > 0) { f.read(&pieces_[i][0], len, "piece bytes"); }
        }
        long pos = f.tell();
        if (pos != size) { fatal("tokenizer '%s': %ld bytes after the last piece", path.c_str(), size - pos); }
        path_ = path;
    }

    bool loaded() const { return vocab_size > 0; }
    PieceType type(int id) const { check(id); return (PieceType)types_[id]; }
    // the stored bytes of a piece (for control/unknown/unused pieces: their name)
    const std::string& piece(int id) const { check(id); return pieces_[id]; }

    // bytes that id decodes to; show_control: control/unused pieces as their names
    std::string decode(int id, bool show_control = false) const {
        check(id);
        switch (types_[id]) {
            case PIECE_CONTROL:
            case PIECE_UNUSED: return show_control ? pieces_[id] : std::string();
            case PIECE_UNKNOWN: return " \xE2\x81\x87 ";
            default: return pieces_[id];
        }
    }
    std::string decode(const std::vector<int>& ids, bool show_control = false) const {
        return decode(ids.data(), ids.size(), show_control);
    }
    std::string decode(const int* ids, size_t n, bool show_control = false) const {
        std::string out;
        for (size_t i = 0; i < n; i++) { out += decode(ids[i], show_control); }
        return out;
    }

    int vocab_size = 0, kind = 0;
    int bos_id = -1, eos_id = -1, pad_id = -1, unk_id = -1;

private:
    void check(int id) const {
        if (id < 0 || id >= vocab_size) {
            fatal("tokenizer '%s': token id %d outside the vocabulary (size %d)", path_.c_str(), id, vocab_size);
        }
    }
    std::string path_;
    std::vector<uint8_t> types_;
    std::vector<std::string> pieces_;
};
