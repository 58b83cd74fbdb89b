/*
train_gpt2.cu: trains the GPT-2 baseline (doc/gpt2.md): learned token and position
embeddings, pre-LayerNorm blocks (LayerNorm with bias), multi-head causal attention with a
fused qkv projection, a tanh-GELU MLP of width 4d, biases on every linear layer, a final
LayerNorm and the LM head tied to the token embedding.

Reads top to bottom: config -> parameters -> activations -> the model (forward, backward)
-> llm.c's model files -> command line -> main, which hands the run to llmc/train/
(trainer.h: main's set-up; training.h: the loop; run_outputs.h: its files). The kernels live
in llmc/ and are the SAN trainer's where the two models agree (attention, GEMM, embedding,
classifier, residual add, AdamW); GPT-2's own pieces are llmc/kernels/layernorm.cuh,
gelu.cuh, bias.cuh and position.cuh. Built by nvcc for the GPU and by g++ for the host backend from this one
source; `test_gpt2.cu` includes this file with TESTING defined and checks it against the
PyTorch reference train_gpt2.py.

    make && ./train_gpt2 -h
*/
#include <cinttypes>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "llmc/utils.h"
#include "llmc/cuda_common.h"
#include "llmc/kernels/gemm.cuh"
#include "llmc/kernels/embedding.cuh"
#include "llmc/kernels/position.cuh"
#include "llmc/kernels/layernorm.cuh"  // defines: LayerNorm
#include "llmc/kernels/bias.cuh"
#include "llmc/kernels/attention.cuh"
#include "llmc/kernels/kv_cache.cuh"
#include "llmc/kernels/gelu.cuh"
#include "llmc/kernels/residual.cuh"
#include "llmc/kernels/residual_norm.cuh"  // defines: residual_layernorm_forward (a residual add + the next LayerNorm)
#include "llmc/kernels/classifier.cuh"
#include "llmc/model/parameters.h"     // ModelParameters: parameters, gradients, optimizer
#include "llmc/train/preset_files.h"   // compiled_config_files: presets/gpt2/NAME.conf
#include "llmc/train/trainer.h"        // trainer_main: main's sequence, run_training; model.h: counts, sample

constexpr float kLayerNormEps = 1e-5f;
constexpr float kInitStd = 0.02f;

// ========================================================================================
// config

// The sizes (vocabulary, context T = rows of wpe, layers, width, heads, BOS: GPT-2 BPE 50256)
// are ModelDims' (llmc/model/model.h); GPT-2 has no other settings.
struct GPT2Config : ModelDims {
    int kv_width() const { return n_embd; }
    int64_t embedding_numel() const { return ((int64_t)padded_vocab() + seq_len) * n_embd; }  // wte and wpe

    void resolve_and_check() const {
        auto require = [](bool ok, const char* what) {
            if (!ok) { fatal("bad model config: %s", what); }
        };
        check_dims();
        require(head_dim() <= 128, "head_dim = n_embd / n_head must be at most 128");
    }
};

// The model's flags (every setting of GPT2Config), after --preset: what a preset file sets.
std::vector<Flag> model_flags(std::string* preset, GPT2Config& m) {
    return ModelDims::flags(
        preset, m, preset_flag_help("presets/gpt2/"),
        "model context T (rows of the position embedding)", "attention heads", "token that starts a sample (default: the tokenizer's)");
}

// The presets: presets/gpt2/NAME.conf, compiled in (llmc/train/preset_files.h), each setting every
// model flag (attnref/gpt2.py reads the same files).
std::map<std::string, GPT2Config> presets() {
    std::map<std::string, GPT2Config> out;
    for (const ConfigFile* f : compiled_config_files_in("presets/gpt2/")) {
        GPT2Config c;
        std::string unused;
        std::vector<Flag> flags = model_flags(&unused, c);
        flags.erase(flags.begin());  // --preset: a preset does not name another
        read_model_preset(*f, flags, "train_gpt2");
        out[f->name()] = c;
    }
    return out;
}

void write_config(TensorFileWriter& w, const GPT2Config& c) {
    w.set("model", std::string("gpt2"));
    c.write_dims(w);
}

GPT2Config read_config(const TensorFileReader& r) {
    if (!r.has_key("model") || r.str("model") != "gpt2") {
        r.fail("is not a GPT-2 checkpoint (config key model=%s): it belongs to train_san, not train_gpt2",
               r.has_key("model") ? r.str("model").c_str() : "<missing>, as in SAN checkpoints");
    }
    GPT2Config c;
    c.read_dims(r);
    c.resolve_and_check();
    c.check_derived(r);
    return c;
}

