/*
test_san.cu: checks the CUDA trainer (train_san.cu, included with TESTING) against debug states
written by the PyTorch reference train_san.py (doc/formats.md "Debug state"), on whichever
executor built it: the parameter count, the loss mask, forward (logits, loss parts), backward
(every gradient), 10 optimizer steps (loss, grad norm, rates, final parameters), and a resume
bit for bit. Plus zcn_rms_pair_{adamw,muon}: a ZCN and an RMSNorm model mapped onto each other
train the same trajectory up to rounding (the paper's noise-floor pair). bf16 builds run one
state of each attention shape through the tensor-core attention (attention_tc.cuh; san.bin for
its own) and the others through the scalar kernels, san.bin once more through the scalar ones, so
make test keeps both under the trainer (tensor_core_states says why not every state).

Usage: test_san [DEBUG_STATE_DIR (default build/debug-states)] [name-filter]

Tolerances: |got - ref| <= atol * max|ref of that tensor| + rtol * |ref|, against an fp64
reference (fp32 figures: this trainer's own rounding). Final parameters are compared per tensor
in relative L2 (catches a systematic error) and per element within a fraction of the rate (Adam
moves a near-zero-gradient element by up to ~lr a step on rounding noise alone).
*/
#define TESTING
#include "train_san.cu"

#include <dirent.h>

#include <algorithm>

#include "dev/test/debug_state.h"
#include "dev/test/testing.h"

#if defined(ENABLE_FP32)
constexpr Tolerances kTol = {
    .logits = {2e-6, 1e-5},
    .loss = {0, 2e-6},
    .grads = {2e-5, 1e-4},
    .traj_loss = {0, 2e-5},
    .traj_norm = {0, 2e-4},
    .grads_l2_matrix = 1e-5,
    .grads_l2_other = 1e-4,
    .final_l2_matrix = 5e-5,
    .final_l2_other = 5e-4,
    .final_lr_fraction = 0.5,
};
#else
constexpr Tolerances kTol = {
    .logits = {3e-2, 3e-2},
    .loss = {0, 5e-3},
    .grads = {3e-1, 2e-1},
    .traj_loss = {0, 1e-2},
    .traj_norm = {0, 5e-2},
    .grads_l2_matrix = 0.1,
    .grads_l2_other = 0.5,
    .final_l2_matrix = 0.05,
    .final_l2_other = 0.3,
    .final_lr_fraction = 20.0,
};
#endif


// The parameter count written out from the architecture (not from parameter_spec). An mlp
// layer (doc/deconstructing.md) holds a SwiGLU of width round((2 qd + 2 kvd) / 3) in place
// of wq, wk, wv, wo and the q/k-norm gains; every other kind has standard attention's tensors.
static int64_t expected_parameter_count(const SANConfig& c) {
    int64_t d = c.n_embd, hd = c.n_embd / c.n_head, qd = c.n_head * hd, kvd = c.n_kv_head * hd;
    bool gated = c.residual == ResidualMode::Gated || c.residual == ResidualMode::Rezero;
    int64_t attention = d /*pre-norm*/ + qd * d /*wq*/ + 2 * kvd * d /*wk, wv*/ + qd * d /*wo*/ +
                        (c.qk_norm ? 2 * hd : 0) + (c.sandwich ? d : 0) + (gated ? 1 : 0);
    int64_t mlp_width = std::llround((2.0 * qd + 2.0 * kvd) / 3.0);
    int64_t mlp = d /*pre-norm*/ + 3 * d * mlp_width + (c.sandwich ? d : 0) + (gated ? 1 : 0);
    int64_t ffn = c.ffn == FfnKind::SwiGLU ? d + 3 * d * c.d_ff + (c.sandwich ? d : 0) + (gated ? 1 : 0) : 0;
    int64_t padded_vocab = (c.vocab_size + 127) / 128 * 128;
    int64_t total = padded_vocab * d + d /*final norm*/;
    for (int l = 0; l < c.n_layer; l++) { total += (c.kinds[l] == AttnKind::Mlp ? mlp : attention) + ffn; }
    return total;
}

