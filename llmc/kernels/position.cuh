/*
Learned positional embeddings (GPT-2), forward and backward:

    forward:  out[b, t, :] += wpe[t, :]                      (ADDED in place, one rounding)
    backward: dwpe[t, :]   += sum over b of dout[b, t, :]    (ACCUMULATED, b ascending)

out, dout: (B, T, C) floatX; wpe, dwpe: (maxT, C) floatX with T <= maxT (rows >= T are
untouched). The trainer calls embedding_forward(out, idx, wte, N, C, 1.0f) (llmc/kernels/embedding.cuh,
exact in floatX at scale 1) and then position_forward, so the sum of the two embeddings is
rounded once, as a fused kernel would.

Launch layout: one thread per (t, c) element for the backward (it loops over the batch in
order: deterministic, no atomics), one thread per element for the forward. No barriers.
*/
#pragma once

#include "llmc/cuda_common.h"

__global__ void position_forward_kernel(floatX* out, const floatX* wpe, int B, int T, int C) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)B * T * C) { return; }
    size_t tc = i % ((size_t)T * C);  // (t, c) of element i: wpe is (maxT, C) with the same row stride
    out[i] = from_float<floatX>(to_float(out[i]) + to_float(wpe[tc]));
}

__global__ void position_backward_kernel(floatX* dwpe, const floatX* dout, int B, int T, int C) {
    size_t tc = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (tc >= (size_t)T * C) { return; }
    float sum = 0.0f;
    for (int b = 0; b < B; b++) { sum += to_float(dout[(size_t)b * T * C + tc]); }
    dwpe[tc] = from_float<floatX>(to_float(dwpe[tc]) + sum);
}

inline void position_forward(floatX* out, const floatX* wpe, int B, int T, int C, cudaStream_t stream) {
    const int block_size = 256;
    size_t total = (size_t)B * T * C;
    if (total == 0) { return; }
    LAUNCH((unsigned)CEIL_DIV(total, (size_t)block_size), block_size, 0, stream, position_forward_kernel)(out, wpe, B, T, C);
    cudaCheckLaunch();
}

inline void position_backward(floatX* dwpe, const floatX* dout, int B, int T, int C, cudaStream_t stream) {
    const int block_size = 256;
    size_t total = (size_t)T * C;
    if (total == 0 || B == 0) { return; }
    LAUNCH((unsigned)CEIL_DIV(total, (size_t)block_size), block_size, 0, stream, position_backward_kernel)(dwpe, dout, B, T, C);
    cudaCheckLaunch();
}
