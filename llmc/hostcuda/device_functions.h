/*
Host backend: what a kernel body can call. The built-in index variables, barriers, warp
shuffles and votes (implemented by the scheduler's collectives), atomics (GCC __atomic
builtins, so they are real atomics between workers running blocks in parallel), cache
hint loads/stores (plain accesses on the CPU), and CUDA's math intrinsics.
*/
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "bf16.h"
#include "scheduler.h"

#define threadIdx (::hostcuda::tls.thread_idx)
#define blockIdx (::hostcuda::tls.block_idx)
#define blockDim (::hostcuda::tls.block_dim)
#define gridDim (::hostcuda::tls.grid_dim)
constexpr int warpSize = 32;

// ---------------------------------------------------------------------------------------
// barriers and warp collectives

inline void __syncthreads() { hostcuda::block_barrier(0); }
inline int __syncthreads_count(int predicate) { return hostcuda::block_barrier(predicate); }
inline int __syncthreads_or(int predicate) { return hostcuda::block_barrier(predicate) != 0; }
inline int __syncthreads_and(int predicate) { return hostcuda::block_barrier(!predicate) == 0; }
inline void __syncwarp(unsigned mask = 0xffffffffu) {
    hostcuda::warp_collective(hostcuda::CollectiveKind::SyncWarp, mask, 0, 0, "__syncwarp");
}
inline unsigned __activemask() { return hostcuda::active_lanes(); }

namespace hostcuda {
template <typename T>
T shuffle(unsigned mask, T var, int source_lane, const char* name) {
    static_assert(std::is_trivially_copyable<T>::value && sizeof(T) <= 8, "shuffle of a type wider than 8 bytes");
#if defined(HOSTCUDA_MUTATION_SHFL_WRONG_LANE)
    source_lane = (source_lane + 1) % kWarpSize;
#endif
    uint64_t bits = 0;
    memcpy(&bits, &var, sizeof(T));
    bits = warp_collective(CollectiveKind::Shuffle, mask, bits, source_lane, name);
    T out;
    memcpy(&out, &bits, sizeof(T));
    return out;
}
inline int lane_id() { return tls.fiber->linear_tid % kWarpSize; }
}  // namespace hostcuda

// Source lanes follow the CUDA rules for `width` < 32: a lane reads inside its own segment
// of `width` lanes; shfl_xor may read an earlier segment but not a later one; a lane whose
// source falls outside gets its own value back.
template <typename T>
T __shfl_sync(unsigned mask, T var, int src_lane, int width = warpSize) {
    int lane = hostcuda::lane_id();
    int src = (lane & ~(width - 1)) + (src_lane & (width - 1));
    return hostcuda::shuffle(mask, var, src, "__shfl_sync");
}
template <typename T>
T __shfl_xor_sync(unsigned mask, T var, int lane_mask, int width = warpSize) {
    int lane = hostcuda::lane_id();
    int src = lane ^ lane_mask;
    if (src >= (lane & ~(width - 1)) + width) { src = lane; }
    return hostcuda::shuffle(mask, var, src, "__shfl_xor_sync");
}
template <typename T>
T __shfl_down_sync(unsigned mask, T var, unsigned delta, int width = warpSize) {
    int lane = hostcuda::lane_id();
    int src = (lane & (width - 1)) + static_cast<int>(delta) < width ? lane + static_cast<int>(delta) : lane;
    return hostcuda::shuffle(mask, var, src, "__shfl_down_sync");
}
template <typename T>
T __shfl_up_sync(unsigned mask, T var, unsigned delta, int width = warpSize) {
    int lane = hostcuda::lane_id();
    int src = (lane & (width - 1)) >= static_cast<int>(delta) ? lane - static_cast<int>(delta) : lane;
    return hostcuda::shuffle(mask, var, src, "__shfl_up_sync");
}
inline unsigned __ballot_sync(unsigned mask, int predicate) {
    return static_cast<unsigned>(
        hostcuda::warp_collective(hostcuda::CollectiveKind::Ballot, mask, predicate != 0, 0, "__ballot_sync"));
}
inline int __all_sync(unsigned mask, int predicate) {
    return static_cast<int>(
        hostcuda::warp_collective(hostcuda::CollectiveKind::All, mask, predicate != 0, 0, "__all_sync"));
}
inline int __any_sync(unsigned mask, int predicate) {
    return static_cast<int>(
        hostcuda::warp_collective(hostcuda::CollectiveKind::Any, mask, predicate != 0, 0, "__any_sync"));
}

