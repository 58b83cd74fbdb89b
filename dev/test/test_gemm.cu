/*
Tests of the GEMM wrapper (llmc/kernels/gemm.cuh) against a plain double-precision loop, on
whichever executor built this file (host backend in `make test`, cuBLAS on a GPU):
all four transpose combinations, shapes that are not multiples of any tile size,
strided and broadcast batches, beta accumulation, beta = 0 ignoring NaN in C, and bf16
inputs with fp32 or bf16 output. On the host backend every case runs on every host GEMM the
build has (llmc/hostcuda/gemm.h: our own, oneDNN, OpenBLAS), with shapes that span several of
the libraries' C tiles; and the GEMM in use must run kernels for the best instruction set the
CPU reports (llmc/hostcuda/cpu_features.h), not older ones.

The bound per element is |got - ref| <= tol * sum_k |a_ik b_kj| (+ output rounding),
the size of the rounding error an fp32-accumulated dot product can have.
*/
#include <cmath>
#include <random>
#include <vector>

#include "llmc/kernels/gemm.cuh"
#include "dev/test/testing.h"

struct GemmCase {
    int M, N, K;
    bool trans_a, trans_b;
    int batch;
    bool broadcast_b;
    float alpha, beta;
};

// the GEMM that runs now, for messages
static const char* gemm_name() {
#if HOST_BACKEND
    static const char* names[] = {"own GEMM", "OpenBLAS", "oneDNN"};
    return names[(int)hostcuda::host_gemm()];
#else
    return "cuBLAS";
#endif
}

template <typename TIn, typename TOut>
static void run_case(const GemmCase& c, uint32_t seed, double tol, double out_eps) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    size_t a_size = (size_t)c.M * c.K, b_size = (size_t)c.K * c.N, c_size = (size_t)c.M * c.N;
    int b_count = c.broadcast_b ? 1 : c.batch;
    std::vector<TIn> A(a_size * c.batch), B(b_size * b_count);
    std::vector<TOut> C(c_size * c.batch);
    for (auto& x : A) { x = from_float<TIn>(normal(rng)); }
    for (auto& x : B) { x = from_float<TIn>(normal(rng)); }
    for (auto& x : C) { x = from_float<TOut>(c.beta == 0.0f ? NAN : normal(rng)); }

    std::vector<double> ref(C.size()), bound(C.size());
    for (int b = 0; b < c.batch; b++) {
        const TIn* Ab = A.data() + b * a_size;
        const TIn* Bb = B.data() + (c.broadcast_b ? 0 : b * b_size);
        for (int i = 0; i < c.M; i++) {
            for (int j = 0; j < c.N; j++) {
                double dot = 0.0, magnitude = 0.0;
                for (int k = 0; k < c.K; k++) {
                    double a = to_float(c.trans_a ? Ab[(size_t)k * c.M + i] : Ab[(size_t)i * c.K + k]);
                    double bv = to_float(c.trans_b ? Bb[(size_t)j * c.K + k] : Bb[(size_t)k * c.N + j]);
                    dot += a * bv;
                    magnitude += std::fabs(a * bv);
                }
                size_t idx = b * c_size + (size_t)i * c.N + j;
                double prior = c.beta == 0.0f ? 0.0 : c.beta * (double)to_float(C[idx]);
                ref[idx] = c.alpha * dot + prior;
                bound[idx] = tol * (std::fabs(c.alpha) * magnitude + std::fabs(prior)) + out_eps * std::fabs(ref[idx]);
            }
        }
    }

    TIn* dA = copy_to_device(A);
    TIn* dB = copy_to_device(B);
    TOut* dC = copy_to_device(C);
    GemmShape shape{c.M, c.N, c.K, c.trans_a, c.trans_b};
    gemm(dC, dA, dB, shape.batched(c.batch, (int64_t)a_size, c.broadcast_b ? 0 : (int64_t)b_size, (int64_t)c_size),
         c.alpha, c.beta);
    cudaCheck(cudaDeviceSynchronize());
    std::vector<TOut> got = copy_from_device(dC, C.size());
    size_t bad = 0;
    for (size_t i = 0; i < got.size(); i++) {
        double err = std::fabs((double)to_float(got[i]) - ref[i]);
        if (!(err <= bound[i] + 1e-30)) {
            if (bad < 3) {
                fprintf(stderr, "  [%zu] got %.9g expected %.9g (bound %.3g)\n", i, (double)to_float(got[i]), ref[i],
                        bound[i]);
            }
            bad++;
        }
    }
    if (bad != 0) {
        char what[200];
        snprintf(what, sizeof(what), "%s, M=%d N=%d K=%d ta=%d tb=%d batch=%d bcast=%d alpha=%g beta=%g: %zu bad", gemm_name(),
                 c.M, c.N, c.K, c.trans_a, c.trans_b, c.batch, c.broadcast_b, c.alpha, c.beta, bad);
        testing::report_failure(__FILE__, __LINE__, what);
    }
    cudaCheck(cudaFree(dA));
    cudaCheck(cudaFree(dB));
    cudaCheck(cudaFree(dC));
}

