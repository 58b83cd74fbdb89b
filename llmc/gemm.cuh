/*
The GEMM wrapper every matmul of the trainers goes through:

    C[b] = alpha * op(A[b]) @ op(B[b]) + beta * C[b]        for b in [0, batch)

Row-major, as PyTorch thinks of tensors: op(A) is M x K, op(B) is K x N, C is M x N, all
contiguous; with trans_a, A is stored K x M (and similarly B stored N x K with trans_b).
Consecutive batch matrices are `stride_*` elements apart (0 broadcasts one matrix).
A and B are float or bf16 (the same type); C is float or bf16; accumulation is fp32.
beta == 0 means C is not read, so it may hold garbage (NaN included), as in cuBLAS.

GPU: cublasGemmStridedBatchedEx, computing in fp32 (CUBLAS_COMPUTE_32F, no TF32, so fp32
builds match the reference tightly; bf16 inputs run on tensor cores). Host backend: a packed, register-tiled CPU GEMM spread over the host
backend's worker pool. Not safe to call from two host threads at once.
*/
#pragma once

#include <cstdint>
#include <type_traits>
#include <vector>

#include "cuda_common.h"

#if defined(__CUDACC__)
#include <cublas_v2.h>

inline void cublas_check(cublasStatus_t status, const char* file, int line) {
    if (status != CUBLAS_STATUS_SUCCESS) {
        fflush(stdout);
        fprintf(stderr, "[cuBLAS ERROR] at %s:%d: status %d\n", file, line, (int)status);
        exit(EXIT_FAILURE);
    }
}
#define cublasCheck(status) (cublas_check((status), __FILE__, __LINE__))

inline cublasHandle_t cublas_handle() {
    static cublasHandle_t handle = [] {
        cublasHandle_t h;
        cublasCheck(cublasCreate(&h));
        // default math: fp32 GEMMs stay fp32 (TF32 only with CUBLAS_TF32_TENSOR_OP_MATH or
        // COMPUTE_32F_FAST_TF32, which we never ask for); bf16 GEMMs use tensor cores.
        // Pedantic mode would also keep fp32 exact but may forbid the fastest bf16 kernels.
        cublasCheck(cublasSetMathMode(h, CUBLAS_DEFAULT_MATH));
        return h;
    }();
    return handle;
}

template <typename T>
constexpr cudaDataType_t cuda_data_type() {
    return std::is_same<T, float>::value ? CUDA_R_32F : CUDA_R_16BF;
}

