/*
train_san.cu: trains the SAN family (the SAN paper; doc/san-model.md): attention-only
transformers ("Simple Attention Networks") and, from the same code, their FFN control
arm, which differs only by a SwiGLU block after each attention block.

Reads top to bottom: config -> parameters -> activations -> forward -> backward -> update
-> checkpoint -> main loop. The kernels live in llmc/; every matmul goes through
llmc/gemm.cuh. Built by nvcc for the GPU and by g++ for the host backend (llmc/hostcuda.h)
from this one source; `test_san.cu` includes this file with TESTING defined and checks it
against the PyTorch reference train_san.py.

    make && ./train_san -h
*/
#include <cinttypes>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "llmc/utils.h"
#include "llmc/cuda_common.h"
#include "llmc/gemm.cuh"
#include "llmc/reduce.cuh"
#include "llmc/embedding.cuh"
#include "llmc/norm.cuh"
#include "llmc/rope.cuh"
#include "llmc/attention.cuh"
#include "llmc/attention_variants.cuh"  // approximate, nonapprox (and SiLU)
#include "llmc/attention_kinds.h"       // AttnKind, the layouts
#include "llmc/fixed_qk.cuh"            // rndembqk, fixedseqqk: FixedQKInput, the fixed row's broadcast and its backward
#include "llmc/kv_cache.cuh"
#include "llmc/swiglu.cuh"
#include "llmc/residual.cuh"
#include "llmc/classifier.cuh"
#include "llmc/spectrum.h"    // effective_rank (the per-layer measurements)
#include "llmc/parameters.h"  // ModelParameters: parameters, gradients, optimizer
#include "llmc/trainer.h"     // trainer_main: main's sequence, run_training; model.h: counts, sample

constexpr float kNormEps = 1e-6f;
constexpr float kInitStd = 0.02f;

// ========================================================================================
// config

enum class FfnKind { None, SwiGLU };
inline const Choices<FfnKind> kFfnKinds{{"none", "swiglu"}};
enum class NormKind { ZCN, RMS };
inline const Choices<NormKind> kNormKinds{{"zcn", "rms"}};
inline const Choices<TaylorNorm> kTaylorNorms{{"joint", "separate"}};  // (llmc/attention_variants.cuh)

// The sizes (vocabulary, context, layers, width, query heads, BOS) are ModelDims' (llmc/model.h).
struct SANConfig : ModelDims {
    int n_kv_head = 2;
    FfnKind ffn = FfnKind::None;
    int d_ff = 0;  // 0: 4 * n_embd
    NormKind norm = NormKind::ZCN;
    int qk_norm = 1;
    ResidualMode residual = ResidualMode::Gated;
    int sandwich = 0;
    double rope_theta = 10000.0;
    int doc_mask = 1;
    double z_loss = 1e-4;
    // the attention variants of "Deconstructing Attention" (doc/deconstructing.md)
    AttnKind attention = AttnKind::Standard;  // the kind of every layer the layout does not keep standard
    std::string layout = "uniform";           // which layers keep standard attention (llmc/attention_kinds.h)
    TaylorNorm taylor_norm = TaylorNorm::Joint;  // approximate: Based's joint feature map, or the paper's terms
    std::vector<AttnKind> kinds;              // resolved by resolve_and_check: one per layer

    int kv_width() const { return n_kv_head * head_dim(); }
    int64_t embedding_numel() const { return (int64_t)padded_vocab() * n_embd; }
    bool has_ffn() const { return ffn == FfnKind::SwiGLU; }
    // ZCN gains are stored as an offset from 1, RMSNorm gains as the gain itself
    float gain_offset() const { return norm == NormKind::ZCN ? 1.0f : 0.0f; }
    AttnKind kind(int layer) const { return kinds[layer]; }
    bool has_kind(AttnKind k) const { return std::find(kinds.begin(), kinds.end(), k) != kinds.end(); }
    // rndembqk, fixedseqqk: q, k from a fixed input run through the network (doc/deconstructing.md)
    bool has_fixed_qk() const { return attention == AttnKind::RndEmbQK || attention == AttnKind::FixedSeqQK; }
    // The weights of W_q, W_k, W_v, W_o (d x (2 Hq hd + 2 Hkv hd)), which an mlp layer's SwiGLU
    // (3 d m weights) replaces: m = round((2 Hq hd + 2 Hkv hd) / 3), nearest integer (4d/3 for MHA).
    int64_t attention_matrix_weights() const {
        return (int64_t)n_embd * (2 * n_head * head_dim() + 2 * n_kv_head * head_dim());
    }
    int mlp_width() const {
        int64_t per_d = 2 * (int64_t)n_head * head_dim() + 2 * (int64_t)n_kv_head * head_dim();
        return (int)((2 * per_d + 3) / 6);
    }
    // "standard,mlp,..." one kind per layer (written to files, checked on load)
    std::string layer_kinds_text() const {
        std::string out;
        for (AttnKind k : kinds) { out += (out.empty() ? "" : ",") + std::string(kAttnKinds.name(k)); }
        return out;
    }

    void resolve_and_check() {
        if (d_ff == 0) { d_ff = 4 * n_embd; }
        auto require = [](bool ok, const char* what) {
            if (!ok) { fatal("bad model config: %s", what); }
        };
        check_dims();
        require(head_dim() % 2 == 0 && head_dim() <= 128, "head_dim = n_embd / n_head must be even and at most 128");
        require(n_kv_head > 0 && n_head % n_kv_head == 0, "--n-head must be a multiple of --n-kv-head");
        require(qk_norm == 0 || qk_norm == 1, "--qk-norm must be 0 or 1");
        require(sandwich == 0 || sandwich == 1, "--sandwich must be 0 or 1");
        require(doc_mask == 0 || doc_mask == 1, "--doc-mask must be 0 or 1");
        require(d_ff > 0, "--d-ff must be positive");
        require(rope_theta > 0.0, "--rope-theta must be positive");
        require(z_loss >= 0.0, "--z-loss must be >= 0");
        resolve_attention_kinds();
    }

    // --attention and --layout -> one kind per layer (llmc/attention_kinds.h)
    void resolve_attention_kinds() {
        std::vector<int> standard;
        std::string error;
        if (!standard_layers_of_layout(layout, n_layer, &standard, &error)) { fatal("--layout: %s", error.c_str()); }
        if (attention == AttnKind::Standard && layout != "uniform") {
            fatal("--layout %s chooses the layers of a variant, but --attention is standard: give --attention KIND "
                  "(%s)", layout.c_str(), kAttnKinds.list(", ").c_str());
        }
        if (attention != AttnKind::Standard && (int)standard.size() == n_layer) {
            fatal("--layout %s keeps standard attention in all %d layers: --attention %s would be used nowhere",
                  layout.c_str(), n_layer, kAttnKinds.name(attention));
        }
        kinds.assign(n_layer, attention);
        for (int l : standard) { kinds[l - 1] = AttnKind::Standard; }
    }
};

std::map<std::string, SANConfig> presets() {
    SANConfig tiny;  // the defaults above: the PyTorch reference's "tiny"
    SANConfig tiny_ffn = tiny;
    tiny_ffn.ffn = FfnKind::SwiGLU;
    tiny_ffn.d_ff = 128;
    SANConfig paper;  // d512, 8 query / 4 kv heads, vocab 16384, T 2048
    paper.set_sizes(16384, 2048, paper.n_layer, 512, 8);
    paper.n_kv_head = 4;
    auto arm = [](SANConfig c, int layers, FfnKind ffn) {
        c.n_layer = layers;
        c.ffn = ffn;
        return c;
    };
    // a small SAN that learns the offline data on a CPU in minutes (vocab from the tokenizer)
    SANConfig demo = tiny;
    demo.set_sizes(8192, 128, 4, 128, 4);
    demo.n_kv_head = 2;
    // "Deconstructing Attention"'s Qwen2.5-style decoders (doc/deconstructing.md "Presets"): RMSNorm,
    // SwiGLU, RoPE (theta 1e6), MHA, plain residuals, no QK-norm, no biases (Qwen2.5's q/k/v biases
    // are left out), GPT-2's vocabulary (its end-of-text token starts documents), no z-loss; the
    // smaller ones take d_ff from the 500M's ratio 4864/896 rounded to a multiple of 128.
    SANConfig qwen = tiny;
    qwen.vocab_size = 50257;
    qwen.seq_len = 2048;
    qwen.ffn = FfnKind::SwiGLU;
    qwen.norm = NormKind::RMS;
    qwen.qk_norm = 0;
    qwen.residual = ResidualMode::Standard;
    qwen.rope_theta = 1e6;
    qwen.bos_id = 50256;
    qwen.z_loss = 0.0;
    auto qwen_size = [](SANConfig c, int layers, int d, int heads, int kv_heads, int d_ff) {
        c.n_layer = layers;
        c.n_embd = d;
        c.n_head = heads;
        c.n_kv_head = kv_heads;
        c.d_ff = d_ff;
        return c;
    };
    SANConfig qwen3 = qwen_size(qwen, 28, 2048, 16, 8, 6144);  // Qwen3-1.7B's shape: GQA 16/8, hd 128, QK-norm
    qwen3.qk_norm = 1;
    SANConfig qwen_cpu = qwen_size(qwen, 4, 128, 4, 4, 640);  // the same shape, small enough for a CPU
    qwen_cpu.vocab_size = 8192;
    qwen_cpu.seq_len = 128;
    qwen_cpu.bos_id = 2;
    SANConfig qwen3_cpu = qwen_size(qwen_cpu, 4, 128, 4, 2, 384);  // ... of the QK-norm one (d_ff 3d)
    qwen3_cpu.qk_norm = 1;
    return {{"tiny", tiny},
            {"tiny-ffn", tiny_ffn},
            {"demo", demo},
            {"qwen-70m", qwen_size(qwen, 6, 512, 8, 8, 2816)},
            {"qwen-160m", qwen_size(qwen, 12, 768, 12, 12, 4224)},
            {"qwen-500m", qwen_size(qwen, 24, 896, 14, 14, 4864)},  // the paper's main size
            {"qwen3-1.7b", qwen3},
            {"qwen-cpu", qwen_cpu},
            {"qwen3-cpu", qwen3_cpu},
            {"san20", arm(paper, 20, FfnKind::None)},    // the paper's SAN
            {"ffn20", arm(paper, 20, FfnKind::SwiGLU)},  // iso-depth partner
            {"ffn4", arm(paper, 4, FfnKind::SwiGLU)},    // iso-param partner
            {"ffn9", arm(paper, 9, FfnKind::SwiGLU)}};   // iso-FLOP partner
}

