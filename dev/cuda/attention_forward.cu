/*
Causal GQA attention forward with an optional same-document mask (llmc/kernels/attention.cuh):

    out[b,t,h] = sum_tau softmax_tau(q[b,t,h] . k[b,tau,j] / sqrt(hd)) v[b,tau,j],   j = h / (Hq/Hkv)
    lse[b,h,t] = log sum_tau exp(scores)        over tau <= t in t's document

q, out: (B, T, Hq, hd), k, v: (B, T, Hkv, hd) floatX; lse: (B, Hq, T) float; doc ids (B, T).

version 1: one thread per query row, keys and values read straight from global memory,
           online softmax (the baseline: no shared memory, no tiling)
version 2: llmc/kernels/attention.cuh: 64 query rows per block share 64-key tiles of K and V in
           shared memory, tiles in the future or in other documents are skipped
version 3: FlashAttention-2 on tensor cores (llmc/kernels/attention_tc.cuh, via llmc/kernels/mma.cuh), bf16
           builds only: a block of 4 warps owns 64 query rows of one head, each warp 16 rows;
           K/V tiles of 64 keys in shared memory (bf16, cp.async, double-buffered); S = Q K^T
           and O += P V are mma.sync m16n8k16 with the online softmax kept in the accumulator
           fragments; head dims that are multiples of 16 up to 128 (validated below at 16, 48,
           64 and 128).
           What bf16 builds of the trainers run. Validated on the host backend only; not yet
           run on a GPU.
version 4: cuDNN's fused SDPA (llmc/kernels/attention_cudnn.cuh): GPU bf16 builds with USE_CUDNN=1
           only, causal without the document mask; the measure our kernels are held against.

Build and run (validation on any executor, timing on a GPU):
    make build/gpu-bf16/attention_forward && ./build/gpu-bf16/attention_forward [version]
*/
#include "dev/cuda/attention_common.h"
#include "llmc/kernels/mma.cuh"

// ----------------------------------------------------------------------------------------
// CPU reference: the full T x T score matrix with an explicit mask, softmax in double

void attention_forward_cpu(float* out, float* lse, const float* q, const float* k, const float* v, const int* doc,
                           int B, int T, int Hq, int Hkv, int hd) {
    std::vector<double> scores(T);
    double scale = 1.0 / std::sqrt((double)hd);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < Hq; h++) {
            int j = h / (Hq / Hkv);
            for (int t = 0; t < T; t++) {
                const float* q_row = q + (((size_t)b * T + t) * Hq + h) * hd;
                double max_score = -INFINITY;
                for (int tau = 0; tau < T; tau++) {
                    bool allowed = tau <= t && (doc == nullptr || doc[b * T + tau] == doc[b * T + t]);
                    scores[tau] = -INFINITY;
                    if (!allowed) { continue; }
                    const float* k_row = k + (((size_t)b * T + tau) * Hkv + j) * hd;
                    double dot = 0.0;
                    for (int e = 0; e < hd; e++) { dot += (double)q_row[e] * k_row[e]; }
                    scores[tau] = dot * scale;
                    max_score = std::max(max_score, scores[tau]);
                }
                double sum = 0.0;
                for (int tau = 0; tau < T; tau++) {
                    scores[tau] = std::isinf(scores[tau]) ? 0.0 : std::exp(scores[tau] - max_score);
                    sum += scores[tau];
                }
                for (int e = 0; e < hd; e++) {
                    double o = 0.0;
                    for (int tau = 0; tau <= t; tau++) { o += scores[tau] * v[(((size_t)b * T + tau) * Hkv + j) * hd + e]; }
                    out[(((size_t)b * T + t) * Hq + h) * hd + e] = (float)(o / sum);
                }
                lse[((size_t)b * Hq + h) * T + t] = (float)(max_score + std::log(sum));
            }
        }
}

// ----------------------------------------------------------------------------------------
// version 1: thread per query row, everything from global memory

