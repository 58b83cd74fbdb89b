/*
The optimizer step shared by the trainers (doc/san-model.md, "Optimizers"): parameters
live in one device buffer in the order of a list of ParamSpec; each tensor is in the
matrix group (2-D weights: weight decay, and the matrix optimizer) or the other group
(embeddings, gains, gates, biases: no weight decay, own learning rate).

One step: global gradient norm over all tensors (deterministic, llmc/reduce.cuh), clip
factor min(1, clip / (norm + 1e-6)), then AdamW per tensor with the group's rate and
decay. The state (fp32 m and v) is saved and loaded by name as opt.m.<param> and
opt.v.<param> (doc/formats.md, "Model checkpoints").
*/
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "adamw.cuh"
#include "cuda_common.h"
#include "reduce.cuh"
#include "schedule.h"
#include "tensor_file.h"

struct ParamSpec {
    std::string name;
    std::vector<int64_t> shape;
    bool matrix;      // matrix group: weight decay (and the matrix optimizer)
    float init_std;   // > 0: N(0, init_std); 0: constant init_value
    float init_value;
    int64_t numel() const {
        int64_t n = 1;
        for (int64_t s : shape) { n *= s; }
        return n;
    }
};

inline size_t total_numel(const std::vector<ParamSpec>& spec) {
    size_t n = 0;
    for (const ParamSpec& s : spec) { n += s.numel(); }
    return n;
}

struct OptimizerConfig {
    std::string optimizer = "adamw";
    double lr = 6e-4, lr_other = -1.0;  // lr_other < 0: same as lr
    double weight_decay = 0.01, beta1 = 0.9, beta2 = 0.95, eps = 1e-8, grad_clip = 1.0;
    Schedule schedule;

    void write(TensorFileWriter& w) const {
        w.set("opt.optimizer", optimizer);
        w.set("opt.lr", lr);
        w.set("opt.lr_other", lr_other < 0 ? lr : lr_other);
        w.set("opt.weight_decay", weight_decay);
        w.set("opt.beta1", beta1);
        w.set("opt.beta2", beta2);
        w.set("opt.eps", eps);
        w.set("opt.grad_clip", grad_clip);
        w.set("opt.schedule", schedule.kind);
        w.set("opt.warmup_frac", schedule.warmup_frac);
        w.set("opt.decay_frac", schedule.decay_frac);
        w.set("opt.final_frac", schedule.final_frac);
    }
    void read(const TensorFileReader& r) {
        optimizer = r.str("opt.optimizer");
        lr = r.real("opt.lr");
        lr_other = r.real("opt.lr_other");
        weight_decay = r.real("opt.weight_decay");
        beta1 = r.real("opt.beta1");
        beta2 = r.real("opt.beta2");
        eps = r.real("opt.eps");
        grad_clip = r.real("opt.grad_clip");
        schedule.kind = r.str("opt.schedule");
        schedule.warmup_frac = r.real("opt.warmup_frac");
        schedule.decay_frac = r.real("opt.decay_frac");
        schedule.final_frac = r.real("opt.final_frac");
    }
};

class ParamOptimizer {
public:
    int64_t step = 0;  // optimizer steps done (AdamW bias correction uses step + 1 next)

    ParamOptimizer(const std::vector<ParamSpec>& spec, floatX* params, float* master, floatX* grads, float* scratch)
        : spec_(spec), num_params_(total_numel(spec)), params_(params), master_(master), grads_(grads), scratch_(scratch) {
        norm_sq_ = cudaMallocElements(float, 1);
    }
    ~ParamOptimizer() {
        cudaFree(norm_sq_);
        if (m_ != nullptr) {
            cudaFree(m_);
            cudaFree(v_);
        }
    }
    ParamOptimizer(const ParamOptimizer&) = delete;
    ParamOptimizer& operator=(const ParamOptimizer&) = delete;

    bool has_state() const { return m_ != nullptr; }
    const float* adam_m() const { return m_; }