void write_config(TensorFileWriter& w, const SANConfig& c) {
    w.set("model", std::string("san"));
    c.write_dims(w);
    w.set("n_kv_head", c.n_kv_head);
    w.set("ffn", std::string(kFfnKinds.name(c.ffn)));
    w.set("d_ff", c.d_ff);
    w.set("norm", std::string(kNormKinds.name(c.norm)));
    w.set("qk_norm", c.qk_norm);
    w.set("residual", std::string(kResidualModes.name(c.residual)));
    w.set("sandwich", c.sandwich);
    w.set("rope_theta", c.rope_theta);
    w.set("doc_mask", c.doc_mask);
    w.set("z_loss", c.z_loss);
    w.set("attention", std::string(kAttnKinds.name(c.attention)));
    w.set("layout", c.layout);
    w.set("taylor_norm", std::string(kTaylorNorms.name(c.taylor_norm)));
    w.set("layer_attention", c.layer_kinds_text());
}

SANConfig read_config(const TensorFileReader& r) {
    // files written before the key existed are SAN files: train_gpt2's always say model=gpt2
    if (r.has_key("model") && r.str("model") != "san") {
        r.fail("is a %s checkpoint (config key model=%s): it belongs to train_%s, not train_san", r.str("model").c_str(),
               r.str("model").c_str(), r.str("model").c_str());
    }
    SANConfig c;
    c.read_dims(r);
    c.n_kv_head = r.int32("n_kv_head");
    read_choice(r, "ffn", kFfnKinds, &c.ffn);
    c.d_ff = r.int32("d_ff");
    read_choice(r, "norm", kNormKinds, &c.norm);
    c.qk_norm = r.int32("qk_norm");
    read_choice(r, "residual", kResidualModes, &c.residual);
    c.sandwich = r.int32("sandwich");
    c.rope_theta = r.real("rope_theta");
    c.doc_mask = r.int32("doc_mask");
    c.z_loss = r.real("z_loss");
    if (r.has_key("attention")) {  // files from before the variants: standard attention everywhere
        read_choice(r, "attention", kAttnKinds, &c.attention);
        c.layout = r.str("layout");
        read_choice(r, "taylor_norm", kTaylorNorms, &c.taylor_norm);
    }
    c.resolve_and_check();
    c.check_derived(r);
    if (r.has_key("layer_attention") && r.str("layer_attention") != c.layer_kinds_text()) {
        r.fail("layer_attention=%s does not follow from attention=%s layout=%s (%s)", r.str("layer_attention").c_str(),
               kAttnKinds.name(c.attention), c.layout.c_str(), c.layer_kinds_text().c_str());
    }
    return c;
}

// ========================================================================================
// parameters: one contiguous buffer, tensors in the canonical order of doc/san-model.md

std::vector<ParamSpec> parameter_spec(const SANConfig& c) {
    int64_t d = c.n_embd, hd = c.head_dim(), qd = (int64_t)c.n_head * hd, kvd = (int64_t)c.n_kv_head * hd;
    float gain = c.norm == NormKind::ZCN ? 0.0f : 1.0f;
    float out_std = kInitStd / std::sqrt(2.0f * c.n_layer);
    bool gated = residual_has_gate(c.residual);
    std::vector<ParamSpec> spec;
    spec.push_back({"wte", {c.padded_vocab(), d}, false, kInitStd, 0.0f, c.vocab_size});
    for (int l = 0; l < c.n_layer; l++) {
        std::string p = "layers." + std::to_string(l) + ".";
        spec.push_back({p + "attn_norm.weight", {d}, false, 0.0f, gain});
        if (c.kind(l) == AttnKind::Mlp) {  // token mixing removed: a SwiGLU in the attention's place
            int64_t m = c.mlp_width();
            spec.push_back({p + "attn.w_gate", {m, d}, true, kInitStd, 0.0f});
            spec.push_back({p + "attn.w_up", {m, d}, true, kInitStd, 0.0f});
            spec.push_back({p + "attn.w_down", {d, m}, true, out_std, 0.0f});
        } else {  // every other kind keeps standard attention's tensors
            spec.push_back({p + "attn.wq", {qd, d}, true, kInitStd, 0.0f});
            spec.push_back({p + "attn.wk", {kvd, d}, true, kInitStd, 0.0f});
            spec.push_back({p + "attn.wv", {kvd, d}, true, kInitStd, 0.0f});
            if (c.qk_norm) {
                spec.push_back({p + "attn.q_norm.weight", {hd}, false, 0.0f, gain});
                spec.push_back({p + "attn.k_norm.weight", {hd}, false, 0.0f, gain});
            }
            spec.push_back({p + "attn.wo", {d, qd}, true, out_std, 0.0f});
        }
        if (c.sandwich) { spec.push_back({p + "attn_post_norm.weight", {d}, false, 0.0f, gain}); }
        if (gated) { spec.push_back({p + "attn_gate", {1}, false, 0.0f, 0.0f}); }
        if (c.has_ffn()) {
            spec.push_back({p + "ffn_norm.weight", {d}, false, 0.0f, gain});
            spec.push_back({p + "ffn.w_gate", {c.d_ff, d}, true, kInitStd, 0.0f});
            spec.push_back({p + "ffn.w_up", {c.d_ff, d}, true, kInitStd, 0.0f});
            spec.push_back({p + "ffn.w_down", {d, c.d_ff}, true, out_std, 0.0f});
            if (c.sandwich) { spec.push_back({p + "ffn_post_norm.weight", {d}, false, 0.0f, gain}); }
            if (gated) { spec.push_back({p + "ffn_gate", {1}, false, 0.0f, 0.0f}); }
        }
    }
    spec.push_back({"final_norm.weight", {d}, false, 0.0f, gain});
    return spec;
}

// Pointers to one layer's tensors inside a buffer in the device layout of parameter_spec
// (llmc/optimizer.h layout_parameters; parameters, gradients and optimizer state share it).
// Absent tensors are null.
template <typename T>
struct LayerTensors {
    T *attn_norm = nullptr, *wq = nullptr, *wk = nullptr, *wv = nullptr, *q_norm = nullptr, *k_norm = nullptr;
    T *wo = nullptr, *attn_post_norm = nullptr, *attn_gate = nullptr;
    T *mlp_gate = nullptr, *mlp_up = nullptr, *mlp_down = nullptr;  // an mlp layer's SwiGLU
    T *ffn_norm = nullptr, *w_gate = nullptr, *w_up = nullptr, *w_down = nullptr, *ffn_post_norm = nullptr,
      *ffn_gate = nullptr;
};
template <typename T>
struct ModelTensors {
    T* wte = nullptr;
    std::vector<LayerTensors<T>> layers;
    T* final_norm = nullptr;

    // spec: laid out (ModelParameters::spec), so that each tensor sits at base + its offset
    void point_into(T* base, const std::vector<ParamSpec>& spec, int n_layer) {
        layers.assign(n_layer, LayerTensors<T>());
        for (const ParamSpec& s : spec) { slot(s.name) = base + s.offset; }
    }

private:
    T*& slot(const std::string& name) {
        if (name == "wte") { return wte; }
        if (name == "final_norm.weight") { return final_norm; }
        size_t dot = name.find('.', 7);  // "layers.<i>.<field>"
        LayerTensors<T>& L = layers[std::stoi(name.substr(7, dot - 7))];
        std::string field = name.substr(dot + 1);
        static const std::map<std::string, T* LayerTensors<T>::*> fields = {
            {"attn_norm.weight", &LayerTensors<T>::attn_norm}, {"attn.wq", &LayerTensors<T>::wq},
            {"attn.wk", &LayerTensors<T>::wk},                 {"attn.wv", &LayerTensors<T>::wv},
            {"attn.q_norm.weight", &LayerTensors<T>::q_norm},  {"attn.k_norm.weight", &LayerTensors<T>::k_norm},
            {"attn.wo", &LayerTensors<T>::wo},                 {"attn_post_norm.weight", &LayerTensors<T>::attn_post_norm},
            {"attn.w_gate", &LayerTensors<T>::mlp_gate},       {"attn.w_up", &LayerTensors<T>::mlp_up},
            {"attn.w_down", &LayerTensors<T>::mlp_down},
            {"attn_gate", &LayerTensors<T>::attn_gate},        {"ffn_norm.weight", &LayerTensors<T>::ffn_norm},
            {"ffn.w_gate", &LayerTensors<T>::w_gate},          {"ffn.w_up", &LayerTensors<T>::w_up},
            {"ffn.w_down", &LayerTensors<T>::w_down},          {"ffn_post_norm.weight", &LayerTensors<T>::ffn_post_norm},
            {"ffn_gate", &LayerTensors<T>::ffn_gate}};
        return L.*(fields.at(field));
    }
};

