/*
Tests that the host backend refuses what would break only on a GPU: a kernel given a host
buffer, a copy whose kind does not match its pointers, a memset or free of host memory
(llmc/hostcuda/device_memory.h), a cp.async wait with copies never committed
(llmc/hostcuda/async_copy.h), and (HOSTCUDA_QUEUED_COPIES) host accesses to pinned memory that a
queued copy still holds (llmc/hostcuda/queued_copies.h). Each misuse runs in a forked child, which must die naming the
kernel or call and the problem; the correct use next to it must pass. The parent launches
nothing itself, so the children fork from a process without worker threads.

Host backend only: on a GPU these misuses fault or are undefined, which is what the checks
stand in for; the nvcc build only prints that it skips.

Usage: test_backend_misuse [name-filter]
*/
#include <signal.h>
#include <sys/wait.h>

#include <string>
#include <vector>

#include "llmc/cuda_common.h"
#include "llmc/kernels/async_copy.cuh"
#include "dev/test/data_test_util.h"  // run_in_child
#include "dev/test/testing.h"

#if HOST_BACKEND

// Runs fn in a child: true if it died (the backend aborts) with `needle` in its output, and
// prints what it said otherwise.
static bool dies_saying(const std::function<void()>& fn, const std::string& needle) {
    std::string out;
    int status = run_in_child(fn, &out);
    // the backend aborts; fatal() (the sync check) exits with a status
    bool died = (WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT) || (WIFEXITED(status) && WEXITSTATUS(status) != 0);
    bool ok = died && out.find(needle) != std::string::npos;
    if (!ok) { fprintf(stderr, "  expected to die saying [%s]; got status %d and: %s\n", needle.c_str(), status, out.c_str()); }
    return ok;
}
static bool runs_clean(const std::function<void()>& fn) {
    std::string out;
    int status = run_in_child(fn, &out);
    bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    if (!ok) { fprintf(stderr, "  expected to run; got status %d and: %s\n", status, out.c_str()); }
    return ok;
}

// Hides where a pointer came from, so that the compiler does not warn about the frees the
// backend is meant to refuse (they never run).
template <typename T>
static T* opaque(T* p) {
    asm volatile("" : "+r"(p));
    return p;
}

__global__ void add_one(float* x, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) { x[i] += 1.0f; }
}

TEST_CASE(kernel_pointer_must_be_device_memory) {
    static const int n = 64;
    CHECK(runs_clean([] {
        float* d = cudaMallocElements(float, n);
        LAUNCH(1, n, 0, 0, add_one)(d, n);
        LAUNCH(1, n, 0, 0, add_one)(d + n, 0);  // one past the end: an empty tensor's pointer
        LAUNCH(1, n, 0, 0, add_one)(nullptr, 0);
        cudaCheck(cudaFree(d));
    }));
    CHECK(dies_saying([] {
        std::vector<float> host(n);
        LAUNCH(1, n, 0, 0, add_one)(host.data(), n);
    }, "kernel 'add_one': pointer argument 0"));
    CHECK(dies_saying([] {
        float* d = cudaMallocElements(float, n);
        cudaCheck(cudaFree(d));
        LAUNCH(1, n, 0, 0, add_one)(d, n);  // freed
    }, "is not in device memory"));
    // pinned host memory is mapped for kernels, as on the GPU
    CHECK(runs_clean([] {
        float* p = nullptr;
        cudaCheck(cudaMallocHost(&p, n * sizeof(float)));
        LAUNCH(1, n, 0, 0, add_one)(p, n);
        cudaCheck(cudaFreeHost(p));
    }));
}

TEST_CASE(copy_kind_must_match_its_pointers) {
    static const size_t bytes = 256;
    CHECK(runs_clean([] {
        std::vector<char> h(bytes);
        char* d = cudaMallocElements(char, bytes);
        char* d2 = cudaMallocElements(char, bytes);
        char* pinned = nullptr;
        cudaCheck(cudaMallocHost(&pinned, bytes));
        cudaCheck(cudaMemcpy(d, h.data(), bytes, cudaMemcpyHostToDevice));
        cudaCheck(cudaMemcpy(h.data(), d, bytes, cudaMemcpyDeviceToHost));
        cudaCheck(cudaMemcpy(d2, d, bytes, cudaMemcpyDeviceToDevice));
        cudaCheck(cudaMemcpyAsync(pinned, d + 128, 128, cudaMemcpyDeviceToHost, 0));
        cudaCheck(cudaMemcpy(d, pinned, bytes, cudaMemcpyDefault));
        cudaCheck(cudaMemset(d + 16, 0, bytes - 16));
        cudaCheck(cudaFreeHost(pinned));
        cudaCheck(cudaFree(d));
        cudaCheck(cudaFree(d2));
    }));
    CHECK(dies_saying([] {
        std::vector<char> h(bytes), h2(bytes);
        cudaMemcpy(h2.data(), h.data(), bytes, cudaMemcpyHostToDevice);
    }, "the destination is host memory; the kind says device"));
    CHECK(dies_saying([] {
        std::vector<char> h(bytes);
        char* d = cudaMallocElements(char, bytes);
        cudaMemcpy(d, h.data(), bytes, cudaMemcpyDeviceToHost);  // arguments swapped
    }, "cudaMemcpyDeviceToHost): the destination is device memory"));
    CHECK(dies_saying([] {
        std::vector<char> h(2 * bytes);
        char* d = cudaMallocElements(char, bytes);
        cudaMemcpyAsync(d, h.data(), 2 * bytes, cudaMemcpyHostToDevice, 0);
    }, "the destination runs past the end of its allocation"));
    CHECK(dies_saying([] {
        std::vector<char> h(bytes);
        cudaMemset(h.data(), 0, bytes);
    }, "cudaMemset("));
    CHECK(dies_saying([] {
        std::vector<char> h(bytes);
        cudaFree(opaque(h.data()));
    }, "cudaFree("));
    CHECK(dies_saying([] {
        char* d = cudaMallocElements(char, bytes);
        cudaFreeHost(d);
    }, "free it with cudaFree"));
}