// ========================================================================================
// parameters: one contiguous buffer, tensors in the canonical order of doc/formats.md
// "GPT-2 checkpoints"; weights in PyTorch (out, in) layout

// Per-layer tensors in canonical order: name, shape in units of d (rows, cols; cols 0 = 1-D),
// matrix group, init (std in units of kInitStd, or a constant)
struct LayerField {
    const char* name;
    int rows, cols;  // multiples of d
    bool matrix;
    bool residual_projection;  // std kInitStd / sqrt(2 L)
    float value;               // constant init of 1-D tensors
};
constexpr LayerField kLayerFields[] = {
    {"ln_1.weight", 1, 0, false, false, 1.0f},       {"ln_1.bias", 1, 0, false, false, 0.0f},
    {"attn.c_attn.weight", 3, 1, true, false, 0.0f}, {"attn.c_attn.bias", 3, 0, false, false, 0.0f},
    {"attn.c_proj.weight", 1, 1, true, true, 0.0f},  {"attn.c_proj.bias", 1, 0, false, false, 0.0f},
    {"ln_2.weight", 1, 0, false, false, 1.0f},       {"ln_2.bias", 1, 0, false, false, 0.0f},
    {"mlp.c_fc.weight", 4, 1, true, false, 0.0f},    {"mlp.c_fc.bias", 4, 0, false, false, 0.0f},
    {"mlp.c_proj.weight", 1, 4, true, true, 0.0f},   {"mlp.c_proj.bias", 1, 0, false, false, 0.0f},
};
constexpr int kNumLayerFields = sizeof(kLayerFields) / sizeof(kLayerFields[0]);

std::vector<ParamSpec> parameter_spec(const GPT2Config& c) {
    int64_t d = c.n_embd;
    float out_std = kInitStd / std::sqrt(2.0f * c.n_layer);
    std::vector<ParamSpec> spec;
    spec.push_back({"wte", {c.padded_vocab(), d}, false, kInitStd, 0.0f, c.vocab_size});
    spec.push_back({"wpe", {c.seq_len, d}, false, kInitStd, 0.0f});
    for (int l = 0; l < c.n_layer; l++) {
        for (const LayerField& f : kLayerFields) {
            std::vector<int64_t> shape = f.cols == 0 ? std::vector<int64_t>{f.rows * d} : std::vector<int64_t>{f.rows * d, f.cols * d};
            float std_dev = f.matrix ? (f.residual_projection ? out_std : kInitStd) : 0.0f;
            spec.push_back({"layers." + std::to_string(l) + "." + f.name, shape, f.matrix, std_dev, f.value});
        }
    }
    spec.push_back({"ln_f.weight", {d}, false, 0.0f, 1.0f});
    spec.push_back({"ln_f.bias", {d}, false, 0.0f, 0.0f});
    return spec;
}

// Pointers to the tensors inside a buffer laid out by parameter_spec (parameters or
// gradients), in the order of kLayerFields.
template <typename T>
struct LayerTensors {
    T *ln1w, *ln1b, *qkvw, *qkvb, *attprojw, *attprojb, *ln2w, *ln2b, *fcw, *fcb, *fcprojw, *fcprojb;
};
template <typename T>
struct ModelTensors {
    T *wte = nullptr, *wpe = nullptr, *lnfw = nullptr, *lnfb = nullptr;
    std::vector<LayerTensors<T>> layers;

    // spec: laid out (ModelParameters::spec), so that each tensor sits at base + its offset
    void point_into(T* base, const std::vector<ParamSpec>& spec, const GPT2Config& c) {
        std::vector<T*> ptrs;
        for (const ParamSpec& s : spec) { ptrs.push_back(base + s.offset); }
        wte = ptrs[0];
        wpe = ptrs[1];
        layers.resize(c.n_layer);
        for (int l = 0; l < c.n_layer; l++) {
            T** f = &ptrs[2 + (size_t)l * kNumLayerFields];
            layers[l] = LayerTensors<T>{f[0], f[1], f[2], f[3], f[4], f[5], f[6], f[7], f[8], f[9], f[10], f[11]};
        }
        lnfw = ptrs[ptrs.size() - 2];
        lnfb = ptrs[ptrs.size() - 1];
    }
};

