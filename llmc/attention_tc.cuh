/*
Causal GQA attention with an optional same-document mask on tensor cores: FlashAttention-2
(Dao, 2023) forward and backward, bf16 operands, fp32 accumulation, through the warp-level
primitives of llmc/mma.cuh (mma.sync m16n8k16, ldmatrix) and llmc/async_copy.cuh (cp.async).
Same maths, shapes and contract as llmc/attention.cuh, which dispatches here in bf16 builds:

    q, out, dout, dq: (B, T, Hq, hd)   k, v, dk, dv: (B, T, Hkv, hd)   bf16, row-major
    lse, D: (B, Hq, T) float            doc_ids: (B, T) int or nullptr
    head dims: multiples of 16 up to 128 (HD = hd rounded up to 16/32/64/128; the padding
    columns are zero in shared memory, so they add nothing); 16-byte aligned pointers.

Every kernel: 4 warps (128 threads) per block, 64 rows of the operand the block owns, warp w
owns rows 16w .. 16w+15 (one m16 tile); the other operand streams through shared memory in
tiles of 64 rows of [64][HD + 8] bf16 (the 8-element pad shifts consecutive rows by 4 banks,
so the 8 row reads of an ldmatrix hit distinct banks), loaded with cp.async (zero-filled past
T) into two buffers, so that the next tile's copy overlaps the current tile's mma. Fragment facts used throughout (llmc/mma.cuh): a row of a 16x8 accumulator lives in the 4
lanes of a lane group; the accumulators of two adjacent n8 tiles, rounded to bf16, are exactly
the A fragment of one k16 step, so probabilities never leave the registers; a tile stored
[n][k] ([key][d]) is a B operand through ldmatrix, one stored [k][n] through ldmatrix.trans.

- attention_forward_tc_kernel: grid (ceil(T/64), Hq, B), the latest query rows first. Per K/V
  tile: S = Q K^T, scale by log2(e)/sqrt(hd), mask, online softmax (exp2) in the fragments,
  O += P V; lse written in natural log.
- attention_backward_dq_tc_kernel: grid (ceil(T/64), Hq, B). First D[t] = dout[t] . out[t]
  (fp32, written to D), then per K/V tile: S = Q K^T, P = exp2(S scale - lse), dP = dO V^T,
  dS = P (dP - D), dQ += dS K; dq = dQ / sqrt(hd).
- attention_backward_dkdv_tc_kernel: grid (ceil(T/64), Hkv, B), a block owns 64 keys of kv
  head j and iterates over the query heads of j's group and, per head, over the query tiles
  from its first key on: S^T = K Q^T, P^T = exp2(S^T scale - lse), dP^T = V dO^T,
  dS^T = P^T (dP^T - D), dV += P^T dO, dK += dS^T Q; dk = dK / sqrt(hd). Runs after the dq
  kernel (it reads D).
No atomics: every output element is written once by one lane, in a fixed order, so results
are bit-reproducible. Tiles wholly in the future are never visited; tiles that no row of the
block can see (other documents) are skipped after a __syncthreads_or; edge tiles are masked.
A and B fragments are read from shared memory with ldmatrix where they are used (not kept in
registers), which keeps the backward kernels' registers for their accumulators.

Rounding (beyond fp32 accumulation): P (forward and backward) and dS are rounded to bf16 for
their products, as in FlashAttention-2, so an element may move by 2^-8 of the sum of the
absolute values of its terms (dev/test/test_attention.cu checks exactly that bound; measured
up to 0.84 of it); doc/san-model.md, "Attention kernels", has the measured figures.

Cost: per 64 x 64 tile and warp, 2 x 8 x HD/16 mma per product (16 x 64 x HD); the forward
does 2 products (S, PV), the backward 7 (dq kernel: S, dP, dQ; dk/dv kernel: S, dP, dV, dK):
3.5x the forward's mma work where 2.5x is the minimum, the price of a separate dq pass without
atomics (S and dP are computed in both kernels).
Shared memory (every kernel double-buffers the tiles it streams: the next visible tile's
cp.async runs during the current one's mma): forward (64 + 4 x 64) (HD + 8) bf16 (45 KiB at
HD 64, 85 KiB at 128); dq kernel 6 x 64 (HD + 8) bf16 + 768 B (54 KiB at HD 64, 103 KiB at
128); dk/dv kernel 6 x 64 (HD + 8) bf16 + 1.5 KiB (55 KiB, 103 KiB). Above 48 KiB the launcher
raises the limit. ptxas (sm_90, CUDA 13.0), registers per thread, no spills anywhere:
    HD            16    32    64   128
    forward       77    83   103   133
    dq kernel    122   130   166   169
    dk/dv kernel 128   152   176   254
On the host backend every mma/ldmatrix is a warp collective (~10x the scalar kernels' time for
the same work; doc/host-backend.md). NOT YET RUN ON A GPU: validated on the host backend only.
*/
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "async_copy.cuh"
#include "cuda_common.h"
#include "head_dim.h"
#include "mma.cuh"

