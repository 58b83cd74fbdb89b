/*
Host backend: the GEMM behind llmc/kernels/gemm.cuh's gemm() (cuBLAS on the GPU), same contract:

    C[b] = alpha * op(A[b]) @ op(B[b]) + beta * C[b]        row-major, fp32 accumulation

    host_gemm(C, A, B, shape, alpha, beta)      shape: llmc/kernels/gemm_shape.h's GemmShape

Two implementations, both spread over the host backend's worker pool (hostcuda::Pool, which
owns the cores) in a fixed partition of C, so results do not depend on HOSTCUDA_THREADS:
- OpenBLAS (built with -DHOSTCUDA_OPENBLAS, which the Makefile sets where libopenblas-dev is
  installed; the default then): C in tiles of kBlasTileRows x kBlasTileCols, each tile one
  single-threaded cblas_sgemm on a worker (bf16 operands converted to fp32 first, bf16 output
  rounded once). Several times faster than our own; its bits depend on the CPU type (its
  kernels are chosen at run time), so it is not the tests' reference.
- gemm_own: our packed GEMM, a 4 x 32 register tile, parallel over column panels and row
  blocks. Portable and the reference dev/test/test_gemm.cu holds OpenBLAS to; the only one
  without OpenBLAS (make HOST_GEMM=own).
HOSTCUDA_GEMM=own|openblas picks one at run time (default: OpenBLAS when built in).
Not safe to call from two host threads at once.
*/
#pragma once

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "../cuda_common.h"
#include "llmc/kernels/gemm_shape.h"  // defines: GemmShape

#if defined(HOSTCUDA_OPENBLAS)
#include <cblas.h>
extern "C" void openblas_set_num_threads(int num_threads);
#endif