// Muon's trajectories (6 states, tiny presets, lr 0.02), measured worst over the states:
//   fp32: loss 9e-8 relative, grad norm (every step) 1.7e-7, final matrices L2 1.9e-5 and
//         per element 1e-4 lr (muon_gqa4's draw: Newton-Schulz grows a small singular value's
//         rounding up to ~490x; other draws 8e-7 to 1.8e-6), other group as AdamW (1.1e-4);
//   bf16 (NS in bf16): loss 5e-5, first-step grad norm 1.6e-3, matrices L2 1.3e-2 and per
//         element 1.2e-3 (= 0.06 lr), other group 4.7e-2.
// Tolerances are 4-10x those (forward/backward: kTol's); leaving out Muon's weight decay moves
// muon_san's matrices 16x past the bound.
#if defined(ENABLE_FP32)
constexpr Tolerances kTolMuon = {
    .logits = {2e-6, 1e-5},
    .loss = {0, 2e-6},
    .grads = {2e-5, 1e-4},
    .traj_loss = {0, 5e-7},
    .traj_norm = {0, 1e-6},
    .grads_l2_matrix = 1e-5,
    .grads_l2_other = 1e-4,
    .final_l2_matrix = 1e-4,
    .final_l2_other = 5e-4,
    .final_lr_fraction = 0.5,
    .final_lr_fraction_muon = 5e-4,
};
#else
constexpr Tolerances kTolMuon = {
    .logits = {3e-2, 3e-2},
    .loss = {0, 5e-3},
    .grads = {3e-1, 2e-1},
    .traj_loss = {0, 3e-4},
    .traj_norm = {0, 1e-2},
    .grads_l2_matrix = 0.1,
    .grads_l2_other = 0.5,
    .final_l2_matrix = 0.05,
    .final_l2_other = 0.3,
    .final_lr_fraction = 20.0,
    .final_lr_fraction_muon = 0.25,
};
#endif

// ZCN vs RMSNorm pair (the trainer against itself, adamw and muon), measured worst:
//   fp32: loss 7e-8 relative, grad norm 1.2e-7, matrices L2 8e-7, gains/other 2.3e-6;
//   bf16: loss 6.4e-4, grad norm 1.9e-3, matrices L2 1.4e-2, gains/other 6.4e-3.
#if defined(ENABLE_FP32)
constexpr Tolerances kPairTol = {
    .logits = {0, 0},
    .loss = {0, 0},
    .grads = {0, 0},
    .traj_loss = {0, 5e-7},
    .traj_norm = {0, 1e-6},
    .grads_l2_matrix = 0,
    .grads_l2_other = 0,
    .final_l2_matrix = 5e-6,
    .final_l2_other = 1e-5,
    .final_lr_fraction = 0,
};
#else
constexpr Tolerances kPairTol = {
    .logits = {0, 0},
    .loss = {0, 0},
    .grads = {0, 0},
    .traj_loss = {0, 3e-3},
    .traj_norm = {0, 1e-2},
    .grads_l2_matrix = 0,
    .grads_l2_other = 0,
    .final_l2_matrix = 0.05,
    .final_l2_other = 0.03,
    .final_lr_fraction = 0,
};
#endif

// check_state runs the tensor-core attention in bf16 builds where `tensor_cores`, else the scalar kernels
static void check_state(const std::string& path, bool tensor_cores = true) {
    StateCheck how;
    how.expected_parameters = expected_parameter_count(read_config(TensorFileReader(path, TENSOR_FILE_DEBUG_STATE)));
    how.tolerances = [](const OptimizerConfig& opt) -> const Tolerances& { return opt.is_muon() ? kTolMuon : kTol; };
    how.lse_sq = true;
    // In bf16 the gradient norm after a few steps is chaotic (measured: 19% off at step 8
    // of the sandwich config while the loss agrees to 1e-4, and fp32 matches to 1e-5), so
    // bf16 checks the norm of the first step only; fp32 checks every step.
    how.grad_norm_every_step = PRECISION_MODE == PrecisionMode::FP32;
    how.resume_file = "build/test_san_resume_" + std::to_string(getpid()) + ".bin";
    attention_tensor_cores() = tensor_cores;
    check_state<SAN>(path, how);
    attention_tensor_cores() = true;
}

