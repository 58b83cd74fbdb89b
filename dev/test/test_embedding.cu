/*
Tests of llmc/kernels/embedding.cuh's backward: the token buckets built on the device
(EmbeddingBuckets::build, a merge sort of (token, position) keys) against the host's stable sort
that built them before issue 55, and the embedding backward against the kernel of that time,
on whichever executor built this file (host backend with g++, GPU with nvcc), in either precision.

- buckets: [count | token | start | positions] equal int for int to the stable sort's, for N from
  1 to past several sort runs (kBucketRun) and merge passes, N not a power of two, vocabularies
  from 1 token to 200k, token ids uniform, skewed (most positions one token), all distinct,
  descending, and the largest id; a rebuild into a buffer from a larger N; bit-identical rebuilds.
- backward: dwte equal bit for bit to the kernel before issue 55 (one block per bucket, the count
  from the host) fed with the host's buckets, with more buckets than the backward's blocks (its
  stride over the buckets), C not a multiple of the 256-channel slice; and within floatX rounding
  of a double-precision reference.

Usage: test_embedding [name-filter]
*/
#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "llmc/cuda_common.h"
#include "llmc/kernels/embedding.cuh"
#include "dev/test/compare.h"
#include "dev/test/testing.h"

static constexpr bool kFP32 = PRECISION_MODE == PrecisionMode::FP32;

// The host build before issue 55 (commit 913271a): a stable sort of the positions by token,
// laid out as the device's buffer, [count | token (count) | start (count + 1) | positions (N)].
static std::vector<int> host_buckets(const std::vector<int>& idx) {
    const int N = (int)idx.size();
    std::vector<int> order(N);
    for (int i = 0; i < N; i++) { order[i] = i; }
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return idx[a] < idx[b]; });
    std::vector<int> tokens, starts;
    for (int i = 0; i < N; i++) {
        if (i == 0 || idx[order[i]] != idx[order[i - 1]]) {
            tokens.push_back(idx[order[i]]);
            starts.push_back(i);
        }
    }
    starts.push_back(N);
    std::vector<int> out = {(int)tokens.size()};
    out.insert(out.end(), tokens.begin(), tokens.end());
    out.insert(out.end(), starts.begin(), starts.end());
    out.insert(out.end(), order.begin(), order.end());
    return out;
}