namespace hostcuda {

// Tasks per chunk of the pool for a product of `tasks` tasks: all of them on the caller below
// ~1 MFLOP, where waking the pool costs more than it saves; else one at a time.
inline int64_t gemm_chunk(int M, int N, int K, int64_t tasks) { return (int64_t)M * N * K < (1 << 20) ? tasks : 1; }

// ---- our own GEMM ----------------------------------------------------------------------


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

template <typename TIn, typename TOut>
void gemm_own(TOut* C, const TIn* A, const TIn* B, const GemmShape& s, float alpha, float beta) {
    static GemmPacked packed;
    packed.M = s.M;
    packed.N = s.N;
    packed.K = s.K;
    packed.row_blocks = CEIL_DIV(s.M, kTileRows);
    packed.col_panels = CEIL_DIV(s.N, kTileCols);
    int64_t tasks = (int64_t)packed.col_panels * CEIL_DIV(packed.row_blocks, kRowBlocksPerTask);
    for (int b = 0; b < s.batch; b++) {
        pack_a(packed, A + b * s.stride_a, s.trans_a);
        pack_b(packed, B + b * s.stride_b, s.trans_b);
        GemmTask<TOut> task{&packed, C + b * s.stride_c, alpha, beta};
        Pool::instance().parallel_for(tasks, gemm_chunk(s.M, s.N, s.K, tasks), gemm_task<TOut>, &task);
    }
}

// ---- OpenBLAS --------------------------------------------------------------------------
#if defined(HOSTCUDA_OPENBLAS)
constexpr bool kHostGemmHasOpenBlas = true;
// C tile of one task: large enough that OpenBLAS's packing of the tile's operands is a
// small part of its work, small enough that a 1024 x 8192 product keeps every worker busy.
constexpr int kBlasTileRows = 256;
constexpr int kBlasTileCols = 1024;

template <typename TOut>
struct BlasTask {
    TOut* C;
    const float *A, *B;  // op(A) M x K and op(B) K x N as stored (fp32)
    int M, N, K, tiles_n;
    bool trans_a, trans_b;
    float alpha, beta;
};

template <typename TOut>
void blas_task(void* ctx, int64_t task) {
    const BlasTask<TOut>& t = *static_cast<const BlasTask<TOut>*>(ctx);
    int i0 = static_cast<int>(task / t.tiles_n) * kBlasTileRows, j0 = static_cast<int>(task % t.tiles_n) * kBlasTileCols;
    int m = std::min(kBlasTileRows, t.M - i0), n = std::min(kBlasTileCols, t.N - j0);
    // the tile's rows of op(A) and columns of op(B), in place
    const float* a = t.trans_a ? t.A + i0 : t.A + (size_t)i0 * t.K;
    const float* b = t.trans_b ? t.B + (size_t)j0 * t.K : t.B + j0;
    int lda = t.trans_a ? t.M : t.K, ldb = t.trans_b ? t.K : t.N;
    CBLAS_TRANSPOSE op_a = t.trans_a ? CblasTrans : CblasNoTrans, op_b = t.trans_b ? CblasTrans : CblasNoTrans;
    if constexpr (std::is_same<TOut, float>::value) {
        // (beta == 0: OpenBLAS writes C without reading it, as the contract needs)
        cblas_sgemm(CblasRowMajor, op_a, op_b, m, n, t.K, t.alpha, a, lda, b, ldb, t.beta, t.C + (size_t)i0 * t.N + j0,
                    t.N);
    } else {
        static thread_local std::vector<float> tile;
        tile.resize((size_t)m * n);
        cblas_sgemm(CblasRowMajor, op_a, op_b, m, n, t.K, t.alpha, a, lda, b, ldb, 0.0f, tile.data(), n);
        for (int i = 0; i < m; i++) {
            TOut* out = t.C + (size_t)(i0 + i) * t.N + j0;
            const float* in = tile.data() + (size_t)i * n;
            for (int j = 0; j < n; j++) {
                float value = in[j];
                if (t.beta != 0.0f) { value += t.beta * to_float(out[j]); }
                out[j] = from_float<TOut>(value);
            }
        }
    }
}

// x as fp32: itself, or converted into `buffer` (on the pool: a 1024 x 8192 bf16 dlogits
// takes ~8 ms on one core)
template <typename T>
struct ConvertTask {
    float* out;
    const T* in;
    size_t count;
};
constexpr int64_t kConvertChunk = 1 << 16;

template <typename T>
void convert_task(void* ctx, int64_t chunk) {
    const ConvertTask<T>& t = *static_cast<const ConvertTask<T>*>(ctx);
    size_t begin = (size_t)chunk * kConvertChunk, end = std::min(t.count, begin + kConvertChunk);
    for (size_t i = begin; i < end; i++) { t.out[i] = to_float(t.in[i]); }
}

template <typename T>
const float* as_fp32(const T* x, size_t count, std::vector<float>& buffer) {
    if constexpr (std::is_same<T, float>::value) {
        return x;
    } else {
        buffer.resize(count);
        ConvertTask<T> task{buffer.data(), x, count};
        Pool::instance().parallel_for(CEIL_DIV((int64_t)count, kConvertChunk), 1, convert_task<T>, &task);
        return buffer.data();
    }
}

template <typename TIn, typename TOut>
void gemm_openblas(TOut* C, const TIn* A, const TIn* B, const GemmShape& s, float alpha, float beta) {
    static bool single_threaded = [] {
        openblas_set_num_threads(1);  // the pool's workers are the threads
        return true;
    }();
    (void)single_threaded;
    static std::vector<float> a_fp32, b_fp32;
    int tiles_m = CEIL_DIV(s.M, kBlasTileRows), tiles_n = CEIL_DIV(s.N, kBlasTileCols);
    for (int b = 0; b < s.batch; b++) {
        BlasTask<TOut> task{C + b * s.stride_c,
                            as_fp32(A + b * s.stride_a, (size_t)s.M * s.K, a_fp32),
                            as_fp32(B + b * s.stride_b, (size_t)s.K * s.N, b_fp32),
                            s.M, s.N, s.K, tiles_n, s.trans_a, s.trans_b, alpha, beta};
        int64_t tasks = (int64_t)tiles_m * tiles_n;
        Pool::instance().parallel_for(tasks, gemm_chunk(s.M, s.N, s.K, tasks), blas_task<TOut>, &task);
    }
}
#else
constexpr bool kHostGemmHasOpenBlas = false;
#endif

// ---- which one runs --------------------------------------------------------------------

// true: OpenBLAS (the default where the build has it); HOSTCUDA_GEMM=own|openblas overrides.
inline bool& host_gemm_uses_openblas() {
    static bool use = [] {
        const char* env = getenv("HOSTCUDA_GEMM");
        if (env == nullptr || env[0] == '\0') { return kHostGemmHasOpenBlas; }
        if (strcmp(env, "own") == 0) { return false; }
        if (strcmp(env, "openblas") == 0) {
            if (!kHostGemmHasOpenBlas) {
                die("HOSTCUDA_GEMM=openblas: this build has no OpenBLAS (install libopenblas-dev and rebuild)");
            }
            return true;
        }
        die("HOSTCUDA_GEMM='%s': expected 'own' or 'openblas' (or unset)", env);
    }();
    return use;
}

template <typename TIn, typename TOut>
void host_gemm(TOut* C, const TIn* A, const TIn* B, const GemmShape& shape, float alpha, float beta) {
    KernelProfile* profile = KernelProfile::instance();
    auto start = profile != nullptr ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point();
#if defined(HOSTCUDA_OPENBLAS)
    if (host_gemm_uses_openblas()) {
        gemm_openblas(C, A, B, shape, alpha, beta);
    } else
#endif
    {
        gemm_own(C, A, B, shape, alpha, beta);
    }
    if (profile != nullptr) {
        // (one line per transpose case and backend: the profile's rows are the kernels' names)
        static const char* names[2][2][2] = {
            {{"gemm own NN (host)", "gemm own NT (host)"}, {"gemm own TN (host)", "gemm own TT (host)"}},
            {{"gemm OpenBLAS NN (host)", "gemm OpenBLAS NT (host)"}, {"gemm OpenBLAS TN (host)", "gemm OpenBLAS TT (host)"}}};
        profile->add(names[host_gemm_uses_openblas()][shape.trans_a][shape.trans_b],
                     std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
}

}  // namespace hostcuda
