/*
Tests of the causal GQA attention kernels (llmc/kernels/attention.cuh) against an independent
plain C++ reference in double precision that builds the full T x T score matrix with an
explicit mask, a full softmax, and the analytic gradients written out term by term.

- forward: out and lse, for MHA and GQA (ratios 2 and 4), hd 6/8/16/48/64/128, T not a
  multiple of the 64-row tile, B > 1, with and without the document mask (several
  documents per row, rows that start mid-document, unsorted ids);
- backward: dq, dk, dv against the reference's analytic gradients (same cases);
- fp32 build: a central finite-difference check of all three gradients on a tiny case;
- gradients are overwritten (outputs and scratch filled with NaN before the call);
- determinism: two runs are bitwise equal;
- the tensor-core backward's dq turns over many key blocks (T 620, a GQA group of 4, documents).
In the bf16 build the reference gets the same bf16-rounded inputs as the kernels (for the
backward that includes the stored, rounded out, which enters D = dout . out). bf16 builds
run the tensor-core kernels (llmc/kernels/attention_tc.cuh) at head dims that are multiples of 16
(here 16, 48, 64, 128) and the scalar kernels at the others (6, 8): the scalar path's
tolerance is relative 2^-7 (one bf16 rounding of each output) plus a small absolute part
proportional to the array's largest reference value (summation order); the tensor-core
path's is derived from its rounding of P and dS (check_rounding_bound).

Usage: test_attention [name-filter]
*/
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "llmc/kernels/attention.cuh"
#include "dev/test/attention_shape.h"
#include "dev/test/compare.h"
#include "dev/test/testing.h"

constexpr bool kFp32 = PRECISION_MODE == PrecisionMode::FP32;

// Inputs of one case, as floats that are exactly representable in floatX.
struct Inputs {
    std::vector<float> q, k, v, dout;
    std::vector<int> doc;  // empty: no document mask
};

static std::vector<float> random_floatx(size_t n, std::mt19937& rng, float scale) {
    std::normal_distribution<float> dist(0.0f, scale);
    std::vector<float> x(n);
    for (auto& value : x) { value = to_float(from_float<floatX>(dist(rng))); }
    return x;
}

// Document ids as the model makes them: every row starts mid-document (id 0: the tail of
// a document from an earlier row), then new documents start at random positions.
static std::vector<int> sorted_doc_ids(int B, int T, std::mt19937& rng, int mean_doc_length) {
    std::vector<int> doc((size_t)B * T);
    std::uniform_int_distribution<int> coin(0, mean_doc_length - 1);
    for (int b = 0; b < B; b++) {
        int id = 0;
        for (int t = 0; t < T; t++) {
            if (t > 0 && coin(rng) == 0) { id++; }
            doc[(size_t)b * T + t] = id;
        }
    }
    return doc;
}

static Inputs make_inputs(const Shape& s, uint32_t seed, float qk_scale, int doc_mode) {
    std::mt19937 rng(seed);
    Inputs in;
    in.q = random_floatx(s.q_size(), rng, qk_scale);
    in.k = random_floatx(s.kv_size(), rng, qk_scale);
    in.v = random_floatx(s.kv_size(), rng, 1.0f);
    in.dout = random_floatx(s.q_size(), rng, 1.0f);
    if (doc_mode == 1) { in.doc = sorted_doc_ids(s.B, s.T, rng, 20); }
    if (doc_mode == 2) {  // unsorted ids: interleaved "documents"
        in.doc.resize((size_t)s.B * s.T);
        for (int b = 0; b < s.B; b++)
            for (int t = 0; t < s.T; t++) in.doc[(size_t)b * s.T + t] = (t / 3 + b) % 4;
    }
    return in;
}

// ----------------------------------------------------------------------------------------
// reference: full scores, explicit mask, softmax, analytic gradients, all in double

