/*
Causal grouped-query attention with an optional same-document mask, forward and backward,
flash-attention style: memory O(T) per head, no T x T matrix is ever stored. These scalar
kernels are the exact reference (fp32 builds, other head dims, the host backend by default);
bf16 builds take llmc/kernels/attention_tc.cuh where they can ("which kernel runs", below).
    q: (B, T, Hq, hd)   k, v: (B, T, Hkv, hd)   out: (B, T, Hq, hd)   all floatX, row-major
    lse: (B, Hq, T) float: natural-log logsumexp of each query row's scaled scores
Query head h uses kv head j = h / (Hq / Hkv). For a query row t:
    s[tau]  = q[t] . k[tau] / sqrt(hd)        for the visible tau, -inf elsewhere
    visible = tau <= t and (doc_ids == nullptr or doc_ids[b*T + tau] == doc_ids[b*T + t])
    out[t]  = sum_tau softmax(s)[tau] v[tau],   lse[t] = log sum_tau exp(s[tau])
Every row sees itself (no softmax row is empty); document ids are only compared for equality
(they need not be sorted).
Backward (gradients are overwritten, not accumulated), with P = exp(s - lse):
    D[t] = dout[t] . out[t]  (in `scratch`),   dS[t,tau] = P[t,tau] (dout[t] . v[tau] - D[t])
    dq[t] = sum_tau dS[t,tau] k[tau] / sqrt(hd)
    dk[tau], dv[tau] = sum over the query heads of its group of sum_t dS[t,tau] q[t] / sqrt(hd),
                       resp. sum_t P[t,tau] dout[t]
Layout: one thread per row, kAttnRows = 64 rows of one (batch, head) per block, walking tiles
of kAttnTile = 64 rows of the other operand loaded into shared memory (as float); each thread's
row vectors and accumulators are HD-arrays in registers (HD = hd rounded up to 8/16/32/64/128,
the padding lanes zero). Per kernel: the comment above it. No atomics: bit-reproducible.
Cost: per 64 x 64 tile, two barriers (host backend: two fiber switches per thread) against
~64 x hd x 4 flops per thread; 3-4 HD-arrays per thread in the backward; hd 128 needs 64 KiB
of shared memory. Registers, spills, times: doc/san-model.md "Attention kernels".
*/
#pragma once

#include <cmath>
#include <cstdio>
#include <string>
#include <type_traits>

#include "llmc/kernels/align.h"
#include "llmc/kernels/attention_cudnn.cuh"
#include "llmc/kernels/attention_shape.h"  // defines: AttnShape, AttnTensors, AttnGrads
#include "llmc/kernels/attention_tc.cuh"
#include "llmc/cuda_common.h"
#include "llmc/kernels/head_dim.h"


constexpr int kAttnRows = 64;  // rows (threads) per block
constexpr int kAttnTile = 64;  // rows of the other operand per shared-memory tile

// Dot product of two HD-vectors with 8 independent partial sums (vectorises on the host,
// gives instruction-level parallelism on the GPU); the order is fixed.
template <int HD>
__device__ __forceinline__ float attn_dot(const float* a, const float* b) {
    constexpr int W = HD < 8 ? HD : 8;
    float part[W];
    for (int i = 0; i < W; i++) { part[i] = 0.0f; }
#pragma unroll
    for (int e = 0; e < HD; e += W) {
        for (int i = 0; i < W; i++) { part[i] += a[e + i] * b[e + i]; }
    }
    float s = 0.0f;
    for (int i = 0; i < W; i++) { s += part[i]; }
    return s;
}

// Loads row `row` (clamped into range by the caller) of a (B, T, H, hd) tensor into an
// HD-array of floats times `scale`, zero beyond hd.
template <int HD>
__device__ __forceinline__ void attn_load_row(float* dst, const floatX* src, int b, int row, int head, int T, int H,
                                              int hd, float scale = 1.0f) {
    const floatX* p = src + (((size_t)b * T + row) * H + head) * hd;
#pragma unroll
    for (int e = 0; e < HD; e++) { dst[e] = e < hd ? to_float(p[e]) * scale : 0.0f; }
}

