/*
Tokenizer: reads the tokenizer .bin written by attnref/tokenizer.py (SentencePiece or tiktoken
GPT-2; doc/formats.md, "Tokenizer"), decodes token ids to text (samples) and encodes a prompt
(SentencePiece kind). Host-only C++17. Version 2 files carry a CRC-32 of the whole file
(llmc/data/crc32.h), checked before parsing: a flipped bos id would otherwise change training
silently; version 1 (no CRC) still loads, with a note.
Decoding is concatenation: the file stores each id's bytes (SentencePiece's "▁" already a
space, byte-fallback pieces already the byte); control tokens decode to nothing unless asked,
<unk> to " ⁇ ". A byte-fallback token alone may be part of a UTF-8 character: decode sequences,
not ids; complete_utf8() makes printed text valid UTF-8.
*/
#pragma once

#include <cstdint>
#include <queue>
#include <string>
#include <unordered_map>
#include <vector>

#include <algorithm>

#include "llmc/data/crc32.h"  // defines: crc32_without_slot
#include "llmc/utils.h"

constexpr int TOKENIZER_MAGIC = 20260312;
constexpr int TOKENIZER_VERSION = 2;         // what the writer writes: with a CRC
constexpr int TOKENIZER_VERSION_NO_CRC = 1;  // still read, with a note
constexpr int TOKENIZER_CRC_SLOT = 9;        // header int holding the CRC (version 2)
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
        if (h[1] != TOKENIZER_VERSION && h[1] != TOKENIZER_VERSION_NO_CRC) {
            fatal("tokenizer '%s': unsupported version %d (this build reads %d and %d)", path.c_str(), h[1],
                  TOKENIZER_VERSION_NO_CRC, TOKENIZER_VERSION);
        }
        check_header_tail(path, f, h, size);
        vocab_size = h[2];
        kind = h[3];
        bos_id = h[4]; eos_id = h[5]; pad_id = h[6]; unk_id = h[7];
        int max_len = h[8];
        if (vocab_size <= 0) { fatal("tokenizer '%s': bad vocabulary size %d", path.c_str(), vocab_size); }
        if (vocab_size > (size - 1024) / 3) {  // each piece takes at least 3 bytes: type and length
            fatal("tokenizer '%s' is truncated or corrupt: the header announces %d pieces, the %ld bytes after it "
                  "hold at most %ld", path.c_str(), vocab_size, size - 1024, (size - 1024) / 3);
        }
        if (kind != TOKENIZER_SENTENCEPIECE && kind != TOKENIZER_TIKTOKEN) {
            fatal("tokenizer '%s': unknown kind %d", path.c_str(), kind);
        }
        for (int id : {bos_id, eos_id, pad_id, unk_id}) {
            if (id < -1 || id >= vocab_size) { fatal("tokenizer '%s': special id %d out of range", path.c_str(), id); }
        }
        types_.resize(vocab_size);
        pieces_.resize(vocab_size);
        uint32_t fingerprint = crc32(&h[2], 7 * sizeof(int32_t));  // (fingerprint() below)
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
            fingerprint = crc32_update(fingerprint, &type, 1);
            fingerprint = crc32_update(fingerprint, &len, 2);  // (little-endian, as stored)
            fingerprint = crc32_update(fingerprint, pieces_[i].data(), len);
        }
        long pos = f.tell();
        if (pos != size) { fatal("tokenizer '%s': %ld bytes after the last piece", path.c_str(), size - pos); }
        path_ = path;
        fingerprint_ = fingerprint;
    }

    // What data made with this tokenizer records (doc/formats.md "Token shards"): the CRC-32 of
    // header ints [2..8] (vocabulary, kind, special ids, longest piece) and the pieces as stored,
    // so that the file's version and checksum do not change it (dev/data/tokenizer.py
    // tokenizer_fingerprint computes the same).
    uint32_t fingerprint() const { return fingerprint_; }
    const std::string& path() const { return path_; }

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

    // Token ids of `text` (no BOS), as SentencePiece's BPE encodes it with the model
    // attnref/tokenizer.py trains (identity normalisation, no dummy prefix, byte fallback): the
    // text split into characters, the user-defined pieces (the SYNTH markers) matched first,
    // longest first; then the adjacent pair whose concatenation is the piece of highest score
    // merged, repeatedly (leftmost first among equals; the .bin holds no scores, but the trainer
    // gives scores decreasing in id order, so the lower id wins); symbols that are no piece end
    // as their bytes' <0xXX> pieces. O(n log n): a heap of candidate pairs over a linked list.
    std::vector<int> encode(const std::string& text) const {
        if (kind != TOKENIZER_SENTENCEPIECE) {
            fatal("tokenizer '%s': encoding is implemented for SentencePiece tokenizers only (this one is tiktoken's "
                  "GPT-2 BPE)", path_.c_str());
        }
        build_index();
        // 1. symbols: user-defined pieces (longest match) or one UTF-8 character each
        struct Symbol { size_t begin, len; int prev, next; };
        std::vector<Symbol> sym;
        for (size_t i = 0; i < text.size();) {
            size_t len = 0;
            for (int id : user_ids_) {
                const std::string& p = pieces_[id];
                if (p.size() > len && text.compare(i, p.size(), p) == 0) { len = p.size(); }
            }
            if (len == 0) { len = std::min(utf8_length((unsigned char)text[i]), text.size() - i); }
            sym.push_back({i, len, (int)sym.size() - 1, (int)sym.size() + 1});
            i += len;
        }
        if (sym.empty()) { return {}; }
        sym.back().next = -1;
        // 2. merges: a heap of (piece id, left symbol) for adjacent pairs that form a piece
        auto piece_of = [&](size_t begin, size_t len) {
            auto it = normal_.find(text.substr(begin, len));
            return it == normal_.end() ? -1 : it->second;
        };
        struct Candidate { int id; int left; size_t len; };
        auto worse = [](const Candidate& a, const Candidate& b) { return a.id != b.id ? a.id > b.id : a.left > b.left; };
        std::priority_queue<Candidate, std::vector<Candidate>, decltype(worse)> heap(worse);
        auto propose = [&](int left) {
            if (left < 0 || sym[left].next < 0) { return; }
            const Symbol& a = sym[left];
            const Symbol& b = sym[a.next];
            int id = piece_of(a.begin, a.len + b.len);
            if (id >= 0) { heap.push({id, left, a.len + b.len}); }
        };
        for (int i = 0; i < (int)sym.size(); i++) { propose(i); }
        while (!heap.empty()) {
            Candidate c = heap.top();
            heap.pop();
            Symbol& a = sym[c.left];
            if (a.len == 0 || a.next < 0 || a.len + sym[a.next].len != c.len) { continue; }  // stale
            Symbol& b = sym[a.next];
            a.len += b.len;
            b.len = 0;
            a.next = b.next;
            if (a.next >= 0) { sym[a.next].prev = c.left; }
            propose(a.prev);
            propose(c.left);
        }
        // 3. ids: a symbol that is no piece becomes its bytes' byte-fallback pieces
        std::vector<int> ids;
        for (int i = 0; i >= 0; i = sym[i].next) {
            const Symbol& s = sym[i];
            std::string bytes = text.substr(s.begin, s.len);
            auto user = std::find_if(user_ids_.begin(), user_ids_.end(), [&](int id) { return pieces_[id] == bytes; });
            if (user != user_ids_.end()) { ids.push_back(*user); continue; }
            int id = piece_of(s.begin, s.len);
            if (id >= 0) { ids.push_back(id); continue; }
            bool bytes_known = std::all_of(bytes.begin(), bytes.end(), [&](char b) { return byte_ids_[(unsigned char)b] >= 0; });
            if (!bytes_known) {  // no byte fallback for it: one <unk> for the character
                if (unk_id < 0) { fatal("tokenizer '%s': '%s' has no piece and there is no <unk>", path_.c_str(), bytes.c_str()); }
                ids.push_back(unk_id);
                continue;
            }
            for (unsigned char byte : bytes) { ids.push_back(byte_ids_[byte]); }
        }
        return ids;
    }

    int vocab_size = 0, kind = 0;
    int bos_id = -1, eos_id = -1, pad_id = -1, unk_id = -1;

