/*
Data parallelism around the optimizer step: what each rank reduces, updates, keeps and shares so
that N ranks take the step one rank would take on the sum of their gradients (a sum, not a mean:
the same bits on any rank count). Used by ParamOptimizer (llmc/optim/optimizer.h); one rank (no
Comm) is the same code with identity collectives. Every piece of work is a Piece of one tensor,
updated by its owner rank; a checkpoint gathers everything, so a file never depends on the rank
count or zero mode. The whole account (zero 0, ZeRO-1 chunks, Muon owners, the gradient norm's
order): doc/multi-gpu.md "What each rank does".
*/
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "llmc/parallel/comm.h"
#include "llmc/cuda_common.h"
#include "llmc/parallel/grad_norm.cuh"  // defines: unit_squares, sum_units
#include "llmc/parallel/sharding.h"

class DataParallel {
public:
    // An element range this rank updates with AdamW; `state` is the index of `begin` in
    // this rank's AdamW state buffers (and master weights when they are sharded).
    struct Range {
        size_t begin, end, state;
    };
    // A piece of work: elements [begin, end) of tensor `tensor` (parameters and gradients share
    // one layout, tensors on 64-element offsets: layout_parameters), updated by `owner` (-1:
    // every rank) with Muon (`muon`: a whole matrix) or AdamW; `state` indexes the owner's
    // state buffer of that kind. DATA_PARALLEL_MUTATION_* (tests only) break the ownership; the
    // multi-rank tests must fail.
    struct Piece {
        int tensor;
        size_t begin, end, state;
        int owner;
        bool muon;
    };
    enum class State { AdamW, Muon, Master };  // which buffer (gather_full, load_full)

    // offsets, sizes: every tensor of the layout; `elements`: E. comm null: one rank.
    DataParallel(Comm* comm, int zero, const std::vector<size_t>& offsets, const std::vector<size_t>& sizes,
                 size_t elements, size_t align)
        : comm_(comm), zero_(zero), offsets_(offsets), sizes_(sizes), elements_(elements), align_(align) {
        if (zero != 0 && zero != 1) { fatal("--zero must be 0 or 1, got %d", zero); }
        if (align % kNormUnit != 0) { fatal("DataParallel: alignment %zu is not a multiple of %zu", align, kNormUnit); }
        plan({});
    }
    ~DataParallel() {
        cudaFree(units_);
        cudaFree(ones_);
    }
    DataParallel(const DataParallel&) = delete;
    DataParallel& operator=(const DataParallel&) = delete;

    int world() const { return comm_ != nullptr ? comm_->world : 1; }
    int rank() const { return comm_ != nullptr ? comm_->rank : 0; }
    int zero() const { return zero_; }
    size_t chunk() const { return chunk_; }
    bool muon() const { return muon_; }
    // Whether the state is kept by ownership (zero 1 with Muon) rather than flat chunks.
    bool by_owner() const { return zero_ == 1 && muon_; }
    // This rank's buffer sizes (elements): AdamW m and v; Muon momentum; sharded master
    // weights (zero 1; 0 otherwise: the full master in ModelParameters).
    size_t state_elements() const { return adamw_elements_; }
    size_t muon_state_elements() const { return muon_elements_; }
    size_t master_elements() const { return zero_ == 1 ? adamw_elements_ + muon_elements_ : 0; }
    const std::vector<Piece>& pieces() const { return pieces_; }