static std::vector<GemmCase> cases() {
    std::vector<GemmCase> out;
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            out.push_back({37, 70, 19, (bool)ta, (bool)tb, 1, false, 1.0f, 0.0f});
            out.push_back({128, 96, 64, (bool)ta, (bool)tb, 1, false, 0.5f, 1.0f});
            out.push_back({5, 33, 129, (bool)ta, (bool)tb, 3, false, 1.0f, 0.0f});
            out.push_back({67, 1, 8, (bool)ta, (bool)tb, 2, true, -2.0f, 0.25f});
        }
    out.push_back({1, 1, 1, false, false, 1, false, 1.0f, 0.0f});
    out.push_back({300, 257, 200, false, true, 1, false, 1.0f, 0.0f});  // several tasks on the pool
    // several library C tiles (256 x 1024), partial ones at both edges, beta accumulating
    out.push_back({530, 2100, 24, true, false, 1, false, 1.0f, 1.0f});
    out.push_back({513, 1030, 40, false, true, 2, false, 0.5f, 0.0f});
    return out;
}

// Runs `check` once on a GPU; on the host once per host GEMM this build has.
template <typename F>
static void for_each_gemm(F check) {
#if HOST_BACKEND
    using hostcuda::HostGemm;
    HostGemm saved = hostcuda::host_gemm();
    for (HostGemm which : {HostGemm::own, HostGemm::openblas, HostGemm::onednn}) {
        if (!hostcuda::host_gemm_built(which)) { continue; }
        hostcuda::host_gemm() = which;
        check();
    }
    hostcuda::host_gemm() = saved;
#else
    check();
#endif
}

// fp32 accumulation error of a K-term dot product stays far below K * 2^-24 * sum|ab|
TEST_CASE(gemm_fp32) {
    for_each_gemm([] { for (const GemmCase& c : cases()) { run_case<float, float>(c, 11, 4e-6, 0.0); } });
}

TEST_CASE(gemm_bf16_in_fp32_out) {
    for_each_gemm([] { for (const GemmCase& c : cases()) { run_case<__nv_bfloat16, float>(c, 12, 4e-6, 0.0); } });
}

// bf16 output: one extra rounding to 8 bits of mantissa (relative 2^-8)
TEST_CASE(gemm_bf16_in_bf16_out) {
    for_each_gemm([] {
        for (const GemmCase& c : cases()) { run_case<__nv_bfloat16, __nv_bfloat16>(c, 13, 4e-6 + 1.0 / 256, 1.0 / 256); }
    });
}

#if HOST_BACKEND
// The library GEMM this build defaults to runs the best kernels the CPU can: its instruction
// set (what oneDNN reports, or what OpenBLAS's core name stands for) is the one cpuid and
// xgetbv report. OpenBLAS 0.3.21 failed this on an AVX-512 Xeon it called "Prescott". A cap
// the user set in the environment (OPENBLAS_CORETYPE, ONEDNN_MAX_CPU_ISA) is respected, and
// a library that is built in but not the default is reported, not checked.
static const char* isa_cap_in_environment(hostcuda::HostGemm which) {
    for (const char* name : which == hostcuda::HostGemm::onednn
                                ? std::vector<const char*>{"ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA"}
                                : std::vector<const char*>{"OPENBLAS_CORETYPE"}) {
        const char* value = getenv(name);
        if (value != nullptr && value[0] != '\0') { return name; }
    }
    return nullptr;
}

TEST_CASE(gemm_kernels_match_the_cpu) {
    using hostcuda::CpuIsa;
    using hostcuda::HostGemm;
    CpuIsa cpu = hostcuda::best_cpu_isa();
    HostGemm saved = hostcuda::host_gemm();
    for (HostGemm which : {HostGemm::onednn, HostGemm::openblas}) {
        if (!hostcuda::host_gemm_built(which)) { continue; }
        hostcuda::host_gemm() = which;
        CpuIsa got = hostcuda::host_gemm_isa();
        // OpenBLAS 0.3.21 has no kernels past avx512_core_bf16 (Cooper Lake), none with AMX
        CpuIsa best = which == HostGemm::openblas && cpu > CpuIsa::avx512_core_bf16 ? CpuIsa::avx512_core_bf16 : cpu;
        const char* cap = isa_cap_in_environment(which);
        bool checked = which == saved && cap == nullptr && cpu != CpuIsa::unknown;
        printf("  %s%s%s%s\n", hostcuda::host_gemm_description().c_str(), which == saved ? " [default]" : "",
               cap != nullptr ? ", capped by " : "", cap != nullptr ? cap : "");
        if (checked) { CHECK(got == best); }
    }
    hostcuda::host_gemm() = saved;
}
#endif

TEST_MAIN()
