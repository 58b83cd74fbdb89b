/*
Host backend: shared-memory race and bounds checking (like compute-sanitizer's racecheck and the
shared-memory part of memcheck) for binaries built with -DHOSTCUDA_RACECHECK -fsanitize=thread
(the Makefile's build/racecheck-<precision>/). The compiler calls __tsan_read4(address), ...
before every load and store; no ThreadSanitizer runtime is linked: those entry points are
defined here, so no kernel source changes. A shadow per byte of the shared windows records
writers, readers and cp.async; accesses a barrier does not order are reported at the launch's
end. doc/host-backend.md "Race checking" has the rule, the choices weighed and the limits.
*/
#pragma once

#include <dlfcn.h>
#include <link.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "runtime.h"
#include "scheduler.h"

#if defined(HOSTCUDA_RACECHECK)
// The checker's own code must not call the hooks it implements.
#define HOSTCUDA_UNINSTRUMENTED __attribute__((no_sanitize_thread))
#else
#define HOSTCUDA_UNINSTRUMENTED
#endif

namespace hostcuda {

#if defined(HOSTCUDA_RACECHECK)
constexpr bool kRaceCheckBuilt = true;
#else
constexpr bool kRaceCheckBuilt = false;
#endif

enum class RaceKind { ReadAfterWrite, WriteAfterWrite, WriteAfterRead, AsyncCopyNotWaited, OutOfBounds };

inline const char* race_kind_name(RaceKind k) {
    switch (k) {
        case RaceKind::ReadAfterWrite: return "read after write";
        case RaceKind::WriteAfterWrite: return "write after write";
        case RaceKind::WriteAfterRead: return "write after read";
        case RaceKind::AsyncCopyNotWaited: return "access to a cp.async destination before its wait";
        case RaceKind::OutOfBounds: return "out-of-bounds shared memory access";
    }
    return "?";
}

struct RaceReport {
    RaceKind kind;
    std::string kernel;
    dim3 block, block_dim;
    int thread = -1;        // linear index of the thread that made the access
    int other_thread = -1;  // the thread it conflicts with (-1: several, or none)
    bool is_write = false;
    bool dynamic = true;    // dynamic shared memory, else static __shared__ arrays
    long offset = 0;        // byte offset from the window's start (may be < 0 out of bounds)
    size_t window_bytes = 0;
    size_t access_bytes = 0;
    uintptr_t pc_offset = 0;  // the instrumented instruction, relative to the binary
    std::string binary;

