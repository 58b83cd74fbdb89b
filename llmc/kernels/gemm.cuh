/*
The GEMM wrapper every matmul of the trainers goes through:

    C[b] = alpha * op(A[b]) @ op(B[b]) + beta * C[b]        for b in [0, batch)

    gemm(C, A, B, shape, alpha, beta, stream)

The shape (llmc/kernels/gemm_shape.h's GemmShape: M, N, K, the transposes, the batch and its strides)
is row-major, as PyTorch thinks of tensors: op(A) is M x K, op(B) is K x N, C is M x N, all
contiguous; with trans_a, A is stored K x M (and similarly B stored N x K with trans_b).
Consecutive batch matrices are `stride_*` elements apart (0 broadcasts one matrix).
A and B are float or bf16 (the same type); C is float or bf16; accumulation is fp32.
beta == 0 means C is not read, so it may hold garbage (NaN included), as in cuBLAS.

GPU: cublasGemmStridedBatchedEx, computing in fp32 (CUBLAS_COMPUTE_32F, no TF32, so fp32
builds match the reference tightly; bf16 inputs run on tensor cores). Host backend:
llmc/hostcuda/gemm.h (oneDNN or OpenBLAS where the build has them, else our own packed GEMM,
spread over the host backend's worker pool). gemm_backend_name() names the one in use. Not safe to call from two host threads at once.
*/
#pragma once

#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "llmc/cuda_common.h"
#include "llmc/kernels/gemm_shape.h"  // defines: GemmShape
#if !defined(__CUDACC__)
#include "llmc/hostcuda/gemm.h"
#endif

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
void gemm(TOut* C, const TIn* A, const TIn* B, const GemmShape& s, float alpha = 1.0f, float beta = 0.0f,
          cudaStream_t stream = 0) {
    // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: swap the operands.
    cublasHandle_t handle = cublas_handle();
    cublasCheck(cublasSetStream(handle, stream));
    cublasCheck(cublasGemmStridedBatchedEx(
        handle, s.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, s.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, s.N, s.M, s.K, &alpha,
        B, cuda_data_type<TIn>(), s.trans_b ? s.K : s.N, s.stride_b, A, cuda_data_type<TIn>(), s.trans_a ? s.M : s.K,
        s.stride_a, &beta, C, cuda_data_type<TOut>(), s.N, s.stride_c, s.batch, CUBLAS_COMPUTE_32F,
        CUBLAS_GEMM_DEFAULT));
}

inline std::string gemm_backend_name() { return "cuBLAS"; }

#else  // host backend

template <typename TIn, typename TOut>
void gemm(TOut* C, const TIn* A, const TIn* B, const GemmShape& shape, float alpha = 1.0f, float beta = 0.0f,
          cudaStream_t = nullptr) {
    hostcuda::host_gemm(C, A, B, shape, alpha, beta);
}

// the library and instruction set of the GEMMs, for the banner
inline std::string gemm_backend_name() { return hostcuda::host_gemm_description(); }

#endif

// ---- the linear layer, as the trainers use it ---------------------------------------------
// A weight W is (out, in) as in PyTorch; x is (N, in) rows, y = x W^T is (N, out).

// y = x W^T (y may be fp32 where x and W are floatX: the logits)
template <typename TIn, typename TOut>
void linear_forward(TOut* y, const TIn* x, const TIn* W, int N, int in, int out, cudaStream_t stream) {
    gemm(y, x, W, GemmShape::nt(N, out, in), 1.0f, 0.0f, stream);
}
// dW += dy^T x: the weight gradient accumulates over micro-batches
template <typename T>
void linear_backward_weight(T* dW, const T* dy, const T* x, int N, int in, int out, cudaStream_t stream) {
    gemm(dW, dy, x, GemmShape::tn(out, in, N), 1.0f, 1.0f, stream);
}
// dx = dy W, or dx += dy W with `accumulate` (x feeds several linear layers: q, k and v)
template <typename T>
void linear_backward_input(T* dx, const T* dy, const T* W, int N, int in, int out, bool accumulate, cudaStream_t stream) {
    gemm(dx, dy, W, GemmShape::nn(N, in, out), 1.0f, accumulate ? 1.0f : 0.0f, stream);
}
