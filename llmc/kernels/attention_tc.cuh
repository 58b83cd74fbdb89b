/*
Causal GQA attention with an optional same-document mask on tensor cores: FlashAttention-2
(Dao, 2023) forward and backward, bf16 operands, fp32 accumulation, through the warp-level
primitives of llmc/kernels/mma.cuh (mma.sync m16n8k16, ldmatrix) and llmc/kernels/async_copy.cuh (cp.async).
Same maths, shapes and contract as llmc/kernels/attention.cuh, which dispatches here in bf16 builds:

    q, out, dout, dq: (B, T, Hq, hd)   k, v, dk, dv: (B, T, Hkv, hd)   bf16, row-major
    lse, D: (B, Hq, T) float            doc_ids: (B, T) int or nullptr
    head dims: multiples of 16 up to 128 (HD = hd rounded up to 16/32/64/128; the padding
    columns are zero in shared memory, so they add nothing); 16-byte aligned pointers.

Every kernel: 4 warps (128 threads) per block, 64 rows of the operand the block owns, warp w
owns rows 16w .. 16w+15 (one m16 tile); the other operand streams through shared memory in
tiles of 64 rows of [64][HD + 8] bf16 (the 8-element pad shifts consecutive rows by 4 banks,
so the 8 row reads of an ldmatrix hit distinct banks), loaded with cp.async (zero-filled past
T) into two buffers, so that the next tile's copy overlaps the current tile's mma (one
FlashTileStream under FlashKeyTiles, the forward's and dq kernel's K/V tiles, and
FlashQueryTiles, the dk/dv kernel's query tiles). Fragment facts used throughout
(llmc/kernels/mma.cuh): a row of a 16x8 accumulator lives in the 4 lanes of a lane group; the
accumulators of two adjacent n8 tiles, rounded to bf16, are exactly the A fragment of one k16
step, so probabilities never leave the registers; a tile stored [n][k] ([key][d]) is a B
operand through ldmatrix, one stored [k][n] through ldmatrix.trans.

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
absolute values of its terms (dev/test/test_attention.cu checks that bound).

Cost: per 64 x 64 tile and warp, 2 x 8 x HD/16 mma per product (16 x 64 x HD); the forward
does 2 products (S, PV), the backward 7 (dq kernel: S, dP, dQ; dk/dv kernel: S, dP, dV, dK):
3.5x the forward's mma work where 2.5x is the minimum, the price of a separate dq pass without
atomics (S and dP are computed in both kernels).
Shared memory (double-buffered tiles): forward (64 + 4 x 64) (HD + 8) bf16 (45 KiB at HD 64,
85 KiB at 128); dq kernel 6 x 64 (HD + 8) bf16 + 768 B (54, 103 KiB); dk/dv kernel
6 x 64 (HD + 8) bf16 + 1.5 KiB (55, 103 KiB). Each kernel's layout is one struct
(FlashForwardSmem, FlashDqSmem, FlashDkdvSmem) that the launcher takes the size from and the
kernel its regions; above 48 KiB the launcher raises the limit, and it refuses a device that
lacks sm_80 or the shared memory (attention.cuh, attention_tc_device_refusal). Registers per
thread (ptxas), the measured errors and the GPU status: doc/san-model.md "Attention kernels".
On the host backend every mma/ldmatrix is a warp collective (doc/host-backend.md).
*/
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "llmc/kernels/async_copy.cuh"
#include "llmc/kernels/attention_shape.h"  // defines: AttnShape, AttnTensorsOf, AttnGradsOf
#include "llmc/cuda_common.h"
#include "llmc/kernels/head_dim.h"
#include "llmc/kernels/mma.cuh"

constexpr int kFlashRows = 64;                // rows of the operand a block owns
constexpr int kFlashTile = 64;                // rows of the streamed operand per shared tile
constexpr int kFlashWarps = kFlashRows / 16;  // one m16 tile per warp
constexpr int kFlashThreads = 32 * kFlashWarps;
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;  // 1 / kLog2e: back from base 2 to natural logs

typedef __nv_bfloat16 flash_bf16;

// Starts the copy of rows [start, start + kFlashTile) of head `head` of a (B, T, H, hd) bf16
// tensor into a shared [kFlashTile][HD + 8] tile, 16 bytes per cp.async (hd % 8 == 0); rows
// past T and columns past hd are zero-filled with plain stores. The caller commits the
// copies (cp_async_commit_group), waits for them and then synchronises the block before reading.
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

// The document mask's tile tests, shared with llmc/kernels/attention.cuh's kernels (which use their own
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