    std::string describe() const {
        auto thread_text = [&](int t) {
            if (t < 0) { return std::string("several threads"); }
            dim3 i = unflatten(t, block_dim);
            char b[64];
            snprintf(b, sizeof(b), "thread (%u,%u,%u)", i.x, i.y, i.z);
            return std::string(b);
        };
        char text[640];
        if (kind == RaceKind::OutOfBounds) {
            snprintf(text, sizeof(text),
                     "kernel '%s', block (%u,%u,%u): %s: %s %s %zu bytes at byte offset %ld of the %zu bytes of "
                     "dynamic shared memory [%s+0x%zx]",
                     kernel.c_str(), block.x, block.y, block.z, race_kind_name(kind), thread_text(thread).c_str(),
                     is_write ? "writes" : "reads", access_bytes, offset, window_bytes, binary.c_str(),
                     (size_t)pc_offset);
        } else {
            snprintf(text, sizeof(text),
                     "kernel '%s', block (%u,%u,%u): %s: %s %s %s shared memory at byte offset %ld, which %s %s "
                     "in the same barrier interval [%s+0x%zx]",
                     kernel.c_str(), block.x, block.y, block.z, race_kind_name(kind), thread_text(thread).c_str(),
                     is_write ? "writes" : "reads", dynamic ? "dynamic" : "static", offset,
                     thread_text(other_thread).c_str(),
                     kind == RaceKind::WriteAfterRead ? "read"
                     : kind == RaceKind::AsyncCopyNotWaited ? "targets with a cp.async not yet waited for"
                                                            : "wrote",
                     binary.c_str(), (size_t)pc_offset);
        }
        return text;
    }
};

// Every hazard found, from all workers. Kept: the first kKeep of each launch (or of a
// capture), counted: all.
class RaceLog {
public:
    static constexpr size_t kKeep = 64;
    static RaceLog& get() {
        static RaceLog log;
        return log;
    }
    void add(RaceReport r) {
        std::lock_guard<std::mutex> lock(mutex_);
        count_++;
        if (kept_.size() < kKeep) { kept_.push_back(std::move(r)); }
    }
    std::mutex mutex_;
    std::vector<RaceReport> kept_;
    size_t count_ = 0;
    int captures_ = 0;
};

// While alive, hazards are collected here instead of ending the program.
class RaceCapture {
public:
    RaceCapture() {
        RaceLog& log = RaceLog::get();
        std::lock_guard<std::mutex> lock(log.mutex_);
        log.captures_++;
        log.kept_.clear();
        log.count_ = 0;
    }
    ~RaceCapture() {
        RaceLog& log = RaceLog::get();
        std::lock_guard<std::mutex> lock(log.mutex_);
        log.captures_--;
        log.kept_.clear();
        log.count_ = 0;
    }
    RaceCapture(const RaceCapture&) = delete;
    RaceCapture& operator=(const RaceCapture&) = delete;
    std::vector<RaceReport> reports() const {
        std::lock_guard<std::mutex> lock(RaceLog::get().mutex_);
        return RaceLog::get().kept_;
    }
    size_t count() const {
        std::lock_guard<std::mutex> lock(RaceLog::get().mutex_);
        return RaceLog::get().count_;
    }
};

// Whether launches are checked: built with checking and not turned off with HOSTCUDA_RACECHECK=0.
inline bool race_check_enabled() {
    static const bool enabled = [] {
        const char* env = getenv("HOSTCUDA_RACECHECK");
        bool wanted = env == nullptr ? kRaceCheckBuilt : strcmp(env, "0") != 0;
        if (wanted && !kRaceCheckBuilt) {
            die("HOSTCUDA_RACECHECK=%s, but this binary was built without race checking: build it as "
                "build/racecheck-<precision>/NAME (make build/racecheck-bf16/NAME)",
                env);
        }
        return wanted;
    }();
    return enabled;
}

// One byte of a shared window, as the checker sees it. The windows: dynamic shared memory with
// guard zones of Worker::kSharedGuardBytes on both sides, and the static __shared__ arrays
// (static thread_local: the worker's TLS block, less the backend's own thread-locals). Times are
// the worker's clock, which ticks at every block start, __syncthreads release and __syncwarp.
struct ShadowByte {
    uint32_t write_time;
    uint32_t read_time;
    int16_t writer;        // linear thread index of the last write
    int16_t reader;        // the first reader of the current set
    int16_t reader_warp;   // the warp all readers are in; -1: readers in several warps
    uint16_t async_owner;  // 1 + the thread whose cp.async to this byte is in flight; 0: none
    uint32_t reader_lanes; // the readers' lanes (when in one warp)
};

struct RaceChecker {
    struct SyncEvent {
        uint32_t time, lanes;
    };

    Worker* worker = nullptr;
    // dynamic shared memory [dyn_lo, dyn_lo + dyn_bytes) and the window with its guards
    uintptr_t dyn_lo = 0, dyn_window_lo = 0;
    size_t dyn_bytes = 0, dyn_window_bytes = 0;
    ShadowByte* dyn_shadow = nullptr;
    size_t dyn_shadow_capacity = 0;
    // static __shared__ arrays: the executable's TLS block of this worker thread
    uintptr_t static_lo = 0;
    size_t static_bytes = 0;
    ShadowByte* static_shadow = nullptr;
    uintptr_t excluded_lo[4] = {}, excluded_hi[4] = {};  // the backend's own thread-locals
    // time: accesses at times < barrier_time are ordered before everything now
    uint32_t clock = 1, barrier_time = 1;
    // the __syncwarp events of each warp since the last block barrier (at most kMaxSyncEvents
    // kept: older ones are dropped, which can only add reports, never hide one)
    static constexpr int kMaxSyncEvents = 64;
    SyncEvent syncwarps[kMaxThreadsPerBlock / kWarpSize][kMaxSyncEvents];
    int num_syncwarps[kMaxThreadsPerBlock / kWarpSize] = {};
    uint32_t warps_with_events = 0;
    bool reported_this_access = false;
    bool busy = false;  // inside the checker: instrumented code it calls is not checked

