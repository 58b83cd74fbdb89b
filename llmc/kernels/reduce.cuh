/*
Deterministic reductions of long vectors: sum(a[i] * b[i]) over N elements (b == a gives a
sum of squares, e.g. the global gradient norm). Two passes whose grid depends only on N,
so the summation order, and therefore every bit of the result, depends only on N, not on
the machine or on timing: no floating-point atomics.

  pass 1: G = reduce_blocks(N) blocks x kReduceThreads threads (enough to keep a GPU's
          memory busy: up to kReduceBlocks = 512, ~32 elements per thread at the least);
          with 16-byte-aligned a and b, thread i of block g reads 16-byte vectors
          v = g*kReduceThreads + i + k*(G*kReduceThreads) (8 bf16 or 4 floats each), and the
          N % vector-width tail element-wise the same way; otherwise element-wise
          throughout. Thread 0 adds the block's kReduceThreads sums in thread order into
          partials[g];
  pass 2: one block sums the G partials the same way and applies
          out = accumulate ? out + scale * total : scale * total.
One barrier per thread and no shuffles: these run a few times per step, and on the host
backend a barrier costs a fiber switch per thread, so fewer synchronisations win there
(and small N gets few blocks).
*/
#pragma once

#include <algorithm>
#include <cstdint>

#include "llmc/cuda_common.h"

constexpr int kReduceBlocks = 512;  // the most blocks of pass 1: scratch buffers hold this many partials
constexpr int kReduceThreads = 128;

// Blocks of pass 1 for N elements: ~32 elements per thread at the least, at most kReduceBlocks.
inline int reduce_blocks(size_t N) {
    size_t blocks = CEIL_DIV(N, (size_t)kReduceThreads * 32);
    return (int)std::max<size_t>(1, std::min<size_t>(blocks, kReduceBlocks));
}

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
__global__ void dot_partials_kernel(float* partials, const T* a, const T* b, size_t N, bool vectorized) {
    constexpr int kWidth = Packed128<T>::size;
    const size_t first = blockIdx.x * (size_t)kReduceThreads + threadIdx.x;
    const size_t stride = (size_t)gridDim.x * kReduceThreads;
    float sum = 0.0f;
    size_t tail = 0;
    if (vectorized) {
        const size_t vectors = N / kWidth;
        for (size_t v = first; v < vectors; v += stride) {
            Packed128<T> x = load128(a + v * kWidth), y = load128(b + v * kWidth);
            for (int k = 0; k < kWidth; k++) { sum += to_float(x[k]) * to_float(y[k]); }
        }
        tail = vectors * kWidth;
    }
    for (size_t i = tail + first; i < N; i += stride) { sum += to_float(a[i]) * to_float(b[i]); }
    float total = block_sum_in_order(sum);
    if (threadIdx.x == 0) { partials[blockIdx.x] = total; }
}

template <typename TOut>
__global__ void sum_partials_kernel(TOut* out, const float* partials, int count, float scale, bool accumulate) {
    float value = 0.0f;
    for (int i = threadIdx.x; i < count; i += kReduceThreads) { value += partials[i]; }
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
    const int blocks = reduce_blocks(N);
    const bool vectorized = (reinterpret_cast<uintptr_t>(a) | reinterpret_cast<uintptr_t>(b)) % 16 == 0;
    LAUNCH(blocks, kReduceThreads, 0, stream, dot_partials_kernel<T>)(scratch, a, b, N, vectorized);
    cudaCheckLaunch();
    LAUNCH(1, kReduceThreads, 0, stream, sum_partials_kernel<TOut>)(out, scratch, blocks, scale, accumulate);
    cudaCheckLaunch();
}
