/*
Drawing the next token from a row of logits, for the trainers' samples:

    sample_token(logits, V, temperature, rng)
        temperature <= 0: argmax over logits[0:V] (first maximum);
        else a draw from softmax(logits[0:V] / temperature), computed in double after
        subtracting the maximum (std::discrete_distribution over the V weights).

Only the first V (real) entries are considered: the padded vocabulary columns never win.
Host-only C++17; the logits are a host copy of one row.
*/
#pragma once

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

inline int sample_token(const float* logits, int V, float temperature, std::mt19937_64& rng) {
    const float* best = std::max_element(logits, logits + V);
    if (temperature <= 0.0f) { return (int)(best - logits); }
    std::vector<double> weights(V);
    for (int j = 0; j < V; j++) { weights[j] = std::exp(((double)logits[j] - *best) / temperature); }
    std::discrete_distribution<int> dist(weights.begin(), weights.end());
    return dist(rng);
}
