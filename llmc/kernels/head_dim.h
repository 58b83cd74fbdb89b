/*
The attention kernels are templates on their head dim HD (register arrays of HD floats);
dispatch_head_dim turns a run-time head dim into one of the instantiated ones, for both the
scalar kernels (llmc/kernels/attention.cuh, llmc/kernels/attention_variants.cuh: from 8) and the tensor-core
ones (llmc/kernels/attention_tc.cuh: from 16). Host-side C++17.
*/
#pragma once

#include <type_traits>

// Calls f(std::integral_constant<int, HD>) with HD the smallest of Smallest, 2 Smallest, ...,
// 128 that is >= hd (the callers have checked hd <= 128).
template <int Smallest, typename F>
void dispatch_head_dim(int hd, F f) {
    if (hd <= Smallest || Smallest == 128) {
        f(std::integral_constant<int, Smallest>{});
    } else if constexpr (Smallest < 128) {
        dispatch_head_dim<2 * Smallest>(hd, f);
    }
}
