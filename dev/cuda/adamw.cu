/*
AdamW step (llmc/kernels/adamw.cuh) against a double reference, with and without fp32 master
weights (bf16 builds keep them; fp32 builds update the parameters directly):
    m = b1 m + (1-b1) g s;  v = b2 v + (1-b2) (g s)^2
    p = p (1 - lr wd) - lr (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps)
and the global gradient norm with clipping (llmc/kernels/reduce.cuh: deterministic two-pass sum
of squares; bit-identical when repeated).

version 1: llmc/kernels/adamw.cuh's adamw_kernel, one thread per element (launched here)
version 2: adamw_update, what the trainers call: the same kernel on a GPU, on the host backend
           its per-element function as a vectorised loop

    ./build/<dir>/adamw
*/
#include "dev/cuda/common.h"
#include "llmc/kernels/adamw.cuh"
#include "llmc/kernels/reduce.cuh"

template <typename T>
static void copy_into_device(T* device, const std::vector<T>& host) {
    cudaCheck(cudaMemcpy(device, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
}

int main() {
    size_t n = HOST_BACKEND ? 50001 : 64 * 1024 * 1024;
    const int t = 3;  // third step: bias corrections differ from 1
    AdamWStep s;
    s.lr = 1e-3f;
    s.beta1 = 0.9f;
    s.beta2 = 0.95f;
    s.eps = 1e-8f;
    s.weight_decay = 0.1f;
    s.beta1_correction = (float)(1.0 - std::pow(0.9, t));
    s.beta2_correction = (float)(1.0 - std::pow(0.95, t));
    std::vector<float> p0 = make_random_float(n, 1), g_f = make_random_float(n, 2), m0 = make_random_float(n, 3, -0.1f, 0.1f),
                       v0 = make_random_float(n, 4, 0.0f, 0.01f);
    std::vector<floatX> p_x = convert_vector<floatX>(p0), g_x = convert_vector<floatX>(g_f);

    // global norm and clip factor first (as the trainer does)
    double norm_sq = 0.0;
    for (size_t i = 0; i < n; i++) { norm_sq += (double)to_float(g_x[i]) * to_float(g_x[i]); }
    float* d_scratch = cudaMallocElements(float, kReduceBlocks);
    float* d_norm_sq = cudaMallocElements(float, 1);
    floatX* d_g = copy_to_device(g_x);
    dot_product(d_norm_sq, d_scratch, d_g, d_g, n, 1.0f, false, 0);
    float ref_norm_sq = (float)norm_sq;
    printf("adamw (%s), n=%zu\n", PRECISION_NAME, n);
    bool ok = validate_result(d_norm_sq, &ref_norm_sq, "norm^2", 1, 0.0f, 1e-5f);
    std::vector<float> first = copy_from_device(d_norm_sq, 1);
    dot_product(d_norm_sq, d_scratch, d_g, d_g, n, 1.0f, false, 0);
    std::vector<float> again = copy_from_device(d_norm_sq, 1);
    printf("    norm bit-identical on rerun: %s\n", first[0] == again[0] ? "yes" : "NO");
    ok &= first[0] == again[0];
    // the dot product's vector and element-wise paths and its grid sizes: lengths around
    // the vector width and the block thresholds, aligned and misaligned starts; a and b
    // differ so that a swapped or skipped element shows (every element is +-1 or +-2 apart)
    for (size_t len : {(size_t)1, (size_t)7, (size_t)8, (size_t)9, (size_t)4097, (size_t)40000, n - 1}) {
        for (size_t start : {(size_t)0, (size_t)1}) {
            const floatX* a = d_g + start;
            std::vector<floatX> bx(len);
            double dot = 0.0;
            for (size_t i = 0; i < len; i++) {
                bx[i] = from_float<floatX>((i % 3 == 0 ? 2.0f : -1.0f));
                dot += (double)to_float(g_x[start + i]) * to_float(bx[i]);
            }
            floatX* d_b = copy_to_device(bx);
            float* d_dot = cudaMallocElements(float, 1);
            dot_product(d_dot, d_scratch, a, d_b, len, 1.0f, false, 0);
            float got = copy_from_device(d_dot, 1)[0];
            bool good = std::fabs(got - dot) <= 1e-5 * (std::fabs(dot) + std::sqrt((double)len));
            if (!good) { printf("    dot product n=%zu start=%zu: %g, expected %g\n", len, start, got, dot); }
            ok &= good;
            cudaFree(d_b);
            cudaFree(d_dot);
        }
    }
    printf("    dot products over 7 lengths x 2 alignments: %s\n", ok ? "ok" : "FAILED");
    s.grad_scale = std::min(1.0f, 10.0f / (std::sqrt(first[0]) + 1e-6f));  // clip to 10

    for (bool with_master : {false, true}) {
        if (!with_master && PRECISION_MODE != PrecisionMode::FP32) { continue; }  // bf16 always has masters
        std::vector<float> p_ref(n), m_ref(n), v_ref(n);
        for (size_t i = 0; i < n; i++) {
            double g = (double)to_float(g_x[i]) * s.grad_scale;
            double m = s.beta1 * (double)m0[i] + (1 - s.beta1) * g, v = s.beta2 * (double)v0[i] + (1 - s.beta2) * g * g;
            double p = with_master ? p0[i] : to_float(p_x[i]);
            p = p * (1 - (double)s.lr * s.weight_decay) - s.lr * (m / s.beta1_correction) / (std::sqrt(v / s.beta2_correction) + s.eps);
            p_ref[i] = (float)p;
            m_ref[i] = (float)m;
            v_ref[i] = (float)v;
        }
        floatX* d_p = copy_to_device(p_x);
        float* d_master = with_master ? copy_to_device(p0) : nullptr;
        float* d_m = copy_to_device(m0);
        float* d_v = copy_to_device(v0);
        std::vector<float> version_results[2];
        for (int version = 1; version <= 2; version++) {
            copy_into_device(d_p, p_x);
            if (with_master) { copy_into_device(d_master, p0); }
            copy_into_device(d_m, m0);
            copy_into_device(d_v, v0);
            if (version == 1) {
                LAUNCH(CEIL_DIV(n, 256), 256, 0, 0, adamw_kernel<floatX>)(d_p, d_master, d_g, d_m, d_v, n, s);
                cudaCheck(cudaGetLastError());
            } else {
                adamw_update(d_p, d_master, d_g, d_m, d_v, n, s, 0);
            }
            printf("  version %d, %s master weights\n", version, with_master ? "with" : "without");
            ok &= validate_result(d_m, m_ref.data(), "m", n, 1e-9f, 1e-5f);
            ok &= validate_result(d_v, v_ref.data(), "v", n, 1e-12f, 1e-5f);
            // the step is ~lr; fp32 rounding of p (|p| <= 1) is ~6e-8
            if (with_master) { ok &= validate_result(d_master, p_ref.data(), "master", n, 2e-7f, 1e-6f); }
            ok &= validate_result(d_p, p_ref.data(), "params", n, 2e-7f, PRECISION_MODE == PrecisionMode::FP32 ? 1e-6f : 1.0f / 256);
            std::vector<floatX> got = copy_from_device(d_p, n);
            for (floatX x : got) { version_results[version - 1].push_back(to_float(x)); }
        }
        // one per-element function: the loop and the kernel agree bit for bit
        bool same = version_results[0] == version_results[1];
        printf("    versions 1 and 2 bit-identical: %s\n", same ? "yes" : "NO");
        ok &= same;
        if (kBenchmarksEnabled) {
            float ms = benchmark_kernel(10, adamw_update<floatX>, d_p, d_master, d_g, d_m, d_v, n, s, (cudaStream_t)0);
            print_table_header();
            print_result_row(with_master ? "adamw (master)" : "adamw", 1, ms, (double)n * (3 * sizeof(floatX) + 4 * sizeof(float) + (with_master ? 8 : 0)), ms);
        }
        cudaCheck(cudaFree(d_p));
        if (d_master) { cudaCheck(cudaFree(d_master)); }
        cudaCheck(cudaFree(d_m));
        cudaCheck(cudaFree(d_v));
    }
    cudaCheck(cudaFree(d_scratch));
    cudaCheck(cudaFree(d_norm_sq));
    cudaCheck(cudaFree(d_g));
    if (!ok) {
        printf("adamw: VALIDATION FAILED\n");
        return EXIT_FAILURE;
    }
    if (!kBenchmarksEnabled) { printf("adamw: valid (benchmarks run on a GPU only)\n"); }
    return 0;
}
