/*
The fixed QK input of the "sequence dependency" variants of Deconstructing Attention
(doc/deconstructing.md "rndembqk and fixedseqqk"): a fixed input of T_max positions runs through
the same network as one extra batch row (the "fixed row", after the B real rows), and each
variant layer takes its queries and keys from that row, for every real row alike. The input
itself (model state) is llmc/model/fixed_qk_input.h; these are the row's two kernels:

  broadcast_fixed_row(x, row, B)    x[b] = x[B] for b < B: the fixed row's q (or k) into the
                               B real rows (row = T * width elements per row)
  sum_rows_into_fixed(x, row, B)    x[B] = sum_{b <= B} x[b], in fp32, one rounding: the real
                               rows' dq (or dk) joins the fixed row's own, the backward of the
                               broadcast
Both kernels: one thread per element of a row, rows row-major and contiguous.
*/
#pragma once

#include <cstddef>

#include "llmc/cuda_common.h"

__global__ void broadcast_fixed_row_kernel(floatX* x, size_t row, int B) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= row) { return; }
    const floatX value = x[(size_t)B * row + i];
    for (int b = 0; b < B; b++) { x[(size_t)b * row + i] = value; }
}

__global__ void sum_rows_into_fixed_kernel(floatX* x, size_t row, int B) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= row) { return; }
    float sum = 0.0f;
    for (int b = 0; b <= B; b++) { sum += to_float(x[(size_t)b * row + i]); }
    x[(size_t)B * row + i] = from_float<floatX>(sum);
}

// x: (B + 1) rows of `row` elements; the last is the fixed row.
inline void broadcast_fixed_row(floatX* x, size_t row, int B, cudaStream_t stream) {
    const int block = 256;
    LAUNCH(CEIL_DIV(row, block), block, 0, stream, broadcast_fixed_row_kernel)(x, row, B);
    cudaCheckLaunch();
}
inline void sum_rows_into_fixed(floatX* x, size_t row, int B, cudaStream_t stream) {
    const int block = 256;
    LAUNCH(CEIL_DIV(row, block), block, 0, stream, sum_rows_into_fixed_kernel)(x, row, B);
    cudaCheckLaunch();
}
