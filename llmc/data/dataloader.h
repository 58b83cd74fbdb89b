/*
Data loader over llm.c-style token shards and their region and exercise sidecars. Host-only C++17.
It opens the shards matching the comma-separated glob(s), sorted, and checks each (headers, tables,
sizes, with cfg.verify_data the CRCs), errors naming the file. Each step, process r of P gets B
rows of T+1 tokens: windows cut from one shard (every token a target once), or with
cfg.whole_documents documents packed unsplit; next_batch() fills the batch arrays described at
DataLoader's members. position() / set_position() resume exactly. The formats: doc/formats.md
"Token shards" and the sidecars; windows, shuffling, resume and whole documents: doc/data.md.
*/
#pragma once

#include <glob.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "llmc/data/crc32.h"  // defines: crc32_update, crc32_of_file_range
#include "llmc/data/python_random.h"  // defines: PythonRandom
#include "llmc/data/tokenizer_record.h"
#include "llmc/utils.h"

constexpr int SHARD_MAGIC = 20240520;
constexpr int SHARD_VERSION_U16 = 1;
constexpr int SHARD_VERSION_U32 = 2;
constexpr int REGIONS_MAGIC = 20260311;
constexpr int REGIONS_VERSION = 1;
constexpr int EXERCISES_MAGIC = 20260314;
constexpr int EXERCISES_VERSION = 1;
constexpr int MAX_EXERCISES = 256;  // ids are uint8
constexpr const char* EXERCISE_NONE = "none";
constexpr int SHARD_CRC_SLOT = 3, REGIONS_CRC_SLOT = 3, EXERCISES_CRC_SLOT = 5;  // header ints holding CRCs
// (the int after each is its flag: 1 = the CRC is present; see the top)
constexpr int SHARD_TOKENIZER_SLOT = 5;  // the tokenizer's fingerprint; [6] its flag (1 = recorded)
constexpr int DATA_HEADER_INTS = 256;
constexpr long DATA_HEADER_BYTES = DATA_HEADER_INTS * 4;
enum Region : uint8_t { REGION_OTHER = 0, REGION_QUERY = 1, REGION_TRACE = 2, REGION_ANSWER = 3 };
// the regions by name, as validation prints and logs them
constexpr int kRegions = 4;
inline const char* region_name(int region) {
    static const char* names[kRegions] = {"other", "query", "trace", "answer"};
    return names[region];
}

// "dir/x_train_000001.bin" -> "dir/x_train_000001.regions"
inline std::string regions_path_for(const std::string& shard) {
    size_t n = shard.size();
    if (n >= 4 && shard.compare(n - 4, 4, ".bin") == 0) { return shard.substr(0, n - 4) + ".regions"; }
    return shard + ".regions";
}

// "dir/x_train_000001.bin" -> "dir/x_train_000001.exercises"
inline std::string exercises_path_for(const std::string& shard) {
    size_t n = shard.size();
    if (n >= 4 && shard.compare(n - 4, 4, ".bin") == 0) { return shard.substr(0, n - 4) + ".exercises"; }
    return shard + ".exercises";
}

// Expands comma-separated glob patterns into a sorted, de-duplicated list of shard files.
// `what` starts each error: the flag that gave the patterns ("--train-data: no file matches ...").
inline std::vector<std::string> glob_shards(const std::string& patterns, const std::string& what = "data shards") {
    std::vector<std::string> files;
    size_t start = 0;
    while (start <= patterns.size()) {
        size_t comma = patterns.find(',', start);
        if (comma == std::string::npos) { comma = patterns.size(); }
        std::string pat = patterns.substr(start, comma - start);
        start = comma + 1;
        if (pat.empty()) { continue; }
        glob_t g;
        int rc = glob(pat.c_str(), 0, nullptr, &g);
        if (rc != 0 && rc != GLOB_NOMATCH) { fatal("%s: glob failed for pattern '%s'", what.c_str(), pat.c_str()); }
        std::vector<std::string> here;
        size_t sidecars = 0;
        for (size_t i = 0; i < g.gl_pathc; i++) {
            std::string f = g.gl_pathv[i];
            auto ends = [&](const char* s) {
                size_t m = strlen(s);
                return f.size() >= m && f.compare(f.size() - m, m, s) == 0;
            };
            if (!ends(".regions") && !ends(".exercises") && !ends(".tmp")) {
                here.push_back(f);
            } else {
                sidecars++;
            }
        }
        globfree(&g);
        if (here.empty() && sidecars > 0) {
            fatal("%s: '%s' matches only sidecar files (.regions, .exercises, .tmp), no token shard", what.c_str(),
                  pat.c_str());
        }
        if (here.empty()) {
            fatal(pat.find_first_of("*?[") == std::string::npos ? "%s: no such file '%s'" : "%s: no file matches '%s'",
                  what.c_str(), pat.c_str());
        }
        files.insert(files.end(), here.begin(), here.end());
    }
    if (files.empty()) { fatal("%s: empty data pattern '%s'", what.c_str(), patterns.c_str()); }
    std::sort(files.begin(), files.end());
    files.erase(std::unique(files.begin(), files.end()), files.end());
    return files;
}