template <int HD>
__global__ void attention_forward_kernel1(floatX* out, float* lse, const floatX* q, const floatX* k, const floatX* v,
                                          const int* doc_ids, int B, int T, int Hq, int Hkv, int hd) {
    int index = blockIdx.x * blockDim.x + threadIdx.x;  // over (b, h, t), t fastest
    if (index >= B * Hq * T) { return; }
    int t = index % T, h = (index / T) % Hq, b = index / (T * Hq);
    int j = h / (Hq / Hkv);
    float q_row[HD], k_row[HD], v_row[HD], acc[HD];
    attn_load_row<HD>(q_row, q, b, t, h, T, Hq, hd, 1.0f / sqrtf((float)hd));
    for (int e = 0; e < HD; e++) { acc[e] = 0.0f; }
    float running_max = -INFINITY, running_sum = 0.0f;
    for (int tau = 0; tau <= t; tau++) {
        if (doc_ids != nullptr && doc_ids[b * T + tau] != doc_ids[b * T + t]) { continue; }
        attn_load_row<HD>(k_row, k, b, tau, j, T, Hkv, hd);
        attn_load_row<HD>(v_row, v, b, tau, j, T, Hkv, hd);
        float s = attn_dot<HD>(q_row, k_row);
        float new_max = fmaxf(running_max, s);
        float correction = expf(running_max - new_max), p = expf(s - new_max);
        running_sum = running_sum * correction + p;
        for (int e = 0; e < HD; e++) { acc[e] = acc[e] * correction + p * v_row[e]; }
        running_max = new_max;
    }
    for (int e = 0; e < HD; e++) {
        if (e < hd) { out[(((size_t)b * T + t) * Hq + h) * hd + e] = from_float<floatX>(acc[e] / running_sum); }
    }
    lse[((size_t)b * Hq + h) * T + t] = running_max + logf(running_sum);
}

// ----------------------------------------------------------------------------------------
// version 3: FlashAttention-2 on tensor cores, llmc/kernels/attention_tc.cuh (what bf16 builds run)

void attention_forward3(floatX* out, float* lse, const floatX* q, const floatX* k, const floatX* v, const int* doc_ids,
                        int B, int T, int Hq, int Hkv, int hd) {
    if (PRECISION_MODE != PrecisionMode::BF16 || !flash_supports(hd)) {
        fprintf(stderr, "attention_forward version 3: needs a bf16 build and hd a multiple of 16 up to 128 (%s, hd %d)\n",
                PRECISION_NAME, hd);
        exit(EXIT_FAILURE);
    }
    attention_check_shapes("attention_forward version 3", {B, T, Hq, Hkv, hd});
    // floatX is bf16 here (checked above); the casts only let the fp32 build compile this file
    using bf16 = __nv_bfloat16;
    attention_forward_tc({B, T, Hq, Hkv, hd, doc_ids},
                         {reinterpret_cast<const bf16*>(q), reinterpret_cast<const bf16*>(k),
                          reinterpret_cast<const bf16*>(v), reinterpret_cast<bf16*>(out), lse},
                         0);
}

// ----------------------------------------------------------------------------------------
// version 4: cuDNN (USE_CUDNN=1 GPU builds)

void attention_forward4(floatX* out, float* lse, const floatX* q, const floatX* k, const floatX* v, const int* doc_ids,
                        int B, int T, int Hq, int Hkv, int hd) {
#if defined(ENABLE_CUDNN) && defined(__CUDACC__)
    if (kAttentionHasCudnn && attention_cudnn_supports(doc_ids, hd) &&
        attention_forward_cudnn({B, T, Hq, Hkv, hd}, {q, k, v, out, lse}, 0)) {
        return;
    }
#endif
    fprintf(stderr, "attention_forward version 4: needs a bf16 GPU build with USE_CUDNN=1, no doc mask, a shape cuDNN "
                    "takes (hd %d)\n", hd);
    exit(EXIT_FAILURE);
}

// ----------------------------------------------------------------------------------------
// launcher

