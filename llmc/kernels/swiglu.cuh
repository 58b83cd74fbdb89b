/*
The elementwise part of the SwiGLU FFN (doc/san-model.md: f = (SiLU(u w_gate^T) * (u w_up^T)) w_down^T):

    out = silu(gate) * up,   silu(x) = x * sigmoid(x),   sigmoid(x) = 1 / (1 + exp(-x))
    backward: dup   = dout * silu(gate)
              dgate = dout * up * sigmoid(gate) * (1 + gate * (1 - sigmoid(gate)))

gate, up, out, dout, dgate, dup: N elements of floatX (any shape, e.g. (B, T, d_ff)); all
maths in fp32, one rounding per output. dgate and dup are OVERWRITTEN.

Launch layout: one thread per V consecutive elements, V = x128::size when every pointer is
16-byte aligned (128-bit loads and stores; the last partial chunk element by element), else
V = 1. Each thread reads all its inputs before it writes, so outputs may alias inputs
element for element (out = gate, dgate = gate, dup = up, dgate = dout, ... are all fine).
The host backend runs the per-element functions as plain vectorised loops instead
(hostcuda::run_elementwise); dev/cuda/swiglu.cu checks both.
*/
#pragma once

#include <cstdint>
#include <initializer_list>

#include "llmc/kernels/align.h"
#include "llmc/cuda_common.h"

__device__ inline float swiglu_sigmoid(float x) { return 1.0f / (1.0f + kernel_expf(-x)); }

// one element: silu(x) * u, and the gradients of x and u given dy
__device__ __forceinline__ float swiglu_value(float x, float u) { return x * swiglu_sigmoid(x) * u; }
__device__ __forceinline__ void swiglu_grads(float x, float u, float dy, float* dx, float* du) {
    float sig = swiglu_sigmoid(x);
    *dx = dy * u * sig * (1.0f + x * (1.0f - sig));
    *du = dy * x * sig;
}

__device__ __forceinline__ void swiglu_forward_element(size_t i, floatX* out, const floatX* gate, const floatX* up) {
    out[i] = from_float<floatX>(swiglu_value(to_float(gate[i]), to_float(up[i])));
}

template <int V>
__global__ void swiglu_forward_kernel(floatX* out, const floatX* gate, const floatX* up, size_t N) {
    size_t start = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * V;
    if (start >= N) { return; }
    if (V > 1 && start + V <= N) {
        x128 g = load128cs(gate + start), u = load128cs(up + start), o;
        for (int k = 0; k < V; k++) { o[k] = from_float<floatX>(swiglu_value(to_float(g[k]), to_float(u[k]))); }
        store128(out + start, o);
    } else {
        for (size_t i = start; i < N && i < start + V; i++) { swiglu_forward_element(i, out, gate, up); }
    }
}

__device__ __forceinline__ void swiglu_backward_element(size_t i, floatX* dgate, floatX* dup, const floatX* dout,
                                                        const floatX* gate, const floatX* up) {
    float dx, du;
    swiglu_grads(to_float(gate[i]), to_float(up[i]), to_float(dout[i]), &dx, &du);
    dgate[i] = from_float<floatX>(dx);
    dup[i] = from_float<floatX>(du);
}

template <int V>
__global__ void swiglu_backward_kernel(floatX* dgate, floatX* dup, const floatX* dout, const floatX* gate,
                                       const floatX* up, size_t N) {
    size_t start = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * V;
    if (start >= N) { return; }
    if (V > 1 && start + V <= N) {
        x128 d = load128cs(dout + start), g = load128cs(gate + start), u = load128cs(up + start), dg, du;
        for (int k = 0; k < V; k++) {
            float dx, dy_up;
            swiglu_grads(to_float(g[k]), to_float(u[k]), to_float(d[k]), &dx, &dy_up);
            dg[k] = from_float<floatX>(dx);
            du[k] = from_float<floatX>(dy_up);
        }
        store128(dgate + start, dg);
        store128(dup + start, du);
    } else {
        for (size_t i = start; i < N && i < start + V; i++) { swiglu_backward_element(i, dgate, dup, dout, gate, up); }
    }
}

inline void swiglu_forward(floatX* out, const floatX* gate, const floatX* up, size_t N, cudaStream_t stream) {
    if (N == 0) { return; }
#if HOST_BACKEND  // the per-element function as a vectorised loop (hostcuda::run_elementwise)
    (void)stream;
    hostcuda::run_elementwise("swiglu_forward (host loop)", N,
                              [=](size_t i) { swiglu_forward_element(i, out, gate, up); });
    return;
#endif
    const int block_size = 256;
    if (aligned16({out, gate, up})) {
        unsigned grid = (unsigned)CEIL_DIV(N, (size_t)block_size * x128::size);
        LAUNCH(grid, block_size, 0, stream, swiglu_forward_kernel<x128::size>)(out, gate, up, N);
    } else {
        unsigned grid = (unsigned)CEIL_DIV(N, (size_t)block_size);
        LAUNCH(grid, block_size, 0, stream, swiglu_forward_kernel<1>)(out, gate, up, N);
    }
    cudaCheckLaunch();
}

inline void swiglu_backward(floatX* dgate, floatX* dup, const floatX* dout, const floatX* gate, const floatX* up,
                            size_t N, cudaStream_t stream) {
    if (N == 0) { return; }
#if HOST_BACKEND
    (void)stream;
    hostcuda::run_elementwise("swiglu_backward (host loop)", N,
                              [=](size_t i) { swiglu_backward_element(i, dgate, dup, dout, gate, up); });
    return;
#endif
    const int block_size = 256;
    if (aligned16({dgate, dup, dout, gate, up})) {
        unsigned grid = (unsigned)CEIL_DIV(N, (size_t)block_size * x128::size);
        LAUNCH(grid, block_size, 0, stream, swiglu_backward_kernel<x128::size>)(dgate, dup, dout, gate, up, N);
    } else {
        unsigned grid = (unsigned)CEIL_DIV(N, (size_t)block_size);
        LAUNCH(grid, block_size, 0, stream, swiglu_backward_kernel<1>)(dgate, dup, dout, gate, up, N);
    }
    cudaCheckLaunch();
}
