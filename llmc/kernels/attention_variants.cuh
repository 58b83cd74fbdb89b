/*
The token mixers of "Deconstructing Attention" (doc/deconstructing.md: the decisions, the
separate form's pole) that need kernels of their own: `approximate` (exp replaced by its
second-order Taylor polynomial) and `nonapprox` (a causal running softmax-weighted average of the
values, weighted by each position's own q.k). The other variants reuse llmc/kernels/attention.cuh
(staticembqk) or llmc/kernels/swiglu.cuh (mlp), plus the SiLU below.
Tensors as in llmc/kernels/attention.cuh: q, out, dq (B, T, Hq, hd), k, v, dk, dv (B, T, Hkv, hd),
floatX, row-major; per-row statistics `stats`: planes of (B, Hq, T) float. Query head h uses kv
head j = h / (Hq / Hkv); visible(t, tau) = tau <= t and (doc_ids == nullptr or the same id):
every row sees itself. Gradients are OVERWRITTEN; the backward maths is above each backward kernel.
1. Taylor, x = q[t].k[tau] / sqrt(hd), sums over the visible tau:
   joint (default; Based's feature map, phi(q).phi(k) = f(x)): f(x) = 1 + x + x^2/2 (>= 1/2)
       Z[t] = sum f(x) (>= 1/2, never vanishes);  out[t] = sum f(x) v[tau] / Z[t]    stats: Z
   separate (the paper's equations): f_0 = 1, f_1 = x, f_2 = x^2/2 normalised apart,
       Z_n[t] = sum f_n;  A_n[t] = sum f_n v / Z_n[t];  out[t] = A_0 + A_1 + A_2   stats: Z_0..Z_2
       (Z_1 = sum x changes sign and can be near 0: the reason this is not the default)
   Layout: one thread per row, kTaylorRows per block, no shared memory; the forward and dq kernels
   own query rows (grid (ceil(T/64), Hq, B)), the dk/dv kernel key rows of a kv head (grid
   (ceil(T/64), Hkv, B)); each reads the other side from global memory. Cost: O(T^2 hd) per head,
   like the scalar attention kernels without their shared-memory tiles.
2. nonapprox, s[t] = q[t].k[t] / sqrt(hd) (stats plane 0), per query head h (kv head j):
       out[t] = sum_visible e^{s[tau]} v[tau] / sum_visible e^{s[tau]}     stats plane 1: lse[t]
   an online softmax with a running maximum (never exp of a positive number); document
   boundaries (where the id changes) reset the running state. Layout: scores and D a thread per
   (b, t, h); the scans a thread per (b, h, e), each walking the whole row; finish a thread per
   (b, t, kv head). Cost: O(T hd) per head, sequential in T (parallel over B x Hq x hd threads).
*/
#pragma once

#include <cmath>

#include "llmc/kernels/attention.cuh"
#include "llmc/choices.h"
#include "llmc/cuda_common.h"

enum class TaylorNorm { Joint, Separate };
inline const Choices<TaylorNorm> kTaylorNorms{{"joint", "separate"}};

constexpr int kTaylorRows = 64;  // rows (threads) per block of the Taylor kernels

inline int taylor_stat_planes(TaylorNorm norm) { return norm == TaylorNorm::Joint ? 1 : 3; }

// Whether key tau is visible from query t of row b (doc_row: that row's ids or nullptr).
__device__ __forceinline__ bool variant_visible(const int* doc_row, int t, int tau) {
    return tau <= t && (doc_row == nullptr || doc_row[tau] == doc_row[t]);
}

// ----------------------------------------------------------------------------------------
// Taylor attention, forward: one thread per query row

