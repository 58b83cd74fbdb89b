/*
Eval-set scoring inside the trainers (--eval-sets, --eval-every, --eval-context): the sets of
dev/data/evals.py scored as lm-evaluation-harness scores them (the metrics, per kind:
doc/san-model.md "Eval sets"; dev/eval/reference_eval.py is the independent PyTorch scoring).
Every item becomes requests (context, continuation) of token ids; a request reads
(context + continuation)[-(T+1):] with T = --seq-len, and the continuation's log-likelihood is
the sum of its tokens' log-probabilities (softmax over the real vocabulary, fp32 logits).
Requests are packed one per row, --batch-size rows per forward pass, no backward (a causal
model never lets a request see the padding after it). --eval-context scores the rolling sets
again in windows of each N <= T (the Deconstructing paper's Table 4 is WikiText's alone).
*/
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "llmc/kernels/classifier.cuh"  // defines: target_logprob
#include "llmc/data/evalset.h"          // defines: EvalSet, load_evalset
#include "llmc/number_text.h"           // defines: parse_whole_integer
#include "llmc/utils.h"

// One request: its tokens ((context + continuation)[-(T+1):]) and how many at the end are scored.
struct EvalRequest {
    int item = 0, choice = 0;
    std::vector<int> tokens;
    int n_scored = 0;
};

// lm-eval's loglikelihood_rolling as (context, continuation) pairs for a window of max_len
// tokens (its rolling windows with context_len 1, made disjoint; attnref/evalset.py
// rolling_requests is the same rule): the first pair predicts the first min(max_len, n)
// tokens after the prefix token; each later pair predicts the next max_len tokens (fewer at
// the end) from the max_len tokens before its last one. Every token is predicted once.
inline std::vector<std::pair<std::vector<int>, std::vector<int>>> rolling_requests(int prefix, const std::vector<int>& tokens,
                                                                                   int max_len) {
    std::vector<std::pair<std::vector<int>, std::vector<int>>> pairs;
    const int n = (int)tokens.size();
    if (n == 0) { return pairs; }
    int first = std::min(max_len, n);
    std::vector<int> ctx = {prefix};
    pairs.push_back({ctx, std::vector<int>(tokens.begin(), tokens.begin() + first)});
    for (int done = first; done < n;) {
        int take = std::min(n - done, max_len), end = done + take;
        // the model's inputs are tokens[end - max_len - 1, end - 1); the context is what
        // precedes the first predicted token
        std::vector<int> window_ctx(tokens.begin() + (end - max_len - 1), tokens.begin() + (end - take));
        pairs.push_back({window_ctx, std::vector<int>(tokens.begin() + (end - take), tokens.begin() + end)});
        done = end;
    }
    return pairs;
}

inline std::vector<EvalRequest> eval_requests(const EvalSet& es, int T) {
    std::vector<EvalRequest> out;
    auto add = [&](int item, int choice, const std::vector<int>& ctx, const std::vector<int>& cont) {
        if ((int)cont.size() > T) {
            fatal("eval set '%s': item %d: a continuation of %zu tokens does not fit the %d-token window (--seq-len)",
                  es.path.c_str(), item, cont.size(), T);
        }
        EvalRequest r;
        r.item = item;
        r.choice = choice;
        r.tokens = ctx;
        r.tokens.insert(r.tokens.end(), cont.begin(), cont.end());
        if ((int)r.tokens.size() > T + 1) { r.tokens.erase(r.tokens.begin(), r.tokens.end() - (T + 1)); }
        r.n_scored = (int)cont.size();
        out.push_back(std::move(r));
    };
    for (int i = 0; i < (int)es.items.size(); i++) {
        const EvalItem& it = es.items[i];
        if (es.kind == EVAL_ROLLING) {
            for (const auto& pair : rolling_requests(it.context[0], it.choices[0], T)) { add(i, 0, pair.first, pair.second); }
        } else if (es.kind == EVAL_PARTIAL) {
            for (int c = 0; c < (int)it.choices.size(); c++) {
                const std::vector<int>& ch = it.choices[c];
                std::vector<int> ctx = it.context;
                ctx.insert(ctx.end(), ch.begin(), ch.begin() + it.choice_chars[c]);
                add(i, c, ctx, std::vector<int>(ch.begin() + it.choice_chars[c], ch.end()));
            }
        } else {
            for (int c = 0; c < (int)it.choices.size(); c++) { add(i, c, it.context, it.choices[c]); }
        }
    }
    return out;
}