// Reads and checks a 256-int32 header; returns it. `kind` names the format in errors; the
// ints from `fields` on have no meaning and must be 0 (so a changed byte there is refused too).
inline std::vector<int32_t> read_data_header(CheckedFile& f, int magic, const char* kind, int fields) {
    long size = f.size();
    if (size < DATA_HEADER_BYTES) {
        fatal("file '%s' is truncated: %ld bytes, shorter than the %ld-byte %s header", f.path().c_str(), size,
              DATA_HEADER_BYTES, kind);
    }
    std::vector<int32_t> h;
    f.seek(0);
    f.read_vector(h, DATA_HEADER_INTS, "header");
    if (h[0] != magic) {
        const char* article = strchr("aeiou", kind[0]) ? "an" : "a";
        fatal("file '%s' is not %s %s: magic number %d, expected %d", f.path().c_str(), article, kind, h[0], magic);
    }
    if (h[2] < 0) { fatal("file '%s': negative token count %d in the %s header", f.path().c_str(), h[2], kind); }
    for (int k = fields; k < DATA_HEADER_INTS; k++) {
        if (h[k] != 0) { fatal("file '%s': %s header int [%d] is %d, must be 0 (corrupt header)", f.path().c_str(), kind, k, h[k]); }
    }
    return h;
}

// The files whose CRC this process has checked, by identity and modification (device, inode,
// size, mtime): each is read for its check once however many loaders open it, and again if it
// is rewritten.
class VerifiedFiles {
public:
    static bool contains(const std::string& path) { return get().has(key(path)); }
    static void add(const std::string& path) { get().insert(key(path)); }

private:
    static VerifiedFiles& get() {
        static VerifiedFiles v;
        return v;
    }
    static std::string key(const std::string& path) {
        struct stat st;
        if (stat(path.c_str(), &st) != 0) { return ""; }
        return std::to_string(st.st_dev) + ":" + std::to_string(st.st_ino) + ":" + std::to_string(st.st_size) + ":" +
               std::to_string(st.st_mtim.tv_sec) + "." + std::to_string(st.st_mtim.tv_nsec);
    }
    bool has(const std::string& k) {
        std::lock_guard<std::mutex> lock(mutex_);
        return !k.empty() && keys_.count(k) != 0;
    }
    void insert(const std::string& k) {
        std::lock_guard<std::mutex> lock(mutex_);
        if (!k.empty()) { keys_.insert(k); }
    }
    std::mutex mutex_;
    std::set<std::string> keys_;
};

// A data header's checksum: its CRC slot and whether the file has one (the flag after the slot
// is 1, or, in a file from before the flag, the slot is not 0).
struct DataCrc {
    uint32_t stored = 0;
    bool present = false;
};
inline DataCrc read_data_crc(const std::string& path, const char* kind, const std::vector<int32_t>& h, int slot) {
    const int flag = h[slot + 1];
    if (flag != 0 && flag != 1) {
        fatal("file '%s': %s header int [%d] (checksum flag) is %d, must be 0 or 1 (corrupt header)", path.c_str(),
              kind, slot + 1, flag);
    }
    return {(uint32_t)h[slot], flag == 1 || h[slot] != 0};
}

// Fails unless `computed` is the CRC a header holds (none: nothing to check).
inline void check_data_crc(const std::string& path, const char* kind, const char* what, DataCrc crc, uint32_t computed) {
    if (crc.present && crc.stored != computed) {
        fatal("%s '%s': checksum mismatch in the %s: stored CRC32 %08x, computed %08x (the file is corrupt)", kind,
              path.c_str(), what, crc.stored, computed);
    }
}

// Checks the CRC of bytes [from, end) of a file (none: nothing read), once per process
// (VerifiedFiles), reading it in pieces.
inline void verify_data_crc(const std::string& path, const char* kind, const char* what, long from, DataCrc stored) {
    if (!stored.present || VerifiedFiles::contains(path)) { return; }
    CheckedFile f(path, "rb");
    check_data_crc(path, kind, what, stored, crc32_of_file_range(f, from, f.size(), what));
    VerifiedFiles::add(path);
}

struct ShardInfo {
    std::string path, regions_path;  // regions_path empty when there is no sidecar
    std::string exercises_path;      // empty when there is no exercise sidecar
    std::vector<std::string> exercise_names;  // the sidecar's table (name 0 is "none")
    long exercise_ids_offset = 0;    // byte offset of the per-token ids in the sidecar
    DataCrc crc, regions_crc, exercises_crc;  // the headers' CRC-32s
    TokenizerRecord tokenizer;       // what the shard was tokenized with
    int version = 0;
    int width = 0;        // bytes per token
    int64_t ntok = 0;
    int64_t nwin = 0;     // windows of T+1 tokens
};