struct Reference {
    std::vector<double> out, lse, dq, dk, dv;
    // per element, the sum of the absolute values of its terms (prob |v| for out, |dS k| / sqrt(hd)
    // for dq, ...): rounding P or dS to bf16 (2^-9 relative) moves a result by at most 2^-9 of it
    std::vector<double> out_mag, dq_mag, dk_mag, dv_mag;
};

// stored_out: the forward output the backward is given (D = dout . stored_out); nullptr: the
// reference's own out rounded to floatX.
static Reference reference_attention(const Shape& s, const Inputs& in, const std::vector<float>* stored_out = nullptr) {
    const int B = s.B, T = s.T, Hq = s.Hq, Hkv = s.Hkv, hd = s.hd;
    auto qi = [&](int b, int t, int h, int e) { return (((size_t)b * T + t) * Hq + h) * hd + e; };
    auto ki = [&](int b, int t, int j, int e) { return (((size_t)b * T + t) * Hkv + j) * hd + e; };
    auto allowed = [&](int b, int t, int tau) {
        if (tau > t) { return false; }
        return in.doc.empty() || in.doc[(size_t)b * T + tau] == in.doc[(size_t)b * T + t];
    };
    Reference r;
    r.out.assign(s.q_size(), 0.0);
    r.lse.assign(s.stat_size(), 0.0);
    r.dq.assign(s.q_size(), 0.0);
    r.dk.assign(s.kv_size(), 0.0);
    r.dv.assign(s.kv_size(), 0.0);
    r.out_mag.assign(s.q_size(), 0.0);
    r.dq_mag.assign(s.q_size(), 0.0);
    r.dk_mag.assign(s.kv_size(), 0.0);
    r.dv_mag.assign(s.kv_size(), 0.0);
    double scale = 1.0 / std::sqrt((double)hd);
    std::vector<double> score(T), prob(T), dprob(T);
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < Hq; h++) {
            int j = h / (Hq / Hkv);
            for (int t = 0; t < T; t++) {
                double max_score = -INFINITY;
                for (int tau = 0; tau < T; tau++) {
                    score[tau] = -INFINITY;
                    if (!allowed(b, t, tau)) { continue; }
                    double dot = 0.0;
                    for (int e = 0; e < hd; e++) { dot += (double)in.q[qi(b, t, h, e)] * in.k[ki(b, tau, j, e)]; }
                    score[tau] = dot * scale;
                    max_score = std::max(max_score, score[tau]);
                }
                double sum = 0.0;
                for (int tau = 0; tau < T; tau++) {
                    prob[tau] = std::isinf(score[tau]) ? 0.0 : std::exp(score[tau] - max_score);
                    sum += prob[tau];
                }
                r.lse[((size_t)b * Hq + h) * T + t] = max_score + std::log(sum);
                for (int tau = 0; tau < T; tau++) { prob[tau] /= sum; }
                // out = P V
                for (int e = 0; e < hd; e++) {
                    double o = 0.0, mag = 0.0;
                    for (int tau = 0; tau < T; tau++) {
                        o += prob[tau] * in.v[ki(b, tau, j, e)];
                        mag += prob[tau] * std::fabs(in.v[ki(b, tau, j, e)]);
                    }
                    r.out[qi(b, t, h, e)] = o;
                    r.out_mag[qi(b, t, h, e)] = mag;
                }
                // dP = dout . v;  dS = P (dP - D),  D = sum_tau P dP = dout . out (the softmax
                // Jacobian). The backward's contract takes the *stored* out (floatX), so D is
                // formed from out rounded to floatX, as the trainer will pass it.
                for (int tau = 0; tau < T; tau++) {
                    double d = 0.0;
                    for (int e = 0; e < hd; e++) { d += (double)in.dout[qi(b, t, h, e)] * in.v[ki(b, tau, j, e)]; }
                    dprob[tau] = d;
                }
                double weighted = 0.0;
                for (int e = 0; e < hd; e++) {
                    double stored = stored_out != nullptr ? (*stored_out)[qi(b, t, h, e)]
                                                          : to_float(from_float<floatX>((float)r.out[qi(b, t, h, e)]));
                    weighted += (double)in.dout[qi(b, t, h, e)] * stored;
                }
                for (int tau = 0; tau < T; tau++) {
                    if (prob[tau] == 0.0) { continue; }
                    double ds = prob[tau] * (dprob[tau] - weighted);
                    for (int e = 0; e < hd; e++) {
                        r.dq[qi(b, t, h, e)] += ds * scale * in.k[ki(b, tau, j, e)];
                        r.dk[ki(b, tau, j, e)] += ds * scale * in.q[qi(b, t, h, e)];
                        r.dv[ki(b, tau, j, e)] += prob[tau] * in.dout[qi(b, t, h, e)];
                        r.dq_mag[qi(b, t, h, e)] += std::fabs(ds * scale * in.k[ki(b, tau, j, e)]);
                        r.dk_mag[ki(b, tau, j, e)] += std::fabs(ds * scale * in.q[qi(b, t, h, e)]);
                        r.dv_mag[ki(b, tau, j, e)] += prob[tau] * std::fabs(in.dout[qi(b, t, h, e)]);
                    }
                }
            }
        }
    }
    return r;
}