// ----------------------------------------------------------------------------------------
// shared memory: one layout per kernel (below the tile streams), byte offsets of its regions
// laid end to end; the launcher takes `bytes` from it and the kernel its regions
// (flash_shared), so that the two agree by construction

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

// ----------------------------------------------------------------------------------------
// a block's rows, and the tiles it streams past them

// A lane's place in its block: the block owns the kFlashRows rows from block_row0 of batch row
// b (queries in the forward and dq kernels, keys in the dk/dv kernel), warp w the 16 from
// warp_row0 = block_row0 + 16w (one m16 tile), the lane row(0) (its accumulator elements 0, 1)
// and row(1) = row(0) + 8 (elements 2, 3), of documents doc(0) and doc(1). (No member arrays:
// an array member indexed by a loop counter kept the whole struct in memory until the loops
// were unrolled; measured, ptxas sm_90: the dk/dv kernel 19 registers more at HD 64 and
// spilling at 128.)
struct FlashLaneRows {
    int b, warp, lane, t4;  // t4: the lane's place in its group of 4 (fragment columns 2 t4, 2 t4 + 1)
    int block_row0, warp_row0;
    int row0, row1;      // row(0), row(1)
    const int* doc_row;  // batch row b of doc_ids; nullptr: no document mask
    int doc0, doc1;      // doc(0), doc(1) (a row past T: row T - 1's, never compared)

    __device__ FlashLaneRows(int block_row0_, int b_, const int* doc_ids, int T)
        : b(b_), warp(threadIdx.x / 32), lane(threadIdx.x % 32), t4(lane % 4), block_row0(block_row0_),
          warp_row0(block_row0_ + 16 * warp), row0(warp_row0 + lane / 4), row1(warp_row0 + lane / 4 + 8),
          doc_row(doc_ids != nullptr ? doc_ids + (size_t)b_ * T : nullptr),
          doc0(doc_row != nullptr ? doc_row[min(row0, T - 1)] : 0),
          doc1(doc_row != nullptr ? doc_row[min(row1, T - 1)] : 0) {}
    __device__ int row(int r) const { return r == 0 ? row0 : row1; }
    __device__ int doc(int r) const { return r == 0 ? doc0 : doc1; }
};

// The block of the forward and the dq kernel: grid (ceil(T/64), Hq, B), block x owns the 64
// query rows from (gridDim.x - 1 - x) * 64 (the longest rows, latest queries, first) of head
// h = blockIdx.y; its keys and values are those of kv head h / (Hq / Hkv). (Whether a tile
// needs the mask at all stays written out in the kernels: as a method here it cost the
// forward 16 to 35 registers per thread, ptxas sm_90, CUDA 13.0.)
struct FlashQueryBlock : FlashLaneRows {
    int h, kv_head;

    __device__ FlashQueryBlock(const int* doc_ids, int T, int Hq, int Hkv)
        : FlashLaneRows((int)(gridDim.x - 1 - blockIdx.x) * kFlashRows, blockIdx.z, doc_ids, T), h(blockIdx.y),
          kv_head(h / (Hq / Hkv)) {}
    // Starts the copy of the block's rows of head h of a (B, T, Hq, hd) tensor (q, dout) into
    // a shared [kFlashRows][HD + 8] tile (flash_load_tile).
    template <int HD>
    __device__ void load(flash_bf16* tile, const flash_bf16* src, int T, int Hq, int hd) const {
        flash_load_tile<HD>(tile, src, b, block_row0, h, T, Hq, hd);
    }
    // Whether every key of the tile from `start` is in this warp's future (warp-uniform: the
    // warp skips the tile).
    __device__ bool warp_before(int start) const { return start > warp_row0 + 15; }
    // Whether row(r) sees key start + j, of document doc_s[j].
    __device__ bool sees(int r, int start, int j, const int* doc_s) const {
        return start + j <= row(r) && (doc_row == nullptr || doc_s[j] == doc(r));
    }
};

// The tiles a block streams through two shared buffers, under FlashKeyTiles (the forward and
// the dq kernel) and FlashQueryTiles (the dk/dv kernel): tiles 0 .. total - 1 in order,
// skipping those that no row of the block can see (other documents); while the warps compute
// on one tile, cp.async brings the next visible one into the other buffer. The derived struct
// `Tiles` says what a tile is:
//     bool sees(int i)           this thread's vote that its row of the block sees into tile i
//                                (asked only under a document mask)
//     void copy(int i, int buf)  starts the copies of tile i into buffer buf
// The kernel calls begin() (the first tile's copy) once the copies of its own rows are
// committed, then next() per tile; every thread of the block runs them (block barriers).
// begin() is not the constructor's so that a kernel can set the stream up with the rest of
// its block's state (the dk/dv kernel does: setting it up after its K/V copies cost it a
// spill at HD 128).
template <typename Tiles>
struct FlashTileStream {
    const int* doc_row;  // the batch row's document ids; nullptr: every tile is visible
    int total;           // tiles, visible or not
    int cur = 0;         // the next visible tile (total: none), whose copy is in flight
    int buf = 0;         // the buffer of that copy

