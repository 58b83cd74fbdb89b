/*
The sync check: a debug mode in which every LAUNCH waits for its kernel and reports a fault
at the launch that caused it, naming the kernel, its grid, block, dynamic shared memory and
call site. Without it a kernel fault surfaces at the next synchronous call (often the loss
copy, far from the kernel), and cudaCheckLaunch() sees only configuration errors.

On with ATTN_SYNC_CHECK=1 in the environment or a trainer's --sync-check 1; costs a device
synchronisation per launch (use it to find a fault, not to train). LaunchSyncCheck is the
guard LAUNCH (llmc/cuda_common.h) puts around each launch: a one-pass for loop whose
variable's destructor runs after the launch statement.
*/
#pragma once

#include <cstdlib>
#include <cstring>

inline bool& sync_check() {
    static bool on = [] {
        const char* v = getenv("ATTN_SYNC_CHECK");
        return v != nullptr && strcmp(v, "") != 0 && strcmp(v, "0") != 0;
    }();
    return on;
}

inline void card_check_once();  // (llmc/card_check.h: the build's code runs on this card; once, before the first launch)

struct LaunchSyncCheck {
    const char* kernel;
    dim3 grid, block;
    size_t shared_bytes;
    const char* file;
    int line;
    bool pending = true;  // the for loop's condition: one pass

    LaunchSyncCheck(const char* kernel_, dim3 grid_, dim3 block_, size_t shared_, const char* file_, int line_)
        : kernel(kernel_), grid(grid_), block(block_), shared_bytes(shared_), file(file_), line(line_) {
        card_check_once();
    }
    ~LaunchSyncCheck() {
        if (!sync_check()) { return; }
        cudaError_t launched = cudaPeekAtLastError();  // a configuration error, left for cudaCheckLaunch too
        cudaError_t ran = launched == cudaSuccess ? cudaDeviceSynchronize() : launched;
        if (ran != cudaSuccess) {
            fatal("sync check: kernel %s (grid %u,%u,%u, block %u,%u,%u, %zu bytes of dynamic shared memory), launched "
                  "at %s:%d: %s", kernel, grid.x, grid.y, grid.z, block.x, block.y, block.z, shared_bytes, file, line,
                  cudaGetErrorString(ran));
        }
    }
    LaunchSyncCheck(const LaunchSyncCheck&) = delete;
    LaunchSyncCheck& operator=(const LaunchSyncCheck&) = delete;
};

#define LAUNCH_SYNC_CHECK(grid, block, shared_bytes, name) \
    for (LaunchSyncCheck launch_sync_check_(name, grid, block, shared_bytes, __FILE__, __LINE__); \
         launch_sync_check_.pending; launch_sync_check_.pending = false)
