/*
Host backend: stand-ins for the CUDA runtime API calls the trainers and tests use.
"Device" memory is host memory (256-byte aligned, like cudaMalloc). Every stream is the
same synchronous queue: a kernel launch runs to completion before it returns, so
cudaMemcpyAsync copies at once, synchronisation calls return at once, and an event
records the wall-clock time of the moment it is recorded (so cudaEventElapsedTime
times the work between two events, as on the GPU). Errors follow the CUDA convention:
API calls return them, launch errors are kept for cudaGetLastError().
*/
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "device_memory.h"
#include "emulated_device.h"
#include "queued_copies.h"
#include "scheduler.h"

enum cudaError_t {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInvalidConfiguration = 9,
    cudaErrorInvalidDeviceFunction = 98,
    cudaErrorInvalidDevice = 101,
    cudaErrorNoKernelImageForDevice = 209,
    cudaErrorNotReady = 600,
};
typedef cudaError_t cudaError;

enum cudaMemcpyKind {
    cudaMemcpyHostToHost = 0,
    cudaMemcpyHostToDevice = 1,
    cudaMemcpyDeviceToHost = 2,
    cudaMemcpyDeviceToDevice = 3,
    cudaMemcpyDefault = 4,
};

enum cudaDeviceAttr {  // (the values are the CUDA runtime's)
    cudaDevAttrMaxSharedMemoryPerBlock = 8,
    cudaDevAttrMultiProcessorCount = 16,
    cudaDevAttrComputeCapabilityMajor = 75,
    cudaDevAttrComputeCapabilityMinor = 76,
    cudaDevAttrMaxSharedMemoryPerBlockOptin = 97,
};

enum cudaFuncAttribute {
    cudaFuncAttributeMaxDynamicSharedMemorySize = 8,
    cudaFuncAttributePreferredSharedMemoryCarveout = 9,
};

struct CUstream_st {};
struct CUevent_st {
    std::chrono::steady_clock::time_point time;
    bool recorded = false;
    long queued_copies = 0;  // the copies queued before it was recorded (queued_copies.h)
};
typedef CUstream_st* cudaStream_t;
typedef CUevent_st* cudaEvent_t;

#define cudaStreamDefault 0x0
#define cudaStreamNonBlocking 0x1
#define cudaEventDefault 0x0
#define cudaEventDisableTiming 0x2
#define cudaHostAllocDefault 0x0

struct cudaDeviceProp {
    char name[256];
    size_t totalGlobalMem;
    size_t sharedMemPerBlock;
    size_t sharedMemPerBlockOptin;
    size_t sharedMemPerMultiprocessor;
    int regsPerBlock;
    int warpSize;
    int maxThreadsPerBlock;
    int maxThreadsDim[3];
    int maxGridSize[3];
    int maxThreadsPerMultiProcessor;
    int multiProcessorCount;
    int l2CacheSize;
    int major;
    int minor;
};

struct cudaFuncAttributes {  // (the fields the project reads)
    size_t sharedSizeBytes;
    int maxThreadsPerBlock;
    int numRegs;
    int ptxVersion;  // the arch the running code was compiled for (10 x major + minor)
};

namespace hostcuda {

constexpr size_t kDefaultSharedBytes = 48 * 1024;

inline thread_local cudaError_t last_error = cudaSuccess;

inline cudaError_t set_error(cudaError_t e) {
    if (e != cudaSuccess) { last_error = e; }
    return e;
}

// How often the host asked to wait for the device: for the whole stream or device
// (cudaStreamSynchronize, cudaDeviceSynchronize) or for an event (cudaEventSynchronize). Here they
// return at once; on a GPU each is a wait, and a stream's drain leaves it idle until the host
// queues more. Tests count a training step's (test_gpt2's loss_queue case).
struct HostWaits {
    std::atomic<long> stream{0}, event{0};
};
inline HostWaits& host_waits() {
    static HostWaits waits;
    return waits;
}

// Dynamic shared memory limits raised with cudaFuncSetAttribute, per kernel.
inline std::mutex& attribute_mutex() {
    static std::mutex m;
    return m;
}
inline std::unordered_map<const void*, size_t>& max_dynamic_shared() {
    static std::unordered_map<const void*, size_t> limits;
    return limits;
}

}  // namespace hostcuda

inline const char* cudaGetErrorString(cudaError_t e) {
    switch (e) {
        case cudaSuccess: return "no error";
        case cudaErrorInvalidValue: return "invalid argument";
        case cudaErrorMemoryAllocation: return "out of memory";
        case cudaErrorInvalidConfiguration: return "invalid configuration argument";
        case cudaErrorInvalidDeviceFunction: return "invalid device function";
        case cudaErrorInvalidDevice: return "invalid device ordinal";
        case cudaErrorNoKernelImageForDevice: return "no kernel image is available for execution on the device";
        case cudaErrorNotReady: return "device not ready";
    }
    return "unknown error";
}
inline const char* cudaGetErrorName(cudaError_t e) { return cudaGetErrorString(e); }
inline cudaError_t cudaGetLastError() {
    cudaError_t e = hostcuda::last_error;
    hostcuda::last_error = cudaSuccess;
    return e;
}
inline cudaError_t cudaPeekAtLastError() { return hostcuda::last_error; }