// Cooperative load of rows [start, start + Tile) of head `head` of a (B, T, H, hd)
// tensor into a [Tile][HD] float tile; rows past T and lanes past hd are zero.
template <int HD, int Tile>
__device__ __forceinline__ void attn_load_tile(float* tile, const floatX* src, int b, int start, int head, int T,
                                               int H, int hd, float scale = 1.0f) {
    for (int i = threadIdx.x; i < Tile * HD; i += blockDim.x) {
        int r = i / HD, e = i % HD;
        int row = start + r;
        tile[i] = (row < T && e < hd) ? to_float(src[(((size_t)b * T + row) * H + head) * hd + e]) * scale : 0.0f;
    }
}

// The query-side kernels' key tile: K, V (float) and the document ids of keys
// start .. start + Tile - 1 into shared memory, between two block barriers (the first
// one also means the previous tile is consumed). Returns false, after the first barrier
// only, when no row of the block sees any key of the tile (other documents): the block
// skips it. Every thread of the block calls it, so the result is the same for all.
template <int HD, int Tile>
__device__ inline bool attn_load_key_tile(float* k_tile, float* v_tile, int* doc_tile, const floatX* k, const floatX* v,
                                          const int* doc_row, int b, int start, int kv_head, int T, int Hkv, int hd,
                                          bool active, int t, int my_doc) {
    if (doc_row != nullptr) {
        bool sees = active && query_sees_key_tile(doc_row, start, Tile, t, T, my_doc);
        if (!__syncthreads_or(sees)) { return false; }
    } else {
        __syncthreads();
    }
    attn_load_tile<HD, Tile>(k_tile, k, b, start, kv_head, T, Hkv, hd);
    attn_load_tile<HD, Tile>(v_tile, v, b, start, kv_head, T, Hkv, hd);
    if (threadIdx.x < Tile) {
        int tau = start + threadIdx.x;
        doc_tile[threadIdx.x] = (doc_row != nullptr && tau < T) ? doc_row[tau] : 0;
    }
    __syncthreads();
    return true;
}

// ----------------------------------------------------------------------------------------
// forward

// Grid (T/64, Hq, B), threads own query rows: online softmax over key tiles 0 .. the block's
// last row (tiles in the future are never loaded). Each tile is loaded cooperatively, with one
// barrier before and one after the load; with doc_ids, a tile that no row of the block can see
// (another document) is skipped before it is loaded (__syncthreads_or over the rows' checks;
// the same in both backward kernels). exp is kernel_expf (llmc/cuda_common.h), inlined, where
// libm's expf had taken about half these kernels' time on the host (built with O3: Makefile).
template <int HD, int Tile>
__global__ void __launch_bounds__(kAttnRows)
    attention_forward_kernel(floatX* out, float* lse, const floatX* q, const floatX* k, const floatX* v,
                             const int* doc_ids, int T, int Hq, int Hkv, int hd) {
    float* k_tile = dynamic_shared_memory<float>();  // [Tile][HD]
    float* v_tile = k_tile + Tile * HD;              // [Tile][HD]
    int* doc_tile = reinterpret_cast<int*>(v_tile + Tile * HD);

    int row_block = gridDim.x - 1 - blockIdx.x;  // the longest rows (latest queries) first
    int h = blockIdx.y, b = blockIdx.z;
    int kv_head = h / (Hq / Hkv);
    int t = row_block * kAttnRows + threadIdx.x;
    bool active = t < T;  // inactive threads still help with loads and barriers
    int row = active ? t : T - 1;
    const int* doc_row = doc_ids != nullptr ? doc_ids + (size_t)b * T : nullptr;
    int my_doc = doc_row != nullptr ? doc_row[row] : 0;

    float q_row[HD], acc[HD];
    attn_load_row<HD>(q_row, q, b, row, h, T, Hq, hd, 1.0f / sqrtf((float)hd));
    for (int e = 0; e < HD; e++) { acc[e] = 0.0f; }
    float running_max = -INFINITY, running_sum = 0.0f;

    int last_row = min(T, (row_block + 1) * kAttnRows) - 1;
    for (int start = 0; start <= last_row; start += Tile) {
        if (!attn_load_key_tile<HD, Tile>(k_tile, v_tile, doc_tile, k, v, doc_row, b, start, kv_head, T, Hkv, hd, active, t,
                                    my_doc)) {
            continue;
        }
        if (!active) { continue; }
        int n = min(Tile, t - start + 1);  // causal: keys start .. t
        for (int j = 0; j < n; j++) {
            if (doc_row != nullptr && doc_tile[j] != my_doc) { continue; }
            float s = attn_dot<HD>(q_row, k_tile + j * HD);
            if (s > running_max) {  // new maximum: rescale what was accumulated so far
                float correction = kernel_expf(running_max - s);
                running_sum *= correction;
                for (int e = 0; e < HD; e++) { acc[e] *= correction; }
                running_max = s;
            }
            float p = kernel_expf(s - running_max);
            running_sum += p;
            const float* v_j = v_tile + j * HD;
            for (int e = 0; e < HD; e++) { acc[e] += p * v_j[e]; }
        }
    }
    if (!active) { return; }
    float inv_sum = 1.0f / running_sum;
    floatX* out_row = out + (((size_t)b * T + t) * Hq + h) * hd;
    for (int e = 0; e < HD; e++) {
        if (e < hd) { out_row[e] = from_float<floatX>(acc[e] * inv_sum); }
    }
    lse[((size_t)b * Hq + h) * T + t] = running_max + logf(running_sum);
}