template <int HD>
__global__ void taylor_forward_kernel(floatX* out, float* stats, const floatX* q, const floatX* k, const floatX* v,
                                      const int* doc_ids, int B, int T, int Hq, int Hkv, int hd, TaylorNorm norm) {
    int h = blockIdx.y, b = blockIdx.z, j = h / (Hq / Hkv);
    int t = blockIdx.x * kTaylorRows + threadIdx.x;
    if (t >= T) { return; }
    const int* doc_row = doc_ids != nullptr ? doc_ids + (size_t)b * T : nullptr;
    const float scale = 1.0f / sqrtf((float)hd);
    float q_row[HD], acc0[HD], acc1[HD], acc2[HD];
    attn_load_row<HD>(q_row, q, b, t, h, T, Hq, hd, scale);
    for (int e = 0; e < HD; e++) { acc0[e] = acc1[e] = acc2[e] = 0.0f; }
    float z0 = 0.0f, z1 = 0.0f, z2 = 0.0f;
    float k_row[HD], v_row[HD];
    for (int tau = 0; tau <= t; tau++) {
        if (!variant_visible(doc_row, t, tau)) { continue; }
        attn_load_row<HD>(k_row, k, b, tau, j, T, Hkv, hd);
        attn_load_row<HD>(v_row, v, b, tau, j, T, Hkv, hd);
        float x = attn_dot<HD>(q_row, k_row);
        float x2 = 0.5f * x * x;
        if (norm == TaylorNorm::Joint) {
            float f = 1.0f + x + x2;
            z0 += f;
            for (int e = 0; e < HD; e++) { acc0[e] += f * v_row[e]; }
        } else {
            z0 += 1.0f;
            z1 += x;
            z2 += x2;
            for (int e = 0; e < HD; e++) {
                acc0[e] += v_row[e];
                acc1[e] += x * v_row[e];
                acc2[e] += x2 * v_row[e];
            }
        }
    }
    floatX* out_row = out + (((size_t)b * T + t) * Hq + h) * hd;
    size_t stat = ((size_t)b * Hq + h) * T + t, plane = (size_t)B * Hq * T;
    for (int e = 0; e < hd; e++) {
        float o = acc0[e] / z0;
        if (norm == TaylorNorm::Separate) { o += acc1[e] / z1 + acc2[e] / z2; }
        out_row[e] = from_float<floatX>(o);
    }
    stats[stat] = z0;
    if (norm == TaylorNorm::Separate) {
        stats[stat + plane] = z1;
        stats[stat + 2 * plane] = z2;
    }
}

// ----------------------------------------------------------------------------------------
// Taylor attention, backward kernel 1: the row statistics D and dq, one thread per query row.
// D (scratch): joint: one plane D[t]; separate: two planes D_1[t], D_2[t].
// The backward of the Taylor forms (header), dx the gradient of x:
//   joint, D[t] = dout[t].out[t]:       dx = (1 + x) / Z[t] * (dout[t].v[tau] - D[t])
//                                       dv[tau] += f(x) / Z[t] * dout[t]
//   separate, D_n[t] = dout[t].A_n[t]:  dx = (dout.v - D_1) / Z_1 + x (dout.v - D_2) / Z_2
//                                       dv[tau] += (1/Z_0 + x/Z_1 + x^2/(2 Z_2)) dout[t]
//   both: dq[t] = sum_tau dx k[tau] / sqrt(hd)
//         dk[tau] = sum_{h of its group} sum_t dx q[t] / sqrt(hd)
// Each output element is written once, in a fixed order (no atomics). The separate mode's dq
// kernel runs over the keys twice (it recomputes A_1, A_2).

