/*
test_muon: the Muon pieces (llmc/kernels/muon.cuh) and the LR schedules (llmc/optim/schedule.h) against
plain C++ double references written here from doc/san-model.md ("Optimizers",
"Schedules"), on whichever executor built it.

  ns_*             Newton-Schulz output of MuonOptimizer::orthogonalize (prepare, normalise,
                   batched NS), in fp32 and in floatX, vs a double NS, for square, tall, wide
                   and GQA k/v shapes, several matrices per batched group;
  ns_property_*    the defining property, computed independently: the singular values of
                   the result (Jacobi eigenvalues of Y^T Y in double) are those of the input
                   (Jacobi on X0^T X0) mapped by the scalar quintic iterated ns_steps times,
                   so they lie inside the band [lo, hi] that map gives on the input's range;
  muon_step_*      full Muon steps (keller and paper orders, clip scale, decay, momentum
                   state) on a small mixed layout vs a double reference of the equations;
  rates_*          default rates per optimizer and the N-GPU scaling (train_san.py's
                   opt_from_args);
  schedule_*       f(s) at the boundaries of warmup, plateau and decay, derived from the
                   definition (the SAN paper code's convention, at its 100,000 steps too),
                   and the W + D > S error.
The NS coefficients here are literals (3.4445, -4.7750, 2.0315), not muon.cuh's constant,
so a wrong coefficient there fails, as does a wrong orientation of tall matrices.
*/
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "llmc/kernels/muon.cuh"
#include "llmc/optim/optimizer.h"
#include "llmc/optim/schedule.h"
#include "dev/test/compare.h"
#include "dev/test/testing.h"

// ----------------------------------------------------------------------------------------
// schedules: expected values written from the definition for chosen S

static double cosine_to(double final_frac, double p) { return final_frac + (1.0 - final_frac) * 0.5 * (1.0 + std::cos(M_PI * p)); }

static Schedule make_schedule(const char* kind, double warmup, double decay, double final_frac) {
    Schedule s;
    CHECK(kScheduleKinds.parse(kind, &s.kind));
    s.warmup_frac = warmup;
    s.decay_frac = decay;
    s.final_frac = final_frac;
    return s;
}

#define CHECK_F(sched, step, total, expected)                                                                    \
    do {                                                                                                         \
        double got_ = (sched).multiplier((step), (total)), exp_ = (expected);                                    \
        if (!(std::fabs(got_ - exp_) <= 1e-12)) {                                                                \
            char msg_[200];                                                                                      \
            snprintf(msg_, sizeof(msg_), "%s f(%ld of %ld) = %.15g, expected %.15g", (sched).name(),             \
                     (long)(step), (long)(total), got_, exp_);                                                   \
            testing::report_failure(__FILE__, __LINE__, msg_);                                                   \
        }                                                                                                        \
    } while (0)

TEST_CASE(schedule_wsd_defaults) {
    // step s runs at the rate of progress s (the SAN paper code's optax schedule): the first
    // update of the warmup at rate 0, the decay's first step still at the peak
    Schedule s = make_schedule("wsd", 0.05, 0.15, 0.05);  // S = 100: W = 5, D = 15
    CHECK_F(s, 0, 100, 0.0);
    CHECK_F(s, 3, 100, 3.0 / 5);
    CHECK_F(s, 4, 100, 4.0 / 5);  // last warmup step
    CHECK_F(s, 5, 100, 1.0);
    CHECK_F(s, 85, 100, 1.0);  // s = S - D: the decay's progress 0
    CHECK_F(s, 86, 100, cosine_to(0.05, 1.0 / 15));
    CHECK_F(s, 92, 100, cosine_to(0.05, 7.0 / 15));
    CHECK_F(s, 99, 100, cosine_to(0.05, 14.0 / 15));  // one step short of final
    // S = 10 (the debug states): W = floor(0.5) = 0, D = floor(1.5) = 1
    CHECK_F(s, 0, 10, 1.0);
    CHECK_F(s, 9, 10, 1.0);  // the one decay step at progress 0
}