    HOSTCUDA_UNINSTRUMENTED explicit RaceChecker(Worker* w);

    HOSTCUDA_UNINSTRUMENTED void start_launch() {
        dyn_lo = reinterpret_cast<uintptr_t>(worker->shared_base());
        dyn_bytes = worker->dynamic_shared_bytes;
        dyn_window_lo = dyn_lo - Worker::kSharedGuardBytes;
        dyn_window_bytes = dyn_bytes + 2 * Worker::kSharedGuardBytes;
        if (dyn_shadow_capacity < dyn_window_bytes) {
            free(dyn_shadow);
            // zeroed entries carry time 0, which is before any barrier_time: "no access yet"
            dyn_shadow = static_cast<ShadowByte*>(calloc(dyn_window_bytes, sizeof(ShadowByte)));
            if (dyn_shadow == nullptr) { die("race check: no memory for the shadow of shared memory"); }
            dyn_shadow_capacity = dyn_window_bytes;
        }
    }
    HOSTCUDA_UNINSTRUMENTED void new_interval() {
        barrier_time = ++clock;
        for (uint32_t m = warps_with_events; m != 0; m &= m - 1) { num_syncwarps[__builtin_ctz(m)] = 0; }
        warps_with_events = 0;
    }
    HOSTCUDA_UNINSTRUMENTED void start_block() {
        if (clock > 0xf0000000u) {  // before the clock wraps: forget everything, start again
            memset(static_cast<void*>(dyn_shadow), 0, dyn_shadow_capacity * sizeof(ShadowByte));
            memset(static_cast<void*>(static_shadow), 0, static_bytes * sizeof(ShadowByte));
            clock = 1;
        }
        new_interval();
    }
    HOSTCUDA_UNINSTRUMENTED void syncwarp(int warp, uint32_t lanes) {
        int& count = num_syncwarps[warp];
        if (count == kMaxSyncEvents) {  // keep the newest
            memmove(&syncwarps[warp][0], &syncwarps[warp][1], (kMaxSyncEvents - 1) * sizeof(SyncEvent));
            count--;
        }
        syncwarps[warp][count++] = {++clock, lanes};
        warps_with_events |= 1u << warp;
    }

    // Whether thread `before`'s access at time `t` is ordered before an access by `now`.
    HOSTCUDA_UNINSTRUMENTED bool ordered(int before, uint32_t t, int now) const {
        if (t < barrier_time || before == now) { return true; }
        if (before / kWarpSize != now / kWarpSize) { return false; }
        uint32_t need = (1u << (before % kWarpSize)) | (1u << (now % kWarpSize));
        return warp_synced_since(now / kWarpSize, t, need);
    }
    HOSTCUDA_UNINSTRUMENTED bool warp_synced_since(int warp, uint32_t t, uint32_t need) const {
        const SyncEvent* events = syncwarps[warp];
        for (int i = num_syncwarps[warp]; i-- > 0;) {
            if (events[i].time <= t) { break; }
            if ((events[i].lanes & need) == need) { return true; }
        }
        return false;
    }
    // Whether every read recorded in `s` is ordered before an access by `now`; if not,
    // `*other` is a reader that is not.
    HOSTCUDA_UNINSTRUMENTED bool readers_ordered(const ShadowByte& s, int now, int* other) const {
        if (s.read_time < barrier_time || s.reader < 0) { return true; }
        int warp = now / kWarpSize;
        uint32_t me = 1u << (now % kWarpSize);
        if (s.reader_warp != warp) {
            *other = s.reader != now ? s.reader : -1;
            return false;
        }
        uint32_t others = s.reader_lanes & ~me;
        if (others == 0) { return true; }
        if (warp_synced_since(warp, s.read_time, others | me)) { return true; }
        *other = warp * kWarpSize + __builtin_ctz(others);
        return false;
    }