// Training FLOPs per token: llmc/model.h's convention (as train_san.py), with the 12 * T * d of
// scores and values counted only for the layers that mix over T x T pairs (standard,
// approximate, staticembqk, rndembqk, fixedseqqk; not mlp, which mixes nothing, nor nonapprox,
// whose scores are one per position). Found instead of model.h's template by argument-dependent
// lookup. (rndembqk / fixedseqqk: the fixed row's cost per micro-batch is not in it, nor the
// real rows' q, k projections that they skip; describe_attention says so.)
double flops_per_token(const SANConfig& c) {
    double nonemb = (double)count_parameters(c).non_embedding;
    int pairwise = 0;
    for (AttnKind k : c.kinds) { pairwise += k != AttnKind::Mlp && k != AttnKind::Nonapprox; }
    return 6.0 * (nonemb + (double)c.vocab_size * c.n_embd) + 12.0 * pairwise * (double)c.seq_len * c.n_embd;
}

// One line on the attention of each layer, and for mlp layers the weight counts they match.
std::string describe_attention(const SANConfig& c) {
    std::string out = std::string("attention: ") + kAttnKinds.name(c.attention) + ", layout " + c.layout +
                      " (layers: " + c.layer_kinds_text() + ")";
    if (c.has_kind(AttnKind::Approximate)) { out += std::string("; taylor_norm ") + kTaylorNorms.name(c.taylor_norm); }
    if (c.has_fixed_qk()) {
        char buf[512];
        if (c.attention == AttnKind::RndEmbQK) {
            snprintf(buf, sizeof(buf), "\nfixed QK input (rndembqk): eps ~ N(0, %g^2) of %d x %d = %lld values",
                     0.02 * std::sqrt((double)c.n_embd), c.seq_len, c.n_embd, (long long)c.seq_len * c.n_embd);
        } else {
            snprintf(buf, sizeof(buf), "\nfixed QK input (fixedseqqk): the embedding of %d fixed tokens = %d values",
                     c.seq_len, c.seq_len);
        }
        out += buf;
        out += " of model state (in checkpoints; not a parameter, not counted below); it runs as one more row per "
               "micro-batch (+1/B of the compute, not in FLOPs/token)";
    }
    if (c.has_kind(AttnKind::Mlp)) {
        char buf[256];
        snprintf(buf, sizeof(buf), "; mlp width %d: SwiGLU 3 d m = %lld weights per layer for W_q,W_k,W_v,W_o's %lld",
                 c.mlp_width(), 3LL * c.n_embd * c.mlp_width(), (long long)c.attention_matrix_weights());
        out += buf;
    }
    return out;
}

// The SAN paper's locked per-device peak rates for this arm (llmc/optimizer.h DefaultRates).
DefaultRates default_rates(const SANConfig& c) {
    DefaultRates r;
    if (c.has_ffn()) {
        r.muon = 0.04;
        r.adamw = 2.4e-3;
    }
    return r;
}

// ========================================================================================
// activations: everything the backward pass needs, for B x T positions

// (norm_rstd: the 1/rms of a norm's rows, kept for its backward)
struct LayerActivations {
    // attention block: attn_in = norm(x); q_lin, k_lin, v = attn_in W^T; q, k = rope(qk_norm(.));
    // o = attention(q, k, v); attn_out = o W_o^T (attn_out_normed: its sandwich norm);
    // x_mid = residual(x, attn_out) when an FFN block follows
    floatX *attn_in, *q_lin, *k_lin, *v, *q, *k, *o, *attn_out, *attn_out_normed, *x_mid;
    float *attn_in_rstd, *q_rstd, *k_rstd, *lse, *attn_out_rstd;  // lse: the mixer's row statistics (forward)
    // the variants (doc/deconstructing.md): nonapprox with QK-norm keeps q_act = SiLU(q_lin), the
    // norm's input; staticembqk keeps qk_in = norm(x0), the embedding through this layer's pre-norm;
    // mlp keeps its SwiGLU's gate, up and output (the attention tensors above stay null)
    floatX *q_act, *qk_in, *mlp_gate, *mlp_up, *mlp_out;
    float *qk_in_rstd;
    // FFN block: ffn_in = norm(x_mid); swiglu_out = silu(ffn_in W_gate^T) * (ffn_in W_up^T);
    // ffn_out = swiglu_out W_down^T (ffn_out_normed: its sandwich norm)
    floatX *ffn_in, *swiglu_gate, *swiglu_up, *swiglu_out, *ffn_out, *ffn_out_normed;
    float *ffn_in_rstd, *ffn_out_rstd;
};

// ========================================================================================
// the model

// --skip-nonstandard: evaluate a trained hybrid without its non-standard attention sub-layers
// (Attention) or without those layers' whole blocks (Block), the paper's "skip" column.
enum class SkipNonstandard { None, Attention, Block };

inline bool is_fixed_qk(AttnKind k) { return k == AttnKind::RndEmbQK || k == AttnKind::FixedSeqQK; }

// The model: its parameters, gradients and optimizer, the residual stream, logits and loss
// buffers (llmc/model.h LanguageModel) and, for B rows of T positions, the activations and
// scratch of forward and backward.
struct SAN : LanguageModel<SANConfig> {
    ModelTensors<floatX> P, G;

    // activations
    std::vector<LayerActivations> acts;
    floatX* xf = nullptr;
    float* xf_rstd = nullptr;
    int* d_doc_ids = nullptr;
    float* rope = nullptr;
    // backward scratch
    floatX *d_branch = nullptr, *d_proj = nullptr, *d_block_in = nullptr;
    floatX *d_o = nullptr, *d_q = nullptr, *d_k = nullptr, *d_v = nullptr, *d_qlin = nullptr, *d_klin = nullptr;
    floatX *d_swiglu_out = nullptr, *d_swiglu_gate = nullptr, *d_swiglu_up = nullptr;
    floatX *d_qk_in = nullptr, *dx0 = nullptr;  // staticembqk: gradients of the layers' qk_in, and of x0
    float* scratch = nullptr;
    float* variant_scratch = nullptr;  // backward scratch of the approximate / nonapprox mixers
    SkipNonstandard skip = SkipNonstandard::None;  // evaluation only: backward() refuses it
    std::vector<int> host_targets_masked;
    // rndembqk, fixedseqqk (llmc/fixed_qk.cuh): the fixed input (model state, host copy as in
    // files), rndembqk's eps on the device, and whether the last forward ran the fixed row
    FixedQKInput fixed;
    floatX* fixed_eps = nullptr;
    int fixed_row = 0;

    // The activations hold one row more than `batch` for the fixed row of rndembqk / fixedseqqk.
    SAN(const SANConfig& config, int batch, int seq) : LanguageModel(config, batch + (config.has_fixed_qk() ? 1 : 0), seq) {
        P.point_into(params, spec, cfg.n_layer);
        G.point_into(grads, spec, cfg.n_layer);
        allocate_activations();
        if (cfg.has_fixed_qk()) {
            fixed = FixedQKInput(cfg.attention == AttnKind::RndEmbQK, cfg.seq_len, cfg.n_embd, cfg.vocab_size);
            if (fixed.random) {
                fixed_eps = arena.alloc<floatX>((size_t)cfg.seq_len * cfg.n_embd);
                upload_fixed_input();
            }
        }
        std::vector<float> table = rope_table(cfg.seq_len, cfg.head_dim(), cfg.rope_theta);
        rope = copy_to_device(table);
        arena.blocks.push_back(rope);
    }

