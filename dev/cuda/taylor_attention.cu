/*
Taylor attention's forward (`approximate`, llmc/kernels/attention_variants.cuh) and where its
rounding error comes from: is the separate normalisation's gap to a float64 evaluation the
kernel's arithmetic, which another evaluation order or wider accumulators would remove, or the
conditioning of the maths, which nothing inside the kernel can remove?

Per query row t, x[tau] = q[t].k[tau] / sqrt(hd) over the visible keys (causal here):
    joint:    out = sum f(x) v / sum f(x),      f(x) = 1 + x + x^2/2 >= 1/2
    separate: out = sum_n (sum f_n(x) v) / (sum f_n(x)),   f_0 = 1, f_1 = x, f_2 = x^2/2
The first-order denominator Z_1 = sum x changes sign. Its condition number
    kappa[t] = sum |x| / |sum x|
is how much a relative perturbation u of every x (rounding, of x itself or of its inputs) can
move Z_1, relative: |dZ_1| / |Z_1| <= kappa u; A_1 = (sum x v) / Z_1 inherits it.

version 1: the llmc kernel (fp32: x by attn_dot, the running sums in key order)
version 2: the separate form with x and every sum in double, one rounding at the end: the
           most a numerics-only change of the kernel can do (the exact value of its fp32 inputs)
version 3: the separate form with Kahan-compensated fp32 sums (x still by attn_dot)
Versions 2 and 3 exist only here; llmc keeps version 1 (doc/deconstructing.md "approximate" has
the measurement and why).

main() validates every version against a double reference on inputs where the maths is well
conditioned (q, k >= 0, so every x >= 0 and kappa = 1), and version 2 on zero-mean inputs too
(there it must equal the reference to a few output roundings, whatever kappa). Then, on
zero-mean inputs, it prints the error of each version per decade of kappa next to the input
floor: the change of the exact (double) result when q, k, v are perturbed by one unit roundoff
of floatX, i.e. the error an exact kernel still has when its inputs carry a single rounding.
The error measure of a row: max_e |out - ref| / max_e |ref| (the row's largest element sets the
scale; rows near Z_1 = 0 are large).

Build and run (validation and the measurement on any executor, fp32 for the doc's figures):
    make build/host-fp32/taylor_attention PRECISION=FP32 && ./build/host-fp32/taylor_attention
*/
#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "dev/cuda/common.h"                      // defines: validate_result, copy helpers
#include "llmc/kernels/attention_variants.cuh"  // defines: taylor_attention_forward, attn_load_row, attn_dot

// ----------------------------------------------------------------------------------------
// CPU reference: every pair written out, in double

// out (B,T,Hq,hd) from q (B,T,Hq,hd), k, v (B,T,Hkv,hd), causal; kappa (B,Hq,T): sum|x| / |sum x|
void taylor_forward_cpu(std::vector<double>& out, std::vector<double>* kappa, const std::vector<double>& q,
                        const std::vector<double>& k, const std::vector<double>& v, int B, int T, int Hq, int Hkv,
                        int hd, TaylorNorm norm) {
    out.assign((size_t)B * T * Hq * hd, 0.0);
    if (kappa) { kappa->assign((size_t)B * Hq * T, 0.0); }
    const double scale = 1.0 / std::sqrt((double)hd);
    std::vector<double> x(T);
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < Hq; h++) {
            int j = h / (Hq / Hkv);
            for (int t = 0; t < T; t++) {
                const double* qr = &q[(((size_t)b * T + t) * Hq + h) * hd];
                double z[3] = {0, 0, 0}, abs_x = 0;
                for (int tau = 0; tau <= t; tau++) {
                    const double* kr = &k[(((size_t)b * T + tau) * Hkv + j) * hd];
                    double dot = 0;
                    for (int e = 0; e < hd; e++) { dot += qr[e] * kr[e]; }
                    x[tau] = dot * scale;
                    z[0] += 1;
                    z[1] += x[tau];
                    z[2] += 0.5 * x[tau] * x[tau];
                    abs_x += std::fabs(x[tau]);
                }
                if (kappa) { (*kappa)[((size_t)b * Hq + h) * T + t] = abs_x / std::fabs(z[1]); }
                double* o = &out[(((size_t)b * T + t) * Hq + h) * hd];
                for (int tau = 0; tau <= t; tau++) {
                    const double* vr = &v[(((size_t)b * T + tau) * Hkv + j) * hd];
                    double f[3] = {1.0, x[tau], 0.5 * x[tau] * x[tau]};
                    double w = norm == TaylorNorm::Joint ? (f[0] + f[1] + f[2]) / (z[0] + z[1] + z[2])
                                                         : f[0] / z[0] + f[1] / z[1] + f[2] / z[2];
                    for (int e = 0; e < hd; e++) { o[e] += w * vr[e]; }
                }
            }
        }
    }
}