    HOSTCUDA_UNINSTRUMENTED void report(RaceKind kind, int thread, int other, bool write, bool dynamic, long offset,
                                        size_t window, size_t bytes, void* pc) {
        if (reported_this_access) { return; }
        reported_this_access = true;
        busy = true;  // the instrumented code below (std::string, its destructor) is not checked
        {
            RaceReport r;
            r.kind = kind;
            r.kernel = worker->kernel_name;
            r.block = tls.block_idx;
            r.block_dim = tls.block_dim;
            r.thread = thread;
            r.other_thread = other;
            r.is_write = write;
            r.dynamic = dynamic;
            r.offset = offset;
            r.window_bytes = window;
            r.access_bytes = bytes;
            Dl_info info;
            if (pc != nullptr && dladdr(pc, &info) != 0 && info.dli_fname != nullptr) {
                r.binary = info.dli_fname;
                r.pc_offset = reinterpret_cast<uintptr_t>(pc) - reinterpret_cast<uintptr_t>(info.dli_fbase);
            } else {
                r.binary = "?";
            }
            RaceLog::get().add(std::move(r));
        }
        busy = false;
    }

    HOSTCUDA_UNINSTRUMENTED void check_byte(ShadowByte& s, int tid, bool write, bool dynamic, long offset,
                                            size_t window, size_t bytes, void* pc) {
        int other = -1;
        if (s.async_owner != 0) {
            report(RaceKind::AsyncCopyNotWaited, tid, s.async_owner - 1, write, dynamic, offset, window, bytes, pc);
        } else if (s.write_time >= barrier_time && !ordered(s.writer, s.write_time, tid)) {
            report(write ? RaceKind::WriteAfterWrite : RaceKind::ReadAfterWrite, tid, s.writer, write, dynamic, offset,
                   window, bytes, pc);
        } else if (write && !readers_ordered(s, tid, &other)) {
            report(RaceKind::WriteAfterRead, tid, other, write, dynamic, offset, window, bytes, pc);
        }
        if (write) {
            s.writer = static_cast<int16_t>(tid);
            s.write_time = clock;
            s.reader = -1;
            return;
        }
        int warp = tid / kWarpSize;
        uint32_t me = 1u << (tid % kWarpSize);
        if (readers_ordered(s, tid, &other)) {  // a new set of readers starts
            s.reader = static_cast<int16_t>(tid);
            s.reader_warp = static_cast<int16_t>(warp);
            s.reader_lanes = me;
        } else if (s.reader_warp == warp) {
            s.reader_lanes |= me;
        } else {
            s.reader_warp = -1;
        }
        s.read_time = clock;
    }

    HOSTCUDA_UNINSTRUMENTED bool excluded(uintptr_t a) const {
        for (int i = 0; i < 4; i++) {
            if (a >= excluded_lo[i] && a < excluded_hi[i]) { return true; }
        }
        return false;
    }

    // Every instrumented access inside a block ends here; kept out of line, so that the
    // hooks' early returns (outside blocks, e.g. the host GEMM) cost a few instructions.
    HOSTCUDA_UNINSTRUMENTED __attribute__((noinline)) void access(uintptr_t a, size_t n, bool write, void* pc) {
        int tid = tls.fiber->linear_tid;
        if (a - dyn_window_lo < dyn_window_bytes || a + n - 1 - dyn_window_lo < dyn_window_bytes) {
            reported_this_access = false;
            for (size_t i = 0; i < n; i++) {
                uintptr_t b = a + i;
                if (b - dyn_window_lo >= dyn_window_bytes) { continue; }
                long offset = static_cast<long>(b) - static_cast<long>(dyn_lo);
                if (offset < 0 || static_cast<size_t>(offset) >= dyn_bytes) {
                    report(RaceKind::OutOfBounds, tid, -1, write, true, static_cast<long>(a) - static_cast<long>(dyn_lo),
                           dyn_bytes, n, pc);
                    continue;
                }
                // the run of bytes from here that lies inside dynamic shared memory
                size_t room = dyn_bytes - static_cast<size_t>(offset);
                size_t run = n - i < room ? n - i : room;
                check_bytes(dyn_shadow + (b - dyn_window_lo), run, tid, write, true, offset, dyn_bytes, pc);
                i += run - 1;
            }
        } else if (a - static_lo < static_bytes && !excluded(a)) {
            reported_this_access = false;
            size_t room = static_bytes - (a - static_lo);
            check_bytes(static_shadow + (a - static_lo), n < room ? n : room, tid, write, false,
                        static_cast<long>(a - static_lo), static_bytes, pc);
        }
    }
    // Bytes [0, n) of one access, all inside a window.
    HOSTCUDA_UNINSTRUMENTED void check_bytes(ShadowByte* shadow, size_t n, int tid, bool write, bool dynamic,
                                             long offset, size_t window, void* pc) {
        for (size_t i = 0; i < n; i++) {
            check_byte(shadow[i], tid, write, dynamic, offset + static_cast<long>(i), window, n, pc);
        }
    }