    // The split of the work, with `muon_tensors` (tensor indices) as the Muon matrices and
    // every other tensor AdamW's. Pure function of the sizes and the rank count.
    void plan(const std::vector<int>& muon_tensors) {
        const int N = world();
        pieces_.clear();
        owner_.assign(offsets_.size(), -1);
        std::vector<bool> is_matrix(offsets_.size(), false);
        for (int t : muon_tensors) { is_matrix[t] = true; }
        muon_ = !muon_tensors.empty();
        chunk_ = 0;
        tail_ = elements_;
        // the matrices' owners (either zero mode)
        std::vector<int64_t> msizes;
        for (int t : muon_tensors) { msizes.push_back((int64_t)sizes_[t]); }
        std::vector<int> owners = balance_owners(msizes, N);
        for (size_t i = 0; i < muon_tensors.size(); i++) { owner_[muon_tensors[i]] = owners[i]; }
        if (zero_ == 0) {  // full layouts: state index = offset
            for (size_t t = 0; t < offsets_.size(); t++) {
                pieces_.push_back({(int)t, offsets_[t], offsets_[t] + sizes_[t], offsets_[t], owner_[t], is_matrix[t]});
            }
            adamw_elements_ = elements_;
            muon_elements_ = muon_ ? elements_ : 0;
            return;
        }
        if (!muon_) {  // flat chunks; the tail shared
            FlatShards s = flat_shards(elements_, N, align_);
            chunk_ = s.chunk;
            tail_ = s.tail_begin();
            for (int r = 0; r < N && chunk_ > 0; r++) {
                for (const TensorPiece& p : pieces_in(offsets_, sizes_, s.begin(r), s.end(r))) {
                    pieces_.push_back({p.tensor, p.begin, p.end, p.begin - s.begin(r), r, false});
                }
            }
            for (const TensorPiece& p : pieces_in(offsets_, sizes_, tail_, elements_)) {
                pieces_.push_back({p.tensor, p.begin, p.end, chunk_ + (p.begin - tail_), -1, false});
            }
            adamw_elements_ = chunk_ + (elements_ - tail_);
            muon_elements_ = 0;
            return;
        }
        // by ownership: the AdamW tensors' 64-element units cut into N runs
        size_t units = 0;
        for (size_t t = 0; t < offsets_.size(); t++) {
            if (!is_matrix[t]) { units += CEIL_DIV(sizes_[t], align_); }
        }
        std::vector<size_t> mine_adamw(N, 0), mine_muon(N, 0);
        size_t at = 0;  // units before this tensor
        for (size_t t = 0; t < offsets_.size(); t++) {
            if (is_matrix[t]) { continue; }
            const size_t n_units = CEIL_DIV(sizes_[t], align_);
            for (int r = 0; r < N; r++) {
                const size_t run_begin = units * (size_t)r / (size_t)N, run_end = units * (size_t)(r + 1) / (size_t)N;
                const size_t b = std::max(at, run_begin), e = std::min(at + n_units, run_end);
                if (b >= e) { continue; }
                const size_t begin = offsets_[t] + (b - at) * align_;
                const size_t end = std::min(offsets_[t] + sizes_[t], offsets_[t] + (e - at) * align_);
                pieces_.push_back({(int)t, begin, end, (b - run_begin) * align_, r, false});
            }
            at += n_units;
        }
        for (int r = 0; r < N; r++) { mine_adamw[r] = (units * (size_t)(r + 1) / N - units * (size_t)r / N) * align_; }
        for (int t : muon_tensors) {
            const int r = owner_[t];
            pieces_.push_back({t, offsets_[t], offsets_[t] + sizes_[t], mine_muon[r], r, true});
            mine_muon[r] += CEIL_DIV(sizes_[t], align_) * align_;
        }
        adamw_elements_ = mine_adamw[rank()];
        muon_elements_ = mine_muon[rank()];
    }

    int owner(int tensor) const { return owner_[tensor]; }
    bool updates_matrix(int tensor) const {
#if defined(DATA_PARALLEL_MUTATION_SKIP_MUON)  // (tests only: the last rank skips the matrices it owns)
        if (world() > 1 && rank() == world() - 1) { return false; }
#endif
        return owner_[tensor] == rank();
    }
    // Where this rank's momentum (and sharded master weights, after the AdamW part) holds
    // matrix `tensor` (one it owns).
    size_t muon_state(int tensor) const {
        for (const Piece& p : pieces_) {
            if (p.muon && p.tensor == tensor) { return p.state; }
        }
        fatal("DataParallel: tensor %d is not a Muon matrix", tensor);
        return 0;
    }

    // Pieces of tensor `tensor` this rank updates with AdamW, with their state index.
    std::vector<Range> adamw_pieces(int tensor) const {
        std::vector<Range> out;
        for (const Piece& p : pieces_) {
            if (!p.muon && p.tensor == tensor && mine(p)) { out.push_back({p.begin, p.end, p.state}); }
        }
        return out;
    }

