/*
Causal GQA attention backward with an optional same-document mask (llmc/kernels/attention.cuh).
With P = softmax of the scaled, masked scores (recomputed from the forward's lse):

    D[t]      = dout[t] . out[t]
    dS[t,tau] = P[t,tau] (dout[t] . v[tau] - D[t])
    dq[t]     = sum_tau dS[t,tau] k[tau] / sqrt(hd)
    dk[tau]   = sum over the group's query heads, sum_t dS[t,tau] q[t] / sqrt(hd)
    dv[tau]   = sum over the group's query heads, sum_t P[t,tau] dout[t]

q, dq, out, dout: (B, T, Hq, hd), k, v, dk, dv: (B, T, Hkv, hd) floatX; lse, D: (B, Hq, T).
Both versions are deterministic (no atomics) and overwrite the gradients.

version 1: two kernels, one thread per query row (D, dq) and one thread per key row
           (dk, dv), everything read straight from global memory (the baseline)
version 2: llmc/kernels/attention.cuh: the same split, 64 rows per block sharing 64-row tiles of
           K/V (dq kernel) or Q/dout/lse/D (dk/dv kernel) in shared memory, with tiles
           in the future or in other documents skipped
version 3: FlashAttention-2 backward on tensor cores (llmc/kernels/attention_tc.cuh), bf16 builds
           only, hd a multiple of 16 up to 128: P recomputed per 64x64 tile from lse in the
           mma accumulators; a dq kernel (4 warps x 16 query rows; D, then S, dP, dS, dQ += dS K
           per K/V tile) and a dk/dv kernel (4 warps x 16 keys of one kv head, over the query
           tiles of every query head of its group: S^T, dP^T, dV += P^T dO, dK += dS^T Q); no
           atomics. What bf16 builds of the trainers run. Validated on the host backend only
           (below at hd 16, 64, 128, with and without the document mask, GQA 2); not yet run
           on a GPU.
version 4: cuDNN's fused SDPA backward, deterministic algorithm (llmc/kernels/attention_cudnn.cuh):
           GPU bf16 builds with USE_CUDNN=1 only, causal without the document mask.

Build and run (validation on any executor, timing on a GPU):
    make build/gpu-bf16/attention_backward && ./build/gpu-bf16/attention_backward [version]
*/
#include "dev/cuda/attention_common.h"

// ----------------------------------------------------------------------------------------
// CPU reference: full softmax rows in double, gradients written out term by term.
// `out` is the forward output as the backward receives it (the stored floatX values).

void attention_backward_cpu(float* dq, float* dk, float* dv, const float* dout, const float* out, const float* q,
                            const float* k, const float* v, const int* doc, int B, int T, int Hq, int Hkv, int hd) {
    std::vector<double> prob(T), dq_acc(hd);
    std::vector<double> dk_acc((size_t)B * T * Hkv * hd, 0.0), dv_acc((size_t)B * T * Hkv * hd, 0.0);
    double scale = 1.0 / std::sqrt((double)hd);
    auto qi = [&](int b, int t, int h) { return (((size_t)b * T + t) * Hq + h) * hd; };
    auto ki = [&](int b, int t, int j) { return (((size_t)b * T + t) * Hkv + j) * hd; };
    for (int b = 0; b < B; b++)
        for (int h = 0; h < Hq; h++) {
            int j = h / (Hq / Hkv);
            for (int t = 0; t < T; t++) {
                double max_score = -INFINITY;
                for (int tau = 0; tau < T; tau++) {
                    prob[tau] = -INFINITY;
                    if (tau > t || (doc != nullptr && doc[b * T + tau] != doc[b * T + t])) { continue; }
                    double dot = 0.0;
                    for (int e = 0; e < hd; e++) { dot += (double)q[qi(b, t, h) + e] * k[ki(b, tau, j) + e]; }
                    prob[tau] = dot * scale;
                    max_score = std::max(max_score, prob[tau]);
                }
                double sum = 0.0;
                for (int tau = 0; tau < T; tau++) {
                    prob[tau] = std::isinf(prob[tau]) ? 0.0 : std::exp(prob[tau] - max_score);
                    sum += prob[tau];
                }
                double D = 0.0;
                for (int e = 0; e < hd; e++) { D += (double)dout[qi(b, t, h) + e] * out[qi(b, t, h) + e]; }
                std::fill(dq_acc.begin(), dq_acc.end(), 0.0);
                for (int tau = 0; tau <= t; tau++) {
                    double p = prob[tau] / sum;
                    if (p == 0.0) { continue; }
                    double dp = 0.0;
                    for (int e = 0; e < hd; e++) { dp += (double)dout[qi(b, t, h) + e] * v[ki(b, tau, j) + e]; }
                    double ds = p * (dp - D);
                    for (int e = 0; e < hd; e++) {
                        dq_acc[e] += ds * scale * k[ki(b, tau, j) + e];
                        dk_acc[ki(b, tau, j) + e] += ds * scale * q[qi(b, t, h) + e];
                        dv_acc[ki(b, tau, j) + e] += p * dout[qi(b, t, h) + e];
                    }
                }
                for (int e = 0; e < hd; e++) { dq[qi(b, t, h) + e] = (float)dq_acc[e]; }
            }
        }
    for (size_t i = 0; i < dk_acc.size(); i++) { dk[i] = (float)dk_acc[i], dv[i] = (float)dv_acc[i]; }
}

