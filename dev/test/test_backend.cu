/*
Tests of the execution model every kernel relies on, run on whichever executor built
this file: the host backend (g++) in every `make test`, the GPU (nvcc) in
scripts/gpu_check.sh. Each kernel is checked against plain C++ loops that compute the
same thing directly from the CUDA rules.

Built-in mutation checks (`make test` builds the backend three times with
-DHOSTCUDA_MUTATION_{SYNCTHREADS_NOOP,SHFL_WRONG_LANE,ATOMICS_NONATOMIC}) require that
this binary FAILS against a broken backend: syncthreads_* fail without barriers,
shuffle_* fail when a shuffle reads the wrong lane, atomics_* fail when the read-modify-
write is not atomic.

Usage: test_backend [name-filter]
*/
#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "llmc/kernels/async_copy.cuh"
#include "llmc/cuda_common.h"
#include "dev/test/compare.h"
#include "dev/test/testing.h"

static std::vector<float> random_floats(size_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> dist(lo, hi);
    std::vector<float> v(n);
    for (auto& x : v) { x = dist(rng); }
    return v;
}

// ----------------------------------------------------------------------------------------
// indices in 1-3-D grids and blocks

struct ThreadRecord {
    int tx, ty, tz, bx, by, bz, bdx, bdy, bdz, gdx, gdy, gdz;
};

__global__ void record_indices(ThreadRecord* out) {
    int block_linear = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    int thread_linear = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
    int threads_per_block = blockDim.x * blockDim.y * blockDim.z;
    ThreadRecord r = {(int)threadIdx.x, (int)threadIdx.y, (int)threadIdx.z, (int)blockIdx.x, (int)blockIdx.y,
                      (int)blockIdx.z, (int)blockDim.x, (int)blockDim.y, (int)blockDim.z, (int)gridDim.x,
                      (int)gridDim.y, (int)gridDim.z};
    out[block_linear * threads_per_block + thread_linear] = r;
}

TEST_CASE(indices_3d_grid_and_block) {
    dim3 grid(3, 2, 4), block(5, 3, 2);
    int n = 3 * 2 * 4 * 5 * 3 * 2;
    ThreadRecord* d_out = cudaMallocElements(ThreadRecord, n);
    cudaCheck(cudaMemset(d_out, 0xff, n * sizeof(ThreadRecord)));
    LAUNCH(grid, block, 0, 0, record_indices)(d_out);
    cudaCheckLaunch();
    std::vector<ThreadRecord> got = copy_from_device(d_out, n);
    int bad = 0;
    int index = 0;
    for (int bz = 0; bz < 4; bz++) for (int by = 0; by < 2; by++) for (int bx = 0; bx < 3; bx++)
    for (int tz = 0; tz < 2; tz++) for (int ty = 0; ty < 3; ty++) for (int tx = 0; tx < 5; tx++) {
        const ThreadRecord& r = got[index++];
        bool ok = r.tx == tx && r.ty == ty && r.tz == tz && r.bx == bx && r.by == by && r.bz == bz &&
                  r.bdx == 5 && r.bdy == 3 && r.bdz == 2 && r.gdx == 3 && r.gdy == 2 && r.gdz == 4;
        bad += !ok;
    }
    CHECK_EQ(bad, 0);
    cudaCheck(cudaFree(d_out));
}

// ----------------------------------------------------------------------------------------
// __syncthreads with static shared memory: reverse each block's slice, in a loop, from a
// device function. Without a barrier, a thread reads a slot its partner has not written.

__device__ void rotate_in_shared(float* tile, int n, int steps) {
    int t = threadIdx.x;
    for (int s = 0; s < steps; s++) {
        float mine = tile[(t + 1) % n];
        __syncthreads();  // everyone has read before anyone overwrites
        tile[t] = mine;
        __syncthreads();  // everyone has written before the next round reads
    }
}

__global__ void reverse_and_rotate(const float* in, float* out, int steps) {
    __shared__ float tile[256];
    int n = blockDim.x;
    int t = threadIdx.x;
    tile[t] = in[blockIdx.x * n + t];
    __syncthreads();
    float reversed = tile[n - 1 - t];
    __syncthreads();
    tile[t] = reversed;
    __syncthreads();
    rotate_in_shared(tile, n, steps);
    out[blockIdx.x * n + t] = tile[t];
}

TEST_CASE(syncthreads_shared_reverse_rotate) {
    int blocks = 64, n = 256, steps = 5;
    std::vector<float> in = random_floats(blocks * n, 1);
    std::vector<float> expect(blocks * n);
    for (int b = 0; b < blocks; b++) {
        for (int t = 0; t < n; t++) {
            // reversed r[t] = in[n-1-t]; after `steps` rotations by one: r[(t + steps) % n]
            int i = (t + steps) % n;
            expect[b * n + t] = in[b * n + (n - 1 - i)];
        }
    }
    float* d_in = copy_to_device(in);
    float* d_out = cudaMallocElements(float, blocks * n);
    LAUNCH(blocks, n, 0, 0, reverse_and_rotate)(d_in, d_out, steps);
    cudaCheckLaunch();
    std::vector<float> got = copy_from_device(d_out, blocks * n);
    CHECK_CLOSE("out", got.data(), expect.data(), got.size(), 0.0, 0.0);
    cudaCheck(cudaFree(d_in));
    cudaCheck(cudaFree(d_out));
}

