/*
What the trainer tests (test_san.cu, test_gpt2.cu) do alike with a PyTorch debug state
(doc/formats.md "Debug state"), for any model of llmc/model/model.h (LanguageModel). Include it
after the trainer (its read_config and parameter_spec are used here).

  DebugCase<Model> dc(path)      the config, the batch and the initial parameters
  dc.train_step(model, ...)      one optimizer step on the debug batch, as the reference did
                                 (the model's optimizer built with dc.optimizer())
  check_resume(dc, ...)          k steps, save, the rest; versus load + the rest: bit-identical
                                 parameters and optimizer state
  check_state<Model>(path, how)  the whole comparison with the reference: parameter count,
                                 loss mask, logits, loss, every gradient, the trajectory of
                                 the first optimizer steps and the final parameters, resume
*/
#pragma once

#include <dirent.h>
#include <unistd.h>

#include <algorithm>

#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dev/test/compare.h"
#include "dev/test/testing.h"

// The debug states (*.bin) in `dir`, sorted; none is an error that says how to make them.
inline std::vector<std::string> debug_state_files(const std::string& dir, const char* maker) {
    std::vector<std::string> files;
    if (DIR* d = opendir(dir.c_str())) {
        while (dirent* e = readdir(d)) {
            std::string name = e->d_name;
            if (name.size() > 4 && name.compare(name.size() - 4, 4, ".bin") == 0) { files.push_back(name); }
        }
        closedir(d);
    }
    if (files.empty()) {
        fatal("no debug states in '%s': run `make test` (or python %s %s)", dir.c_str(), maker, dir.c_str());
    }
    std::sort(files.begin(), files.end());
    return files;
}

template <typename Model>
struct DebugCase {
    using Config = decltype(Model::cfg);
    TensorFileReader r;
    Config cfg;
    int B, T;
    std::vector<int> inputs, targets;
    std::vector<float> init;  // initial parameters, canonical order

    explicit DebugCase(const std::string& path) : r(path, TENSOR_FILE_DEBUG_STATE) {
        cfg = read_config(r);
        B = (int)r.integer("debug.batch_size");
        T = cfg.seq_len;
        inputs = r.ints("batch.inputs", (int64_t)B * T);
        targets = r.ints("batch.targets", (int64_t)B * T);
        for (const ParamSpec& s : parameter_spec(cfg)) {
            std::vector<float> t = r.floats(s.name, s.numel());
            init.insert(init.end(), t.begin(), t.end());
        }
    }
    // 1 / (number of targets the reference counted)
    float loss_scale() const {
        int64_t count = 0;
        for (int m : r.ints("batch.loss_mask")) { count += m; }
        return 1.0f / (float)std::max<int64_t>(count, 1);
    }
    // The optimizer settings the reference trained with.
    OptimizerConfig optimizer() const {
        OptimizerConfig opt;
        opt.read(r);
        return opt;
    }
    // A model with the state's initial parameters (and model state) and an optimizer built with `opt`.
    std::unique_ptr<Model> model(const OptimizerConfig& opt) const {
        auto m = std::make_unique<Model>(cfg, B, T);
        m->set_parameters(init);
        m->read_state(r);  // model state that is not a parameter (train_san's fixed QK input), if any
        m->build_optimizer(opt);
        return m;
    }
    // One optimizer step (step k of a schedule of `total`) on the debug batch; returns the
    // loss before it.
    double train_step(Model& model, long k, long total, float* grad_norm) const {
        const OptimizerConfig& opt = model.optimizer->config();
        model.zero_grad();
        LossStats s = model.forward(inputs.data(), targets.data(), B, T, loss_scale(), nullptr);
        model.backward();
        double f = opt.schedule.multiplier(k, total);
        *grad_norm = model.update(opt.lr * f, opt.lr_other * f);
        return model.loss_value(s);
    }
};

template <typename T>
static bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
    return a.size() == b.size() && memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

