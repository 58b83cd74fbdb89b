/*
Sampling one token at a time with a KV cache: the keys and values of the positions already
seen stay on the device, so each new token costs one single-position forward pass instead
of recomputing the whole row.

    KVCache: per layer k, v: (capacity, Hkv, hd) floatX, rows 0 .. pos-1 filled (the keys
             after QK-norm and RoPE, as attention_forward sees them); doc: (capacity) int,
             the document id of each cached position (llmc/kernels/attention.cuh's doc_ids).
    attention_decode(shape, tensors): with shape.T = p + 1 cached positions (shape.B = 1), the
             attention of position p's query heads q: (Hq, hd) over cached rows 0..p, into
             out: (Hq, hd):
                 s[tau] = q . k[tau] / sqrt(hd) for tau <= p, and doc[tau] == doc[p] when doc
                 (shape.doc_ids) is given; out = softmax(s) v
             the maths of attention_forward's row p (llmc/kernels/attention.cuh), in fp32.

sample_tokens(model, tokens, n, ...): the trainers' sampling loop (below), with or without the
             cache (model.kv).

Launch layout: one block of kDecodeThreads threads per query head. Dynamic shared memory
holds the p + 1 scores and kDecodeThreads floats for the block reductions (max, then sum,
each a tree with a barrier per level); then thread c sums output dimension c over the keys.
Cost per head: 2 (p + 1) hd multiply-adds, linear in the context, against a full forward
pass's quadratic recomputation of the row.
*/
#pragma once

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "llmc/kernels/attention_shape.h"  // defines: AttnShape, AttnTensors
#include "llmc/cuda_common.h"
#include "llmc/model/sampling.h"

constexpr int kDecodeThreads = 128;

__global__ void attention_decode_kernel(floatX* out, const floatX* q, const floatX* k, const floatX* v, const int* doc,
                                        int p, int Hq, int Hkv, int hd) {
    const int h = blockIdx.x, j = h / (Hq / Hkv), tid = threadIdx.x;
    float* scores = dynamic_shared_memory<float>();  // [p + 1]
    float* reduce = scores + p + 1;                  // [kDecodeThreads]
    const floatX* qh = q + (size_t)h * hd;
    const float scale = 1.0f / sqrtf((float)hd);
    float local_max = -INFINITY;
    for (int tau = tid; tau <= p; tau += blockDim.x) {
        float s = -INFINITY;
        if (doc == nullptr || doc[tau] == doc[p]) {
            const floatX* kt = k + ((size_t)tau * Hkv + j) * hd;
            float dot = 0.0f;
            for (int c = 0; c < hd; c++) { dot += to_float(qh[c]) * to_float(kt[c]); }
            s = dot * scale;
        }
        scores[tau] = s;
        local_max = fmaxf(local_max, s);
    }
    reduce[tid] = local_max;
    __syncthreads();
    for (int stride = blockDim.x / 2; stride > 0; stride /= 2) {
        if (tid < stride) { reduce[tid] = fmaxf(reduce[tid], reduce[tid + stride]); }
        __syncthreads();
    }
    const float row_max = reduce[0];  // finite: position p sees itself
    __syncthreads();
    float local_sum = 0.0f;
    for (int tau = tid; tau <= p; tau += blockDim.x) {
        float e = scores[tau] == -INFINITY ? 0.0f : expf(scores[tau] - row_max);
        scores[tau] = e;
        local_sum += e;
    }
    reduce[tid] = local_sum;
    __syncthreads();
    for (int stride = blockDim.x / 2; stride > 0; stride /= 2) {
        if (tid < stride) { reduce[tid] += reduce[tid + stride]; }
        __syncthreads();
    }
    const float total = reduce[0];
    for (int c = tid; c < hd; c += blockDim.x) {
        float acc = 0.0f;
        for (int tau = 0; tau <= p; tau++) { acc += scores[tau] * to_float(v[((size_t)tau * Hkv + j) * hd + c]); }
        out[(size_t)h * hd + c] = from_float<floatX>(acc / total);
    }
}

inline void attention_decode(const AttnShape& s, const AttnTensors& t, cudaStream_t stream) {
    const int p = s.T - 1;
    size_t shared = ((size_t)p + 1 + kDecodeThreads) * sizeof(float);
    if (shared > 48 * 1024) {
        cudaCheck(cudaFuncSetAttribute(attention_decode_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)shared));
    }
    LAUNCH(s.Hq, kDecodeThreads, shared, stream, attention_decode_kernel)(t.out, t.q, t.k, t.v, s.doc_ids, p, s.Hq,
                                                                           s.Hkv, s.hd);
    cudaCheckLaunch();
}

// The cached keys and values of one sequence, for `layers` layers of kv_dim = Hkv * hd.
struct KVCache {
    int capacity = 0, pos = 0;  // rows held, rows filled
    std::vector<floatX*> k, v;
    int* doc = nullptr;
    int next_doc = 0;           // the document id of the next position (host)
    DeviceArena arena;

    void allocate(int layers, int rows, int kv_dim) {
        if (capacity == rows && (int)k.size() == layers) { return; }
        k.clear();
        v.clear();
        for (int l = 0; l < layers; l++) {
            k.push_back(arena.alloc<floatX>((size_t)rows * kv_dim));
            v.push_back(arena.alloc<floatX>((size_t)rows * kv_dim));
        }
        doc = arena.alloc<int>(rows);
        capacity = rows;
    }
    void clear() { pos = 0, next_doc = 0; }
};

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
