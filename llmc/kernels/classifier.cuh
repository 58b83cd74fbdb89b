/*
Fused softmax cross-entropy with z-loss over the LM head's logits, forward and backward
in one pass per row; and (target_logprob, at the end) each row's target log-probability and
whether the target is the argmax, for scoring eval sets (llmc/train/eval_scoring.h).

logits: (N, Vp) float (fp32, as the paper keeps them); only the first V columns enter the
softmax, the padded ones never do. targets: (N) int, negative = masked (the caller masks
padding and, with the document mask, the targets that cross a document boundary).
For each row n with targets[n] >= 0:
    lse[n]    = logsumexp(logits[n, 0:V])
    losses[n] = lse[n] - logits[n, targets[n]]            (cross-entropy)
    lse_sq[n] = lse[n]^2                                  (z-loss term)
and masked rows get 0 for both. classifier_loss_sums (below) sums them on the device and copies
back the two sums (the batch loss is (sum losses + z_loss * sum lse_sq) / number of unmasked rows).
If dlogits is not null, it receives d(loss * dloss_scale)/d logits, i.e. for j < V
    dloss_scale * (softmax_j - [j == target] + z_loss * 2 * lse * softmax_j)
and 0 for masked rows and for the padded columns j >= V.

Launch: kClassifierLanes lanes per row, kClassifierRowsPerBlock rows per block, no block
barriers. On the GPU a warp per row: lanes stride over the columns and combine max and sum
with warp shuffles (a row of 16k logits keeps a warp busy). On the host backend one thread
per row: every shuffle would be a fiber switch per lane, and a thread that owns its row walks
it in kRowChunk independent partial maxima and sums, which the compiler vectorises, with
hostcuda::vector_expf for expf (libm's does not vectorise). Each row is one thread's work
in a fixed order, so the result does not depend on the number of workers.
*/
#pragma once

#include "llmc/cuda_common.h"

// The classifier's per-row outputs summed over a batch (in double, classifier_loss_sums):
// loss = (sum of cross-entropies + z_loss * sum of lse^2) / number of counted rows.
struct LossStats {
    double ce_sum = 0.0, lse_sq_sum = 0.0;
    int64_t count = 0;
    double loss(double z_loss) const { return count == 0 ? 0.0 : (ce_sum + z_loss * lse_sq_sum) / (double)count; }
};

constexpr int kClassifierLanes = HOST_BACKEND ? 1 : 32;
constexpr int kClassifierRowsPerBlock = HOST_BACKEND ? 16 : 4;

// exp of a logit minus its row's maximum
__device__ inline float softmax_exp(float x) { return kernel_expf(x); }

// The maximum over the lanes of a row (a no-op with one lane per row).
__device__ inline float row_lanes_max(float value) {
    if constexpr (kClassifierLanes == 1) {
        return value;
    } else {
        return warp_reduce_max(value);
    }
}

// A row's maximum and sum_j exp(row[j] - max), both reduced over the row's lanes (every lane
// gets them), so logsumexp = max + log(sum). NaN logits make the sum NaN.
__device__ inline void row_softmax_stats(const float* row, int V, int lane, float* max_out, float* sum_out) {
#if HOST_BACKEND
    // one thread: kRowChunk partial results side by side, combined in a fixed order
    constexpr int kRowChunk = 16;
    int whole = V - V % kRowChunk;
    float maxima[kRowChunk], sums[kRowChunk] = {};
    for (int k = 0; k < kRowChunk; k++) { maxima[k] = -INFINITY; }
    for (int j = 0; j < whole; j += kRowChunk) {
        for (int k = 0; k < kRowChunk; k++) { maxima[k] = row[j + k] > maxima[k] ? row[j + k] : maxima[k]; }
    }
    float max_value = -INFINITY;
    for (int k = 0; k < kRowChunk; k++) { max_value = fmaxf(max_value, maxima[k]); }
    for (int j = whole; j < V; j++) { max_value = fmaxf(max_value, row[j]); }
    for (int j = 0; j < whole; j += kRowChunk) {
        for (int k = 0; k < kRowChunk; k++) { sums[k] += softmax_exp(row[j + k] - max_value); }
    }
    float sum = 0.0f;
    for (int k = 0; k < kRowChunk; k++) { sum += sums[k]; }
    for (int j = whole; j < V; j++) { sum += softmax_exp(row[j] - max_value); }
    (void)lane;
    *max_out = max_value;
    *sum_out = sum;
#else
    float max_value = -INFINITY;
    for (int j = lane; j < V; j += 32) { max_value = fmaxf(max_value, row[j]); }
    max_value = warp_reduce_max(max_value);
    float sum = 0.0f;
    for (int j = lane; j < V; j += 32) { sum += expf(row[j] - max_value); }
    *max_out = max_value;
    *sum_out = warp_reduce_sum(sum);
#endif
}

