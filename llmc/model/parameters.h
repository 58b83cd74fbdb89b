/*
The trainable parameters of a model, shared by the trainers: every tensor of a ParamSpec list in
one device buffer (canonical order, doc/formats.md), their gradients, the fp32 master copy (bf16
builds: the optimizer updates it and rounds into the floatX copy), and the optimizer
(llmc/optim/optimizer.h), built by build_optimizer() before the first update or the load of a
checkpoint's optimizer state. A trainer's model derives from ModelParameters and adds its
activations, forward and backward. Values go in and out as fp32 host vectors in canonical order;
checkpoints hold the master weights, so a bf16 run resumes bit for bit. Sharded master weights
(ZeRO-1) and fp32 gradient accumulation: at the members below, and doc/multi-gpu.md.
*/
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "llmc/cuda_common.h"
#include "llmc/kernels/grad_accumulate.cuh"
#include "llmc/optim/optimizer.h"
#include "llmc/data/tensor_file.h"

class ModelParameters {
public:
    std::vector<ParamSpec> spec;  // with each tensor's offset in the device buffers (layout_parameters)
    size_t num_params = 0;        // values in canonical order (host vectors, files)
    size_t device_elements = 0;   // elements of each device buffer: tensors on aligned offsets
    floatX* params = nullptr;
    // Gradients: backward() accumulates into `grads` (floatX). With accumulate_in_fp32() (bf16
    // builds, --grad-fp32 1) every micro-batch ends with end_micro_batch(), which moves them into
    // the fp32 buffer `grads_fp32` that the optimizer then reads (llmc/kernels/grad_accumulate.cuh).
    floatX* grads = nullptr;
    float* grads_fp32 = nullptr;  // the fp32 gradient accumulator, when accumulate_in_fp32() was called
    // Under ZeRO-1 (distribute(comm, 1)) the master weights are sharded with the optimizer state:
    // the optimizer holds this rank's share, `master` is null, and get_parameters() gathers them
    // (a collective: every rank calls it).
    float* master = nullptr;  // fp32 copy of the parameters (bf16 builds only; null when sharded, above)
    std::unique_ptr<ParamOptimizer> optimizer;  // null until build_optimizer()
    cudaStream_t stream = nullptr;

    // Model state that is not a parameter (not trained, not counted; train_san's fixed QK input of
    // rndembqk / fixedseqqk): written into checkpoints with the parameters and read back by
    // load_parameters (and by the tests from debug states). None by default.
    virtual void write_state(TensorFileWriter&) const {}
    virtual void read_state(const TensorFileReader&) {}

    explicit ModelParameters(std::vector<ParamSpec> parameter_spec) : spec(std::move(parameter_spec)) {
        num_params = total_numel(spec);
        device_elements = layout_parameters(spec);
        params = arena_.alloc<floatX>(device_elements);
        grads = arena_.alloc<floatX>(device_elements);
        cudaCheck(cudaMemset(params, 0, device_elements * sizeof(floatX)));
        cudaCheck(cudaMemset(grads, 0, device_elements * sizeof(floatX)));
        if (PRECISION_MODE != PrecisionMode::FP32) {  // (not in the arena: ZeRO-1 frees it)
            master = cudaMallocElements(float, device_elements);
            cudaCheck(cudaMemset(master, 0, device_elements * sizeof(float)));
        }
        optimizer_scratch_ = arena_.alloc<float>(kReduceBlocks);
        // each layer's tensors ("layers.<l>."), a contiguous range of the layout (the buckets
        // of an overlapped reduction)
        for (const ParamSpec& s : spec) {
            int l = -1;
            if (sscanf(s.name.c_str(), "layers.%d.", &l) != 1 || l < 0) { continue; }
            if ((size_t)l >= layer_range_.size()) { layer_range_.resize(l + 1, {device_elements, 0}); }
            layer_range_[l].first = std::min(layer_range_[l].first, s.offset);
            layer_range_[l].second = std::max(layer_range_[l].second, s.offset + (size_t)s.numel());
        }
        for (size_t l = 0; l < layer_range_.size(); l++) {
            for (const ParamSpec& s : spec) {  // a tensor of another layer inside the range: no buckets
                bool inside = s.offset >= layer_range_[l].first && s.offset < layer_range_[l].second;
                if (inside && s.name.rfind("layers." + std::to_string(l) + ".", 0) != 0) { layer_range_.clear(); }
                if (layer_range_.empty()) { break; }
            }
        }
    }
    virtual ~ModelParameters() {
        if (master != nullptr) { cudaFree(master); }
    }
    ModelParameters(const ModelParameters&) = delete;
    ModelParameters& operator=(const ModelParameters&) = delete;