// Tree reduction in shared memory, with threads that exit early (before the barriers) in
// the last block, which the barrier must not wait for.
__global__ void block_sum_tree(const float* in, float* block_sums, int n) {
    __shared__ double partial[512];
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    partial[threadIdx.x] = 0.0;
    __syncthreads();
    if (i >= n) { return; }
    partial[threadIdx.x] = in[i];
    __syncthreads();
    for (int stride = blockDim.x / 2; stride > 0; stride /= 2) {
        if ((int)threadIdx.x < stride && i + stride < n) { partial[threadIdx.x] += partial[threadIdx.x + stride]; }
        __syncthreads();
    }
    if (threadIdx.x == 0) { block_sums[blockIdx.x] = (float)partial[0]; }
}

TEST_CASE(syncthreads_tree_reduction_with_exited_threads) {
    int n = 10000, block = 512, blocks = CEIL_DIV(n, block);
    // small integers: every summation order gives the exact same float
    std::vector<float> in(n);
    for (int i = 0; i < n; i++) { in[i] = (float)((i * 7919) % 13 - 6); }
    std::vector<float> expect(blocks, 0.0f);
    for (int i = 0; i < n; i++) { expect[i / block] += in[i]; }
    float* d_in = copy_to_device(in);
    float* d_sums = cudaMallocElements(float, blocks);
    LAUNCH(blocks, block, 0, 0, block_sum_tree)(d_in, d_sums, n);
    cudaCheckLaunch();
    std::vector<float> got = copy_from_device(d_sums, blocks);
    CHECK_CLOSE("block_sums", got.data(), expect.data(), blocks, 0.0, 0.0);
    cudaCheck(cudaFree(d_in));
    cudaCheck(cudaFree(d_sums));
}

__global__ void syncthreads_predicates(const int* flags, int* out) {
    int f = flags[blockIdx.x * blockDim.x + threadIdx.x];
    int count = __syncthreads_count(f);
    int all = __syncthreads_and(f);
    int any = __syncthreads_or(f);
    if (threadIdx.x == 0) {
        out[3 * blockIdx.x + 0] = count;
        out[3 * blockIdx.x + 1] = all;
        out[3 * blockIdx.x + 2] = any;
    }
}

TEST_CASE(syncthreads_count_and_or) {
    int blocks = 4, n = 96;
    std::vector<int> flags(blocks * n, 0);
    for (int t = 0; t < n; t++) {
        flags[0 * n + t] = 0;                // none
        flags[1 * n + t] = 1;                // all
        flags[2 * n + t] = (t % 3 == 0);     // some
        flags[3 * n + t] = (t == n - 1);     // only the last
    }
    std::vector<int> expect;
    for (int b = 0; b < blocks; b++) {
        int c = 0;
        for (int t = 0; t < n; t++) { c += flags[b * n + t] != 0; }
        expect.push_back(c);
        expect.push_back(c == n);
        expect.push_back(c > 0);
    }
    int* d_flags = copy_to_device(flags);
    int* d_out = cudaMallocElements(int, 3 * blocks);
    LAUNCH(blocks, n, 0, 0, syncthreads_predicates)(d_flags, d_out);
    cudaCheckLaunch();
    std::vector<int> got = copy_from_device(d_out, 3 * blocks);
    CHECK_CLOSE("count/and/or", got.data(), expect.data(), got.size(), 0.0, 0.0);
    cudaCheck(cudaFree(d_flags));
    cudaCheck(cudaFree(d_out));
}

// ----------------------------------------------------------------------------------------
// dynamic shared memory: a block transposes a rows x cols tile through shared memory

template <typename T, int kRows>
__global__ void transpose_tiles(const T* in, T* out, int cols) {
    T* tile = dynamic_shared_memory<T>();
    const T* src = in + (size_t)blockIdx.x * kRows * cols;
    T* dst = out + (size_t)blockIdx.x * kRows * cols;
    for (int i = threadIdx.x; i < kRows * cols; i += blockDim.x) { tile[i] = src[i]; }
    __syncthreads();
    for (int i = threadIdx.x; i < kRows * cols; i += blockDim.x) {
        int c = i / kRows, r = i % kRows;
        dst[i] = tile[r * cols + c];
    }
}