template <typename TGrad>
__global__ void classifier_kernel(TGrad* dlogits, float* losses, float* lse_sq, const float* logits, const int* targets,
                                  int N, int V, int Vp, float z_loss, float dloss_scale) {
    int n = blockIdx.x * kClassifierRowsPerBlock + threadIdx.x / kClassifierLanes;
    int lane = threadIdx.x % kClassifierLanes;
    if (n >= N) { return; }  // the row's lanes leave together
    const float* row = logits + (size_t)n * Vp;
    int target = targets[n];
    float max_value, sum;
    row_softmax_stats(row, V, lane, &max_value, &sum);
    float lse = max_value + logf(sum);
    if (lane == 0) {
        losses[n] = target >= 0 ? lse - row[target] : 0.0f;
        lse_sq[n] = target >= 0 ? lse * lse : 0.0f;
    }
    if (dlogits == nullptr) { return; }
    TGrad* drow = dlogits + (size_t)n * Vp;
    float inv_sum = 1.0f / sum;
#if HOST_BACKEND
    // the same values, with the target's column and the padding out of the loop, which then
    // vectorises (with the conversion to TGrad)
    const float zloss_factor = z_loss * 2.0f * lse;
    const int counted = target >= 0 ? V : 0;
    for (int j = 0; j < counted; j++) {
        float p = softmax_exp(row[j] - max_value) * inv_sum;
        drow[j] = from_float<TGrad>(dloss_scale * (p + zloss_factor * p));
    }
    if (target >= 0) {
        float p = softmax_exp(row[target] - max_value) * inv_sum;
        drow[target] = from_float<TGrad>(dloss_scale * (p - 1.0f + zloss_factor * p));
    }
    for (int j = counted; j < Vp; j++) { drow[j] = from_float<TGrad>(0.0f); }
    return;
#endif
    for (int j = lane; j < Vp; j += kClassifierLanes) {
        float grad = 0.0f;
        if (target >= 0 && j < V) {
            float p = softmax_exp(row[j] - max_value) * inv_sum;
            grad = dloss_scale * (p - (j == target ? 1.0f : 0.0f) + z_loss * 2.0f * lse * p);
        }
        drow[j] = from_float<TGrad>(grad);
    }
}

// The tensors of one classifier_forward_backward call (laid out as in the header): what it
// reads, logits (N, Vp) and targets (N); what it writes, losses and lse_sq (N each) and,
// unless null (evaluation), dlogits (N, Vp).
template <typename TGrad>
struct ClassifierTensorsOf {
    const float* logits;
    const int* targets;
    float* losses;
    float* lse_sq;
    TGrad* dlogits;
};
using ClassifierTensors = ClassifierTensorsOf<floatX>;

// The loss of N rows of V real (Vp stored) logits, and dlogits = d(loss * dloss_scale)/d logits.
template <typename TGrad>
void classifier_forward_backward(const ClassifierTensorsOf<TGrad>& t, int N, int V, int Vp, float z_loss,
                                 float dloss_scale, cudaStream_t stream) {
    LAUNCH(CEIL_DIV(N, kClassifierRowsPerBlock), kClassifierLanes * kClassifierRowsPerBlock, 0, stream,
           classifier_kernel<TGrad>)(t.dlogits, t.losses, t.lse_sq, t.logits, t.targets, N, V, Vp, z_loss, dloss_scale);
    cudaCheckLaunch();
}