// (log-likelihood, greedy) of each request under the model, in batches of up to `rows`
// requests of the longest one's length. Model: forward(inputs, targets, Bn, Tn, 0) leaves
// the fp32 logits (Bn*Tn, Vp) in model.logits (train_san.cu, train_gpt2.cu).
template <typename Model>
std::vector<std::pair<double, bool>> score_requests(Model& model, const std::vector<EvalRequest>& requests, int rows,
                                                    int V, int Vp) {
    std::vector<std::pair<double, bool>> out(requests.size());
    // longest first, so that a batch's rows have similar lengths
    std::vector<size_t> order(requests.size());
    for (size_t i = 0; i < order.size(); i++) { order[i] = i; }
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return requests[a].tokens.size() > requests[b].tokens.size(); });
    DeviceArena arena;
    const size_t capacity = (size_t)rows * (requests.empty() ? 1 : requests[order[0]].tokens.size());
    int* d_targets = arena.alloc<int>(capacity);
    float* d_logprob = arena.alloc<float>(capacity);
    int* d_greedy = arena.alloc<int>(capacity);
    for (size_t start = 0; start < order.size(); start += rows) {
        const int Bn = (int)std::min<size_t>(rows, order.size() - start);
        const int Tn = (int)requests[order[start]].tokens.size() - 1;
        const int N = Bn * Tn;
        std::vector<int> inputs(N, 0), targets(N, -1), none(N, -1);
        for (int b = 0; b < Bn; b++) {
            const EvalRequest& r = requests[order[start + b]];
            const int len = (int)r.tokens.size() - 1;
            for (int t = 0; t < len; t++) {
                inputs[b * Tn + t] = r.tokens[t];
                if (t >= len - r.n_scored) { targets[b * Tn + t] = r.tokens[t + 1]; }
            }
        }
        model.forward(inputs.data(), none.data(), Bn, Tn, 0.0f);
        cudaCheck(cudaMemcpy(d_targets, targets.data(), N * sizeof(int), cudaMemcpyHostToDevice));
        target_logprob(d_logprob, d_greedy, model.logits, d_targets, N, V, Vp, model.stream);
        std::vector<float> logprob = copy_from_device(d_logprob, N);
        std::vector<int> greedy = copy_from_device(d_greedy, N);
        for (int b = 0; b < Bn; b++) {
            const EvalRequest& r = requests[order[start + b]];
            const int len = (int)r.tokens.size() - 1;
            double ll = 0.0;
            bool all_greedy = true;
            for (int t = len - r.n_scored; t < len; t++) {
                ll += logprob[b * Tn + t];
                all_greedy = all_greedy && greedy[b * Tn + t] != 0;
            }
            out[order[start + b]] = {ll, all_greedy};
        }
    }
    return out;
}

// The metrics of one set (NaN where a metric does not apply to its kind).
struct EvalSetScores {
    std::string name;
    int kind = 0;
    int n = 0;
    double acc = NAN, acc_norm = NAN, perplexity = NAN, word_perplexity = NAN, token_perplexity = NAN;
};

