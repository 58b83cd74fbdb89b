/*
Learned positional embeddings (llmc/kernels/position.cuh), forward and backward:

    out[b, t, :] += wpe[t, :]              dwpe[t, :] += sum over b of dout[b, t, :]

out, dout: (B, T, C) floatX; wpe, dwpe: (maxT, C) floatX, T <= maxT.

version 1: forward one thread per element; backward one thread per (t, c) (no atomics):
           these are the llmc kernels, which are already the simple form; the backward
           alternative measured against them is
version 2: backward with float atomics (one thread per (b, t, c) element): NOT deterministic
           in bf16/fp32 summation order, shown for the timing comparison only; the trainers
           use version 1

Build and run (validation on any executor, timing on a GPU):
    make build/gpu-bf16/position && ./build/gpu-bf16/position [version]
*/
#include "dev/cuda/common.h"
#include "llmc/kernels/position.cuh"

void position_cpu(float* out, float* dwpe, const float* wpe, const float* dout, int B, int T, int C) {
    for (int b = 0; b < B; b++) {
        for (size_t tc = 0; tc < (size_t)T * C; tc++) { out[(size_t)b * T * C + tc] += wpe[tc]; }
    }
    for (size_t tc = 0; tc < (size_t)T * C; tc++) {
        double sum = 0.0;
        for (int b = 0; b < B; b++) { sum += dout[(size_t)b * T * C + tc]; }
        dwpe[tc] += (float)sum;
    }
}

__global__ void position_backward_atomic_kernel(float* dwpe, const floatX* dout, int B, int T, int C) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)B * T * C) { return; }
    atomicAdd(dwpe + i % ((size_t)T * C), to_float(dout[i]));
}

int main(int argc, char** argv) {
    int B = 8, T = 1024, C = 768, maxT = 1024;
    if (HOST_BACKEND) {  // validation only
        B = 3;
        T = 50;
        C = 36;
        maxT = 64;
    }
    int first = 1, last = 2;
    if (argc > 1) { first = last = atoi(argv[1]); }
    size_t n = (size_t)B * T * C, nw = (size_t)maxT * C;
    std::vector<float> out0 = make_random_float(n, 1), wpe = make_random_float(nw, 2), dout = make_random_float(n, 3),
                       dw0 = make_random_float(nw, 4);
    auto round_trip = [](std::vector<float>& v) {
        std::vector<floatX> d = convert_vector<floatX>(v);
        for (size_t i = 0; i < v.size(); i++) { v[i] = to_float(d[i]); }
    };
    for (auto* v : {&out0, &wpe, &dout, &dw0}) { round_trip(*v); }
    std::vector<float> out_ref = out0, dw_ref = dw0;
    position_cpu(out_ref.data(), dw_ref.data(), wpe.data(), dout.data(), B, T, C);
    floatX* d_out = copy_to_device(convert_vector<floatX>(out0));
    floatX* d_wpe = copy_to_device(convert_vector<floatX>(wpe));
    floatX* d_dout = copy_to_device(convert_vector<floatX>(dout));
    floatX* d_dw = copy_to_device(convert_vector<floatX>(dw0));
    float* d_dw_f = copy_to_device(dw0);
    bool fp32 = PRECISION_MODE == PrecisionMode::FP32;
    float eps = fp32 ? 1e-6f : 1.0f / 256;
    bool ok = true;
    printf("position (%s), B=%d T=%d C=%d maxT=%d\n", PRECISION_NAME, B, T, C, maxT);
    if (first <= 1) {
        printf("  version 1\n");
        position_forward(d_out, d_wpe, B, T, C, 0);
        position_backward(d_dw, d_dout, B, T, C, 0);
        ok &= validate_result(d_out, out_ref.data(), "out", n, 1e-6f, eps);
        ok &= validate_result(d_dw, dw_ref.data(), "dwpe", nw, 1e-5f, eps);
    }
    if (last >= 2) {
        printf("  version 2\n");
        LAUNCH((unsigned)CEIL_DIV(n, (size_t)256), 256, 0, 0, position_backward_atomic_kernel)(d_dw_f, d_dout, B, T, C);
        cudaCheckLaunch();
        ok &= validate_result(d_dw_f, dw_ref.data(), "dwpe", nw, 1e-5f, 1e-5f);
    }
    if (!ok) {
        printf("position: VALIDATION FAILED\n");
        return EXIT_FAILURE;
    }
    if (kBenchmarksEnabled) {
        print_table_header();
        float baseline = benchmark_kernel(20, position_backward, d_dw, (const floatX*)d_dout, B, T, C, (cudaStream_t)0);
        print_result_row("position_backward", 1, baseline, (double)n * sizeof(floatX), baseline);
        auto atomic = [&]() {
            LAUNCH((unsigned)CEIL_DIV(n, (size_t)256), 256, 0, 0, position_backward_atomic_kernel)(d_dw_f, d_dout, B, T, C);
        };
        float ms = benchmark_kernel(20, atomic);
        print_result_row("position_backward", 2, ms, (double)n * sizeof(floatX), baseline);
        float fwd = benchmark_kernel(20, position_forward, d_out, (const floatX*)d_wpe, B, T, C, (cudaStream_t)0);
        print_result_row("position_forward", 1, fwd, 2.0 * n * sizeof(floatX), fwd);
    } else {
        printf("position: all versions valid (benchmarks run on a GPU only)\n");
    }
    for (floatX* p : {d_out, d_wpe, d_dout, d_dw}) { cudaCheck(cudaFree(p)); }
    cudaCheck(cudaFree(d_dw_f));
    return 0;
}
