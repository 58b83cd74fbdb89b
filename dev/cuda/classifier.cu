/*
Fused softmax cross-entropy with z-loss and masked targets (llmc/kernels/classifier.cuh):
per row of fp32 logits (N, Vp), over the first V columns,
    loss = lse - logit[target],  lse_sq = lse^2,
    dlogits = scale * (softmax - onehot(target) + z * 2 * lse * softmax), 0 for masked rows
    and padded columns.

version 1: one thread per row, three plain passes (the baseline)
version 2: llmc/kernels/classifier.cuh, one warp per row with shuffles
and the rows' loss sums on the device (classifier_loss_sums) against the host's sequential sum.

    ./build/<dir>/classifier [version]
*/
#include "dev/cuda/common.h"
#include "llmc/kernels/classifier.cuh"

void classifier_cpu(float* dlogits, float* losses, float* lse_sq, const float* logits, const int* targets, int N, int V,
                    int Vp, float z, float scale) {
    for (int n = 0; n < N; n++) {
        const float* row = logits + (size_t)n * Vp;
        double mx = -INFINITY, sum = 0.0;
        for (int j = 0; j < V; j++) { mx = std::max(mx, (double)row[j]); }
        for (int j = 0; j < V; j++) { sum += std::exp(row[j] - mx); }
        double lse = mx + std::log(sum);
        int t = targets[n];
        losses[n] = t >= 0 ? (float)(lse - row[t]) : 0.0f;
        lse_sq[n] = t >= 0 ? (float)(lse * lse) : 0.0f;
        for (int j = 0; j < Vp; j++) {
            double g = 0.0;
            if (t >= 0 && j < V) {
                double p = std::exp(row[j] - lse);
                g = scale * (p - (j == t) + z * 2.0 * lse * p);
            }
            dlogits[(size_t)n * Vp + j] = (float)g;
        }
    }
}

__global__ void classifier_kernel1(floatX* dlogits, float* losses, float* lse_sq, const float* logits, const int* targets,
                                   int N, int V, int Vp, float z, float scale) {
    int n = blockIdx.x * blockDim.x + threadIdx.x;
    if (n >= N) { return; }
    const float* row = logits + (size_t)n * Vp;
    float mx = -INFINITY, sum = 0.0f;
    for (int j = 0; j < V; j++) { mx = fmaxf(mx, row[j]); }
    for (int j = 0; j < V; j++) { sum += expf(row[j] - mx); }
    float lse = mx + logf(sum);
    int t = targets[n];
    losses[n] = t >= 0 ? lse - row[t] : 0.0f;
    lse_sq[n] = t >= 0 ? lse * lse : 0.0f;
    for (int j = 0; j < Vp; j++) {
        float g = 0.0f;
        if (t >= 0 && j < V) {
            float p = expf(row[j] - mx) / sum;
            g = scale * (p - (j == t ? 1.0f : 0.0f) + z * 2.0f * lse * p);
        }
        dlogits[(size_t)n * Vp + j] = from_float<floatX>(g);
    }
}

void run(int version, floatX* dlogits, float* losses, float* lse_sq, const float* logits, const int* targets, int N, int V,
         int Vp, float z, float scale) {
    if (version == 1) {
        LAUNCH(CEIL_DIV(N, 128), 128, 0, 0, classifier_kernel1)(dlogits, losses, lse_sq, logits, targets, N, V, Vp, z, scale);
        cudaCheckLaunch();
    } else {
        classifier_forward_backward(ClassifierTensors{logits, targets, losses, lse_sq, dlogits}, N, V, Vp, z, scale, 0);
    }
}

