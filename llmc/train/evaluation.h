/*
Validation and the per-layer measurements logged with it (host side; the model computes):
  evaluate(model, val, batches[, comm])  the validation loss, overall, per token region and
                                    per SYNTH exercise x region (ValResult); over several
                                    ranks each evaluates its rows of every batch (the
                                    loader's rank) and the sums are added before dividing
  LayerMeasurements, has_measure    what a model may add at each validation (SAN: gates,
                                    effective ranks, largest attention logits)
  print_validation(step, r)         the lines a validation prints
  validation_json(step, r, m)       its line of the JSON-lines log (without the newline)
*/
#pragma once

#include <array>
#include <cstdint>
#include <cstdio>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "llmc/parallel/comm.h"
#include "llmc/data/dataloader.h"
#include "llmc/model/attention_indicators.h"  // defines: LayerIndicators, LogitSummary, their JSON
#include "llmc/train/run_log.h"

// Validation over the first `batches` batches (0, or more than there are: one pass over the
// data): cross-entropy only, token-weighted (the sum over every counted target divided by
// their number); the z-loss term is reported apart (its coefficient times the mean lse^2).
// Per region (of the target token) and per SYNTH exercise x region, when the shards have
// sidecars: only targets whose whole document is in the row count there, so that no
// region's loss mixes in tokens whose context was cut (in window rows, the targets of a
// row's leading fragment of a document are left out; whole-document rows have none).

struct LossSum {
    double sum = 0.0;
    int64_t count = 0;
    void add(double x) { sum += x, count++; }
    double mean() const { return count > 0 ? sum / (double)count : 0.0; }
};

struct ValResult {
    double loss = 0.0, z_loss = 0.0;
    int64_t count = 0;
    bool has_regions = false, has_exercises = false;
    LossSum region[kRegions];
    std::vector<std::string> exercise_names;
    std::vector<std::array<LossSum, kRegions + 1>> exercise;  // [exercise][region], [.][kRegions]: all regions
};

// Every rank's sums added (rank order), so every rank holds the whole validation's.
inline void sum_over_ranks(ValResult& r, double& ce_sum, double& lse_sq_sum, const Comm& comm) {
    std::vector<double> sums = {ce_sum, lse_sq_sum, (double)r.count};
    auto put = [&](const LossSum& g) {
        sums.push_back(g.sum);
        sums.push_back((double)g.count);
    };
    for (const LossSum& g : r.region) { put(g); }
    for (const auto& e : r.exercise) {
        for (const LossSum& g : e) { put(g); }
    }
    comm.sum(sums);
    size_t k = 0;
    ce_sum = sums[k++];
    lse_sq_sum = sums[k++];
    r.count = (int64_t)sums[k++];
    auto take = [&](LossSum& g) {
        g.sum = sums[k++];
        g.count = (int64_t)sums[k++];
    };
    for (LossSum& g : r.region) { take(g); }
    for (auto& e : r.exercise) {
        for (LossSum& g : e) { take(g); }
    }
}

template <typename Model>
ValResult evaluate(Model& model, DataLoader& val, int batches, const Comm* comm = nullptr) {
    val.reset();
    ValResult r;
    r.has_regions = val.has_regions;
    r.has_exercises = val.has_exercises;
    r.exercise_names = val.exercise_names;
    r.exercise.resize(val.exercise_names.size());
    if (batches <= 0 || batches > val.steps_per_epoch()) { batches = (int)val.steps_per_epoch(); }  // each batch once
    const int doc_start = val.config().doc_start_token;
    double ce_sum = 0.0, lse_sq_sum = 0.0;
    std::vector<float> row_losses;
    for (int k = 0; k < batches; k++) {
        val.next_batch();
        LossStats s = model.forward(val.inputs.data(), val.targets.data(), val.B, val.T, 0.0f, &row_losses);
        ce_sum += s.ce_sum;
        lse_sq_sum += s.lse_sq_sum;
        r.count += s.count;
        if (!val.has_regions && !val.has_exercises) { continue; }
        const std::vector<int>& counted = model.loss_targets();
        for (int b = 0; b < val.B; b++) {
            // until the row's first document start, the context of a target was cut
            bool whole = false;
            for (int t = 0; t < val.T; t++) {
                int i = b * val.T + t;
                whole = whole || (doc_start >= 0 && val.inputs[i] == doc_start);
                if (counted[i] < 0 || !whole) { continue; }
                size_t target = (size_t)b * (val.T + 1) + t + 1;  // the target token's position
                int region = val.has_regions ? val.regions[target] : REGION_OTHER;
                r.region[region].add(row_losses[i]);
                if (val.has_exercises) {
                    auto& e = r.exercise[val.exercises[target]];
                    e[region].add(row_losses[i]);
                    e[kRegions].add(row_losses[i]);
                }
            }
        }
    }
    if (comm != nullptr && comm->world > 1) { sum_over_ranks(r, ce_sum, lse_sq_sum, *comm); }
    if (r.count > 0) {
        r.loss = ce_sum / (double)r.count;
        r.z_loss = model.z_loss_coefficient() * lse_sq_sum / (double)r.count;
    }
    return r;
}