TEST_CASE(schedule_paper_length) {
    // the SAN paper's "105B": 100,000 steps; W = 5,000, D = 15,000 (0.05 and 0.15 of them)
    Schedule s = make_schedule("wsd", 0.05, 0.15, 0.05);
    CHECK_F(s, 0, 100000, 0.0);
    CHECK_F(s, 1, 100000, 1.0 / 5000);
    CHECK_F(s, 4999, 100000, 4999.0 / 5000);
    CHECK_F(s, 5000, 100000, 1.0);
    CHECK_F(s, 85000, 100000, 1.0);
    CHECK_F(s, 85001, 100000, cosine_to(0.05, 1.0 / 15000));
    CHECK_F(s, 99999, 100000, cosine_to(0.05, 14999.0 / 15000));
}

TEST_CASE(schedule_cosine_linear_constant) {
    Schedule c = make_schedule("cosine", 0.1, 0.15, 0.1);  // S = 50: W = 5, 45 decay steps
    CHECK_F(c, 4, 50, 4.0 / 5);
    CHECK_F(c, 5, 50, 1.0);
    CHECK_F(c, 6, 50, cosine_to(0.1, 1.0 / 45));
    CHECK_F(c, 27, 50, cosine_to(0.1, 22.0 / 45));
    CHECK_F(c, 49, 50, cosine_to(0.1, 44.0 / 45));
    Schedule l = make_schedule("linear", 0.1, 0.15, 0.1);
    CHECK_F(l, 0, 50, 0.0);
    CHECK_F(l, 1, 50, 1.0 / 5);
    CHECK_F(l, 6, 50, 1.0 - 0.9 / 45);
    CHECK_F(l, 49, 50, 1.0 - 0.9 * 44 / 45);
    Schedule k = make_schedule("constant", 0.1, 0.15, 0.1);
    CHECK_F(k, 0, 50, 0.0);
    CHECK_F(k, 4, 50, 4.0 / 5);
    CHECK_F(k, 5, 50, 1.0);
    CHECK_F(k, 49, 50, 1.0);
    Schedule k0 = make_schedule("constant", 0.0, 0.15, 0.1);  // no warmup: exactly 1 everywhere
    for (long step : {0L, 1L, 49L}) { CHECK_F(k0, step, 50, 1.0); }
    Schedule c0 = make_schedule("cosine", 0.0, 0.0, 0.0);  // W = 0: p = s / S
    CHECK_F(c0, 0, 8, 1.0);
    CHECK_F(c0, 7, 8, cosine_to(0.0, 7.0 / 8));
}

TEST_CASE(schedule_step_counts_floored) {
    Schedule s = make_schedule("wsd", 0.29, 0.15, 0.05);  // 0.29 x 100 = 28.999...: 29 warmup steps (slack)
    CHECK_F(s, 1, 100, 1.0 / 29);
    CHECK_F(s, 28, 100, 28.0 / 29);
    CHECK_F(s, 29, 100, 1.0);
    Schedule h = make_schedule("wsd", 0.25, 0.25, 0.0);  // S = 10: W = floor(2.5) = 2, D = 2
    CHECK_F(h, 1, 10, 1.0 / 2);
    CHECK_F(h, 2, 10, 1.0);
    CHECK_F(h, 8, 10, 1.0);
    CHECK_F(h, 9, 10, cosine_to(0.0, 1.0 / 2));
    Schedule d = make_schedule("cosine", 2000.0 / 120000, 0.15, 0.1);  // a whole count as a fraction
    CHECK_F(d, 1999, 120000, 1999.0 / 2000);
    CHECK_F(d, 2000, 120000, 1.0);
}

