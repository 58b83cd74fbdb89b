/*
Tests llmc/data/tokenizer.h on a tokenizer .bin written here by hand from doc/formats.md:
normal pieces (spaces already decoded from SentencePiece's marker), byte-fallback pieces
that together form a UTF-8 character and a newline, control pieces (hidden unless asked),
user-defined markers, <unk>; encoding and complete_utf8 on small cases (the encoder is
checked against SentencePiece itself in dev/test/test_trainer_ux.py); and clear failures
on bad files.
  make build/host-bf16/test_tokenizer
*/
#include "llmc/data/tokenizer.h"
#include "dev/test/data_test_util.h"

struct Piece { uint8_t type; std::string bytes; };

static std::vector<uint8_t> tokenizer_bytes(const std::vector<Piece>& pieces, int bos, int eos, int max_len = -1,
                                            int magic = TOKENIZER_MAGIC, int version = TOKENIZER_VERSION) {
    int ml = 0;
    for (auto& p : pieces) { ml = std::max(ml, (int)p.bytes.size()); }
    std::vector<uint8_t> b = header_bytes({magic, version, (int32_t)pieces.size(), TOKENIZER_SENTENCEPIECE, bos, eos,
                                           0, 3, max_len >= 0 ? max_len : ml});
    for (auto& p : pieces) {
        b.push_back(p.type);
        append_le<uint16_t>(b, (uint16_t)p.bytes.size());
        b.insert(b.end(), p.bytes.begin(), p.bytes.end());
    }
    return version == TOKENIZER_VERSION ? sealed(b, TOKENIZER_CRC_SLOT) : b;
}

static std::vector<Piece> fixture_pieces() {
    return {
        {PIECE_CONTROL, "<pad>"}, {PIECE_CONTROL, "</s>"}, {PIECE_CONTROL, "<s>"}, {PIECE_UNKNOWN, "<unk>"},
        {PIECE_USER, "<|im_start|>"},                               // 4
        {PIECE_BYTE, "\n"}, {PIECE_BYTE, "\xE2"}, {PIECE_BYTE, "\x81"}, {PIECE_BYTE, "\x87"},  // 5..8
        {PIECE_NORMAL, "In"}, {PIECE_NORMAL, " the"}, {PIECE_NORMAL, " beginning"},  // 9..11
        {PIECE_NORMAL, " "}, {PIECE_UNUSED, "<unused>"},                             // 12, 13
    };
}

