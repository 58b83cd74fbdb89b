/*
cp.async: asynchronous copies from global to shared memory (sm_80+), the way a kernel
stages the next tile while it computes on the current one.

  cp_async_16(dst, src) / cp_async_8 / cp_async_4   start copying 16/8/4 bytes; dst in shared
                                                     memory, src in global memory, both
                                                     aligned to the size
  cp_async_commit_group()                            close this thread's open group of copies
  cp_async_wait_group<N>()                           wait until at most N of this thread's
                                                     committed groups are still in flight
  cp_async_wait_all()                                commit, then wait for everything

Groups are per thread (PTX ISA, cp.async.commit_group / wait_group): a thread's wait says
nothing about other threads' copies, so the usual pattern is wait, then __syncthreads,
then read what any thread copied. Nothing else completes a copy, __syncthreads included.

Under nvcc these are the PTX instructions (a plain synchronous copy below sm_80, where
cp.async does not exist). On the host backend (llmc/hostcuda/async_copy.h) the source is
read when the copy starts and the destination is written at the matching wait, so a read
that comes too early sees stale data there too, and racecheck builds report it.
*/
#pragma once

#include <cstdint>

#include "llmc/cuda_common.h"

#if defined(__CUDACC__)

template <int kBytes>
__device__ __forceinline__ void cp_async(void* shared_dst, const void* global_src) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(shared_dst));
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2;\n" ::"r"(dst), "l"(global_src), "n"(kBytes) : "memory");
#else
    struct alignas(kBytes) Chunk { unsigned char bytes[kBytes]; };
    *static_cast<Chunk*>(shared_dst) = *static_cast<const Chunk*>(global_src);
#endif
}
__device__ __forceinline__ void cp_async_commit_group() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}
template <int N>
__device__ __forceinline__ void cp_async_wait_group() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}
__device__ __forceinline__ void cp_async_wait_all() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_all;\n" ::: "memory");
#endif
}

#else  // host backend

template <int kBytes>
inline void cp_async(void* shared_dst, const void* global_src) {
    hostcuda::async_copy_issue(shared_dst, global_src, kBytes, "cp.async");
}
inline void cp_async_commit_group() { hostcuda::async_copy_commit_group(); }
template <int N>
inline void cp_async_wait_group() {
    static_assert(N >= 0, "cp_async_wait_group<N>: N >= 0");
    hostcuda::async_copy_wait_group(N);
}
inline void cp_async_wait_all() { hostcuda::async_copy_wait_all(); }

#endif

__device__ __forceinline__ void cp_async_16(void* shared_dst, const void* global_src) { cp_async<16>(shared_dst, global_src); }
__device__ __forceinline__ void cp_async_8(void* shared_dst, const void* global_src) { cp_async<8>(shared_dst, global_src); }
__device__ __forceinline__ void cp_async_4(void* shared_dst, const void* global_src) { cp_async<4>(shared_dst, global_src); }
