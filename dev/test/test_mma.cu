/*
Tests of the tensor-core primitives of llmc/kernels/mma.cuh (mma.sync m16n8k16 bf16 -> fp32, ldmatrix
x1/x2/x4 with and without .trans), run on whichever executor built this file: the host
backend's emulation in every `make test`, the hardware in scripts/gpu_check.sh, where the
same checks prove that the emulated layouts are the GPU's.

- *_layout: operands whose values encode their row and column, checked lane by lane and
  register by register against the fragment tables below, which are written from the PTX ISA
  ("Matrix Fragments for mma.m16n8k16 with floating point type", "ldmatrix") as lists, not
  from the emulation's formulas.
- mma_gemm_*, ldmatrix_copy_*: every primitive against a plain GEMM / copy loop.

Mutation checks (scripts/mutation_check.sh): built with -DHOSTCUDA_MUTATION_MMA_A_LAYOUT the
mma_* cases must fail, with -DHOSTCUDA_MUTATION_LDMATRIX_TRANS the ldmatrix_* cases must.

Cost: a few launches of one block; well under a second on the host backend.
Usage: test_mma [name-filter]
*/
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "llmc/cuda_common.h"
#include "llmc/kernels/mma.cuh"
#include "dev/test/compare.h"
#include "dev/test/testing.h"

// ----------------------------------------------------------------------------------------
// The fragment tables, from the PTX ISA figures. lane = 0..31, g = lane / 4, t = lane % 4.

// A (16x16, row-major "row"): a0,a1 at (g, 2t), (g, 2t+1); a2,a3 at (g+8, 2t), (g+8, 2t+1);
// a4,a5 at (g, 2t+8), (g, 2t+9); a6,a7 at (g+8, 2t+8), (g+8, 2t+9).
static const int kARowPlusG[8] = {0, 0, 8, 8, 0, 0, 8, 8};
static const int kAColPlus2T[8] = {0, 1, 0, 1, 8, 9, 8, 9};
// B (16x8, "col"): b0,b1 at (k = 2t, 2t+1; n = g); b2,b3 at (k = 2t+8, 2t+9; n = g).
static const int kBRowPlus2T[4] = {0, 1, 8, 9};
// C and D (16x8 fp32): c0,c1 at (g, 2t), (g, 2t+1); c2,c3 at (g+8, 2t), (g+8, 2t+1).
static const int kCRowPlusG[4] = {0, 0, 8, 8};
static const int kCColPlus2T[4] = {0, 1, 0, 1};

struct Position {
    int row, col;
};
static Position table_a(int lane, int i) { return {lane / 4 + kARowPlusG[i], 2 * (lane % 4) + kAColPlus2T[i]}; }
static Position table_b(int lane, int i) { return {2 * (lane % 4) + kBRowPlus2T[i], lane / 4}; }
static Position table_c(int lane, int i) { return {lane / 4 + kCRowPlusG[i], 2 * (lane % 4) + kCColPlus2T[i]}; }
// ldmatrix: each lane receives, of every matrix j, the 32-bit word `lane % 4` of row `lane / 4`
// (elements 2t and 2t+1); with .trans the same word of the transposed matrix, i.e. the
// elements (2t, g) and (2t+1, g) of the stored one. Element `half` of register j:
static Position table_ldmatrix(int lane, int half, bool trans) {
    int g = lane / 4, t = lane % 4;
    return trans ? Position{2 * t + half, g} : Position{g, 2 * t + half};
}

static uint16_t bf16_bits(float x) { return __bfloat16_as_ushort(__float2bfloat16_rn(x)); }
static uint32_t pack_bits(uint16_t lo, uint16_t hi) { return static_cast<uint32_t>(lo) | static_cast<uint32_t>(hi) << 16; }

// ----------------------------------------------------------------------------------------
// mma layout: the host packs every lane's A, B, C registers from the tables; the warp runs
// one mma; each lane writes its D registers back as they are.

