/*
Causal GQA attention with an optional same-document mask on tensor cores: FlashAttention-2
(Dao, 2023) forward and backward, bf16 operands, fp32 accumulation, through llmc/kernels/mma.cuh
(mma.sync m16n8k16, ldmatrix) and llmc/kernels/async_copy.cuh (cp.async). Same maths, shapes and
contract as llmc/kernels/attention.cuh, which dispatches here in bf16 builds:
    q, out, dout, dq: (B, T, Hq, hd)   k, v, dk, dv: (B, T, Hkv, hd)   bf16, row-major
    lse, D: (B, Hq, T) float   doc_ids: (B, T) int or nullptr   16-byte aligned pointers
    hd a multiple of 16 up to 128; HD = hd rounded up to 16/32/64/128 (padding columns zero).
Layout: 4 warps (128 threads) per block, 64 rows of the operand the block owns, warp w rows
16w .. 16w+15 (one m16 tile); the other operand streams through shared memory in [64][HD + 8]
tiles, cp.async into two buffers so the next copy overlaps this tile's mma (FlashTileStream).
- attention_forward_tc_kernel: grid (ceil(T/64), Hq, B), latest queries first; per K/V tile
  S = Q K^T, online softmax (exp2) in the fragments, O += P V; lse in natural log.
- attention_backward_prep_tc_kernel: one warp per (b, t, h): D[t] = dout[t] . out[t].
- attention_backward_tc_kernel: grid (ceil(T/64), Hkv, B), a block owns 64 keys of a kv head
  and walks its group's query tiles from its diagonal on, 5 products per tile: S^T = K Q^T,
  P^T = exp2(S^T scale - lse), dP^T = V dO^T, dS^T = P^T (dP^T - D), dV += P^T dO,
  dK += dS^T Q, and dQ = dS K added to fp32 partial sums in a fixed order (no atomics on the
  data: bit-reproducible; the turns, above flash_wait_for_turn).
Rounding: P and dS are rounded to bf16 for their products, as in FlashAttention-2: an element
may move by 2^-8 of the sum of |its terms| (dev/test/test_attention.cu checks that bound).
Cost: per 64 x 64 tile and warp, 2 x 8 x HD/16 mma per product (16 x 64 x HD); forward 2
products, backward 5 (2.5x), plus the dq partial sums ((B, T, Hq, hd) fp32, mostly in L2).
Shared memory at HD 64 / 128: forward 45 / 85 KiB, backward 64.5 / 112.5 KiB (FlashForwardSmem,
FlashBackwardSmem).
Design and history, registers, spills: doc/gpu-runs/attention-backward-fa2.md; measured errors,
the GPU status: doc/san-model.md "Attention kernels"; the host backend's mma: doc/host-backend.md.
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
constexpr int kFlashDsStride = kFlashTile + 8;  // row stride (elements) of the backward's shared dS^T tile

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

// bytes of a shared [rows][HD + 8] bf16 tile. The 8-element pad shifts consecutive rows by 4
// banks, so the 8 row reads of an ldmatrix hit distinct banks.
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
    // the tile made current by next(): its shared copies
    int index = 0, start = 0;  // its index among the stream's tiles, its first query
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
        index = tile;
        start = tile_start(tile);
        q_s = q_buf + tile_buf * kTile;
        do_s = do_buf + tile_buf * kTile;
        lse_s = lse_buf + tile_buf * kFlashTile;
        D_s = D_buf + tile_buf * kFlashTile;
        doc_s = doc_buf + tile_buf * kFlashTile;
        return true;
    }
};

// The kernels' layouts (double-buffered tiles). forward: the block's queries, then the K/V
// tiles: (64 + 4 x 64) (HD + 8) bf16, 45 KiB at HD 64, 85 KiB at 128.
template <int HD>
struct FlashForwardSmem {
    static constexpr size_t q = 0;                                     // [kFlashRows][HD + 8] bf16
    static constexpr size_t keys = q + flash_tile_bytes<HD>(kFlashRows);  // FlashKeyTiles<HD>
    static constexpr size_t bytes = keys + FlashKeyTiles<HD>::kSmemBytes;
};

// backward kernel: the block's keys and values, its dS^T tile, then the query tiles:
// 6 x 64 (HD + 8) bf16 + 64 x 72 bf16 + 1.5 KiB, 64.5 KiB at HD 64, 112.5 KiB at 128.
template <int HD>
struct FlashBackwardSmem {
    static constexpr size_t k = 0;                                          // [kFlashRows][HD + 8] bf16
    static constexpr size_t v = k + flash_tile_bytes<HD>(kFlashRows);          // [kFlashRows][HD + 8] bf16
    static constexpr size_t ds = v + flash_tile_bytes<HD>(kFlashRows);         // [kFlashRows][kFlashTile + 8] bf16
    static constexpr size_t queries = ds + (size_t)kFlashRows * kFlashDsStride * sizeof(flash_bf16);  // FlashQueryTiles<HD>
    static constexpr size_t bytes = queries + FlashQueryTiles<HD>::kSmemBytes;
};

// Fragment facts used throughout (llmc/kernels/mma.cuh): a row of a 16x8 accumulator lives in
// the 4 lanes of a lane group; the accumulators of two adjacent n8 tiles, rounded to bf16, are
// exactly the A fragment of one k16 step, so probabilities never leave the registers; a tile
// stored [n][k] ([key][d]) is a B operand through ldmatrix, one stored [k][n] through
// ldmatrix.trans. A and B fragments are read from shared memory with ldmatrix where they are
// used (not kept in registers), which keeps the backward kernel's registers for its
// accumulators. On the host backend every mma/ldmatrix is a warp collective (doc/host-backend.md).

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

// acc (16 x HD) += X B as flash_accumulate, with X (16 x 64) read from shared memory: the warp's
// 16 rows of a [.][kFlashDsStride] bf16 tile (x_rows points at its first row).
template <int HD>
__device__ __forceinline__ void flash_accumulate_shared(float acc[HD / 8][4], const flash_bf16* x_rows,
                                                        const flash_bf16* b_tile, int lane) {
    constexpr int S = HD + 8;
    for (int p = 0; p < 4; p++) {
        uint32_t a[4];
        ldmatrix_x4(a, x_rows + (lane % 16) * kFlashDsStride + 16 * p + 8 * (lane / 16));
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

// Per K/V tile: S = Q K^T, scaled by log2(e)/sqrt(hd), masked, online softmax (exp2) in the
// fragments, O += P V; lse written in natural log. Tiles wholly in the future are never
// visited; tiles that no row of the block can see (other documents) are skipped after a
// __syncthreads_or; edge tiles are masked (the same in the backward).
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
// backward: D = rowsum(dout * out), then dq, dk and dv in one pass over the key blocks

// The backward's fp32 scratch (floats from g.scratch): D, (B, Hq, T); the dq turn counts,
// (B, Hq, ceil(T / 64)) ints; the dq partial sums, (B, T, Hq, hd) floats. Each part starts
// 16-byte aligned.
struct FlashBackwardScratch {
    size_t count_offset, accum_offset, floats;
    FlashBackwardScratch(int B, int T, int Hq, int hd) {
        auto round4 = [](size_t n) { return (n + 3) / 4 * 4; };
        count_offset = round4((size_t)B * Hq * T);  // the turn counts, then the ticket counter
        accum_offset = count_offset + round4((size_t)B * Hq * CEIL_DIV(T, kFlashTile) + 1);
        floats = accum_offset + (size_t)B * T * Hq * hd;
    }
};

// D[b, h, t] = dout[b, t, h] . out[b, t, h] in fp32, one warp per row; also zeroes the n_counts
// ints of the dq turn counts and the ticket counter (n_counts <= rows + 1 < the grid's threads).
__global__ void __launch_bounds__(kFlashThreads)
    attention_backward_prep_tc_kernel(float* D, int* turn_counts, int n_counts, const flash_bf16* dout,
                                      const flash_bf16* out, int B, int T, int Hq, int hd) {
    const size_t thread = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    const size_t row = thread / 32;  // (b * T + t) * Hq + h
    const int lane = threadIdx.x % 32;
    if (row < (size_t)B * T * Hq) {  // warp-uniform
        const __nv_bfloat162* o = reinterpret_cast<const __nv_bfloat162*>(out + (size_t)row * hd);
        const __nv_bfloat162* d = reinterpret_cast<const __nv_bfloat162*>(dout + (size_t)row * hd);
        float sum = 0.0f;
        for (int e = lane; e < hd / 2; e += 32) {
            sum += __bfloat162float(d[e].x) * __bfloat162float(o[e].x) +
                   __bfloat162float(d[e].y) * __bfloat162float(o[e].y);
        }
        for (int offset = 16; offset > 0; offset /= 2) { sum += __shfl_xor_sync(0xffffffffu, sum, offset); }
        if (lane == 0) {
            size_t h = row % Hq, t = (row / Hq) % T, b = row / ((size_t)Hq * T);
            D[((size_t)b * Hq + h) * T + t] = sum;
        }
    }
    if (thread < (size_t)n_counts) { turn_counts[thread] = 0; }
}

// Determinism without atomics on the data (FlashAttention-2 adds dQ with fp32 atomics, whose
// order varies run to run): query tile qt of head h takes the dQ of key blocks qt, qt - 1, ..., 0
// in that order, each waiting until a per-tile count (turn_counts, raised after the previous
// block's partial sums are visible: __threadfence, then the count) says it is its turn. The
// diagonal block writes the partial sums (no memset), key block 0 writes dq. Since every block
// starts at its own diagonal tile and walks up, block j reaches tile qt after blocks qt .. j + 1
// did (in a steady state nobody waits). A block's place in the grid is a ticket drawn when it
// starts (atomicAdd on a counter the prep kernel zeroes), not blockIdx: the blocks it waits for
// hold lower tickets, so they have started and, waiting only on lower tickets themselves,
// finish. (blockIdx would need blocks dispatched in increasing index, which hardware does in
// practice but CUDA does not promise, as in CUB's single-pass scan; not yet run on a GPU.)
// A tile the block does not see (document mask) still takes its turn, adding nothing. Every
// element of dk, dv and dq is written once by one lane, every partial sum in a fixed order, so
// results are bit-reproducible.

// Waits (thread 0 polls, the block's barrier passes it on) until *count == expected. The count
// is raised by other blocks of the same launch (flash_dq_turn_done).
__device__ __forceinline__ void flash_wait_for_turn(const int* count, int expected) {
    if (threadIdx.x == 0) {
        while (*reinterpret_cast<const volatile int*>(count) != expected) {
#if HOST_BACKEND || (defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700)
            __nanosleep(64);
#endif
        }
        __threadfence();  // the earlier blocks' partial sums are read after their count
    }
    __syncthreads();
}
// Publishes the block's writes of its turn, then raises the count.
__device__ __forceinline__ void flash_dq_turn_done(int* count) {
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) { atomicAdd(count, 1); }
}

// This block's turn at query tile `start` (64 queries) of head h: partial = partial + dS K, where
// dS (64 queries x 64 keys) is the block's shared dS^T tile (ds_t, [key][query]) and K its 64
// keys (k_s, [key][HD + 8]); warp w adds the rows of queries start + 16w .. + 15, in chunks of 16
// columns (2 n8 tiles: the dk/dv accumulators stay the only large ones). The first turn (the
// diagonal block) writes the partial sums without reading them; the last (key block 0) writes
// dq = (partial + its own) * scale in bf16 instead. has_ds false: a tile the block does not see
// (document mask): nothing to add, but the last turn still writes dq.
template <int HD>
__device__ __forceinline__ void flash_dq_turn(flash_bf16* dq, float* partial, const flash_bf16* ds_t,
                                              const flash_bf16* k_s, bool has_ds, bool first, bool last, int b,
                                              int start, int h, int T, int Hq, int hd, float scale, int warp,
                                              int lane) {
    constexpr int S = HD + 8;
    if (!has_ds && !last) { return; }
    // A fragments of dS (this warp's 16 queries x 64 keys) from the tile stored [key][query]:
    // matrix m = lane / 8 is keys 16 kc + 8 (m / 2), queries 16 w + 8 (m % 2); re-read for each
    // 16-column chunk rather than held across the chunks
    const int m = lane / 8;
    const flash_bf16* a_rows = ds_t + (8 * (m / 2) + lane % 8) * kFlashDsStride + 16 * warp + 8 * (m % 2);
    const int g = lane / 4, t4 = lane % 4;
    // a chunk or two's loads of the partial sums in flight, not all of them (all unrolled: 240
    // registers at HD 64, ptxas sm_80); by 2 (by 1 at HD 16 kept acc in a stack frame), by 1 at HD
    // 128 (by 2 spilled more on sm_90)
#pragma unroll(HD == 128 ? 1 : 2)
    for (int dp = 0; dp < HD / 16; dp++) {
        float acc[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
        if (has_ds) {
            for (int kc = 0; kc < 4; kc++) {
                uint32_t a[4], bf[4];
                ldmatrix_x4_trans(a, a_rows + 16 * kc * kFlashDsStride);
                ldmatrix_x4_trans(bf, k_s + (16 * kc + lane % 16) * S + 16 * dp + 8 * (lane / 16));
                mma_m16n8k16_bf16(acc[0], a, &bf[0], acc[0]);
                mma_m16n8k16_bf16(acc[1], a, &bf[2], acc[1]);
            }
        }
        for (int n = 0; n < 2; n++) {
            for (int r = 0; r < 2; r++) {
                int row = start + 16 * warp + g + 8 * r, col = 16 * dp + 8 * n + 2 * t4;
                if (row >= T || col >= hd) { continue; }
                size_t at = (((size_t)b * T + row) * Hq + h) * hd + col;
                float2 x = make_float2(acc[n][2 * r], acc[n][2 * r + 1]);
                if (!first) {  // the partial sums of the turns before (L2: written by other blocks)
                    float2 old = __ldcg(reinterpret_cast<const float2*>(partial + at));
                    x.x = old.x + x.x;
                    x.y = old.y + x.y;
                }
                if (last) {
                    *reinterpret_cast<__nv_bfloat162*>(dq + at) = __floats2bfloat162_rn(x.x * scale, x.y * scale);
                } else {
                    __stcg(reinterpret_cast<float2*>(partial + at), x);
                }
            }
        }
    }
}

// The block owns the 64 keys of key block j = gridDim.x - 1 - x (the latest keys first: see the
// turns) of kv head y, batch row z, (x, y, z) its ticket's place in the grid; FlashQueryTiles streams the query tiles of its
// group's heads that see them, from tile j on. Per tile: S^T, dP^T, dS^T in registers, dS^T
// also to shared memory (a [64][72] bf16 tile); dV += P^T dO, dK += dS^T Q; then its dq turn
// (each warp dQ = dS K for 16 of the tile's queries, 16 columns at a time, so no third HD
// accumulator). dk = dK / sqrt(hd), dv = dV; the last block to add to a query tile writes
// dq = sum / sqrt(hd).
template <int HD>
__global__ void __launch_bounds__(kFlashThreads)
    attention_backward_tc_kernel(flash_bf16* dq, flash_bf16* dk, flash_bf16* dv, float* partial, int* turn_counts,
                                 const float* D, const flash_bf16* dout, const flash_bf16* q, const flash_bf16* k,
                                 const flash_bf16* v, const float* lse, const int* doc_ids, int T, int Hq, int Hkv,
                                 int hd) {
    constexpr int S = HD + 8;
    using Smem = FlashBackwardSmem<HD>;
    unsigned char* smem = dynamic_shared_memory<unsigned char>();
    flash_bf16* k_s = flash_shared<flash_bf16, Smem::k>(smem);
    flash_bf16* v_s = flash_shared<flash_bf16, Smem::v>(smem);
    flash_bf16* ds_s = flash_shared<flash_bf16, Smem::ds>(smem);

    // the block's (x, y, z) from its ticket, x fastest (why not blockIdx: above
    // flash_wait_for_turn); the ticket counter follows the B * Hq * n_tiles turn counts
    __shared__ int ticket_s;
    if (threadIdx.x == 0) { ticket_s = atomicAdd(turn_counts + (size_t)gridDim.z * Hq * gridDim.x, 1); }
    __syncthreads();
    const int ticket = ticket_s, block_x = ticket % gridDim.x, block_z = ticket / (gridDim.x * gridDim.y);
    const int kv_head = (ticket / gridDim.x) % gridDim.y, group = Hq / Hkv;
    const int key_block = gridDim.x - 1 - block_x, n_tiles = gridDim.x;
    const FlashLaneRows keys(key_block * kFlashRows, block_z, doc_ids, T);  // this lane's keys: keys.row(0), row(1)
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
    const float score_scale = kLog2e / sqrtf((float)hd), scale = 1.0f / sqrtf((float)hd);

    // The dq turns: query tile qt of head h gets the dS K of key blocks qt, qt - 1, ..., 0 in that
    // order (counted in turn_counts[b, h, qt]), so its sums are the same on every run without
    // atomics on the data. Block j's turn at tile qt comes after blocks qt .. j + 1, which start
    // the tile before it does (each streams its tiles from its own block on), so in a steady
    // state nobody waits; the blocks it waits for hold lower tickets (started first).
    // A tile of the stream the block does not see (document mask) still takes its turn.
    int turns_taken = 0;
    auto take_turn = [&](int i, bool has_ds) {
        int h = kv_head * group + i / tiles.tiles_per_head, start = tiles.tile_start(i), qt = start / kFlashTile;
        int* count = turn_counts + ((size_t)keys.b * Hq + h) * n_tiles + qt;
        bool first = qt == key_block, last = key_block == 0;
        if (!first) { flash_wait_for_turn(count, qt - key_block); }
        flash_dq_turn<HD>(dq, partial, ds_s, k_s, has_ds, first, last, keys.b, start, h, T, Hq, hd, scale, warp, lane);
        if (!last) { flash_dq_turn_done(count); }
    };

    tiles.begin();
    while (tiles.next()) {
        for (; turns_taken < tiles.index; turns_taken++) { take_turn(turns_taken, false); }
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
            // dS^T, rounded to bf16 as the products below take it, to the shared tile for dQ
            flash_bf16* ds_row = ds_s + (16 * warp + lane / 4) * kFlashDsStride + 8 * nt + 2 * t4;
            *reinterpret_cast<uint32_t*>(ds_row) = pack_bf16x2(dp[nt][0], dp[nt][1]);
            *reinterpret_cast<uint32_t*>(ds_row + 8 * kFlashDsStride) = pack_bf16x2(dp[nt][2], dp[nt][3]);
        }
        __syncwarp();  // the warp's own dS^T rows are in ds_s
        // dK += dS^T Q with dS^T from ds_s, so that dp is dead before dV's product (holding s and
        // dp beside dK and dV spilled 92 B at HD 128, ptxas sm_80)
        flash_accumulate_shared<HD>(dk_acc, ds_s + 16 * warp * kFlashDsStride, tiles.q_s, lane);
        flash_accumulate<HD>(dv_acc, s, tiles.do_s, lane);  // dV += P^T dO
        __syncthreads();  // every warp's dS^T rows are in ds_s (read again only after next()'s barrier)
        take_turn(turns_taken++, true);                     // dQ (+)= dS K
    }
    for (; turns_taken < tiles.total; turns_taken++) { take_turn(turns_taken, false); }
    cp_async_wait_all();  // (nothing is in flight here unless the block had no visible tile)

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
// HD 128: 115,200 B (the backward), over the 101,376 of sm_86, sm_89 and sm_120. Above 48 KiB
// the launchers raise the limit; llmc/kernels/attention.cuh (attention_tc_device_refusal)
// refuses a device that lacks sm_80 or this much shared memory.
inline size_t flash_shared_bytes(int hd) {
    size_t bytes = 0;
    flash_dispatch_head_dim(hd, [&](auto head_dim) {
        constexpr int HD = decltype(head_dim)::value;
        bytes = std::max(FlashForwardSmem<HD>::bytes, FlashBackwardSmem<HD>::bytes);
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

// The floats of g.scratch the backward needs (FlashBackwardScratch).
inline size_t flash_backward_scratch_floats(int B, int T, int Hq, int hd) {
    return FlashBackwardScratch(B, T, Hq, hd).floats;
}

// g.scratch: flash_backward_scratch_floats(B, T, Hq, hd) floats, 16-byte aligned; none of it
// needs to be set (the prep kernel zeroes the counts, the first turn writes the partial sums).
inline void attention_backward_tc(const AttnShape& s, const AttnTensorsOf<flash_bf16>& t,
                                  const AttnGradsOf<flash_bf16>& g, cudaStream_t stream) {
    const FlashBackwardScratch layout(s.B, s.T, s.Hq, s.hd);
    float* D = g.scratch;
    int* turn_counts = reinterpret_cast<int*>(g.scratch + layout.count_offset);
    float* partial = g.scratch + layout.accum_offset;
    const int n_tiles = CEIL_DIV(s.T, kFlashTile), rows = s.B * s.T * s.Hq;
    LAUNCH(CEIL_DIV(rows, kFlashWarps), kFlashThreads, 0, stream, attention_backward_prep_tc_kernel)(
        D, turn_counts, s.B * s.Hq * n_tiles + 1, g.dout, t.out, s.B, s.T, s.Hq, s.hd);
    cudaCheckLaunch();
    flash_dispatch_head_dim(s.hd, [&](auto head_dim) {
        constexpr int HD = decltype(head_dim)::value;
        constexpr size_t shared = FlashBackwardSmem<HD>::bytes;
        flash_allow_shared(attention_backward_tc_kernel<HD>, shared);
        dim3 grid(n_tiles, s.Hkv, s.B);
        LAUNCH(grid, kFlashThreads, shared, stream, attention_backward_tc_kernel<HD>)(
            g.dq, g.dk, g.dv, partial, turn_counts, D, g.dout, t.q, t.k, t.v, t.stats, s.doc_ids, s.T, s.Hq, s.Hkv,
            s.hd);
    });
    cudaCheckLaunch();
}
