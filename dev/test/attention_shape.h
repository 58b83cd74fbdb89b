// The shape of an attention test case (dev/test/test_attention.cu, test_attention_variants.cu):
// q, out: (B, T, Hq, hd); k, v: (B, T, Hkv, hd); per-row statistics (lse, ...): (B, Hq, T).
#pragma once

#include <cstddef>

struct Shape {
    int B, T, Hq, Hkv, hd;
    size_t q_size() const { return (size_t)B * T * Hq * hd; }
    size_t kv_size() const { return (size_t)B * T * Hkv * hd; }
    size_t stat_size() const { return (size_t)B * Hq * T; }
};