// ========================================================================================
// activations: everything the backward pass needs, for B x T positions

struct LayerActivations {
    floatX *ln1, *q, *k, *v, *o, *x_mid, *ln2, *fc, *gelu;
    float *ln1_mean, *ln1_rstd, *lse, *ln2_mean, *ln2_rstd;
};

// ========================================================================================
// the model

// The model: its parameters, gradients and optimizer, the residual stream, logits and loss
// buffers (llmc/model/model.h LanguageModel) and, for B rows of T positions, the activations and
// scratch of forward and backward.
struct GPT2 : LanguageModel<GPT2Config> {
    ModelTensors<floatX> P, G;

    // activations
    std::vector<LayerActivations> acts;
    floatX* branch = nullptr;  // output of the current sub-layer before it joins the stream (N, d)
    floatX* xf = nullptr;
    float *lnf_mean = nullptr, *lnf_rstd = nullptr;
    // backward scratch
    floatX *d_ln = nullptr, *d_o = nullptr, *d_q = nullptr, *d_k = nullptr,
           *d_v = nullptr, *d_fc = nullptr;
    float* scratch = nullptr;
    std::vector<int> host_targets;

    GPT2(const GPT2Config& config, int batch, int seq) : LanguageModel(config, batch, seq) {
        P.point_into(params, spec, cfg);
        G.point_into(grads, spec, cfg);
        allocate_activations();
    }

    void allocate_activations() {
        size_t N = (size_t)B * T, d = cfg.n_embd, H = cfg.n_head;
        acts.resize(cfg.n_layer);
        for (LayerActivations& a : acts) {  // grouped by size
            for (floatX** p : {&a.ln1, &a.q, &a.k, &a.v, &a.o, &a.x_mid, &a.ln2}) { *p = arena.alloc<floatX>(N * d); }
            for (floatX** p : {&a.fc, &a.gelu}) { *p = arena.alloc<floatX>(N * 4 * d); }
            for (float** p : {&a.ln1_mean, &a.ln1_rstd, &a.ln2_mean, &a.ln2_rstd}) { *p = arena.alloc<float>(N); }
            a.lse = arena.alloc<float>(N * H);
        }
        for (floatX** p : {&branch, &xf, &d_ln, &d_o, &d_q, &d_k, &d_v}) { *p = arena.alloc<floatX>(N * d); }
        d_fc = arena.alloc<floatX>(N * 4 * d);
        lnf_mean = arena.alloc<float>(N);
        lnf_rstd = arena.alloc<float>(N);
        size_t scratch_floats = std::max({layernorm_backward_scratch_floats((int)N, (int)d),
                                          bias_backward_scratch_floats((int)N, (int)(4 * d)),
                                          attention_backward_scratch_floats(B, T, (int)H, (int)(d / H)),
                                          (size_t)kReduceBlocks + 1});
        scratch = arena.alloc<float>(scratch_floats);
    }

    // ---- loss bookkeeping (llmc/model/model.h, training.h): every target >= 0 counts -----------
    bool counts_in_loss(int target) const { return target >= 0; }
    int doc_start_token() const { return -1; }  // GPT-2 attends across documents, as llm.c does
    double loss_value(const LossStats& s) const { return s.loss(0.0); }
    double z_loss_coefficient() const { return 0.0; }
    const std::vector<int>& loss_targets() const { return host_targets; }