// --- devices -----------------------------------------------------------------------------
inline cudaError_t cudaGetDeviceCount(int* count) { *count = 1; return cudaSuccess; }
inline cudaError_t cudaSetDevice(int device) {
    return hostcuda::set_error(device == 0 ? cudaSuccess : cudaErrorInvalidDevice);
}
inline cudaError_t cudaGetDevice(int* device) { *device = 0; return cudaSuccess; }
inline cudaError_t cudaDeviceSynchronize() {
    hostcuda::host_waits().stream++;
    hostcuda::QueuedCopies::get().waited();
    return cudaSuccess;
}
inline cudaError_t cudaDeviceReset() { return cudaSuccess; }
inline cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
    if (device != 0) { return hostcuda::set_error(cudaErrorInvalidDevice); }
    const hostcuda::EmulatedDevice& emulated = hostcuda::emulated_device();
    memset(prop, 0, sizeof(*prop));
    snprintf(prop->name, sizeof(prop->name), "host backend (%d CPU workers, %s limits)",
             hostcuda::Pool::instance().num_workers(), emulated.name);
    long pages = sysconf(_SC_PHYS_PAGES), page_size = sysconf(_SC_PAGESIZE);
    prop->totalGlobalMem = static_cast<size_t>(pages) * static_cast<size_t>(page_size);
    prop->sharedMemPerBlock = hostcuda::kDefaultSharedBytes;
    prop->sharedMemPerBlockOptin = emulated.shared_per_block_optin;
    prop->sharedMemPerMultiprocessor = emulated.shared_per_multiprocessor;
    prop->regsPerBlock = 65536;
    prop->warpSize = hostcuda::kWarpSize;
    prop->maxThreadsPerBlock = hostcuda::kMaxThreadsPerBlock;
    prop->maxThreadsDim[0] = 1024; prop->maxThreadsDim[1] = 1024; prop->maxThreadsDim[2] = 64;
    prop->maxGridSize[0] = 2147483647; prop->maxGridSize[1] = 65535; prop->maxGridSize[2] = 65535;
    prop->maxThreadsPerMultiProcessor = 2048;
    prop->multiProcessorCount = hostcuda::Pool::instance().num_workers();
    prop->l2CacheSize = 4 * 1024 * 1024;
    prop->major = emulated.major;  // the emulated device's (emulated_device.h)
    prop->minor = emulated.minor;
    return cudaSuccess;
}
inline cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attribute, int device) {
    if (device != 0) { return hostcuda::set_error(cudaErrorInvalidDevice); }
    const hostcuda::EmulatedDevice& emulated = hostcuda::emulated_device();
    switch (attribute) {
        case cudaDevAttrMaxSharedMemoryPerBlock: *value = (int)hostcuda::kDefaultSharedBytes; return cudaSuccess;
        case cudaDevAttrMultiProcessorCount: *value = hostcuda::Pool::instance().num_workers(); return cudaSuccess;
        case cudaDevAttrComputeCapabilityMajor: *value = emulated.major; return cudaSuccess;
        case cudaDevAttrComputeCapabilityMinor: *value = emulated.minor; return cudaSuccess;
        case cudaDevAttrMaxSharedMemoryPerBlockOptin: *value = (int)emulated.shared_per_block_optin; return cudaSuccess;
    }
    return hostcuda::set_error(cudaErrorInvalidValue);
}
inline cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
    long total = sysconf(_SC_PHYS_PAGES) * sysconf(_SC_PAGESIZE);
    long avail = sysconf(_SC_AVPHYS_PAGES) * sysconf(_SC_PAGESIZE);
    *free_bytes = static_cast<size_t>(avail);
    *total_bytes = static_cast<size_t>(total);
    return cudaSuccess;
}
// Which of the binary's images runs the kernel on this card (emulated_device.h: HOSTCUDA_DEVICE,
// HOSTCUDA_GPU_ARCHS); no kernel image, as the driver says, when none does.
template <typename Kernel>
cudaError_t cudaFuncGetAttributes(cudaFuncAttributes* attributes, Kernel*) {
    int code_arch = hostcuda::emulated_code_arch();
    if (code_arch == 0) { return hostcuda::set_error(cudaErrorNoKernelImageForDevice); }
    memset(attributes, 0, sizeof(*attributes));
    attributes->maxThreadsPerBlock = hostcuda::kMaxThreadsPerBlock;
    attributes->ptxVersion = code_arch;
    return cudaSuccess;
}
template <typename Kernel>
cudaError_t cudaFuncSetAttribute(Kernel* kernel, cudaFuncAttribute attribute, int value) {
    if (attribute == cudaFuncAttributeMaxDynamicSharedMemorySize) {
        if (value < 0 || static_cast<size_t>(value) > hostcuda::emulated_device().shared_per_block_optin) {
            return hostcuda::set_error(cudaErrorInvalidValue);
        }
        std::lock_guard<std::mutex> lock(hostcuda::attribute_mutex());
        hostcuda::max_dynamic_shared()[reinterpret_cast<const void*>(kernel)] = static_cast<size_t>(value);
    }
    return cudaSuccess;
}