    // The optimizer with its settings (a fresh state; load_parameters may restore one).
    void build_optimizer(const OptimizerConfig& config) {
        if (master_sharded()) { fatal("build_optimizer: the master weights are sharded with the optimizer built already"); }
        optimizer = std::make_unique<ParamOptimizer>(config, spec, params, master, grads, optimizer_scratch_);
        optimizer->distribute(comm_, zero_);
        release_sharded_master();
        if (grads_fp32 != nullptr) { optimizer->read_fp32_gradients(grads_fp32); }
    }
    bool master_sharded() const { return optimizer != nullptr && optimizer->shards_master(); }

    // values: every parameter in canonical order (num_params floats)
    void set_parameters(const std::vector<float>& values) {
        if (values.size() != num_params) { fatal("set_parameters: %zu values for %zu parameters", values.size(), num_params); }
        std::vector<float> laid_out = to_device_layout(values);
        std::vector<floatX> converted(device_elements);
        for (size_t i = 0; i < device_elements; i++) { converted[i] = from_float<floatX>(laid_out[i]); }
        cudaCheck(cudaMemcpy(params, converted.data(), device_elements * sizeof(floatX), cudaMemcpyHostToDevice));
        if (master != nullptr) {
            cudaCheck(cudaMemcpy(master, laid_out.data(), device_elements * sizeof(float), cudaMemcpyHostToDevice));
        }
        if (master_sharded()) { optimizer->load_master(laid_out); }
    }
    // Under sharded master weights a collective (see `master`).
    std::vector<float> get_parameters() const { return to_canonical(laid_out_parameters()); }
    // The same in the device layout (device_elements floats, zeros in the gaps).
    std::vector<float> laid_out_parameters() const {
        if (master_sharded()) { return optimizer->gather_master(); }
        if (master != nullptr) { return copy_from_device(master, device_elements); }
        return to_floats(copy_from_device(params, device_elements));
    }
    // The gradients the optimizer would use (the fp32 accumulator when there is one), in
    // canonical order.
    std::vector<float> get_gradients() const {
        if (grads_fp32 != nullptr) { return to_canonical(copy_from_device(grads_fp32, device_elements)); }
        return to_canonical(to_floats(copy_from_device(grads, device_elements)));
    }

    // Accumulates micro-batch gradients in fp32 from now on (a no-op in fp32 builds, whose
    // gradients are fp32 already).
    void accumulate_in_fp32() {
        if (PRECISION_MODE == PrecisionMode::FP32 || grads_fp32 != nullptr) { return; }
        grads_fp32 = arena_.alloc<float>(device_elements);
        cudaCheck(cudaMemset(grads_fp32, 0, device_elements * sizeof(float)));
        if (optimizer != nullptr) { optimizer->read_fp32_gradients(grads_fp32); }
    }
    // After each micro-batch's backward(): moves its gradients into the fp32 accumulator.
    void end_micro_batch() {
        if (grads_fp32 != nullptr) { accumulate_fp32(grads_fp32, grads, device_elements, stream); }
    }

    // "parameter 'name'" or "gradient 'name'" of the first tensor (canonical order,
    // parameters first) holding a value that is not finite, or "" if there is none.
    std::string first_nonfinite_tensor() const {
        std::vector<float> values[2] = {get_parameters(), get_gradients()};
        const char* kinds[2] = {"parameter", "gradient"};
        for (int k = 0; k < 2; k++) {
            size_t offset = 0;
            for (const ParamSpec& s : spec) {
                for (int64_t i = 0; i < s.numel(); i++) {
                    if (!std::isfinite(values[k][offset + i])) { return std::string(kinds[k]) + " '" + s.name + "'"; }
                }
                offset += s.numel();
            }
        }
        return "";
    }

    // N(0, init_std) for the first init_rows rows of a tensor (all rows when init_rows < 0),
    // init_value elsewhere: padded vocabulary rows stay zero. Our own random stream: the
    // tests load the reference's parameters instead of reproducing its generator.
    void init_parameters(uint64_t seed) {
        std::mt19937_64 rng(seed);
        std::normal_distribution<float> normal(0.0f, 1.0f);
        std::vector<float> values;
        values.reserve(num_params);
        for (const ParamSpec& s : spec) {
            int64_t rows = s.shape.empty() ? 1 : s.shape[0];
            int64_t row_size = s.numel() / rows;
            int64_t random_rows = s.init_rows >= 0 ? s.init_rows : rows;
            for (int64_t i = 0; i < s.numel(); i++) {
                bool random = s.init_std > 0.0f && i / row_size < random_rows;
                values.push_back(random ? s.init_std * normal(rng) : s.init_value);
            }
        }
        set_parameters(values);
    }