void attention_forward_version(int version, floatX* out, float* lse, const floatX* q, const floatX* k,
                               const floatX* v, const int* doc_ids, int B, int T, int Hq, int Hkv, int hd) {
    switch (version) {
        case 1:
            attention_dispatch_head_dim(hd, [&](auto head_dim) {
                constexpr int HD = decltype(head_dim)::value;
                LAUNCH(CEIL_DIV(B * Hq * T, 64), 64, 0, 0, attention_forward_kernel1<HD>)(out, lse, q, k, v, doc_ids,
                                                                                         B, T, Hq, Hkv, hd);
            });
            cudaCheckLaunch();
            break;
        case 2: attention_forward_scalar({B, T, Hq, Hkv, hd, doc_ids}, {q, k, v, out, lse}, 0); break;
        case 3: attention_forward3(out, lse, q, k, v, doc_ids, B, T, Hq, Hkv, hd); break;
        case 4: attention_forward4(out, lse, q, k, v, doc_ids, B, T, Hq, Hkv, hd); break;
        default: fprintf(stderr, "unknown version %d\n", version); exit(EXIT_FAILURE);
    }
}

// Validates versions first..last at one shape against the CPU reference; false on a mismatch.
bool validate_versions(int first, int last, int B, int T, int Hq, int Hkv, int hd, bool use_docs) {
    size_t q_size = (size_t)B * T * Hq * hd, kv_size = (size_t)B * T * Hkv * hd;
    std::vector<float> q = make_random_float(q_size, 1, -2.0f, 2.0f);
    std::vector<float> k = make_random_float(kv_size, 2, -2.0f, 2.0f);
    std::vector<float> v = make_random_float(kv_size, 3);
    std::vector<int> doc = make_doc_ids(B, T, 100, 4);
    // the reference sees exactly the (rounded) inputs the kernels see
    std::vector<floatX> q_x = convert_vector<floatX>(q), k_x = convert_vector<floatX>(k), v_x = convert_vector<floatX>(v);
    for (size_t i = 0; i < q_size; i++) { q[i] = to_float(q_x[i]); }
    for (size_t i = 0; i < kv_size; i++) { k[i] = to_float(k_x[i]), v[i] = to_float(v_x[i]); }
    std::vector<float> out_ref(q_size), lse_ref((size_t)B * Hq * T);
    attention_forward_cpu(out_ref.data(), lse_ref.data(), q.data(), k.data(), v.data(), use_docs ? doc.data() : nullptr,
                          B, T, Hq, Hkv, hd);

    floatX* d_q = copy_to_device(q_x);
    floatX* d_k = copy_to_device(k_x);
    floatX* d_v = copy_to_device(v_x);
    int* d_doc = use_docs ? copy_to_device(doc) : nullptr;
    floatX* d_out = cudaMallocElements(floatX, q_size);
    float* d_lse = cudaMallocElements(float, (size_t)B * Hq * T);

    printf("attention_forward (%s), B=%d T=%d Hq=%d Hkv=%d hd=%d, doc mask %s\n", PRECISION_NAME, B, T, Hq, Hkv, hd,
           use_docs ? "on" : "off");
    bool ok = true;
    for (int version = first; version <= last; version++) {
        if (!attention_version_available(version, use_docs)) { continue; }
        // fp32: summation order only; bf16: one rounding of the output (2^-8 relative).
        // Version 3 also rounds the probabilities to bf16 for the P V product (as FlashAttention-2
        // does): |sum_tau p delta v| / sum_tau p <= 2^-9 max|v| = 2^-9 here (v in [-1, 1]);
        // measured max |err| 0.0029 at hd 16..128, all of it on elements the relative term covers.
        float out_eps = PRECISION_MODE == PrecisionMode::FP32 ? 1e-5f : 1.0f / 128;
        // cuDNN (version 4) also rounds P to bf16: the same bound as version 3
        float out_tol = PRECISION_MODE == PrecisionMode::FP32 ? 1e-6f : (version >= 3 ? 1.0f / 512 : 1e-4f);
        printf("  version %d\n", version);
        cudaCheck(cudaMemset(d_out, 0, q_size * sizeof(floatX)));
        attention_forward_version(version, d_out, d_lse, d_q, d_k, d_v, d_doc, B, T, Hq, Hkv, hd);
        ok &= validate_result(d_out, out_ref.data(), "out", q_size, out_tol, out_eps);
        ok &= validate_result(d_lse, lse_ref.data(), "lse", (size_t)B * Hq * T, 1e-5f, 1e-5f);
    }
    cudaCheck(cudaFree(d_q));
    cudaCheck(cudaFree(d_k));
    cudaCheck(cudaFree(d_v));
    cudaCheck(cudaFree(d_out));
    cudaCheck(cudaFree(d_lse));
    if (d_doc != nullptr) { cudaCheck(cudaFree(d_doc)); }
    return ok;
}

