/*
Fused residual add + the next pre-norm, forward and backward (issue 55 target 4;
doc/gpu-runs/fused-residual-norm.md): in a pre-norm stack the residual add that ends one
sub-layer, x_out = x + coef * h (llmc/kernels/residual.cuh), is followed by the next sub-layer's
norm of x_out (llmc/kernels/norm.cuh); backward, the norm's backward adds into the stream's
gradient dx, which the residual's backward then reads to give the branch below its gradient.

    forward:  x_out = round(residual_value(x, h, coef)),  out = norm(x_out) (its rstd kept)
    backward: dx = round(dx + the norm's dinp),  dh = round(coef_below * dx)

x, h, x_out, out, dx, dout, dh: (N, C) floatX; coef from the residual's mode and gate (device
memory: residual_coefficient). round() is the rounding to floatX that the unfused pair stores
between its kernels; the fused kernels keep it and every float operation of the pair in the
same order (residual.cuh's residual_value; the norm's sum of squares through norm.cuh's
norm_row_rstd and its scaling as norm_forward_kernel writes it, over the same lanes and
chunks; the norm's backward through norm_backward_sums / norm_backward_dinp with the same
dgain partials), so their results are the pair's bit for bit (dev/test/test_residual_norm.cu). A compiler may contract a * b + c
into an fma in one inlined copy and not another (g++ does, by default in C++), so the forward
keeps the pair's loops as they are: the residual's over x and h, then norm_row_rstd and
norm_forward_kernel's second loop over x_out, read back (from the cache), not from registers:
with the sum of squares taken inside the first loop, g++'s FP32 host build put x_out, out and
rstd one or two ulps off the pair's. When the pointers give the fused kernel another vector
width than the norm alone would take, the pair runs instead.

The forward is the norm's own kernel with the residual add (ResidualAdd) as its Before:
norm_forward_kernel for the SAN's norm. GPT-2's LayerNorm (llmc/kernels/layernorm.cuh) has the
forward only: residual_layernorm_forward runs layernorm_forward_kernel with the same Before, then the LayerNorm's own three loops over x_out read back, so its
x_out, out, mean and rstd are the pair's bit for bit. Its backward has no residual pass to take
in: a standard residual's branch gradient is dx itself.

Launch layout: norm.cuh's (a row group of L lanes per row, V-element chunks, norm_layout and
norm_backward_launch). Forward: the first loop reads x and h and writes x_out; the norm's two
loops then read the lane's own chunks of x_out back (from the cache) and write out. Backward:
the norm's backward kernel with one more store per chunk (dh) after dx's.

Cost (counts of the host backend, bytes per element of the stream): forward reads x, h and
writes x_out, out (the pair: x, h read, x_out written, x_out read, out written); backward reads
x, dout, dx and writes dx, dh (the pair: the same, then dx read again and dh written).
*/
#pragma once

#include "llmc/cuda_common.h"
#include "llmc/kernels/layernorm.cuh"  // defines: LayerNorm (its forward kernel takes a Before)
#include "llmc/kernels/norm.cuh"      // defines: norm_layout, norm_row_rstd, norm_backward_sums, norm_backward_dinp, GainNorm
#include "llmc/kernels/residual.cuh"  // defines: ResidualMode, residual_coefficient, residual_value, residual_branch_grad

// ----------------------------------------------------------------------------------------
// kernels. blockDim.x is a multiple of 32 and of `lanes`; C % V == 0.

// The residual add over a row group's lane's chunks of one row (offset: the row's first
// element): x_out = round(residual_value(x, h, coef)), coef from mode and gate. The fused
// forwards' first loop (a norm's Before: norm_forward_kernel's and layernorm_forward_kernel's).
struct ResidualAdd {
    floatX* x_out;
    const floatX* x;
    const floatX* h;
    const floatX* gate;
    ResidualMode mode;
    template <int V>
    __device__ void row(size_t offset, int lane, int lanes, int C) const {
        const float coef = residual_coefficient(mode, gate);
        const bool skip = mode != ResidualMode::None;
        for (int c = lane * V; c < C; c += lanes * V) {
            float a[V], b[V], y[V];
            load_floats<V>(a, x + offset + c);
            load_floats<V>(b, h + offset + c);
            for (int k = 0; k < V; k++) { y[k] = residual_value(a[k], b[k], coef, skip); }
            store_floats<V>(x_out + offset + c, y);
        }
    }
};

// The backward's Extra (norm.cuh's norm_backward_kernel): dh = coef * round(dinp) from each
// finished chunk of dinp, residual_branch_grad_element's arithmetic (coef: the residual below's).
struct ResidualBranchGrad {
    floatX* dh;
    const floatX* gate;
    ResidualMode mode;
    template <int V>
    __device__ void store(const float (&di)[V], size_t offset, int c) const {
        const float coef = residual_coefficient(mode, gate);
        float b[V];
        for (int k = 0; k < V; k++) { b[k] = coef * to_float(from_float<floatX>(di[k])); }
        store_floats<V>(dh + offset + c, b);
    }
};

