/*
Residual connections of the SAN family (doc/san-model.md, "Residual"): a sub-layer output
h joins the residual stream x (both (N) elements, floatX) as

    gated:    x_out = x + sigmoid(g) * h        g: one scalar parameter (device memory)
    standard: x_out = x + h
    rezero:   x_out = x + g * h
    none:     x_out = h                         (no skip connection)

Backward, given dx_out:
    dh = coef * dx_out            with coef = sigmoid(g), 1, g, 1
    dx = dx_out                   (for `none`: 0; the trainer clears its stream gradient)
    dg += dcoef/dg * sum(dx_out * h)       (gated: s(1-s), rezero: 1), deterministic (reduce.cuh)
Elementwise kernels, one thread per element; the host backend runs their per-element
functions as plain loops (hostcuda::run_elementwise), with the coefficient computed once.
*/
#pragma once

#include <cstring>
#include <string>

#include "llmc/choices.h"
#include "llmc/cuda_common.h"
#include "llmc/kernels/reduce.cuh"

enum class ResidualMode { Gated, Standard, Rezero, None };

inline const Choices<ResidualMode> kResidualModes{{"gated", "standard", "rezero", "none"}};
inline bool residual_has_gate(ResidualMode mode) { return mode == ResidualMode::Gated || mode == ResidualMode::Rezero; }

__device__ inline float residual_coefficient(ResidualMode mode, const floatX* gate) {
    switch (mode) {
        case ResidualMode::Gated: return 1.0f / (1.0f + expf(-to_float(*gate)));
        case ResidualMode::Rezero: return to_float(*gate);
        default: return 1.0f;
    }
}

// one element of x_out before its rounding to floatX (residual_norm.cuh's fused kernel calls it
// too). The fma written out: nvcc contracts x + coef * h into it anyway, g++ in some inlined
// copies and not in others (the host loop and the kernel came out an ulp apart).
__device__ __forceinline__ float residual_value(float x, float h, float coef, bool skip) {
    return fmaf(coef, h, skip ? x : 0.0f);
}

__device__ __forceinline__ void residual_forward_element(size_t i, floatX* x_out, const floatX* x, const floatX* h,
                                                         float coef, bool skip) {
    x_out[i] = from_float<floatX>(residual_value(to_float(x[i]), to_float(h[i]), coef, skip));
}

__global__ void residual_forward_kernel(floatX* x_out, const floatX* x, const floatX* h, const floatX* gate,
                                        ResidualMode mode, size_t N) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= N) { return; }
    residual_forward_element(i, x_out, x, h, residual_coefficient(mode, gate), mode != ResidualMode::None);
}

// gate may be null for modes without a gate. x_out may alias x.
void residual_forward(floatX* x_out, const floatX* x, const floatX* h, const floatX* gate, ResidualMode mode, size_t N,
                      cudaStream_t stream) {
#if HOST_BACKEND
    (void)stream;
    float coef = residual_coefficient(mode, gate);
    if (mode == ResidualMode::None) {
        hostcuda::run_elementwise("residual_forward (host loop)", N, [=](size_t i) { residual_forward_element(i, x_out, x, h, coef, false); });
    } else {
        hostcuda::run_elementwise("residual_forward (host loop)", N, [=](size_t i) { residual_forward_element(i, x_out, x, h, coef, true); });
    }
#else
    const int block = 256;
    LAUNCH(CEIL_DIV(N, block), block, 0, stream, residual_forward_kernel)(x_out, x, h, gate, mode, N);
    cudaCheckLaunch();
#endif
}

__device__ __forceinline__ void residual_branch_grad_element(size_t i, floatX* dh, const floatX* dx_out, float coef) {
    dh[i] = from_float<floatX>(coef * to_float(dx_out[i]));
}

__global__ void residual_branch_grad_kernel(floatX* dh, const floatX* dx_out, const floatX* gate, ResidualMode mode,
                                            size_t N) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= N) { return; }
    residual_branch_grad_element(i, dh, dx_out, residual_coefficient(mode, gate));
}

__global__ void gate_grad_kernel(floatX* dgate, const float* dot, const floatX* gate, ResidualMode mode) {
    float g = to_float(*gate);
    float dcoef = 1.0f;
    if (mode == ResidualMode::Gated) {
        float s = 1.0f / (1.0f + expf(-g));
        dcoef = s * (1.0f - s);
    }
    *dgate = from_float<floatX>(to_float(*dgate) + dcoef * *dot);
}

// dh = coef * dx_out (overwritten): the branch's gradient
void residual_branch_grad(floatX* dh, const floatX* dx_out, const floatX* gate, ResidualMode mode, size_t N,
                          cudaStream_t stream) {
#if HOST_BACKEND
    (void)stream;
    float coef = residual_coefficient(mode, gate);
    hostcuda::run_elementwise("residual_branch_grad (host loop)", N,
                              [=](size_t i) { residual_branch_grad_element(i, dh, dx_out, coef); });
#else
    const int block = 256;
    LAUNCH(CEIL_DIV(N, block), block, 0, stream, residual_branch_grad_kernel)(dh, dx_out, gate, mode, N);
    cudaCheckLaunch();
#endif
}

// dgate += dcoef/dg * sum(dx_out * h) for gated modes (nothing for the others). scratch: kReduceBlocks + 1 floats.
void residual_gate_backward(floatX* dgate, float* scratch, const floatX* dx_out, const floatX* h, const floatX* gate,
                            ResidualMode mode, size_t N, cudaStream_t stream) {
    if (!residual_has_gate(mode)) { return; }
    float* dot = scratch + kReduceBlocks;
    dot_product(dot, scratch, dx_out, h, N, 1.0f, false, stream);
    LAUNCH(1, 1, 0, stream, gate_grad_kernel)(dgate, dot, gate, mode);
    cudaCheckLaunch();
}

// both: dh = coef * dx_out (overwritten); dgate += dcoef/dg * sum(dx_out * h) for gated modes.
// scratch: kReduceBlocks + 1 floats.
void residual_backward(floatX* dh, floatX* dgate, float* scratch, const floatX* dx_out, const floatX* h, const floatX* gate,
                       ResidualMode mode, size_t N, cudaStream_t stream) {
    residual_branch_grad(dh, dx_out, gate, mode, N, stream);
    residual_gate_backward(dgate, scratch, dx_out, h, gate, mode, N, stream);
}
