/*
Token embedding, scaled: out[n, :] = scale * wte[idx[n], :]   (the SAN uses scale = sqrt(d)).
wte: (Vp, C), idx: (N) token ids, out: (N, C), floatX, row-major.

Backward, without atomics and therefore deterministic:
    dwte[v, :] += scale * sum over the positions n with idx[n] == v of dout[n, :]
The host groups the positions by token id (EmbeddingBuckets, built from the batch that
the host already holds); one block per (token, 256-channel slice) sums its positions in
ascending order.
*/
#pragma once

#include <algorithm>
#include <vector>

#include "llmc/cuda_common.h"

__global__ void embedding_forward_kernel(floatX* out, const int* idx, const floatX* wte, int N, int C, float scale) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)N * C) { return; }
    int n = (int)(i / C), c = (int)(i % C);
    out[i] = from_float<floatX>(scale * to_float(wte[(size_t)idx[n] * C + c]));
}

void embedding_forward(floatX* out, const int* idx, const floatX* wte, int N, int C, float scale, cudaStream_t stream) {
    const int block = 256;
    LAUNCH(CEIL_DIV((size_t)N * C, block), block, 0, stream, embedding_forward_kernel)(out, idx, wte, N, C, scale);
    cudaCheckLaunch();
}

// Positions grouped by token: bucket k is token[k], positions [start[k], start[k+1]) of
// `positions`, ascending. The device copy is one int buffer (at most 3 N + 1 ints).
struct EmbeddingBuckets {
    int num_buckets = 0;
    int* device = nullptr;  // [token (num_buckets) | start (num_buckets + 1) | positions (N)]
    size_t capacity = 0;
    std::vector<int> host;

    EmbeddingBuckets() = default;
    EmbeddingBuckets(const EmbeddingBuckets&) = delete;
    EmbeddingBuckets& operator=(const EmbeddingBuckets&) = delete;

    void build(const int* idx_host, int N, cudaStream_t stream) {
        std::vector<int> order(N);
        for (int i = 0; i < N; i++) { order[i] = i; }
        std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return idx_host[a] < idx_host[b]; });
        std::vector<int> tokens, starts;
        for (int i = 0; i < N; i++) {
            if (i == 0 || idx_host[order[i]] != idx_host[order[i - 1]]) {
                tokens.push_back(idx_host[order[i]]);
                starts.push_back(i);
            }
        }
        starts.push_back(N);
        num_buckets = (int)tokens.size();
        host.clear();
        host.insert(host.end(), tokens.begin(), tokens.end());
        host.insert(host.end(), starts.begin(), starts.end());
        host.insert(host.end(), order.begin(), order.end());
        if (host.size() > capacity) {
            if (device != nullptr) { cudaCheck(cudaFree(device)); }
            capacity = 3 * (size_t)N + 1;
            device = cudaMallocElements(int, capacity);
        }
        cudaCheck(cudaMemcpyAsync(device, host.data(), host.size() * sizeof(int), cudaMemcpyHostToDevice, stream));
    }
    ~EmbeddingBuckets() {
        if (device != nullptr) { cudaFree(device); }
    }
};

__global__ void embedding_backward_kernel(floatX* dwte, const floatX* dout, const int* buckets, int num_buckets, int C,
                                          float scale) {
    int bucket = blockIdx.x;
    int c = blockIdx.y * blockDim.x + threadIdx.x;
    if (c >= C) { return; }
    const int* tokens = buckets;
    const int* starts = buckets + num_buckets;
    const int* positions = buckets + 2 * num_buckets + 1;
    float sum = 0.0f;
    for (int p = starts[bucket]; p < starts[bucket + 1]; p++) { sum += to_float(dout[(size_t)positions[p] * C + c]); }
    floatX* target = dwte + (size_t)tokens[bucket] * C + c;
    *target = from_float<floatX>(to_float(*target) + scale * sum);
}

void embedding_backward(floatX* dwte, const floatX* dout, const EmbeddingBuckets& buckets, int C, float scale,
                        cudaStream_t stream) {
    const int block = 256;
    dim3 grid(buckets.num_buckets, CEIL_DIV(C, block));
#if defined(KERNEL_MUTATION_HOST_BUFFER)  // scripts/mutation_check.sh: the host backend must refuse it
    const int* bucket_data = buckets.host.data();
#else
    const int* bucket_data = buckets.device;
#endif
    LAUNCH(grid, block, 0, stream, embedding_backward_kernel)(dwte, dout, bucket_data, buckets.num_buckets, C, scale);
    cudaCheckLaunch();
}