constexpr int kFlashRows = 64;                // rows of the operand a block owns
constexpr int kFlashTile = 64;                // rows of the streamed operand per shared tile
constexpr int kFlashWarps = kFlashRows / 16;  // one m16 tile per warp
constexpr int kFlashThreads = 32 * kFlashWarps;
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;  // 1 / kLog2e: back from base 2 to natural logs

typedef __nv_bfloat16 flash_bf16;

// Starts the copy of rows [start, start + kFlashTile) of head `head` of a (B, T, H, hd) bf16
// tensor into a shared [kFlashTile][HD + 8] tile, 16 bytes per cp.async (hd % 8 == 0); rows
// past T and columns past hd are zero-filled with plain stores. The caller waits
// (cp_async_wait_all) and then synchronises the block before reading.
template <int HD>
__device__ __forceinline__ void flash_load_tile(flash_bf16* tile, const flash_bf16* src, int b, int start, int head,
                                                int T, int H, int hd) {
    constexpr int kChunks = HD / 8;
    for (int i = threadIdx.x; i < kFlashTile * kChunks; i += blockDim.x) {
        int r = i / kChunks, c = 8 * (i % kChunks);
        int row = start + r;
        flash_bf16* dst = tile + r * (HD + 8) + c;
        if (row < T && c < hd) {
            cp_async_16(dst, src + (((size_t)b * T + row) * H + head) * hd + c);
        } else {
            *reinterpret_cast<int4*>(dst) = make_int4(0, 0, 0, 0);
        }
    }
}

// The document mask's tile tests, shared with llmc/attention.cuh's kernels (which use their own
// tile size): doc_row holds the row's document ids, T of them.
// Whether the query at `pos` (document `doc`) sees any key of [start, start + tile).
__device__ __forceinline__ bool query_sees_key_tile(const int* doc_row, int start, int tile, int pos, int T, int doc) {
    int end = min(min(start + tile, T), pos + 1);
    for (int tau = start; tau < end; tau++) {
        if (doc_row[tau] == doc) { return true; }
    }
    return false;
}
// Whether the key at `pos` (document `doc`) is seen by any query of [start, start + tile).
__device__ __forceinline__ bool key_seen_by_query_tile(const int* doc_row, int start, int tile, int pos, int T, int doc) {
    int end = min(start + tile, T);
    for (int t = max(start, pos); t < end; t++) {
        if (doc_row[t] == doc) { return true; }
    }
    return false;
}

// The query-side kernels' K/V tiles (tile i: keys from i * kFlashTile), double-buffered.
// flash_next_key_tile: the first tile >= i that some query row of the block (rows block_row0 ..
// block_row0 + kFlashRows - 1) can see, `total` if none. Every thread calls it; each candidate
// costs a block barrier, which also says that the buffer computed on before the call is free.
__device__ inline int flash_next_key_tile(int i, int total, const int* doc_row, int block_row0, int T) {
    for (; i < total; i++) {
        if (doc_row == nullptr) {
            __syncthreads();
            return i;
        }
        int row = block_row0 + threadIdx.x;
        bool sees = threadIdx.x < kFlashRows && row < T &&
                    query_sees_key_tile(doc_row, i * kFlashTile, kFlashTile, row, T, doc_row[row]);
        if (__syncthreads_or(sees)) { return i; }
    }
    return total;
}
// Starts the copies of K/V tile i (and its document ids) into one buffer: one cp.async group.
template <int HD>
__device__ inline void flash_issue_key_tile(flash_bf16* k_s, flash_bf16* v_s, int* doc_s, const flash_bf16* k,
                                            const flash_bf16* v, const int* doc_row, int i, int b, int kv_head, int T,
                                            int Hkv, int hd) {
    int start = i * kFlashTile;
    flash_load_tile<HD>(k_s, k, b, start, kv_head, T, Hkv, hd);
    flash_load_tile<HD>(v_s, v, b, start, kv_head, T, Hkv, hd);
    if (threadIdx.x < kFlashTile) {
        int tau = start + threadIdx.x;
        doc_s[threadIdx.x] = (doc_row != nullptr && tau < T) ? doc_row[tau] : 0;
    }
    cp_async_commit_group();
}

// The K/V tiles a block of query rows can see, streamed through two shared buffers (the
// forward and the dq kernel): while the warps compute on one tile, cp.async brings the next
// visible one into the other buffer.
//     FlashKeyTiles<HD> tiles(k_buf, v_buf, doc_buf, k, v, doc_row, b, kv_head, block_row0, T, Hkv, hd);
//     while (tiles.next()) { ... tiles.start, tiles.k_s, tiles.v_s, tiles.doc_s ... }
// Every thread of the block runs next() (it has block barriers); a warp may skip the rest of
// a tile's body with `continue`.
template <int HD>
struct FlashKeyTiles {
    static constexpr int kTile = kFlashTile * (HD + 8);
    flash_bf16 *k_buf, *v_buf;  // [2][kFlashTile][HD + 8] each
    int* doc_buf;               // [2][kFlashTile]
    const flash_bf16 *k, *v;
    const int* doc_row;
    int b, kv_head, block_row0, T, Hkv, hd;
    int cur, total, buf = 0;
    // the tile made current by next(): its first key and its shared copies
    int start = 0;
    const flash_bf16 *k_s = nullptr, *v_s = nullptr;
    const int* doc_s = nullptr;

