/*
Host backend: which addresses are "device" memory, so that host/device mix-ups fail here as
they would on a GPU. On the host backend every pointer is a host pointer, so without this a
kernel given `vector.data()`, a cudaMemcpy with the wrong kind or a cudaFree of a host
buffer all run fine and fail only on the first GPU. The runtime registers each allocation
(cudaMalloc, cudaMallocHost, cudaMallocManaged) in a sorted map and checks every kernel pointer
argument, copy, memset and free against it (one lookup each). What is refused, what is not seen
and the tests: doc/host-backend.md "Host and device memory".
*/
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>

#include "scheduler.h"  // die

namespace hostcuda {

enum class MemoryKind { Device, Pinned, Managed };

inline const char* memory_kind_name(MemoryKind k) {
    return k == MemoryKind::Device ? "device (cudaMalloc)" : k == MemoryKind::Pinned ? "pinned host (cudaMallocHost)"
                                                                                      : "managed (cudaMallocManaged)";
}

struct Allocation {
    uintptr_t end;  // one past the last byte asked for
    MemoryKind kind;
};

// From start to end: one lookup is O(log n), a few hundred allocations in a trainer; a launch
// costs one lookup per pointer argument.
struct AllocationMap {
    std::mutex mutex;
    std::map<uintptr_t, Allocation> by_start;
};

inline AllocationMap& allocations() {
    static AllocationMap* map = new AllocationMap();  // never destroyed: frees at exit still find it
    return *map;
}

// The allocation holding [p, p + bytes) (p == end allowed for bytes 0: an empty tensor's
// pointer one past the last); false if none.
inline bool find_allocation(const void* p, size_t bytes, Allocation* found, uintptr_t* start = nullptr) {
    uintptr_t a = reinterpret_cast<uintptr_t>(p);
    AllocationMap& m = allocations();
    std::lock_guard<std::mutex> lock(m.mutex);
    auto it = m.by_start.upper_bound(a);
    if (it == m.by_start.begin()) { return false; }
    --it;
    if (a > it->second.end || a + bytes > it->second.end) { return false; }
    *found = it->second;
    if (start != nullptr) { *start = it->first; }
    return true;
}

// cudaMalloc / cudaMallocHost / cudaMallocManaged. Pinned memory (cudaMallocHost) is host memory
// for copies but kernels may read it (mapped, as on the GPU); managed memory is both.
inline void register_allocation(void* p, size_t bytes, MemoryKind kind) {
    uintptr_t a = reinterpret_cast<uintptr_t>(p);
    AllocationMap& m = allocations();
    std::lock_guard<std::mutex> lock(m.mutex);
    m.by_start[a] = Allocation{a + bytes, kind};
}

// cudaFree / cudaFreeHost: dies unless p is the start of an allocation of a kind `call` frees.
inline void release_allocation(void* p, bool pinned_call, const char* call) {
    uintptr_t a = reinterpret_cast<uintptr_t>(p);
    AllocationMap& m = allocations();
    std::lock_guard<std::mutex> lock(m.mutex);
    auto it = m.by_start.find(a);
    if (it == m.by_start.end()) {
        die("%s(%p): not the start of memory from cudaMalloc/cudaMallocHost (a host buffer, freed twice, or an "
            "offset into an allocation); a GPU fails here", call, p);
    }
    if ((it->second.kind == MemoryKind::Pinned) != pinned_call) {
        die("%s(%p): the memory is %s; free it with %s", call, p, memory_kind_name(it->second.kind),
            it->second.kind == MemoryKind::Pinned ? "cudaFreeHost" : "cudaFree");
    }
    m.by_start.erase(it);
}

// A pointer argument of a kernel: must point into memory a GPU kernel can reach. (Pointers a
// kernel receives inside a struct are not seen, nor a host dereference of device memory.)
inline void check_kernel_pointer(const char* kernel, int index, const void* p) {
    if (p == nullptr) { return; }
    Allocation a;
    if (!find_allocation(p, 0, &a)) {
        die("kernel '%s': pointer argument %d (%p) is not in device memory (a host buffer such as a std::vector's "
            "data(), or memory already freed); on a GPU the kernel faults", kernel, index, p);
    }
}

inline bool is_device_side(const void* p, size_t bytes, bool* in_bounds_if_device) {
    Allocation a;
    uintptr_t start = 0;
    // in an allocation at its start: a range check; else the start alone says which side
    if (find_allocation(p, bytes, &a, &start)) {
        *in_bounds_if_device = true;
        return a.kind != MemoryKind::Pinned;
    }
    if (find_allocation(p, 0, &a, &start)) {  // starts inside, runs past the end
        *in_bounds_if_device = false;
        return a.kind != MemoryKind::Pinned;
    }
    *in_bounds_if_device = true;
    return false;
}

inline const char* kind_name(int kind) {
    switch (kind) {
        case 0: return "cudaMemcpyHostToHost";
        case 1: return "cudaMemcpyHostToDevice";
        case 2: return "cudaMemcpyDeviceToHost";
        case 3: return "cudaMemcpyDeviceToDevice";
        default: return "cudaMemcpyDefault";
    }
}

// kind: a cudaMemcpyKind (0 H2H, 1 H2D, 2 D2H, 3 D2D, 4 default: either side, checked only
// for bounds). Managed memory is on whichever side the kind says.
inline void check_copy(const char* call, void* dst, const void* src, size_t bytes, int kind) {
    if (bytes == 0) { return; }
    Allocation a;
    bool dst_in = true, src_in = true;
    bool dst_dev = is_device_side(dst, bytes, &dst_in), src_dev = is_device_side(src, bytes, &src_in);
    if (!dst_in || !src_in) {
        die("%s of %zu bytes (%s): the %s runs past the end of its allocation", call, bytes, kind_name(kind),
            !dst_in ? "destination" : "source");
    }
    bool dst_managed = find_allocation(dst, 0, &a) && a.kind == MemoryKind::Managed;
    bool src_managed = find_allocation(src, 0, &a) && a.kind == MemoryKind::Managed;
    if (kind == 4) { return; }
    bool want_dst_dev = kind == 1 || kind == 3, want_src_dev = kind == 2 || kind == 3;
    bool dst_ok = dst_managed || dst_dev == want_dst_dev, src_ok = src_managed || src_dev == want_src_dev;
    if (!dst_ok || !src_ok) {
        die("%s(%p <- %p, %zu bytes, %s): the %s is %s memory; the kind says %s", call, dst, src, bytes,
            kind_name(kind), !dst_ok ? "destination" : "source",
            (!dst_ok ? dst_dev : src_dev) ? "device" : "host",
            (!dst_ok ? want_dst_dev : want_src_dev) ? "device" : "host");
    }
}

// cudaMemset's destination: device (or managed) memory, [p, p + bytes) inside it.
inline void check_device_range(const char* call, const void* p, size_t bytes) {
    if (bytes == 0) { return; }
    Allocation a;
    if (!find_allocation(p, bytes, &a) || a.kind == MemoryKind::Pinned) {
        die("%s(%p, %zu bytes): not inside device memory (a host buffer, or past the end of the allocation)", call,
            p, bytes);
    }
}

}  // namespace hostcuda