int main(int argc, char** argv) {
    // validation shape (the CPU reference is O(T^2)); the benchmark uses the paper preset
    int B = 2, T = 512, Hq = 8, Hkv = 4, hd = 64;
    if (HOST_BACKEND) { T = 300; }  // validation only: keep it quick
    int first, last;
    attention_versions_from_args("attention_forward", argc, argv, &first, &last);

    bool all_ok = true;
    for (int use_docs = 0; use_docs <= 1; use_docs++) {
        all_ok &= validate_versions(first, last, B, T, Hq, Hkv, hd, use_docs);
    }
    // version 3's other head dims (its fragments tile hd in steps of 16; 48 runs padded to 64)
    if (first <= 3 && last >= 3) {
        for (int other_hd : {16, 48, 128}) { all_ok &= validate_versions(3, 3, B, T, Hq, Hkv, other_hd, other_hd == 48); }
    }
    if (!all_ok) {
        printf("attention_forward: VALIDATION FAILED\n");
        return EXIT_FAILURE;
    }
    if (kBenchmarksEnabled) {
        B = 8, T = 2048, Hq = 8, Hkv = 4, hd = 64;  // the paper preset's attention, batch 8
        size_t q_size = (size_t)B * T * Hq * hd, kv_size = (size_t)B * T * Hkv * hd;
        floatX* d_q = copy_to_device(convert_vector<floatX>(make_random_float(q_size, 5)));
        floatX* d_k = copy_to_device(convert_vector<floatX>(make_random_float(kv_size, 6)));
        floatX* d_v = copy_to_device(convert_vector<floatX>(make_random_float(kv_size, 7)));
        floatX* d_out = cudaMallocElements(floatX, q_size);
        float* d_lse = cudaMallocElements(float, (size_t)B * Hq * T);
        int* d_doc = copy_to_device(make_doc_ids(B, T, 500, 8));
        double bytes = (2.0 * q_size + 2.0 * kv_size) * sizeof(floatX) + B * Hq * T * sizeof(float);
        double causal_flops = 4.0 * B * Hq * hd * (double)T * (T + 1) / 2;
        printf("benchmark B=%d T=%d Hq=%d Hkv=%d hd=%d (TFLOP/s count the causal half, no doc mask)\n", B, T, Hq, Hkv, hd);
        print_table_header();
        for (int use_docs = 0; use_docs <= 1; use_docs++) {
            float baseline = 0.0f;
            for (int version = first; version <= last; version++) {
                if (!attention_version_available(version, use_docs)) { continue; }
                float ms = benchmark_kernel(10, attention_forward_version, version, d_out, d_lse, d_q, d_k, d_v,
                                            use_docs ? d_doc : nullptr, B, T, Hq, Hkv, hd);
                if (version == first) { baseline = ms; }
                print_result_row(use_docs ? "attention_forward (docs)" : "attention_forward", version, ms, bytes, baseline);
                printf("%28s %8s %12.1f TFLOP/s\n", "", "", causal_flops / (ms * 1e-3) / 1e12);
            }
        }
        cudaCheck(cudaFree(d_q));
        cudaCheck(cudaFree(d_k));
        cudaCheck(cudaFree(d_v));
        cudaCheck(cudaFree(d_out));
        cudaCheck(cudaFree(d_lse));
        cudaCheck(cudaFree(d_doc));
    } else {
        printf("attention_forward: all versions valid (benchmarks run on a GPU only)\n");
    }
    return 0;
}
