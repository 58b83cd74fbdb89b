/*
How data-parallel ranks split the optimizer's work: ZeRO-1's flat chunks of the parameter,
gradient and optimizer-state layout (flat_shards, pieces_in) and the Muon matrices' owners
(balance_owners). Pure functions of sizes and the rank count, so every rank computes the same
split without talking. The rules and why they hold are next to each function below;
doc/multi-gpu.md "What each rank does" says how the optimizer uses them.
*/
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <vector>

#include "llmc/utils.h"

struct FlatShards {
    size_t elements = 0;  // real elements of the buffer
    size_t chunk = 0;     // elements per rank (a multiple of the alignment; 0 for tiny buffers)
    int world = 1;
    size_t tail_begin() const { return chunk * (size_t)world; }  // [tail_begin, elements): every rank's
    size_t begin(int r) const { return chunk * (size_t)r; }
    size_t end(int r) const { return chunk * (size_t)(r + 1); }
};

// ZeRO-1: the parameter, gradient and optimizer-state buffers share one layout of E elements
// (every tensor on a multiple of 64: layout_parameters, llmc/model/parameters.h). Rank r owns
// [r*C, (r+1)*C) with C = floor(E / (N*align)) * align, so every chunk starts aligned (vector
// loads, NCCL's 16-byte preference) and all have the same size, as NCCL's reduce-scatter and
// all-gather require. The tail [N*C, E), fewer than N*align elements, belongs to every rank
// (llmc/parallel/data_parallel.h all-reduces it and every rank updates it): equal, aligned
// chunks without padding the model's buffers.
inline FlatShards flat_shards(size_t elements, int world, size_t align) {
    if (world < 1 || align < 1) { fatal("flat_shards: world %d and alignment %zu must be positive", world, align); }
    FlatShards s;
    s.elements = elements;
    s.world = world;
    s.chunk = elements / ((size_t)world * align) * align;
    return s;
}

// The part of tensor `tensor` (elements [begin, end) of the layout) inside a range.
struct TensorPiece {
    int tensor;
    size_t begin, end;
};

// The pieces of the tensors at [offsets[i], offsets[i] + sizes[i]) inside [begin, end), in
// tensor order; gaps between tensors belong to none. A chunk cuts tensors anywhere: an
// element-wise optimizer (AdamW) updates each piece with its tensor's settings.
inline std::vector<TensorPiece> pieces_in(const std::vector<size_t>& offsets, const std::vector<size_t>& sizes,
                                          size_t begin, size_t end) {
    std::vector<TensorPiece> out;
    for (size_t i = 0; i < offsets.size(); i++) {
        size_t b = std::max(begin, offsets[i]), e = std::min(end, offsets[i] + sizes[i]);
        if (b < e) { out.push_back({(int)i, b, e}); }
    }
    return out;
}

// owner[i] in [0, world) for the matrix of sizes[i] elements. Newton-Schulz needs a whole matrix,
// so matrices, not elements, are dealt out: largest first, each to the rank with the least total
// so far (ties: the earlier matrix, the lower rank). Greedy by the least loaded leaves no rank
// more than one matrix ahead (max - min load <= the largest matrix); largest first keeps the max
// within 4/3 of the best split (Graham's bound). Loads are element counts, which is also what the
// all-gather of the results moves.
inline std::vector<int> balance_owners(const std::vector<int64_t>& sizes, int world) {
    if (world < 1) { fatal("balance_owners: world %d must be positive", world); }
    std::vector<int> order(sizes.size());
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return sizes[a] > sizes[b]; });
    std::vector<int64_t> load(world, 0);
    std::vector<int> owner(sizes.size(), 0);
    for (int i : order) {
        int least = (int)(std::min_element(load.begin(), load.end()) - load.begin());  // first minimum: lowest rank
        owner[i] = least;
        load[least] += sizes[i];
    }
    return owner;
}
