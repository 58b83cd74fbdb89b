/*
Where one layer's tensors are, by name: a model's parts (token mixers, the SwiGLU MLP, the
residual sub-layers) find their weights and gradients here instead of in one struct that
knows every part's fields. The buffers are the laid-out ones of llmc/optim/param_spec.h (parameters
and gradients share the layout), so a tensor and its gradient sit at the same offset.

    LayerWeights weights(spec, "layers.3.", params, grads);
    Weight wq = weights["attn.wq"];   // {w, grad} (llmc/cuda_common.h); both null when absent
*/
#pragma once

#include <map>
#include <string>
#include <vector>

#include "llmc/cuda_common.h"
#include "llmc/optim/param_spec.h"

class LayerWeights {
public:
    // the tensors of `spec` (laid out) whose names start with `prefix`, looked up by the rest
    LayerWeights(const std::vector<ParamSpec>& spec, const std::string& prefix, floatX* params, floatX* grads)
        : params_(params), grads_(grads) {
        for (const ParamSpec& s : spec) {
            if (s.name.compare(0, prefix.size(), prefix) == 0) { offsets_[s.name.substr(prefix.size())] = s.offset; }
        }
    }
    Weight operator[](const std::string& name) const {
        auto it = offsets_.find(name);
        if (it == offsets_.end()) { return {}; }
        return {params_ + it->second, grads_ + it->second};
    }

private:
    std::map<std::string, size_t> offsets_;
    floatX *params_, *grads_;
};
