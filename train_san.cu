/*
train_san.cu: trains the SAN family (papers/SAN.md, doc/san-model.md): attention-only
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
#include "llmc/swiglu.cuh"
#include "llmc/residual.cuh"
#include "llmc/classifier.cuh"
#include "llmc/optimizer.h"
#include "llmc/cli.h"
#include "llmc/tensor_file.h"
#include "llmc/dataloader.h"
#include "llmc/tokenizer.h"

constexpr float kNormEps = 1e-6f;
constexpr float kInitStd = 0.02f;

// ========================================================================================
// config

struct SANConfig {
    int vocab_size = 250;
    int seq_len = 64;
    int n_layer = 2;
    int n_embd = 64;
    int n_head = 4;
    int n_kv_head = 2;
    std::string ffn = "none";  // none | swiglu
    int d_ff = 0;              // 0: 4 * n_embd
    std::string norm = "zcn";  // zcn | rms
    int qk_norm = 1;
    std::string residual = "gated";  // gated | standard | rezero | none
    int sandwich = 0;
    double rope_theta = 10000.0;
    int doc_mask = 1;
    int bos_id = 2;
    double z_loss = 1e-4;

    int padded_vocab() const { return CEIL_DIV(vocab_size, 128) * 128; }
    int head_dim() const { return n_embd / n_head; }
    bool has_ffn() const { return ffn == "swiglu"; }
    // ZCN gains are stored as an offset from 1, RMSNorm gains as the gain itself
    float gain_offset() const { return norm == "zcn" ? 1.0f : 0.0f; }
    ResidualMode residual_mode() const {
        ResidualMode mode;
        if (!parse_residual_mode(residual, &mode)) { fatal("--residual: unknown mode '%s'", residual.c_str()); }
        return mode;
    }

    void resolve_and_check() {
        if (d_ff == 0) { d_ff = 4 * n_embd; }
        auto require = [](bool ok, const char* what) {
            if (!ok) { fatal("bad model config: %s", what); }
        };
        require(vocab_size > 0 && seq_len > 0 && n_layer > 0 && n_embd > 0, "vocab, seq_len, layers and width must be positive");
        require(n_head > 0 && n_embd % n_head == 0, "--n-embd must be a multiple of --n-head");
        require(head_dim() % 2 == 0 && head_dim() <= 128, "head_dim = n_embd / n_head must be even and at most 128");
        require(n_kv_head > 0 && n_head % n_kv_head == 0, "--n-head must be a multiple of --n-kv-head");
        require(ffn == "none" || ffn == "swiglu", "--ffn must be none or swiglu");
        require(norm == "zcn" || norm == "rms", "--norm must be zcn or rms");
        require(qk_norm == 0 || qk_norm == 1, "--qk-norm must be 0 or 1");
        require(sandwich == 0 || sandwich == 1, "--sandwich must be 0 or 1");
        require(doc_mask == 0 || doc_mask == 1, "--doc-mask must be 0 or 1");
        require(d_ff > 0, "--d-ff must be positive");
        require(rope_theta > 0.0, "--rope-theta must be positive");
        require(z_loss >= 0.0, "--z-loss must be >= 0");
        residual_mode();
    }
};

std::map<std::string, SANConfig> presets() {
    SANConfig tiny;  // the defaults above: the PyTorch reference's "tiny"
    SANConfig tiny_ffn = tiny;
    tiny_ffn.ffn = "swiglu";
    tiny_ffn.d_ff = 128;
    SANConfig paper;  // d512, 8 query / 4 kv heads, vocab 16384, T 2048
    paper.vocab_size = 16384;
    paper.seq_len = 2048;
    paper.n_embd = 512;
    paper.n_head = 8;
    paper.n_kv_head = 4;
    auto arm = [](SANConfig c, int layers, const char* ffn) {
        c.n_layer = layers;
        c.ffn = ffn;
        return c;
    };
    // a small SAN that learns the offline data on a CPU in minutes (vocab from the tokenizer)
    SANConfig demo = tiny;
    demo.vocab_size = 8192;
    demo.seq_len = 128;
    demo.n_layer = 4;
    demo.n_embd = 128;
    demo.n_head = 4;
    demo.n_kv_head = 2;
    return {{"tiny", tiny},
            {"tiny-ffn", tiny_ffn},
            {"demo", demo},
            {"san20", arm(paper, 20, "none")},    // the paper's SAN
            {"ffn20", arm(paper, 20, "swiglu")},  // iso-depth partner
            {"ffn4", arm(paper, 4, "swiglu")},    // iso-param partner
            {"ffn9", arm(paper, 9, "swiglu")}};   // iso-FLOP partner
}

void write_config(TensorFileWriter& w, const SANConfig& c) {
    w.set("vocab_size", c.vocab_size);
    w.set("seq_len", c.seq_len);
    w.set("n_layer", c.n_layer);
    w.set("n_embd", c.n_embd);
    w.set("n_head", c.n_head);
    w.set("n_kv_head", c.n_kv_head);
    w.set("ffn", c.ffn);
    w.set("d_ff", c.d_ff);
    w.set("norm", c.norm);
    w.set("qk_norm", c.qk_norm);
    w.set("residual", c.residual);
    w.set("sandwich", c.sandwich);
    w.set("rope_theta", c.rope_theta);
    w.set("doc_mask", c.doc_mask);
    w.set("bos_id", c.bos_id);
    w.set("z_loss", c.z_loss);
    w.set("padded_vocab_size", c.padded_vocab());
    w.set("head_dim", c.head_dim());
}

SANConfig read_config(const TensorFileReader& r) {
    SANConfig c;
    c.vocab_size = (int)r.integer("vocab_size");
    c.seq_len = (int)r.integer("seq_len");
    c.n_layer = (int)r.integer("n_layer");
    c.n_embd = (int)r.integer("n_embd");
    c.n_head = (int)r.integer("n_head");
    c.n_kv_head = (int)r.integer("n_kv_head");
    c.ffn = r.str("ffn");
    c.d_ff = (int)r.integer("d_ff");
    c.norm = r.str("norm");
    c.qk_norm = (int)r.integer("qk_norm");
    c.residual = r.str("residual");
    c.sandwich = (int)r.integer("sandwich");
    c.rope_theta = r.real("rope_theta");
    c.doc_mask = (int)r.integer("doc_mask");
    c.bos_id = (int)r.integer("bos_id");
    c.z_loss = r.real("z_loss");
    c.resolve_and_check();
    if (r.integer("padded_vocab_size") != c.padded_vocab() || r.integer("head_dim") != c.head_dim()) {
        r.fail("padded_vocab_size/head_dim do not follow from the config");
    }
    return c;
}

// ========================================================================================
// parameters: one contiguous buffer, tensors in the canonical order of doc/san-model.md

std::vector<ParamSpec> parameter_spec(const SANConfig& c) {
    int64_t d = c.n_embd, hd = c.head_dim(), qd = (int64_t)c.n_head * hd, kvd = (int64_t)c.n_kv_head * hd;
    float gain = c.norm == "zcn" ? 0.0f : 1.0f;
    float out_std = kInitStd / std::sqrt(2.0f * c.n_layer);
    bool gated = residual_has_gate(c.residual_mode());
    std::vector<ParamSpec> spec;
    spec.push_back({"wte", {c.padded_vocab(), d}, false, kInitStd, 0.0f});
    for (int l = 0; l < c.n_layer; l++) {
        std::string p = "layers." + std::to_string(l) + ".";
        spec.push_back({p + "attn_norm.weight", {d}, false, 0.0f, gain});
        spec.push_back({p + "attn.wq", {qd, d}, true, kInitStd, 0.0f});
        spec.push_back({p + "attn.wk", {kvd, d}, true, kInitStd, 0.0f});
        spec.push_back({p + "attn.wv", {kvd, d}, true, kInitStd, 0.0f});
        if (c.qk_norm) {
            spec.push_back({p + "attn.q_norm.weight", {hd}, false, 0.0f, gain});
            spec.push_back({p + "attn.k_norm.weight", {hd}, false, 0.0f, gain});
        }
        spec.push_back({p + "attn.wo", {d, qd}, true, out_std, 0.0f});
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

// Pointers to one layer's tensors inside a buffer laid out by parameter_spec (parameters,
// gradients or optimizer state all use the same layout). Absent tensors are null.
template <typename T>
struct LayerTensors {
    T *attn_norm = nullptr, *wq = nullptr, *wk = nullptr, *wv = nullptr, *q_norm = nullptr, *k_norm = nullptr;
    T *wo = nullptr, *attn_post_norm = nullptr, *attn_gate = nullptr;
    T *ffn_norm = nullptr, *w_gate = nullptr, *w_up = nullptr, *w_down = nullptr, *ffn_post_norm = nullptr,
      *ffn_gate = nullptr;
};
template <typename T>
struct ModelTensors {
    T* wte = nullptr;
    std::vector<LayerTensors<T>> layers;
    T* final_norm = nullptr;

    void point_into(T* base, const SANConfig& c) {
        std::vector<ParamSpec> spec = parameter_spec(c);
        layers.assign(c.n_layer, LayerTensors<T>());
        T* p = base;
        for (const ParamSpec& s : spec) {
            slot(s.name) = p;
            p += s.numel();
        }
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
            {"attn_gate", &LayerTensors<T>::attn_gate},        {"ffn_norm.weight", &LayerTensors<T>::ffn_norm},
            {"ffn.w_gate", &LayerTensors<T>::w_gate},          {"ffn.w_up", &LayerTensors<T>::w_up},
            {"ffn.w_down", &LayerTensors<T>::w_down},          {"ffn_post_norm.weight", &LayerTensors<T>::ffn_post_norm},
            {"ffn_gate", &LayerTensors<T>::ffn_gate}};
        return L.*(fields.at(field));
    }
};

// (total, non-embedding) parameter counts; total includes the padded embedding rows
std::pair<int64_t, int64_t> count_parameters(const SANConfig& c) {
    int64_t total = 0;
    for (const ParamSpec& s : parameter_spec(c)) { total += s.numel(); }
    return {total, total - (int64_t)c.padded_vocab() * c.n_embd};
}
// Training FLOPs per token (PaLM convention, as train_san.py): 6 * (non-embedding params +
// LM head V*d) + 12 * L * T * d for attention scores and values.
double flops_per_token(const SANConfig& c) {
    double nonemb = (double)count_parameters(c).second;
    return 6.0 * (nonemb + (double)c.vocab_size * c.n_embd) + 12.0 * c.n_layer * (double)c.seq_len * c.n_embd;
}

// ========================================================================================
// activations: everything the backward pass needs, for B x T positions

struct LayerActivations {
    floatX *u, *q_lin, *k_lin, *v, *q, *k, *o, *h, *h_post, *x_mid;  // attention block
    float *u_rstd, *q_rstd, *k_rstd, *lse, *h_rstd;
    floatX *fu, *f_gate, *f_up, *f_sw, *f_h, *f_post;  // FFN block
    float *fu_rstd, *f_rstd;
};

// ========================================================================================
// the model

struct LossStats {
    double ce_sum = 0.0, lse_sq_sum = 0.0;
    int64_t count = 0;
    double loss(double z_loss) const { return count == 0 ? 0.0 : (ce_sum + z_loss * lse_sq_sum) / (double)count; }
};

struct SAN {
    SANConfig cfg;
    int B, T;  // capacity of the activations: B rows of T positions
    std::vector<ParamSpec> spec;
    size_t num_params = 0;
    DeviceArena arena;

    floatX* params = nullptr;
    floatX* grads = nullptr;
    float* master = nullptr;  // fp32 copy of the parameters (bf16 builds only)
    ModelTensors<floatX> P, G;
    std::unique_ptr<ParamOptimizer> optimizer;

    // activations
    std::vector<floatX*> residual;  // L + 1 residual-stream states (N, d)
    std::vector<LayerActivations> acts;
    floatX* xf = nullptr;
    float* xf_rstd = nullptr;
    float* logits = nullptr;  // (N, Vp) fp32
    floatX* dlogits = nullptr;
    float *row_loss = nullptr, *row_lse_sq = nullptr;
    int *d_inputs = nullptr, *d_targets = nullptr, *d_doc_ids = nullptr;
    float* rope = nullptr;
    // backward scratch
    floatX *dx = nullptr, *dxf = nullptr, *d_branch = nullptr, *d_proj = nullptr, *d_u = nullptr;
    floatX *d_o = nullptr, *d_q = nullptr, *d_k = nullptr, *d_v = nullptr, *d_qlin = nullptr, *d_klin = nullptr;
    floatX *d_sw = nullptr, *d_gate = nullptr, *d_up = nullptr;
    float* scratch = nullptr;
    EmbeddingBuckets buckets;
    int last_B = 0, last_T = 0;
    std::vector<int> host_targets_masked;
    cudaStream_t stream = nullptr;

    SAN(const SANConfig& config, int batch, int seq) : cfg(config), B(batch), T(seq) {
        if (T > cfg.seq_len) { fatal("sequence length %d exceeds the model's seq_len %d", T, cfg.seq_len); }
        spec = parameter_spec(cfg);
        num_params = total_numel(spec);
        params = arena.alloc<floatX>(num_params);
        grads = arena.alloc<floatX>(num_params);
        cudaCheck(cudaMemset(grads, 0, num_params * sizeof(floatX)));
        if (PRECISION_MODE != PrecisionMode::FP32) { master = arena.alloc<float>(num_params); }
        P.point_into(params, cfg);
        G.point_into(grads, cfg);
        allocate_activations();
        optimizer = std::make_unique<ParamOptimizer>(spec, params, master, grads, scratch);
        std::vector<float> table = rope_table(cfg.seq_len, cfg.head_dim(), cfg.rope_theta);
        rope = copy_to_device(table);
        arena.blocks.push_back(rope);
    }

    void allocate_activations() {
        size_t N = (size_t)B * T, d = cfg.n_embd, hd = cfg.head_dim();
        size_t qd = (size_t)cfg.n_head * hd, kvd = (size_t)cfg.n_kv_head * hd, ff = cfg.d_ff;
        size_t Vp = cfg.padded_vocab();
        for (int l = 0; l <= cfg.n_layer; l++) { residual.push_back(arena.alloc<floatX>(N * d)); }
        acts.resize(cfg.n_layer);
        for (LayerActivations& a : acts) {
            a = LayerActivations{};
            a.u = arena.alloc<floatX>(N * d);
            a.u_rstd = arena.alloc<float>(N);
            a.q_lin = arena.alloc<floatX>(N * qd);
            a.k_lin = arena.alloc<floatX>(N * kvd);
            a.v = arena.alloc<floatX>(N * kvd);
            a.q = arena.alloc<floatX>(N * qd);
            a.k = arena.alloc<floatX>(N * kvd);
            a.q_rstd = arena.alloc<float>(N * cfg.n_head);
            a.k_rstd = arena.alloc<float>(N * cfg.n_kv_head);
            a.o = arena.alloc<floatX>(N * qd);
            a.lse = arena.alloc<float>(N * cfg.n_head);
            a.h = arena.alloc<floatX>(N * d);
            if (cfg.sandwich) {
                a.h_post = arena.alloc<floatX>(N * d);
                a.h_rstd = arena.alloc<float>(N);
            }
            if (cfg.has_ffn()) {
                a.x_mid = arena.alloc<floatX>(N * d);
                a.fu = arena.alloc<floatX>(N * d);
                a.fu_rstd = arena.alloc<float>(N);
                a.f_gate = arena.alloc<floatX>(N * ff);
                a.f_up = arena.alloc<floatX>(N * ff);
                a.f_sw = arena.alloc<floatX>(N * ff);
                a.f_h = arena.alloc<floatX>(N * d);
                if (cfg.sandwich) {
                    a.f_post = arena.alloc<floatX>(N * d);
                    a.f_rstd = arena.alloc<float>(N);
                }
            }
        }
        xf = arena.alloc<floatX>(N * d);
        xf_rstd = arena.alloc<float>(N);
        logits = arena.alloc<float>(N * Vp);
        dlogits = arena.alloc<floatX>(N * Vp);
        row_loss = arena.alloc<float>(N);
        row_lse_sq = arena.alloc<float>(N);
        d_inputs = arena.alloc<int>(N);
        d_targets = arena.alloc<int>(N);
        d_doc_ids = arena.alloc<int>(N);
        dx = arena.alloc<floatX>(N * d);
        dxf = arena.alloc<floatX>(N * d);
        d_branch = arena.alloc<floatX>(N * d);
        d_proj = arena.alloc<floatX>(N * d);
        d_u = arena.alloc<floatX>(N * d);
        d_o = arena.alloc<floatX>(N * qd);
        d_q = arena.alloc<floatX>(N * qd);
        d_k = arena.alloc<floatX>(N * kvd);
        d_v = arena.alloc<floatX>(N * kvd);
        d_qlin = arena.alloc<floatX>(N * qd);
        d_klin = arena.alloc<floatX>(N * kvd);
        if (cfg.has_ffn()) {
            d_sw = arena.alloc<floatX>(N * ff);
            d_gate = arena.alloc<floatX>(N * ff);
            d_up = arena.alloc<floatX>(N * ff);
        }
        size_t scratch_floats = std::max({norm_backward_scratch_floats((int)N, (int)d),
                                          norm_backward_scratch_floats((int)(N * cfg.n_head), (int)hd),
                                          N * cfg.n_head, (size_t)kReduceBlocks + 1});
        scratch = arena.alloc<float>(scratch_floats);
    }

    // ---- parameters in and out (fp32 host vectors in canonical order) --------------------
    void set_parameters(const std::vector<float>& values) {
        if (values.size() != num_params) { fatal("set_parameters: %zu values for %zu parameters", values.size(), num_params); }
        std::vector<floatX> converted(num_params);
        for (size_t i = 0; i < num_params; i++) { converted[i] = from_float<floatX>(values[i]); }
        cudaCheck(cudaMemcpy(params, converted.data(), num_params * sizeof(floatX), cudaMemcpyHostToDevice));
        if (master != nullptr) { cudaCheck(cudaMemcpy(master, values.data(), num_params * sizeof(float), cudaMemcpyHostToDevice)); }
    }
    std::vector<float> get_parameters() const {
        std::vector<float> out(num_params);
        if (master != nullptr) {
            cudaCheck(cudaMemcpy(out.data(), master, num_params * sizeof(float), cudaMemcpyDeviceToHost));
        } else {
            std::vector<floatX> values = copy_from_device(params, num_params);
            for (size_t i = 0; i < num_params; i++) { out[i] = to_float(values[i]); }
        }
        return out;
    }
    std::vector<float> get_gradients() const {
        std::vector<floatX> values = copy_from_device(grads, num_params);
        std::vector<float> out(num_params);
        for (size_t i = 0; i < num_params; i++) { out[i] = to_float(values[i]); }
        return out;
    }

    // Parameter init of doc/san-model.md (our own random stream; the reference's stream is
    // not reproduced: tests load parameters instead).
    void init_parameters(uint64_t seed) {
        std::mt19937_64 rng(seed);
        std::normal_distribution<float> normal(0.0f, 1.0f);
        std::vector<float> values;
        values.reserve(num_params);
        for (const ParamSpec& s : spec) {
            int64_t rows_used = s.name == "wte" ? cfg.vocab_size : (s.shape.empty() ? 1 : s.shape[0]);
            int64_t row_size = s.numel() / (s.shape.empty() ? 1 : s.shape[0]);
            for (int64_t i = 0; i < s.numel(); i++) {
                bool padded_row = i / row_size >= rows_used;
                values.push_back(s.init_std > 0.0f && !padded_row ? s.init_std * normal(rng) : s.init_value);
            }
        }
        set_parameters(values);
    }

    // ---- forward ------------------------------------------------------------------------
    // inputs, targets: host (Bn, Tn) token ids (targets < 0 are ignored). Computes the loss;
    // with dloss_scale != 0 also leaves d(loss * dloss_scale)/d logits for backward().
    // Returns the per-row statistics: the loss is their ce + z * lse_sq over the count.
    LossStats forward(const int* inputs, const int* targets, int Bn, int Tn, float dloss_scale,
                      std::vector<float>* row_losses = nullptr) {
        if (Bn > B || Tn > T || (size_t)Bn * Tn > (size_t)B * T) {
            fatal("forward: batch %d x %d exceeds the allocated %d x %d", Bn, Tn, B, T);
        }
        last_B = Bn;
        last_T = Tn;
        const int N = Bn * Tn, d = cfg.n_embd, hd = cfg.head_dim(), Hq = cfg.n_head, Hkv = cfg.n_kv_head;
        const int qd = Hq * hd, kvd = Hkv * hd, ff = cfg.d_ff, V = cfg.vocab_size, Vp = cfg.padded_vocab();
        const float off = cfg.gain_offset();
        const ResidualMode mode = cfg.residual_mode();

        // inputs, masked targets and document ids (the rules of doc/san-model.md)
        std::vector<int> doc_ids(N), masked(N);
        int64_t count = 0;
        for (int b = 0; b < Bn; b++) {
            int doc = 0;
            for (int t = 0; t < Tn; t++) {
                int i = b * Tn + t;
                if (inputs[i] < 0 || inputs[i] >= V) { fatal("input token %d at (%d, %d) is outside the vocabulary of %d", inputs[i], b, t, V); }
                if (targets[i] >= V) { fatal("target token %d at (%d, %d) is outside the vocabulary of %d", targets[i], b, t, V); }
                doc += inputs[i] == cfg.bos_id;
                doc_ids[i] = doc;
                bool counts = targets[i] >= 0 && !(cfg.doc_mask && targets[i] == cfg.bos_id);
                masked[i] = counts ? targets[i] : -1;
                count += counts;
            }
        }
        host_targets_masked = masked;
        cudaCheck(cudaMemcpy(d_inputs, inputs, N * sizeof(int), cudaMemcpyHostToDevice));
        cudaCheck(cudaMemcpy(d_targets, masked.data(), N * sizeof(int), cudaMemcpyHostToDevice));
        cudaCheck(cudaMemcpy(d_doc_ids, doc_ids.data(), N * sizeof(int), cudaMemcpyHostToDevice));
        const int* doc = cfg.doc_mask ? d_doc_ids : nullptr;
        if (dloss_scale != 0.0f) { buckets.build(inputs, N, stream); }

        embedding_forward(residual[0], d_inputs, P.wte, N, d, std::sqrt((float)d), stream);
        for (int l = 0; l < cfg.n_layer; l++) {
            const LayerTensors<floatX>& p = P.layers[l];
            LayerActivations& a = acts[l];
            floatX* x_in = residual[l];
            floatX* x_attn_out = cfg.has_ffn() ? a.x_mid : residual[l + 1];
            // attention block
            norm_forward(a.u, a.u_rstd, x_in, p.attn_norm, N, d, off, kNormEps, stream);
            gemm(a.q_lin, a.u, p.wq, N, qd, d, false, true, 1.0f, 0.0f, 1, 0, 0, 0, stream);
            gemm(a.k_lin, a.u, p.wk, N, kvd, d, false, true, 1.0f, 0.0f, 1, 0, 0, 0, stream);
            gemm(a.v, a.u, p.wv, N, kvd, d, false, true, 1.0f, 0.0f, 1, 0, 0, 0, stream);
            if (cfg.qk_norm) {
                norm_forward(a.q, a.q_rstd, a.q_lin, p.q_norm, N * Hq, hd, off, kNormEps, stream);
                norm_forward(a.k, a.k_rstd, a.k_lin, p.k_norm, N * Hkv, hd, off, kNormEps, stream);
                rope_forward(a.q, a.q, rope, Bn, Tn, Hq, hd, stream);
                rope_forward(a.k, a.k, rope, Bn, Tn, Hkv, hd, stream);
            } else {
                rope_forward(a.q, a.q_lin, rope, Bn, Tn, Hq, hd, stream);
                rope_forward(a.k, a.k_lin, rope, Bn, Tn, Hkv, hd, stream);
            }
            attention_forward(a.o, a.lse, a.q, a.k, a.v, doc, Bn, Tn, Hq, Hkv, hd, stream);
            gemm(a.h, a.o, p.wo, N, d, qd, false, true, 1.0f, 0.0f, 1, 0, 0, 0, stream);
            const floatX* branch = a.h;
            if (cfg.sandwich) {
                norm_forward(a.h_post, a.h_rstd, a.h, p.attn_post_norm, N, d, off, kNormEps, stream);
                branch = a.h_post;
            }
            residual_forward(x_attn_out, x_in, branch, p.attn_gate, mode, (size_t)N * d, stream);
            // FFN block (control arm)
            if (cfg.has_ffn()) {
                norm_forward(a.fu, a.fu_rstd, a.x_mid, p.ffn_norm, N, d, off, kNormEps, stream);
                gemm(a.f_gate, a.fu, p.w_gate, N, ff, d, false, true, 1.0f, 0.0f, 1, 0, 0, 0, stream);
                gemm(a.f_up, a.fu, p.w_up, N, ff, d, false, true, 1.0f, 0.0f, 1, 0, 0, 0, stream);
                swiglu_forward(a.f_sw, a.f_gate, a.f_up, (size_t)N * ff, stream);
                gemm(a.f_h, a.f_sw, p.w_down, N, d, ff, false, true, 1.0f, 0.0f, 1, 0, 0, 0, stream);
                const floatX* fbranch = a.f_h;
                if (cfg.sandwich) {
                    norm_forward(a.f_post, a.f_rstd, a.f_h, p.ffn_post_norm, N, d, off, kNormEps, stream);
                    fbranch = a.f_post;
                }
                residual_forward(residual[l + 1], a.x_mid, fbranch, p.ffn_gate, mode, (size_t)N * d, stream);
            }
        }
        norm_forward(xf, xf_rstd, residual[cfg.n_layer], P.final_norm, N, d, off, kNormEps, stream);
        gemm(logits, xf, P.wte, N, Vp, d, false, true, 1.0f, 0.0f, 1, 0, 0, 0, stream);
        classifier_forward_backward(dloss_scale != 0.0f ? dlogits : (floatX*)nullptr, row_loss, row_lse_sq, logits,
                                    d_targets, N, V, Vp, (float)cfg.z_loss, dloss_scale, stream);

        std::vector<float> losses = copy_from_device(row_loss, N), lse_sq = copy_from_device(row_lse_sq, N);
        LossStats stats;
        for (int i = 0; i < N; i++) {
            stats.ce_sum += losses[i];
            stats.lse_sq_sum += lse_sq[i];
        }
        stats.count = count;
        if (row_losses != nullptr) {
            row_losses->resize(N);
            for (int i = 0; i < N; i++) { (*row_losses)[i] = losses[i] + (float)cfg.z_loss * lse_sq[i]; }
        }
        return stats;
    }

    // ---- backward -----------------------------------------------------------------------
    // Accumulates d(loss * dloss_scale)/d params into grads (zero them with zero_grad()),
    // for the batch of the last forward() that was given a non-zero dloss_scale.
    void backward() {
        const int Bn = last_B, Tn = last_T, N = Bn * Tn, d = cfg.n_embd, hd = cfg.head_dim();
        const int Hq = cfg.n_head, Hkv = cfg.n_kv_head, qd = Hq * hd, kvd = Hkv * hd, ff = cfg.d_ff;
        const int Vp = cfg.padded_vocab();
        const float off = cfg.gain_offset();
        const ResidualMode mode = cfg.residual_mode();
        const int* doc = cfg.doc_mask ? d_doc_ids : nullptr;
        const size_t Nd = (size_t)N * d;

        // LM head (tied embedding) and final norm
        gemm(G.wte, dlogits, xf, Vp, d, N, true, false, 1.0f, 1.0f, 1, 0, 0, 0, stream);
        gemm(dxf, dlogits, P.wte, N, d, Vp, false, false, 1.0f, 0.0f, 1, 0, 0, 0, stream);
        cudaCheck(cudaMemsetAsync(dx, 0, Nd * sizeof(floatX), stream));
        norm_backward(dx, G.final_norm, scratch, dxf, residual[cfg.n_layer], P.final_norm, xf_rstd, N, d, off, stream);

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
            const LayerTensors<floatX>& p = P.layers[l];
            const LayerTensors<floatX>& g = G.layers[l];
            LayerActivations& a = acts[l];
            if (cfg.has_ffn()) {
                floatX* df = branch_backward(cfg.sandwich ? a.f_post : a.f_h, a.f_h, a.f_rstd, p.ffn_post_norm,
                                             g.ffn_post_norm, p.ffn_gate, g.ffn_gate);
                gemm(g.w_down, df, a.f_sw, d, ff, N, true, false, 1.0f, 1.0f, 1, 0, 0, 0, stream);
                gemm(d_sw, df, p.w_down, N, ff, d, false, false, 1.0f, 0.0f, 1, 0, 0, 0, stream);
                swiglu_backward(d_gate, d_up, d_sw, a.f_gate, a.f_up, (size_t)N * ff, stream);
                gemm(g.w_gate, d_gate, a.fu, ff, d, N, true, false, 1.0f, 1.0f, 1, 0, 0, 0, stream);
                gemm(g.w_up, d_up, a.fu, ff, d, N, true, false, 1.0f, 1.0f, 1, 0, 0, 0, stream);
                gemm(d_u, d_gate, p.w_gate, N, d, ff, false, false, 1.0f, 0.0f, 1, 0, 0, 0, stream);
                gemm(d_u, d_up, p.w_up, N, d, ff, false, false, 1.0f, 1.0f, 1, 0, 0, 0, stream);
                norm_backward(dx, g.ffn_norm, scratch, d_u, a.x_mid, p.ffn_norm, a.fu_rstd, N, d, off, stream);
            }
            floatX* dh = branch_backward(cfg.sandwich ? a.h_post : a.h, a.h, a.h_rstd, p.attn_post_norm,
                                         g.attn_post_norm, p.attn_gate, g.attn_gate);
            gemm(g.wo, dh, a.o, d, qd, N, true, false, 1.0f, 1.0f, 1, 0, 0, 0, stream);
            gemm(d_o, dh, p.wo, N, qd, d, false, false, 1.0f, 0.0f, 1, 0, 0, 0, stream);
            attention_backward(d_q, d_k, d_v, scratch, d_o, a.o, a.q, a.k, a.v, a.lse, doc, Bn, Tn, Hq, Hkv, hd, stream);
            rope_backward(d_q, d_q, rope, Bn, Tn, Hq, hd, stream);
            rope_backward(d_k, d_k, rope, Bn, Tn, Hkv, hd, stream);
            floatX* dq_lin = d_q;
            floatX* dk_lin = d_k;
            if (cfg.qk_norm) {
                cudaCheck(cudaMemsetAsync(d_qlin, 0, (size_t)N * qd * sizeof(floatX), stream));
                cudaCheck(cudaMemsetAsync(d_klin, 0, (size_t)N * kvd * sizeof(floatX), stream));
                norm_backward(d_qlin, g.q_norm, scratch, d_q, a.q_lin, p.q_norm, a.q_rstd, N * Hq, hd, off, stream);
                norm_backward(d_klin, g.k_norm, scratch, d_k, a.k_lin, p.k_norm, a.k_rstd, N * Hkv, hd, off, stream);
                dq_lin = d_qlin;
                dk_lin = d_klin;
            }
            gemm(g.wq, dq_lin, a.u, qd, d, N, true, false, 1.0f, 1.0f, 1, 0, 0, 0, stream);
            gemm(g.wk, dk_lin, a.u, kvd, d, N, true, false, 1.0f, 1.0f, 1, 0, 0, 0, stream);
            gemm(g.wv, d_v, a.u, kvd, d, N, true, false, 1.0f, 1.0f, 1, 0, 0, 0, stream);
            gemm(d_u, dq_lin, p.wq, N, d, qd, false, false, 1.0f, 0.0f, 1, 0, 0, 0, stream);
            gemm(d_u, dk_lin, p.wk, N, d, kvd, false, false, 1.0f, 1.0f, 1, 0, 0, 0, stream);
            gemm(d_u, d_v, p.wv, N, d, kvd, false, false, 1.0f, 1.0f, 1, 0, 0, 0, stream);
            norm_backward(dx, g.attn_norm, scratch, d_u, residual[l], p.attn_norm, a.u_rstd, N, d, off, stream);
        }
        embedding_backward(G.wte, dx, buckets, d, std::sqrt((float)d), stream);
    }

    void zero_grad() { cudaCheck(cudaMemsetAsync(grads, 0, num_params * sizeof(floatX), stream)); }

    // ---- update -------------------------------------------------------------------------
    // One optimizer step on the accumulated gradients (clipped to the global norm); returns
    // the global gradient norm before clipping.
    float update(const OptimizerConfig& opt, double lr_matrix, double lr_other) {
        return optimizer->update(opt, lr_matrix, lr_other, stream);
    }
    int64_t steps_done() const { return optimizer->step; }

    // ---- checkpoint ---------------------------------------------------------------------
    // Model + optimizer state (AdamW or Muon) in the container of doc/formats.md (readable by train_san.py);
    // `extra` adds keys such as the data position for an exact resume.
    void save_checkpoint(const std::string& path, const OptimizerConfig& opt,
                         const std::vector<std::pair<std::string, std::string>>& extra) const {
        TensorFileWriter w(TENSOR_FILE_CHECKPOINT);
        write_config(w, cfg);
        optimizer->save(w, opt);
        for (const auto& kv : extra) { w.set(kv.first, kv.second); }
        std::vector<float> values = get_parameters();
        size_t offset = 0;
        for (const ParamSpec& s : spec) {
            w.add_floats(s.name, s.shape, values.data() + offset);
            offset += s.numel();
        }
                w.write(path);
    }

    // Loads parameters (and the optimizer state and step, if the file has them) by name.
    void load_parameters(const TensorFileReader& r, bool with_optimizer) {
        std::vector<float> values;
        for (const ParamSpec& s : spec) {
            std::vector<float> t = r.floats(s.name, s.numel());
            values.insert(values.end(), t.begin(), t.end());
        }
        set_parameters(values);
        if (with_optimizer) { optimizer->load(r); }
    }

    // ---- sampling -----------------------------------------------------------------------
    // Continues `prompt` by n tokens, sampling from softmax(logits / temperature) over the
    // real vocabulary (temperature 0: greedy). Recomputes the whole row per token.
    std::vector<int> sample(std::vector<int> tokens, int n, float temperature, std::mt19937_64& rng) {
        const int V = cfg.vocab_size, Vp = cfg.padded_vocab(), Tn = T;
        std::vector<int> row(Tn), no_targets(Tn, -1);
        for (int k = 0; k < n; k++) {
            int start = std::max(0, (int)tokens.size() - Tn);
            int len = (int)tokens.size() - start;
            std::fill(row.begin(), row.end(), cfg.bos_id);
            std::copy(tokens.begin() + start, tokens.end(), row.begin());
            forward(row.data(), no_targets.data(), 1, Tn, 0.0f);
            std::vector<float> last(Vp);
            cudaCheck(cudaMemcpy(last.data(), logits + (size_t)(len - 1) * Vp, Vp * sizeof(float), cudaMemcpyDeviceToHost));
            int next = 0;
            if (temperature <= 0.0f) {
                next = (int)(std::max_element(last.begin(), last.begin() + V) - last.begin());
            } else {
                float mx = *std::max_element(last.begin(), last.begin() + V);
                std::vector<double> p(V);
                for (int j = 0; j < V; j++) { p[j] = std::exp((last[j] - mx) / temperature); }
                std::discrete_distribution<int> dist(p.begin(), p.end());
                next = dist(rng);
            }
            tokens.push_back(next);
        }
        return tokens;
    }
};

// ========================================================================================
// command line

struct Options {
    std::string preset = "tiny";
    SANConfig model;
    OptimizerConfig opt = [] {
        OptimizerConfig c;
        c.lr = -1.0;  // the optimizer's default (OptimizerConfig::resolve_rates)
        return c;
    }();
    int lr_scale_gpus = 1;
    std::string train_data, val_data, tokenizer_path, log_path, checkpoint_dir, resume_path, init_from;
    int batch_size = 8, seq_len = 0, grad_accum = 1;
    long steps = 100;
    int val_every = 50, val_batches = 8, sample_every = 0, sample_tokens = 64, save_every = 0, log_every = 1;
    float temperature = 1.0f;
    uint64_t seed = 42;
    int shuffle = 1;
};

std::vector<Flag> make_flags(Options& o) {
    SANConfig& m = o.model;
    OptimizerConfig& p = o.opt;
    return {
        make_flag("--preset", &o.preset, "model preset: tiny, tiny-ffn, demo, san20, ffn20 (iso-depth), ffn4 (iso-param), ffn9 (iso-FLOP); flags below override it"),
        make_flag("--vocab-size", &m.vocab_size, "real vocabulary size V (embedding padded to a multiple of 128)"),
        make_flag("--max-seq-len", &m.seq_len, "model context T (RoPE table size)"),
        make_flag("--n-layer", &m.n_layer, "layers L"),
        make_flag("--n-embd", &m.n_embd, "width d"),
        make_flag("--n-head", &m.n_head, "query heads"),
        make_flag("--n-kv-head", &m.n_kv_head, "kv heads (GQA; = n-head is MHA)"),
        make_flag("--ffn", &m.ffn, "none (SAN) | swiglu (FFN control arm)"),
        make_flag("--d-ff", &m.d_ff, "SwiGLU width (0: 4 d)"),
        make_flag("--norm", &m.norm, "zcn | rms"),
        make_flag("--qk-norm", &m.qk_norm, "per-head QK-norm 0|1"),
        make_flag("--residual", &m.residual, "gated | standard | rezero | none"),
        make_flag("--sandwich", &m.sandwich, "sandwich norm on sub-layer outputs 0|1"),
        make_flag("--rope-theta", &m.rope_theta, "RoPE base"),
        make_flag("--doc-mask", &m.doc_mask, "same-document attention and boundary-target masking 0|1"),
        make_flag("--bos-id", &m.bos_id, "token that starts a document"),
        make_flag("--z-loss", &m.z_loss, "z-loss coefficient"),
        make_flag("--train-data", &o.train_data, "training shards (glob, comma-separated globs)"),
        make_flag("--val-data", &o.val_data, "validation shards (glob); empty: no validation"),
        make_flag("--tokenizer", &o.tokenizer_path, "tokenizer .bin to decode samples (and take V from)"),
        make_flag("--batch-size", &o.batch_size, "rows per micro-batch B"),
        make_flag("--seq-len", &o.seq_len, "tokens per row (0: the model's T)"),
        make_flag("--grad-accum", &o.grad_accum, "micro-batches per optimizer step"),
        make_flag("--steps", &o.steps, "optimizer steps"),
        make_flag("--optimizer", &p.optimizer, "adamw | muon (Muon on the matrices, AdamW without decay on the rest)"),
        make_flag("--lr", &p.lr, "peak rate of the matrix group (<0: muon 0.02, adamw 6e-4)"),
        make_flag("--lr-other", &p.lr_other, "peak rate of embedding/gains/gates (<0: muon 3e-4, adamw same as --lr)"),
        make_flag("--lr-scale-gpus", &o.lr_scale_gpus, "scale the rates for N GPUs: AdamW rates x N, the Muon rate x sqrt(N)"),
        make_flag("--muon-order", &p.muon_order, "keller (momentum, then orthogonalise, shape factor) | paper (orthogonalise, then momentum)"),
        make_flag("--muon-momentum", &p.muon_momentum, "Muon momentum"),
        make_flag("--ns-steps", &p.ns_steps, "Newton-Schulz steps"),
        make_flag("--ns-fp32", &p.ns_fp32, "Newton-Schulz in fp32 also in bf16 builds 0|1"),
        make_flag("--weight-decay", &p.weight_decay, "decoupled weight decay (matrices only)"),
        make_flag("--beta1", &p.beta1, "AdamW beta1"),
        make_flag("--beta2", &p.beta2, "AdamW beta2"),
        make_flag("--eps", &p.eps, "AdamW epsilon"),
        make_flag("--grad-clip", &p.grad_clip, "global grad-norm clip (0: off)"),
        make_flag("--schedule", &p.schedule.kind, "wsd | cosine | linear | constant"),
        make_flag("--warmup-frac", &p.schedule.warmup_frac, "warmup fraction of the steps"),
        make_flag("--decay-frac", &p.schedule.decay_frac, "wsd: decay fraction of the steps"),
        make_flag("--final-frac", &p.schedule.final_frac, "final rate as a fraction of the peak"),
        make_flag("--seed", &o.seed, "seed of init, data order and sampling"),
        make_flag("--shuffle", &o.shuffle, "shuffle training windows 0|1"),
        make_flag("--val-every", &o.val_every, "validate every N steps (and at the end; 0: only at the end)"),
        make_flag("--val-batches", &o.val_batches, "validation micro-batches"),
        make_flag("--sample-every", &o.sample_every, "sample every N steps (0: only at the end)"),
        make_flag("--sample-tokens", &o.sample_tokens, "tokens per sample (0: no samples)"),
        make_flag("--temperature", &o.temperature, "sampling temperature (0: greedy)"),
        make_flag("--log", &o.log_path, "machine-readable log (JSON lines); empty: none"),
        make_flag("--log-every", &o.log_every, "print a progress line every N steps"),
        make_flag("--checkpoint-dir", &o.checkpoint_dir, "where checkpoints go (empty: none)"),
        make_flag("--save-every", &o.save_every, "checkpoint every N steps (0: only at the end)"),
        make_flag("--resume", &o.resume_path, "checkpoint to resume exactly (model, optimizer, data position, RNG)"),
        make_flag("--init-from", &o.init_from, "checkpoint to take the model config and parameters from"),
    };
}

// Parses argv: --preset first (it sets the model defaults), then every flag.
Options parse_args(int argc, char** argv) {
    Options o;
    std::string preset = find_flag_value(argc, argv, "--preset");
    if (!preset.empty()) { o.preset = preset; }
    auto all = presets();
    if (!all.count(o.preset)) { fatal("--preset: unknown preset '%s' (see -h)", o.preset.c_str()); }
    o.model = all[o.preset];
    parse_flags(argc, argv, make_flags(o), "train_san");
    return o;
}

// ========================================================================================
// main loop

#ifndef TESTING

// Validation loss over the first `batches` batches of the validation data, overall and
// per token region (the region of each target) when the shards have region sidecars.
struct ValResult {
    double loss = 0.0;
    double region_loss[4] = {0, 0, 0, 0};
    int64_t region_count[4] = {0, 0, 0, 0};
    bool has_regions = false;
};
ValResult evaluate(SAN& model, DataLoader& val, int batches) {
    val.reset();
    ValResult r;
    double weighted = 0.0;
    int64_t count = 0;
    std::vector<float> row_losses;
    for (int k = 0; k < batches; k++) {
        val.next_batch();
        LossStats s = model.forward(val.inputs.data(), val.targets.data(), val.B, val.T, 0.0f, &row_losses);
        weighted += s.ce_sum + model.cfg.z_loss * s.lse_sq_sum;
        count += s.count;
        if (val.has_regions) {
            r.has_regions = true;
            for (int b = 0; b < val.B; b++) {
                for (int t = 0; t < val.T; t++) {
                    int i = b * val.T + t;
                    if (model.host_targets_masked[i] < 0) { continue; }
                    int region = val.regions[(size_t)b * (val.T + 1) + t + 1];
                    r.region_loss[region] += row_losses[i];
                    r.region_count[region]++;
                }
            }
        }
    }
    r.loss = count > 0 ? weighted / count : 0.0;
    for (int g = 0; g < 4; g++) { r.region_loss[g] = r.region_count[g] > 0 ? r.region_loss[g] / r.region_count[g] : 0.0; }
    return r;
}

int main(int argc, char** argv) {
    setvbuf(stdout, nullptr, _IOLBF, 0);  // progress lines appear at once, also through pipes
    Options o = parse_args(argc, argv);
    int resume_data_epoch = 0;
    long long resume_data_step = 0;
    uint64_t resume_rng = 0;
    std::unique_ptr<TensorFileReader> checkpoint;
    if (!o.resume_path.empty() || !o.init_from.empty()) {
        if (!o.resume_path.empty() && !o.init_from.empty()) { fatal("--resume and --init-from are exclusive"); }
        const std::string& path = o.resume_path.empty() ? o.init_from : o.resume_path;
        checkpoint = std::make_unique<TensorFileReader>(path, TENSOR_FILE_CHECKPOINT);
        o.model = read_config(*checkpoint);
    }
    Tokenizer tokenizer;
    if (!o.tokenizer_path.empty()) {
        tokenizer.load(o.tokenizer_path);
        if (checkpoint == nullptr) { o.model.vocab_size = tokenizer.vocab_size; }
    }
    o.model.resolve_and_check();
    const SANConfig& c = o.model;
    if (o.seq_len == 0) { o.seq_len = c.seq_len; }
    o.opt.check();
    o.opt.resolve_rates(o.lr_scale_gpus);
    if (o.batch_size <= 0 || o.seq_len <= 0 || o.seq_len > c.seq_len) { fatal("--batch-size must be > 0 and 0 < --seq-len <= %d", c.seq_len); }
    if (o.grad_accum <= 0 || o.steps <= 0) { fatal("--grad-accum and --steps must be positive"); }
    if (o.train_data.empty()) { fatal("--train-data is required (e.g. \"data/offline/*_train_*.bin\"; make demo builds it)"); }
    o.opt.schedule.check(o.steps);

    // config, sizes, FLOPs
    auto counts = count_parameters(c);
    printf("train_san (%s, %s)\n", HOST_BACKEND ? "host backend" : "GPU", PRECISION_NAME);
    printf("model: L=%d d=%d heads %d/%d (head_dim %d) ffn=%s", c.n_layer, c.n_embd, c.n_head, c.n_kv_head, c.head_dim(), c.ffn.c_str());
    if (c.has_ffn()) { printf(" d_ff=%d", c.d_ff); }
    printf(" norm=%s qk_norm=%d residual=%s sandwich=%d rope_theta=%g doc_mask=%d z_loss=%g\n", c.norm.c_str(), c.qk_norm,
           c.residual.c_str(), c.sandwich, c.rope_theta, c.doc_mask, c.z_loss);
    printf("vocab %d (padded %d), context %d\n", c.vocab_size, c.padded_vocab(), c.seq_len);
    printf("parameters: %" PRId64 " total, %" PRId64 " non-embedding; %.2f MFLOPs/token\n", counts.first, counts.second,
           flops_per_token(c) / 1e6);
    printf("training: %ld steps x %d micro-batches x %d x %d tokens\n", o.steps, o.grad_accum, o.batch_size, o.seq_len);
    if (o.opt.is_muon()) {
        printf("optimizer: muon (%s order, momentum %g, %d NS steps in %s) lr %g, adamw on the rest lr %g",
               o.opt.muon_order.c_str(), o.opt.muon_momentum, o.opt.ns_steps,
               o.opt.ns_fp32 || PRECISION_MODE == PrecisionMode::FP32 ? "fp32" : "bf16", o.opt.lr, o.opt.lr_other);
    } else {
        printf("optimizer: adamw lr %g (other %g)", o.opt.lr, o.opt.lr_other);
    }
    printf("; wd %g clip %g, schedule %s\n", o.opt.weight_decay, o.opt.grad_clip, o.opt.schedule.kind.c_str());

    SAN model(c, o.batch_size, o.seq_len);
    if (checkpoint != nullptr) {
        model.load_parameters(*checkpoint, !o.resume_path.empty());
    } else {
        model.init_parameters(o.seed);
    }

    DataLoaderConfig train_cfg;
    train_cfg.pattern = o.train_data;
    train_cfg.B = o.batch_size;
    train_cfg.T = o.seq_len;
    train_cfg.shuffle = o.shuffle != 0;
    train_cfg.seed = o.seed;
    train_cfg.doc_start_token = c.doc_mask ? c.bos_id : -1;
    train_cfg.vocab_size = c.vocab_size;
    DataLoader train(train_cfg);
    std::unique_ptr<DataLoader> val;
    if (!o.val_data.empty()) {
        DataLoaderConfig val_cfg = train_cfg;
        val_cfg.pattern = o.val_data;
        val_cfg.shuffle = false;
        val = std::make_unique<DataLoader>(val_cfg);
    }
    std::mt19937_64 rng(o.seed);
    if (!o.resume_path.empty()) {
        resume_data_epoch = (int)checkpoint->integer("resume.data_epoch");
        resume_data_step = checkpoint->integer("resume.data_step");
        resume_rng = (uint64_t)std::stoull(checkpoint->str("resume.rng_seed"));
        DataPosition pos{resume_data_epoch, resume_data_step, (uint64_t)std::stoull(checkpoint->str("resume.data_fingerprint"))};
        train.set_position(pos);
        rng.seed(resume_rng);
        printf("resumed from %s at step %" PRId64 "\n", o.resume_path.c_str(), model.steps_done());
    }
    checkpoint.reset();
    FILE* log = nullptr;
    if (!o.log_path.empty()) {
        log = fopen(o.log_path.c_str(), model.steps_done() > 0 ? "a" : "w");
        if (log == nullptr) { fatal("cannot open log file '%s': %s", o.log_path.c_str(), strerror(errno)); }
    }
    auto save = [&](const std::string& name) {
        if (o.checkpoint_dir.empty()) { return; }
        DataPosition pos = train.position();
        uint64_t rng_seed = rng();  // reseeding from a drawn value makes the resumed stream exact
        rng.seed(rng_seed);
        std::string path = o.checkpoint_dir + "/" + name;
        model.save_checkpoint(path, o.opt, {{"resume.data_epoch", std::to_string(pos.epoch)},
                                            {"resume.data_step", std::to_string(pos.step)},
                                            {"resume.data_fingerprint", std::to_string(pos.fingerprint)},
                                            {"resume.rng_seed", std::to_string(rng_seed)}});
        printf("saved %s\n", path.c_str());
    };
    auto print_sample = [&]() {
        if (o.sample_tokens <= 0) { return; }
        std::vector<int> out = model.sample({c.bos_id}, o.sample_tokens, o.temperature, rng);
        printf("sample: ");
        if (tokenizer.loaded()) {
            printf("%s\n", tokenizer.decode(out).c_str());
        } else {
            for (int t : out) { printf("%d ", t); }
            printf("\n");
        }
    };
    auto validate = [&](long step) {
        if (val == nullptr) { return; }
        ValResult r = evaluate(model, *val, o.val_batches);
        printf("step %ld: val loss %.4f", step, r.loss);
        static const char* names[4] = {"other", "query", "trace", "answer"};
        if (r.has_regions) {
            for (int g = 0; g < 4; g++) {
                if (r.region_count[g] > 0) { printf(" | %s %.4f", names[g], r.region_loss[g]); }
            }
        }
        printf("\n");
        if (log != nullptr) {
            fprintf(log, "{\"step\": %ld, \"val_loss\": %.6f", step, r.loss);
            for (int g = 0; g < 4 && r.has_regions; g++) {
                if (r.region_count[g] > 0) { fprintf(log, ", \"val_loss_%s\": %.6f", names[g], r.region_loss[g]); }
            }
            fprintf(log, "}\n");
            fflush(log);
        }
    };

    const double tokens_per_step = (double)o.grad_accum * o.batch_size * o.seq_len;
    double total_ms = 0.0;
    long first_step = (long)model.steps_done();
    for (long step = first_step; step < o.steps; step++) {
        Timer timer;
        model.zero_grad();
        double loss = 0.0;
        for (int micro = 0; micro < o.grad_accum; micro++) {
            train.next_batch();
            int64_t count = 0;
            for (int i = 0; i < o.batch_size * o.seq_len; i++) {
                int y = train.targets[i];
                count += y >= 0 && !(c.doc_mask && y == c.bos_id);
            }
            float scale = 1.0f / (float)(std::max<int64_t>(count, 1) * o.grad_accum);
            LossStats s = model.forward(train.inputs.data(), train.targets.data(), o.batch_size, o.seq_len, scale);
            model.backward();
            loss += s.loss(c.z_loss) / o.grad_accum;
        }
        if (!std::isfinite(loss)) { fatal("step %ld: loss is %f: the run diverged", step + 1, loss); }
        double f = o.opt.schedule.multiplier(step, o.steps);
        float grad_norm = model.update(o.opt, o.opt.lr * f, o.opt.lr_other * f);
        cudaCheck(cudaDeviceSynchronize());
        double ms = timer.ms();
        total_ms += ms;
        long done = step + 1;
        double eta_s = total_ms / (done - first_step) * (o.steps - done) / 1e3;
        if (done % o.log_every == 0 || done == o.steps || done == first_step + 1) {
            printf("step %5ld/%ld | loss %.4f | lr %.3e | norm %6.3f | %7.1f ms | %8.0f tok/s | eta %.0fs\n", done, o.steps,
                   loss, o.opt.lr * f, grad_norm, ms, tokens_per_step / (ms / 1e3), eta_s);
        }
        if (log != nullptr) {
            fprintf(log, "{\"step\": %ld, \"loss\": %.6f, \"lr\": %.6e, \"grad_norm\": %.6f, \"ms\": %.2f}\n", done, loss,
                    o.opt.lr * f, grad_norm, ms);
            fflush(log);
        }
        if (o.val_every > 0 && done % o.val_every == 0 && done != o.steps) { validate(done); }
        if (o.sample_every > 0 && done % o.sample_every == 0 && done != o.steps) { print_sample(); }
        if (o.save_every > 0 && done % o.save_every == 0 && done != o.steps) { save("step_" + std::to_string(done) + ".bin"); }
    }
    validate(o.steps);
    print_sample();
    save("final.bin");
    if (log != nullptr) { fclose(log); }
    return 0;
}
#endif