    __device__ FlashTileStream(const int* doc_row_, int total_) : doc_row(doc_row_), total(total_) {}

    // The first tile >= i that some row of the block can see, `total` if none. Every thread
    // calls it; each candidate costs a block barrier, which also says that the buffer computed
    // on before the call is free.
    __device__ int next_visible(int i) {
        for (; i < total; i++) {
            if (doc_row == nullptr) {
                __syncthreads();
                return i;
            }
            if (__syncthreads_or(static_cast<Tiles*>(this)->sees(i))) { return i; }
        }
        return total;
    }
    // Starts the copies of tile i into buffer `into`: one cp.async group.
    __device__ void issue(int i, int into) {
        static_cast<Tiles*>(this)->copy(i, into);
        cp_async_commit_group();
    }
    // Finds the first visible tile and starts its copy.
    __device__ void begin() {
        cur = next_visible(0);
        if (cur < total) { issue(cur, 0); }
    }
    // Makes the next visible tile current, waiting for its copy and starting the copy of the
    // one after it: tile, its index; tile_buf, its buffer. False when no tile is left.
    __device__ bool advance(int& tile, int& tile_buf) {
        if (cur >= total) { return false; }
        int nxt = next_visible(cur + 1);  // buffer buf ^ 1 is free
        if (nxt < total) {
            issue(nxt, buf ^ 1);
            cp_async_wait_group<1>();  // everything but the tile just issued has landed
        } else {
            cp_async_wait_all();
        }
        __syncthreads();
        tile = cur;
        tile_buf = buf;
        cur = nxt;
        buf ^= 1;
        return true;
    }
    // The document ids of rows [start, start + kFlashTile) into dst (0 past T and without a
    // mask): plain stores, published by advance()'s barrier like the copies.
    __device__ void copy_doc_ids(int* dst, int start, int T) const {
        if (threadIdx.x < kFlashTile) {
            int t = start + threadIdx.x;
            dst[threadIdx.x] = (doc_row != nullptr && t < T) ? doc_row[t] : 0;
        }
    }
};

// The K/V tiles a block of query rows can see (the forward and the dq kernel): tile i holds
// the keys and values from i * kFlashTile of kv head blk.kv_head, tiles up to the block's last
// row (causal), and the keys' document ids.
//     FlashKeyTiles<HD> tiles(smem_region, k, v, blk, T, Hkv, hd);
//     while (tiles.next()) { ... tiles.start, tiles.k_s, tiles.v_s, tiles.doc_s ... }
// A warp may skip the rest of a tile's body with `continue`. Its shared memory, kSmemBytes
// from smem_region: [2][kFlashTile][HD + 8] bf16 K, the same for V, [2][kFlashTile] int ids.
template <int HD>
struct FlashKeyTiles : FlashTileStream<FlashKeyTiles<HD>> {
    static constexpr int kTile = kFlashTile * (HD + 8);  // elements of one buffer of K or V
    static constexpr size_t kK = 0, kV = kK + 2 * flash_tile_bytes<HD>(kFlashTile),
                            kDoc = kV + 2 * flash_tile_bytes<HD>(kFlashTile);
    static constexpr size_t kSmemBytes = kDoc + 2 * kFlashTile * sizeof(int);
    flash_bf16 *k_buf, *v_buf;
    int* doc_buf;
    const flash_bf16 *k, *v;
    int b, kv_head, block_row0, T, Hkv, hd;
    // the tile made current by next(): its first key and its shared copies
    int start = 0;
    const flash_bf16 *k_s = nullptr, *v_s = nullptr;
    const int* doc_s = nullptr;

