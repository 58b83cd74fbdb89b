/*
ZCN / RMSNorm backward (llmc/kernels/norm.cuh), with gradients ACCUMULATED:

    y = x[r, :] * rstd[r],  dy = dout[r, :] * (gain_offset + gain)
    dinp[r, :] += rstd[r] * (dy - y * mean(dy * y))
    dgain[:]   += sum over rows of dout[r, :] * y

gain_offset 1: ZCN, 0: RMSNorm. x, dout, dinp: (N rows, C) floatX; gain, dgain: (C) floatX;
rstd: (N) fp32 from the forward. No float atomics: dgain is reduced in a fixed order.

version 1: one thread per row for dinp, then one thread per column summing dout*y over all
           rows for dgain (two passes over the inputs; the baseline)
version 2: llmc/kernels/norm.cuh: a group of lanes per row (128-bit loads, xor shuffles), per-group
           dgain partials in shared memory, per-block partials in scratch, a second kernel
           sums the blocks in fixed order

Build and run (validation on any executor, timing on a GPU):
    make build/gpu-bf16/norm_backward && ./build/gpu-bf16/norm_backward [version]
*/
#include "dev/cuda/common.h"
#include "llmc/kernels/norm.cuh"

// ----------------------------------------------------------------------------------------
// CPU reference (double accumulation); dinp and dgain accumulated

void norm_backward_cpu(float* dinp, float* dgain, const float* dout, const float* x, const float* gain,
                       int N, int C, float gain_offset, float eps) {
    std::vector<double> dg(C, 0.0);
    for (int r = 0; r < N; r++) {
        const float* xr = x + (size_t)r * C;
        const float* dr = dout + (size_t)r * C;
        double ss = 0.0;
        for (int c = 0; c < C; c++) { ss += (double)xr[c] * xr[c]; }
        double s = 1.0 / std::sqrt(ss / C + eps);
        double dot = 0.0;  // sum(dy * y)
        for (int c = 0; c < C; c++) { dot += (double)dr[c] * (gain_offset + gain[c]) * xr[c] * s; }
        for (int c = 0; c < C; c++) {
            double y = xr[c] * s;
            double dy = (double)dr[c] * (gain_offset + gain[c]);
            dinp[(size_t)r * C + c] += (float)(s * (dy - y * dot / C));
            dg[c] += dr[c] * y;
        }
    }
    for (int c = 0; c < C; c++) { dgain[c] += (float)dg[c]; }
}

// ----------------------------------------------------------------------------------------
// version 1 kernels

__global__ void norm_backward_dinp_kernel1(floatX* dinp, const floatX* dout, const floatX* x, const floatX* gain,
                                           const float* rstd, int N, int C, float gain_offset) {
    int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= N) { return; }
    size_t base = (size_t)r * C;
    float s = rstd[r];
    float dot = 0.0f;
    for (int c = 0; c < C; c++) { dot += to_float(dout[base + c]) * (gain_offset + to_float(gain[c])) * to_float(x[base + c]) * s; }
    float mean = dot / C;
    for (int c = 0; c < C; c++) {
        float dy = to_float(dout[base + c]) * (gain_offset + to_float(gain[c]));
        float d = s * (dy - to_float(x[base + c]) * s * mean);
        dinp[base + c] = from_float<floatX>(to_float(dinp[base + c]) + d);
    }
}

__global__ void norm_backward_dgain_kernel1(floatX* dgain, const floatX* dout, const floatX* x, const float* rstd,
                                            int N, int C) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) { return; }
    float sum = 0.0f;
    for (int r = 0; r < N; r++) { sum += to_float(dout[(size_t)r * C + c]) * to_float(x[(size_t)r * C + c]) * rstd[r]; }
    dgain[c] = from_float<floatX>(to_float(dgain[c]) + sum);
}

// ----------------------------------------------------------------------------------------
// launchers

void norm_backward_version(int version, floatX* dinp, floatX* dgain, float* scratch, const floatX* dout,
                           const floatX* x, const floatX* gain, const float* rstd, int N, int C, float gain_offset) {
    switch (version) {
        case 1:
            LAUNCH(CEIL_DIV(N, 128), 128, 0, 0, norm_backward_dinp_kernel1)(dinp, dout, x, gain, rstd, N, C, gain_offset);
            cudaCheckLaunch();
            LAUNCH(CEIL_DIV(C, 128), 128, 0, 0, norm_backward_dgain_kernel1)(dgain, dout, x, rstd, N, C);
            cudaCheckLaunch();
            break;
        case 2: {
            GainNorm norm{{const_cast<floatX*>(gain), dgain}, C, gain_offset};  // (backward only reads the gain)
            norm.backward(dinp, dout, x, rstd, N, scratch, 0);
            break;
        }
        default: fprintf(stderr, "unknown version %d\n", version); exit(EXIT_FAILURE);
    }
}