template <int HD>
__global__ void taylor_backward_dq_kernel(floatX* dq, float* D, const floatX* dout, const floatX* out,
                                          const floatX* q, const floatX* k, const floatX* v, const float* stats,
                                          const int* doc_ids, int B, int T, int Hq, int Hkv, int hd,
                                          TaylorNorm norm) {
    int h = blockIdx.y, b = blockIdx.z, j = h / (Hq / Hkv);
    int t = blockIdx.x * kTaylorRows + threadIdx.x;
    if (t >= T) { return; }
    const int* doc_row = doc_ids != nullptr ? doc_ids + (size_t)b * T : nullptr;
    const float scale = 1.0f / sqrtf((float)hd);
    size_t stat = ((size_t)b * Hq + h) * T + t, plane = (size_t)B * Hq * T;
    float q_row[HD], dout_row[HD], dq_acc[HD], k_row[HD], v_row[HD];
    attn_load_row<HD>(q_row, q, b, t, h, T, Hq, hd, scale);
    attn_load_row<HD>(dout_row, dout, b, t, h, T, Hq, hd);
    float d0 = 0.0f, d1 = 0.0f, d2 = 0.0f;
    const float z0 = stats[stat];
    const float z1 = norm == TaylorNorm::Separate ? stats[stat + plane] : 0.0f;
    const float z2 = norm == TaylorNorm::Separate ? stats[stat + 2 * plane] : 0.0f;
    if (norm == TaylorNorm::Joint) {
        attn_load_row<HD>(dq_acc, out, b, t, h, T, Hq, hd);  // out, briefly
        d0 = attn_dot<HD>(dout_row, dq_acc);
        D[stat] = d0;
    } else {  // D_n = dout . A_n needs A_1 and A_2 apart: one pass over the keys recomputes them
        float acc1[HD], acc2[HD];
        for (int e = 0; e < HD; e++) { acc1[e] = acc2[e] = 0.0f; }
        for (int tau = 0; tau <= t; tau++) {
            if (!variant_visible(doc_row, t, tau)) { continue; }
            attn_load_row<HD>(k_row, k, b, tau, j, T, Hkv, hd);
            attn_load_row<HD>(v_row, v, b, tau, j, T, Hkv, hd);
            float x = attn_dot<HD>(q_row, k_row);
            for (int e = 0; e < HD; e++) {
                acc1[e] += x * v_row[e];
                acc2[e] += 0.5f * x * x * v_row[e];
            }
        }
        d1 = attn_dot<HD>(dout_row, acc1) / z1;
        d2 = attn_dot<HD>(dout_row, acc2) / z2;
        D[stat] = d1;
        D[stat + plane] = d2;
    }
    for (int e = 0; e < HD; e++) { dq_acc[e] = 0.0f; }
    for (int tau = 0; tau <= t; tau++) {
        if (!variant_visible(doc_row, t, tau)) { continue; }
        attn_load_row<HD>(k_row, k, b, tau, j, T, Hkv, hd);
        attn_load_row<HD>(v_row, v, b, tau, j, T, Hkv, hd);
        float x = attn_dot<HD>(q_row, k_row);
        float dp = attn_dot<HD>(dout_row, v_row);
        float dx = norm == TaylorNorm::Joint ? (1.0f + x) / z0 * (dp - d0) : (dp - d1) / z1 + x * (dp - d2) / z2;
        for (int e = 0; e < HD; e++) { dq_acc[e] += dx * k_row[e]; }
    }
    floatX* dq_row = dq + (((size_t)b * T + t) * Hq + h) * hd;
    for (int e = 0; e < hd; e++) { dq_row[e] = from_float<floatX>(dq_acc[e] * scale); }
}

