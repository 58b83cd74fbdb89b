/*
The optimizer step shared by the trainers: parameters live in one device buffer in the order of a
list of ParamSpec; each tensor is in the matrix group (2-D weights: weight decay, the matrix
optimizer) or the other group (embeddings, gains, gates, biases: no decay unless
--decay-embedding 1 decays the embeddings; own rate). ParamOptimizer::update clips by the global
gradient norm, then runs AdamW per tensor ("adamw"), or Muon on the matrix group and AdamW without
decay on the other ("muon"). Over N ranks (distribute(); llmc/parallel/data_parallel.h) it
updates only what this rank owns. doc/optimizers.md; doc/san-model.md "Optimizers".
*/
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "llmc/kernels/adamw.cuh"
#include "llmc/cuda_common.h"
#include "llmc/parallel/data_parallel.h"
#include "llmc/kernels/muon.cuh"
#include "llmc/optim/param_spec.h"
#include "llmc/kernels/reduce.cuh"
#include "llmc/optim/schedule.h"
#include "llmc/data/tensor_file.h"

// A model's default peak rates (per device, before --lr-scale-gpus), as its trainer's
// default_rates finds them in presets/rates/NAME.conf or a preset's swept rates
// (llmc/train/preset_files.h compiled_default_rates). A rate < 0: none (train_gpt2 has no Muon).
struct DefaultRates {
    double muon = -1.0, adamw = -1.0, muon_other = -1.0;
    std::string source;  // where the rates come from, as -h and the optimizer line print it
};

enum class OptimizerKind { AdamW, Muon };
inline const Choices<OptimizerKind> kOptimizerKinds{{"adamw", "muon"}};

struct OptimizerConfig {
    OptimizerKind optimizer = OptimizerKind::AdamW;
    double lr = 6e-4, lr_other = -1.0;  // lr_other < 0: same as lr (resolve_rates: the optimizer's defaults)
    double weight_decay = 0.01, beta1 = 0.9, beta2 = 0.95, eps = 1e-8, grad_clip = 1.0;
    MuonOrder muon_order = MuonOrder::Keller;
    double muon_momentum = 0.95;
    int ns_steps = 5;
    int ns_fp32 = 0;  // 1: Newton-Schulz in fp32 also in bf16 builds
    int decay_embedding = 0;  // 1: the embeddings decay too (decays())
    Schedule schedule;

    bool is_muon() const { return optimizer == OptimizerKind::Muon; }
    // Whether weight decay applies to a tensor: the matrix group's, and with decay_embedding
    // the other group's 2-D tensors (the embeddings; gains, gates and biases are 1-D).
    bool decays(const ParamSpec& s) const { return s.matrix || (decay_embedding != 0 && s.shape.size() == 2); }
    const char* name() const { return kOptimizerKinds.name(optimizer); }
    void check() const {
        // (written as !(ok) so that NaN fails too; 100 Newton-Schulz steps is far past any use)
        if (!(ns_steps >= 0 && ns_steps <= 100)) { fatal("--ns-steps must be in [0, 100], got %d", ns_steps); }
        if (!(muon_momentum >= 0.0 && muon_momentum < 1.0)) { fatal("--muon-momentum must be in [0, 1), got %g", muon_momentum); }
        if (!(beta1 >= 0.0 && beta1 < 1.0)) { fatal("--beta1 must be in [0, 1), got %g", beta1); }
        if (!(beta2 >= 0.0 && beta2 < 1.0)) { fatal("--beta2 must be in [0, 1), got %g", beta2); }
        if (!(eps > 0.0)) { fatal("--eps must be > 0, got %g", eps); }
        if (!(weight_decay >= 0.0)) { fatal("--weight-decay must be >= 0, got %g", weight_decay); }
        if (!(grad_clip >= 0.0)) { fatal("--grad-clip must be >= 0 (0: off), got %g", grad_clip); }
        if (ns_fp32 != 0 && ns_fp32 != 1) { fatal("--ns-fp32 must be 0 or 1, got %d", ns_fp32); }
        if (decay_embedding != 0 && decay_embedding != 1) { fatal("--decay-embedding must be 0 or 1, got %d", decay_embedding); }
        schedule.check_fractions();
    }
    // Rates left < 0 take the model's defaults (the matrix group's rate for this optimizer;
    // the other group: 3e-4 under Muon, the matrix rate under AdamW), then the N-GPU rule
    // of the paper's code: AdamW rates x N, the Muon rate x sqrt(N).
    void resolve_rates(const DefaultRates& defaults, int lr_scale_gpus = 1) {
        if (lr_scale_gpus < 1) { fatal("--lr-scale-gpus must be >= 1, got %d", lr_scale_gpus); }
        if (lr < 0) { lr = is_muon() ? defaults.muon : defaults.adamw; }
        if (lr_other < 0) { lr_other = is_muon() ? defaults.muon_other : lr; }
        lr *= is_muon() ? std::sqrt((double)lr_scale_gpus) : (double)lr_scale_gpus;
        lr_other *= lr_scale_gpus;
    }
    MuonConfig muon() const {
        MuonConfig m;
        m.order = muon_order;
        m.momentum = (float)muon_momentum;
        m.ns_steps = ns_steps;
        m.ns_fp32 = ns_fp32 != 0;
        return m;
    }