    void allocate_activations() {
        size_t N = (size_t)B * T, d = cfg.n_embd, hd = cfg.head_dim();
        size_t qd = (size_t)cfg.n_head * hd, kvd = (size_t)cfg.n_kv_head * hd;
        size_t ff = cfg.has_ffn() ? (size_t)cfg.d_ff : 0;  // the widest SwiGLU: the FFN's or an mlp layer's
        size_t mixer_scratch = 0;                          // the variants' backward scratch (fp32)
        acts.resize(cfg.n_layer);
        for (int l = 0; l < cfg.n_layer; l++) {
            LayerActivations& a = acts[l];
            const AttnKind kind = cfg.kind(l);
            a = LayerActivations{};
            a.attn_in = arena.alloc<floatX>(N * d);
            a.attn_in_rstd = arena.alloc<float>(N);
            if (kind == AttnKind::Mlp) {
                size_t m = cfg.mlp_width();
                a.mlp_gate = arena.alloc<floatX>(N * m);
                a.mlp_up = arena.alloc<floatX>(N * m);
                a.mlp_out = arena.alloc<floatX>(N * m);
                ff = std::max(ff, m);
            } else {
                a.q_lin = arena.alloc<floatX>(N * qd);
                a.k_lin = arena.alloc<floatX>(N * kvd);
                a.v = arena.alloc<floatX>(N * kvd);
                a.q = arena.alloc<floatX>(N * qd);
                a.k = arena.alloc<floatX>(N * kvd);
                a.q_rstd = arena.alloc<float>(N * cfg.n_head);
                a.k_rstd = arena.alloc<float>(N * cfg.n_kv_head);
                a.o = arena.alloc<floatX>(N * qd);
                // row statistics: lse (standard), the Z planes (approximate), scores and lse (nonapprox)
                size_t planes = kind == AttnKind::Approximate ? taylor_stat_planes(cfg.taylor_norm)
                                : kind == AttnKind::Nonapprox ? 2 : 1;
                a.lse = arena.alloc<float>(planes * N * cfg.n_head);
            }
            if (kind == AttnKind::Nonapprox) {
                if (cfg.qk_norm) { a.q_act = arena.alloc<floatX>(N * qd); }
                mixer_scratch = std::max(mixer_scratch, nonapprox_backward_scratch_floats(B, T, cfg.n_head, (int)hd));
            }
            if (kind == AttnKind::Approximate) {
                mixer_scratch = std::max(mixer_scratch, taylor_backward_scratch_floats(B, T, cfg.n_head, cfg.taylor_norm));
            }
            if (kind == AttnKind::StaticEmbQK) {
                a.qk_in = arena.alloc<floatX>(N * d);
                a.qk_in_rstd = arena.alloc<float>(N);
            }
            a.attn_out = arena.alloc<floatX>(N * d);
            if (cfg.sandwich) {
                a.attn_out_normed = arena.alloc<floatX>(N * d);
                a.attn_out_rstd = arena.alloc<float>(N);
            }
            if (cfg.has_ffn()) {
                size_t ff = cfg.d_ff;
                a.x_mid = arena.alloc<floatX>(N * d);
                a.ffn_in = arena.alloc<floatX>(N * d);
                a.ffn_in_rstd = arena.alloc<float>(N);
                a.swiglu_gate = arena.alloc<floatX>(N * ff);
                a.swiglu_up = arena.alloc<floatX>(N * ff);
                a.swiglu_out = arena.alloc<floatX>(N * ff);
                a.ffn_out = arena.alloc<floatX>(N * d);
                if (cfg.sandwich) {
                    a.ffn_out_normed = arena.alloc<floatX>(N * d);
                    a.ffn_out_rstd = arena.alloc<float>(N);
                }
            }
        }
        xf = arena.alloc<floatX>(N * d);
        xf_rstd = arena.alloc<float>(N);
        d_doc_ids = arena.alloc<int>(N);
        d_branch = arena.alloc<floatX>(N * d);
        d_proj = arena.alloc<floatX>(N * d);
        d_block_in = arena.alloc<floatX>(N * d);
        d_o = arena.alloc<floatX>(N * qd);
        d_q = arena.alloc<floatX>(N * qd);
        d_k = arena.alloc<floatX>(N * kvd);
        d_v = arena.alloc<floatX>(N * kvd);
        d_qlin = arena.alloc<floatX>(N * qd);
        d_klin = arena.alloc<floatX>(N * kvd);
        if (cfg.has_kind(AttnKind::StaticEmbQK)) {
            d_qk_in = arena.alloc<floatX>(N * d);
            dx0 = arena.alloc<floatX>(N * d);
        }
        if (mixer_scratch > 0) { variant_scratch = arena.alloc<float>(mixer_scratch); }
        if (ff > 0) {
            d_swiglu_out = arena.alloc<floatX>(N * ff);
            d_swiglu_gate = arena.alloc<floatX>(N * ff);
            d_swiglu_up = arena.alloc<floatX>(N * ff);
        }
        size_t scratch_floats = std::max({norm_backward_scratch_floats((int)N, (int)d),
                                          norm_backward_scratch_floats((int)(N * cfg.n_head), (int)hd),
                                          N * cfg.n_head, (size_t)kReduceBlocks + 1});
        scratch = arena.alloc<float>(scratch_floats);
    }

    // ---- the fixed QK input (rndembqk, fixedseqqk): model state, not a parameter ------------
    // A fresh model's: rndembqk draws eps from the seed, fixedseqqk takes the first seq_len
    // tokens of the training data (`train_data`, the --train-data pattern).
    void init_fixed_input(uint64_t seed, const std::string& train_data) {
        if (!cfg.has_fixed_qk()) { return; }
        if (fixed.random) {
            fixed.draw(seed);
            upload_fixed_input();
        } else {
            fixed.take_first_tokens(train_data);
        }
    }
    void write_state(TensorFileWriter& w) const override {
        if (cfg.has_fixed_qk()) { fixed.write(w); }
    }
    void read_state(const TensorFileReader& r) override {
        if (!cfg.has_fixed_qk()) { return; }
        fixed.read(r);
        upload_fixed_input();
    }
    void upload_fixed_input() {
        if (fixed_eps == nullptr) { return; }
        std::vector<floatX> x(fixed.eps.size());
        for (size_t i = 0; i < x.size(); i++) { x[i] = from_float<floatX>(fixed.eps[i]); }
        cudaCheck(cudaMemcpy(fixed_eps, x.data(), x.size() * sizeof(floatX), cudaMemcpyHostToDevice));
    }
    // the fixed row runs when some layer reads it (not when --skip-nonstandard leaves them out)
    bool fixed_row_needed() const { return cfg.has_fixed_qk() && skip == SkipNonstandard::None; }

    // ---- loss bookkeeping (llmc/model.h, training.h) -------------------------------------
    // A target counts if it is >= 0 and, with the document mask, not the BOS of the next
    // document (doc/san-model.md, "Document mask and loss mask").
    bool counts_in_loss(int target) const { return target >= 0 && !(cfg.doc_mask && target == cfg.bos_id); }
    int doc_start_token() const { return cfg.doc_mask ? cfg.bos_id : -1; }
    double loss_value(const LossStats& s) const { return s.loss(cfg.z_loss); }
    double z_loss_coefficient() const { return cfg.z_loss; }
    const std::vector<int>& loss_targets() const { return host_targets_masked; }

