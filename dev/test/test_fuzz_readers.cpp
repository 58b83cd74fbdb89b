/*
A bounded, deterministic fuzz of every file reader: token shards (uint16 and uint32), region
and exercise sidecars (llmc/data/dataloader.h), tokenizer files (llmc/data/tokenizer.h), model
checkpoints and debug states (llmc/data/tensor_file.h) and eval sets (llmc/data/evalset.h).

For each reader a valid seed file is written here from doc/formats.md and read back (it
must be accepted); then FUZZ_CASES (default 300; 100 under ASan) mutants of it per reader are written and
read, each in a forked child with a 10 s alarm. The child reads the file the way the
trainers do (the data loader through a whole epoch, in window and whole-document mode;
every tokenizer id decoded and a text encoded; every config key and tensor of a tensor
file fetched; every eval item walked). A mutant passes when the child either exits 0
(read) or exits 1 with "error: " and the mutated file's path in its output (refused, as
fatal() does); anything else fails the test: a signal (crash, the alarm: a hang), an abort
from an uncaught exception (e.g. std::bad_alloc from a size taken on trust), a sanitizer
report, or a refusal that does not name the file. `make test-asan` runs it under
AddressSanitizer and UBSan, so an out-of-bounds read is a failure too.

Mutations (from splitmix64(FUZZ_SEED, reader, case), so every run makes the same files),
after hand-made mutants that must be refused (tensor files whose sizes wrap around 2^64 or
with a shape slot past ndim set; eval sets announcing 2^31 - 1 or 5e7 choices, 2^31 - 1
context tokens or items; a tokenizer announcing 2^31 - 1 pieces; in the checksummed files,
with their CRCs made to match so that the size or shape check is what refuses them; and a
changed bos id or bos flag, a zeroed CRC field, which only the CRC catches):
1-3 of: flip bits, set a byte, set an aligned 32-bit word (most often inside the
1024-byte header) or 64-bit word to an interesting value (0, ±1, extremes, the file
size and small multiples), truncate, append garbage, delete or duplicate a chunk. Each child
may take only 512 MiB more address space than it starts with (not under ASan), so a size
taken on trust fails as std::bad_alloc even where memory would have sufficed.
Each reader of a file without checksums (tensor files, tokenizers and eval sets of version 1,
shards and sidecars with CRC 0 and no flag) must see some mutants accepted and several
distinct refusals, so the mutants demonstrably get past the magic number and the structural
checks behind it are fuzzed; the same readers on checksummed seeds (tensor files, tokenizers
and eval sets of version 2, shards and sidecars with their CRC and flag) must refuse every
mutant that changed the file (but for a shard or sidecar whose CRC slot and flag the mutation
both set to 0, a file from before the checksums, read unchecked by design, or whose only
change is its flag set to 0: its CRC is still checked).

Then, for each checksummed seed, single bytes are flipped (one bit, a different bit per
position; every byte of the structure, a sample of each CRC-covered data range: see
flip_positions) and the file read: each must be refused with an error that names the file and, where
a checksum catches it, the part: the tensor ("tensor 'wte': checksum mismatch"), the
header/config text/table, the tokens, labels or exercise ids, the tokenizer or eval set.
Version-1 tensor files, tokenizers and eval sets and CRC-0 shards (written before checksums)
still read, with their notes; a shard's CRC slot set to 0 under its flag is refused; a
DataLoader with verify_data off (--verify-data 0) reads a shard whose tokens no longer match
its CRC.
The last line counts the kinds of file, the mutants, those that crashed or hung and the
changed checksummed files read (both must be 0).
A failing mutant is kept in the temporary directory and named in the output.
Cost: about 5,400 fuzzed and 4,200 flipped files, a few seconds (doc/testing.md has the times measured).
*/
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "dev/test/data_test_util.h"
#include "llmc/data/crc32.h"  // defines: crc32
#include "llmc/data/dataloader.h"
#include "llmc/data/evalset.h"
#include "llmc/data/tensor_file.h"
#include "llmc/data/tokenizer.h"

using Bytes = std::vector<uint8_t>;

// ---- seed files (doc/formats.md) -------------------------------------------------------

constexpr int kVocab = 300, kBos = 1;

static std::vector<int> seed_tokens(int n) {  // documents that start with BOS
    std::vector<int> t;
    SplitMix64 rng(7);
    while ((int)t.size() < n) {
        t.push_back(kBos);
        int len = 2 + (int)rng.below(12);
        for (int i = 0; i < len && (int)t.size() < n; i++) { t.push_back(2 + (int)rng.below(kVocab - 2)); }
    }
    return t;
}

static Bytes shard_bytes(const std::vector<int>& toks, int version) {
    Bytes b = header_bytes({SHARD_MAGIC, version, (int32_t)toks.size()});
    for (int t : toks) {
        if (version == SHARD_VERSION_U16) { append_le<uint16_t>(b, (uint16_t)t); }
        else { append_le<uint32_t>(b, (uint32_t)t); }
    }
    return b;
}

// a shard or sidecar with its CRC slot filled and the flag after it set (doc/formats.md), as
// attnref/shards.py writes them
static Bytes with_crc(Bytes b, int slot) {
    uint32_t c = crc32(b.data() + DATA_HEADER_BYTES, b.size() - DATA_HEADER_BYTES), flag = 1;
    memcpy(&b[4 * slot], &c, 4);
    memcpy(&b[4 * slot + 4], &flag, 4);
    return b;
}

// a version-2 tensor file turned into version 1: the same bytes without the checksums
static Bytes as_version1(Bytes b) {
    uint64_t meta_bytes, n;
    memcpy(&meta_bytes, &b[16], 8);
    memcpy(&n, &b[24], 8);
    b[8] = 1;
    memset(&b[TENSOR_FILE_HEADER_CRC_AT], 0, 4);
    for (uint64_t t = 0; t < n; t++) { memset(&b[64 + meta_bytes + 128 * t + TENSOR_ENTRY_CRC_AT], 0, 4); }
    return b;
}