// ---------------------------------------------------------------------------------------
// atomics: relaxed read-modify-write, returning the old value, as on the GPU

namespace hostcuda {
#if defined(HOSTCUDA_MUTATION_ATOMICS_NONATOMIC)
inline void reschedule_current_thread();  // (scheduler.h)
#endif
// Applies `op` to *address atomically with a compare-and-swap loop on the raw bits.
template <typename T, typename Bits, typename Op>
T atomic_update(T* address, Op op) {
    static_assert(sizeof(T) == sizeof(Bits), "bit width mismatch");
    Bits* raw = reinterpret_cast<Bits*>(address);
#if defined(HOSTCUDA_MUTATION_ATOMICS_NONATOMIC)
    T old = *address;
    reschedule_current_thread();  // the other threads' read-modify-writes run in between
    *address = op(old);
    (void)raw;
    return old;
#else
    Bits expected = __atomic_load_n(raw, __ATOMIC_RELAXED);
    for (;;) {
        T old;
        memcpy(&old, &expected, sizeof(T));
        T updated = op(old);
        Bits desired;
        memcpy(&desired, &updated, sizeof(T));
        if (__atomic_compare_exchange_n(raw, &expected, desired, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
            return old;
        }
    }
#endif
}
template <typename T>
using bits_of = std::conditional_t<sizeof(T) == 2, uint16_t,
                                   std::conditional_t<sizeof(T) == 4, uint32_t, uint64_t>>;
}  // namespace hostcuda

#define HOSTCUDA_ATOMIC(name, expr)                                                       \
    template <typename T>                                                                 \
    T name(T* address, T val) {                                                           \
        return hostcuda::atomic_update<T, hostcuda::bits_of<T>>(address, [&](T old) { return expr; }); \
    }
HOSTCUDA_ATOMIC(atomicAdd, static_cast<T>(old + val))
HOSTCUDA_ATOMIC(atomicSub, static_cast<T>(old - val))
HOSTCUDA_ATOMIC(atomicExch, val)
HOSTCUDA_ATOMIC(atomicMin, (val < old ? val : old))
HOSTCUDA_ATOMIC(atomicMax, (val > old ? val : old))
HOSTCUDA_ATOMIC(atomicAnd, static_cast<T>(old & val))
HOSTCUDA_ATOMIC(atomicOr, static_cast<T>(old | val))
HOSTCUDA_ATOMIC(atomicXor, static_cast<T>(old ^ val))
#undef HOSTCUDA_ATOMIC

inline __nv_bfloat162 atomicAdd(__nv_bfloat162* address, __nv_bfloat162 val) {
    return hostcuda::atomic_update<__nv_bfloat162, uint32_t>(address, [&](__nv_bfloat162 old) {
        return __nv_bfloat162(old.x + val.x, old.y + val.y);
    });
}
template <typename T>
T atomicCAS(T* address, T compare, T val) {
    static_assert(std::is_integral<T>::value, "atomicCAS on integers");
    __atomic_compare_exchange_n(address, &compare, val, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
    return compare;  // holds the old value either way
}
inline void __threadfence() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
inline void __threadfence_block() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
// a polling thread's pause: here it lets the other workers (whose blocks it waits for) run
inline void __nanosleep(unsigned) { std::this_thread::yield(); }

// ---------------------------------------------------------------------------------------
// cache-hinted loads and stores: plain memory accesses on the CPU

template <typename T> T __ldg(const T* p) { return *p; }
template <typename T> T __ldcs(const T* p) { return *p; }
template <typename T> T __ldcg(const T* p) { return *p; }
template <typename T> T __ldca(const T* p) { return *p; }
template <typename T> T __ldlu(const T* p) { return *p; }
template <typename T> T __ldcv(const T* p) { return *p; }
template <typename T> void __stcs(T* p, T v) { *p = v; }
template <typename T> void __stcg(T* p, T v) { *p = v; }
template <typename T> void __stwb(T* p, T v) { *p = v; }
template <typename T> void __stwt(T* p, T v) { *p = v; }

// ---------------------------------------------------------------------------------------
// math and bit intrinsics

inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
inline float __expf(float x) { return expf(x); }
inline float __logf(float x) { return logf(x); }
inline float __log2f(float x) { return log2f(x); }
inline float __sinf(float x) { return sinf(x); }
inline float __cosf(float x) { return cosf(x); }
inline void __sincosf(float x, float* s, float* c) { *s = sinf(x); *c = cosf(x); }
inline float __tanhf(float x) { return tanhf(x); }
inline float __powf(float x, float y) { return powf(x, y); }
inline float __fdividef(float a, float b) { return a / b; }
inline float __frcp_rn(float x) { return 1.0f / x; }
inline float __fsqrt_rn(float x) { return sqrtf(x); }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
inline float __saturatef(float x) { return x < 0.0f ? 0.0f : (x > 1.0f ? 1.0f : x); }
inline unsigned __float_as_uint(float f) { unsigned u; memcpy(&u, &f, 4); return u; }
inline float __uint_as_float(unsigned u) { float f; memcpy(&f, &u, 4); return f; }
inline int __float_as_int(float f) { int i; memcpy(&i, &f, 4); return i; }
inline float __int_as_float(int i) { float f; memcpy(&f, &i, 4); return f; }
inline long long __double_as_longlong(double d) { long long i; memcpy(&i, &d, 8); return i; }
inline double __longlong_as_double(long long i) { double d; memcpy(&d, &i, 8); return d; }
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz(static_cast<unsigned>(x)); }
inline int __ffs(int x) { return __builtin_ffs(x); }
inline unsigned __brev(unsigned x) {
    x = ((x >> 1) & 0x55555555u) | ((x & 0x55555555u) << 1);
    x = ((x >> 2) & 0x33333333u) | ((x & 0x33333333u) << 2);
    x = ((x >> 4) & 0x0f0f0f0fu) | ((x & 0x0f0f0f0fu) << 4);
    x = ((x >> 8) & 0x00ff00ffu) | ((x & 0x00ff00ffu) << 8);
    return (x >> 16) | (x << 16);
}

namespace hostcuda {
// exp(x) in float, written without branches or calls so that a loop over it vectorises
// (glibc's expf does not, short of -ffast-math): the host backend's loops over long rows
// (the classifier's softmax) use it where the GPU calls expf. x = n ln2 + r with |r| <= ln2/2
// (ln2 split in two so n ln2 is exact), e^r by a degree-7 polynomial (the Cephes expf
// coefficients), scaled by 2^n through the exponent bits. Error at most 2 ulp against the
// exact value (dev/test/test_backend.cu checks every float in [-87.3, 88.7] against exp in
// double), as CUDA's expf promises. Results that would be subnormal (x below about -87.3) are
// 0 (flushed); NaN stays NaN, -inf gives 0, x > 88.72 gives +inf.
inline float vector_expf(float x) {
    // (NaN fails both compares and is replaced; the original comes back at the end)
    float xc = x > -104.0f ? (x < 89.0f ? x : 89.0f) : -104.0f;
    // n = round(x / ln2) by adding and subtracting 1.5 * 2^23 (floorf, like fmaxf, does not
    // vectorise without -fno-trapping-math)
    float n = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
    float r = xc - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    // 2^n from the exponent bits: n = 128 (x just below the overflow) as 2 * 2^127; n < -126
    // (a subnormal result) as 0
    p = n > 127.0f ? p * 2.0f : p;
    // (the biased exponent n + 127 read off the mantissa of n + 127 + 2^23, not by a float->int
    // conversion: that, like memcpy, would stop the vectoriser)
    int e = __builtin_bit_cast(int, (n > 127.0f ? 127.0f : n) + (127.0f + 8388608.0f)) - 0x4b000000;
    float scale = __builtin_bit_cast(float, e > 0 ? e << 23 : 0);
    float result = p * scale;
    return x == x ? result : x;
}
}  // namespace hostcuda

// CUDA device code has global min/max overloads for the arithmetic types.
#define HOSTCUDA_MINMAX(T)                                   \
    inline T min(T a, T b) { return b < a ? b : a; }         \
    inline T max(T a, T b) { return a < b ? b : a; }
HOSTCUDA_MINMAX(int)
HOSTCUDA_MINMAX(unsigned int)
HOSTCUDA_MINMAX(long)
HOSTCUDA_MINMAX(unsigned long)
HOSTCUDA_MINMAX(long long)
HOSTCUDA_MINMAX(unsigned long long)
#undef HOSTCUDA_MINMAX
inline float min(float a, float b) { return fminf(a, b); }
inline float max(float a, float b) { return fmaxf(a, b); }
inline double min(double a, double b) { return fmin(a, b); }
inline double max(double a, double b) { return fmax(a, b); }
