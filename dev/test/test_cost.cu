/*
The host backend's cost counts (llmc/hostcuda/cost.h, HOSTCUDA_COST), the yardstick of
dev/cost_model.py, against hand counts: a copy kernel's footprint; a kernel whose every block
reads the whole input (counted once per launch, as a GPU's caches would serve the re-reads); a
GEMM's 2MNK and operand bytes; the attention forward's tensor-core FLOPs, worked out from its
tiling (llmc/kernels/attention_tc.cuh: per 64-row query block, the 64-key tiles up to the
diagonal, 2 products of 2 x 64 x 64 x HD each) and its bytes (q, k, v read, out and lse
written). Host backend only: on a GPU the binary says so and passes nothing off as checked.

Usage: test_cost [name-filter]
*/
#include <cstdlib>
#include <string>
#include <vector>

#include "llmc/cuda_common.h"
#include "llmc/kernels/attention.cuh"
#include "llmc/kernels/gemm.cuh"
#include "dev/test/testing.h"

#if HOST_BACKEND
static hostcuda::CostRecorder::Totals counted(const char* name) { return hostcuda::CostRecorder::instance()->totals_of(name); }
static uint64_t pages(uint64_t bytes) { return (bytes + hostcuda::kCostPage - 1) / hostcuda::kCostPage * hostcuda::kCostPage; }

__global__ void cost_copy_kernel(float* out, const float* in, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) { out[i] = in[i]; }
}
// every block sums the whole input: n reads per block, one footprint
__global__ void cost_sum_all_kernel(float* out, const float* in, int n) {
    if (threadIdx.x != 0) { return; }
    float s = 0.0f;
    for (int i = 0; i < n; i++) { s += in[i]; }
    out[blockIdx.x] = s;
}

TEST_CASE(footprint_of_a_copy_and_of_re_reads) {
    const int n = 3000;  // 12,000 bytes: 3 pages
    std::vector<float> host(n, 1.0f);
    float* in = copy_to_device(host);
    float* out = cudaMallocElements(float, n);
    LAUNCH(CEIL_DIV(n, 128), 128, 0, 0, cost_copy_kernel)(out, in, n);
    cudaCheckLaunch();
    auto copy = counted("cost_copy_kernel");
    CHECK_EQ(copy.launches, 1u);
    CHECK_EQ(copy.read, pages(n * 4));
    CHECK_EQ(copy.written, pages(n * 4));
    CHECK_EQ(copy.tensor_flops, 0u);
    LAUNCH(16, 32, 0, 0, cost_sum_all_kernel)(out, in, n);
    cudaCheckLaunch();
    auto sum = counted("cost_sum_all_kernel");
    CHECK_EQ(sum.read, pages(n * 4));  // not 16 times
    CHECK_EQ(sum.written, pages(16 * 4));
    CHECK_EQ(copy_from_device(out, 16)[15], (float)n);
    cudaFree(in);
    cudaFree(out);
}

TEST_CASE(gemm_flops_and_operands) {
    const int M = 96, N = 64, K = 48;
    std::vector<floatX> a(M * K, from_float<floatX>(0.5f)), b(K * N, from_float<floatX>(0.25f));
    floatX* d_a = copy_to_device(a);
    floatX* d_b = copy_to_device(b);
    floatX* d_c = cudaMallocElements(floatX, M * N);
    const char* name = sizeof(floatX) == 2 ? "gemm (bf16, tensor cores)" : "gemm (fp32)";
    auto before = counted(name);
    gemm(d_c, d_a, d_b, GemmShape::nn(M, N, K), 1.0f, 0.0f, 0);  // C = A B
    gemm(d_c, d_a, d_b, GemmShape::nn(M, N, K), 1.0f, 1.0f, 0);  // C += A B: C read too
    auto after = counted(name);
    uint64_t flops = 2ull * M * N * K, e = sizeof(floatX);
    CHECK_EQ(after.launches - before.launches, 2u);
    CHECK_EQ(after.tensor_flops + after.fma_flops - before.tensor_flops - before.fma_flops, 2 * flops);
    CHECK_EQ((sizeof(floatX) == 2 ? after.tensor_flops - before.tensor_flops : after.fma_flops - before.fma_flops),
             2 * flops);
    CHECK_EQ(after.read - before.read, 2 * (M * K + K * N) * e + M * N * e);
    CHECK_EQ(after.written - before.written, 2 * M * N * e);
    CHECK_EQ(to_float(copy_from_device(d_c, 1)[0]), 2 * K * 0.5f * 0.25f);
    cudaFree(d_a);
    cudaFree(d_b);
    cudaFree(d_c);
}

TEST_CASE(attention_forward_flops_and_bytes) {
    const int B = 2, T = 320, Hq = 4, Hkv = 2, hd = 64;  // 5 query blocks of 64
    AttnShape s{B, T, Hq, Hkv, hd};
    std::vector<floatX> q(B * T * Hq * hd), kv(B * T * Hkv * hd);
    for (size_t i = 0; i < q.size(); i++) { q[i] = from_float<floatX>(0.01f * (i % 97)); }
    for (size_t i = 0; i < kv.size(); i++) { kv[i] = from_float<floatX>(0.02f * (i % 89)); }
    floatX *d_q = copy_to_device(q), *d_k = copy_to_device(kv), *d_v = copy_to_device(kv);
    floatX* d_out = cudaMallocElements(floatX, q.size());
    float* d_lse = cudaMallocElements(float, B * Hq * T);
    attention_tensor_cores() = true;
    attention_forward(s, AttnTensors{d_q, d_k, d_v, d_out, d_lse}, 0);
    cudaCheckLaunch();
    bool tc = PRECISION_MODE == PrecisionMode::BF16;
    auto f = counted(tc ? "attention_forward_tc_kernel<HD>" : "attention_forward_kernel<HD, Tile>");
    CHECK_EQ(f.launches, 1u);
    // query block i sees key tiles 0..i: 1 + 2 + 3 + 4 + 5 = 15 (block, tile) pairs per (b, head);
    // each: S = Q K^T and O += P V, 2 x 64 x 64 x hd FLOPs apiece
    uint64_t flops = 15ull * B * Hq * 2 * (2ull * 64 * 64 * hd);
    CHECK_EQ(f.tensor_flops, tc ? flops : 0u);
    uint64_t e = sizeof(floatX);
    CHECK_EQ(f.read, pages(q.size() * e) + 2 * pages(kv.size() * e));
    CHECK_EQ(f.written, pages(q.size() * e) + pages(B * Hq * T * 4));
    cudaFree(d_q);
    cudaFree(d_k);
    cudaFree(d_v);
    cudaFree(d_out);
    cudaFree(d_lse);
}

int main(int argc, char** argv) {
    // the tests read the counts in memory; the file the recorder writes at exit lies beside the binary
    std::string cost_file = std::string(argv[0]) + ".cost.tsv";
    setenv("HOSTCUDA_COST", cost_file.c_str(), 1);  // (before the first allocation: the recorder starts there)
    return testing::run_all(argv[0], argc > 1 ? argv[1] : nullptr);
}
#else
int main() {
    printf("test_cost: the cost counts are the host backend's (llmc/hostcuda/cost.h); nothing to check on a GPU\n");
    return 0;
}
#endif
