/*
ZCN / RMSNorm over rows, forward and backward (doc/san-model.md "Forward pass"):

    out[r, :] = (gain_offset + gain[:]) * (inp[r, :] * rstd[r]),   rstd[r] = 1 / sqrt(mean(inp[r, :]^2) + eps)

gain_offset = 1 is ZCN (gains init 0), 0 is RMSNorm (gains init 1). inp, out: (N, C) row-major
floatX; gain: (C) floatX, shared by all rows; rstd: (N) fp32. All maths in fp32; the
normalised row is not rounded before the gain multiply, the output is rounded once.
The same kernels serve the residual stream (C = d, N = B*T) and per-head QK-norm
(C = head_dim, N = B*T*heads).

Launch layout: a "row group" of L lanes (L = the power of two >= C / V, at most 32, where V
is the vector width: x128::size when C and every pointer allow 128-bit access, else 1)
handles one row; lanes stride over the row in V-element chunks and combine their partial
sums with L-wide xor shuffles (log2 L shuffles per row, no barriers). Row groups never
straddle a warp, and every lane of a warp takes part in every shuffle (a group whose row
is past N contributes zeros), so the shuffles use the full mask.

Backward (dinp and dgain ACCUMULATED):
    y = inp * rstd,  dy = dout * (gain_offset + gain)
    dinp += rstd * (dy - y * mean(dy * y))          per row
    dgain += sum over rows of dout * y
The backward kernel takes two template choices besides V: how it reads dout (Grad, NormDout:
the tensor as it is; the fused QK-norm + RoPE backward passes one that rotates it back through
RoPE first, llmc/kernels/qk_norm_rope.cuh) and whether dinp accumulates (NormDinp).
Deterministic dgain without atomics: a grid of at most kNormBackwardMaxBlocks blocks; each
row group loops over rows (grid-stride) accumulating dout*y into its own shared-memory row
of C floats (each lane owns fixed columns, so no races); at the end the block sums its
groups in fixed order into scratch[block, :], and a second kernel sums the blocks in fixed
order and adds the result to dgain. dinp must not alias dout or inp.

Calls: norm_forward(out, rstd, inp, gain, N, C, gain_offset, eps, stream), and GainNorm (at
the end: a norm with its gain tensor and the gain's gradient) whose forward wraps it and
whose backward launches the backward kernels.
*/
#pragma once

#include <cstdint>
#include <initializer_list>

#include "llmc/kernels/align.h"
#include "llmc/cuda_common.h"

constexpr int kNormBackwardMaxBlocks = 512;
constexpr int kNormMaxSharedBytes = 48 * 1024;

// ----------------------------------------------------------------------------------------
// helpers (rows are read and written V elements at a time: load_floats / store_floats)

// Sum over the L lanes of a row group (L a power of two <= 32); every lane of the warp calls it.
__device__ inline float norm_group_sum(float value, int lanes) {
    for (int offset = lanes / 2; offset > 0; offset /= 2) { value += __shfl_xor_sync(0xffffffffu, value, offset); }
    return value;
}

// The backward's per-element steps with their fused multiply-adds written out. A compiler may
// contract a * b + c into an fma or not, and which product of a * b + c * d, as it likes (g++
// did it one way in norm_backward_kernel<1> and another in <x128::size>); written out, the
// fused QK-norm + RoPE backward (llmc/kernels/qk_norm_rope.cuh: this kernel with another Grad
// and NormDinp, so another instantiation) gives the plain one's results bit for bit on either
// executor. They are the contractions g++ chose for the 128-bit path (its host results did not
// change; the scalar path's fp32 results moved by an ulp in places).
// backward, first pass: sum_dy_y += dy * y and acc += dout * y, dy = dout * (gain_offset + gain)
__device__ inline void norm_backward_sums(float& sum_dy_y, float& acc, float d, float gain_plus_offset, float y) {
    sum_dy_y = fmaf(d * gain_plus_offset, y, sum_dy_y);
    acc = fmaf(d, y, acc);
}
// backward, second pass: di + rstd * (dy - y * mean(dy * y))
__device__ inline float norm_backward_dinp(float di, float d, float gain_plus_offset, float x, float s,
                                           float mean_dy_y) {
    return fmaf(s, fmaf(-(x * s), mean_dy_y, d * gain_plus_offset), di);
}