private:
    // The header ints past the fields are 0; version 2: the CRC over everything after the
    // header matches (the file is left just after the header).
    static void check_header_tail(const std::string& path, CheckedFile& f, const std::vector<int32_t>& h, long size) {
        const bool checksum = h[1] == TOKENIZER_VERSION;
        for (int k = checksum ? TOKENIZER_CRC_SLOT + 1 : TOKENIZER_CRC_SLOT; k < 256; k++) {
            if (h[k] != 0) { fatal("tokenizer '%s': header int [%d] is %d, must be 0 (corrupt header)", path.c_str(), k, h[k]); }
        }
        if (!checksum) {
            fprintf(stderr, "note: tokenizer '%s' is of version 1, without a checksum: its contents are not verified "
                    "(attnref/tokenizer.py writes version 2)\n", path.c_str());
            return;
        }
        uint32_t stored = (uint32_t)h[TOKENIZER_CRC_SLOT], computed = crc32_without_slot(f, h.data(), TOKENIZER_CRC_SLOT, size, "pieces");
        if (stored != computed) {
            fatal("tokenizer '%s': checksum mismatch: stored CRC32 %08x, computed %08x (the file is corrupt)",
                  path.c_str(), stored, computed);
        }
        f.seek(1024);
    }
    static size_t utf8_length(unsigned char lead) {
        return lead < 0x80 ? 1 : (lead >> 5) == 0x6 ? 2 : (lead >> 4) == 0xE ? 3 : (lead >> 3) == 0x1E ? 4 : 1;
    }
    // the lookup tables of encode(), made on first use
    void build_index() const {
        if (!normal_.empty() || vocab_size == 0) { return; }
        byte_ids_.assign(256, -1);
        for (int i = 0; i < vocab_size; i++) {
            if (types_[i] == PIECE_NORMAL) { normal_.emplace(pieces_[i], i); }  // first (highest-scored) id wins
            if (types_[i] == PIECE_USER) { user_ids_.push_back(i); }
            if (types_[i] == PIECE_BYTE && pieces_[i].size() == 1) { byte_ids_[(unsigned char)pieces_[i][0]] = i; }
        }
    }
    mutable std::unordered_map<std::string, int> normal_;
    mutable std::vector<int> user_ids_, byte_ids_;

    void check(int id) const {
        if (id < 0 || id >= vocab_size) {
            fatal("tokenizer '%s': token id %d outside the vocabulary (size %d)", path_.c_str(), id, vocab_size);
        }
    }
    std::string path_;
    uint32_t fingerprint_ = 0;
    std::vector<uint8_t> types_;
    std::vector<std::string> pieces_;
};