TEST_CASE(dynamic_shared_memory_and_its_limit) {
    constexpr int rows = 64;
    int cols = 200, blocks = 6;  // 64 x 200 floats = 51200 bytes: above the 48 KiB default
    size_t smem = rows * cols * sizeof(float);
    std::vector<float> in = random_floats((size_t)blocks * rows * cols, 2);
    std::vector<float> expect(in.size());
    for (int b = 0; b < blocks; b++)
        for (int r = 0; r < rows; r++)
            for (int c = 0; c < cols; c++) expect[(size_t)b * rows * cols + c * rows + r] = in[(size_t)b * rows * cols + r * cols + c];
    float* d_in = copy_to_device(in);
    float* d_out = cudaMallocElements(float, in.size());

    // without raising the limit the launch must be refused, as on the GPU
    (void)cudaGetLastError();
    LAUNCH(blocks, 128, smem, 0, transpose_tiles<float, rows>)(d_in, d_out, cols);
    CHECK(cudaGetLastError() != cudaSuccess);

    cudaCheck(cudaFuncSetAttribute(transpose_tiles<float, rows>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    LAUNCH(blocks, 128, smem, 0, transpose_tiles<float, rows>)(d_in, d_out, cols);
    cudaCheckLaunch();
    std::vector<float> got = copy_from_device(d_out, in.size());
    CHECK_CLOSE("transposed", got.data(), expect.data(), got.size(), 0.0, 0.0);
    cudaCheck(cudaFree(d_in));
    cudaCheck(cudaFree(d_out));
}

TEST_CASE(invalid_launch_configuration_is_reported) {
    float* d_x = cudaMallocElements(float, 1);
    (void)cudaGetLastError();
    LAUNCH(1, 2048, 0, 0, transpose_tiles<float, 1>)(d_x, d_x, 1);  // 2048 threads > 1024
    CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration);
    CHECK(cudaGetLastError() == cudaSuccess);  // reading the error clears it
    cudaCheck(cudaFree(d_x));
}

// ----------------------------------------------------------------------------------------
// warp shuffles and votes. Each lane starts from a distinct value, so a result read from
// the wrong lane cannot pass.

// mode: 0 = shfl (broadcast from `arg`), 1 = xor, 2 = down, 3 = up
template <typename T>
__global__ void shuffle_kernel(const T* in, T* out, int mode, int arg, int width) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    T v = in[i];
    T r;
    if (mode == 0) r = __shfl_sync(0xffffffffu, v, arg, width);
    else if (mode == 1) r = __shfl_xor_sync(0xffffffffu, v, arg, width);
    else if (mode == 2) r = __shfl_down_sync(0xffffffffu, v, arg, width);
    else r = __shfl_up_sync(0xffffffffu, v, arg, width);
    out[i] = r;
}

// The source lane of each lane by the CUDA programming guide's rules.
static int expected_source_lane(int lane, int mode, int arg, int width) {
    int segment_start = lane - lane % width;
    switch (mode) {
        case 0: return segment_start + arg % width;
        case 1: { int src = lane ^ arg; return src >= segment_start + width ? lane : src; }
        case 2: return lane % width + arg < width ? lane + arg : lane;
        default: return lane % width >= arg ? lane - arg : lane;
    }
}

template <typename T>
static void check_shuffles(const char* type_name) {
    int n = 4 * 64;  // 4 blocks of 64 threads: two warps each
    std::vector<T> in(n);
    for (int i = 0; i < n; i++) { in[i] = (T)(i * 3 + 1); }
    T* d_in = copy_to_device(in);
    T* d_out = cudaMallocElements(T, n);
    struct Case { int mode, arg, width; };
    std::vector<Case> cases = {{0, 0, 32}, {0, 31, 32}, {0, 5, 8},  {1, 1, 32}, {1, 16, 32}, {1, 3, 32},
                               {1, 4, 8},  {1, 8, 8},   {2, 1, 32}, {2, 7, 32}, {2, 3, 16}, {3, 1, 32},
                               {3, 5, 16}, {3, 2, 4}};
    for (const Case& c : cases) {
        LAUNCH(4, 64, 0, 0, shuffle_kernel<T>)(d_in, d_out, c.mode, c.arg, c.width);
        cudaCheckLaunch();
        std::vector<T> got = copy_from_device(d_out, n);
        std::vector<T> expect(n);
        for (int i = 0; i < n; i++) {
            int lane = i % 32;
            expect[i] = in[i - lane + expected_source_lane(lane, c.mode, c.arg, c.width)];
        }
        char what[96];
        snprintf(what, sizeof(what), "%s mode %d arg %d width %d", type_name, c.mode, c.arg, c.width);
        CHECK_CLOSE(what, got.data(), expect.data(), n, 0.0, 0.0);
    }
    cudaCheck(cudaFree(d_in));
    cudaCheck(cudaFree(d_out));
}

TEST_CASE(shuffle_all_kinds_int_float_double) {
    check_shuffles<int>("int");
    check_shuffles<float>("float");
    check_shuffles<double>("double");
}

__global__ void warp_reduce_kernel(const float* in, float* sums, float* maxes) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    float s = warp_reduce_sum(in[i]);
    float m = warp_reduce_max(in[i]);
    if (threadIdx.x % 32 == 0) {
        sums[i / 32] = s;
        maxes[i / 32] = m;
    }
}

TEST_CASE(shuffle_warp_reductions) {
    int n = 8 * 128;
    std::vector<float> in(n);
    for (int i = 0; i < n; i++) { in[i] = (float)((i * 37) % 101 - 50); }  // exact in any order
    std::vector<float> sums(n / 32, 0.0f), maxes(n / 32, -1e30f);
    for (int i = 0; i < n; i++) {
        sums[i / 32] += in[i];
        maxes[i / 32] = std::max(maxes[i / 32], in[i]);
    }
    float* d_in = copy_to_device(in);
    float* d_sums = cudaMallocElements(float, n / 32);
    float* d_maxes = cudaMallocElements(float, n / 32);
    LAUNCH(8, 128, 0, 0, warp_reduce_kernel)(d_in, d_sums, d_maxes);
    cudaCheckLaunch();
    std::vector<float> got_sums = copy_from_device(d_sums, n / 32), got_maxes = copy_from_device(d_maxes, n / 32);
    CHECK_CLOSE("sums", got_sums.data(), sums.data(), sums.size(), 0.0, 0.0);
    CHECK_CLOSE("maxes", got_maxes.data(), maxes.data(), maxes.size(), 0.0, 0.0);
    cudaCheck(cudaFree(d_in));
    cudaCheck(cudaFree(d_sums));
    cudaCheck(cudaFree(d_maxes));
}