// The forward's first pass: rstd = 1 / sqrt(mean(x^2) + eps) of row r of inp, the sum of
// squares over the row group's lanes (each lane's V-element chunks in order, then
// norm_group_sum). Every lane of the warp calls it; a row past N adds nothing (its result is
// not used). The fused QK-norm + RoPE forward calls it too: the same float operations.
template <int V>
__device__ inline float norm_row_rstd(const floatX* inp, int r, int N, int C, int lane, int lanes, float eps) {
    float sum_sq = 0.0f;
    if (r < N) {
        const floatX* row = inp + (size_t)r * C;
        for (int c = lane * V; c < C; c += lanes * V) {
            float x[V];
            load_floats<V>(x, row + c);
            for (int k = 0; k < V; k++) { sum_sq += x[k] * x[k]; }
        }
    }
    sum_sq = norm_group_sum(sum_sq, lanes);
    return rsqrtf(sum_sq / C + eps);
}

// What a forward kernel does to a valid row before it normalises it (its Before):
// row<V>(offset, lane, lanes, C) over the lane's own chunks of the row that starts at element
// offset. NormNothingBefore: nothing; residual_norm.cuh's ResidualAdd: writes the row as a
// residual add, so that the norm reads it back.
struct NormNothingBefore {
    template <int V>
    __device__ void row(size_t, int, int, int) const {}
};

// ----------------------------------------------------------------------------------------
// kernels. blockDim.x is a multiple of 32 and of `lanes`; C % V == 0.

// before: what it does to each valid row first (NormNothingBefore, or residual_norm.cuh's
// ResidualAdd, which writes inp's row); the sums then read the row back, each lane its own chunks.
template <int V, class Before = NormNothingBefore>
__global__ void norm_forward_kernel(floatX* out, float* rstd, const floatX* inp, const floatX* gain, int N, int C,
                                    int lanes, float gain_offset, float eps, Before before) {
    int lane = threadIdx.x % lanes;
    int r = blockIdx.x * (blockDim.x / lanes) + threadIdx.x / lanes;
    if (r < N) { before.template row<V>((size_t)r * C, lane, lanes, C); }
    float s = norm_row_rstd<V>(inp, r, N, C, lane, lanes, eps);  // the whole warp, rows past N too
    if (r >= N) { return; }
    const floatX* row = inp + (size_t)r * C;
    for (int c = lane * V; c < C; c += lanes * V) {
        float x[V], g[V], y[V];
        load_floats<V>(x, row + c);  // second read hits the cache
        load_floats<V>(g, gain + c);
        for (int k = 0; k < V; k++) { y[k] = (x[k] * s) * (gain_offset + g[k]); }
        store_floats<V>(out + (size_t)r * C + c, y);
    }
    if (lane == 0 && rstd != nullptr) { rstd[r] = s; }
}

// The backward's read of dL/d out (its Grad): load(d, r, offset, c) puts columns c .. c + V - 1
// of row r (whose elements start at offset = r * C) into d. NormDout reads the tensor dout.
struct NormDout {
    const floatX* dout;
    template <int V>
    __device__ void load(float (&d)[V], int r, size_t offset, int c) const {
        load_floats<V>(d, dout + offset + c);
    }
};

// What the backward does with dinp: adds its gradient to it, or overwrites it (as a zeroed
// dinp accumulated: the same float operations, without reading dinp)
enum class NormDinp { accumulate, overwrite };

// What else it writes from each finished chunk of dinp (its Extra): store(di, offset, c) after
// dinp's store. NormNoExtra: nothing; residual_norm.cuh's ResidualBranchGrad: the gradient of
// the branch of the residual below.
struct NormNoExtra {
    template <int V>
    __device__ void store(const float (&)[V], size_t, int) const {}
};