// --- memory ------------------------------------------------------------------------------
// Every allocation is registered (device_memory.h), so that copies, frees and kernel
// arguments can be checked against the side of memory they say they use.
inline cudaError_t hostcuda_allocate(void** ptr, size_t size, hostcuda::MemoryKind kind) {
    *ptr = nullptr;
    if (size == 0) { return cudaSuccess; }
    // (the cost counts protect device memory page by page: whole pages of its own there, cost.h)
    hostcuda::CostRecorder* cost = kind != hostcuda::MemoryKind::Pinned ? hostcuda::CostRecorder::instance() : nullptr;
    // (and the check of queued copies pinned memory: queued_copies.h)
    bool pages = cost != nullptr || (kind == hostcuda::MemoryKind::Pinned && hostcuda::QueuedCopies::get().on());
    size_t align = pages ? hostcuda::kCostPage : 256;
    void* p = aligned_alloc(align, (size + align - 1) / align * align);
    if (p == nullptr) { return hostcuda::set_error(cudaErrorMemoryAllocation); }
    hostcuda::register_allocation(p, size, kind);
    if (cost != nullptr) { cost->add_allocation(p, size); }
    *ptr = p;
    return cudaSuccess;
}
inline cudaError_t cudaMalloc(void** ptr, size_t size) { return hostcuda_allocate(ptr, size, hostcuda::MemoryKind::Device); }
template <typename T>
cudaError_t cudaMalloc(T** ptr, size_t size) { return cudaMalloc(reinterpret_cast<void**>(ptr), size); }
inline cudaError_t cudaMallocHost(void** ptr, size_t size) {
    return hostcuda_allocate(ptr, size, hostcuda::MemoryKind::Pinned);
}
template <typename T>
cudaError_t cudaMallocHost(T** ptr, size_t size) { return cudaMallocHost(reinterpret_cast<void**>(ptr), size); }
template <typename T>
cudaError_t cudaMallocManaged(T** ptr, size_t size, unsigned = 1) {
    return hostcuda_allocate(reinterpret_cast<void**>(ptr), size, hostcuda::MemoryKind::Managed);
}
inline cudaError_t cudaFree(void* ptr) {
    if (ptr == nullptr) { return cudaSuccess; }
    hostcuda::release_allocation(ptr, false, "cudaFree");
    if (hostcuda::CostRecorder* cost = hostcuda::CostRecorder::instance()) { cost->remove_allocation(ptr); }
    free(ptr);
    return cudaSuccess;
}
inline cudaError_t cudaFreeHost(void* ptr) {
    if (ptr == nullptr) { return cudaSuccess; }
    hostcuda::Allocation a;
    if (hostcuda::find_allocation(ptr, 0, &a)) {
        hostcuda::QueuedCopies::get().freed(ptr, a.end - reinterpret_cast<uintptr_t>(ptr));
    }
    hostcuda::release_allocation(ptr, true, "cudaFreeHost");
    free(ptr);
    return cudaSuccess;
}
namespace hostcuda {
// A copy's or memset's bytes for the cost counts (cost.h), under a name per direction.
inline void count_copy(const char* call, const void* dst, const void* src, size_t count, int kind) {
    CostRecorder* cost = CostRecorder::instance();
    if (cost == nullptr) { return; }
    bool unused;
    bool dst_device = is_device_side(dst, 0, &unused), src_device = src != nullptr && is_device_side(src, 0, &unused);
    if (src == nullptr) {
        cost->add(call, 0, 0, 0, dst_device ? count : 0);
    } else if (dst_device && src_device) {
        cost->add("cudaMemcpy device to device", 0, 0, count, count);
    } else if (dst_device || src_device) {
        cost->add(dst_device ? "cudaMemcpy host to device" : "cudaMemcpy device to host", 0, 0, count, count);
    }
    (void)kind;
}
}  // namespace hostcuda