    // Gradients -> their sum over ranks, where this rank needs it: everywhere (zero 0), its
    // chunk and the tail (zero 1, AdamW), or the pieces it owns (zero 1, Muon).
    template <typename T>
    void reduce_gradients(T* grads, cudaStream_t stream) {
        if (world() == 1) { return; }
        if (zero_ == 0) {
            comm_->all_reduce(grads, elements_, ReduceOp::Sum, stream);
            return;
        }
        if (by_owner()) {
            comm_->group_start();
            for (const Piece& p : pieces_) {
                int root = p.owner;
#if defined(DATA_PARALLEL_MUTATION_REDUCE_ROOT)  // (tests only: reduced to the next rank, not the owner)
                root = (root + 1) % world();
#endif
                comm_->reduce(grads + p.begin, p.end - p.begin, root, ReduceOp::Sum, stream);
            }
            comm_->group_end();
            return;
        }
        if (chunk_ > 0) { comm_->reduce_scatter(grads + (size_t)rank() * chunk_, grads, chunk_, ReduceOp::Sum, stream); }
        if (tail_ < elements_) { comm_->all_reduce(grads + tail_, elements_ - tail_, ReduceOp::Sum, stream); }
    }

    // The same for the gradients of [begin, end) only, a range of whole tensors (a layer's
    // bucket when the reduction overlaps the backward pass; the ranges of one step cover
    // [0, E) once). Elementwise the same sums as reduce_gradients, so the same bits on the
    // host; under flat chunks the reduce-scatter becomes a reduce of each chunk's part.
    template <typename T>
    void reduce_range(T* grads, size_t begin, size_t end, cudaStream_t stream) {
        if (world() == 1 || begin >= end) { return; }
        if (zero_ == 0) {
            comm_->all_reduce(grads + begin, end - begin, ReduceOp::Sum, stream);
            return;
        }
        comm_->group_start();
        if (by_owner()) {
            for (const Piece& p : pieces_) {
                if (p.begin < begin || p.end > end) { continue; }
                int root = p.owner;
#if defined(DATA_PARALLEL_MUTATION_REDUCE_ROOT)
                root = (root + 1) % world();
#endif
                comm_->reduce(grads + p.begin, p.end - p.begin, root, ReduceOp::Sum, stream);
            }
        } else {
            for (int r = 0; r < world() && chunk_ > 0; r++) {
                size_t b = std::max(begin, (size_t)r * chunk_), e = std::min(end, (size_t)(r + 1) * chunk_);
                if (b < e) { comm_->reduce(grads + b, e - b, r, ReduceOp::Sum, stream); }
            }
            size_t b = std::max(begin, tail_);
            if (b < end) { comm_->all_reduce(grads + b, end - b, ReduceOp::Sum, stream); }
        }
        comm_->group_end();
    }

    // The global gradient norm of the reduced gradients: squares summed per 64-element unit, each
    // on the rank holding its reduced gradient, in one fixed order (llmc/parallel/grad_norm.cuh),
    // so the same bits on every rank, for any rank count and zero mode. norm_sq: one device float;
    // scratch: kReduceBlocks floats.
    template <typename T>
    float grad_norm(const T* grads, float* norm_sq, float* scratch, cudaStream_t stream) {
        const size_t n_units = CEIL_DIV(elements_, kNormUnit);
        if (units_ == nullptr) {
            units_ = cudaMallocElements(float, std::max<size_t>(n_units, 1));
            ones_ = copy_to_device(std::vector<float>(std::max<size_t>(n_units, 1), 1.0f));
        }
        if (zero_ == 0 || world() == 1) {  // every rank holds every reduced gradient
            unit_squares(units_, grads, 0, elements_, stream);
        } else {  // each unit from the rank that holds it reduced (the shared tail: rank 0), 0 elsewhere
            cudaCheck(cudaMemsetAsync(units_, 0, n_units * sizeof(float), stream));
            for (const Piece& p : pieces_) {
                if (p.owner == rank() || (p.owner < 0 && rank() == 0)) { unit_squares(units_, grads, p.begin, p.end, stream); }
            }
            comm_->all_reduce(units_, n_units, ReduceOp::Sum, stream);
        }
        sum_units(norm_sq, scratch, units_, ones_, n_units, stream);
        float value = 0.0f;
        cudaCheck(cudaMemcpy(&value, norm_sq, sizeof(float), cudaMemcpyDeviceToHost));
        return std::sqrt(value);
    }