    // ---- forward ------------------------------------------------------------------------
    // inputs, targets: host (Bn, Tn) token ids (targets < 0 are ignored). Computes the loss;
    // with dloss_scale != 0 also leaves d(loss * dloss_scale)/d logits for backward().
    // Returns the per-row statistics: the loss is their ce + z * lse_sq over the count;
    // row_losses, if given, receives each position's cross-entropy.
    // With `cache` (sampling): one position, Bn = Tn = 1, at cache->pos: its keys and values
    // go into the cache and its query attends over the cached rows (llmc/kv_cache.cuh).
    LossStats forward(const int* inputs, const int* targets, int Bn, int Tn, float dloss_scale,
                      std::vector<float>* row_losses = nullptr, KVCache* cache = nullptr) {
        // rndembqk, fixedseqqk: the fixed stream rides along as one more row after the Bn real
        // rows (row Bn), through every layer; it has no targets. --skip-nonstandard leaves out the
        // layers that read it, and so the row.
        const int F = fixed_row_needed() ? 1 : 0;
        if (F && cache != nullptr) { fatal("forward: a cached step has no fixed row (sample() recomputes the window)"); }
        begin_forward(Bn + F, Tn, dloss_scale, cache);
        fixed_row = F;
        const int Rn = Bn + F;  // rows through the layers
        const int Nh = Bn * Tn, N = Rn * Tn;  // positions of the real rows (head, loss), of every row (layers)
        const int d = cfg.n_embd, hd = cfg.head_dim(), Hq = cfg.n_head, Hkv = cfg.n_kv_head;
        const int qd = Hq * hd, kvd = Hkv * hd, ff = cfg.d_ff, V = cfg.vocab_size, Vp = cfg.padded_vocab();
        const float off = cfg.gain_offset();
        const ResidualMode mode = cfg.residual;

        // inputs, masked targets and document ids (the rules of doc/san-model.md); the fixed row
        // is one sequence (document id 0 throughout: causal, no document boundaries) and, for
        // fixedseqqk, its inputs are the fixed tokens
        std::vector<int> doc_ids(N, 0), masked(Nh), stream_inputs(inputs, inputs + Nh);
        int64_t count = 0;
        for (int b = 0; b < Bn; b++) {
            int doc = 0;
            for (int t = 0; t < Tn; t++) {
                int i = b * Tn + t;
                if (inputs[i] < 0 || inputs[i] >= V) { fatal("input token %d at (%d, %d) is outside the vocabulary of %d", inputs[i], b, t, V); }
                if (targets[i] >= V) { fatal("target token %d at (%d, %d) is outside the vocabulary of %d", targets[i], b, t, V); }
                doc += inputs[i] == cfg.bos_id;
                doc_ids[i] = doc;
                masked[i] = counts_in_loss(targets[i]) ? targets[i] : -1;
                count += masked[i] >= 0;
            }
        }
        const int pos = cache != nullptr ? cache->pos : 0;
        if (cache != nullptr) {  // the document id continues the cached positions'
            cache->next_doc += inputs[0] == cfg.bos_id;
            doc_ids[0] = cache->next_doc;
            cudaCheck(cudaMemcpy(cache->doc + pos, doc_ids.data(), sizeof(int), cudaMemcpyHostToDevice));
        }
        const bool fixed_tokens = F && cfg.attention == AttnKind::FixedSeqQK;
        if (fixed_tokens) { stream_inputs.insert(stream_inputs.end(), fixed.tokens.begin(), fixed.tokens.begin() + Tn); }
        const int embedded = fixed_tokens ? N : Nh;  // positions looked up in the embedding
        host_targets_masked = masked;
        cudaCheck(cudaMemcpy(d_inputs, stream_inputs.data(), embedded * sizeof(int), cudaMemcpyHostToDevice));
        cudaCheck(cudaMemcpy(d_targets, masked.data(), Nh * sizeof(int), cudaMemcpyHostToDevice));
        cudaCheck(cudaMemcpy(d_doc_ids, doc_ids.data(), N * sizeof(int), cudaMemcpyHostToDevice));
        // (with the document mask off, the fixed row's mask is causal like every row's)
        const int* doc = cfg.doc_mask ? d_doc_ids : nullptr;
        if (dloss_scale != 0.0f) { buckets.build(stream_inputs.data(), embedded, stream); }

        embedding_forward(residual[0], d_inputs, P.wte, embedded, d, std::sqrt((float)d), stream);
        if (F && !fixed_tokens) {  // rndembqk: the fixed row starts as eps (its first Tn positions)
            cudaCheck(cudaMemcpyAsync(residual[0] + (size_t)Nh * d, fixed_eps, (size_t)Tn * d * sizeof(floatX),
                                      cudaMemcpyDeviceToDevice, stream));
        }
        for (int l = 0; l < cfg.n_layer; l++) {
            const LayerTensors<floatX>& p = P.layers[l];
            LayerActivations& a = acts[l];
            floatX* x_in = residual[l];
            floatX* x_attn_out = cfg.has_ffn() ? a.x_mid : residual[l + 1];
            const AttnKind kind = cfg.kind(l);
            // --skip-nonstandard (evaluation): the variant's sub-layer, or its whole block, is left out
            const bool skipped = skip != SkipNonstandard::None && kind != AttnKind::Standard;
            if (skipped && skip == SkipNonstandard::Block) {
                cudaCheck(cudaMemcpyAsync(residual[l + 1], x_in, (size_t)N * d * sizeof(floatX),
                                          cudaMemcpyDeviceToDevice, stream));
                continue;
            }
            if (skipped) {
                cudaCheck(cudaMemcpyAsync(x_attn_out, x_in, (size_t)N * d * sizeof(floatX), cudaMemcpyDeviceToDevice,
                                          stream));
            } else {
                // attention block (or the variant of this layer: doc/deconstructing.md)
                norm_forward(a.attn_in, a.attn_in_rstd, x_in, p.attn_norm, N, d, off, kNormEps, stream);
                if (kind == AttnKind::Mlp) {  // no token mixing: a SwiGLU of the position's own input
                    const int m = cfg.mlp_width();
                    linear_forward(a.mlp_gate, a.attn_in, p.mlp_gate, N, d, m, stream);
                    linear_forward(a.mlp_up, a.attn_in, p.mlp_up, N, d, m, stream);
                    swiglu_forward(a.mlp_out, a.mlp_gate, a.mlp_up, (size_t)N * m, stream);
                    linear_forward(a.attn_out, a.mlp_out, p.mlp_down, N, m, d, stream);
                } else {
                    // keys and values: the activations, or with a cache its row `pos`
                    floatX* k = cache != nullptr ? cache->k[l] + (size_t)pos * kvd : a.k;
                    floatX* v = cache != nullptr ? cache->v[l] + (size_t)pos * kvd : a.v;
                    const float* rope_rows = rope + (size_t)pos * hd;  // the table from position pos on
                    // staticembqk: queries and keys from the embedding x0, through this layer's pre-norm
                    const floatX* qk_in = a.attn_in;
                    if (kind == AttnKind::StaticEmbQK) {
                        norm_forward(a.qk_in, a.qk_in_rstd, residual[0], p.attn_norm, N, d, off, kNormEps, stream);
                        qk_in = a.qk_in;
                    }
                    // rndembqk, fixedseqqk: only the fixed row computes its own q, k (rows r0 ..
                    // r0 + Rq - 1), which are then broadcast into the real rows; v from every row
                    const bool fixed_qk = is_fixed_qk(kind);
                    const int r0 = fixed_qk ? Bn : 0, Rq = fixed_qk ? 1 : Rn, Nq = Rq * Tn;
                    const size_t p0 = (size_t)r0 * Tn;  // first position of those rows
                    floatX* q = a.q + p0 * qd;
                    k += p0 * kvd;
                    linear_forward(a.q_lin + p0 * qd, qk_in + p0 * d, p.wq, Nq, d, qd, stream);
                    linear_forward(a.k_lin + p0 * kvd, qk_in + p0 * d, p.wk, Nq, d, kvd, stream);
                    linear_forward(v, a.attn_in, p.wv, N, d, kvd, stream);
                    if (kind == AttnKind::Nonapprox) {
                        // q = SiLU(attn_in W_q), then QK-norm; no RoPE: the score q[t].k[t] pairs a
                        // position with itself, and rotating both by one angle would change nothing
                        silu_forward(cfg.qk_norm ? a.q_act : a.q, a.q_lin, (size_t)N * qd, stream);
                        if (cfg.qk_norm) {
                            norm_forward(a.q, a.q_rstd, a.q_act, p.q_norm, N * Hq, hd, off, kNormEps, stream);
                            norm_forward(a.k, a.k_rstd, a.k_lin, p.k_norm, N * Hkv, hd, off, kNormEps, stream);
                        } else {
                            cudaCheck(cudaMemcpyAsync(a.k, a.k_lin, (size_t)N * kvd * sizeof(floatX),
                                                      cudaMemcpyDeviceToDevice, stream));
                        }
                        nonapprox_forward(a.o, a.lse, a.q, a.k, a.v, doc, Rn, Tn, Hq, Hkv, hd, stream);
                    } else {
                        if (cfg.qk_norm) {
                            norm_forward(q, a.q_rstd + p0 * Hq, a.q_lin + p0 * qd, p.q_norm, Nq * Hq, hd, off, kNormEps,
                                         stream);
                            norm_forward(k, a.k_rstd + p0 * Hkv, a.k_lin + p0 * kvd, p.k_norm, Nq * Hkv, hd, off,
                                         kNormEps, stream);
                            rope_forward(q, q, rope_rows, Rq, Tn, Hq, hd, stream);
                            rope_forward(k, k, rope_rows, Rq, Tn, Hkv, hd, stream);
                        } else {
                            rope_forward(q, a.q_lin + p0 * qd, rope_rows, Rq, Tn, Hq, hd, stream);
                            rope_forward(k, a.k_lin + p0 * kvd, rope_rows, Rq, Tn, Hkv, hd, stream);
                        }
                        if (fixed_qk) {  // every real row attends with the fixed row's q, k (its own mask)
                            broadcast_fixed_row(a.q, (size_t)Tn * qd, Bn, stream);
                            broadcast_fixed_row(a.k, (size_t)Tn * kvd, Bn, stream);
                        }
                        if (cache != nullptr) {  // (sample() caches standard and staticembqk layers only)
                            attention_decode(a.o, a.q, cache->k[l], cache->v[l], cfg.doc_mask ? cache->doc : nullptr,
                                             pos, Hq, Hkv, hd, stream);
                        } else if (kind == AttnKind::Approximate) {
                            taylor_attention_forward(a.o, a.lse, a.q, a.k, a.v, doc, Rn, Tn, Hq, Hkv, hd,
                                                     cfg.taylor_norm, stream);
                        } else {
                            attention_forward(a.o, a.lse, a.q, a.k, a.v, doc, Rn, Tn, Hq, Hkv, hd, stream);
                        }
                    }
                    linear_forward(a.attn_out, a.o, p.wo, N, qd, d, stream);
                }
                const floatX* branch = a.attn_out;
                if (cfg.sandwich) {
                    norm_forward(a.attn_out_normed, a.attn_out_rstd, a.attn_out, p.attn_post_norm, N, d, off, kNormEps,
                                 stream);
                    branch = a.attn_out_normed;
                }
                residual_forward(x_attn_out, x_in, branch, p.attn_gate, mode, (size_t)N * d, stream);
            }
            // FFN block (control arm)
            if (cfg.has_ffn()) {
                norm_forward(a.ffn_in, a.ffn_in_rstd, a.x_mid, p.ffn_norm, N, d, off, kNormEps, stream);
                linear_forward(a.swiglu_gate, a.ffn_in, p.w_gate, N, d, ff, stream);
                linear_forward(a.swiglu_up, a.ffn_in, p.w_up, N, d, ff, stream);
                swiglu_forward(a.swiglu_out, a.swiglu_gate, a.swiglu_up, (size_t)N * ff, stream);
                linear_forward(a.ffn_out, a.swiglu_out, p.w_down, N, ff, d, stream);
                const floatX* fbranch = a.ffn_out;
                if (cfg.sandwich) {
                    norm_forward(a.ffn_out_normed, a.ffn_out_rstd, a.ffn_out, p.ffn_post_norm, N, d, off, kNormEps, stream);
                    fbranch = a.ffn_out_normed;
                }
                residual_forward(residual[l + 1], a.x_mid, fbranch, p.ffn_gate, mode, (size_t)N * d, stream);
            }
        }
        // the head: the real rows (the first Nh positions; the fixed row has no targets)
        norm_forward(xf, xf_rstd, residual[cfg.n_layer], P.final_norm, Nh, d, off, kNormEps, stream);
        linear_forward(logits, xf, P.wte, Nh, d, Vp, stream);
        classifier_forward_backward(dloss_scale != 0.0f ? dlogits : (floatX*)nullptr, row_loss, row_lse_sq, logits,
                                    d_targets, Nh, V, Vp, (float)cfg.z_loss, dloss_scale, stream);

        std::vector<float> losses = copy_from_device(row_loss, Nh), lse_sq = copy_from_device(row_lse_sq, Nh);
        LossStats stats;
        for (int i = 0; i < Nh; i++) {
            stats.ce_sum += losses[i];
            stats.lse_sq_sum += lse_sq[i];
        }
        stats.count = count;
        if (row_losses != nullptr) { *row_losses = losses; }
        return stats;
    }