// ----------------------------------------------------------------------------------------
// version 1: thread per row, everything from global memory

template <int HD>
__global__ void attention_backward_dq_kernel1(floatX* dq, float* D, const floatX* dout, const floatX* out,
                                              const floatX* q, const floatX* k, const floatX* v, const float* lse,
                                              const int* doc_ids, int B, int T, int Hq, int Hkv, int hd) {
    int index = blockIdx.x * blockDim.x + threadIdx.x;  // over (b, h, t), t fastest
    if (index >= B * Hq * T) { return; }
    int t = index % T, h = (index / T) % Hq, b = index / (T * Hq);
    int j = h / (Hq / Hkv);
    float scale = 1.0f / sqrtf((float)hd);
    float q_row[HD], dout_row[HD], other[HD], dq_acc[HD];
    attn_load_row<HD>(q_row, q, b, t, h, T, Hq, hd, scale);
    attn_load_row<HD>(dout_row, dout, b, t, h, T, Hq, hd);
    attn_load_row<HD>(other, out, b, t, h, T, Hq, hd);
    float row_D = attn_dot<HD>(dout_row, other), row_lse = lse[index];
    for (int e = 0; e < HD; e++) { dq_acc[e] = 0.0f; }
    for (int tau = 0; tau <= t; tau++) {
        if (doc_ids != nullptr && doc_ids[b * T + tau] != doc_ids[b * T + t]) { continue; }
        attn_load_row<HD>(other, v, b, tau, j, T, Hkv, hd);
        float dp = attn_dot<HD>(dout_row, other);
        attn_load_row<HD>(other, k, b, tau, j, T, Hkv, hd);
        float p = expf(attn_dot<HD>(q_row, other) - row_lse);
        for (int e = 0; e < HD; e++) { dq_acc[e] += p * (dp - row_D) * other[e]; }
    }
    D[index] = row_D;
    for (int e = 0; e < HD; e++) {
        if (e < hd) { dq[(((size_t)b * T + t) * Hq + h) * hd + e] = from_float<floatX>(dq_acc[e] * scale); }
    }
}

template <int HD>
__global__ void attention_backward_dkdv_kernel1(floatX* dk, floatX* dv, const float* D, const floatX* dout,
                                                const floatX* q, const floatX* k, const floatX* v, const float* lse,
                                                const int* doc_ids, int B, int T, int Hq, int Hkv, int hd) {
    int index = blockIdx.x * blockDim.x + threadIdx.x;  // over (b, j, tau), tau fastest
    if (index >= B * Hkv * T) { return; }
    int tau = index % T, j = (index / T) % Hkv, b = index / (T * Hkv);
    int group = Hq / Hkv;
    float scale = 1.0f / sqrtf((float)hd);
    float k_row[HD], v_row[HD], q_row[HD], dout_row[HD], dk_acc[HD], dv_acc[HD];
    attn_load_row<HD>(k_row, k, b, tau, j, T, Hkv, hd);
    attn_load_row<HD>(v_row, v, b, tau, j, T, Hkv, hd);
    for (int e = 0; e < HD; e++) { dk_acc[e] = 0.0f, dv_acc[e] = 0.0f; }
    for (int h = j * group; h < (j + 1) * group; h++) {
        for (int t = tau; t < T; t++) {
            if (doc_ids != nullptr && doc_ids[b * T + tau] != doc_ids[b * T + t]) { continue; }
            attn_load_row<HD>(q_row, q, b, t, h, T, Hq, hd, scale);
            attn_load_row<HD>(dout_row, dout, b, t, h, T, Hq, hd);
            size_t stat = ((size_t)b * Hq + h) * T + t;
            float p = expf(attn_dot<HD>(q_row, k_row) - lse[stat]);
            float ds = p * (attn_dot<HD>(dout_row, v_row) - D[stat]);
            for (int e = 0; e < HD; e++) { dv_acc[e] += p * dout_row[e], dk_acc[e] += ds * q_row[e]; }
        }
    }
    for (int e = 0; e < HD; e++) {
        if (e < hd) {
            dk[(((size_t)b * T + tau) * Hkv + j) * hd + e] = from_float<floatX>(dk_acc[e]);
            dv[(((size_t)b * T + tau) * Hkv + j) * hd + e] = from_float<floatX>(dv_acc[e]);
        }
    }
}

