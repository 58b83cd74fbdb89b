/*
Tests of llmc/kernels/norm.cuh (ZCN / RMSNorm), llmc/kernels/rope.cuh (rotate-half RoPE) and llmc/kernels/swiglu.cuh
against independent plain C++ references in double precision, on whichever executor built
this file (host backend with g++, GPU with nvcc), in either precision.

- norm: forward and backward for ZCN and RMS, the residual-stream shape and the QK-norm shape
  (rows = B*T*H, C = hd, one shared gain), odd C (scalar path), a misaligned pointer, N not
  a multiple of the rows per block, N large enough for the grid-stride loop; the +=
  semantics of dinp and dgain; bit-identical reruns; the double reference's gradient against
  finite differences of the double forward (both precisions) and, in the FP32 build, the
  kernels' backward against finite differences of the kernels' forward.
- rope: the table against direct fp64 maths, forward and backward against a complex-number
  formulation (z1 + i z2) * exp(+-i angle) that does not use the table, backward(forward(x))
  == x, in-place operation, odd head dims, the FP32 adjoint identity <Rx, y> == <x, R^T y>.
- qk_norm_rope (llmc/kernels/qk_norm_rope.cuh): the fused QK-norm + RoPE forward and backward
  bit-identical to the two kernels they replace (norm then rope; rope's backward then the norm's),
  out, rstd, dinp and dgain, for head dims on the 128-bit and the scalar paths and those the
  fusion refuses, GQA's two head counts, a table from a later position (decoding), misaligned
  pointers and the backward's grid-stride loop; dinp overwritten, dout left as it was.
- swiglu: forward and backward against the double reference, tails and misaligned
  pointers, in-place aliasing, FP32 finite differences.

Usage: test_norm_rope_swiglu [name-filter]
*/
#include <algorithm>
#include <complex>
#include <cstdint>
#include <random>
#include <vector>

#include "llmc/cuda_common.h"
#include "llmc/kernels/norm.cuh"
#include "llmc/kernels/qk_norm_rope.cuh"
#include "llmc/kernels/rope.cuh"
#include "llmc/kernels/swiglu.cuh"
#include "dev/test/compare.h"
#include "dev/test/testing.h"

static constexpr bool kFP32 = PRECISION_MODE == PrecisionMode::FP32;
// one rounding of an output to floatX: 2^-9 relative for bf16; margin x2
static constexpr double kRound = kFP32 ? 0.0 : 1.0 / 256;

// Random values rounded to floatX: `x` holds the floatX values, `d` the same values in double.
struct Data {
    std::vector<floatX> x;
    std::vector<double> d;
};
static Data random_data(size_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> dist(lo, hi);
    Data data;
    data.x.resize(n);
    data.d.resize(n);
    for (size_t i = 0; i < n; i++) {
        data.x[i] = from_float<floatX>(dist(rng));
        data.d[i] = to_float(data.x[i]);
    }
    return data;
}
template <typename T>  // floatX or float
static std::vector<double> to_double(const std::vector<T>& v) {
    std::vector<double> out(v.size());
    for (size_t i = 0; i < v.size(); i++) { out[i] = to_float(v[i]); }
    return out;
}
static double max_abs(const std::vector<double>& v) {
    double m = 0.0;
    for (double x : v) { m = std::max(m, std::fabs(x)); }
    return m;
}
static bool bits_equal(const std::vector<floatX>& a, const std::vector<floatX>& b) {
    return a.size() == b.size() && memcmp(a.data(), b.data(), a.size() * sizeof(floatX)) == 0;
}

// ========================================================================================
// norm

static void norm_forward_ref(std::vector<double>& out, std::vector<double>& rstd, const std::vector<double>& x,
                             const std::vector<double>& g, int N, int C, double offset, double eps) {
    out.assign((size_t)N * C, 0.0);
    rstd.assign(N, 0.0);
    for (int r = 0; r < N; r++) {
        double ss = 0.0;
        for (int c = 0; c < C; c++) { ss += x[(size_t)r * C + c] * x[(size_t)r * C + c]; }
        double s = 1.0 / std::sqrt(ss / C + eps);
        rstd[r] = s;
        for (int c = 0; c < C; c++) { out[(size_t)r * C + c] = (offset + g[c]) * x[(size_t)r * C + c] * s; }
    }
}

