/*
Data parallelism around the optimizer step (doc/multi-gpu.md): what each rank reduces,
updates and shares so that N ranks take the step one rank would take on the mean of their
gradients. Used by ParamOptimizer (llmc/optimizer.h); one rank (no Comm) is the same code
with identity collectives.

Buffers: parameters, gradients, master weights and optimizer state share one layout of E
elements, tensors on 64-element offsets (layout_parameters).

  zero 0: gradients all-reduced (mean); every rank holds all AdamW state and updates every
          AdamW tensor (the same inputs and kernels give the same bits on every rank).
  zero 1: ZeRO-1. [0, N*C) is cut into N equal chunks of C elements, C a multiple of 64
          (llmc/sharding.h): gradients reduce-scattered so rank r gets the mean of chunk r,
          rank r holds the AdamW state of chunk r only and updates those elements, then the
          chunks are all-gathered. The tail [N*C, E) (under N*64 elements: it keeps chunks
          equal and aligned without padding the model's buffers) is all-reduced and updated
          by every rank, its state held by every rank. State buffers hold C + (E - N*C).
  Muon:   every matrix has one owner (balance_owners: whole matrices, balanced by size);
          the owner alone orthogonalises it and updates it and its momentum, then
          broadcasts it. Owners need whole matrices' gradients, so with Muon the gradients
          are all-reduced in either zero mode; zero 1 still shards the AdamW state of the
          other tensors. Momentum buffers keep the full layout; only the owner's copy of a
          matrix's momentum is current.
Bf16 builds' fp32 master weights are current where a rank updated them; a checkpoint
gathers them (gather_updated) with the state, so a file never depends on the rank count.

Gradient norm: zero 0 or Muon: of the all-reduced buffer, the same on every rank; zero 1:
each rank's sum of squares over its chunk (rank 0 adds the tail), summed in rank order.

DATA_PARALLEL_MUTATION_SKIP_MUON (tests only): the last rank does not update the matrices
it owns, the bug of a rank that skips its share; the multi-rank tests must fail with it.
*/
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "comm.h"
#include "cuda_common.h"
#include "reduce.cuh"
#include "sharding.h"

class DataParallel {
public:
    // An element range this rank updates with AdamW; `state` is the index of `begin` in
    // this rank's state buffers.
    struct Range {
        size_t begin, end, state;
    };

    // tensors: offset and size of every tensor of the layout; `elements`: E. comm null: one rank.
    DataParallel(Comm* comm, int zero, const std::vector<size_t>& offsets, const std::vector<size_t>& sizes,
                 size_t elements, size_t align)
        : comm_(comm), zero_(zero), offsets_(offsets), sizes_(sizes), elements_(elements) {
        if (zero != 0 && zero != 1) { fatal("--zero must be 0 or 1, got %d", zero); }
        const int r = rank();
        if (zero == 0) {
            ranges_.push_back({0, elements, 0});
            state_elements_ = elements;
        } else {
            FlatShards s = flat_shards(elements, world(), align);
            chunk_ = s.chunk;
            tail_ = s.tail_begin();
            if (chunk_ > 0) { ranges_.push_back({(size_t)r * chunk_, (size_t)(r + 1) * chunk_, 0}); }
            if (tail_ < elements) { ranges_.push_back({tail_, elements, chunk_}); }
            state_elements_ = chunk_ + (elements - tail_);
        }
        owner_.assign(offsets.size(), -1);
    }

    int world() const { return comm_ != nullptr ? comm_->world : 1; }
    int rank() const { return comm_ != nullptr ? comm_->rank : 0; }
    int zero() const { return zero_; }
    size_t chunk() const { return chunk_; }
    size_t state_elements() const { return state_elements_; }
    const std::vector<Range>& ranges() const { return ranges_; }

    // Muon: the matrices (tensor indices) to deal out. Until called, nothing is owned.
    void set_muon_matrices(const std::vector<int>& tensors) {
        std::vector<int64_t> sizes;
        for (int t : tensors) { sizes.push_back((int64_t)sizes_[t]); }
        std::vector<int> owners = balance_owners(sizes, world());
        owner_.assign(offsets_.size(), -1);
        for (size_t i = 0; i < tensors.size(); i++) { owner_[tensors[i]] = owners[i]; }
        muon_ = !tensors.empty();
    }
    int owner(int tensor) const { return owner_[tensor]; }
    bool updates_matrix(int tensor) const {
#if defined(DATA_PARALLEL_MUTATION_SKIP_MUON)
        if (world() > 1 && rank() == world() - 1) { return false; }
#endif
        return owner_[tensor] == rank();
    }

    // Pieces of tensor `tensor` this rank updates with AdamW, with their state index.
    std::vector<Range> adamw_pieces(int tensor) const {
        std::vector<Range> out;
        for (const Range& r : ranges_) {
            for (const TensorPiece& p : pieces_in({offsets_[tensor]}, {sizes_[tensor]}, r.begin, r.end)) {
                out.push_back({p.begin, p.end, r.state + (p.begin - r.begin)});
            }
        }
        return out;
    }

