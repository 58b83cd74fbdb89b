/*
`nonapprox` (doc/deconstructing.md): each position gets one score, its own q[t].k[t] / sqrt(hd),
and the output is the causal softmax-weighted average of the values under those scores
(llmc/kernels/attention_variants.cuh nonapprox_*). Queries go through SiLU before QK-norm,
q = qk_norm(SiLU(u W_q)); there is no RoPE, since rotating q[t] and k[t] by the same angle
leaves q[t].k[t] as it is. Tensors as standard attention's (standard.h). Sampling recomputes
the window.
*/
#pragma once

#include <algorithm>

#include "llmc/kernels/attention_variants.cuh"  // defines: nonapprox_forward, nonapprox_backward, silu_*
#include "standard.h"

class NonapproxMixer : public AttentionMixer {
public:
    using AttentionMixer::AttentionMixer;
    void allocate(DeviceArena& arena, size_t N) override {
        AttentionMixer::allocate(arena, N);
        if (D.qk_norm) { q_act = arena.alloc<floatX>(N * D.qd()); }
    }
    void size_scratch(ScratchSizes& sizes, int B, int T) const override {
        sizes.attention = true;
        sizes.kernel_floats = std::max(sizes.kernel_floats, nonapprox_backward_scratch_floats(B, T, D.Hq, D.hd));
    }
    ScoreInputs score_inputs() const override { return {q, k, AttnWeights::OwnScoreSoftmax}; }
    bool mixes_pairs() const override { return false; }  // one score per position
    bool decodes_with_cache() const override { return false; }

protected:
    size_t stat_planes() const override { return 2; }  // the scores, then lse
    // q = qk_norm(SiLU(q_lin)), k = qk_norm(k_lin); no RoPE
    void shape_qk(const MixerPass& s, const Rows&) override {
        const int N = s.N();
        silu_forward(D.qk_norm ? q_act : q, q_lin, (size_t)N * D.qd(), s.stream);
        if (D.qk_norm) {
            q_norm.forward(q, q_rstd, q_act, N * D.Hq, s.stream);
            k_norm.forward(k, k_rstd, k_lin, N * D.Hkv, s.stream);
        } else {
            cudaCheck(cudaMemcpyAsync(k, k_lin, (size_t)N * D.kvd() * sizeof(floatX), cudaMemcpyDeviceToDevice, s.stream));
        }
    }
    QKGrads shape_qk_backward(const MixerPass& s, const Rows& r) override {
        QKGrads lin = qk_norm_backward(s, r, q_act, {s.scratch->d_q, s.scratch->d_k});
        silu_backward(lin.dq, lin.dq, q_lin, (size_t)s.N() * D.qd(), s.stream);  // through SiLU, in place
        return lin;
    }
    void mix(const MixerPass& s) override { nonapprox_forward(shape(s), tensors(), s.stream); }
    void mix_backward(const MixerPass& s) override {
        AttnGrads g = grads(s);
        g.scratch = s.scratch->kernels;
        nonapprox_backward(shape(s), tensors(), g, s.stream);
    }

    floatX* q_act = nullptr;  // SiLU(q_lin): QK-norm's input (with QK-norm)
};