__global__ void mma_registers_kernel(const uint32_t* a_regs, const uint32_t* b_regs, const float* c_regs,
                                     float* d_regs) {
    int lane = threadIdx.x % 32;
    uint32_t a[4], b[2];
    float c[4], d[4];
    for (int r = 0; r < 4; r++) { a[r] = a_regs[4 * lane + r]; }
    for (int r = 0; r < 2; r++) { b[r] = b_regs[2 * lane + r]; }
    for (int i = 0; i < 4; i++) { c[i] = c_regs[4 * lane + i]; }
    mma_m16n8k16_bf16(d, a, b, c);
    for (int i = 0; i < 4; i++) { d_regs[4 * lane + i] = d[i]; }
}

// Runs the mma on row-major A (16x16), B (16x8), C (16x8) distributed by the tables and checks
// that every lane's D register i holds D = A*B + C at table_c(lane, i). Values must be exact in
// bf16 (A, B) so that the products are exact.
static void check_mma_layout(const char* what, const float* A, const float* B, const float* C) {
    std::vector<uint32_t> a_regs(32 * 4), b_regs(32 * 2);
    std::vector<float> c_regs(32 * 4);
    for (int lane = 0; lane < 32; lane++) {
        uint16_t a[8], b[4];
        for (int i = 0; i < 8; i++) {
            Position p = table_a(lane, i);
            a[i] = bf16_bits(A[p.row * 16 + p.col]);
        }
        for (int i = 0; i < 4; i++) {
            Position p = table_b(lane, i);
            b[i] = bf16_bits(B[p.row * 8 + p.col]);
            Position q = table_c(lane, i);
            c_regs[4 * lane + i] = C[q.row * 8 + q.col];
        }
        for (int r = 0; r < 4; r++) { a_regs[4 * lane + r] = pack_bits(a[2 * r], a[2 * r + 1]); }
        for (int r = 0; r < 2; r++) { b_regs[2 * lane + r] = pack_bits(b[2 * r], b[2 * r + 1]); }
    }
    DeviceArena arena;
    uint32_t* d_a = arena.alloc<uint32_t>(a_regs.size());
    uint32_t* d_b = arena.alloc<uint32_t>(b_regs.size());
    float* d_c = arena.alloc<float>(c_regs.size());
    float* d_d = arena.alloc<float>(32 * 4);
    cudaCheck(cudaMemcpy(d_a, a_regs.data(), a_regs.size() * 4, cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy(d_b, b_regs.data(), b_regs.size() * 4, cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy(d_c, c_regs.data(), c_regs.size() * 4, cudaMemcpyHostToDevice));
    LAUNCH(1, 32, 0, 0, mma_registers_kernel)(d_a, d_b, d_c, d_d);
    cudaCheckLaunch();
    std::vector<float> got = copy_from_device(d_d, 32 * 4);
    int bad = 0;
    for (int lane = 0; lane < 32; lane++) {
        for (int i = 0; i < 4; i++) {
            Position p = table_c(lane, i);
            double expected = C[p.row * 8 + p.col];
            for (int k = 0; k < 16; k++) { expected += static_cast<double>(A[p.row * 16 + k]) * B[k * 8 + p.col]; }
            if (got[4 * lane + i] != expected) {
                if (bad++ < 6) {
                    char msg[200];
                    snprintf(msg, sizeof(msg), "%s: lane %d d%d = %g, expected D[%d][%d] = %g", what, lane, i,
                             got[4 * lane + i], p.row, p.col, expected);
                    testing::report_failure(__FILE__, __LINE__, msg);
                }
            }
        }
    }
    CHECK_EQ(bad, 0);
}

// A[m][k] = 16m + k + 1 (integers <= 256: exact in bf16); B picks column k = n + 8h of A, so
// D[m][n] = A[m][n + 8h] names the A element that reached each D register.
TEST_CASE(mma_layout_a) {
    std::vector<float> A(16 * 16), B(16 * 8), C(16 * 8, 0.0f);
    for (int m = 0; m < 16; m++) for (int k = 0; k < 16; k++) { A[m * 16 + k] = 16 * m + k + 1; }
    for (int h = 0; h < 2; h++) {
        for (int k = 0; k < 16; k++) for (int n = 0; n < 8; n++) { B[k * 8 + n] = k == n + 8 * h ? 1.0f : 0.0f; }
        check_mma_layout(h == 0 ? "A columns 0-7" : "A columns 8-15", A.data(), B.data(), C.data());
    }
}

// A = identity, B[k][n] = 8k + n + 1: D = B register by register.
TEST_CASE(mma_layout_b) {
    std::vector<float> A(16 * 16, 0.0f), B(16 * 8), C(16 * 8, 0.0f);
    for (int m = 0; m < 16; m++) { A[m * 16 + m] = 1.0f; }
    for (int k = 0; k < 16; k++) for (int n = 0; n < 8; n++) { B[k * 8 + n] = 8 * k + n + 1; }
    check_mma_layout("B", A.data(), B.data(), C.data());
}

// C[m][n] = 1000 (8m + n + 1) on top of D = B: the accumulator goes in and comes out where the
// table says.
TEST_CASE(mma_layout_c) {
    std::vector<float> A(16 * 16, 0.0f), B(16 * 8), C(16 * 8);
    for (int m = 0; m < 16; m++) { A[m * 16 + m] = 1.0f; }
    for (int k = 0; k < 16; k++) for (int n = 0; n < 8; n++) { B[k * 8 + n] = 8 * k + n + 1; }
    for (int m = 0; m < 16; m++) for (int n = 0; n < 8; n++) { C[m * 8 + n] = 1000.0f * (8 * m + n + 1); }
    check_mma_layout("C", A.data(), B.data(), C.data());
}

// ----------------------------------------------------------------------------------------
// ldmatrix layout: a pool of 16-byte rows in shared memory, row p holding
// 0x1000 (j + 1) | 16 r | c at column c when it stores row r of matrix j. Lanes address the rows
// in a scrambled order (the pool is not laid out as matrices), lanes that the variant does not
// read address a poison row, and each lane writes back its registers as they are.

constexpr int kPoolRows = 33;  // 32 rows of matrices + 1 poison
constexpr uint16_t kPoison = 0xffff;

template <int count, bool trans>
__global__ void ldmatrix_registers_kernel(const uint16_t* pool, const int* lane_row, uint32_t* regs) {
    __align__(16) __shared__ uint16_t shared_pool[kPoolRows * 8];
    int lane = threadIdx.x % 32;
    for (int i = lane; i < kPoolRows * 8; i += 32) { shared_pool[i] = pool[i]; }
    __syncthreads();
    uint32_t r[4] = {0, 0, 0, 0};
    const void* row = shared_pool + 8 * lane_row[lane];
    if constexpr (count == 1) { trans ? ldmatrix_x1_trans(r, row) : ldmatrix_x1(r, row); }
    if constexpr (count == 2) { trans ? ldmatrix_x2_trans(r, row) : ldmatrix_x2(r, row); }
    if constexpr (count == 4) { trans ? ldmatrix_x4_trans(r, row) : ldmatrix_x4(r, row); }
    for (int j = 0; j < count; j++) { regs[count * lane + j] = r[j]; }
}

static uint16_t ldmatrix_code(int j, int r, int c) { return static_cast<uint16_t>(0x1000 * (j + 1) | 16 * r | c); }

template <int count, bool trans>
static void check_ldmatrix_layout() {
    // matrix j's row r goes to pool row (5 (8j + r) + 3) % 32 and is addressed by lane 8j + r
    std::vector<uint16_t> pool(kPoolRows * 8, kPoison);
    std::vector<int> lane_row(32, kPoolRows - 1);
    for (int lane = 0; lane < 8 * count; lane++) {
        int j = lane / 8, r = lane % 8;
        int p = (5 * lane + 3) % 32;
        lane_row[lane] = p;
        for (int c = 0; c < 8; c++) { pool[8 * p + c] = ldmatrix_code(j, r, c); }
    }
    DeviceArena arena;
    uint16_t* d_pool = arena.alloc<uint16_t>(pool.size());
    int* d_lane_row = arena.alloc<int>(32);
    uint32_t* d_regs = arena.alloc<uint32_t>(32 * count);
    cudaCheck(cudaMemcpy(d_pool, pool.data(), pool.size() * 2, cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy(d_lane_row, lane_row.data(), 32 * sizeof(int), cudaMemcpyHostToDevice));
    LAUNCH(1, 32, 0, 0, ldmatrix_registers_kernel<count, trans>)(d_pool, d_lane_row, d_regs);
    cudaCheckLaunch();
    std::vector<uint32_t> got = copy_from_device(d_regs, 32 * count);
    int bad = 0;
    for (int lane = 0; lane < 32; lane++) {
        for (int j = 0; j < count; j++) {
            Position lo = table_ldmatrix(lane, 0, trans), hi = table_ldmatrix(lane, 1, trans);
            uint32_t expected = pack_bits(ldmatrix_code(j, lo.row, lo.col), ldmatrix_code(j, hi.row, hi.col));
            if (got[count * lane + j] != expected) {
                if (bad++ < 6) {
                    char msg[200];
                    snprintf(msg, sizeof(msg), "ldmatrix.x%d%s: lane %d register %d = 0x%08x, expected 0x%08x", count,
                             trans ? ".trans" : "", lane, j, got[count * lane + j], expected);
                    testing::report_failure(__FILE__, __LINE__, msg);
                }
            }
        }
    }
    CHECK_EQ(bad, 0);
}

TEST_CASE(ldmatrix_layout_x1) { check_ldmatrix_layout<1, false>(); }
TEST_CASE(ldmatrix_layout_x2) { check_ldmatrix_layout<2, false>(); }
TEST_CASE(ldmatrix_layout_x4) { check_ldmatrix_layout<4, false>(); }
TEST_CASE(ldmatrix_trans_layout_x1) { check_ldmatrix_layout<1, true>(); }
TEST_CASE(ldmatrix_trans_layout_x2) { check_ldmatrix_layout<2, true>(); }
TEST_CASE(ldmatrix_trans_layout_x4) { check_ldmatrix_layout<4, true>(); }

// ----------------------------------------------------------------------------------------
// ldmatrix against a plain copy: a 16x16 tile of random 16-bit values in shared memory with a
// padded row stride (24 elements, as a kernel pads against bank conflicts); lane l addresses
// row l % 16, columns 8 (l / 16) onward (matrices: rows 0-7 | 8-15 of columns 0-7, then of
// columns 8-15). Every lane scatters its registers to where the table says they came from;
// the result must be the tile (or its transpose, per 8x8 matrix, with .trans).

constexpr int kTileStride = 24;

template <int count, bool trans>
__global__ void ldmatrix_scatter_kernel(const uint16_t* tile, uint16_t* out) {
    __align__(16) __shared__ uint16_t shared_tile[16 * kTileStride];
    int lane = threadIdx.x % 32;
    for (int i = lane; i < 16 * 16; i += 32) { shared_tile[(i / 16) * kTileStride + i % 16] = tile[i]; }
    __syncthreads();
    uint32_t r[4] = {0, 0, 0, 0};
    const void* row = shared_tile + (lane % 16) * kTileStride + 8 * (lane / 16);
    if constexpr (count == 1) { trans ? ldmatrix_x1_trans(r, row) : ldmatrix_x1(r, row); }
    if constexpr (count == 2) { trans ? ldmatrix_x2_trans(r, row) : ldmatrix_x2(r, row); }
    if constexpr (count == 4) { trans ? ldmatrix_x4_trans(r, row) : ldmatrix_x4(r, row); }
    int g = lane / 4, t = lane % 4;
    for (int j = 0; j < count; j++) {
        int row0 = 8 * (j % 2), col0 = 8 * (j / 2);  // where matrix j lies in the tile
        for (int half = 0; half < 2; half++) {
            int mr = trans ? 2 * t + half : g, mc = trans ? g : 2 * t + half;  // in the stored matrix
            out[(row0 + mr) * 16 + col0 + mc] = static_cast<uint16_t>(r[j] >> (16 * half));
        }
    }
}

template <int count, bool trans>
static void check_ldmatrix_copy() {
    std::mt19937 rng(17 + count + 8 * trans);
    std::vector<uint16_t> tile(256);
    for (auto& x : tile) { x = static_cast<uint16_t>(rng()); }
    DeviceArena arena;
    uint16_t* d_tile = arena.alloc<uint16_t>(256);
    uint16_t* d_out = arena.alloc<uint16_t>(256);
    cudaCheck(cudaMemcpy(d_tile, tile.data(), 512, cudaMemcpyHostToDevice));
    cudaCheck(cudaMemset(d_out, 0, 512));
    LAUNCH(1, 32, 0, 0, ldmatrix_scatter_kernel<count, trans>)(d_tile, d_out);
    cudaCheckLaunch();
    std::vector<uint16_t> got = copy_from_device(d_out, 256);
    // the plain copy: the matrices the variant loads, each in place, other elements 0
    std::vector<uint16_t> expected(256, 0);
    for (int j = 0; j < count; j++) {
        int row0 = 8 * (j % 2), col0 = 8 * (j / 2);
        for (int r = 0; r < 8; r++) for (int c = 0; c < 8; c++) {
            expected[(row0 + r) * 16 + col0 + c] = tile[(row0 + r) * 16 + col0 + c];
        }
    }
    int bad = 0;
    for (int i = 0; i < 256; i++) { bad += got[i] != expected[i]; }
    CHECK_EQ(bad, 0);
}

TEST_CASE(ldmatrix_copy_x1) { check_ldmatrix_copy<1, false>(); }
TEST_CASE(ldmatrix_copy_x2) { check_ldmatrix_copy<2, false>(); }
TEST_CASE(ldmatrix_copy_x4) { check_ldmatrix_copy<4, false>(); }
TEST_CASE(ldmatrix_trans_copy_x1) { check_ldmatrix_copy<1, true>(); }
TEST_CASE(ldmatrix_trans_copy_x2) { check_ldmatrix_copy<2, true>(); }
TEST_CASE(ldmatrix_trans_copy_x4) { check_ldmatrix_copy<4, true>(); }

// ----------------------------------------------------------------------------------------
// GEMM on tensor cores against a plain loop: C (32x32, fp32) = A (32xK) * B (Kx32), bf16,
// K = 64, one block of 4 warps, each owning a 16x16 piece of C as two 16x8 mma tiles. A is
// loaded with ldmatrix_x4; B either stored as [n][k] (like a weight W[out][in]) and loaded with
// ldmatrix_x4, or stored as [k][n] (like V in attention) and loaded with ldmatrix_x4_trans.
// The accumulator is passed as both C and D, as kernels do.

constexpr int kGemmM = 32, kGemmN = 32, kGemmK = 64;
constexpr int kGemmStride = kGemmK + 8;  // padded shared rows (bf16 elements), 16-byte multiple

template <bool b_is_k_by_n>
__global__ void mma_gemm_kernel(const __nv_bfloat16* A, const __nv_bfloat16* B, float* C) {
    __align__(16) __shared__ __nv_bfloat16 a_s[kGemmM * kGemmStride];
    __align__(16) __shared__ __nv_bfloat16 b_s[kGemmK * (kGemmN + 8)];  // [k][n] or [n][k], padded
    int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    for (int i = tid; i < kGemmM * kGemmK; i += blockDim.x) { a_s[(i / kGemmK) * kGemmStride + i % kGemmK] = A[i]; }
    if (b_is_k_by_n) {
        for (int i = tid; i < kGemmK * kGemmN; i += blockDim.x) { b_s[(i / kGemmN) * (kGemmN + 8) + i % kGemmN] = B[i]; }
    } else {
        for (int i = tid; i < kGemmN * kGemmK; i += blockDim.x) { b_s[(i / kGemmK) * kGemmStride + i % kGemmK] = B[i]; }
    }
    __syncthreads();
    int m0 = 16 * (warp % 2), n0 = 16 * (warp / 2);
    float acc[2][4] = {};
    for (int k0 = 0; k0 < kGemmK; k0 += 16) {
        uint32_t a[4], b[4];
        ldmatrix_x4(a, &a_s[(m0 + lane % 16) * kGemmStride + k0 + 8 * (lane / 16)]);
        if (b_is_k_by_n) {
            // matrices (k0-7 | k8-15) x (n0..n0+7), then x (n0+8..n0+15): registers b0,b1 feed the
            // first n8 tile, b2,b3 the second
            ldmatrix_x4_trans(b, &b_s[(k0 + lane % 16) * (kGemmN + 8) + n0 + 8 * (lane / 16)]);
        } else {
            // rows n: lanes 0-7 n0..n0+7 at k0, 8-15 the same rows at k0+8, 16-31 rows n0+8..15
            int n = n0 + lane % 8 + 8 * (lane / 16), k = k0 + 8 * ((lane / 8) % 2);
            ldmatrix_x4(b, &b_s[n * kGemmStride + k]);
        }
        mma_m16n8k16_bf16(acc[0], a, &b[0], acc[0]);
        mma_m16n8k16_bf16(acc[1], a, &b[2], acc[1]);
    }
    int g = lane / 4, t = lane % 4;
    for (int nt = 0; nt < 2; nt++) {
        for (int i = 0; i < 4; i++) {
            int row = m0 + g + 8 * (i / 2), col = n0 + 8 * nt + 2 * t + i % 2;
            C[row * kGemmN + col] = acc[nt][i];
        }
    }
}

template <bool b_is_k_by_n>
static void check_mma_gemm() {
    std::mt19937 rng(2024 + b_is_k_by_n);
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    std::vector<__nv_bfloat16> A(kGemmM * kGemmK), B(kGemmK * kGemmN);
    for (auto& x : A) { x = __float2bfloat16_rn(dist(rng)); }
    for (auto& x : B) { x = __float2bfloat16_rn(dist(rng)); }
    auto b_at = [&](int k, int n) { return __bfloat162float(b_is_k_by_n ? B[k * kGemmN + n] : B[n * kGemmK + k]); };
    std::vector<float> ref(kGemmM * kGemmN);
    for (int m = 0; m < kGemmM; m++) for (int n = 0; n < kGemmN; n++) {
        double sum = 0.0;
        for (int k = 0; k < kGemmK; k++) { sum += static_cast<double>(__bfloat162float(A[m * kGemmK + k])) * b_at(k, n); }
        ref[m * kGemmN + n] = static_cast<float>(sum);
    }
    DeviceArena arena;
    __nv_bfloat16* d_a = arena.alloc<__nv_bfloat16>(A.size());
    __nv_bfloat16* d_b = arena.alloc<__nv_bfloat16>(B.size());
    float* d_c = arena.alloc<float>(kGemmM * kGemmN);
    cudaCheck(cudaMemcpy(d_a, A.data(), A.size() * 2, cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy(d_b, B.data(), B.size() * 2, cudaMemcpyHostToDevice));
    LAUNCH(1, 128, 0, 0, mma_gemm_kernel<b_is_k_by_n>)(d_a, d_b, d_c);
    cudaCheckLaunch();
    std::vector<float> got = copy_from_device(d_c, kGemmM * kGemmN);
    // The products are exact in fp32; what differs is the fp32 summation of 64 terms of size
    // <= 1 (the host adds in k order; the tensor core's order and rounding are unspecified).
    // Measured on the host backend: max |err| 9.5e-7 (|C| up to ~5); the bound leaves 20x.
    CHECK_CLOSE(b_is_k_by_n ? "C = A B, B [k][n]" : "C = A B, B [n][k]", got.data(), ref.data(), got.size(), 2e-5,
                1e-5);
}

TEST_CASE(mma_gemm_b_n_by_k) { check_mma_gemm<false>(); }
TEST_CASE(mma_gemm_b_k_by_n) { check_mma_gemm<true>(); }

// pack_bf16x2 puts the lower-numbered element in the low half, as the fragments need.
TEST_CASE(mma_pack_bf16x2) {
    uint32_t packed = pack_bf16x2(1.0f, -2.0f);
    CHECK_EQ(packed & 0xffffu, static_cast<uint32_t>(bf16_bits(1.0f)));
    CHECK_EQ(packed >> 16, static_cast<uint32_t>(bf16_bits(-2.0f)));
}

TEST_MAIN()
