/*
Muon for the matrix group (doc/san-model.md, "Optimizers"; doc/optimizers.md). For a
matrix W of stored shape (rows, cols), state M (fp32), momentum mu:

    NS(G):  X = G / (||G||_F + 1e-7); in the wide orientation (rows <= cols, else X^T)
            ns_steps times: A = X X^T; X = a X + (b A + c A^2) X;  (a, b, c) = kNSCoefficients
    keller: M = mu M + (1-mu) g;  U = NS((1-mu) g + mu M) * sqrt(max(1, rows/cols))
    paper:  O = NS(g);  M = mu M + O;  U = O + mu M     (the SAN paper's code: no (1-mu) damping)
    both:   W = W (1 - lr wd) - lr U

All matrices of one shape form a group that is orthogonalised together: every GEMM of the
iteration is one strided-batched gemm() over the group. Per group and step:
  1. muon_prepare_kernel: (keller) the momentum update, and per matrix the sum of u^2 over
     a fixed grid of kMuonNormBlocks blocks (deterministic, no atomics);
  2. muon_normalize_kernel: X = u / (||u||_F + 1e-7) into a contiguous batch in the NS type
     T (floatX by default, fp32 with ns_fp32);
  3. newton_schulz(): per step NSBatch's 3 batched GEMMs (gram, poly, update) in T with fp32
     accumulation;
  4. muon_apply_kernel: (paper) the momentum update, and the decoupled-decay update of the
     parameters (fp32 master weights in bf16 builds, rounded into the floatX parameters).

Orientation: a tall matrix (rows > cols) is worked on as X^T without copying it: its Gram
matrix is X^T X (cols x cols) and the update is X <- a X + X (b A + c A^2), which is the
transpose of the wide-form update of X^T (A is symmetric). So the Gram matrix is always
min(rows, cols) square, as in the reference, and no transposing pass is needed.
*/
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "llmc/cuda_common.h"
#include "llmc/kernels/gemm.cuh"
#include "llmc/kernels/reduce.cuh"
#include "llmc/choices.h"
#include "llmc/utils.h"

struct NSCoefficients {
    float a, b, c;
};
constexpr NSCoefficients kNSCoefficients = {3.4445f, -4.7750f, 2.0315f};
constexpr float kNSEps = 1e-7f;
constexpr int kMuonNormBlocks = 8;  // blocks per matrix in the Frobenius-norm pass (fixed: deterministic)

enum class MuonOrder { Keller, Paper };

inline const Choices<MuonOrder> kMuonOrders{{"keller", "paper"}};

struct MuonConfig {
    MuonOrder order = MuonOrder::Keller;
    float momentum = 0.95f;
    int ns_steps = 5;
    bool ns_fp32 = false;  // run Newton-Schulz in fp32 even when floatX is bf16
    NSCoefficients coefficients = kNSCoefficients;
};

// One matrix of the group: its offset (in elements) into the parameter and gradient
// buffers, and into the momentum (and master-weight) buffers: the same offset when those
// share the parameters' layout (state_offset < 0), else where this rank's compact state
// holds the matrix (ZeRO-1: a rank keeps the state of the matrices it owns only).
struct MuonMatrix {
    int64_t offset;
    int rows, cols;
    int64_t state_offset = -1;
    int64_t state() const { return state_offset >= 0 ? state_offset : offset; }
};

// ---------------------------------------------------------------------------------------
// kernels: grid (blocks, batch); blockIdx.y is the matrix of the group

// The Newton-Schulz input of element i: keller also updates the momentum (once, here).
template <typename TGrad>
__device__ inline float muon_input(const TGrad* g, float* m, int64_t i, float grad_scale, float mu, bool keller,
                                   bool update_momentum) {
    float gi = to_float(g[i]) * grad_scale;
    if (!keller) { return gi; }
    float mi = m[i];
    if (update_momentum) {
        mi = mu * mi + (1.0f - mu) * gi;
        m[i] = mi;
    }
    return (1.0f - mu) * gi + mu * mi;
}