namespace hostcuda {
// A copy, run now. Its pinned ends are opened first for the check of queued copies
// (queued_copies.h); a queued one (cudaMemcpyAsync) then holds them until a wait covers it, a
// synchronous one waits for everything queued before it, as on a GPU.
inline void run_copy(const char* call, void* dst, const void* src, size_t count, bool queued) {
    QueuedCopies& q = QueuedCopies::get();
    Allocation a;
    bool dst_pinned = q.on() && find_allocation(dst, count, &a) && a.kind == MemoryKind::Pinned;
    bool src_pinned = q.on() && find_allocation(src, count, &a) && a.kind == MemoryKind::Pinned;
    if (dst_pinned) { q.open(dst, count); }
    if (src_pinned) { q.open(src, count); }
    if (count > 0) { memmove(dst, src, count); }
    if (!queued) {
        q.waited();
        return;
    }
    if (dst_pinned) { q.queue(call, dst, count, true); }
    if (src_pinned) { q.queue(call, src, count, false); }
}
}  // namespace hostcuda

inline cudaError_t cudaMemcpy(void* dst, const void* src, size_t count, cudaMemcpyKind kind) {
    hostcuda::check_copy("cudaMemcpy", dst, src, count, static_cast<int>(kind));
    hostcuda::count_copy("cudaMemcpy", dst, src, count, static_cast<int>(kind));
    hostcuda::run_copy("cudaMemcpy", dst, src, count, false);
    return cudaSuccess;
}
inline cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t count, cudaMemcpyKind kind,
                                   cudaStream_t = nullptr) {
    hostcuda::check_copy("cudaMemcpyAsync", dst, src, count, static_cast<int>(kind));
    hostcuda::count_copy("cudaMemcpyAsync", dst, src, count, static_cast<int>(kind));
    hostcuda::run_copy("cudaMemcpyAsync", dst, src, count, true);
    return cudaSuccess;
}
inline cudaError_t cudaMemset(void* dst, int value, size_t count) {
    hostcuda::check_device_range("cudaMemset", dst, count);
    hostcuda::count_copy("cudaMemset", dst, nullptr, count, 0);
    if (count > 0) { memset(dst, value, count); }
    return cudaSuccess;
}
inline cudaError_t cudaMemsetAsync(void* dst, int value, size_t count, cudaStream_t = nullptr) {
    hostcuda::check_device_range("cudaMemsetAsync", dst, count);
    hostcuda::count_copy("cudaMemset", dst, nullptr, count, 0);
    if (count > 0) { memset(dst, value, count); }
    return cudaSuccess;
}
template <typename T>
cudaError_t cudaMemcpyToSymbol(T& symbol, const void* src, size_t count, size_t offset = 0,
                               cudaMemcpyKind = cudaMemcpyHostToDevice) {
    if (offset + count > sizeof(T)) { return hostcuda::set_error(cudaErrorInvalidValue); }
    memcpy(reinterpret_cast<char*>(&symbol) + offset, src, count);
    return cudaSuccess;
}

// --- streams and events ------------------------------------------------------------------
inline cudaError_t cudaStreamCreate(cudaStream_t* stream) { *stream = new CUstream_st(); return cudaSuccess; }
inline cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned) { return cudaStreamCreate(stream); }
inline cudaError_t cudaStreamDestroy(cudaStream_t stream) { delete stream; return cudaSuccess; }
inline cudaError_t cudaStreamSynchronize(cudaStream_t) {
    hostcuda::host_waits().stream++;
    hostcuda::QueuedCopies::get().waited();
    return cudaSuccess;
}
inline cudaError_t cudaStreamWaitEvent(cudaStream_t, cudaEvent_t, unsigned = 0) { return cudaSuccess; }
inline cudaError_t cudaEventCreate(cudaEvent_t* event) { *event = new CUevent_st(); return cudaSuccess; }
inline cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned) { return cudaEventCreate(event); }
inline cudaError_t cudaEventDestroy(cudaEvent_t event) { delete event; return cudaSuccess; }
inline cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t = nullptr) {
    event->time = std::chrono::steady_clock::now();
    event->recorded = true;
    event->queued_copies = hostcuda::QueuedCopies::get().mark();
    return cudaSuccess;
}
inline cudaError_t cudaEventSynchronize(cudaEvent_t event) {
    hostcuda::host_waits().event++;
    hostcuda::QueuedCopies::get().waited(event->queued_copies);
    return cudaSuccess;
}
inline cudaError_t cudaEventQuery(cudaEvent_t event) {  // (done: what it follows may be touched)
    hostcuda::QueuedCopies::get().waited(event->queued_copies);
    return cudaSuccess;
}
inline cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
    if (!start->recorded || !end->recorded) { return hostcuda::set_error(cudaErrorInvalidValue); }
    *ms = std::chrono::duration<float, std::milli>(end->time - start->time).count();
    return cudaSuccess;
}