// Opens and validates one shard (and its sidecar if present).
inline ShardInfo inspect_shard(const std::string& path) {
    ShardInfo s;
    s.path = path;
    CheckedFile f(path, "rb");
    std::vector<int32_t> h = read_data_header(f, SHARD_MAGIC, "token shard", SHARD_TOKENIZER_SLOT + 2);
    s.crc = read_data_crc(path, "token shard", h, SHARD_CRC_SLOT);
    s.tokenizer = read_tokenizer_record(path, "token shard", h, SHARD_TOKENIZER_SLOT);
    s.version = h[1];
    if (s.version == SHARD_VERSION_U16) { s.width = 2; }
    else if (s.version == SHARD_VERSION_U32) { s.width = 4; }
    else { fatal("token shard '%s': unsupported version %d (1 = uint16, 2 = uint32)", path.c_str(), s.version); }
    s.ntok = h[2];
    long expect = DATA_HEADER_BYTES + (long)s.ntok * s.width;
    long size = f.size();
    if (size < expect) {
        fatal("token shard '%s' is truncated: header says %lld tokens (%ld bytes), file has %ld bytes",
              path.c_str(), (long long)s.ntok, expect, size);
    }
    if (size > expect) {
        fatal("token shard '%s': %ld bytes after the %lld tokens the header announces", path.c_str(),
              size - expect, (long long)s.ntok);
    }
    std::string rp = regions_path_for(path);
    if (file_exists(rp)) {
        CheckedFile r(rp, "rb");
        std::vector<int32_t> rh = read_data_header(r, REGIONS_MAGIC, "region sidecar", REGIONS_CRC_SLOT + 2);
        s.regions_crc = read_data_crc(rp, "region sidecar", rh, REGIONS_CRC_SLOT);
        if (rh[1] != REGIONS_VERSION) { fatal("region sidecar '%s': unsupported version %d", rp.c_str(), rh[1]); }
        if (rh[2] != s.ntok) {
            fatal("region sidecar '%s' has %d labels but its shard '%s' has %lld tokens", rp.c_str(), rh[2],
                  path.c_str(), (long long)s.ntok);
        }
        long rexpect = DATA_HEADER_BYTES + (long)s.ntok;
        long rsize = r.size();
        if (rsize != rexpect) {
            fatal("region sidecar '%s' %s: expected %ld bytes, file has %ld", rp.c_str(),
                  rsize < rexpect ? "is truncated" : "is too long", rexpect, rsize);
        }
        s.regions_path = rp;
    }
    std::string ep = exercises_path_for(path);
    if (file_exists(ep)) {
        CheckedFile e(ep, "rb");
        std::vector<int32_t> eh = read_data_header(e, EXERCISES_MAGIC, "exercise sidecar", EXERCISES_CRC_SLOT + 2);
        s.exercises_crc = read_data_crc(ep, "exercise sidecar", eh, EXERCISES_CRC_SLOT);
        if (eh[1] != EXERCISES_VERSION) { fatal("exercise sidecar '%s': unsupported version %d", ep.c_str(), eh[1]); }
        if (eh[2] != s.ntok) {
            fatal("exercise sidecar '%s' has %d ids but its shard '%s' has %lld tokens", ep.c_str(), eh[2],
                  path.c_str(), (long long)s.ntok);
        }
        int k = eh[3], table_bytes = eh[4];
        if (k < 1 || k > MAX_EXERCISES || table_bytes < 2 * k) {
            fatal("exercise sidecar '%s': bad name table in the header (%d names in %d bytes; 1..%d names)",
                  ep.c_str(), k, table_bytes, MAX_EXERCISES);
        }
        long eexpect = DATA_HEADER_BYTES + (long)table_bytes + (long)s.ntok;
        long esize = e.size();
        if (esize != eexpect) {
            fatal("exercise sidecar '%s' %s: expected %ld bytes, file has %ld", ep.c_str(),
                  esize < eexpect ? "is truncated" : "is too long", eexpect, esize);
        }
        std::vector<char> table;
        e.seek(DATA_HEADER_BYTES);
        e.read_vector(table, (size_t)table_bytes, "exercise names");
        if (table.back() != '\0') { fatal("exercise sidecar '%s': the name table does not end with a NUL", ep.c_str()); }
        for (size_t a = 0; a < table.size();) {
            size_t z = a;
            while (table[z] != '\0') { z++; }
            s.exercise_names.emplace_back(table.data() + a, z - a);
            a = z + 1;
        }
        if ((int)s.exercise_names.size() != k) {
            fatal("exercise sidecar '%s': the name table holds %zu names, the header says %d", ep.c_str(),
                  s.exercise_names.size(), k);
        }
        if (s.exercise_names[0] != EXERCISE_NONE) {
            fatal("exercise sidecar '%s': name 0 is '%s', must be '%s'", ep.c_str(), s.exercise_names[0].c_str(),
                  EXERCISE_NONE);
        }
        for (int i = 0; i < k; i++) {
            if (s.exercise_names[i].empty()) { fatal("exercise sidecar '%s': name %d is empty", ep.c_str(), i); }
            for (int j = 0; j < i; j++) {
                if (s.exercise_names[i] == s.exercise_names[j]) {
                    fatal("exercise sidecar '%s': name '%s' appears twice", ep.c_str(), s.exercise_names[i].c_str());
                }
            }
        }
        s.exercises_path = ep;
        s.exercise_ids_offset = DATA_HEADER_BYTES + table_bytes;
    }
    return s;
}

// Checks the CRCs of a shard and of its sidecars (each once per process; see the top).
inline void verify_shard(const ShardInfo& s) {
    verify_data_crc(s.path, "token shard", "tokens", DATA_HEADER_BYTES, s.crc);
    if (!s.regions_path.empty()) {
        verify_data_crc(s.regions_path, "region sidecar", "region labels", DATA_HEADER_BYTES, s.regions_crc);
    }
    if (!s.exercises_path.empty()) {
        verify_data_crc(s.exercises_path, "exercise sidecar", "exercise names and ids", DATA_HEADER_BYTES, s.exercises_crc);
    }
}