// ----------------------------------------------------------------------------------------
// running the kernels

struct Result {
    std::vector<float> out, lse, dq, dk, dv;
};

template <typename T>
static std::vector<T> filled_with_nan(size_t n) {
    std::vector<T> x(n);
    memset(x.data(), 0xff, n * sizeof(T));  // NaN in float and bf16
    return x;
}

static std::vector<floatX> convert_floats(const std::vector<float>& x) {
    std::vector<floatX> y(x.size());
    for (size_t i = 0; i < x.size(); i++) { y[i] = from_float<floatX>(x[i]); }
    return y;
}

static std::vector<float> to_floats(const std::vector<floatX>& x) {
    std::vector<float> y(x.size());
    for (size_t i = 0; i < x.size(); i++) { y[i] = to_float(x[i]); }
    return y;
}

static Result run_kernels(const Shape& s, const Inputs& in, bool backward = true) {
    floatX* d_q = copy_to_device(convert_floats(in.q));
    floatX* d_k = copy_to_device(convert_floats(in.k));
    floatX* d_v = copy_to_device(convert_floats(in.v));
    floatX* d_dout = copy_to_device(convert_floats(in.dout));
    int* d_doc = in.doc.empty() ? nullptr : copy_to_device(in.doc);
    floatX* d_out = copy_to_device(filled_with_nan<floatX>(s.q_size()));
    float* d_lse = copy_to_device(filled_with_nan<float>(s.stat_size()));
    Result r;
    const AttnShape shape{s.B, s.T, s.Hq, s.Hkv, s.hd, d_doc};
    const AttnTensors tensors{d_q, d_k, d_v, d_out, d_lse};
    attention_forward(shape, tensors, 0);
    cudaCheck(cudaDeviceSynchronize());
    r.out = to_floats(copy_from_device(d_out, s.q_size()));
    r.lse = copy_from_device(d_lse, s.stat_size());
    if (backward) {
        floatX* d_dq = copy_to_device(filled_with_nan<floatX>(s.q_size()));
        floatX* d_dk = copy_to_device(filled_with_nan<floatX>(s.kv_size()));
        floatX* d_dv = copy_to_device(filled_with_nan<floatX>(s.kv_size()));
        float* d_scratch = copy_to_device(filled_with_nan<float>(attention_backward_scratch_floats(s.B, s.T, s.Hq, s.hd)));
        attention_backward(shape, tensors, {d_dout, d_dq, d_dk, d_dv, d_scratch}, 0);
        cudaCheck(cudaDeviceSynchronize());
        r.dq = to_floats(copy_from_device(d_dq, s.q_size()));
        r.dk = to_floats(copy_from_device(d_dk, s.kv_size()));
        r.dv = to_floats(copy_from_device(d_dv, s.kv_size()));
        for (void* p : {(void*)d_dq, (void*)d_dk, (void*)d_dv, (void*)d_scratch}) { cudaCheck(cudaFree(p)); }
    }
    for (void* p : {(void*)d_q, (void*)d_k, (void*)d_v, (void*)d_dout, (void*)d_out, (void*)d_lse}) {
        cudaCheck(cudaFree(p));
    }
    if (d_doc != nullptr) { cudaCheck(cudaFree(d_doc)); }
    return r;
}

