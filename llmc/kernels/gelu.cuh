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
alias dout or inp element for element. The host backend runs the per-element functions as
plain vectorised loops instead (hostcuda::run_elementwise); dev/cuda/gelu.cu checks both.
*/
#pragma once

#include "llmc/kernels/align.h"
#include "llmc/cuda_common.h"

constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluCubic = 0.044715f;

// 1 + tanh(u) and 1 - tanh(u) from one exp (several times cheaper than tanhf on the host,
// and branch-free, so the host compiler vectorises it), each without cancellation: with
// e = exp(2 u), 1 - tanh = 2 / (1 + e) and 1 + tanh = 2 e / (1 + e). u is capped at 20,
// where 1 + tanh is 2 in fp32 and 1 - tanh < 1e-17 (no inf / inf); e underflows to 0 for
// very negative u, giving exactly 0 and 2.
__device__ inline void gelu_tanh_parts(float u, float* one_plus, float* one_minus) {
    float e = kernel_expf(2.0f * kernel_fminf_bound(u, 20.0f)), inv = 1.0f / (1.0f + e);
    *one_minus = 2.0f * inv;
    *one_plus = 2.0f * e * inv;
}

__device__ inline float gelu_tanh(float x) {
    float one_plus, one_minus;
    gelu_tanh_parts(kGeluScale * (x + kGeluCubic * x * x * x), &one_plus, &one_minus);
    return 0.5f * x * one_plus;
}
__device__ inline float gelu_tanh_grad(float x) {
    x = kernel_fminf_bound(kernel_fmaxf_bound(x, -10.0f), 10.0f);  // beyond, gelu' is 0 or 1 in fp32; keeps x^3 finite (no 0 * inf)
    float x2 = x * x, one_plus, one_minus;
    gelu_tanh_parts(kGeluScale * (x + kGeluCubic * x2 * x), &one_plus, &one_minus);
    return 0.5f * one_plus + 0.5f * x * (one_plus * one_minus) * kGeluScale * (1.0f + 3.0f * kGeluCubic * x2);
}

// one element of each direction: the kernels' scalar path and the host backend's loops
__device__ __forceinline__ void gelu_forward_element(size_t i, floatX* out, const floatX* inp) {
    out[i] = from_float<floatX>(gelu_tanh(to_float(inp[i])));
}
__device__ __forceinline__ void gelu_backward_element(size_t i, floatX* dinp, const floatX* dout, const floatX* inp) {
    dinp[i] = from_float<floatX>(to_float(dout[i]) * gelu_tanh_grad(to_float(inp[i])));
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
        for (size_t i = start; i < N && i < start + V; i++) { gelu_forward_element(i, out, inp); }
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
        for (size_t i = start; i < N && i < start + V; i++) { gelu_backward_element(i, dinp, dout, inp); }
    }
}

inline void gelu_forward(floatX* out, const floatX* inp, size_t N, cudaStream_t stream) {
    if (N == 0) { return; }
#if HOST_BACKEND  // the per-element function as a vectorised loop (hostcuda::run_elementwise)
    (void)stream;
    hostcuda::run_elementwise("gelu_forward (host loop)", N, [=](size_t i) { gelu_forward_element(i, out, inp); });
    return;
#endif
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
#if HOST_BACKEND
    (void)stream;
    hostcuda::run_elementwise("gelu_backward (host loop)", N, [=](size_t i) { gelu_backward_element(i, dinp, dout, inp); });
    return;
#endif
    const int block_size = 256;
    if (aligned16({dinp, dout, inp})) {
        unsigned grid = (unsigned)CEIL_DIV(N, (size_t)block_size * x128::size);
        LAUNCH(grid, block_size, 0, stream, gelu_backward_kernel<x128::size>)(dinp, dout, inp, N);
    } else {
        LAUNCH((unsigned)CEIL_DIV(N, (size_t)block_size), block_size, 0, stream, gelu_backward_kernel<1>)(dinp, dout, inp, N);
    }
    cudaCheckLaunch();
}
