/*
Host backend: the tensor-core instructions of llmc/kernels/mma.cuh (mma.sync m16n8k16 bf16 ->
fp32; ldmatrix x1/x2/x4, with and without .trans) emulated as warp collectives: each lane posts
a pointer to its registers and parks, the last lane to arrive gathers the fragments into whole
matrices by the PTX ISA layouts, computes and scatters each lane's part back (scheduler.h,
CollectiveKind::Exchange). The layouts, the arithmetic and the mutations that test_mma must
catch: doc/host-backend.md "Tensor-core fragments"; dev/test/test_mma.cu is the judge.
*/
#pragma once

#include <cstdint>
#include <cstring>

#include "bf16.h"
#include "emulated_device.h"
#include "scheduler.h"

namespace hostcuda {

// Where element i of a lane's fragment sits (PTX ISA, mma.m16n8k16; g = lane >> 2, t = lane & 3;
// a register holds two 16-bit elements, the lower-numbered one in its low half):
//   A (a0..a7 in 4 registers): row g + 8 * bit1(i), column 2t + bit0(i) + 8 * bit2(i)
//   B (b0..b3 in 2 registers): row (k) 2t + bit0(i) + 8 * bit1(i), column (n) g
//   C, D (c0..c3, floats):     row g + 8 * bit1(i), column 2t + bit0(i)
// The mutation HOSTCUDA_MUTATION_MMA_A_LAYOUT swaps the roles of A's registers 1 and 2 (a2, a3
// read as columns +8 of row g instead of row g + 8); test_mma's mma_* cases must fail.
inline int mma_a_row(int lane, int i) {
#if defined(HOSTCUDA_MUTATION_MMA_A_LAYOUT)
    return (lane >> 2) + 8 * ((i >> 2) & 1);
#else
    return (lane >> 2) + 8 * ((i >> 1) & 1);
#endif
}
inline int mma_a_col(int lane, int i) {
#if defined(HOSTCUDA_MUTATION_MMA_A_LAYOUT)
    return 2 * (lane & 3) + (i & 1) + 8 * ((i >> 1) & 1);
#else
    return 2 * (lane & 3) + (i & 1) + 8 * ((i >> 2) & 1);
#endif
}
inline int mma_b_row(int lane, int i) { return 2 * (lane & 3) + (i & 1) + 8 * ((i >> 1) & 1); }
inline int mma_b_col(int lane, int) { return lane >> 2; }
inline int mma_c_row(int lane, int i) { return (lane >> 2) + 8 * ((i >> 1) & 1); }
inline int mma_c_col(int lane, int i) { return 2 * (lane & 3) + (i & 1); }

// The 16-bit element `half` (0: low, 1: high) of a register, and back.
inline uint16_t reg_half(uint32_t reg, int half) { return static_cast<uint16_t>(reg >> (16 * half)); }
inline float bf16_bits_to_float(uint16_t bits) { return static_cast<float>(__nv_bfloat16::from_bits(bits)); }

// Both instructions are .aligned: the whole warp must execute them, so a block whose last warp
// is partial cannot use them (undefined on the hardware; an error here).
inline void require_full_warp(const char* name) {
    Worker& w = current_worker(name);
    if (active_lanes() != 0xffffffffu) {
        die("kernel '%s': %s in warp %d, which has fewer than 32 threads: the instruction is "
            "warp-wide (.aligned) and needs every lane",
            w.kernel_name, name, tls.fiber->linear_tid / kWarpSize);
    }
}

struct MmaLane {
    const uint32_t* a;  // 4 registers
    const uint32_t* b;  // 2 registers
    const float* c;     // 4
    float* d;           // 4; may alias c
};

inline void mma_m16n8k16_exchange(const uint64_t* lane_values, uint32_t) {
    CostRecorder::count_tensor_flops(2 * 16 * 8 * 16);  // (HOSTCUDA_COST: cost.h)
    float a[16][16], b[16][8], c[16][8];
    for (int lane = 0; lane < kWarpSize; lane++) {
        const MmaLane& in = *reinterpret_cast<const MmaLane*>(lane_values[lane]);
        for (int i = 0; i < 8; i++) {
            a[mma_a_row(lane, i)][mma_a_col(lane, i)] = bf16_bits_to_float(reg_half(in.a[i >> 1], i & 1));
        }
        for (int i = 0; i < 4; i++) {
            b[mma_b_row(lane, i)][mma_b_col(lane, i)] = bf16_bits_to_float(reg_half(in.b[i >> 1], i & 1));
            c[mma_c_row(lane, i)][mma_c_col(lane, i)] = in.c[i];
        }
    }
    // bf16 x bf16 products are exact in fp32; each D element is C plus the 16 products added in
    // k order (the GPU's order and rounding are unspecified: it may differ in the last bits).
    // k outermost, so that the compiler vectorises over the 128 outputs.
    for (int k = 0; k < 16; k++) {
        for (int row = 0; row < 16; row++) {
            for (int col = 0; col < 8; col++) { c[row][col] += a[row][k] * b[k][col]; }
        }
    }
    // every operand is read before any D is written: D may be the C registers
    for (int lane = 0; lane < kWarpSize; lane++) {
        const MmaLane& out = *reinterpret_cast<const MmaLane*>(lane_values[lane]);
        for (int i = 0; i < 4; i++) { out.d[i] = c[mma_c_row(lane, i)][mma_c_col(lane, i)]; }
    }
}

inline void mma_m16n8k16_bf16(float d[4], const uint32_t a[4], const uint32_t b[2], const float c[4]) {
    require_full_warp("mma.sync.m16n8k16");
    require_sm80(tls.worker->kernel_name, "bf16 mma.sync.m16n8k16");
    MmaLane mine{a, b, c, d};
    warp_collective(CollectiveKind::Exchange, 0xffffffffu, reinterpret_cast<uint64_t>(&mine), 0,
                    "mma.sync.m16n8k16", mma_m16n8k16_exchange);
}

struct LdmatrixLane {
    const void* row;  // the row this lane addresses (lanes 8j..8j+7: rows of matrix j)
    uint32_t* out;    // `count` registers
};

// Lanes 8j..8j+7 give the addresses of rows 0..7 of matrix j; register j of a lane gets matrix
// j's row g, columns 2t and 2t+1 (.trans: its column g, rows 2t and 2t+1). The mutation
// HOSTCUDA_MUTATION_LDMATRIX_TRANS hands out the untransposed fragment (test_mma's ldmatrix_*).
template <int count, bool trans>
void ldmatrix_exchange(const uint64_t* lane_values, uint32_t) {
    uint16_t m[count][8][8];
    for (int j = 0; j < count; j++) {
        for (int r = 0; r < 8; r++) {
            const void* row = reinterpret_cast<const LdmatrixLane*>(lane_values[8 * j + r])->row;
            if (reinterpret_cast<uintptr_t>(row) % 16 != 0) {
                die("kernel '%s': ldmatrix: lane %d gives row address %p, which is not 16-byte aligned",
                    tls.worker->kernel_name, 8 * j + r, row);
            }
            memcpy(m[j][r], row, 16);
        }
    }
    for (int lane = 0; lane < kWarpSize; lane++) {
        uint32_t* out = reinterpret_cast<const LdmatrixLane*>(lane_values[lane])->out;
        int g = lane >> 2, t = lane & 3;
        for (int j = 0; j < count; j++) {
            bool transposed = trans;
#if defined(HOSTCUDA_MUTATION_LDMATRIX_TRANS)
            transposed = false;
#endif
            uint16_t lo = transposed ? m[j][2 * t][g] : m[j][g][2 * t];
            uint16_t hi = transposed ? m[j][2 * t + 1][g] : m[j][g][2 * t + 1];
            out[j] = static_cast<uint32_t>(lo) | static_cast<uint32_t>(hi) << 16;
        }
    }
}

template <int count, bool trans>
void ldmatrix(uint32_t* out, const void* row_address) {
    static_assert(count == 1 || count == 2 || count == 4, "ldmatrix loads 1, 2 or 4 matrices");
    const char* name = trans ? "ldmatrix.trans" : "ldmatrix";
    require_full_warp(name);
    LdmatrixLane mine{row_address, out};
    warp_collective(CollectiveKind::Exchange, 0xffffffffu, reinterpret_cast<uint64_t>(&mine), 0, name,
                    ldmatrix_exchange<count, trans>);
}

}  // namespace hostcuda
