/*
Standard attention (doc/san-model.md "Forward pass"), and the steps every attention kind shares:
    q_lin = u W_q^T, k_lin = u W_k^T, v = u W_v^T           (project)
    q, k  = rope(qk_norm(q_lin)), rope(qk_norm(k_lin))      (shape_qk; per head)
    o     = attention(q, k, v)                              (mix: causal GQA, llmc/kernels/attention.cuh)
    out   = o W_o^T
AttentionMixer runs these in order; a variant overrides the step it changes (approximate.h:
mix; nonapprox.h: shape_qk and mix; static_emb_qk.h: where q, k come from; fixed_qk.h: which
rows compute q, k). The variants: doc/deconstructing.md.
*/
#pragma once

#include <string>
#include <vector>

#include "llmc/kernels/attention.cuh"  // defines: attention_forward, attention_backward
#include "llmc/kernels/gemm.cuh"       // defines: linear_forward, linear_backward_weight, linear_backward_input
#include "llmc/kernels/qk_norm_rope.cuh"  // defines: qk_norm_rope_forward, qk_norm_rope_backward
#include "llmc/kernels/rope.cuh"       // defines: rope_forward, rope_backward
#include "mixer.h"

class AttentionMixer : public TokenMixer {
public:
    explicit AttentionMixer(const MixerDims& dims) : D(dims) {}

    // Weights "attn.wq" (Hq hd, d), "attn.wk", "attn.wv" (Hkv hd, d), with QK-norm
    // "attn.q_norm.weight", "attn.k_norm.weight" (hd), and "attn.wo" (d, Hq hd).
    void add_parameters(std::vector<ParamSpec>& spec, const std::string& prefix) const override {
        const int64_t d = D.d, qd = D.qd(), kvd = D.kvd();
        spec.push_back({prefix + "wq", {qd, d}, true, D.init_std, 0.0f});
        spec.push_back({prefix + "wk", {kvd, d}, true, D.init_std, 0.0f});
        spec.push_back({prefix + "wv", {kvd, d}, true, D.init_std, 0.0f});
        if (D.qk_norm) {
            spec.push_back({prefix + "q_norm.weight", {D.hd}, false, 0.0f, D.gain_init});
            spec.push_back({prefix + "k_norm.weight", {D.hd}, false, 0.0f, D.gain_init});
        }
        spec.push_back({prefix + "wo", {d, qd}, true, D.out_std, 0.0f});
    }
    void bind(const LayerWeights& w) override {
        wq = w["attn.wq"], wk = w["attn.wk"], wv = w["attn.wv"], wo = w["attn.wo"];
        q_norm = D.head_norm(w["attn.q_norm.weight"]);
        k_norm = D.head_norm(w["attn.k_norm.weight"]);
    }
    void allocate(DeviceArena& arena, size_t N) override {
        q_lin = arena.alloc<floatX>(N * D.qd());
        k_lin = arena.alloc<floatX>(N * D.kvd());
        v = arena.alloc<floatX>(N * D.kvd());
        q = arena.alloc<floatX>(N * D.qd());
        k = arena.alloc<floatX>(N * D.kvd());
        q_rstd = arena.alloc<float>(N * D.Hq);
        k_rstd = arena.alloc<float>(N * D.Hkv);
        o = arena.alloc<floatX>(N * D.qd());
        stats = arena.alloc<float>(stat_planes() * N * D.Hq);
    }
    void size_scratch(ScratchSizes& sizes, int, int) const override { sizes.attention = true; }

    void forward(const MixerPass& s, const floatX* in, floatX* out) override {
        const Rows r = qk_rows(s);
        const floatX* qk_in = qk_input(s, in);
        project(s, in, qk_in, r);
        shape_qk(s, r);
        share_qk(s);
        mix(s);
        linear_forward(out, o, wo.w, s.N(), D.qd(), D.d, s.stream);
    }
    void backward(const MixerPass& s, const floatX* in, const floatX* dout, floatX* din) override {
        const BackwardScratch& g = *s.scratch;
        const int N = s.N();
        linear_backward_weight(wo.grad, dout, o, N, D.qd(), D.d, s.stream);
        linear_backward_input(g.d_o, dout, wo.w, N, D.qd(), D.d, false, s.stream);
        mix_backward(s);
        share_qk_backward(s);
        const Rows r = qk_rows(s);
        QKGrads lin = shape_qk_backward(s, r);
        // the projections' weights: q, k from their rows of the q, k input; v from every row
        const floatX* qk_in = qk_input_of_forward(in) + r.p0 * D.d;
        linear_backward_weight(wq.grad, lin.dq, qk_in, r.Nq, D.d, D.qd(), s.stream);
        linear_backward_weight(wk.grad, lin.dk, qk_in, r.Nq, D.d, D.kvd(), s.stream);
        linear_backward_weight(wv.grad, g.d_v, in, N, D.d, D.kvd(), s.stream);
        input_grads(s, r, lin, din);
    }