// `steps` steps straight, saving a checkpoint after `split`; versus a fresh model that loads
// it and runs the remaining steps: parameters and optimizer state must be bit-identical.
template <typename Model>
void check_resume(const DebugCase<Model>& dc, const OptimizerConfig& opt, long split, long steps, long total,
                  const std::string& checkpoint) {
    std::unique_ptr<Model> straight_model = dc.model(opt);
    Model& straight = *straight_model;
    float norm = 0.0f;
    for (long k = 0; k < split; k++) { dc.train_step(straight, k, total, &norm); }
    save_checkpoint(straight, checkpoint);
    for (long k = split; k < steps; k++) { dc.train_step(straight, k, total, &norm); }
    Model resumed(dc.cfg, dc.B, dc.T);
    resumed.build_optimizer(opt);
    {
        TensorFileReader ckpt(checkpoint, TENSOR_FILE_CHECKPOINT);
        auto back = read_config(ckpt);
        CHECK(back.n_layer == dc.cfg.n_layer && back.vocab_size == dc.cfg.vocab_size && back.bos_id == dc.cfg.bos_id);
        resumed.load_parameters(ckpt, true);
    }
    CHECK_EQ((long)resumed.steps_done(), split);
    for (long k = split; k < steps; k++) { dc.train_step(resumed, k, total, &norm); }
    CHECK(same_bits(straight.get_parameters(), resumed.get_parameters()));
    const ParamOptimizer &a = *straight.optimizer, &b = *resumed.optimizer;
    CHECK(a.has_state() && b.has_state() && a.state_kind() == opt.optimizer && b.state_kind() == opt.optimizer);
    if (a.adam_m() != nullptr && b.adam_m() != nullptr) {
        CHECK(same_bits(copy_from_device(a.adam_m(), straight.device_elements), copy_from_device(b.adam_m(), resumed.device_elements)));
    }
    if (opt.is_muon()) {
        CHECK(same_bits(copy_from_device(a.muon_momentum(), straight.device_elements),
                        copy_from_device(b.muon_momentum(), resumed.device_elements)));
    }
    remove(checkpoint.c_str());
}

// Tolerances of a trainer test against a debug state (the test file states them and the
// errors they were measured from).
struct Tolerances {
    Tolerance logits, loss, grads, traj_loss, traj_norm;
    double grads_l2_matrix;   // relative L2 error per gradient tensor: matrices
    double grads_l2_other;    // ... embeddings, gains, gates, biases
    double final_l2_matrix;   // relative L2 error per matrix after the steps (tight enough to see weight decay)
    double final_l2_other;    // ... per embedding/gain/gate/bias tensor (small tensors of tiny values)
    double final_lr_fraction;  // per element: |error| <= this * lr
    double final_lr_fraction_muon = 0.0;  // ... for Muon's matrices (no per-element division by a running RMS)
};

// What differs between the trainers' checks of a debug state.
struct StateCheck {
    int64_t expected_parameters = 0;  // the count written out from the architecture (not from parameter_spec)
    std::function<const Tolerances&(const OptimizerConfig&)> tolerances;
    bool lse_sq = false;              // the model reports the mean lse^2 (z-loss models)
    bool grad_norm_every_step = true;  // else only the first step's (bf16: later ones are chaotic)
    // a tensor's final L2 comparison done otherwise (returns true when it did it)
    std::function<bool(const ParamSpec&, const float* got, const float* ref, const Tolerances&)> final_l2;
    std::string resume_file;           // the checkpoint the resume check writes (and removes)
};