    // ---- forward ------------------------------------------------------------------------
    // inputs, targets: host (Bn, Tn) token ids (targets < 0 are ignored). Computes the mean
    // cross-entropy; with dloss_scale != 0 also leaves d(loss_sum * dloss_scale)/d logits
    // for backward(). row_losses, if given, receives the per-position losses.
    // With `cache` (sampling): one position, Bn = Tn = 1, at cache->pos: its keys and values
    // go into the cache and its query attends over the cached rows (llmc/kernels/kv_cache.cuh).
    LossStats forward(const int* inputs, const int* targets, int Bn, int Tn, float dloss_scale,
                     std::vector<float>* row_losses = nullptr, KVCache* cache = nullptr) {
        begin_forward(Bn, Tn, dloss_scale, cache);
        const int N = Bn * Tn, d = cfg.n_embd, H = cfg.n_head, hd = cfg.head_dim(), V = cfg.vocab_size,
                  Vp = cfg.padded_vocab();
        LossStats sums;
        host_targets.assign(targets, targets + N);
        for (int i = 0; i < N; i++) {
            if (inputs[i] < 0 || inputs[i] >= V) { fatal("input token %d at %d is outside the vocabulary of %d", inputs[i], i, V); }
            if (targets[i] >= V) { fatal("target token %d at %d is outside the vocabulary of %d", targets[i], i, V); }
            sums.count += targets[i] >= 0;
        }
        // through the pinned staging (model.h), copies queued on the stream
        begin_staging();
        std::copy(inputs, inputs + N, staged_inputs());
        std::copy(targets, targets + N, staged_targets());
        upload_ids(d_inputs, staged_inputs(), N);
        upload_ids(d_targets, staged_targets(), N);
        if (dloss_scale != 0.0f) { buckets.build(d_inputs, N, stream); }

        const int pos = cache != nullptr ? cache->pos : 0;
        embedding_forward(residual[0], d_inputs, P.wte, N, d, 1.0f, stream);
        position_forward(residual[0], P.wpe + (size_t)pos * d, Bn, Tn, d, stream);  // positions pos, pos + 1, ...
        const StreamNorm first = stream_norm(0);
        first.norm.forward(first.out, first.mean, first.rstd, residual[0], N, stream);
        for (int l = 0; l < cfg.n_layer; l++) {
            const LayerTensors<floatX>& p = P.layers[l];
            LayerActivations& a = acts[l];
            // attention block (its ln_1 ran with the residual add before it): the fused qkv
            // weight (3d, d) is three (d, d) row blocks
            // keys and values: the activations, or with a cache its row `pos`
            floatX* qkv[3] = {a.q, cache != nullptr ? cache->k[l] + (size_t)pos * d : a.k,
                              cache != nullptr ? cache->v[l] + (size_t)pos * d : a.v};
            for (int j = 0; j < 3; j++) {
                linear_forward(qkv[j], a.ln1, p.qkvw + (size_t)j * d * d, N, d, d, stream);
                bias_forward(qkv[j], qkv[j], p.qkvb + (size_t)j * d, N, d, stream);
            }
            if (cache != nullptr) {
                attention_decode({1, pos + 1, H, H, hd}, {a.q, cache->k[l], cache->v[l], a.o, nullptr}, stream);
            } else {
                attention_forward({Bn, Tn, H, H, hd}, {a.q, a.k, a.v, a.o, a.lse}, stream);
            }
            linear_forward(branch, a.o, p.attprojw, N, d, d, stream);
            bias_forward(branch, branch, p.attprojb, N, d, stream);
            // the residual add and the MLP block's ln_2, one launch (llmc/kernels/residual_norm.cuh)
            residual_layernorm_forward(a.x_mid, residual[l], branch, nullptr, ResidualMode::Standard, ln_2(l), a.ln2,
                                       a.ln2_mean, a.ln2_rstd, N, stream);
            // MLP block
            linear_forward(a.fc, a.ln2, p.fcw, N, d, 4 * d, stream);
            bias_forward(a.fc, a.fc, p.fcb, N, 4 * d, stream);
            gelu_forward(a.gelu, a.fc, (size_t)N * 4 * d, stream);
            linear_forward(branch, a.gelu, p.fcprojw, N, 4 * d, d, stream);
            bias_forward(branch, branch, p.fcprojb, N, d, stream);
            // the residual add and the next layer's ln_1 (after the last layer: ln_f), one launch
            const StreamNorm next = stream_norm(l + 1);
            residual_layernorm_forward(residual[l + 1], a.x_mid, branch, nullptr, ResidualMode::Standard, next.norm,
                                       next.out, next.mean, next.rstd, N, stream);
        }
        linear_forward(logits, xf, P.wte, N, d, Vp, stream);
        ClassifierTensors head{logits, d_targets, row_loss, row_lse_sq, dloss_scale != 0.0f ? dlogits : nullptr};
        classifier_forward_backward(head, N, V, Vp, 0.0f, dloss_scale, stream);

        sums.ce_sum = loss_sums(N, false).ce_sum;  // one sum back, not N rows
        if (row_losses != nullptr) { *row_losses = copy_from_device(row_loss, N); }
        return sums;
    }