    void write(TensorFileWriter& w) const {
        w.set("opt.optimizer", std::string(name()));
        w.set("opt.lr", lr);
        w.set("opt.lr_other", lr_other < 0 ? lr : lr_other);
        w.set("opt.weight_decay", weight_decay);
        w.set("opt.beta1", beta1);
        w.set("opt.beta2", beta2);
        w.set("opt.eps", eps);
        w.set("opt.grad_clip", grad_clip);
        w.set("opt.muon_order", std::string(kMuonOrders.name(muon_order)));
        w.set("opt.muon_momentum", muon_momentum);
        w.set("opt.ns_steps", (long long)ns_steps);
        w.set("opt.ns_fp32", (long long)ns_fp32);
        w.set("opt.schedule", std::string(schedule.name()));
        w.set("opt.warmup_frac", schedule.warmup_frac);
        w.set("opt.decay_frac", schedule.decay_frac);
        w.set("opt.final_frac", schedule.final_frac);
        // only when set: a run without them writes the file it wrote before the keys existed
        if (schedule.horizon > 0) { w.set("opt.schedule_steps", (long long)schedule.horizon); }
        if (decay_embedding != 0) { w.set("opt.decay_embedding", (long long)decay_embedding); }
    }
    void read(const TensorFileReader& r) {
        read_choice(r, "opt.optimizer", kOptimizerKinds, &optimizer);
        lr = r.real("opt.lr");
        lr_other = r.real("opt.lr_other");
        weight_decay = r.real("opt.weight_decay");
        beta1 = r.real("opt.beta1");
        beta2 = r.real("opt.beta2");
        eps = r.real("opt.eps");
        grad_clip = r.real("opt.grad_clip");
        // absent from files written before Muon existed
        if (r.has_key("opt.muon_order")) { read_choice(r, "opt.muon_order", kMuonOrders, &muon_order); }
        if (r.has_key("opt.muon_momentum")) { muon_momentum = r.real("opt.muon_momentum"); }
        if (r.has_key("opt.ns_steps")) { ns_steps = r.int32("opt.ns_steps"); }
        if (r.has_key("opt.ns_fp32")) { ns_fp32 = r.int32("opt.ns_fp32"); }
        read_choice(r, "opt.schedule", kScheduleKinds, &schedule.kind);
        schedule.warmup_frac = r.real("opt.warmup_frac");
        schedule.decay_frac = r.real("opt.decay_frac");
        schedule.final_frac = r.real("opt.final_frac");
        schedule.horizon = r.has_key("opt.schedule_steps") ? (long)r.integer("opt.schedule_steps") : 0;
        decay_embedding = r.has_key("opt.decay_embedding") ? r.int32("opt.decay_embedding") : 0;
    }
};

class ParamOptimizer {
public:
    int64_t step = 0;  // optimizer steps done (AdamW bias correction uses step + 1 next)

