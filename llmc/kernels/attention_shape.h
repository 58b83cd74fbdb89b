/*
The arguments of an attention call, by name: its shape (AttnShape), its tensors (AttnTensors)
and, for a backward, its gradients (AttnGrads). Every attention kernel family takes them:
llmc/kernels/attention.cuh (softmax attention), llmc/kernels/attention_variants.cuh (Taylor, nonapprox),
llmc/kernels/kv_cache.cuh (the one-position decode).
*/
#pragma once

#include "llmc/cuda_common.h"

// One attention call's shape: B rows of T positions, Hq query heads sharing Hkv kv heads of
// hd; doc_ids (B*T ints, or null for causal only) is the mask's other half.
struct AttnShape {
    int B, T, Hq, Hkv, hd;
    const int* doc_ids = nullptr;
};
// Its tensors, row-major: q (B,T,Hq,hd); k, v (B,T,Hkv,hd); out (B,T,Hq,hd); stats: the
// forward's per-row statistics, planes of (B,Hq,T) floats (softmax attention: one, the lse).
template <typename T>
struct AttnTensorsOf {
    const T *q, *k, *v;
    T* out;
    float* stats;
};
// The backward's: dL/d out, and the gradients it writes (dq like q; dk, dv like k), with
// the kernels' fp32 scratch.
template <typename T>
struct AttnGradsOf {
    const T* dout;
    T *dq, *dk, *dv;
    float* scratch;
};
using AttnTensors = AttnTensorsOf<floatX>;
using AttnGrads = AttnGradsOf<floatX>;