// ----------------------------------------------------------------------------------------
// backward, kernel 1: D = rowsum(dout * out) and dq, one thread per query row

// The forward's layout; computes D (written to scratch: attention_backward_scratch_floats) and
// dq, recomputing P from lse.
template <int HD, int Tile>
__global__ void __launch_bounds__(kAttnRows)
    attention_backward_dq_kernel(floatX* dq, float* D, const floatX* dout, const floatX* out, const floatX* q,
                                 const floatX* k, const floatX* v, const float* lse, const int* doc_ids, int T,
                                 int Hq, int Hkv, int hd) {
    float* k_tile = dynamic_shared_memory<float>();  // [Tile][HD]
    float* v_tile = k_tile + Tile * HD;              // [Tile][HD]
    int* doc_tile = reinterpret_cast<int*>(v_tile + Tile * HD);

    int row_block = gridDim.x - 1 - blockIdx.x;
    int h = blockIdx.y, b = blockIdx.z;
    int kv_head = h / (Hq / Hkv);
    int t = row_block * kAttnRows + threadIdx.x;
    bool active = t < T;
    int row = active ? t : T - 1;
    const int* doc_row = doc_ids != nullptr ? doc_ids + (size_t)b * T : nullptr;
    int my_doc = doc_row != nullptr ? doc_row[row] : 0;
    float scale = 1.0f / sqrtf((float)hd);

    float q_row[HD], dout_row[HD], dq_acc[HD];
    attn_load_row<HD>(q_row, q, b, row, h, T, Hq, hd, scale);
    attn_load_row<HD>(dout_row, dout, b, row, h, T, Hq, hd);
    attn_load_row<HD>(dq_acc, out, b, row, h, T, Hq, hd);  // out, briefly
    float row_D = attn_dot<HD>(dout_row, dq_acc);
    for (int e = 0; e < HD; e++) { dq_acc[e] = 0.0f; }
    size_t stat_index = ((size_t)b * Hq + h) * T + row;
    float row_lse = lse[stat_index];

    int last_row = min(T, (row_block + 1) * kAttnRows) - 1;
    for (int start = 0; start <= last_row; start += Tile) {
        if (!attn_load_key_tile<HD, Tile>(k_tile, v_tile, doc_tile, k, v, doc_row, b, start, kv_head, T, Hkv, hd, active, t,
                                    my_doc)) {
            continue;
        }
        if (!active) { continue; }
        int n = min(Tile, t - start + 1);
        for (int j = 0; j < n; j++) {
            if (doc_row != nullptr && doc_tile[j] != my_doc) { continue; }
            const float* k_j = k_tile + j * HD;
            float p = kernel_expf(attn_dot<HD>(q_row, k_j) - row_lse);
            float ds = p * (attn_dot<HD>(dout_row, v_tile + j * HD) - row_D);
            for (int e = 0; e < HD; e++) { dq_acc[e] += ds * k_j[e]; }
        }
    }
    if (!active) { return; }
    D[stat_index] = row_D;
    floatX* dq_row = dq + (((size_t)b * T + t) * Hq + h) * hd;
    for (int e = 0; e < HD; e++) {
        if (e < hd) { dq_row[e] = from_float<floatX>(dq_acc[e] * scale); }
    }
}

