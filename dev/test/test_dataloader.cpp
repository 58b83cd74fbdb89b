/*
Tests llmc/data/dataloader.h on fixture shards it writes itself (by hand, from the format in
doc/formats.md, independently of the Python writer): headers of both token widths,
window contents, rank sharding (P processes together = one process with a P-times larger
batch; every window at most once per epoch), seeded shuffling, exact resume, region
labels and exercise ids (remapped from per-shard tables to one) lining up with tokens,
document ids, whole-document rows checked against plain loops over the tokens, and clear
failures on bad files.
  make build/host-bf16/test_dataloader
*/
#include <map>
#include <set>

#include "llmc/data/dataloader.h"
#include "dev/test/data_test_util.h"

static std::string g_dir;

// writes a shard of the given version (1 = uint16, 2 = uint32) with raw header fields
static void write_shard(const std::string& path, const std::vector<uint32_t>& toks, int version,
                        int magic = SHARD_MAGIC, int64_t claimed = -1, long cut_bytes = 0) {
    std::vector<uint8_t> b = header_bytes({magic, version, (int32_t)(claimed >= 0 ? claimed : (int64_t)toks.size())});
    for (uint32_t t : toks) {
        if (version == 1) { append_le<uint16_t>(b, (uint16_t)t); } else { append_le<uint32_t>(b, t); }
    }
    b.resize(b.size() - cut_bytes);
    write_bytes(path, b);
}

static void write_sidecar(const std::string& path, const std::vector<uint8_t>& labels, int64_t claimed = -1,
                          int magic = REGIONS_MAGIC) {
    std::vector<uint8_t> b = header_bytes({magic, 1, (int32_t)(claimed >= 0 ? claimed : (int64_t)labels.size())});
    b.insert(b.end(), labels.begin(), labels.end());
    write_bytes(path, b);
}

// an exercise sidecar: header [magic, version, N, K, table bytes], NUL-ended names, ids
static void write_exercises(const std::string& path, const std::vector<std::string>& names,
                            const std::vector<uint8_t>& ids, int64_t claimed = -1, int magic = EXERCISES_MAGIC,
                            int version = 1, long cut_bytes = 0) {
    std::vector<uint8_t> table;
    for (const std::string& n : names) {
        table.insert(table.end(), n.begin(), n.end());
        table.push_back(0);
    }
    std::vector<uint8_t> b = header_bytes({magic, version, (int32_t)(claimed >= 0 ? claimed : (int64_t)ids.size()),
                                           (int32_t)names.size(), (int32_t)table.size()});
    b.insert(b.end(), table.begin(), table.end());
    b.insert(b.end(), ids.begin(), ids.end());
    b.resize(b.size() - cut_bytes);
    write_bytes(path, b);
}

static uint8_t label_of(uint32_t tok) { return (uint8_t)((tok * 7 + tok / 5) % 4); }

// the fixture's exercise tables differ per shard (shard 1 has none), so ids must be remapped by name
static const std::vector<std::vector<std::string>> FX_EXERCISES = {
    {"none", "math", "rag"}, {}, {"none", "rag", "mcq", "math", "recall"}};
static uint8_t local_exercise_of(int shard, uint32_t tok) {  // document of 37 tokens <-> one exercise
    return (uint8_t)(1 + (tok / 37) % (FX_EXERCISES[shard].size() - 1));
}
static std::string exercise_name_of(int shard, uint32_t tok) {
    return FX_EXERCISES[shard].empty() ? "none" : FX_EXERCISES[shard][local_exercise_of(shard, tok)];
}

struct Fixture {
    std::vector<std::vector<uint32_t>> shards;  // tokens per shard, unique across the data
    std::string pattern;
};