    // ---- backward -----------------------------------------------------------------------
    // Accumulates d(loss * dloss_scale)/d params into grads (zero them with zero_grad()),
    // for the batch of the last forward() that was given a non-zero dloss_scale.
    void backward() {
        const int Bn = last_B, Tn = last_T, N = Bn * Tn, d = cfg.n_embd, H = cfg.n_head, hd = cfg.head_dim();
        const int Vp = cfg.padded_vocab();

        // LM head (tied embedding) and final LayerNorm
        linear_backward_weight(G.wte, dlogits, xf, N, d, Vp, stream);
        linear_backward_input(dxf, dlogits, P.wte, N, d, Vp, false, stream);
        cudaCheck(cudaMemsetAsync(dx, 0, (size_t)N * d * sizeof(floatX), stream));
        ln_f().backward(dx, dxf, residual[cfg.n_layer], lnf_mean, lnf_rstd, N, scratch, stream);

        // dx holds dL/d(residual stream); a standard residual passes it to both the stream
        // and the branch unchanged, so each branch's output gradient is dx itself
        for (int l = cfg.n_layer - 1; l >= 0; l--) {
            const LayerTensors<floatX>& p = P.layers[l];
            const LayerTensors<floatX>& g = G.layers[l];
            LayerActivations& a = acts[l];
            // MLP block
            bias_backward(g.fcprojb, scratch, dx, N, d, stream);
            linear_backward_weight(g.fcprojw, dx, a.gelu, N, 4 * d, d, stream);
            linear_backward_input(d_fc, dx, p.fcprojw, N, 4 * d, d, false, stream);
            gelu_backward(d_fc, d_fc, a.fc, (size_t)N * 4 * d, stream);
            bias_backward(g.fcb, scratch, d_fc, N, 4 * d, stream);
            linear_backward_weight(g.fcw, d_fc, a.ln2, N, d, 4 * d, stream);
            linear_backward_input(d_ln, d_fc, p.fcw, N, d, 4 * d, false, stream);
            ln_2(l).backward(dx, d_ln, a.x_mid, a.ln2_mean, a.ln2_rstd, N, scratch, stream);
            // attention block
            bias_backward(g.attprojb, scratch, dx, N, d, stream);
            linear_backward_weight(g.attprojw, dx, a.o, N, d, d, stream);
            linear_backward_input(d_o, dx, p.attprojw, N, d, d, false, stream);
            attention_backward({Bn, Tn, H, H, hd}, {a.q, a.k, a.v, a.o, a.lse}, {d_o, d_q, d_k, d_v, scratch}, stream);
            floatX* dqkv[3] = {d_q, d_k, d_v};
            for (int j = 0; j < 3; j++) {
                bias_backward(g.qkvb + (size_t)j * d, scratch, dqkv[j], N, d, stream);
                linear_backward_weight(g.qkvw + (size_t)j * d * d, dqkv[j], a.ln1, N, d, d, stream);
                linear_backward_input(d_ln, dqkv[j], p.qkvw + (size_t)j * d * d, N, d, d, j > 0, stream);
            }
            ln_1(l).backward(dx, d_ln, residual[l], a.ln1_mean, a.ln1_rstd, N, scratch, stream);
            layer_gradients_done(l);  // final: its reduction may start (--overlap-reduce)
        }
        embedding_backward(G.wte, dx, buckets, d, 1.0f, stream);
        position_backward(G.wpe, dx, Bn, Tn, d, stream);
    }

    // The LayerNorms with their parameters and gradients: layer l's ln_1 and ln_2, and ln_f.
    LayerNorm ln_1(int l) const { return layernorm(P.layers[l].ln1w, P.layers[l].ln1b, G.layers[l].ln1w, G.layers[l].ln1b); }
    LayerNorm ln_2(int l) const { return layernorm(P.layers[l].ln2w, P.layers[l].ln2b, G.layers[l].ln2w, G.layers[l].ln2b); }
    LayerNorm ln_f() const { return layernorm(P.lnfw, P.lnfb, G.lnfw, G.lnfb); }
    // The LayerNorm that reads residual[l] and what it writes: layer l's ln_1, or for l = L, ln_f
    struct StreamNorm {
        LayerNorm norm;
        floatX* out;
        float *mean, *rstd;
    };
    StreamNorm stream_norm(int l) const {
        if (l == cfg.n_layer) { return {ln_f(), xf, lnf_mean, lnf_rstd}; }
        const LayerActivations& a = acts[l];
        return {ln_1(l), a.ln1, a.ln1_mean, a.ln1_rstd};
    }
    LayerNorm layernorm(floatX* w, floatX* b, floatX* dw, floatX* db) const {
        return {{w, dw}, {b, db}, cfg.n_embd, kLayerNormEps};
    }

};

