/*
What every trainer's model does alike, asked of the model (its config `cfg`, its
ModelParameters): the trainers' models hold only what differs.

  count_parameters(cfg)        {total, non-embedding}; total includes the padded vocabulary rows
  flops_per_token(cfg)         training FLOPs per token (PaLM convention, as the references)
  count_loss_targets(model, targets, n)   the targets that enter the loss (model.counts_in_loss)
  sample(model, tokens, n, temperature, rng, use_cache)   llmc/kv_cache.cuh sample_tokens
  save_checkpoint(model, path, extra)     config (write_config), optimizer and parameters

A config provides vocab_size, seq_len, n_layer, n_embd, bos_id, padded_vocab(),
embedding_numel() (the embedding tables' elements) and kv_width() (one position's keys);
the trainer file defines parameter_spec(cfg) and write_config(writer, cfg), found here by
argument-dependent lookup.
*/
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "kv_cache.cuh"
#include "param_spec.h"
#include "tensor_file.h"

struct ParameterCounts {
    int64_t total = 0, non_embedding = 0;
};

template <typename Config>
ParameterCounts count_parameters(const Config& c) {
    int64_t total = (int64_t)total_numel(parameter_spec(c));
    return {total, total - c.embedding_numel()};
}

// 6 * (non-embedding parameters + the LM head V * d) + 12 * L * T * d for the attention
// scores and values (PaLM's convention; train_san.py and train_gpt2.py count the same).
template <typename Config>
double flops_per_token(const Config& c) {
    double nonemb = (double)count_parameters(c).non_embedding;
    return 6.0 * (nonemb + (double)c.vocab_size * c.n_embd) + 12.0 * c.n_layer * (double)c.seq_len * c.n_embd;
}

template <typename Model>
int64_t count_loss_targets(const Model& model, const int* targets, int n) {
    int64_t count = 0;
    for (int i = 0; i < n; i++) { count += model.counts_in_loss(targets[i]); }
    return count;
}

// Continues `tokens` by n tokens, sampling from softmax(logits / temperature) over the real
// vocabulary (temperature 0: greedy); the context is the model's last T tokens. With
// use_cache, one cached forward step per position while the sequence fits in T, else the
// window is recomputed for each token (llmc/kv_cache.cuh).
template <typename Model>
std::vector<int> sample(Model& model, std::vector<int> tokens, int n, float temperature, std::mt19937_64& rng,
                        bool use_cache = true) {
    const auto& c = model.cfg;
    return sample_tokens(model, model.kv, model.T, c.padded_vocab(), c.vocab_size, c.bos_id, c.n_layer, c.kv_width(),
                         model.logits, std::move(tokens), n, temperature, rng, use_cache);
}

// The container of doc/formats.md (readable by the trainer's PyTorch reference); `extra`
// adds keys such as the resume position.
template <typename Model>
void save_checkpoint(const Model& model, const std::string& path,
                     const std::vector<std::pair<std::string, std::string>>& extra = {}) {
    model.write_checkpoint(path, extra, [&](TensorFileWriter& w) { write_config(w, model.cfg); });
}