// three shards: uint16 with sidecar, uint32 without, uint16 with sidecar
static Fixture make_fixture() {
    Fixture fx;
    std::string d = g_dir + "/mix";
    if (system(("mkdir -p '" + d + "'").c_str()) != 0) { exit(2); }
    int sizes[3] = {1000, 777, 513};
    uint32_t bases[3] = {0, 100000, 2000};
    int versions[3] = {1, 2, 1};
    for (int s = 0; s < 3; s++) {
        std::vector<uint32_t> t(sizes[s]);
        for (int i = 0; i < sizes[s]; i++) { t[i] = bases[s] + i; }
        char name[256];
        snprintf(name, sizeof(name), "%s/fx_train_%06d.bin", d.c_str(), s);
        write_shard(name, t, versions[s]);
        if (s != 1) {
            std::vector<uint8_t> lab(t.size());
            for (size_t i = 0; i < t.size(); i++) { lab[i] = label_of(t[i]); }
            write_sidecar(regions_path_for(name), lab);
            std::vector<uint8_t> ex(t.size());
            for (size_t i = 0; i < t.size(); i++) { ex[i] = local_exercise_of(s, t[i]); }
            write_exercises(exercises_path_for(name), FX_EXERCISES[s], ex);
        }
        fx.shards.push_back(t);
    }
    write_shard(d + "/fx_val_000000.bin", {1, 2, 3}, 1);  // must not match the train pattern
    fx.pattern = d + "/fx_train_*.bin";
    return fx;
}

static DataLoaderConfig cfg(const std::string& pattern, int B, int T, int rank = 0, int nproc = 1,
                            bool shuffle = false, uint64_t seed = 0) {
    DataLoaderConfig c;
    c.pattern = pattern; c.B = B; c.T = T; c.rank = rank; c.nproc = nproc; c.shuffle = shuffle; c.seed = seed;
    return c;
}

// the rows of one batch as vectors
static std::vector<std::vector<int32_t>> rows(const DataLoader& dl) {
    std::vector<std::vector<int32_t>> r;
    for (int b = 0; b < dl.B; b++) {
        r.emplace_back(dl.tokens.begin() + (size_t)b * (dl.T + 1), dl.tokens.begin() + (size_t)(b + 1) * (dl.T + 1));
    }
    return r;
}

static void test_read_and_headers(const Fixture& fx) {
    std::vector<std::string> files = glob_shards(fx.pattern);
    CHECK(files.size() == 3);
    for (size_t s = 0; s < files.size(); s++) {
        ShardInfo info = inspect_shard(files[s]);
        CHECK(info.ntok == (int64_t)fx.shards[s].size());
        CHECK(info.width == (s == 1 ? 4 : 2));
        CHECK(info.regions_path.empty() == (s == 1));
        CHECK(info.exercises_path.empty() == (s == 1));
        CHECK(info.exercise_names == FX_EXERCISES[s]);
        std::vector<int32_t> got = read_token_shard(files[s]);
        bool same = got.size() == fx.shards[s].size();
        for (size_t i = 0; same && i < got.size(); i++) { same = got[i] == (int32_t)fx.shards[s][i]; }
        CHECK(same);
    }
    // comma-separated patterns de-duplicate
    CHECK(glob_shards(fx.pattern + "," + files[0]).size() == 3);
}

static void test_sequential_windows(const Fixture& fx) {
    const int B = 4, T = 16;
    DataLoader dl(cfg(fx.pattern, B, T));
    int64_t expect_windows = 0;
    for (auto& s : fx.shards) { expect_windows += ((int64_t)s.size() - 1) / T; }
    CHECK(dl.num_windows() == expect_windows);
    CHECK(dl.steps_per_epoch() == expect_windows / B);
    CHECK(dl.has_regions);
    CHECK(dl.has_exercises);
    // one table for all shards: "none", then the names in order of first appearance
    std::vector<std::string> want_names = {"none", "math", "rag", "mcq", "recall"};
    CHECK(dl.exercise_names == want_names);
    // walk the expected windows in file order
    std::vector<std::pair<int, int64_t>> order;
    for (int s = 0; s < 3; s++) {
        for (int64_t k = 0; k < ((int64_t)fx.shards[s].size() - 1) / T; k++) { order.push_back({s, k}); }
    }
    bool tokens_ok = true, io_ok = true, regions_ok = true, exercises_ok = true;
    for (int64_t step = 0; step < dl.steps_per_epoch(); step++) {
        dl.next_batch();
        for (int b = 0; b < B; b++) {
            auto [s, k] = order[step * B + b];
            for (int t = 0; t <= T; t++) {
                uint32_t want = fx.shards[s][k * T + t];
                int32_t got = dl.tokens[(size_t)b * (T + 1) + t];
                tokens_ok = tokens_ok && got == (int32_t)want;
                uint8_t wl = (s == 1) ? 0 : label_of(want);
                regions_ok = regions_ok && dl.regions[(size_t)b * (T + 1) + t] == wl;
                uint8_t id = dl.exercises[(size_t)b * (T + 1) + t];
                exercises_ok = exercises_ok && id < dl.exercise_names.size() &&
                               dl.exercise_names[id] == exercise_name_of(s, want);
                if (t < T) {
                    io_ok = io_ok && dl.inputs[(size_t)b * T + t] == (int32_t)want &&
                            dl.targets[(size_t)b * T + t] == (int32_t)fx.shards[s][k * T + t + 1];
                }
            }
        }
    }
    CHECK(tokens_ok);
    CHECK(io_ok);
    CHECK(regions_ok);
    CHECK(exercises_ok);
    // the epoch wrapped: the next batch is the first again
    dl.next_batch();
    CHECK(dl.position().epoch == 1 && dl.position().step == 1);
    CHECK(dl.tokens[0] == (int32_t)fx.shards[0][0]);
}