// kReduceThreads threads per block, kMuonNormBlocks blocks per matrix.
template <typename TGrad>
__global__ void muon_prepare_kernel(float* partials, const TGrad* grads, float* mom, const int64_t* offsets,
                                    const int64_t* state_offsets, int64_t n, float grad_scale, float mu, bool keller) {
    int b = blockIdx.y;
    const TGrad* g = grads + offsets[b];
    float* m = mom + state_offsets[b];
    float sum = 0.0f;
    for (int64_t i = (int64_t)blockIdx.x * kReduceThreads + threadIdx.x; i < n;
         i += (int64_t)kMuonNormBlocks * kReduceThreads) {
        float u = muon_input(g, m, i, grad_scale, mu, keller, true);
        sum += u * u;
    }
    float total = block_sum_in_order(sum);
    if (threadIdx.x == 0) { partials[b * kMuonNormBlocks + blockIdx.x] = total; }
}

template <typename T, typename TGrad>
__global__ void muon_normalize_kernel(T* X, const float* partials, const TGrad* grads, float* mom,
                                      const int64_t* offsets, const int64_t* state_offsets, int64_t n, float grad_scale,
                                      float mu, bool keller) {
    int b = blockIdx.y;
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) { return; }
    float sum_sq = 0.0f;
    for (int k = 0; k < kMuonNormBlocks; k++) { sum_sq += partials[b * kMuonNormBlocks + k]; }
    float u = muon_input(grads + offsets[b], mom + state_offsets[b], i, grad_scale, mu, keller, false);
    X[(int64_t)b * n + i] = from_float<T>(u / (sqrtf(sum_sq) + kNSEps));
}

template <typename T>
__global__ void muon_apply_kernel(floatX* params, float* master, float* mom, const T* X, const int64_t* offsets,
                                  const int64_t* state_offsets, int64_t n, float lr, float weight_decay, float mu,
                                  float shape_scale, bool keller) {
    int b = blockIdx.y;
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) { return; }
    int64_t j = offsets[b] + i, k = state_offsets[b] + i;  // parameter, state (momentum, master)
    float o = to_float(X[(int64_t)b * n + i]);
    float u;
    if (keller) {
        u = o * shape_scale;
    } else {
        float m = mu * mom[k] + o;
        mom[k] = m;
        u = o + mu * m;
    }
    float p = master != nullptr ? master[k] : to_float(params[j]);
    p = p * (1.0f - lr * weight_decay) - lr * u;
    if (master != nullptr) { master[k] = p; }
    params[j] = from_float<floatX>(p);
}

// ---------------------------------------------------------------------------------------
// The three GEMMs of a Newton-Schulz step over one group: `batch` (rows, cols) matrices X,
// contiguous, and their n x n Gram-sized matrices (n = min(rows, cols)), contiguous. A tall
// group (rows > cols) is worked on as X^T (see the header): its Gram matrix is X^T X and the
// polynomial multiplies X from the right.
struct NSBatch {
    int batch, rows, cols;

    bool tall() const { return rows > cols; }
    int n() const { return tall() ? cols : rows; }
    int64_t x_size() const { return (int64_t)rows * cols; }
    int64_t gram_size() const { return (int64_t)n() * n(); }

    // gram = X X^T (wide) or X^T X (tall)
    template <typename T>
    void gram(T* gram, const T* x, cudaStream_t stream) const {
        GemmShape s = tall() ? GemmShape::tn(n(), n(), rows) : GemmShape::nt(n(), n(), cols);
        gemm(gram, x, x, s.batched(batch, x_size(), x_size(), gram_size()), 1.0f, 0.0f, stream);
    }
    // poly = b gram + c gram^2 (gemm's beta term scales what C holds: first a copy of gram)
    template <typename T>
    void poly(T* poly, const T* gram, NSCoefficients k, cudaStream_t stream) const {
        size_t bytes = (size_t)batch * gram_size() * sizeof(T);
        cudaCheck(cudaMemcpyAsync(poly, gram, bytes, cudaMemcpyDeviceToDevice, stream));
        GemmShape s = GemmShape::nn(n(), n(), n()).batched(batch, gram_size(), gram_size(), gram_size());
        gemm(poly, gram, gram, s, k.c, k.b, stream);
    }
    // x_next = a X + poly X (wide) or a X + X poly (tall) (x_next first holds a copy of X)
    template <typename T>
    void update(T* x_next, const T* poly, const T* x, NSCoefficients k, cudaStream_t stream) const {
        size_t bytes = (size_t)batch * x_size() * sizeof(T);
        cudaCheck(cudaMemcpyAsync(x_next, x, bytes, cudaMemcpyDeviceToDevice, stream));
        if (!tall()) {
            GemmShape s = GemmShape::nn(rows, cols, rows).batched(batch, gram_size(), x_size(), x_size());
            gemm(x_next, poly, x, s, 1.0f, k.a, stream);
        } else {
            GemmShape s = GemmShape::nn(rows, cols, cols).batched(batch, x_size(), gram_size(), x_size());
            gemm(x_next, x, poly, s, 1.0f, k.a, stream);
        }
    }
};