// bf16 travels through a shuffle bit-exactly
__global__ void shuffle_bf16_kernel(const __nv_bfloat16* in, __nv_bfloat16* out) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    out[i] = __shfl_xor_sync(0xffffffffu, in[i], 5);
}

TEST_CASE(shuffle_bf16) {
    int n = 64;
    std::vector<__nv_bfloat16> in(n);
    for (int i = 0; i < n; i++) { in[i] = __float2bfloat16((float)i * 0.37f - 3.0f); }
    __nv_bfloat16* d_in = copy_to_device(in);
    __nv_bfloat16* d_out = cudaMallocElements(__nv_bfloat16, n);
    LAUNCH(1, n, 0, 0, shuffle_bf16_kernel)(d_in, d_out);
    cudaCheckLaunch();
    std::vector<__nv_bfloat16> got = copy_from_device(d_out, n);
    int bad = 0;
    for (int i = 0; i < n; i++) {
        int src = (i - i % 32) + ((i % 32) ^ 5);
        bad += memcmp(&got[i], &in[src], sizeof(__nv_bfloat16)) != 0;
    }
    CHECK_EQ(bad, 0);
    cudaCheck(cudaFree(d_in));
    cudaCheck(cudaFree(d_out));
}

// Votes in a block of 48 threads: the second warp has 16 lanes.
__global__ void vote_kernel(const int* pred, unsigned* ballot, int* all, int* any, unsigned* active) {
    int i = threadIdx.x;
    unsigned b = __ballot_sync(__activemask(), pred[i]);
    int a = __all_sync(__activemask(), pred[i]);
    int y = __any_sync(__activemask(), pred[i]);
    __syncwarp();
    if (i % 32 == 0) {
        ballot[i / 32] = b;
        all[i / 32] = a;
        any[i / 32] = y;
        active[i / 32] = __activemask();
    }
}

TEST_CASE(shuffle_votes_in_a_partial_warp) {
    int n = 48;
    std::vector<int> pred(n);
    for (int i = 0; i < n; i++) { pred[i] = (i % 5 == 0) || i >= 32; }  // warp 1: all true
    unsigned expect_ballot[2] = {0, 0};
    for (int i = 0; i < n; i++) { if (pred[i]) expect_ballot[i / 32] |= 1u << (i % 32); }
    unsigned expect_active[2] = {0xffffffffu, 0x0000ffffu};
    int* d_pred = copy_to_device(pred);
    unsigned* d_ballot = cudaMallocElements(unsigned, 2);
    unsigned* d_active = cudaMallocElements(unsigned, 2);
    int* d_all = cudaMallocElements(int, 2);
    int* d_any = cudaMallocElements(int, 2);
    LAUNCH(1, n, 0, 0, vote_kernel)(d_pred, d_ballot, d_all, d_any, d_active);
    cudaCheckLaunch();
    std::vector<unsigned> ballot = copy_from_device(d_ballot, 2), active = copy_from_device(d_active, 2);
    std::vector<int> all = copy_from_device(d_all, 2), any = copy_from_device(d_any, 2);
    for (int w = 0; w < 2; w++) {
        CHECK_EQ(ballot[w], expect_ballot[w]);
        CHECK_EQ(active[w], expect_active[w]);
        CHECK_EQ(all[w] != 0, expect_ballot[w] == expect_active[w]);
        CHECK_EQ(any[w] != 0, expect_ballot[w] != 0);
    }
    cudaCheck(cudaFree(d_pred));
    cudaCheck(cudaFree(d_ballot));
    cudaCheck(cudaFree(d_active));
    cudaCheck(cudaFree(d_all));
    cudaCheck(cudaFree(d_any));
}

// ----------------------------------------------------------------------------------------
// atomics contended across blocks: every thread of every block hits a few counters

__global__ void contended_atomics(int* counts, float* fsums, unsigned long long* wide, int* max_seen,
                                  int* exchanges, int iters) {
    int gid = blockIdx.x * blockDim.x + threadIdx.x;
    for (int k = 0; k < iters; k++) {
        atomicAdd(&counts[(gid + k) % 4], 1);
        atomicAdd(&fsums[k % 2], 1.0f);
        atomicAdd(wide, 3ull);
    }
    atomicMax(max_seen, gid);
    atomicAdd(&exchanges[atomicExch(&exchanges[64], gid) % 64], 0);  // exercises atomicExch
}

// A CAS loop from the CUDA guide's pattern: each thread adds its index to a counter.
__global__ void cas_accumulate(int* total) {
    int add = blockIdx.x * blockDim.x + threadIdx.x;
    int old = *total, assumed;
    do {
        assumed = old;
        old = atomicCAS(total, assumed, assumed + add);
    } while (assumed != old);
}