    __device__ FlashKeyTiles(flash_bf16* k_buf_, flash_bf16* v_buf_, int* doc_buf_, const flash_bf16* k_,
                             const flash_bf16* v_, const int* doc_row_, int b_, int kv_head_, int block_row0_, int T_,
                             int Hkv_, int hd_)
        : k_buf(k_buf_), v_buf(v_buf_), doc_buf(doc_buf_), k(k_), v(v_), doc_row(doc_row_), b(b_), kv_head(kv_head_),
          block_row0(block_row0_), T(T_), Hkv(Hkv_), hd(hd_) {
        int last_row = min(T, block_row0 + kFlashRows) - 1;
        total = last_row / kFlashTile + 1;  // causal: key tiles up to the block's last row
        cur = flash_next_key_tile(0, total, doc_row, block_row0, T);
        if (cur < total) { issue(cur, 0); }
    }
    __device__ void issue(int tile, int into) {
        flash_issue_key_tile<HD>(k_buf + into * kTile, v_buf + into * kTile, doc_buf + into * kFlashTile, k, v, doc_row,
                                 tile, b, kv_head, T, Hkv, hd);
    }
    // Makes the next visible tile current (waiting for its copy, and starting the copy of the
    // one after it); false when no tile is left.
    __device__ bool next() {
        if (cur >= total) { return false; }
        int nxt = flash_next_key_tile(cur + 1, total, doc_row, block_row0, T);  // buffer buf ^ 1 is free
        if (nxt < total) {
            issue(nxt, buf ^ 1);
            cp_async_wait_group<1>();  // everything but the tile just issued has landed
        } else {
            cp_async_wait_all();
        }
        __syncthreads();
        start = cur * kFlashTile;
        k_s = k_buf + buf * kTile;
        v_s = v_buf + buf * kTile;
        doc_s = doc_buf + buf * kFlashTile;
        cur = nxt;
        buf ^= 1;
        return true;
    }
};

// S (16 x 64, eight n8 accumulator tiles) = A B^T over HD: A is the warp's 16 rows of a shared
// [.][HD + 8] tile (a_rows points at its first row), B the 64 rows of another (rows are the n
// index, columns the k index: "col" B operand as it lies).
template <int HD>
__device__ __forceinline__ void flash_scores(float s[8][4], const flash_bf16* a_rows, const flash_bf16* b_tile,
                                             int lane) {
    constexpr int S = HD + 8;
    for (int nt = 0; nt < 8; nt++) {
        for (int i = 0; i < 4; i++) { s[nt][i] = 0.0f; }
    }
    for (int kc = 0; kc < HD / 16; kc++) {
        uint32_t a[4];
        ldmatrix_x4(a, a_rows + (lane % 16) * S + 16 * kc + 8 * (lane / 16));
        for (int p = 0; p < 4; p++) {
            uint32_t bf[4];  // n8 tiles 2p (registers 0, 1) and 2p + 1 (2, 3)
            ldmatrix_x4(bf, b_tile + (16 * p + lane % 8 + 8 * (lane / 16)) * S + 16 * kc + 8 * ((lane / 8) % 2));
            mma_m16n8k16_bf16(s[2 * p], a, &bf[0], s[2 * p]);
            mma_m16n8k16_bf16(s[2 * p + 1], a, &bf[2], s[2 * p + 1]);
        }
    }
}

// acc (16 x HD) += X B where X (16 x 64) is in accumulator layout (eight n8 tiles, rounded to
// bf16 as A fragments) and B the 64 rows of a shared [64][HD + 8] tile (rows are the k index:
// row-major B, read with ldmatrix.trans).
template <int HD>
__device__ __forceinline__ void flash_accumulate(float acc[HD / 8][4], const float x[8][4], const flash_bf16* b_tile,
                                                 int lane) {
    constexpr int S = HD + 8;
    for (int p = 0; p < 4; p++) {
        uint32_t a[4] = {pack_bf16x2(x[2 * p][0], x[2 * p][1]), pack_bf16x2(x[2 * p][2], x[2 * p][3]),
                         pack_bf16x2(x[2 * p + 1][0], x[2 * p + 1][1]), pack_bf16x2(x[2 * p + 1][2], x[2 * p + 1][3])};
        for (int dp = 0; dp < HD / 16; dp++) {
            uint32_t bf[4];
            ldmatrix_x4_trans(bf, b_tile + (16 * p + lane % 16) * S + 16 * dp + 8 * (lane / 16));
            mma_m16n8k16_bf16(acc[2 * dp], a, &bf[0], acc[2 * dp]);
            mma_m16n8k16_bf16(acc[2 * dp + 1], a, &bf[2], acc[2 * dp + 1]);
        }
    }
}

