/*
The attention kind of each layer, for the variants of "Deconstructing Attention": the kinds'
names, and the layouts that say which layers keep standard attention. Host code: a model parses
`--attention KIND` and `--layout SPEC` once, at its config check, into one AttnKind per layer.
A layout names the layers (counted from 1) that KEEP standard attention (uniform, hybrid, odd,
top-/bottom-/middle-simple, quarter, first, last, bilateral, or a list like "3,7,8"); every other
layer gets the variant. At L = 24 they are the paper's sets exactly. Each layout at any depth:
doc/deconstructing.md "Layouts, at any depth".
*/
#pragma once

#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

#include "llmc/choices.h"

enum class AttnKind { Standard, Mlp, Approximate, Nonapprox, RndEmbQK, FixedSeqQK, StaticEmbQK };
inline const Choices<AttnKind> kAttnKinds{
    {"standard", "mlp", "approximate", "nonapprox", "rndembqk", "fixedseqqk", "staticembqk"}};

inline const char* attn_layout_choices() {
    return "uniform, hybrid, even, odd, top-simple, middle-simple, bottom-simple, quarter, first, last, bilateral, "
           "or a list of layers such as 1,24";
}

// The layers (1-based, ascending) that keep standard attention under `layout` in a model of
// L layers. On a bad layout returns false with `error` saying why. With h = floor(L/2) and
// q = max(1, round(L/4)):
//     uniform        none                        hybrid, even   2, 4, 6, ...
//     odd            1, 3, 5, ...                top-simple     1 .. h
//     bottom-simple  h+1 .. L                    middle-simple  1 .. q and L-q+1 .. L
//     quarter        round(k L / q) for k = 1 .. q (every 4th layer, the last included)
//     first          1                           last           L
//     bilateral      1 and L                     "3,7,8"        an explicit list
// At L = 24: top-simple 1-12, middle-simple 1-6 and 19-24, bottom-simple 13-24, quarter 4, 8,
// ..., 24.
inline bool standard_layers_of_layout(const std::string& layout, int L, std::vector<int>* layers, std::string* error) {
    layers->clear();
    const int h = L / 2, q = std::max(1, (L + 2) / 4);
    auto range = [&](int from, int to) {
        for (int l = from; l <= to; l++) { layers->push_back(l); }
    };
    if (layout == "uniform") {
    } else if (layout == "hybrid" || layout == "even") {
        for (int l = 2; l <= L; l += 2) { layers->push_back(l); }
    } else if (layout == "odd") {
        for (int l = 1; l <= L; l += 2) { layers->push_back(l); }
    } else if (layout == "top-simple") {
        range(1, h);
    } else if (layout == "bottom-simple") {
        range(h + 1, L);
    } else if (layout == "middle-simple") {
        range(1, std::min(q, L));
        range(std::max(q + 1, L - q + 1), L);
    } else if (layout == "quarter") {
        for (int k = 1; k <= q; k++) { layers->push_back((2 * k * L + q) / (2 * q)); }  // round(k L / q)
    } else if (layout == "first") {
        layers->push_back(1);
    } else if (layout == "last") {
        layers->push_back(L);
    } else if (layout == "bilateral") {
        layers->push_back(1);
        if (L > 1) { layers->push_back(L); }
    } else {  // an explicit list: "3" or "1,24"
        size_t start = 0;
        while (start <= layout.size()) {
            size_t comma = layout.find(',', start);
            std::string item = layout.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
            char* end = nullptr;
            long l = item.empty() ? 0 : std::strtol(item.c_str(), &end, 10);
            if (item.empty() || *end != '\0') {
                *error = "'" + layout + "' is neither a named layout (" + attn_layout_choices() + ") nor a list of layers";
                return false;
            }
            if (l < 1 || l > L) {
                *error = "layer " + item + " is out of range: the model has layers 1.." + std::to_string(L);
                return false;
            }
            if (std::find(layers->begin(), layers->end(), (int)l) != layers->end()) {
                *error = "layer " + item + " is listed twice";
                return false;
            }
            layers->push_back((int)l);
            if (comma == std::string::npos) { break; }
            start = comma + 1;
        }
        std::sort(layers->begin(), layers->end());
    }
    return true;
}
