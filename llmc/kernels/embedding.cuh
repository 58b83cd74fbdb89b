/*
Token embedding, scaled: out[n, :] = scale * wte[idx[n], :]   (the SAN uses scale = sqrt(d)).
wte: (Vp, C), idx: (N) token ids, out: (N, C), floatX, row-major.

Backward, without atomics and therefore deterministic:
    dwte[v, :] += scale * sum over the positions n with idx[n] == v of dout[n, :]
The device groups the positions by token id (EmbeddingBuckets, a merge sort of (token, position)
keys: no host sort and no wait per micro-batch); one thread per (token, channel) sums its
positions in ascending order, the blocks striding over the tokens.
*/
#pragma once

#include <algorithm>
#include <cstdint>
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

// ---- the token buckets, built on the device from the device's token ids ----------------------
// One int buffer of 3 N + 2: [count | token (count) | start (count + 1) | positions (N)]; bucket k
// is token[k] at positions[start[k] .. start[k + 1]), tokens ascending, positions ascending: the
// host stable sort's arrays, with the count in front for the backward to read on the device.
// Each position n is the key (token << 32 | n); distinct keys have one ascending order, the stable
// one, so merging is deterministic without atomics: a block sorts runs of kBucketRun keys in shared
// memory, global passes merge pairs of runs (key i goes to the pair's start + its index in its run
// + the other run's keys below it, by binary search), and one block compacts the sorted keys
// (bucket heads counted per thread slice, scanned in thread order). 2 + ceil(log2(N / kBucketRun))
// launches, 16 N bytes of keys. Design and tests: doc/gpu-runs/host-stalls.md.
constexpr int kBucketRun = 1024;           // keys a block sorts in shared memory (16 KiB, two buffers)
constexpr int kBucketSortThreads = 256;    // threads of the sort and merge kernels
constexpr int kBucketCompactThreads = 256;  // threads of the one compaction block

__device__ inline uint64_t bucket_key(int token, int position) {
    return ((uint64_t)(uint32_t)token << 32) | (uint32_t)position;
}

// Moves key i of `in` (runs of `width` keys, the last one possibly short; n keys in all) to its
// place in `out`, where each pair of runs (2r, 2r + 1) becomes one sorted run.
__device__ inline void merge_place(uint64_t* out, const uint64_t* in, int n, int width, int i) {
    const int run = i / width, own = run * width, pair = (run & ~1) * width, other = (run ^ 1) * width;
    const int other_len = other >= n ? 0 : min(width, n - other);
    const uint64_t key = in[i];
    int lo = 0, hi = other_len;  // keys of the other run below `key`
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (in[other + mid] < key) { lo = mid + 1; } else { hi = mid; }
    }
    out[pair + (i - own) + lo] = key;
}

__global__ void embedding_sort_runs_kernel(uint64_t* keys, const int* idx, int N) {
    __shared__ uint64_t buffer[2][kBucketRun];
    const int base = blockIdx.x * kBucketRun, len = min(kBucketRun, N - base);
    for (int i = threadIdx.x; i < len; i += blockDim.x) { buffer[0][i] = bucket_key(idx[base + i], base + i); }
    __syncthreads();
    int src = 0;
    for (int width = 1; width < len; width *= 2) {
        for (int i = threadIdx.x; i < len; i += blockDim.x) { merge_place(buffer[src ^ 1], buffer[src], len, width, i); }
        __syncthreads();
        src ^= 1;
    }
    for (int i = threadIdx.x; i < len; i += blockDim.x) { keys[base + i] = buffer[src][i]; }
}

__global__ void embedding_merge_runs_kernel(uint64_t* out, const uint64_t* in, int N, int width) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < N) { merge_place(out, in, N, width, i); }
}

__device__ inline bool bucket_head(const uint64_t* keys, int i) { return i == 0 || (keys[i] >> 32) != (keys[i - 1] >> 32); }

__global__ void embedding_bucket_compact_kernel(int* buckets, const uint64_t* keys, int N) {
    __shared__ int first_bucket[kBucketCompactThreads];
    __shared__ int total;
    const int per = CEIL_DIV(N, kBucketCompactThreads);
    const int begin = min(N, (int)threadIdx.x * per), end = min(N, begin + per);
    int heads = 0;
    for (int i = begin; i < end; i++) { heads += bucket_head(keys, i); }
    first_bucket[threadIdx.x] = heads;
    __syncthreads();
    if (threadIdx.x == 0) {  // exclusive scan in thread order
        int sum = 0;
        for (int t = 0; t < kBucketCompactThreads; t++) {
            int count = first_bucket[t];
            first_bucket[t] = sum;
            sum += count;
        }
        total = sum;
    }
    __syncthreads();
    const int count = total;
    int* tokens = buckets + 1;
    int* starts = tokens + count;
    int* positions = starts + count + 1;
    int b = first_bucket[threadIdx.x];
    for (int i = begin; i < end; i++) {
        const uint64_t key = keys[i];
        if (bucket_head(keys, i)) {
            tokens[b] = (int)(key >> 32);
            starts[b] = i;
            b++;
        }
        positions[i] = (int)(uint32_t)key;
    }
    if (threadIdx.x == 0) {
        buckets[0] = count;
        starts[count] = N;
    }
}