    // cp.async (async_copy.h): the copy is issued (a write that lands later) / lands.
    HOSTCUDA_UNINSTRUMENTED void async_issued(void* dst, size_t n, void* pc) {
        int tid = tls.fiber->linear_tid;
        uintptr_t a = reinterpret_cast<uintptr_t>(dst);
        access(a, n, true, pc);  // hazards with what other threads do in this interval
        for (size_t i = 0; i < n; i++) {
            if (ShadowByte* s = shadow_of(a + i)) { s->async_owner = static_cast<uint16_t>(tid + 1); }
        }
    }
    HOSTCUDA_UNINSTRUMENTED void async_landed(void* dst, size_t n, int owner) {
        uintptr_t a = reinterpret_cast<uintptr_t>(dst);
        for (size_t i = 0; i < n; i++) {
            if (ShadowByte* s = shadow_of(a + i)) {
                s->async_owner = 0;
                s->writer = static_cast<int16_t>(owner);
                s->write_time = clock;
                s->reader = -1;
            }
        }
    }
    HOSTCUDA_UNINSTRUMENTED ShadowByte* shadow_of(uintptr_t b) {
        if (b - dyn_lo < dyn_bytes) { return &dyn_shadow[b - dyn_window_lo]; }
        if (b - static_lo < static_bytes && !excluded(b)) { return &static_shadow[b - static_lo]; }
        return nullptr;
    }
};

// The executable's TLS block of the calling thread (where static __shared__ arrays live).
struct TlsBlock {
    uintptr_t lo = 0;
    size_t bytes = 0;
};
HOSTCUDA_UNINSTRUMENTED inline int find_executable_tls(struct dl_phdr_info* info, size_t, void* data) {
    TlsBlock* block = static_cast<TlsBlock*>(data);
    for (int i = 0; i < info->dlpi_phnum; i++) {
        if (info->dlpi_phdr[i].p_type == PT_TLS && info->dlpi_tls_data != nullptr) {
            block->lo = reinterpret_cast<uintptr_t>(info->dlpi_tls_data);
            block->bytes = info->dlpi_phdr[i].p_memsz;
        }
    }
    return 1;  // the first module is the executable
}

HOSTCUDA_UNINSTRUMENTED inline RaceChecker::RaceChecker(Worker* w) : worker(w) {
    TlsBlock block;
    dl_iterate_phdr(find_executable_tls, &block);
    static_lo = block.lo;
    static_bytes = block.bytes;
    static_shadow = static_cast<ShadowByte*>(calloc(static_bytes > 0 ? static_bytes : 1, sizeof(ShadowByte)));
    if (static_shadow == nullptr) { die("race check: no memory for the shadow of static shared memory"); }
    auto exclude = [&](int i, const void* p, size_t n) {
        excluded_lo[i] = reinterpret_cast<uintptr_t>(p);
        excluded_hi[i] = excluded_lo[i] + n;
    };
    exclude(0, &tls, sizeof(tls));
    exclude(1, w, sizeof(Worker));
    exclude(2, &last_error, sizeof(last_error));
    exclude(3, &Pool::in_parallel_region, sizeof(Pool::in_parallel_region));
}

// ----------------------------------------------------------------------------------------
// the scheduler's events (declared in scheduler.h)

HOSTCUDA_UNINSTRUMENTED inline void race_launch_started(Worker& w) {
    if (!race_check_enabled()) { return; }
    if (w.race == nullptr) { w.race = new RaceChecker(&w); }
    w.race->start_launch();
}
HOSTCUDA_UNINSTRUMENTED inline void race_block_started(Worker& w) { w.race->start_block(); }
HOSTCUDA_UNINSTRUMENTED inline void race_block_barrier(Worker& w) { w.race->new_interval(); }
HOSTCUDA_UNINSTRUMENTED inline void race_syncwarp(Worker& w, int warp, uint32_t lanes) { w.race->syncwarp(warp, lanes); }

// After every launch: a launch with hazards ends the program unless a RaceCapture collects them.
inline void race_launch_finished(const char* kernel_name) {
    if (!kRaceCheckBuilt) { return; }
    RaceLog& log = RaceLog::get();
    std::lock_guard<std::mutex> lock(log.mutex_);
    if (log.count_ == 0 || log.captures_ > 0) { return; }
    fflush(stdout);
    size_t shown = std::min<size_t>(log.kept_.size(), 10);
    for (size_t i = 0; i < shown; i++) { fprintf(stderr, "host backend: race check: %s\n", log.kept_[i].describe().c_str()); }
    die("race check: %zu shared-memory hazards in kernel '%s' (first %zu above; addr2line -Cfe BINARY OFFSET "
        "names the line)",
        log.count_, kernel_name, shown);
}

HOSTCUDA_UNINSTRUMENTED __attribute__((always_inline)) inline void race_check_access(const void* p, size_t n,
                                                                                     bool write, void* pc) {
    if (__builtin_expect(tls.fiber == nullptr, 1)) { return; }
    RaceChecker* r = tls.worker->race;
    if (r == nullptr || r->busy) { return; }
    r->access(reinterpret_cast<uintptr_t>(p), n, write, pc);
}

}  // namespace hostcuda