// the (shard base token) of a window identifies it uniquely
static std::vector<int32_t> firsts(const DataLoader& dl) {
    std::vector<int32_t> f;
    for (int b = 0; b < dl.B; b++) { f.push_back(dl.tokens[(size_t)b * (dl.T + 1)]); }
    return f;
}

static void test_rank_sharding(const Fixture& fx, bool shuffle) {
    const int B = 3, T = 8, P = 3;
    DataLoader one(cfg(fx.pattern, B * P, T, 0, 1, shuffle, 17));
    std::vector<std::unique_ptr<DataLoader>> ranks;
    for (int r = 0; r < P; r++) { ranks.emplace_back(new DataLoader(cfg(fx.pattern, B, T, r, P, shuffle, 17))); }
    CHECK(ranks[0]->steps_per_epoch() == one.steps_per_epoch());
    std::multiset<int32_t> seen;
    bool same_as_one = true, rows_match = true;
    for (int64_t step = 0; step < one.steps_per_epoch(); step++) {
        one.next_batch();
        std::vector<std::vector<int32_t>> glob_rows = rows(one);
        for (int r = 0; r < P; r++) {
            ranks[r]->next_batch();
            std::vector<std::vector<int32_t>> rr = rows(*ranks[r]);
            for (int b = 0; b < B; b++) {
                same_as_one = same_as_one && rr[b] == glob_rows[(size_t)r * B + b];
                for (int t = 1; t <= T; t++) { rows_match = rows_match && rr[b][t] == rr[b][t - 1] + 1; }
                seen.insert(rr[b][0]);
            }
        }
    }
    CHECK(same_as_one);
    CHECK(rows_match);  // every window is contiguous within one shard
    std::set<int32_t> uniq(seen.begin(), seen.end());
    CHECK(uniq.size() == seen.size());  // no window twice in an epoch
    CHECK((int64_t)seen.size() == one.steps_per_epoch() * B * P);
    CHECK(one.num_windows() - (int64_t)seen.size() < B * P);  // only the last partial batch is skipped
    // every seen window is a real window start: (token - base) % T == 0 within its shard
    bool starts_ok = true;
    for (int32_t f : uniq) {
        int64_t off = f >= 100000 ? f - 100000 : (f >= 2000 ? f - 2000 : f);
        starts_ok = starts_ok && off % T == 0;
    }
    CHECK(starts_ok);
}

static std::vector<std::vector<int32_t>> run_epoch(DataLoader& dl) {
    std::vector<std::vector<int32_t>> out;
    for (int64_t s = 0; s < dl.steps_per_epoch(); s++) {
        dl.next_batch();
        out.push_back(firsts(dl));
    }
    return out;
}