// The comparison with the reference: 1. parameter counts; 2. the loss mask; 3. forward:
// logits and loss; 4. backward: every gradient (the padded vocabulary rows get none);
// 5. the trajectory of the state's optimizer steps and the final parameters; 6. resume.
template <typename Model>
void check_state(const std::string& path, const StateCheck& how) {
    DebugCase<Model> dc(path);
    const auto& c = dc.cfg;
    const int N = dc.B * dc.T, Vp = c.padded_vocab();
    std::vector<ParamSpec> spec = parameter_spec(c);

    // 1. parameter counts
    int64_t from_file = 0;
    for (const ParamSpec& s : spec) { from_file += dc.r.tensor(s.name).numel(); }
    CHECK_EQ(count_parameters(c).total, how.expected_parameters);
    CHECK_EQ(from_file, how.expected_parameters);

    // 2.-4. forward and backward
    const OptimizerConfig opt = dc.optimizer();
    const Tolerances& tol = how.tolerances(opt);
    std::unique_ptr<Model> model = dc.model(opt);
    model->zero_grad();
    LossStats stats = model->forward(dc.inputs.data(), dc.targets.data(), dc.B, dc.T, dc.loss_scale());
    std::vector<int> ref_mask = dc.r.ints("batch.loss_mask");
    int mask_mismatch = 0;
    for (int i = 0; i < N; i++) { mask_mismatch += (model->loss_targets()[i] >= 0) != (ref_mask[i] != 0); }
    CHECK_EQ(mask_mismatch, 0);
    model->backward();
    std::vector<float> logits = copy_from_device(model->logits, (size_t)N * Vp);
    compare("logits", logits.data(), dc.r.floats("logits", (int64_t)N * Vp).data(), logits.size(), tol.logits);
    float loss = (float)model->loss_value(stats), ce = (float)(stats.ce_sum / stats.count);
    compare("loss", &loss, dc.r.floats("loss", 1).data(), 1, tol.loss);
    compare("loss.ce", &ce, dc.r.floats("loss.ce", 1).data(), 1, tol.loss);
    if (how.lse_sq) {
        float lse_sq = (float)(stats.lse_sq_sum / stats.count);
        compare("loss.lse_sq", &lse_sq, dc.r.floats("loss.lse_sq", 1).data(), 1, tol.loss);
    }
    std::vector<float> grads = model->get_gradients();
    size_t offset = 0;
    for (const ParamSpec& s : spec) {
        std::vector<float> ref = dc.r.floats("grad." + s.name, s.numel());
        compare("grad." + s.name, grads.data() + offset, ref.data(), s.numel(), tol.grads);
        compare_l2("grad." + s.name, grads.data() + offset, ref.data(), s.numel(),
                   s.matrix ? tol.grads_l2_matrix : tol.grads_l2_other);
        offset += s.numel();
    }
    // the padded rows of wte (the first tensor) get no gradient
    size_t padded_grads = 0;
    for (size_t i = (size_t)c.vocab_size * c.n_embd; i < (size_t)Vp * c.n_embd; i++) { padded_grads += grads[i] != 0.0f; }
    CHECK_EQ(padded_grads, (size_t)0);

    // 5. the trajectory
    long steps = (long)dc.r.integer("debug.steps"), total = (long)dc.r.integer("debug.schedule_steps");
    std::unique_ptr<Model> trained = dc.model(opt);
    std::vector<float> traj_loss, traj_norm, traj_lr, traj_lr_other;
    for (long k = 0; k < steps; k++) {
        float norm = 0.0f;
        traj_loss.push_back((float)dc.train_step(*trained, k, total, &norm));
        traj_norm.push_back(norm);
        double f = opt.schedule.multiplier(k, total);
        traj_lr.push_back((float)(opt.lr * f));
        traj_lr_other.push_back((float)(opt.lr_other * f));
    }
    compare("traj.loss", traj_loss.data(), dc.r.floats("traj.loss", steps).data(), steps, tol.traj_loss);
    long norm_steps = how.grad_norm_every_step ? steps : 1;
    compare("traj.grad_norm", traj_norm.data(), dc.r.floats("traj.grad_norm", steps).data(), norm_steps, tol.traj_norm);
    compare("traj.lr_matrix", traj_lr.data(), dc.r.floats("traj.lr_matrix", steps).data(), steps, {0, 1e-6});
    compare("traj.lr_other", traj_lr_other.data(), dc.r.floats("traj.lr_other", steps).data(), steps, {0, 1e-6});
    std::vector<float> final_params = trained->get_parameters();
    offset = 0;
    for (const ParamSpec& s : spec) {
        std::vector<float> ref = dc.r.floats("final." + s.name, s.numel());
        const float* got = final_params.data() + offset;
        if (!how.final_l2 || !how.final_l2(s, got, ref.data(), tol)) {
            compare_l2("final." + s.name, got, ref.data(), s.numel(), s.matrix ? tol.final_l2_matrix : tol.final_l2_other);
        }
        double fraction = opt.is_muon() && s.matrix ? tol.final_lr_fraction_muon : tol.final_lr_fraction;
        // the paper order's update is not damped by (1 - mu): per unit of lr it moves the
        // weights 1 / (1 - mu) times as far as the keller order (the states use lr 1e-3 for it)
        double step_unit = s.matrix ? opt.lr : opt.lr_other;
        if (opt.is_muon() && s.matrix && opt.muon_order == MuonOrder::Paper) { step_unit /= 1.0 - opt.muon_momentum; }
        compare("final." + s.name, got, ref.data(), s.numel(), {0.0, 0.0, fraction * step_unit});
        offset += s.numel();
    }

    // 6. save -> load -> continue is bit-identical to continuing
    check_resume(dc, opt, 4, steps, total, how.resume_file);
}
