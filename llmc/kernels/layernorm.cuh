/*
LayerNorm over rows with weight and bias (GPT-2, doc/gpt2.md), forward and backward:

    mean[r] = mean(inp[r, :]),   rstd[r] = 1 / sqrt(mean((inp[r, :] - mean[r])^2) + eps)
    xhat    = (inp[r, :] - mean[r]) * rstd[r]
    out[r, :] = xhat * weight[:] + bias[:]

inp, out: (N, C) row-major floatX; weight, bias: (C) floatX; mean, rstd: (N) fp32 (either
may be null in the forward when no backward follows). All maths in fp32 (two passes over
the row for the statistics, so no cancellation from E[x^2] - E[x]^2); the output is rounded
once.

Launch layout: the row groups of llmc/kernels/norm.cuh (a group of L lanes per row, V-element
chunks, V = x128::size when C and every pointer allow 128-bit access; L = 1 on the host
backend, where a shuffle costs a fiber switch per lane; up to 32 on the GPU).

Backward (dinp, dweight and dbias ACCUMULATED):
    dy = dout * weight
    dinp    += rstd * (dy - mean(dy) - xhat * mean(dy * xhat))     per row
    dweight += sum over rows of dout * xhat
    dbias   += sum over rows of dout
Deterministic without atomics, as GainNorm::backward (llmc/kernels/norm.cuh): each row group accumulates its dweight and
dbias partials in its own shared-memory rows (2 C floats), the block sums its groups in a
fixed order into scratch (dweight partials at scratch[b * C + c], dbias partials at
scratch[blocks * C + b * C + c]), and norm_dgain_reduce_kernel sums the blocks in a fixed
order. Scratch: layernorm_backward_scratch_floats(N, C). dinp must not alias dout or inp.

Calls: LayerNorm{weight, bias, C, eps} (at the end: a layernorm with its weight and bias
and their gradients), .forward(out, mean, rstd, inp, N, stream) and
.backward(dinp, dout, inp, mean, rstd, N, scratch, stream). The forward kernel takes a policy,
what it does to a row first (Before): llmc/kernels/residual_norm.cuh's
residual_layernorm_forward runs the residual add that writes inp in the same launch.
*/
#pragma once

#include "llmc/cuda_common.h"
#include "llmc/kernels/norm.cuh"        // row-group layout, row chunk loads/stores, group sums, fixed-order block reduction

// ----------------------------------------------------------------------------------------
// kernels. blockDim.x is a multiple of `lanes` (and of 32 when lanes > 1); C % V == 0.

// before: what it does to each valid row first (norm.cuh's NormNothingBefore, or
// residual_norm.cuh's ResidualAdd, which writes inp's row as a residual add); the statistics
// then read the row back, each lane its own chunks.
template <int V, class Before = NormNothingBefore>
__global__ void layernorm_forward_kernel(floatX* out, float* mean, float* rstd, const floatX* inp, const floatX* weight,
                                         const floatX* bias, int N, int C, int lanes, float eps, Before before) {
    int lane = threadIdx.x % lanes;
    int r = blockIdx.x * (blockDim.x / lanes) + threadIdx.x / lanes;
    bool valid = r < N;
    const floatX* row = inp + (size_t)(valid ? r : 0) * C;
    if (valid) { before.template row<V>((size_t)r * C, lane, lanes, C); }
    float sum = 0.0f;
    if (valid) {
        for (int c = lane * V; c < C; c += lanes * V) {
            float x[V];
            load_floats<V>(x, row + c);
            for (int k = 0; k < V; k++) { sum += x[k]; }
        }
    }
    float m = norm_group_sum(sum, lanes) / C;  // the whole warp, valid or not
    float sum_sq = 0.0f;
    if (valid) {
        for (int c = lane * V; c < C; c += lanes * V) {
            float x[V];
            load_floats<V>(x, row + c);
            for (int k = 0; k < V; k++) { sum_sq += (x[k] - m) * (x[k] - m); }
        }
    }
    sum_sq = norm_group_sum(sum_sq, lanes);
    if (!valid) { return; }
    float s = rsqrtf(sum_sq / C + eps);
    for (int c = lane * V; c < C; c += lanes * V) {
        float x[V], w[V], b[V], y[V];
        load_floats<V>(x, row + c);
        load_floats<V>(w, weight + c);
        load_floats<V>(b, bias + c);
        for (int k = 0; k < V; k++) { y[k] = ((x[k] - m) * s) * w[k] + b[k]; }
        store_floats<V>(out + (size_t)r * C + c, y);
    }
    if (lane == 0) {
        if (mean != nullptr) { mean[r] = m; }
        if (rstd != nullptr) { rstd[r] = s; }
    }
}