static void test_shuffle(const Fixture& fx) {
    const int B = 2, T = 8;
    DataLoader a(cfg(fx.pattern, B, T, 0, 1, true, 5)), b(cfg(fx.pattern, B, T, 0, 1, true, 5));
    DataLoader c(cfg(fx.pattern, B, T, 0, 1, true, 6)), seq(cfg(fx.pattern, B, T));
    auto ea1 = run_epoch(a), eb1 = run_epoch(b), ec1 = run_epoch(c), es1 = run_epoch(seq);
    auto ea2 = run_epoch(a);
    CHECK(ea1 == eb1);   // same seed, same order
    CHECK(ea1 != ec1);   // another seed, another order
    CHECK(ea1 != es1);   // shuffled differs from file order
    CHECK(ea1 != ea2);   // reshuffled each epoch
    for (auto* e : {&ea1, &ea2, &ec1}) {  // a permutation of the sequential epoch's windows
        std::vector<int32_t> x, y;
        for (auto& v : *e) { x.insert(x.end(), v.begin(), v.end()); }
        for (auto& v : es1) { y.insert(y.end(), v.begin(), v.end()); }
        std::set<int32_t> sx(x.begin(), x.end());
        CHECK(sx.size() == x.size());
        // windows: the total count is even (B=2) so with 2 leftovers at most, all but <B are shared
        std::set<int32_t> all_windows;
        DataLoader full(cfg(fx.pattern, 1, T));
        for (int64_t s = 0; s < full.steps_per_epoch(); s++) { full.next_batch(); all_windows.insert(full.tokens[0]); }
        bool subset = true;
        for (int32_t v : sx) { subset = subset && all_windows.count(v) == 1; }
        CHECK(subset);
        CHECK((int64_t)all_windows.size() - (int64_t)sx.size() < B);
    }
}

// resuming into a later (reshuffled) epoch, and the shard order changing between epochs
static void test_resume_later_epoch(const Fixture& fx) {
    const int B = 2, T = 8;
    DataLoader a(cfg(fx.pattern, B, T, 0, 1, true, 3));
    std::set<int> first_shards;
    DataPosition pos;
    std::vector<std::vector<int32_t>> cont;
    for (int e = 0; e < 8; e++) {
        for (int64_t s = 0; s < a.steps_per_epoch(); s++) {
            a.next_batch();
            if (s == 0) {
                int32_t f = a.tokens[0];
                first_shards.insert(f >= 100000 ? 1 : (f >= 2000 ? 2 : 0));
            }
            if (e == 2 && s == 4) { pos = a.position(); }
            if (e == 2 && s >= 4 && s < 9) { cont.push_back(firsts(a)); }
        }
    }
    CHECK(first_shards.size() >= 2);
    CHECK(pos.epoch == 2 && pos.step == 5);
    DataLoader b(cfg(fx.pattern, B, T, 0, 1, true, 3));
    b.set_position(pos);
    bool same = true;
    for (size_t i = 1; i < cont.size(); i++) {
        b.next_batch();
        same = same && firsts(b) == cont[i];
    }
    CHECK(same);
}

static void test_resume(const Fixture& fx) {
    const int B = 3, T = 8;
    for (bool shuffle : {false, true}) {
        DataLoader a(cfg(fx.pattern, B, T, 1, 2, shuffle, 99));
        int64_t spe = a.steps_per_epoch();
        int64_t k = spe - 2;  // stop two steps before the epoch ends, so the resumed run crosses it
        for (int64_t s = 0; s < k; s++) { a.next_batch(); }
        DataPosition pos = a.position();
        CHECK(pos.epoch == 0 && pos.step == k);
        std::vector<std::vector<std::vector<int32_t>>> cont;
        std::vector<std::vector<uint8_t>> cont_regions;
        for (int s = 0; s < 5; s++) {
            a.next_batch();
            cont.push_back(rows(a));
            cont_regions.push_back(a.regions);
        }
        DataLoader b(cfg(fx.pattern, B, T, 1, 2, shuffle, 99));
        b.set_position(pos);
        bool same = true;
        for (int s = 0; s < 5; s++) {
            b.next_batch();
            same = same && rows(b) == cont[s] && b.regions == cont_regions[s];
        }
        CHECK(same);
        CHECK(b.position().epoch == 1 && b.position().step == 3);
        // a position from other settings is refused
        DataPosition p2 = pos;
        CHECK(expect_fatal([&] {
            DataLoader c(cfg(fx.pattern, B, T, 1, 2, shuffle, 100));
            c.set_position(p2);
            if (!shuffle) { DataLoader d(cfg(fx.pattern, B, T + 1, 1, 2)); d.set_position(p2); }
        }, {"resume position", "different"}));
        CHECK(expect_fatal([&] {
            DataLoader c(cfg(fx.pattern, B, T, 1, 2, shuffle, 99));
            DataPosition bad = pos;
            bad.step = c.steps_per_epoch();
            c.set_position(bad);
        }, {"bad resume position"}));
    }
}

