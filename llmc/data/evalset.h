/*
Eval-set loader: reads an eval .bin written by attnref/evalset.py: multiple-choice, cloze, rolling
(a whole document, lm-eval's loglikelihood_rolling) or partial (Winogrande) items, each a context
and its choices' tokens with the gold index and the lengths the metrics normalise by. The scorer
(llmc/train/eval_scoring.h) scores continuation tokens given context + preceding continuation
tokens, lm-eval style. The file's CRC-32 is checked first, and every count against the bytes left
before anything is allocated for it, so a corrupt file is refused, never taken on trust; every
check names the file and the item. Host-only C++17. The format: doc/formats.md "Eval sets".
*/
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "llmc/data/crc32.h"  // defines: crc32_without_slot
#include "llmc/data/tokenizer_record.h"
#include "llmc/utils.h"

constexpr int EVAL_MAGIC = 20260313;
constexpr int EVAL_VERSION = 2;         // what the writer writes: with a CRC
constexpr int EVAL_VERSION_NO_CRC = 1;  // still read, with a note
// Version 2 holds in header int [9] the CRC-32 (llmc/data/crc32.h, zlib's) of the whole file but
// that int, checked before the items are parsed; a 0 there is a mismatch like any other value.
// Version 1 (no CRC) still loads, with a note.
constexpr int EVAL_CRC_SLOT = 9;        // header int holding the CRC (version 2)
constexpr int EVAL_TOKENIZER_SLOT = 10; // the tokenizer's fingerprint; [11] its flag (version 2)
enum EvalKind { EVAL_MULTIPLE_CHOICE = 0, EVAL_CLOZE = 1, EVAL_ROLLING = 2, EVAL_PARTIAL = 3 };
inline const char* eval_kind_name(int kind) {
    static const char* names[] = {"multiple-choice", "cloze", "rolling", "partial"};
    return kind >= 0 && kind <= EVAL_PARTIAL ? names[kind] : "unknown";
}

struct EvalItem {
    std::vector<int> context;               // starts with BOS when EvalSet::bos
    std::vector<std::vector<int>> choices;  // continuation tokens, one list per choice
    std::vector<int> choice_chars;          // what the metric normalises by: characters (multiple
                                            // choice), words of the document (rolling); partial:
                                            // the choice's own context tokens (not scored)
    int gold = 0;
};

struct EvalSet {
    std::string path, description;
    int kind = 0, vocab_size = 0, max_choices = 0, max_tokens = 0;
    bool bos = false;
    TokenizerRecord tokenizer;  // what its tokens were made with
    std::vector<EvalItem> items;
};

// The tokenizer an eval set records (header only; version 1 files record none).
inline TokenizerRecord evalset_tokenizer(const std::string& path) {
    CheckedFile f(path, "rb");
    if (f.size() < 1024) { fatal("eval set '%s' is truncated: %ld bytes, shorter than its 1024-byte header", path.c_str(), f.size()); }
    std::vector<int32_t> h;
    f.read_vector(h, 256, "header");
    if (h[0] != EVAL_MAGIC) { fatal("file '%s' is not an eval set: magic number %d, expected %d", path.c_str(), h[0], EVAL_MAGIC); }
    return h[1] == EVAL_VERSION ? read_tokenizer_record(path, "eval set", h, EVAL_TOKENIZER_SLOT) : TokenizerRecord{};
}