// ----------------------------------------------------------------------------------------
// backward, kernel 2: dk and dv, one thread per key row of a kv head

// Grid (T/64, Hkv, B), threads own key rows of kv head j; loops over the query tiles from the
// block's first key onwards, for every query head of j's group. No atomics: every output
// element is written by exactly one thread, in a fixed order, so results are bit-reproducible
// run to run.
template <int HD, int Tile>
__global__ void __launch_bounds__(kAttnRows)
    attention_backward_dkdv_kernel(floatX* dk, floatX* dv, const float* D, const floatX* dout, const floatX* q,
                                   const floatX* k, const floatX* v, const float* lse, const int* doc_ids, int T,
                                   int Hq, int Hkv, int hd) {
    float* q_tile = dynamic_shared_memory<float>();  // [Tile][HD], scaled by 1/sqrt(hd)
    float* dout_tile = q_tile + Tile * HD;           // [Tile][HD]
    float* lse_tile = dout_tile + Tile * HD;         // [Tile]
    float* D_tile = lse_tile + Tile;                 // [Tile]
    int* doc_tile = reinterpret_cast<int*>(D_tile + Tile);

    int kv_head = blockIdx.y, b = blockIdx.z;
    int group = Hq / Hkv;
    int tau = blockIdx.x * kAttnRows + threadIdx.x;
    bool active = tau < T;
    int row = active ? tau : T - 1;
    const int* doc_row = doc_ids != nullptr ? doc_ids + (size_t)b * T : nullptr;
    int my_doc = doc_row != nullptr ? doc_row[row] : 0;
    float scale = 1.0f / sqrtf((float)hd);

    float k_row[HD], v_row[HD], dk_acc[HD], dv_acc[HD];
    attn_load_row<HD>(k_row, k, b, row, kv_head, T, Hkv, hd);
    attn_load_row<HD>(v_row, v, b, row, kv_head, T, Hkv, hd);
    for (int e = 0; e < HD; e++) { dk_acc[e] = 0.0f; dv_acc[e] = 0.0f; }

    int first_row = blockIdx.x * kAttnRows;  // causal: queries before the block see none of it
    for (int h = kv_head * group; h < (kv_head + 1) * group; h++) {
        const float* lse_head = lse + ((size_t)b * Hq + h) * T;
        const float* D_head = D + ((size_t)b * Hq + h) * T;
        for (int start = first_row; start < T; start += Tile) {
            if (doc_row != nullptr) {
                bool seen = active && key_seen_by_query_tile(doc_row, start, Tile, tau, T, my_doc);
                if (!__syncthreads_or(seen)) { continue; }
            } else {
                __syncthreads();
            }
            attn_load_tile<HD, Tile>(q_tile, q, b, start, h, T, Hq, hd, scale);
            attn_load_tile<HD, Tile>(dout_tile, dout, b, start, h, T, Hq, hd);
            if (threadIdx.x < Tile) {
                int t = start + threadIdx.x;
                bool in_range = t < T;
                lse_tile[threadIdx.x] = in_range ? lse_head[t] : 0.0f;
                D_tile[threadIdx.x] = in_range ? D_head[t] : 0.0f;
                doc_tile[threadIdx.x] = (doc_row != nullptr && in_range) ? doc_row[t] : 0;
            }
            __syncthreads();
            if (!active) { continue; }
            int j_end = min(Tile, T - start);
            for (int j = max(0, tau - start); j < j_end; j++) {  // causal: queries t >= tau
                if (doc_row != nullptr && doc_tile[j] != my_doc) { continue; }
                const float* q_j = q_tile + j * HD;
                const float* dout_j = dout_tile + j * HD;
                float p = kernel_expf(attn_dot<HD>(q_j, k_row) - lse_tile[j]);
                float ds = p * (attn_dot<HD>(dout_j, v_row) - D_tile[j]);
                for (int e = 0; e < HD; e++) {
                    dv_acc[e] += p * dout_j[e];
                    dk_acc[e] += ds * q_j[e];  // q_j carries the 1/sqrt(hd)
                }
            }
        }
    }
    if (!active) { return; }
    floatX* dk_row = dk + (((size_t)b * T + tau) * Hkv + kv_head) * hd;
    floatX* dv_row = dv + (((size_t)b * T + tau) * Hkv + kv_head) * hd;
    for (int e = 0; e < HD; e++) {
        if (e < hd) {
            dk_row[e] = from_float<floatX>(dk_acc[e]);
            dv_row[e] = from_float<floatX>(dv_acc[e]);
        }
    }
}


