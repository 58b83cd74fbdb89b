/*
What the two attention playgrounds (attention_forward.cu, attention_backward.cu) share: their
numbering of versions and which of them a build has, the choice of versions from the command
line, and document ids shaped like the data loader's.
*/
#pragma once

#include <random>
#include <vector>

#include "dev/cuda/common.h"
#include "llmc/kernels/attention.cuh"

// Versions 1-2 run everywhere; 3 (tensor cores) takes bf16 operands; 4 is cuDNN, which has no
// document mask.
inline bool attention_version_available(int version, bool use_docs) {
    if (version == 3) { return PRECISION_MODE == PrecisionMode::BF16; }
    if (version == 4) { return kAttentionHasCudnn && !use_docs; }
    return true;
}

// The versions to run: all this build has, or the one named by argv[1] (refused when absent).
inline void attention_versions_from_args(const char* program, int argc, char** argv, int* first, int* last) {
    *first = 1;
    *last = kAttentionHasCudnn ? 4 : PRECISION_MODE == PrecisionMode::BF16 ? 3 : 2;
    if (argc > 1) { *first = *last = atoi(argv[1]); }
    if (*first < 1 || *first > 4 || !attention_version_available(*first, false)) {
        fprintf(stderr, "%s: version %d is not built here (%s%s)\n", program, *first, PRECISION_NAME,
                kAttentionHasCudnn ? "" : ", no cuDNN");
        exit(EXIT_FAILURE);
    }
}

// Document ids as the data loader makes them: the row starts mid-document, then new
// documents start at random (mean length `mean_length`).
inline std::vector<int> make_doc_ids(int B, int T, int mean_length, uint32_t seed) {
    std::mt19937 rng(seed);
    std::uniform_int_distribution<int> coin(0, mean_length - 1);
    std::vector<int> doc((size_t)B * T);
    for (int b = 0; b < B; b++) {
        int id = 0;
        for (int t = 0; t < T; t++) { doc[(size_t)b * T + t] = (t > 0 && coin(rng) == 0) ? ++id : id; }
    }
    return doc;
}