// ----------------------------------------------------------------------------------------
// launchers

// x_out = residual(x, h) (mode, gate as residual_forward; x_out may alias x), then
// out, rstd = norm.forward(x_out): N rows of norm.C.
inline void residual_norm_forward(floatX* x_out, const floatX* x, const floatX* h, const floatX* gate,
                                  ResidualMode mode, const GainNorm& norm, floatX* out, float* rstd, int N,
                                  cudaStream_t stream) {
    if (N <= 0) { return; }
    const int C = norm.C;
    NormLayout alone = norm_layout(C, {out, x_out, norm.gain.w});
    NormLayout layout = norm_layout(C, {out, x_out, x, h, norm.gain.w});
    if (layout.vector != alone.vector) {  // another chunking: the norm's sums in another order
        residual_forward(x_out, x, h, gate, mode, (size_t)N * C, stream);
        norm.forward(out, rstd, x_out, N, stream);
        return;
    }
    // norm_forward_kernel with the residual add as its Before (as GPT-2's LayerNorm, below)
    norm_forward(out, rstd, x_out, norm.gain.w, N, C, norm.gain_offset, norm.eps, stream,
                 ResidualAdd{x_out, x, h, gate, mode});
}

// norm.backward(dx, dout, x, rstd, N, scratch) (dx += dL/dx through the norm, the gain's gradient),
// then dh = coef * dx (overwritten) with the coefficient of the residual below (gate_below,
// mode_below): the gradient of that residual's branch, as residual_branch_grad gives it.
inline void residual_norm_backward(floatX* dx, floatX* dh, const floatX* dout, const floatX* x, const float* rstd,
                                   const GainNorm& norm, const floatX* gate_below, ResidualMode mode_below, int N,
                                   float* scratch, cudaStream_t stream) {
    if (N <= 0) { return; }
    const int C = norm.C;
    NormLayout alone = norm_layout(C, {dx, dout, x, norm.gain.w});
    NormLayout layout = norm_layout(C, {dx, dh, dout, x, norm.gain.w});
    if (layout.vector != alone.vector) {
        norm.backward(dx, dout, x, rstd, N, scratch, stream);
        residual_branch_grad(dh, dx, gate_below, mode_below, (size_t)N * C, stream);
        return;
    }
    NormBackwardLaunch launch = norm_backward_launch(N, C, layout.lanes, "residual_norm_backward");
    ResidualBranchGrad branch{dh, gate_below, mode_below};
    if (layout.vector) {
        LAUNCH(launch.blocks, launch.block_size, launch.shared, stream,
               norm_backward_kernel<x128::size, NormDout, NormDinp::accumulate, ResidualBranchGrad>)(
            dx, scratch, NormDout{dout}, x, norm.gain.w, rstd, N, C, layout.lanes, norm.gain_offset, branch);
    } else {
        LAUNCH(launch.blocks, launch.block_size, launch.shared, stream,
               norm_backward_kernel<1, NormDout, NormDinp::accumulate, ResidualBranchGrad>)(
            dx, scratch, NormDout{dout}, x, norm.gain.w, rstd, N, C, layout.lanes, norm.gain_offset, branch);
    }
    cudaCheckLaunch();
    norm.reduce_dgain(scratch, launch.blocks, stream);
}

// GPT-2's pair (train_gpt2.cu): x_out = residual(x, h) (mode, gate as residual_forward; x_out may
// alias x), then out, mean, rstd = norm.forward(x_out), in one launch: layernorm_forward_kernel with
// the residual add as its Before. (Its backward has nothing to fuse: with a standard residual the
// branch's gradient is dx itself, which GPT-2's backward reads in place.)
inline void residual_layernorm_forward(floatX* x_out, const floatX* x, const floatX* h, const floatX* gate,
                                       ResidualMode mode, const LayerNorm& norm, floatX* out, float* mean,
                                       float* rstd, int N, cudaStream_t stream) {
    if (N <= 0) { return; }
    NormLayout alone = norm_layout(norm.C, {out, x_out, norm.weight.w, norm.bias.w});
    NormLayout layout = norm_layout(norm.C, {out, x_out, x, h, norm.weight.w, norm.bias.w});
    if (layout.vector != alone.vector) {  // another chunking: the norm's sums in another order
        residual_forward(x_out, x, h, gate, mode, (size_t)N * norm.C, stream);
        norm.forward(out, mean, rstd, x_out, N, stream);
        return;
    }
    norm.forward(out, mean, rstd, x_out, N, stream, ResidualAdd{x_out, x, h, gate, mode});
}