    ParamOptimizer(const OptimizerConfig& config, const std::vector<ParamSpec>& spec, floatX* params, float* master,
                   floatX* grads, float* scratch)
        : config_(config), spec_(spec), num_params_(layout_parameters(spec_)), params_(params), model_master_(master),
          grads_(grads), scratch_(scratch) {
        config_.check();
        norm_sq_ = cudaMallocElements(float, 1);
        distribute(nullptr, 0);
    }
    ~ParamOptimizer() {
        cudaFree(norm_sq_);
        if (comm_stream_ != nullptr) {
            cudaEventDestroy(ready_);
            cudaEventDestroy(reduced_);
            cudaStreamDestroy(comm_stream_);
        }
        if (m_ != nullptr) {
            cudaFree(m_);
            cudaFree(v_);
        }
        if (mom_ != nullptr) { cudaFree(mom_); }
        if (master_shard_ != nullptr) { cudaFree(master_shard_); }
    }
    ParamOptimizer(const ParamOptimizer&) = delete;
    ParamOptimizer& operator=(const ParamOptimizer&) = delete;

    const OptimizerConfig& config() const { return config_; }
    bool has_state() const { return m_ != nullptr; }
    // this rank's state buffers (layouts: DataParallel's pieces; the tests compare them)
    const float* adam_m() const { return m_; }
    const float* adam_v() const { return v_; }
    const float* master_shard() const { return master_shard_; }
    const float* muon_momentum() const { return mom_; }  // null unless the state is Muon's
    OptimizerKind state_kind() const { return kind_; }  // the state's optimizer (has_state())

    // Where update() reads the gradients: the floatX buffer the backward pass writes, or an
    // fp32 buffer they were accumulated into (ModelParameters::grads_fp32); null: floatX.
    void read_fp32_gradients(const float* grads) { grads_fp32_ = grads; }

    // Data parallelism over comm's ranks (null: one rank) with ZeRO stage `zero` (0 or 1);
    // before the optimizer has state. With zero 1 and master weights the optimizer takes
    // this rank's share of them (shards_master(): the model's full copy may then go).
    void distribute(Comm* comm, int zero) {
        if (m_ != nullptr) { fatal("ParamOptimizer::distribute: the optimizer has state already"); }
        if (master_shard_ != nullptr) { fatal("ParamOptimizer::distribute: the master weights are sharded already"); }
        std::vector<size_t> offsets, sizes;
        for (const ParamSpec& s : spec_) {
            offsets.push_back(s.offset);
            sizes.push_back((size_t)s.numel());
        }
        dp_ = std::make_unique<DataParallel>(comm, zero, offsets, sizes, num_params_, kParamAlignElements);
        planned_ = config_.optimizer;
        dp_->plan(muon_tensors(planned_));
        if (zero == 1 && model_master_ != nullptr) {
            master_shard_ = cudaMallocElements(float, std::max<size_t>(dp_->master_elements(), 1));
            cudaCheck(cudaMemset(master_shard_, 0, dp_->master_elements() * sizeof(float)));
            dp_->load_full_device(model_master_, master_shard_, DataParallel::State::Master);
            model_master_ = nullptr;
        }
    }
    const DataParallel& data_parallel() const { return *dp_; }

    // ZeRO-1 master weights (bf16 builds): this rank's share lives here.
    bool shards_master() const { return master_shard_ != nullptr; }
    // Full-layout fp32 values (E) -> this rank's share (local).
    void load_master(const std::vector<float>& laid_out) {
        dp_->load_full(laid_out, master_shard_, DataParallel::State::Master);
    }
    // Every rank's share -> the full layout (E host floats): a collective.
    std::vector<float> gather_master() { return dp_->gather_full(master_shard_, DataParallel::State::Master, nullptr); }

    // Bytes of optimizer state this rank holds for the configured optimizer: AdamW m and v,
    // the Muon momentum, and the fp32 master weights (bf16 builds; sharded under ZeRO-1,
    // else the model's full copy).
    size_t state_bytes() const {
        size_t floats = 2 * dp_->state_elements() + dp_->muon_state_elements();
        if (master_shard_ != nullptr) {
            floats += dp_->master_elements();
        } else if (model_master_ != nullptr) {
            floats += num_params_;
        }
        return floats * sizeof(float);
    }