static Bytes regions_bytes(int ntok) {
    Bytes b = header_bytes({REGIONS_MAGIC, REGIONS_VERSION, ntok});
    for (int i = 0; i < ntok; i++) { b.push_back((uint8_t)(i / 5 % 4)); }
    return b;
}

static Bytes exercises_bytes(int ntok) {
    const std::string table = std::string("none") + '\0' + "recall" + '\0' + "sort" + '\0';
    Bytes b = header_bytes({EXERCISES_MAGIC, EXERCISES_VERSION, ntok, 3, (int32_t)table.size()});
    b.insert(b.end(), table.begin(), table.end());
    for (int i = 0; i < ntok; i++) { b.push_back((uint8_t)(i / 7 % 3)); }
    return b;
}

static Bytes tokenizer_seed(int version) {
    struct Piece { uint8_t type; std::string text; };
    std::vector<Piece> p = {{PIECE_CONTROL, "<pad>"}, {PIECE_CONTROL, "<s>"}, {PIECE_CONTROL, "</s>"},
                            {PIECE_UNKNOWN, "<unk>"}, {PIECE_USER, "<|q|>"}};
    for (int c = 0; c < 256; c += 17) { p.push_back({PIECE_BYTE, std::string(1, (char)c)}); }
    for (const char* s : {"t", "h", "e", " ", "a", "n", "th", "he", "the", " the", "an", "and", "\xE2\x81\x87"}) {
        p.push_back({PIECE_NORMAL, s});
    }
    p.push_back({PIECE_UNUSED, "<unused>"});
    Bytes b = header_bytes({TOKENIZER_MAGIC, version, (int32_t)p.size(), TOKENIZER_SENTENCEPIECE, 1, 2, 0, 3, 16});
    for (const Piece& x : p) {
        b.push_back(x.type);
        append_le<uint16_t>(b, (uint16_t)x.text.size());
        b.insert(b.end(), x.text.begin(), x.text.end());
    }
    return version == TOKENIZER_VERSION ? sealed(b, TOKENIZER_CRC_SLOT) : b;
}

static Bytes evalset_seed(int kind, int version) {
    std::vector<int> toks = seed_tokens(400);
    SplitMix64 rng(kind + 11);
    const std::string desc = kind == EVAL_CLOZE ? "cloze fixture" : "multiple-choice fixture";
    const int items = 12, max_choices = kind == EVAL_CLOZE ? 1 : 4, max_tokens = 24;
    Bytes b = header_bytes({EVAL_MAGIC, version, items, kind, kVocab, max_choices, max_tokens, 1, (int32_t)desc.size()});
    b.insert(b.end(), desc.begin(), desc.end());
    size_t k = 0;
    for (int i = 0; i < items; i++) {
        int nc = kind == EVAL_CLOZE ? 1 : 2 + (int)rng.below(3), nctx = 2 + (int)rng.below(10);
        append_le<int32_t>(b, nc);
        append_le<int32_t>(b, (int32_t)rng.below(nc));
        append_le<int32_t>(b, nctx);
        for (int t = 0; t < nctx; t++) { append_le<int32_t>(b, toks[k++ % toks.size()]); }
        for (int c = 0; c < nc; c++) {
            int nt = 1 + (int)rng.below(max_tokens - nctx);
            append_le<int32_t>(b, nt);
            append_le<int32_t>(b, 3 * nt);
            for (int t = 0; t < nt; t++) { append_le<int32_t>(b, toks[k++ % toks.size()]); }
        }
    }
    return version == EVAL_VERSION ? sealed(b, EVAL_CRC_SLOT) : b;
}

// the names and config keys the tensor-file seeds hold (the child asks for each)
static const std::vector<std::string> kTensorNames = {"wte", "h.0.attn.w_q", "h.0.gate", "tokens", "logits"};
static const std::vector<std::string> kIntKeys = {"n_layer", "n_embd", "vocab_size", "step"};
static const std::vector<std::string> kRealKeys = {"lr", "rope_theta"};

static Bytes tensor_file_seed(const std::string& dir, uint32_t kind) {
    TensorFileWriter w(kind);
    w.set("n_layer", 1);
    w.set("n_embd", 8);
    w.set("vocab_size", 16);
    w.set("step", 3);
    w.set("lr", 3e-3);
    w.set("rope_theta", 10000.0);
    w.set("norm", std::string("zcn"));
    std::vector<float> f(16 * 8);
    for (size_t i = 0; i < f.size(); i++) { f[i] = 0.01f * (float)i - 0.3f; }
    std::vector<int32_t> ids(12);
    for (size_t i = 0; i < ids.size(); i++) { ids[i] = (int32_t)(i * 5 % 16); }
    w.add_floats("wte", {16, 8}, f.data());
    w.add_floats("h.0.attn.w_q", {8, 8}, f.data());
    w.add_floats("h.0.gate", {}, f.data());
    w.add_ints("tokens", {2, 6}, ids.data());
    if (kind == TENSOR_FILE_DEBUG_STATE) { w.add_floats("logits", {2, 3, 16}, f.data()); }
    std::string path = dir + "/seed.tensors";
    w.write(path);
    FILE* fp = fopen(path.c_str(), "rb");
    Bytes b;
    int c;
    while ((c = fgetc(fp)) != EOF) { b.push_back((uint8_t)c); }
    fclose(fp);
    return b;
}

// ---- how each reader reads (runs in the child; fatal() exits 1) -------------------------

static void read_data(const std::string& shard) {
    volatile int64_t sum = 0;
    for (int mode = 0; mode < 2; mode++) {
        DataLoaderConfig cfg;
        cfg.pattern = shard;
        cfg.B = 2;
        cfg.T = 16;
        cfg.vocab_size = kVocab;
        cfg.doc_start_token = kBos;
        cfg.whole_documents = mode == 1;
        cfg.shuffle = mode == 0;
        cfg.seed = 5;
        DataLoader d(cfg);
        for (int64_t s = 0; s <= d.steps_per_epoch(); s++) {  // one epoch and the first batch of the next
            d.next_batch();
            for (size_t i = 0; i < d.tokens.size(); i++) { sum += d.tokens[i] + d.regions[i] + d.exercises[i] + d.doc_ids[i]; }
            for (size_t i = 0; i < d.targets.size(); i++) { sum += d.targets[i]; }
        }
        for (size_t e = 0; e < d.exercise_names.size(); e++) { sum += (int64_t)d.exercise_names[e].size(); }
    }
    std::vector<int32_t> all = read_token_shard(shard);
    for (int32_t t : all) { sum += t; }
}