inline EvalSet load_evalset(const std::string& path) {
    CheckedFile f(path, "rb");
    long size = f.size();
    if (size < 1024) { fatal("eval set '%s' is truncated: %ld bytes, shorter than its 1024-byte header", path.c_str(), size); }
    std::vector<int32_t> h;
    f.read_vector(h, 256, "header");
    if (h[0] != EVAL_MAGIC) { fatal("file '%s' is not an eval set: magic number %d, expected %d", path.c_str(), h[0], EVAL_MAGIC); }
    if (h[1] != EVAL_VERSION && h[1] != EVAL_VERSION_NO_CRC) {
        fatal("eval set '%s': unsupported version %d (this build reads %d and %d)", path.c_str(), h[1],
              EVAL_VERSION_NO_CRC, EVAL_VERSION);
    }
    const bool checksum = h[1] == EVAL_VERSION;
    for (int k = checksum ? EVAL_TOKENIZER_SLOT + 2 : EVAL_CRC_SLOT; k < 256; k++) {
        if (h[k] != 0) { fatal("eval set '%s': header int [%d] is %d, must be 0 (corrupt header)", path.c_str(), k, h[k]); }
    }
    if (checksum) {
        uint32_t stored = (uint32_t)h[EVAL_CRC_SLOT], computed = crc32_without_slot(f, h.data(), EVAL_CRC_SLOT, size, "items");
        if (stored != computed) {
            fatal("eval set '%s': checksum mismatch: stored CRC32 %08x, computed %08x (the file is corrupt)",
                  path.c_str(), stored, computed);
        }
        f.seek(1024);
    } else {
        fprintf(stderr, "note: eval set '%s' is of version 1, without a checksum: its contents are not verified "
                "(attnref/evalset.py writes version 2)\n", path.c_str());
    }
    EvalSet es;
    es.path = path;
    if (checksum) { es.tokenizer = read_tokenizer_record(path, "eval set", h, EVAL_TOKENIZER_SLOT); }
    int n_items = h[2];
    es.kind = h[3];
    es.vocab_size = h[4];
    es.max_choices = h[5];
    es.max_tokens = h[6];
    es.bos = h[7] != 0;
    int desc_len = h[8];
    if (n_items < 0 || es.vocab_size <= 0 || es.max_choices < 0 || es.max_tokens < 0 || desc_len < 0) {
        fatal("eval set '%s': bad header (items %d, vocab %d, choices %d, tokens %d, description %d)", path.c_str(),
              n_items, es.vocab_size, es.max_choices, es.max_tokens, desc_len);
    }
    if (es.kind != EVAL_MULTIPLE_CHOICE && es.kind != EVAL_CLOZE && es.kind != EVAL_ROLLING && es.kind != EVAL_PARTIAL) {
        fatal("eval set '%s': unknown kind %d", path.c_str(), es.kind);
    }
    // an item takes at least 28 bytes (three counts, a context token, a continuation's two
    // counts and one token), so the counts are checked before anything is allocated for them
    if (desc_len > size - 1024 || (long)n_items * 28 > size - 1024 - desc_len) {
        fatal("eval set '%s' is truncated or corrupt: the header announces %d items and a %d-byte description, "
              "the file has %ld bytes after its header", path.c_str(), n_items, desc_len, size - 1024);
    }
    es.description.resize(desc_len);
    if (desc_len > 0) { f.read(&es.description[0], desc_len, "description"); }
    // every count is checked against the bytes left, so a corrupt count cannot allocate wildly
    auto count = [&](const char* what, int item, int lo, int hi) {
        int v = f.read_value<int32_t>(what);
        if (v < lo || v > hi) {
            fatal("eval set '%s': item %d: %s is %d, outside %d..%d", path.c_str(), item, what, v, lo, hi);
        }
        return v;
    };
    auto tokens = [&](std::vector<int>& dst, int n, int item, const char* what) {
        if ((long)n * 4 > size - f.tell()) {
            fatal("eval set '%s' is truncated in item %d: %d tokens of %s announced, %ld bytes left", path.c_str(),
                  item, n, what, size - f.tell());
        }
        f.read_vector(dst, n, what);
        for (int t : dst) {
            if (t < 0 || t >= es.vocab_size) {
                fatal("eval set '%s': item %d: token %d in its %s is outside the vocabulary (%d)", path.c_str(), item,
                      t, what, es.vocab_size);
            }
        }
    };
    es.items.resize(n_items);
    for (int i = 0; i < n_items; i++) {
        EvalItem& it = es.items[i];
        int nc = count("number of choices", i, 1, es.max_choices);
        // each choice takes at least 12 bytes (its two counts and a token)
        if ((long)nc * 12 > size - f.tell()) {
            fatal("eval set '%s' is truncated or corrupt in item %d: %d choices announced, %ld bytes left", path.c_str(),
                  i, nc, size - f.tell());
        }
        if (es.kind != EVAL_MULTIPLE_CHOICE && es.kind != EVAL_PARTIAL && nc != 1) {
            fatal("eval set '%s': %s item %d has %d continuations", path.c_str(), eval_kind_name(es.kind), i, nc);
        }
        it.gold = count("gold index", i, 0, nc - 1);
        int nctx = count("context length", i, 1, es.kind == EVAL_ROLLING ? 1 : es.max_tokens);
        tokens(it.context, nctx, i, "context");
        it.choices.resize(nc);
        it.choice_chars.resize(nc);
        for (int c = 0; c < nc; c++) {
            int nt = count("continuation length", i, 1, es.max_tokens - nctx);
            // (partial: the choice's own context tokens, leaving at least one to score)
            it.choice_chars[c] = count("continuation characters", i, 0, es.kind == EVAL_PARTIAL ? nt - 1 : 1 << 30);
            tokens(it.choices[c], nt, i, "continuation");
        }
    }
    if (f.tell() != size) { fatal("eval set '%s': %ld bytes after the last item", path.c_str(), size - f.tell()); }
    return es;
}