static void test_doc_ids() {
    std::string d = g_dir + "/docs";
    if (system(("mkdir -p '" + d + "'").c_str()) != 0) { exit(2); }
    // BOS = 2; two windows of T = 6: [5 6 2 7 2 2 8] and [8 9 9 2 9 9 9]
    std::vector<uint32_t> toks = {5, 6, 2, 7, 2, 2, 8, 9, 9, 2, 9, 9, 9};
    write_shard(d + "/doc_train_000000.bin", toks, 1);
    DataLoaderConfig c = cfg(d + "/doc_train_*.bin", 2, 6);
    c.doc_start_token = 2;
    DataLoader dl(c);
    dl.next_batch();
    std::vector<int32_t> want = {0, 0, 1, 1, 2, 3, 3, /* row 2 */ 0, 0, 0, 1, 1, 1, 1};
    CHECK(dl.doc_ids == want);
    CHECK(!dl.has_regions);
    CHECK(std::all_of(dl.regions.begin(), dl.regions.end(), [](uint8_t r) { return r == 0; }));
    CHECK(!dl.has_exercises);
    CHECK(dl.exercise_names == std::vector<std::string>{"none"});
    CHECK(std::all_of(dl.exercises.begin(), dl.exercises.end(), [](uint8_t e) { return e == 0; }));
    c.doc_start_token = -1;
    DataLoader nodoc(c);
    nodoc.next_batch();
    CHECK(std::all_of(nodoc.doc_ids.begin(), nodoc.doc_ids.end(), [](int32_t v) { return v == 0; }));
}

// The whole-document fixture: shards of a leading fragment without BOS and 60 documents (some
// longer than T+1, shard cuts inside documents, the exercise names in another order per shard),
// and the reference rows from plain loops over the concatenated tokens: documents from one BOS
// to the next, the fragment left out, documents longer than T+1 skipped, the rest packed
// greedily in order, padding and document starts never scored.
struct WholeDocs {
    static constexpr int BOS = 2, T = 16, PAD = 1;
    std::string dir;
    std::vector<uint32_t> all;
    std::vector<int> doc_of;  // document index per token, -1 for the leading fragment
    std::vector<std::vector<std::string>> tables = {
        {"none", "rag", "math", "mcq"}, {"none", "mcq", "rag", "math"}, {"none", "math", "mcq", "rag"}};
    std::vector<std::vector<size_t>> rows_ref;  // token positions in `all` per row
    int64_t kept = 0, skipped = 0, scored_ref = 0;

    std::string name_of_doc(int k) const { return k < 0 ? std::string("none") : tables[0][1 + k % 3]; }
    DataLoaderConfig config() const {
        DataLoaderConfig c = cfg(dir + "/w_val_*.bin", 3, T);
        c.doc_start_token = BOS;
        c.whole_documents = true;
        c.pad_token = PAD;
        c.vocab_size = 100000;
        return c;
    }
    // row b of the loader's batch against reference row g (empty past the last): tokens,
    // regions and exercise names follow their tokens; only a document's own next token is a target
    bool check_row(const DataLoader& dl, int b, int64_t g) const {
        static const std::vector<size_t> none;
        const std::vector<size_t>& pos = g < (int64_t)rows_ref.size() ? rows_ref[g] : none;
        bool ok = true;
        for (int t = 0; t <= T; t++) {
            size_t o = (size_t)b * (T + 1) + t;
            bool real = t < (int)pos.size();
            ok = ok && dl.tokens[o] == (real ? (int32_t)all[pos[t]] : PAD);
            ok = ok && dl.regions[o] == (real ? label_of(all[pos[t]]) : 0);
            ok = ok && dl.exercise_names[dl.exercises[o]] == (real ? name_of_doc(doc_of[pos[t]]) : "none");
            if (t < T) {
                bool scored = t + 1 < (int)pos.size() && all[pos[t + 1]] != (uint32_t)BOS;
                ok = ok && dl.inputs[(size_t)b * T + t] == dl.tokens[o];
                ok = ok && dl.targets[(size_t)b * T + t] == (scored ? (int32_t)all[pos[t + 1]] : -1);
            }
        }
        return ok;
    }
};