// Gradient of L = sum(dout * out) (not accumulated).
static void norm_backward_ref(std::vector<double>& dx, std::vector<double>& dg, const std::vector<double>& dout,
                              const std::vector<double>& x, const std::vector<double>& g, int N, int C,
                              double offset, double eps) {
    dx.assign((size_t)N * C, 0.0);
    dg.assign(C, 0.0);
    for (int r = 0; r < N; r++) {
        const double* xr = &x[(size_t)r * C];
        const double* dr = &dout[(size_t)r * C];
        double ss = 0.0;
        for (int c = 0; c < C; c++) { ss += xr[c] * xr[c]; }
        double s = 1.0 / std::sqrt(ss / C + eps);
        // d/dx_j of sum_c dy_c x_c s, with ds/dx_j = -s^3 x_j / C
        double dot = 0.0;
        for (int c = 0; c < C; c++) { dot += dr[c] * (offset + g[c]) * xr[c]; }
        for (int j = 0; j < C; j++) {
            dx[(size_t)r * C + j] = dr[j] * (offset + g[j]) * s - dot * s * s * s * xr[j] / C;
            dg[j] += dr[j] * xr[j] * s;
        }
    }
}

struct NormCase {
    int N, C;
    float offset;
    int misalign;  // element offset of every pointer
    uint32_t seed;
};