// ----------------------------------------------------------------------------------------
// versions 2 and 3 of the separate forward (one thread per query row, as version 1)

template <int HD>
__global__ void taylor_separate_double_kernel(floatX* out, const floatX* q, const floatX* k, const floatX* v, int T,
                                              int Hq, int Hkv, int hd) {
    int h = blockIdx.y, b = blockIdx.z, j = h / (Hq / Hkv);
    int t = blockIdx.x * kTaylorRows + threadIdx.x;
    if (t >= T) { return; }
    const double scale = 1.0 / sqrt((double)hd);
    float q_row[HD], k_row[HD], v_row[HD];
    double acc[3][HD], z[3] = {0.0, 0.0, 0.0};
    attn_load_row<HD>(q_row, q, b, t, h, T, Hq, hd);
    for (int e = 0; e < HD; e++) { acc[0][e] = acc[1][e] = acc[2][e] = 0.0; }
    for (int tau = 0; tau <= t; tau++) {
        attn_load_row<HD>(k_row, k, b, tau, j, T, Hkv, hd);
        attn_load_row<HD>(v_row, v, b, tau, j, T, Hkv, hd);
        double dot = 0.0;
        for (int e = 0; e < HD; e++) { dot += (double)q_row[e] * k_row[e]; }
        double f[3] = {1.0, dot * scale, 0.5 * dot * scale * dot * scale};
        for (int n = 0; n < 3; n++) {
            z[n] += f[n];
            for (int e = 0; e < HD; e++) { acc[n][e] += f[n] * v_row[e]; }
        }
    }
    floatX* out_row = out + (((size_t)b * T + t) * Hq + h) * hd;
    for (int e = 0; e < hd; e++) { out_row[e] = from_float<floatX>((float)(acc[0][e] / z[0] + acc[1][e] / z[1] + acc[2][e] / z[2])); }
}

// sum += x with Kahan's compensation c (the low-order bits the last addition lost)
__device__ __forceinline__ void kahan_add(float& sum, float& c, float x) {
    float y = x - c, s = sum + y;
    c = (s - sum) - y;
    sum = s;
}

template <int HD>
__global__ void taylor_separate_kahan_kernel(floatX* out, const floatX* q, const floatX* k, const floatX* v, int T,
                                             int Hq, int Hkv, int hd) {
    int h = blockIdx.y, b = blockIdx.z, j = h / (Hq / Hkv);
    int t = blockIdx.x * kTaylorRows + threadIdx.x;
    if (t >= T) { return; }
    const float scale = 1.0f / sqrtf((float)hd);
    float q_row[HD], k_row[HD], v_row[HD];
    float acc[3][HD], acc_c[3][HD], z[3] = {0.0f, 0.0f, 0.0f}, z_c[3] = {0.0f, 0.0f, 0.0f};
    attn_load_row<HD>(q_row, q, b, t, h, T, Hq, hd, scale);
    for (int n = 0; n < 3; n++) {
        for (int e = 0; e < HD; e++) { acc[n][e] = acc_c[n][e] = 0.0f; }
    }
    for (int tau = 0; tau <= t; tau++) {
        attn_load_row<HD>(k_row, k, b, tau, j, T, Hkv, hd);
        attn_load_row<HD>(v_row, v, b, tau, j, T, Hkv, hd);
        float x = attn_dot<HD>(q_row, k_row);
        float f[3] = {1.0f, x, 0.5f * x * x};
        for (int n = 0; n < 3; n++) {
            kahan_add(z[n], z_c[n], f[n]);
            for (int e = 0; e < HD; e++) { kahan_add(acc[n][e], acc_c[n][e], f[n] * v_row[e]); }
        }
    }
    floatX* out_row = out + (((size_t)b * T + t) * Hq + h) * hd;
    for (int e = 0; e < hd; e++) { out_row[e] = from_float<floatX>(acc[0][e] / z[0] + acc[1][e] / z[1] + acc[2][e] / z[2]); }
}

void taylor_forward_version(int version, const AttnShape& s, const AttnTensors& t, TaylorNorm norm) {
    if (version == 1) {
        taylor_attention_forward(s, t, norm, 0);
        return;
    }
    if (norm != TaylorNorm::Separate || (version != 2 && version != 3)) {
        fprintf(stderr, "unknown version %d of the %s form\n", version, kTaylorNorms.name(norm));
        exit(EXIT_FAILURE);
    }
    attention_dispatch_head_dim(s.hd, [&](auto head_dim) {
        constexpr int HD = decltype(head_dim)::value;
        dim3 grid(CEIL_DIV(s.T, kTaylorRows), s.Hq, s.B);
        if (version == 2) {
            LAUNCH(grid, kTaylorRows, 0, 0, taylor_separate_double_kernel<HD>)(t.out, t.q, t.k, t.v, s.T, s.Hq, s.Hkv, s.hd);
        } else {
            LAUNCH(grid, kTaylorRows, 0, 0, taylor_separate_kahan_kernel<HD>)(t.out, t.q, t.k, t.v, s.T, s.Hq, s.Hkv, s.hd);
        }
    });
    cudaCheckLaunch();
}