// The flip test's data reader: a loader opens the shard (which checks the CRCs), nothing more.
static void open_data(const std::string& shard, bool verify = true) {
    DataLoaderConfig cfg;
    cfg.pattern = shard;
    cfg.B = 2;
    cfg.T = 16;
    cfg.verify_data = verify;
    DataLoader d(cfg);
}

static void read_tokenizer(const std::string& path) {
    Tokenizer tok(path);
    std::vector<int> ids;
    for (int i = 0; i < tok.vocab_size; i++) { ids.push_back(i); }
    volatile size_t n = complete_utf8(tok.decode(ids, true)).size() + tok.decode(ids).size();
    if (tok.kind == TOKENIZER_SENTENCEPIECE) {
        for (int id : tok.encode("<|q|>the and then \xE2\x81\x87\n\x01\xff the end")) { n += tok.decode(id).size(); }
    }
    (void)n;
}

static void read_tensor_file(const std::string& path, uint32_t kind) {
    TensorFileReader r(path, kind);
    volatile double sum = 0;
    for (const std::string& k : kIntKeys) { if (r.has_key(k)) { sum += (double)r.integer(k); } }
    for (const std::string& k : kRealKeys) { if (r.has_key(k)) { sum += r.real(k); } }
    sum += (double)r.str("norm").size();
    for (const std::string& name : kTensorNames) {
        if (!r.has_tensor(name)) { continue; }
        if (r.tensor(name).dtype == DTYPE_INT32) {
            for (int32_t v : r.ints(name)) { sum += v; }
        } else {
            for (float v : r.floats(name)) { sum += v; }
        }
    }
    r.floats("wte", 16 * 8);  // as a trainer asks: with the element count it expects
}

static void read_evalset(const std::string& path) {
    EvalSet es = load_evalset(path);
    volatile int64_t sum = (int64_t)es.description.size();
    for (const EvalItem& it : es.items) {
        for (int t : it.context) { sum += t; }
        for (size_t c = 0; c < it.choices.size(); c++) {
            for (int t : it.choices[c]) { sum += t; }
            sum += it.choice_chars[c] + it.gold;
        }
    }
}

// ---- mutations -------------------------------------------------------------------------

static void mutate(Bytes& b, SplitMix64& rng) {
    const int64_t interesting32[] = {0, 1, -1, 2, 255, 256, 65535, 65536, 0x7fffffff, (int64_t)0x80000000u,
                                     0x7ffffffe, -2, 1023, 1024, 1025, (int64_t)b.size(), (int64_t)b.size() / 4,
                                     (int64_t)b.size() * 2};
    const uint64_t interesting64[] = {0, 1, ~0ull, 64, 128, 1ull << 32, 1ull << 63, (1ull << 63) - 64, ~0ull - 63,
                                      (uint64_t)b.size(), (uint64_t)b.size() - 64, (uint64_t)b.size() + 64};
    int n = 1 + (int)rng.below(3);
    for (int m = 0; m < n; m++) {
        if (b.empty()) { b.push_back(0); }
        size_t size = b.size();
        switch (rng.below(9)) {
            case 0: {  // flip bits
                int flips = 1 + (int)rng.below(4);
                for (int i = 0; i < flips; i++) { b[rng.below(size)] ^= (uint8_t)(1u << rng.below(8)); }
                break;
            }
            case 1: b[rng.below(size)] = (uint8_t)rng.next(); break;
            case 2:
            case 3: {  // an aligned 32-bit word, mostly in the header
                size_t words = size / 4;
                if (words == 0) { break; }
                size_t w = rng.below(4) != 0 ? rng.below(std::min<size_t>(words, 16)) : rng.below(words);
                int64_t v = interesting32[rng.below(sizeof(interesting32) / sizeof(interesting32[0]))];
                if (rng.below(4) == 0) { v += (int64_t)rng.below(5) - 2; }
                uint32_t u = (uint32_t)v;
                memcpy(&b[4 * w], &u, 4);
                break;
            }
            case 4: {  // an aligned 64-bit word (tensor-file headers and tables)
                size_t words = size / 8;
                if (words == 0) { break; }
                size_t w = rng.below(2) != 0 ? rng.below(std::min<size_t>(words, 8)) : rng.below(words);
                uint64_t v = interesting64[rng.below(sizeof(interesting64) / sizeof(interesting64[0]))];
                memcpy(&b[8 * w], &v, 8);
                break;
            }
            case 5: b.resize(rng.below(size + 1)); break;  // truncate
            case 6: {                                       // append garbage
                size_t extra = 1 + rng.below(64);
                for (size_t i = 0; i < extra; i++) { b.push_back((uint8_t)rng.next()); }
                break;
            }
            case 7: {  // delete a chunk
                size_t at = rng.below(size), len = 1 + rng.below(std::min<size_t>(size - at, 64));
                b.erase(b.begin() + at, b.begin() + at + len);
                break;
            }
            case 8: {  // duplicate a chunk
                size_t at = rng.below(size), len = 1 + rng.below(std::min<size_t>(size - at, 64));
                Bytes chunk(b.begin() + at, b.begin() + at + len);
                b.insert(b.begin() + rng.below(size + 1), chunk.begin(), chunk.end());
                break;
            }
        }
    }
}

// ---- running one file in a child -------------------------------------------------------

enum Outcome { READ, REFUSED, BROKEN };

struct Result {
    Outcome outcome;
    std::string detail;  // the message (refused) or what went wrong (broken)
};

