/*
The shape and layout of one GEMM call, by name (llmc/kernels/gemm.cuh's gemm(), and the host
backend's llmc/hostcuda/gemm.h behind it):

    C[b] = alpha * op(A[b]) @ op(B[b]) + beta * C[b]        for b in [0, batch)

Row-major: op(A) is M x K, op(B) is K x N, C is M x N; with trans_a, A is stored K x M (and
B stored N x K with trans_b). Consecutive batch matrices are stride_* elements apart (0
broadcasts one matrix). Built by name: GemmShape::nt(M, N, K) is C = A B^T, and
.batched(batch, stride_a, stride_b, stride_c) makes it strided-batched.
*/
#pragma once

#include <cstdint>

struct GemmShape {
    int M = 0, N = 0, K = 0;
    bool trans_a = false, trans_b = false;
    int batch = 1;
    int64_t stride_a = 0, stride_b = 0, stride_c = 0;

    // C = A B, A^T B, A B^T, A^T B^T (op(A) M x K, op(B) K x N), one matrix each
    static GemmShape nn(int M, int N, int K) { return {M, N, K, false, false}; }
    static GemmShape tn(int M, int N, int K) { return {M, N, K, true, false}; }
    static GemmShape nt(int M, int N, int K) { return {M, N, K, false, true}; }
    static GemmShape tt(int M, int N, int K) { return {M, N, K, true, true}; }

    // the same product over `count` matrices, each operand's consecutive matrices `stride_*` elements apart
    GemmShape batched(int count, int64_t a, int64_t b, int64_t c) const {
        GemmShape s = *this;
        s.batch = count;
        s.stride_a = a;
        s.stride_b = b;
        s.stride_c = c;
        return s;
    }
};
