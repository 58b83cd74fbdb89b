/*
The one order in which the parts of a gradient are added, wherever they live: pairwise by index,
level by level, the odd part out carried to the next level; every sum but the root rounded into T
(the root is the caller's to round, once, as the host stand-in's mean needs). For 4 parts:
(p0 + p1) + (p2 + p3); for 3: (p0 + p1) + p2. The parts are the G gradient groups of a step: a
rank adds its own groups in this order (llmc/parallel/grad_groups.h) and the host stand-in the
ranks' results (llmc/parallel/comm.h): with 2^k groups per rank, one tree over all G groups, the
same bits on any such rank count (doc/multi-gpu.md "The same bits on any rank count").
*/
#pragma once

#include <utility>
#include <vector>

#include "llmc/cuda_common.h"

// The sums, in order: each pair (into, from) adds part `from` into part `into`; part 0
// holds the root after the last one (n - 1 sums for n parts).
inline std::vector<std::pair<int, int>> pairwise_plan(int n) {
    std::vector<std::pair<int, int>> sums;
    std::vector<int> live;
    for (int i = 0; i < n; i++) { live.push_back(i); }
    while (live.size() > 1) {
        std::vector<int> next;
        for (size_t k = 0; k < live.size(); k += 2) {
            if (k + 1 < live.size()) { sums.push_back({live[k], live[k + 1]}); }
            next.push_back(live[k]);
        }
        live = next;
    }
    return sums;
}

// The fp32 root of parts[0], parts[stride], ... (n of them) summed by `plan`
// (pairwise_plan(n)), every inner sum rounded into T. `work`: scratch of n floats.
template <typename T>
float pairwise_sum(const T* parts, size_t stride, const std::vector<std::pair<int, int>>& plan, float* work, int n) {
    for (int i = 0; i < n; i++) { work[i] = to_float(parts[(size_t)i * stride]); }
    for (size_t s = 0; s < plan.size(); s++) {
        const float sum = work[plan[s].first] + work[plan[s].second];
        work[plan[s].first] = s + 1 < plan.size() ? to_float(from_float<T>(sum)) : sum;
    }
    return work[0];
}
