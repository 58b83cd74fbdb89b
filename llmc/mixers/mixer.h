/*
A token mixer: what a SAN block runs between its pre-norm and its residual step
(doc/san-model.md "Forward pass"): out = mixer(in), (N, d) -> (N, d), N = rows x positions.
Standard attention is one; the variants of "Deconstructing Attention" are the others, one
header each in this folder, listed in registry.h (doc/deconstructing.md has the table of kinds
and headers, and how to add one). TokenMixer below is the interface the model calls, in the
order its methods are declared; llmc/model/layer_weights.h finds a mixer's tensors.
*/
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "llmc/kernels/attention_shape.h"       // defines: AttnShape, AttnTensors, AttnGrads
#include "llmc/kernels/attention_variants.cuh"  // defines: TaylorNorm
#include "llmc/model/attention_indicators.h"    // defines: AttnWeights
#include "llmc/cuda_common.h"
#include "llmc/kernels/kv_cache.cuh"            // defines: KVCache
#include "llmc/model/layer_weights.h"           // defines: Weight, LayerWeights
#include "llmc/kernels/norm.cuh"                // defines: GainNorm
#include "llmc/optim/param_spec.h"
#include "llmc/model/swiglu_mlp.h"              // defines: SwiGLUScratch

// The sizes and settings a mixer is built from (SANConfig::mixer_dims).
struct MixerDims {
    int d = 0, Hq = 0, Hkv = 0, hd = 0;
    int context = 0;                  // the model's T (rndembqk's fixed input has as many rows)
    bool qk_norm = true;              // per-head norm of q and k
    TaylorNorm taylor_norm = TaylorNorm::Joint;  // approximate's normalisation
    float gain_offset = 1.0f;         // norm gains stored as an offset from 1 (ZCN) or as the gain (RMS)
    float gain_init = 0.0f;           // a fresh gain's stored value
    float norm_eps = 1e-6f;
    float init_std = 0.02f;           // input projections: N(0, init_std)
    float out_std = 0.02f;            // output projections: N(0, out_std)
    float fixed_input_std = 0.02f;    // rndembqk's eps ~ N(0, this^2): the real stream's scale at init
    int qd() const { return Hq * hd; }
    int kvd() const { return Hkv * hd; }
    GainNorm head_norm(Weight gain) const { return {gain, hd, gain_offset, norm_eps}; }
};

// The backward's buffers every layer shares: one set per model, sized for the widest layer
// (ScratchSizes, from every layer's size_scratch).
struct BackwardScratch {
    float* reduce = nullptr;  // fp32: norm backward's partials, attention's D = rowsum(dout * out), gate sums
    floatX *d_branch = nullptr, *d_proj = nullptr;  // (N, d): the residual/sandwich step's
    floatX *d_o = nullptr, *d_q = nullptr, *d_k = nullptr, *d_v = nullptr;  // attention mixers: (N, qd / kvd)
    floatX *d_q_lin = nullptr, *d_k_lin = nullptr;                           // ... before QK-norm
    floatX* d_qk_in = nullptr;  // (N, d) staticembqk: dL/d norm(x0)
    float* kernels = nullptr;   // the approximate / nonapprox backward kernels' fp32 scratch
    SwiGLUScratch swiglu;       // (N, m) the SwiGLU MLPs'
};
struct ScratchSizes {
    bool attention = false;     // d_o .. d_k_lin
    bool qk_in = false;         // d_qk_in
    size_t kernel_floats = 0;   // kernels
    size_t swiglu_width = 0;    // swiglu: m of the widest SwiGLU
};

// One forward or backward call's rows and what the model lends the mixers.
struct MixerPass {
    int Bn = 0;                  // real rows
    int Rn = 0, Tn = 0;          // rows through the layers (Bn, then the fixed row when one runs), positions
    const int* doc_ids = nullptr;   // (Rn, Tn) document ids, or null: causal only
    const float* rope = nullptr;    // the RoPE table from position 0 (llmc/kernels/rope.cuh)
    KVCache* cache = nullptr;       // sampling: one position at cache->pos, keys and values cached
    int layer = 0;
    const floatX* x0 = nullptr;     // the token embedding (the stream before layer 0)
    floatX* dx0 = nullptr;          // its gradient (allocated when some mixer reads_embedding())
    const GainNorm* pre_norm = nullptr;  // the block's pre-norm (staticembqk runs x0 through it)
    const BackwardScratch* scratch = nullptr;
    cudaStream_t stream = 0;

    int N() const { return Rn * Tn; }
    int pos() const { return cache != nullptr ? cache->pos : 0; }
};

// The q and k whose scaled products the measurements look at (null: the mixer has no scores),
// and the weights the mixer makes of them (llmc/model/attention_indicators.h).
struct ScoreInputs {
    const floatX* q = nullptr;   // (Bn, Tn, Hq, hd)
    const floatX* k = nullptr;   // (Bn, Tn, Hkv, hd)
    AttnWeights weights = AttnWeights::Softmax;  // OwnScoreSoftmax (nonapprox): the score of t is q[t].k[t]
    bool own_position_only() const { return weights == AttnWeights::OwnScoreSoftmax; }
};

// What a layer's mixer does; the model calls these in this order.
class TokenMixer {
public:
    virtual ~TokenMixer() = default;
    // its tensors, appended under "layers.<l>.attn."
    virtual void add_parameters(std::vector<ParamSpec>& spec, const std::string& prefix) const = 0;
    // finds them and their gradients (names as added, with "attn.")
    virtual void bind(const LayerWeights& weights) = 0;
    // its activations for N positions, kept for backward
    virtual void allocate(DeviceArena& arena, size_t N) = 0;
    // the backward buffers it shares with every other layer
    virtual void size_scratch(ScratchSizes& sizes, int B, int T) const = 0;
    // out = mixer(in)
    virtual void forward(const MixerPass& pass, const floatX* in, floatX* out) = 0;
    // din = dL/d in, OVERWRITTEN; its gradients ACCUMULATE
    virtual void backward(const MixerPass& pass, const floatX* in, const floatX* dout, floatX* din) = 0;

    // What the model asks of it:
    // the q, k of the logged max-logit measurement, and what its weights are for the
    // attention-pattern indicators
    virtual ScoreInputs score_inputs() const { return {}; }
    virtual bool mixes_pairs() const { return true; }  // costs 12 T d FLOPs per token (scores and values)
    virtual bool decodes_with_cache() const { return false; }  // sampling: one position from the KV cache
    // what the model must provide: the fixed row (rndembqk, fixedseqqk), the token embedding x0
    virtual bool reads_fixed_row() const { return false; }
    virtual bool reads_embedding() const { return false; }
    virtual std::string describe() const { return ""; }  // for the run's banner
};