// The backward kernel before issue 55: one block per (bucket, 256-channel slice), the bucket
// count from the host, the buckets without the count in front.
__global__ void embedding_backward_before_kernel(floatX* dwte, const floatX* dout, const int* buckets, int num_buckets,
                                                 int C, float scale) {
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

enum class Tokens { Uniform, Skewed, Distinct, Descending, Largest };
static const char* name_of(Tokens t) {
    return t == Tokens::Uniform ? "uniform" : t == Tokens::Skewed ? "skewed" : t == Tokens::Distinct ? "distinct"
                                           : t == Tokens::Descending ? "descending" : "largest";
}

static std::vector<int> make_tokens(int N, int V, Tokens kind, uint32_t seed) {
    std::mt19937 rng(seed);
    std::vector<int> idx(N);
    for (int n = 0; n < N; n++) {
        switch (kind) {
            case Tokens::Uniform: idx[n] = (int)(rng() % V); break;
            case Tokens::Skewed: idx[n] = rng() % 10 < 7 ? V / 2 : (int)(rng() % V); break;
            case Tokens::Distinct: idx[n] = n; break;
            case Tokens::Descending: idx[n] = (int)((int64_t)(N - 1 - n) * V / N); break;
            case Tokens::Largest: idx[n] = rng() % 2 ? 0x7fffffff : (int)(rng() % V); break;
        }
    }
    if (kind == Tokens::Distinct) { std::shuffle(idx.begin(), idx.end(), rng); }
    return idx;
}

// Builds the buckets of idx on the device into `buckets` and checks them against the host's.
static void check_buckets(EmbeddingBuckets& buckets, const std::vector<int>& idx, const char* what) {
    const int N = (int)idx.size();
    int* d_idx = copy_to_device(idx);
    buckets.build(d_idx, N, 0);
    std::vector<int> ref = host_buckets(idx);
    std::vector<int> got = copy_from_device(buckets.device, ref.size());
    bool same = got == ref;
    if (!same) {
        size_t k = 0;
        while (k < ref.size() && got[k] == ref[k]) { k++; }
        fprintf(stderr, "  %s N=%d: first difference at %zu of %zu: %d vs %d (count %d vs %d)\n", what, N, k, ref.size(),
                got[k], ref[k], got[0], ref[0]);
    }
    CHECK(same);
    CHECK_EQ(buckets.positions, N);
    cudaCheck(cudaFree(d_idx));
}

TEST_CASE(buckets_equal_the_host_stable_sort) {
    const int sizes[] = {1, 2, 5, 255, 1000, kBucketRun, kBucketRun + 1, 2 * kBucketRun, 3001, 4 * kBucketRun + 77};
    const int vocabs[] = {1, 7, 250, 50257, 200000};
    uint32_t seed = 1;
    for (int N : sizes) {
        for (int V : vocabs) {
            for (Tokens kind : {Tokens::Uniform, Tokens::Skewed}) {
                EmbeddingBuckets buckets;
                char what[96];
                snprintf(what, sizeof(what), "%s V=%d", name_of(kind), V);
                check_buckets(buckets, make_tokens(N, V, kind, seed++), what);
            }
        }
        for (Tokens kind : {Tokens::Distinct, Tokens::Descending, Tokens::Largest}) {
            EmbeddingBuckets buckets;
            check_buckets(buckets, make_tokens(N, 50257, kind, seed++), name_of(kind));
        }
    }
}

TEST_CASE(buckets_rebuild_and_repeat) {
    EmbeddingBuckets buckets;
    check_buckets(buckets, make_tokens(3001, 250, Tokens::Uniform, 7), "first");
    check_buckets(buckets, make_tokens(700, 50, Tokens::Skewed, 8), "smaller, same buffer");
    std::vector<int> idx = make_tokens(2 * kBucketRun + 5, 300, Tokens::Uniform, 9);
    check_buckets(buckets, idx, "larger, new buffer");
    std::vector<int> first = copy_from_device(buckets.device, 3 * idx.size() + 2);
    check_buckets(buckets, idx, "again");
    CHECK(first == copy_from_device(buckets.device, 3 * idx.size() + 2));
}

// dwte after the backward of the new buckets and kernel == after the kernel before issue 55 on
// the host's buckets, bit for bit; and close to the double-precision sums.
static void check_backward(int N, int V, int C, Tokens kind, uint32_t seed) {
    std::vector<int> idx = make_tokens(N, V, kind, seed);
    std::mt19937 rng(seed + 1000);
    std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
    std::vector<floatX> dout((size_t)N * C), dwte0((size_t)V * C);
    for (auto& x : dout) { x = from_float<floatX>(uni(rng)); }
    for (auto& x : dwte0) { x = from_float<floatX>(0.01f * uni(rng)); }
    const float scale = std::sqrt((float)C);

    int* d_idx = copy_to_device(idx);
    floatX* d_dout = copy_to_device(dout);
    floatX* d_new = copy_to_device(dwte0);
    floatX* d_before = copy_to_device(dwte0);
    EmbeddingBuckets buckets;
    buckets.build(d_idx, N, 0);
    embedding_backward(d_new, d_dout, buckets, C, scale, 0);

    std::vector<int> ref = host_buckets(idx);
    const int count = ref[0];
    std::vector<int> before_layout(ref.begin() + 1, ref.end());
    int* d_before_buckets = copy_to_device(before_layout);
    LAUNCH(dim3(count, CEIL_DIV(C, 256)), 256, 0, 0, embedding_backward_before_kernel)(d_before, d_dout, d_before_buckets,
                                                                                        count, C, scale);
    cudaCheckLaunch();

    std::vector<floatX> got = copy_from_device(d_new, dwte0.size()), before = copy_from_device(d_before, dwte0.size());
    bool same = memcmp(got.data(), before.data(), got.size() * sizeof(floatX)) == 0;
    if (!same) { fprintf(stderr, "  N=%d V=%d C=%d %s: dwte differs from the kernel before issue 55\n", N, V, C, name_of(kind)); }
    CHECK(same);

    std::vector<double> acc((size_t)V * C, 0.0);
    for (int n = 0; n < N; n++)
        for (int c = 0; c < C; c++) { acc[(size_t)idx[n] * C + c] += to_float(dout[(size_t)n * C + c]); }
    std::vector<float> expect(acc.size()), got_f(acc.size());
    for (size_t i = 0; i < acc.size(); i++) {
        expect[i] = (float)(to_float(dwte0[i]) + scale * acc[i]);
        got_f[i] = to_float(got[i]);
    }
    // fp32: the sums of up to N terms of size 1 (times scale), ~1e-6 relative to the largest;
    // bf16: one rounding of the output (2^-9 relative, x2)
    CHECK(compare("dwte", got_f.data(), expect.data(), expect.size(), Tolerance{kFP32 ? 1e-5 : 1e-3, kFP32 ? 1e-5 : 1.0 / 256}));
    for (void* p : {(void*)d_idx, (void*)d_dout, (void*)d_new, (void*)d_before, (void*)d_before_buckets}) { cudaCheck(cudaFree(p)); }
}

TEST_CASE(backward_equals_the_kernel_before) {
    check_backward(1, 5, 64, Tokens::Uniform, 11);
    check_backward(300, 50, 96, Tokens::Skewed, 12);            // few buckets, one large
    check_backward(1000, 700, 300, Tokens::Uniform, 13);        // > 32 buckets (the host's blocks), C % 256 != 0
    check_backward(3001, 3001, 40, Tokens::Distinct, 14);       // > 1024 buckets (a GPU's blocks), a merge pass
    check_backward(2 * kBucketRun + 3, 250, 72, Tokens::Uniform, 15);
}

TEST_MAIN()
