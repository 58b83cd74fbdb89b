/*
Gradient groups: the gradient of a step as a fixed sum of G group gradients, so that it has the
same bits on every rank count that splits the groups evenly (--grad-groups, default: the rank
count). Every micro-batch's rows over all ranks are cut into G groups of consecutive rows, L = G /
ranks on each rank, each with its own accumulator; the groups are added pairwise by index
(llmc/parallel/sum_order.h), so with L a power of two every such rank count gives the same bits.
GradientGroups' methods, in the order a step calls them, say what each does. Why, what holds and
the cost (with L > 1: L gradient buffers more, two copies per group and micro-batch, smaller
GEMMs): doc/multi-gpu.md "The same bits on any rank count".
*/
#pragma once

#include <vector>

#include "llmc/cuda_common.h"
#include "llmc/parallel/comm.h"
#include "llmc/parallel/sum_order.h"  // defines: pairwise_plan
#include "llmc/utils.h"

// into[i] = T(float(into[i]) + float(from[i])), one thread per element.
template <typename T>
__global__ void add_into_kernel(T* into, const T* from, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) { return; }
    into[i] = from_float<T>(to_float(into[i]) + to_float(from[i]));
}

// G for `ranks` ranks of `batch_size` rows (0: the rank count), checked: over several ranks
// each gets a power of two of the groups, and each rank's rows split into its groups.
inline int checked_grad_groups(int groups, int ranks, int batch_size) {
    if (groups == 0) { return ranks; }
    if (groups < 0 || groups % ranks != 0) {
        fatal("--grad-groups %d: must be a positive multiple of the %d ranks (0: the rank count)", groups, ranks);
    }
    const int local = groups / ranks;
    if (ranks > 1 && (local & (local - 1)) != 0) {
        fatal("--grad-groups %d over %d ranks: %d groups per rank; it must be a power of two (the ranks' sums are then "
              "nodes of the groups' pairwise sum)", groups, ranks, local);
    }
    if (batch_size % local != 0) {
        fatal("--grad-groups %d over %d ranks: %d groups per rank do not split --batch-size %d", groups, ranks, local,
              batch_size);
    }
    return groups;
}

// Whether a run of G groups can go on over `ranks` ranks with the same bits: one rank sums the
// whole tree; over several, each rank's groups must be a node of it (a power of two of them).
inline bool grad_groups_fit(int groups, int ranks) {
    if (groups <= 0 || groups % ranks != 0) { return false; }
    const int local = groups / ranks;
    return ranks == 1 || (local & (local - 1)) == 0;
}

class GradientGroups {
public:
    // comm null: one rank
    GradientGroups(int groups, const Comm* comm)
        : comm_(comm), world_(comm != nullptr ? comm->world : 1), rank_(comm != nullptr ? comm->rank : 0),
          groups_(groups), local_(groups / world_) {
        if (!grad_groups_fit(groups, world_)) { fatal("GradientGroups: %d groups over %d ranks", groups, world_); }
    }
    ~GradientGroups() {
        for (void* p : saved_) { cudaFree(p); }
    }
    GradientGroups(const GradientGroups&) = delete;
    GradientGroups& operator=(const GradientGroups&) = delete;

    int local() const { return local_; }  // L: groups on this rank; rows per group = B / L
    int groups() const { return groups_; }

    // The model's gradient buffer holds group g's sum so far (before micro-batch `micro`)...
    template <typename Model>
    void begin(Model& m, int g, int micro) {
        if (local_ == 1) { return; }
        if (micro == 0) {
            if (g > 0) { m.zero_grad(); }  // (group 0's: the step's zero_grad)
            return;
        }
        if (m.grads_fp32 != nullptr) {
            copy(m.grads_fp32, saved<float>(m, g), m.device_elements, m.stream);
        } else {
            copy(m.grads, saved<floatX>(m, g), m.device_elements, m.stream);
        }
    }
    // ... and is saved as group g's after it (L > 1 only).
    template <typename Model>
    void end(Model& m, int g) {
        if (local_ == 1) { return; }
        if (m.grads_fp32 != nullptr) {
            copy(saved<float>(m, g), m.grads_fp32, m.device_elements, m.stream);
        } else {
            copy(saved<floatX>(m, g), m.grads, m.device_elements, m.stream);
        }
    }
    // The buffer = the pairwise sum of this rank's groups (the ranks' results are then summed in
    // the same pairwise order, in the sum over ranks).
    template <typename Model>
    void combine(Model& m) {
        if (local_ == 1) { return; }
        if (m.grads_fp32 != nullptr) {
            combine_into(m, m.grads_fp32);
        } else {
            combine_into(m, m.grads);
        }
    }

    // The step's loss from this rank's groups' (local_ values): every group's value in group
    // order over all ranks (the others' are 0 here: x + 0 is exact), added in that order.
    double total(const std::vector<double>& local) const {
        std::vector<double> all(groups_, 0.0);
        for (int g = 0; g < local_; g++) { all[(size_t)rank_ * local_ + g] = local[g]; }
        if (comm_ != nullptr) { comm_->sum(all); }
        double sum = 0.0;
        for (double v : all) { sum += v; }
        return sum;
    }

private:
    template <typename T, typename Model>
    T* saved(const Model& m, int g) {
        if (saved_.empty()) {
            for (int i = 0; i < local_; i++) { saved_.push_back(cudaMallocElements(T, m.device_elements)); }
        }
        return static_cast<T*>(saved_[g]);
    }
    template <typename T>
    static void copy(T* to, const T* from, size_t n, cudaStream_t stream) {
        cudaCheck(cudaMemcpyAsync(to, from, n * sizeof(T), cudaMemcpyDeviceToDevice, stream));
    }
    template <typename Model, typename T>
    void combine_into(Model& m, T* grads) {
        const size_t n = m.device_elements;
        const int threads = 256;
        for (const auto& sum : pairwise_plan(local_)) {
            LAUNCH((unsigned)CEIL_DIV(n, (size_t)threads), threads, 0, m.stream, add_into_kernel<T>)(
                saved<T>(m, sum.first), saved<T>(m, sum.second), n);
            cudaCheckLaunch();
        }
        copy(grads, saved<T>(m, 0), n, m.stream);
    }

    const Comm* comm_;
    int world_, rank_, groups_, local_;
    std::vector<void*> saved_;  // L buffers of the gradient type, allocated at the first use
};
