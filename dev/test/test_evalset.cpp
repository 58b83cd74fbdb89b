/*
Tests llmc/data/evalset.h on eval .bin files written here by hand from doc/formats.md: a
multiple-choice set and a cloze set read back exactly, and clear failures on wrong magic,
truncation, out-of-range gold/tokens, a cloze item with two continuations, trailing bytes.
  make build/host-bf16/test_evalset
*/
#include "llmc/data/evalset.h"
#include "dev/test/data_test_util.h"

static std::vector<uint8_t> evalset_bytes(const std::vector<EvalItem>& items, int kind, int vocab,
                                          const std::string& desc, int magic = EVAL_MAGIC,
                                          int version = EVAL_VERSION) {
    int max_choices = 0, max_tokens = 0;
    for (auto& it : items) {
        max_choices = std::max(max_choices, (int)it.choices.size());
        size_t longest = 0;
        for (auto& c : it.choices) { longest = std::max(longest, c.size()); }
        max_tokens = std::max(max_tokens, (int)(it.context.size() + longest));
    }
    std::vector<uint8_t> b = header_bytes({magic, version, (int32_t)items.size(), kind, vocab, max_choices,
                                           max_tokens, 1, (int32_t)desc.size()});
    b.insert(b.end(), desc.begin(), desc.end());
    for (auto& it : items) {
        append_le<int32_t>(b, (int32_t)it.choices.size());
        append_le<int32_t>(b, it.gold);
        append_le<int32_t>(b, (int32_t)it.context.size());
        for (int t : it.context) { append_le<int32_t>(b, t); }
        for (size_t c = 0; c < it.choices.size(); c++) {
            append_le<int32_t>(b, (int32_t)it.choices[c].size());
            append_le<int32_t>(b, it.choice_chars[c]);
            for (int t : it.choices[c]) { append_le<int32_t>(b, t); }
        }
    }
    return version == EVAL_VERSION ? sealed(b, EVAL_CRC_SLOT) : b;
}

static bool same_items(const std::vector<EvalItem>& a, const std::vector<EvalItem>& b) {
    if (a.size() != b.size()) { return false; }
    for (size_t i = 0; i < a.size(); i++) {
        if (a[i].context != b[i].context || a[i].choices != b[i].choices || a[i].choice_chars != b[i].choice_chars ||
            a[i].gold != b[i].gold) { return false; }
    }
    return true;
}