    ScoreInputs score_inputs() const override { return {q, k, AttnWeights::Softmax}; }
    // Sampling: one position per step, its k and v written into the KV cache
    // (llmc/kernels/kv_cache.cuh).
    bool decodes_with_cache() const override { return true; }

protected:
    // The rows that compute their own q and k: rows r0 .. r0 + Rq - 1 (every row here),
    // positions p0 = r0 Tn on, Nq = Rq Tn of them.
    struct Rows {
        int r0, Rq, Nq;
        size_t p0;
    };
    virtual Rows qk_rows(const MixerPass& s) const { return {0, s.Rn, s.N(), 0}; }
    // The input q and k are projected from: the mixer's input here.
    virtual const floatX* qk_input(const MixerPass&, const floatX* in) { return in; }
    virtual const floatX* qk_input_of_forward(const floatX* in) const { return in; }

    // q_lin, k_lin of rows r; v of every row (with a cache: into the cache's row pos).
    void project(const MixerPass& s, const floatX* in, const floatX* qk_in, const Rows& r) {
        const int d = D.d, qd = D.qd(), kvd = D.kvd();
        linear_forward(q_lin + r.p0 * qd, qk_in + r.p0 * d, wq.w, r.Nq, d, qd, s.stream);
        linear_forward(k_lin + r.p0 * kvd, qk_in + r.p0 * d, wk.w, r.Nq, d, kvd, s.stream);
        linear_forward(v_out(s), in, wv.w, s.N(), d, kvd, s.stream);
    }
    // q, k = rope(qk_norm(q_lin, k_lin)) for rows r (k: into the cache with one)
    virtual void shape_qk(const MixerPass& s, const Rows& r) {
        const int qd = D.qd(), kvd = D.kvd(), hd = D.hd;
        floatX* q_rows = q + r.p0 * qd;
        floatX* k_rows = k_out(s) + r.p0 * kvd;
        const float* rope_rows = s.rope + (size_t)s.pos() * hd;  // the table from position pos on
        if (D.qk_norm) {  // one pass each (llmc/kernels/qk_norm_rope.cuh)
            qk_norm_rope_forward(q_norm, q_rows, q_rstd + r.p0 * D.Hq, q_lin + r.p0 * qd, rope_rows, r.Rq, s.Tn, D.Hq,
                                 s.stream);
            qk_norm_rope_forward(k_norm, k_rows, k_rstd + r.p0 * D.Hkv, k_lin + r.p0 * kvd, rope_rows, r.Rq, s.Tn,
                                 D.Hkv, s.stream);
        } else {
            rope_forward(q_rows, q_lin + r.p0 * qd, rope_rows, r.Rq, s.Tn, D.Hq, hd, s.stream);
            rope_forward(k_rows, k_lin + r.p0 * kvd, rope_rows, r.Rq, s.Tn, D.Hkv, hd, s.stream);
        }
    }
    // after shape_qk: rows that did not compute q, k get them (fixed_qk.h)
    virtual void share_qk(const MixerPass&) {}
    virtual void share_qk_backward(const MixerPass&) {}
    // o = attention(q, k, v); with a cache, position pos's query over the cached rows
    virtual void mix(const MixerPass& s) {
        if (s.cache != nullptr) {
            attention_decode({1, s.pos() + 1, D.Hq, D.Hkv, D.hd, s.doc_ids},
                             {q, s.cache->k[s.layer], s.cache->v[s.layer], o, nullptr}, s.stream);
        } else {
            attention_forward(shape(s), tensors(), s.stream);
        }
    }
    virtual void mix_backward(const MixerPass& s) { attention_backward(shape(s), tensors(), grads(s), s.stream); }