// The states (file names) that run the tensor-core attention in bf16 builds: one for each attention
// shape, i.e. what the tensor-core kernels' code paths and numbers depend on (context, query and kv
// heads, head dim, document mask, QK-norm), taken from the states whose every layer is standard
// attention, else from those that keep some standard layers (a hybrid layout); the other states run
// the scalar kernels, the host trainer's own default. On the host every mma.sync and ldmatrix is a
// warp collective, ~15x the scalar kernels' time a launch: through all 35 states the tensor-core
// kernels were 85% of test_san's ~40 s (2-core EPYC, 2026-12-08), the same kernels on the same
// shapes again under another norm, optimizer or residual.
static std::set<std::string> tensor_core_states(const std::string& dir, const std::vector<std::string>& files) {
    std::set<std::string> chosen, shapes;
    if (PRECISION_MODE != PrecisionMode::BF16) { return chosen; }  // (fp32 builds have no tensor-core attention)
    std::vector<std::pair<std::string, SANConfig>> states;  // san.bin first: the SAN itself speaks for its shape
    for (const std::string& f : files) {
        states.emplace_back(f, read_config(TensorFileReader(dir + "/" + f, TENSOR_FILE_DEBUG_STATE)));
    }
    std::stable_partition(states.begin(), states.end(), [](const auto& s) { return s.first == "san.bin"; });
    for (bool all_standard : {true, false}) {
        for (const auto& [f, c] : states) {
            bool standard = c.attention == AttnKind::Standard, some_standard = standard || c.layout != "uniform";
            if (all_standard ? !standard : !some_standard) { continue; }
            char shape[96];
            snprintf(shape, sizeof(shape), "T%d Hq%d Hkv%d hd%d doc%d qk%d", c.seq_len, c.n_head, c.n_kv_head,
                     c.head_dim(), c.doc_mask, c.qk_norm);
            if (shapes.insert(shape).second) { chosen.insert(f); }
        }
    }
    return chosen;
}

// The noise-floor pair: ZCN (gain g, effective 1 + g) and RMSNorm (gain 1 + g) from the
// same matrices; gains sit in the other group (no decay), so both train identically up to
// rounding. Init and batch from the zcn debug state `path`.
static void check_zcn_rms_pair(const std::string& path, OptimizerKind optimizer) {
    DebugCase<SAN> dc(path);
    CHECK(dc.cfg.norm == NormKind::ZCN);
    SANConfig rms_cfg = dc.cfg;
    rms_cfg.norm = NormKind::RMS;
    std::vector<ParamSpec> spec = parameter_spec(dc.cfg), rms_spec = parameter_spec(rms_cfg);
    CHECK_EQ(spec.size(), rms_spec.size());
    auto is_gain = [](const ParamSpec& s) { return s.name.size() > 11 && s.name.compare(s.name.size() - 11, 11, "norm.weight") == 0; };
    std::vector<float> rms_init = dc.init;
    size_t offset = 0, gains = 0;
    for (const ParamSpec& s : spec) {
        if (is_gain(s)) {
            for (int64_t i = 0; i < s.numel(); i++) { rms_init[offset + i] += 1.0f; }
            gains += s.numel();
        }
        offset += s.numel();
    }
    CHECK(gains > 0);
    OptimizerConfig opt;
    opt.optimizer = optimizer;
    opt.lr = opt.lr_other = -1.0;
    opt.resolve_rates(default_rates(dc.cfg));
    opt.lr_other = 1e-2;  // move the gains visibly (AdamW: ~lr_other per step)
    const long steps = 10;
    SAN zcn(dc.cfg, dc.B, dc.T), rms(rms_cfg, dc.B, dc.T);
    zcn.set_parameters(dc.init);
    rms.set_parameters(rms_init);
    zcn.build_optimizer(opt);
    rms.build_optimizer(opt);
    std::vector<float> loss_z, loss_r, norm_z, norm_r;
    for (long k = 0; k < steps; k++) {
        float nz = 0.0f, nr = 0.0f;
        loss_z.push_back((float)dc.train_step(zcn, k, steps, &nz));
        loss_r.push_back((float)dc.train_step(rms, k, steps, &nr));
        norm_z.push_back(nz);
        norm_r.push_back(nr);
    }
    std::vector<float> pz = zcn.get_parameters(), pr = rms.get_parameters();
    offset = 0;
    for (const ParamSpec& s : spec) {
        if (is_gain(s)) {
            for (int64_t i = 0; i < s.numel(); i++) { pr[offset + i] -= 1.0f; }
        }
        offset += s.numel();
    }
    // fp32: 1 + g rounds g to 2^-24; bf16: the RMS gains 1 + g hold 8 bits (steps of
    // 2^-7 near 1) where ZCN's g holds 8 bits of g itself
    const Tolerances& tol = kPairTol;
    compare("pair.loss", loss_r.data(), loss_z.data(), steps, tol.traj_loss);
    compare("pair.grad_norm", norm_r.data(), norm_z.data(), steps, tol.traj_norm);
    offset = 0;
    for (const ParamSpec& s : spec) {
        compare_l2("pair.final." + s.name, pr.data() + offset, pz.data() + offset, s.numel(),
                   s.matrix ? tol.final_l2_matrix : tol.final_l2_other);
        offset += s.numel();
    }
}