TEST_CASE(atomics_contended_across_blocks) {
    int blocks = 512, threads = 256, iters = 16;
    long total = (long)blocks * threads;
    int* d_counts = cudaMallocElements(int, 4);
    float* d_fsums = cudaMallocElements(float, 2);
    unsigned long long* d_wide = cudaMallocElements(unsigned long long, 1);
    int* d_max = cudaMallocElements(int, 1);
    int* d_exch = cudaMallocElements(int, 65);
    cudaCheck(cudaMemset(d_counts, 0, 4 * sizeof(int)));
    cudaCheck(cudaMemset(d_fsums, 0, 2 * sizeof(float)));
    cudaCheck(cudaMemset(d_wide, 0, sizeof(unsigned long long)));
    cudaCheck(cudaMemset(d_exch, 0, 65 * sizeof(int)));
    std::vector<int> minus_one = {-1};
    cudaCheck(cudaMemcpy(d_max, minus_one.data(), sizeof(int), cudaMemcpyHostToDevice));
    LAUNCH(blocks, threads, 0, 0, contended_atomics)(d_counts, d_fsums, d_wide, d_max, d_exch, iters);
    cudaCheckLaunch();
    std::vector<int> counts = copy_from_device(d_counts, 4);
    std::vector<float> fsums = copy_from_device(d_fsums, 2);
    std::vector<unsigned long long> wide = copy_from_device(d_wide, 1);
    std::vector<int> max_seen = copy_from_device(d_max, 1);
    // each thread adds to 4 consecutive counters iters/4 times each: total*iters/4 per counter
    for (int c = 0; c < 4; c++) { CHECK_EQ((long)counts[c], total * iters / 4); }
    // float sums stay below 2^24, so every addition is exact
    for (int c = 0; c < 2; c++) { CHECK_EQ((double)fsums[c], (double)(total * iters / 2)); }
    CHECK_EQ(wide[0], (unsigned long long)(3 * total * iters));
    CHECK_EQ(max_seen[0], (int)(total - 1));

    int* d_total = cudaMallocElements(int, 1);
    cudaCheck(cudaMemset(d_total, 0, sizeof(int)));
    LAUNCH(64, 128, 0, 0, cas_accumulate)(d_total);
    cudaCheckLaunch();
    std::vector<int> cas_total = copy_from_device(d_total, 1);
    CHECK_EQ(cas_total[0], 64 * 128 * (64 * 128 - 1) / 2);
    cudaCheck(cudaFree(d_counts));
    cudaCheck(cudaFree(d_fsums));
    cudaCheck(cudaFree(d_wide));
    cudaCheck(cudaFree(d_max));
    cudaCheck(cudaFree(d_exch));
    cudaCheck(cudaFree(d_total));
}

// ----------------------------------------------------------------------------------------
// bf16: conversions (round to nearest even) and arithmetic, against an exact reference

// The bf16 nearest to x (ties to even), found by comparing the two neighbours in double.
static uint16_t reference_bf16_bits(float x) {
    uint32_t bits;
    memcpy(&bits, &x, 4);
    uint16_t down = (uint16_t)(bits >> 16);  // truncation toward zero
    uint16_t up = (uint16_t)(down + 1);      // next magnitude up
    uint32_t down32 = (uint32_t)down << 16, up32 = (uint32_t)up << 16;
    float fd, fu;
    memcpy(&fd, &down32, 4);
    memcpy(&fu, &up32, 4);
    if ((bits & 0xffffu) == 0) { return down; }
    double dd = std::fabs((double)x - (double)fd), du = std::fabs((double)fu - (double)x);
    if (dd < du) { return down; }
    if (du < dd) { return up; }
    return (down & 1) ? up : down;
}

__global__ void bf16_convert(const float* in, __nv_bfloat16* out, float* back, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        out[i] = __float2bfloat16(in[i]);
        back[i] = __bfloat162float(out[i]);
    }
}

__global__ void bf16_arith(const __nv_bfloat16* a, const __nv_bfloat16* b, __nv_bfloat16* sum,
                           __nv_bfloat16* prod, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        sum[i] = __hadd(a[i], b[i]);
        prod[i] = __hmul(a[i], b[i]);
    }
}

#if HOST_BACKEND
// hostcuda::vector_expf (the classifier's exp on the host): within 2 ulp of exp in double for
// every 61st float whose result is a normal float (~37 million of them; all 2.2 billion were
// checked once, 1.02 ulp at worst), and the edges its comment promises.
TEST_CASE(vector_expf_normal_results) {
    double worst_ulps = 0.0;
    float worst_x = 0.0f;
    uint32_t first, last;
    float lo = -87.33f, hi = 88.72f;
    memcpy(&first, &lo, 4);  // negative floats: larger bit patterns are further from zero
    memcpy(&last, &hi, 4);
    std::vector<float> xs;
    for (uint32_t bits = first; bits > 0x80000000u; bits -= 61) { xs.push_back(__uint_as_float(bits)); }
    for (uint32_t bits = 0; bits <= last; bits += 61) { xs.push_back(__uint_as_float(bits)); }
    for (float x : xs) {
        double exact = std::exp((double)x);
        double ulp = std::ldexp(1.0, std::ilogb(exact) - 23);
        double ulps = std::fabs((double)hostcuda::vector_expf(x) - exact) / ulp;
        if (!(ulps <= worst_ulps)) {
            worst_ulps = ulps;
            worst_x = x;
        }
    }
    if (!(worst_ulps <= 2.0)) { fprintf(stderr, "  vector_expf(%.9g): %.3f ulp\n", (double)worst_x, worst_ulps); }
    CHECK(worst_ulps <= 2.0);
    CHECK(std::isnan(hostcuda::vector_expf(NAN)));
    CHECK_EQ(hostcuda::vector_expf(-INFINITY), 0.0f);
    CHECK_EQ(hostcuda::vector_expf(-100.0f), 0.0f);  // subnormal results flush to 0
    CHECK_EQ(hostcuda::vector_expf(0.0f), 1.0f);
    CHECK(std::isinf(hostcuda::vector_expf(88.73f)) && std::isinf(hostcuda::vector_expf(INFINITY)));
    CHECK(std::isfinite(hostcuda::vector_expf(88.72f)));
}
#endif

