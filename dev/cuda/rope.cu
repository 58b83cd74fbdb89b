/*
Rotate-half RoPE forward and backward (llmc/kernels/rope.cuh) on (B, T, H, hd) tensors:

    z1 = z[:hd/2], z2 = z[hd/2:]:  forward  [z1 cos - z2 sin, z2 cos + z1 sin]
                                    backward [d1 cos + d2 sin, d2 cos - d1 sin]  (rotation by -angle)

cos/sin from rope_table (fp64 angles on the host, rounded to fp32), angle[t, i] = t * theta^(-2i/hd).

version 1: one thread per pair (i, i + hd/2), scalar loads (the baseline)
version 2: llmc/kernels/rope.cuh: one thread per x128::size pairs, 128-bit loads and stores

Build and run (validation on any executor, timing on a GPU):
    make build/gpu-bf16/rope && ./build/gpu-bf16/rope [version]
*/
#include "dev/cuda/common.h"
#include "llmc/kernels/rope.cuh"

// ----------------------------------------------------------------------------------------
// CPU reference: angles in fp64 directly (not through the table)

void rope_cpu(float* out, const float* inp, int B, int T, int H, int hd, double theta, double direction) {
    int half = hd / 2;
    for (int b = 0; b < B; b++) for (int t = 0; t < T; t++) for (int h = 0; h < H; h++) {
        size_t base = (((size_t)b * T + t) * H + h) * hd;
        for (int i = 0; i < half; i++) {
            double angle = t * std::pow(theta, -2.0 * i / hd);
            double c = std::cos(angle), s = direction * std::sin(angle);
            double z1 = inp[base + i], z2 = inp[base + half + i];
            out[base + i] = (float)(z1 * c - z2 * s);
            out[base + half + i] = (float)(z2 * c + z1 * s);
        }
    }
}

// ----------------------------------------------------------------------------------------
// launchers: version 1 is rope_kernel<1> (one pair per thread), version 2 the llmc launcher

void rope_version(int version, bool backward, floatX* out, const floatX* inp, const float* table, int B, int T,
                  int H, int hd) {
    switch (version) {
        case 1: {
            size_t threads = (size_t)B * T * H * (hd / 2);
            LAUNCH((unsigned)CEIL_DIV(threads, (size_t)256), 256, 0, 0, rope_kernel<1>)(out, inp, table, B, T, H, hd,
                                                                                         backward ? -1.0f : 1.0f);
            cudaCheckLaunch();
            break;
        }
        case 2:
            if (backward) {
                rope_backward(out, inp, table, B, T, H, hd, 0);
            } else {
                rope_forward(out, inp, table, B, T, H, hd, 0);
            }
            break;
        default: fprintf(stderr, "unknown version %d\n", version); exit(EXIT_FAILURE);
    }
}

int main(int argc, char** argv) {
    int B = 8, T = 2048, H = 8, hd = 64;
    if (HOST_BACKEND) { B = 2, T = 256, H = 4; }  // validation only: keep it quick
    double theta = 10000.0;
    int first = 1, last = 2;
    if (argc > 1) { first = last = atoi(argv[1]); }
    size_t n = (size_t)B * T * H * hd;

    std::vector<float> x = make_random_float(n, 1, -2.0f, 2.0f);
    std::vector<floatX> x_d = convert_vector<floatX>(x);
    for (size_t i = 0; i < n; i++) { x[i] = to_float(x_d[i]); }
    std::vector<float> fwd_ref(n), bwd_ref(n);
    rope_cpu(fwd_ref.data(), x.data(), B, T, H, hd, theta, 1.0);
    rope_cpu(bwd_ref.data(), x.data(), B, T, H, hd, theta, -1.0);

    floatX* d_x = copy_to_device(x_d);
    floatX* d_out = cudaMallocElements(floatX, n);
    float* d_table = copy_to_device(rope_table(T, hd, theta));

    // fp32 table and maths: ~1e-7 of the pair magnitude (<= 2.9); bf16: one rounding per output
    float out_eps = PRECISION_MODE == PrecisionMode::FP32 ? 0.0f : 1.0f / 256;
    bool all_ok = true;
    printf("rope (%s), B=%d T=%d H=%d hd=%d\n", PRECISION_NAME, B, T, H, hd);
    for (int version = first; version <= last; version++) {
        for (int backward = 0; backward <= 1; backward++) {
            printf("  version %d %s\n", version, backward ? "backward" : "forward");
            cudaCheck(cudaMemset(d_out, 0, n * sizeof(floatX)));
            rope_version(version, backward, d_out, d_x, d_table, B, T, H, hd);
            all_ok &= validate_result(d_out, backward ? bwd_ref.data() : fwd_ref.data(), "out", n, 2e-6f, out_eps);
        }
    }
    if (!all_ok) {
        printf("rope: VALIDATION FAILED\n");
        return EXIT_FAILURE;
    }
    if (kBenchmarksEnabled) {
        double bytes = 2.0 * n * sizeof(floatX) + (double)T * hd * sizeof(float);
        print_table_header();
        for (int backward = 0; backward <= 1; backward++) {
            float baseline = 0.0f;
            for (int version = first; version <= last; version++) {
                float ms = benchmark_kernel(20, rope_version, version, (bool)backward, d_out, d_x, d_table, B, T, H, hd);
                if (version == first) { baseline = ms; }
                print_result_row(backward ? "rope_backward" : "rope_forward", version, ms, bytes, baseline);
            }
        }
    } else {
        printf("rope: all versions valid (benchmarks run on a GPU only)\n");
    }
    cudaCheck(cudaFree(d_x));
    cudaCheck(cudaFree(d_out));
    cudaCheck(cudaFree(d_table));
    return 0;
}
