/*
The attention-pattern indicators of "Deconstructing Attention" (its section 4.4 and the radar
plots of figures 1 and 8) and the distribution of the pre-softmax logits (its figures 2 and 6),
from one layer's q and k, on the host in double. A measurement at validation time on a few rows,
not a hot path: the trainer copies q and k from the device (the same on a GPU build) and calls
attention_patterns, which computes both in one pass over the scores. The definitions as
implemented, the context L and the cost: doc/deconstructing.md "Attention-pattern indicators";
each formula is also next to the field that holds it below.
*/
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <type_traits>
#include <vector>

// What a mixer's weights over the keys are (TokenMixer::score_inputs, llmc/mixers/mixer.h), with
// x = q[t].k[tau] / sqrt(hd) and the sums over the keys tau visible from t:
//   Softmax          a[t][tau] = exp(x) / sum exp(x)                        the QK kinds
//   TaylorJoint      a[t][tau] = f(x) / sum f(x), f = 1 + x + x^2/2          approximate (joint)
//   OwnScoreSoftmax  a[t][tau] = exp(s[tau]) / sum exp(s), s[tau] = q[tau].k[tau] / sqrt(hd)
//                                                                            nonapprox
//   NotStochastic    pairwise logits but no single non-negative row-stochastic matrix
//                    (approximate, separate: three matrices, the first-order one signed)
enum class AttnWeights { Softmax, TaylorJoint, OwnScoreSoftmax, NotStochastic };

constexpr int kLocFocDistances = 4;  // LocFoc N for N = 0..3
constexpr std::array<double, 5> kLogitLevels = {0.5, 0.9, 0.99, 0.999, 1.0};

// 29 edges, 10^-3 .. 10^4, four per decade: 28 bins
inline std::vector<double> logit_bin_edges() {
    std::vector<double> edges;
    for (int i = -12; i <= 16; i++) { edges.push_back(std::pow(10.0, i / 4.0)); }
    return edges;
}

// One layer's q and k on the host (fp32 copies of the activations) and what its weights are.
struct HostScores {
    std::vector<float> q, k;  // (Bn, Tn, Hq, hd), (Bn, Tn, Hkv, hd)
    std::vector<int> doc;     // (Bn, Tn) document ids; empty: causal only
    int Bn = 0, Tn = 0, Hq = 0, Hkv = 0, hd = 0;
    AttnWeights weights = AttnWeights::Softmax;

    bool visible(int b, int t, int tau) const {
        return tau <= t && (doc.empty() || doc[(size_t)b * Tn + tau] == doc[(size_t)b * Tn + t]);
    }
    // q[t] of head h . k[tau] of its kv head, / sqrt(hd)
    double logit(int b, int h, int t, int tau) const {
        const float* qt = &q[(((size_t)b * Tn + t) * Hq + h) * hd];
        const float* kt = &k[(((size_t)b * Tn + tau) * Hkv + h / (Hq / Hkv)) * hd];
        double dot = 0.0;
        for (int c = 0; c < hd; c++) { dot += (double)qt[c] * kt[c]; }
        return dot / std::sqrt((double)hd);
    }
    bool has_matrix() const { return weights != AttnWeights::NotStochastic; }
};

