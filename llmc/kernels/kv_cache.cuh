/*
Decoding one token at a time with a KV cache: the keys and values of the positions already
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

The trainers' sampling loop, which steps through this cache, is llmc/model/sampling.h's
sample_tokens.

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