int main(int argc, char** argv) {
    int N = HOST_BACKEND ? 64 : 8 * 1024, V = HOST_BACKEND ? 1000 : 16384, Vp = CEIL_DIV(V, 128) * 128;
    float z = 1e-4f;
    int first = 1, last = 2;
    if (argc > 1) { first = last = atoi(argv[1]); }
    std::vector<float> logits = make_random_float((size_t)N * Vp, 1, -4.0f, 4.0f);
    std::vector<int> targets(N);
    for (int n = 0; n < N; n++) { targets[n] = n % 7 == 3 ? -1 : (n * 7919) % V; }  // every 7th masked
    float scale = 1.0f / N;
    std::vector<float> d_ref((size_t)N * Vp), loss_ref(N), lse_sq_ref(N);
    classifier_cpu(d_ref.data(), loss_ref.data(), lse_sq_ref.data(), logits.data(), targets.data(), N, V, Vp, z, scale);

    float* d_logits = copy_to_device(logits);
    int* d_targets = copy_to_device(targets);
    floatX* d_dlogits = cudaMallocElements(floatX, (size_t)N * Vp);
    float* d_losses = cudaMallocElements(float, N);
    float* d_lse_sq = cudaMallocElements(float, N);
    float grad_eps = PRECISION_MODE == PrecisionMode::FP32 ? 1e-4f : 1.0f / 128;  // bf16: output rounding
    bool ok = true;
    printf("classifier (%s), N=%d V=%d Vp=%d\n", PRECISION_NAME, N, V, Vp);
    for (int version = first; version <= last; version++) {
        printf("  version %d\n", version);
        run(version, d_dlogits, d_losses, d_lse_sq, d_logits, d_targets, N, V, Vp, z, scale);
        ok &= validate_result(d_losses, loss_ref.data(), "losses", N, 1e-5f, 1e-5f);
        ok &= validate_result(d_lse_sq, lse_sq_ref.data(), "lse_sq", N, 1e-5f, 1e-5f);
        ok &= validate_result(d_dlogits, d_ref.data(), "dlogits", (size_t)N * Vp, 1e-9f, grad_eps);
    }
    // the loss sums on the device (classifier_loss_sums) against the host's sequential double sums
    // of the same rows (the trainers' sum before issue 55): within double rounding, and the same
    // bits on a rerun; over all rows and over a count that leaves threads one row short
    double* d_sums = cudaMallocElements(double, 2);
    double* pinned = nullptr;
    cudaCheck(cudaMallocHost(&pinned, 2 * sizeof(double)));
    std::vector<float> rows = copy_from_device(d_losses, N), rows_sq = copy_from_device(d_lse_sq, N);
    for (int count : {N, N - 5}) {
        double ce = 0.0, sq = 0.0;
        for (int n = 0; n < count; n++) {
            ce += rows[n];
            sq += rows_sq[n];
        }
        LossStats a = classifier_loss_sums(d_losses, d_lse_sq, count, d_sums, pinned, 0);
        LossStats b = classifier_loss_sums(d_losses, d_lse_sq, count, d_sums, pinned, 0);
        LossStats c = classifier_loss_sums(d_losses, nullptr, count, d_sums, pinned, 0);
        double rel = std::max(std::fabs(a.ce_sum - ce) / ce, std::fabs(a.lse_sq_sum - sq) / sq);
        bool same = memcmp(&a, &b, sizeof(a)) == 0 && c.ce_sum == a.ce_sum && c.lse_sq_sum == 0.0;
        printf("  loss sums over %d rows: relative difference from the host's sequential sum %.2e, "
               "rerun bit-identical: %s\n", count, rel, same ? "yes" : "NO");
        ok &= rel <= 1e-12 && same;
    }
    cudaCheck(cudaFree(d_sums));
    cudaCheck(cudaFreeHost(pinned));
    if (!ok) {
        printf("classifier: VALIDATION FAILED\n");
        return EXIT_FAILURE;
    }
    if (kBenchmarksEnabled) {
        double bytes = (double)N * Vp * (sizeof(float) + sizeof(floatX));
        print_table_header();
        float baseline = 0.0f;
        for (int version = first; version <= last; version++) {
            float ms = benchmark_kernel(10, run, version, d_dlogits, d_losses, d_lse_sq, d_logits, d_targets, N, V, Vp, z, scale);
            if (version == first) { baseline = ms; }
            print_result_row("classifier", version, ms, bytes, baseline);
        }
    } else {
        printf("classifier: all versions valid (benchmarks run on a GPU only)\n");
    }
    for (void* p : {(void*)d_logits, (void*)d_targets, (void*)d_dlogits, (void*)d_losses, (void*)d_lse_sq}) { cudaCheck(cudaFree(p)); }
    return 0;
}
