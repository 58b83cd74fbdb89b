/*
Tests of llmc/kernels/residual_norm.cuh: the fused residual add + pre-norm, forward and
backward, bit-identical to the pair of kernels it replaces (residual_forward then the norm's
forward; the norm's backward then residual_branch_grad), on whichever executor built this
file, in either precision: x_out, out, rstd; dx
(accumulated), dh (overwritten) and dgain (accumulated); for widths on the 128-bit path
(san20's 512, GPT-2's 768, 64) and on the scalar path (odd widths, a misaligned branch that
makes the pair run instead), every residual mode and both norm offsets (ZCN, RMS), x_out
aliasing x, rows not a multiple of a block's. And GPT-2's residual add + LayerNorm
(residual_layernorm_forward against residual_forward then LayerNorm::forward: x_out, out, mean,
rstd) over the same widths and layouts.

Usage: test_residual_norm [name-filter]
*/
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "llmc/cuda_common.h"
#include "llmc/kernels/layernorm.cuh"
#include "llmc/kernels/norm.cuh"
#include "llmc/kernels/residual.cuh"
#include "llmc/kernels/residual_norm.cuh"
#include "dev/test/testing.h"

static std::vector<floatX> random_floats(size_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> dist(lo, hi);
    std::vector<floatX> v(n);
    for (auto& x : v) { x = from_float<floatX>(dist(rng)); }
    return v;
}
template <typename T>
static bool bits_equal(const std::vector<T>& a, const std::vector<T>& b) {
    return a.size() == b.size() && memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

struct Case {
    int N, C;
    ResidualMode mode;
    float offset;       // 1: ZCN, 0: RMS
    int misalign;       // element offset of the branch h and of dh (the others stay aligned)
    bool alias;         // x_out = x
    uint32_t seed;
};

// One case through the pair and through the fused launchers; returns whether the fused
// kernels ran (the launchers' own test of the layouts).
static bool check_case(const Case& k) {
    const int N = k.N, C = k.C, m = k.misalign;
    const size_t n = (size_t)N * C;
    const float eps = 1e-6f;
    std::vector<floatX> x = random_floats(n, k.seed, -2.0f, 2.0f), h = random_floats(n, k.seed + 1);
    std::vector<floatX> g = random_floats(C, k.seed + 2, k.offset == 1.0f ? -0.5f : 0.5f, k.offset == 1.0f ? 0.5f : 1.5f);
    std::vector<floatX> dout = random_floats(n, k.seed + 3), dx0 = random_floats(n, k.seed + 4);
    std::vector<floatX> dg0 = random_floats(C, k.seed + 5), garbage = random_floats(n, k.seed + 6);
    std::vector<floatX> gate = {from_float<floatX>(0.37f)};
    auto upload = [](const std::vector<floatX>& v, int offset) {
        std::vector<floatX> padded(offset, from_float<floatX>(0.0f));
        padded.insert(padded.end(), v.begin(), v.end());
        return copy_to_device(padded) + offset;
    };
    floatX *d_x = upload(x, 0), *d_h = upload(h, m), *d_g = upload(g, 0), *d_dg = upload(dg0, 0);
    floatX *d_gate = upload(gate, 0), *d_xout = k.alias ? d_x : upload(garbage, 0);
    floatX *d_out = upload(garbage, 0), *d_dout = upload(dout, 0), *d_dx = upload(dx0, 0), *d_dh = upload(garbage, m);
    float* d_rstd = cudaMallocElements(float, N);
    float* d_scratch = cudaMallocElements(float, norm_backward_scratch_floats(N, C));
    GainNorm norm{{d_g, d_dg}, C, k.offset, eps};
    const floatX* gate_ptr = residual_has_gate(k.mode) ? d_gate : nullptr;
    const bool fused = norm_layout(C, {d_out, d_xout, d_g}).vector == norm_layout(C, {d_out, d_xout, d_x, d_h, d_g}).vector &&
                       norm_layout(C, {d_dx, d_dout, d_x, d_g}).vector == norm_layout(C, {d_dx, d_dh, d_dout, d_x, d_g}).vector;

    // the pair
    residual_forward(d_xout, d_x, d_h, gate_ptr, k.mode, n, 0);
    norm.forward(d_out, d_rstd, d_xout, N, 0);
    std::vector<floatX> xout_pair = copy_from_device(d_xout, n), out_pair = copy_from_device(d_out, n);
    std::vector<float> rstd_pair = copy_from_device(d_rstd, N);
    norm.backward(d_dx, d_dout, d_xout, d_rstd, N, d_scratch, 0);
    residual_branch_grad(d_dh, d_dx, gate_ptr, k.mode, n, 0);
    std::vector<floatX> dx_pair = copy_from_device(d_dx, n), dh_pair = copy_from_device(d_dh, n);
    std::vector<floatX> dg_pair = copy_from_device(d_dg, C);

    // fused, from the same inputs
    cudaCheck(cudaMemcpy(d_x, x.data(), n * sizeof(floatX), cudaMemcpyHostToDevice));
    if (!k.alias) { cudaCheck(cudaMemcpy(d_xout, garbage.data(), n * sizeof(floatX), cudaMemcpyHostToDevice)); }
    cudaCheck(cudaMemcpy(d_out, garbage.data(), n * sizeof(floatX), cudaMemcpyHostToDevice));
    cudaCheck(cudaMemset(d_rstd, 0, N * sizeof(float)));
    residual_norm_forward(d_xout, d_x, d_h, gate_ptr, k.mode, norm, d_out, d_rstd, N, 0);
    CHECK(bits_equal(copy_from_device(d_xout, n), xout_pair));
    CHECK(bits_equal(copy_from_device(d_out, n), out_pair));
    CHECK(bits_equal(copy_from_device(d_rstd, N), rstd_pair));
    cudaCheck(cudaMemcpy(d_dx, dx0.data(), n * sizeof(floatX), cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy(d_dh, garbage.data(), n * sizeof(floatX), cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy(d_dg, dg0.data(), C * sizeof(floatX), cudaMemcpyHostToDevice));
    residual_norm_backward(d_dx, d_dh, d_dout, d_xout, d_rstd, norm, gate_ptr, k.mode, N, d_scratch, 0);
    CHECK(bits_equal(copy_from_device(d_dx, n), dx_pair));
    CHECK(bits_equal(copy_from_device(d_dh, n), dh_pair));
    CHECK(bits_equal(copy_from_device(d_dg, C), dg_pair));
    CHECK(bits_equal(copy_from_device(d_dout, n), dout));  // read only

    for (floatX* p : {d_x, d_g, d_dg, d_gate, d_out, d_dout, d_dx}) { cudaCheck(cudaFree(p)); }
    if (!k.alias) { cudaCheck(cudaFree(d_xout)); }
    cudaCheck(cudaFree(d_h - m));
    cudaCheck(cudaFree(d_dh - m));
    cudaCheck(cudaFree(d_rstd));
    cudaCheck(cudaFree(d_scratch));
    return fused;
}

TEST_CASE(residual_norm_equals_pair_widths) {
    CHECK(check_case({37, 512, ResidualMode::Gated, 1.0f, 0, false, 1}));  // san20's d, ZCN
    CHECK(check_case({19, 768, ResidualMode::Standard, 0.0f, 0, false, 2}));  // GPT-2's d
    CHECK(check_case({300, 64, ResidualMode::Gated, 1.0f, 0, false, 3}));  // tiny's d; rows past one block
    CHECK(check_case({41, 8, ResidualMode::Rezero, 0.0f, 0, false, 4}));  // one 128-bit chunk (bf16)
    CHECK(check_case({23, 96, ResidualMode::None, 1.0f, 0, false, 5}));
    // scalar path: widths not a multiple of the vector width
    CHECK(check_case({17, 37, ResidualMode::Gated, 1.0f, 0, false, 6}));
    CHECK(check_case({9, 1, ResidualMode::Standard, 0.0f, 0, false, 7}));
    CHECK(check_case({13, 130, ResidualMode::Rezero, 1.0f, 0, false, 8}));
}

TEST_CASE(residual_norm_aliasing_and_misaligned_branch) {
    CHECK(check_case({29, 512, ResidualMode::Gated, 1.0f, 0, true, 9}));   // x_out = x, as residual_forward allows
    CHECK(check_case({11, 64, ResidualMode::None, 0.0f, 0, true, 10}));
    // a branch off the 16-byte grid: the norm alone takes 128-bit chunks, the fused kernel could
    // not, so the pair runs (bf16: 8 elements a chunk; fp32: 4)
    CHECK(!check_case({21, 64, ResidualMode::Gated, 1.0f, 1, false, 11}));
    CHECK(check_case({21, 37, ResidualMode::Gated, 1.0f, 1, false, 12}));  // scalar either way: fused
}

// GPT-2's forward pair (offset unused; the weights around 1, the biases around 0) through
// residual_forward + LayerNorm::forward and through residual_layernorm_forward; with
// `statistics` false the mean and rstd are not asked for (null), as a forward without a
// backward may. Returns whether the fused kernel ran.
static bool check_layernorm_case(const Case& k, bool statistics = true) {
    const int N = k.N, C = k.C, m = k.misalign;
    const size_t n = (size_t)N * C;
    std::vector<floatX> x = random_floats(n, k.seed, -2.0f, 2.0f), h = random_floats(n, k.seed + 1);
    std::vector<floatX> w = random_floats(C, k.seed + 2, 0.5f, 1.5f), b = random_floats(C, k.seed + 3, -0.5f, 0.5f);
    std::vector<floatX> garbage = random_floats(n, k.seed + 6), gate = {from_float<floatX>(0.37f)};
    std::vector<float> stale(N, -7.0f);
    auto upload = [](const std::vector<floatX>& v, int offset) {
        std::vector<floatX> padded(offset, from_float<floatX>(0.0f));
        padded.insert(padded.end(), v.begin(), v.end());
        return copy_to_device(padded) + offset;
    };
    floatX *d_x = upload(x, 0), *d_h = upload(h, m), *d_w = upload(w, 0), *d_b = upload(b, 0);
    floatX *d_gate = upload(gate, 0), *d_xout = k.alias ? d_x : upload(garbage, 0), *d_out = upload(garbage, 0);
    float *d_mean = copy_to_device(stale), *d_rstd = copy_to_device(stale);
    float* mean = statistics ? d_mean : nullptr;
    float* rstd = statistics ? d_rstd : nullptr;
    LayerNorm norm{{d_w, nullptr}, {d_b, nullptr}, C, 1e-5f};
    const floatX* gate_ptr = residual_has_gate(k.mode) ? d_gate : nullptr;
    const bool fused = norm_layout(C, {d_out, d_xout, d_w, d_b}).vector ==
                       norm_layout(C, {d_out, d_xout, d_x, d_h, d_w, d_b}).vector;

    residual_forward(d_xout, d_x, d_h, gate_ptr, k.mode, n, 0);
    norm.forward(d_out, mean, rstd, d_xout, N, 0);
    std::vector<floatX> xout_pair = copy_from_device(d_xout, n), out_pair = copy_from_device(d_out, n);
    std::vector<float> mean_pair = copy_from_device(d_mean, N), rstd_pair = copy_from_device(d_rstd, N);

    cudaCheck(cudaMemcpy(d_x, x.data(), n * sizeof(floatX), cudaMemcpyHostToDevice));
    if (!k.alias) { cudaCheck(cudaMemcpy(d_xout, garbage.data(), n * sizeof(floatX), cudaMemcpyHostToDevice)); }
    cudaCheck(cudaMemcpy(d_out, garbage.data(), n * sizeof(floatX), cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy(d_mean, stale.data(), N * sizeof(float), cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy(d_rstd, stale.data(), N * sizeof(float), cudaMemcpyHostToDevice));
    residual_layernorm_forward(d_xout, d_x, d_h, gate_ptr, k.mode, norm, d_out, mean, rstd, N, 0);
    CHECK(bits_equal(copy_from_device(d_xout, n), xout_pair));
    CHECK(bits_equal(copy_from_device(d_out, n), out_pair));
    CHECK(bits_equal(copy_from_device(d_mean, N), mean_pair));
    CHECK(bits_equal(copy_from_device(d_rstd, N), rstd_pair));
    CHECK(statistics || bits_equal(copy_from_device(d_rstd, N), stale));  // not asked: not written
    if (!k.alias) { CHECK(bits_equal(copy_from_device(d_x, n), x)); }  // read only
    CHECK(bits_equal(copy_from_device(d_h, n), h));

    for (floatX* p : {d_x, d_w, d_b, d_gate, d_out}) { cudaCheck(cudaFree(p)); }
    if (!k.alias) { cudaCheck(cudaFree(d_xout)); }
    cudaCheck(cudaFree(d_h - m));
    cudaCheck(cudaFree(d_mean));
    cudaCheck(cudaFree(d_rstd));
    return fused;
}

TEST_CASE(residual_layernorm_equals_pair) {
    CHECK(check_layernorm_case({19, 768, ResidualMode::Standard, 0.0f, 0, false, 21}));  // GPT-2 124M's d
    CHECK(check_layernorm_case({300, 64, ResidualMode::Standard, 0.0f, 0, false, 22}));  // tiny's d; past one block
    CHECK(check_layernorm_case({41, 8, ResidualMode::Standard, 0.0f, 0, false, 23}));  // one 128-bit chunk (bf16)
    CHECK(check_layernorm_case({23, 96, ResidualMode::Gated, 0.0f, 0, false, 24}));  // (any mode: the same add)
    CHECK(check_layernorm_case({7, 1600, ResidualMode::None, 0.0f, 0, false, 25}));  // GPT-2 XL's d
    CHECK(check_layernorm_case({33, 128, ResidualMode::Standard, 0.0f, 0, false, 26}, false));  // no mean, rstd
    // scalar path
    CHECK(check_layernorm_case({17, 37, ResidualMode::Standard, 0.0f, 0, false, 27}));
    CHECK(check_layernorm_case({9, 1, ResidualMode::Standard, 0.0f, 0, false, 28}));
    CHECK(check_layernorm_case({13, 130, ResidualMode::Rezero, 0.0f, 0, false, 29}));
    // x_out = x; a misaligned branch (the pair runs, checked as above), and on the scalar path (fused)
    CHECK(check_layernorm_case({29, 768, ResidualMode::Standard, 0.0f, 0, true, 30}));
    CHECK(!check_layernorm_case({21, 64, ResidualMode::Standard, 0.0f, 1, false, 31}));
    CHECK(check_layernorm_case({21, 37, ResidualMode::Standard, 0.0f, 1, false, 32}));
}

TEST_MAIN()
