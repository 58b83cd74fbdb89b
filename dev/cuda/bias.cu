/*
Bias of a linear layer (llmc/kernels/bias.cuh), forward and backward:

    out[n, c] = inp[n, c] + bias[c]           dbias[c] += sum over n of dout[n, c]

inp, out, dout: (N, C) floatX; bias, dbias: (C) floatX.

version 1: forward one thread per element; backward one thread per column summing all N
           rows (the baseline: C threads only)
version 2: llmc/kernels/bias.cuh: forward one thread per x128::size elements (on the host
           backend a vectorised loop per row instead); backward over row chunks (grid
           columns x chunks), then a fixed-order sum of the chunk partials (deterministic,
           no atomics, no barriers)
version 3: forward: the x128 kernel launched directly (what version 2 runs on a GPU);
           backward as version 2

Build and run (validation on any executor, timing on a GPU):
    make build/gpu-bf16/bias && ./build/gpu-bf16/bias [version]
*/
#include "dev/cuda/common.h"
#include "llmc/kernels/bias.cuh"

void bias_cpu(float* out, float* dbias, const float* inp, const float* bias, const float* dout, int N, int C) {
    std::vector<double> db(C, 0.0);
    for (int n = 0; n < N; n++) {
        for (int c = 0; c < C; c++) {
            out[(size_t)n * C + c] = inp[(size_t)n * C + c] + bias[c];
            db[c] += dout[(size_t)n * C + c];
        }
    }
    for (int c = 0; c < C; c++) { dbias[c] += (float)db[c]; }
}

__global__ void bias_backward_kernel1(floatX* dbias, const floatX* dout, int N, int C) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) { return; }
    float sum = 0.0f;
    for (int n = 0; n < N; n++) { sum += to_float(dout[(size_t)n * C + c]); }
    dbias[c] = from_float<floatX>(to_float(dbias[c]) + sum);
}

void forward_version(int version, floatX* out, const floatX* inp, const floatX* bias, int N, int C) {
    if (version == 1) {
        LAUNCH((unsigned)CEIL_DIV((size_t)N * C, (size_t)256), 256, 0, 0, bias_forward_kernel<1>)(out, inp, bias, N, C);
        cudaCheckLaunch();
    } else if (version == 3 && C % x128::size == 0) {
        unsigned grid = (unsigned)CEIL_DIV((size_t)N * C, (size_t)256 * x128::size);
        LAUNCH(grid, 256, 0, 0, bias_forward_kernel<x128::size>)(out, inp, bias, N, C);
        cudaCheckLaunch();
    } else {
        bias_forward(out, inp, bias, N, C, 0);
    }
}
void backward_version(int version, floatX* dbias, float* scratch, const floatX* dout, int N, int C) {
    if (version == 1) {
        LAUNCH(CEIL_DIV(C, 256), 256, 0, 0, bias_backward_kernel1)(dbias, dout, N, C);
        cudaCheckLaunch();
    } else {
        bias_backward(dbias, scratch, dout, N, C, 0);
    }
}

bool run_case(int N, int C, int first, int last, bool bench) {
    std::vector<float> inp = make_random_float((size_t)N * C, 1), bias = make_random_float(C, 2),
                       dout = make_random_float((size_t)N * C, 3), db0 = make_random_float(C, 4);
    auto round_trip = [](std::vector<float>& v) {
        std::vector<floatX> d = convert_vector<floatX>(v);
        for (size_t i = 0; i < v.size(); i++) { v[i] = to_float(d[i]); }
    };
    for (auto* v : {&inp, &bias, &dout, &db0}) { round_trip(*v); }
    std::vector<float> out_ref((size_t)N * C), db_ref = db0;
    bias_cpu(out_ref.data(), db_ref.data(), inp.data(), bias.data(), dout.data(), N, C);
    floatX* d_inp = copy_to_device(convert_vector<floatX>(inp));
    floatX* d_bias = copy_to_device(convert_vector<floatX>(bias));
    floatX* d_dout = copy_to_device(convert_vector<floatX>(dout));
    floatX* d_out = cudaMallocElements(floatX, (size_t)N * C);
    floatX* d_db = cudaMallocElements(floatX, C);
    float* scratch = cudaMallocElements(float, bias_backward_scratch_floats(N, C));
    bool fp32 = PRECISION_MODE == PrecisionMode::FP32;
    bool ok = true;
    printf("bias (%s), N=%d C=%d\n", PRECISION_NAME, N, C);
    for (int version = first; version <= last; version++) {
        printf("  version %d\n", version);
        cudaCheck(cudaMemcpy(d_db, convert_vector<floatX>(db0).data(), C * sizeof(floatX), cudaMemcpyHostToDevice));
        forward_version(version, d_out, d_inp, d_bias, N, C);
        backward_version(version, d_db, scratch, d_dout, N, C);
        ok &= validate_result(d_out, out_ref.data(), "out", (size_t)N * C, 1e-6f, fp32 ? 1e-6f : 1.0f / 256);
        // a sum of N values in [-1, 1]: fp32 summation order, bf16 one rounding of a value ~sqrt(N)
        ok &= validate_result(d_db, db_ref.data(), "dbias", C, fp32 ? 1e-4f : 0.05f, fp32 ? 1e-5f : 1.0f / 128);
    }
    if (ok && bench && kBenchmarksEnabled) {
        print_table_header();
        float baseline = 0.0f;
        for (int version = first; version <= last; version++) {
            float ms = benchmark_kernel(20, forward_version, version, d_out, d_inp, d_bias, N, C);
            if (version == first) { baseline = ms; }
            print_result_row("bias_forward", version, ms, 2.0 * N * C * sizeof(floatX), baseline);
        }
        for (int version = first; version <= last; version++) {
            float ms = benchmark_kernel(20, backward_version, version, d_db, scratch, d_dout, N, C);
            if (version == first) { baseline = ms; }
            print_result_row("bias_backward", version, ms, 1.0 * N * C * sizeof(floatX), baseline);
        }
    }
    for (floatX* p : {d_inp, d_bias, d_dout, d_out, d_db}) { cudaCheck(cudaFree(p)); }
    cudaCheck(cudaFree(scratch));
    return ok;
}

int main(int argc, char** argv) {
    int first = 1, last = 3;
    if (argc > 1) { first = last = atoi(argv[1]); }
    bool ok = true;
    if (HOST_BACKEND) {  // validation only; 100 and 7: no 128-bit path; 1001 rows: a partial chunk
        ok &= run_case(1001, 100, first, last, false);
        ok &= run_case(33, 7, first, last, false);
        ok &= run_case(2048, 768, first, last, false);
    } else {
        ok &= run_case(1001, 100, first, last, false);
        ok &= run_case(8 * 1024, 768, first, last, true);
        ok &= run_case(8 * 1024, 3072, first, last, true);
    }
    if (!ok) {
        printf("bias: VALIDATION FAILED\n");
        return EXIT_FAILURE;
    }
    printf("bias: all versions valid%s\n", kBenchmarksEnabled ? "" : " (benchmarks run on a GPU only)");
    return 0;
}
