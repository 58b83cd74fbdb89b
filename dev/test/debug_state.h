/*
What the trainer tests (test_san.cu, test_gpt2.cu) do alike with a PyTorch debug state
(doc/formats.md "Debug state"), for any model type of llmc/training.h that also derives
from ModelParameters. Include it after the trainer (its read_config and parameter_spec
are used here).

  DebugCase<Model> dc(path)      the config, the batch and the initial parameters
  dc.train_step(model, ...)      one optimizer step on the debug batch, as the reference did
  check_resume(dc, opt, ...)     k steps, save, the rest; versus load + the rest: bit-identical
                                 parameters and optimizer state
*/
#pragma once

#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "dev/test/testing.h"

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
    // One optimizer step (step k of a schedule of `total`) on the debug batch; returns the
    // loss before it.
    double train_step(Model& model, const OptimizerConfig& opt, long k, long total, float* grad_norm) const {
        model.zero_grad();
        LossStats s = model.forward(inputs.data(), targets.data(), B, T, loss_scale(), nullptr);
        model.backward();
        double f = opt.schedule.multiplier(k, total);
        *grad_norm = model.update(opt, opt.lr * f, opt.lr_other * f);
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
    Model straight(dc.cfg, dc.B, dc.T);
    straight.set_parameters(dc.init);
    float norm = 0.0f;
    for (long k = 0; k < split; k++) { dc.train_step(straight, opt, k, total, &norm); }
    straight.save_checkpoint(checkpoint, opt, {});
    for (long k = split; k < steps; k++) { dc.train_step(straight, opt, k, total, &norm); }
    Model resumed(dc.cfg, dc.B, dc.T);
    {
        TensorFileReader ckpt(checkpoint, TENSOR_FILE_CHECKPOINT);
        auto back = read_config(ckpt);
        CHECK(back.n_layer == dc.cfg.n_layer && back.vocab_size == dc.cfg.vocab_size && back.bos_id == dc.cfg.bos_id);
        resumed.load_parameters(ckpt, true);
    }
    CHECK_EQ((long)resumed.steps_done(), split);
    for (long k = split; k < steps; k++) { dc.train_step(resumed, opt, k, total, &norm); }
    CHECK(same_bits(straight.get_parameters(), resumed.get_parameters()));
    const ParamOptimizer &a = *straight.optimizer, &b = *resumed.optimizer;
    CHECK(a.state_kind() == opt.optimizer && b.state_kind() == opt.optimizer);
    if (a.adam_m() != nullptr && b.adam_m() != nullptr) {
        CHECK(same_bits(copy_from_device(a.adam_m(), straight.device_elements), copy_from_device(b.adam_m(), resumed.device_elements)));
    }
    if (opt.is_muon()) {
        CHECK(same_bits(copy_from_device(a.muon_momentum(), straight.device_elements),
                        copy_from_device(b.muon_momentum(), resumed.device_elements)));
    }
    remove(checkpoint.c_str());
}