// The child ends here when fatal() calls exit(): at once with the same status, skipping the
// sanitizer's leak check at exit (it would triple the fuzz's time under ASan; the parent
// process still has it).
static void exit_at_once(int status, void*) {
    fflush(nullptr);
    _exit(status);
}

// The child's address space is capped at what it has plus 512 MiB (no seed needs a tenth of
// that), so a size taken on trust fails as std::bad_alloc (an abort: a failure) instead of
// passing by luck on a large machine: an eval set announcing 5e7 choices took 1.39 GB for a 5.6
// KB file. Not under ASan, whose shadow memory reserves terabytes of address space.
static void cap_memory() {
#if !defined(__SANITIZE_ADDRESS__)
    FILE* f = fopen("/proc/self/statm", "r");
    unsigned long pages = 0;
    if (f && fscanf(f, "%lu", &pages) == 1) {
        rlim_t cap = (rlim_t)pages * (rlim_t)sysconf(_SC_PAGESIZE) + (512ul << 20);
        struct rlimit r = {cap, cap};
        setrlimit(RLIMIT_AS, &r);
    }
    if (f) { fclose(f); }
#endif
}

static Result run_child(const std::function<void()>& reader, const std::string& must_name) {
    std::string out;
    int status = run_in_child(reader, &out, [] {
        alarm(10);
        cap_memory();
        on_exit(exit_at_once, nullptr);
    });
    if (WIFSIGNALED(status)) {
        int sig = WTERMSIG(status);
        return {BROKEN, std::string(sig == SIGALRM ? "hang (no result in 10 s)" : strsignal(sig)) + ": " + out};
    }
    int code = WEXITSTATUS(status);
    bool sanitizer = out.find("Sanitizer") != std::string::npos || out.find("runtime error") != std::string::npos;
    if (code == 0 && !sanitizer) { return {READ, ""}; }
    if (code == 1 && !sanitizer && out.find("error: ") != std::string::npos && out.find(must_name) != std::string::npos) {
        return {REFUSED, out};
    }
    return {BROKEN, "exit " + std::to_string(code) + (code == 1 ? " (refusal that does not name the file?)" : "") + ": " + out};
}

// the message with its numbers blanked, to count distinct kinds of refusal
static std::string message_kind(const std::string& msg) {
    std::string k;
    size_t start = msg.find("error: ");
    for (size_t i = start; i < msg.size() && msg[i] != '\n'; i++) {
        char c = msg[i];
        if (isdigit((unsigned char)c) || c == '-') {
            if (k.empty() || k.back() != '#') { k += '#'; }
        } else {
            k += c;
        }
    }
    return k;
}

struct Target {
    std::string name;
    std::string file;                  // the file that is mutated (others stay valid)
    Bytes seed;
    std::function<void()> read;        // reads the file (and its companions) as a trainer does
    std::vector<Bytes> crafted = {};   // hand-made mutants, read before the random ones
    bool checksummed = false;          // every mutant that changed the file must be refused
    int crc_slot = -1;                 // shards and sidecars: the header int of the CRC (its flag follows)
    int file_crc_slot = -1;            // tokenizer and eval sets of version 2: the CRC of the whole file but this int
    std::function<void()> open = {};   // the flip test's reader (default: read)
};

// Tensor-file mutants whose sums wrap around 2^64 (random mutation rarely lines up two
// fields like this): a data offset past the end with the data size wrapping back to the
// file size; a tensor's offset + size wrapping to a small number; a negative dimension
// whose byte count wraps to the stored size; a shape whose product overflows to it.
static std::vector<Bytes> crafted_tensor_files(const Bytes& seed) {
    auto u64 = [&](const Bytes& b, size_t at) { uint64_t v; memcpy(&v, &b[at], 8); return v; };
    auto set64 = [](Bytes& b, size_t at, uint64_t v) { memcpy(&b[at], &v, 8); };
    const uint64_t size = seed.size(), table = 64 + u64(seed, 16);  // the first entry is "wte" [16, 8] fp32
    std::vector<Bytes> out;
    Bytes b = seed;
    set64(b, 32, ~0ull - 63);
    set64(b, 40, size - (~0ull - 63));
    out.push_back(b);
    b = seed;
    set64(b, table + 104, ~0ull - 63);  // offset 2^64 - 64, 512 bytes: the sum wraps to 448
    out.push_back(b);
    b = seed;
    set64(b, table + 72, ~0ull);        // shape [-1, 8]: numel -8, 2^64 - 32 bytes
    set64(b, table + 112, ~0ull - 31);
    out.push_back(b);
    b = seed;
    set64(b, table + 72, (1ull << 62) + 16);  // [2^62 + 16, 8] x 4 bytes wraps to 512
    out.push_back(b);
    return out;
}

// Eval-set mutants whose counts only the file's size can refuse (the header agrees with them):
// 2^31 - 1 and 5e7 choices in the first item, 2^31 - 1 context tokens, 2^31 - 1 items. A
// version-2 seed's mutants are sealed (their CRC made to match), so the size check is what
// refuses them, not the checksum.
static std::vector<Bytes> crafted_evalsets(const Bytes& seed, bool version2) {
    auto set32 = [](Bytes& b, size_t at, int32_t v) { memcpy(&b[at], &v, 4); };
    int32_t desc_len;
    memcpy(&desc_len, &seed[4 * 8], 4);
    const size_t item0 = 1024 + (size_t)desc_len;
    std::vector<Bytes> out;
    for (int32_t n : {INT32_MAX, 50000000}) {
        Bytes b = seed;
        set32(b, 4 * 5, n);  // most choices in an item
        set32(b, item0, n);  // item 0's choices
        out.push_back(b);
    }
    Bytes b = seed;
    set32(b, 4 * 6, INT32_MAX);    // most tokens in an item
    set32(b, item0 + 8, INT32_MAX);  // item 0's context length
    out.push_back(b);
    b = seed;
    set32(b, 4 * 2, INT32_MAX);  // items
    out.push_back(b);
    if (version2) {
        for (Bytes& x : out) { x = sealed(x, EVAL_CRC_SLOT); }
        b = seed;
        b[4 * 7] ^= 1;  // contexts start with BOS -> not: only the CRC can tell
        out.push_back(b);
    }
    return out;
}