// ----------------------------------------------------------------------------------------
// launcher

void attention_backward_version(int version, floatX* dq, floatX* dk, floatX* dv, float* scratch, const floatX* dout,
                                const floatX* out, const floatX* q, const floatX* k, const floatX* v,
                                const float* lse, const int* doc_ids, int B, int T, int Hq, int Hkv, int hd) {
    switch (version) {
        case 1:
            attention_dispatch_head_dim(hd, [&](auto head_dim) {
                constexpr int HD = decltype(head_dim)::value;
                LAUNCH(CEIL_DIV(B * Hq * T, 64), 64, 0, 0, attention_backward_dq_kernel1<HD>)(
                    dq, scratch, dout, out, q, k, v, lse, doc_ids, B, T, Hq, Hkv, hd);
                cudaCheckLaunch();
                LAUNCH(CEIL_DIV(B * Hkv * T, 64), 64, 0, 0, attention_backward_dkdv_kernel1<HD>)(
                    dk, dv, scratch, dout, q, k, v, lse, doc_ids, B, T, Hq, Hkv, hd);
            });
            cudaCheckLaunch();
            break;
        case 2:
            // (the backward only reads out and lse: AttnTensors holds them writable for the forward)
            attention_backward_scalar({B, T, Hq, Hkv, hd, doc_ids},
                                      {q, k, v, const_cast<floatX*>(out), const_cast<float*>(lse)},
                                      {dout, dq, dk, dv, scratch}, 0);
            break;
        case 3:
            if (PRECISION_MODE != PrecisionMode::BF16 || !flash_supports(hd)) {
                fprintf(stderr, "attention_backward version 3: needs a bf16 build and hd a multiple of 16 up to 128 "
                                "(%s, hd %d)\n", PRECISION_NAME, hd);
                exit(EXIT_FAILURE);
            }
            // floatX is bf16 here (checked above); the casts only let the fp32 build compile this file
            {
                using bf16 = __nv_bfloat16;
                const AttnTensorsOf<bf16> t{reinterpret_cast<const bf16*>(q), reinterpret_cast<const bf16*>(k),
                                            reinterpret_cast<const bf16*>(v),
                                            reinterpret_cast<bf16*>(const_cast<floatX*>(out)), const_cast<float*>(lse)};
                const AttnGradsOf<bf16> g{reinterpret_cast<const bf16*>(dout), reinterpret_cast<bf16*>(dq),
                                          reinterpret_cast<bf16*>(dk), reinterpret_cast<bf16*>(dv), scratch};
                attention_backward_tc({B, T, Hq, Hkv, hd, doc_ids}, t, g, 0);
            }
            break;
        case 4:
#if defined(ENABLE_CUDNN) && defined(__CUDACC__)
            if (kAttentionHasCudnn && attention_cudnn_supports(doc_ids, hd) &&
                attention_backward_cudnn({B, T, Hq, Hkv, hd}, {q, k, v, const_cast<floatX*>(out), const_cast<float*>(lse)},
                                         {dout, dq, dk, dv, nullptr}, 0)) {
                break;
            }
#endif
            fprintf(stderr, "attention_backward version 4: needs a bf16 GPU build with USE_CUDNN=1, no doc mask, a shape cuDNN takes\n");
            exit(EXIT_FAILURE);
        default: fprintf(stderr, "unknown version %d\n", version); exit(EXIT_FAILURE);
    }
}

std::vector<float> rounded_to_floatX(std::vector<float> x) {
    for (auto& value : x) { value = to_float(from_float<floatX>(value)); }
    return x;
}

double max_abs(const std::vector<float>& x) {
    double m = 0.0;
    for (float value : x) { m = std::max(m, (double)std::fabs(value)); }
    return m;
}