TEST_CASE(bf16_conversion_and_arithmetic) {
    // finite floats of many magnitudes, plus exact ties in both parities
    std::vector<float> in = random_floats(20000, 3, -1e4f, 1e4f);
    std::vector<float> small = random_floats(5000, 4, -1e-3f, 1e-3f);
    in.insert(in.end(), small.begin(), small.end());
    for (uint32_t m : {0x3f808000u, 0x3f818000u, 0xbf808000u, 0x40490fdbu, 0x00000001u, 0x7f7f0000u}) {
        float f;
        memcpy(&f, &m, 4);
        in.push_back(f);
    }
    int n = (int)in.size();
    float* d_in = copy_to_device(in);
    __nv_bfloat16* d_out = cudaMallocElements(__nv_bfloat16, n);
    float* d_back = cudaMallocElements(float, n);
    LAUNCH(CEIL_DIV(n, 256), 256, 0, 0, bf16_convert)(d_in, d_out, d_back, n);
    cudaCheckLaunch();
    std::vector<__nv_bfloat16> out = copy_from_device(d_out, n);
    std::vector<float> back = copy_from_device(d_back, n);
    int bad = 0;
    for (int i = 0; i < n; i++) {
        uint16_t got;
        memcpy(&got, &out[i], 2);
        uint32_t widened = (uint32_t)got << 16;
        float w;
        memcpy(&w, &widened, 4);
        bad += got != reference_bf16_bits(in[i]) || w != back[i];
    }
    CHECK_EQ(bad, 0);

    // sums and products: computed in float, rounded once
    std::vector<__nv_bfloat16> a(n / 2), b(n / 2);
    for (int i = 0; i < n / 2; i++) { a[i] = out[i]; b[i] = out[n / 2 + i]; }
    __nv_bfloat16* d_a = copy_to_device(a);
    __nv_bfloat16* d_b = copy_to_device(b);
    __nv_bfloat16* d_sum = cudaMallocElements(__nv_bfloat16, n / 2);
    __nv_bfloat16* d_prod = cudaMallocElements(__nv_bfloat16, n / 2);
    LAUNCH(CEIL_DIV(n / 2, 256), 256, 0, 0, bf16_arith)(d_a, d_b, d_sum, d_prod, n / 2);
    cudaCheckLaunch();
    std::vector<__nv_bfloat16> sum = copy_from_device(d_sum, n / 2), prod = copy_from_device(d_prod, n / 2);
    bad = 0;
    for (int i = 0; i < n / 2; i++) {
        float fa = back[i], fb = back[n / 2 + i];
        uint16_t s, p;
        memcpy(&s, &sum[i], 2);
        memcpy(&p, &prod[i], 2);
        bad += s != reference_bf16_bits(fa + fb) || p != reference_bf16_bits(fa * fb);
    }
    CHECK_EQ(bad, 0);
    for (void* p : {(void*)d_in, (void*)d_out, (void*)d_back, (void*)d_a, (void*)d_b, (void*)d_sum, (void*)d_prod}) {
        cudaCheck(cudaFree(p));
    }
}

// ----------------------------------------------------------------------------------------
// 128-bit packed loads/stores, cache-hint intrinsics and fast math, with a templated
// kernel whose template arguments contain a comma (the LAUNCH macro must cope)

template <typename T, int kScale>
__global__ void packed_scale(const T* in, T* out, float* rs, int n) {
    int i = (blockIdx.x * blockDim.x + threadIdx.x) * Packed128<T>::size;
    if (i >= n) { return; }
    Packed128<T> v = load128cs(in + i);
    Packed128<T> r;
    for (int k = 0; k < Packed128<T>::size; k++) {
        r[k] = from_float<T>(to_float(v[k]) * kScale);
        rs[i + k] = rsqrtf(fabsf(to_float(v[k])) + 1.0f) + __expf(-fabsf(to_float(v[k])));
    }
    store128cs(out + i, r);
}