// ----------------------------------------------------------------------------------------

struct Case {
    std::vector<floatX> q, k, v;     // what the kernels read
    std::vector<double> qd, kd, vd;  // the same values in double
};

// q, k uniform in [lo, 1], v in [-1, 1], each rounded to floatX
Case make_case(size_t nq, size_t nkv, float lo, uint32_t seed) {
    Case c;
    auto fill = [](std::vector<floatX>& dst, std::vector<double>& dd, size_t n, float a, uint32_t sd) {
        dst = convert_vector<floatX>(make_random_float(n, sd, a, 1.0f));
        dd.resize(n);
        for (size_t i = 0; i < n; i++) { dd[i] = to_float(dst[i]); }
    };
    fill(c.q, c.qd, nq, lo, seed);
    fill(c.k, c.kd, nkv, lo, seed + 1);
    fill(c.v, c.vd, nkv, -1.0f, seed + 2);
    return c;
}

// per row (b, t, h): max_e |got - ref| / max_e |ref|, rows in the (B,Hq,T) order of kappa
std::vector<double> row_errors(const std::vector<double>& got, const std::vector<double>& ref, int B, int T, int Hq,
                               int hd) {
    std::vector<double> err((size_t)B * Hq * T);
    for (int b = 0; b < B; b++) {
        for (int t = 0; t < T; t++) {
            for (int h = 0; h < Hq; h++) {
                size_t base = (((size_t)b * T + t) * Hq + h) * hd;
                double num = 0, den = 0;
                for (int e = 0; e < hd; e++) {
                    num = std::max(num, std::fabs(got[base + e] - ref[base + e]));
                    den = std::max(den, std::fabs(ref[base + e]));
                }
                err[((size_t)b * Hq + h) * T + t] = num / den;
            }
        }
    }
    return err;
}

std::vector<double> run_version(int version, const AttnShape& s, const Case& c, TaylorNorm norm) {
    size_t nq = (size_t)s.B * s.T * s.Hq * s.hd;
    floatX *d_q = copy_to_device(c.q), *d_k = copy_to_device(c.k), *d_v = copy_to_device(c.v);
    floatX* d_out = cudaMallocElements(floatX, nq);
    float* d_stats = cudaMallocElements(float, (size_t)3 * s.B * s.Hq * s.T);
    AttnTensors t{d_q, d_k, d_v, d_out, d_stats};
    taylor_forward_version(version, s, t, norm);
    std::vector<floatX> raw = copy_from_device(d_out, nq);
    std::vector<double> out(nq);
    for (size_t i = 0; i < nq; i++) { out[i] = to_float(raw[i]); }
    for (void* p : {(void*)d_q, (void*)d_k, (void*)d_v, (void*)d_out, (void*)d_stats}) { cudaCheck(cudaFree(p)); }
    return out;
}

double quantile(std::vector<double> v, double p) {
    if (v.empty()) { return NAN; }
    std::sort(v.begin(), v.end());
    return v[std::min(v.size() - 1, (size_t)(p * (v.size() - 1) + 0.5))];
}

