/*
Warp-level tensor-core primitives: the only way kernels reach tensor cores, so that every
kernel keeps one source for both executors. Under nvcc each is one PTX instruction (sm_80 or
newer); on the host backend a warp collective that follows the PTX ISA fragment layouts
(llmc/hostcuda/mma.h), so a kernel written against them runs in `make test` on any CPU. They are
warp-wide: every lane of the warp must call them together (.aligned). Operands are bf16
whatever floatX is. The emulation, its checks and the GPU status: doc/host-backend.md
"Tensor-core fragments".
  mma_m16n8k16_bf16(d, a, b, c)   D(16x8) = A(16x16) * B(16x8) + C, bf16 inputs, fp32
                                  accumulate (mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32)
  ldmatrix_x{1,2,4}(r, row)       load 1, 2 or 4 8x8 matrices of 16-bit elements from shared
  ldmatrix_x{1,2,4}_trans(r, row) memory, transposed with _trans (ldmatrix.sync.aligned.m8n8)
  pack_bf16x2(lo, hi)             two floats as one bf16x2 register (for A/B fragments made
                                  from registers, e.g. softmax probabilities)

Fragments are plain arrays: A uint32_t[4] (8 bf16), B uint32_t[2] (4 bf16), C/D float[4].
With lane = 0..31, g = lane >> 2, t = lane & 3 (a register's lower-numbered element in its low
16 bits):
  A element i (register i/2): row g + 8*bit1(i), column 2t + bit0(i) + 8*bit2(i)
  B element i (register i/2): row k = 2t + bit0(i) + 8*bit1(i), column n = g
  C/D element i:              row g + 8*bit1(i), column 2t + bit0(i)
  ldmatrix: lanes 8j..8j+7 give the shared-memory addresses of rows 0..7 of matrix j (16
  bytes each, 16-byte aligned; x1 reads lanes 0-7, x2 lanes 0-15); register j of every lane
  gets matrix j's row g, columns 2t, 2t+1 (with _trans: column g, rows 2t, 2t+1).
So ldmatrix_x4 over a row-major 16x16 bf16 tile (lane l addressing row l % 16, column
8 * (l / 16)) yields the A fragment; ldmatrix_x2 over an [n][k] tile (B stored transposed,
like a weight W[out][in]) yields B without _trans, over a [k][n] tile with _trans.
*/
#pragma once

#include <cstdint>

#include "llmc/cuda_common.h"

// Two floats rounded to bf16 in one register, `lo` in the low 16 bits (fragment element order).
__host__ __device__ inline uint32_t pack_bf16x2(float lo, float hi) {
    uint32_t lo_bits = __bfloat16_as_ushort(__float2bfloat16_rn(lo));
    uint32_t hi_bits = __bfloat16_as_ushort(__float2bfloat16_rn(hi));
    return lo_bits | (hi_bits << 16);
}

#if HOST_BACKEND

__device__ __forceinline__ void mma_m16n8k16_bf16(float d[4], const uint32_t a[4], const uint32_t b[2],
                                                  const float c[4]) {
    hostcuda::mma_m16n8k16_bf16(d, a, b, c);
}
__device__ __forceinline__ void ldmatrix_x1(uint32_t r[1], const void* row) { hostcuda::ldmatrix<1, false>(r, row); }
__device__ __forceinline__ void ldmatrix_x2(uint32_t r[2], const void* row) { hostcuda::ldmatrix<2, false>(r, row); }
__device__ __forceinline__ void ldmatrix_x4(uint32_t r[4], const void* row) { hostcuda::ldmatrix<4, false>(r, row); }
__device__ __forceinline__ void ldmatrix_x1_trans(uint32_t r[1], const void* row) { hostcuda::ldmatrix<1, true>(r, row); }
__device__ __forceinline__ void ldmatrix_x2_trans(uint32_t r[2], const void* row) { hostcuda::ldmatrix<2, true>(r, row); }
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t r[4], const void* row) { hostcuda::ldmatrix<4, true>(r, row); }

#else  // nvcc

// bf16 mma.sync and ldmatrix need sm_80 (ldmatrix alone sm_75); on older targets a kernel that
// reaches them stops with a message instead of failing the whole build.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#define MMA_REQUIRE_SM80()                                                              \
    do {                                                                                \
        printf("llmc/kernels/mma.cuh: tensor-core primitives need sm_80 or newer (built for sm_%d)\n", \
               __CUDA_ARCH__ / 10);                                                     \
        __trap();                                                                       \
    } while (0)
#else
#define MMA_REQUIRE_SM80() \
    do {                   \
    } while (0)
#endif

__device__ __forceinline__ void mma_m16n8k16_bf16(float d[4], const uint32_t a[4], const uint32_t b[2],
                                                  const float c[4]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%10, %11, %12, %13};\n"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]), "f"(c[2]),
          "f"(c[3]));
#else
    MMA_REQUIRE_SM80();
#endif
}

// ldmatrix takes a .shared address: the generic pointer converted to the shared window.
__device__ __forceinline__ uint32_t shared_address(const void* p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void ldmatrix_x1(uint32_t r[1], const void* row) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("ldmatrix.sync.aligned.m8n8.x1.shared.b16 {%0}, [%1];\n" : "=r"(r[0]) : "r"(shared_address(row)));
#else
    MMA_REQUIRE_SM80();
#endif
}
__device__ __forceinline__ void ldmatrix_x2(uint32_t r[2], const void* row) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n"
                 : "=r"(r[0]), "=r"(r[1])
                 : "r"(shared_address(row)));
#else
    MMA_REQUIRE_SM80();
#endif
}
__device__ __forceinline__ void ldmatrix_x4(uint32_t r[4], const void* row) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(shared_address(row)));
#else
    MMA_REQUIRE_SM80();
#endif
}
__device__ __forceinline__ void ldmatrix_x1_trans(uint32_t r[1], const void* row) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("ldmatrix.sync.aligned.m8n8.x1.trans.shared.b16 {%0}, [%1];\n"
                 : "=r"(r[0])
                 : "r"(shared_address(row)));
#else
    MMA_REQUIRE_SM80();
#endif
}
__device__ __forceinline__ void ldmatrix_x2_trans(uint32_t r[2], const void* row) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];\n"
                 : "=r"(r[0]), "=r"(r[1])
                 : "r"(shared_address(row)));
#else
    MMA_REQUIRE_SM80();
#endif
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t r[4], const void* row) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(shared_address(row)));
#else
    MMA_REQUIRE_SM80();
#endif
}

#undef MMA_REQUIRE_SM80
#endif