    // ---- backward -----------------------------------------------------------------------
    // Accumulates d(loss * dloss_scale)/d params into grads (zero them with zero_grad()),
    // for the batch of the last forward() that was given a non-zero dloss_scale.
    void backward() {
        if (skip != SkipNonstandard::None) { fatal("backward: --skip-nonstandard is for evaluation only"); }
        // rows: Bn real rows and, with rndembqk / fixedseqqk, the fixed row after them (row Bn)
        const int Rn = last_B, Bn = Rn - fixed_row, Tn = last_T, Nh = Bn * Tn, N = Rn * Tn;
        const int d = cfg.n_embd, hd = cfg.head_dim();
        const int Hq = cfg.n_head, Hkv = cfg.n_kv_head, qd = Hq * hd, kvd = Hkv * hd, ff = cfg.d_ff;
        const int Vp = cfg.padded_vocab();
        const float off = cfg.gain_offset();
        const ResidualMode mode = cfg.residual;
        const int* doc = cfg.doc_mask ? d_doc_ids : nullptr;
        const size_t Nd = (size_t)N * d;

        // LM head (tied embedding) and final norm: the real rows (the fixed row's stream gradient
        // starts at 0: it has no loss, only the q, k paths of the variant layers below)
        linear_backward_weight(G.wte, dlogits, xf, Nh, d, Vp, stream);
        linear_backward_input(dxf, dlogits, P.wte, Nh, d, Vp, false, stream);
        cudaCheck(cudaMemsetAsync(dx, 0, Nd * sizeof(floatX), stream));
        norm_backward(dx, G.final_norm, scratch, dxf, residual[cfg.n_layer], P.final_norm, xf_rstd, Nh, d, off, stream);
        if (dx0 != nullptr) { cudaCheck(cudaMemsetAsync(dx0, 0, Nd * sizeof(floatX), stream)); }

        // Gradient of one residual branch: dx holds dL/d(x_out). Leaves dL/d(branch output
        // before the sandwich norm) in the returned buffer and clears dx for mode `none`.
        auto branch_backward = [&](const floatX* branch_out, const floatX* pre_norm, const float* post_rstd,
                                   const floatX* post_gain, floatX* post_dgain, const floatX* gate, floatX* dgate) {
            residual_backward(d_branch, dgate, scratch, dx, branch_out, gate, mode, Nd, stream);
            if (mode == ResidualMode::None) { cudaCheck(cudaMemsetAsync(dx, 0, Nd * sizeof(floatX), stream)); }
            if (!cfg.sandwich) { return d_branch; }
            cudaCheck(cudaMemsetAsync(d_proj, 0, Nd * sizeof(floatX), stream));
            norm_backward(d_proj, post_dgain, scratch, d_branch, pre_norm, post_gain, post_rstd, N, d, off, stream);
            return d_proj;
        };

        for (int l = cfg.n_layer - 1; l >= 0; l--) {
            // layer l + 1's gradients are final: their reduction may start (--overlap-reduce)
            if (l + 1 < cfg.n_layer) { layer_gradients_done(l + 1); }
            const LayerTensors<floatX>& p = P.layers[l];
            const LayerTensors<floatX>& g = G.layers[l];
            LayerActivations& a = acts[l];
            if (cfg.has_ffn()) {
                floatX* d_ffn_out = branch_backward(cfg.sandwich ? a.ffn_out_normed : a.ffn_out, a.ffn_out,
                                                    a.ffn_out_rstd, p.ffn_post_norm, g.ffn_post_norm, p.ffn_gate, g.ffn_gate);
                linear_backward_weight(g.w_down, d_ffn_out, a.swiglu_out, N, ff, d, stream);
                linear_backward_input(d_swiglu_out, d_ffn_out, p.w_down, N, ff, d, false, stream);
                swiglu_backward(d_swiglu_gate, d_swiglu_up, d_swiglu_out, a.swiglu_gate, a.swiglu_up, (size_t)N * ff,
                                stream);
                linear_backward_weight(g.w_gate, d_swiglu_gate, a.ffn_in, N, d, ff, stream);
                linear_backward_weight(g.w_up, d_swiglu_up, a.ffn_in, N, d, ff, stream);
                linear_backward_input(d_block_in, d_swiglu_gate, p.w_gate, N, d, ff, false, stream);
                linear_backward_input(d_block_in, d_swiglu_up, p.w_up, N, d, ff, true, stream);
                norm_backward(dx, g.ffn_norm, scratch, d_block_in, a.x_mid, p.ffn_norm, a.ffn_in_rstd, N, d, off, stream);
            }
            floatX* d_attn_out = branch_backward(cfg.sandwich ? a.attn_out_normed : a.attn_out, a.attn_out,
                                                 a.attn_out_rstd, p.attn_post_norm, g.attn_post_norm, p.attn_gate, g.attn_gate);
            const AttnKind kind = cfg.kind(l);
            if (kind == AttnKind::Mlp) {
                const int m = cfg.mlp_width();
                linear_backward_weight(g.mlp_down, d_attn_out, a.mlp_out, N, m, d, stream);
                linear_backward_input(d_swiglu_out, d_attn_out, p.mlp_down, N, m, d, false, stream);
                swiglu_backward(d_swiglu_gate, d_swiglu_up, d_swiglu_out, a.mlp_gate, a.mlp_up, (size_t)N * m, stream);
                linear_backward_weight(g.mlp_gate, d_swiglu_gate, a.attn_in, N, d, m, stream);
                linear_backward_weight(g.mlp_up, d_swiglu_up, a.attn_in, N, d, m, stream);
                linear_backward_input(d_block_in, d_swiglu_gate, p.mlp_gate, N, d, m, false, stream);
                linear_backward_input(d_block_in, d_swiglu_up, p.mlp_up, N, d, m, true, stream);
                norm_backward(dx, g.attn_norm, scratch, d_block_in, residual[l], p.attn_norm, a.attn_in_rstd, N, d, off,
                              stream);
                continue;
            }
            linear_backward_weight(g.wo, d_attn_out, a.o, N, qd, d, stream);
            linear_backward_input(d_o, d_attn_out, p.wo, N, qd, d, false, stream);
            if (kind == AttnKind::Nonapprox) {  // (no RoPE)
                nonapprox_backward(d_q, d_k, d_v, variant_scratch, d_o, a.o, a.q, a.k, a.v, a.lse, doc, Rn, Tn, Hq, Hkv,
                                   hd, stream);
            }
            // rndembqk, fixedseqqk: the real rows' q, k were the fixed row's (broadcast), so their
            // dq, dk join the fixed row's own; from here on only the fixed row's q, k path runs
            // (rows r0 .. r0 + Rq - 1; every row for the other kinds)
            const bool fixed_qk = is_fixed_qk(kind);
            const int r0 = fixed_qk ? Bn : 0, Rq = fixed_qk ? 1 : Rn, Nq = Rq * Tn;
            const size_t p0 = (size_t)r0 * Tn;
            floatX* dq = d_q + p0 * qd;
            floatX* dk = d_k + p0 * kvd;
            if (kind != AttnKind::Nonapprox) {
                if (kind == AttnKind::Approximate) {
                    taylor_attention_backward(d_q, d_k, d_v, variant_scratch, d_o, a.o, a.q, a.k, a.v, a.lse, doc, Rn,
                                              Tn, Hq, Hkv, hd, cfg.taylor_norm, stream);
                } else {
                    attention_backward(d_q, d_k, d_v, scratch, d_o, a.o, a.q, a.k, a.v, a.lse, doc, Rn, Tn, Hq, Hkv, hd,
                                       stream);
                }
                if (fixed_qk) {
                    sum_rows_into_fixed(d_q, (size_t)Tn * qd, Bn, stream);
                    sum_rows_into_fixed(d_k, (size_t)Tn * kvd, Bn, stream);
                }
                rope_backward(dq, dq, rope, Rq, Tn, Hq, hd, stream);
                rope_backward(dk, dk, rope, Rq, Tn, Hkv, hd, stream);
            }
            floatX* dq_lin = dq;
            floatX* dk_lin = dk;
            if (cfg.qk_norm) {
                dq_lin = d_qlin + p0 * qd;
                dk_lin = d_klin + p0 * kvd;
                cudaCheck(cudaMemsetAsync(dq_lin, 0, (size_t)Nq * qd * sizeof(floatX), stream));
                cudaCheck(cudaMemsetAsync(dk_lin, 0, (size_t)Nq * kvd * sizeof(floatX), stream));
                norm_backward(dq_lin, g.q_norm, scratch, dq, (kind == AttnKind::Nonapprox ? a.q_act : a.q_lin) + p0 * qd,
                              p.q_norm, a.q_rstd + p0 * Hq, Nq * Hq, hd, off, stream);
                norm_backward(dk_lin, g.k_norm, scratch, dk, a.k_lin + p0 * kvd, p.k_norm, a.k_rstd + p0 * Hkv, Nq * Hkv,
                              hd, off, stream);
            }
            if (kind == AttnKind::Nonapprox) {  // through q = SiLU(q_lin), in place
                silu_backward(dq_lin, dq_lin, a.q_lin, (size_t)N * qd, stream);
            }
            // staticembqk: q and k came from qk_in = norm(x0): their gradient goes to x0 (dx0)
            const floatX* qk_in = (kind == AttnKind::StaticEmbQK ? a.qk_in : a.attn_in) + p0 * d;
            floatX* d_qk = (kind == AttnKind::StaticEmbQK ? d_qk_in : d_block_in) + p0 * d;
            linear_backward_weight(g.wq, dq_lin, qk_in, Nq, d, qd, stream);
            linear_backward_weight(g.wk, dk_lin, qk_in, Nq, d, kvd, stream);
            linear_backward_weight(g.wv, d_v, a.attn_in, N, d, kvd, stream);
            if (fixed_qk) {  // the real rows' input reaches only v; the fixed row's also q and k
                linear_backward_input(d_block_in, d_v, p.wv, N, d, kvd, false, stream);
                linear_backward_input(d_qk, dq_lin, p.wq, Nq, d, qd, true, stream);
                linear_backward_input(d_qk, dk_lin, p.wk, Nq, d, kvd, true, stream);
            } else {
                linear_backward_input(d_qk, dq_lin, p.wq, N, d, qd, false, stream);
                linear_backward_input(d_qk, dk_lin, p.wk, N, d, kvd, true, stream);
                linear_backward_input(d_block_in, d_v, p.wv, N, d, kvd, kind != AttnKind::StaticEmbQK, stream);
            }
            if (kind == AttnKind::StaticEmbQK) {
                norm_backward(dx0, g.attn_norm, scratch, d_qk_in, residual[0], p.attn_norm, a.qk_in_rstd, N, d, off,
                              stream);
            }
            norm_backward(dx, g.attn_norm, scratch, d_block_in, residual[l], p.attn_norm, a.attn_in_rstd, N, d, off, stream);
        }
        layer_gradients_done(0);
        if (dx0 != nullptr) {  // the staticembqk layers' path to the embedding joins the stream's
            residual_forward(dx, dx, dx0, nullptr, ResidualMode::Standard, Nd, stream);
        }
        embedding_backward(G.wte, dx, buckets, d, std::sqrt((float)d), stream);
    }