// Tokenizer mutants: a piece count of 2^31 - 1 (sealed in version 2: the size must refuse it);
// in version 2 also the bos id changed to another valid id and the CRC field set to 0.
static std::vector<Bytes> crafted_tokenizers(const Bytes& seed, bool version2) {
    auto set32 = [](Bytes& b, size_t at, int32_t v) { memcpy(&b[at], &v, 4); };
    Bytes b = seed;
    set32(b, 4 * 2, INT32_MAX);
    std::vector<Bytes> out = {version2 ? sealed(b, TOKENIZER_CRC_SLOT) : b};
    if (version2) {
        b = seed;
        set32(b, 4 * 4, 2);  // bos 1 -> 2
        out.push_back(b);
        b = seed;
        set32(b, 4 * TOKENIZER_CRC_SLOT, 0);
        out.push_back(b);
    }
    return out;
}

// A tensor file whose first table entry has a non-zero shape slot past its ndim (wte is 2-D:
// slot 2 set), with the header CRC recomputed in version 2, so only the shape check can refuse it.
static Bytes tensor_file_with_unused_shape_slot(const Bytes& seed, bool version2) {
    uint64_t meta_bytes, data_offset, seven = 7;
    memcpy(&meta_bytes, &seed[16], 8);
    memcpy(&data_offset, &seed[32], 8);
    Bytes b = seed;
    memcpy(&b[64 + meta_bytes + 72 + 8 * 2], &seven, 8);
    if (version2) {
        uint32_t c = tensor_file_header_crc(b.data(), b.data() + 64, data_offset - 64);
        memcpy(&b[TENSOR_FILE_HEADER_CRC_AT], &c, 4);
    }
    return b;
}

// The bytes the flip test flips: every byte of the headers, config text, tensor tables, name
// tables and padding (each is checked its own way); in the zero ints of a shard header one
// byte per int (one loop checks them all); inside a CRC-covered data range (tokens, labels,
// ids, tensor data) its first and last 8 bytes and every 7th between (a CRC-32 catches every
// change of up to 32 consecutive bits wherever it lies in the range, so these stand for the
// rest; 7 so the flipped bit moves through all eight). A third of the files of every byte.
static std::vector<size_t> flip_positions(const Target& t) {
    const Bytes& b = t.seed;
    if (t.file_crc_slot >= 0) {  // tokenizer, eval set: the header's fields, a byte of every 8th zero int
        std::vector<size_t> out;  // (one loop checks them all), a sample of the rest
        const size_t fields = 4 * (size_t)(t.file_crc_slot + 1);
        for (size_t i = 0; i < b.size(); i++) {
            bool zero_int = i >= fields && i < (size_t)DATA_HEADER_BYTES && (i / 4) % 8 == 0;
            bool body = i >= (size_t)DATA_HEADER_BYTES;
            if (i < fields || (zero_int && i % 4 == (i / 32) % 4) ||
                (body && ((i - DATA_HEADER_BYTES) % 7 == 0 || i + 8 >= b.size()))) {
                out.push_back(i);
            }
        }
        return out;
    }
    std::vector<std::pair<size_t, size_t>> data;  // [from, to) of each CRC-covered data range
    size_t zero_ints_from = 0, zero_ints_to = 0;   // shard-like: the header ints without a field
    if (t.crc_slot >= 0) {
        int32_t table_bytes = 0;
        if (t.name.rfind("exercises", 0) == 0) { memcpy(&table_bytes, &b[16], 4); }
        data.push_back({(size_t)DATA_HEADER_BYTES + table_bytes, b.size()});
        zero_ints_from = 4 * (t.crc_slot + 2);
        zero_ints_to = DATA_HEADER_BYTES;
    } else {
        uint64_t meta_bytes, n, data_offset;
        memcpy(&meta_bytes, &b[16], 8);
        memcpy(&n, &b[24], 8);
        memcpy(&data_offset, &b[32], 8);
        for (uint64_t k = 0; k < n; k++) {
            uint64_t off, nb;
            memcpy(&off, &b[64 + meta_bytes + 128 * k + 104], 8);
            memcpy(&nb, &b[64 + meta_bytes + 128 * k + 112], 8);
            data.push_back({data_offset + off, data_offset + off + nb});
        }
    }
    std::vector<size_t> out;
    for (size_t i = 0; i < b.size(); i++) {
        if (i >= zero_ints_from && i < zero_ints_to) {
            if (i % 4 == (i / 4) % 4) { out.push_back(i); }
            continue;
        }
        bool sampled = true;
        for (const auto& r : data) {
            if (i >= r.first && i < r.second) { sampled = i < r.first + 8 || i + 8 >= r.second || (i - r.first) % 7 == 0; }
        }
        if (sampled) { out.push_back(i); }
    }
    return out;
}