int main() {
    std::string dir = make_temp_dir("evalset");
    std::vector<EvalItem> mc = {
        {{2, 10, 11, 12}, {{20, 21}, {22}, {23, 24, 25}, {26}}, {7, 4, 12, 3}, 2},
        {{2, 13}, {{30}, {31, 32}}, {5, 9}, 0},
    };
    std::string p = dir + "/mc.bin";
    write_bytes(p, evalset_bytes(mc, EVAL_MULTIPLE_CHOICE, 64, "SANITY SET test"));
    EvalSet es = load_evalset(p);
    CHECK(es.kind == EVAL_MULTIPLE_CHOICE && es.vocab_size == 64 && es.bos);
    CHECK(es.description == "SANITY SET test");
    CHECK(es.max_choices == 4 && es.max_tokens == 7);
    CHECK(same_items(es.items, mc));

    std::vector<EvalItem> cloze = {{{2, 5, 6, 7}, {{8, 9}}, {6}, 0}, {{2, 40}, {{41}}, {3}, 0}};
    p = dir + "/cloze.bin";
    write_bytes(p, evalset_bytes(cloze, EVAL_CLOZE, 64, ""));
    es = load_evalset(p);
    CHECK(es.kind == EVAL_CLOZE && es.description.empty());
    CHECK(same_items(es.items, cloze));

    // rolling: the prefix token as context, a whole document, its word count
    std::vector<EvalItem> rolling = {{{2}, {{8, 9, 10, 11, 12}}, {4}, 0}, {{2}, {{41}}, {1}, 0}};
    p = dir + "/rolling.bin";
    write_bytes(p, evalset_bytes(rolling, EVAL_ROLLING, 64, "wikitext"));
    es = load_evalset(p);
    CHECK(es.kind == EVAL_ROLLING && same_items(es.items, rolling));

    // partial (Winogrande): per choice its own context's tokens (choice_chars), then the continuation's
    std::vector<EvalItem> partial = {{{2}, {{8, 9, 10}, {11, 10}}, {2, 1}, 1}};
    p = dir + "/partial.bin";
    write_bytes(p, evalset_bytes(partial, EVAL_PARTIAL, 64, "winogrande"));
    es = load_evalset(p);
    CHECK(es.kind == EVAL_PARTIAL && same_items(es.items, partial));

    auto fails = [&](const std::vector<uint8_t>& bytes, const char* name, std::vector<std::string> needles) {
        std::string path = dir + "/" + name;
        write_bytes(path, bytes);
        needles.push_back(name);
        return expect_fatal([path] { load_evalset(path); }, needles);
    };
    std::vector<uint8_t> good = evalset_bytes(mc, EVAL_MULTIPLE_CHOICE, 64, "d");
    CHECK(fails(evalset_bytes(mc, EVAL_MULTIPLE_CHOICE, 64, "d", 20240520), "magic.bin", {"not an eval set"}));
    CHECK(fails(sealed(std::vector<uint8_t>(good.begin(), good.end() - 4), EVAL_CRC_SLOT), "cut.bin", {"truncated"}));
    CHECK(fails(std::vector<uint8_t>(good.begin(), good.begin() + 100), "header.bin", {"truncated"}));
    std::vector<uint8_t> extra = good;
    append_le<int32_t>(extra, 0);
    CHECK(fails(sealed(extra, EVAL_CRC_SLOT), "extra.bin", {"4 bytes after the last item"}));
    std::vector<EvalItem> badgold = mc;
    badgold[1].gold = 2;
    CHECK(fails(evalset_bytes(badgold, EVAL_MULTIPLE_CHOICE, 64, ""), "gold.bin", {"item 1", "gold index is 2"}));
    CHECK(fails(evalset_bytes(mc, EVAL_MULTIPLE_CHOICE, 25, ""), "vocab.bin", {"item 0", "token 25", "outside the vocabulary"}));
    CHECK(fails(evalset_bytes(mc, EVAL_CLOZE, 64, ""), "cloze2.bin", {"cloze item 0 has 4 continuations"}));
    CHECK(fails(evalset_bytes(mc, 5, 64, ""), "kind.bin", {"unknown kind 5"}));
    CHECK(fails(evalset_bytes(mc, EVAL_ROLLING, 64, ""), "rolling2.bin", {"rolling item 0 has 4 continuations"}));
    CHECK(fails(evalset_bytes(cloze, EVAL_ROLLING, 64, ""), "rollingctx.bin", {"item 0", "context length is 4"}));
    std::vector<EvalItem> unscored = partial;  // a choice that is all context: nothing to score
    unscored[0].choice_chars[0] = 3;
    CHECK(fails(evalset_bytes(unscored, EVAL_PARTIAL, 64, ""), "partial0.bin",
                {"item 0", "continuation characters is 3, outside 0..2"}));
    // a huge count in a corrupt file fails cleanly instead of allocating
    std::vector<uint8_t> huge = good;
    size_t ctx_len_at = 1024 + 1 + 8;  // header, description "d", then n_choices, gold, n_ctx
    huge[ctx_len_at] = 0xFF; huge[ctx_len_at + 1] = 0xFF; huge[ctx_len_at + 2] = 0xFF; huge[ctx_len_at + 3] = 0x0F;
    CHECK(fails(sealed(huge, EVAL_CRC_SLOT), "huge.bin", {"context length"}));
    // 2^31 - 1 choices, announced by the header and the first item: refused from the file's
    // size before anything is allocated (it was std::bad_alloc, SIGABRT: expect_fatal wants an
    // exit with the message); 5e7 choices, which took 1.39 GB for a 5.6 KB file, likewise
    for (int32_t n : {INT32_MAX, 50000000}) {
        std::vector<uint8_t> many = good;
        memcpy(&many[4 * 5], &n, 4);        // header [5]: most choices in an item
        memcpy(&many[1024 + 1], &n, 4);     // item 0: n_choices
        CHECK(fails(sealed(many, EVAL_CRC_SLOT), "choices.bin", {"item 0", "choices announced", "bytes left"}));
    }
    // version 2's CRC covers the header and the items: a changed token or header field, or the
    // CRC field set to 0, is refused; the header ints past the fields must be 0
    std::vector<uint8_t> token = good;
    token[1024 + 1 + 4 * 4] ^= 1;  // item 0's second context token 10 -> 11, still a valid id
    CHECK(fails(token, "token.bin", {"checksum mismatch: stored CRC32"}));
    std::vector<uint8_t> nobos = good;
    nobos[4 * 7] = 0;
    CHECK(fails(nobos, "nobos.bin", {"checksum mismatch"}));
    std::vector<uint8_t> zeroed = good;
    memset(&zeroed[4 * EVAL_CRC_SLOT], 0, 4);
    CHECK(fails(zeroed, "zeroed.bin", {"checksum mismatch: stored CRC32 00000000"}));
    std::vector<uint8_t> tail = good;
    tail[4 * 100] = 1;
    CHECK(fails(sealed(tail, EVAL_CRC_SLOT), "tail.bin", {"header int [100] is 1, must be 0"}));
    // version 1 (no CRC) still loads, with a note
    std::string v1 = dir + "/v1.bin";
    write_bytes(v1, evalset_bytes(mc, EVAL_MULTIPLE_CHOICE, 64, "d", EVAL_MAGIC, EVAL_VERSION_NO_CRC));
    std::string out;
    int status = run_in_child([v1, mc] { if (!same_items(load_evalset(v1).items, mc)) { exit(3); } }, &out);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    CHECK(out.find("note: eval set '" + v1 + "' is of version 1, without a checksum") != std::string::npos);
    remove_dir(dir);
    return report("test_evalset");
}
