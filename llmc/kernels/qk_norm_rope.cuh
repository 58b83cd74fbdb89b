/*
Fused QK-norm + RoPE, forward and backward: q = RoPE(norm(q_lin)) per head in one pass over
q_lin (and the same for k), where llmc/kernels/norm.cuh and llmc/kernels/rope.cuh take two
passes and a third over the gradient (issue 55 target 4; doc/gpu-runs/fused-qk-norm-rope.md:
the kernels, their numerics, tests, registers and the cost model's view).
    forward:  y = round((x * rstd) * (gain_offset + gain)),  out = round(RoPE(y))
    backward: dy = round(RoPE^T(dout)),  dinp = norm's backward of dy (dinp OVERWRITTEN),
              gain.grad += sum over rows of dy * x * rstd
inp, out, dout, dinp: (B, T, H, hd) floatX, one row per head vector (N = B T H rows of C = hd,
position t = (row / H) % T); gain: (hd), shared by the heads; rstd: (N) fp32; table: the RoPE
table (rope_table, from the tensor's first position). round() is the rounding to floatX that
the unfused pair stores between its two kernels: the fused kernels keep it, and every float
operation of the pair in the same order (how: above each kernel), so their results are the
pair's bit for bit (dev/test/test_norm_rope_swiglu.cu).
Launch layout: norm.cuh's (a row group of L lanes per row, V-element chunks, the norm's sums
over the same lanes in the same order). Forward: after the row's rstd, each lane takes pairs
(i, i + hd/2) V at a time and writes both halves. Backward: norm_backward_kernel, its dout read
through QkRopeGrad (a chunk and its partner at c +- hd/2) and dinp overwritten. No chunk may
straddle the halves: other head dims take the two kernels (qk_norm_rope_fused says which).
Cost (counts of the host backend): forward reads x once and writes out once (the pair: x read,
y written, y read, out written); backward reads dout and x once and writes dinp once (the pair:
dout read and written by RoPE, dinp zeroed, read and written by the norm).
*/
#pragma once

#include "llmc/cuda_common.h"
#include "llmc/kernels/norm.cuh"  // defines: norm_row_rstd, norm_backward_kernel, NormDinp, norm_layout,
                                  // norm_backward_launch, GainNorm
#include "llmc/kernels/rope.cuh"  // defines: rope_first, rope_second, rope_forward, rope_backward

// x rounded to floatX and back: what a store to a floatX tensor and its load give
__device__ inline float round_to_floatX(float x) { return to_float(from_float<floatX>(x)); }

// ----------------------------------------------------------------------------------------
// kernels. blockDim.x is a multiple of 32 and of `lanes`; C even, (C / 2) % V == 0.

// The forward does the pair's float operations in the pair's order: the rotation through
// rope.cuh's rope_first / rope_second, whose fmas are written out; rstd through norm_row_rstd,
// as norm_forward_kernel's, and its scaling as norm_forward_kernel writes it, with the same
// lanes per row.
template <int V>
__global__ void qk_norm_rope_forward_kernel(floatX* out, float* rstd, const floatX* inp, const floatX* gain,
                                            const float* table, int N, int T, int H, int C, int lanes,
                                            float gain_offset, float eps) {
    int lane = threadIdx.x % lanes;
    int r = blockIdx.x * (blockDim.x / lanes) + threadIdx.x / lanes;
    float s = norm_row_rstd<V>(inp, r, N, C, lane, lanes, eps);  // as norm_forward_kernel: the whole warp
    if (r >= N) { return; }
    const floatX* row = inp + (size_t)r * C;
    const int half = C / 2;
    const float* angles = table + (size_t)((r / H) % T) * C;
    for (int i = lane * V; i < half; i += lanes * V) {
        float x1[V], x2[V], g1[V], g2[V], o1[V], o2[V];
        load_floats<V>(x1, row + i);  // second read hits the cache
        load_floats<V>(x2, row + half + i);
        load_floats<V>(g1, gain + i);
        load_floats<V>(g2, gain + half + i);
        for (int k = 0; k < V; k++) {
            float y1 = round_to_floatX((x1[k] * s) * (gain_offset + g1[k]));
            float y2 = round_to_floatX((x2[k] * s) * (gain_offset + g2[k]));
            o1[k] = rope_first(y1, y2, angles, half, i + k, 1.0f);
            o2[k] = rope_second(y1, y2, angles, half, i + k, 1.0f);
        }
        store_floats<V>(out + (size_t)r * C + i, o1);
        store_floats<V>(out + (size_t)r * C + half + i, o2);
    }
    if (lane == 0 && rstd != nullptr) { rstd[r] = s; }
}