// One query head's indicators, from A = a (Tn x Tn, zero where not visible) of each row b:
//   entropy    -sum_{t,tau} a log a over the whole matrix (0 log 0 = 0), mean over the rows
//   conc       ||A||_F = sqrt(sum_{t,tau} a^2), mean over the rows
//   sink       mean over (b, t) of a[t][0], the row's first token: the paper's A[:,1]/L literally
//              (under the document mask a[t][0] = 0 past the row's first document)
//   sink_doc   mean over (b, t) of a[t][first(t)], first(t) the first key t sees (its document's
//              first token; = sink without the document mask)
//   locfoc[N]  mean of a[t][t - N] over the (b, t) whose key t - N is visible, N = 0..3
struct HeadIndicators {
    double entropy = 0.0, conc = 0.0, sink = 0.0, sink_doc = 0.0;
    std::array<double, kLocFocDistances> locfoc{};
};
struct LayerIndicators {
    bool has = false;  // false: the layer's weights are no attention matrix (logged as null)
    std::vector<HeadIndicators> head;
    // mean over the visible (b, t, tau) of the std over the query heads of a_h[t][tau] (population
    // std); with every causal pair visible, the paper's 2 / (L (1 + L)) normalisation, L = Tn
    double headdiv = 0.0;
};
struct LogitSummary {
    bool has = false;                                     // false: the layer has no logits (logged as null)
    std::array<double, kLogitLevels.size()> quantile{};  // of |x|, at kLogitLevels
    std::vector<int64_t> count;                           // per bin of logit_bin_edges()
};
struct LayerPatterns {
    LayerIndicators indicators;
    LogitSummary logits;
};

// The scores of row b, head h into X (Tn x Tn, row-major; only visible entries are written):
// x = q[t].k[tau] / sqrt(hd), or for OwnScoreSoftmax s[tau] in every row t.
inline void head_scores(const HostScores& s, int b, int h, std::vector<double>& X) {
    const int T = s.Tn;
    X.assign((size_t)T * T, 0.0);
    std::vector<double> own;
    if (s.weights == AttnWeights::OwnScoreSoftmax) {
        for (int t = 0; t < T; t++) { own.push_back(s.logit(b, h, t, t)); }
    }
    for (int t = 0; t < T; t++) {
        for (int tau = 0; tau <= t; tau++) {
            if (s.visible(b, t, tau)) { X[(size_t)t * T + tau] = own.empty() ? s.logit(b, h, t, tau) : own[tau]; }
        }
    }
}

// The weights of row b from its scores X, in place: A (zero where not visible).
inline void weights_of_scores(const HostScores& s, int b, std::vector<double>& X) {
    const int T = s.Tn;
    for (int t = 0; t < T; t++) {
        double* row = &X[(size_t)t * T];
        double largest = -INFINITY;
        for (int tau = 0; tau <= t; tau++) {
            if (s.visible(b, t, tau)) { largest = std::max(largest, row[tau]); }
        }
        double sum = 0.0;
        for (int tau = 0; tau <= t; tau++) {
            if (!s.visible(b, t, tau)) { continue; }
            const double x = row[tau];
            // softmax from the largest score (exp of a number <= 0); f(x) >= 1/2 needs no shift
            row[tau] = s.weights == AttnWeights::TaylorJoint ? 1.0 + x + 0.5 * x * x : std::exp(x - largest);
            sum += row[tau];
        }
        for (int tau = 0; tau <= t; tau++) { row[tau] /= sum; }
    }
}

// One head's matrix A of row b added into its indicators (sums; attention_patterns divides).
inline void add_head(const HostScores& s, int b, const std::vector<double>& A, HeadIndicators& m,
                     std::array<int64_t, kLocFocDistances>* loc_count) {
    const int T = s.Tn;
    double ent = 0.0, sq = 0.0;
    for (int t = 0; t < T; t++) {
        const double* row = &A[(size_t)t * T];
        int first = t;
        for (int tau = 0; tau <= t; tau++) {
            const double a = row[tau];
            if (a > 0.0) { ent -= a * std::log(a); }
            sq += a * a;
            if (s.visible(b, t, tau)) { first = std::min(first, tau); }
        }
        m.sink += row[0];
        m.sink_doc += row[first];
        for (int n = 0; n < kLocFocDistances && n <= t; n++) {
            if (!s.visible(b, t, t - n)) { continue; }
            m.locfoc[n] += row[t - n];
            if (loc_count != nullptr) { (*loc_count)[n]++; }
        }
    }
    m.entropy += ent;
    m.conc += std::sqrt(sq);
}