    // Overlap of the reduction with the backward pass (doc/multi-gpu.md): the gradients of
    // [begin, end) (whole tensors: a layer) are final once what `stream` has queued is
    // done, so their reduction starts now on a second stream, ordered after it by an event;
    // update() reduces the rest and waits for that stream. Over one rank, or with an fp32
    // accumulator (filled after the whole backward pass), there is nothing to start early.
    void reduce_early(size_t begin, size_t end, cudaStream_t stream) {
        if (dp_->world() == 1 || grads_fp32_ != nullptr || begin >= end) { return; }
        if (comm_stream_ == nullptr) {
            cudaCheck(cudaStreamCreateWithFlags(&comm_stream_, cudaStreamNonBlocking));
            cudaCheck(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming));
            cudaCheck(cudaEventCreateWithFlags(&reduced_, cudaEventDisableTiming));
        }
        cudaCheck(cudaEventRecord(ready_, stream));
        cudaCheck(cudaStreamWaitEvent(comm_stream_, ready_, 0));
        dp_->reduce_range(grads_, begin, end, comm_stream_);
        early_.push_back({begin, end});
        early_total_++;
    }
    // How many ranges reduce_early() has started: since the last update, and in all.
    size_t early_ranges() const { return early_.size(); }
    long early_total() const { return early_total_; }

    // One step with the given rates; returns the gradient norm before clipping. When that
    // norm is not finite nothing is updated (the trainer stops and names the tensor).
    // The step: global gradient norm (deterministic, llmc/kernels/reduce.cuh), clip factor
    // min(1, clip / (norm + 1e-6)), then AdamW per tensor, or Muon on the matrix group
    // (llmc/kernels/muon.cuh) and AdamW without decay on the other.
    float update(double lr_matrix, double lr_other, cudaStream_t stream) {
        const OptimizerConfig& opt = config_;
        allocate_state(opt.optimizer);
        // the sum over ranks, reduced in the precision the gradients were accumulated in
        float norm;
        if (grads_fp32_ != nullptr) {
            dp_->reduce_gradients(const_cast<float*>(grads_fp32_), stream);
            norm = dp_->grad_norm(grads_fp32_, norm_sq_, scratch_, stream);
        } else {
            if (early_.empty()) {
                dp_->reduce_gradients(grads_, stream);
            } else {  // the ranges not started early, then wait for the second stream
                std::sort(early_.begin(), early_.end());
                size_t at = 0;
                cudaCheck(cudaEventRecord(ready_, stream));
                cudaCheck(cudaStreamWaitEvent(comm_stream_, ready_, 0));
                for (const auto& r : early_) {
                    dp_->reduce_range(grads_, at, r.first, comm_stream_);
                    at = std::max(at, r.second);
                }
                dp_->reduce_range(grads_, at, num_params_, comm_stream_);
                cudaCheck(cudaEventRecord(reduced_, comm_stream_));
                cudaCheck(cudaStreamWaitEvent(stream, reduced_, 0));
                early_.clear();
            }
            norm = dp_->grad_norm((const floatX*)grads_, norm_sq_, scratch_, stream);
        }
        if (!std::isfinite(norm)) { return norm; }
        float grad_scale = opt.grad_clip > 0.0 ? std::min(1.0f, (float)(opt.grad_clip / (norm + 1e-6))) : 1.0f;
        step++;
        if (grads_fp32_ != nullptr) {
            apply(grads_fp32_, lr_matrix, lr_other, grad_scale, stream);
        } else {
            apply((const floatX*)grads_, lr_matrix, lr_other, grad_scale, stream);
        }
        dp_->gather_updated(params_, stream);
        return norm;
    }

    // The state by name (opt.m/opt.v.<param>, opt.mom.<param>: doc/formats.md "Model
    // checkpoints"). Over N ranks the gradients are summed first, Muon matrices are updated by
    // their owners and ZeRO-1 keeps on each rank only the state it updates (bf16: its fp32
    // master weights too, shards_master()); a checkpoint gathers everything, so save() is then a
    // collective that every rank calls. It also makes the master weights current on every rank,
    // so get_parameters() after it reads the whole model.
    void save(TensorFileWriter& w) {
        w.set("step", (long long)step);
        w.set("has_optimizer", has_state() ? 1 : 0);
        if (has_state() && kind_ != config_.optimizer) {
            fatal("checkpoint: the optimizer state is %s's but the config says %s", kOptimizerKinds.name(kind_),
                  config_.name());
        }
        config_.write(w);
        // full-layout master weights are current where a rank updated them: the matrices
        // from their owners (sharded ones are gathered by ModelParameters::get_parameters)
        if (model_master_ != nullptr && dp_->muon()) { dp_->broadcast_matrices(model_master_, nullptr); }
        if (!has_state()) { return; }
        std::vector<float> m = dp_->gather_full(m_, DataParallel::State::AdamW, nullptr);
        std::vector<float> v = dp_->gather_full(v_, DataParallel::State::AdamW, nullptr);
        std::vector<float> mom =
            mom_ != nullptr ? dp_->gather_full(mom_, DataParallel::State::Muon, nullptr) : std::vector<float>();
        for (const ParamSpec& s : spec_) {
            const size_t offset = s.offset;
            if (uses_muon(s)) {
                w.add_floats("opt.mom." + s.name, s.shape, mom.data() + offset);
            } else {
                w.add_floats("opt.m." + s.name, s.shape, m.data() + offset);
                w.add_floats("opt.v." + s.name, s.shape, v.data() + offset);
            }
        }
    }

    // Restores the optimizer state (AdamW's or Muon's, as the file says) and step, if the
    // file has them. Continuing it with the other optimizer is refused by update() (under
    // ZeRO-1 already here: the state is sharded by the run's optimizer).
    void load(const TensorFileReader& r) {
        const long long has = r.integer("has_optimizer");
        if (has != 0 && has != 1) { r.fail("has_optimizer must be 0 or 1, got %lld", has); }
        if (has == 0) { return; }
        OptimizerKind kind;
        read_choice(r, "opt.optimizer", kOptimizerKinds, &kind);
        release_state();
        allocate_state(kind);
        std::vector<float> m(num_params_, 0.0f), v(num_params_, 0.0f), mom;
        if (mom_ != nullptr) { mom.assign(num_params_, 0.0f); }
        for (const ParamSpec& s : spec_) {
            const size_t offset = s.offset;
            if (uses_muon(s)) {
                std::vector<float> t = r.floats("opt.mom." + s.name, s.numel());
                std::copy(t.begin(), t.end(), mom.begin() + offset);
            } else {
                std::vector<float> tm = r.floats("opt.m." + s.name, s.numel()), tv = r.floats("opt.v." + s.name, s.numel());
                std::copy(tm.begin(), tm.end(), m.begin() + offset);
                std::copy(tv.begin(), tv.end(), v.begin() + offset);
            }
        }
        dp_->load_full(m, m_, DataParallel::State::AdamW);
        dp_->load_full(v, v_, DataParallel::State::AdamW);
        if (mom_ != nullptr) { dp_->load_full(mom, mom_, DataParallel::State::Muon); }
        step = r.integer("step");
        if (step < 0) { r.fail("step is %lld: a saved run has done 0 or more steps", (long long)step); }
    }