// ----------------------------------------------------------------------------------------
// the entry points -fsanitize=thread code calls (ThreadSanitizer's runtime is not linked)

#if defined(HOSTCUDA_RACECHECK)
extern "C" {
#define HOSTCUDA_TSAN_ACCESS(size)                                                                           \
    __attribute__((weak)) HOSTCUDA_UNINSTRUMENTED void __tsan_read##size(void* p) {                          \
        hostcuda::race_check_access(p, size, false, __builtin_return_address(0));                            \
    }                                                                                                        \
    __attribute__((weak)) HOSTCUDA_UNINSTRUMENTED void __tsan_write##size(void* p) {                         \
        hostcuda::race_check_access(p, size, true, __builtin_return_address(0));                             \
    }                                                                                                        \
    __attribute__((weak)) HOSTCUDA_UNINSTRUMENTED void __tsan_unaligned_read##size(void* p) {                \
        hostcuda::race_check_access(p, size, false, __builtin_return_address(0));                            \
    }                                                                                                        \
    __attribute__((weak)) HOSTCUDA_UNINSTRUMENTED void __tsan_unaligned_write##size(void* p) {               \
        hostcuda::race_check_access(p, size, true, __builtin_return_address(0));                             \
    }
HOSTCUDA_TSAN_ACCESS(1)
HOSTCUDA_TSAN_ACCESS(2)
HOSTCUDA_TSAN_ACCESS(4)
HOSTCUDA_TSAN_ACCESS(8)
HOSTCUDA_TSAN_ACCESS(16)
#undef HOSTCUDA_TSAN_ACCESS
__attribute__((weak)) HOSTCUDA_UNINSTRUMENTED void __tsan_read_range(void* p, unsigned long size) {
    hostcuda::race_check_access(p, size, false, __builtin_return_address(0));
}
__attribute__((weak)) HOSTCUDA_UNINSTRUMENTED void __tsan_write_range(void* p, unsigned long size) {
    hostcuda::race_check_access(p, size, true, __builtin_return_address(0));
}
__attribute__((weak)) void __tsan_init() {}
__attribute__((weak)) void __tsan_func_entry(void*) {}
__attribute__((weak)) void __tsan_func_exit() {}
__attribute__((weak)) void __tsan_vptr_update(void**, void*) {}
__attribute__((weak)) void __tsan_vptr_read(void**) {}