// Stores a lane's part of a warp's 16 x HD accumulator (times `scale`) into rows rows[0]
// (elements 0, 1) and rows[1] (elements 2, 3) of head `head` of a (B, T, H, hd) tensor.
template <int HD>
__device__ __forceinline__ void flash_store_rows(flash_bf16* dst, const float acc[HD / 8][4], const int rows[2],
                                                 const float scale[2], int b, int head, int T, int H, int hd, int t4) {
    for (int r = 0; r < 2; r++) {
        if (rows[r] >= T) { continue; }
        flash_bf16* row = dst + (((size_t)b * T + rows[r]) * H + head) * hd;
        for (int dt = 0; dt < HD / 8; dt++) {
            int col = 8 * dt + 2 * t4;
            if (col < hd) {
                *reinterpret_cast<__nv_bfloat162*>(row + col) =
                    __floats2bfloat162_rn(acc[dt][2 * r] * scale[r], acc[dt][2 * r + 1] * scale[r]);
            }
        }
    }
}

// ----------------------------------------------------------------------------------------
// shared memory: one layout per kernel, byte offsets of its regions laid end to end; the
// launcher takes `bytes` from it and the kernel its regions (flash_shared), so that the two
// agree by construction

// bytes of a shared [rows][HD + 8] bf16 tile
template <int HD>
constexpr size_t flash_tile_bytes(int rows) {
    return (size_t)rows * (HD + 8) * sizeof(flash_bf16);
}

// The region of the block's dynamic shared memory (smem) that starts `offset` bytes in.
template <typename T, size_t offset>
__device__ __forceinline__ T* flash_shared(unsigned char* smem) {
    static_assert(offset % 16 == 0, "every region starts 16-byte aligned (cp.async, ldmatrix rows)");
    return reinterpret_cast<T*>(smem + offset);
}

// forward: the block's queries; the double-buffered K/V tiles and their keys' document ids
template <int HD>
struct FlashForwardSmem {
    static constexpr size_t q = 0;                                           // [kFlashRows][HD + 8] bf16
    static constexpr size_t k = q + flash_tile_bytes<HD>(kFlashRows);        // [2][kFlashTile][HD + 8] bf16
    static constexpr size_t v = k + 2 * flash_tile_bytes<HD>(kFlashTile);    // [2][kFlashTile][HD + 8] bf16
    static constexpr size_t doc = v + 2 * flash_tile_bytes<HD>(kFlashTile);  // [2][kFlashTile] int
    static constexpr size_t bytes = doc + 2 * kFlashTile * sizeof(int);
};

// dq kernel: the block's queries and output gradients, the K/V tiles as in the forward, and
// the block's D (dout . out per row)
template <int HD>
struct FlashDqSmem {
    static constexpr size_t q = 0;                                           // [kFlashRows][HD + 8] bf16
    static constexpr size_t dout = q + flash_tile_bytes<HD>(kFlashRows);     // [kFlashRows][HD + 8] bf16
    static constexpr size_t k = dout + flash_tile_bytes<HD>(kFlashRows);     // [2][kFlashTile][HD + 8] bf16
    static constexpr size_t v = k + 2 * flash_tile_bytes<HD>(kFlashTile);    // [2][kFlashTile][HD + 8] bf16
    static constexpr size_t D = v + 2 * flash_tile_bytes<HD>(kFlashTile);    // [kFlashRows] float
    static constexpr size_t doc = D + kFlashRows * sizeof(float);            // [2][kFlashTile] int
    static constexpr size_t bytes = doc + 2 * kFlashTile * sizeof(int);
};

// dk/dv kernel: the block's keys and values; the double-buffered query tiles (q, dout) with
// their rows' lse (log2 units), D and document ids
template <int HD>
struct FlashDkdvSmem {
    static constexpr size_t k = 0;                                           // [kFlashRows][HD + 8] bf16
    static constexpr size_t v = k + flash_tile_bytes<HD>(kFlashRows);        // [kFlashRows][HD + 8] bf16
    static constexpr size_t q = v + flash_tile_bytes<HD>(kFlashRows);        // [2][kFlashTile][HD + 8] bf16
    static constexpr size_t dout = q + 2 * flash_tile_bytes<HD>(kFlashTile); // [2][kFlashTile][HD + 8] bf16
    static constexpr size_t lse = dout + 2 * flash_tile_bytes<HD>(kFlashTile);  // [2][kFlashTile] float
    static constexpr size_t D = lse + 2 * kFlashTile * sizeof(float);       // [2][kFlashTile] float
    static constexpr size_t doc = D + 2 * kFlashTile * sizeof(float);       // [2][kFlashTile] int
    static constexpr size_t bytes = doc + 2 * kFlashTile * sizeof(int);
};

// ----------------------------------------------------------------------------------------
// forward