// The backward: norm_backward_kernel reading its gradient through this (its Grad) and with dinp
// overwritten (NormDinp::overwrite: the pair's zeroed dinp). load gives the gradient of the
// norm's output at columns c .. c + V - 1 of row r: RoPE's backward rotation of dout, from the
// chunk and its partner at c +- C / 2 on the table row of r's position, rounded to floatX as
// rope_backward's store rounds it. `direction` is -1, a run-time value as in rope_kernel.
// The backward is norm.cuh's norm_backward_kernel itself, another instantiation, whose fmas are
// written out too. The partner chunk is read twice (from the cache), so the chunks stay the
// norm's and the sums keep their order; dgain goes through the norm's shared-memory partials
// and norm_dgain_reduce_kernel.
struct QkRopeGrad {
    const floatX* dout;
    const float* table;
    int T, H, C;
    float direction;
    template <int V>
    __device__ void load(float (&d)[V], int r, size_t offset, int c) const {
        const float* angles = table + (size_t)((r / H) % T) * C;
        const floatX* row = dout + offset;
        const int half = C / 2;
        float z1[V], z2[V];
        if (c < half) {
            load_floats<V>(z1, row + c);
            load_floats<V>(z2, row + half + c);
            for (int k = 0; k < V; k++) { d[k] = round_to_floatX(rope_first(z1[k], z2[k], angles, half, c + k, direction)); }
        } else {
            load_floats<V>(z1, row + c - half);
            load_floats<V>(z2, row + c);
            for (int k = 0; k < V; k++) {
                d[k] = round_to_floatX(rope_second(z1[k], z2[k], angles, half, c - half + k, direction));
            }
        }
    }
};

// ----------------------------------------------------------------------------------------
// launchers

// Whether the fused kernels serve this head dim with this layout (else the two kernels run):
// no chunk may straddle the halves, so hd even and, on the 128-bit path, (hd/2) % V == 0.
inline bool qk_norm_rope_fused(int hd, const NormLayout& layout) {
    return hd % 2 == 0 && (!layout.vector || (hd / 2) % x128::size == 0);
}

// out = RoPE(norm(inp)) over B T H head vectors of norm.C; rstd kept for the backward.
// out must not alias inp.
inline void qk_norm_rope_forward(const GainNorm& norm, floatX* out, float* rstd, const floatX* inp,
                                 const float* table, int B, int T, int H, cudaStream_t stream) {
    const int C = norm.C, N = B * T * H;
    if (N <= 0) { return; }
    NormLayout layout = norm_layout(C, {out, inp, norm.gain.w});  // norm_forward's
    if (!qk_norm_rope_fused(C, layout)) {
        norm.forward(out, rstd, inp, N, stream);
        rope_forward(out, out, table, B, T, H, C, stream);
        return;
    }
    const int block_size = 256;
    int grid = CEIL_DIV(N, block_size / layout.lanes);
    if (layout.vector) {
        LAUNCH(grid, block_size, 0, stream, qk_norm_rope_forward_kernel<x128::size>)(
            out, rstd, inp, norm.gain.w, table, N, T, H, C, layout.lanes, norm.gain_offset, norm.eps);
    } else {
        LAUNCH(grid, block_size, 0, stream, qk_norm_rope_forward_kernel<1>)(
            out, rstd, inp, norm.gain.w, table, N, T, H, C, layout.lanes, norm.gain_offset, norm.eps);
    }
    cudaCheckLaunch();
}

// dinp = dL/d inp (OVERWRITTEN) and norm.gain.grad += dL/d gain, from dout = dL/d out and the
// forward's inp, rstd. scratch: norm_backward_scratch_floats(B T H, norm.C) floats. dout is
// rotated in place where the two kernels run (head dims qk_norm_rope_fused refuses). dinp
// must not alias dout or inp.
inline void qk_norm_rope_backward(const GainNorm& norm, floatX* dinp, floatX* dout, const floatX* inp,
                                  const float* rstd, const float* table, int B, int T, int H, float* scratch,
                                  cudaStream_t stream) {
    const int C = norm.C, N = B * T * H;
    if (N <= 0) { return; }
    NormLayout layout = norm_layout(C, {dinp, dout, inp, norm.gain.w});  // GainNorm::backward's
    if (!qk_norm_rope_fused(C, layout)) {
        cudaCheck(cudaMemsetAsync(dinp, 0, (size_t)N * C * sizeof(floatX), stream));
        rope_backward(dout, dout, table, B, T, H, C, stream);
        norm.backward(dinp, dout, inp, rstd, N, scratch, stream);
        return;
    }
    NormBackwardLaunch launch = norm_backward_launch(N, C, layout.lanes, "qk_norm_rope_backward");
    QkRopeGrad grad{dout, table, T, H, C, -1.0f};
    if (layout.vector) {
        LAUNCH(launch.blocks, launch.block_size, launch.shared, stream,
               norm_backward_kernel<x128::size, QkRopeGrad, NormDinp::overwrite>)(
            dinp, scratch, grad, inp, norm.gain.w, rstd, N, C, layout.lanes, norm.gain_offset, NormNoExtra{});
    } else {
        LAUNCH(launch.blocks, launch.block_size, launch.shared, stream,
               norm_backward_kernel<1, QkRopeGrad, NormDinp::overwrite>)(
            dinp, scratch, grad, inp, norm.gain.w, rstd, N, C, layout.lanes, norm.gain_offset, NormNoExtra{});
    }
    cudaCheckLaunch();
    norm.reduce_dgain(scratch, launch.blocks, stream);
}