// check() exits the process: run it in a child. These cases come first in the file (cases
// run in file order) so the host backend has started no worker threads before the fork.
static int exit_status_of_check(const Schedule& s, long total) {
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        if (freopen("/dev/null", "w", stderr) == nullptr) { _exit(3); }
        s.check(total);
        _exit(0);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

TEST_CASE(schedule_errors) {
    CHECK(exit_status_of_check(make_schedule("wsd", 0.5, 0.5, 0.0), 10) == 0);   // W + D = S: allowed
    CHECK(exit_status_of_check(make_schedule("wsd", 0.5, 0.6, 0.0), 10) != 0);   // W + D > S
    CHECK(exit_status_of_check(make_schedule("cosine", 1.0, 0.6, 0.0), 10) == 0);  // decay applies to wsd only
    ScheduleKind kind = ScheduleKind::WSD;
    CHECK(!kScheduleKinds.parse("step", &kind));  // an unknown name is refused where it is parsed (flag, file)
    CHECK(exit_status_of_check(make_schedule("wsd", 0.1, 0.1, 0.0), 0) != 0);
}

// ----------------------------------------------------------------------------------------
// default rates and --lr-scale-gpus (OptimizerConfig::resolve_rates vs opt_from_args)

// the SAN arm's defaults of presets/rates/san-paper.conf (this test needs no compiled-in file)
const DefaultRates kSanArm{0.02, 6e-4, 3e-4, "the SAN paper's SAN arm"};

static OptimizerConfig rates(const char* optimizer, double lr, double lr_other, int gpus,
                             const DefaultRates& defaults = kSanArm) {
    OptimizerConfig o;
    CHECK(kOptimizerKinds.parse(optimizer, &o.optimizer));
    o.lr = lr;
    o.lr_other = lr_other;
    o.resolve_rates(defaults, gpus);
    return o;
}

TEST_CASE(rates_defaults_and_gpu_scaling) {
    OptimizerConfig m = rates("muon", -1, -1, 1);
    CHECK(m.lr == 0.02 && m.lr_other == 3e-4);
    OptimizerConfig a = rates("adamw", -1, -1, 1);
    CHECK(a.lr == 6e-4 && a.lr_other == 6e-4);
    OptimizerConfig a2 = rates("adamw", 1e-3, -1, 1);  // lr_other follows an explicit --lr
    CHECK(a2.lr == 1e-3 && a2.lr_other == 1e-3);
    OptimizerConfig m4 = rates("muon", -1, -1, 4);  // Muon x sqrt(4), its AdamW group x 4
    CHECK(std::fabs(m4.lr - 0.04) < 1e-15 && std::fabs(m4.lr_other - 1.2e-3) < 1e-15);
    OptimizerConfig a4 = rates("adamw", -1, -1, 4);
    CHECK(std::fabs(a4.lr - 2.4e-3) < 1e-15 && std::fabs(a4.lr_other - 2.4e-3) < 1e-15);
    OptimizerConfig m2 = rates("muon", 0.01, 1e-3, 2);
    CHECK(std::fabs(m2.lr - 0.01 * std::sqrt(2.0)) < 1e-15 && std::fabs(m2.lr_other - 2e-3) < 1e-15);
    // a model's own defaults (the FFN arm's: Muon 0.04, AdamW 2.4e-3) replace only the unset rates
    DefaultRates ffn{0.04, 2.4e-3, 3e-4};
    OptimizerConfig fm = rates("muon", -1, -1, 8, ffn);  // the paper setup's n = 8
    CHECK(std::fabs(fm.lr - 0.04 * std::sqrt(8.0)) < 1e-15 && std::fabs(fm.lr_other - 2.4e-3) < 1e-15);
    OptimizerConfig fa = rates("adamw", -1, -1, 1, ffn);
    CHECK(fa.lr == 2.4e-3 && fa.lr_other == 2.4e-3);
    OptimizerConfig fx = rates("adamw", 1e-3, -1, 1, ffn);
    CHECK(fx.lr == 1e-3 && fx.lr_other == 1e-3);
}

// ----------------------------------------------------------------------------------------
// double references

using Mat = std::vector<double>;  // row-major

static Mat matmul(const Mat& A, const Mat& B, int m, int k, int n) {  // (m,k) x (k,n)
    Mat C((size_t)m * n, 0.0);
    for (int i = 0; i < m; i++) {
        for (int p = 0; p < k; p++) {
            double a = A[(size_t)i * k + p];
            for (int j = 0; j < n; j++) { C[(size_t)i * n + j] += a * B[(size_t)p * n + j]; }
        }
    }
    return C;
}
static Mat transpose(const Mat& A, int m, int n) {
    Mat T((size_t)m * n);
    for (int i = 0; i < m; i++) {
        for (int j = 0; j < n; j++) { T[(size_t)j * m + i] = A[(size_t)i * n + j]; }
    }
    return T;
}

// NS of doc/san-model.md: normalise, go wide, iterate, come back.
static Mat ns_reference(Mat X, int rows, int cols, int steps) {
    const double a = 3.4445, b = -4.7750, c = 2.0315;
    double norm = 0.0;
    for (double x : X) { norm += x * x; }
    norm = std::sqrt(norm) + 1e-7;
    for (double& x : X) { x /= norm; }
    bool tall = rows > cols;
    int r = rows, k = cols;
    if (tall) {
        X = transpose(X, rows, cols);
        std::swap(r, k);
    }
    for (int s = 0; s < steps; s++) {
        Mat A = matmul(X, transpose(X, r, k), r, k, r);
        Mat A2 = matmul(A, A, r, r, r);
        Mat B(A.size());
        for (size_t i = 0; i < A.size(); i++) { B[i] = b * A[i] + c * A2[i]; }
        Mat BX = matmul(B, X, r, r, k);
        for (size_t i = 0; i < X.size(); i++) { X[i] = a * X[i] + BX[i]; }
    }
    return tall ? transpose(X, r, k) : X;
}

// Eigenvalues of a symmetric n x n matrix (cyclic Jacobi), ascending.
static std::vector<double> jacobi_eigenvalues(Mat A, int n) {
    for (int sweep = 0; sweep < 100; sweep++) {
        double off = 0.0, diag = 0.0;
        for (int i = 0; i < n; i++) {
            diag += A[(size_t)i * n + i] * A[(size_t)i * n + i];
            for (int j = i + 1; j < n; j++) { off += A[(size_t)i * n + j] * A[(size_t)i * n + j]; }
        }
        if (off <= 1e-30 * diag) { break; }
        for (int p = 0; p < n; p++) {
            for (int q = p + 1; q < n; q++) {
                double apq = A[(size_t)p * n + q];
                if (apq == 0.0) { continue; }
                double theta = (A[(size_t)q * n + q] - A[(size_t)p * n + p]) / (2.0 * apq);
                double t = (theta >= 0 ? 1.0 : -1.0) / (std::fabs(theta) + std::sqrt(theta * theta + 1.0));
                double cs = 1.0 / std::sqrt(t * t + 1.0), sn = t * cs;
                for (int k = 0; k < n; k++) {  // A <- A J (columns p, q)
                    double akp = A[(size_t)k * n + p], akq = A[(size_t)k * n + q];
                    A[(size_t)k * n + p] = cs * akp - sn * akq;
                    A[(size_t)k * n + q] = sn * akp + cs * akq;
                }
                for (int k = 0; k < n; k++) {  // A <- J^T A (rows p, q)
                    double apk = A[(size_t)p * n + k], aqk = A[(size_t)q * n + k];
                    A[(size_t)p * n + k] = cs * apk - sn * aqk;
                    A[(size_t)q * n + k] = sn * apk + cs * aqk;
                }
            }
        }
    }
    std::vector<double> e(n);
    for (int i = 0; i < n; i++) { e[i] = A[(size_t)i * n + i]; }
    std::sort(e.begin(), e.end());
    return e;
}

// Singular values (ascending) of a (rows, cols) matrix from its small Gram matrix.
static std::vector<double> singular_values(const Mat& X, int rows, int cols) {
    Mat G = rows >= cols ? matmul(transpose(X, rows, cols), X, cols, rows, cols)
                         : matmul(X, transpose(X, rows, cols), rows, cols, rows);
    std::vector<double> e = jacobi_eigenvalues(G, std::min(rows, cols));
    for (double& v : e) { v = std::sqrt(std::max(0.0, v)); }
    return e;
}

static double quintic_iterated(double s, int steps) {
    for (int k = 0; k < steps; k++) { s = 3.4445 * s - 4.7750 * s * s * s + 2.0315 * s * s * s * s * s; }
    return s;
}

// ----------------------------------------------------------------------------------------
// running the device code on a group of matrices

struct Layout {
    int rows, cols, batch;
    std::vector<MuonMatrix> matrices;
    size_t total;
    // matrices of one shape with a few unrelated elements between them (real layouts interleave gains)
    Layout(int r, int c, int b) : rows(r), cols(c), batch(b) {
        size_t offset = 3;
        for (int k = 0; k < b; k++) {
            matrices.push_back({(int64_t)offset, r, c});
            offset += (size_t)r * c + 5;
        }
        total = offset;
    }
};

// Gaussian gradients, rounded to floatX (the reference sees the rounded values).
static std::vector<float> random_grads(size_t n, uint32_t seed, float scale) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> dist(0.0f, scale);
    std::vector<float> g(n);
    for (float& x : g) { x = to_float(from_float<floatX>(dist(rng))); }
    return g;
}