    __device__ FlashKeyTiles(unsigned char* smem_region, const flash_bf16* k_, const flash_bf16* v_,
                             const FlashQueryBlock& blk, int T_, int Hkv_, int hd_)
        : FlashTileStream<FlashKeyTiles<HD>>(blk.doc_row, (min(T_, blk.block_row0 + kFlashRows) - 1) / kFlashTile + 1),
          k_buf(flash_shared<flash_bf16, kK>(smem_region)), v_buf(flash_shared<flash_bf16, kV>(smem_region)),
          doc_buf(flash_shared<int, kDoc>(smem_region)), k(k_), v(v_), b(blk.b), kv_head(blk.kv_head),
          block_row0(blk.block_row0), T(T_), Hkv(Hkv_), hd(hd_) {}
    __device__ bool sees(int i) const {
        int row = block_row0 + threadIdx.x;
        return threadIdx.x < kFlashRows && row < T &&
               query_sees_key_tile(this->doc_row, i * kFlashTile, kFlashTile, row, T, this->doc_row[row]);
    }
    __device__ void copy(int i, int into) {
        int first = i * kFlashTile;
        flash_load_tile<HD>(k_buf + into * kTile, k, b, first, kv_head, T, Hkv, hd);
        flash_load_tile<HD>(v_buf + into * kTile, v, b, first, kv_head, T, Hkv, hd);
        this->copy_doc_ids(doc_buf + into * kFlashTile, first, T);
    }
    // Makes the next visible tile current; false when no tile is left.
    __device__ bool next() {
        int tile, tile_buf;
        if (!this->advance(tile, tile_buf)) { return false; }
        start = tile * kFlashTile;
        k_s = k_buf + tile_buf * kTile;
        v_s = v_buf + tile_buf * kTile;
        doc_s = doc_buf + tile_buf * kFlashTile;
        return true;
    }
};

// The query tiles that see a block of keys (the dk/dv kernel): tile i holds the queries and
// output gradients of query head kv_head * group + i / tiles_per_head from block_key0 +
// (i % tiles_per_head) * kFlashTile (causal: none before the block's keys), with their rows'
// lse (log2 units), D and document ids.
//     FlashQueryTiles<HD> tiles(smem_region, q, dout, lse, D, keys, kv_head, group, T, Hq, hd);
//     while (tiles.next()) { ... tiles.start, tiles.q_s, tiles.do_s, tiles.lse_s, tiles.D_s, tiles.doc_s ... }
// Its shared memory, kSmemBytes from smem_region: [2][kFlashTile][HD + 8] bf16 q, the same
// for dout, [2][kFlashTile] float lse, the same for D, [2][kFlashTile] int ids.
template <int HD>
struct FlashQueryTiles : FlashTileStream<FlashQueryTiles<HD>> {
    static constexpr int kTile = kFlashTile * (HD + 8);  // elements of one buffer of q or dout
    static constexpr size_t kQ = 0, kDout = kQ + 2 * flash_tile_bytes<HD>(kFlashTile),
                            kLse = kDout + 2 * flash_tile_bytes<HD>(kFlashTile),
                            kD = kLse + 2 * kFlashTile * sizeof(float), kDoc = kD + 2 * kFlashTile * sizeof(float);
    static constexpr size_t kSmemBytes = kDoc + 2 * kFlashTile * sizeof(int);
    flash_bf16 *q_buf, *do_buf;
    float *lse_buf, *D_buf;
    int* doc_buf;
    const flash_bf16 *q, *dout;
    const float *lse, *D;
    int b, kv_head, group, block_key0, tiles_per_head, T, Hq, hd;
    // the tile made current by next(): its first query and its shared copies
    int start = 0;
    const flash_bf16 *q_s = nullptr, *do_s = nullptr;
    const float *lse_s = nullptr, *D_s = nullptr;
    const int* doc_s = nullptr;

    __device__ FlashQueryTiles(unsigned char* smem_region, const flash_bf16* q_, const flash_bf16* dout_,
                               const float* lse_, const float* D_, const FlashLaneRows& keys, int kv_head_, int group_,
                               int T_, int Hq_, int hd_)
        : FlashTileStream<FlashQueryTiles<HD>>(keys.doc_row, group_ * CEIL_DIV(T_ - keys.block_row0, kFlashTile)),
          q_buf(flash_shared<flash_bf16, kQ>(smem_region)), do_buf(flash_shared<flash_bf16, kDout>(smem_region)),
          lse_buf(flash_shared<float, kLse>(smem_region)), D_buf(flash_shared<float, kD>(smem_region)),
          doc_buf(flash_shared<int, kDoc>(smem_region)), q(q_), dout(dout_), lse(lse_), D(D_), b(keys.b),
          kv_head(kv_head_), group(group_), block_key0(keys.block_row0),
          tiles_per_head(CEIL_DIV(T_ - keys.block_row0, kFlashTile)), T(T_), Hq(Hq_), hd(hd_) {}
    __device__ int tile_start(int i) const { return block_key0 + (i % tiles_per_head) * kFlashTile; }
    __device__ bool sees(int i) const {
        int key = block_key0 + threadIdx.x;
        return threadIdx.x < kFlashRows && key < T &&
               key_seen_by_query_tile(this->doc_row, tile_start(i), kFlashTile, key, T, this->doc_row[key]);
    }
    __device__ void copy(int i, int into) {
        int h = kv_head * group + i / tiles_per_head, first = tile_start(i);
        flash_load_tile<HD>(q_buf + into * kTile, q, b, first, h, T, Hq, hd);
        flash_load_tile<HD>(do_buf + into * kTile, dout, b, first, h, T, Hq, hd);
        if (threadIdx.x < kFlashTile) {
            int t = first + threadIdx.x;
            bool in_range = t < T;
            size_t stat = ((size_t)b * Hq + h) * T + t;
            lse_buf[into * kFlashTile + threadIdx.x] = in_range ? lse[stat] * kLog2e : 0.0f;
            D_buf[into * kFlashTile + threadIdx.x] = in_range ? D[stat] : 0.0f;
        }
        this->copy_doc_ids(doc_buf + into * kFlashTile, first, T);
    }
    // Makes the next visible tile current; false when no tile is left.
    __device__ bool next() {
        int tile, tile_buf;
        if (!this->advance(tile, tile_buf)) { return false; }
        start = tile_start(tile);
        q_s = q_buf + tile_buf * kTile;
        do_s = do_buf + tile_buf * kTile;
        lse_s = lse_buf + tile_buf * kFlashTile;
        D_s = D_buf + tile_buf * kFlashTile;
        doc_s = doc_buf + tile_buf * kFlashTile;
        return true;
    }
};