static WholeDocs make_whole_docs() {
    WholeDocs w;
    const int BOS = WholeDocs::BOS, T = WholeDocs::T;
    w.dir = g_dir + "/whole";
    if (system(("mkdir -p '" + w.dir + "'").c_str()) != 0) { exit(2); }
    std::vector<uint32_t>& all = w.all;
    for (int i = 0; i < 3; i++) { all.push_back(500 + i); w.doc_of.push_back(-1); }
    SplitMix64 rng(7);
    uint32_t next_tok = 10;
    const int ndocs = 60;
    for (int k = 0; k < ndocs; k++) {
        int len = k == 5 ? T + 1 : k == 6 ? T + 2 : k % 9 == 8 ? 20 + (int)rng.below(10) : 1 + (int)rng.below(12);
        all.push_back(BOS);
        w.doc_of.push_back(k);
        for (int i = 1; i < len; i++) { all.push_back(next_tok++); w.doc_of.push_back(k); }
    }
    // the same exercise names in another order per shard: ids must be remapped by name
    size_t cuts[4] = {0, 97, 230, all.size()};  // shard boundaries, inside documents
    for (int s = 0; s < 3; s++) {
        std::vector<uint32_t> t(all.begin() + cuts[s], all.begin() + cuts[s + 1]);
        std::vector<uint8_t> lab, ex;
        for (size_t i = cuts[s]; i < cuts[s + 1]; i++) {
            lab.push_back(label_of(all[i]));
            std::string n = w.name_of_doc(w.doc_of[i]);
            ex.push_back((uint8_t)(std::find(w.tables[s].begin(), w.tables[s].end(), n) - w.tables[s].begin()));
        }
        char name[256];
        snprintf(name, sizeof(name), "%s/w_val_%06d.bin", w.dir.c_str(), s);
        write_shard(name, t, s == 1 ? 2 : 1);
        write_sidecar(regions_path_for(name), lab);
        write_exercises(exercises_path_for(name), w.tables[s], ex);
    }
    // the reference: documents, filtered, packed greedily
    std::vector<std::vector<size_t>> docs;  // token positions in `all` per document
    for (size_t i = 0; i < all.size(); i++) {
        if (all[i] == (uint32_t)BOS) { docs.emplace_back(); }
        if (!docs.empty()) { docs.back().push_back(i); }
    }
    for (const auto& doc : docs) {
        if ((int)doc.size() > T + 1) { w.skipped++; continue; }
        w.kept++;
        w.scored_ref += (int64_t)doc.size() - 1;
        if (w.rows_ref.empty() || w.rows_ref.back().size() + doc.size() > (size_t)T + 1) { w.rows_ref.emplace_back(); }
        w.rows_ref.back().insert(w.rows_ref.back().end(), doc.begin(), doc.end());
    }
    CHECK(w.skipped >= 5 && w.kept > 40);  // the fixture exercises both paths
    return w;
}

// Whole-document rows against the reference: counts, every row of an epoch, the next epoch.
static void test_whole_documents(const WholeDocs& w) {
    DataLoader dl(w.config());
    CHECK(dl.num_documents() == w.kept);
    CHECK(dl.num_skipped_documents() == w.skipped);
    CHECK(dl.num_rows() == (int64_t)w.rows_ref.size());
    CHECK(dl.steps_per_epoch() == ((int64_t)w.rows_ref.size() + 2) / 3);
    CHECK(dl.has_regions && dl.has_exercises);
    bool rows_ok = true;
    int64_t scored = 0;
    for (int64_t step = 0; step < dl.steps_per_epoch(); step++) {
        dl.next_batch();
        for (int b = 0; b < 3; b++) { rows_ok = rows_ok && w.check_row(dl, b, step * 3 + b); }
        for (int32_t t : dl.targets) { scored += t >= 0; }
    }
    CHECK(rows_ok);
    CHECK(scored == w.scored_ref);  // every kept document's targets exactly once per epoch
    dl.next_batch();                // the next epoch starts over, in the same order
    CHECK(w.check_row(dl, 0, 0) && dl.position().epoch == 1);
}