// Taylor attention, backward kernel 2: dk and dv, one thread per key row of a kv head.
template <int HD>
__global__ void taylor_backward_dkdv_kernel(floatX* dk, floatX* dv, const float* D, const floatX* dout,
                                            const floatX* q, const floatX* k, const floatX* v, const float* stats,
                                            const int* doc_ids, int B, int T, int Hq, int Hkv, int hd,
                                            TaylorNorm norm) {
    int j = blockIdx.y, b = blockIdx.z, group = Hq / Hkv;
    int tau = blockIdx.x * kTaylorRows + threadIdx.x;
    if (tau >= T) { return; }
    const int* doc_row = doc_ids != nullptr ? doc_ids + (size_t)b * T : nullptr;
    const float scale = 1.0f / sqrtf((float)hd);
    const size_t plane = (size_t)B * Hq * T;
    float k_row[HD], v_row[HD], dk_acc[HD], dv_acc[HD], q_row[HD], dout_row[HD];
    attn_load_row<HD>(k_row, k, b, tau, j, T, Hkv, hd);
    attn_load_row<HD>(v_row, v, b, tau, j, T, Hkv, hd);
    for (int e = 0; e < HD; e++) { dk_acc[e] = dv_acc[e] = 0.0f; }
    for (int h = j * group; h < (j + 1) * group; h++) {
        for (int t = tau; t < T; t++) {
            if (!variant_visible(doc_row, t, tau)) { continue; }
            size_t stat = ((size_t)b * Hq + h) * T + t;
            attn_load_row<HD>(q_row, q, b, t, h, T, Hq, hd, scale);
            attn_load_row<HD>(dout_row, dout, b, t, h, T, Hq, hd);
            float x = attn_dot<HD>(q_row, k_row);
            float dp = attn_dot<HD>(dout_row, v_row);
            float p, dx;
            if (norm == TaylorNorm::Joint) {
                float z = stats[stat];
                p = (1.0f + x + 0.5f * x * x) / z;
                dx = (1.0f + x) / z * (dp - D[stat]);
            } else {
                float z0 = stats[stat], z1 = stats[stat + plane], z2 = stats[stat + 2 * plane];
                p = 1.0f / z0 + x / z1 + 0.5f * x * x / z2;
                dx = (dp - D[stat]) / z1 + x * (dp - D[stat + plane]) / z2;
            }
            for (int e = 0; e < HD; e++) {
                dv_acc[e] += p * dout_row[e];
                dk_acc[e] += dx * q_row[e];  // q_row carries the 1/sqrt(hd)
            }
        }
    }
    floatX* dk_row = dk + (((size_t)b * T + tau) * Hkv + j) * hd;
    floatX* dv_row = dv + (((size_t)b * T + tau) * Hkv + j) * hd;
    for (int e = 0; e < hd; e++) {
        dk_row[e] = from_float<floatX>(dk_acc[e]);
        dv_row[e] = from_float<floatX>(dv_acc[e]);
    }
}

// t.stats: taylor_stat_planes(norm) planes of B*Hq*T floats.
inline void taylor_attention_forward(const AttnShape& s, const AttnTensors& t, TaylorNorm norm, cudaStream_t stream) {
    attention_check_shapes("taylor_attention_forward", s);
    attention_dispatch_head_dim(s.hd, [&](auto head_dim) {
        constexpr int HD = decltype(head_dim)::value;
        dim3 grid(CEIL_DIV(s.T, kTaylorRows), s.Hq, s.B);
        LAUNCH(grid, kTaylorRows, 0, stream, taylor_forward_kernel<HD>)(t.out, t.stats, t.q, t.k, t.v, s.doc_ids, s.B,
                                                                       s.T, s.Hq, s.Hkv, s.hd, norm);
    });
    cudaCheckLaunch();
}

inline size_t taylor_backward_scratch_floats(int B, int T, int Hq, TaylorNorm norm) {
    return (size_t)(norm == TaylorNorm::Joint ? 1 : 2) * B * Hq * T;
}
// g.scratch: at least taylor_backward_scratch_floats floats.
inline void taylor_attention_backward(const AttnShape& s, const AttnTensors& t, const AttnGrads& g, TaylorNorm norm,
                                      cudaStream_t stream) {
    attention_check_shapes("taylor_attention_backward", s);
    attention_dispatch_head_dim(s.hd, [&](auto head_dim) {
        constexpr int HD = decltype(head_dim)::value;
        dim3 grid_dq(CEIL_DIV(s.T, kTaylorRows), s.Hq, s.B);
        LAUNCH(grid_dq, kTaylorRows, 0, stream, taylor_backward_dq_kernel<HD>)(
            g.dq, g.scratch, g.dout, t.out, t.q, t.k, t.v, t.stats, s.doc_ids, s.B, s.T, s.Hq, s.Hkv, s.hd, norm);
        cudaCheckLaunch();
        dim3 grid_dkdv(CEIL_DIV(s.T, kTaylorRows), s.Hkv, s.B);
        LAUNCH(grid_dkdv, kTaylorRows, 0, stream, taylor_backward_dkdv_kernel<HD>)(
            g.dk, g.dv, g.scratch, g.dout, t.q, t.k, t.v, t.stats, s.doc_ids, s.B, s.T, s.Hq, s.Hkv, s.hd, norm);
    });
    cudaCheckLaunch();
}

// ----------------------------------------------------------------------------------------
// nonapprox