// What the refusal of a file with byte i flipped must say (besides the file): the part a
// checksum catches, or for the header fields that are checked one by one, just "error"; ""
// where reading is right too (a shard's CRC flag turned from 1 to 0: its CRC is still checked).
static std::function<std::string(size_t)> flip_expectations(const Target& t) {
    const Bytes& b = t.seed;
    if (t.file_crc_slot >= 0) {  // tokenizer, eval set: magic and version, then the zero ints, then the CRC
        // (an eval set's tokenizer record, two ints after its CRC, is a field the CRC covers)
        const size_t fields = 4 * (size_t)(t.file_crc_slot + 1 + (t.name.rfind("evalset", 0) == 0 ? 2 : 0));
        return [fields](size_t i) -> std::string {
            if (i < 8) { return "error: "; }
            if (i >= fields && i < (size_t)DATA_HEADER_BYTES) { return "must be 0 (corrupt header)"; }
            return "checksum mismatch";
        };
    }
    if (t.crc_slot >= 0) {  // shard or sidecar
        const std::string part = t.name.rfind("regions", 0) == 0     ? "checksum mismatch in the region labels"
                                 : t.name.rfind("exercises", 0) == 0 ? "checksum mismatch in the exercise names and ids"
                                                                     : "checksum mismatch in the tokens";
        const int slot = t.crc_slot;
        // an exercise sidecar's name table is checked name by name as the shard is inspected,
        // before its CRC: those errors say what is wrong with the table
        int32_t table_bytes = 0;
        if (t.name.rfind("exercises", 0) == 0) { memcpy(&table_bytes, &b[16], 4); }
        // a shard's tokenizer record (none in the seeds): a fingerprint without its flag is refused;
        // the flag's lowest bit makes it "recorded 0", which reads
        const int tokenizer_slot = t.name.rfind("shard", 0) == 0 ? SHARD_TOKENIZER_SLOT : -1;
        return [part, slot, table_bytes, tokenizer_slot](size_t i) -> std::string {
            if (i >= (size_t)DATA_HEADER_BYTES && i < (size_t)(DATA_HEADER_BYTES + table_bytes)) { return "error: "; }
            if (i >= (size_t)DATA_HEADER_BYTES || i / 4 == (size_t)slot) { return part; }
            if (i / 4 == (size_t)slot + 1) { return i % 4 == 0 && i % 8 == 0 ? "" : "(checksum flag) is"; }
            if (tokenizer_slot >= 0 && i / 4 == (size_t)tokenizer_slot) { return "with no tokenizer recorded"; }
            if (tokenizer_slot >= 0 && i / 4 == (size_t)tokenizer_slot + 1) {
                return i % 4 == 0 && i % 8 == 0 ? "" : "(tokenizer flag) is";
            }
            if (i / 4 > (size_t)slot + 1) { return "must be 0 (corrupt header)"; }
            return "error: ";
        };
    }
    uint64_t meta_bytes, n, data_offset;
    memcpy(&meta_bytes, &b[16], 8);
    memcpy(&n, &b[24], 8);
    memcpy(&data_offset, &b[32], 8);
    struct Span { uint64_t from, to; std::string name; };
    std::vector<Span> spans;
    for (uint64_t k = 0; k < n; k++) {
        const uint8_t* e = &b[64 + meta_bytes + 128 * k];
        uint64_t off, nb;
        memcpy(&off, e + 104, 8);
        memcpy(&nb, e + 112, 8);
        spans.push_back({data_offset + off, data_offset + off + nb, reinterpret_cast<const char*>(e)});
    }
    return [spans, data_offset](size_t i) -> std::string {
        if (i < TENSOR_FILE_HEADER_CRC_AT) { return "error: "; }  // magic, version, kind, sizes: each its own check
        if (i < TENSOR_FILE_HEADER_CRC_AT + 4 || (i >= 64 && i < data_offset)) {
            return "checksum mismatch in the header, config text or tensor table";
        }
        if (i < 64) { return "must be 0 (corrupt header)"; }
        for (const Span& s : spans) {
            if (i >= s.from && i < s.to) { return "tensor '" + s.name + "': checksum mismatch"; }
        }
        return "nonzero padding after the data of tensor";
    };
}

// The readers' targets, one directory each under `dir` (so a mutant never meets another target's
// files), with their valid seed files and hand-made mutants.
static std::vector<Target> make_targets(const std::string& dir) {
    auto sub = [&dir](const std::string& name) {
        std::string d = dir + "/" + name;
        if (mkdir(d.c_str(), 0755) != 0) { perror(d.c_str()); exit(2); }
        return d;
    };
    std::vector<int> toks = seed_tokens(240);
    std::vector<Target> targets;
    // the data files without checksums (CRC 0, as written before there were any), then with them
    for (bool crc : {false, true}) {
        for (const char* which : {"shard_u16", "regions", "exercises"}) {
            std::string w = std::string(which) + (crc ? "_crc" : "");
            std::string d = sub(w.c_str());
            std::string shard = d + "/fz_000000.bin";
            Bytes sb = shard_bytes(toks, SHARD_VERSION_U16), rb = regions_bytes((int)toks.size()),
                  eb = exercises_bytes((int)toks.size());
            if (crc) {
                sb = with_crc(sb, SHARD_CRC_SLOT);
                rb = with_crc(rb, REGIONS_CRC_SLOT);
                eb = with_crc(eb, EXERCISES_CRC_SLOT);
            }
            write_bytes(shard, sb);
            write_bytes(regions_path_for(shard), rb);
            write_bytes(exercises_path_for(shard), eb);
            const char c = which[0];
            std::string file = c == 's' ? shard : c == 'r' ? regions_path_for(shard) : exercises_path_for(shard);
            Target t{w, file, c == 's' ? sb : c == 'r' ? rb : eb, [shard] { read_data(shard); }};
            t.checksummed = crc;
            t.crc_slot = c == 'e' ? EXERCISES_CRC_SLOT : SHARD_CRC_SLOT;  // (the regions' slot is the shard's)
            t.open = [shard] { open_data(shard); };
            targets.push_back(t);
        }
        std::string w = crc ? "shard_u32_crc" : "shard_u32";
        std::string shard = sub(w.c_str()) + "/fz_000000.bin";
        Bytes sb = shard_bytes(toks, SHARD_VERSION_U32);
        Target t{w, shard, crc ? with_crc(sb, SHARD_CRC_SLOT) : sb, [shard] { read_data(shard); }};
        t.checksummed = crc;
        t.crc_slot = SHARD_CRC_SLOT;
        t.open = [shard] { open_data(shard); };
        targets.push_back(t);
    }
    // tokenizer files: version 1 (no checksum: the structural checks get fuzzed), then version 2
    for (int version : {TOKENIZER_VERSION_NO_CRC, TOKENIZER_VERSION}) {
        const bool v2 = version == TOKENIZER_VERSION;
        std::string name = v2 ? "tokenizer" : "tokenizer_v1";
        std::string path = sub(name) + "/tok.bin";
        Bytes seed = tokenizer_seed(version);
        Target t{name, path, seed, [path] { read_tokenizer(path); }, crafted_tokenizers(seed, v2)};
        t.checksummed = v2;
        t.file_crc_slot = v2 ? TOKENIZER_CRC_SLOT : -1;
        targets.push_back(t);
    }
    // tensor files: version 1 (no checksums: the structural checks get fuzzed), then version 2
    for (int version : {1, 2}) {
        for (uint32_t kind : {(uint32_t)TENSOR_FILE_CHECKPOINT, (uint32_t)TENSOR_FILE_DEBUG_STATE}) {
            std::string name = std::string(kind == TENSOR_FILE_CHECKPOINT ? "checkpoint" : "debug_state") +
                               (version == 1 ? "_v1" : "");
            std::string d = sub(name);
            std::string path = d + "/" + name + ".bin";
            Bytes seed = tensor_file_seed(d, kind);
            if (version == 1) { seed = as_version1(seed); }
            std::vector<Bytes> crafted = crafted_tensor_files(seed);
            crafted.push_back(tensor_file_with_unused_shape_slot(seed, version == 2));
            if (version == 2) {  // the version turned into 1 (no checksums): its CRCs are still there, refused
                crafted.push_back(seed);
                crafted.back()[8] = 1;
            }
            Target t{name, path, seed, [path, kind] { read_tensor_file(path, kind); }, crafted};
            t.checksummed = version == 2;
            targets.push_back(t);
        }
    }
    // eval sets: version 1 (no checksum), then version 2
    for (int version : {EVAL_VERSION_NO_CRC, EVAL_VERSION}) {
        for (int kind : {EVAL_MULTIPLE_CHOICE, EVAL_CLOZE}) {
            const bool v2 = version == EVAL_VERSION;
            std::string name = std::string(kind == EVAL_CLOZE ? "evalset_cloze" : "evalset_mc") + (v2 ? "" : "_v1");
            std::string path = sub(name) + "/eval.bin";
            Bytes seed = evalset_seed(kind, version);
            Target t{name, path, seed, [path] { read_evalset(path); }, crafted_evalsets(seed, v2)};
            t.checksummed = v2;
            t.file_crc_slot = v2 ? EVAL_CRC_SLOT : -1;
            targets.push_back(t);
        }
    }
    return targets;
}

