/*
Muon's Newton-Schulz orthogonalisation (llmc/kernels/muon.cuh):

    X = G / (||G||_F + 1e-7), wide orientation;  5 x  A = X X^T;  X = a X + (b A + c A^2) X

version 1: one matrix at a time: three unbatched gemm() calls per NS step per matrix
version 2: llmc/kernels/muon.cuh: all matrices of one shape at once, three strided-batched gemm()
           calls per NS step (what the trainer runs)

Validation (any executor): both versions, in floatX and fp32, against a double CPU
reference, for the shapes of the tiny presets on the host backend (seconds) and of the
paper's 20-layer d512 SAN on a GPU. What a whole Muon step costs next to the model's
forward + backward is measured on the trainer itself: scripts/bench_gpu.sh times san20's
step under AdamW, Muon with Newton-Schulz in bf16 and in fp32.

    make build/gpu-bf16/muon && ./build/gpu-bf16/muon
*/
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "llmc/utils.h"
#include "llmc/cuda_common.h"
#include "llmc/kernels/muon.cuh"  // defines: MuonOptimizer, MuonMatrix, MuonConfig
#include "dev/cuda/common.h"

// ----------------------------------------------------------------------------------------
// CPU reference (double)

static std::vector<double> ns_cpu(const float* G, int rows, int cols, int steps) {
    const double a = 3.4445, b = -4.7750, c = 2.0315;
    bool tall = rows > cols;
    int r = tall ? cols : rows, k = tall ? rows : cols;  // wide: r x k
    std::vector<double> X((size_t)r * k);
    double norm = 0.0;
    for (size_t i = 0; i < X.size(); i++) { norm += (double)G[i] * G[i]; }
    norm = std::sqrt(norm) + 1e-7;
    for (int i = 0; i < rows; i++) {
        for (int j = 0; j < cols; j++) {
            double v = G[(size_t)i * cols + j] / norm;
            if (tall) { X[(size_t)j * k + i] = v; } else { X[(size_t)i * k + j] = v; }
        }
    }
    std::vector<double> A((size_t)r * r), B((size_t)r * r), Y(X.size());
    for (int s = 0; s < steps; s++) {
        for (int i = 0; i < r; i++) {
            for (int j = 0; j < r; j++) {
                double sum = 0.0;
                for (int p = 0; p < k; p++) { sum += X[(size_t)i * k + p] * X[(size_t)j * k + p]; }
                A[(size_t)i * r + j] = sum;
            }
        }
        for (int i = 0; i < r; i++) {  // B = b A + c A A (row i), then Y = a X + B X (row i)
            double* Bi = B.data() + (size_t)i * r;
            for (int j = 0; j < r; j++) { Bi[j] = b * A[(size_t)i * r + j]; }
            for (int p = 0; p < r; p++) {
                double aip = c * A[(size_t)i * r + p];
                for (int j = 0; j < r; j++) { Bi[j] += aip * A[(size_t)p * r + j]; }
            }
            double* Yi = Y.data() + (size_t)i * k;
            for (int j = 0; j < k; j++) { Yi[j] = a * X[(size_t)i * k + j]; }
            for (int p = 0; p < r; p++) {
                double bip = Bi[p];
                for (int j = 0; j < k; j++) { Yi[j] += bip * X[(size_t)p * k + j]; }
            }
        }
        X.swap(Y);
    }
    std::vector<double> out((size_t)rows * cols);
    for (int i = 0; i < rows; i++) {
        for (int j = 0; j < cols; j++) { out[(size_t)i * cols + j] = tall ? X[(size_t)j * k + i] : X[(size_t)i * k + j]; }
    }
    return out;
}

// ----------------------------------------------------------------------------------------
// versions 1 and 2 run through MuonOptimizer::orthogonalize: v1 with one optimizer per
// matrix (batch 1 in every gemm call), v2 with one for the whole group

struct Case {
    const char* name;
    int rows, cols, batch;
};