// s[b, h, t] = q[b,t,h] . k[b,t,j] / sqrt(hd), one thread per (b, t, h)
__global__ void nonapprox_scores_kernel(float* scores, const floatX* q, const floatX* k, int B, int T, int Hq, int Hkv,
                                        int hd) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= B * T * Hq) { return; }
    int h = i % Hq, t = (i / Hq) % T, b = i / (Hq * T), j = h / (Hq / Hkv);
    const floatX* q_row = q + (size_t)i * hd;
    const floatX* k_row = k + (((size_t)b * T + t) * Hkv + j) * hd;
    float s = 0.0f;
    for (int e = 0; e < hd; e++) { s += to_float(q_row[e]) * to_float(k_row[e]); }
    scores[((size_t)b * Hq + h) * T + t] = s / sqrtf((float)hd);
}

// the running average, one thread per (b, h, e)
__global__ void nonapprox_forward_kernel(floatX* out, float* lse, const float* scores, const floatX* v,
                                         const int* doc_ids, int B, int T, int Hq, int Hkv, int hd) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= B * Hq * hd) { return; }
    int e = i % hd, h = (i / hd) % Hq, b = i / (hd * Hq), j = h / (Hq / Hkv);
    const int* doc_row = doc_ids != nullptr ? doc_ids + (size_t)b * T : nullptr;
    const float* s_row = scores + ((size_t)b * Hq + h) * T;
    float running_max = -INFINITY, running_sum = 0.0f, acc = 0.0f;
    for (int t = 0; t < T; t++) {
        if (doc_row != nullptr && t > 0 && doc_row[t] != doc_row[t - 1]) {  // a new document
            running_max = -INFINITY;
            running_sum = 0.0f;
            acc = 0.0f;
        }
        float s = s_row[t];
        if (s > running_max) {  // rescale what was accumulated to the new maximum
            float correction = kernel_expf(running_max - s);
            running_sum *= correction;
            acc *= correction;
            running_max = s;
        }
        float p = kernel_expf(s - running_max);
        running_sum += p;
        acc += p * to_float(v[(((size_t)b * T + t) * Hkv + j) * hd + e]);
        out[(((size_t)b * T + t) * Hq + h) * hd + e] = from_float<floatX>(acc / running_sum);
        if (e == 0) { lse[((size_t)b * Hq + h) * T + t] = running_max + logf(running_sum); }
    }
}

// The backward, D[t] = dout[t].out[t], with w[t,tau] = exp(s[tau] - lse[t]) <= 1:
//     dvh[tau] = sum_{t >= tau, visible} w[t,tau] dout[t]        (per query head)
//     ds[tau]  = v[tau].dvh[tau] - sum_{t >= tau, visible} w[t,tau] D[t]
//     dq[t] = ds[t] k[t] / sqrt(hd);  dk[t] = sum_{h of the group} ds_h[t] q_h[t] / sqrt(hd);
//     dv[t] = sum_{h of the group} dvh_h[t]
// The suffix sums run backwards with a running reference m = min_{t' >= tau} lse[t'] (>= s[tau],
// since lse[t'] >= s[tau] for every t' that sees tau): they hold sum exp(m - lse[t]) (...), every
// factor <= 1, and dvh[tau] = exp(s[tau] - m) * sum, again <= 1 per term.
// The scans: consecutive threads consecutive e, so the v/out/dout accesses coalesce; the running
// scalars are computed by every thread of the head alike (thread e = 0 writes them).
// Scratch (nonapprox_backward_scratch_floats): D, the suffix term of ds, and dvh (fp32).

// D[b, h, t] = dout . out, one thread per (b, t, h)
__global__ void nonapprox_rowdot_kernel(float* D, const floatX* dout, const floatX* out, int B, int T, int Hq, int hd) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= B * T * Hq) { return; }
    int h = i % Hq, t = (i / Hq) % T, b = i / (Hq * T);
    float s = 0.0f;
    for (int e = 0; e < hd; e++) { s += to_float(dout[(size_t)i * hd + e]) * to_float(out[(size_t)i * hd + e]); }
    D[((size_t)b * Hq + h) * T + t] = s;
}