// Dynamic shared memory: (blockDim.x / lanes) * 2 * C floats.
template <int V>
__global__ void layernorm_backward_kernel(floatX* dinp, float* scratch, const floatX* dout, const floatX* inp,
                                          const floatX* weight, const float* mean, const float* rstd, int N, int C,
                                          int lanes) {
    int groups = blockDim.x / lanes;
    int group = threadIdx.x / lanes;
    int lane = threadIdx.x % lanes;
    // this group's partials: dweight in the first C floats, dbias in the next C; column c at
    // (c % V) * (C / V) + c / V, so consecutive lanes touch consecutive words
    const int chunks = C / V;
    float* acc_w = dynamic_shared_memory<float>() + (size_t)group * 2 * C;
    float* acc_b = acc_w + C;
    for (int c = lane * V; c < C; c += lanes * V) {
        for (int k = 0; k < V; k++) {
            acc_w[k * chunks + c / V] = 0.0f;
            acc_b[k * chunks + c / V] = 0.0f;
        }
    }
    int stride = gridDim.x * groups;
    int iterations = CEIL_DIV(N, stride);  // the same for every group of the block: shuffles stay converged
    for (int it = 0; it < iterations; it++) {
        int r = it * stride + blockIdx.x * groups + group;
        bool valid = r < N;
        size_t offset = (size_t)(valid ? r : 0) * C;
        float m = valid ? mean[r] : 0.0f;
        float s = valid ? rstd[r] : 0.0f;
        float sum_dy = 0.0f, sum_dy_xhat = 0.0f;
        if (valid) {
            for (int c = lane * V; c < C; c += lanes * V) {
                float x[V], d[V], w[V];
                load_floats<V>(x, inp + offset + c);
                load_floats<V>(d, dout + offset + c);
                load_floats<V>(w, weight + c);
                for (int k = 0; k < V; k++) {
                    float xhat = (x[k] - m) * s;
                    float dy = d[k] * w[k];
                    sum_dy += dy;
                    sum_dy_xhat += dy * xhat;
                    acc_w[k * chunks + c / V] += d[k] * xhat;
                    acc_b[k * chunks + c / V] += d[k];
                }
            }
        }
        sum_dy = norm_group_sum(sum_dy, lanes);
        sum_dy_xhat = norm_group_sum(sum_dy_xhat, lanes);
        if (valid) {
            float mean_dy = sum_dy / C, mean_dy_xhat = sum_dy_xhat / C;
            for (int c = lane * V; c < C; c += lanes * V) {
                float x[V], d[V], w[V], di[V];
                load_floats<V>(x, inp + offset + c);
                load_floats<V>(d, dout + offset + c);
                load_floats<V>(w, weight + c);
                load_floats<V>(di, dinp + offset + c);
                for (int k = 0; k < V; k++) {
                    float xhat = (x[k] - m) * s;
                    di[k] += s * (d[k] * w[k] - mean_dy - xhat * mean_dy_xhat);
                }
                store_floats<V>(dinp + offset + c, di);
            }
        }
    }
    __syncthreads();
    const float* all = dynamic_shared_memory<float>();
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        float sum_w = 0.0f, sum_b = 0.0f;
        int position = (c % V) * chunks + c / V;
        for (int g = 0; g < groups; g++) {
            sum_w += all[(size_t)g * 2 * C + position];
            sum_b += all[(size_t)g * 2 * C + C + position];
        }
        scratch[(size_t)blockIdx.x * C + c] = sum_w;
        scratch[(size_t)gridDim.x * C + (size_t)blockIdx.x * C + c] = sum_b;
    }
}

