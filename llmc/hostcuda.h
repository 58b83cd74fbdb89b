/*
The host backend: lets the host C++ compiler build and run the project's CUDA kernels on the
CPU, so that `make test` runs the real kernels on machines without a GPU. Included by
llmc/cuda_common.h when the compiler is not nvcc; each include below says what it brings.
What kernel code must do for it: launch with LAUNCH(grid, block, shared_bytes, stream, kernel)
(args...), which is kernel<<<...>>> under nvcc, and reach dynamic shared memory through
dynamic_shared_memory<T>() (llmc/cuda_common.h), not `extern __shared__` (no host equivalent).
doc/host-backend.md: how a launch runs, every part, thread orders, race checking, not modelled.
*/
#pragma once

#include <tuple>
#include <type_traits>
#include <utility>

#include "hostcuda/async_copy.h"        // cp.async: per-thread groups of copies that land at their wait
#include "hostcuda/bf16.h"              // __nv_bfloat16, its conversions and arithmetic
#include "hostcuda/device_functions.h"  // threadIdx & co, __syncthreads, shuffles, votes, atomics
#include "hostcuda/emulated_device.h"   // the GPU whose limits it reports (HOSTCUDA_DEVICE)
#include "hostcuda/mma.h"               // mma.sync and ldmatrix as warp collectives
#include "hostcuda/racecheck.h"         // shared-memory race and bounds checking (racecheck builds)
#include "hostcuda/runtime.h"           // cudaMalloc, cudaMemcpy, streams, events, errors
#include "hostcuda/scheduler.h"         // blocks on a worker pool, threads as fibers, barriers
#include "hostcuda/types.h"             // __global__ & co, dim3, vector types

namespace hostcuda {

// Checks a launch configuration the way the GPU would; returns an error (and says why on
// stderr) instead of running an impossible launch.
inline cudaError_t check_launch(const char* name, const void* kernel, dim3 grid, dim3 block, size_t shared_bytes) {
    emulated_device();  // (a HOSTCUDA_DEVICE it does not know stops the first launch)
    uint64_t threads = static_cast<uint64_t>(block.x) * block.y * block.z;
    const char* problem = nullptr;
    if (threads == 0 || grid.x == 0 || grid.y == 0 || grid.z == 0) {
        problem = "a grid or block dimension is 0";
    } else if (threads > static_cast<uint64_t>(kMaxThreadsPerBlock) || block.x > 1024 || block.y > 1024 ||
               block.z > 64) {
        problem = "too many threads per block (limit 1024; z <= 64)";
    } else if (grid.y > 65535 || grid.z > 65535 || grid.x > 2147483647u) {
        problem = "grid too large (y and z <= 65535)";
    } else {
        size_t limit = kDefaultSharedBytes;
        std::lock_guard<std::mutex> lock(attribute_mutex());
        auto it = max_dynamic_shared().find(kernel);
        if (it != max_dynamic_shared().end()) { limit = it->second; }
        if (shared_bytes > limit) {
            problem = "dynamic shared memory above the kernel's limit (48 KiB unless raised "
                      "with cudaFuncSetAttribute)";
        }
    }
    if (problem == nullptr) { return cudaSuccess; }
    fprintf(stderr,
            "host backend: launch of '%s' with grid (%u,%u,%u), block (%u,%u,%u), %zu bytes of "
            "dynamic shared memory: %s\n",
            name, grid.x, grid.y, grid.z, block.x, block.y, block.z, shared_bytes, problem);
    return cudaErrorInvalidConfiguration;
}

template <typename Body>
void invoke_body(void* body) {
    (*static_cast<Body*>(body))();
}

// The host side of LAUNCH: copies the arguments into the kernel's parameter types (as a
// GPU launch does) and runs the grid.
template <typename... Params>
class Launch {
public:
    Launch(const char* name, dim3 grid, dim3 block, size_t shared_bytes, cudaStream_t, void (*kernel)(Params...))
        : name_(name), grid_(grid), block_(block), shared_bytes_(shared_bytes), kernel_(kernel) {}

    template <typename... Args>
    void operator()(Args&&... args) const {
        static_assert(sizeof...(Args) == sizeof...(Params), "wrong number of kernel arguments");
        cudaError_t status = check_launch(name_, reinterpret_cast<const void*>(kernel_), grid_, block_, shared_bytes_);
        if (status != cudaSuccess) {
            set_error(status);
            return;
        }
        std::tuple<std::decay_t<Params>...> params(std::forward<Args>(args)...);
        check_pointer_arguments(params, std::index_sequence_for<Params...>{});
        auto kernel = kernel_;
        auto body = [&params, kernel]() { std::apply(kernel, params); };
        run_grid(GridLaunch{name_, grid_, block_, shared_bytes_, &invoke_body<decltype(body)>, &body, 0});
    }

private:
    // Every pointer parameter must point into memory a GPU kernel can reach (device_memory.h).
    template <typename Tuple, size_t... I>
    void check_pointer_arguments(const Tuple& params, std::index_sequence<I...>) const {
        (check_one_argument(static_cast<int>(I), std::get<I>(params)), ...);
    }
    template <typename P>
    void check_one_argument(int index, const P& p) const {
        if constexpr (std::is_pointer<P>::value) { check_kernel_pointer(name_, index, p); }
    }

    const char* name_;
    dim3 grid_, block_;
    size_t shared_bytes_;
    void (*kernel_)(Params...);
};

}  // namespace hostcuda