// fp32 gradient accumulation (--grad-fp32): in bf16 builds three micro-batches of the same
// batch must sum to exactly 3x one micro-batch's gradients (a bf16 value times 3 needs 10
// significand bits, so it is exact in fp32 and rounded in bf16), and the optimizer must read
// the fp32 sum (its gradient norm). fp32 builds accumulate in fp32 anyway (no accumulator;
// the backward kernels add into the gradients, so the sum is only close: 1e-6 of the largest).
static void check_grad_accumulation_fp32(const std::string& path) {
    DebugCase<SAN> dc(path);
    SAN model(dc.cfg, dc.B, dc.T);
    model.set_parameters(dc.init);
    model.zero_grad();
    model.forward(dc.inputs.data(), dc.targets.data(), dc.B, dc.T, dc.loss_scale(), nullptr);
    model.backward();
    std::vector<float> one = model.get_gradients();  // floatX values, before any accumulator exists
    model.accumulate_in_fp32();
    model.zero_grad();
    for (int micro = 0; micro < 3; micro++) {
        model.forward(dc.inputs.data(), dc.targets.data(), dc.B, dc.T, dc.loss_scale(), nullptr);
        model.backward();
        model.end_micro_batch();
    }
    std::vector<float> sum = model.get_gradients();
    CHECK_EQ(sum.size(), one.size());
    size_t wrong = 0;
    double norm_sq = 0.0;
    const bool exact = PRECISION_MODE != PrecisionMode::FP32;
    float largest = 0.0f;
    for (float g : one) { largest = std::max(largest, std::fabs(3.0f * g)); }
    for (size_t i = 0; i < one.size(); i++) {
        wrong += exact ? sum[i] != 3.0f * one[i] : std::fabs(sum[i] - 3.0f * one[i]) > 1e-6f * largest;
        norm_sq += (double)sum[i] * sum[i];
    }
    CHECK_EQ(wrong, (size_t)0);
    OptimizerConfig opt;
    opt.lr = opt.lr_other = 0.0;
    model.build_optimizer(opt);
    float norm = model.update(0.0, 0.0);
    CHECK(std::fabs(norm - std::sqrt(norm_sq)) <= 1e-5 * std::sqrt(norm_sq));
}

// Device layout: every tensor of parameters, gradients and master weights starts on a
// 128-byte boundary (the scalar gates would shift the matrices after them otherwise), the
// canonical values round-trip exactly, and training leaves the gaps zero.
static void check_parameter_alignment(const std::string& path) {
    DebugCase<SAN> dc(path);
    SAN model(dc.cfg, dc.B, dc.T);
    int shifted_before = 0;  // tensors a back-to-back layout would put off a 16-byte boundary
    size_t packed = 0;
    for (const ParamSpec& s : model.spec) {
        CHECK_EQ((uintptr_t)(model.params + s.offset) % 128, (uintptr_t)0);
        CHECK_EQ((uintptr_t)(model.grads + s.offset) % 128, (uintptr_t)0);
        if (model.master != nullptr) { CHECK_EQ((uintptr_t)(model.master + s.offset) % 128, (uintptr_t)0); }
        shifted_before += (packed * sizeof(floatX)) % 16 != 0;
        packed += s.numel();
    }
    CHECK(shifted_before > 0);  // the config has scalar gates: the test is not vacuous
    model.set_parameters(dc.init);
    CHECK(model.get_parameters() == dc.init);
    model.build_optimizer(dc.optimizer());
    float norm = 0.0f;
    for (long k = 0; k < 2; k++) { dc.train_step(model, k, 2, &norm); }
    std::vector<float> all(model.device_elements);
    if (model.master != nullptr) {
        all = copy_from_device(model.master, model.device_elements);
    } else {
        std::vector<floatX> x = copy_from_device(model.params, model.device_elements);
        for (size_t i = 0; i < x.size(); i++) { all[i] = to_float(x[i]); }
    }
    std::vector<bool> used(model.device_elements, false);
    for (const ParamSpec& s : model.spec) { std::fill(used.begin() + s.offset, used.begin() + s.offset + s.numel(), true); }
    size_t nonzero_gaps = 0;
    for (size_t i = 0; i < all.size(); i++) { nonzero_gaps += !used[i] && all[i] != 0.0f; }
    CHECK_EQ(nonzero_gaps, (size_t)0);
}