// Forward and accumulated backward of one case against the double reference.
static void check_norm_case(const NormCase& k) {
    const int N = k.N, C = k.C, m = k.misalign;
    const double eps = 1e-6;
    Data x = random_data((size_t)N * C, k.seed, -2.0f, 2.0f);
    Data g = random_data(C, k.seed + 1, k.offset == 1.0f ? -0.5f : 0.5f, k.offset == 1.0f ? 0.5f : 1.5f);
    Data dout = random_data((size_t)N * C, k.seed + 2);
    Data dinp0 = random_data((size_t)N * C, k.seed + 3);  // existing gradient: += must keep it
    Data dg0 = random_data(C, k.seed + 4);

    std::vector<double> out_ref, rstd_ref, dx_ref, dg_ref;
    norm_forward_ref(out_ref, rstd_ref, x.d, g.d, N, C, k.offset, eps);
    norm_backward_ref(dx_ref, dg_ref, dout.d, x.d, g.d, N, C, k.offset, eps);

    auto upload = [m](const std::vector<floatX>& v) {
        std::vector<floatX> padded(m, from_float<floatX>(0.0f));
        padded.insert(padded.end(), v.begin(), v.end());
        return copy_to_device(padded);
    };
    floatX* d_x = upload(x.x);
    floatX* d_g = upload(g.x);
    floatX* d_dout = upload(dout.x);
    floatX* d_dinp = upload(dinp0.x);
    floatX* d_dg = upload(dg0.x);
    floatX* d_out = upload(std::vector<floatX>((size_t)N * C));
    float* d_rstd = cudaMallocElements(float, N);
    float* d_scratch = cudaMallocElements(float, norm_backward_scratch_floats(N, C));

    norm_forward(d_out + m, d_rstd, d_x + m, d_g + m, N, C, k.offset, (float)eps, 0);
    std::vector<floatX> out = copy_from_device(d_out + m, (size_t)N * C);
    std::vector<float> rstd = copy_from_device(d_rstd, N);
    double out_scale = max_abs(out_ref);
    CHECK_CLOSE("norm out", to_double(out).data(), out_ref.data(), out.size(), 2e-6 * out_scale, 1e-5 + kRound);
    CHECK_CLOSE("norm rstd", to_double(rstd).data(), rstd_ref.data(), rstd.size(), 0.0, 1e-5);

    GainNorm norm{{d_g + m, d_dg + m}, C, k.offset, (float)eps};
    norm.backward(d_dinp + m, d_dout + m, d_x + m, d_rstd, N, d_scratch, 0);
    std::vector<floatX> dinp = copy_from_device(d_dinp + m, (size_t)N * C);
    std::vector<floatX> dg = copy_from_device(d_dg + m, C);
    std::vector<double> dinp_expect(dinp.size()), dg_expect(C), dg_terms(C, 0.0);
    for (size_t i = 0; i < dinp.size(); i++) { dinp_expect[i] = dinp0.d[i] + dx_ref[i]; }
    for (int c = 0; c < C; c++) { dg_expect[c] = dg0.d[c] + dg_ref[c]; }
    for (int r = 0; r < N; r++) {
        for (int c = 0; c < C; c++) { dg_terms[c] += std::fabs(dout.d[(size_t)r * C + c] * out_ref[(size_t)r * C + c]); }
    }
    double dx_scale = max_abs(dx_ref), dg_scale = max_abs(dg_terms) + 1.0;
    CHECK_CLOSE("norm dinp (+=)", to_double(dinp).data(), dinp_expect.data(), dinp.size(), 1e-5 * dx_scale,
                1e-5 + kRound);
    CHECK_CLOSE("norm dgain (+=)", to_double(dg).data(), dg_expect.data(), C, 2e-5 * dg_scale, 1e-5 + kRound);

    // bit-identical rerun of the same accumulation
    cudaCheck(cudaMemcpy(d_dinp + m, dinp0.x.data(), dinp0.x.size() * sizeof(floatX), cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy(d_dg + m, dg0.x.data(), C * sizeof(floatX), cudaMemcpyHostToDevice));
    norm.backward(d_dinp + m, d_dout + m, d_x + m, d_rstd, N, d_scratch, 0);
    CHECK(bits_equal(copy_from_device(d_dinp + m, (size_t)N * C), dinp));
    CHECK(bits_equal(copy_from_device(d_dg + m, C), dg));

    for (void* p : {(void*)d_x, (void*)d_g, (void*)d_dout, (void*)d_dinp, (void*)d_dg, (void*)d_out,
                    (void*)d_rstd, (void*)d_scratch}) {
        cudaCheck(cudaFree(p));
    }
}

TEST_CASE(norm_residual_stream_zcn_and_rms) {
    check_norm_case({74, 512, 1.0f, 0, 10});  // ZCN, 128-bit path, N not a multiple of the rows per block
    check_norm_case({74, 512, 0.0f, 0, 20});  // RMS
    check_norm_case({3, 768, 1.0f, 0, 30});
}

TEST_CASE(norm_qk_norm_shape_shared_gain) {
    int B = 2, T = 7, H = 3, hd = 64;  // rows = B*T*H, C = hd, one gain for all heads
    check_norm_case({B * T * H, hd, 1.0f, 0, 40});
    check_norm_case({B * T * H, hd, 0.0f, 0, 50});
    check_norm_case({5 * 3 * 2, 16, 1.0f, 0, 55});  // small head dim: 1-2 lanes per row
}

TEST_CASE(norm_odd_sizes_and_misaligned) {
    check_norm_case({37, 37, 1.0f, 0, 60});   // C odd: scalar path
    check_norm_case({19, 102, 0.0f, 0, 70});  // C = 2 mod 4: scalar path in both precisions
    check_norm_case({11, 6, 1.0f, 0, 80});    // tiny row
    check_norm_case({1, 1, 1.0f, 0, 85});     // one element
    check_norm_case({23, 64, 1.0f, 1, 90});   // misaligned pointers: scalar path
}

TEST_CASE(norm_grid_stride_many_rows) {
    // more rows than kNormBackwardMaxBlocks blocks cover at once: every group loops
    check_norm_case({kNormBackwardMaxBlocks * 8 + 77, 512, 1.0f, 0, 100});
    check_norm_case({kNormBackwardMaxBlocks * 32 + 5, 64, 0.0f, 0, 110});
}

// The double reference's gradient against central differences of the double forward.
TEST_CASE(norm_reference_gradient_vs_finite_differences) {
    int N = 3, C = 10;
    for (double offset : {1.0, 0.0}) {
        Data x = random_data((size_t)N * C, 7, -2.0f, 2.0f), g = random_data(C, 8), dout = random_data((size_t)N * C, 9);
        std::vector<double> dx, dg, out, rstd;
        norm_backward_ref(dx, dg, dout.d, x.d, g.d, N, C, offset, 1e-6);
        auto loss = [&](const std::vector<double>& xv, const std::vector<double>& gv) {
            norm_forward_ref(out, rstd, xv, gv, N, C, offset, 1e-6);
            double L = 0.0;
            for (size_t i = 0; i < out.size(); i++) { L += dout.d[i] * out[i]; }
            return L;
        };
        const double h = 1e-5;
        std::vector<double> fd_x(dx.size()), fd_g(C);
        for (size_t i = 0; i < dx.size(); i++) {
            std::vector<double> xp = x.d, xm = x.d;
            xp[i] += h;
            xm[i] -= h;
            fd_x[i] = (loss(xp, g.d) - loss(xm, g.d)) / (2 * h);
        }
        for (int c = 0; c < C; c++) {
            std::vector<double> gp = g.d, gm = g.d;
            gp[c] += h;
            gm[c] -= h;
            fd_g[c] = (loss(x.d, gp) - loss(x.d, gm)) / (2 * h);
        }
        CHECK_CLOSE("ref dx vs fd", dx.data(), fd_x.data(), dx.size(), 1e-7, 1e-6);
        CHECK_CLOSE("ref dgain vs fd", dg.data(), fd_g.data(), C, 1e-7, 1e-6);
    }
}

// FP32 build: the kernels' backward against central differences of the kernels' forward.
TEST_CASE(norm_kernel_gradient_vs_finite_differences_fp32) {
    if (!kFP32) { return; }
    int N = 3, C = 16;
    for (float offset : {1.0f, 0.0f}) {
        Data x = random_data((size_t)N * C, 11, -2.0f, 2.0f), g = random_data(C, 12), dout = random_data((size_t)N * C, 13);
        floatX* d_x = copy_to_device(x.x);
        floatX* d_g = copy_to_device(g.x);
        floatX* d_dout = copy_to_device(dout.x);
        floatX* d_out = cudaMallocElements(floatX, (size_t)N * C);
        float* d_rstd = cudaMallocElements(float, N);
        floatX* d_dinp = copy_to_device(std::vector<floatX>((size_t)N * C, from_float<floatX>(0.0f)));
        floatX* d_dg = copy_to_device(std::vector<floatX>(C, from_float<floatX>(0.0f)));
        float* d_scratch = cudaMallocElements(float, norm_backward_scratch_floats(N, C));
        norm_forward(d_out, d_rstd, d_x, d_g, N, C, offset, 1e-6f, 0);
        GainNorm{{d_g, d_dg}, C, offset, 1e-6f}.backward(d_dinp, d_dout, d_x, d_rstd, N, d_scratch, 0);
        std::vector<double> dinp = to_double(copy_from_device(d_dinp, (size_t)N * C));
        std::vector<double> dg = to_double(copy_from_device(d_dg, C));
        auto loss = [&](const std::vector<floatX>& xv, const std::vector<floatX>& gv) {
            cudaCheck(cudaMemcpy(d_x, xv.data(), xv.size() * sizeof(floatX), cudaMemcpyHostToDevice));
            cudaCheck(cudaMemcpy(d_g, gv.data(), gv.size() * sizeof(floatX), cudaMemcpyHostToDevice));
            norm_forward(d_out, d_rstd, d_x, d_g, N, C, offset, 1e-6f, 0);
            std::vector<floatX> out = copy_from_device(d_out, (size_t)N * C);
            double L = 0.0;
            for (size_t i = 0; i < out.size(); i++) { L += dout.d[i] * to_float(out[i]); }
            return L;
        };
        const float h = 1e-2f;
        std::vector<double> fd_x(dinp.size()), fd_g(C);
        for (size_t i = 0; i < dinp.size(); i++) {
            std::vector<floatX> xp = x.x, xm = x.x;
            xp[i] = from_float<floatX>(to_float(x.x[i]) + h);
            xm[i] = from_float<floatX>(to_float(x.x[i]) - h);
            fd_x[i] = (loss(xp, g.x) - loss(xm, g.x)) / (to_float(xp[i]) - to_float(xm[i]));
        }
        for (int c = 0; c < C; c++) {
            std::vector<floatX> gp = g.x, gm = g.x;
            gp[c] = from_float<floatX>(to_float(g.x[c]) + h);
            gm[c] = from_float<floatX>(to_float(g.x[c]) - h);
            fd_g[c] = (loss(x.x, gp) - loss(x.x, gm)) / (to_float(gp[c]) - to_float(gm[c]));
        }
        CHECK_CLOSE("kernel dinp vs fd", dinp.data(), fd_x.data(), dinp.size(), 2e-3, 1e-2);
        CHECK_CLOSE("kernel dgain vs fd", dg.data(), fd_g.data(), C, 2e-3, 1e-2);
        for (void* p : {(void*)d_x, (void*)d_g, (void*)d_dout, (void*)d_out, (void*)d_rstd, (void*)d_dinp,
                        (void*)d_dg, (void*)d_scratch}) {
            cudaCheck(cudaFree(p));
        }
    }
}

// ========================================================================================
// rope

static double rope_inv_freq(int i, int hd, double theta) { return 1.0 / std::pow(theta, 2.0 * i / hd); }

// Independent formulation: pair i of a head vector is the complex number z1[i] + i z2[i];
// RoPE multiplies it by exp(i * direction * angle).
static std::vector<double> rope_complex_ref(const std::vector<double>& x, int B, int T, int H, int hd,
                                            double theta, double direction) {
    int half = hd / 2;
    std::vector<double> out(x.size());
    for (int b = 0; b < B; b++) for (int t = 0; t < T; t++) for (int h = 0; h < H; h++) {
        size_t base = (((size_t)b * T + t) * H + h) * hd;
        for (int i = 0; i < half; i++) {
            std::complex<double> z(x[base + i], x[base + half + i]);
            std::complex<double> r = z * std::polar(1.0, direction * t * rope_inv_freq(i, hd, theta));
            out[base + i] = r.real();
            out[base + half + i] = r.imag();
        }
    }
    return out;
}

TEST_CASE(rope_table_matches_fp64_maths) {
    int T = 300, hd = 64;
    double theta = 10000.0;
    std::vector<float> table = rope_table(T, hd, theta);
    CHECK_EQ(table.size(), (size_t)T * hd);
    std::vector<double> got(table.begin(), table.end()), expect(table.size());
    for (int t = 0; t < T; t++) {
        for (int i = 0; i < hd / 2; i++) {
            double angle = t * rope_inv_freq(i, hd, theta);
            expect[(size_t)t * hd + i] = (float)std::cos(angle);
            expect[(size_t)t * hd + hd / 2 + i] = (float)std::sin(angle);
        }
    }
    // fp64 angle then one rounding to fp32: equal up to 1 ulp of fp32 (pow/division order)
    CHECK_CLOSE("rope table", got.data(), expect.data(), got.size(), 1e-7, 1.2e-7);
    CHECK(table[0] == 1.0f && table[hd / 2] == 0.0f);  // t = 0: cos 1, sin 0
}

static void check_rope_case(int B, int T, int H, int hd, double theta, int misalign, uint32_t seed) {
    size_t n = (size_t)B * T * H * hd;
    Data x = random_data(n, seed, -2.0f, 2.0f);
    std::vector<double> fwd_ref = rope_complex_ref(x.d, B, T, H, hd, theta, 1.0);
    std::vector<double> bwd_ref = rope_complex_ref(x.d, B, T, H, hd, theta, -1.0);
    std::vector<float> table = rope_table(T, hd, theta);
    float* d_table = copy_to_device(table);
    std::vector<floatX> padded(misalign, from_float<floatX>(0.0f));
    padded.insert(padded.end(), x.x.begin(), x.x.end());
    floatX* d_x = copy_to_device(padded);
    floatX* d_out = cudaMallocElements(floatX, n + misalign);
    floatX* d_back = cudaMallocElements(floatX, n + misalign);

    // fp32 table and fp32 maths: ~1e-7 relative to the pair's magnitude (<= 2.9)
    const double tol = 2e-6;
    rope_forward(d_out + misalign, d_x + misalign, d_table, B, T, H, hd, 0);
    std::vector<floatX> out = copy_from_device(d_out + misalign, n);
    CHECK_CLOSE("rope forward vs complex", to_double(out).data(), fwd_ref.data(), n, tol, kRound);
    rope_backward(d_back + misalign, d_x + misalign, d_table, B, T, H, hd, 0);
    std::vector<floatX> back = copy_from_device(d_back + misalign, n);
    CHECK_CLOSE("rope backward vs complex", to_double(back).data(), bwd_ref.data(), n, tol, kRound);

    // backward(forward(x)) == x: two roundings of outputs of pair magnitude
    rope_backward(d_back + misalign, d_out + misalign, d_table, B, T, H, hd, 0);
    std::vector<floatX> round_trip = copy_from_device(d_back + misalign, n);
    CHECK_CLOSE("rope backward(forward(x))", to_double(round_trip).data(), x.d.data(), n, 2 * tol + 3 * kRound * 2.9,
                0.0);

    // in place: bit-identical to out of place
    rope_forward(d_x + misalign, d_x + misalign, d_table, B, T, H, hd, 0);
    CHECK(bits_equal(copy_from_device(d_x + misalign, n), out));
    rope_backward(d_x + misalign, d_x + misalign, d_table, B, T, H, hd, 0);
    CHECK(bits_equal(copy_from_device(d_x + misalign, n), round_trip));

    cudaCheck(cudaFree(d_table));
    cudaCheck(cudaFree(d_x));
    cudaCheck(cudaFree(d_out));
    cudaCheck(cudaFree(d_back));
}

TEST_CASE(rope_forward_backward_vs_complex) {
    check_rope_case(2, 37, 3, 64, 10000.0, 0, 1);  // 128-bit path
    check_rope_case(1, 2048, 1, 64, 10000.0, 0, 2);  // long context: large angles
    check_rope_case(3, 5, 4, 128, 500000.0, 0, 3);
}

TEST_CASE(rope_odd_head_dims_and_misaligned) {
    check_rope_case(2, 9, 3, 6, 10000.0, 0, 4);   // half = 3: scalar path
    check_rope_case(1, 7, 5, 2, 10000.0, 0, 5);   // one pair
    check_rope_case(2, 11, 3, 20, 10000.0, 0, 6); // half = 10: scalar in bf16, 128-bit would need 8
    check_rope_case(2, 13, 2, 64, 10000.0, 1, 7); // misaligned: scalar path
}

// <R x, y> == <x, R^T y> with the kernels, FP32 build (bf16 rounding would dominate).
TEST_CASE(rope_adjoint_identity_fp32) {
    if (!kFP32) { return; }
    int B = 2, T = 17, H = 3, hd = 32;
    size_t n = (size_t)B * T * H * hd;
    Data x = random_data(n, 21), y = random_data(n, 22);
    float* d_table = copy_to_device(rope_table(T, hd, 10000.0));
    floatX* d_x = copy_to_device(x.x);
    floatX* d_y = copy_to_device(y.x);
    rope_forward(d_x, d_x, d_table, B, T, H, hd, 0);
    rope_backward(d_y, d_y, d_table, B, T, H, hd, 0);
    std::vector<double> rx = to_double(copy_from_device(d_x, n)), rty = to_double(copy_from_device(d_y, n));
    double lhs = 0.0, rhs = 0.0, mag = 0.0;
    for (size_t i = 0; i < n; i++) {
        lhs += rx[i] * y.d[i];
        rhs += x.d[i] * rty[i];
        mag += std::fabs(x.d[i] * y.d[i]);
    }
    CHECK(std::fabs(lhs - rhs) <= 1e-6 * mag);
    cudaCheck(cudaFree(d_table));
    cudaCheck(cudaFree(d_x));
    cudaCheck(cudaFree(d_y));
}

// ========================================================================================
// qk_norm_rope: the fused kernels against the pair they replace, bit for bit

struct QKCase {
    int B, T, H, hd;
    float offset;
    int pos;       // the table from this position on (a decoding step's rows)
    int misalign;  // element offset of every floatX pointer
    uint32_t seed;
};

// Forward and backward of one case through qk_norm_rope_* and through the two kernels;
// returns whether the fused kernels ran (else both are the two kernels).
static bool check_qk_norm_rope_case(const QKCase& k) {
    const int N = k.B * k.T * k.H, C = k.hd, m = k.misalign;
    const size_t n = (size_t)N * C;
    const float eps = 1e-6f;
    Data x = random_data(n, k.seed, -2.0f, 2.0f);
    Data g = random_data(C, k.seed + 1, k.offset == 1.0f ? -0.5f : 0.5f, k.offset == 1.0f ? 0.5f : 1.5f);
    Data dout = random_data(n, k.seed + 2);
    Data garbage = random_data(n, k.seed + 3);  // the fused backward overwrites dinp
    Data dg0 = random_data(C, k.seed + 4);
    auto upload = [m](const std::vector<floatX>& v) {
        std::vector<floatX> padded(m, from_float<floatX>(0.0f));
        padded.insert(padded.end(), v.begin(), v.end());
        return copy_to_device(padded) + m;
    };
    float* d_table = copy_to_device(rope_table(k.pos + k.T, C, 10000.0));
    const float* table = d_table + (size_t)k.pos * C;
    floatX* d_x = upload(x.x);
    floatX* d_g = upload(g.x);
    floatX* d_dg = upload(dg0.x);
    floatX* d_out = upload(std::vector<floatX>(n));
    floatX* d_dout = upload(dout.x);
    floatX* d_dinp = upload(garbage.x);
    float* d_rstd = cudaMallocElements(float, N);
    float* d_scratch = cudaMallocElements(float, norm_backward_scratch_floats(N, C));
    GainNorm norm{{d_g, d_dg}, C, k.offset, eps};
    bool fused = qk_norm_rope_fused(C, norm_layout(C, {d_out, d_x, d_g})) &&
                 qk_norm_rope_fused(C, norm_layout(C, {d_dinp, d_dout, d_x, d_g}));

    // the two kernels
    norm.forward(d_out, d_rstd, d_x, N, 0);
    rope_forward(d_out, d_out, table, k.B, k.T, k.H, C, 0);
    std::vector<floatX> out_pair = copy_from_device(d_out, n);
    std::vector<float> rstd_pair = copy_from_device(d_rstd, N);
    cudaCheck(cudaMemset(d_dinp, 0, n * sizeof(floatX)));
    rope_backward(d_dout, d_dout, table, k.B, k.T, k.H, C, 0);
    norm.backward(d_dinp, d_dout, d_x, d_rstd, N, d_scratch, 0);
    std::vector<floatX> dinp_pair = copy_from_device(d_dinp, n), dg_pair = copy_from_device(d_dg, C);

    // fused, from the same inputs
    cudaCheck(cudaMemcpy(d_dout, dout.x.data(), n * sizeof(floatX), cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy(d_dinp, garbage.x.data(), n * sizeof(floatX), cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy(d_dg, dg0.x.data(), C * sizeof(floatX), cudaMemcpyHostToDevice));
    cudaCheck(cudaMemset(d_out, 0, n * sizeof(floatX)));
    cudaCheck(cudaMemset(d_rstd, 0, N * sizeof(float)));
    qk_norm_rope_forward(norm, d_out, d_rstd, d_x, table, k.B, k.T, k.H, 0);
    std::vector<float> rstd = copy_from_device(d_rstd, N);
    CHECK(bits_equal(copy_from_device(d_out, n), out_pair));
    CHECK(memcmp(rstd.data(), rstd_pair.data(), N * sizeof(float)) == 0);
    qk_norm_rope_backward(norm, d_dinp, d_dout, d_x, d_rstd, table, k.B, k.T, k.H, d_scratch, 0);
    CHECK(bits_equal(copy_from_device(d_dinp, n), dinp_pair));
    CHECK(bits_equal(copy_from_device(d_dg, C), dg_pair));
    if (fused) { CHECK(bits_equal(copy_from_device(d_dout, n), dout.x)); }  // read only

    cudaCheck(cudaFree(d_table));
    for (floatX* p : {d_x, d_g, d_dg, d_out, d_dout, d_dinp}) { cudaCheck(cudaFree(p - m)); }
    cudaCheck(cudaFree(d_rstd));
    cudaCheck(cudaFree(d_scratch));
    return fused;
}

TEST_CASE(qk_norm_rope_fused_equals_pair_head_dims) {
    // hd 64 and 128: the 128-bit path, 8 or 16 lanes a row on a GPU (1 on the host)
    CHECK(check_qk_norm_rope_case({2, 37, 8, 64, 1.0f, 0, 0, 1}));  // ZCN, san20's query heads
    CHECK(check_qk_norm_rope_case({2, 37, 4, 64, 1.0f, 0, 0, 2}));  // GQA: its key heads
    CHECK(check_qk_norm_rope_case({3, 5, 4, 128, 0.0f, 0, 0, 3}));  // RMS
    CHECK(check_qk_norm_rope_case({2, 9, 3, 32, 1.0f, 0, 0, 4}));
    CHECK(check_qk_norm_rope_case({2, 9, 3, 16, 1.0f, 0, 0, 5}));  // 1-2 lanes a row
    CHECK(check_qk_norm_rope_case({1, 2048, 1, 64, 1.0f, 0, 0, 6}));  // long context: large angles
    // scalar path: hd % V != 0 (odd halves), or misaligned pointers
    CHECK(check_qk_norm_rope_case({2, 9, 3, 6, 1.0f, 0, 0, 7}));
    CHECK(check_qk_norm_rope_case({1, 7, 5, 2, 0.0f, 0, 0, 8}));
    CHECK(check_qk_norm_rope_case({2, 13, 2, 64, 1.0f, 0, 1, 9}));
    // hd 8 (bf16: 128-bit chunks of 8 straddle the halves) and 20 (fp32: chunks of 4, halves
    // of 10): the two kernels run there; hd 8 in fp32 and hd 20 in bf16 (scalar) fuse
    CHECK(check_qk_norm_rope_case({2, 11, 3, 8, 1.0f, 0, 0, 10}) == kFP32);
    CHECK(check_qk_norm_rope_case({2, 11, 3, 20, 1.0f, 0, 0, 11}) == !kFP32);
}

TEST_CASE(qk_norm_rope_fused_equals_pair_decode_and_many_rows) {
    CHECK(check_qk_norm_rope_case({4, 1, 8, 64, 1.0f, 0, 0, 19}));   // position 0 only: angle 0
    CHECK(check_qk_norm_rope_case({1, 1, 8, 64, 1.0f, 37, 0, 20}));  // one decoding position: the table from 37 on
    CHECK(check_qk_norm_rope_case({3, 1, 4, 64, 1.0f, 5, 0, 21}));
    // more rows than kNormBackwardMaxBlocks blocks cover at once: the grid-stride loop (hd 64:
    // 32 rows a block on a GPU, 128 on the host, where a row has one lane)
    CHECK(check_qk_norm_rope_case({2, 2048, 17, 64, 1.0f, 0, 0, 22}));
}

// ========================================================================================
// swiglu

static double sigmoid_ref(double x) { return 1.0 / (1.0 + std::exp(-x)); }

static void check_swiglu_case(size_t N, int misalign, uint32_t seed) {
    Data gate = random_data(N, seed, -8.0f, 8.0f), up = random_data(N, seed + 1, -2.0f, 2.0f);
    Data dout = random_data(N, seed + 2);
    std::vector<double> out_ref(N), dgate_ref(N), dup_ref(N);
    for (size_t i = 0; i < N; i++) {
        double g = gate.d[i], s = sigmoid_ref(g);
        out_ref[i] = g * s * up.d[i];
        dgate_ref[i] = dout.d[i] * up.d[i] * (s + g * s * (1.0 - s));
        dup_ref[i] = dout.d[i] * g * s;
    }
    auto upload = [misalign](const std::vector<floatX>& v) {
        std::vector<floatX> padded(misalign, from_float<floatX>(0.0f));
        padded.insert(padded.end(), v.begin(), v.end());
        return copy_to_device(padded) + misalign;
    };
    floatX* d_gate = upload(gate.x);
    floatX* d_up = upload(up.x);
    floatX* d_dout = upload(dout.x);
    floatX* d_out = upload(std::vector<floatX>(N));
    floatX* d_dgate = upload(std::vector<floatX>(N));
    floatX* d_dup = upload(std::vector<floatX>(N));

    swiglu_forward(d_out, d_gate, d_up, N, 0);
    std::vector<floatX> out = copy_from_device(d_out, N);
    CHECK_CLOSE("swiglu out", to_double(out).data(), out_ref.data(), N, 1e-6, 1e-5 + kRound);
    swiglu_backward(d_dgate, d_dup, d_dout, d_gate, d_up, N, 0);
    std::vector<floatX> dgate = copy_from_device(d_dgate, N), dup = copy_from_device(d_dup, N);
    CHECK_CLOSE("swiglu dgate", to_double(dgate).data(), dgate_ref.data(), N, 1e-6, 1e-5 + kRound);
    CHECK_CLOSE("swiglu dup", to_double(dup).data(), dup_ref.data(), N, 1e-6, 1e-5 + kRound);

    // in place: dgate over gate, dup over up; then forward into gate's buffer
    swiglu_backward(d_gate, d_up, d_dout, d_gate, d_up, N, 0);
    CHECK(bits_equal(copy_from_device(d_gate, N), dgate));
    CHECK(bits_equal(copy_from_device(d_up, N), dup));
    cudaCheck(cudaMemcpy(d_gate, gate.x.data(), N * sizeof(floatX), cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy(d_up, up.x.data(), N * sizeof(floatX), cudaMemcpyHostToDevice));
    swiglu_forward(d_gate, d_gate, d_up, N, 0);
    CHECK(bits_equal(copy_from_device(d_gate, N), out));

    for (floatX* p : {d_gate, d_up, d_dout, d_out, d_dgate, d_dup}) { cudaCheck(cudaFree(p - misalign)); }
}

TEST_CASE(swiglu_forward_backward) {
    check_swiglu_case(4096, 0, 1);        // whole 128-bit chunks
    check_swiglu_case(256 * 8 * 3 + 7, 0, 2);  // tail of 7 (bf16) or 3 (fp32): N not a multiple of the chunk or block
    check_swiglu_case(1003, 1, 3);        // misaligned: scalar path
    check_swiglu_case(1, 0, 4);
}

TEST_CASE(swiglu_gradient_vs_finite_differences_fp32) {
    if (!kFP32) { return; }
    size_t N = 203;
    Data gate = random_data(N, 31, -6.0f, 6.0f), up = random_data(N, 32, -2.0f, 2.0f), dout = random_data(N, 33);
    floatX* d_gate = copy_to_device(gate.x);
    floatX* d_up = copy_to_device(up.x);
    floatX* d_dout = copy_to_device(dout.x);
    floatX* d_dgate = cudaMallocElements(floatX, N);
    floatX* d_dup = cudaMallocElements(floatX, N);
    floatX* d_out = cudaMallocElements(floatX, N);
    swiglu_backward(d_dgate, d_dup, d_dout, d_gate, d_up, N, 0);
    std::vector<double> dgate = to_double(copy_from_device(d_dgate, N)), dup = to_double(copy_from_device(d_dup, N));
    // elementwise: perturb every element at once, L_i = dout_i * out_i separately
    auto outputs = [&](float dg, float du) {
        std::vector<floatX> gv(N), uv(N);
        for (size_t i = 0; i < N; i++) {
            gv[i] = from_float<floatX>(to_float(gate.x[i]) + dg);
            uv[i] = from_float<floatX>(to_float(up.x[i]) + du);
        }
        cudaCheck(cudaMemcpy(d_gate, gv.data(), N * sizeof(floatX), cudaMemcpyHostToDevice));
        cudaCheck(cudaMemcpy(d_up, uv.data(), N * sizeof(floatX), cudaMemcpyHostToDevice));
        swiglu_forward(d_out, d_gate, d_up, N, 0);
        return to_double(copy_from_device(d_out, N));
    };
    const float h = 1e-2f;
    std::vector<double> gp = outputs(h, 0), gm = outputs(-h, 0), upp = outputs(0, h), um = outputs(0, -h);
    std::vector<double> fd_g(N), fd_u(N);
    for (size_t i = 0; i < N; i++) {
        fd_g[i] = dout.d[i] * (gp[i] - gm[i]) / (2 * h);
        fd_u[i] = dout.d[i] * (upp[i] - um[i]) / (2 * h);
    }
    CHECK_CLOSE("swiglu dgate vs fd", dgate.data(), fd_g.data(), N, 1e-3, 1e-2);
    CHECK_CLOSE("swiglu dup vs fd", dup.data(), fd_u.data(), N, 1e-3, 1e-2);
    for (floatX* p : {d_gate, d_up, d_dout, d_dgate, d_dup, d_out}) { cudaCheck(cudaFree(p)); }
}

TEST_MAIN()
