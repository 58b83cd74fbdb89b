/*
The tokenizer a data file was made with: token shards (header ints [5], [6]) and eval sets
([10], [11]) record the fingerprint of the tokenizer that wrote them (llmc/data/tokenizer.h
Tokenizer::fingerprint(), dev/data/tokenizer.py tokenizer_fingerprint), and its flag, so the
trainer can refuse data that does not match its --tokenizer or each other
(llmc/train/input_files.h check_data_tokenizers). Files from before the field have 0 in both.
*/
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "llmc/utils.h"

// The fingerprint of the tokenizer a file was made with (llmc/data/tokenizer.h fingerprint()),
// from header int `slot` and its flag after it: 1 = recorded, 0 = a file from before the field
// (whose slot must then be 0).
struct TokenizerRecord {
    uint32_t fingerprint = 0;
    bool present = false;
};
inline TokenizerRecord read_tokenizer_record(const std::string& path, const char* kind, const std::vector<int32_t>& h, int slot) {
    const int flag = h[slot + 1];
    if (flag != 0 && flag != 1) {
        fatal("file '%s': %s header int [%d] (tokenizer flag) is %d, must be 0 or 1 (corrupt header)", path.c_str(), kind,
              slot + 1, flag);
    }
    if (flag == 0 && h[slot] != 0) {
        fatal("file '%s': %s header int [%d] is %d with no tokenizer recorded ([%d] 0): must be 0 (corrupt header)",
              path.c_str(), kind, slot, h[slot], slot + 1);
    }
    return {(uint32_t)h[slot], flag == 1};
}