// The logits' summary from |x| of every visible pair of every row and query head (OwnScoreSoftmax:
// |s[t]| per position), sorted here: quantiles at kLogitLevels (nearest rank: the ceil(p n)-th
// smallest) and counts in the bins of logit_bin_edges() (below the first edge: bin 0; from the
// last edge on: the last bin).
inline LogitSummary summarise_logits(std::vector<double>& x) {
    LogitSummary r;
    if (x.empty()) { return r; }
    r.has = true;
    std::sort(x.begin(), x.end());
    for (size_t i = 0; i < kLogitLevels.size(); i++) {
        size_t rank = (size_t)std::ceil(kLogitLevels[i] * (double)x.size());  // 1-based
        r.quantile[i] = x[std::min(x.size(), std::max<size_t>(rank, 1)) - 1];
    }
    const std::vector<double> edges = logit_bin_edges();
    r.count.assign(edges.size() - 1, 0);
    for (double v : x) {
        // the bin [edges[i-1], edges[i]) holding v, clamped to the first and the last
        size_t i = std::upper_bound(edges.begin(), edges.end(), v) - edges.begin();
        r.count[std::min(std::max<size_t>(i, 1), r.count.size()) - 1]++;
    }
    return r;
}

// A layer's indicators and logit summary, one pass over its scores (empty s: neither).
inline LayerPatterns attention_patterns(const HostScores& s) {
    LayerPatterns r;
    if (s.Bn <= 0 || s.Tn <= 0) { return r; }
    const int T = s.Tn, H = s.Hq;
    const bool own = s.weights == AttnWeights::OwnScoreSoftmax;
    LayerIndicators& ind = r.indicators;
    ind.has = s.has_matrix();
    ind.head.resize(ind.has ? H : 0);
    std::vector<std::vector<double>> A(H);  // one row's heads at once: headdiv needs them together
    std::vector<double> abs_logits;
    abs_logits.reserve((size_t)s.Bn * H * (own ? T : (size_t)T * (T + 1) / 2));
    double div_sum = 0.0;
    int64_t div_count = 0;
    std::array<int64_t, kLocFocDistances> loc_count{};
    for (int b = 0; b < s.Bn; b++) {
        for (int h = 0; h < H; h++) {
            head_scores(s, b, h, A[h]);
            for (int t = 0; t < T; t++) {
                for (int tau = own ? t : 0; tau <= t; tau++) {
                    if (s.visible(b, t, tau)) { abs_logits.push_back(std::fabs(A[h][(size_t)t * T + tau])); }
                }
            }
            if (!ind.has) { continue; }
            weights_of_scores(s, b, A[h]);
            add_head(s, b, A[h], ind.head[h], h == 0 ? &loc_count : nullptr);
        }
        if (!ind.has) { continue; }
        // the std over the heads at every visible pair
        for (int t = 0; t < T; t++) {
            for (int tau = 0; tau <= t; tau++) {
                if (!s.visible(b, t, tau)) { continue; }
                double mean = 0.0, var = 0.0;
                for (int h = 0; h < H; h++) { mean += A[h][(size_t)t * T + tau]; }
                mean /= H;
                for (int h = 0; h < H; h++) {
                    const double dev = A[h][(size_t)t * T + tau] - mean;
                    var += dev * dev;
                }
                div_sum += std::sqrt(var / H);
                div_count++;
            }
        }
    }
    for (HeadIndicators& m : ind.head) {
        m.entropy /= s.Bn;
        m.conc /= s.Bn;
        m.sink /= (double)s.Bn * T;
        m.sink_doc /= (double)s.Bn * T;
        for (int n = 0; n < kLocFocDistances; n++) { m.locfoc[n] = loc_count[n] > 0 ? m.locfoc[n] / loc_count[n] : 0.0; }
    }
    if (ind.has) { ind.headdiv = div_sum / (double)div_count; }
    r.logits = summarise_logits(abs_logits);
    return r;
}