// Says, once per process and pattern, that files of the data carry no checksum (written before
// there were any, or by llm.c), so their contents are not verified: never silently.
inline void note_unchecked_files(const std::string& pattern, int64_t files) {
    static std::mutex mutex;
    static std::set<std::string> noted;
    std::lock_guard<std::mutex> lock(mutex);
    if (!noted.insert(pattern).second) { return; }
    fprintf(stderr, "note: %lld file%s of data '%s' carr%s no checksum (written before there were any, or by llm.c): "
            "%s not verified\n", (long long)files, files == 1 ? "" : "s", pattern.c_str(), files == 1 ? "ies" : "y",
            files == 1 ? "its contents are" : "their contents are");
}

// Reads a whole shard into int32 (whole-document packing, fixedseqqk, tools and tests);
// `verify`: check its CRC on the bytes read (unless this process has already).
inline std::vector<int32_t> read_token_shard(const std::string& path, bool verify = true) {
    ShardInfo s = inspect_shard(path);
    CheckedFile f(path, "rb");
    f.seek(DATA_HEADER_BYTES);
    std::vector<int32_t> out(s.ntok);
    const bool check = verify && s.crc.present && !VerifiedFiles::contains(path);
    uint32_t c = 0;
    if (s.width == 2) {
        std::vector<uint16_t> t;
        f.read_vector(t, s.ntok, "tokens");
        if (check) { c = crc32_update(0, t.data(), t.size() * 2); }
        for (int64_t i = 0; i < s.ntok; i++) { out[i] = t[i]; }
    } else {
        std::vector<uint32_t> t;
        f.read_vector(t, s.ntok, "tokens");
        if (check) { c = crc32_update(0, t.data(), t.size() * 4); }
        for (int64_t i = 0; i < s.ntok; i++) { out[i] = (int32_t)t[i]; }
    }
    if (check) {
        check_data_crc(path, "token shard", "tokens", s.crc, c);
        VerifiedFiles::add(path);
    }
    return out;
}

// splitmix64: a small deterministic generator (same sequence on every platform)
struct SplitMix64 {
    uint64_t state;
    explicit SplitMix64(uint64_t seed) : state(seed) {}
    uint64_t next() {
        uint64_t z = (state += 0x9E3779B97F4A7C15ull);
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        return z ^ (z >> 31);
    }
    uint64_t below(uint64_t n) { return (uint64_t)(((unsigned __int128)next() * n) >> 64); }  // [0, n)
};

// permutation of 0..n-1 (Fisher-Yates)
inline void seeded_permutation(std::vector<int64_t>& p, int64_t n, uint64_t seed) {
    p.resize(n);
    for (int64_t i = 0; i < n; i++) { p[i] = i; }
    SplitMix64 rng(seed);
    for (int64_t i = n - 1; i > 0; i--) { std::swap(p[i], p[(int64_t)rng.below(i + 1)]); }
}

// How whole-document mode draws sample_documents: uniformly over the data (reservoir), as the
// SAN paper's eval code, 1 in kPaperSampleEvery of the head of the data until N are kept, or
// uniformly over the exercises that fit a row (documents of at most T+1 tokens with a query
// token: on data that mixes exercises with other documents, N exercises are packed; doc/data.md
// "Whole-document evaluation").
enum class DocDraw { Uniform, PaperHead, Exercises };
constexpr int kPaperSampleEvery = 10;

struct DataLoaderConfig {
    std::string pattern;       // glob(s), comma-separated
    int B = 1, T = 1;          // rows per process, tokens per row (windows are T+1)
    int rank = 0, nproc = 1;   // this process and the number of processes
    bool shuffle = false;
    uint64_t seed = 0;
    int doc_start_token = -1;  // token that starts a document (BOS); -1: no document ids
    int vocab_size = 0;        // > 0: every token read is checked to be below it
    // Evaluation: rows of whole documents (delimited by doc_start_token), never split;
    // documents longer than T+1 skipped; the rest of a row padded with pad_token and
    // target -1 (doc/data.md "Whole-document evaluation"). Needs doc_start_token >= 0 and no
    // shuffle.
    bool whole_documents = false;
    int pad_token = 0;         // input id of padding positions (any id: they come after every real token)
    // Whole-document mode: > 0 reads a seeded sample of this many documents, not all (doc/data.md
    // "Whole-document evaluation"); the same files, T, N and seed give the same sample on every
    // machine.
    int64_t sample_documents = 0;
    uint64_t sample_seed = 0;
    DocDraw sample_draw = DocDraw::Uniform;
    bool verify_data = true;   // check each file's CRC-32 once when opening (--verify-data)
};

struct DataPosition {
    int64_t epoch = 0, step = 0;
    uint64_t fingerprint = 0;
};

