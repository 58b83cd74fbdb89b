/*
The machine's GEMM limit, for the CPU bench (scripts/bench_cpu.sh): GFLOP/s of a large fp32
product through the GEMM wrapper (llmc/kernels/gemm.cuh), once per GEMM this build has: on
the host backend every host GEMM (oneDNN, OpenBLAS, our own; llmc/hostcuda/gemm.h) spread
over HOSTCUDA_THREADS workers, on a GPU cuBLAS. A training run's FLOP/s divided by the
first line is the share of the machine's limit it reaches.

    ./build/host-fp32/gemm_peak [SIZE]        SIZE x SIZE x SIZE (default 2048), best of 5

Prints one line per GEMM: "gemm_peak <name> <size> <GFLOP/s>", the default GEMM first.
*/
#include <chrono>
#include <cstdlib>

#include "dev/cuda/common.h"
#include "llmc/kernels/gemm.cuh"

// best-of-5 GFLOP/s of an n x n x n fp32 product, after one warm-up call
static double peak_gflops(int n, float* c, const float* a, const float* b) {
    GemmShape shape{n, n, n, false, false};
    gemm(c, a, b, shape);
    cudaCheck(cudaDeviceSynchronize());
    double best = 0.0;
    for (int r = 0; r < 5; r++) {
        auto start = std::chrono::steady_clock::now();
        gemm(c, a, b, shape);
        cudaCheck(cudaDeviceSynchronize());
        double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        best = std::max(best, 2.0 * n * n * n / seconds / 1e9);
    }
    return best;
}

int main(int argc, char** argv) {
    int n = argc > 1 ? atoi(argv[1]) : 2048;
    if (n < 1 || n > 16384) {
        fprintf(stderr, "gemm_peak: SIZE must be 1 to 16384, not '%s'\n", argv[1]);
        return 2;
    }
    std::vector<float> host_a = make_random_float((size_t)n * n, 1), host_b = make_random_float((size_t)n * n, 2);
    float* a = copy_to_device(host_a);
    float* b = copy_to_device(host_b);
    float* c = cudaMallocElements(float, (size_t)n * n);
#if HOST_BACKEND
    using hostcuda::HostGemm;
    HostGemm preferred = hostcuda::host_gemm();
    std::vector<HostGemm> gemms = {preferred};
    for (HostGemm which : {HostGemm::onednn, HostGemm::openblas, HostGemm::own}) {
        if (hostcuda::host_gemm_built(which) && which != preferred) { gemms.push_back(which); }
    }
    for (HostGemm which : gemms) {
        hostcuda::host_gemm() = which;
        printf("gemm_peak %s | %d | %.1f GFLOP/s\n", gemm_backend_name().c_str(), n, peak_gflops(n, c, a, b));
    }
#else
    printf("gemm_peak %s | %d | %.1f GFLOP/s\n", gemm_backend_name().c_str(), n, peak_gflops(n, c, a, b));
#endif
    cudaCheck(cudaFree(a));
    cudaCheck(cudaFree(b));
    cudaCheck(cudaFree(c));
    return 0;
}