// Dynamic shared memory: (blockDim.x / lanes) * C floats. Writes scratch[blockIdx.x * C + c].
template <int V, class Grad = NormDout, NormDinp dinp_mode = NormDinp::accumulate, class Extra = NormNoExtra>
__global__ void norm_backward_kernel(floatX* dinp, float* scratch, Grad grad, const floatX* inp, const floatX* gain,
                                     const float* rstd, int N, int C, int lanes, float gain_offset, Extra extra) {
    int groups = blockDim.x / lanes;
    int group = threadIdx.x / lanes;
    int lane = threadIdx.x % lanes;
    // this group's dgain partials, column c at (c % V) * (C / V) + c / V: consecutive lanes
    // touch consecutive words (no bank conflicts with 128-bit chunks)
    const int chunks = C / V;
    float* acc = dynamic_shared_memory<float>() + (size_t)group * C;
    for (int c = lane * V; c < C; c += lanes * V) {
        for (int k = 0; k < V; k++) { acc[k * chunks + c / V] = 0.0f; }
    }
    int stride = gridDim.x * groups;
    int iterations = CEIL_DIV(N, stride);  // the same for every group of the block: shuffles stay converged
    for (int it = 0; it < iterations; it++) {
        int r = it * stride + blockIdx.x * groups + group;
        bool valid = r < N;
        size_t offset = (size_t)(valid ? r : 0) * C;
        float s = valid ? rstd[r] : 0.0f;
        float sum_dy_y = 0.0f;
        if (valid) {
            for (int c = lane * V; c < C; c += lanes * V) {
                float x[V], d[V], g[V];
                load_floats<V>(x, inp + offset + c);
                grad.load(d, r, offset, c);
                load_floats<V>(g, gain + c);
                for (int k = 0; k < V; k++) {
                    norm_backward_sums(sum_dy_y, acc[k * chunks + c / V], d[k], gain_offset + g[k], x[k] * s);
                }
            }
        }
        sum_dy_y = norm_group_sum(sum_dy_y, lanes);
        if (valid) {
            float mean_dy_y = sum_dy_y / C;
            for (int c = lane * V; c < C; c += lanes * V) {
                float x[V], d[V], g[V], di[V];
                load_floats<V>(x, inp + offset + c);
                grad.load(d, r, offset, c);
                load_floats<V>(g, gain + c);
                if constexpr (dinp_mode == NormDinp::accumulate) {
                    load_floats<V>(di, dinp + offset + c);
                } else {
                    for (int k = 0; k < V; k++) { di[k] = 0.0f; }
                }
                for (int k = 0; k < V; k++) {
                    di[k] = norm_backward_dinp(di[k], d[k], gain_offset + g[k], x[k], s, mean_dy_y);
                }
                store_floats<V>(dinp + offset + c, di);
                extra.store(di, offset, c);
            }
        }
    }
    __syncthreads();
    const float* all = dynamic_shared_memory<float>();
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        float sum = 0.0f;
        int position = (c % V) * chunks + c / V;
        for (int g = 0; g < groups; g++) { sum += all[(size_t)g * C + position]; }
        scratch[(size_t)blockIdx.x * C + c] = sum;
    }
}

// dgain[c] += sum over b < blocks of partial[b * C + c], in a fixed order.
// Block (32, 8): column blockIdx.x * 32 + threadIdx.x; threadIdx.y strides over the blocks.
__global__ void norm_dgain_reduce_kernel(floatX* dgain, const float* partial, int blocks, int C) {
    __shared__ float sums[8][32];
    int c = blockIdx.x * 32 + threadIdx.x;
    float sum = 0.0f;
    if (c < C) {
        for (int b = threadIdx.y; b < blocks; b += 8) { sum += partial[(size_t)b * C + c]; }
    }
    sums[threadIdx.y][threadIdx.x] = sum;
    __syncthreads();
    if (threadIdx.y == 0 && c < C) {
        float total = 0.0f;
        for (int y = 0; y < 8; y++) { total += sums[y][threadIdx.x]; }
        dgain[c] = from_float<floatX>(to_float(dgain[c]) + total);
    }
}

// ----------------------------------------------------------------------------------------
// launchers

struct NormLayout {
    bool vector;  // 128-bit path
    int lanes;    // lanes per row
};

inline NormLayout norm_layout(int C, std::initializer_list<const void*> pointers) {
    NormLayout layout;
    layout.vector = C % x128::size == 0 && aligned16(pointers);
    int chunks = layout.vector ? C / x128::size : C;
    layout.lanes = 1;
    // On the host backend every shuffle is a fiber switch per lane, and lanes run one after
    // another anyway: one lane per row is fastest there.
    int max_lanes = HOST_BACKEND ? 1 : 32;
    while (layout.lanes < max_lanes && layout.lanes < chunks) { layout.lanes *= 2; }
    return layout;
}