template <typename Model>
EvalSetScores score_evalset(Model& model, const EvalSet& es, const std::string& name, int rows, int T, int V, int Vp) {
    std::vector<EvalRequest> requests = eval_requests(es, T);
    std::vector<std::pair<double, bool>> scores = score_requests(model, requests, rows, V, Vp);
    // per item and choice: log-likelihood and greedy, summed over an item's requests
    std::vector<std::vector<double>> ll(es.items.size());
    std::vector<std::vector<bool>> greedy(es.items.size());
    for (size_t i = 0; i < es.items.size(); i++) {
        ll[i].assign(es.items[i].choices.size(), 0.0);
        greedy[i].assign(es.items[i].choices.size(), true);
    }
    for (size_t q = 0; q < requests.size(); q++) {
        ll[requests[q].item][requests[q].choice] += scores[q].first;
        greedy[requests[q].item][requests[q].choice] = greedy[requests[q].item][requests[q].choice] && scores[q].second;
    }
    EvalSetScores s;
    s.name = name;
    s.kind = es.kind;
    s.n = (int)es.items.size();
    if (s.n == 0) { return s; }
    if (es.kind == EVAL_PARTIAL) {
        int hits = 0;
        for (size_t i = 0; i < es.items.size(); i++) {
            int best = 0;  // strict > keeps the first index on ties
            for (int c = 1; c < (int)es.items[i].choices.size(); c++) {
                if (ll[i][c] > ll[i][best]) { best = c; }
            }
            hits += best == es.items[i].gold;
        }
        s.acc = (double)hits / s.n;
    } else if (es.kind == EVAL_MULTIPLE_CHOICE) {
        int hits = 0, hits_norm = 0;
        for (size_t i = 0; i < es.items.size(); i++) {
            const EvalItem& it = es.items[i];
            int best = 0, best_norm = 0;  // strict > keeps the first index on ties
            for (int c = 1; c < (int)it.choices.size(); c++) {
                if (ll[i][c] > ll[i][best]) { best = c; }
                if (ll[i][c] / it.choice_chars[c] > ll[i][best_norm] / it.choice_chars[best_norm]) { best_norm = c; }
            }
            hits += best == it.gold;
            hits_norm += best_norm == it.gold;
        }
        s.acc = (double)hits / s.n;
        s.acc_norm = (double)hits_norm / s.n;
    } else if (es.kind == EVAL_CLOZE) {
        int hits = 0;
        double sum = 0.0;
        for (size_t i = 0; i < es.items.size(); i++) {
            hits += greedy[i][0];
            sum += ll[i][0];
        }
        s.acc = (double)hits / s.n;
        s.perplexity = std::exp(-sum / s.n);
    } else {
        double sum = 0.0;
        long long words = 0, tokens = 0;
        for (size_t i = 0; i < es.items.size(); i++) {
            sum += ll[i][0];
            words += es.items[i].choice_chars[0];
            tokens += (long long)es.items[i].choices[0].size();
        }
        s.word_perplexity = std::exp(-sum / (double)std::max(words, 1LL));
        s.token_perplexity = std::exp(-sum / (double)tokens);
    }
    return s;
}

// The windows of --eval-context (a comma list of token counts): each 1..seq_len (the run's
// activations hold rows of --seq-len tokens), none twice; empty list: none.
inline std::vector<int> parse_eval_contexts(const std::string& list, int seq_len) {
    std::vector<int> contexts;
    for (size_t pos = 0; pos <= list.size() && !list.empty();) {
        size_t comma = std::min(list.find(',', pos), list.size());
        const std::string text = list.substr(pos, comma - pos);
        pos = comma + 1;
        long long n = 0;
        if (!parse_whole_integer(text.c_str(), &n)) {
            fatal("--eval-context '%s': '%s' is not a whole number of tokens", list.c_str(), text.c_str());
        }
        if (n < 1 || n > seq_len) {
            fatal("--eval-context '%s': %lld is outside 1..%d, the run's --seq-len (a row holds at most --seq-len "
                  "tokens; --steps 0 --init-from CKPT takes the model's context unless --seq-len is given)",
                  list.c_str(), n, seq_len);
        }
        if (std::find(contexts.begin(), contexts.end(), (int)n) != contexts.end()) {
            fatal("--eval-context '%s': %lld is listed twice", list.c_str(), n);
        }
        contexts.push_back((int)n);
    }
    return contexts;
}

// The eval sets of --eval-sets (a comma list of .bin files), each named by its file name
// without directory and ".bin"; checked against the model's vocabulary at load. `contexts`:
// the windows of --eval-context that the rolling sets are scored in besides --seq-len.
struct EvalSuite {
    std::vector<EvalSet> sets;
    std::vector<std::string> names;
    std::vector<int> contexts;