int main() {
    std::string dir = make_temp_dir("tokenizer");
    std::string path = dir + "/tok.bin";
    write_bytes(path, tokenizer_bytes(fixture_pieces(), 2, 1));
    Tokenizer tok(path);
    CHECK(tok.vocab_size == 14);
    CHECK(tok.bos_id == 2 && tok.eos_id == 1 && tok.pad_id == 0 && tok.unk_id == 3);
    CHECK(tok.kind == TOKENIZER_SENTENCEPIECE);
    // BOS <|im_start|> In the beginning \n ⁇(3 bytes) ' ' EOS
    std::vector<int> ids = {2, 4, 9, 10, 11, 5, 6, 7, 8, 12, 1};
    CHECK(tok.decode(ids) == "<|im_start|>In the beginning\n\xE2\x81\x87 ");
    CHECK(tok.decode(ids, true) == "<s><|im_start|>In the beginning\n\xE2\x81\x87 </s>");
    CHECK(tok.decode(3) == " \xE2\x81\x87 ");  // <unk> as SentencePiece prints it
    CHECK(tok.decode(13).empty() && tok.decode(13, true) == "<unused>");
    CHECK(tok.type(5) == PIECE_BYTE && tok.piece(5) == "\n");
    CHECK(tok.type(4) == PIECE_USER);
    // encoding (SentencePiece BPE, merges ranked by id): the user piece whole, "In" merged
    // from its characters, the newline and the 3-byte character without a normal piece as
    // their byte pieces
    CHECK(tok.encode("<|im_start|>In \n\xE2\x81\x87") == std::vector<int>({4, 9, 12, 5, 6, 7, 8}));
    CHECK(tok.encode("").empty());
    // complete_utf8: an incomplete character at the end is held back; broken bytes inside
    // become U+FFFD; whole characters pass
    CHECK(complete_utf8("ab\xE2\x81") == "ab");
    CHECK(complete_utf8("ab\xE2\x81\x87") == "ab\xE2\x81\x87");
    CHECK(complete_utf8("a\x81" "b") == "a\xEF\xBF\xBD" "b");
    CHECK(complete_utf8("a\xE2\x81z") == "a\xEF\xBF\xBD" "z");
    CHECK(complete_utf8("\xF0\x9F\x98\x80") == "\xF0\x9F\x98\x80");
    // RFC 3629's exclusions become U+FFFD per maximal bad run, as Python's errors="replace":
    // overlong forms, surrogates, code points above U+10FFFF (they used to pass as valid)
    const std::string bad = "\xEF\xBF\xBD";
    CHECK(complete_utf8("a\xE0\x80\x80z") == "a" + bad + bad + bad + "z");
    CHECK(complete_utf8("\xC0\x80") == bad + bad);
    CHECK(complete_utf8("\xED\xA0\x80") == bad + bad + bad);
    CHECK(complete_utf8("\xF0\x80\x80\x80") == bad + bad + bad + bad);
    CHECK(complete_utf8("\xF4\x90\x80\x80") == bad + bad + bad + bad);
    CHECK(complete_utf8("\xF5\x80") == bad + bad);
    CHECK(complete_utf8("ab\xE0\x80") == "ab" + bad + bad);  // no later byte can complete it
    CHECK(complete_utf8("ab\xF0\x9F\x98") == "ab");       // a later byte can: held back
    for (const char* edge : {"\xE0\xA0\x80", "\xED\x9F\xBF", "\xEE\x80\x80", "\xF0\x90\x80\x80", "\xF4\x8F\xBF\xBF"}) {
        CHECK(complete_utf8(edge) == edge);  // U+0800, U+D7FF, U+E000, U+10000, U+10FFFF
    }
    // errors
    CHECK(expect_fatal([&] { tok.decode(14); }, {"tok.bin", "token id 14 outside"}));
    CHECK(expect_fatal([&] { tok.decode(-1); }, {"token id -1 outside"}));
    auto expect_load_fails = [&](const std::vector<uint8_t>& bytes, const char* name, std::vector<std::string> needles) {
        std::string p = dir + "/" + name;
        write_bytes(p, bytes);
        needles.push_back(name);
        return expect_fatal([p] { Tokenizer t(p); }, needles);
    };
    std::vector<uint8_t> good = tokenizer_bytes(fixture_pieces(), 2, 1);
    CHECK(expect_load_fails(tokenizer_bytes(fixture_pieces(), 2, 1, -1, 20240520), "magic.bin", {"not a tokenizer", "20240520"}));
    CHECK(expect_load_fails(tokenizer_bytes(fixture_pieces(), 2, 1, -1, TOKENIZER_MAGIC, 9), "version.bin", {"unsupported version 9"}));
    CHECK(expect_load_fails(sealed(std::vector<uint8_t>(good.begin(), good.end() - 4), TOKENIZER_CRC_SLOT), "cut.bin",
                            {"truncated"}));
    CHECK(expect_load_fails(std::vector<uint8_t>(good.begin(), good.begin() + 500), "header.bin", {"truncated"}));
    std::vector<uint8_t> extra = good;
    extra.push_back(0);
    CHECK(expect_load_fails(sealed(extra, TOKENIZER_CRC_SLOT), "extra.bin", {"1 bytes after the last piece"}));
    // version 2's CRC covers the header too: a bos id changed from 2 to 1 (a valid id: it would
    // change training silently), a changed piece, a CRC field set to 0: each refused
    std::vector<uint8_t> bos = good;
    bos[16] = 1;
    CHECK(expect_load_fails(bos, "bos.bin", {"checksum mismatch: stored CRC32"}));
    std::vector<uint8_t> piece = good;
    piece[1024 + 3 + 1] ^= 1;  // a byte of piece 0's name
    CHECK(expect_load_fails(piece, "piece.bin", {"checksum mismatch"}));
    std::vector<uint8_t> zeroed = good;
    memset(&zeroed[4 * TOKENIZER_CRC_SLOT], 0, 4);
    CHECK(expect_load_fails(zeroed, "zeroed.bin", {"checksum mismatch: stored CRC32 00000000"}));
    std::vector<uint8_t> tail = sealed([&] { auto b = good; b[4 * 200] = 1; return b; }(), TOKENIZER_CRC_SLOT);
    CHECK(expect_load_fails(tail, "tail.bin", {"header int [200] is 1, must be 0"}));
    // version 1 (no CRC) still loads, with a note
    std::string v1 = dir + "/v1.bin";
    write_bytes(v1, tokenizer_bytes(fixture_pieces(), 2, 1, -1, TOKENIZER_MAGIC, TOKENIZER_VERSION_NO_CRC));
    std::string out;
    int status = run_in_child([v1] { Tokenizer t(v1); if (t.decode(9) != "In") { exit(3); } }, &out);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    CHECK(out.find("note: tokenizer '" + v1 + "' is of version 1, without a checksum") != std::string::npos);
    CHECK(expect_load_fails(tokenizer_bytes(fixture_pieces(), 2, 1, 3), "maxlen.bin", {"longer than the header's maximum 3"}));
    CHECK(expect_load_fails(tokenizer_bytes(fixture_pieces(), 2, 99), "special.bin", {"special id 99"}));
    std::vector<Piece> badtype = fixture_pieces();
    badtype[9].type = 7;
    CHECK(expect_load_fails(tokenizer_bytes(badtype, 2, 1), "type.bin", {"piece 9 has unknown type 7"}));
    remove_dir(dir);
    return report("test_tokenizer");
}