// `before` (the kernel's Before) writes inp's rows first: its pointers must give the layout that
// out, inp and gain give (residual_norm.cuh's residual_norm_forward checks)
template <class Before = NormNothingBefore>
inline void norm_forward(floatX* out, float* rstd, const floatX* inp, const floatX* gain, int N, int C,
                         float gain_offset, float eps, cudaStream_t stream, Before before = {}) {
    if (N <= 0) { return; }
    NormLayout layout = norm_layout(C, {out, inp, gain});
    const int block_size = 256;
    int grid = CEIL_DIV(N, block_size / layout.lanes);
    if (layout.vector) {
        LAUNCH(grid, block_size, 0, stream, norm_forward_kernel<x128::size, Before>)(
            out, rstd, inp, gain, N, C, layout.lanes, gain_offset, eps, before);
    } else {
        LAUNCH(grid, block_size, 0, stream, norm_forward_kernel<1, Before>)(
            out, rstd, inp, gain, N, C, layout.lanes, gain_offset, eps, before);
    }
    cudaCheckLaunch();
}

inline int norm_backward_blocks(int N) { return N < kNormBackwardMaxBlocks ? N : kNormBackwardMaxBlocks; }

inline size_t norm_backward_scratch_floats(int N, int C) { return (size_t)norm_backward_blocks(N) * C; }

// The backward kernel's launch for N rows of C with `lanes` lanes a row: as many row groups a
// block as their dgain rows fit in kNormMaxSharedBytes (at most 256 threads), at most
// norm_backward_blocks(N) blocks. `who` names the caller in the error of a C too wide.
struct NormBackwardLaunch {
    int blocks, block_size;
    size_t shared;
};
inline NormBackwardLaunch norm_backward_launch(int N, int C, int lanes, const char* who) {
    int groups = 256 / lanes;
    while (groups > 1 && (size_t)groups * C * sizeof(float) > (size_t)kNormMaxSharedBytes) { groups /= 2; }
    if ((size_t)groups * C * sizeof(float) > (size_t)kNormMaxSharedBytes) {
        fprintf(stderr, "%s: C = %d needs more than %d bytes of shared memory\n", who, C, kNormMaxSharedBytes);
        exit(EXIT_FAILURE);
    }
    NormBackwardLaunch launch;
    // lanes < 32 only for C < 32 * V, where groups stays 256 / lanes: block_size is a multiple of 32
    launch.block_size = groups * lanes;
    launch.blocks = CEIL_DIV(N, groups);
    if (launch.blocks > norm_backward_blocks(N)) { launch.blocks = norm_backward_blocks(N); }
    launch.shared = (size_t)groups * C * sizeof(float);
    return launch;
}

// A norm as a model calls it: its gain tensor (and the gain's gradient), the row width C and
// how the gains are stored. forward: out = norm(x) over N rows (rstd kept for backward);
// backward: dx += dL/dx and gain.grad += dL/dgain, from dout = dL/d out and the forward's x, rstd.
struct GainNorm {
    Weight gain;
    int C = 0;
    float gain_offset = 0.0f, eps = 0.0f;

    void forward(floatX* out, float* rstd, const floatX* x, int N, cudaStream_t stream) const {
        norm_forward(out, rstd, x, gain.w, N, C, gain_offset, eps, stream);
    }
    // (the launch of the backward kernels above: scratch holds norm_backward_scratch_floats(N, C))
    void backward(floatX* dx, const floatX* dout, const floatX* x, const float* rstd, int N, float* scratch,
                  cudaStream_t stream) const {
        if (N <= 0) { return; }
        NormLayout layout = norm_layout(C, {dx, dout, x, gain.w});
        NormBackwardLaunch launch = norm_backward_launch(N, C, layout.lanes, "GainNorm::backward");
        if (layout.vector) {
            LAUNCH(launch.blocks, launch.block_size, launch.shared, stream, norm_backward_kernel<x128::size>)(
                dx, scratch, NormDout{dout}, x, gain.w, rstd, N, C, layout.lanes, gain_offset, NormNoExtra{});
        } else {
            LAUNCH(launch.blocks, launch.block_size, launch.shared, stream, norm_backward_kernel<1>)(
                dx, scratch, NormDout{dout}, x, gain.w, rstd, N, C, layout.lanes, gain_offset, NormNoExtra{});
        }
        cudaCheckLaunch();
        reduce_dgain(scratch, launch.blocks, stream);
    }
    // gain.grad += the sum of the backward kernel's per-block partials in scratch
    void reduce_dgain(const float* scratch, int blocks, cudaStream_t stream) const {
        LAUNCH(CEIL_DIV(C, 32), dim3(32, 8), 0, stream, norm_dgain_reduce_kernel)(gain.grad, scratch, blocks, C);
        cudaCheckLaunch();
    }
};
