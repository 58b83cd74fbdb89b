/*
Bias of a linear layer (GPT-2's projections: y = x W^T + b), forward and backward:

    forward:  out[n, c] = inp[n, c] + bias[c]          inp, out: (N, C) floatX; bias: (C)
    backward: dbias[c] += sum over n of dout[n, c]     (ACCUMULATED)

Forward: one thread per V consecutive elements of a row (V = x128::size when C % V == 0
and every pointer is 16-byte aligned, else 1); maths in fp32, one rounding. out may alias
inp (the trainer adds the bias in place after the GEMM).

Backward, deterministic without atomics, no barriers (cheap on the host backend too):
  pass 1: grid (ceil(C / 256), chunks); thread c of chunk k sums column c over the rows
          [k R, (k+1) R) in ascending order into scratch[k C + c]  (consecutive threads
          read consecutive columns: coalesced);
  pass 2: one thread per column adds the chunk sums in ascending order to dbias[c].
R and the number of chunks depend only on N (bias_backward_chunks), so every bit of the
result depends only on the inputs. Scratch: bias_backward_scratch_floats(N, C).
*/
#pragma once

#include "llmc/kernels/align.h"
#include "llmc/cuda_common.h"

constexpr int kBiasMinRowsPerChunk = 32;
constexpr int kBiasMaxChunks = 256;

// out[i] = inp[i] + bias[c], the column c of element i: the kernels' scalar path and the host loop
__device__ __forceinline__ void bias_forward_element(size_t i, int c, floatX* out, const floatX* inp, const floatX* bias) {
    out[i] = from_float<floatX>(to_float(inp[i]) + to_float(bias[c]));
}

template <int V>
__global__ void bias_forward_kernel(floatX* out, const floatX* inp, const floatX* bias, int N, int C) {
    size_t start = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * V;  // C % V == 0: a chunk never straddles rows
    if (start >= (size_t)N * C) { return; }
    int c = (int)(start % C);
    if constexpr (V > 1) {
        x128 x = load128(inp + start), b = load128(bias + c), y;
        for (int k = 0; k < V; k++) { y[k] = from_float<floatX>(to_float(x[k]) + to_float(b[k])); }
        store128(out + start, y);
    } else {
        bias_forward_element(start, c, out, inp, bias);
    }
}

__global__ void bias_backward_partial_kernel(float* scratch, const floatX* dout, int N, int C, int rows_per_chunk) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) { return; }
    int begin = blockIdx.y * rows_per_chunk;
    int end = begin + rows_per_chunk < N ? begin + rows_per_chunk : N;
    float sum = 0.0f;
    for (int n = begin; n < end; n++) { sum += to_float(dout[(size_t)n * C + c]); }
    scratch[(size_t)blockIdx.y * C + c] = sum;
}

__global__ void bias_backward_final_kernel(floatX* dbias, const float* scratch, int chunks, int C) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) { return; }
    float sum = 0.0f;
    for (int k = 0; k < chunks; k++) { sum += scratch[(size_t)k * C + c]; }
    dbias[c] = from_float<floatX>(to_float(dbias[c]) + sum);
}

inline void bias_forward(floatX* out, const floatX* inp, const floatX* bias, int N, int C, cudaStream_t stream) {
    if (N <= 0 || C <= 0) { return; }
#if HOST_BACKEND  // a vectorised loop per row (hostcuda::run_elementwise), the kernel's sum per element
    (void)stream;
    hostcuda::run_elementwise("bias_forward (host loop)", (size_t)N, [=](size_t n) {
        for (int c = 0; c < C; c++) { bias_forward_element(n * C + c, c, out, inp, bias); }
    });
    return;
#endif
    const int block_size = 256;
    size_t total = (size_t)N * C;
    if (C % x128::size == 0 && aligned16({out, inp, bias})) {
        unsigned grid = (unsigned)CEIL_DIV(total, (size_t)block_size * x128::size);
        LAUNCH(grid, block_size, 0, stream, bias_forward_kernel<x128::size>)(out, inp, bias, N, C);
    } else {
        LAUNCH((unsigned)CEIL_DIV(total, (size_t)block_size), block_size, 0, stream, bias_forward_kernel<1>)(out, inp, bias, N, C);
    }
    cudaCheckLaunch();
}

inline int bias_backward_chunks(int N) {
    int chunks = CEIL_DIV(N, kBiasMinRowsPerChunk);
    return chunks < kBiasMaxChunks ? (chunks > 0 ? chunks : 1) : kBiasMaxChunks;
}
inline size_t bias_backward_scratch_floats(int N, int C) { return (size_t)bias_backward_chunks(N) * C; }

inline void bias_backward(floatX* dbias, float* scratch, const floatX* dout, int N, int C, cudaStream_t stream) {
    if (N <= 0 || C <= 0) { return; }
    const int block_size = 256;
    int chunks = bias_backward_chunks(N);
    int rows_per_chunk = CEIL_DIV(N, chunks);
    LAUNCH(dim3(CEIL_DIV(C, block_size), chunks), block_size, 0, stream, bias_backward_partial_kernel)(scratch, dout, N, C,
                                                                                                      rows_per_chunk);
    cudaCheckLaunch();
    LAUNCH(CEIL_DIV(C, block_size), block_size, 0, stream, bias_backward_final_kernel)(dbias, scratch, chunks, C);
    cudaCheckLaunch();
}