    // dL/d q_lin, dL/d k_lin (the rows r of these pointers) from dL/d q, dL/d k
    struct QKGrads {
        floatX *dq, *dk;
    };
    virtual QKGrads shape_qk_backward(const MixerPass& s, const Rows& r) {
        const BackwardScratch& g = *s.scratch;
        floatX* dq = g.d_q + r.p0 * D.qd();
        floatX* dk = g.d_k + r.p0 * D.kvd();
        if (D.qk_norm) {  // one pass each, into d_q_lin, d_k_lin
            QKGrads lin{g.d_q_lin + r.p0 * D.qd(), g.d_k_lin + r.p0 * D.kvd()};
            qk_norm_rope_backward(q_norm, lin.dq, dq, q_lin + r.p0 * D.qd(), q_rstd + r.p0 * D.Hq, s.rope, r.Rq, s.Tn,
                                  D.Hq, g.reduce, s.stream);
            qk_norm_rope_backward(k_norm, lin.dk, dk, k_lin + r.p0 * D.kvd(), k_rstd + r.p0 * D.Hkv, s.rope, r.Rq,
                                  s.Tn, D.Hkv, g.reduce, s.stream);
            return lin;
        }
        rope_backward(dq, dq, s.rope, r.Rq, s.Tn, D.Hq, D.hd, s.stream);
        rope_backward(dk, dk, s.rope, r.Rq, s.Tn, D.Hkv, D.hd, s.stream);
        return {dq, dk};
    }
    // through QK-norm (identity without it): `q_in` is the tensor q's norm read
    QKGrads qk_norm_backward(const MixerPass& s, const Rows& r, const floatX* q_in, QKGrads d) {
        if (!D.qk_norm) { return d; }
        const BackwardScratch& g = *s.scratch;
        const int qd = D.qd(), kvd = D.kvd();
        QKGrads lin{g.d_q_lin + r.p0 * qd, g.d_k_lin + r.p0 * kvd};
        cudaCheck(cudaMemsetAsync(lin.dq, 0, (size_t)r.Nq * qd * sizeof(floatX), s.stream));
        cudaCheck(cudaMemsetAsync(lin.dk, 0, (size_t)r.Nq * kvd * sizeof(floatX), s.stream));
        q_norm.backward(lin.dq, d.dq, q_in + r.p0 * qd, q_rstd + r.p0 * D.Hq, r.Nq * D.Hq, g.reduce, s.stream);
        k_norm.backward(lin.dk, d.dk, k_lin + r.p0 * kvd, k_rstd + r.p0 * D.Hkv, r.Nq * D.Hkv, g.reduce, s.stream);
        return lin;
    }
    // din = the projections' input gradients (q, k and v all read the mixer's input here)
    virtual void input_grads(const MixerPass& s, const Rows&, const QKGrads& lin, floatX* din) {
        const int N = s.N(), d = D.d;
        linear_backward_input(din, lin.dq, wq.w, N, d, D.qd(), false, s.stream);
        linear_backward_input(din, lin.dk, wk.w, N, d, D.kvd(), true, s.stream);
        linear_backward_input(din, s.scratch->d_v, wv.w, N, d, D.kvd(), true, s.stream);
    }

    // the row statistics the forward keeps: planes of (rows, Hq, T) floats
    virtual size_t stat_planes() const { return 1; }
    AttnShape shape(const MixerPass& s) const { return {s.Rn, s.Tn, D.Hq, D.Hkv, D.hd, s.doc_ids}; }
    AttnTensors tensors() const { return {q, k, v, o, stats}; }
    AttnGrads grads(const MixerPass& s) const {
        const BackwardScratch& g = *s.scratch;
        return {g.d_o, g.d_q, g.d_k, g.d_v, s.scratch->reduce};
    }
    // where this pass's k and v go: the activations, or with a cache its row pos
    floatX* k_out(const MixerPass& s) const {
        return s.cache != nullptr ? s.cache->k[s.layer] + (size_t)s.pos() * D.kvd() : k;
    }
    floatX* v_out(const MixerPass& s) const {
        return s.cache != nullptr ? s.cache->v[s.layer] + (size_t)s.pos() * D.kvd() : v;
    }

    const MixerDims D;
    Weight wq, wk, wv, wo;
    GainNorm q_norm, k_norm;
    // activations: q_lin, k_lin, v = u W^T; q, k after QK-norm and RoPE (rstd: the norms');
    // o = attention output; stats: the mixing's row statistics
    floatX *q_lin = nullptr, *k_lin = nullptr, *v = nullptr, *q = nullptr, *k = nullptr, *o = nullptr;
    float *q_rstd = nullptr, *k_rstd = nullptr, *stats = nullptr;
};