// the suffix sums, backwards, one thread per (b, h, e): dvh (B, T, Hq, hd) fp32 and the
// second term of ds, c[b, h, tau] = sum_{t >= tau} w[t,tau] D[t]
__global__ void nonapprox_backward_scan_kernel(float* dvh, float* c, const float* D, const float* scores,
                                               const float* lse, const floatX* dout, const int* doc_ids, int B, int T,
                                               int Hq, int hd) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= B * Hq * hd) { return; }
    int e = i % hd, h = (i / hd) % Hq, b = i / (hd * Hq);
    const int* doc_row = doc_ids != nullptr ? doc_ids + (size_t)b * T : nullptr;
    const size_t row = ((size_t)b * Hq + h) * T;
    float ref = INFINITY, sum = 0.0f, sum_D = 0.0f;  // sums of exp(ref - lse[t]) (dout[t][e], D[t])
    for (int t = T - 1; t >= 0; t--) {
        if (doc_row != nullptr && t < T - 1 && doc_row[t] != doc_row[t + 1]) {  // t ends a document
            ref = INFINITY;
            sum = 0.0f;
            sum_D = 0.0f;
        }
        float l = lse[row + t];
        if (l < ref) {  // a smaller reference: rescale (factor <= 1; exp(-inf) = 0 on the first)
            float correction = kernel_expf(l - ref);
            sum *= correction;
            sum_D *= correction;
            ref = l;
        }
        float w = kernel_expf(ref - l);
        sum += w * to_float(dout[(((size_t)b * T + t) * Hq + h) * hd + e]);
        sum_D += w * D[row + t];
        float to_s = kernel_expf(scores[row + t] - ref);
        dvh[(((size_t)b * T + t) * Hq + h) * hd + e] = to_s * sum;
        if (e == 0) { c[row + t] = to_s * sum_D; }
    }
}

// ds = v . dvh - c, then dq, dk, dv; one thread per (b, t, kv head j)
template <int HD>
__global__ void nonapprox_backward_finish_kernel(floatX* dq, floatX* dk, floatX* dv, const float* dvh, const float* c,
                                                 const floatX* q, const floatX* k, const floatX* v, int B, int T,
                                                 int Hq, int Hkv, int hd) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= B * T * Hkv) { return; }
    int j = i % Hkv, t = (i / Hkv) % T, b = i / (Hkv * T), group = Hq / Hkv;
    const float scale = 1.0f / sqrtf((float)hd);
    float k_row[HD], v_row[HD], dk_acc[HD], dv_acc[HD];
    attn_load_row<HD>(k_row, k, b, t, j, T, Hkv, hd);
    attn_load_row<HD>(v_row, v, b, t, j, T, Hkv, hd);
    for (int e = 0; e < HD; e++) { dk_acc[e] = dv_acc[e] = 0.0f; }
    for (int h = j * group; h < (j + 1) * group; h++) {
        const float* dvh_row = dvh + (((size_t)b * T + t) * Hq + h) * hd;
        const floatX* q_row = q + (((size_t)b * T + t) * Hq + h) * hd;
        float ds = -c[((size_t)b * Hq + h) * T + t];
        for (int e = 0; e < hd; e++) { ds += v_row[e] * dvh_row[e]; }
        floatX* dq_row = dq + (((size_t)b * T + t) * Hq + h) * hd;
        for (int e = 0; e < hd; e++) {
            dq_row[e] = from_float<floatX>(ds * k_row[e] * scale);
            dk_acc[e] += ds * to_float(q_row[e]) * scale;
            dv_acc[e] += dvh_row[e];
        }
    }
    floatX* dk_row = dk + (((size_t)b * T + t) * Hkv + j) * hd;
    floatX* dv_row = dv + (((size_t)b * T + t) * Hkv + j) * hd;
    for (int e = 0; e < hd; e++) {
        dk_row[e] = from_float<floatX>(dk_acc[e]);
        dv_row[e] = from_float<floatX>(dv_acc[e]);
    }
}