// ----------------------------------------------------------------------------------------
// launchers

// Calls f(std::integral_constant<int, HD>) with HD = hd rounded up to 8, 16, 32, 64 or 128.
template <typename F>
void attention_dispatch_head_dim(int hd, F f) {
    dispatch_head_dim<8>(hd, f);
}

inline void attention_check_shapes(const char* who, const AttnShape& s) {
    if (s.B < 1 || s.T < 1 || s.Hq < 1 || s.Hkv < 1 || s.Hq % s.Hkv != 0 || s.hd < 2 || s.hd > 128 || s.hd % 2 != 0 ||
        s.Hq > 65535 || s.B > 65535) {
        fprintf(stderr, "%s: unsupported shape B=%d T=%d Hq=%d Hkv=%d hd=%d (need Hq %% Hkv == 0, even hd <= 128)\n",
                who, s.B, s.T, s.Hq, s.Hkv, s.hd);
        exit(EXIT_FAILURE);
    }
}

// Raises the kernel's dynamic shared memory limit when it needs more than the default 48 KiB
// (hd 128: 64 KiB per block).
template <typename Kernel>
void attention_allow_shared(Kernel* kernel, size_t bytes) {
    if (bytes > 48 * 1024) {
        cudaCheck(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
    }
}

// The device's limits that decide which attention kernels can run on it, read once: its compute
// capability and that of the code running on it (the tensor-core kernels' bf16 mma.sync needs
// sm_80 on both: llmc/card_check.h) and the shared memory a block may opt in to (99 KiB on sm_86,
// sm_89 and sm_120, 64 KiB on sm_75). The host backend reports those of the device
// HOSTCUDA_DEVICE names and a build for HOSTCUDA_GPU_ARCHS (llmc/hostcuda/emulated_device.h).
struct AttentionDevice {
    int arch;             // 10 x major + minor
    int code_arch;        // what the code that runs on it was compiled for (<= arch)
    size_t shared_optin;  // bytes per block
};
inline const AttentionDevice& attention_device() {
    static const AttentionDevice device = [] {
        card_check_once();
        int id = 0, optin = 0;
        cudaCheck(cudaGetDevice(&id));
        cudaCheck(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, id));
        return AttentionDevice{card_facts().device_arch, card_code_arch(), (size_t)optin};
    }();
    return device;
}

// Shared memory of the scalar kernels with tiles of `tile` rows: the query-side kernels
// (forward, dq: K and V tiles, document ids) and the key-side one (dk/dv: q and dout tiles,
// lse, D, document ids).
constexpr size_t attn_query_side_shared(int hd, int tile) { return (2 * (size_t)tile * hd + tile) * sizeof(float); }
constexpr size_t attn_key_side_shared(int hd, int tile) { return (2 * (size_t)tile * hd + 3 * tile) * sizeof(float); }