class DataLoader {
public:
    explicit DataLoader(const DataLoaderConfig& cfg) : B(cfg.B), T(cfg.T), cfg_(cfg) {
        if (B < 1 || T < 1) { fatal("data loader: B and T must be positive (got B=%d, T=%d)", B, T); }
        if (cfg.nproc < 1 || cfg.rank < 0 || cfg.rank >= cfg.nproc) {
            fatal("data loader: bad rank %d of %d processes", cfg.rank, cfg.nproc);
        }
        if (cfg.whole_documents) {
            if (cfg.doc_start_token < 0) {
                fatal("data loader: whole_documents needs a document-start token (doc_start_token, got %d; data '%s')",
                      cfg.doc_start_token, cfg.pattern.c_str());
            }
            if (cfg.shuffle) { fatal("data loader: whole_documents reads in file order; turn shuffle off (data '%s')", cfg.pattern.c_str()); }
            if (cfg.pad_token < 0 || (cfg.vocab_size > 0 && cfg.pad_token >= cfg.vocab_size)) {
                fatal("data loader: pad_token %d is outside the vocabulary (size %d)", cfg.pad_token, cfg.vocab_size);
            }
        }
        exercise_names.push_back(EXERCISE_NONE);
        int64_t offset = 0;
        int64_t unchecked = 0;  // files without a checksum (from before there were any)
        for (const std::string& f : glob_shards(cfg.pattern)) {
            ShardInfo s = inspect_shard(f);
            if (cfg.verify_data) { verify_shard(s); }
            unchecked += !s.crc.present + (!s.regions_path.empty() && !s.regions_crc.present) +
                         (!s.exercises_path.empty() && !s.exercises_crc.present);
            s.nwin = s.ntok >= 1 ? (s.ntok - 1) / T : 0;
            has_regions = has_regions || !s.regions_path.empty();
            has_exercises = has_exercises || !s.exercises_path.empty();
            num_windows_ += s.nwin;
            exercise_map_.push_back(map_exercise_names(s));
            shard_start_.push_back(offset);
            offset += s.ntok;
            shards_.push_back(s);
        }
        if (unchecked > 0 && cfg.verify_data && cfg.rank == 0) { note_unchecked_files(cfg.pattern, unchecked); }
        shard_start_.push_back(offset);
        int64_t global = (int64_t)B * cfg.nproc;
        if (cfg.whole_documents) {
            pack_documents();
            steps_per_epoch_ = (num_rows_ + global - 1) / global;
            if (steps_per_epoch_ < 1) {
                fatal("data '%s' holds no whole document of at most %d tokens (%lld skipped as longer)",
                      cfg.pattern.c_str(), T + 1, (long long)num_skipped_documents_);
            }
        } else {
            num_rows_ = num_windows_;
            steps_per_epoch_ = num_windows_ / global;
            if (steps_per_epoch_ < 1) {
                fatal("data '%s' holds %lld windows of %d tokens, fewer than one global batch of %d x %d processes",
                      cfg.pattern.c_str(), (long long)num_windows_, T + 1, B, cfg.nproc);
            }
        }
        // fingerprint of everything that decides the sample order
        SplitMix64 h((uint64_t)num_rows_ * 1000003u + (uint64_t)T);
        uint64_t fp = h.next() ^ (uint64_t)global * 0x9E3779B97F4A7C15ull;
        fp = SplitMix64(fp ^ (cfg.shuffle ? cfg.seed * 2 + 1 : 0)).next();
        if (cfg.whole_documents) { fp = SplitMix64(fp ^ 0x5EEDull).next(); }  // window mode keeps its old value
        if (cfg.sample_documents > 0) { fp = SplitMix64(fp ^ cfg.sample_seed ^ (uint64_t)cfg.sample_documents).next(); }
        if (cfg.sample_documents > 0 && cfg.sample_draw == DocDraw::PaperHead) { fp = SplitMix64(fp ^ 0x4EADull).next(); }
        for (const ShardInfo& s : shards_) { fp = SplitMix64(fp ^ (uint64_t)s.ntok).next(); }
        fingerprint_ = fp;
        tokens.resize((size_t)B * (T + 1));
        regions.assign((size_t)B * (T + 1), 0);
        exercises.assign((size_t)B * (T + 1), 0);
        doc_ids.assign((size_t)B * (T + 1), 0);
        inputs.resize((size_t)B * T);
        targets.resize((size_t)B * T);
        set_position(DataPosition{0, 0, fingerprint_});
    }

    const int B, T;
    bool has_regions = false;
    bool has_exercises = false;                // some shard has an exercise sidecar
    // The batch, row-major, row b at b*(T+1) (at b*T in inputs and targets):
    //   tokens  B x (T+1) int32   the rows; inputs = tokens[.., 0..T-1], targets = tokens[.., 1..T]
    //   inputs, targets  B x T    (copies; targets are -1 only where whole-document mode pads)
    //   regions, exercises B x (T+1) uint8   the sidecars' labels of the same positions (0: none;
    //                             exercises index exercise_names)
    //   doc_ids B x (T+1) int32   document index within the row, +1 at every doc_start_token (BOS);
    //                             the causal document mask: i sees j iff j <= i and doc_ids equal
    std::vector<int32_t> tokens, inputs, targets, doc_ids;
    std::vector<uint8_t> regions, exercises;
    std::vector<std::string> exercise_names;   // exercise id -> name; [0] = "none"