    // ---- measurements (logged at every validation; llmc/evaluation.h LayerMeasurements) --
    // The residual gates come from the parameters; one forward pass over Bn rows of Tn
    // tokens gives the effective rank of the residual stream after each layer
    // (llmc/spectrum.h) and the largest |q . k| / sqrt(hd) over the (query, key) pairs the
    // attention mask lets a query see (the input of exp, or of the Taylor polynomial; for
    // nonapprox each position's own q[t].k[t]; mlp and skipped layers have none and log 0). On
    // the host, in double: a measurement, not a hot path.
    LayerMeasurements measure(const int* inputs, int Bn, int Tn) {
        LayerMeasurements m;
        const ResidualMode mode = cfg.residual;
        // the fp32 values (master weights in bf16 builds; gathered when ZeRO-1 shards them,
        // so every rank measures)
        const std::vector<float> values = residual_has_gate(mode) ? laid_out_parameters() : std::vector<float>();
        auto gate_value = [&](const floatX* gate) {
            double g = values[(size_t)(gate - params)];
            return mode == ResidualMode::Gated ? 1.0 / (1.0 + std::exp(-g)) : g;
        };
        if (residual_has_gate(mode)) {
            for (const LayerTensors<floatX>& p : P.layers) {
                m.attn_gate.push_back(gate_value(p.attn_gate));
                if (cfg.has_ffn()) { m.ffn_gate.push_back(gate_value(p.ffn_gate)); }
            }
        }
        if (Bn <= 0 || Tn <= 0) { return m; }
        const int N = Bn * Tn, d = cfg.n_embd, hd = cfg.head_dim(), Hq = cfg.n_head, Hkv = cfg.n_kv_head;
        std::vector<int> no_targets(N, -1);
        forward(inputs, no_targets.data(), Bn, Tn, 0.0f);
        std::vector<int> doc = copy_from_device(d_doc_ids, N);
        const double scale = 1.0 / std::sqrt((double)hd);
        for (int l = 0; l < cfg.n_layer; l++) {
            std::vector<float> h = to_floats(copy_from_device(residual[l + 1], (size_t)N * d));
            m.erank.push_back(effective_rank(h, N, d));
            const AttnKind kind = cfg.kind(l);
            if (kind == AttnKind::Mlp || (skip != SkipNonstandard::None && kind != AttnKind::Standard)) {
                m.max_logit.push_back(0.0);
                continue;
            }
            std::vector<float> q = to_floats(copy_from_device(acts[l].q, (size_t)N * Hq * hd));
            std::vector<float> k = to_floats(copy_from_device(acts[l].k, (size_t)N * Hkv * hd));
            double largest = 0.0;
            for (int b = 0; b < Bn; b++) {
                for (int h = 0; h < Hq; h++) {
                    int j = h / (Hq / Hkv);
                    for (int t = 0; t < Tn; t++) {
                        const float* qt = &q[(((size_t)b * Tn + t) * Hq + h) * hd];
                        for (int tau = kind == AttnKind::Nonapprox ? t : 0; tau <= t; tau++) {
                            if (cfg.doc_mask && doc[b * Tn + tau] != doc[b * Tn + t]) { continue; }
                            const float* kt = &k[(((size_t)b * Tn + tau) * Hkv + j) * hd];
                            double dot = 0.0;
                            for (int c = 0; c < hd; c++) { dot += (double)qt[c] * kt[c]; }
                            largest = std::max(largest, std::fabs(dot) * scale);
                        }
                    }
                }
            }
            m.max_logit.push_back(largest);
        }
        return m;
    }
};

// Sampling (llmc/model.h), found instead of model.h's template by argument-dependent lookup:
// the cached step runs standard attention (llmc/kv_cache.cuh), so a model with approximate,
// nonapprox, rndembqk or fixedseqqk layers (the last two need the fixed row beside every step's
// queries) recomputes the window for every token instead.
std::vector<int> sample(SAN& model, std::vector<int> tokens, int n, float temperature, std::mt19937_64& rng,
                        bool use_cache = true) {
    const SANConfig& c = model.cfg;
    use_cache = use_cache && !c.has_kind(AttnKind::Approximate) && !c.has_kind(AttnKind::Nonapprox) && !c.has_fixed_qk();
    return sample_tokens(model, model.kv, model.T, c.padded_vocab(), c.vocab_size, c.bos_id, c.n_layer, c.kv_width(),
                         model.logits, std::move(tokens), n, temperature, rng, use_cache);
}

// ========================================================================================
// command line and main (the sequence: llmc/trainer.h)

struct Options {
    std::string preset = "tiny";
    SANConfig model;
    int paper_setup = 0;
    int deconstructing_setup = 0;
    std::string skip_nonstandard = "none";  // not model config: an evaluation of a trained model
    TrainOptions train = [] {
        TrainOptions t;
        t.opt.optimizer = OptimizerKind::Muon;  // the paper's optimizer, and train_san.py's default
        return t;
    }();
};