template <int HD>
__global__ void __launch_bounds__(kFlashThreads)
    attention_forward_tc_kernel(flash_bf16* out, float* lse, const flash_bf16* q, const flash_bf16* k,
                                const flash_bf16* v, const int* doc_ids, int T, int Hq, int Hkv, int hd) {
    constexpr int S = HD + 8;  // shared row stride (elements)
    unsigned char* smem = dynamic_shared_memory<unsigned char>();
    using Smem = FlashForwardSmem<HD>;
    flash_bf16* q_s = flash_shared<flash_bf16, Smem::q>(smem);
    flash_bf16* k_buf = flash_shared<flash_bf16, Smem::k>(smem);
    flash_bf16* v_buf = flash_shared<flash_bf16, Smem::v>(smem);
    int* doc_buf = flash_shared<int, Smem::doc>(smem);

    int row_block = gridDim.x - 1 - blockIdx.x;  // the longest rows (latest queries) first
    int h = blockIdx.y, b = blockIdx.z;
    int kv_head = h / (Hq / Hkv);
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    int g = lane / 4, t4 = lane % 4;  // fragment coordinates: row group, thread in group
    int block_row0 = row_block * kFlashRows;
    int warp_row0 = block_row0 + 16 * warp;
    int rows[2] = {warp_row0 + g, warp_row0 + g + 8};  // this lane's rows: accumulator elements 0,1 and 2,3
    const int* doc_row = doc_ids != nullptr ? doc_ids + (size_t)b * T : nullptr;
    int my_doc[2];
    for (int r = 0; r < 2; r++) { my_doc[r] = doc_row != nullptr ? doc_row[min(rows[r], T - 1)] : 0; }

    flash_load_tile<HD>(q_s, q, b, block_row0, h, T, Hq, hd);
    cp_async_commit_group();  // lands with (and is published by the barrier of) the first K/V tile

    float o[HD / 8][4];
    for (int dt = 0; dt < HD / 8; dt++) {
        for (int i = 0; i < 4; i++) { o[dt][i] = 0.0f; }
    }
    float row_max[2] = {-INFINITY, -INFINITY};  // in log2 units of the scaled scores
    float row_sum[2] = {0.0f, 0.0f};           // this lane's part of the row's sum (its 2 of 8 columns per n8 tile)
    const float score_scale = kLog2e / sqrtf((float)hd);  // exp2 instead of exp

    FlashKeyTiles<HD> tiles(k_buf, v_buf, doc_buf, k, v, doc_row, b, kv_head, block_row0, T, Hkv, hd);
    while (tiles.next()) {
        const int start = tiles.start;
        const flash_bf16 *k_s = tiles.k_s, *v_s = tiles.v_s;
        const int* doc_s = tiles.doc_s;
        if (start > warp_row0 + 15) { continue; }  // warp-uniform: every key is in this warp's future

        float s[8][4];
        flash_scores<HD>(s, q_s + 16 * warp * S, k_s, lane);

        // scale and mask; accumulator element i is row rows[i / 2], key start + 8 nt + 2 t4 + i % 2
        bool needs_mask = doc_row != nullptr || start + kFlashTile - 1 > warp_row0;
        for (int nt = 0; nt < 8; nt++) {
            for (int i = 0; i < 4; i++) {
                float x = s[nt][i] * score_scale;
                if (needs_mask) {
                    int j = 8 * nt + 2 * t4 + i % 2;
                    bool visible = start + j <= rows[i / 2] && (doc_row == nullptr || doc_s[j] == my_doc[i / 2]);
                    if (!visible) { x = -INFINITY; }
                }
                s[nt][i] = x;
            }
        }

        // online softmax per row: the 4 lanes of a group hold the row's 64 scores
        for (int r = 0; r < 2; r++) {
            float tile_max = -INFINITY;
            for (int nt = 0; nt < 8; nt++) { tile_max = fmaxf(tile_max, fmaxf(s[nt][2 * r], s[nt][2 * r + 1])); }
            tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
            tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 2));
            float new_max = fmaxf(row_max[r], tile_max);
            float reference = new_max == -INFINITY ? 0.0f : new_max;  // no key visible yet: avoid inf - inf
            float correction = exp2f(row_max[r] - reference);
            row_max[r] = new_max;
            row_sum[r] *= correction;
            for (int dt = 0; dt < HD / 8; dt++) {
                o[dt][2 * r] *= correction;
                o[dt][2 * r + 1] *= correction;
            }
            for (int nt = 0; nt < 8; nt++) {
                for (int i = 2 * r; i < 2 * r + 2; i++) {
                    s[nt][i] = exp2f(s[nt][i] - reference);
                    row_sum[r] += s[nt][i];
                }
            }
        }

        flash_accumulate<HD>(o, s, v_s, lane);  // O += P V
    }

    for (int r = 0; r < 2; r++) {
        row_sum[r] += __shfl_xor_sync(0xffffffffu, row_sum[r], 1);
        row_sum[r] += __shfl_xor_sync(0xffffffffu, row_sum[r], 2);
    }
    float inv_sum[2] = {1.0f / row_sum[0], 1.0f / row_sum[1]};  // every row sees itself: > 0
    flash_store_rows<HD>(out, o, rows, inv_sum, b, h, T, Hq, hd, t4);
    for (int r = 0; r < 2; r++) {
        if (rows[r] < T && t4 == 0) {
            lse[((size_t)b * Hq + h) * T + rows[r]] = (row_max[r] + log2f(row_sum[r])) * kLn2;
        }
    }
}

// ----------------------------------------------------------------------------------------
// backward, kernel 1: D = rowsum(dout * out) and dq; 64 query rows of one head per block