    const DataLoaderConfig& config() const { return cfg_; }
    int64_t steps_per_epoch() const { return steps_per_epoch_; }
    int64_t num_windows() const { return num_windows_; }
    // rows per epoch: the windows, or in whole-document mode the packed rows (without the
    // empty rows that complete the last step)
    int64_t num_rows() const { return num_rows_; }
    // whole-document mode: documents packed into rows, and those skipped as longer than T+1
    // (with sample_documents: of the documents drawn)
    int64_t num_documents() const { return (int64_t)doc_start_.size(); }
    int64_t num_skipped_documents() const { return num_skipped_documents_; }
    // with sample_documents: the documents the draw went through (DocDraw::PaperHead: the head
    // of the data up to the N-th kept; DocDraw::Uniform: all of them)
    int64_t num_documents_visited() const { return num_documents_visited_; }
    // DocDraw::Exercises: the documents it drew from (at most T+1 tokens, a query token)
    int64_t num_drawable_documents() const { return num_drawable_documents_; }
    size_t num_shards() const { return shards_.size(); }
    // the shard this process's first row of the last batch came from (-1: whole documents, or none
    // yet): where the data changes corpus, the divergence guard says so (llmc/train/training.h)
    int64_t batch_shard() const { return batch_shard_; }
    const std::vector<ShardInfo>& shards() const { return shards_; }

    DataPosition position() const { return DataPosition{epoch_, step_, fingerprint_}; }
    void set_position(const DataPosition& p) {
        if (p.fingerprint != fingerprint_) {
            fatal("data loader: the resume position was saved for different data or settings (fingerprint "
                  "%llx, this run %llx; data '%s')", (unsigned long long)p.fingerprint,
                  (unsigned long long)fingerprint_, cfg_.pattern.c_str());
        }
        if (p.epoch < 0 || p.step < 0 || p.step >= steps_per_epoch_) {
            fatal("data loader: bad resume position epoch %lld step %lld (%lld steps per epoch)",
                  (long long)p.epoch, (long long)p.step, (long long)steps_per_epoch_);
        }
        if (p.epoch != epoch_ || order_.empty()) { build_epoch_order(p.epoch); }
        step_ = p.step;
    }
    void reset() { set_position(DataPosition{0, 0, fingerprint_}); }

    // The window of global sample index g of the current epoch: (shard, window within shard).
    void locate(int64_t g, int64_t* shard, int64_t* window) {
        int64_t p = std::upper_bound(cum_.begin(), cum_.end(), g) - cum_.begin() - 1;
        int64_t sh = order_[p];
        int64_t w = g - cum_[p];
        if (cfg_.shuffle) {
            if (perm_shard_ != sh) {
                seeded_permutation(perm_, shards_[sh].nwin, mix(cfg_.seed, (uint64_t)epoch_, (uint64_t)sh + 1));
                perm_shard_ = sh;
            }
            w = perm_[w];
        }
        *shard = sh;
        *window = w;
    }

    // Fills tokens/inputs/targets/regions/doc_ids with this process's rows of the current
    // step, then advances (to the next epoch after its last step). A shard of n tokens holds
    // (n - 1) / T windows of T+1 tokens; an epoch orders all windows (file order, or permuted
    // from (seed, epoch)); at step s, process r of P gets the B rows from s*B*P + r*B, so the
    // processes together read each window at most once.
    void next_batch() {
        int64_t base = step_ * (int64_t)B * cfg_.nproc + (int64_t)cfg_.rank * B;
        batch_shard_ = -1;
        for (int b = 0; b < B; b++) {
            size_t o = (size_t)b * (T + 1);
            if (cfg_.whole_documents) {
                fill_document_row(base + b, &tokens[o], &regions[o], &exercises[o]);
                continue;
            }
            int64_t sh, w;
            locate(base + b, &sh, &w);
            read_range(sh, w * T, T + 1, &tokens[o], &regions[o], &exercises[o]);
            if (b == 0) { batch_shard_ = sh; }
        }
        for (int b = 0; b < B; b++) {
            const int32_t* row = &tokens[(size_t)b * (T + 1)];
            int32_t* d = &doc_ids[(size_t)b * (T + 1)];
            int32_t id = 0;
            d[0] = 0;
            for (int t = 1; t <= T; t++) {
                if (cfg_.doc_start_token >= 0 && row[t] == cfg_.doc_start_token) { id++; }
                d[t] = id;
            }
            std::copy(row, row + T, &inputs[(size_t)b * T]);
            std::copy(row + 1, row + T + 1, &targets[(size_t)b * T]);
            if (cfg_.whole_documents) {
                const uint8_t* scored = &row_scored_[(size_t)b * (T + 1)];
                for (int t = 0; t < T; t++) {
                    if (!scored[t + 1]) { targets[(size_t)b * T + t] = -1; }
                }
            }
        }
        step_++;
        if (step_ == steps_per_epoch_) {
            build_epoch_order(epoch_ + 1);
            step_ = 0;
        }
    }

private:
    static uint64_t mix(uint64_t a, uint64_t b, uint64_t c) {
        SplitMix64 r(a ^ 0xD1B54A32D192ED03ull);
        uint64_t x = r.next() ^ b;
        x = SplitMix64(x).next() ^ c;
        return SplitMix64(x).next();
    }

    void build_epoch_order(int64_t epoch) {
        epoch_ = epoch;
        int64_t n = (int64_t)shards_.size();
        if (cfg_.shuffle) {
            seeded_permutation(order_, n, mix(cfg_.seed, (uint64_t)epoch, 0));
        } else {
            order_.resize(n);
            for (int64_t i = 0; i < n; i++) { order_[i] = i; }
        }
        cum_.assign(n + 1, 0);
        for (int64_t i = 0; i < n; i++) { cum_[i + 1] = cum_[i] + shards_[order_[i]].nwin; }
        perm_shard_ = -1;
    }