static double max_abs(const std::vector<double>& x) {
    double m = 0.0;
    for (double value : x) { m = std::max(m, std::fabs(value)); }
    return m;
}

// |got - ref| <= abs_frac * max|ref| + |ref| * eps
#define CHECK_ARRAY(name, got, ref, abs_frac, eps) \
    CHECK_CLOSE(name, (got).data(), (ref).data(), (ref).size(), (abs_frac) * max_abs(ref), (eps))

// Whether attention_forward/backward take the tensor-core path (llmc/kernels/attention_tc.cuh) at
// this head dim (the test's buffers are 16-byte aligned). main() allows it on the host too,
// where the trainers' default is the scalar kernels.
static bool tensor_cores(int hd) { return !kFp32 && attention_tensor_cores() && flash_supports(hd); }

// The tensor-core path rounds P (forward and backward) and dS (backward) to bf16 for its
// products, as FlashAttention-2 does: bf16 keeps 8 significant bits, so each term moves by at
// most 2^-8 of itself and each element by at most 2^-8 of the sum of its terms' absolute values
// (the reference's *_mag), on top of the output's own bf16 rounding (2^-8 relative, |ref|/128
// allows 2x). Checked: |got - ref| <= 2^-8 mag + |ref| / 128 + 1e-6 max|ref|. Printed per case:
// the worst error beyond the output rounding as a fraction of 2^-8 mag (measured 0.3-0.85 over
// these cases; elements whose bound is below the 1e-6 floor, e.g. a lone key's dS = dP - D = 0
// up to fp32 cancellation, are left out of the figure).
static void check_rounding_bound(const char* name, const std::vector<float>& got, const std::vector<double>& ref,
                                 const std::vector<double>& mag) {
    double floor = 1e-6 * max_abs(ref), worst = 0.0;
    size_t bad = 0, first_bad = 0;
    for (size_t i = 0; i < ref.size(); i++) {
        double err = std::fabs(got[i] - ref[i]);
        if (!(err <= std::ldexp(mag[i], -8) + std::fabs(ref[i]) / 128 + floor)) {
            if (bad++ == 0) { first_bad = i; }
        }
        double beyond_output_rounding = std::max(0.0, err - std::fabs(ref[i]) / 256);
        if (std::ldexp(mag[i], -8) > floor) { worst = std::max(worst, beyond_output_rounding / std::ldexp(mag[i], -8)); }
    }
    printf("    %-3s worst error beyond the output rounding: %.2f x 2^-8 of its terms' magnitude\n", name, worst);
    if (bad > 0) {
        testing::report_failure(__FILE__, __LINE__,
                                std::string(name) + ": " + std::to_string(bad) + " elements beyond 2^-8 of their terms' " +
                                    "magnitude, first [" + std::to_string(first_bad) + "] = " +
                                    std::to_string(got[first_bad]) + " vs " + std::to_string(ref[first_bad]));
    }
}

// The reference for checking `got`. On the tensor-core path D is formed from the kernels' own
// stored out: their out differs from the reference's by the forward's P rounding, and
// D = dout . out enters every dS, so the backward is checked on the input it was given.
static Reference reference_for(const Shape& s, const Inputs& in, const Result& got) {
    return reference_attention(s, in, tensor_cores(s.hd) ? &got.out : nullptr);
}