// What the fuzz found over all targets; `broken` counts every failure.
struct FuzzCounts {
    int total = 0, broken = 0, silent = 0, crashed = 0;
};

// The seed of target `ti`, then its hand-made mutants and `cases` random ones (from FUZZ_SEED), each
// read in a child: a crash or hang, a refusal that does not name the file, or a changed checksummed
// file read counts as broken; the mutants must reach past the header checks.
static void fuzz_target(Target& t, size_t ti, int cases, uint64_t fuzz_seed, FuzzCounts& n) {
    write_bytes(t.file, t.seed);
    Result seed = run_child(t.read, t.file);
    CHECK(seed.outcome == READ);
    if (seed.outcome != READ) { fprintf(stderr, "seed of %s not read: %s\n", t.name.c_str(), seed.detail.c_str()); }
    int read = 0, refused = 0;
    std::set<std::string> kinds;
    const int n_crafted = (int)t.crafted.size();
    for (int c = -n_crafted; c < cases; c++) {  // c < 0: the hand-made mutants
        SplitMix64 rng(fuzz_seed * 0x9E3779B97F4A7C15ull ^ (ti << 32) ^ (uint64_t)c);
        Bytes b = t.seed;
        if (c < 0) { b = t.crafted[c + n_crafted]; }
        else { mutate(b, rng); }
        write_bytes(t.file, b);
        Result r = run_child(t.read, t.file);
        n.total++;
        if (r.outcome == READ) { read++; }
        if (r.outcome == REFUSED) {
            refused++;
            kinds.insert(message_kind(r.detail));
        }
        if (c < 0 && r.outcome == READ) {  // each hand-made mutant is corrupt: it must be refused
            n.broken++;
            n.silent++;
            fprintf(stderr, "FAIL %s hand-made mutant %d was read as if it were valid\n", t.name.c_str(), c + n_crafted);
        }
        // a checksummed file that changed must be refused; but a shard or sidecar whose CRC slot
        // and flag both became 0 is a file from before the checksums (read unchecked by design),
        // and one whose only change is its flag turned to 0 still has its CRC checked
        bool legacy = false;
        if (t.crc_slot >= 0 && b.size() >= (size_t)DATA_HEADER_BYTES) {
            uint32_t slot, flag;
            memcpy(&slot, &b[4 * t.crc_slot], 4);
            memcpy(&flag, &b[4 * t.crc_slot + 4], 4);
            Bytes flag_restored = b;
            memcpy(&flag_restored[4 * t.crc_slot + 4], &t.seed[4 * t.crc_slot + 4], 4);
            legacy = flag == 0 && (slot == 0 || flag_restored == t.seed);
        }
        if (t.checksummed && c >= 0 && r.outcome == READ && b != t.seed && !legacy) {
            n.broken++;
            n.silent++;
            std::string keep = t.file + ".case" + std::to_string(c);
            write_bytes(keep, b);
            fprintf(stderr, "FAIL %s case %d: a changed checksummed file was read (kept as %s)\n", t.name.c_str(), c,
                    keep.c_str());
        }
        if (r.outcome == BROKEN) {
            n.broken++;
            n.crashed++;
            std::string keep = t.file + ".case" + std::to_string(c);
            write_bytes(keep, b);
            fprintf(stderr, "FAIL %s case %d (FUZZ_SEED=%llu; file kept as %s): %s\n", t.name.c_str(), c,
                    (unsigned long long)fuzz_seed, keep.c_str(), r.detail.substr(0, 2000).c_str());
        }
    }
    write_bytes(t.file, t.seed);
    printf("%-14s %8d %8d %8d %16zu\n", t.name.c_str(), cases + n_crafted, read, refused, kinds.size());
    // the mutants must reach past the header checks: some read, several kinds of refusal
    // (shards and sidecars: their headers are checked whole, every int without a field must
    // be 0, so most mutants of a header word stop there; many distinct refusals show that the
    // others get past it)
    if (t.checksummed) {
        CHECK(kinds.size() >= 4);
    } else if (t.crc_slot >= 0) {
        CHECK(kinds.size() >= 8);
    } else {
        CHECK(read >= cases / 50);
        CHECK(kinds.size() >= 4);
    }
}

