/*
Shared helpers for the kernel playground files in dev/cuda/: each file holds numbered
versions of one op, a plain C++ reference, and a main() that validates every version
against the reference and (on a GPU) benchmarks it. On the host backend the same files
build and validate; timing a CPU emulation of a GPU kernel means nothing, so
benchmarking is skipped there.

  validate_result(device_ptr, reference, name, n, tol, eps)  |got - ref| <= tol + |ref| * eps
                                                             (dev/test/compare.h measure_error)
  benchmark_kernel(repeats, fn, args...)                     mean ms per call, L2 flushed before each
  print_result_row(...)                                      one row of the summary table
*/
#pragma once

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "dev/test/compare.h"
#include "llmc/cuda_common.h"

inline std::vector<float> make_random_float(size_t n, uint32_t seed = 42, float lo = -1.0f, float hi = 1.0f) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> dist(lo, hi);
    std::vector<float> v(n);
    for (auto& x : v) { x = dist(rng); }
    return v;
}

template <typename T>
std::vector<T> convert_vector(const std::vector<float>& v) {
    std::vector<T> out(v.size());
    for (size_t i = 0; i < v.size(); i++) { out[i] = from_float<T>(v[i]); }
    return out;
}

// Copies the device result back and compares it with the CPU reference. Prints the first
// mismatches and returns false if any element is out of tolerance (or NaN).
template <typename T>
bool validate_result(const T* device_result, const float* reference, const char* name, size_t n, float tol,
                     float eps = 0.0f) {
    std::vector<T> raw = copy_from_device(device_result, n);
    std::vector<float> got(n);
    for (size_t i = 0; i < n; i++) { got[i] = to_float(raw[i]); }
    ErrorMeasure m = measure_error(got.data(), reference, n, Tolerance{0.0, eps, tol});
    if (m.bad > 0) {
        printf("    mismatch %s[%zu] (the worst): got %.8g, reference %.8g\n", name, m.worst, got[m.worst],
               reference[m.worst]);
    }
    printf("    %-10s %s (max |err| %.3g, tol %.3g + |ref| x %.3g, %zu elements)\n", name,
           m.bad == 0 ? "ok" : "MISMATCH", m.max_error, (double)tol, (double)eps, n);
    return m.bad == 0;
}

constexpr bool kBenchmarksEnabled = !HOST_BACKEND;

// Mean milliseconds per call of fn(args...), over `repeats` calls, with the L2 cache
// flushed before each so every call reads its inputs from memory.
template <typename Fn, typename... Args>
float benchmark_kernel(int repeats, Fn fn, Args&&... args) {
    cudaDeviceProp prop;
    cudaCheck(cudaGetDeviceProperties(&prop, 0));
    size_t flush_bytes = (size_t)prop.l2CacheSize * 2;
    void* flush_buffer = nullptr;
    cudaCheck(cudaMalloc(&flush_buffer, flush_bytes));
    cudaEvent_t start, stop;
    cudaCheck(cudaEventCreate(&start));
    cudaCheck(cudaEventCreate(&stop));
    float total_ms = 0.0f;
    for (int r = 0; r < repeats; r++) {
        cudaCheck(cudaMemset(flush_buffer, r & 0xff, flush_bytes));
        cudaCheck(cudaEventRecord(start));
        fn(std::forward<Args>(args)...);
        cudaCheck(cudaEventRecord(stop));
        cudaCheck(cudaEventSynchronize(stop));
        float ms = 0.0f;
        cudaCheck(cudaEventElapsedTime(&ms, start, stop));
        total_ms += ms;
    }
    cudaCheckLaunch();
    cudaCheck(cudaEventDestroy(start));
    cudaCheck(cudaEventDestroy(stop));
    cudaCheck(cudaFree(flush_buffer));
    return total_ms / repeats;
}

inline void print_table_header() {
    printf("%-28s %8s %12s %12s %10s\n", "op", "version", "time (ms)", "GB/s", "vs v1");
}
inline void print_result_row(const char* op, int version, float ms, double bytes, float baseline_ms) {
    printf("%-28s %8d %12.4f %12.1f %9.2fx\n", op, version, ms, bytes / (ms * 1e-3) / 1e9, baseline_ms / ms);
}
