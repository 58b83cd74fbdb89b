/*
Host backend: CUDA's built-in vector types (with their GPU alignment, so a kernel that
reinterprets memory as int4 sees the same layout), dim3, and the function-qualifier
keywords, which mean nothing to the host compiler.
*/
#pragma once

#include <cstddef>
#include <cstdint>

#define __global__
#define __device__
#define __host__
#define __constant__
#define __managed__
#define __forceinline__ inline __attribute__((always_inline))
#define __noinline__ __attribute__((noinline))
#define __align__(n) alignas(n)
#define __launch_bounds__(...)
#define __grid_constant__
// Static shared memory: one copy per OS thread. The blocks an OS thread runs run one
// after another, and all threads of a block run on that OS thread, so this is exactly
// "one copy per resident block". (The race checker, racecheck.h, relies on this: static
// shared arrays are what lies in the executable's TLS block besides the backend's own.)
#define __shared__ static thread_local

struct dim3 {
    unsigned int x, y, z;
    constexpr dim3(unsigned int vx = 1, unsigned int vy = 1, unsigned int vz = 1) : x(vx), y(vy), z(vz) {}
};
typedef dim3 uint3;

#define HOSTCUDA_VEC2(T, name, align) \
    struct alignas(align) name { T x, y; };  \
    inline name make_##name(T x, T y) { return name{x, y}; }
#define HOSTCUDA_VEC3(T, name) \
    struct name { T x, y, z; }; \
    inline name make_##name(T x, T y, T z) { return name{x, y, z}; }
#define HOSTCUDA_VEC4(T, name, align) \
    struct alignas(align) name { T x, y, z, w; }; \
    inline name make_##name(T x, T y, T z, T w) { return name{x, y, z, w}; }

HOSTCUDA_VEC2(float, float2, 8)
HOSTCUDA_VEC3(float, float3)
HOSTCUDA_VEC4(float, float4, 16)
HOSTCUDA_VEC2(int, int2, 8)
HOSTCUDA_VEC3(int, int3)
HOSTCUDA_VEC4(int, int4, 16)
HOSTCUDA_VEC2(unsigned int, uint2, 8)
HOSTCUDA_VEC4(unsigned int, uint4, 16)
HOSTCUDA_VEC2(double, double2, 16)

#undef HOSTCUDA_VEC2
#undef HOSTCUDA_VEC3
#undef HOSTCUDA_VEC4
