/*
The elementwise part of SwiGLU (llmc/kernels/swiglu.cuh), forward and backward:

    out   = silu(gate) * up,   silu(x) = x * sigmoid(x)
    dup   = dout * silu(gate)
    dgate = dout * up * sigmoid(gate) * (1 + gate * (1 - sigmoid(gate)))

gate, up, out, dout, dgate, dup: N elements of floatX; maths in fp32.

version 1: one thread per element, scalar loads (the baseline)
version 2: llmc/kernels/swiglu.cuh's launchers: on a GPU one thread per x128::size elements,
           128-bit loads and stores; on the host backend a vectorised per-element loop
version 3: the x128 kernels launched directly (what version 2 runs on a GPU)

Build and run (validation on any executor, timing on a GPU):
    make build/gpu-bf16/swiglu && ./build/gpu-bf16/swiglu [version]
*/
#include "dev/cuda/common.h"
#include "llmc/kernels/swiglu.cuh"

// ----------------------------------------------------------------------------------------
// CPU reference

void swiglu_forward_cpu(float* out, const float* gate, const float* up, size_t N) {
    for (size_t i = 0; i < N; i++) {
        double g = gate[i], s = 1.0 / (1.0 + std::exp(-g));
        out[i] = (float)(g * s * up[i]);
    }
}
void swiglu_backward_cpu(float* dgate, float* dup, const float* dout, const float* gate, const float* up, size_t N) {
    for (size_t i = 0; i < N; i++) {
        double g = gate[i], s = 1.0 / (1.0 + std::exp(-g));
        dgate[i] = (float)(dout[i] * up[i] * (s + g * s * (1.0 - s)));
        dup[i] = (float)(dout[i] * g * s);
    }
}

// ----------------------------------------------------------------------------------------
// launchers: version 1 runs the scalar kernels (one element per thread), version 2 the llmc
// launchers (on the host backend a vectorised loop over the per-element functions), version 3
// the x128 kernels directly (what version 2 runs on a GPU)

void swiglu_forward_version(int version, floatX* out, const floatX* gate, const floatX* up, size_t N) {
    switch (version) {
        case 1:
            LAUNCH((unsigned)CEIL_DIV(N, (size_t)256), 256, 0, 0, swiglu_forward_kernel<1>)(out, gate, up, N);
            cudaCheckLaunch();
            break;
        case 2: swiglu_forward(out, gate, up, N, 0); break;
        case 3:
            LAUNCH((unsigned)CEIL_DIV(N, (size_t)256 * x128::size), 256, 0, 0, swiglu_forward_kernel<x128::size>)(out, gate, up, N);
            cudaCheckLaunch();
            break;
        default: fprintf(stderr, "unknown version %d\n", version); exit(EXIT_FAILURE);
    }
}
void swiglu_backward_version(int version, floatX* dgate, floatX* dup, const floatX* dout, const floatX* gate,
                             const floatX* up, size_t N) {
    switch (version) {
        case 1:
            LAUNCH((unsigned)CEIL_DIV(N, (size_t)256), 256, 0, 0, swiglu_backward_kernel<1>)(dgate, dup, dout, gate, up, N);
            cudaCheckLaunch();
            break;
        case 2: swiglu_backward(dgate, dup, dout, gate, up, N, 0); break;
        case 3:
            LAUNCH((unsigned)CEIL_DIV(N, (size_t)256 * x128::size), 256, 0, 0, swiglu_backward_kernel<x128::size>)(dgate, dup, dout, gate, up, N);
            cudaCheckLaunch();
            break;
        default: fprintf(stderr, "unknown version %d\n", version); exit(EXIT_FAILURE);
    }
}

int main(int argc, char** argv) {
    size_t N = (size_t)8 * 2048 * 2048;  // B*T*d_ff of the ffn presets
    if (HOST_BACKEND) { N = 100003; }    // validation only; odd: exercises the tail
    int first = 1, last = 3;
    if (argc > 1) { first = last = atoi(argv[1]); }

    std::vector<float> gate = make_random_float(N, 1, -8.0f, 8.0f), up = make_random_float(N, 2, -2.0f, 2.0f),
                       dout = make_random_float(N, 3);
    std::vector<floatX> gate_d = convert_vector<floatX>(gate), up_d = convert_vector<floatX>(up),
                        dout_d = convert_vector<floatX>(dout);
    for (size_t i = 0; i < N; i++) {
        gate[i] = to_float(gate_d[i]);
        up[i] = to_float(up_d[i]);
        dout[i] = to_float(dout_d[i]);
    }
    std::vector<float> out_ref(N), dgate_ref(N), dup_ref(N);
    swiglu_forward_cpu(out_ref.data(), gate.data(), up.data(), N);
    swiglu_backward_cpu(dgate_ref.data(), dup_ref.data(), dout.data(), gate.data(), up.data(), N);

    floatX* d_gate = copy_to_device(gate_d);
    floatX* d_up = copy_to_device(up_d);
    floatX* d_dout = copy_to_device(dout_d);
    floatX* d_out = cudaMallocElements(floatX, N);
    floatX* d_dgate = cudaMallocElements(floatX, N);
    floatX* d_dup = cudaMallocElements(floatX, N);

    // fp32: expf and a few roundings; bf16: one rounding per output (2^-9 relative, x2 margin)
    float out_eps = PRECISION_MODE == PrecisionMode::FP32 ? 1e-5f : 1.0f / 256;
    bool all_ok = true;
    printf("swiglu (%s), N=%zu\n", PRECISION_NAME, N);
    for (int version = first; version <= last; version++) {
        printf("  version %d\n", version);
        cudaCheck(cudaMemset(d_out, 0, N * sizeof(floatX)));
        cudaCheck(cudaMemset(d_dgate, 0, N * sizeof(floatX)));
        cudaCheck(cudaMemset(d_dup, 0, N * sizeof(floatX)));
        swiglu_forward_version(version, d_out, d_gate, d_up, N);
        swiglu_backward_version(version, d_dgate, d_dup, d_dout, d_gate, d_up, N);
        all_ok &= validate_result(d_out, out_ref.data(), "out", N, 1e-6f, out_eps);
        all_ok &= validate_result(d_dgate, dgate_ref.data(), "dgate", N, 1e-6f, out_eps);
        all_ok &= validate_result(d_dup, dup_ref.data(), "dup", N, 1e-6f, out_eps);
    }
    if (!all_ok) {
        printf("swiglu: VALIDATION FAILED\n");
        return EXIT_FAILURE;
    }
    if (kBenchmarksEnabled) {
        print_table_header();
        float baseline = 0.0f;
        for (int version = first; version <= last; version++) {
            float ms = benchmark_kernel(20, swiglu_forward_version, version, d_out, d_gate, d_up, N);
            if (version == first) { baseline = ms; }
            print_result_row("swiglu_forward", version, ms, 3.0 * N * sizeof(floatX), baseline);
        }
        for (int version = first; version <= last; version++) {
            float ms = benchmark_kernel(20, swiglu_backward_version, version, d_dgate, d_dup, d_dout, d_gate, d_up, N);
            if (version == first) { baseline = ms; }
            print_result_row("swiglu_backward", version, ms, 5.0 * N * sizeof(floatX), baseline);
        }
    } else {
        printf("swiglu: all versions valid (benchmarks run on a GPU only)\n");
    }
    for (floatX* p : {d_gate, d_up, d_dout, d_out, d_dgate, d_dup}) { cudaCheck(cudaFree(p)); }
    return 0;
}