    // Gradients -> their mean over ranks, where this rank needs it: everywhere (zero 0 or
    // Muon), or this rank's chunk and the tail (zero 1).
    template <typename T>
    void reduce_gradients(T* grads, cudaStream_t stream) {
        if (world() == 1) { return; }
        if (zero_ == 0 || muon_) {
            comm_->all_reduce(grads, elements_, ReduceOp::Avg, stream);
            return;
        }
        if (chunk_ > 0) { comm_->reduce_scatter(grads + (size_t)rank() * chunk_, grads, chunk_, ReduceOp::Avg, stream); }
        if (tail_ < elements_) { comm_->all_reduce(grads + tail_, elements_ - tail_, ReduceOp::Avg, stream); }
    }

    // The global gradient norm of the reduced gradients (see the top of the file).
    // norm_sq: one device float; scratch: kReduceBlocks floats.
    template <typename T>
    float grad_norm(const T* grads, float* norm_sq, float* scratch, cudaStream_t stream) {
        if (zero_ == 0 || muon_) { return std::sqrt(sum_of_squares(grads, 0, elements_, norm_sq, scratch, stream)); }
        double local = 0.0;
        if (chunk_ > 0) {
            local += sum_of_squares(grads, (size_t)rank() * chunk_, (size_t)(rank() + 1) * chunk_, norm_sq, scratch, stream);
        }
        if (rank() == 0 && tail_ < elements_) { local += sum_of_squares(grads, tail_, elements_, norm_sq, scratch, stream); }
        double total = comm_ != nullptr ? comm_->sum(local) : local;
        return (float)std::sqrt(total);
    }

    // After this rank's updates: every rank gets every updated value of `buffer` (the
    // parameters each step; master weights and state for a checkpoint). `matrices`: also
    // the Muon matrices from their owners.
    template <typename T>
    void gather_updated(T* buffer, bool matrices, cudaStream_t stream) {
        if (world() == 1) { return; }
        // matrices first: the all-gather then moves whole chunks that are current everywhere
        // (the other order would overwrite an owner's matrix with a chunk holder's stale copy)
        if (matrices && muon_) { broadcast_matrices(buffer, stream); }
        if (zero_ == 1 && chunk_ > 0) { comm_->all_gather(buffer, chunk_, stream); }
    }
    // Only the Muon matrices from their owners (momentum, for a checkpoint).
    template <typename T>
    void broadcast_matrices(T* buffer, cudaStream_t stream) {
        if (world() == 1) { return; }
        comm_->group_start();
        for (size_t t = 0; t < owner_.size(); t++) {
            if (owner_[t] >= 0) { comm_->broadcast(buffer + offsets_[t], sizes_[t], owner_[t], stream); }
        }
        comm_->group_end();
    }

    // AdamW state in the full layout (E host floats, zeros in the gaps) from this rank's
    // state buffer: a collective (every rank calls it; every rank gets the whole).
    std::vector<float> full_state(const float* state, cudaStream_t stream) {
        if (zero_ == 0) { return copy_from_device(state, elements_); }
        float* full = cudaMallocElements(float, std::max<size_t>(elements_, 1));
        cudaCheck(cudaMemsetAsync(full, 0, elements_ * sizeof(float), stream));
        for (const Range& r : ranges_) {
            cudaCheck(cudaMemcpyAsync(full + r.begin, state + r.state, (r.end - r.begin) * sizeof(float),
                                      cudaMemcpyDeviceToDevice, stream));
        }
        if (world() > 1 && chunk_ > 0) { comm_->all_gather(full, chunk_, stream); }
        cudaCheck(cudaStreamSynchronize(stream));
        std::vector<float> out = copy_from_device(full, elements_);
        cudaFree(full);
        return out;
    }
    // The inverse: this rank's part of a full-layout host vector into its state buffer.
    void load_state(const std::vector<float>& full, float* state) const {
        for (const Range& r : ranges_) {
            cudaCheck(cudaMemcpy(state + r.state, full.data() + r.begin, (r.end - r.begin) * sizeof(float),
                                 cudaMemcpyHostToDevice));
        }
    }

private:
    template <typename T>
    double sum_of_squares(const T* x, size_t begin, size_t end, float* norm_sq, float* scratch, cudaStream_t stream) {
        dot_product(norm_sq, scratch, x + begin, x + begin, end - begin, 1.0f, false, stream);
        float value = 0.0f;
        cudaCheck(cudaMemcpy(&value, norm_sq, sizeof(float), cudaMemcpyDeviceToHost));
        return value;
    }

    Comm* comm_;
    int zero_;
    std::vector<size_t> offsets_, sizes_;
    size_t elements_;
    size_t chunk_ = 0, tail_ = 0, state_elements_ = 0;
    std::vector<Range> ranges_;
    std::vector<int> owner_;
    bool muon_ = false;
};