// ========================================================================================
// llm.c model files (doc/formats.md "GPT-2 checkpoints", llm.c compatibility): a 256 x i32
// header [20240326, version 3 (fp32) or 5 (bf16), maxT, V, L, H, C, Vp, 0...], then the
// parameters with each per-layer kind stacked over the layers (wte (Vp, C), wpe (maxT, C),
// ln_1.weight (L, C), ln_1.bias, c_attn.weight (L, 3C, C), ... in kLayerFields order,
// ln_f.weight, ln_f.bias), weights (out, in) as ours. Only the storage order differs.

constexpr int kLlmcMagic = 20240326;

struct LlmcModel {
    GPT2Config cfg;
    std::vector<float> values;  // canonical order of parameter_spec(cfg)
};

// bos_id: the config's first sample token, which the file does not hold (< 0: 50256 for
// the GPT-2 BPE vocabulary of 50257, else 0).
LlmcModel load_llmc(const std::string& path, int bos_id) {
    CheckedFile file(path, "rb");
    long size = file.size();
    if (size < 1024) { fatal("llm.c model file '%s': %ld bytes, shorter than the 1024-byte header", path.c_str(), size); }
    int32_t h[256];
    file.read(h, sizeof(h), "the header");
    if (h[0] != kLlmcMagic) {
        fatal("'%s' is not an llm.c GPT-2 model file (magic %d, expected %d)", path.c_str(), h[0], kLlmcMagic);
    }
    if (h[1] != 3 && h[1] != 5) {
        fatal("llm.c model file '%s': version %d (this reader knows 3 = fp32, 5 = bf16)", path.c_str(), h[1]);
    }
    LlmcModel m;
    GPT2Config& c = m.cfg;
    c.seq_len = h[2];
    c.vocab_size = h[3];
    c.n_layer = h[4];
    c.n_head = h[5];
    c.n_embd = h[6];
    int64_t Vp_file = h[7];
    c.bos_id = bos_id >= 0 ? bos_id : (c.vocab_size == 50257 ? 50256 : 0);
    if (c.vocab_size <= 0 || c.seq_len <= 0 || c.n_layer <= 0 || c.n_embd <= 0 || c.n_head <= 0 || Vp_file < c.vocab_size) {
        fatal("llm.c model file '%s': bad header (maxT %d, V %d, L %d, H %d, C %d, Vp %lld)", path.c_str(), c.seq_len,
              c.vocab_size, c.n_layer, c.n_head, c.n_embd, (long long)Vp_file);
    }
    c.resolve_and_check();
    const int64_t d = c.n_embd, L = c.n_layer;
    if ((__int128)d * d * L > size) {  // every layer holds a (3d, d) matrix: the products below stay far from 2^63
        fatal("llm.c model file '%s': its header (L %d, C %d) announces more parameters than its %ld bytes hold",
              path.c_str(), c.n_layer, c.n_embd, size);
    }
    // sizes of the file's tensors in its order: wte, wpe, the stacked layer fields, ln_f
    std::vector<int64_t> field_numel;
    for (const LayerField& f : kLayerFields) { field_numel.push_back(f.rows * d * (f.cols == 0 ? 1 : f.cols * d)); }
    // (in 128 bits: header sizes up to 2^31 make products that wrap 64 bits, and a wrapped total
    // could match the file's size)
    __int128 total128 = (__int128)Vp_file * d + (__int128)c.seq_len * d + 2 * d;
    for (int64_t n : field_numel) { total128 += (__int128)L * n; }
    size_t item = h[1] == 3 ? 4 : 2;
    if (total128 * item != (__int128)size - 1024) {
        fatal("llm.c model file '%s': %ld bytes, expected %.0Lf for its header (version %d)", path.c_str(), size,
              (long double)(1024 + total128 * item), h[1]);
    }
    const int64_t total = (int64_t)total128;
    std::vector<float> raw(total);
    if (item == 4) {
        file.read(raw.data(), (size_t)total * sizeof(float), "the fp32 parameters");
    } else {
        std::vector<uint16_t> bits(total);
        file.read(bits.data(), (size_t)total * sizeof(uint16_t), "the bf16 parameters");
        for (int64_t i = 0; i < total; i++) {
            uint32_t u = (uint32_t)bits[i] << 16;
            memcpy(&raw[i], &u, sizeof(float));
        }
    }
    // file offsets of each block
    int64_t wte_at = 0, wpe_at = Vp_file * d, field_at = wpe_at + (int64_t)c.seq_len * d;
    std::vector<int64_t> field_start;
    for (int64_t n : field_numel) {
        field_start.push_back(field_at);
        field_at += L * n;
    }
    int64_t lnf_at = field_at;
    // canonical order
    const int64_t Vp = c.padded_vocab();
    m.values.assign((size_t)count_parameters(c).total, 0.0f);
    float* out = m.values.data();
    std::copy(raw.begin() + wte_at, raw.begin() + wte_at + (int64_t)c.vocab_size * d, out);  // rows >= V stay 0
    out += Vp * d;
    std::copy(raw.begin() + wpe_at, raw.begin() + wpe_at + (int64_t)c.seq_len * d, out);
    out += (int64_t)c.seq_len * d;
    for (int64_t l = 0; l < L; l++) {
        for (int f = 0; f < kNumLayerFields; f++) {
            int64_t from = field_start[f] + l * field_numel[f];
            std::copy(raw.begin() + from, raw.begin() + from + field_numel[f], out);
            out += field_numel[f];
        }
    }
    std::copy(raw.begin() + lnf_at, raw.begin() + lnf_at + 2 * d, out);
    return m;
}