int main(int argc, char** argv) {
    // the CPU study's head shape (qwen-cpu: hd 32, MHA) at a context where sum x crosses zero often
    AttnShape s{2, 256, 4, 4, 32};
    int first = 1, last = 3;
    if (argc > 1) { first = last = atoi(argv[1]); }
    const size_t nq = (size_t)s.B * s.T * s.Hq * s.hd, nkv = (size_t)s.B * s.T * s.Hkv * s.hd;
    const bool fp32 = PRECISION_MODE == PrecisionMode::FP32;
    const double unit = fp32 ? std::ldexp(1.0, -24) : std::ldexp(1.0, -8);  // floatX's unit roundoff
    printf("taylor_attention (%s), B=%d T=%d Hq=%d Hkv=%d hd=%d\n", PRECISION_NAME, s.B, s.T, s.Hq, s.Hkv, s.hd);

    // 1. validation. Well conditioned (q, k >= 0): every version, at test_attention_variants' fp32 tolerance
    // (bf16: one output rounding, 2^-8 relative, and the kernels' fp32 arithmetic). Zero-mean: version 2
    // alone, to 4 output roundings of the row's largest element, kappa notwithstanding.
    bool all_ok = true;
    Case pos = make_case(nq, nkv, 0.0f, 1), mixed = make_case(nq, nkv, -1.0f, 11);
    std::vector<double> ref, kappa;
    for (TaylorNorm norm : {TaylorNorm::Joint, TaylorNorm::Separate}) {
        taylor_forward_cpu(ref, nullptr, pos.qd, pos.kd, pos.vd, s.B, s.T, s.Hq, s.Hkv, s.hd, norm);
        std::vector<float> ref_f(ref.begin(), ref.end());
        for (int version = first; version <= (norm == TaylorNorm::Joint ? 1 : last); version++) {
            std::vector<double> got = run_version(version, s, pos, norm);
            std::vector<floatX> got_x(got.size());
            for (size_t i = 0; i < got.size(); i++) { got_x[i] = from_float<floatX>((float)got[i]); }
            floatX* d = copy_to_device(got_x);
            printf("  %s version %d, q, k >= 0\n", kTaylorNorms.name(norm), version);
            all_ok &= validate_result(d, ref_f.data(), "out", nq, fp32 ? 2e-5f : 2e-2f, fp32 ? 1e-4f : 1.0f / 128);
            cudaCheck(cudaFree(d));
        }
    }
    taylor_forward_cpu(ref, &kappa, mixed.qd, mixed.kd, mixed.vd, s.B, s.T, s.Hq, s.Hkv, s.hd, TaylorNorm::Separate);
    if (first <= 2 && 2 <= last) {
        std::vector<double> err2 = row_errors(run_version(2, s, mixed, TaylorNorm::Separate), ref, s.B, s.T, s.Hq, s.hd);
        double worst = *std::max_element(err2.begin(), err2.end());
        bool ok = worst <= 4 * unit;
        printf("  separate version 2, zero-mean q, k: worst row error %.3g (%s, limit 4 x %.3g)\n", worst,
               ok ? "ok" : "MISMATCH", unit);
        all_ok &= ok;
    }
    if (!all_ok) {
        printf("taylor_attention: VALIDATION FAILED\n");
        return EXIT_FAILURE;
    }

    // 2. the measurement: zero-mean q, k, v; errors per decade of kappa
    std::mt19937 rng(5);
    std::uniform_real_distribution<double> jitter(-unit, unit);
    auto perturbed = [&](const std::vector<double>& a) {
        std::vector<double> p(a);
        for (double& x : p) { x *= 1.0 + jitter(rng); }
        return p;
    };
    std::vector<double> ref_p;
    taylor_forward_cpu(ref_p, nullptr, perturbed(mixed.qd), perturbed(mixed.kd), perturbed(mixed.vd), s.B, s.T, s.Hq,
                       s.Hkv, s.hd, TaylorNorm::Separate);
    std::vector<std::vector<double>> errs;
    std::vector<std::string> names;
    for (int version = first; version <= last; version++) {
        errs.push_back(row_errors(run_version(version, s, mixed, TaylorNorm::Separate), ref, s.B, s.T, s.Hq, s.hd));
        names.push_back("v" + std::to_string(version));
    }
    errs.push_back(row_errors(ref_p, ref, s.B, s.T, s.Hq, s.hd));
    names.push_back("input floor");
    std::vector<double> joint_ref;
    taylor_forward_cpu(joint_ref, nullptr, mixed.qd, mixed.kd, mixed.vd, s.B, s.T, s.Hq, s.Hkv, s.hd, TaylorNorm::Joint);
    std::vector<double> joint_err = row_errors(run_version(1, s, mixed, TaylorNorm::Joint), joint_ref, s.B, s.T, s.Hq, s.hd);

    printf("\nseparate form, zero-mean q, k, v in [-1, 1]: row error max|out - ref| / max|ref| against double,\n"
           "median / max per decade of kappa = sum|x| / |sum x|; u = %.3g (floatX's unit roundoff)\n", unit);
    printf("%-16s %6s", "kappa", "rows");
    for (auto& n : names) { printf(" %23s", n.c_str()); }
    printf("\n");
    for (double lo = 1; lo < 1e12; lo *= 10) {
        std::vector<std::vector<double>> bin(errs.size());
        for (size_t r = 0; r < kappa.size(); r++) {
            if (kappa[r] >= lo && (kappa[r] < lo * 10 || lo * 10 >= 1e12)) {
                for (size_t i = 0; i < errs.size(); i++) { bin[i].push_back(errs[i][r]); }
            }
        }
        if (bin[0].empty()) { continue; }
        printf("[%7.0e, %7.0e) %6zu", lo, lo * 10, bin[0].size());
        for (auto& b : bin) { printf("   %9.2e / %9.2e", quantile(b, 0.5), quantile(b, 1.0)); }
        printf("\n");
    }
    printf("joint form, same inputs, v1: median %.2e, max %.2e (its denominator sum f(x) >= rows / 2)\n",
           quantile(joint_err, 0.5), quantile(joint_err, 1.0));
    printf("taylor_attention: all versions valid (no benchmark: this file measures accuracy)\n");
    return 0;
}