// Whole-document rows over two ranks (those of one process with the global batch) and resumed
// inside the epoch; the window loader's resume position does not fit them.
static void test_whole_documents_ranks_and_resume(const WholeDocs& w) {
    const DataLoaderConfig c = w.config();
    DataLoaderConfig c4 = c;
    c4.B = 4;
    DataLoader one(c4);
    bool ranks_ok = true;
    std::vector<std::unique_ptr<DataLoader>> ranks;
    for (int r = 0; r < 2; r++) {
        DataLoaderConfig cr = c;
        cr.B = 2;
        cr.rank = r;
        cr.nproc = 2;
        ranks.emplace_back(new DataLoader(cr));
    }
    CHECK(ranks[0]->steps_per_epoch() == one.steps_per_epoch());
    for (int64_t step = 0; step < one.steps_per_epoch(); step++) {
        one.next_batch();
        for (int r = 0; r < 2; r++) {
            ranks[r]->next_batch();
            for (int b = 0; b < 2; b++) { ranks_ok = ranks_ok && w.check_row(*ranks[r], b, step * 4 + r * 2 + b); }
        }
    }
    CHECK(ranks_ok);
    DataLoader a(c), b2(c);
    a.next_batch();
    b2.set_position(a.position());
    a.next_batch();
    b2.next_batch();
    CHECK(a.tokens == b2.tokens && a.targets == b2.targets);
    CHECK(expect_fatal([&] {
        DataLoaderConfig win = c;
        win.whole_documents = false;
        DataLoader x(c), y(win);
        y.set_position(x.position());
    }, {"resume position", "different"}));
}

// Whole-document settings the loader refuses, naming the setting or the file.
static void test_whole_documents_misuse(const WholeDocs& w) {
    const DataLoaderConfig c = w.config();
    CHECK(expect_fatal([&] { DataLoaderConfig e = c; e.doc_start_token = -1; DataLoader x(e); },
                       {"whole_documents", "document-start token"}));
    CHECK(expect_fatal([&] { DataLoaderConfig e = c; e.shuffle = true; DataLoader x(e); }, {"whole_documents", "shuffle"}));
    CHECK(expect_fatal([&] { DataLoaderConfig e = c; e.doc_start_token = 99999; DataLoader x(e); },
                       {"w_val_", "no document-start token 99999"}));
    write_shard(w.dir + "/long_val_000000.bin", {2, 5, 6, 7, 2, 8, 9, 10}, 1);  // two documents of 4 tokens
    CHECK(expect_fatal([&] {
        DataLoaderConfig e = c;
        e.pattern = w.dir + "/long_val_*.bin";
        e.T = 2;
        DataLoader x(e);
    }, {"long_val_", "no whole document of at most 3 tokens", "2 skipped"}));
    CHECK(expect_fatal([&] { DataLoaderConfig e = c; e.pad_token = 100000; DataLoader x(e); }, {"pad_token 100000"}));
}

