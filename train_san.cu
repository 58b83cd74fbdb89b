/*
train_san.cu: trains the SAN family (the SAN paper; doc/san-model.md): attention-only
transformers ("Simple Attention Networks") and, from the same code, their FFN control
arm, which differs only by a SwiGLU block after each attention block.

Reads top to bottom: config -> parameters -> a block -> the model (forward, backward) ->
command line (options, presets, recipes) -> main, which hands the run to llmc/train/
(trainer.h: main's set-up; training.h: the loop; run_outputs.h: its files). The kernels live
in llmc/; every matmul goes through llmc/kernels/gemm.cuh. Built by nvcc for the GPU and by g++ for the host backend (llmc/hostcuda.h)
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
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "llmc/utils.h"
#include "llmc/cuda_common.h"
#include "llmc/kernels/gemm.cuh"
#include "llmc/kernels/reduce.cuh"
#include "llmc/kernels/embedding.cuh"
#include "llmc/kernels/norm.cuh"
#include "llmc/kernels/rope.cuh"
#include "llmc/mixers/attention_kinds.h"  // AttnKind, the layouts
#include "llmc/mixers/registry.h"         // make_token_mixer: each attention kind's TokenMixer (llmc/mixers/)
#include "llmc/model/fixed_qk_input.h"   // rndembqk, fixedseqqk: FixedQKInput, the fixed row's model state
#include "llmc/kernels/kv_cache.cuh"
#include "llmc/model/swiglu_mlp.h"        // SwiGLUMLP: the FFN arm's body
#include "llmc/model/layer_weights.h"     // LayerWeights: a layer's tensors by name
#include "llmc/kernels/residual.cuh"
#include "llmc/kernels/residual_norm.cuh"
#include "llmc/kernels/classifier.cuh"
#include "llmc/model/spectrum.h"          // effective_rank (the per-layer measurements)
#include "llmc/model/attention_indicators.h"  // attention_patterns: indicators, logit summary (the per-layer measurements)
#include "llmc/model/parameters.h"        // ModelParameters: parameters, gradients, optimizer
#include "llmc/train/trainer.h"           // trainer_main: main's sequence, run_training; model.h: counts, sample
#include "llmc/train/preset_files.h"      // compiled_config_files: presets/NAME.conf and presets/recipes/NAME.conf

constexpr float kNormEps = 1e-6f;
constexpr float kInitStd = 0.02f;

// ========================================================================================
// config

enum class FfnKind { None, SwiGLU };
inline const Choices<FfnKind> kFfnKinds{{"none", "swiglu"}};
enum class NormKind { ZCN, RMS };
inline const Choices<NormKind> kNormKinds{{"zcn", "rms"}};
// The embedding's output multiplier: sqrt(d) (the SAN paper's, Gemma-style) or 1 (Qwen2.5's, GPT-2's)
enum class EmbedScale { SqrtD, One };
inline const Choices<EmbedScale> kEmbedScales{{"sqrt-d", "1"}};
// The output projections' init (attention's W_o, the SwiGLU's W_down): N(0, 0.02 / sqrt(2 L)), GPT-2's
// residual scaling, or N(0, 0.02) like every other matrix (Qwen2.5's, Hugging Face's initializer_range)
enum class OutInit { Scaled, Plain };
inline const Choices<OutInit> kOutInits{{"scaled", "plain"}};

// The sizes (vocabulary, context, layers, width, query heads, BOS) are ModelDims' (llmc/model/model.h).
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
    EmbedScale embed_scale = EmbedScale::SqrtD;
    OutInit out_init = OutInit::Scaled;
    // the attention variants of "Deconstructing Attention" (doc/deconstructing.md)
    AttnKind attention = AttnKind::Standard;  // the kind of every layer the layout does not keep standard
    std::string layout = "uniform";           // which layers keep standard attention (llmc/mixers/attention_kinds.h)
    TaylorNorm taylor_norm = TaylorNorm::Joint;  // approximate: Based's joint feature map, or the paper's terms
    std::vector<AttnKind> kinds;              // resolved by resolve_and_check: one per layer

    int kv_width() const { return n_kv_head * head_dim(); }
    int64_t embedding_numel() const { return (int64_t)padded_vocab() * n_embd; }
    bool has_ffn() const { return ffn == FfnKind::SwiGLU; }
    // what the embedding lookup multiplies by (forward, and the same factor in its backward)
    float embed_multiplier() const { return embed_scale == EmbedScale::SqrtD ? std::sqrt((float)n_embd) : 1.0f; }
    // ZCN gains are stored as an offset from 1, RMSNorm gains as the gain itself
    float gain_offset() const { return norm == NormKind::ZCN ? 1.0f : 0.0f; }
    AttnKind kind(int layer) const { return kinds[layer]; }
    // layer l's token mixer (llmc/mixers/registry.h), unallocated: parameter_spec asks it for its
    // tensors, the model binds and allocates it
    MixerDims mixer_dims() const {
        MixerDims m;
        m.d = n_embd, m.Hq = n_head, m.Hkv = n_kv_head, m.hd = head_dim(), m.context = seq_len;
        m.qk_norm = qk_norm != 0;
        m.taylor_norm = taylor_norm;
        m.gain_offset = gain_offset(), m.gain_init = norm == NormKind::ZCN ? 0.0f : 1.0f, m.norm_eps = kNormEps;
        m.init_std = kInitStd;
        m.out_std = out_init == OutInit::Scaled ? kInitStd / std::sqrt(2.0f * n_layer) : kInitStd;
        m.fixed_input_std = kInitStd * embed_multiplier();  // the embedding's N(0, 0.02) times its multiplier
        return m;
    }
    std::unique_ptr<TokenMixer> mixer(int layer) const { return make_token_mixer(kinds[layer], mixer_dims()); }
    // whether some layer takes q, k from the fixed row (rndembqk, fixedseqqk), or from x0 (staticembqk)
    bool reads_fixed_row() const { return any_mixer(&TokenMixer::reads_fixed_row); }
    bool reads_embedding() const { return any_mixer(&TokenMixer::reads_embedding); }
    bool any_mixer(bool (TokenMixer::*what)() const) const {
        for (int l = 0; l < n_layer; l++) {
            if ((*mixer(l).*what)()) { return true; }
        }
        return false;
    }
    // the residual stream's norms (pre-norms, sandwich norms, the final norm)
    GainNorm stream_norm(Weight gain) const { return {gain, n_embd, gain_offset(), kNormEps}; }
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

    // --attention and --layout -> one kind per layer (llmc/mixers/attention_kinds.h)
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

// The model's flags (every setting of SANConfig), after --preset: what a preset file sets.
std::vector<Flag> model_flags(std::string* preset, SANConfig& m) {
    std::vector<Flag> flags = ModelDims::flags(
        preset, m, preset_flag_help("presets/"),
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
        make_flag("--embed-scale", &m.embed_scale, kEmbedScales, "the embedding's output multiplier (the qwen presets: 1)"),
        make_flag("--out-init", &m.out_init, kOutInits, "W_o, W_down init: N(0, 0.02/sqrt(2L)) or N(0, 0.02) (the qwen presets: plain)"),
        make_flag("--attention", &m.attention, kAttnKinds, "kind of the layers the layout does not keep standard (doc/deconstructing.md; rndembqk: q, k from a fixed random input run through the model; fixedseqqk: from the first seq_len tokens of --train-data)"),
        make_flag("--layout", &m.layout, "layers that keep standard attention: uniform (none), hybrid, even, odd, top-simple, middle-simple, bottom-simple, quarter, first, last, bilateral, or a list like 1,24"),
        make_flag("--taylor-norm", &m.taylor_norm, kTaylorNorms, "approximate: Based's joint feature map, or the paper's separately normalised terms"),
    };
    flags.insert(flags.end(), san.begin(), san.end());
    return flags;
}

// A preset's default peak rates for one arm (the preset with this --ffn), the best of a sweep at
// one vocabulary (default_rates below).
struct SweptRates {
    FfnKind ffn;
    int vocab_size;
    double muon, muon_other, adamw;  // Muon's matrix rate and its AdamW side; AdamW's rate
    std::string source;              // as the optimizer line prints it
};

// A preset: presets/NAME.conf, compiled in (llmc/train/preset_files.h). The file sets every
// model flag, so a preset is its file alone (no default of SANConfig's shows through); its other
// keys are its swept rates (swept-*: the sweep, its report, the vocabulary swept, and per arm
// swept-[ffn-KIND-]muon, -muon-other, -adamw) and tuned-for (the recipe its default rates were
// tuned for: print_model warns when a run leaves it out).
struct SANPreset {
    SANConfig model;  // unresolved (d_ff 0: 4 d), as the flags read it
    std::string tuned_for;
    std::vector<SweptRates> swept;
};

std::vector<SweptRates> read_swept_rates(const ConfigFile& f, const SANConfig& model,
                                         const std::map<std::string, const ConfigEntry*>& keys) {
    auto text = [&](const std::string& key) {
        auto it = keys.find(key);
        if (it == keys.end()) { fatal("%s has swept rates but no %s (the sweep that chose them)", f.path.c_str(), key.c_str()); }
        return it->second;
    };
    const ConfigEntry* vocab = text("swept-vocab-size");
    std::map<std::string, std::map<std::string, double>> arms;  // {"" or "ffn-swiglu-": {muon: rate, ...}}
    for (const auto& [key, e] : keys) {
        if (key == "swept-by" || key == "swept-study" || key == "swept-report" || key == "swept-vocab-size") { continue; }
        std::string arm = key.substr(strlen("swept-")), rate;  // swept-ARM-RATE
        for (const std::string r : {"muon-other", "muon", "adamw"}) {
            const bool ends_with_r = arm.size() >= r.size() && arm.compare(arm.size() - r.size(), r.size(), r) == 0;
            if (rate.empty() && ends_with_r) {
                rate = r;
                arm.resize(arm.size() - r.size());
            }
        }
        FfnKind ffn;
        const bool known_arm = arm.empty() || (arm.rfind("ffn-", 0) == 0 && arm.back() == '-' &&
                                               kFfnKinds.parse(arm.substr(4, arm.size() - 5).c_str(), &ffn));
        if (rate.empty() || !known_arm) {
            fatal("%s line %d: unknown key '%s' (swept rates are swept-[ffn-KIND-]muon, -muon-other, -adamw)",
                  f.path.c_str(), e->line, key.c_str());
        }
        arms[arm][rate] = f.real(*e);
    }
    std::vector<SweptRates> out;
    for (const auto& [arm, rates] : arms) {
        if (rates.size() != 3) { fatal("%s: the swept rates of swept-%s* need muon, muon-other and adamw", f.path.c_str(), arm.c_str()); }
        SweptRates s;
        s.ffn = model.ffn;
        if (!arm.empty()) { kFfnKinds.parse(arm.substr(4, arm.size() - 5).c_str(), &s.ffn); }
        s.vocab_size = (int)f.real(*vocab);
        s.muon = rates.at("muon"), s.muon_other = rates.at("muon-other"), s.adamw = rates.at("adamw");
        s.source = text("swept-by")->value + " of --preset " + f.name() +
                   (s.ffn != model.ffn ? std::string(" --ffn ") + kFfnKinds.name(s.ffn) : "") + " at V " +
                   std::to_string(s.vocab_size) + " (" + text("swept-study")->value + ")";
        text("swept-report");  // the run doc that chose them (the Python test checks the rates against it)
        out.push_back(s);
    }
    return out;
}

SANPreset read_preset(const ConfigFile& f) {
    SANPreset p;
    std::string unused;
    std::vector<Flag> flags = model_flags(&unused, p.model);
    flags.erase(flags.begin());  // --preset: a preset does not name another
    std::map<std::string, const ConfigEntry*> swept;
    read_model_preset(f, flags, "train_san", [&](const ConfigEntry& e) {
        if (e.key == "tuned-for") {
            p.tuned_for = e.value;
            compiled_config_file("presets/recipes/" + e.value + ".conf");  // (fails for a recipe that is not one)
        } else if (e.key.rfind("swept-", 0) == 0) {
            swept[e.key] = &e;
        } else {
            return false;
        }
        return true;
    });
    if (!swept.empty()) { p.swept = read_swept_rates(f, p.model, swept); }
    return p;
}

// Every preset (presets/NAME.conf), read once.
const std::map<std::string, SANPreset>& san_presets() {
    static const std::map<std::string, SANPreset> all = [] {
        std::map<std::string, SANPreset> out;
        for (const ConfigFile* f : compiled_config_files_in("presets/")) { out[f->name()] = read_preset(*f); }
        return out;
    }();
    return all;
}

std::map<std::string, SANConfig> presets() {
    std::map<std::string, SANConfig> out;
    for (const auto& [name, p] : san_presets()) { out[name] = p.model; }
    return out;
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
    // written only when not the default, so the files of every earlier config stay byte for byte as they were
    if (c.embed_scale != EmbedScale::SqrtD) { w.set("embed_scale", std::string(kEmbedScales.name(c.embed_scale))); }
    if (c.out_init != OutInit::Scaled) { w.set("out_init", std::string(kOutInits.name(c.out_init))); }
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
    if (r.has_key("embed_scale")) { read_choice(r, "embed_scale", kEmbedScales, &c.embed_scale); }  // absent: sqrt-d
    if (r.has_key("out_init")) { read_choice(r, "out_init", kOutInits, &c.out_init); }              // absent: scaled
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
    const int64_t d = c.n_embd;
    const MixerDims dims = c.mixer_dims();
    const bool gated = residual_has_gate(c.residual);
    std::vector<ParamSpec> spec;
    spec.push_back({"wte", {c.padded_vocab(), d}, false, kInitStd, 0.0f, c.vocab_size});
    // a sub-layer's tensors: its pre-norm, its body's, its sandwich norm and its gate
    auto sublayer = [&](const std::string& prefix, const std::string& name, const auto& add_body) {
        spec.push_back({prefix + name + "_norm.weight", {d}, false, 0.0f, dims.gain_init});
        add_body(prefix + name + ".");
        if (c.sandwich) { spec.push_back({prefix + name + "_post_norm.weight", {d}, false, 0.0f, dims.gain_init}); }
        if (gated) { spec.push_back({prefix + name + "_gate", {1}, false, 0.0f, 0.0f}); }
    };
    for (int l = 0; l < c.n_layer; l++) {
        const std::string prefix = "layers." + std::to_string(l) + ".";
        sublayer(prefix, "attn", [&](const std::string& p) { c.mixer(l)->add_parameters(spec, p); });
        if (c.has_ffn()) {
            sublayer(prefix, "ffn", [&](const std::string& p) {
                SwiGLUMLP(c.n_embd, c.d_ff).add_parameters(spec, p, kInitStd, dims.out_std);
            });
        }
    }
    spec.push_back({"final_norm.weight", {d}, false, 0.0f, dims.gain_init});
    return spec;
}

// Training FLOPs per token: llmc/model/model.h's convention (as train_san.py), with the 12 * T * d of
// scores and values counted only for the layers whose mixer mixes over T x T pairs (not mlp,
// which mixes nothing, nor nonapprox, whose scores are one per position). Found instead of
// model.h's template by argument-dependent lookup. (rndembqk / fixedseqqk: the fixed row's cost
// per micro-batch is not in it, nor the real rows' q, k projections that they skip;
// describe_attention says so.)
double flops_per_token(const SANConfig& c) {
    double nonemb = (double)count_parameters(c).non_embedding;
    int pairwise = 0;
    for (int l = 0; l < c.n_layer; l++) { pairwise += c.mixer(l)->mixes_pairs(); }
    return 6.0 * (nonemb + (double)c.vocab_size * c.n_embd) + 12.0 * pairwise * (double)c.seq_len * c.n_embd;
}

// One line on the attention of each layer, and what the variant's mixer says of itself.
std::string describe_attention(const SANConfig& c) {
    std::string out = std::string("attention: ") + kAttnKinds.name(c.attention) + ", layout " + c.layout +
                      " (layers: " + c.layer_kinds_text() + ")";
    if (c.attention != AttnKind::Standard) { out += make_token_mixer(c.attention, c.mixer_dims())->describe(); }
    return out;
}

// Whether a and b are one model but for the context and BOS id (which the data set): their
// checkpoint configs agree on every other key (write_config records every model setting).
bool same_model_but_context(SANConfig a, const SANConfig& b) {
    a.seq_len = b.seq_len, a.bos_id = b.bos_id;
    a.resolve_and_check();
    TensorFileWriter wa(TENSOR_FILE_CHECKPOINT), wb(TENSOR_FILE_CHECKPOINT);
    write_config(wa, a);
    write_config(wb, b);
    return wa.config() == wb.config();
}

// Default peak rates (per device, before --lr-scale-gpus; llmc/optim/optimizer.h DefaultRates).
// Every model takes the SAN paper's locked rates for its arm (presets/rates/san-paper.conf),
// except the small presets' models at the vocabulary they were swept at: those take the best
// rates of the sweep their preset file names (swept-*; doc/san-model.md "Default rates"). A model is
// such a preset's when its config is the preset's with that vocabulary, up to the context and BOS
// id; so tiny at its own V 250, or any preset with its size changed (--n-layer 12), goes back to
// the paper's rates. --lr and --lr-other override both.
DefaultRates default_rates(const SANConfig& c) {
    DefaultRates r = compiled_default_rates("presets/rates/san-paper.conf", c.has_ffn() ? "ffn" : "san");
    for (const auto& [name, preset] : san_presets()) {
        for (const SweptRates& s : preset.swept) {
            if (c.vocab_size != s.vocab_size) { continue; }
            SANConfig p = preset.model;
            p.ffn = s.ffn;
            p.vocab_size = s.vocab_size;
            if (!same_model_but_context(p, c)) { continue; }
            r.muon = s.muon;
            r.muon_other = s.muon_other;
            r.adamw = s.adamw;
            r.source = s.source;
        }
    }
    return r;
}

// ========================================================================================
// a block: two pre-norm residual sub-layers, the token mixer's and (FFN arm) the SwiGLU's

// x_out = residual(x, branch): branch = body(norm(x)), through the sandwich norm when on
// (doc/san-model.md "Forward pass"). The body (the layer's token mixer, or the FFN) reads
// `in` and writes `out`; the sub-layer keeps what its own backward needs.
struct SubLayer {
    GainNorm norm, post_norm;
    Weight gate;
    ResidualMode mode = ResidualMode::Gated;
    bool sandwich = false;
    floatX *in = nullptr, *out = nullptr, *out_normed = nullptr;  // norm(x); the body's output; its sandwich norm
    float *in_rstd = nullptr, *out_rstd = nullptr;

    // name: "attn" or "ffn" (its tensors: <name>_norm.weight, <name>_post_norm.weight, <name>_gate)
    void bind(const LayerWeights& w, const std::string& name, const SANConfig& c) {
        norm = c.stream_norm(w[name + "_norm.weight"]);
        post_norm = c.stream_norm(w[name + "_post_norm.weight"]);
        gate = w[name + "_gate"];
        mode = c.residual;
        sandwich = c.sandwich != 0;
    }
    void allocate(DeviceArena& arena, size_t N, size_t d) {
        in = arena.alloc<floatX>(N * d);
        in_rstd = arena.alloc<float>(N);
        out = arena.alloc<floatX>(N * d);
        if (sandwich) {
            out_normed = arena.alloc<floatX>(N * d);
            out_rstd = arena.alloc<float>(N);
        }
    }
    void forward_in(const floatX* x, int N, cudaStream_t stream) { norm.forward(in, in_rstd, x, N, stream); }
    // next: the sub-layer that reads x_out, whose pre-norm the residual add then writes too
    // (llmc/kernels/residual_norm.cuh), or null
    void forward_out(floatX* x_out, const floatX* x, int N, cudaStream_t stream, SubLayer* next = nullptr) {
        const floatX* branch = out;
        if (sandwich) {
            post_norm.forward(out_normed, out_rstd, out, N, stream);
            branch = out_normed;
        }
        if (next != nullptr) {
            residual_norm_forward(x_out, x, branch, gate.w, mode, next->norm, next->in, next->in_rstd, N, stream);
        } else {
            residual_forward(x_out, x, branch, gate.w, mode, (size_t)N * norm.C, stream);
        }
    }
    // dx holds dL/d x_out; returns dL/d out (the body's output) and, with mode none, clears dx.
    // branch_done: the backward above already wrote s.d_branch (backward_in's `below`).
    floatX* backward_out(floatX* dx, int N, const BackwardScratch& s, cudaStream_t stream,
                         bool branch_done = false) const {
        const size_t Nd = (size_t)N * norm.C;
        const floatX* h = sandwich ? out_normed : out;
        if (!branch_done) { residual_branch_grad(s.d_branch, dx, gate.w, mode, Nd, stream); }
        residual_gate_backward(gate.grad, s.reduce, dx, h, gate.w, mode, Nd, stream);
        if (mode == ResidualMode::None) { cudaCheck(cudaMemsetAsync(dx, 0, Nd * sizeof(floatX), stream)); }
        if (!sandwich) { return s.d_branch; }
        cudaCheck(cudaMemsetAsync(s.d_proj, 0, Nd * sizeof(floatX), stream));
        post_norm.backward(s.d_proj, s.d_branch, out, out_rstd, N, s.reduce, stream);
        return s.d_proj;
    }
    // dx += dL/dx through the pre-norm, from d_in = dL/d in; with `below` (the sub-layer whose
    // residual add wrote x) also s.d_branch = below's branch gradient, its backward_out's first pass
    void backward_in(floatX* dx, const floatX* d_in, const floatX* x, int N, const BackwardScratch& s,
                     cudaStream_t stream, const SubLayer* below = nullptr) const {
        if (below != nullptr) {
            residual_norm_backward(dx, s.d_branch, d_in, x, in_rstd, norm, below->gate.w, below->mode, N, s.reduce, stream);
        } else {
            norm.backward(dx, d_in, x, in_rstd, N, s.reduce, stream);
        }
    }
};

struct Block {
    SubLayer attn, ffn;                 // ffn: the FFN arm's
    std::unique_ptr<TokenMixer> mixer;  // the attention sub-layer's body (llmc/mixers/)
    SwiGLUMLP ffn_body;                 // the FFN sub-layer's
    floatX* x_mid = nullptr;            // the stream between the two (FFN arm)
};

// ========================================================================================
// the model

// --skip-nonstandard: evaluate a trained hybrid without its non-standard attention sub-layers
// (Attention) or without those layers' whole blocks (Block), the paper's "skip" column.
enum class SkipNonstandard { None, Attention, Block };

// The model: its parameters, gradients and optimizer, the residual stream, logits and loss
// buffers (llmc/model/model.h LanguageModel) and, for B rows of T positions, the blocks'
// activations and the backward's shared scratch.
struct SAN : LanguageModel<SANConfig> {
    std::vector<Block> blocks;
    floatX* xf = nullptr;  // the final norm's output
    float* xf_rstd = nullptr;
    int* d_doc_ids = nullptr;
    float* rope = nullptr;
    BackwardScratch scratch;
    floatX *d_block_in = nullptr, *dx0 = nullptr;  // dL/d(a sub-layer's normed input); dL/d x0 (staticembqk)
    SkipNonstandard skip = SkipNonstandard::None;  // evaluation only: backward() refuses it
    std::vector<int> host_targets_masked;
    // rndembqk, fixedseqqk (llmc/model/fixed_qk_input.h): the fixed input (model state, host copy as in
    // files), rndembqk's eps on the device, and whether the last forward ran the fixed row
    bool has_fixed_row = false;
    FixedQKInput fixed;
    floatX* fixed_eps = nullptr;
    int fixed_row = 0;

    // The activations hold one row more than `batch` for the fixed row of rndembqk / fixedseqqk.
    SAN(const SANConfig& config, int batch, int seq)
        : LanguageModel(config, batch + (config.reads_fixed_row() ? 1 : 0), seq), has_fixed_row(config.reads_fixed_row()) {
        build_blocks();
        allocate_activations();
        if (has_fixed_row) {
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

    // each layer's mixer and sub-layers, bound to their tensors in the parameter buffers
    void build_blocks() {
        blocks.resize(cfg.n_layer);
        for (int l = 0; l < cfg.n_layer; l++) {
            Block& b = blocks[l];
            LayerWeights weights(spec, "layers." + std::to_string(l) + ".", params, grads);
            b.attn.bind(weights, "attn", cfg);
            b.mixer = cfg.mixer(l);
            b.mixer->bind(weights);
            if (cfg.has_ffn()) {
                b.ffn.bind(weights, "ffn", cfg);
                b.ffn_body = SwiGLUMLP(cfg.n_embd, cfg.d_ff);
                b.ffn_body.bind(weights, "ffn.");
            }
        }
    }

    void allocate_activations() {
        const size_t N = (size_t)B * T, d = cfg.n_embd, qd = (size_t)cfg.n_head * cfg.head_dim();
        const size_t kvd = (size_t)cfg.kv_width();
        ScratchSizes sizes;
        if (cfg.has_ffn()) { sizes.swiglu_width = cfg.d_ff; }
        for (Block& b : blocks) {
            b.attn.allocate(arena, N, d);
            b.mixer->allocate(arena, N);
            b.mixer->size_scratch(sizes, B, T);
            if (cfg.has_ffn()) {
                b.x_mid = arena.alloc<floatX>(N * d);
                b.ffn.allocate(arena, N, d);
                b.ffn_body.allocate(arena, N);
            }
        }
        xf = arena.alloc<floatX>(N * d);
        xf_rstd = arena.alloc<float>(N);
        d_doc_ids = arena.alloc<int>(N);
        d_block_in = arena.alloc<floatX>(N * d);
        scratch.d_branch = arena.alloc<floatX>(N * d);
        scratch.d_proj = arena.alloc<floatX>(N * d);
        if (sizes.attention) {
            scratch.d_o = arena.alloc<floatX>(N * qd);
            scratch.d_q = arena.alloc<floatX>(N * qd);
            scratch.d_k = arena.alloc<floatX>(N * kvd);
            scratch.d_v = arena.alloc<floatX>(N * kvd);
            scratch.d_q_lin = arena.alloc<floatX>(N * qd);
            scratch.d_k_lin = arena.alloc<floatX>(N * kvd);
        }
        if (sizes.qk_in) { scratch.d_qk_in = arena.alloc<floatX>(N * d); }
        if (cfg.reads_embedding()) { dx0 = arena.alloc<floatX>(N * d); }
        if (sizes.kernel_floats > 0) { scratch.kernels = arena.alloc<float>(sizes.kernel_floats); }
        if (sizes.swiglu_width > 0) {
            scratch.swiglu.d_h = arena.alloc<floatX>(N * sizes.swiglu_width);
            scratch.swiglu.d_gate = arena.alloc<floatX>(N * sizes.swiglu_width);
            scratch.swiglu.d_up = arena.alloc<floatX>(N * sizes.swiglu_width);
        }
        size_t reduce_floats = std::max({norm_backward_scratch_floats((int)N, (int)d),
                                         norm_backward_scratch_floats((int)(N * cfg.n_head), cfg.head_dim()),
                                         attention_backward_scratch_floats(B, T, cfg.n_head, cfg.head_dim()),
                                         (size_t)kReduceBlocks + 1});
        scratch.reduce = arena.alloc<float>(reduce_floats);
    }

    // ---- the fixed QK input (rndembqk, fixedseqqk): model state, not a parameter ------------
    // A fresh model's: rndembqk draws eps from the seed, fixedseqqk takes the first seq_len
    // tokens of the training data (`train_data`, the --train-data pattern).
    void init_fixed_input(uint64_t seed, const std::string& train_data) {
        if (!has_fixed_row) { return; }
        if (fixed.random) {
            fixed.draw(seed, cfg.mixer_dims().fixed_input_std);
            upload_fixed_input();
        } else {
            fixed.take_first_tokens(train_data);
        }
    }
    void write_state(TensorFileWriter& w) const override {
        if (has_fixed_row) { fixed.write(w); }
    }
    void read_state(const TensorFileReader& r) override {
        if (!has_fixed_row) { return; }
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
    bool fixed_row_needed() const { return has_fixed_row && skip == SkipNonstandard::None; }

    // ---- loss bookkeeping (llmc/model/model.h, training.h) -------------------------------------
    // A target counts if it is >= 0 and, with the document mask, not the BOS of the next
    // document (doc/san-model.md, "Document mask and loss mask").
    bool counts_in_loss(int target) const { return target >= 0 && !(cfg.doc_mask && target == cfg.bos_id); }
    int doc_start_token() const { return cfg.doc_mask ? cfg.bos_id : -1; }
    double loss_value(const LossStats& s) const { return s.loss(cfg.z_loss); }
    double z_loss_coefficient() const { return cfg.z_loss; }
    const std::vector<int>& loss_targets() const { return host_targets_masked; }

    // What the mixers of one call share: its rows, mask, RoPE table, cache and scratch.
    MixerPass mixer_pass(int Bn, int Rn, int Tn, KVCache* cache) const {
        MixerPass s;
        s.Bn = Bn, s.Rn = Rn, s.Tn = Tn;
        s.doc_ids = !cfg.doc_mask ? nullptr : cache != nullptr ? cache->doc : d_doc_ids;
        s.rope = rope;
        s.cache = cache;
        s.x0 = residual[0];
        s.dx0 = dx0;
        s.scratch = &scratch;
        s.stream = stream;
        return s;
    }
    MixerPass layer_pass(MixerPass s, int l) const {
        s.layer = l;
        s.pre_norm = &blocks[l].attn.norm;
        return s;
    }
    bool skipped(int l) const { return skip != SkipNonstandard::None && cfg.kind(l) != AttnKind::Standard; }

    // ---- forward ------------------------------------------------------------------------
    // inputs, targets: host (Bn, Tn) token ids (targets < 0 are ignored). Computes the loss;
    // with dloss_scale != 0 also leaves d(loss * dloss_scale)/d logits for backward().
    // Returns the per-row statistics: the loss is their ce + z * lse_sq over the count;
    // row_losses, if given, receives each position's cross-entropy.
    // With `cache` (sampling): one position, Bn = Tn = 1, at cache->pos: its keys and values
    // go into the cache and its query attends over the cached rows (llmc/kernels/kv_cache.cuh).
    LossStats forward(const int* inputs, const int* targets, int Bn, int Tn, float dloss_scale,
                      std::vector<float>* row_losses = nullptr, KVCache* cache = nullptr) {
        // rndembqk, fixedseqqk: the fixed stream rides along as one more row after the Bn real
        // rows (row Bn), through every layer; it has no targets. --skip-nonstandard leaves out the
        // layers that read it, and so the row.
        const int F = fixed_row_needed() ? 1 : 0;
        if (F && cache != nullptr) { fatal("forward: a cached step has no fixed row (sample() recomputes the window)"); }
        begin_forward(Bn + F, Tn, dloss_scale, cache);
        fixed_row = F;
        const int N = (Bn + F) * Tn;
        const size_t bytes = (size_t)N * cfg.n_embd * sizeof(floatX);
        const int64_t count = embed_batch(inputs, targets, Bn, Tn, F, cache, dloss_scale != 0.0f);
        const MixerPass pass = mixer_pass(Bn, Bn + F, Tn, cache);
        bool normed = false;  // the residual add before this sub-layer wrote its pre-norm too
        for (int l = 0; l < cfg.n_layer; l++) {
            Block& b = blocks[l];
            floatX *x = residual[l], *x_out = residual[l + 1];
            floatX* x_attn_out = cfg.has_ffn() ? b.x_mid : x_out;
            // --skip-nonstandard (evaluation): the variant's sub-layer, or its whole block, is left out
            if (skipped(l) && skip == SkipNonstandard::Block) {
                cudaCheck(cudaMemcpyAsync(x_out, x, bytes, cudaMemcpyDeviceToDevice, stream));
                normed = false;
                continue;
            }
            SubLayer* next_attn = l + 1 < cfg.n_layer && !skipped(l + 1) ? &blocks[l + 1].attn : nullptr;
            if (skipped(l)) {
                cudaCheck(cudaMemcpyAsync(x_attn_out, x, bytes, cudaMemcpyDeviceToDevice, stream));
                normed = false;
            } else {
                if (!normed) { b.attn.forward_in(x, N, stream); }
                b.mixer->forward(layer_pass(pass, l), b.attn.in, b.attn.out);
                SubLayer* next = cfg.has_ffn() ? &b.ffn : next_attn;
                b.attn.forward_out(x_attn_out, x, N, stream, next);
                normed = next != nullptr;
            }
            if (cfg.has_ffn()) {
                if (!normed) { b.ffn.forward_in(b.x_mid, N, stream); }
                b.ffn_body.forward(b.ffn.out, b.ffn.in, N, stream);
                b.ffn.forward_out(x_out, b.x_mid, N, stream, next_attn);
                normed = next_attn != nullptr;
            }
        }
        return head_forward(Bn * Tn, count, dloss_scale, row_losses);
    }

    // The batch onto the device and into the stream: inputs, masked targets and document ids
    // (the rules of doc/san-model.md), the embedding; returns the count of targets in the
    // loss. The fixed row (F = 1) is one sequence (document id 0 throughout: causal, no
    // document boundaries) and starts as rndembqk's eps or the embedding of fixedseqqk's tokens.
    int64_t embed_batch(const int* inputs, const int* targets, int Bn, int Tn, int F, KVCache* cache, bool training) {
        const int Nh = Bn * Tn, N = (Bn + F) * Tn, V = cfg.vocab_size, d = cfg.n_embd;
        // into the pinned staging (model.h), then up with copies queued on the stream
        begin_staging();
        int *stream_inputs = staged_inputs(), *masked = staged_targets(), *doc_ids = staged_doc_ids();
        std::copy(inputs, inputs + Nh, stream_inputs);
        std::fill(doc_ids, doc_ids + N, 0);
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
        if (cache != nullptr) {  // the document id continues the cached positions'
            cache->next_doc += inputs[0] == cfg.bos_id;
            doc_ids[0] = cache->next_doc;
            upload_ids(cache->doc + cache->pos, doc_ids, 1);
        }
        const bool fixed_tokens = F && !fixed.random;
        if (fixed_tokens) { std::copy(fixed.tokens.begin(), fixed.tokens.begin() + Tn, stream_inputs + Nh); }
        const int embedded = fixed_tokens ? N : Nh;  // positions looked up in the embedding
        host_targets_masked.assign(masked, masked + Nh);
        upload_ids(d_inputs, stream_inputs, embedded);
        upload_ids(d_targets, masked, Nh);
        upload_ids(d_doc_ids, doc_ids, N);
        if (training) { buckets.build(d_inputs, embedded, stream); }
        embedding_forward(residual[0], d_inputs, wte().w, embedded, d, cfg.embed_multiplier(), stream);
        if (F && !fixed_tokens) {  // rndembqk: the fixed row starts as eps (its first Tn positions)
            cudaCheck(cudaMemcpyAsync(residual[0] + (size_t)Nh * d, fixed_eps, (size_t)Tn * d * sizeof(floatX),
                                      cudaMemcpyDeviceToDevice, stream));
        }
        return count;
    }

    // The head on the real rows (the first Nh positions; the fixed row has no targets): final
    // norm, tied-embedding logits, cross-entropy and z-loss (and d logits when training).
    LossStats head_forward(int Nh, int64_t count, float dloss_scale, std::vector<float>* row_losses) {
        const int d = cfg.n_embd;
        final_norm().forward(xf, xf_rstd, residual[cfg.n_layer], Nh, stream);
        linear_forward(logits, xf, wte().w, Nh, d, cfg.padded_vocab(), stream);
        ClassifierTensors head{logits, d_targets, row_loss, row_lse_sq, dloss_scale != 0.0f ? dlogits : nullptr};
        classifier_forward_backward(head, Nh, cfg.vocab_size, cfg.padded_vocab(), (float)cfg.z_loss, dloss_scale,
                                    stream);
        LossStats stats = loss_sums(Nh, true);  // two sums back, not 2 Nh rows
        stats.count = count;
        if (row_losses != nullptr) { *row_losses = copy_from_device(row_loss, Nh); }
        return stats;
    }

    // ---- backward -----------------------------------------------------------------------
    // Accumulates d(loss * dloss_scale)/d params into grads (zero them with zero_grad()),
    // for the batch of the last forward() that was given a non-zero dloss_scale.
    void backward() {
        if (skip != SkipNonstandard::None) { fatal("backward: --skip-nonstandard is for evaluation only"); }
        // rows: Bn real rows and, with rndembqk / fixedseqqk, the fixed row after them (row Bn)
        const int Rn = last_B, Bn = Rn - fixed_row, Tn = last_T, Nh = Bn * Tn, N = Rn * Tn;
        const int d = cfg.n_embd;
        const size_t Nd = (size_t)N * d;

        // LM head (tied embedding) and final norm: the real rows (the fixed row's stream gradient
        // starts at 0: it has no loss, only the q, k paths of the variant layers below)
        linear_backward_weight(wte().grad, dlogits, xf, Nh, d, cfg.padded_vocab(), stream);
        linear_backward_input(dxf, dlogits, wte().w, Nh, d, cfg.padded_vocab(), false, stream);
        cudaCheck(cudaMemsetAsync(dx, 0, Nd * sizeof(floatX), stream));
        final_norm().backward(dx, dxf, residual[cfg.n_layer], xf_rstd, Nh, scratch.reduce, stream);
        if (dx0 != nullptr) { cudaCheck(cudaMemsetAsync(dx0, 0, Nd * sizeof(floatX), stream)); }

        const MixerPass pass = mixer_pass(Bn, Rn, Tn, nullptr);
        bool branch_done = false;
        for (int l = cfg.n_layer - 1; l >= 0; l--) {
            // layer l + 1's gradients are final: their reduction may start (--overlap-reduce)
            if (l + 1 < cfg.n_layer) { layer_gradients_done(l + 1); }
            Block& b = blocks[l];
            // a pre-norm's backward also gives the residual below its branch gradient
            // (llmc/kernels/residual_norm.cuh): branch_done says the next backward_out has it
            if (cfg.has_ffn()) {
                floatX* d_ffn_out = b.ffn.backward_out(dx, N, scratch, stream, branch_done);
                b.ffn_body.backward(d_block_in, d_ffn_out, b.ffn.in, N, scratch.swiglu, stream);
                b.ffn.backward_in(dx, d_block_in, b.x_mid, N, scratch, stream, &b.attn);
                branch_done = true;
            }
            floatX* d_attn_out = b.attn.backward_out(dx, N, scratch, stream, branch_done);
            b.mixer->backward(layer_pass(pass, l), b.attn.in, d_attn_out, d_block_in);
            const SubLayer* below = l == 0 ? nullptr : cfg.has_ffn() ? &blocks[l - 1].ffn : &blocks[l - 1].attn;
            b.attn.backward_in(dx, d_block_in, residual[l], N, scratch, stream, below);
            branch_done = below != nullptr;
        }
        layer_gradients_done(0);
        if (dx0 != nullptr) {  // the staticembqk layers' path to the embedding joins the stream's
            residual_forward(dx, dx, dx0, nullptr, ResidualMode::Standard, Nd, stream);
        }
        embedding_backward(wte().grad, dx, buckets, d, cfg.embed_multiplier(), stream);
    }

    // the tied embedding and the final norm: the first and the last tensor of the spec
    Weight wte() const { return {params + spec.front().offset, grads + spec.front().offset}; }
    GainNorm final_norm() const { return cfg.stream_norm({params + spec.back().offset, grads + spec.back().offset}); }

    // ---- measurements (logged at every validation; llmc/train/evaluation.h LayerMeasurements) --
    // The residual gates come from the parameters; one forward pass over Bn rows of Tn
    // tokens gives, from its first kMeasureRows rows, the effective rank of the residual stream
    // after each layer (llmc/model/spectrum.h) and the largest |q . k| / sqrt(hd) over the
    // (query, key) pairs the attention mask lets a query see (the input of exp, or of the Taylor
    // polynomial; for nonapprox each position's own q[t].k[t]; mlp and skipped layers have none
    // and log 0), and from all Bn rows the attention-pattern indicators and the logits'
    // distribution (llmc/model/attention_indicators.h; null for mlp, skipped layers and weights
    // that are no attention matrix). On the host, in double: a measurement, not a hot path.
    LayerMeasurements measure(const int* inputs, int Bn, int Tn) {
        LayerMeasurements m;
        const ResidualMode mode = cfg.residual;
        // the fp32 values (master weights in bf16 builds; gathered when ZeRO-1 shards them,
        // so every rank measures)
        const std::vector<float> values = residual_has_gate(mode) ? laid_out_parameters() : std::vector<float>();
        auto gate_value = [&](const Weight& gate) {
            double g = values[(size_t)(gate.w - params)];
            return mode == ResidualMode::Gated ? 1.0 / (1.0 + std::exp(-g)) : g;
        };
        if (residual_has_gate(mode)) {
            for (const Block& b : blocks) {
                m.attn_gate.push_back(gate_value(b.attn.gate));
                if (cfg.has_ffn()) { m.ffn_gate.push_back(gate_value(b.ffn.gate)); }
            }
        }
        if (Bn <= 0 || Tn <= 0) { return m; }
        const int N = Bn * Tn, d = cfg.n_embd;
        std::vector<int> no_targets(N, -1);
        forward(inputs, no_targets.data(), Bn, Tn, 0.0f);
        std::vector<int> doc = copy_from_device(d_doc_ids, N);
        const int Bm = std::min(Bn, kMeasureRows);
        for (int l = 0; l < cfg.n_layer; l++) {
            std::vector<float> h = to_floats(copy_from_device(residual[l + 1], (size_t)Bm * Tn * d));
            m.erank.push_back(effective_rank(h, Bm * Tn, d));
            const ScoreInputs scores = blocks[l].mixer->score_inputs();
            const bool has_scores = scores.q != nullptr && !skipped(l);
            m.max_logit.push_back(has_scores ? largest_score(scores, doc, Bm, Tn) : 0.0);
            LayerPatterns patterns;  // empty: logged as null
            if (has_scores) { patterns = attention_patterns(host_scores(scores, doc, Bn, Tn)); }
            m.indicators.push_back(patterns.indicators);
            m.logits.push_back(patterns.logits);
        }
        return m;
    }
    // a layer's q, k of the first Bn rows on the host (fp32), for llmc/model/attention_indicators.h
    HostScores host_scores(const ScoreInputs& in, const std::vector<int>& doc, int Bn, int Tn) const {
        HostScores s;
        const size_t N = (size_t)Bn * Tn;
        s.Bn = Bn, s.Tn = Tn, s.Hq = cfg.n_head, s.Hkv = cfg.n_kv_head, s.hd = cfg.head_dim();
        s.q = to_floats(copy_from_device(in.q, N * s.Hq * s.hd));
        s.k = to_floats(copy_from_device(in.k, N * s.Hkv * s.hd));
        if (cfg.doc_mask) { s.doc.assign(doc.begin(), doc.begin() + N); }
        s.weights = in.weights;
        return s;
    }
    double largest_score(const ScoreInputs& s, const std::vector<int>& doc, int Bn, int Tn) const {
        const int N = Bn * Tn, hd = cfg.head_dim(), Hq = cfg.n_head, Hkv = cfg.n_kv_head;
        std::vector<float> q = to_floats(copy_from_device(s.q, (size_t)N * Hq * hd));
        std::vector<float> k = to_floats(copy_from_device(s.k, (size_t)N * Hkv * hd));
        const double scale = 1.0 / std::sqrt((double)hd);
        double largest = 0.0;
        for (int b = 0; b < Bn; b++) {
            for (int h = 0; h < Hq; h++) {
                int j = h / (Hq / Hkv);
                for (int t = 0; t < Tn; t++) {
                    const float* qt = &q[(((size_t)b * Tn + t) * Hq + h) * hd];
                    for (int tau = s.own_position_only() ? t : 0; tau <= t; tau++) {
                        if (cfg.doc_mask && doc[b * Tn + tau] != doc[b * Tn + t]) { continue; }
                        const float* kt = &k[(((size_t)b * Tn + tau) * Hkv + j) * hd];
                        double dot = 0.0;
                        for (int c = 0; c < hd; c++) { dot += (double)qt[c] * kt[c]; }
                        largest = std::max(largest, std::fabs(dot) * scale);
                    }
                }
            }
        }
        return largest;
    }
};

// Sampling (llmc/model/model.h), found instead of model.h's template by argument-dependent lookup:
// the cached step needs every layer's mixer to decode one position from the cache
// (llmc/kernels/kv_cache.cuh); with approximate, nonapprox, rndembqk or fixedseqqk layers (the last
// two need the fixed row beside every step's queries) the window is recomputed for every token.
std::vector<int> sample(SAN& model, std::vector<int> tokens, int n, float temperature, std::mt19937_64& rng,
                        bool use_cache = true) {
    for (const Block& b : model.blocks) { use_cache = use_cache && b.mixer->decodes_with_cache(); }
    return sample_tokens(model, std::move(tokens), n, temperature, rng, use_cache);
}

// ========================================================================================
// command line and main (the sequence: llmc/train/trainer.h)

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

// A preset whose default rates were tuned for a recipe (tuned-for = paper-setup: the SAN paper's
// presets, at its locked rates, tuned for its paper-order Muon and batch), trained without a
// recipe and with keller-order Muon: one line says so.
void warn_paper_preset_without_setup(const std::string& preset, int paper_setup, int deconstructing_setup,
                                     const TrainOptions& t) {
    auto it = san_presets().find(preset);
    if (it == san_presets().end() || it->second.tuned_for != "paper-setup" || paper_setup != 0 ||
        deconstructing_setup != 0 || t.steps == 0 || !t.opt.is_muon() || t.opt.muon_order != MuonOrder::Keller) {
        return;
    }
    printf("warning: --preset %s without --paper-setup 1: keller-order Muon at the SAN paper's rates, which are tuned "
           "for its paper-order Muon; --paper-setup 1 trains the paper's recipe\n", preset.c_str());
}

// A preset's tuned rates apply to its own model at the vocabulary they were swept at
// (default_rates); a run of the preset at another vocabulary (--tokenizer) or shape falls back to
// the SAN paper's rates, which one line says, with the rates used (none when --lr was given, or
// when nothing trains: an evaluation, --steps 0).
void note_preset_rates_not_applied(const std::string& preset, const SANConfig& c, const TrainOptions& t) {
    auto it = san_presets().find(preset);
    if (it == san_presets().end() || t.rates_source.empty() || t.steps == 0) { return; }
    for (const SweptRates& s : it->second.swept) {
        if (s.ffn != c.ffn || s.source == t.rates_source) { continue; }
        SANConfig tuned = it->second.model;
        tuned.ffn = s.ffn;
        tuned.vocab_size = c.vocab_size;
        std::string why = c.vocab_size != s.vocab_size ? "vocabulary " + std::to_string(c.vocab_size) : "";
        if (!same_model_but_context(tuned, c)) { why += std::string(why.empty() ? "" : " and ") + "another shape"; }
        char used[96];
        if (t.opt.is_muon()) {
            snprintf(used, sizeof(used), "muon %g, other %g", t.opt.lr, t.opt.lr_other);
        } else {
            snprintf(used, sizeof(used), "adamw %g", t.opt.lr);
        }
        printf("note: --preset %s's tuned rates (muon %g, other %g; adamw %g) are for its own shape at vocabulary %d; "
               "this run has %s, so it trains at the rates of %s: %s (--lr / --lr-other set them)\n", preset.c_str(),
               s.muon, s.muon_other, s.adamw, s.vocab_size, why.c_str(), t.rates_source.c_str(), used);
    }
}

std::vector<Flag> make_flags(Options& o) {
    std::vector<Flag> flags = model_flags(&o.preset, o.model);
    std::vector<Flag> san = {
        make_flag("--skip-nonstandard", &o.skip_nonstandard, "evaluation (--steps 0 --init-from CKPT): none | attention (leave out the non-standard attention sub-layers) | block (their whole blocks)"),
        make_flag("--paper-setup", &o.paper_setup, "1: the SAN paper's recipe as defaults (doc/san-model.md \"Paper setup\"); flags given win"),
        make_flag("--deconstructing-setup", &o.deconstructing_setup, "1: Deconstructing Attention's recipe as defaults (doc/deconstructing.md \"Recipe\"); flags given win"),
    };
    flags.insert(flags.end(), san.begin(), san.end());
    add_training_flags(flags, o.train);
    return flags;
}

// A recipe's schedule scaled from the paper's runs to --steps (its keys paper-max-steps,
// paper-warmup-steps of the paper's schedule and paper-run-steps, where the paper's runs stopped):
// a horizon of steps x max / run (unless --schedule-steps is given) and steps x warmup / run
// warmup steps (at most the horizon), as a fraction of the horizon. Returns the flags it sets.
std::vector<std::string> scale_paper_schedule(const ConfigFile& f, const std::map<std::string, double>& paper,
                                              TrainOptions& t, int argc, char** argv) {
    for (const char* key : {"paper-max-steps", "paper-warmup-steps", "paper-run-steps"}) {
        if (!paper.count(key)) { fatal("%s: the paper's schedule needs %s (and the other paper-*-steps)", f.path.c_str(), key); }
    }
    // (the flags are checked when parsed; here a bad value only sets defaults they replace)
    const std::string steps_given = find_flag_value(argc, argv, "--steps"), horizon = find_flag_value(argc, argv, "--schedule-steps");
    const long steps = std::max(1L, steps_given.empty() ? t.steps : std::strtol(steps_given.c_str(), nullptr, 10));
    const long horizon_given = horizon.empty() ? 0 : std::strtol(horizon.c_str(), nullptr, 10);
    const double run = paper.at("paper-run-steps"), warmup_steps = (double)steps * paper.at("paper-warmup-steps") / run;
    Schedule& s = t.opt.schedule;
    s.horizon = horizon_given > 0 ? horizon_given : std::max(1L, Schedule::round_steps(paper.at("paper-max-steps") / run, steps));
    s.warmup_frac = std::min(1.0, warmup_steps / (double)s.horizon);
    return {"--schedule-steps", "--warmup-frac"};
}

// --paper-setup 1, --deconstructing-setup 1: the recipe presets/recipes/NAME.conf as defaults
// that the flags given override. A key that names a flag sets it, and counts as given (a resume
// compares it) unless resume-keeps lists it; PRESET.flag sets the flag for that preset only; the
// paper-*-steps keys scale the paper's schedule (scale_paper_schedule).
void apply_recipe(Options& o, const std::string& recipe, int argc, char** argv) {
    const ConfigFile& f = compiled_config_file("presets/recipes/" + recipe + ".conf");
    const std::vector<Flag> flags = make_flags(o);
    std::set<std::string> given, keeps;
    std::map<std::string, double> paper;
    std::vector<ConfigEntry> for_preset;  // PRESET.flag, applied after the others
    for (const ConfigEntry& e : f.entries) {
        if (e.key == "resume-keeps") {
            std::istringstream names(e.value);
            for (std::string name; names >> name;) { keeps.insert("--" + name); }
        } else if (e.key == "paper-max-steps" || e.key == "paper-warmup-steps" || e.key == "paper-run-steps") {
            paper[e.key] = f.real(e);
        } else if (e.key.find('.') != std::string::npos) {  // (flag names have no dot)
            const std::string preset = e.key.substr(0, e.key.rfind('.'));
            if (!san_presets().count(preset)) { fatal("%s line %d: %s names no preset", f.path.c_str(), e.line, e.key.c_str()); }
            if (preset != o.preset) { continue; }
            for_preset.push_back(e);
            for_preset.back().key = e.key.substr(preset.size() + 1);
        } else {
            given.insert(apply_setting(f, e, flags));
        }
    }
    for (const ConfigEntry& e : for_preset) { given.insert(apply_setting(f, e, flags)); }
    if (!paper.empty()) {
        for (const std::string& flag : scale_paper_schedule(f, paper, o.train, argc, argv)) { given.insert(flag); }
    }
    for (const std::string& flag : keeps) {
        if (!given.erase(flag)) { fatal("%s: resume-keeps names %s, which the recipe does not set", f.path.c_str(), flag.c_str()); }
    }
    o.train.given.insert(given.begin(), given.end());
}

// --skip-nonstandard: checked against what it needs (an evaluation of a model that mixes
// standard and non-standard layers); the layers it drops are printed and go into the log's
// run record (skipped_layers)
SkipNonstandard parse_skip_nonstandard(const std::string& value, const SANConfig& c, TrainOptions& t) {
    if (value == "none") { return SkipNonstandard::None; }
    if (value != "attention" && value != "block") {
        fatal("--skip-nonstandard must be none, attention or block, not '%s'", value.c_str());
    }
    if (t.steps != 0 || t.init_from.empty()) {
        fatal("--skip-nonstandard evaluates a trained model: give --steps 0 --init-from CKPT");
    }
    std::string dropped, dropped_json;  // the layers left out, 1-based as --layout numbers them
    int n_dropped = 0;
    for (int l = 0; l < c.n_layer; l++) {
        if (c.kind(l) == AttnKind::Standard) { continue; }
        dropped += (dropped.empty() ? "" : ",") + std::to_string(l + 1);
        dropped_json += (dropped_json.empty() ? "" : ", ") + std::to_string(l + 1);
        n_dropped++;
    }
    const char* model = t.init_from.c_str();
    if (n_dropped == 0) { fatal("--skip-nonstandard %s: the model of %s has standard attention in every layer: nothing to leave out", value.c_str(), model); }
    // a uniform model has no standard attention left to read: the skip reading is for hybrids
    if (n_dropped == c.n_layer) {
        fatal("--skip-nonstandard %s: every layer of %s is %s (layout %s), so leaving them out would evaluate a model "
              "without attention; the skip reading is for models that keep standard layers (e.g. --layout hybrid)",
              value.c_str(), model, kAttnKinds.name(c.attention), c.layout.c_str());
    }
    printf("evaluation without the %s of layers %s (%s; --skip-nonstandard %s): %d of %d layers\n",
           value == "block" ? "blocks" : "attention sub-layers", dropped.c_str(), kAttnKinds.name(c.attention),
           value.c_str(), n_dropped, c.n_layer);
    t.record.notes.push_back({"skipped_layers", "[" + dropped_json + "]"});
    t.record.notes.push_back({"skip_nonstandard", "\"" + value + "\""});
    return value == "block" ? SkipNonstandard::Block : SkipNonstandard::Attention;
}

// What llmc/train/trainer.h asks of this trainer.
struct SANTrainer {
    using Model = SAN;
    static void set_defaults(Options& o, int argc, char** argv) {
        std::string paper = find_flag_value(argc, argv, "--paper-setup");
        if (!paper.empty() && paper != "0" && paper != "1") { fatal("option --paper-setup: must be 0 or 1, not '%s'", paper.c_str()); }
        if (paper == "1") { apply_recipe(o, "paper-setup", argc, argv); }
        std::string recipe = find_flag_value(argc, argv, "--deconstructing-setup");
        if (!recipe.empty() && recipe != "0" && recipe != "1") {
            fatal("option --deconstructing-setup: must be 0 or 1, not '%s'", recipe.c_str());
        }
        if (recipe == "1") {
            if (paper == "1") { fatal("--paper-setup 1 and --deconstructing-setup 1 are two recipes: give one"); }
            apply_recipe(o, "deconstructing-setup", argc, argv);
        }
    }
    static bool start_elsewhere(Options&, bool) { return false; }
    static DefaultRates default_rates(const SANConfig& c) { return ::default_rates(c); }
    // san or ffn, and the non-standard attention with its layout (ffn-mlp-hybrid)
    static std::string arm_name(const SANConfig& c) {
        std::string arm = c.has_ffn() ? "ffn" : "san";
        bool variant = false;
        for (AttnKind k : c.kinds) { variant = variant || k != AttnKind::Standard; }
        if (!variant) { return arm; }
        std::string layout;
        for (char ch : c.layout) { layout += isalnum((unsigned char)ch) ? ch : '_'; }
        return arm + "-" + kAttnKinds.name(c.attention) + "-" + layout;
    }
    static void print_model(const Options& o) {
        const SANConfig& c = o.model;
        printf("model: L=%d d=%d heads %d/%d (head_dim %d) ffn=%s", c.n_layer, c.n_embd, c.n_head, c.n_kv_head,
               c.head_dim(), kFfnKinds.name(c.ffn));
        if (c.has_ffn()) { printf(" d_ff=%d", c.d_ff); }
        printf(" norm=%s qk_norm=%d residual=%s sandwich=%d rope_theta=%g doc_mask=%d z_loss=%g embed_scale=%s out_init=%s\n",
               kNormKinds.name(c.norm), c.qk_norm, kResidualModes.name(c.residual), c.sandwich, c.rope_theta, c.doc_mask,
               c.z_loss, kEmbedScales.name(c.embed_scale), kOutInits.name(c.out_init));
        printf("%s\n", describe_attention(c).c_str());
        printf("vocab %d (padded %d), context %d, bos %d\n", c.vocab_size, c.padded_vocab(), c.seq_len, c.bos_id);
        if (o.paper_setup) { printf("recipe: the SAN paper's setup (--paper-setup 1), with the flags given on top\n"); }
        if (o.deconstructing_setup) {
            printf("recipe: Deconstructing Attention's setup (--deconstructing-setup 1), with the flags given on top\n");
        }
        warn_paper_preset_without_setup(o.preset, o.paper_setup, o.deconstructing_setup, o.train);
        note_preset_rates_not_applied(o.preset, c, o.train);
    }
    static void init_parameters(SAN& model, const Options& o) {
        model.init_parameters(o.train.seed);
        model.init_fixed_input(o.train.seed, o.train.train_data);
    }
    // settings of this run that are not model config (llmc/train/trainer.h calls it once the model is built)
    static void configure_model(SAN& model, Options& o) {
        model.skip = parse_skip_nonstandard(o.skip_nonstandard, o.model, o.train);
    }
};

// The entry point, named so that test_san.cu, which includes this file, holds it too: the Makefile
// links ./train_san from test_san's object with train_san_main as its main (one compile for both).
extern "C" int train_san_main(int argc, char** argv) {
    return trainer_main<SANTrainer>(argc, argv, "train_san", presets(), make_flags, read_config);
}
#ifndef TESTING
int main(int argc, char** argv) { return train_san_main(argc, argv); }
#endif