// The kernels' layouts. forward: the block's queries, then the K/V tiles.
template <int HD>
struct FlashForwardSmem {
    static constexpr size_t q = 0;                                     // [kFlashRows][HD + 8] bf16
    static constexpr size_t keys = q + flash_tile_bytes<HD>(kFlashRows);  // FlashKeyTiles<HD>
    static constexpr size_t bytes = keys + FlashKeyTiles<HD>::kSmemBytes;
};

// dq kernel: the block's queries and output gradients, the K/V tiles, the block's D (dout .
// out per row).
template <int HD>
struct FlashDqSmem {
    static constexpr size_t q = 0;                                        // [kFlashRows][HD + 8] bf16
    static constexpr size_t dout = q + flash_tile_bytes<HD>(kFlashRows);     // [kFlashRows][HD + 8] bf16
    static constexpr size_t keys = dout + flash_tile_bytes<HD>(kFlashRows);  // FlashKeyTiles<HD>
    static constexpr size_t D = keys + FlashKeyTiles<HD>::kSmemBytes;        // [kFlashRows] float
    static constexpr size_t bytes = D + kFlashRows * sizeof(float);
};

// dk/dv kernel: the block's keys and values, then the query tiles.
template <int HD>
struct FlashDkdvSmem {
    static constexpr size_t k = 0;                                          // [kFlashRows][HD + 8] bf16
    static constexpr size_t v = k + flash_tile_bytes<HD>(kFlashRows);          // [kFlashRows][HD + 8] bf16
    static constexpr size_t queries = v + flash_tile_bytes<HD>(kFlashRows);    // FlashQueryTiles<HD>
    static constexpr size_t bytes = queries + FlashQueryTiles<HD>::kSmemBytes;
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

// Stores a lane's part of a warp's 16 x HD accumulator (times scale[r] in row r) into its rows
// (lanes.row(0): elements 0, 1; lanes.row(1): elements 2, 3) of head `head` of a (B, T, H, hd)
// tensor.
template <int HD>
__device__ __forceinline__ void flash_store_rows(flash_bf16* dst, const float acc[HD / 8][4],
                                                 const FlashLaneRows& lanes, const float scale[2], int head, int T,
                                                 int H, int hd) {
    for (int r = 0; r < 2; r++) {
        if (lanes.row(r) >= T) { continue; }
        flash_bf16* row = dst + (((size_t)lanes.b * T + lanes.row(r)) * H + head) * hd;
        for (int dt = 0; dt < HD / 8; dt++) {
            int col = 8 * dt + 2 * lanes.t4;
            if (col < hd) {
                *reinterpret_cast<__nv_bfloat162*>(row + col) =
                    __floats2bfloat162_rn(acc[dt][2 * r] * scale[r], acc[dt][2 * r + 1] * scale[r]);
            }
        }
    }
}

// ----------------------------------------------------------------------------------------
// forward

template <int HD>
__global__ void __launch_bounds__(kFlashThreads)
    attention_forward_tc_kernel(flash_bf16* out, float* lse, const flash_bf16* q, const flash_bf16* k,
                                const flash_bf16* v, const int* doc_ids, int T, int Hq, int Hkv, int hd) {
    constexpr int S = HD + 8;  // shared row stride (elements)
    using Smem = FlashForwardSmem<HD>;
    unsigned char* smem = dynamic_shared_memory<unsigned char>();
    flash_bf16* q_s = flash_shared<flash_bf16, Smem::q>(smem);

    const FlashQueryBlock blk(doc_ids, T, Hq, Hkv);
    const int warp = blk.warp, lane = blk.lane, t4 = blk.t4;
    blk.load<HD>(q_s, q, T, Hq, hd);
    cp_async_commit_group();  // lands with (and is published by the barrier of) the first K/V tile

    float o[HD / 8][4];
    for (int dt = 0; dt < HD / 8; dt++) {
        for (int i = 0; i < 4; i++) { o[dt][i] = 0.0f; }
    }
    float row_max[2] = {-INFINITY, -INFINITY};  // in log2 units of the scaled scores
    float row_sum[2] = {0.0f, 0.0f};           // this lane's part of the row's sum (its 2 of 8 columns per n8 tile)
    const float score_scale = kLog2e / sqrtf((float)hd);  // exp2 instead of exp

    FlashKeyTiles<HD> tiles(flash_shared<unsigned char, Smem::keys>(smem), k, v, blk, T, Hkv, hd);
    tiles.begin();
    while (tiles.next()) {
        const int start = tiles.start;
        if (blk.warp_before(start)) { continue; }

        float s[8][4];
        flash_scores<HD>(s, q_s + 16 * warp * S, tiles.k_s, lane);

        // scale and mask; accumulator element i is row blk.row(i / 2), key start + 8 nt + 2 t4 + i % 2
        bool needs_mask = blk.doc_row != nullptr || start + kFlashTile - 1 > blk.warp_row0;
        for (int nt = 0; nt < 8; nt++) {
            for (int i = 0; i < 4; i++) {
                float x = s[nt][i] * score_scale;
                if (needs_mask) {
                    bool visible = blk.sees(i / 2, start, 8 * nt + 2 * t4 + i % 2, tiles.doc_s);
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

        flash_accumulate<HD>(o, s, tiles.v_s, lane);  // O += P V
    }

    for (int r = 0; r < 2; r++) {
        row_sum[r] += __shfl_xor_sync(0xffffffffu, row_sum[r], 1);
        row_sum[r] += __shfl_xor_sync(0xffffffffu, row_sum[r], 2);
    }
    float inv_sum[2] = {1.0f / row_sum[0], 1.0f / row_sum[1]};  // every row sees itself: > 0
    flash_store_rows<HD>(out, o, blk, inv_sum, blk.h, T, Hq, hd);
    for (int r = 0; r < 2; r++) {
        if (blk.row(r) < T && t4 == 0) {
            lse[((size_t)blk.b * Hq + blk.h) * T + blk.row(r)] = (row_max[r] + log2f(row_sum[r])) * kLn2;
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
    using Smem = FlashDqSmem<HD>;
    unsigned char* smem = dynamic_shared_memory<unsigned char>();
    flash_bf16* q_s = flash_shared<flash_bf16, Smem::q>(smem);
    flash_bf16* do_s = flash_shared<flash_bf16, Smem::dout>(smem);
    float* D_s = flash_shared<float, Smem::D>(smem);

    const FlashQueryBlock blk(doc_ids, T, Hq, Hkv);
    const int warp = blk.warp, lane = blk.lane, t4 = blk.t4;
    blk.load<HD>(q_s, q, T, Hq, hd);
    blk.load<HD>(do_s, dout, T, Hq, hd);
    cp_async_commit_group();  // Q and dO: one group, waited for below (wait_all alone would commit it implicitly)
    {  // D: two threads per row, each half of the columns, in fp32 from global memory
        int r = threadIdx.x / 2, half = threadIdx.x % 2, row = blk.block_row0 + r;
        float sum = 0.0f;
        if (row < T) {
            size_t base = (((size_t)blk.b * T + row) * Hq + blk.h) * hd;
            for (int e = half * (hd / 2); e < (half + 1) * (hd / 2); e++) {
                sum += __bfloat162float(dout[base + e]) * __bfloat162float(out[base + e]);
            }
        }
        sum += __shfl_xor_sync(0xffffffffu, sum, 1);
        if (half == 0) {
            D_s[r] = sum;
            if (row < T) { D[((size_t)blk.b * Hq + blk.h) * T + row] = sum; }
        }
    }
    cp_async_wait_all();
    __syncthreads();
    // per lane: its rows' lse (log2 units; +inf past T: P = 0 there) and D
    float row_lse[2], row_D[2];
    for (int r = 0; r < 2; r++) {
        row_lse[r] = blk.row(r) < T ? lse[((size_t)blk.b * Hq + blk.h) * T + blk.row(r)] * kLog2e : INFINITY;
        row_D[r] = D_s[blk.row(r) - blk.block_row0];
    }

    float dq_acc[HD / 8][4];
    for (int dt = 0; dt < HD / 8; dt++) {
        for (int i = 0; i < 4; i++) { dq_acc[dt][i] = 0.0f; }
    }
    const float score_scale = kLog2e / sqrtf((float)hd);

    FlashKeyTiles<HD> tiles(flash_shared<unsigned char, Smem::keys>(smem), k, v, blk, T, Hkv, hd);
    tiles.begin();
    while (tiles.next()) {
        const int start = tiles.start;
        if (blk.warp_before(start)) { continue; }

        float s[8][4], dp[8][4];
        flash_scores<HD>(s, q_s + 16 * warp * S, tiles.k_s, lane);    // S = Q K^T
        flash_scores<HD>(dp, do_s + 16 * warp * S, tiles.v_s, lane);  // dP = dO V^T
        bool needs_mask = blk.doc_row != nullptr || start + kFlashTile - 1 > blk.warp_row0;
        for (int nt = 0; nt < 8; nt++) {
            for (int i = 0; i < 4; i++) {
                int r = i / 2, j = 8 * nt + 2 * t4 + i % 2;
                bool visible = !needs_mask || blk.sees(r, start, j, tiles.doc_s);
                float p = visible ? exp2f(s[nt][i] * score_scale - row_lse[r]) : 0.0f;
                dp[nt][i] = p * (dp[nt][i] - row_D[r]);  // dS
            }
        }
        flash_accumulate<HD>(dq_acc, dp, tiles.k_s, lane);  // dQ += dS K
    }

    float scale = 1.0f / sqrtf((float)hd);
    float scales[2] = {scale, scale};
    flash_store_rows<HD>(dq, dq_acc, blk, scales, blk.h, T, Hq, hd);
}

// ----------------------------------------------------------------------------------------
// backward, kernel 2: dk and dv; 64 keys of one kv head per block, over its group's query heads

// The block owns the 64 keys from blockIdx.x * 64 (the earliest keys, most query tiles, first)
// of kv head blockIdx.y; FlashQueryTiles streams the query tiles of its group's heads that see them.
template <int HD>
__global__ void __launch_bounds__(kFlashThreads)
    attention_backward_dkdv_tc_kernel(flash_bf16* dk, flash_bf16* dv, const float* D, const flash_bf16* dout,
                                      const flash_bf16* q, const flash_bf16* k, const flash_bf16* v,
                                      const float* lse, const int* doc_ids, int T, int Hq, int Hkv, int hd) {
    constexpr int S = HD + 8;
    using Smem = FlashDkdvSmem<HD>;
    unsigned char* smem = dynamic_shared_memory<unsigned char>();
    flash_bf16* k_s = flash_shared<flash_bf16, Smem::k>(smem);
    flash_bf16* v_s = flash_shared<flash_bf16, Smem::v>(smem);

    int kv_head = blockIdx.y, group = Hq / Hkv;
    const FlashLaneRows keys(blockIdx.x * kFlashRows, blockIdx.z, doc_ids, T);  // this lane's keys: keys.row(0), row(1)
    const int warp = keys.warp, lane = keys.lane, t4 = keys.t4;
    FlashQueryTiles<HD> tiles(flash_shared<unsigned char, Smem::queries>(smem), q, dout, lse, D, keys, kv_head, group,
                              T, Hq, hd);  // streaming starts at tiles.begin(), below
    flash_load_tile<HD>(k_s, k, keys.b, keys.block_row0, kv_head, T, Hkv, hd);
    flash_load_tile<HD>(v_s, v, keys.b, keys.block_row0, kv_head, T, Hkv, hd);
    cp_async_commit_group();  // completes before (and is published with) the first query tile

    float dk_acc[HD / 8][4], dv_acc[HD / 8][4];
    for (int dt = 0; dt < HD / 8; dt++) {
        for (int i = 0; i < 4; i++) { dk_acc[dt][i] = 0.0f, dv_acc[dt][i] = 0.0f; }
    }
    const float score_scale = kLog2e / sqrtf((float)hd);

    tiles.begin();
    while (tiles.next()) {
        const int start = tiles.start;
        // transposed tiles: rows are this warp's 16 keys, columns the tile's 64 queries
        float s[8][4], dp[8][4];
        flash_scores<HD>(s, k_s + 16 * warp * S, tiles.q_s, lane);    // S^T = K Q^T
        flash_scores<HD>(dp, v_s + 16 * warp * S, tiles.do_s, lane);  // dP^T = V dO^T
        bool needs_mask = keys.doc_row != nullptr || start < keys.warp_row0 + 16 || start + kFlashTile > T;
        for (int nt = 0; nt < 8; nt++) {
            for (int i = 0; i < 4; i++) {
                int r = i / 2, j = 8 * nt + 2 * t4 + i % 2, t = start + j;
                bool visible = !needs_mask || (t >= keys.row(r) && t < T &&
                                               (keys.doc_row == nullptr || tiles.doc_s[j] == keys.doc(r)));
                float p = visible ? exp2f(s[nt][i] * score_scale - tiles.lse_s[j]) : 0.0f;
                s[nt][i] = p;
                dp[nt][i] = p * (dp[nt][i] - tiles.D_s[j]);  // dS^T
            }
        }
        flash_accumulate<HD>(dv_acc, s, tiles.do_s, lane);  // dV += P^T dO
        flash_accumulate<HD>(dk_acc, dp, tiles.q_s, lane);  // dK += dS^T Q
    }
    cp_async_wait_all();  // (nothing is in flight here unless the block had no visible tile)

    float scale = 1.0f / sqrtf((float)hd);
    float dk_scales[2] = {scale, scale}, dv_scales[2] = {1.0f, 1.0f};
    flash_store_rows<HD>(dk, dk_acc, keys, dk_scales, kv_head, T, Hkv, hd);
    flash_store_rows<HD>(dv, dv_acc, keys, dv_scales, kv_head, T, Hkv, hd);
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

// The most shared memory a block of the three kernels needs at head dim hd (flash_supports):
// what the device must allow (cudaDevAttrMaxSharedMemoryPerBlockOptin) for them to run.
// HD 128: 105,984 B (the dk/dv kernel), over the 101,376 of sm_86, sm_89 and sm_120.
inline size_t flash_shared_bytes(int hd) {
    size_t bytes = 0;
    flash_dispatch_head_dim(hd, [&](auto head_dim) {
        constexpr int HD = decltype(head_dim)::value;
        bytes = std::max({FlashForwardSmem<HD>::bytes, FlashDqSmem<HD>::bytes, FlashDkdvSmem<HD>::bytes});
    });
    return bytes;
}

// The tensors and shapes of llmc/kernels/attention.cuh's entry points (t.stats: the lse).
inline void attention_forward_tc(const AttnShape& s, const AttnTensorsOf<flash_bf16>& t, cudaStream_t stream) {
    flash_dispatch_head_dim(s.hd, [&](auto head_dim) {
        constexpr int HD = decltype(head_dim)::value;
        constexpr size_t shared = FlashForwardSmem<HD>::bytes;
        flash_allow_shared(attention_forward_tc_kernel<HD>, shared);
        dim3 grid(CEIL_DIV(s.T, kFlashRows), s.Hq, s.B);
        LAUNCH(grid, kFlashThreads, shared, stream, attention_forward_tc_kernel<HD>)(t.out, t.stats, t.q, t.k, t.v,
                                                                                    s.doc_ids, s.T, s.Hq, s.Hkv, s.hd);
    });
    cudaCheckLaunch();
}

// g.scratch: D, B*Hq*T floats (written by the dq kernel, read by the dk/dv kernel)
inline void attention_backward_tc(const AttnShape& s, const AttnTensorsOf<flash_bf16>& t,
                                  const AttnGradsOf<flash_bf16>& g, cudaStream_t stream) {
    flash_dispatch_head_dim(s.hd, [&](auto head_dim) {
        constexpr int HD = decltype(head_dim)::value;
        constexpr size_t shared_dq = FlashDqSmem<HD>::bytes;
        flash_allow_shared(attention_backward_dq_tc_kernel<HD>, shared_dq);
        dim3 grid_dq(CEIL_DIV(s.T, kFlashRows), s.Hq, s.B);
        LAUNCH(grid_dq, kFlashThreads, shared_dq, stream, attention_backward_dq_tc_kernel<HD>)(
            g.dq, g.scratch, g.dout, t.out, t.q, t.k, t.v, t.stats, s.doc_ids, s.T, s.Hq, s.Hkv, s.hd);
        cudaCheckLaunch();
        constexpr size_t shared_dkdv = FlashDkdvSmem<HD>::bytes;
        flash_allow_shared(attention_backward_dkdv_tc_kernel<HD>, shared_dkdv);
        dim3 grid_dkdv(CEIL_DIV(s.T, kFlashRows), s.Hkv, s.B);
        LAUNCH(grid_dkdv, kFlashThreads, shared_dkdv, stream, attention_backward_dkdv_tc_kernel<HD>)(
            g.dk, g.dv, g.scratch, g.dout, t.q, t.k, t.v, t.stats, s.doc_ids, s.T, s.Hq, s.Hkv, s.hd);
    });
    cudaCheckLaunch();
}