// NS of `batch` (rows, cols) gradient matrices laid out with gaps, by both versions;
// returns the worst relative Frobenius error over the checked matrices (first and last).
template <typename T>
static double worst_error(const Case& c, const std::vector<MuonMatrix>& mats, const floatX* d_g, float* d_mom,
                          const std::vector<int>& checked, const std::vector<std::vector<double>>& refs, int version,
                          const MuonConfig& cfg) {
    size_t n = (size_t)c.rows * c.cols;
    std::vector<float> got(n * c.batch);
    if (version == 1) {
        for (int b : checked) {
            MuonOptimizer one({{mats[b].offset, c.rows, c.cols}});
            std::vector<T> h = copy_from_device(one.orthogonalize<T>(0, d_g, d_mom, 1.0f, cfg, nullptr), n);
            for (size_t i = 0; i < n; i++) { got[b * n + i] = to_float(h[i]); }
        }
    } else {
        MuonOptimizer all(mats);
        std::vector<T> h = copy_from_device(all.orthogonalize<T>(0, d_g, d_mom, 1.0f, cfg, nullptr), n * c.batch);
        for (size_t i = 0; i < h.size(); i++) { got[i] = to_float(h[i]); }
    }
    double worst = 0.0;
    for (size_t k = 0; k < checked.size(); k++) {
        double diff = 0.0, norm = 0.0;
        for (size_t i = 0; i < n; i++) {
            double d = got[checked[k] * n + i] - refs[k][i];
            diff += d * d;
            norm += refs[k][i] * refs[k][i];
        }
        worst = std::max(worst, std::sqrt(diff / norm));
    }
    return worst;
}

static bool validate_case(const Case& c, int steps, double tol_fp32, double tol_x) {
    std::vector<MuonMatrix> mats;
    int64_t offset = 1;
    for (int b = 0; b < c.batch; b++) {
        mats.push_back({offset, c.rows, c.cols});
        offset += (int64_t)c.rows * c.cols + 3;
    }
    size_t total = (size_t)offset;
    std::vector<float> g = make_random_float(total, 11 + c.rows, -1.0f, 1.0f);
    std::vector<floatX> gx = convert_vector<floatX>(g);
    for (size_t i = 0; i < total; i++) { g[i] = to_float(gx[i]); }
    std::vector<int> checked = {0};
    if (c.batch > 1) { checked.push_back(c.batch - 1); }
    std::vector<std::vector<double>> refs;
    for (int b : checked) { refs.push_back(ns_cpu(g.data() + mats[b].offset, c.rows, c.cols, steps)); }
    floatX* d_g = copy_to_device(gx);
    float* d_mom = cudaMallocElements(float, total);
    cudaCheck(cudaMemset(d_mom, 0, total * sizeof(float)));
    MuonConfig cfg;
    cfg.order = MuonOrder::Paper;
    cfg.ns_steps = steps;
    bool ok = true;
    for (int t = 0; t < (PRECISION_MODE == PrecisionMode::FP32 ? 1 : 2); t++) {
        double e[2], tol = t == 0 ? tol_fp32 : tol_x;
        for (int version = 1; version <= 2; version++) {
            e[version - 1] = t == 0 ? worst_error<float>(c, mats, d_g, d_mom, checked, refs, version, cfg)
                                    : worst_error<floatX>(c, mats, d_g, d_mom, checked, refs, version, cfg);
        }
        bool case_ok = e[0] <= tol && e[1] <= tol;
        printf("    %-22s %5d x %-5d x %2d  NS in %-4s: v1 %.3g, v2 %.3g (tol %.3g) %s\n", c.name, c.rows, c.cols,
               c.batch, t == 0 ? "fp32" : "bf16", e[0], e[1], tol, case_ok ? "ok" : "MISMATCH");
        ok &= case_ok;
    }
    cudaFree(d_g);
    cudaFree(d_mom);
    return ok;
}

int main() {
    const int steps = 5;
    // tiny-preset shapes on the host; the san20 / ffn shapes on a GPU
    std::vector<Case> cases;
    if (HOST_BACKEND) {
        cases = {{"tiny wq/wo", 64, 64, 4}, {"tiny wk/wv (GQA)", 32, 64, 4}, {"tiny-ffn w_gate/w_up", 128, 64, 4},
                 {"tiny-ffn w_down", 64, 128, 2}};
    } else {
        cases = {{"san20 wq/wo", 512, 512, 40}, {"san20 wk/wv (GQA)", 256, 512, 40}, {"ffn w_gate/w_up", 2048, 512, 8},
                 {"ffn w_down", 512, 2048, 4}};
    }
    // fp32: summation order of 5 NS steps (~1e-6 at the tiny shapes; the GPU shapes sum
    // over up to 2048 terms, hence the wider bound there); bf16: 8-bit GEMM outputs (~1.5e-2)
    double tol_fp32 = HOST_BACKEND ? 2e-5 : 1e-4;
    double tol_x = PRECISION_MODE == PrecisionMode::FP32 ? tol_fp32 : 6e-2;
    bool ok = true;
    printf("muon (%s): Newton-Schulz, %d steps, vs a double CPU reference (relative Frobenius error)\n", PRECISION_NAME, steps);
    for (const Case& c : cases) { ok &= validate_case(c, steps, tol_fp32, tol_x); }
    if (!ok) {
        printf("muon: VALIDATION FAILED\n");
        return EXIT_FAILURE;
    }
    printf("muon: all versions valid\n");
    return 0;
}