// ----------------------------------------------------------------------------------------
// the launchers

inline size_t layernorm_backward_scratch_floats(int N, int C) { return 2 * (size_t)norm_backward_blocks(N) * C; }

// A LayerNorm as a model calls it (GainNorm's counterpart, llmc/kernels/norm.cuh): its weight and
// bias (each with its gradient), the row width C and eps. forward: out = layernorm(x) over
// N rows (mean, rstd kept for backward; either may be null when no backward follows);
// backward: dx += dL/dx, weight.grad and bias.grad += theirs, from dout = dL/d out and the
// forward's x, mean, rstd; scratch holds layernorm_backward_scratch_floats(N, C).
struct LayerNorm {
    Weight weight, bias;
    int C = 0;
    float eps = 0.0f;

    // `before` (the kernel's Before) writes x's rows first: its pointers must give the layout
    // that out, x and the weights give (residual_norm.cuh's residual_layernorm_forward checks)
    template <class Before = NormNothingBefore>
    void forward(floatX* out, float* mean, float* rstd, const floatX* x, int N, cudaStream_t stream,
                 Before before = {}) const {
        if (N <= 0) { return; }
        NormLayout layout = norm_layout(C, {out, x, weight.w, bias.w});
        const int block_size = 256;
        int grid = CEIL_DIV(N, block_size / layout.lanes);
        if (layout.vector) {
            LAUNCH(grid, block_size, 0, stream, layernorm_forward_kernel<x128::size, Before>)(
                out, mean, rstd, x, weight.w, bias.w, N, C, layout.lanes, eps, before);
        } else {
            LAUNCH(grid, block_size, 0, stream, layernorm_forward_kernel<1, Before>)(
                out, mean, rstd, x, weight.w, bias.w, N, C, layout.lanes, eps, before);
        }
        cudaCheckLaunch();
    }

    void backward(floatX* dx, const floatX* dout, const floatX* x, const float* mean, const float* rstd, int N,
                  float* scratch, cudaStream_t stream) const {
        if (N <= 0) { return; }
        NormLayout layout = norm_layout(C, {dx, dout, x, weight.w});
        const size_t group_bytes = 2 * (size_t)C * sizeof(float);
        int groups = 256 / layout.lanes;
        while (groups > 1 && groups * group_bytes > (size_t)kNormMaxSharedBytes) { groups /= 2; }
        if (groups * group_bytes > (size_t)kNormMaxSharedBytes) {
            fprintf(stderr, "LayerNorm::backward: C = %d needs more than %d bytes of shared memory\n", C,
                    kNormMaxSharedBytes);
            exit(EXIT_FAILURE);
        }
        int block_size = groups * layout.lanes;
        int blocks = CEIL_DIV(N, groups);
        if (blocks > norm_backward_blocks(N)) { blocks = norm_backward_blocks(N); }
        size_t shared = groups * group_bytes;
        if (layout.vector) {
            LAUNCH(blocks, block_size, shared, stream, layernorm_backward_kernel<x128::size>)(
                dx, scratch, dout, x, weight.w, mean, rstd, N, C, layout.lanes);
        } else {
            LAUNCH(blocks, block_size, shared, stream, layernorm_backward_kernel<1>)(dx, scratch, dout, x, weight.w,
                                                                                      mean, rstd, N, C, layout.lanes);
        }
        cudaCheckLaunch();
        LAUNCH(CEIL_DIV(C, 32), dim3(32, 8), 0, stream, norm_dgain_reduce_kernel)(weight.grad, scratch, blocks, C);
        cudaCheckLaunch();
        LAUNCH(CEIL_DIV(C, 32), dim3(32, 8), 0, stream, norm_dgain_reduce_kernel)(
            bias.grad, scratch + (size_t)blocks * C, blocks, C);
        cudaCheckLaunch();
    }
};