// ========================================================================================
// command line and main (the sequence: llmc/train/trainer.h)

struct Options {
    std::string preset = "tiny";
    GPT2Config model;
    TrainOptions train;
    std::string init_from_llmc;
    std::shared_ptr<LlmcModel> llmc;  // the --init-from-llmc file's parameters, until the model takes them
};

std::vector<Flag> make_flags(Options& o) {
    std::vector<Flag> flags = model_flags(&o.preset, o.model);
    flags.push_back(make_flag("--init-from-llmc", &o.init_from_llmc, "llm.c GPT-2 model file (gpt2_124M.bin, ..._bf16.bin) to start from"));
    add_training_flags(flags, o.train, /*with_muon=*/false);
    return flags;
}

// What llmc/train/trainer.h asks of this trainer.
struct GPT2Trainer {
    using Model = GPT2;
    static void set_defaults(Options&, int, char**) {}
    // --init-from-llmc: the config and parameters of an llm.c model file
    static bool start_elsewhere(Options& o, bool bos_given) {
        if (o.init_from_llmc.empty()) { return false; }
        if (!start_checkpoint(o.train).empty()) { fatal("--resume, --init-from and --init-from-llmc are exclusive"); }
        check_input_file("--init-from-llmc", o.init_from_llmc);
        FatalContext reading("--init-from-llmc", "--init-from-llmc");
        o.llmc = std::make_shared<LlmcModel>(load_llmc(o.init_from_llmc, bos_given ? o.model.bos_id : -1));
        o.model = o.llmc->cfg;
        o.train.model_loaded = true;  // --steps 0 evaluates it
        return true;
    }
    static DefaultRates default_rates(const GPT2Config&) { return compiled_default_rates("presets/rates/gpt2.conf", "gpt2"); }
    static std::string arm_name(const GPT2Config&) { return "gpt2"; }
    static void print_model(const Options& o) {
        const GPT2Config& c = o.model;
        printf("model: GPT-2 L=%d d=%d heads %d (head_dim %d), vocab %d (padded %d), context %d, bos %d\n", c.n_layer,
               c.n_embd, c.n_head, c.head_dim(), c.vocab_size, c.padded_vocab(), c.seq_len, c.bos_id);
    }
    static void init_parameters(GPT2& model, Options& o) {
        if (o.llmc == nullptr) {
            model.init_parameters(o.train.seed);
            return;
        }
        model.set_parameters(o.llmc->values);
        printf("initialised from llm.c model file %s\n", o.init_from_llmc.c_str());
        o.llmc.reset();
    }
};

// The entry point, named so that test_gpt2.cu, which includes this file, holds it too: the Makefile
// links ./train_gpt2 from test_gpt2's object with train_gpt2_main as its main (one compile for both).
extern "C" int train_gpt2_main(int argc, char** argv) {
    return trainer_main<GPT2Trainer>(argc, argv, "train_gpt2", presets(), make_flags, read_config);
}
#ifndef TESTING
int main(int argc, char** argv) { return train_gpt2_main(argc, argv); }
#endif
