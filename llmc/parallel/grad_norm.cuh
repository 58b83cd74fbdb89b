/*
The squared gradient norm in an order that does not depend on how the ranks split the buffer
(llmc/parallel/data_parallel.h grad_norm; doc/multi-gpu.md "The same bits on any rank count").

    unit_squares(units, g, begin, end)   units[u] = sum of g[i]^2 over the elements i of
                                         [begin, end) in unit u = [64u, 64u + 64), i ascending
    sum_units(out, units, ones, n)       out = the sum of units[0..n) (llmc/kernels/reduce.cuh
                                         dot_product with a vector of ones: its order depends
                                         on n only)

Every tensor starts on a 64-element offset and the ZeRO-1 chunks and ownership runs are whole
64-element units, so each unit is the gradient of one rank's piece: its owner fills it, the other
ranks leave 0 there, a sum over ranks (x + 0 = x, exactly) gives every rank every unit, and
sum_units adds them in the same order for 1 rank, N ranks, ZeRO 0 or 1. Gap elements between
tensors hold 0 and add nothing. Launch: one thread per unit, 128 per block; each thread adds
its 64 squares in order (a pass over the gradients, like the dot product it replaces).
*/
#pragma once

#include <cstddef>

#include "llmc/cuda_common.h"
#include "llmc/kernels/reduce.cuh"  // defines: dot_product, kReduceBlocks

constexpr size_t kNormUnit = 64;  // elements per unit: the layout's tensor alignment

template <typename T>
__global__ void unit_squares_kernel(float* units, const T* g, size_t begin, size_t end) {
    const size_t u = begin / kNormUnit + blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    const size_t first = u * kNormUnit > begin ? u * kNormUnit : begin;
    const size_t last = (u + 1) * kNormUnit < end ? (u + 1) * kNormUnit : end;
    if (first >= last) { return; }
    float sum = 0.0f;
    for (size_t i = first; i < last; i++) {
        const float x = to_float(g[i]);
        sum += x * x;
    }
    units[u] = sum;
}

// units[u] for every unit u that [begin, end) touches (begin a multiple of kNormUnit).
template <typename T>
void unit_squares(float* units, const T* g, size_t begin, size_t end, cudaStream_t stream) {
    if (begin >= end) { return; }
    const size_t count = CEIL_DIV(end, kNormUnit) - begin / kNormUnit;
    const int threads = 128;
    LAUNCH((unsigned)CEIL_DIV(count, (size_t)threads), threads, 0, stream, unit_squares_kernel<T>)(units, g, begin, end);
    cudaCheckLaunch();
}

// out (one device float) = the sum of units[0..n), in an order fixed by n.
inline void sum_units(float* out, float* scratch, const float* units, const float* ones, size_t n, cudaStream_t stream) {
    dot_product(out, scratch, units, ones, n, 1.0f, false, stream);
}