    // After this rank's updates: every rank gets every updated parameter.
    template <typename T>
    void gather_updated(T* buffer, cudaStream_t stream) {
        if (world() == 1) { return; }
        if (by_owner()) {
            comm_->group_start();
            for (const Piece& p : pieces_) { comm_->broadcast(buffer + p.begin, p.end - p.begin, p.owner, stream); }
            comm_->group_end();
            return;
        }
        // matrices first: the all-gather then moves whole chunks that are current everywhere
        // (the other order would overwrite an owner's matrix with a chunk holder's stale copy)
        if (muon_) { broadcast_matrices(buffer, stream); }
        if (zero_ == 1 && chunk_ > 0) { comm_->all_gather(buffer, chunk_, stream); }
    }
    // Only the Muon matrices from their owners (zero 0: a full-layout buffer).
    template <typename T>
    void broadcast_matrices(T* buffer, cudaStream_t stream) {
        if (world() == 1) { return; }
        comm_->group_start();
        for (size_t t = 0; t < owner_.size(); t++) {
            if (owner_[t] >= 0) { comm_->broadcast(buffer + offsets_[t], sizes_[t], owner_[t], stream); }
        }
        comm_->group_end();
    }

    // A state buffer of this rank (`which`: m or v, the momentum, sharded master weights) in
    // the full layout (E host floats, zeros where no tensor of that kind is): a collective
    // (every rank calls it; every rank gets the whole). Checkpoints gather everything this way,
    // so a file never depends on the rank count or zero mode.
    std::vector<float> gather_full(const float* state, State which, cudaStream_t stream) {
        if (zero_ == 0) {
            if (which == State::Master) { fatal("DataParallel: the master weights are not sharded under --zero 0"); }
            if (which == State::Muon) { broadcast_matrices(const_cast<float*>(state), stream); }
            cudaCheck(cudaStreamSynchronize(stream));
            return copy_from_device(state, elements_);
        }
        float* full = cudaMallocElements(float, std::max<size_t>(elements_, 1));
        cudaCheck(cudaMemsetAsync(full, 0, elements_ * sizeof(float), stream));
        for (const Piece& p : pieces_) {
            if (!mine(p) || !of_kind(p, which)) { continue; }
            cudaCheck(cudaMemcpyAsync(full + p.begin, state + state_index(p, which), (p.end - p.begin) * sizeof(float),
                                      cudaMemcpyDeviceToDevice, stream));
        }
        if (world() > 1) {
            if (by_owner()) {
                comm_->group_start();
                for (const Piece& p : pieces_) {
                    if (of_kind(p, which)) { comm_->broadcast(full + p.begin, p.end - p.begin, p.owner, stream); }
                }
                comm_->group_end();
            } else if (chunk_ > 0) {
                comm_->all_gather(full, chunk_, stream);
            }
        }
        cudaCheck(cudaStreamSynchronize(stream));
        std::vector<float> out = copy_from_device(full, elements_);
        cudaFree(full);
        return out;
    }
    // The inverse, local: this rank's part of a full-layout host vector into its buffer.
    void load_full(const std::vector<float>& full, float* state, State which) const {
        if (zero_ == 0) {
            cudaCheck(cudaMemcpy(state, full.data(), elements_ * sizeof(float), cudaMemcpyHostToDevice));
            return;
        }
        for (const Piece& p : pieces_) {
            if (!mine(p) || !of_kind(p, which)) { continue; }
            cudaCheck(cudaMemcpy(state + state_index(p, which), full.data() + p.begin, (p.end - p.begin) * sizeof(float),
                                 cudaMemcpyHostToDevice));
        }
    }
    // The same from a full-layout device buffer (the model's master weights, once).
    void load_full_device(const float* full, float* state, State which) const {
        for (const Piece& p : pieces_) {
            if (!mine(p) || !of_kind(p, which)) { continue; }
            cudaCheck(cudaMemcpy(state + state_index(p, which), full + p.begin, (p.end - p.begin) * sizeof(float),
                                 cudaMemcpyDeviceToDevice));
        }
    }

private:
    bool mine(const Piece& p) const { return p.owner == rank() || p.owner < 0; }
    static bool of_kind(const Piece& p, State which) {
        return which == State::Master || (which == State::Muon) == p.muon;
    }
    // where `which` holds the piece: the master weights put the matrices after the AdamW part
    size_t state_index(const Piece& p, State which) const {
        return which == State::Master && p.muon ? adamw_elements_ + p.state : p.state;
    }

    Comm* comm_;
    int zero_;
    std::vector<size_t> offsets_, sizes_;
    size_t elements_, align_;
    size_t chunk_ = 0, tail_ = 0, adamw_elements_ = 0, muon_elements_ = 0;
    std::vector<Piece> pieces_;
    std::vector<int> owner_;
    bool muon_ = false;
    float *units_ = nullptr, *ones_ = nullptr;  // grad_norm: the units' squares, and ones to sum them
};