    bool empty() const { return sets.empty(); }

    void load(const std::string& list, int vocab_size, const std::vector<int>& rolling_contexts = {}) {
        size_t pos = 0;
        while (pos <= list.size() && !list.empty()) {
            size_t comma = list.find(',', pos);
            std::string path = list.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
            pos = comma == std::string::npos ? list.size() + 1 : comma + 1;
            if (path.empty()) { fatal("--eval-sets '%s': an empty file name in the list", list.c_str()); }
            EvalSet es = load_evalset(path);
            if (es.vocab_size != vocab_size) {
                fatal("--eval-sets: '%s' is tokenized for a vocabulary of %d; the model has %d", path.c_str(),
                      es.vocab_size, vocab_size);
            }
            std::string name = path.substr(path.find_last_of('/') == std::string::npos ? 0 : path.find_last_of('/') + 1);
            if (name.size() > 4 && name.compare(name.size() - 4, 4, ".bin") == 0) { name.resize(name.size() - 4); }
            for (const std::string& other : names) {
                if (other == name) { fatal("--eval-sets: two files are named '%s'; their results would mix", name.c_str()); }
            }
            printf("eval set %s: %zu %s items (%s)\n", name.c_str(), es.items.size(),
                   eval_kind_name(es.kind),
                   path.c_str());
            sets.push_back(std::move(es));
            names.push_back(name);
        }
        contexts = rolling_contexts;
        bool any_rolling = false;
        for (const EvalSet& es : sets) { any_rolling = any_rolling || es.kind == EVAL_ROLLING; }
        if (!contexts.empty() && !any_rolling) {
            fatal("--eval-context: none of the --eval-sets is a rolling set (e.g. wikitext from dev/data/evals.py); "
                  "it changes only how rolling sets are scored");
        }
    }

    // Scores every set; prints one line per set and returns the JSON object of the results
    // ({"name": {"acc": ..., ...}, ...}) for the log.
    template <typename Model>
    std::string score(Model& model, long step, int rows, int T, int V, int Vp) const {
        std::string json = "{";
        for (size_t k = 0; k < sets.size(); k++) {
            Timer timer;
            EvalSetScores s = score_evalset(model, sets[k], names[k], rows, T, V, Vp);
            char buf[256];
            printf("step %ld: eval %s (%d items):", step, s.name.c_str(), s.n);
            snprintf(buf, sizeof(buf), "%s\"%s\": {\"n\": %d", k ? ", " : "", s.name.c_str(), s.n);
            json += buf;
            auto metric = [&](const char* key, double v) {
                if (std::isnan(v)) { return; }
                printf(" %s %.4f", key, v);
                if (std::isfinite(v)) {
                    snprintf(buf, sizeof(buf), ", \"%s\": %.9g", key, v);
                } else {  // a perplexity beyond double's range: JSON has no infinity
                    snprintf(buf, sizeof(buf), ", \"%s\": null", key);
                }
                json += buf;
            };
            metric("acc", s.acc);
            metric("acc_norm", s.acc_norm);
            metric("perplexity", s.perplexity);
            metric("word_perplexity", s.word_perplexity);
            metric("token_perplexity", s.token_perplexity);
            printf(" | %.1f s\n", timer.ms() / 1e3);
            if (sets[k].kind == EVAL_ROLLING) {  // --eval-context: the same set in windows of N tokens
                for (int N : contexts) {
                    Timer context_timer;
                    EvalSetScores c = score_evalset(model, sets[k], names[k], rows, N, V, Vp);
                    printf("step %ld: eval %s at context %d:", step, c.name.c_str(), N);
                    const std::string at = "@" + std::to_string(N);
                    metric(("word_perplexity" + at).c_str(), c.word_perplexity);
                    metric(("token_perplexity" + at).c_str(), c.token_perplexity);
                    printf(" | %.1f s\n", context_timer.ms() / 1e3);
                }
            }
            json += "}";
        }
        return json + "}";
    }
};