    // Local-to-global exercise ids of one shard, adding its names to exercise_names.
    std::vector<uint8_t> map_exercise_names(const ShardInfo& s) {
        std::vector<uint8_t> map;
        for (const std::string& name : s.exercise_names) {
            size_t g = std::find(exercise_names.begin(), exercise_names.end(), name) - exercise_names.begin();
            if (g == exercise_names.size()) {
                if ((int)g == MAX_EXERCISES) {
                    fatal("exercise sidecar '%s': the data names more than %d exercises", s.exercises_path.c_str(),
                          MAX_EXERCISES);
                }
                exercise_names.push_back(name);
            }
            map.push_back((uint8_t)g);
        }
        return map;
    }

    // Reads n tokens from `first` on of shard sh, with their region labels and global exercise ids.
    void read_range(int64_t sh, int64_t first, int n, int32_t* out, uint8_t* reg, uint8_t* ex) {
        const ShardInfo& s = shards_[sh];
        if (open_shard_ != sh) {
            file_.reset(new CheckedFile(s.path, "rb"));
            rfile_.reset(s.regions_path.empty() ? nullptr : new CheckedFile(s.regions_path, "rb"));
            efile_.reset(s.exercises_path.empty() ? nullptr : new CheckedFile(s.exercises_path, "rb"));
            open_shard_ = sh;
        }
        file_->seek(DATA_HEADER_BYTES + first * s.width);
        if (s.width == 2) {
            buf16_.resize(n);
            file_->read(buf16_.data(), (size_t)n * 2, "tokens");
            for (int t = 0; t < n; t++) { out[t] = buf16_[t]; }
        } else {
            buf32_.resize(n);
            file_->read(buf32_.data(), (size_t)n * 4, "tokens");
            for (int t = 0; t < n; t++) { out[t] = (int32_t)buf32_[t]; }
        }
        if (cfg_.vocab_size > 0) {
            for (int t = 0; t < n; t++) {
                if (out[t] < 0 || out[t] >= cfg_.vocab_size) {
                    fatal("token shard '%s': token %u at position %lld is outside the vocabulary (size %d)",
                          s.path.c_str(), (unsigned)out[t], (long long)(first + t), cfg_.vocab_size);
                }
            }
        }
        if (rfile_) {
            rfile_->seek(DATA_HEADER_BYTES + first);
            rfile_->read(reg, (size_t)n, "region labels");
            for (int t = 0; t < n; t++) {
                if (reg[t] > REGION_ANSWER) {
                    fatal("region sidecar '%s': label %d at position %lld is not 0..3", s.regions_path.c_str(),
                          reg[t], (long long)(first + t));
                }
            }
        } else {
            std::fill(reg, reg + n, (uint8_t)0);
        }
        if (efile_) {
            const std::vector<uint8_t>& map = exercise_map_[sh];
            efile_->seek(s.exercise_ids_offset + first);
            efile_->read(ex, (size_t)n, "exercise ids");
            for (int t = 0; t < n; t++) {
                if (ex[t] >= map.size()) {
                    fatal("exercise sidecar '%s': id %d at position %lld is outside its table of %zu names",
                          s.exercises_path.c_str(), ex[t], (long long)(first + t), map.size());
                }
                ex[t] = map[ex[t]];
            }
        } else {
            std::fill(ex, ex + n, (uint8_t)0);
        }
    }

    // Reads n tokens from global offset `first` of the data (shards back to back in file order).
    void read_span(int64_t first, int n, int32_t* out, uint8_t* reg, uint8_t* ex) {
        while (n > 0) {
            int64_t sh = std::upper_bound(shard_start_.begin(), shard_start_.end(), first) - shard_start_.begin() - 1;
            int64_t local = first - shard_start_[sh];
            int take = (int)std::min<int64_t>(n, shards_[sh].ntok - local);
            read_range(sh, local, take, out, reg, ex);
            first += take;
            n -= take;
            out += take;
            reg += take;
            ex += take;
        }
    }

    // Whole-document mode: visits every document of the data, (global start, length), in file
    // order: doc_start_token to the next one across shards, the last one to the end.
    template <typename Visit>
    int64_t for_each_document(Visit visit) {
        const int64_t total = shard_start_.back();
        int64_t previous = -1, count = 0;
        for (size_t sh = 0; sh < shards_.size(); sh++) {
            std::vector<int32_t> toks = read_token_shard(shards_[sh].path, cfg_.verify_data);
            for (size_t i = 0; i < toks.size(); i++) {
                if (toks[i] != cfg_.doc_start_token) { continue; }
                const int64_t start = shard_start_[sh] + (int64_t)i;
                if (previous >= 0) { visit(previous, start - previous), count++; }
                previous = start;
            }
        }
        if (previous >= 0) { visit(previous, total - previous), count++; }
        return count;
    }