// --paper-setup 1: the SAN paper's reference recipe (its code, run on 8 devices at 64 rows
// each) as defaults that explicit flags override: a global batch of 512 rows, rates scaled
// as for 8 devices (AdamW x 8, Muon x sqrt(8)), Muon in the paper's order, Newton-Schulz and
// gradient accumulation in fp32, WSD 5% / 15% / 0.05, milestone checkpoints.
void apply_paper_setup(TrainOptions& t) {
    t.global_batch = 512;
    t.lr_scale_gpus = 8;
    t.opt.optimizer = OptimizerKind::Muon;
    t.opt.muon_order = MuonOrder::Paper;
    t.opt.ns_fp32 = 1;
    t.grad_fp32 = 1;
    t.opt.schedule.kind = ScheduleKind::WSD;
    t.opt.schedule.warmup_frac = 0.05;
    t.opt.schedule.decay_frac = 0.15;
    t.opt.schedule.final_frac = 0.05;
    t.milestones = 1;
}
// the settings --paper-setup sets count as given (a resume compares them)
constexpr const char* kPaperSetupFlags[] = {"--global-batch", "--lr-scale-gpus", "--optimizer", "--muon-order", "--ns-fp32",
                                            "--grad-fp32", "--schedule", "--warmup-frac", "--decay-frac", "--final-frac"};

// --deconstructing-setup 1: the recipe of "Deconstructing Attention" as defaults that explicit
// flags override: AdamW (beta2 0.9999, the paper's Table 9) at peak 4e-4 (every group), weight
// decay 0.1 (matrices, as always here),
// clip 1.0, 256 rows per step, cosine to 0.1x after 2000 warmup steps: the warmup fraction is
// 2000 / steps (at most 1), from --steps as given. (The paper states no final rate: 0.1x is
// this project's choice, doc/deconstructing.md.)
void apply_deconstructing_setup(TrainOptions& t, long steps) {
    t.global_batch = 256;
    t.opt.optimizer = OptimizerKind::AdamW;
    t.opt.beta2 = 0.9999;
    t.opt.lr = 4e-4;
    t.opt.weight_decay = 0.1;
    t.opt.grad_clip = 1.0;
    t.opt.schedule.kind = ScheduleKind::Cosine;
    t.opt.schedule.warmup_frac = std::min(1.0, 2000.0 / (double)std::max(1L, steps));
    t.opt.schedule.final_frac = 0.1;
}
constexpr const char* kDeconstructingSetupFlags[] = {"--global-batch", "--optimizer", "--beta2", "--lr", "--weight-decay",
                                                     "--grad-clip", "--schedule", "--warmup-frac", "--final-frac"};

std::vector<Flag> make_flags(Options& o) {
    SANConfig& m = o.model;
    std::vector<Flag> flags = ModelDims::flags(
        &o.preset, m, "model preset: tiny, tiny-ffn, demo, san20, ffn20 (iso-depth), ffn4 (iso-param), ffn9 (iso-FLOP); Deconstructing Attention's qwen-70m, qwen-160m, qwen-500m, qwen3-1.7b and the CPU-sized qwen-cpu, qwen3-cpu; the flags below override it",
        "model context T (RoPE table size)", "query heads", "token that starts a document (default: the tokenizer's)");
    std::vector<Flag> san = {
        make_flag("--n-kv-head", &m.n_kv_head, "kv heads (GQA; = n-head is MHA)"),
        make_flag("--ffn", &m.ffn, kFfnKinds, "none: SAN; swiglu: FFN control arm"),
        make_flag("--d-ff", &m.d_ff, "SwiGLU width (0: 4 d)"),
        make_flag("--norm", &m.norm, kNormKinds, ""),
        make_flag("--qk-norm", &m.qk_norm, "per-head QK-norm 0|1"),
        make_flag("--residual", &m.residual, kResidualModes, ""),
        make_flag("--sandwich", &m.sandwich, "sandwich norm on sub-layer outputs 0|1"),
        make_flag("--rope-theta", &m.rope_theta, "RoPE base"),
        make_flag("--doc-mask", &m.doc_mask, "same-document attention and boundary-target masking 0|1"),
        make_flag("--z-loss", &m.z_loss, "z-loss coefficient"),
        make_flag("--attention", &m.attention, kAttnKinds, "kind of the layers the layout does not keep standard (doc/deconstructing.md; rndembqk: q, k from a fixed random input run through the model; fixedseqqk: from the first seq_len tokens of --train-data)"),
        make_flag("--layout", &m.layout, "layers that keep standard attention: uniform (none), hybrid, even, odd, top-simple, middle-simple, bottom-simple, quarter, first, last, bilateral, or a list like 1,24"),
        make_flag("--taylor-norm", &m.taylor_norm, kTaylorNorms, "approximate: Based's joint feature map, or the paper's separately normalised terms"),
        make_flag("--skip-nonstandard", &o.skip_nonstandard, "evaluation (--steps 0 --init-from CKPT): none | attention (leave out the non-standard attention sub-layers) | block (their whole blocks)"),
        make_flag("--paper-setup", &o.paper_setup, "1: the SAN paper's recipe as defaults (doc/san-model.md \"Paper setup\"); flags given win"),
        make_flag("--deconstructing-setup", &o.deconstructing_setup, "1: Deconstructing Attention's recipe as defaults (doc/deconstructing.md \"Recipe\"); flags given win"),
    };
    flags.insert(flags.end(), san.begin(), san.end());
    add_training_flags(flags, o.train);
    return flags;
}

// --skip-nonstandard: checked against what it needs (an evaluation of a model with variants)
SkipNonstandard parse_skip_nonstandard(const std::string& value, const SANConfig& c, const TrainOptions& t) {
    if (value == "none") { return SkipNonstandard::None; }
    if (value != "attention" && value != "block") {
        fatal("--skip-nonstandard must be none, attention or block, not '%s'", value.c_str());
    }
    if (t.steps != 0 || t.init_from.empty()) {
        fatal("--skip-nonstandard evaluates a trained model: give --steps 0 --init-from CKPT");
    }
    bool any = false;
    for (AttnKind k : c.kinds) { any = any || k != AttnKind::Standard; }
    if (!any) { fatal("--skip-nonstandard %s: the model has standard attention in every layer", value.c_str()); }
    printf("evaluation without the non-standard layers' %s (--skip-nonstandard)\n",
           value == "block" ? "blocks" : "attention sub-layers");
    return value == "block" ? SkipNonstandard::Block : SkipNonstandard::Attention;
}

// What llmc/trainer.h asks of this trainer.
struct SANTrainer {
    using Model = SAN;
    static void set_defaults(Options& o, int argc, char** argv) {
        std::string paper = find_flag_value(argc, argv, "--paper-setup");
        if (!paper.empty() && paper != "0" && paper != "1") { fatal("option --paper-setup: must be 0 or 1, not '%s'", paper.c_str()); }
        if (paper == "1") {
            apply_paper_setup(o.train);
            o.train.given.insert(std::begin(kPaperSetupFlags), std::end(kPaperSetupFlags));
        }
        std::string recipe = find_flag_value(argc, argv, "--deconstructing-setup");
        if (!recipe.empty() && recipe != "0" && recipe != "1") {
            fatal("option --deconstructing-setup: must be 0 or 1, not '%s'", recipe.c_str());
        }
        if (recipe == "1") {
            if (paper == "1") { fatal("--paper-setup 1 and --deconstructing-setup 1 are two recipes: give one"); }
            std::string steps = find_flag_value(argc, argv, "--steps");
            char* end = nullptr;
            long n = steps.empty() ? o.train.steps : std::strtol(steps.c_str(), &end, 10);
            apply_deconstructing_setup(o.train, n > 0 ? n : 1);
            o.train.given.insert(std::begin(kDeconstructingSetupFlags), std::end(kDeconstructingSetupFlags));
        }
    }
    static bool start_elsewhere(Options&, bool) { return false; }
    static DefaultRates default_rates(const SANConfig& c) { return ::default_rates(c); }
    static void print_model(const Options& o) {
        const SANConfig& c = o.model;
        printf("model: L=%d d=%d heads %d/%d (head_dim %d) ffn=%s", c.n_layer, c.n_embd, c.n_head, c.n_kv_head,
               c.head_dim(), kFfnKinds.name(c.ffn));
        if (c.has_ffn()) { printf(" d_ff=%d", c.d_ff); }
        printf(" norm=%s qk_norm=%d residual=%s sandwich=%d rope_theta=%g doc_mask=%d z_loss=%g\n", kNormKinds.name(c.norm),
               c.qk_norm, kResidualModes.name(c.residual), c.sandwich, c.rope_theta, c.doc_mask, c.z_loss);
        printf("%s\n", describe_attention(c).c_str());
        printf("vocab %d (padded %d), context %d, bos %d\n", c.vocab_size, c.padded_vocab(), c.seq_len, c.bos_id);
        if (o.paper_setup) { printf("recipe: the SAN paper's setup (--paper-setup 1), with the flags given on top\n"); }
        if (o.deconstructing_setup) {
            printf("recipe: Deconstructing Attention's setup (--deconstructing-setup 1), with the flags given on top\n");
        }
    }
    static void init_parameters(SAN& model, const Options& o) {
        model.init_parameters(o.train.seed);
        model.init_fixed_input(o.train.seed, o.train.train_data);
    }
    // settings of this run that are not model config (llmc/trainer.h calls it once the model is built)
    static void configure_model(SAN& model, const Options& o) {
        model.skip = parse_skip_nonstandard(o.skip_nonstandard, o.model, o.train);
    }
};

#ifndef TESTING
int main(int argc, char** argv) { return trainer_main<SANTrainer>(argc, argv, "train_san", presets(), make_flags, read_config); }
#endif