// Scoring a continuation (llmc/train/eval_scoring.h): for each row n with targets[n] >= 0,
//     logprob[n] = logits[n, target] - logsumexp(logits[n, 0:V])
//     greedy[n]  = 1 if target is the argmax of logits[n, 0:V] (the first index among equal
//                  maxima, as torch.argmax picks it), else 0
// and 0 / 1 for masked rows. Same launch as the loss.
__global__ void target_logprob_kernel(float* logprob, int* greedy, const float* logits, const int* targets, int N, int V,
                                      int Vp) {
    int n = blockIdx.x * kClassifierRowsPerBlock + threadIdx.x / kClassifierLanes;
    int lane = threadIdx.x % kClassifierLanes;
    if (n >= N) { return; }
    const float* row = logits + (size_t)n * Vp;
    int target = targets[n];
    float max_value, sum;
    row_softmax_stats(row, V, lane, &max_value, &sum);
    // does any column beat the target (a larger logit, or an equal one at a smaller index)?
    float beaten = 0.0f;
    if (target >= 0) {
        float mine = row[target];
        for (int j = lane; j < V; j += kClassifierLanes) {
            if (row[j] > mine || (row[j] == mine && j < target)) { beaten = 1.0f; }
        }
    }
    beaten = row_lanes_max(beaten);
    if (lane == 0) {
        logprob[n] = target >= 0 ? row[target] - (max_value + logf(sum)) : 0.0f;
        greedy[n] = target >= 0 ? (beaten == 0.0f) : 1;
    }
}

inline void target_logprob(float* logprob, int* greedy, const float* logits, const int* targets, int N, int V, int Vp,
                           cudaStream_t stream) {
    LAUNCH(CEIL_DIV(N, kClassifierRowsPerBlock), kClassifierLanes * kClassifierRowsPerBlock, 0, stream,
           target_logprob_kernel)(logprob, greedy, logits, targets, N, V, Vp);
    cudaCheckLaunch();
}

// ---- the loss sums on the device --------------------------------------------------------------
// sums[0] = sum of row_loss[0:N], sums[1] = sum of row_lse_sq[0:N] (0 when row_lse_sq is null), in
// double. One block of kLossSumThreads threads: thread t adds rows t, t + kLossSumThreads, ... in
// order, thread 0 adds the threads' sums in thread order: a fixed order, so deterministic, and
// within double rounding of the sequential sum the host took before issue 55 (not bit for bit).
// Two doubles come back instead of 2 N floats.
constexpr int kLossSumThreads = HOST_BACKEND ? 32 : 512;

__global__ void loss_sums_kernel(double* sums, const float* row_loss, const float* row_lse_sq, int N) {
    __shared__ double partial[2][kLossSumThreads];
    double ce = 0.0, lse_sq = 0.0;
    for (int i = threadIdx.x; i < N; i += kLossSumThreads) {
        ce += row_loss[i];
        if (row_lse_sq != nullptr) { lse_sq += row_lse_sq[i]; }
    }
    partial[0][threadIdx.x] = ce;
    partial[1][threadIdx.x] = lse_sq;
    __syncthreads();
    if (threadIdx.x == 0) {
        double total[2] = {0.0, 0.0};
        for (int t = 0; t < kLossSumThreads; t++) {
            total[0] += partial[0][t];
            total[1] += partial[1][t];
        }
        sums[0] = total[0];
        sums[1] = total[1];
    }
}

// The batch's loss sums queued: summed into `scratch` (2 doubles on the device), then copied
// into `host` (2 doubles, pinned, so the copy is one DMA that the host does not wait for). They
// are there once the stream has passed the copy (an event recorded after it).
inline void classifier_loss_sums_queue(const float* row_loss, const float* row_lse_sq, int N, double* scratch,
                                       double* host, cudaStream_t stream) {
    LAUNCH(1, kLossSumThreads, 0, stream, loss_sums_kernel)(scratch, row_loss, row_lse_sq, N);
    cudaCheckLaunch();
    cudaCheck(cudaMemcpyAsync(host, scratch, 2 * sizeof(double), cudaMemcpyDeviceToHost, stream));
}

// The batch's loss sums (count left 0: the caller knows it), as classifier_loss_sums_queue
// leaves them; waits for the stream.
inline LossStats classifier_loss_sums(const float* row_loss, const float* row_lse_sq, int N, double* scratch, double* host,
                                      cudaStream_t stream) {
    classifier_loss_sums_queue(row_loss, row_lse_sq, N, scratch, host, stream);
    cudaCheck(cudaStreamSynchronize(stream));
    LossStats stats;
    stats.ce_sum = host[0];
    stats.lse_sq_sum = host[1];
    return stats;
}