// NS through MuonOptimizer::orthogonalize (paper order: NS of the raw gradient).
template <typename T>
static std::vector<float> device_ns(const Layout& L, const std::vector<float>& grads, int steps) {
    std::vector<floatX> gx(grads.size());
    for (size_t i = 0; i < grads.size(); i++) { gx[i] = from_float<floatX>(grads[i]); }
    floatX* d_grads = copy_to_device(gx);
    float* d_mom = cudaMallocElements(float, L.total);
    cudaCheck(cudaMemset(d_mom, 0, L.total * sizeof(float)));
    MuonOptimizer muon(L.matrices);
    CHECK_EQ((int)muon.groups().size(), 1);
    MuonConfig cfg;
    cfg.order = MuonOrder::Paper;
    cfg.ns_steps = steps;
    const T* X = muon.orthogonalize<T>(0, d_grads, d_mom, 1.0f, cfg, nullptr);
    std::vector<T> got = copy_from_device(X, (size_t)L.batch * L.rows * L.cols);
    std::vector<float> out(got.size());
    for (size_t i = 0; i < got.size(); i++) { out[i] = to_float(got[i]); }
    cudaFree(d_grads);
    cudaFree(d_mom);
    return out;
}

static std::vector<floatX> convert_grads(const std::vector<float>& g) {
    std::vector<floatX> out(g.size());
    for (size_t i = 0; i < g.size(); i++) { out[i] = from_float<floatX>(g[i]); }
    return out;
}