// cp.async: a wait with copies in the open group (never committed) is refused, also by
// wait_all, whose implicit commit the kernels do not rely on.
__global__ void async_copy_commit(const float* in, float* out, bool commit, bool wait_all) {
    float* s = dynamic_shared_memory<float>();
    int t = threadIdx.x;
    cp_async_4(&s[t], &in[t]);
    if (commit) { cp_async_commit_group(); }
    if (wait_all) {
        cp_async_wait_all();
    } else {
        cp_async_wait_group<0>();
    }
    __syncthreads();
    out[t] = s[t];
}

TEST_CASE(async_copy_wait_refuses_uncommitted_copies) {
    const int n = 32;
    for (bool wait_all : {false, true}) {
        auto run = [=](bool commit) {
            std::vector<float> h(n, 2.0f);
            float* in = copy_to_device(h);
            float* out = cudaMallocElements(float, n);
            LAUNCH(1, n, n * sizeof(float), 0, async_copy_commit)(in, out, commit, wait_all);
            cudaCheck(cudaMemcpy(h.data(), out, n * sizeof(float), cudaMemcpyDeviceToHost));
            if (h[n - 1] != 2.0f) { fatal("async_copy_commit: wrong result"); }
        };
        CHECK(runs_clean([=] { run(true); }));
        CHECK(dies_saying([=] { run(false); }, wait_all ? "reaches cp_async_wait_all with cp.async copies it never committed"
                                                        : "reaches cp_async_wait_group with cp.async copies it never committed"));
    }
}

// The sync check (llmc/launch_check.h) reports a failed launch at the launch, by kernel
// name, launch shape and call site; without it the error waits for the next cudaCheckLaunch.
// HOSTCUDA_QUEUED_COPIES (llmc/hostcuda/queued_copies.h): the host may not write a queued copy's
// pinned source nor read its pinned destination before a wait covers the copy.
TEST_CASE(queued_copy_pinned_memory_waits_first) {
    static const int n = 64;
    struct Buffers {
        int *pinned = nullptr, *device = nullptr;
        cudaEvent_t event = nullptr;
        Buffers() {
            hostcuda::queued_copies_check(true);
            cudaCheck(cudaMallocHost(&pinned, n * sizeof(int)));
            device = cudaMallocElements(int, n);
            cudaCheck(cudaEventCreate(&event));
        }
        void up() { cudaCheck(cudaMemcpyAsync(device, pinned, n * sizeof(int), cudaMemcpyHostToDevice, 0)); }
        void down() { cudaCheck(cudaMemcpyAsync(pinned, device, n * sizeof(int), cudaMemcpyDeviceToHost, 0)); }
    };
    CHECK(runs_clean([] {
        Buffers b;
        b.up();
        volatile int seen = b.pinned[3];  // reading a source: allowed
        (void)seen;
        cudaCheck(cudaEventRecord(b.event, 0));
        cudaCheck(cudaEventSynchronize(b.event));
        b.pinned[3] = 7;  // after the wait: allowed
        b.down();
        cudaCheck(cudaStreamSynchronize(0));
        if (b.pinned[3] != 0) { abort(); }
        b.up();
        cudaCheck(cudaEventRecord(b.event, 0));
        if (cudaEventQuery(b.event) != cudaSuccess) { abort(); }  // done: as a wait
        b.pinned[0] = 1;
        b.up();
        cudaCheck(cudaFreeHost(b.pinned));  // its copies go with it
    }));
    CHECK(dies_saying([] {
        Buffers b;
        b.up();
        b.pinned[3] = 7;  // the copy may not have read it yet
    }, "in the pinned source of a queued cudaMemcpyAsync"));
    CHECK(dies_saying([] {
        Buffers b;
        cudaCheck(cudaEventRecord(b.event, 0));  // an event before the copy covers nothing of it
        b.down();
        cudaCheck(cudaEventSynchronize(b.event));
        volatile int seen = b.pinned[3];  // the copy may not have written it yet
        (void)seen;
    }, "in the pinned destination of a queued cudaMemcpyAsync"));
}

TEST_CASE(sync_check_names_the_failing_kernel) {
    auto bad_launch = [](bool check) {
        sync_check() = check;
        float* d = cudaMallocElements(float, 1);
        LAUNCH(1, 2048, 0, 0, add_one)(d, 1);  // too many threads per block
        printf("returned from the launch\n");
        exit(0);
    };
    CHECK(dies_saying([&] { bad_launch(true); },
                      "sync check: kernel add_one (grid 1,1,1, block 2048,1,1, 0 bytes of dynamic shared memory), "
                      "launched at dev/test/test_backend_misuse.cu:"));
    CHECK(runs_clean([&] { bad_launch(false); }));
}

TEST_MAIN()

#else

int main() {
    printf("test_backend_misuse: skipped (it checks the host backend's emulation of GPU faults)\n");
    return 0;
}

#endif