// t.stats: 2 planes of B*Hq*T floats (the scores, then lse).
inline void nonapprox_forward(const AttnShape& s, const AttnTensors& t, cudaStream_t stream) {
    attention_check_shapes("nonapprox_forward", s);
    const int B = s.B, T = s.T, Hq = s.Hq, Hkv = s.Hkv, hd = s.hd;
    float* scores = t.stats;
    float* lse = t.stats + (size_t)B * Hq * T;
    const int block = 128;
    LAUNCH(CEIL_DIV(B * T * Hq, block), block, 0, stream, nonapprox_scores_kernel)(scores, t.q, t.k, B, T, Hq, Hkv, hd);
    cudaCheckLaunch();
    LAUNCH(CEIL_DIV(B * Hq * hd, block), block, 0, stream, nonapprox_forward_kernel)(t.out, lse, scores, t.v, s.doc_ids,
                                                                                     B, T, Hq, Hkv, hd);
    cudaCheckLaunch();
}

inline size_t nonapprox_backward_scratch_floats(int B, int T, int Hq, int hd) {
    return 2 * (size_t)B * Hq * T + (size_t)B * T * Hq * hd;
}
// g.scratch: at least nonapprox_backward_scratch_floats floats.
inline void nonapprox_backward(const AttnShape& s, const AttnTensors& t, const AttnGrads& g, cudaStream_t stream) {
    attention_check_shapes("nonapprox_backward", s);
    const int B = s.B, T = s.T, Hq = s.Hq, Hkv = s.Hkv, hd = s.hd;
    const size_t plane = (size_t)B * Hq * T;
    const float* scores = t.stats;
    const float* lse = t.stats + plane;
    float* D = g.scratch;
    float* c = g.scratch + plane;
    float* dvh = g.scratch + 2 * plane;
    const int block = 128;
    LAUNCH(CEIL_DIV(B * T * Hq, block), block, 0, stream, nonapprox_rowdot_kernel)(D, g.dout, t.out, B, T, Hq, hd);
    cudaCheckLaunch();
    LAUNCH(CEIL_DIV(B * Hq * hd, block), block, 0, stream, nonapprox_backward_scan_kernel)(
        dvh, c, D, scores, lse, g.dout, s.doc_ids, B, T, Hq, hd);
    cudaCheckLaunch();
    attention_dispatch_head_dim(hd, [&](auto head_dim) {
        constexpr int HD = decltype(head_dim)::value;
        LAUNCH(CEIL_DIV(B * T * Hkv, block), block, 0, stream, nonapprox_backward_finish_kernel<HD>)(
            g.dq, g.dk, g.dv, dvh, c, t.q, t.k, t.v, B, T, Hq, Hkv, hd);
    });
    cudaCheckLaunch();
}

// ----------------------------------------------------------------------------------------
// SiLU for nonapprox's queries (q = SiLU(u W_q)): out = x sigmoid(x); backward
// dinp = dout * sigmoid(x) (1 + x (1 - sigmoid(x))), OVERWRITTEN. One thread per element;
// out may alias inp and dinp may alias dout.

__global__ void silu_forward_kernel(floatX* out, const floatX* inp, size_t N) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= N) { return; }
    float x = to_float(inp[i]);
    out[i] = from_float<floatX>(x / (1.0f + kernel_expf(-x)));
}
__global__ void silu_backward_kernel(floatX* dinp, const floatX* dout, const floatX* inp, size_t N) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= N) { return; }
    float x = to_float(inp[i]);
    float sig = 1.0f / (1.0f + kernel_expf(-x));
    dinp[i] = from_float<floatX>(to_float(dout[i]) * sig * (1.0f + x * (1.0f - sig)));
}
inline void silu_forward(floatX* out, const floatX* inp, size_t N, cudaStream_t stream) {
    if (N == 0) { return; }
    LAUNCH((unsigned)CEIL_DIV(N, (size_t)256), 256, 0, stream, silu_forward_kernel)(out, inp, N);
    cudaCheckLaunch();
}
inline void silu_backward(floatX* dinp, const floatX* dout, const floatX* inp, size_t N, cudaStream_t stream) {
    if (N == 0) { return; }
    LAUNCH((unsigned)CEIL_DIV(N, (size_t)256), 256, 0, stream, silu_backward_kernel)(dinp, dout, inp, N);
    cudaCheckLaunch();
}