static Mat matrix_of(const std::vector<float>& buf, size_t offset, size_t n) {
    return Mat(buf.begin() + offset, buf.begin() + offset + n);
}

// Relative Frobenius error of each NS result vs the double reference, worst over the batch.
template <typename T>
static double ns_error(int rows, int cols, int batch, int steps) {
    Layout L(rows, cols, batch);
    std::vector<float> grads = random_grads(L.total, 1000 + rows * 7 + cols, 0.01f);
    std::vector<float> got = device_ns<T>(L, grads, steps);
    double worst = 0.0;
    size_t n = (size_t)rows * cols;
    for (int b = 0; b < batch; b++) {
        Mat ref = ns_reference(matrix_of(grads, L.matrices[b].offset, n), rows, cols, steps);
        double diff = 0.0, norm = 0.0;
        for (size_t i = 0; i < n; i++) {
            double d = got[(size_t)b * n + i] - ref[i];
            diff += d * d;
            norm += ref[i] * ref[i];
        }
        worst = std::max(worst, std::sqrt(diff / norm));
    }
    return worst;
}

// fp32 NS: rounding of 5 steps of GEMMs on matrices of norm ~1 (measured ~1e-6);
// bf16: every GEMM output (A, the polynomial, X) is rounded to 8 bits (measured ~1e-2).
constexpr double kNsTolFp32 = 2e-5;
constexpr double kNsTolBf16 = 6e-2;

