/*
Deterministic reductions of long vectors: sum(a[i] * b[i]) over N elements (b == a gives a
sum of squares, e.g. the global gradient norm). Two passes with a FIXED grid, so the
summation order, and therefore every bit of the result, depends only on N, not on the
machine or on timing: no floating-point atomics.

  pass 1: kReduceBlocks blocks x kReduceThreads threads; thread i of block b sums the
          elements b*kReduceThreads + i + k*(kReduceBlocks*kReduceThreads), then thread 0
          adds the block's kReduceThreads sums in thread order into partials[b];
  pass 2: one block sums the partials the same way and applies
          out = accumulate ? out + scale * total : scale * total.
One barrier per thread and no shuffles: these run a few times per step, and on the host
backend a barrier costs a fiber switch per thread, so fewer synchronisations win there.
*/
#pragma once

#include "cuda_common.h"

constexpr int kReduceBlocks = 32;
constexpr int kReduceThreads = 128;

// Sums `value` over the block's kReduceThreads threads in thread order; the total is
// valid in thread 0 only.
__device__ inline float block_sum_in_order(float value) {
    __shared__ float sums[kReduceThreads];
    sums[threadIdx.x] = value;
    __syncthreads();
    float total = 0.0f;
    if (threadIdx.x == 0) {
        for (int i = 0; i < kReduceThreads; i++) { total += sums[i]; }
    }
    return total;
}

template <typename T>
__global__ void dot_partials_kernel(float* partials, const T* a, const T* b, size_t N) {
    float sum = 0.0f;
    for (size_t i = blockIdx.x * (size_t)kReduceThreads + threadIdx.x; i < N; i += (size_t)kReduceBlocks * kReduceThreads) {
        sum += to_float(a[i]) * to_float(b[i]);
    }
    float total = block_sum_in_order(sum);
    if (threadIdx.x == 0) { partials[blockIdx.x] = total; }
}

template <typename TOut>
__global__ void sum_partials_kernel(TOut* out, const float* partials, float scale, bool accumulate) {
    float value = 0.0f;
    for (int i = threadIdx.x; i < kReduceBlocks; i += kReduceThreads) { value += partials[i]; }
    float total = block_sum_in_order(value);
    if (threadIdx.x == 0) {
        float result = scale * total;
        if (accumulate) { result += to_float(*out); }
        *out = from_float<TOut>(result);
    }
}

// out (one element on the device) = [out +] scale * sum_i a[i] * b[i].
// scratch: kReduceBlocks floats.
template <typename T, typename TOut>
void dot_product(TOut* out, float* scratch, const T* a, const T* b, size_t N, float scale, bool accumulate,
                 cudaStream_t stream) {
    LAUNCH(kReduceBlocks, kReduceThreads, 0, stream, dot_partials_kernel<T>)(scratch, a, b, N);
    cudaCheckLaunch();
    LAUNCH(1, kReduceThreads, 0, stream, sum_partials_kernel<TOut>)(out, scratch, scale, accumulate);
    cudaCheckLaunch();
}
