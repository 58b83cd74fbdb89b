/*
Host backend: bfloat16 (__nv_bfloat16, __nv_bfloat162) for kernels compiled by the host
compiler. Storage is the upper 16 bits of an IEEE float. float -> bf16 rounds to nearest,
ties to even (as __float2bfloat16 does on the GPU); NaN stays a quiet NaN. Arithmetic
converts to float, computes, and rounds back once, which is what sm_80+ does for
bf16 add/sub/mul.
*/
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

struct __nv_bfloat16 {
    uint16_t __x;

    __nv_bfloat16() = default;
    __nv_bfloat16(float f) : __x(from_float(f)) {}
    __nv_bfloat16(double d) : __x(from_float(static_cast<float>(d))) {}
    __nv_bfloat16(int i) : __x(from_float(static_cast<float>(i))) {}
    // (bit casts and a select, not memcpy and a branch: loops over arrays of bf16 vectorise)
    operator float() const { return __builtin_bit_cast(float, static_cast<uint32_t>(__x) << 16); }

    static uint16_t from_float(float f) {
        uint32_t bits = __builtin_bit_cast(uint32_t, f);
        uint32_t rounding_bias = 0x7fffu + ((bits >> 16) & 1u);  // ties to even
        uint16_t rounded = static_cast<uint16_t>((bits + rounding_bias) >> 16);
        uint16_t quiet_nan = static_cast<uint16_t>((bits >> 16) | 0x0040u);  // NaN: keep sign, force quiet
        return (bits & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded;
    }
    static __nv_bfloat16 from_bits(uint16_t b) {
        __nv_bfloat16 h;
        h.__x = b;
        return h;
    }
};
typedef __nv_bfloat16 nv_bfloat16;

struct __nv_bfloat162 {
    __nv_bfloat16 x, y;
    __nv_bfloat162() = default;
    __nv_bfloat162(__nv_bfloat16 a, __nv_bfloat16 b) : x(a), y(b) {}
};
typedef __nv_bfloat162 nv_bfloat162;

inline __nv_bfloat16 __float2bfloat16(float f) { return __nv_bfloat16(f); }
inline __nv_bfloat16 __float2bfloat16_rn(float f) { return __nv_bfloat16(f); }
inline float __bfloat162float(__nv_bfloat16 h) { return static_cast<float>(h); }
inline __nv_bfloat162 __floats2bfloat162_rn(float a, float b) { return {__nv_bfloat16(a), __nv_bfloat16(b)}; }
inline __nv_bfloat162 __float2bfloat162_rn(float a) { return {__nv_bfloat16(a), __nv_bfloat16(a)}; }
inline float __low2float(__nv_bfloat162 h) { return static_cast<float>(h.x); }
inline float __high2float(__nv_bfloat162 h) { return static_cast<float>(h.y); }
inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 h) { return h.__x; }
inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short b) { return __nv_bfloat16::from_bits(b); }

#define HOSTCUDA_BF16_BINARY(op, name)                                                     \
    inline __nv_bfloat16 operator op(__nv_bfloat16 a, __nv_bfloat16 b) {                     \
        return __nv_bfloat16(static_cast<float>(a) op static_cast<float>(b));                \
    }                                                                                        \
    inline __nv_bfloat16& operator op##=(__nv_bfloat16 & a, __nv_bfloat16 b) {               \
        a = a op b;                                                                          \
        return a;                                                                            \
    }                                                                                        \
    inline __nv_bfloat16 name(__nv_bfloat16 a, __nv_bfloat16 b) { return a op b; }
HOSTCUDA_BF16_BINARY(+, __hadd)
HOSTCUDA_BF16_BINARY(-, __hsub)
HOSTCUDA_BF16_BINARY(*, __hmul)
HOSTCUDA_BF16_BINARY(/, __hdiv)
#undef HOSTCUDA_BF16_BINARY

inline __nv_bfloat16 operator-(__nv_bfloat16 a) { return __nv_bfloat16::from_bits(a.__x ^ 0x8000u); }
inline __nv_bfloat16 __hneg(__nv_bfloat16 a) { return -a; }
inline __nv_bfloat16 __hfma(__nv_bfloat16 a, __nv_bfloat16 b, __nv_bfloat16 c) {
    return __nv_bfloat16(std::fma(static_cast<float>(a), static_cast<float>(b), static_cast<float>(c)));
}
inline __nv_bfloat16 __hmax(__nv_bfloat16 a, __nv_bfloat16 b) {
    return static_cast<float>(a) >= static_cast<float>(b) ? a : b;
}
inline __nv_bfloat16 __hmin(__nv_bfloat16 a, __nv_bfloat16 b) {
    return static_cast<float>(a) <= static_cast<float>(b) ? a : b;
}
inline bool __hisnan(__nv_bfloat16 a) { return std::isnan(static_cast<float>(a)); }