template <int HD>
__global__ void __launch_bounds__(kFlashThreads)
    attention_backward_dq_tc_kernel(flash_bf16* dq, float* D, const flash_bf16* dout, const flash_bf16* out,
                                    const flash_bf16* q, const flash_bf16* k, const flash_bf16* v, const float* lse,
                                    const int* doc_ids, int T, int Hq, int Hkv, int hd) {
    constexpr int S = HD + 8;
    unsigned char* smem = dynamic_shared_memory<unsigned char>();
    using Smem = FlashDqSmem<HD>;
    flash_bf16* q_s = flash_shared<flash_bf16, Smem::q>(smem);
    flash_bf16* do_s = flash_shared<flash_bf16, Smem::dout>(smem);
    flash_bf16* k_buf = flash_shared<flash_bf16, Smem::k>(smem);
    flash_bf16* v_buf = flash_shared<flash_bf16, Smem::v>(smem);
    float* D_s = flash_shared<float, Smem::D>(smem);
    int* doc_buf = flash_shared<int, Smem::doc>(smem);

    int row_block = gridDim.x - 1 - blockIdx.x;  // the longest rows first
    int h = blockIdx.y, b = blockIdx.z;
    int kv_head = h / (Hq / Hkv);
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    int g = lane / 4, t4 = lane % 4;
    int block_row0 = row_block * kFlashRows;
    int warp_row0 = block_row0 + 16 * warp;
    int rows[2] = {warp_row0 + g, warp_row0 + g + 8};
    const int* doc_row = doc_ids != nullptr ? doc_ids + (size_t)b * T : nullptr;
    int my_doc[2];
    for (int r = 0; r < 2; r++) { my_doc[r] = doc_row != nullptr ? doc_row[min(rows[r], T - 1)] : 0; }

    flash_load_tile<HD>(q_s, q, b, block_row0, h, T, Hq, hd);
    flash_load_tile<HD>(do_s, dout, b, block_row0, h, T, Hq, hd);
    {  // D: two threads per row, each half of the columns, in fp32 from global memory
        int r = threadIdx.x / 2, half = threadIdx.x % 2, row = block_row0 + r;
        float sum = 0.0f;
        if (row < T) {
            size_t base = (((size_t)b * T + row) * Hq + h) * hd;
            for (int e = half * (hd / 2); e < (half + 1) * (hd / 2); e++) {
                sum += __bfloat162float(dout[base + e]) * __bfloat162float(out[base + e]);
            }
        }
        sum += __shfl_xor_sync(0xffffffffu, sum, 1);
        if (half == 0) {
            D_s[r] = sum;
            if (row < T) { D[((size_t)b * Hq + h) * T + row] = sum; }
        }
    }
    cp_async_wait_all();
    __syncthreads();
    // per lane: its rows' lse (log2 units; +inf past T: P = 0 there) and D
    float row_lse[2], row_D[2];
    for (int r = 0; r < 2; r++) {
        row_lse[r] = rows[r] < T ? lse[((size_t)b * Hq + h) * T + rows[r]] * kLog2e : INFINITY;
        row_D[r] = D_s[rows[r] - block_row0];
    }

    float dq_acc[HD / 8][4];
    for (int dt = 0; dt < HD / 8; dt++) {
        for (int i = 0; i < 4; i++) { dq_acc[dt][i] = 0.0f; }
    }
    const float score_scale = kLog2e / sqrtf((float)hd);

    FlashKeyTiles<HD> tiles(k_buf, v_buf, doc_buf, k, v, doc_row, b, kv_head, block_row0, T, Hkv, hd);
    while (tiles.next()) {
        const int start = tiles.start;
        const flash_bf16 *k_s = tiles.k_s, *v_s = tiles.v_s;
        const int* doc_s = tiles.doc_s;
        if (start > warp_row0 + 15) { continue; }  // warp-uniform: every key is in this warp's future

        float s[8][4], dp[8][4];
        flash_scores<HD>(s, q_s + 16 * warp * S, k_s, lane);    // S = Q K^T
        flash_scores<HD>(dp, do_s + 16 * warp * S, v_s, lane);  // dP = dO V^T
        bool needs_mask = doc_row != nullptr || start + kFlashTile - 1 > warp_row0;
        for (int nt = 0; nt < 8; nt++) {
            for (int i = 0; i < 4; i++) {
                int r = i / 2, j = 8 * nt + 2 * t4 + i % 2;
                bool visible = !needs_mask ||
                               (start + j <= rows[r] && (doc_row == nullptr || doc_s[j] == my_doc[r]));
                float p = visible ? exp2f(s[nt][i] * score_scale - row_lse[r]) : 0.0f;
                dp[nt][i] = p * (dp[nt][i] - row_D[r]);  // dS
            }
        }
        flash_accumulate<HD>(dq_acc, dp, k_s, lane);  // dQ += dS K
    }

    float scale = 1.0f / sqrtf((float)hd);
    float scales[2] = {scale, scale};
    flash_store_rows<HD>(dq, dq_acc, rows, scales, b, h, T, Hq, hd, t4);
}

// ----------------------------------------------------------------------------------------
// backward, kernel 2: dk and dv; 64 keys of one kv head per block, over its group's query heads

