/*
Host backend: the GEMM behind llmc/kernels/gemm.cuh's gemm() (cuBLAS on the GPU), same contract:
C[b] = alpha * op(A[b]) @ op(B[b]) + beta * C[b], row-major, fp32 accumulation; host_gemm(C, A,
B, shape, alpha, beta) with llmc/kernels/gemm_shape.h's GemmShape. oneDNN (the default where the
build has it), OpenBLAS, or our own packed GEMM (gemm_own: the tests' reference and the portable
fallback), each over the worker pool in a fixed partition of C, so results do not depend on
HOSTCUDA_THREADS; HOSTCUDA_GEMM=own|openblas|onednn picks one at run time. Not safe to call from
two host threads at once. Why oneDNN first, the tiles, the tests: doc/host-backend.md, "GEMM".
*/
#pragma once

#include <cctype>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "../cuda_common.h"
#include "cpu_features.h"             // defines: best_cpu_isa, cpu_isa_name
#include "llmc/kernels/gemm_shape.h"  // defines: GemmShape

#if defined(HOSTCUDA_ONEDNN)
#include <dnnl.h>
extern "C" void omp_set_num_threads(int num_threads);
#endif
#if defined(HOSTCUDA_OPENBLAS)
#include <cblas.h>
extern "C" void openblas_set_num_threads(int num_threads);
extern "C" char* openblas_get_corename(void);
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

// ---- a library's GEMM (oneDNN, OpenBLAS), one single-threaded call per tile of C --------
// bf16 operands are converted to fp32 first (on the pool), a bf16 output rounded once.
#if defined(HOSTCUDA_ONEDNN) || defined(HOSTCUDA_OPENBLAS)
// C tile of one task: large enough that the library's packing of the tile's operands is a
// small part of its work, small enough that a 1024 x 8192 product keeps every worker busy.
constexpr int kBlasTileRows = 256;
constexpr int kBlasTileCols = 1024;

// C = alpha op(A) op(B) + beta C, row-major, on the calling thread only; beta == 0 writes C
// without reading it (both libraries do, as the contract needs)
using RowMajorSgemm = void (*)(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a, int lda,
                               const float* b, int ldb, float beta, float* c, int ldc);

template <typename TOut>
struct BlasTask {
    RowMajorSgemm sgemm;
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
    if constexpr (std::is_same<TOut, float>::value) {
        t.sgemm(t.trans_a, t.trans_b, m, n, t.K, t.alpha, a, lda, b, ldb, t.beta, t.C + (size_t)i0 * t.N + j0, t.N);
    } else {
        static thread_local std::vector<float> tile;
        tile.resize((size_t)m * n);
        t.sgemm(t.trans_a, t.trans_b, m, n, t.K, t.alpha, a, lda, b, ldb, 0.0f, tile.data(), n);
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
void gemm_library(RowMajorSgemm sgemm, TOut* C, const TIn* A, const TIn* B, const GemmShape& s, float alpha,
                  float beta) {
    static std::vector<float> a_fp32, b_fp32;
    int tiles_m = CEIL_DIV(s.M, kBlasTileRows), tiles_n = CEIL_DIV(s.N, kBlasTileCols);
    for (int b = 0; b < s.batch; b++) {
        BlasTask<TOut> task{sgemm,
                            C + b * s.stride_c,
                            as_fp32(A + b * s.stride_a, (size_t)s.M * s.K, a_fp32),
                            as_fp32(B + b * s.stride_b, (size_t)s.K * s.N, b_fp32),
                            s.M, s.N, s.K, tiles_n, s.trans_a, s.trans_b, alpha, beta};
        int64_t tasks = (int64_t)tiles_m * tiles_n;
        Pool::instance().parallel_for(tasks, gemm_chunk(s.M, s.N, s.K, tasks), blas_task<TOut>, &task);
    }
}
#endif

#if defined(HOSTCUDA_ONEDNN)
// oneDNN's sgemm JIT-compiles its kernels for the instruction set cpuid reports (no table of
// models), so it runs AVX-512 kernels on any AVX-512 CPU. Debian builds it on OpenMP: each
// thread that calls it is told to use one thread, since the pool's workers are the threads.
inline void onednn_sgemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a, int lda,
                         const float* b, int ldb, float beta, float* c, int ldc) {
    static thread_local bool single_threaded = (omp_set_num_threads(1), true);
    (void)single_threaded;
    dnnl_status_t status = dnnl_sgemm(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    if (status != dnnl_success) { die("oneDNN sgemm failed (status %d) on a %d x %d x %d tile", (int)status, m, n, k); }
}

// the instruction set oneDNN's kernels use, in cpu_features.h's levels
inline CpuIsa onednn_isa() {
    switch (dnnl_get_effective_cpu_isa()) {
        case dnnl_cpu_isa_sse41: return CpuIsa::sse41;
        case dnnl_cpu_isa_avx: return CpuIsa::avx;
        case dnnl_cpu_isa_avx2:
        case dnnl_cpu_isa_avx2_vnni: return CpuIsa::avx2;
        case dnnl_cpu_isa_avx512_core: return CpuIsa::avx512_core;
        case dnnl_cpu_isa_avx512_core_vnni: return CpuIsa::avx512_core_vnni;
        case dnnl_cpu_isa_avx512_core_bf16: return CpuIsa::avx512_core_bf16;
        case dnnl_cpu_isa_avx512_core_amx: return CpuIsa::avx512_core_amx;
        default: return CpuIsa::unknown;
    }
}
#endif

#if defined(HOSTCUDA_OPENBLAS)
inline void openblas_sgemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a, int lda,
                           const float* b, int ldb, float beta, float* c, int ldc) {
    static bool single_threaded = (openblas_set_num_threads(1), true);  // the pool's workers are the threads
    (void)single_threaded;
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, m, n, k, alpha,
                a, lda, b, ldb, beta, c, ldc);
}