int main(int argc, char** argv) {
    float eps = 1e-6f;
    int first = 1, last = 2;
    if (argc > 1) { first = last = atoi(argv[1]); }
    // (N, C): the residual stream (B*T, d) and QK-norm (B*T*heads, head_dim)
    struct Shape { int N, C; const char* what; };
    std::vector<Shape> shapes = {{8 * 1024, 512, "residual"}, {8 * 1024 * 8, 64, "qk-norm"}};
    if (HOST_BACKEND) { shapes = {{259, 512, "residual"}, {1030, 64, "qk-norm"}, {77, 37, "odd C"}}; }

    bool all_ok = true;
    for (const Shape& shape : shapes) {
        int N = shape.N, C = shape.C;
        std::vector<float> x = make_random_float((size_t)N * C, 1, -2.0f, 2.0f);
        std::vector<float> dout = make_random_float((size_t)N * C, 2);
        std::vector<float> gain = make_random_float(C, 3, -0.5f, 0.5f);
        std::vector<float> dinp0 = make_random_float((size_t)N * C, 4);
        std::vector<float> dgain0 = make_random_float(C, 5);
        // the reference sees exactly the (rounded) values the kernels see
        std::vector<floatX> x_d = convert_vector<floatX>(x), dout_d = convert_vector<floatX>(dout),
                            gain_d = convert_vector<floatX>(gain), dinp0_d = convert_vector<floatX>(dinp0),
                            dgain0_d = convert_vector<floatX>(dgain0);
        for (size_t i = 0; i < x.size(); i++) {
            x[i] = to_float(x_d[i]);
            dout[i] = to_float(dout_d[i]);
            dinp0[i] = to_float(dinp0_d[i]);
        }
        for (int c = 0; c < C; c++) {
            gain[c] = to_float(gain_d[c]);
            dgain0[c] = to_float(dgain0_d[c]);
        }
        floatX* d_x = copy_to_device(x_d);
        floatX* d_dout = copy_to_device(dout_d);
        floatX* d_gain = copy_to_device(gain_d);
        floatX* d_dinp = cudaMallocElements(floatX, (size_t)N * C);
        floatX* d_dgain = cudaMallocElements(floatX, C);
        floatX* d_out = cudaMallocElements(floatX, (size_t)N * C);
        float* d_rstd = cudaMallocElements(float, N);
        float* d_scratch = cudaMallocElements(float, norm_backward_scratch_floats(N, C));

        for (float gain_offset : {1.0f, 0.0f}) {
            std::vector<float> dinp_ref = dinp0, dgain_ref = dgain0;
            norm_backward_cpu(dinp_ref.data(), dgain_ref.data(), dout.data(), x.data(), gain.data(), N, C, gain_offset, eps);
            double dgain_scale = 0.0, dinp_scale = 0.0;
            for (float v : dgain_ref) { dgain_scale = std::max(dgain_scale, (double)std::fabs(v)); }
            for (size_t i = 0; i < dinp_ref.size(); i++) { dinp_scale = std::max(dinp_scale, (double)std::fabs(dinp_ref[i] - dinp0[i])); }
            // fp32: summation order; bf16: one rounding of each output (2^-9 relative, x2 margin)
            float out_eps = PRECISION_MODE == PrecisionMode::FP32 ? 1e-5f : 1.0f / 256;
            norm_forward(d_out, d_rstd, d_x, d_gain, N, C, gain_offset, eps, 0);  // rstd as the trainer has it
            printf("norm_backward (%s), %s N=%d C=%d, %s\n", PRECISION_NAME, shape.what, N, C,
                   gain_offset == 1.0f ? "zcn" : "rms");
            for (int version = first; version <= last; version++) {
                printf("  version %d\n", version);
                cudaCheck(cudaMemcpy(d_dinp, dinp0_d.data(), dinp0_d.size() * sizeof(floatX), cudaMemcpyHostToDevice));
                cudaCheck(cudaMemcpy(d_dgain, dgain0_d.data(), C * sizeof(floatX), cudaMemcpyHostToDevice));
                norm_backward_version(version, d_dinp, d_dgain, d_scratch, d_dout, d_x, d_gain, d_rstd, N, C, gain_offset);
                all_ok &= validate_result(d_dinp, dinp_ref.data(), "dinp", (size_t)N * C, 1e-5f * dinp_scale, out_eps);
                // a sum over N rows in fp32
                all_ok &= validate_result(d_dgain, dgain_ref.data(), "dgain", C, 1e-7f * N * dgain_scale + 1e-5f, out_eps);
            }
        }
        if (kBenchmarksEnabled && all_ok) {
            // reads dout, x, dinp, writes dinp (dinp is accumulated into on every call: fine for timing)
            double bytes = 4.0 * N * C * sizeof(floatX) + N * sizeof(float);
            float baseline = 0.0f;
            print_table_header();
            for (int version = first; version <= last; version++) {
                float ms = benchmark_kernel(20, norm_backward_version, version, d_dinp, d_dgain, d_scratch, d_dout,
                                            d_x, d_gain, d_rstd, N, C, 1.0f);
                if (version == first) { baseline = ms; }
                print_result_row(shape.what, version, ms, bytes, baseline);
            }
        }
        for (void* p : {(void*)d_x, (void*)d_dout, (void*)d_gain, (void*)d_dinp, (void*)d_dgain, (void*)d_out,
                        (void*)d_rstd, (void*)d_scratch}) {
            cudaCheck(cudaFree(p));
        }
    }
    if (!all_ok) {
        printf("norm_backward: VALIDATION FAILED\n");
        return EXIT_FAILURE;
    }
    if (!kBenchmarksEnabled) { printf("norm_backward: all versions valid (benchmarks run on a GPU only)\n"); }
    return 0;
}
