/*
`mlp` (doc/deconstructing.md): token mixing removed: the layer's attention becomes a SwiGLU MLP
of each position's own input (llmc/model/swiglu_mlp.h), of width m chosen so that its 3 d m weights
match the W_q, W_k, W_v, W_o they replace: m = round((2 Hq hd + 2 Hkv hd) / 3) (4d/3 for MHA).
Weights "attn.w_gate", "attn.w_up" (m, d) and "attn.w_down" (d, m).
*/
#pragma once

#include <algorithm>
#include <cstdio>
#include <string>

#include "llmc/model/swiglu_mlp.h"
#include "mixer.h"

class MlpMixer : public TokenMixer {
public:
    explicit MlpMixer(const MixerDims& dims) : D(dims), mlp_(dims.d, width(dims)) {}
    // round(2 (Hq + Hkv) hd / 3), to the nearest integer
    static int width(const MixerDims& m) {
        int64_t per_d = 2 * (int64_t)m.Hq * m.hd + 2 * (int64_t)m.Hkv * m.hd;
        return (int)((2 * per_d + 3) / 6);
    }

    void add_parameters(std::vector<ParamSpec>& spec, const std::string& prefix) const override {
        mlp_.add_parameters(spec, prefix, D.init_std, D.out_std);
    }
    void bind(const LayerWeights& weights) override { mlp_.bind(weights, "attn."); }
    void allocate(DeviceArena& arena, size_t N) override { mlp_.allocate(arena, N); }
    void size_scratch(ScratchSizes& sizes, int, int) const override {
        sizes.swiglu_width = std::max(sizes.swiglu_width, (size_t)mlp_.width());
    }
    void forward(const MixerPass& s, const floatX* in, floatX* out) override { mlp_.forward(out, in, s.N(), s.stream); }
    void backward(const MixerPass& s, const floatX* in, const floatX* dout, floatX* din) override {
        mlp_.backward(din, dout, in, s.N(), s.scratch->swiglu, s.stream);
    }
    bool mixes_pairs() const override { return false; }
    bool decodes_with_cache() const override { return true; }  // nothing to cache: each position alone
    std::string describe() const override {
        const long long m = mlp_.width(), d = D.d;
        char buf[256];
        snprintf(buf, sizeof(buf), "; mlp width %lld: SwiGLU 3 d m = %lld weights per layer for W_q,W_k,W_v,W_o's %lld",
                 m, 3 * d * m, d * (2LL * D.qd() + 2LL * D.kvd()));
        return buf;
    }

private:
    const MixerDims D;
    SwiGLUMLP mlp_;
};