// The instruction set of the kernels OpenBLAS picked, from the core name it gives them
// (its DYNAMIC_ARCH table of CPU models: an unknown model gets old kernels).
inline CpuIsa openblas_isa() {
    std::string core = openblas_get_corename();
    for (char& ch : core) { ch = (char)tolower((unsigned char)ch); }
    for (const char* name : {"cooperlake", "sapphirerapids"}) {
        if (core == name) { return CpuIsa::avx512_core_bf16; }
    }
    if (core == "skylakex") { return CpuIsa::avx512_core; }
    for (const char* name : {"haswell", "zen", "excavator"}) {
        if (core == name) { return CpuIsa::avx2; }
    }
    for (const char* name : {"sandybridge", "bulldozer", "piledriver", "steamroller"}) {
        if (core == name) { return CpuIsa::avx; }
    }
    return CpuIsa::sse41;  // prescott, core2, nehalem, ...: SSE kernels
}
#endif

// ---- which one runs --------------------------------------------------------------------

enum class HostGemm { own, openblas, onednn };
constexpr bool kHostGemmHasOpenBlas =
#if defined(HOSTCUDA_OPENBLAS)
    true;
#else
    false;
#endif
constexpr bool kHostGemmHasOneDnn =
#if defined(HOSTCUDA_ONEDNN)
    true;
#else
    false;
#endif

// whether this build has `which` (our own it always has)
constexpr bool host_gemm_built(HostGemm which) {
    return which == HostGemm::onednn ? kHostGemmHasOneDnn : which == HostGemm::openblas ? kHostGemmHasOpenBlas : true;
}

// The host GEMM in use: oneDNN where the build has it, else OpenBLAS, else our own;
// HOSTCUDA_GEMM=own|openblas|onednn overrides (a library the build lacks is an error).
inline HostGemm& host_gemm() {
    static HostGemm use = [] {
        const char* env = getenv("HOSTCUDA_GEMM");
        if (env == nullptr || env[0] == '\0') {
            return kHostGemmHasOneDnn ? HostGemm::onednn : kHostGemmHasOpenBlas ? HostGemm::openblas : HostGemm::own;
        }
        if (strcmp(env, "own") == 0) { return HostGemm::own; }
        if (strcmp(env, "openblas") == 0) {
            if (!kHostGemmHasOpenBlas) {
                die("HOSTCUDA_GEMM=openblas: this build has no OpenBLAS (install libopenblas-dev and rebuild)");
            }
            return HostGemm::openblas;
        }
        if (strcmp(env, "onednn") == 0) {
            if (!kHostGemmHasOneDnn) { die("HOSTCUDA_GEMM=onednn: this build has no oneDNN (install libdnnl-dev and rebuild)"); }
            return HostGemm::onednn;
        }
        die("HOSTCUDA_GEMM='%s': expected 'own', 'openblas' or 'onednn' (or unset)", env);
    }();
    return use;
}