static void check_results(const Shape& s, const Result& got, const Reference& ref, bool lse = true) {
    double eps = kFp32 ? 1e-5 : 1.0 / 128;
    if (lse) { CHECK_CLOSE("lse", got.lse.data(), ref.lse.data(), ref.lse.size(), kFp32 ? 1e-5 : 1e-3, 1e-5); }
    if (tensor_cores(s.hd)) {
        check_rounding_bound("out", got.out, ref.out, ref.out_mag);
        check_rounding_bound("dq", got.dq, ref.dq, ref.dq_mag);
        check_rounding_bound("dk", got.dk, ref.dk, ref.dk_mag);
        check_rounding_bound("dv", got.dv, ref.dv, ref.dv_mag);
        return;
    }
    // fp32: summation order only. bf16 (scalar kernels): one rounding of each output (2^-8 relative).
    double out_abs = kFp32 ? 1e-6 : 1e-4, grad_abs = kFp32 ? 1e-5 : 1e-3;
    CHECK_ARRAY("out", got.out, ref.out, out_abs, eps);
    CHECK_ARRAY("dq", got.dq, ref.dq, grad_abs, eps);
    CHECK_ARRAY("dk", got.dk, ref.dk, grad_abs, eps);
    CHECK_ARRAY("dv", got.dv, ref.dv, grad_abs, eps);
}

static void check_case(const Shape& s, uint32_t seed, float qk_scale, int doc_mode) {
    Inputs in = make_inputs(s, seed, qk_scale, doc_mode);
    Result got = run_kernels(s, in);
    check_results(s, got, reference_for(s, in, got));
}

// ----------------------------------------------------------------------------------------
// cases

TEST_CASE(mha_small_single_tile) { check_case({1, 17, 2, 2, 8}, 1, 1.0f, 0); }
TEST_CASE(mha_hd16_T_not_multiple_of_tile_B2) { check_case({2, 150, 3, 3, 16}, 2, 1.0f, 0); }
TEST_CASE(gqa2_hd64_B2) { check_case({2, 130, 4, 2, 64}, 3, 1.0f, 0); }
TEST_CASE(gqa4_hd16) { check_case({1, 200, 8, 2, 16}, 4, 1.0f, 0); }
TEST_CASE(gqa4_hd8_single_kv_head) { check_case({2, 70, 4, 1, 8}, 5, 1.0f, 0); }
TEST_CASE(large_scores_online_softmax) { check_case({1, 190, 2, 1, 16}, 6, 3.0f, 0); }
TEST_CASE(odd_head_dims_6_and_48) {
    check_case({1, 80, 2, 1, 6}, 7, 1.0f, 1);
    check_case({1, 80, 2, 2, 48}, 8, 1.0f, 1);
}
TEST_CASE(head_dim_128_large_shared) { check_case({1, 100, 2, 1, 128}, 9, 1.0f, 1); }
TEST_CASE(doc_mask_mha_B3) { check_case({3, 150, 2, 2, 16}, 10, 1.0f, 1); }
TEST_CASE(doc_mask_gqa2_hd64) { check_case({2, 140, 4, 2, 64}, 11, 1.5f, 1); }
TEST_CASE(doc_mask_gqa4_hd8) { check_case({2, 200, 4, 1, 8}, 12, 1.0f, 1); }
TEST_CASE(doc_mask_unsorted_ids) { check_case({2, 100, 2, 1, 16}, 13, 1.0f, 2); }
TEST_CASE(seq_len_one) { check_case({2, 1, 2, 1, 8}, 14, 1.0f, 1); }
// The tensor-core path's edges in bf16 (the scalar path in fp32): one position; one row past a
// tile with GQA 4 at hd 32; large scores with the document mask at hd 64 across two tiles.
TEST_CASE(tensor_core_edges) {
    check_case({2, 1, 4, 1, 16}, 20, 1.0f, 1);
    check_case({1, 65, 4, 1, 32}, 21, 1.0f, 0);
    check_case({1, 129, 2, 2, 64}, 22, 3.0f, 1);
}