TEST_CASE(packed128_intrinsics_and_template_launch) {
    int n = 4096;
    std::vector<float> in = random_floats(n, 5, -4.0f, 4.0f);
    float* d_in = copy_to_device(in);
    float* d_out = cudaMallocElements(float, n);
    float* d_rs = cudaMallocElements(float, n);
    LAUNCH(CEIL_DIV(n / 4, 128), 128, 0, 0, packed_scale<float, 3>)(d_in, d_out, d_rs, n);
    cudaCheckLaunch();
    std::vector<float> out = copy_from_device(d_out, n), rs = copy_from_device(d_rs, n);
    std::vector<float> expect_out(n), expect_rs(n);
    for (int i = 0; i < n; i++) {
        expect_out[i] = in[i] * 3;
        expect_rs[i] = (float)(1.0 / std::sqrt(std::fabs((double)in[i]) + 1.0) + std::exp(-std::fabs((double)in[i])));
    }
    CHECK_CLOSE("scaled", out.data(), expect_out.data(), n, 0.0, 0.0);
    // fast-math intrinsics on the GPU are accurate to a few ulp
    CHECK_CLOSE("rsqrt+exp", rs.data(), expect_rs.data(), n, 1e-6, 1e-5);
    cudaCheck(cudaFree(d_in));
    cudaCheck(cudaFree(d_out));
    cudaCheck(cudaFree(d_rs));
}

// ----------------------------------------------------------------------------------------
// cp.async (llmc/kernels/async_copy.cuh): a double-buffered pipeline that copies tile k + 1 while it
// sums tile k; each thread copies kBytes per tile and reads a word its neighbour copied, so
// a copy that landed late or in the wrong place changes the result.

template <int kBytes>
__global__ void async_copy_pipeline(const float* in, float* out, int tiles) {
    constexpr int per = kBytes / 4;  // floats per thread per tile
    float* buf = dynamic_shared_memory<float>();  // [2][blockDim.x * per]
    int n = blockDim.x, t = threadIdx.x, m = n * per;
    const float* src = in + (size_t)blockIdx.x * tiles * m;
    cp_async<kBytes>(&buf[t * per], &src[t * per]);
    cp_async_commit_group();
    float acc = 0.0f;
    for (int k = 0; k < tiles; k++) {
        if (k + 1 < tiles) { cp_async<kBytes>(&buf[((k + 1) & 1) * m + t * per], &src[(size_t)(k + 1) * m + t * per]); }
        cp_async_commit_group();   // (possibly empty: groups stay in step)
        cp_async_wait_group<1>();  // this thread's copies of tile k have landed
        __syncthreads();           // and everyone's
        acc += buf[(k & 1) * m + (t * per + per) % m] * (float)(k + 1);
        __syncthreads();           // tile k is read before its buffer takes tile k + 2
    }
    cp_async_wait_all();
    out[blockIdx.x * n + t] = acc;
}

template <int kBytes>
static void check_async_copy_pipeline() {
    constexpr int per = kBytes / 4;
    int blocks = 3, n = 64, tiles = 5, m = n * per;
    std::vector<float> in((size_t)blocks * tiles * m);
    for (size_t i = 0; i < in.size(); i++) { in[i] = (float)(i % 1000) * 0.25f; }  // exact sums
    std::vector<float> expect((size_t)blocks * n, 0.0f);
    for (int b = 0; b < blocks; b++)
        for (int t = 0; t < n; t++)
            for (int k = 0; k < tiles; k++)
                expect[b * n + t] += in[((size_t)b * tiles + k) * m + (t * per + per) % m] * (float)(k + 1);
    float* d_in = copy_to_device(in);
    float* d_out = cudaMallocElements(float, expect.size());
    LAUNCH(blocks, n, 2 * m * sizeof(float), 0, async_copy_pipeline<kBytes>)(d_in, d_out, tiles);
    cudaCheckLaunch();
    std::vector<float> got = copy_from_device(d_out, expect.size());
    char what[32];
    snprintf(what, sizeof(what), "cp.async %d bytes", kBytes);
    CHECK_CLOSE(what, got.data(), expect.data(), got.size(), 0.0, 0.0);
    cudaCheck(cudaFree(d_in));
    cudaCheck(cudaFree(d_out));
}

TEST_CASE(async_copy_double_buffered_pipeline) {
    check_async_copy_pipeline<4>();
    check_async_copy_pipeline<8>();
    check_async_copy_pipeline<16>();
}

// ----------------------------------------------------------------------------------------
// events time the work between them

TEST_CASE(events_measure_elapsed_time) {
    cudaEvent_t start, stop;
    cudaCheck(cudaEventCreate(&start));
    cudaCheck(cudaEventCreate(&stop));
    int n = 1 << 16;
    float* d_x = cudaMallocElements(float, n);
    cudaCheck(cudaMemset(d_x, 0, n * sizeof(float)));
    float* d_y = cudaMallocElements(float, n);
    float* d_r = cudaMallocElements(float, n);
    cudaCheck(cudaEventRecord(start));
    LAUNCH(CEIL_DIV(n / 4, 256), 256, 0, 0, packed_scale<float, 2>)(d_x, d_y, d_r, n);
    cudaCheck(cudaEventRecord(stop));
    cudaCheck(cudaEventSynchronize(stop));
    float ms = -1.0f;
    cudaCheck(cudaEventElapsedTime(&ms, start, stop));
    CHECK(ms > 0.0f && ms < 10000.0f);
    cudaCheck(cudaEventDestroy(start));
    cudaCheck(cudaEventDestroy(stop));
    cudaCheck(cudaFree(d_x));
    cudaCheck(cudaFree(d_y));
    cudaCheck(cudaFree(d_r));
}

