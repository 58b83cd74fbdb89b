/*
Measures what the executor costs, so that the speed of a CPU training run can be
understood and the host backend tuned (doc/host-backend.md records the figures):

  launch        an empty kernel, 1 block of 1 thread: fixed cost per launch
  thread        an elementwise kernel without barriers: cost per GPU thread
  barrier       256-thread blocks doing 64 __syncthreads: cost per thread per barrier,
                which on the host backend is one fiber switch in and one out
  shuffle       warp_reduce_sum (5 shuffles) per thread: cost per thread per shuffle
  mma           64 mma.sync m16n8k16 per warp (llmc/kernels/mma.cuh): cost per thread per mma, which
                on the host backend is a warp collective plus a 16x8x16 product
  ldmatrix      64 ldmatrix_x4 per warp: cost per thread per ldmatrix
  gemm          the GEMM wrapper, 512 x 768 x 768, fp32 in/out: GFLOP/s

Runs on both executors (`make` builds it as build/host-bf16/backend_overhead and, with
nvcc, build/gpu-bf16/backend_overhead); prints one table.
*/
#include <chrono>

#include "dev/cuda/common.h"
#include "llmc/kernels/gemm.cuh"
#include "llmc/kernels/mma.cuh"

__global__ void empty_kernel() {}

__global__ void axpy_kernel(float* y, const float* x, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) { y[i] += a * x[i]; }
}

__global__ void barrier_kernel(float* out, int rounds) {
    __shared__ float slots[256];
    float v = threadIdx.x;
    for (int r = 0; r < rounds; r++) {
        slots[threadIdx.x] = v;
        __syncthreads();
        v = slots[(threadIdx.x + 1) % blockDim.x];
        __syncthreads();
    }
    out[blockIdx.x * blockDim.x + threadIdx.x] = v;
}

__global__ void shuffle_kernel(float* out) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    out[i] = warp_reduce_sum((float)i);
}

__global__ void mma_kernel(float* out, int rounds) {
    uint32_t a[4] = {threadIdx.x, 1u, 2u, 3u}, b[2] = {4u, threadIdx.x};
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int r = 0; r < rounds; r++) { mma_m16n8k16_bf16(acc, a, b, acc); }
    out[blockIdx.x * blockDim.x + threadIdx.x] = acc[0] + acc[1] + acc[2] + acc[3];
}

__global__ void ldmatrix_kernel(float* out, int rounds) {
    __align__(16) __shared__ __nv_bfloat16 tile[16 * 24];
    for (int i = threadIdx.x; i < 16 * 24; i += blockDim.x) { tile[i] = __float2bfloat16(i); }
    __syncthreads();
    int lane = threadIdx.x % 32;
    uint32_t sum = 0;
    for (int r = 0; r < rounds; r++) {
        uint32_t regs[4];
        ldmatrix_x4(regs, tile + (lane % 16) * 24 + 8 * (lane / 16));
        sum += regs[0] ^ regs[3];
    }
    out[blockIdx.x * blockDim.x + threadIdx.x] = (float)sum;
}

// Wall-clock microseconds per call of fn(), after one warm-up call.
template <typename Fn>
double time_us(int repeats, Fn fn) {
    fn();
    cudaCheck(cudaDeviceSynchronize());
    auto start = std::chrono::steady_clock::now();
    for (int r = 0; r < repeats; r++) { fn(); }
    cudaCheck(cudaDeviceSynchronize());
    auto end = std::chrono::steady_clock::now();
    return std::chrono::duration<double, std::micro>(end - start).count() / repeats;
}

int main() {
    int n = 1 << 20;
    float* d_x = cudaMallocElements(float, n);
    float* d_y = cudaMallocElements(float, n);
    cudaCheck(cudaMemset(d_x, 0, n * sizeof(float)));
    cudaCheck(cudaMemset(d_y, 0, n * sizeof(float)));
    cudaDeviceProp prop;
    cudaCheck(cudaGetDeviceProperties(&prop, 0));
    printf("executor: %s\n", prop.name);
    printf("%-10s %14s %16s  %s\n", "measure", "us per call", "ns per unit", "unit");

    double launch = time_us(2000, [] { LAUNCH(1, 1, 0, 0, empty_kernel)(); });
    printf("%-10s %14.3f %16.1f  %s\n", "launch", launch, launch * 1e3, "launch");

    double thread = time_us(20, [&] { LAUNCH(n / 256, 256, 0, 0, axpy_kernel)(d_y, d_x, 0.5f, n); });
    printf("%-10s %14.1f %16.3f  %s\n", "thread", thread, thread * 1e3 / n, "GPU thread");

    int rounds = 64, barrier_blocks = 64;
    double barrier = time_us(3, [&] { LAUNCH(barrier_blocks, 256, 0, 0, barrier_kernel)(d_y, rounds); });
    double per_wait = barrier * 1e3 / (barrier_blocks * 256.0 * 2 * rounds);
    printf("%-10s %14.1f %16.3f  %s\n", "barrier", barrier, per_wait, "thread x __syncthreads");

    int shuffle_threads = 1 << 16;
    double shuffle = time_us(5, [&] { LAUNCH(shuffle_threads / 256, 256, 0, 0, shuffle_kernel)(d_y); });
    printf("%-10s %14.1f %16.3f  %s\n", "shuffle", shuffle, shuffle * 1e3 / (shuffle_threads * 5.0),
           "thread x shuffle");

    int tc_blocks = 64, tc_rounds = 64;
    double mma = time_us(3, [&] { LAUNCH(tc_blocks, 256, 0, 0, mma_kernel)(d_y, tc_rounds); });
    printf("%-10s %14.1f %16.3f  %s\n", "mma", mma, mma * 1e3 / (tc_blocks * 256.0 * tc_rounds), "thread x mma");
    double ldm = time_us(3, [&] { LAUNCH(tc_blocks, 256, 0, 0, ldmatrix_kernel)(d_y, tc_rounds); });
    printf("%-10s %14.1f %16.3f  %s\n", "ldmatrix", ldm, ldm * 1e3 / (tc_blocks * 256.0 * tc_rounds),
           "thread x ldmatrix_x4");

    int M = 512, N = 768, K = 768;
    float* d_a = cudaMallocElements(float, (size_t)M * K);
    float* d_b = cudaMallocElements(float, (size_t)K * N);
    float* d_c = cudaMallocElements(float, (size_t)M * N);
    cudaCheck(cudaMemset(d_a, 0, (size_t)M * K * sizeof(float)));
    cudaCheck(cudaMemset(d_b, 0, (size_t)K * N * sizeof(float)));
    double gemm_us = time_us(5, [&] { gemm(d_c, d_a, d_b, GemmShape::nt(M, N, K)); });
    printf("%-10s %14.1f %16.2f  %s\n", "gemm", gemm_us, 2.0 * M * N * K / (gemm_us * 1e3), "GFLOP/s (not ns)");

    for (void* p : {(void*)d_x, (void*)d_y, (void*)d_a, (void*)d_b, (void*)d_c}) { cudaCheck(cudaFree(p)); }
    return 0;
}