// The instruction set the GEMM in use runs (own: what the compiler was allowed, -march)
inline CpuIsa host_gemm_isa() {
    switch (host_gemm()) {
#if defined(HOSTCUDA_ONEDNN)
        case HostGemm::onednn: return onednn_isa();
#endif
#if defined(HOSTCUDA_OPENBLAS)
        case HostGemm::openblas: return openblas_isa();
#endif
        default:
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512DQ__)
            return CpuIsa::avx512_core;
#elif defined(__AVX2__)
            return CpuIsa::avx2;
#elif defined(__AVX__)
            return CpuIsa::avx;
#else
            return CpuIsa::sse41;
#endif
    }
}

// The GEMM in use and its instruction set, as the trainers' banner and scripts/bench_cpu.sh print
// it, e.g. "oneDNN 2.6.3 sgemm, avx512_core_bf16 kernels (CPU: avx512_core_bf16)"
inline std::string host_gemm_description() {
    char text[200];
    const char* cpu = cpu_isa_name(best_cpu_isa());
    switch (host_gemm()) {
#if defined(HOSTCUDA_ONEDNN)
        case HostGemm::onednn: {
            const dnnl_version_t* v = dnnl_version();
            snprintf(text, sizeof(text), "oneDNN %d.%d.%d sgemm, %s kernels (CPU: %s)", v->major, v->minor, v->patch,
                     cpu_isa_name(onednn_isa()), cpu);
            break;
        }
#endif
#if defined(HOSTCUDA_OPENBLAS)
        case HostGemm::openblas:
            snprintf(text, sizeof(text), "OpenBLAS sgemm, %s kernels (%s; CPU: %s)", openblas_get_corename(),
                     cpu_isa_name(openblas_isa()), cpu);
            break;
#endif
        default:
            snprintf(text, sizeof(text), "own GEMM, %s by the compiler (CPU: %s)", cpu_isa_name(host_gemm_isa()), cpu);
    }
    return text;
}

template <typename TIn, typename TOut>
void host_gemm(TOut* C, const TIn* A, const TIn* B, const GemmShape& shape, float alpha, float beta) {
    KernelProfile* profile = KernelProfile::instance();
    auto start = profile != nullptr ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point();
    HostGemm which = host_gemm();
    switch (which) {
#if defined(HOSTCUDA_ONEDNN)
        case HostGemm::onednn: gemm_library(onednn_sgemm, C, A, B, shape, alpha, beta); break;
#endif
#if defined(HOSTCUDA_OPENBLAS)
        case HostGemm::openblas: gemm_library(openblas_sgemm, C, A, B, shape, alpha, beta); break;
#endif
        default: gemm_own(C, A, B, shape, alpha, beta);
    }
    if (CostRecorder* cost = CostRecorder::instance()) {  // (HOSTCUDA_COST: a GPU's cuBLAS call, by its sizes)
        uint64_t flops = 2ull * shape.M * shape.N * shape.K * shape.batch;
        uint64_t a = (uint64_t)shape.M * shape.K * sizeof(TIn), b = (uint64_t)shape.K * shape.N * sizeof(TIn);
        uint64_t c = (uint64_t)shape.M * shape.N * sizeof(TOut);
        // (a broadcast operand, stride 0, is read once)
        uint64_t read = (shape.stride_a == 0 ? a : a * shape.batch) + (shape.stride_b == 0 ? b : b * shape.batch) +
                        (beta != 0.0f ? c * shape.batch : 0);
        bool tensor = sizeof(TIn) == 2;
        cost->add(tensor ? "gemm (bf16, tensor cores)" : "gemm (fp32)", tensor ? flops : 0, tensor ? 0 : flops, read,
                  c * shape.batch);
    }
    if (profile != nullptr) {
        // (one line per transpose case and backend: the profile's rows are the kernels' names)
        static const char* names[3][2][2] = {
            {{"gemm own NN (host)", "gemm own NT (host)"}, {"gemm own TN (host)", "gemm own TT (host)"}},
            {{"gemm OpenBLAS NN (host)", "gemm OpenBLAS NT (host)"}, {"gemm OpenBLAS TN (host)", "gemm OpenBLAS TT (host)"}},
            {{"gemm oneDNN NN (host)", "gemm oneDNN NT (host)"}, {"gemm oneDNN TN (host)", "gemm oneDNN TT (host)"}}};
        profile->add(names[(int)which][shape.trans_a][shape.trans_b],
                     std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
}

}  // namespace hostcuda
