/*
`approximate` (doc/deconstructing.md): standard attention with exp(x) replaced by its
second-order Taylor polynomial 1 + x + x^2/2, normalised jointly (Based's feature map, the
default) or term by term (--taylor-norm separate, the paper's equations); the kernels and
their maths are llmc/kernels/attention_variants.cuh's. Same tensors, projections, QK-norm and RoPE as
standard attention (standard.h): only the mixing step differs. Sampling recomputes the window
(no cached decode for this kind).
*/
#pragma once

#include <string>

#include "llmc/kernels/attention_variants.cuh"  // defines: taylor_attention_forward, taylor_attention_backward
#include "standard.h"

class ApproximateMixer : public AttentionMixer {
public:
    using AttentionMixer::AttentionMixer;
    void size_scratch(ScratchSizes& sizes, int B, int T) const override {
        sizes.attention = true;
        sizes.kernel_floats = std::max(sizes.kernel_floats, taylor_backward_scratch_floats(B, T, D.Hq, D.taylor_norm));
    }
    bool decodes_with_cache() const override { return false; }
    // joint: the weights f(x) / sum f(x), f >= 1/2; separate: three matrices, the first-order one
    // signed, so no attention matrix for the indicators (its logits still count)
    ScoreInputs score_inputs() const override {
        return {q, k, D.taylor_norm == TaylorNorm::Joint ? AttnWeights::TaylorJoint : AttnWeights::NotStochastic};
    }
    std::string describe() const override { return std::string("; taylor_norm ") + kTaylorNorms.name(D.taylor_norm); }

protected:
    size_t stat_planes() const override { return taylor_stat_planes(D.taylor_norm); }
    void mix(const MixerPass& s) override { taylor_attention_forward(shape(s), tensors(), D.taylor_norm, s.stream); }
    void mix_backward(const MixerPass& s) override {
        AttnGrads g = grads(s);
        g.scratch = s.scratch->kernels;
        taylor_attention_backward(shape(s), tensors(), g, D.taylor_norm, s.stream);
    }
};
