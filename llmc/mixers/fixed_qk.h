/*
`rndembqk` and `fixedseqqk` (doc/deconstructing.md "rndembqk and fixedseqqk"): queries and keys
do not depend on the sequence. A fixed input (rndembqk: random vectors eps; fixedseqqk: the
embedding of the first T tokens of the training data; llmc/kernels/fixed_qk.cuh FixedQKInput, model
state the model keeps) runs through the network as one more row after the Bn real rows, and
in these layers only that row computes q and k, which every real row then uses
(broadcast_fixed_row); values come from every row. Backward: the real rows' dq, dk are summed
into the fixed row's (sum_rows_into_fixed) and flow back through its q, k path only. Everything
else is standard attention (standard.h). Sampling recomputes the window (a cached step would
need the fixed row beside every token).
*/
#pragma once

#include <cmath>
#include <cstdio>
#include <string>

#include "llmc/kernels/fixed_qk.cuh"  // defines: broadcast_fixed_row, sum_rows_into_fixed
#include "standard.h"

class FixedQKMixer : public AttentionMixer {
public:
    // random: rndembqk's eps, else fixedseqqk's tokens (only the banner differs)
    FixedQKMixer(const MixerDims& dims, bool random) : AttentionMixer(dims), random_(random) {}
    bool reads_fixed_row() const override { return true; }
    bool decodes_with_cache() const override { return false; }
    std::string describe() const override {
        const int T = D.context, d = D.d;
        char buf[512];
        if (random_) {
            // (sigma as drawn: 0.02 x the embedding multiplier, sqrt(d) or 1; SANConfig::mixer_dims)
            snprintf(buf, sizeof(buf), "\nfixed QK input (rndembqk): eps ~ N(0, %g^2) of %d x %d = %lld values",
                     (double)D.fixed_input_std, T, d, (long long)T * d);
        } else {
            snprintf(buf, sizeof(buf), "\nfixed QK input (fixedseqqk): the embedding of %d fixed tokens = %d values", T, T);
        }
        return std::string(buf) +
               " of model state (in checkpoints; not a parameter, not counted below); it runs as one more row per "
               "micro-batch (+1/B of the compute, not in FLOPs/token)";
    }

protected:
    Rows qk_rows(const MixerPass& s) const override { return {s.Bn, 1, s.Tn, (size_t)s.Bn * s.Tn}; }
    void share_qk(const MixerPass& s) override {  // every real row attends with the fixed row's q, k
        broadcast_fixed_row(q, (size_t)s.Tn * D.qd(), s.Bn, s.stream);
        broadcast_fixed_row(k, (size_t)s.Tn * D.kvd(), s.Bn, s.stream);
    }
    void share_qk_backward(const MixerPass& s) override {
        sum_rows_into_fixed(s.scratch->d_q, (size_t)s.Tn * D.qd(), s.Bn, s.stream);
        sum_rows_into_fixed(s.scratch->d_k, (size_t)s.Tn * D.kvd(), s.Bn, s.stream);
    }
    // the real rows' input reaches only v; the fixed row's also q and k
    void input_grads(const MixerPass& s, const Rows& r, const QKGrads& lin, floatX* din) override {
        const int d = D.d;
        floatX* din_fixed = din + r.p0 * d;
        linear_backward_input(din, s.scratch->d_v, wv.w, s.N(), d, D.kvd(), false, s.stream);
        linear_backward_input(din_fixed, lin.dq, wq.w, r.Nq, d, D.qd(), true, s.stream);
        linear_backward_input(din_fixed, lin.dk, wk.w, r.Nq, d, D.kvd(), true, s.stream);
    }

private:
    bool random_;
};
