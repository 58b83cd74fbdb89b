/*
Fused softmax cross-entropy with z-loss over the LM head's logits, forward and backward
in one pass per row; and (target_logprob, at the end) each row's target log-probability and
whether the target is the argmax, for scoring eval sets (llmc/eval_scoring.h).

logits: (N, Vp) float (fp32, as the paper keeps them); only the first V columns enter the
softmax, the padded ones never do. targets: (N) int, negative = masked (the caller masks
padding and, with the document mask, the targets that cross a document boundary).
For each row n with targets[n] >= 0:
    lse[n]    = logsumexp(logits[n, 0:V])
    losses[n] = lse[n] - logits[n, targets[n]]            (cross-entropy)
    lse_sq[n] = lse[n]^2                                  (z-loss term)
and masked rows get 0 for both. The caller sums them (the batch loss is
(sum losses + z_loss * sum lse_sq) / number of unmasked rows).
If dlogits is not null, it receives d(loss * dloss_scale)/d logits, i.e. for j < V
    dloss_scale * (softmax_j - [j == target] + z_loss * 2 * lse * softmax_j)
and 0 for masked rows and for the padded columns j >= V.

Launch: one warp per row (kClassifierRowsPerBlock rows per block); lanes stride over the
columns and combine max and sum with warp shuffles, without block barriers (on the host
backend every synchronisation is a fiber switch per thread, so a warp per row is much
cheaper there than a block per row, and on the GPU a row of 16k logits keeps a warp busy).
*/
#pragma once

#include "cuda_common.h"

// The classifier's per-row outputs summed over a batch on the host (in double):
// loss = (sum of cross-entropies + z_loss * sum of lse^2) / number of counted rows.
struct LossStats {
    double ce_sum = 0.0, lse_sq_sum = 0.0;
    int64_t count = 0;
    double loss(double z_loss) const { return count == 0 ? 0.0 : (ce_sum + z_loss * lse_sq_sum) / (double)count; }
};

constexpr int kClassifierRowsPerBlock = 4;

// One warp's pass over a row of V logits: its maximum and sum_j exp(row[j] - max), both
// reduced over the warp (every lane gets them), so logsumexp = max + log(sum).
__device__ inline void warp_row_softmax_stats(const float* row, int V, int lane, float* max_out, float* sum_out) {
    float max_value = -INFINITY;
    for (int j = lane; j < V; j += 32) { max_value = fmaxf(max_value, row[j]); }
    max_value = warp_reduce_max(max_value);
    float sum = 0.0f;
    for (int j = lane; j < V; j += 32) { sum += expf(row[j] - max_value); }
    *max_out = max_value;
    *sum_out = warp_reduce_sum(sum);
}

template <typename TGrad>
__global__ void classifier_kernel(TGrad* dlogits, float* losses, float* lse_sq, const float* logits, const int* targets,
                                  int N, int V, int Vp, float z_loss, float dloss_scale) {
    int n = blockIdx.x * kClassifierRowsPerBlock + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    if (n >= N) { return; }  // the whole warp leaves together
    const float* row = logits + (size_t)n * Vp;
    int target = targets[n];
    float max_value, sum;
    warp_row_softmax_stats(row, V, lane, &max_value, &sum);
    float lse = max_value + logf(sum);
    if (lane == 0) {
        losses[n] = target >= 0 ? lse - row[target] : 0.0f;
        lse_sq[n] = target >= 0 ? lse * lse : 0.0f;
    }
    if (dlogits == nullptr) { return; }
    TGrad* drow = dlogits + (size_t)n * Vp;
    float inv_sum = 1.0f / sum;
    for (int j = lane; j < Vp; j += 32) {
        float grad = 0.0f;
        if (target >= 0 && j < V) {
            float p = expf(row[j] - max_value) * inv_sum;
            grad = dloss_scale * (p - (j == target ? 1.0f : 0.0f) + z_loss * 2.0f * lse * p);
        }
        drow[j] = from_float<TGrad>(grad);
    }
}

template <typename TGrad>
void classifier_forward_backward(TGrad* dlogits, float* losses, float* lse_sq, const float* logits, const int* targets,
                                 int N, int V, int Vp, float z_loss, float dloss_scale, cudaStream_t stream) {
    LAUNCH(CEIL_DIV(N, kClassifierRowsPerBlock), 32 * kClassifierRowsPerBlock, 0, stream,
           classifier_kernel<TGrad>)(dlogits, losses, lse_sq, logits, targets, N, V, Vp, z_loss, dloss_scale);
    cudaCheckLaunch();
}

// Scoring a continuation (llmc/eval_scoring.h): for each row n with targets[n] >= 0,
//     logprob[n] = logits[n, target] - logsumexp(logits[n, 0:V])
//     greedy[n]  = 1 if target is the argmax of logits[n, 0:V] (the first index among equal
//                  maxima, as torch.argmax picks it), else 0
// and 0 / 1 for masked rows. Same launch as the loss: one warp per row.
__global__ void target_logprob_kernel(float* logprob, int* greedy, const float* logits, const int* targets, int N, int V,
                                      int Vp) {
    int n = blockIdx.x * kClassifierRowsPerBlock + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    if (n >= N) { return; }
    const float* row = logits + (size_t)n * Vp;
    int target = targets[n];
    float max_value, sum;
    warp_row_softmax_stats(row, V, lane, &max_value, &sum);
    // does any column beat the target (a larger logit, or an equal one at a smaller index)?
    float beaten = 0.0f;
    if (target >= 0) {
        float mine = row[target];
        for (int j = lane; j < V; j += 32) {
            if (row[j] > mine || (row[j] == mine && j < target)) { beaten = 1.0f; }
        }
    }
    beaten = warp_reduce_max(beaten);
    if (lane == 0) {
        logprob[n] = target >= 0 ? row[target] - (max_value + logf(sum)) : 0.0f;
        greedy[n] = target >= 0 ? (beaten == 0.0f) : 1;
    }
}

inline void target_logprob(float* logprob, int* greedy, const float* logits, const int* targets, int N, int V, int Vp,
                           cudaStream_t stream) {
    LAUNCH(CEIL_DIV(N, kClassifierRowsPerBlock), 32 * kClassifierRowsPerBlock, 0, stream,
           target_logprob_kernel)(logprob, greedy, logits, targets, N, V, Vp);
    cudaCheckLaunch();
}
