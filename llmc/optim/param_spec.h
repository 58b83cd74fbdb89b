/*
ParamSpec: one trainable tensor of a model (name, shape, group, init), and the device
layout of a list of them. One list per model (a trainer's parameter_spec(cfg)) drives the
allocation, the init, the checkpoint names and the optimizer groups (llmc/model/parameters.h,
llmc/optim/optimizer.h). Host-only C++17.
*/
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "llmc/utils.h"

struct ParamSpec {
    std::string name;
    std::vector<int64_t> shape;
    bool matrix;      // matrix group: weight decay (and the matrix optimizer)
    float init_std;   // > 0: N(0, init_std); 0: constant init_value
    float init_value;
    int64_t init_rows = -1;  // rows drawn from N(0, init_std) (-1: all; padded vocabulary rows stay init_value)
    size_t offset = 0;       // element offset in the device buffers (layout_parameters)
    int64_t numel() const {
        int64_t n = 1;
        for (int64_t s : shape) { n *= s; }
        return n;
    }
};

// Values in canonical order (host vectors, files): the tensors back to back.
inline size_t total_numel(const std::vector<ParamSpec>& spec) {
    size_t n = 0;
    for (const ParamSpec& s : spec) { n += s.numel(); }
    return n;
}

// The device layout of parameters, gradients, master weights and optimizer state: every
// tensor starts on a multiple of kParamAlignElements elements (128 bytes in bf16, 256 in
// fp32), so that cuBLAS and vectorised kernels see aligned operands even after the scalar
// gates; the gaps hold zeros. Sets each spec's offset; returns the buffer size in elements.
constexpr size_t kParamAlignElements = 64;
inline size_t layout_parameters(std::vector<ParamSpec>& spec) {
    size_t offset = 0;
    for (ParamSpec& s : spec) {
        s.offset = offset;
        offset += CEIL_DIV((size_t)s.numel(), kParamAlignElements) * kParamAlignElements;
    }
    return offset;
}