    // Global L2 norm of all gradients.
    float grad_norm(cudaStream_t stream) {
        dot_product(norm_sq_, scratch_, grads_, grads_, num_params_, 1.0f, false, stream);
        float norm_sq = 0.0f;
        cudaCheck(cudaMemcpy(&norm_sq, norm_sq_, sizeof(float), cudaMemcpyDeviceToHost));
        return std::sqrt(norm_sq);
    }

    // One step with the given rates; returns the gradient norm before clipping.
    float update(const OptimizerConfig& opt, double lr_matrix, double lr_other, cudaStream_t stream) {
        allocate_state();
        float norm = grad_norm(stream);
        if (!std::isfinite(norm)) { fatal("step %lld: the gradient norm is %f: the run diverged", (long long)step + 1, norm); }
        float grad_scale = opt.grad_clip > 0.0 ? std::min(1.0f, (float)(opt.grad_clip / (norm + 1e-6))) : 1.0f;
        step++;
        size_t offset = 0;
        for (const ParamSpec& s : spec_) {
            AdamWStep a;
            a.lr = (float)(s.matrix ? lr_matrix : lr_other);
            a.beta1 = (float)opt.beta1;
            a.beta2 = (float)opt.beta2;
            a.eps = (float)opt.eps;
            a.weight_decay = s.matrix ? (float)opt.weight_decay : 0.0f;
            a.beta1_correction = (float)(1.0 - std::pow(opt.beta1, (double)step));
            a.beta2_correction = (float)(1.0 - std::pow(opt.beta2, (double)step));
            a.grad_scale = grad_scale;
            adamw_update(params_ + offset, master_ != nullptr ? master_ + offset : nullptr, grads_ + offset, m_ + offset,
                         v_ + offset, s.numel(), a, stream);
            offset += s.numel();
        }
        return norm;
    }

    void save(TensorFileWriter& w, const OptimizerConfig& opt) const {
        w.set("step", (long long)step);
        w.set("has_optimizer", has_state() ? 1 : 0);
        opt.write(w);
        if (!has_state()) { return; }
        std::vector<float> m = copy_from_device(m_, num_params_), v = copy_from_device(v_, num_params_);
        size_t offset = 0;
        for (const ParamSpec& s : spec_) {
            w.add_floats("opt.m." + s.name, s.shape, m.data() + offset);
            w.add_floats("opt.v." + s.name, s.shape, v.data() + offset);
            offset += s.numel();
        }
    }

    // Restores the AdamW state and step, if the file has them.
    void load(const TensorFileReader& r) {
        if (r.integer("has_optimizer") != 1) { return; }
        if (r.str("opt.optimizer") != "adamw") {
            r.fail("holds %s optimizer state; this build resumes AdamW only", r.str("opt.optimizer").c_str());
        }
        std::vector<float> m, v;
        for (const ParamSpec& s : spec_) {
            std::vector<float> tm = r.floats("opt.m." + s.name, s.numel()), tv = r.floats("opt.v." + s.name, s.numel());
            m.insert(m.end(), tm.begin(), tm.end());
            v.insert(v.end(), tv.begin(), tv.end());
        }
        allocate_state();
        cudaCheck(cudaMemcpy(m_, m.data(), num_params_ * sizeof(float), cudaMemcpyHostToDevice));
        cudaCheck(cudaMemcpy(v_, v.data(), num_params_ * sizeof(float), cudaMemcpyHostToDevice));
        step = r.integer("step");
    }

private:
    void allocate_state() {
        if (m_ != nullptr) { return; }
        m_ = cudaMallocElements(float, num_params_);
        v_ = cudaMallocElements(float, num_params_);
        cudaCheck(cudaMemset(m_, 0, num_params_ * sizeof(float)));
        cudaCheck(cudaMemset(v_, 0, num_params_ * sizeof(float)));
    }

    std::vector<ParamSpec> spec_;
    size_t num_params_;
    floatX* params_;
    float* master_;
    floatX* grads_;
    float* scratch_;  // kReduceBlocks floats
    float* norm_sq_ = nullptr;
    float *m_ = nullptr, *v_ = nullptr;
};