// Validates versions first..last at one shape against the CPU reference; false on a mismatch.
bool validate_versions(int first, int last, int B, int T, int Hq, int Hkv, int hd, bool use_docs) {
    bool ok = true;
    size_t q_size = (size_t)B * T * Hq * hd, kv_size = (size_t)B * T * Hkv * hd, stat_size = (size_t)B * Hq * T;
    // the reference sees exactly the (rounded) inputs the kernels see
    std::vector<float> q = rounded_to_floatX(make_random_float(q_size, 1, -2.0f, 2.0f));
    std::vector<float> k = rounded_to_floatX(make_random_float(kv_size, 2, -2.0f, 2.0f));
    std::vector<float> v = rounded_to_floatX(make_random_float(kv_size, 3));
    std::vector<float> dout = rounded_to_floatX(make_random_float(q_size, 4));
    std::vector<int> doc = make_doc_ids(B, T, 100, 5);
    floatX* d_q = copy_to_device(convert_vector<floatX>(q));
    floatX* d_k = copy_to_device(convert_vector<floatX>(k));
    floatX* d_v = copy_to_device(convert_vector<floatX>(v));
    floatX* d_dout = copy_to_device(convert_vector<floatX>(dout));
    int* d_doc = use_docs ? copy_to_device(doc) : nullptr;
    floatX* d_out = cudaMallocElements(floatX, q_size);
    float* d_lse = cudaMallocElements(float, stat_size);
    float* d_scratch = cudaMallocElements(float, attention_backward_scratch_floats(B, T, Hq, hd));
    floatX* d_dq = cudaMallocElements(floatX, q_size);
    floatX* d_dk = cudaMallocElements(floatX, kv_size);
    floatX* d_dv = cudaMallocElements(floatX, kv_size);
    // the backward's inputs out and lse come from the (tested) scalar forward: any forward that
    // meets the contract will do, and it is the cheap one on the host backend
    attention_forward_scalar({B, T, Hq, Hkv, hd, d_doc}, {d_q, d_k, d_v, d_out, d_lse}, 0);
    std::vector<floatX> out_x = copy_from_device(d_out, q_size);
    std::vector<float> out(q_size);
    for (size_t i = 0; i < q_size; i++) { out[i] = to_float(out_x[i]); }
    std::vector<float> dq_ref(q_size), dk_ref(kv_size), dv_ref(kv_size);
    attention_backward_cpu(dq_ref.data(), dk_ref.data(), dv_ref.data(), dout.data(), out.data(), q.data(),
                           k.data(), v.data(), use_docs ? doc.data() : nullptr, B, T, Hq, Hkv, hd);

    // fp32: summation order only; bf16: one rounding of each gradient (2^-8 relative);
    // plus an absolute part relative to the array's largest value. Version 3 also rounds P and
    // dS to bf16 for its products (as FlashAttention-2 does): an error of 2^-9 of the largest
    // terms of each sum, not of the (possibly cancelling) result. Measured on these cases, the
    // worst element needs 3.4e-3 x max|ref| (dq, hd 16, doc mask on; 1.1e-3 for dk, dv).
    bool fp32 = PRECISION_MODE == PrecisionMode::FP32;
    float eps = fp32 ? 1e-5f : 1.0f / 128;
    printf("attention_backward (%s), B=%d T=%d Hq=%d Hkv=%d hd=%d, doc mask %s\n", PRECISION_NAME, B, T, Hq, Hkv,
           hd, use_docs ? "on" : "off");
    for (int version = first; version <= last; version++) {
        if (!attention_version_available(version, use_docs)) { continue; }
        printf("  version %d\n", version);
        // cuDNN (version 4) rounds P and dS to bf16 as version 3 does: the same bound
        float abs_frac = fp32 ? 1e-5f : (version >= 3 ? 4e-3f : 1e-3f);
        cudaCheck(cudaMemset(d_dq, 0xff, q_size * sizeof(floatX)));  // NaN: gradients are overwritten
        cudaCheck(cudaMemset(d_dk, 0xff, kv_size * sizeof(floatX)));
        cudaCheck(cudaMemset(d_dv, 0xff, kv_size * sizeof(floatX)));
        attention_backward_version(version, d_dq, d_dk, d_dv, d_scratch, d_dout, d_out, d_q, d_k, d_v, d_lse, d_doc,
                                   B, T, Hq, Hkv, hd);
        ok &= validate_result(d_dq, dq_ref.data(), "dq", q_size, abs_frac * max_abs(dq_ref), eps);
        ok &= validate_result(d_dk, dk_ref.data(), "dk", kv_size, abs_frac * max_abs(dk_ref), eps);
        ok &= validate_result(d_dv, dv_ref.data(), "dv", kv_size, abs_frac * max_abs(dv_ref), eps);
    }
    for (void* p : {(void*)d_q, (void*)d_k, (void*)d_v, (void*)d_dout, (void*)d_out, (void*)d_lse,
                    (void*)d_scratch, (void*)d_dq, (void*)d_dk, (void*)d_dv}) {
        cudaCheck(cudaFree(p));
    }
    if (d_doc != nullptr) { cudaCheck(cudaFree(d_doc)); }
    return ok;
}