static void check_ns_shape(int rows, int cols, int batch) {
    double e32 = ns_error<float>(rows, cols, batch, 5);
    double ex = ns_error<floatX>(rows, cols, batch, 5);
    double tol_x = PRECISION_MODE == PrecisionMode::FP32 ? kNsTolFp32 : kNsTolBf16;
    printf("    NS %4d x %-4d batch %d: relative error fp32 %.3g (tol %.3g), floatX %.3g (tol %.3g)\n", rows, cols, batch,
           e32, kNsTolFp32, ex, tol_x);
    CHECK(e32 <= kNsTolFp32);
    CHECK(ex <= tol_x);
}

TEST_CASE(ns_square) { check_ns_shape(64, 64, 3); }
TEST_CASE(ns_tall) { check_ns_shape(96, 32, 2); }
TEST_CASE(ns_wide) { check_ns_shape(32, 96, 2); }
TEST_CASE(ns_gqa_kv) {
    check_ns_shape(32, 64, 4);    // tiny preset wk/wv: 2 kv heads x 16, d 64
    check_ns_shape(256, 512, 2);  // san20 wk/wv: 4 kv heads x 64, d 512
}
TEST_CASE(ns_ffn) {
    check_ns_shape(128, 64, 2);  // tiny-ffn w_gate/w_up (tall)
    check_ns_shape(64, 128, 2);  // w_down (wide)
}
TEST_CASE(ns_zero_steps_is_normalisation) {
    CHECK(ns_error<float>(48, 16, 2, 0) <= 1e-6);
}

// The defining property: singular values map by the scalar quintic.
template <typename T>
static void check_property(int rows, int cols, double tol) {
    const int steps = 5;
    Layout L(rows, cols, 2);
    std::vector<float> grads = random_grads(L.total, 7 + rows + cols, 1.0f);
    std::vector<float> got = device_ns<T>(L, grads, steps);
    size_t n = (size_t)rows * cols;
    for (int b = 0; b < L.batch; b++) {
        Mat x0 = matrix_of(grads, L.matrices[b].offset, n);
        double norm = 0.0;
        for (double x : x0) { norm += x * x; }
        norm = std::sqrt(norm) + 1e-7;
        for (double& x : x0) { x /= norm; }
        std::vector<double> s_in = singular_values(x0, rows, cols);
        std::vector<double> s_out = singular_values(Mat(got.begin() + b * n, got.begin() + (b + 1) * n), rows, cols);
        std::vector<double> expected(s_in.size());
        for (size_t i = 0; i < s_in.size(); i++) { expected[i] = quintic_iterated(s_in[i], steps); }
        std::sort(expected.begin(), expected.end());
        // the band of the iterated quintic over the input's singular-value range
        double lo = INFINITY, hi = -INFINITY;
        for (int k = 0; k <= 20000; k++) {
            double s = s_in.front() + (s_in.back() - s_in.front()) * k / 20000.0;
            double v = quintic_iterated(s, steps);
            lo = std::min(lo, v);
            hi = std::max(hi, v);
        }
        double worst = 0.0;
        int outside = 0;
        for (size_t i = 0; i < s_out.size(); i++) {
            worst = std::max(worst, std::fabs(s_out[i] - expected[i]));
            outside += s_out[i] < lo - tol || s_out[i] > hi + tol;
        }
        if (b == 0) {
            printf("    %s %3d x %-3d: input sv [%.4f, %.4f] -> band [%.4f, %.4f]; result sv [%.4f, %.4f], "
                   "max |sv - p^5(sv_in)| %.3g (tol %.3g)\n",
                   sizeof(T) == 4 ? "fp32  " : "floatX", rows, cols, s_in.front(), s_in.back(), lo, hi, s_out.front(),
                   s_out.back(), worst, tol);
        }
        CHECK(worst <= tol);
        CHECK_EQ(outside, 0);
    }
}