// Newton-Schulz's buffers: x, the normalised input, and x_alt like it (batch x rows x cols);
// gram, poly: batch x n x n.
template <typename T>
struct NSBuffers {
    T *x, *x_alt, *gram, *poly;
};

// Newton-Schulz on the contiguous batch of normalised matrices in buf.x, the rest of buf
// being workspace. Returns the buffer that holds the result (buf.x or buf.x_alt).
template <typename T>
T* newton_schulz(NSBuffers<T> buf, const NSBatch& ns, int steps, NSCoefficients k, cudaStream_t stream) {
    for (int s = 0; s < steps; s++) {
        ns.gram(buf.gram, buf.x, stream);
        ns.poly(buf.poly, buf.gram, k, stream);
        ns.update(buf.x_alt, buf.poly, buf.x, k, stream);
        std::swap(buf.x, buf.x_alt);
    }
    return buf.x;
}

// ---------------------------------------------------------------------------------------
// The matrix group of a model, grouped by shape, with its workspace.
class MuonOptimizer {
public:
    struct Group {
        int rows, cols;
        std::vector<int64_t> offsets, state_offsets;  // host copies
        int64_t* d_offsets = nullptr;                  // device copies
        int64_t* d_state_offsets = nullptr;
        int batch() const { return (int)offsets.size(); }
        int64_t numel() const { return (int64_t)rows * cols; }
    };

    // Groups matrices by shape, in order of first appearance.
    explicit MuonOptimizer(const std::vector<MuonMatrix>& matrices) {
        std::map<std::pair<int, int>, int> index;
        for (const MuonMatrix& m : matrices) {
            auto key = std::make_pair(m.rows, m.cols);
            if (!index.count(key)) {
                index[key] = (int)groups_.size();
                groups_.push_back(Group{m.rows, m.cols, {}, {}, nullptr, nullptr});
            }
            groups_[index[key]].offsets.push_back(m.offset);
            groups_[index[key]].state_offsets.push_back(m.state());
        }
        size_t max_x = 0, max_gram = 0;
        int max_batch = 0;
        for (Group& g : groups_) {
            g.d_offsets = copy_to_device(g.offsets);
            g.d_state_offsets = copy_to_device(g.state_offsets);
            int n = std::min(g.rows, g.cols);
            max_x = std::max(max_x, (size_t)g.batch() * g.numel());
            max_gram = std::max(max_gram, (size_t)g.batch() * n * n);
            max_batch = std::max(max_batch, g.batch());
        }
        x_elems_ = CEIL_DIV(max_x, 64) * 64;  // keeps every array 128-byte aligned
        gram_elems_ = CEIL_DIV(max_gram, 64) * 64;
        partials_ = cudaMallocElements(float, (size_t)std::max(1, max_batch) * kMuonNormBlocks);
    }
    ~MuonOptimizer() {
        for (Group& g : groups_) {
            cudaFree(g.d_offsets);
            cudaFree(g.d_state_offsets);
        }
        cudaFree(partials_);
        if (workspace_ != nullptr) { cudaFree(workspace_); }
    }
    MuonOptimizer(const MuonOptimizer&) = delete;
    MuonOptimizer& operator=(const MuonOptimizer&) = delete;