// ----------------------------------------------------------------------------------------
// the start-up card check (llmc/card_check.h): which image runs, and what it says

#if HOST_BACKEND
// The driver's choice, emulated (hostcuda::select_image), against the compatibility rules of the
// CUDA Programming Guide worked out by hand: machine code for X.Y runs on X.Z, Z >= Y, and is
// preferred; the PTX of the newest arch is compiled for any newer card; an 'a' arch on itself only.
TEST_CASE(card_check_image_selection) {
    struct Case { int device; const char* archs; int code; };
    const Case cases[] = {
        {80, "90", 0},       // an sm_90 build on an A100: nothing runs
        {86, "80", 80},      // sm_80 machine code on an sm_86
        {89, "80 86", 86},   // the newest machine code of the card's major
        {90, "80", 80},      // no sm_9x machine code: the compute_80 PTX, compiled at start
        {120, "90", 90},     // a card newer than the build: the PTX
        {75, "75", 75},      {90, "75", 75},   // a T4 build on an H100: compute_75 PTX (trap stubs)
        {80, "86", 0},       // sm_86 code needs 8.6 or newer of major 8; compute_86 PTX too
        {75, "80 90", 0},    // a T4 and an sm_80+ build
        {90, "90a", 90},     {100, "90a", 0},  // arch-specific code: that card alone
        {100, "80 90a", 0},  // the PTX is compute_90a: sm_90 alone
        {121, "120", 120},   {90, "80 86 89 90", 90},
    };
    for (const Case& c : cases) {
        int got = hostcuda::select_image(c.device, c.archs);
        if (got != c.code) {
            CHECK_EQ(got, c.code);
            fprintf(stderr, "    (device sm_%d, GPU_ARCHS \"%s\")\n", c.device, c.archs);
        }
    }
    for (const char* bad : {"", "9", "80x", "1000", "80,90", "a"}) { CHECK_EQ(hostcuda::select_image(90, bad), -1); }
}
#else
__global__ void code_arch_kernel(int* out) {
#if defined(__CUDA_ARCH__)  // (the device passes of nvcc)
    *out = __CUDA_ARCH__ / 10;
#endif
}
#endif

// What the check saw on this device: on a GPU, the arch the running kernels were compiled for
// (a kernel's __CUDA_ARCH__); on the host backend the emulated card's (no HOSTCUDA_GPU_ARCHS).
TEST_CASE(card_check_sees_the_running_code) {
    int id = 0, major = 0, minor = 0;
    cudaCheck(cudaGetDevice(&id));
    cudaCheck(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, id));
    cudaCheck(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, id));
    CHECK_EQ(card_facts().device_arch, 10 * major + minor);
#if HOST_BACKEND
    if (hostcuda::emulated_build_archs() == nullptr) { CHECK_EQ(card_code_arch(), 10 * major + minor); }
#else
    int* d_arch = cudaMallocElements(int, 1);
    LAUNCH(1, 1, 0, 0, code_arch_kernel)(d_arch);
    cudaCheckLaunch();
    CHECK_EQ(copy_from_device(d_arch, 1)[0], card_code_arch());
    cudaCheck(cudaFree(d_arch));
#endif
}

// The refusal and the warnings name the card, the build's archs and the make line to run.
TEST_CASE(card_check_messages) {
    auto has = [](const std::string& text, const std::string& part) {
        bool found = text.find(part) != std::string::npos;
        if (!found) { fprintf(stderr, "    '%s' lacks '%s'\n", text.c_str(), part.c_str()); }
        return found;
    };
    CardFacts a100{"NVIDIA A100-SXM4-80GB", 80, 0, "90"};
    std::string refusal = card_refusal(a100);
    CHECK(has(refusal, "GPU_ARCHS=\"90\" only; the GPU is NVIDIA A100-SXM4-80GB (sm_80)"));
    CHECK(has(refusal, "`make GPU_ARCHS=80`") && has(refusal, "GPU_ARCHS=\"90 80\" builds for both"));
    CHECK(refusal.find('\n') == std::string::npos);
    CHECK(card_warning(a100, true).empty());

    CardFacts h100{"NVIDIA H100 80GB HBM3", 90, 90, "90"};
    CHECK(card_refusal(h100).empty() && card_warning(h100, true).empty() && card_warning(h100, false).empty());

    CardFacts stubs{"NVIDIA H100 80GB HBM3", 90, 75, "75"};
    CHECK(card_refusal(stubs).empty());
    CHECK(has(card_warning(stubs, true), "(sm_90), is compute_75 (GPU_ARCHS=\"75\")"));
    CHECK(has(card_warning(stubs, true), "`make GPU_ARCHS=90` builds them"));
    CHECK(card_warning(stubs, false).empty());  // (fp32 runs the scalar attention on every card)

    CardFacts t4{"Tesla T4", 75, 75, "75"};
    CHECK(card_refusal(t4).empty());
    CHECK(has(card_warning(t4, true), "Tesla T4 (sm_75), older than sm_80"));
    CHECK(has(card_warning(t4, true), "scalar kernels") && has(card_warning(t4, true), "GEMMs run without tensor cores"));
    CHECK(card_warning(t4, false).empty());
}

TEST_MAIN()
