/*
The trainers' samples: drawing the next token from a row of logits (sample_token, over the first
V real entries only: the padded vocabulary columns never win), the generator of each printed
sample (sample_rng), and the loop that continues a sequence (sample_tokens, with the KV cache of
llmc/kernels/kv_cache.cuh, or recomputing the window). A sample depends only on (seed, step), so
a resumed run samples exactly as the uninterrupted one. sample_token is host-only C++17 (the
logits are a host copy of one row). Where the samples are printed and logged: doc/trainer.md.
*/
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "llmc/cuda_common.h"
#include "llmc/kernels/kv_cache.cuh"  // defines: KVCache

// The generator of the sample a run prints after `step` steps, seeded from (seed, step) alone: a
// sample does not depend on what the run did before it (saves, an interruption, earlier
// samples), so a resumed run samples exactly as the uninterrupted one.
inline std::mt19937_64 sample_rng(uint64_t seed, long step) {
    const uint64_t n = (uint64_t)step;
    std::seed_seq seq{(uint32_t)seed, (uint32_t)(seed >> 32), (uint32_t)n, (uint32_t)(n >> 32)};
    return std::mt19937_64(seq);
}

// temperature <= 0: argmax over logits[0:V] (first maximum); else a draw from
// softmax(logits[0:V] / temperature), computed in double after subtracting the maximum
// (std::discrete_distribution over the V weights). Only the first V (real) entries are
// considered: the padded vocabulary columns never win.
inline int sample_token(const float* logits, int V, float temperature, std::mt19937_64& rng) {
    const float* best = std::max_element(logits, logits + V);
    if (temperature <= 0.0f) { return (int)(best - logits); }
    std::vector<double> weights(V);
    for (int j = 0; j < V; j++) { weights[j] = std::exp(((double)logits[j] - *best) / temperature); }
    std::discrete_distribution<int> dist(weights.begin(), weights.end());
    return dist(rng);
}

// Continues `tokens` by n tokens drawn by sample_token (llmc/model/sampling.h) from the logits of
// the last position; the context is the last T tokens. With use_cache, every position of
// the window is one cached forward step while the sequence fits in T rows (the greedy
// tokens equal the recomputing path's); once it does not (the window slides and every
// position moves), and without the cache, the whole window is recomputed for each token,
// padded with the BOS token after its end (causal: the padding changes nothing before it).
// What the model knows is asked of it: its context T, its cache (model.kv), its logits
// buffer (positions, Vp) fp32, and from model.cfg the padded and real vocabulary sizes, the
// BOS id and the cache's layers and width.
template <typename Model>
std::vector<int> sample_tokens(Model& model, std::vector<int> tokens, int n, float temperature, std::mt19937_64& rng,
                               bool use_cache) {
    const auto& c = model.cfg;
    const int T = model.T, Vp = c.padded_vocab(), V = c.vocab_size, bos_id = c.bos_id;
    const float* logits = model.logits;
    KVCache& cache = model.kv;
    std::vector<float> last(Vp);
    std::vector<int> row(T);
    const int no_target = -1;
    std::vector<int> no_targets(T, -1);
    auto recompute = [&]() {  // the logits of the last token, from the whole window
        int start = std::max(0, (int)tokens.size() - T);
        int len = (int)tokens.size() - start;
        std::fill(row.begin(), row.end(), bos_id);
        std::copy(tokens.begin() + start, tokens.end(), row.begin());
        model.forward(row.data(), no_targets.data(), 1, T, 0.0f);
        cudaCheck(cudaMemcpy(last.data(), logits + (size_t)(len - 1) * Vp, Vp * sizeof(float), cudaMemcpyDeviceToHost));
    };
    auto step = [&](int token) {  // one cached position
        model.forward(&token, &no_target, 1, 1, 0.0f, nullptr, &cache);
        cache.pos++;
        cudaCheck(cudaMemcpy(last.data(), logits, Vp * sizeof(float), cudaMemcpyDeviceToHost));
    };
    bool cached = use_cache && (int)tokens.size() <= T && n > 0;
    if (cached) {
        cache.allocate(c.n_layer, T, c.kv_width());
        cache.clear();
        for (int t : tokens) { step(t); }
    }
    for (int k = 0; k < n; k++) {
        if (!cached) { recompute(); }
        tokens.push_back(sample_token(last.data(), V, temperature, rng));
        if (cached && k + 1 < n) {
            if ((int)tokens.size() <= T) {
                step(tokens.back());
            } else {
                cached = false;
            }
        }
    }
    return tokens;
}