// `text` as valid UTF-8: an incomplete character at the end is held back (left out: the
// next tokens may complete it), and every other maximal run of bytes that starts no valid
// character becomes one U+FFFD, as Python's decode(errors="replace") does, so a terminal or
// a JSON reader never sees a broken sequence. Valid means RFC 3629: no overlong forms (C0,
// C1, E0 80..9F, F0 80..8F), no surrogates (ED A0..BF), nothing above U+10FFFF (F4 90.., F5..).
inline std::string complete_utf8(const std::string& text) {
    std::string out;
    size_t i = 0, n = text.size();
    while (i < n) {
        unsigned char c = (unsigned char)text[i];
        size_t len = c < 0x80 ? 1 : c < 0xC2 ? 0 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : c < 0xF5 ? 4 : 0;
        // the second byte's range is narrower after these leads (the exclusions above)
        unsigned char lo = c == 0xE0 ? 0xA0 : c == 0xF0 ? 0x90 : 0x80, hi = c == 0xED ? 0x9F : c == 0xF4 ? 0x8F : 0xBF;
        size_t k = 1;
        while (len > 1 && k < len && i + k < n) {
            unsigned char b = (unsigned char)text[i + k];
            if (k == 1 ? b < lo || b > hi : (b >> 6) != 0x2) { break; }
            k++;
        }
        if (len > 1 && k < len && i + k == n) { break; }  // cut short by the end: hold back
        if (len == 0 || k < len) {
            out += "\xEF\xBF\xBD";
            i += len == 0 ? 1 : k;
            continue;
        }
        out.append(text, i, len);
        i += len;
    }
    return out;
}