// The fallback from the tensor-core kernels names its reason and is counted (the run's one
// note on stderr says it is slow): hd not a multiple of 16, a pointer not 16-byte aligned.
TEST_CASE(tensor_core_fallback_is_named) {
    alignas(16) static char buf[64];
    const char* device = attention_tc_device_refusal(64);  // nullptr, or why this device cannot (an sm_75)
    CHECK(attention_tc_refusal(64, {buf, buf + 16}) == device);
    const char* hd = attention_tc_refusal(24, {buf});
    CHECK(hd != nullptr && strstr(hd, "multiple of 16") != nullptr);
    const char* align = attention_tc_refusal(64, {buf, buf + 2});
    CHECK(align != nullptr && strstr(align, device != nullptr ? device : "16-byte aligned") != nullptr);
    if (kFp32) { return; }  // fp32 builds never take the tensor-core kernels: nothing falls back
    long before = attention_tc_fallbacks();
    CHECK(!attention_uses_tensor_cores(8, {buf}));
    const bool device_takes_64 = attention_tc_device_refusal(64) == nullptr;  // (an sm_75 does not)
    CHECK(attention_uses_tensor_cores(64, {buf}) == device_takes_64);
    CHECK_EQ(attention_tc_fallbacks(), before + (device_takes_64 ? 1 : 2));
}

// A shape cuDNN refuses (its graph build failed) is remembered with the reason, per direction,
// so the dispatcher runs our kernels for it instead of stopping the run (cuDNN itself runs on
// a GPU only; this is the bookkeeping the fallback relies on).
TEST_CASE(cudnn_refusal_falls_back_per_shape) {
    CudnnRefusals r;
    CudnnRefusals::Shape a{2, 64, 4, 2, 64}, b{2, 64, 4, 2, 128};
    CHECK(!r.refused(false, a));
    r.refuse(false, a, "check_support: test");
    r.refuse(false, a, "again");  // (noted once)
    CHECK(r.refused(false, a));
    CHECK(!r.refused(true, a));
    CHECK(!r.refused(false, b));
    CHECK(r.reasons.size() == 1 && r.reasons.begin()->second == "check_support: test");
}

// Explicit document boundaries: each row b starts new documents at starts[b] (positions
// before the first start belong to a document that began in an earlier row).
static void check_documents(const Shape& s, uint32_t seed, const std::vector<std::vector<int>>& starts) {
    Inputs in = make_inputs(s, seed, 1.0f, 0);
    in.doc.resize((size_t)s.B * s.T);
    for (int b = 0; b < s.B; b++)
        for (int t = 0; t < s.T; t++) {
            int id = 0;
            for (int start : starts[b]) id += t >= start;
            in.doc[(size_t)b * s.T + t] = id + 100 * b;
        }
    Result got = run_kernels(s, in);
    check_results(s, got, reference_for(s, in, got), false);
}

// Long documents that end inside tiles: whole tiles are skipped for some blocks and not
// for others; a document spans the first tile boundary; row 1 has a one-token document
// exactly on a tile start (128) followed by a new one.
TEST_CASE(doc_mask_tile_skipping) { check_documents({2, 260, 2, 1, 16}, 15, {{70, 140, 200}, {3, 128, 129}}); }

// The tensor-core backward's dq turns (llmc/kernels/attention_tc.cuh): 10 key blocks add to
// each late query tile in a fixed order, over a GQA group of 4 heads; in row 0 key block 0 does
// not see tiles 2-9 (a document starts at 100) yet still writes their dq, in row 1 documents end
// and start inside tiles and one starts on a tile boundary (320).
TEST_CASE(dq_turns_many_key_blocks) {
    check_documents({2, 620, 4, 1, 16}, 23, {{100, 400}, {30, 200, 320, 321, 590}});
}