// The query tiles are double-buffered: while the warps compute on one, cp.async brings in the
// next visible one (the next (query head, tile) pair that some key of the block can see).
template <int HD>
__global__ void __launch_bounds__(kFlashThreads)
    attention_backward_dkdv_tc_kernel(flash_bf16* dk, flash_bf16* dv, const float* D, const flash_bf16* dout,
                                      const flash_bf16* q, const flash_bf16* k, const flash_bf16* v,
                                      const float* lse, const int* doc_ids, int T, int Hq, int Hkv, int hd) {
    constexpr int S = HD + 8;
    constexpr int kTile = kFlashTile * S;
    unsigned char* smem = dynamic_shared_memory<unsigned char>();
    using Smem = FlashDkdvSmem<HD>;
    flash_bf16* k_s = flash_shared<flash_bf16, Smem::k>(smem);
    flash_bf16* v_s = flash_shared<flash_bf16, Smem::v>(smem);
    flash_bf16* q_s = flash_shared<flash_bf16, Smem::q>(smem);
    flash_bf16* do_s = flash_shared<flash_bf16, Smem::dout>(smem);
    float* lse_s = flash_shared<float, Smem::lse>(smem);
    float* D_s = flash_shared<float, Smem::D>(smem);
    int* doc_s = flash_shared<int, Smem::doc>(smem);

    int kv_head = blockIdx.y, b = blockIdx.z;
    int group = Hq / Hkv;
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    int g = lane / 4, t4 = lane % 4;
    int block_key0 = blockIdx.x * kFlashRows;  // the earliest keys (most query tiles) first
    int warp_key0 = block_key0 + 16 * warp;
    int keys[2] = {warp_key0 + g, warp_key0 + g + 8};  // this lane's keys: accumulator elements 0,1 and 2,3
    const int* doc_row = doc_ids != nullptr ? doc_ids + (size_t)b * T : nullptr;
    int my_doc[2];
    for (int r = 0; r < 2; r++) { my_doc[r] = doc_row != nullptr ? doc_row[min(keys[r], T - 1)] : 0; }

    // the block's work: tile i = query head kv_head * group + i / tiles_per_head, queries from
    // block_key0 + (i % tiles_per_head) * kFlashTile (causal: none before the block's keys)
    int tiles_per_head = CEIL_DIV(T - block_key0, kFlashTile);
    int total = group * tiles_per_head;
    auto tile_start = [&](int i) { return block_key0 + (i % tiles_per_head) * kFlashTile; };
    // The first tile >= i that some key of the block can see (total: none). Every thread calls
    // it; each candidate costs a block barrier, which also says that the buffer computed on
    // before the call is free again.
    auto next_visible = [&](int i) {
        for (; i < total; i++) {
            if (doc_row == nullptr) {
                __syncthreads();
                return i;
            }
            int key = block_key0 + threadIdx.x;
            bool seen = threadIdx.x < kFlashRows && key < T &&
                        key_seen_by_query_tile(doc_row, tile_start(i), kFlashTile, key, T, doc_row[key]);
            if (__syncthreads_or(seen)) { return i; }
        }
        return total;
    };
    // Starts the copies of tile i into buffer `buf` (one cp.async group per thread).
    auto issue = [&](int i, int buf) {
        int h = kv_head * group + i / tiles_per_head, start = tile_start(i);
        flash_load_tile<HD>(q_s + buf * kTile, q, b, start, h, T, Hq, hd);
        flash_load_tile<HD>(do_s + buf * kTile, dout, b, start, h, T, Hq, hd);
        if (threadIdx.x < kFlashTile) {
            int t = start + threadIdx.x;
            bool in_range = t < T;
            size_t stat = ((size_t)b * Hq + h) * T + t;
            lse_s[buf * kFlashTile + threadIdx.x] = in_range ? lse[stat] * kLog2e : 0.0f;
            D_s[buf * kFlashTile + threadIdx.x] = in_range ? D[stat] : 0.0f;
            doc_s[buf * kFlashTile + threadIdx.x] = (doc_row != nullptr && in_range) ? doc_row[t] : 0;
        }
        cp_async_commit_group();
    };

    flash_load_tile<HD>(k_s, k, b, block_key0, kv_head, T, Hkv, hd);
    flash_load_tile<HD>(v_s, v, b, block_key0, kv_head, T, Hkv, hd);
    cp_async_commit_group();  // completes before (and is published with) the first query tile

    float dk_acc[HD / 8][4], dv_acc[HD / 8][4];
    for (int dt = 0; dt < HD / 8; dt++) {
        for (int i = 0; i < 4; i++) { dk_acc[dt][i] = 0.0f, dv_acc[dt][i] = 0.0f; }
    }
    const float score_scale = kLog2e / sqrtf((float)hd);

    int cur = next_visible(0), buf = 0;
    if (cur < total) { issue(cur, buf); }
    while (cur < total) {
        int nxt = next_visible(cur + 1);  // its barrier: buffer buf ^ 1 (the tile before cur) is free
        if (nxt < total) {
            issue(nxt, buf ^ 1);
            cp_async_wait_group<1>();  // everything but the tile just issued has landed
        } else {
            cp_async_wait_all();
        }
        __syncthreads();

        int start = tile_start(cur);
        const flash_bf16* qt = q_s + buf * kTile;
        const flash_bf16* dot = do_s + buf * kTile;
        const float* lse_t = lse_s + buf * kFlashTile;
        const float* D_t = D_s + buf * kFlashTile;
        const int* doc_t = doc_s + buf * kFlashTile;
        // transposed tiles: rows are this warp's 16 keys, columns the tile's 64 queries
        float s[8][4], dp[8][4];
        flash_scores<HD>(s, k_s + 16 * warp * S, qt, lane);    // S^T = K Q^T
        flash_scores<HD>(dp, v_s + 16 * warp * S, dot, lane);  // dP^T = V dO^T
        bool needs_mask = doc_row != nullptr || start < warp_key0 + 16 || start + kFlashTile > T;
        for (int nt = 0; nt < 8; nt++) {
            for (int i = 0; i < 4; i++) {
                int r = i / 2, j = 8 * nt + 2 * t4 + i % 2, t = start + j;
                bool visible =
                    !needs_mask || (t >= keys[r] && t < T && (doc_row == nullptr || doc_t[j] == my_doc[r]));
                float p = visible ? exp2f(s[nt][i] * score_scale - lse_t[j]) : 0.0f;
                s[nt][i] = p;
                dp[nt][i] = p * (dp[nt][i] - D_t[j]);  // dS^T
            }
        }
        flash_accumulate<HD>(dv_acc, s, dot, lane);  // dV += P^T dO
        flash_accumulate<HD>(dk_acc, dp, qt, lane);  // dK += dS^T Q
        cur = nxt;
        buf ^= 1;
    }
    cp_async_wait_all();  // (nothing is in flight here unless the block had no visible tile)

    float scale = 1.0f / sqrtf((float)hd);
    float dk_scales[2] = {scale, scale}, dv_scales[2] = {1.0f, 1.0f};
    flash_store_rows<HD>(dk, dk_acc, keys, dk_scales, b, kv_head, T, Hkv, hd, t4);
    flash_store_rows<HD>(dv, dv_acc, keys, dv_scales, b, kv_head, T, Hkv, hd, t4);
}