template <typename TIn, typename TOut>
void gemm(TOut* C, const TIn* A, const TIn* B, int M, int N, int K, bool trans_a, bool trans_b,
          float alpha = 1.0f, float beta = 0.0f, int batch = 1, int64_t stride_a = 0, int64_t stride_b = 0,
          int64_t stride_c = 0, cudaStream_t stream = 0) {
    // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: swap the operands.
    cublasHandle_t handle = cublas_handle();
    cublasCheck(cublasSetStream(handle, stream));
    cublasCheck(cublasGemmStridedBatchedEx(
        handle, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, N, M, K, &alpha, B,
        cuda_data_type<TIn>(), trans_b ? K : N, stride_b, A, cuda_data_type<TIn>(), trans_a ? M : K, stride_a,
        &beta, C, cuda_data_type<TOut>(), N, stride_c, batch, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

#else  // host backend

namespace hostcuda {

// Micro-tile: kTileRows rows x kTileCols columns of C held in registers across the K loop.
constexpr int kTileRows = 4;
constexpr int kTileCols = 32;
constexpr int kRowBlocksPerTask = 16;

// op(A) packed as [row block][k][kTileRows] and op(B) as [column panel][k][kTileCols], in
// fp32, zero-padded to whole tiles, so the inner loop reads both sequentially.
struct GemmPacked {
    std::vector<float> a, b;
    int M, N, K, row_blocks, col_panels;
};

template <typename T>
void pack_a(GemmPacked& p, const T* A, bool trans_a) {
    p.a.assign((size_t)p.row_blocks * p.K * kTileRows, 0.0f);
    for (int i = 0; i < p.M; i++) {
        float* dst = p.a.data() + (size_t)(i / kTileRows) * p.K * kTileRows + i % kTileRows;
        for (int k = 0; k < p.K; k++) {
            dst[(size_t)k * kTileRows] = to_float(trans_a ? A[(size_t)k * p.M + i] : A[(size_t)i * p.K + k]);
        }
    }
}

template <typename T>
void pack_b(GemmPacked& p, const T* B, bool trans_b) {
    p.b.assign((size_t)p.col_panels * p.K * kTileCols, 0.0f);
    for (int k = 0; k < p.K; k++) {
        for (int j = 0; j < p.N; j++) {
            float value = to_float(trans_b ? B[(size_t)j * p.K + k] : B[(size_t)k * p.N + j]);
            p.b[((size_t)(j / kTileCols) * p.K + k) * kTileCols + j % kTileCols] = value;
        }
    }
}

template <typename TOut>
struct GemmTask {
    const GemmPacked* packed;
    TOut* C;
    float alpha, beta;
};

template <typename TOut>
void gemm_task(void* ctx, int64_t task) {
    const GemmTask<TOut>& t = *static_cast<const GemmTask<TOut>*>(ctx);
    const GemmPacked& p = *t.packed;
    int panel = static_cast<int>(task % p.col_panels);
    int first_block = static_cast<int>(task / p.col_panels) * kRowBlocksPerTask;
    int last_block = std::min(p.row_blocks, first_block + kRowBlocksPerTask);
    const float* b_panel = p.b.data() + (size_t)panel * p.K * kTileCols;
    for (int block = first_block; block < last_block; block++) {
        const float* a_block = p.a.data() + (size_t)block * p.K * kTileRows;
        float acc[kTileRows][kTileCols] = {};
        for (int k = 0; k < p.K; k++) {
            const float* b_row = b_panel + (size_t)k * kTileCols;
            const float* a_col = a_block + (size_t)k * kTileRows;
            for (int r = 0; r < kTileRows; r++) {
                float a = a_col[r];
                for (int c = 0; c < kTileCols; c++) { acc[r][c] += a * b_row[c]; }
            }
        }
        for (int r = 0; r < kTileRows; r++) {
            int i = block * kTileRows + r;
            if (i >= p.M) { break; }
            for (int c = 0; c < kTileCols; c++) {
                int j = panel * kTileCols + c;
                if (j >= p.N) { break; }
                TOut* out = t.C + (size_t)i * p.N + j;
                float value = t.alpha * acc[r][c];
                if (t.beta != 0.0f) { value += t.beta * to_float(*out); }
                *out = from_float<TOut>(value);
            }
        }
    }
}

}  // namespace hostcuda

template <typename TIn, typename TOut>
void gemm(TOut* C, const TIn* A, const TIn* B, int M, int N, int K, bool trans_a, bool trans_b,
          float alpha = 1.0f, float beta = 0.0f, int batch = 1, int64_t stride_a = 0, int64_t stride_b = 0,
          int64_t stride_c = 0, cudaStream_t = nullptr) {
    using namespace hostcuda;
    static GemmPacked packed;
    packed.M = M;
    packed.N = N;
    packed.K = K;
    packed.row_blocks = CEIL_DIV(M, kTileRows);
    packed.col_panels = CEIL_DIV(N, kTileCols);
    int64_t tasks = (int64_t)packed.col_panels * CEIL_DIV(packed.row_blocks, kRowBlocksPerTask);
    for (int b = 0; b < batch; b++) {
        pack_a(packed, A + b * stride_a, trans_a);
        pack_b(packed, B + b * stride_b, trans_b);
        GemmTask<TOut> task{&packed, C + b * stride_c, alpha, beta};
        // below ~1 MFLOP, waking the pool costs more than it saves
        int64_t chunk = (int64_t)M * N * K < (1 << 20) ? tasks : 1;
        Pool::instance().parallel_for(tasks, chunk, gemm_task<TOut>, &task);
    }
}

#endif

// ---- the linear layer, as the trainers use it ---------------------------------------------
// A weight W is (out, in) as in PyTorch; x is (N, in) rows, y = x W^T is (N, out).

// y = x W^T (y may be fp32 where x and W are floatX: the logits)
template <typename TIn, typename TOut>
void linear_forward(TOut* y, const TIn* x, const TIn* W, int N, int in, int out, cudaStream_t stream) {
    gemm(y, x, W, N, out, in, false, true, 1.0f, 0.0f, 1, 0, 0, 0, stream);
}
// dW += dy^T x: the weight gradient accumulates over micro-batches
template <typename T>
void linear_backward_weight(T* dW, const T* dy, const T* x, int N, int in, int out, cudaStream_t stream) {
    gemm(dW, dy, x, out, in, N, true, false, 1.0f, 1.0f, 1, 0, 0, 0, stream);
}
// dx = dy W, or dx += dy W with `accumulate` (x feeds several linear layers: q, k and v)
template <typename T>
void linear_backward_input(T* dx, const T* dy, const T* W, int N, int in, int out, bool accumulate, cudaStream_t stream) {
    gemm(dx, dy, W, N, in, out, false, false, 1.0f, accumulate ? 1.0f : 0.0f, 1, 0, 0, 0, stream);
}