// The last block holds a single row that starts a document: the only key it sees in its
// own tile is itself (a tile skip that forgot the diagonal would drop it), and key 128 is
// seen by that one query only.
TEST_CASE(doc_mask_lone_row_in_last_tile) { check_documents({1, 129, 2, 2, 8}, 19, {{40, 128}}); }

// The first query of a document attends only to itself: out equals its v row exactly
// (up to the output rounding), and lse equals its own score.
TEST_CASE(document_start_sees_only_itself) {
    Shape s{1, 90, 2, 1, 16};
    Inputs in = make_inputs(s, 16, 1.0f, 1);
    Result got = run_kernels(s, in, false);
    int checked = 0, differ = 0;
    for (int t = 0; t < s.T; t++) {
        if (t > 0 && in.doc[t] == in.doc[t - 1]) { continue; }
        for (int h = 0; h < s.Hq; h++) {
            for (int e = 0; e < s.hd; e++) {
                differ += got.out[((size_t)t * s.Hq + h) * s.hd + e] != in.v[(size_t)t * s.hd + e];
            }
            checked++;
        }
    }
    CHECK(checked >= 4);
    CHECK_EQ(differ, 0);
}

TEST_CASE(deterministic_bitwise) {
    Shape s{2, 150, 4, 2, 16};
    Inputs in = make_inputs(s, 17, 1.0f, 1);
    Result a = run_kernels(s, in), b = run_kernels(s, in);
    CHECK(memcmp(a.out.data(), b.out.data(), a.out.size() * sizeof(float)) == 0);
    CHECK(memcmp(a.lse.data(), b.lse.data(), a.lse.size() * sizeof(float)) == 0);
    CHECK(memcmp(a.dq.data(), b.dq.data(), a.dq.size() * sizeof(float)) == 0);
    CHECK(memcmp(a.dk.data(), b.dk.data(), a.dk.size() * sizeof(float)) == 0);
    CHECK(memcmp(a.dv.data(), b.dv.data(), a.dv.size() * sizeof(float)) == 0);
}

// fp32 only: the kernels' gradients of L = sum(out * dout) against central differences
// of the kernels' own forward, for every input element of a tiny GQA + doc-mask case.
TEST_CASE(finite_differences_fp32) {
    if (!kFp32) {
        printf("  (finite differences run in the fp32 build only)\n");
        return;
    }
    Shape s{1, 9, 4, 2, 8};
    Inputs in = make_inputs(s, 18, 1.0f, 0);
    in.doc = {0, 0, 0, 1, 1, 1, 1, 2, 2};
    Result got = run_kernels(s, in);
    auto loss = [&](const Inputs& x) {
        Result r = run_kernels(s, x, false);
        double l = 0.0;
        for (size_t i = 0; i < r.out.size(); i++) { l += (double)r.out[i] * x.dout[i]; }
        return l;
    };
    const float h = 1e-2f;
    auto check_fd = [&](const char* name, std::vector<float> Inputs::*field, const std::vector<float>& grad) {
        std::vector<double> fd(grad.size());
        for (size_t i = 0; i < grad.size(); i++) {
            Inputs plus = in, minus = in;
            (plus.*field)[i] += h;
            (minus.*field)[i] -= h;
            fd[i] = (loss(plus) - loss(minus)) / (2.0 * h);
        }
        CHECK_CLOSE(name, grad.data(), fd.data(), fd.size(), 2e-4, 1e-3);
    };
    check_fd("dq_vs_fd", &Inputs::q, got.dq);
    check_fd("dk_vs_fd", &Inputs::k, got.dk);
    check_fd("dv_vs_fd", &Inputs::v, got.dv);
}

int main(int argc, char** argv) {
    attention_tensor_cores() = true;
    return testing::run_all(argv[0], argc > 1 ? argv[1] : nullptr);
}
