/*
The SwiGLU MLP, written once for its two users: the FFN block of the SAN family's control arm,
and the `mlp` token mixer of "Deconstructing Attention" (llmc/mixers/mlp.h), which puts one in
attention's place (doc/san-model.md, doc/deconstructing.md):

    gate = u W_gate^T,  up = u W_up^T   (N, m)      h = silu(gate) * up      y = h W_down^T  (N, d)

Weights: W_gate, W_up (m, d), W_down (d, m), named "<prefix>w_gate", "w_up", "w_down". The
activations gate, up and h are kept for backward; its scratch (dh, dgate, dup) is shared by
every SwiGLU of a model (SwiGLUScratch, sized for the widest).
*/
#pragma once

#include <string>
#include <vector>

#include "llmc/cuda_common.h"
#include "llmc/kernels/gemm.cuh"       // defines: linear_forward, linear_backward_weight, linear_backward_input
#include "llmc/model/layer_weights.h"  // defines: Weight, LayerWeights
#include "llmc/optim/param_spec.h"
#include "llmc/kernels/swiglu.cuh"     // defines: swiglu_forward, swiglu_backward

// Backward buffers of width m (N x m each), one set per model.
struct SwiGLUScratch {
    floatX *d_h = nullptr, *d_gate = nullptr, *d_up = nullptr;
};

class SwiGLUMLP {
public:
    SwiGLUMLP() = default;
    SwiGLUMLP(int d, int m) : d_(d), m_(m) {}
    int width() const { return m_; }

    // W_gate, W_up drawn from N(0, init_std), W_down from N(0, out_std)
    void add_parameters(std::vector<ParamSpec>& spec, const std::string& prefix, float init_std, float out_std) const {
        spec.push_back({prefix + "w_gate", {m_, d_}, true, init_std, 0.0f});
        spec.push_back({prefix + "w_up", {m_, d_}, true, init_std, 0.0f});
        spec.push_back({prefix + "w_down", {d_, m_}, true, out_std, 0.0f});
    }
    void bind(const LayerWeights& weights, const std::string& prefix) {
        w_gate_ = weights[prefix + "w_gate"];
        w_up_ = weights[prefix + "w_up"];
        w_down_ = weights[prefix + "w_down"];
    }
    void allocate(DeviceArena& arena, size_t N) {
        gate_ = arena.alloc<floatX>(N * m_);
        up_ = arena.alloc<floatX>(N * m_);
        h_ = arena.alloc<floatX>(N * m_);
    }

    // y = swiglu(u): u, y (N, d)
    void forward(floatX* y, const floatX* u, int N, cudaStream_t stream) const {
        linear_forward(gate_, u, w_gate_.w, N, d_, m_, stream);
        linear_forward(up_, u, w_up_.w, N, d_, m_, stream);
        swiglu_forward(h_, gate_, up_, (size_t)N * m_, stream);
        linear_forward(y, h_, w_down_.w, N, m_, d_, stream);
    }
    // du = dL/du (overwritten) from dy = dL/dy, for the u of the last forward; the weights'
    // gradients accumulate
    void backward(floatX* du, const floatX* dy, const floatX* u, int N, const SwiGLUScratch& s,
                  cudaStream_t stream) const {
        linear_backward_weight(w_down_.grad, dy, h_, N, m_, d_, stream);
        linear_backward_input(s.d_h, dy, w_down_.w, N, m_, d_, false, stream);
        swiglu_backward(s.d_gate, s.d_up, s.d_h, gate_, up_, (size_t)N * m_, stream);
        linear_backward_weight(w_gate_.grad, s.d_gate, u, N, d_, m_, stream);
        linear_backward_weight(w_up_.grad, s.d_up, u, N, d_, m_, stream);
        linear_backward_input(du, s.d_gate, w_gate_.w, N, d_, m_, false, stream);
        linear_backward_input(du, s.d_up, w_up_.w, N, d_, m_, true, stream);
    }

private:
    int d_ = 0, m_ = 0;
    Weight w_gate_, w_up_, w_down_;
    floatX *gate_ = nullptr, *up_ = nullptr, *h_ = nullptr;
};
