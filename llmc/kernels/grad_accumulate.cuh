/*
fp32 gradient accumulation for bf16 builds (TrainOptions::grad_fp32; the SAN paper keeps
gradients in fp32). The backward pass writes one micro-batch's gradients into the floatX
buffer; this pass adds them into the fp32 accumulator and clears the floatX buffer for the
next micro-batch, so the sum over --grad-accum micro-batches is rounded once per addition
in fp32 instead of in bf16:

    acc[i] += float(grads[i]);   grads[i] = 0          n elements, one thread per element
*/
#pragma once

#include "llmc/cuda_common.h"

__global__ void accumulate_fp32_kernel(float* acc, floatX* grads, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) { return; }
    acc[i] += to_float(grads[i]);
    grads[i] = from_float<floatX>(0.0f);
}

inline void accumulate_fp32(float* acc, floatX* grads, size_t n, cudaStream_t stream) {
    const int block = 256;
    LAUNCH(CEIL_DIV(n, block), block, 0, stream, accumulate_fp32_kernel)(acc, grads, n);
    cudaCheckLaunch();
}