// aspect 1:3 Gaussian matrices are well conditioned, so their whole spectrum lands in the
// quintic's band (~[0.7, 1.2]); the square case has small singular values and checks the map.
TEST_CASE(ns_property) {
    double tol_x = PRECISION_MODE == PrecisionMode::FP32 ? 1e-4 : 5e-2;
    for (auto shape : {std::make_pair(48, 144), std::make_pair(144, 48), std::make_pair(64, 64), std::make_pair(32, 64)}) {
        check_property<float>(shape.first, shape.second, 1e-4);
        check_property<floatX>(shape.first, shape.second, tol_x);
    }
}

// ----------------------------------------------------------------------------------------
// full Muon steps vs a double reference of the update equations

static void check_muon_steps(MuonOrder order, bool ns_fp32) {
    // two shape groups (one tall, one wide), interleaved with non-matrix elements
    std::vector<MuonMatrix> mats = {{2, 40, 24}, {970, 24, 40}, {1935, 40, 24}};
    size_t total = 1935 + 40 * 24 + 3;
    const int steps = 3;
    const float mu = 0.9f, lr = 0.05f, wd = 0.1f;
    const float scales[steps] = {1.0f, 0.5f, 0.25f};  // the clip factor enters before everything
    std::vector<float> p0 = random_grads(total, 5, 0.02f);
    std::vector<floatX> px(total);
    for (size_t i = 0; i < total; i++) { px[i] = from_float<floatX>(p0[i]); }
    floatX* d_params = copy_to_device(px);
    float* d_master = nullptr;
    if (PRECISION_MODE != PrecisionMode::FP32) { d_master = copy_to_device(p0); }
    float* d_mom = cudaMallocElements(float, total);
    cudaCheck(cudaMemset(d_mom, 0, total * sizeof(float)));
    floatX* d_grads = cudaMallocElements(floatX, total);
    MuonOptimizer muon(mats);
    CHECK_EQ((int)muon.groups().size(), 2);
    MuonConfig cfg;
    cfg.order = order;
    cfg.momentum = mu;
    cfg.ns_fp32 = ns_fp32;

    std::vector<Mat> P, M;
    for (const MuonMatrix& m : mats) {
        P.push_back(Mat(p0.begin() + m.offset, p0.begin() + m.offset + (size_t)m.rows * m.cols));
        M.push_back(Mat((size_t)m.rows * m.cols, 0.0));
    }
    for (int s = 0; s < steps; s++) {
        std::vector<float> g = random_grads(total, 100 + s, 0.1f);
        cudaCheck(cudaMemcpy(d_grads, convert_grads(g).data(), total * sizeof(floatX), cudaMemcpyHostToDevice));
        muon.step(d_params, d_master, d_grads, d_mom, scales[s], lr, wd, cfg, nullptr);
        for (size_t k = 0; k < mats.size(); k++) {
            const MuonMatrix& m = mats[k];
            size_t n = (size_t)m.rows * m.cols;
            Mat gk(n), U;
            for (size_t i = 0; i < n; i++) { gk[i] = (double)g[m.offset + i] * scales[s]; }
            if (order == MuonOrder::Keller) {
                Mat u(n);
                for (size_t i = 0; i < n; i++) {
                    M[k][i] = mu * M[k][i] + (1.0 - mu) * gk[i];
                    u[i] = (1.0 - mu) * gk[i] + mu * M[k][i];
                }
                U = ns_reference(u, m.rows, m.cols, 5);
                for (double& x : U) { x *= std::sqrt(std::max(1.0, (double)m.rows / m.cols)); }
            } else {
                Mat o = ns_reference(gk, m.rows, m.cols, 5);
                U.resize(n);
                for (size_t i = 0; i < n; i++) {
                    M[k][i] = mu * M[k][i] + o[i];
                    U[i] = o[i] + mu * M[k][i];
                }
            }
            for (size_t i = 0; i < n; i++) { P[k][i] = P[k][i] * (1.0 - (double)lr * wd) - lr * U[i]; }
        }
    }
    std::vector<float> got_p = d_master != nullptr ? copy_from_device(d_master, total) : std::vector<float>(total);
    if (d_master == nullptr) {
        std::vector<floatX> x = copy_from_device(d_params, total);
        for (size_t i = 0; i < total; i++) { got_p[i] = to_float(x[i]); }
    }
    std::vector<float> got_m = copy_from_device(d_mom, total);
    // measured: fp32 NS 6e-8 / 1.5e-7 (keller / paper params), 9.5e-7 (paper momentum, which
    // sums the undamped NS outputs: |M| up to ~1); bf16 NS 1.7e-3 / 2.0e-3 (keller / paper
    // params), 1.2e-2 (paper momentum)
    bool bf16_ns = !ns_fp32 && PRECISION_MODE != PrecisionMode::FP32;
    bool keller = order == MuonOrder::Keller;
    double tol_p = bf16_ns ? (keller ? 6e-3 : 5e-3) : 5e-7;
    double tol_m = keller ? 1e-7 : (bf16_ns ? 3e-2 : 3e-6);  // keller's momentum never sees NS
    double err_p = 0.0, err_m = 0.0;
    for (size_t k = 0; k < mats.size(); k++) {
        for (size_t i = 0; i < P[k].size(); i++) {
            err_p = std::max(err_p, std::fabs(got_p[mats[k].offset + i] - P[k][i]));
            err_m = std::max(err_m, std::fabs(got_m[mats[k].offset + i] - M[k][i]));
        }
    }
    printf("    %s order, NS in %s: max |param err| %.3g (tol %.3g), max |momentum err| %.3g (tol %.3g)\n",
           keller ? "keller" : "paper", bf16_ns ? "bf16" : "fp32", err_p, tol_p, err_m, tol_m);
    for (size_t k = 0; k < mats.size(); k++) {
        size_t n = (size_t)mats[k].rows * mats[k].cols;
        CHECK_CLOSE("params", got_p.data() + mats[k].offset, P[k].data(), n, tol_p, 0.0);
        // keller's momentum holds clipped gradients (~0.1): compare relative to its size
        CHECK_CLOSE("momentum", got_m.data() + mats[k].offset, M[k].data(), n, tol_m, 0.0);
    }
    // elements outside the matrices are untouched
    CHECK(got_p[0] == p0[0] && got_p[1] == p0[1] && got_m[0] == 0.0f && got_m[total - 1] == 0.0f);
    cudaFree(d_params);
    if (d_master != nullptr) { cudaFree(d_master); }
    cudaFree(d_mom);
    cudaFree(d_grads);
}

TEST_CASE(muon_step_keller_fp32) { check_muon_steps(MuonOrder::Keller, true); }
TEST_CASE(muon_step_paper_fp32) { check_muon_steps(MuonOrder::Paper, true); }
TEST_CASE(muon_step_keller_floatx) { check_muon_steps(MuonOrder::Keller, false); }
TEST_CASE(muon_step_paper_floatx) { check_muon_steps(MuonOrder::Paper, false); }

TEST_MAIN()
