/*
GELU, tanh approximation (llmc/kernels/gelu.cuh), forward and backward:

    out  = 0.5 x (1 + tanh(u)),  u = sqrt(2/pi) (x + 0.044715 x^3)
    dinp = dout * (0.5 (1 + tanh(u)) + 0.5 x (1 - tanh(u)^2) sqrt(2/pi) (1 + 3 * 0.044715 x^2))

x, out, dout, dinp: N elements of floatX; maths in fp32.

version 1: one thread per element, scalar loads (the baseline)
version 2: llmc/kernels/gelu.cuh's launchers, what the trainers call: on a GPU one thread per
           x128::size elements, 128-bit loads and stores; on the host backend a vectorised
           loop over the same per-element functions
version 3: the x128 kernels launched directly (what version 2 runs on a GPU), so that the
           host backend checks them too

Build and run (validation on any executor, timing on a GPU):
    make build/gpu-bf16/gelu && ./build/gpu-bf16/gelu [version]
*/
#include "dev/cuda/common.h"
#include "llmc/kernels/gelu.cuh"

void gelu_cpu(float* out, float* dinp, const float* x, const float* dout, size_t N) {
    const double k = std::sqrt(2.0 / M_PI);
    for (size_t i = 0; i < N; i++) {
        double v = x[i], t = std::tanh(k * (v + 0.044715 * v * v * v));
        out[i] = (float)(0.5 * v * (1.0 + t));
        dinp[i] = (float)(dout[i] * (0.5 * (1.0 + t) + 0.5 * v * (1.0 - t * t) * k * (1.0 + 3.0 * 0.044715 * v * v)));
    }
}

void forward_version(int version, floatX* out, const floatX* x, size_t N) {
    if (version == 1) {
        LAUNCH((unsigned)CEIL_DIV(N, (size_t)256), 256, 0, 0, gelu_forward_kernel<1>)(out, x, N);
        cudaCheckLaunch();
    } else if (version == 3) {
        LAUNCH((unsigned)CEIL_DIV(N, (size_t)256 * x128::size), 256, 0, 0, gelu_forward_kernel<x128::size>)(out, x, N);
        cudaCheckLaunch();
    } else {
        gelu_forward(out, x, N, 0);
    }
}
void backward_version(int version, floatX* dinp, const floatX* dout, const floatX* x, size_t N) {
    if (version == 1) {
        LAUNCH((unsigned)CEIL_DIV(N, (size_t)256), 256, 0, 0, gelu_backward_kernel<1>)(dinp, dout, x, N);
        cudaCheckLaunch();
    } else if (version == 3) {
        LAUNCH((unsigned)CEIL_DIV(N, (size_t)256 * x128::size), 256, 0, 0, gelu_backward_kernel<x128::size>)(dinp, dout, x, N);
        cudaCheckLaunch();
    } else {
        gelu_backward(dinp, dout, x, N, 0);
    }
}

int main(int argc, char** argv) {
    size_t N = (size_t)8 * 1024 * 3072;  // B*T*4d of GPT-2 124M at B*T = 8k
    if (HOST_BACKEND) { N = 100003; }    // validation only; odd: exercises the tail
    int first = 1, last = 3;
    if (argc > 1) { first = last = atoi(argv[1]); }
    std::vector<float> x = make_random_float(N, 1, -6.0f, 6.0f), dout = make_random_float(N, 2);
    const float extremes[] = {0.0f, 1e-8f, -1e-8f, 15.0f, -15.0f, 30.0f, -30.0f, 100.0f, -100.0f, 1e30f, -1e30f};
    for (size_t i = 0; i < sizeof(extremes) / sizeof(float); i++) { x[i * 7] = extremes[i]; }  // tails and limits
    std::vector<floatX> x_d = convert_vector<floatX>(x), dout_d = convert_vector<floatX>(dout);
    for (size_t i = 0; i < N; i++) {
        x[i] = to_float(x_d[i]);
        dout[i] = to_float(dout_d[i]);
    }
    std::vector<float> out_ref(N), dinp_ref(N);
    gelu_cpu(out_ref.data(), dinp_ref.data(), x.data(), dout.data(), N);
    floatX* d_x = copy_to_device(x_d);
    floatX* d_dout = copy_to_device(dout_d);
    floatX* d_out = cudaMallocElements(floatX, N);
    floatX* d_dinp = cudaMallocElements(floatX, N);
    // fp32: tanhf and a few roundings; bf16: one rounding per output (2^-9 relative, x2 margin)
    float eps = PRECISION_MODE == PrecisionMode::FP32 ? 1e-5f : 1.0f / 256;
    bool ok = true;
    printf("gelu (%s), N=%zu\n", PRECISION_NAME, N);
    for (int version = first; version <= last; version++) {
        printf("  version %d\n", version);
        cudaCheck(cudaMemset(d_out, 0, N * sizeof(floatX)));
        cudaCheck(cudaMemset(d_dinp, 0, N * sizeof(floatX)));
        forward_version(version, d_out, d_x, N);
        backward_version(version, d_dinp, d_dout, d_x, N);
        ok &= validate_result(d_out, out_ref.data(), "out", N, 1e-6f, eps);
        ok &= validate_result(d_dinp, dinp_ref.data(), "dinp", N, 1e-6f, eps);
    }
    if (!ok) {
        printf("gelu: VALIDATION FAILED\n");
        return EXIT_FAILURE;
    }
    if (kBenchmarksEnabled) {
        print_table_header();
        float baseline = 0.0f;
        for (int version = first; version <= last; version++) {
            float ms = benchmark_kernel(20, forward_version, version, d_out, d_x, N);
            if (version == first) { baseline = ms; }
            print_result_row("gelu_forward", version, ms, 2.0 * N * sizeof(floatX), baseline);
        }
        for (int version = first; version <= last; version++) {
            float ms = benchmark_kernel(20, backward_version, version, d_dinp, d_dout, d_x, N);
            if (version == first) { baseline = ms; }
            print_result_row("gelu_backward", version, ms, 3.0 * N * sizeof(floatX), baseline);
        }
    } else {
        printf("gelu: all versions valid (benchmarks run on a GPU only)\n");
    }
    for (floatX* p : {d_x, d_dout, d_out, d_dinp}) { cudaCheck(cudaFree(p)); }
    return 0;
}