// Calls f(std::integral_constant<int, Tile>): kAttnTile rows where the device allows the
// kernels' shared memory, else half as many (HD 128 on sm_75, whose 64 KiB per block are 768 B
// short of the 64-row dk/dv kernel's need). Same results bit for bit (each thread still visits
// its keys or queries in order), twice the barriers.
template <int HD, typename F>
void attention_dispatch_tile(F f) {
    if constexpr (attn_key_side_shared(HD, kAttnTile) > 48 * 1024) {
        if (attn_key_side_shared(HD, kAttnTile) > attention_device().shared_optin) {
            f(std::integral_constant<int, kAttnTile / 2>{});
            return;
        }
    }
    f(std::integral_constant<int, kAttnTile>{});
}

// The scalar kernels (the exact reference; the tensors of AttnShape / AttnTensors).
inline void attention_forward_scalar(const AttnShape& s, const AttnTensors& t, cudaStream_t stream) {
    attention_check_shapes("attention_forward", s);
    attention_dispatch_head_dim(s.hd, [&](auto head_dim) {
        constexpr int HD = decltype(head_dim)::value;
        attention_dispatch_tile<HD>([&](auto tile) {
            constexpr int Tile = decltype(tile)::value;
            constexpr size_t shared = attn_query_side_shared(HD, Tile);
            attention_allow_shared(attention_forward_kernel<HD, Tile>, shared);
            dim3 grid(CEIL_DIV(s.T, kAttnRows), s.Hq, s.B);
            LAUNCH(grid, kAttnRows, shared, stream, attention_forward_kernel<HD, Tile>)(
                t.out, t.stats, t.q, t.k, t.v, s.doc_ids, s.T, s.Hq, s.Hkv, s.hd);
        });
    });
    cudaCheckLaunch();
}

// Gradients, OVERWRITTEN (not accumulated); g.scratch: at least B*Hq*T floats (holds
// D = rowsum(dout * out)).
inline void attention_backward_scalar(const AttnShape& s, const AttnTensors& t, const AttnGrads& g,
                                      cudaStream_t stream) {
    attention_check_shapes("attention_backward", s);
    attention_dispatch_head_dim(s.hd, [&](auto head_dim) {
        constexpr int HD = decltype(head_dim)::value;
        attention_dispatch_tile<HD>([&](auto tile) {
            constexpr int Tile = decltype(tile)::value;
            constexpr size_t shared_dq = attn_query_side_shared(HD, Tile);
            attention_allow_shared(attention_backward_dq_kernel<HD, Tile>, shared_dq);
            dim3 grid_dq(CEIL_DIV(s.T, kAttnRows), s.Hq, s.B);
            LAUNCH(grid_dq, kAttnRows, shared_dq, stream, attention_backward_dq_kernel<HD, Tile>)(
                g.dq, g.scratch, g.dout, t.out, t.q, t.k, t.v, t.stats, s.doc_ids, s.T, s.Hq, s.Hkv, s.hd);
            cudaCheckLaunch();
            constexpr size_t shared_dkdv = attn_key_side_shared(HD, Tile);
            attention_allow_shared(attention_backward_dkdv_kernel<HD, Tile>, shared_dkdv);
            dim3 grid_dkdv(CEIL_DIV(s.T, kAttnRows), s.Hkv, s.B);
            LAUNCH(grid_dkdv, kAttnRows, shared_dkdv, stream, attention_backward_dkdv_kernel<HD, Tile>)(
                g.dk, g.dv, g.scratch, g.dout, t.q, t.k, t.v, t.stats, s.doc_ids, s.T, s.Hq, s.Hkv, s.hd);
        });
    });
    cudaCheckLaunch();
}

// ----------------------------------------------------------------------------------------
// which kernel runs: cuDNN's fused attention when the build has it (USE_CUDNN=1), the trainer
// asked for it (--cudnn 1: attention_prefer_cudnn() = true) and the call is one cuDNN takes
// (bf16, no document mask); else the tensor-core kernels (llmc/kernels/attention_tc.cuh) in bf16
// builds when attention_tensor_cores() allows them, hd is a multiple of 16, every pointer is
// 16-byte aligned (their 16-byte copies) and the device has their instructions (sm_80) and
// their shared memory (attention_device()); otherwise the scalar kernels above (always in fp32
// builds: they are the exact reference).

