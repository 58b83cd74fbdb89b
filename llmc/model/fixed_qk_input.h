/*
The fixed QK input of rndembqk and fixedseqqk (doc/deconstructing.md "rndembqk and fixedseqqk";
the mixer is llmc/mixers/fixed_qk.h, the row's kernels llmc/kernels/fixed_qk.cuh): model state
that is not a parameter. rndembqk's eps (T_max x d fp32, N(0, sigma^2), sigma = the real stream's
scale at init: 0.02 x the embedding multiplier, sqrt(d) or 1),
or fixedseqqk's T_max token ids (embedded with the live embedding); drawn / read at init,
written to and read from checkpoints (tensors fixed_qk.input / fixed_qk.tokens, doc/formats.md).
*/
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "llmc/cuda_common.h"
#include "llmc/data/dataloader.h"  // glob_shards, read_token_shard
#include "llmc/data/tensor_file.h"

// The fixed input (host copy, exactly as stored in files). `random`: rndembqk's eps, else
// fixedseqqk's tokens.
struct FixedQKInput {
    bool random = true;
    int T = 0, d = 0, vocab = 0;
    std::vector<float> eps;     // (T, d) rndembqk
    std::vector<int> tokens;    // (T) fixedseqqk

    static constexpr const char* kInputName = "fixed_qk.input";
    static constexpr const char* kTokensName = "fixed_qk.tokens";

    FixedQKInput() = default;
    FixedQKInput(bool random_input, int T_max, int width, int vocab_size)
        : random(random_input), T(T_max), d(width), vocab(vocab_size) {
        if (random) { eps.assign((size_t)T * d, 0.0f); } else { tokens.assign(T, 0); }
    }
    // rndembqk: eps ~ N(0, sigma^2) from its own stream (seed + 1), so the parameters' draw is the
    // same for every kind; sigma: the scale of the real stream at init (the embedding's N(0, 0.02)
    // times its multiplier)
    void draw(uint64_t seed, float sigma) {
        std::mt19937_64 rng(seed + 1);
        std::normal_distribution<float> normal(0.0f, 1.0f);
        for (float& e : eps) { e = sigma * normal(rng); }
    }
    // fixedseqqk: the first T tokens of the training data (its shards in sorted order)
    void take_first_tokens(const std::string& pattern) {
        if (pattern.empty()) {
            fatal("--attention fixedseqqk takes its fixed tokens from the training data: give --train-data");
        }
        size_t n = 0;
        for (const std::string& shard : glob_shards(pattern)) {
            for (int32_t t : read_token_shard(shard)) {
                if (n == (size_t)T) { break; }
                if (t < 0 || t >= vocab) {
                    fatal("--train-data %s: token %d in %s is outside the vocabulary of %d (fixedseqqk's fixed tokens)",
                          pattern.c_str(), t, shard.c_str(), vocab);
                }
                tokens[n++] = t;
            }
            if (n == (size_t)T) { return; }
        }
        fatal("--train-data %s: %zu tokens, fewer than the %d fixed tokens of fixedseqqk (the model's seq_len)",
              pattern.c_str(), n, T);
    }

    void write(TensorFileWriter& w) const {
        if (random) {
            w.add_floats(kInputName, {T, d}, eps.data());
        } else {
            w.add_ints(kTokensName, {T}, tokens.data());
        }
    }
    // From a checkpoint or debug state: the tensor must be there with this model's shape.
    void read(const TensorFileReader& r) {
        const char* name = random ? kInputName : kTokensName;
        if (!r.has_tensor(name)) {
            r.fail("missing tensor '%s': the fixed input of --attention %s", name, random ? "rndembqk" : "fixedseqqk");
        }
        const TensorEntry& t = r.tensor(name);
        const bool shape_ok = random ? t.shape == std::vector<int64_t>{T, d} : t.shape == std::vector<int64_t>{T};
        if (!shape_ok) {
            r.fail("tensor '%s' has the wrong shape (expected %s for seq_len %d, n_embd %d)", name,
                   random ? "(seq_len, n_embd)" : "(seq_len)", T, d);
        }
        if (random) {
            eps = r.floats(name, (int64_t)T * d);
            return;
        }
        std::vector<int32_t> ids = r.ints(name, T);
        for (int i = 0; i < T; i++) {
            if (ids[i] < 0 || ids[i] >= vocab) {
                r.fail("tensor '%s': token %d at %d is outside the vocabulary of %d", name, ids[i], i, vocab);
            }
        }
        tokens.assign(ids.begin(), ids.end());
    }
};
