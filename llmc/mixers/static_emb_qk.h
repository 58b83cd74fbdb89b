/*
`staticembqk` (doc/deconstructing.md): queries and keys come from the token embedding x0 (the
stream before layer 0) instead of the layer's input, through this layer's own pre-norm:
q_lin, k_lin = norm(x0) W_q^T, W_k^T; values still come from the layer's input. Everything
else is standard attention (standard.h), the KV-cached decode included. Backward: the q, k
paths' gradient goes to x0 (pass.dx0, which the model adds to the embedding's gradient) and
into the pre-norm's gain.
*/
#pragma once

#include "standard.h"

class StaticEmbQKMixer : public AttentionMixer {
public:
    using AttentionMixer::AttentionMixer;
    void allocate(DeviceArena& arena, size_t N) override {
        AttentionMixer::allocate(arena, N);
        qk_in = arena.alloc<floatX>(N * D.d);
        qk_in_rstd = arena.alloc<float>(N);
    }
    void size_scratch(ScratchSizes& sizes, int, int) const override {
        sizes.attention = true;
        sizes.qk_in = true;
    }
    bool reads_embedding() const override { return true; }

protected:
    const floatX* qk_input(const MixerPass& s, const floatX*) override {
        s.pre_norm->forward(qk_in, qk_in_rstd, s.x0, s.N(), s.stream);
        return qk_in;
    }
    const floatX* qk_input_of_forward(const floatX*) const override { return qk_in; }
    // q, k's input gradient goes to norm(x0) and on to x0; only v's to the mixer's input
    void input_grads(const MixerPass& s, const Rows&, const QKGrads& lin, floatX* din) override {
        const BackwardScratch& g = *s.scratch;
        const int N = s.N(), d = D.d;
        linear_backward_input(g.d_qk_in, lin.dq, wq.w, N, d, D.qd(), false, s.stream);
        linear_backward_input(g.d_qk_in, lin.dk, wk.w, N, d, D.kvd(), true, s.stream);
        linear_backward_input(din, g.d_v, wv.w, N, d, D.kvd(), false, s.stream);
        s.pre_norm->backward(s.dx0, g.d_qk_in, s.x0, qk_in_rstd, N, g.reduce, s.stream);
    }

    floatX* qk_in = nullptr;  // norm(x0)
    float* qk_in_rstd = nullptr;
};