constexpr bool kAttentionHasCudnn =
#if defined(ENABLE_CUDNN) && defined(__CUDACC__)
    PRECISION_MODE == PrecisionMode::BF16;
#else
    false;
#endif

inline bool& attention_prefer_cudnn() {
    static bool prefer = false;
    return prefer;
}

// Whether bf16 calls may take the tensor-core kernels. Default: on a GPU yes; on the host
// backend no, because there every mma.sync and ldmatrix is a warp collective (a fiber switch
// per lane), which made the tensor-core kernels ~6x slower than the scalar ones (demo SAN,
// HOSTCUDA_PROFILE, 2026-12-02). The tests that check the tensor-core kernels on the host
// (test_attention, test_san, test_gpt2) set it; the trainers' --attention-kernels sets it.
inline bool& attention_tensor_cores() {
    static bool use = !HOST_BACKEND;
    return use;
}

// Why this device cannot run the tensor-core kernels at head dim hd (one flash_supports takes);
// nullptr: it can. Worked out once per head dim.
inline const char* attention_tc_device_refusal(int hd) {
    static std::string reasons[129];
    static bool known[129] = {};
    if (!known[hd]) {
        known[hd] = true;
        const AttentionDevice& d = attention_device();
        const size_t needed = flash_shared_bytes(hd);
        char why[200] = "";
        if (d.arch < 80) {
            snprintf(why, sizeof(why), "the device is sm_%d; the tensor-core kernels need sm_80 or newer (bf16 mma.sync)",
                     d.arch);
        } else if (d.code_arch < 80) {
            snprintf(why, sizeof(why),
                     "this build's code for the device (sm_%d) is compute_%d, where the tensor-core kernels are "
                     "trap stubs (bf16 mma.sync needs sm_80 code)", d.arch, d.code_arch);
        } else if (needed > d.shared_optin) {
            snprintf(why, sizeof(why),
                     "the tensor-core kernels need %zu B of shared memory per block; the device (sm_%d) allows %zu",
                     needed, d.arch, d.shared_optin);
        }
        reasons[hd] = why;
    }
    return reasons[hd].empty() ? nullptr : reasons[hd].c_str();
}

// Why a bf16 call the tensor-core kernels were asked for cannot take them; nullptr: it can.
inline const char* attention_tc_refusal(int hd, std::initializer_list<const void*> pointers) {
    if (!flash_supports(hd)) { return "the head dimension is not a multiple of 16 in [16, 128]"; }
    if (const char* why = attention_tc_device_refusal(hd)) { return why; }
    if (!aligned16(pointers)) { return "a tensor is not 16-byte aligned"; }
    return nullptr;
}

// How many times a call fell back from the tensor-core kernels to the scalar ones, and the
// one note that says so (stderr, the first time): a run that was meant to be fast must not be
// slow without a word. At hd 128 the scalar kernels spill 6-8.5 KB per thread (ptxas, sm_90).
inline long& attention_tc_fallbacks() {
    static long n = 0;
    return n;
}
inline void attention_note_fallback(const char* why, int hd) {
    if (attention_tc_fallbacks()++ == 0) {
        fprintf(stderr,
                "attention: falling back to the scalar kernels (%s; hd %d): they are correct but several times "
                "slower on a GPU; noted once\n", why, hd);
    }
}

inline bool attention_uses_tensor_cores(int hd, std::initializer_list<const void*> pointers) {
    if (PRECISION_MODE != PrecisionMode::BF16 || !attention_tensor_cores()) { return false; }
    const char* why = attention_tc_refusal(hd, pointers);
    if (why != nullptr) { attention_note_fallback(why, hd); }
    return why == nullptr;
}