    // Whole-document mode: finds the documents (all, or the sample_documents drawn), skips
    // those longer than T+1 and packs the rest greedily into rows.
    void pack_documents() {
        int fill = T + 1;  // the current row is full: the first document opens a row
        auto pack = [&](int64_t start, int64_t len) {
            if (len > T + 1) {
                num_skipped_documents_++;
                return;
            }
            if (fill + len > T + 1) {
                row_begin_.push_back((int64_t)doc_start_.size());
                fill = 0;
            }
            doc_start_.push_back(start);
            doc_len_.push_back((int32_t)len);
            fill += (int)len;
        };
        const int64_t n = cfg_.sample_documents;
        std::vector<std::pair<int64_t, int64_t>> drawn;  // reservoir of (start, length)
        SplitMix64 rng(cfg_.sample_seed);
        PythonRandom head_rng(cfg_.sample_seed);
        const bool head = n > 0 && cfg_.sample_draw == DocDraw::PaperHead;
        const bool exercises = n > 0 && cfg_.sample_draw == DocDraw::Exercises;
        std::vector<int32_t> span_tok((size_t)T + 1);
        std::vector<uint8_t> span_reg((size_t)T + 1), span_ex((size_t)T + 1);
        auto is_exercise = [&](int64_t start, int64_t len) {  // fits a row and holds a query token
            if (len > T + 1) { return false; }
            read_span(start, (int)len, span_tok.data(), span_reg.data(), span_ex.data());
            return std::find(span_reg.begin(), span_reg.begin() + len, (uint8_t)REGION_QUERY) != span_reg.begin() + len;
        };
        int64_t index = 0, kept = 0;  // the document visited (Exercises: drawable), from 0; PaperHead: those packed
        const int64_t seen = for_each_document([&](int64_t start, int64_t len) {
            if (exercises && !is_exercise(start, len)) { return; }
            const int64_t i = index++;
            if (head) {  // (for_each_document visits every document: past the N-th kept, none is drawn)
                if (kept == n) { return; }
                num_documents_visited_ = i + 1;
                if (head_rng.random() >= 1.0 / kPaperSampleEvery) { return; }
                if (len <= T + 1) { kept++; }
                pack(start, len);
            } else if (n <= 0) {
                pack(start, len);
            } else if (i < n) {
                drawn.push_back({start, len});
            } else if (const uint64_t j = rng.below((uint64_t)i + 1); j < (uint64_t)n) {
                drawn[j] = {start, len};
            }
        });
        if (seen == 0) {
            fatal("data '%s' has no document-start token %d, so whole_documents finds no document",
                  cfg_.pattern.c_str(), cfg_.doc_start_token);
        }
        if (n > 0 && !head) { num_documents_visited_ = seen; }
        if (exercises && index == 0) {
            fatal("data '%s' has no exercise to draw: no document of at most %d tokens holds a query token "
                  "(the draw of exercises needs region sidecars)", cfg_.pattern.c_str(), T + 1);
        }
        if (exercises) { num_drawable_documents_ = index; }
        std::sort(drawn.begin(), drawn.end());
        for (const auto& [start, len] : drawn) { pack(start, len); }
        num_rows_ = (int64_t)row_begin_.size();
        row_begin_.push_back((int64_t)doc_start_.size());
        row_scored_.assign((size_t)B * (T + 1), 0);
    }

    // Whole-document mode: row g of the epoch (empty when g is past the last row); marks in
    // row_scored_ the positions whose token is a scored target.
    void fill_document_row(int64_t g, int32_t* out, uint8_t* reg, uint8_t* ex) {
        int64_t b = (out - tokens.data()) / (T + 1);
        uint8_t* scored = &row_scored_[(size_t)b * (T + 1)];
        std::fill(scored, scored + T + 1, (uint8_t)0);
        int fill = 0;
        if (g < num_rows_) {
            for (int64_t k = row_begin_[g]; k < row_begin_[g + 1]; k++) {
                read_span(doc_start_[k], doc_len_[k], out + fill, reg + fill, ex + fill);
                std::fill(scored + fill + 1, scored + fill + doc_len_[k], (uint8_t)1);
                fill += doc_len_[k];
            }
        }
        std::fill(out + fill, out + T + 1, cfg_.pad_token);
        std::fill(reg + fill, reg + T + 1, (uint8_t)0);
        std::fill(ex + fill, ex + T + 1, (uint8_t)0);
    }

    DataLoaderConfig cfg_;
    std::vector<ShardInfo> shards_;
    int64_t num_windows_ = 0, num_rows_ = 0, steps_per_epoch_ = 0;
    std::vector<int64_t> shard_start_;               // global offset of each shard's first token (+ total)
    std::vector<std::vector<uint8_t>> exercise_map_;  // per shard: local exercise id -> global
    // whole-document mode: kept documents (global start, length), row r = documents
    // [row_begin_[r], row_begin_[r+1]); row_scored_ marks the scored targets of the batch
    std::vector<int64_t> doc_start_, row_begin_;
    std::vector<int32_t> doc_len_;
    std::vector<uint8_t> row_scored_;
    int64_t num_skipped_documents_ = 0;
    int64_t num_documents_visited_ = 0;
    int64_t num_drawable_documents_ = 0;  // DocDraw::Exercises: the exercises that fit a row
    uint64_t fingerprint_ = 0;
    int64_t epoch_ = -1, step_ = 0;
    int64_t batch_shard_ = -1;  // batch_shard()
    std::vector<int64_t> order_, cum_, perm_;
    int64_t perm_shard_ = -1, open_shard_ = -1;
    std::unique_ptr<CheckedFile> file_, rfile_, efile_;
    std::vector<uint16_t> buf16_;
    std::vector<uint32_t> buf32_;
};