    // Data-parallel training over comm's ranks (llmc/parallel/data_parallel.h), ZeRO stage 0 or 1,
    // for the optimizer built now or later; before its first update or checkpoint load.
    void distribute(Comm& comm, int zero) {
        comm_ = &comm;
        zero_ = zero;
        if (optimizer != nullptr) {
            optimizer->distribute(comm_, zero_);
            release_sharded_master();
        }
    }

    // Overlap of the gradient reduction with backward() (--overlap-reduce 1; doc/multi-gpu.md):
    // on for the last micro-batch's backward, where backward() calls layer_gradients_done(l)
    // once layer l's gradients are final, which starts their reduction on a second stream.
    void overlap_reduction(bool on) { overlap_ = on; }
    void layer_gradients_done(int layer) {
        if (!overlap_ || optimizer == nullptr || layer < 0 || (size_t)layer >= layer_range_.size()) { return; }
        optimizer->reduce_early(layer_range_[layer].first, layer_range_[layer].second, stream);
    }

    void zero_grad() {
        cudaCheck(cudaMemsetAsync(grads, 0, device_elements * sizeof(floatX), stream));
        if (grads_fp32 != nullptr) { cudaCheck(cudaMemsetAsync(grads_fp32, 0, device_elements * sizeof(float), stream)); }
    }

    // One optimizer step on the accumulated gradients (clipped to the global norm); returns
    // the global gradient norm before clipping.
    float update(double lr_matrix, double lr_other) { return built_optimizer().update(lr_matrix, lr_other, stream); }
    int64_t steps_done() const { return optimizer != nullptr ? optimizer->step : 0; }

    // Writes a checkpoint: the model's config keys (write_config), the optimizer settings
    // and state, `extra` keys (e.g. the resume position), every parameter and the model state
    // (llmc/model/model.h save_checkpoint passes the trainer's write_config). Over several ranks a
    // collective (the state is gathered) that rank 0 alone writes.
    void write_checkpoint(const std::string& path, const std::vector<std::pair<std::string, std::string>>& extra,
                          const std::function<void(TensorFileWriter&)>& write_config) const {
        TensorFileWriter w(TENSOR_FILE_CHECKPOINT);
        write_config(w);
        built_optimizer().save(w);
        for (const auto& kv : extra) { w.set(kv.first, kv.second); }
        std::vector<float> values = get_parameters();
        size_t offset = 0;
        for (const ParamSpec& s : spec) {
            w.add_floats(s.name, s.shape, values.data() + offset);
            offset += s.numel();
        }
        write_state(w);
        if (comm_ == nullptr || comm_->is_main()) { w.write(path); }
    }

    // Loads every parameter by name, the model state (read_state), and the optimizer state and
    // step if asked and present.
    void load_parameters(const TensorFileReader& r, bool with_optimizer) {
        std::vector<float> values;
        values.reserve(num_params);
        for (const ParamSpec& s : spec) {
            std::vector<float> t = r.floats(s.name, s.numel());
            values.insert(values.end(), t.begin(), t.end());
        }
        set_parameters(values);
        read_state(r);
        if (with_optimizer) { built_optimizer().load(r); }
    }

protected:
    // canonical order (tensors back to back) <-> device layout (tensors at spec[i].offset)
    std::vector<float> to_device_layout(const std::vector<float>& values) const {
        std::vector<float> out(device_elements, 0.0f);
        size_t from = 0;
        for (const ParamSpec& s : spec) {
            std::copy(values.begin() + from, values.begin() + from + s.numel(), out.begin() + s.offset);
            from += s.numel();
        }
        return out;
    }
    std::vector<float> to_canonical(const std::vector<float>& laid_out) const {
        std::vector<float> out;
        out.reserve(num_params);
        for (const ParamSpec& s : spec) {
            out.insert(out.end(), laid_out.begin() + s.offset, laid_out.begin() + s.offset + s.numel());
        }
        return out;
    }
    static std::vector<float> to_floats(const std::vector<floatX>& values) {
        std::vector<float> out(values.size());
        for (size_t i = 0; i < values.size(); i++) { out[i] = to_float(values[i]); }
        return out;
    }

private:
    // once the optimizer holds this rank's share of the master weights, the full copy goes
    void release_sharded_master() {
        if (master != nullptr && optimizer->shards_master()) {
            cudaCheck(cudaFree(master));
            master = nullptr;
        }
    }
    ParamOptimizer& built_optimizer() const {
        if (optimizer == nullptr) { fatal("the model's optimizer is not built yet (ModelParameters::build_optimizer)"); }
        return *optimizer;
    }

    DeviceArena arena_;
    float* optimizer_scratch_ = nullptr;  // kReduceBlocks floats for the gradient norm
    Comm* comm_ = nullptr;                 // the ranks (distribute()); null: one
    int zero_ = 0;
    std::vector<std::pair<size_t, size_t>> layer_range_;  // layer l's [begin, end) in the layout
    bool overlap_ = false;
};
