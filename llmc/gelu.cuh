/*
GELU, tanh approximation (as GPT-2), elementwise, forward and backward:

    gelu(x)  = 0.5 x (1 + tanh(u)),   u = sqrt(2/pi) (x + 0.044715 x^3)
    gelu'(x) = 0.5 (1 + tanh(u)) + 0.5 x (1 - tanh(u)^2) sqrt(2/pi) (1 + 3 * 0.044715 x^2)
    forward:  out  = gelu(inp)
    backward: dinp = dout * gelu'(inp)      (OVERWRITTEN)

inp, out, dout, dinp: N elements of floatX (any shape, e.g. (B, T, 4 d)); maths in fp32,
one rounding per output.

Launch layout: one thread per V consecutive elements, V = x128::size when every pointer is
16-byte aligned (128-bit loads and stores; the last partial chunk element by element), else
V = 1. Each thread reads its inputs before it writes, so out may alias inp and dinp may
alias dout or inp element for element. No barriers: on the host backend this is a plain
loop (tanhf dominates).
*/
#pragma once

#include "llmc/align.h"
#include "llmc/cuda_common.h"

constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluCubic = 0.044715f;

__device__ inline float gelu_tanh(float x) {
    float u = kGeluScale * (x + kGeluCubic * x * x * x);
    return 0.5f * x * (1.0f + tanhf(u));
}
__device__ inline float gelu_tanh_grad(float x) {
    float x2 = x * x;
    float t = tanhf(kGeluScale * (x + kGeluCubic * x2 * x));
    return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * kGeluScale * (1.0f + 3.0f * kGeluCubic * x2);
}

template <int V>
__global__ void gelu_forward_kernel(floatX* out, const floatX* inp, size_t N) {
    size_t start = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * V;
    if (start >= N) { return; }
    if (V > 1 && start + V <= N) {
        x128 x = load128cs(inp + start), y;
        for (int k = 0; k < V; k++) { y[k] = from_float<floatX>(gelu_tanh(to_float(x[k]))); }
        store128(out + start, y);
    } else {
        for (size_t i = start; i < N && i < start + V; i++) { out[i] = from_float<floatX>(gelu_tanh(to_float(inp[i]))); }
    }
}

template <int V>
__global__ void gelu_backward_kernel(floatX* dinp, const floatX* dout, const floatX* inp, size_t N) {
    size_t start = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * V;
    if (start >= N) { return; }
    if (V > 1 && start + V <= N) {
        x128 x = load128cs(inp + start), d = load128cs(dout + start), g;
        for (int k = 0; k < V; k++) { g[k] = from_float<floatX>(to_float(d[k]) * gelu_tanh_grad(to_float(x[k]))); }
        store128(dinp + start, g);
    } else {
        for (size_t i = start; i < N && i < start + V; i++) {
            dinp[i] = from_float<floatX>(to_float(dout[i]) * gelu_tanh_grad(to_float(inp[i])));
        }
    }
}

inline void gelu_forward(floatX* out, const floatX* inp, size_t N, cudaStream_t stream) {
    if (N == 0) { return; }
    const int block_size = 256;
    if (aligned16({out, inp})) {
        unsigned grid = (unsigned)CEIL_DIV(N, (size_t)block_size * x128::size);
        LAUNCH(grid, block_size, 0, stream, gelu_forward_kernel<x128::size>)(out, inp, N);
    } else {
        LAUNCH((unsigned)CEIL_DIV(N, (size_t)block_size), block_size, 0, stream, gelu_forward_kernel<1>)(out, inp, N);
    }
    cudaCheckLaunch();
}

inline void gelu_backward(floatX* dinp, const floatX* dout, const floatX* inp, size_t N, cudaStream_t stream) {
    if (N == 0) { return; }
    const int block_size = 256;
    if (aligned16({dinp, dout, inp})) {
        unsigned grid = (unsigned)CEIL_DIV(N, (size_t)block_size * x128::size);
        LAUNCH(grid, block_size, 0, stream, gelu_backward_kernel<x128::size>)(dinp, dout, inp, N);
    } else {
        LAUNCH((unsigned)CEIL_DIV(N, (size_t)block_size), block_size, 0, stream, gelu_backward_kernel<1>)(dinp, dout, inp, N);
    }
    cudaCheckLaunch();
}