// Atomics: performed (sequentially consistent, which is at least as strong as asked), not checked.
#define HOSTCUDA_TSAN_ATOMIC(bits, T)                                                                         \
    __attribute__((weak)) HOSTCUDA_UNINSTRUMENTED T __tsan_atomic##bits##_load(const volatile T* a, int) {      \
        return __atomic_load_n(a, __ATOMIC_SEQ_CST);                                                          \
    }                                                                                                         \
    __attribute__((weak)) HOSTCUDA_UNINSTRUMENTED void __tsan_atomic##bits##_store(volatile T* a, T v, int) {   \
        __atomic_store_n(a, v, __ATOMIC_SEQ_CST);                                                             \
    }                                                                                                         \
    __attribute__((weak)) HOSTCUDA_UNINSTRUMENTED T __tsan_atomic##bits##_exchange(volatile T* a, T v, int) {   \
        return __atomic_exchange_n(a, v, __ATOMIC_SEQ_CST);                                                   \
    }                                                                                                         \
    __attribute__((weak)) HOSTCUDA_UNINSTRUMENTED T __tsan_atomic##bits##_fetch_add(volatile T* a, T v, int) {  \
        return __atomic_fetch_add(a, v, __ATOMIC_SEQ_CST);                                                    \
    }                                                                                                         \
    __attribute__((weak)) HOSTCUDA_UNINSTRUMENTED T __tsan_atomic##bits##_fetch_sub(volatile T* a, T v, int) {  \
        return __atomic_fetch_sub(a, v, __ATOMIC_SEQ_CST);                                                    \
    }                                                                                                         \
    __attribute__((weak)) HOSTCUDA_UNINSTRUMENTED T __tsan_atomic##bits##_fetch_and(volatile T* a, T v, int) {  \
        return __atomic_fetch_and(a, v, __ATOMIC_SEQ_CST);                                                    \
    }                                                                                                         \
    __attribute__((weak)) HOSTCUDA_UNINSTRUMENTED T __tsan_atomic##bits##_fetch_or(volatile T* a, T v, int) {   \
        return __atomic_fetch_or(a, v, __ATOMIC_SEQ_CST);                                                     \
    }                                                                                                         \
    __attribute__((weak)) HOSTCUDA_UNINSTRUMENTED T __tsan_atomic##bits##_fetch_xor(volatile T* a, T v, int) {  \
        return __atomic_fetch_xor(a, v, __ATOMIC_SEQ_CST);                                                    \
    }                                                                                                         \
    __attribute__((weak)) HOSTCUDA_UNINSTRUMENTED T __tsan_atomic##bits##_fetch_nand(volatile T* a, T v, int) { \
        return __atomic_fetch_nand(a, v, __ATOMIC_SEQ_CST);                                                   \
    }                                                                                                         \
    __attribute__((weak)) HOSTCUDA_UNINSTRUMENTED int __tsan_atomic##bits##_compare_exchange_strong(            \
        volatile T* a, T* expected, T v, int, int) {                                                          \
        return __atomic_compare_exchange_n(a, expected, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);        \
    }                                                                                                         \
    __attribute__((weak)) HOSTCUDA_UNINSTRUMENTED int __tsan_atomic##bits##_compare_exchange_weak(              \
        volatile T* a, T* expected, T v, int, int) {                                                          \
        return __atomic_compare_exchange_n(a, expected, v, true, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);         \
    }                                                                                                         \
    __attribute__((weak)) HOSTCUDA_UNINSTRUMENTED T __tsan_atomic##bits##_compare_exchange_val(                 \
        volatile T* a, T expected, T v, int, int) {                                                           \
        __atomic_compare_exchange_n(a, &expected, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);              \
        return expected;                                                                                      \
    }
HOSTCUDA_TSAN_ATOMIC(8, char)
HOSTCUDA_TSAN_ATOMIC(16, short)
HOSTCUDA_TSAN_ATOMIC(32, int)
HOSTCUDA_TSAN_ATOMIC(64, long)
#undef HOSTCUDA_TSAN_ATOMIC
__attribute__((weak)) HOSTCUDA_UNINSTRUMENTED void __tsan_atomic_thread_fence(int) {
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
}
__attribute__((weak)) HOSTCUDA_UNINSTRUMENTED void __tsan_atomic_signal_fence(int) {
    __atomic_signal_fence(__ATOMIC_SEQ_CST);
}
}  // extern "C"
#endif