// The kernels a trainer's calls of head dim hd take, for the banner and the log: "cudnn"
// (asked for, built, and a call cuDNN takes: no document mask), "tensor-cores" or "scalar".
// When the tensor-core kernels were asked for and this device or head dim refuses them, the
// fallback's note is given here, at start. (The trainers refuse --cudnn 1 with a document mask.)
inline const char* attention_kernels_for(int hd, bool doc_mask) {
    if (kAttentionHasCudnn && attention_prefer_cudnn() && !doc_mask && hd % 8 == 0) { return "cudnn"; }
    if (PRECISION_MODE != PrecisionMode::BF16 || !attention_tensor_cores()) { return "scalar"; }
    const char* why = attention_tc_refusal(hd, {});
    if (why != nullptr) { attention_note_fallback(why, hd); }
    return why == nullptr ? "tensor-cores" : "scalar";
}

// Run the tensor-core kernels when they apply; false: the caller runs the scalar ones. Templates,
// so that fp32 builds (T = float) never instantiate the bf16-only kernels.
template <typename T>
bool attention_forward_try_tc(const AttnShape& s, const AttnTensorsOf<T>& t, cudaStream_t stream) {
    if constexpr (std::is_same<T, __nv_bfloat16>::value) {
        if (attention_uses_tensor_cores(s.hd, {t.out, t.q, t.k, t.v})) {
            attention_forward_tc(s, t, stream);
            return true;
        }
    }
    return false;
}
template <typename T>
bool attention_backward_try_tc(const AttnShape& s, const AttnTensorsOf<T>& t, const AttnGradsOf<T>& g,
                               cudaStream_t stream) {
    if constexpr (std::is_same<T, __nv_bfloat16>::value) {
        if (attention_uses_tensor_cores(s.hd, {g.dq, g.dk, g.dv, g.dout, t.out, t.q, t.k, t.v})) {
            attention_backward_tc(s, t, g, stream);
            return true;
        }
    }
    return false;
}

// The public entry points: one call = a shape, its tensors (and for backward the gradients).
// out, lse: written; q, k, v: read. Every row sees at least itself, so no row is empty.
inline void attention_forward(const AttnShape& s, const AttnTensors& t, cudaStream_t stream) {
    attention_check_shapes("attention_forward", s);
#if defined(ENABLE_CUDNN) && defined(__CUDACC__)
    if (attention_prefer_cudnn() && attention_cudnn_supports(s.doc_ids, s.hd) && attention_forward_cudnn(s, t, stream)) {
        return;
    }
#endif
    if (attention_forward_try_tc(s, t, stream)) { return; }
    attention_forward_scalar(s, t, stream);
}

// The floats of fp32 scratch attention_backward needs at this shape: B*Hq*T for D (the scalar
// kernels); in bf16 builds at head dims the tensor-core kernels take, also their dq partial
// sums and turn counts (llmc/kernels/attention_tc.cuh FlashBackwardScratch; about 2x the size of
// dq in bytes), whether or not this run takes them.
inline size_t attention_backward_scratch_floats(int B, int T, int Hq, int hd) {
    size_t floats = (size_t)B * Hq * T;
    if (PRECISION_MODE == PrecisionMode::BF16 && flash_supports(hd)) {
        floats = std::max(floats, flash_backward_scratch_floats(B, T, Hq, hd));
    }
    return floats;
}

// dq, dk, dv: OVERWRITTEN (not accumulated); g.scratch: attention_backward_scratch_floats(B, T,
// Hq, hd) floats, 16-byte aligned, contents ignored; t: the forward's tensors (out and lse as it
// left them).
inline void attention_backward(const AttnShape& s, const AttnTensors& t, const AttnGrads& g, cudaStream_t stream) {
    attention_check_shapes("attention_backward", s);
#if defined(ENABLE_CUDNN) && defined(__CUDACC__)
    if (attention_prefer_cudnn() && attention_cudnn_supports(s.doc_ids, s.hd) && attention_backward_cudnn(s, t, g, stream)) {
        return;
    }
#endif
    if (attention_backward_try_tc(s, t, g, stream)) { return; }
    attention_backward_scalar(s, t, g, stream);
}
