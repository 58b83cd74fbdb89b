/*
RMSNorm forward, the example op of the kernel playground:

    out[r, :] = weight * x[r, :] / sqrt(mean(x[r, :]^2) + eps),   rstd[r] = 1 / sqrt(...)

x: (N rows, C) row-major in floatX, weight: (C), statistics in fp32.

version 1: one thread per row, a plain loop (the baseline)
version 2: one warp per row; lanes stride over the row with 128-bit loads and combine
           their sums with warp shuffles

Build and run (validation on any executor, timing on a GPU):
    make build/gpu-bf16/rmsnorm_forward && ./build/gpu-bf16/rmsnorm_forward [version]
*/
#include "dev/cuda/common.h"

// ----------------------------------------------------------------------------------------
// CPU reference

void rmsnorm_forward_cpu(float* out, float* rstd, const float* x, const float* weight, int N, int C, float eps) {
    for (int r = 0; r < N; r++) {
        const float* row = x + (size_t)r * C;
        double sum_sq = 0.0;
        for (int c = 0; c < C; c++) { sum_sq += (double)row[c] * row[c]; }
        float s = (float)(1.0 / std::sqrt(sum_sq / C + eps));
        for (int c = 0; c < C; c++) { out[(size_t)r * C + c] = row[c] * s * weight[c]; }
        rstd[r] = s;
    }
}

// ----------------------------------------------------------------------------------------
// kernels

__global__ void rmsnorm_forward_kernel1(floatX* out, float* rstd, const floatX* x, const floatX* weight, int N,
                                        int C, float eps) {
    int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= N) { return; }
    const floatX* row = x + (size_t)r * C;
    float sum_sq = 0.0f;
    for (int c = 0; c < C; c++) { sum_sq += to_float(row[c]) * to_float(row[c]); }
    float s = rsqrtf(sum_sq / C + eps);
    for (int c = 0; c < C; c++) { out[(size_t)r * C + c] = from_float<floatX>(to_float(row[c]) * s * to_float(weight[c])); }
    rstd[r] = s;
}

// blockDim.x must be a multiple of 32; C a multiple of x128::size.
__global__ void rmsnorm_forward_kernel2(floatX* out, float* rstd, const floatX* x, const floatX* weight, int N,
                                        int C, float eps) {
    int lane = threadIdx.x % 32;
    int r = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (r >= N) { return; }  // the whole warp leaves together
    const floatX* row = x + (size_t)r * C;
    float sum_sq = 0.0f;
    for (int c = lane * x128::size; c < C; c += 32 * x128::size) {
        x128 packed = load128cs(row + c);
        for (int k = 0; k < x128::size; k++) { sum_sq += to_float(packed[k]) * to_float(packed[k]); }
    }
    sum_sq = warp_reduce_sum(sum_sq);
    float s = rsqrtf(sum_sq / C + eps);
    for (int c = lane * x128::size; c < C; c += 32 * x128::size) {
        x128 packed = load128cs(row + c);  // second read mostly hits L1
        x128 w = load128(weight + c);
        x128 result;
        for (int k = 0; k < x128::size; k++) { result[k] = from_float<floatX>(to_float(packed[k]) * s * to_float(w[k])); }
        store128(out + (size_t)r * C + c, result);
    }
    if (lane == 0) { rstd[r] = s; }
}

// ----------------------------------------------------------------------------------------
// launchers

void rmsnorm_forward(int version, floatX* out, float* rstd, const floatX* x, const floatX* weight, int N, int C,
                     float eps, int block_size) {
    switch (version) {
        case 1:
            LAUNCH(CEIL_DIV(N, block_size), block_size, 0, 0, rmsnorm_forward_kernel1)(out, rstd, x, weight, N, C, eps);
            break;
        case 2:
            LAUNCH(CEIL_DIV(N * 32, block_size), block_size, 0, 0, rmsnorm_forward_kernel2)(out, rstd, x, weight, N, C, eps);
            break;
        default: fprintf(stderr, "unknown version %d\n", version); exit(EXIT_FAILURE);
    }
    cudaCheckLaunch();
}

int main(int argc, char** argv) {
    int N = 8 * 1024, C = 768;
    if (HOST_BACKEND) { N = 256; }  // validation only: keep it quick
    float eps = 1e-6f;
    int first = 1, last = 2;
    if (argc > 1) { first = last = atoi(argv[1]); }

    std::vector<float> x = make_random_float((size_t)N * C, 1, -2.0f, 2.0f);
    std::vector<float> weight = make_random_float(C, 2, 0.5f, 1.5f);
    // the reference sees exactly the (rounded) inputs the kernel sees
    std::vector<floatX> x_device_type = convert_vector<floatX>(x), w_device_type = convert_vector<floatX>(weight);
    for (size_t i = 0; i < x.size(); i++) { x[i] = to_float(x_device_type[i]); }
    for (int i = 0; i < C; i++) { weight[i] = to_float(w_device_type[i]); }
    std::vector<float> out_ref((size_t)N * C), rstd_ref(N);
    rmsnorm_forward_cpu(out_ref.data(), rstd_ref.data(), x.data(), weight.data(), N, C, eps);

    floatX* d_x = copy_to_device(x_device_type);
    floatX* d_weight = copy_to_device(w_device_type);
    floatX* d_out = cudaMallocElements(floatX, (size_t)N * C);
    float* d_rstd = cudaMallocElements(float, N);

    // fp32: summation order only; bf16: one rounding of the output (2^-8 relative)
    float out_eps = PRECISION_MODE == PrecisionMode::FP32 ? 1e-5f : 1.0f / 128;
    bool all_ok = true;
    int block_sizes[] = {64, 128, 256, 512};
    printf("rmsnorm_forward (%s), N=%d C=%d\n", PRECISION_NAME, N, C);
    for (int version = first; version <= last; version++) {
        for (int block_size : block_sizes) {
            printf("  version %d, block size %d\n", version, block_size);
            cudaCheck(cudaMemset(d_out, 0, (size_t)N * C * sizeof(floatX)));
            rmsnorm_forward(version, d_out, d_rstd, d_x, d_weight, N, C, eps, block_size);
            all_ok &= validate_result(d_out, out_ref.data(), "out", (size_t)N * C, 1e-6f, out_eps);
            all_ok &= validate_result(d_rstd, rstd_ref.data(), "rstd", N, 0.0f, 1e-5f);
        }
    }
    if (!all_ok) {
        printf("rmsnorm_forward: VALIDATION FAILED\n");
        return EXIT_FAILURE;
    }
    if (kBenchmarksEnabled) {
        double bytes = 2.0 * N * C * sizeof(floatX) + C * sizeof(floatX) + N * sizeof(float);
        float baseline = 0.0f;
        print_table_header();
        for (int version = first; version <= last; version++) {
            float ms = benchmark_kernel(20, rmsnorm_forward, version, d_out, d_rstd, d_x, d_weight, N, C, eps, 256);
            if (version == first) { baseline = ms; }
            print_result_row("rmsnorm_forward", version, ms, bytes, baseline);
        }
    } else {
        printf("rmsnorm_forward: all versions valid (benchmarks run on a GPU only)\n");
    }
    cudaCheck(cudaFree(d_x));
    cudaCheck(cudaFree(d_weight));
    cudaCheck(cudaFree(d_out));
    cudaCheck(cudaFree(d_rstd));
    return 0;
}