int main(int argc, char** argv) {
    // validation shape (the CPU reference is O(T^2)); the benchmark uses the paper preset
    int B = 2, T = 512, Hq = 8, Hkv = 4, hd = 64;
    if (HOST_BACKEND) { T = 200; }  // validation only: keep it quick
    int first, last;
    attention_versions_from_args("attention_backward", argc, argv, &first, &last);

    bool all_ok = true;
    for (int use_docs = 0; use_docs <= 1; use_docs++) {
        all_ok &= validate_versions(first, last, B, T, Hq, Hkv, hd, use_docs);
    }
    // version 3's smallest and largest head dims (its fragments tile hd in steps of 16); one
    // batch row on the host: the emulated mma makes version 3 the slow one there (racecheck)
    if (first <= 3 && last >= 3) {
        for (int other_hd : {16, 128}) {
            for (int use_docs = 0; use_docs <= 1; use_docs++) {
                all_ok &= validate_versions(3, 3, HOST_BACKEND ? 1 : B, T, Hq, Hkv, other_hd, use_docs);
            }
        }
    }
    if (!all_ok) {
        printf("attention_backward: VALIDATION FAILED\n");
        return EXIT_FAILURE;
    }
    if (kBenchmarksEnabled) {
        B = 8, T = 2048, Hq = 8, Hkv = 4, hd = 64;  // the paper preset's attention, batch 8
        size_t q_size = (size_t)B * T * Hq * hd, kv_size = (size_t)B * T * Hkv * hd, stat_size = (size_t)B * Hq * T;
        floatX* d_q = copy_to_device(convert_vector<floatX>(make_random_float(q_size, 6)));
        floatX* d_k = copy_to_device(convert_vector<floatX>(make_random_float(kv_size, 7)));
        floatX* d_v = copy_to_device(convert_vector<floatX>(make_random_float(kv_size, 8)));
        floatX* d_dout = copy_to_device(convert_vector<floatX>(make_random_float(q_size, 9)));
        int* d_doc = copy_to_device(make_doc_ids(B, T, 500, 10));
        floatX* d_out = cudaMallocElements(floatX, q_size);
        float* d_lse = cudaMallocElements(float, stat_size);
        float* d_scratch = cudaMallocElements(float, attention_backward_scratch_floats(B, T, Hq, hd));
        floatX* d_dq = cudaMallocElements(floatX, q_size);
        floatX* d_dk = cudaMallocElements(floatX, kv_size);
        floatX* d_dv = cudaMallocElements(floatX, kv_size);
        double bytes = (4.0 * q_size + 4.0 * kv_size) * sizeof(floatX) + 2.0 * stat_size * sizeof(float);
        double causal_flops = 2.5 * 4.0 * B * Hq * hd * (double)T * (T + 1) / 2;  // 2.5x the forward
        printf("benchmark B=%d T=%d Hq=%d Hkv=%d hd=%d (TFLOP/s count 2.5x the forward's causal half)\n", B, T, Hq, Hkv, hd);
        print_table_header();
        for (int use_docs = 0; use_docs <= 1; use_docs++) {
            const int* docs = use_docs ? d_doc : nullptr;
            attention_forward({B, T, Hq, Hkv, hd, docs}, {d_q, d_k, d_v, d_out, d_lse}, 0);
            float baseline = 0.0f;
            for (int version = first; version <= last; version++) {
                if (!attention_version_available(version, use_docs)) { continue; }
                float ms = benchmark_kernel(10, attention_backward_version, version, d_dq, d_dk, d_dv, d_scratch, d_dout,
                                            d_out, d_q, d_k, d_v, d_lse, docs, B, T, Hq, Hkv, hd);
                if (version == first) { baseline = ms; }
                print_result_row(use_docs ? "attention_backward (docs)" : "attention_backward", version, ms, bytes, baseline);
                printf("%28s %8s %12.1f TFLOP/s\n", "", "", causal_flops / (ms * 1e-3) / 1e12);
            }
        }
        for (void* p : {(void*)d_q, (void*)d_k, (void*)d_v, (void*)d_dout, (void*)d_doc, (void*)d_out, (void*)d_lse,
                        (void*)d_scratch, (void*)d_dq, (void*)d_dk, (void*)d_dv}) {
            cudaCheck(cudaFree(p));
        }
    } else {
        printf("attention_backward: all versions valid (benchmarks run on a GPU only)\n");
    }
    return 0;
}