private:
    template <typename TGrad>
    void apply(const TGrad* grads, double lr_matrix, double lr_other, float grad_scale, cudaStream_t stream) {
        const OptimizerConfig& opt = config_;
        const bool muon = opt.is_muon();
        for (size_t t = 0; t < spec_.size(); t++) {
            const ParamSpec& s = spec_[t];
            if (!(muon && s.matrix)) {
                AdamWStep a;
                a.lr = (float)(s.matrix ? lr_matrix : lr_other);
                a.beta1 = (float)opt.beta1;
                a.beta2 = (float)opt.beta2;
                a.eps = (float)opt.eps;
                a.weight_decay = opt.decays(s) ? (float)opt.weight_decay : 0.0f;
                a.beta1_correction = (float)(1.0 - std::pow(opt.beta1, (double)step));
                a.beta2_correction = (float)(1.0 - std::pow(opt.beta2, (double)step));
                a.grad_scale = grad_scale;
                // the parts of the tensor this rank updates (all of it unless ZeRO-1); the
                // master weights in the full layout, or sharded as the state
                for (const DataParallel::Range& p : dp_->adamw_pieces((int)t)) {
                    float* master = master_shard_ != nullptr ? master_shard_ + p.state
                                    : model_master_ != nullptr ? model_master_ + p.begin
                                                               : nullptr;
                    adamw_update(params_ + p.begin, master, grads + p.begin, m_ + p.state, v_ + p.state, p.end - p.begin, a,
                                 stream);
                }
            }
        }
        if (muon) {  // the master weights of the matrices after the AdamW part when sharded
            float* master = master_shard_ != nullptr ? master_shard_ + dp_->state_elements() : model_master_;
            muon_->step(params_, master, grads, mom_, grad_scale, (float)lr_matrix, (float)opt.weight_decay, opt.muon(),
                        stream);
        }
    }

    bool uses_muon(const ParamSpec& s) const { return kind_ == OptimizerKind::Muon && s.matrix; }

    // The tensors an optimizer of `kind` updates with Muon (none for AdamW).
    std::vector<int> muon_tensors(OptimizerKind kind) const {
        std::vector<int> tensors;
        if (kind != OptimizerKind::Muon) { return tensors; }
        for (size_t t = 0; t < spec_.size(); t++) {
            if (spec_[t].matrix) {
                if (spec_[t].shape.size() != 2) { fatal("Muon: matrix-group tensor %s is not 2-D", spec_[t].name.c_str()); }
                tensors.push_back((int)t);
            }
        }
        return tensors;
    }

    // m, v (and for Muon the momentum) in the parameters' layout; the parts no tensor uses
    // stay zero. The Muon grouping and workspace are made with the state.
    void allocate_state(OptimizerKind kind) {
        if (m_ != nullptr) {
            if (kind != kind_) {
                fatal("the optimizer state is %s's (e.g. from a checkpoint); it cannot be continued with %s",
                      kOptimizerKinds.name(kind_), kOptimizerKinds.name(kind));
            }
            return;
        }
        if (kind != planned_) {
            // ZeRO-1 shards the state (and master weights) by the run's optimizer
            if (dp_->zero() == 1) {
                fatal("the optimizer state is %s's (e.g. from a checkpoint) but this run's optimizer is %s: under "
                      "--zero 1 the state is sharded by the run's optimizer; continue with --optimizer %s",
                      kOptimizerKinds.name(kind), config_.name(), kOptimizerKinds.name(kind));
            }
            planned_ = kind;
            dp_->plan(muon_tensors(kind));
        }
        kind_ = kind;
        const size_t state = dp_->state_elements();  // this rank's AdamW state (all of it unless ZeRO-1)
        m_ = cudaMallocElements(float, std::max<size_t>(state, 1));
        v_ = cudaMallocElements(float, std::max<size_t>(state, 1));
        cudaCheck(cudaMemset(m_, 0, state * sizeof(float)));
        cudaCheck(cudaMemset(v_, 0, state * sizeof(float)));
        if (kind == OptimizerKind::Muon) {
            const size_t mom = dp_->muon_state_elements();  // the full layout, or the owned matrices (ZeRO-1)
            mom_ = cudaMallocElements(float, std::max<size_t>(mom, 1));
            cudaCheck(cudaMemset(mom_, 0, mom * sizeof(float)));
            // each rank orthogonalises the matrices it owns
            std::vector<MuonMatrix> matrices;
            for (int t : muon_tensors(kind)) {
                const ParamSpec& s = spec_[t];
                if (dp_->updates_matrix(t)) {
                    matrices.push_back({(int64_t)s.offset, (int)s.shape[0], (int)s.shape[1], (int64_t)dp_->muon_state(t)});
                }
            }
            muon_ = std::make_unique<MuonOptimizer>(matrices);
        }
    }
    void release_state() {
        if (m_ == nullptr) { return; }
        cudaFree(m_);
        cudaFree(v_);
        if (mom_ != nullptr) { cudaFree(mom_); }
        m_ = v_ = mom_ = nullptr;
        muon_.reset();
    }

    OptimizerConfig config_;
    std::vector<ParamSpec> spec_;
    size_t num_params_;
    floatX* params_;
    float* model_master_;             // the model's full-layout master weights (null: none, or sharded)
    float* master_shard_ = nullptr;   // ZeRO-1: this rank's master weights (AdamW part, then matrices)
    OptimizerKind planned_ = OptimizerKind::AdamW;  // the optimizer dp_'s split was made for
    floatX* grads_;
    const float* grads_fp32_ = nullptr;
    float* scratch_;  // kReduceBlocks floats
    float* norm_sq_ = nullptr;
    float *m_ = nullptr, *v_ = nullptr, *mom_ = nullptr;
    OptimizerKind kind_ = OptimizerKind::AdamW;  // meaningful while there is state (m_)
    std::unique_ptr<MuonOptimizer> muon_;
    std::unique_ptr<DataParallel> dp_;
    // reduce_early(): the second stream, its events, and the ranges started this step
    cudaStream_t comm_stream_ = nullptr;
    cudaEvent_t ready_ = nullptr, reduced_ = nullptr;
    std::vector<std::pair<size_t, size_t>> early_;
    long early_total_ = 0;
};
