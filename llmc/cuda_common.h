/*
Common CUDA utilities for every kernel header, trainer and test:
- selects the executor: nvcc builds for the GPU, any other compiler builds for the host
  backend (llmc/hostcuda.h), from the same source;
- LAUNCH(grid, block, shared_bytes, stream, kernel)(args...), the one way kernels are launched;
- cudaCheck with file:line, the precision typedefs (floatX), 128-bit packed loads/stores,
  warp reductions, and dynamic shared memory that works on both executors.
*/
#pragma once

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <type_traits>
#include <vector>

#include "utils.h"  // fatal

#if defined(__CUDACC__)
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#define HOST_BACKEND 0
#else
#include "hostcuda.h"
#define HOST_BACKEND 1
#endif
#include "launch_check.h"  // defines: sync_check, LAUNCH_SYNC_CHECK (every launch waits and reports, when on)
// The kernel name goes last so that template arguments with commas need no parentheses.
#if defined(__CUDACC__)
#define LAUNCH(grid, block, shared_bytes, stream, ...) \
    LAUNCH_SYNC_CHECK(grid, block, shared_bytes, #__VA_ARGS__) __VA_ARGS__<<<grid, block, shared_bytes, stream>>>
#else
#define LAUNCH(grid, block, shared_bytes, stream, ...)               \
    LAUNCH_SYNC_CHECK(grid, block, shared_bytes, #__VA_ARGS__) \
    ::hostcuda::Launch(#__VA_ARGS__, grid, block, shared_bytes, stream, __VA_ARGS__)
#endif

// e^x in kernels: CUDA's expf on a GPU; on the host backend hostcuda::vector_expf, which has
// CUDA's accuracy (2 ulp) and is inlined, so loops over it vectorise, where a call into libm
// per element was a third to a half of the softmax, attention and GELU kernels' time there.
__device__ __forceinline__ float kernel_expf(float x) {
#if HOST_BACKEND
    return hostcuda::vector_expf(x);
#else
    return expf(x);
#endif
}

// fminf(x, bound) and fmaxf(x, bound) for a bound that is not NaN (a NaN x gives the bound, as
// fminf / fmaxf do): the GPU's min / max instructions; on the host a compare and select, which
// the vectoriser takes where fminf stops it (it must keep fminf's signalling behaviour).
__device__ __forceinline__ float kernel_fminf_bound(float x, float bound) {
#if HOST_BACKEND
    return x < bound ? x : bound;
#else
    return fminf(x, bound);
#endif
}
__device__ __forceinline__ float kernel_fmaxf_bound(float x, float bound) {
#if HOST_BACKEND
    return x > bound ? x : bound;
#else
    return fmaxf(x, bound);
#endif
}

// ----------------------------------------------------------------------------------------
// error checking

inline void cuda_check(cudaError_t error, const char* file, int line) {
    if (error != cudaSuccess) { fatal("CUDA error at %s:%d: %s", file, line, cudaGetErrorString(error)); }
}
#define cudaCheck(err) (cuda_check(err, __FILE__, __LINE__))

// Call after a launch: reports a bad launch configuration at the caller's line.
#define cudaCheckLaunch() (cuda_check(cudaGetLastError(), __FILE__, __LINE__))

// What a failed allocation adds to its error while set (a trainer: the sizes behind its buffers
// and the flags that shrink them); "" for nothing.
inline std::string& allocation_hint() {
    static std::string hint;
    return hint;
}

template <typename T>
T* cuda_malloc_check(size_t count, const char* file, int line) {
    T* ptr = nullptr;
    cudaError_t error = cudaMalloc(reinterpret_cast<void**>(&ptr), count * sizeof(T));
    if (error != cudaSuccess) {
        fatal("CUDA error at %s:%d: cudaMalloc of %zu bytes: %s%s", file, line, count * sizeof(T), cudaGetErrorString(error),
              allocation_hint().c_str());
    }
    return ptr;
}
// Allocates `count` elements of T on the device (host memory on the host backend).
#define cudaMallocElements(T, count) (cuda_malloc_check<T>((count), __FILE__, __LINE__))

// Host <-> device copies of whole arrays, for tests and set-up code.
template <typename T>
T* copy_to_device(const std::vector<T>& host) {
    T* device = cudaMallocElements(T, host.size());
    cudaCheck(cudaMemcpy(device, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
    return device;
}
template <typename T>
std::vector<T> copy_from_device(const T* device, size_t count) {
    std::vector<T> host(count);
    cudaCheck(cudaMemcpy(host.data(), device, count * sizeof(T), cudaMemcpyDeviceToHost));
    return host;
}

// Device allocations freed together when the owner goes away.
struct DeviceArena {
    std::vector<void*> blocks;
    DeviceArena() = default;
    DeviceArena(const DeviceArena&) = delete;
    DeviceArena& operator=(const DeviceArena&) = delete;
    template <typename T>
    T* alloc(size_t count) {
        T* p = cudaMallocElements(T, count > 0 ? count : 1);
        blocks.push_back(p);
        return p;
    }
    ~DeviceArena() {
        for (void* p : blocks) { cudaFree(p); }
    }
};

#define CEIL_DIV(m, n) (((m) + (n) - 1) / (n))

// ----------------------------------------------------------------------------------------
// precision: floatX is the type of parameters and activations

enum class PrecisionMode { FP32, BF16 };
#if defined(ENABLE_FP32)
typedef float floatX;
constexpr PrecisionMode PRECISION_MODE = PrecisionMode::FP32;
#define PRECISION_NAME "fp32"
#else
typedef __nv_bfloat16 floatX;
constexpr PrecisionMode PRECISION_MODE = PrecisionMode::BF16;
#define PRECISION_NAME "bf16"
#endif

// A parameter tensor and its gradient (device pointers into the model's buffers).
struct Weight {
    floatX* w = nullptr;
    floatX* grad = nullptr;
};

// Conversions that read the same for float and bf16 on both executors.
__host__ __device__ inline float to_float(float x) { return x; }
__host__ __device__ inline float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
template <typename T>
__host__ __device__ inline T from_float(float x) {
    if constexpr (std::is_same<T, float>::value) {
        return x;
    } else {
        return __float2bfloat16_rn(x);
    }
}

#include "card_check.h"  // defines: card_check_once (before the first launch), card_code_arch

// ----------------------------------------------------------------------------------------
// 128-bit packed loads and stores: one memory transaction per 16 bytes on the GPU

template <typename T>
struct alignas(16) Packed128 {
    static constexpr int size = 16 / sizeof(T);
    T payload[size];

    Packed128() = default;
    __device__ explicit Packed128(int4 bits) { memcpy(payload, &bits, sizeof(bits)); }
    __device__ static Packed128 constant(T value) {
        Packed128 result;
        for (int k = 0; k < size; k++) { result.payload[k] = value; }
        return result;
    }
    __device__ T& operator[](int index) { return payload[index]; }
    __device__ const T& operator[](int index) const { return payload[index]; }
    __device__ int4 get_bits() const {
        int4 bits;
        memcpy(&bits, payload, sizeof(bits));
        return bits;
    }
};
typedef Packed128<floatX> x128;

// `address` must be 16-byte aligned.
template <typename T>
__device__ inline Packed128<T> load128(const T* address) {
    return Packed128<T>{*reinterpret_cast<const int4*>(address)};
}
// Streaming load: the data is used once, so do not keep it in cache.
template <typename T>
__device__ inline Packed128<T> load128cs(const T* address) {
    return Packed128<T>{__ldcs(reinterpret_cast<const int4*>(address))};
}
template <typename T>
__device__ inline void store128(T* target, Packed128<T> value) {
    *reinterpret_cast<int4*>(target) = value.get_bits();
}
template <typename T>
__device__ inline void store128cs(T* target, Packed128<T> value) {
    __stcs(reinterpret_cast<int4*>(target), value.get_bits());
}

// V consecutive floatX elements to / from fp32 registers: one 128-bit access when
// V == x128::size (the address must then be 16-byte aligned), else V scalar accesses.
template <int V>
__device__ inline void load_floats(float* dst, const floatX* src) {
    if constexpr (V == x128::size) {
        x128 packed = load128(src);
        for (int k = 0; k < V; k++) { dst[k] = to_float(packed[k]); }
    } else {
        for (int k = 0; k < V; k++) { dst[k] = to_float(src[k]); }
    }
}
template <int V>
__device__ inline void store_floats(floatX* dst, const float* src) {
    if constexpr (V == x128::size) {
        x128 packed;
        for (int k = 0; k < V; k++) { packed[k] = from_float<floatX>(src[k]); }
        store128(dst, packed);
    } else {
        for (int k = 0; k < V; k++) { dst[k] = from_float<floatX>(src[k]); }
    }
}

// ----------------------------------------------------------------------------------------
// warp reductions (every lane of a full warp gets the result) and dynamic shared memory

__device__ inline float warp_reduce_sum(float value) {
    for (int offset = 16; offset > 0; offset /= 2) { value += __shfl_xor_sync(0xffffffffu, value, offset); }
    return value;
}
__device__ inline float warp_reduce_max(float value) {
    for (int offset = 16; offset > 0; offset /= 2) { value = fmaxf(value, __shfl_xor_sync(0xffffffffu, value, offset)); }
    return value;
}

// The block's dynamic shared memory (the launch's shared_bytes), 16-byte aligned.
template <typename T>
__device__ inline T* dynamic_shared_memory() {
#if defined(__CUDACC__)
    extern __shared__ __align__(16) unsigned char dynamic_shared_bytes[];
    return reinterpret_cast<T*>(dynamic_shared_bytes);
#else
    return reinterpret_cast<T*>(hostcuda::dynamic_shared_memory());
#endif
}