// ---- the JSONL keys (doc/formats.md "Validation records"): one entry per layer, null where
// the layer has none.

inline void append_number(std::string& out, double v) {
    char buf[32];
    snprintf(buf, sizeof(buf), "%.6g", v);
    out += buf;
}

// "key": [layer: [head: value] or null]
template <typename Get>
void append_per_head(std::string& out, const char* key, const std::vector<LayerIndicators>& layers, Get get) {
    out += std::string(", \"") + key + "\": [";
    for (size_t l = 0; l < layers.size(); l++) {
        out += l > 0 ? ", " : "";
        if (!layers[l].has) {
            out += "null";
            continue;
        }
        out += "[";
        for (size_t h = 0; h < layers[l].head.size(); h++) {
            out += h > 0 ? ", " : "";
            append_number(out, get(layers[l].head[h]));
        }
        out += "]";
    }
    out += "]";
}

// attn_entropy, attn_conc, attn_sink, attn_sink_doc: [layer][head]; attn_locfoc: [layer][N][head];
// attn_headdiv: [layer]
inline void append_indicators_json(std::string& out, const std::vector<LayerIndicators>& layers) {
    if (layers.empty()) { return; }
    append_per_head(out, "attn_entropy", layers, [](const HeadIndicators& m) { return m.entropy; });
    append_per_head(out, "attn_conc", layers, [](const HeadIndicators& m) { return m.conc; });
    append_per_head(out, "attn_sink", layers, [](const HeadIndicators& m) { return m.sink; });
    append_per_head(out, "attn_sink_doc", layers, [](const HeadIndicators& m) { return m.sink_doc; });
    out += ", \"attn_locfoc\": [";
    for (size_t l = 0; l < layers.size(); l++) {
        out += l > 0 ? ", " : "";
        if (!layers[l].has) {
            out += "null";
            continue;
        }
        for (int n = 0; n < kLocFocDistances; n++) {
            out += n == 0 ? "[[" : ", [";
            for (size_t h = 0; h < layers[l].head.size(); h++) {
                out += h > 0 ? ", " : "";
                append_number(out, layers[l].head[h].locfoc[n]);
            }
            out += "]";
        }
        out += "]";
    }
    out += "], \"attn_headdiv\": [";
    for (size_t l = 0; l < layers.size(); l++) {
        out += l > 0 ? ", " : "";
        if (layers[l].has) {
            append_number(out, layers[l].headdiv);
        } else {
            out += "null";
        }
    }
    out += "]";
}

// logit_abs_levels, logit_abs_edges (constants, so that a log reads alone);
// logit_abs_quantiles: [layer][level]; logit_abs_hist: [layer][bin]
inline void append_logits_json(std::string& out, const std::vector<LogitSummary>& layers) {
    if (layers.empty()) { return; }
    auto list = [&](const auto& values) {  // counts as integers, the rest as %.6g
        out += "[";
        for (size_t i = 0; i < values.size(); i++) {
            out += i > 0 ? ", " : "";
            if constexpr (std::is_integral_v<std::decay_t<decltype(values[i])>>) {
                out += std::to_string(values[i]);
            } else {
                append_number(out, values[i]);
            }
        }
        out += "]";
    };
    out += ", \"logit_abs_levels\": ";
    list(kLogitLevels);
    out += ", \"logit_abs_edges\": ";
    list(logit_bin_edges());
    out += ", \"logit_abs_quantiles\": [";
    for (size_t l = 0; l < layers.size(); l++) {
        out += l > 0 ? ", " : "";
        if (layers[l].has) { list(layers[l].quantile); } else { out += "null"; }
    }
    out += "], \"logit_abs_hist\": [";
    for (size_t l = 0; l < layers.size(); l++) {
        out += l > 0 ? ", " : "";
        if (layers[l].has) { list(layers[l].count); } else { out += "null"; }
    }
    out += "]";
}
