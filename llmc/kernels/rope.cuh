/*
Rotary position embedding, rotate-half convention (doc/san-model.md "RoPE"), on (B, T, H, hd)
tensors (query or key heads), position t = index in the row:

    z1 = z[:hd/2], z2 = z[hd/2:]:   RoPE(z) = [z1 * cos - z2 * sin,  z2 * cos + z1 * sin]
    backward (the transpose, a rotation by -angle): [d1 * cos + d2 * sin,  d2 * cos - d1 * sin]

The cos/sin table is computed once on the HOST in fp64 (inv_freq[i] = theta^(-2i/hd),
angle = t * inv_freq[i], as attnref/san.py's rope_cos_sin) and rounded to fp32, the compute
dtype: table (T, hd) fp32 with table[t*hd + i] = cos, table[t*hd + hd/2 + i] = sin, i < hd/2.
Copy it to the device once. All maths in fp32, one rounding of the output.

Launch layout: one thread per V pairs (i, i + hd/2) of one head vector, V = x128::size when
hd/2 is a multiple of it and the pointers are 16-byte aligned (two 128-bit loads, two stores),
else V = 1. Each thread reads both halves before writing them, so out may alias inp (and
dinp may alias dout). No barriers.
*/
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "llmc/cuda_common.h"

inline std::vector<float> rope_table(int T, int hd, double theta) {
    int half = hd / 2;
    std::vector<float> table((size_t)T * hd);
    for (int i = 0; i < half; i++) {
        double inv_freq = std::pow(theta, -((double)i * 2.0 / hd));
        for (int t = 0; t < T; t++) {
            double angle = (double)t * inv_freq;
            table[(size_t)t * hd + i] = (float)std::cos(angle);
            table[(size_t)t * hd + half + i] = (float)std::sin(angle);
        }
    }
    return table;
}


// The two halves of a rotated pair (z1, z2) = (z[i], z[half + i]) at one position, `row` its
// table row: rope_first = z1 cos - z2 sin, rope_second = z2 cos + z1 sin, sin times `direction`
// (+1 forward, -1 backward), the fma written out (as g++ contracted it before) so that the
// fused QK-norm + RoPE kernels (llmc/kernels/qk_norm_rope.cuh), which call the same functions,
// compute the same float operations whatever a compiler would contract.
__device__ inline float rope_first(float z1, float z2, const float* row, int half, int i, float direction) {
    float c = row[i], s = direction * row[half + i];
    return fmaf(z1, c, -(z2 * s));
}
__device__ inline float rope_second(float z1, float z2, const float* row, int half, int i, float direction) {
    float c = row[i], s = direction * row[half + i];
    return fmaf(z2, c, z1 * s);
}

// direction +1: forward rotation; -1: backward (rotation by -angle). (hd/2) % V == 0.
template <int V>
__global__ void rope_kernel(floatX* out, const floatX* inp, const float* table, int B, int T, int H, int hd,
                            float direction) {
    int half = hd / 2;
    int chunks_per_head = half / V;
    size_t index = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    size_t total = (size_t)B * T * H * chunks_per_head;
    if (index >= total) { return; }
    int i = (int)(index % chunks_per_head) * V;
    size_t head_vector = index / chunks_per_head;  // (b, t, h) flattened
    int t = (int)((head_vector / H) % T);
    size_t base = head_vector * hd;
    float z1[V], z2[V], o1[V], o2[V];
    load_floats<V>(z1, inp + base + i);
    load_floats<V>(z2, inp + base + half + i);
    const float* row = table + (size_t)t * hd;
    for (int k = 0; k < V; k++) {
        o1[k] = rope_first(z1[k], z2[k], row, half, i + k, direction);
        o2[k] = rope_second(z1[k], z2[k], row, half, i + k, direction);
    }
    store_floats<V>(out + base + i, o1);
    store_floats<V>(out + base + half + i, o2);
}

inline void rope_launch(floatX* out, const floatX* inp, const float* table, int B, int T, int H, int hd,
                        float direction, cudaStream_t stream) {
    int half = hd / 2;
    bool vector = half % x128::size == 0 && reinterpret_cast<uintptr_t>(out) % 16 == 0 &&
                  reinterpret_cast<uintptr_t>(inp) % 16 == 0;
    int V = vector ? x128::size : 1;
    size_t threads = (size_t)B * T * H * (half / V);
    if (threads == 0) { return; }
    const int block_size = 256;
    unsigned grid = (unsigned)CEIL_DIV(threads, (size_t)block_size);
    if (vector) {
        LAUNCH(grid, block_size, 0, stream, rope_kernel<x128::size>)(out, inp, table, B, T, H, hd, direction);
    } else {
        LAUNCH(grid, block_size, 0, stream, rope_kernel<1>)(out, inp, table, B, T, H, hd, direction);
    }
    cudaCheckLaunch();
}

// out = RoPE(inp); out may alias inp. table: rope_table(T_table >= T, hd, theta) on the device.
inline void rope_forward(floatX* out, const floatX* inp, const float* table, int B, int T, int H, int hd,
                         cudaStream_t stream) {
    rope_launch(out, inp, table, B, T, H, hd, 1.0f, stream);
}

// dinp = RoPE^T(dout), OVERWRITTEN; dinp may alias dout.
inline void rope_backward(floatX* dinp, const floatX* dout, const float* table, int B, int T, int H, int hd,
                          cudaStream_t stream) {
    rope_launch(dinp, dout, table, B, T, H, hd, -1.0f, stream);
}