// ----------------------------------------------------------------------------------------
// launchers (shapes checked by the caller: hd % 16 == 0, hd <= 128, Hq % Hkv == 0)

// Calls f(std::integral_constant<int, HD>) with HD = hd rounded up to 16, 32, 64 or 128.
template <typename F>
void flash_dispatch_head_dim(int hd, F f) {
    dispatch_head_dim<16>(hd, f);
}

template <typename Kernel>
void flash_allow_shared(Kernel* kernel, size_t bytes) {
    if (bytes > 48 * 1024) {
        cudaCheck(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
    }
}

inline bool flash_supports(int hd) { return hd % 16 == 0 && hd >= 16 && hd <= 128; }

inline void attention_forward_tc(flash_bf16* out, float* lse, const flash_bf16* q, const flash_bf16* k,
                                 const flash_bf16* v, const int* doc_ids, int B, int T, int Hq, int Hkv, int hd,
                                 cudaStream_t stream) {
    flash_dispatch_head_dim(hd, [&](auto head_dim) {
        constexpr int HD = decltype(head_dim)::value;
        constexpr size_t shared = FlashForwardSmem<HD>::bytes;
        flash_allow_shared(attention_forward_tc_kernel<HD>, shared);
        dim3 grid(CEIL_DIV(T, kFlashRows), Hq, B);
        LAUNCH(grid, kFlashThreads, shared, stream, attention_forward_tc_kernel<HD>)(out, lse, q, k, v, doc_ids, T, Hq,
                                                                                    Hkv, hd);
    });
    cudaCheckLaunch();
}

// D: B*Hq*T floats (written by the dq kernel, read by the dk/dv kernel)
inline void attention_backward_tc(flash_bf16* dq, flash_bf16* dk, flash_bf16* dv, float* D, const flash_bf16* dout,
                                  const flash_bf16* out, const flash_bf16* q, const flash_bf16* k, const flash_bf16* v,
                                  const float* lse, const int* doc_ids, int B, int T, int Hq, int Hkv, int hd,
                                  cudaStream_t stream) {
    flash_dispatch_head_dim(hd, [&](auto head_dim) {
        constexpr int HD = decltype(head_dim)::value;
        constexpr size_t shared_dq = FlashDqSmem<HD>::bytes;
        flash_allow_shared(attention_backward_dq_tc_kernel<HD>, shared_dq);
        dim3 grid_dq(CEIL_DIV(T, kFlashRows), Hq, B);
        LAUNCH(grid_dq, kFlashThreads, shared_dq, stream, attention_backward_dq_tc_kernel<HD>)(
            dq, D, dout, out, q, k, v, lse, doc_ids, T, Hq, Hkv, hd);
        cudaCheckLaunch();
        constexpr size_t shared_dkdv = FlashDkdvSmem<HD>::bytes;
        flash_allow_shared(attention_backward_dkdv_tc_kernel<HD>, shared_dkdv);
        dim3 grid_dkdv(CEIL_DIV(T, kFlashRows), Hkv, B);
        LAUNCH(grid_dkdv, kFlashThreads, shared_dkdv, stream, attention_backward_dkdv_tc_kernel<HD>)(
            dk, dv, D, dout, q, k, v, lse, doc_ids, T, Hq, Hkv, hd);
    });
    cudaCheckLaunch();
}