static void test_errors() {
    std::string d = g_dir + "/bad";
    if (system(("mkdir -p '" + d + "'").c_str()) != 0) { exit(2); }
    std::vector<uint32_t> t(100);
    for (int i = 0; i < 100; i++) { t[i] = i; }
    auto load = [&](const std::string& path) {
        return [path] { DataLoader dl(cfg(path, 1, 4)); };
    };
    write_shard(d + "/magic.bin", t, 1, 12345);
    CHECK(expect_fatal(load(d + "/magic.bin"), {"magic.bin", "magic number 12345"}));
    write_shard(d + "/version.bin", t, 3);
    CHECK(expect_fatal(load(d + "/version.bin"), {"version.bin", "unsupported version 3"}));
    write_shard(d + "/short.bin", t, 1, SHARD_MAGIC, -1, 7);
    CHECK(expect_fatal(load(d + "/short.bin"), {"short.bin", "truncated"}));
    write_bytes(d + "/tiny.bin", {1, 2, 3});
    CHECK(expect_fatal(load(d + "/tiny.bin"), {"tiny.bin", "truncated"}));
    write_shard(d + "/long.bin", t, 2, SHARD_MAGIC, 90);
    CHECK(expect_fatal(load(d + "/long.bin"), {"long.bin", "after the 90 tokens"}));
    write_shard(d + "/side.bin", t, 1);
    write_sidecar(d + "/side.regions", std::vector<uint8_t>(99, 1));
    CHECK(expect_fatal(load(d + "/side.bin"), {"side.regions", "99 labels", "100 tokens"}));
    write_sidecar(d + "/side.regions", std::vector<uint8_t>(99, 1), 100);
    CHECK(expect_fatal(load(d + "/side.bin"), {"side.regions", "truncated"}));
    write_sidecar(d + "/side.regions", std::vector<uint8_t>(100, 1), -1, SHARD_MAGIC);
    CHECK(expect_fatal(load(d + "/side.bin"), {"side.regions", "not a region sidecar"}));
    write_sidecar(d + "/side.regions", std::vector<uint8_t>(100, 9));
    CHECK(expect_fatal([&] { DataLoader dl(cfg(d + "/side.bin", 1, 4)); dl.next_batch(); }, {"side.regions", "label 9"}));
    // exercise sidecars: magic, version, count, size, table, ids
    write_sidecar(d + "/side.regions", std::vector<uint8_t>(100, 1));
    std::vector<std::string> names = {"none", "math", "rag"};
    std::vector<uint8_t> ids(100, 1);
    write_exercises(d + "/side.exercises", names, ids, -1, REGIONS_MAGIC);
    CHECK(expect_fatal(load(d + "/side.bin"), {"side.exercises", "not an exercise sidecar", "magic number"}));
    write_exercises(d + "/side.exercises", names, ids, -1, EXERCISES_MAGIC, 2);
    CHECK(expect_fatal(load(d + "/side.bin"), {"side.exercises", "unsupported version 2"}));
    write_exercises(d + "/side.exercises", names, std::vector<uint8_t>(99, 1));
    CHECK(expect_fatal(load(d + "/side.bin"), {"side.exercises", "99 ids", "100 tokens"}));
    write_exercises(d + "/side.exercises", names, ids, -1, EXERCISES_MAGIC, 1, 3);
    CHECK(expect_fatal(load(d + "/side.bin"), {"side.exercises", "truncated"}));
    write_exercises(d + "/side.exercises", {"math", "rag"}, ids);
    CHECK(expect_fatal(load(d + "/side.bin"), {"side.exercises", "name 0 is 'math'"}));
    write_exercises(d + "/side.exercises", {"none", "rag", "rag"}, ids);
    CHECK(expect_fatal(load(d + "/side.bin"), {"side.exercises", "'rag' appears twice"}));
    write_exercises(d + "/side.exercises", names, std::vector<uint8_t>(100, 3));
    CHECK(expect_fatal([&] { DataLoader dl(cfg(d + "/side.bin", 1, 4)); dl.next_batch(); },
                       {"side.exercises", "id 3", "table of 3 names"}));
    write_exercises(d + "/side.exercises", names, ids);
    {  // the repaired file loads
        DataLoader dl(cfg(d + "/side.bin", 1, 4));
        dl.next_batch();
        CHECK(dl.has_exercises && dl.exercise_names == names && dl.exercises[0] == 1);
    }
    CHECK(expect_fatal(load(d + "/nothing_*.bin"), {"data shards: no file matches", "nothing_"}));
    write_shard(d + "/small.bin", {1, 2, 3, 4, 5}, 1);
    CHECK(expect_fatal([&] { DataLoader dl(cfg(d + "/small.bin", 2, 4)); }, {"small.bin", "fewer than one global batch"}));
    CHECK(expect_fatal([&] { DataLoader dl(cfg(d + "/small.bin", 1, 2, 2, 2)); }, {"bad rank 2 of 2"}));
    CHECK(expect_fatal([&] {
        DataLoaderConfig c = cfg(d + "/small.bin", 1, 2);
        c.vocab_size = 3;
        DataLoader dl(c);
        dl.next_batch();
    }, {"small.bin", "outside the vocabulary"}));
}

int main() {
    g_dir = make_temp_dir("dataloader");
    Fixture fx = make_fixture();
    test_read_and_headers(fx);
    test_sequential_windows(fx);
    test_rank_sharding(fx, false);
    test_rank_sharding(fx, true);
    test_shuffle(fx);
    test_resume(fx);
    test_resume_later_epoch(fx);
    test_doc_ids();
    const WholeDocs whole = make_whole_docs();
    test_whole_documents(whole);
    test_whole_documents_ranks_and_resume(whole);
    test_whole_documents_misuse(whole);
    test_errors();
    remove_dir(g_dir);
    return report("test_dataloader");
}