// Per-layer measurements for the SAN paper's analyses, logged at every validation (a model
// provides them with measure(); doc/san-model.md "Measurements").
struct LayerMeasurements {
    std::vector<double> attn_gate, ffn_gate;  // residual gate values (sigmoid(g) gated, g rezero); empty: none
    std::vector<double> erank;                // effective rank of the residual stream after each layer
    std::vector<double> max_logit;            // largest |pre-softmax attention logit| of each layer
    std::vector<LayerIndicators> indicators;  // attention-pattern indicators of each layer ("Deconstructing Attention")
    std::vector<LogitSummary> logits;         // the distribution of each layer's |pre-softmax logits|
};

template <typename Model, typename = void>
struct has_measure : std::false_type {};
template <typename Model>
struct has_measure<Model, std::void_t<decltype(std::declval<Model&>().measure((const int*)nullptr, 0, 0))>>
    : std::true_type {};

// The slice of validation data measure() runs on: the first 4 windows of 257 tokens, fewer
// where the run's rows are shorter, the activations smaller or the data has fewer windows. The
// effective ranks and max_logit read its first 2 rows (the SAN paper's code), the
// attention-pattern indicators and the logit distribution all 4 (doc/deconstructing.md).
constexpr int kMeasureRows = 2, kIndicatorRows = 4, kMeasureTokens = 257;

// The lines a validation prints: the loss (per region, z-loss), then one line per exercise.
inline void print_validation(long step, const ValResult& r) {
    printf("step %ld: val loss %.4f", step, r.loss);
    for (int g = 0; g < kRegions && r.has_regions; g++) {
        if (r.region[g].count > 0) { printf(" | %s %.4f", region_name(g), r.region[g].mean()); }
    }
    if (r.z_loss > 0.0) { printf(" | z-loss %.2e", r.z_loss); }
    printf("\n");
    for (size_t e = 1; e < r.exercise.size(); e++) {  // 0: no exercise
        if (r.exercise[e][kRegions].count == 0) { continue; }
        printf("    %-14s %.4f", r.exercise_names[e].c_str(), r.exercise[e][kRegions].mean());
        for (int g = 1; g < kRegions; g++) {
            if (r.exercise[e][g].count > 0) { printf(" | %s %.4f", region_name(g), r.exercise[e][g].mean()); }
        }
        printf("\n");
    }
}

// A validation's line of the JSON-lines log, without the newline; `whole_docs` (--val-whole-docs
// 2): the same validation on whole documents, nested as "whole_docs": {its val_* keys};
// `train_docs` (--train-doc-eval): the sample of training documents, nested as "train_docs".
inline std::string validation_json(long step, const ValResult& r, const LayerMeasurements& m,
                                   const ValResult* whole_docs = nullptr, const ValResult* train_docs = nullptr) {
    std::string line = "{\"step\": " + std::to_string(step);
    char buf[160];
    snprintf(buf, sizeof(buf), ", \"val_loss\": %.6f, \"val_z_loss\": %.6g, \"val_tokens\": %lld", r.loss, r.z_loss,
             (long long)r.count);
    line += buf;
    for (int g = 0; g < kRegions && r.has_regions; g++) {
        if (r.region[g].count > 0) {
            snprintf(buf, sizeof(buf), ", \"val_loss_%s\": %.6f", region_name(g), r.region[g].mean());
            line += buf;
        }
    }
    if (r.has_exercises) {  // "val_exercise": {"recall": {"all": x, "query": y, ...}, ...}
        line += ", \"val_exercise\": {";
        bool first = true;
        for (size_t e = 1; e < r.exercise.size(); e++) {
            if (r.exercise[e][kRegions].count == 0) { continue; }
            snprintf(buf, sizeof(buf), "%s\"%s\": {\"all\": %.6f", first ? "" : ", ", r.exercise_names[e].c_str(),
                     r.exercise[e][kRegions].mean());
            line += buf;
            for (int g = 0; g < kRegions; g++) {
                if (r.exercise[e][g].count == 0) { continue; }
                snprintf(buf, sizeof(buf), ", \"%s\": %.6f", region_name(g), r.exercise[e][g].mean());
                line += buf;
            }
            line += "}";
            first = false;
        }
        line += "}";
    }
    append_json_array(line, "gate_attn", m.attn_gate);
    append_json_array(line, "gate_ffn", m.ffn_gate);
    append_json_array(line, "erank", m.erank);
    append_json_array(line, "max_logit", m.max_logit);
    append_indicators_json(line, m.indicators);
    append_logits_json(line, m.logits);
    auto nest = [&](const char* key, const ValResult& nested) {  // its keys after the step's: {"step": N, "val_loss": ...}
        std::string inner = validation_json(step, nested, LayerMeasurements{});
        line += std::string(", \"") + key + "\": {" + inner.substr(inner.find(", ") + 2);
    };
    if (whole_docs != nullptr) { nest("whole_docs", *whole_docs); }
    if (train_docs != nullptr) { nest("train_docs", *train_docs); }
    return line + "}";
}