// Every byte of each checksummed file flipped (one bit): refused, naming the file and the part.
static void flip_every_byte(std::vector<Target>& targets) {
    Timer flip_timer;
    int flips = 0;
    for (Target& t : targets) {
        if (!t.checksummed) { continue; }
        auto expect = flip_expectations(t);
        int missed = 0;
        // (under ASan every 8th position: a fork costs ~5 ms of system time there, 2,121 forks
        // took 133 s at every other one; the plain build flips them all)
#if defined(__SANITIZE_ADDRESS__)
        const size_t stride = 8;
#else
        const size_t stride = 1;
#endif
        const std::vector<size_t> positions = flip_positions(t);
        for (size_t k = 0; k < positions.size(); k += stride) {
            const size_t i = positions[k];
            Bytes b = t.seed;
            b[i] ^= (uint8_t)(1u << (i % 8));
            write_bytes(t.file, b);
            Result r = run_child(t.open ? t.open : t.read, t.file);
            flips++;
            const std::string& needle = expect(i);
            bool ok = needle.empty() ? r.outcome != BROKEN
                                     : r.outcome == REFUSED && r.detail.find(needle) != std::string::npos;
            if (!ok) {
                if (missed++ < 5) {
                    fprintf(stderr, "FAIL %s: byte %zu flipped: %s (expected a refusal with \"%s\")\n", t.name.c_str(), i,
                            r.outcome == READ ? "read as valid" : r.detail.substr(0, 300).c_str(), needle.c_str());
                }
            }
        }
        write_bytes(t.file, t.seed);
        CHECK(missed == 0);
    }
    printf("%d files with one byte flipped in %.1f s\n", flips, flip_timer.ms() / 1e3);
}

// Files from before the checksums still read: a version-1 tensor file, tokenizer and eval set (with
// their notes), a CRC-0 shard even with a changed token; --verify-data 0 skips a shard's check.
static void check_files_before_checksums(std::vector<Target>& targets) {
    for (Target& t : targets) {
        std::string out;
        if (t.name == "tokenizer_v1" || t.name == "evalset_mc_v1") {
            write_bytes(t.file, t.seed);
            CHECK(run_child(t.read, t.file).outcome == READ);
            run_in_child(t.read, &out);
            CHECK(out.find("' is of version 1, without a checksum") != std::string::npos);
        }
        if (t.name == "checkpoint_v1") {
            write_bytes(t.file, t.seed);
            Result r = run_child(t.read, t.file);
            CHECK(r.outcome == READ);
            run_in_child(t.read, &out);
            CHECK(out.find("note: '" + t.file + "' is an attn.c tensor file of version 1, without checksums") !=
                  std::string::npos);
        }
        if (t.name == "shard_u16" || t.name == "shard_u16_crc") {
            Bytes b = t.seed;
            b[DATA_HEADER_BYTES + 10] ^= 1;  // a token id changes to another valid id
            write_bytes(t.file, b);
            const std::string shard = t.file;
            Result checked = run_child([shard] { open_data(shard, true); }, t.file);
            Result skipped = run_child([shard] { open_data(shard, false); }, t.file);
            if (t.name == "shard_u16") {
                CHECK(checked.outcome == READ);  // CRC 0 and no flag: none to check, and the loader says so
                CHECK(checked.detail.empty());
                std::string out;
                run_in_child([shard] { open_data(shard, true); }, &out);
                // (the shard and its two sidecars)
                CHECK(out.find("note: 3 files of data '" + shard + "' carry no checksum") != std::string::npos);
            } else {
                CHECK(checked.outcome == REFUSED && checked.detail.find("checksum mismatch in the tokens") != std::string::npos);
                CHECK(skipped.outcome == READ);
                b = t.seed;  // the CRC slot zeroed, its flag kept: a mismatch, not "none"
                memset(&b[4 * SHARD_CRC_SLOT], 0, 4);
                write_bytes(t.file, b);
                Result zeroed = run_child([shard] { open_data(shard, true); }, t.file);
                CHECK(zeroed.outcome == REFUSED && zeroed.detail.find("stored CRC32 00000000") != std::string::npos);
            }
            write_bytes(t.file, t.seed);
        }
    }
}

int main() {
    const char* cases_env = getenv("FUZZ_CASES");
    const char* seed_env = getenv("FUZZ_SEED");
#if defined(__SANITIZE_ADDRESS__)
    const int default_cases = 100;  // a forked child per mutant: under ASan a third of the plain build's
#else
    const int default_cases = 300;
#endif
    const int cases = cases_env ? atoi(cases_env) : default_cases;
    const uint64_t fuzz_seed = seed_env ? strtoull(seed_env, nullptr, 10) : 1;
    std::string dir = make_temp_dir("fuzz");
    Timer timer;
    std::vector<Target> targets = make_targets(dir);
    FuzzCounts n;
    printf("%-14s %8s %8s %8s %16s\n", "reader", "mutants", "read", "refused", "kinds of refusal");
    for (size_t ti = 0; ti < targets.size(); ti++) { fuzz_target(targets[ti], ti, cases, fuzz_seed, n); }
    flip_every_byte(targets);
    check_files_before_checksums(targets);
    CHECK(n.broken == 0);
    printf("%zu kinds of file, %d mutated files in %.1f s: %d crashed, hung or were refused without naming the file; "
           "%d changed checksummed files read\n", targets.size(), n.total, timer.ms() / 1e3, n.crashed, n.silent);
    if (n.broken == 0) { remove_dir(dir); }
    return report("test_fuzz_readers");
}
