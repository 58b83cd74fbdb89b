/*
AdamW with decoupled weight decay (doc/san-model.md, "Optimizers"), for one parameter
tensor of n elements; one thread per element:

    g = grad * grad_scale                      (grad_scale applies the global-norm clip)
    m = beta1 m + (1 - beta1) g;   v = beta2 v + (1 - beta2) g^2
    p = p (1 - lr wd) - lr * (m / (1 - beta1^t)) / (sqrt(v / (1 - beta2^t)) + eps)

m, v are fp32; the gradients floatX, or fp32 when accumulated in fp32. With a master copy (bf16 builds), the update runs on the fp32 master
weights and the floatX parameters receive them rounded to nearest; without one (fp32
builds, master == nullptr) it runs on the parameters directly.

Launch: one thread per element. The host backend runs the same per-element function as a
plain loop instead (adamw_update); dev/cuda/adamw.cu checks the kernel and that loop.
*/
#pragma once

#include "llmc/cuda_common.h"

struct AdamWStep {
    float lr, beta1, beta2, eps, weight_decay;
    float beta1_correction, beta2_correction;  // 1 - beta^t
    float grad_scale;
};

// The update of element i: the kernel's body, and on the host backend the body of a plain
// loop (hostcuda::run_elementwise: vectorised, ~10x cheaper than a fiber call per element)
template <typename TGrad>
__device__ __forceinline__ void adamw_element(size_t i, floatX* params, float* master, const TGrad* grads, float* m,
                                              float* v, const AdamWStep& s) {
    float g = to_float(grads[i]) * s.grad_scale;
    float mi = s.beta1 * m[i] + (1.0f - s.beta1) * g;
    float vi = s.beta2 * v[i] + (1.0f - s.beta2) * g * g;
    m[i] = mi;
    v[i] = vi;
    float p = master != nullptr ? master[i] : to_float(params[i]);
    p = p * (1.0f - s.lr * s.weight_decay);
    p -= s.lr * (mi / s.beta1_correction) / (sqrtf(vi / s.beta2_correction) + s.eps);
    if (master != nullptr) { master[i] = p; }
    params[i] = from_float<floatX>(p);
}

template <typename TGrad>
__global__ void adamw_kernel(floatX* params, float* master, const TGrad* grads, float* m, float* v, size_t n,
                             AdamWStep s) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) { adamw_element(i, params, master, grads, m, v, s); }
}

template <typename TGrad>
void adamw_update(floatX* params, float* master, const TGrad* grads, float* m, float* v, size_t n, const AdamWStep& step,
                  cudaStream_t stream) {
#if HOST_BACKEND
    (void)stream;
    // (two loops, so that each has one form of the master-weight branch and vectorises)
    if (master != nullptr) {
        hostcuda::run_elementwise("adamw (host loop)", n, [=](size_t i) { adamw_element(i, params, master, grads, m, v, step); });
    } else {
        hostcuda::run_elementwise("adamw (host loop)", n, [=](size_t i) { adamw_element(i, params, (float*)nullptr, grads, m, v, step); });
    }
#else
    const int block = 256;
    LAUNCH(CEIL_DIV(n, block), block, 0, stream, adamw_kernel<TGrad>)(params, master, grads, m, v, n, step);
    cudaCheckLaunch();
#endif
}