    const std::vector<Group>& groups() const { return groups_; }

    // Steps 1-3 for one group: the orthogonalised input of every matrix, a contiguous
    // (batch, rows, cols) array of T in the workspace (valid until the next call).
    template <typename T, typename TGrad>
    const T* orthogonalize(int group, const TGrad* grads, float* mom, float grad_scale, const MuonConfig& cfg,
                           cudaStream_t stream) {
        const Group& g = groups_[group];
        const bool keller = cfg.order == MuonOrder::Keller;
        NSBuffers<T> buf = workspace<T>();
        const int64_t n = g.numel();
        LAUNCH(dim3(kMuonNormBlocks, g.batch()), kReduceThreads, 0, stream, muon_prepare_kernel<TGrad>)(
            partials_, grads, mom, g.d_offsets, g.d_state_offsets, n, grad_scale, cfg.momentum, keller);
        cudaCheckLaunch();
        const int block = 256;
        LAUNCH(dim3(CEIL_DIV(n, block), g.batch()), block, 0, stream, muon_normalize_kernel<T, TGrad>)(
            buf.x, partials_, grads, mom, g.d_offsets, g.d_state_offsets, n, grad_scale, cfg.momentum, keller);
        cudaCheckLaunch();
        return newton_schulz(buf, NSBatch{g.batch(), g.rows, g.cols}, cfg.ns_steps, cfg.coefficients, stream);
    }

    // One Muon step on every matrix. grad_scale applies the global-norm clip. Gradients are
    // floatX, or fp32 when accumulated in fp32 (TrainOptions::grad_fp32).
    template <typename TGrad>
    void step(floatX* params, float* master, const TGrad* grads, float* mom, float grad_scale, float lr,
              float weight_decay, const MuonConfig& cfg, cudaStream_t stream) {
        if (cfg.ns_fp32 || PRECISION_MODE == PrecisionMode::FP32) {
            step_impl<float>(params, master, grads, mom, grad_scale, lr, weight_decay, cfg, stream);
        } else {
            step_impl<floatX>(params, master, grads, mom, grad_scale, lr, weight_decay, cfg, stream);
        }
    }

private:
    template <typename T, typename TGrad>
    void step_impl(floatX* params, float* master, const TGrad* grads, float* mom, float grad_scale, float lr,
                   float weight_decay, const MuonConfig& cfg, cudaStream_t stream) {
        const bool keller = cfg.order == MuonOrder::Keller;
        for (int k = 0; k < (int)groups_.size(); k++) {
            const Group& g = groups_[k];
            const T* X = orthogonalize<T, TGrad>(k, grads, mom, grad_scale, cfg, stream);
            float shape_scale = std::sqrt(std::max(1.0f, (float)g.rows / (float)g.cols));
            const int block = 256;
            LAUNCH(dim3(CEIL_DIV(g.numel(), block), g.batch()), block, 0, stream, muon_apply_kernel<T>)(
                params, master, mom, X, g.d_offsets, g.d_state_offsets, g.numel(), lr, weight_decay, cfg.momentum,
                shape_scale, keller);
            cudaCheckLaunch();
        }
    }

    // Newton-Schulz's four arrays of T, carved from one allocation (re-made if T changes).
    template <typename T>
    NSBuffers<T> workspace() {
        size_t bytes = (2 * x_elems_ + 2 * gram_elems_) * sizeof(T);
        if (workspace_ != nullptr && workspace_bytes_ != bytes) {
            cudaCheck(cudaFree(workspace_));
            workspace_ = nullptr;
        }
        if (workspace_ == nullptr) {
            cudaCheck(cudaMalloc(&workspace_, bytes));
            workspace_bytes_ = bytes;
        }
        T* base = static_cast<T*>(workspace_);
        return {base, base + x_elems_, base + 2 * x_elems_, base + 2 * x_elems_ + gram_elems_};
    }

    std::vector<Group> groups_;
    size_t x_elems_ = 0, gram_elems_ = 0;
    float* partials_ = nullptr;
    void* workspace_ = nullptr;
    size_t workspace_bytes_ = 0;
};
