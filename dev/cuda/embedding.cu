/*
Scaled token embedding (llmc/kernels/embedding.cuh), forward and backward:
    out[n, :] = scale * wte[idx[n], :]
    dwte[v, :] += scale * sum over n with idx[n] == v of dout[n, :]
The backward groups positions by token (EmbeddingBuckets: until issue 55 a stable sort on the
host, now a merge sort of (token, position) keys on the device) and sums each group in order,
so it is deterministic without atomics. Token ids repeat a lot here (a small vocabulary), as
in real batches. dev/test/test_embedding.cu checks the buckets against the host's stable sort.

version 1: llmc/kernels/embedding.cuh (forward: one thread per element; backward: one block per
           (token, 256-channel slice))
version 2: the same kernels, the buckets built on the device and the backward's blocks striding
           over them (the count stays on the device)

    ./build/<dir>/embedding
*/
#include "dev/cuda/common.h"
#include "llmc/kernels/embedding.cuh"

int main() {
    int N = HOST_BACKEND ? 512 : 64 * 1024, C = HOST_BACKEND ? 96 : 768, V = 300;
    float scale = std::sqrt((float)C);
    std::vector<float> wte = make_random_float((size_t)V * C, 1), dout = make_random_float((size_t)N * C, 2);
    std::vector<float> dwte_init = make_random_float((size_t)V * C, 3, -0.01f, 0.01f);
    std::vector<int> idx(N);
    for (int n = 0; n < N; n++) { idx[n] = (n * 37 + n / 5) % V; }
    std::vector<floatX> wte_x = convert_vector<floatX>(wte), dout_x = convert_vector<floatX>(dout),
                        dwte_x = convert_vector<floatX>(dwte_init);

    // references from the same (rounded) inputs
    std::vector<float> out_ref((size_t)N * C), dwte_ref((size_t)V * C);
    for (int n = 0; n < N; n++)
        for (int c = 0; c < C; c++) out_ref[(size_t)n * C + c] = scale * to_float(wte_x[(size_t)idx[n] * C + c]);
    std::vector<double> acc((size_t)V * C, 0.0);
    for (int n = 0; n < N; n++)
        for (int c = 0; c < C; c++) acc[(size_t)idx[n] * C + c] += to_float(dout_x[(size_t)n * C + c]);
    for (size_t i = 0; i < acc.size(); i++) { dwte_ref[i] = (float)(to_float(dwte_x[i]) + scale * acc[i]); }

    int* d_idx = copy_to_device(idx);
    floatX* d_wte = copy_to_device(wte_x);
    floatX* d_dout = copy_to_device(dout_x);
    floatX* d_dwte = copy_to_device(dwte_x);
    floatX* d_out = cudaMallocElements(floatX, (size_t)N * C);
    EmbeddingBuckets buckets;
    buckets.build(d_idx, N, 0);
    embedding_forward(d_out, d_idx, d_wte, N, C, scale, 0);
    embedding_backward(d_dwte, d_dout, buckets, C, scale, 0);

    float eps = PRECISION_MODE == PrecisionMode::FP32 ? 1e-5f : 1.0f / 128;
    printf("embedding (%s), N=%d C=%d V=%d\n", PRECISION_NAME, N, C, V);
    bool ok = validate_result(d_out, out_ref.data(), "out", out_ref.size(), 1e-6f, eps);
    // each dwte element sums N/V values of size ~scale: fp32 summation error ~1e-6 of that
    ok &= validate_result(d_dwte, dwte_ref.data(), "dwte", dwte_ref.size(), 1e-3f, eps);
    // deterministic: a second backward from the same start is bit-identical
    std::vector<floatX> first = copy_from_device(d_dwte, dwte_ref.size());
    cudaCheck(cudaMemcpy(d_dwte, dwte_x.data(), dwte_x.size() * sizeof(floatX), cudaMemcpyHostToDevice));
    embedding_backward(d_dwte, d_dout, buckets, C, scale, 0);
    std::vector<floatX> second = copy_from_device(d_dwte, dwte_ref.size());
    bool same = memcmp(first.data(), second.data(), first.size() * sizeof(floatX)) == 0;
    printf("    backward bit-identical on rerun: %s\n", same ? "yes" : "NO");
    ok &= same;
    if (!ok) {
        printf("embedding: VALIDATION FAILED\n");
        return EXIT_FAILURE;
    }
    if (kBenchmarksEnabled) {
        print_table_header();
        float fwd = benchmark_kernel(20, embedding_forward, d_out, d_idx, d_wte, N, C, scale, (cudaStream_t)0);
        print_result_row("embedding_forward", 1, fwd, 2.0 * N * C * sizeof(floatX), fwd);
        float build = benchmark_kernel(20, [&] { buckets.build(d_idx, N, 0); });
        print_result_row("embedding buckets (device)", 2, build, 3.0 * N * sizeof(int) + 16.0 * N, build);
        float bwd = benchmark_kernel(20, embedding_backward, d_dwte, d_dout, std::cref(buckets), C, scale, (cudaStream_t)0);
        print_result_row("embedding_backward", 1, bwd, (double)N * C * sizeof(floatX) + 2.0 * V * C * sizeof(floatX), bwd);
    } else {
        printf("embedding: valid (benchmarks run on a GPU only)\n");
    }
    for (void* p : {(void*)d_idx, (void*)d_wte, (void*)d_dout, (void*)d_dwte, (void*)d_out}) { cudaCheck(cudaFree(p)); }
    return 0;
}