// MFU peaks by device name: the more specific names must win over their substrings
// (H100 PCIe vs H100, L40S vs L40 vs L4, A100 vs A10), unknown devices give 0 (no MFU).
TEST_CASE(mfu_peaks_by_device_name) {
    CHECK_EQ(peak_flops_for("NVIDIA H100 PCIe", false), 756e12);
    CHECK_EQ(peak_flops_for("NVIDIA H100 80GB HBM3", false), 989e12);
    CHECK_EQ(peak_flops_for("NVIDIA H200", true), 67e12);
    CHECK_EQ(peak_flops_for("NVIDIA L40S", false), 362e12);
    CHECK_EQ(peak_flops_for("NVIDIA L40", false), 181e12);
    CHECK_EQ(peak_flops_for("NVIDIA L4", false), 121e12);
    CHECK_EQ(peak_flops_for("NVIDIA A100-SXM4-80GB", false), 312e12);
    CHECK_EQ(peak_flops_for("NVIDIA A10", false), 125e12);
    CHECK_EQ(peak_flops_for("NVIDIA GeForce RTX 4090", false), 165e12);
    CHECK_EQ(peak_flops_for("Tesla V100-SXM2-16GB", false), 0.0);
}

int main(int argc, char** argv) {
    attention_tensor_cores() = true;  // on the host too (the trainer's default there is scalar)
    std::string dir = argc > 1 ? argv[1] : "build/debug-states";
    const char* filter = argc > 2 ? argv[2] : nullptr;
    std::vector<std::string> files = debug_state_files(dir, "dev/test/make_debug_states.py");
    std::set<std::string> tensor_cores = tensor_core_states(dir, files);
    for (const std::string& f : files) {
        std::string name = f.substr(0, f.size() - 4);
        std::string path = dir + "/" + f;
        bool tc = tensor_cores.count(f) > 0;
        testing::register_case(name, [path, tc] { check_state(path, tc); });
    }
    if (std::find(files.begin(), files.end(), "san.bin") != files.end()) {
        std::string path = dir + "/san.bin";
        testing::register_case("zcn_rms_pair_adamw", [path] { check_zcn_rms_pair(path, OptimizerKind::AdamW); });
        testing::register_case("zcn_rms_pair_muon", [path] { check_zcn_rms_pair(path, OptimizerKind::Muon); });
        testing::register_case("grad_accumulation_fp32", [path] { check_grad_accumulation_fp32(path); });
        testing::register_case("parameter_alignment", [path] { check_parameter_alignment(path); });
        if (PRECISION_MODE == PrecisionMode::BF16) {
            testing::register_case("san_scalar_attention", [path] { check_state(path, false); });
        }
    }
    // rndembqk / fixedseqqk rerun the fixed row in every micro-batch: their sum must be exact too
    for (const char* fixed : {"rndembqk_hybrid.bin", "fixedseqqk_uniform.bin"}) {
        if (std::find(files.begin(), files.end(), fixed) == files.end()) { continue; }
        std::string path = dir + "/" + fixed, name = std::string("grad_accumulation_fp32_") + fixed;
        name.resize(name.size() - 4);
        testing::register_case(name, [path] { check_grad_accumulation_fp32(path); });
    }
    return testing::run_all(argv[0], filter);
}
