/*
Residual connections of the SAN family (llmc/kernels/residual.cuh), every mode, forward and
backward, against a double reference:
    forward   x_out = skip(x) + coef(g) * h     gated: sigmoid(g), standard: 1, rezero: g, none: no skip
    backward  dh = coef * dx_out,  dg += dcoef/dg * sum(dx_out * h)  (deterministic reduction)

version 1: llmc/kernels/residual.cuh's residual_forward / residual_backward (on the host backend
           the elementwise parts run as loops over the kernels' per-element functions;
           llmc/kernels/reduce.cuh for the gate gradient)
version 2: the elementwise kernels launched directly: bit-identical to version 1

    ./build/<dir>/residual
*/
#include "dev/cuda/common.h"
#include "llmc/kernels/residual.cuh"

int main() {
    size_t N = HOST_BACKEND ? 100003 : 8 * 1024 * 768;  // not a multiple of any block size
    std::vector<floatX> x = convert_vector<floatX>(make_random_float(N, 1)), h = convert_vector<floatX>(make_random_float(N, 2)),
                        dx = convert_vector<floatX>(make_random_float(N, 3));
    floatX* d_x = copy_to_device(x);
    floatX* d_h = copy_to_device(h);
    floatX* d_dx = copy_to_device(dx);
    floatX* d_out = cudaMallocElements(floatX, N);
    floatX* d_dh = cudaMallocElements(floatX, N);
    floatX* d_gate = cudaMallocElements(floatX, 1);
    floatX* d_dgate = cudaMallocElements(floatX, 1);
    float* d_scratch = cudaMallocElements(float, kReduceBlocks + 1);
    float eps = PRECISION_MODE == PrecisionMode::FP32 ? 1e-6f : 1.0f / 128;
    bool ok = true;
    printf("residual (%s), N=%zu\n", PRECISION_NAME, N);
    for (ResidualMode mode : {ResidualMode::Gated, ResidualMode::Standard, ResidualMode::Rezero, ResidualMode::None}) {
        float g = to_float(from_float<floatX>(0.3f)), dg0 = to_float(from_float<floatX>(0.125f));
        std::vector<floatX> gate = {from_float<floatX>(g)}, dgate = {from_float<floatX>(dg0)};
        cudaCheck(cudaMemcpy(d_gate, gate.data(), sizeof(floatX), cudaMemcpyHostToDevice));
        cudaCheck(cudaMemcpy(d_dgate, dgate.data(), sizeof(floatX), cudaMemcpyHostToDevice));
        double s = 1.0 / (1.0 + std::exp(-(double)g));
        double coef = mode == ResidualMode::Gated ? s : mode == ResidualMode::Rezero ? g : 1.0;
        double dcoef = mode == ResidualMode::Gated ? s * (1.0 - s) : mode == ResidualMode::Rezero ? 1.0 : 0.0;
        std::vector<float> out_ref(N), dh_ref(N);
        double dot = 0.0;
        for (size_t i = 0; i < N; i++) {
            double skip = mode == ResidualMode::None ? 0.0 : (double)to_float(x[i]);
            out_ref[i] = (float)(skip + coef * to_float(h[i]));
            dh_ref[i] = (float)(coef * to_float(dx[i]));
            dot += (double)to_float(dx[i]) * to_float(h[i]);
        }
        float dgate_ref = (float)(dg0 + dcoef * dot);
        residual_forward(d_out, d_x, d_h, d_gate, mode, N, 0);
        residual_backward(d_dh, d_dgate, d_scratch, d_dx, d_h, d_gate, mode, N, 0);
        printf("  mode %s\n", kResidualModes.name(mode));
        ok &= validate_result(d_out, out_ref.data(), "out", N, 1e-6f, eps);
        ok &= validate_result(d_dh, dh_ref.data(), "dh", N, 1e-6f, eps);
        // the gate sums N products (fp32 accumulation); in bf16 it is also stored in bf16
        ok &= validate_result(d_dgate, &dgate_ref, "dgate", 1, PRECISION_MODE == PrecisionMode::FP32 ? 2e-4f : 2e-2f, eps);
        std::vector<floatX> out1 = copy_from_device(d_out, N), dh1 = copy_from_device(d_dh, N);
        LAUNCH(CEIL_DIV(N, 256), 256, 0, 0, residual_forward_kernel)(d_out, d_x, d_h, d_gate, mode, N);
        LAUNCH(CEIL_DIV(N, 256), 256, 0, 0, residual_branch_grad_kernel)(d_dh, d_dx, d_gate, mode, N);
        cudaCheck(cudaGetLastError());
        std::vector<floatX> out2 = copy_from_device(d_out, N), dh2 = copy_from_device(d_dh, N);
        bool same = memcmp(out1.data(), out2.data(), N * sizeof(floatX)) == 0 && memcmp(dh1.data(), dh2.data(), N * sizeof(floatX)) == 0;
        printf("    version 2 (the kernels) bit-identical to version 1: %s\n", same ? "yes" : "NO");
        ok &= same;
    }
    if (!ok) {
        printf("residual: VALIDATION FAILED\n");
        return EXIT_FAILURE;
    }
    if (kBenchmarksEnabled) {
        print_table_header();
        float fwd = benchmark_kernel(20, residual_forward, d_out, d_x, d_h, d_gate, ResidualMode::Gated, N, (cudaStream_t)0);
        print_result_row("residual_forward", 1, fwd, 3.0 * N * sizeof(floatX), fwd);
        float bwd = benchmark_kernel(20, residual_backward, d_dh, d_dgate, d_scratch, d_dx, d_h, d_gate, ResidualMode::Gated, N,
                                     (cudaStream_t)0);
        print_result_row("residual_backward", 1, bwd, 4.0 * N * sizeof(floatX), bwd);
    } else {
        printf("residual: valid (benchmarks run on a GPU only)\n");
    }
    for (void* p : {(void*)d_x, (void*)d_h, (void*)d_dx, (void*)d_out, (void*)d_dh, (void*)d_gate, (void*)d_dgate, (void*)d_scratch}) {
        cudaCheck(cudaFree(p));
    }
    return 0;
}