struct EmbeddingBuckets {
    int* device = nullptr;        // [count | token (count) | start (count + 1) | positions (N)]
    uint64_t* keys = nullptr;     // 2 x capacity sort keys (ping-pong)
    int capacity = 0;             // positions the buffers hold
    int positions = 0;            // N of the last build: the most buckets there can be

    EmbeddingBuckets() = default;
    EmbeddingBuckets(const EmbeddingBuckets&) = delete;
    EmbeddingBuckets& operator=(const EmbeddingBuckets&) = delete;

    // idx: the N token ids on the device (ids >= 0). Queued on `stream`; nothing waits.
    void build(const int* idx, int N, cudaStream_t stream) {
        if (N > capacity || device == nullptr) {
            release();
            capacity = std::max(N, 1);
            device = cudaMallocElements(int, 3 * (size_t)N + 2);
            keys = cudaMallocElements(uint64_t, 2 * (size_t)N);
        }
        positions = N;
        uint64_t *src = keys, *dst = keys + capacity;
        if (N > 0) {
            LAUNCH(CEIL_DIV(N, kBucketRun), kBucketSortThreads, 0, stream, embedding_sort_runs_kernel)(src, idx, N);
            cudaCheckLaunch();
        }
        for (int width = kBucketRun; width < N; width *= 2) {
            LAUNCH(CEIL_DIV(N, kBucketSortThreads), kBucketSortThreads, 0, stream, embedding_merge_runs_kernel)(dst, src, N,
                                                                                                             width);
            cudaCheckLaunch();
            std::swap(src, dst);
        }
        LAUNCH(1, kBucketCompactThreads, 0, stream, embedding_bucket_compact_kernel)(device, src, N);
        cudaCheckLaunch();
    }
    void release() {
        if (device != nullptr) { cudaCheck(cudaFree(device)); }
        if (keys != nullptr) { cudaCheck(cudaFree(keys)); }
        device = nullptr;
        keys = nullptr;
        capacity = 0;
    }
    ~EmbeddingBuckets() {
        if (device != nullptr) { cudaFree(device); }
        if (keys != nullptr) { cudaFree(keys); }
    }
};

// The backward's grid: (blocks over the buckets, 256-channel slices); each block strides over the
// buckets (bucket = blockIdx.x, + gridDim.x, ...) up to the count the build left on the device, so
// the host never waits for it. Each (bucket, channel) is one thread's sum, as before.
constexpr int kEmbeddingBackwardBlocks = HOST_BACKEND ? 32 : 1024;

__global__ void embedding_backward_kernel(floatX* dwte, const floatX* dout, const int* buckets, int C, float scale) {
    int c = blockIdx.y * blockDim.x + threadIdx.x;
    if (c >= C) { return; }
    const int num_buckets = buckets[0];
    const int* tokens = buckets + 1;
    const int* starts = tokens + num_buckets;
    const int* positions = starts + num_buckets + 1;
    for (int bucket = blockIdx.x; bucket < num_buckets; bucket += gridDim.x) {
        float sum = 0.0f;
        for (int p = starts[bucket]; p < starts[bucket + 1]; p++) { sum += to_float(dout[(size_t)positions[p] * C + c]); }
        floatX* target = dwte + (size_t)tokens[bucket] * C + c;
        *target = from_float<floatX>(to_float(*target) + scale * sum);
    }
}

void embedding_backward(floatX* dwte, const floatX* dout, const EmbeddingBuckets& buckets, int C, float scale,
                        cudaStream_t stream) {
    if (buckets.positions == 0) { return; }
    const int block = 256;
    dim3 grid(std::min(buckets.positions, kEmbeddingBackwardBlocks), CEIL_DIV(C, block));
#if defined(KERNEL_MUTATION_HOST_BUFFER)  // scripts/mutation_check.sh: the host backend must refuse it
    static std::vector<int> host_copy(3 * (size_t)buckets.capacity + 2);
    const int* bucket_data = host_copy.data();
#else
    const int* bucket_data = buckets.device;
#endif
    LAUNCH(grid, block, 0, stream, embedding_backward_kernel)(dwte, dout, bucket_data, C, scale);
    cudaCheckLaunch();
}
