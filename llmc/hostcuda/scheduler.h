/*
Host backend: runs a kernel launch (grid of blocks of threads) on the CPU. Blocks are spread over
a pool of OS threads ("workers"; HOSTCUDA_THREADS, default: all cores); inside a block, GPU
threads run as fibers, and a fiber runs threads until one waits (at __syncthreads or a warp
collective), so a kernel without barriers costs one function call per GPU thread and no context
switch. The order threads run in is fixed by the launch and HOSTCUDA_SCHEDULE (forward, reverse,
random:SEED): results are deterministic, and a kernel that relies on one order (a missing
barrier) shows up under another. Barriers, collectives, deadlock reports and the orders:
doc/host-backend.md "How it executes a launch", "Thread orders".
*/
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <map>
#include <string>
#include <condition_variable>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

#include "cost.h"  // defines: CostRecorder (HOSTCUDA_COST: each launch's FLOPs and bytes)
#include "fiber.h"
#include "types.h"

namespace hostcuda {

[[noreturn]] inline void die(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
inline void die(const char* fmt, ...) {
    fflush(stdout);
    va_list args;
    va_start(args, fmt);
    fprintf(stderr, "host backend: ");
    vfprintf(stderr, fmt, args);
    fprintf(stderr, "\n");
    va_end(args);
    abort();
}

constexpr int kWarpSize = 32;
constexpr int kMaxThreadsPerBlock = 1024;
#if defined(__SANITIZE_ADDRESS__)
constexpr size_t kFiberStackBytes = 1024 * 1024;  // ASan's redzones make frames several times larger
#else
constexpr size_t kFiberStackBytes = 256 * 1024;
#endif

// Exchange: each lane posts a pointer to its own operands; the last to arrive calls the
// collective's `exchange` function on all of them (tensor-core emulation, hostcuda/mma.h).
enum class CollectiveKind { Shuffle, Ballot, All, Any, SyncWarp, Exchange };

// ----------------------------------------------------------------------------------------
// the order threads run in (HOSTCUDA_SCHEDULE)

enum class ScheduleOrder { Forward, Reverse, Random };
struct Schedule {
    ScheduleOrder order = ScheduleOrder::Forward;
    uint64_t seed = 0;
};

// Parses "forward", "reverse" or "random:SEED" (SEED a non-negative integer).
inline Schedule parse_schedule(const char* text) {
    Schedule s;
    if (text == nullptr || strcmp(text, "") == 0 || strcmp(text, "forward") == 0) { return s; }
    if (strcmp(text, "reverse") == 0) {
        s.order = ScheduleOrder::Reverse;
        return s;
    }
    if (strncmp(text, "random:", 7) == 0 && text[7] >= '0' && text[7] <= '9') {
        char* end = nullptr;
        unsigned long long seed = strtoull(text + 7, &end, 10);
        if (*end == '\0') {
            s.order = ScheduleOrder::Random;
            s.seed = seed;
            return s;
        }
    }
    die("HOSTCUDA_SCHEDULE='%s': expected forward, reverse or random:SEED (SEED a non-negative integer)", text);
}

// HOSTCUDA_THREADS: a whole number of worker threads, 1 to kMaxWorkers (a typo is an error,
// not one worker; empty is the default, as for HOSTCUDA_SCHEDULE).
constexpr int kMaxWorkers = 256;
inline int parse_thread_count(const char* text) {
    char* end = nullptr;
    long n = text[0] >= '0' && text[0] <= '9' ? strtol(text, &end, 10) : 0;
    if (end == nullptr || *end != '\0' || n < 1 || n > kMaxWorkers) {
        die("HOSTCUDA_THREADS='%s': expected a number of worker threads from 1 to %d", text, kMaxWorkers);
    }
    return static_cast<int>(n);
}

// The schedule of the following launches: HOSTCUDA_SCHEDULE, unless a test set another one.
inline Schedule& current_schedule() {
    static Schedule schedule = parse_schedule(getenv("HOSTCUDA_SCHEDULE"));
    return schedule;
}
// For tests: runs the following launches under `s` (call between launches, not inside one).
inline void set_schedule(Schedule s) { current_schedule() = s; }

inline uint64_t splitmix64(uint64_t& state) {
    uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

struct Fiber {
    Context context;
    FiberStack stack;
    int linear_tid = -1;  // the GPU thread this fiber is running
    dim3 thread_idx;
    uint64_t collective_result = 0;
    const char* waiting_for = nullptr;  // for deadlock reports
};

// One warp's collective in progress. All lanes in `participants` must arrive with the
// same kind before any of them gets its result.
struct WarpCollective {
    uint32_t participants = 0;
    uint32_t arrived = 0;
    CollectiveKind kind = CollectiveKind::SyncWarp;
    void (*exchange)(const uint64_t* lane_values, uint32_t participants) = nullptr;
    uint64_t value[kWarpSize];
    int source_lane[kWarpSize];
    Fiber* fiber[kWarpSize];
};

struct Worker;
struct RaceChecker;        // racecheck.h
struct AsyncCopyState;     // async_copy.h
// Events the race checker (racecheck.h) and cp.async emulation (async_copy.h) follow.
void race_launch_started(Worker& w);
void race_block_started(Worker& w);
void race_block_barrier(Worker& w);
void race_syncwarp(Worker& w, int warp, uint32_t lanes);
void async_copies_thread_exited(Worker& w, int linear_tid);
void async_copies_release(Worker& w);
void race_launch_finished(const char* kernel_name);

// Per-OS-thread view of "which GPU thread is running now"; threadIdx & co read from here.
struct ThreadState {
    Worker* worker;
    Fiber* fiber;
    dim3 thread_idx;
    dim3 block_idx;
    dim3 block_dim;
    dim3 grid_dim;
};
inline thread_local ThreadState tls{};

struct Worker {
    Context scheduler;
    std::vector<Fiber*> all_fibers;
    std::vector<Fiber*> idle_fibers;
    std::deque<Fiber*> run_queue;

    // the block being run
    const char* kernel_name = nullptr;
    void (*body)(void*) = nullptr;
    void* body_arg = nullptr;
    uint64_t launch_id = 0;
    int num_threads = 0;
    int next_unstarted = 0;
    int finished = 0;
    int barrier_arrived = 0;
    int barrier_predicate_count = 0;
    int barrier_result = 0;
    std::vector<Fiber*> barrier_waiters;
    WarpCollective warps[kMaxThreadsPerBlock / kWarpSize];
    std::vector<unsigned char> dynamic_shared;  // sized per launch, 16-byte aligned start
    size_t dynamic_shared_bytes = 0;            // the launch's shared_bytes

    // the schedule of this block (HOSTCUDA_SCHEDULE)
    ScheduleOrder order = ScheduleOrder::Forward;
    uint64_t rng = 0;                // Random: the block's random stream
    std::vector<int> start_order;    // Random: the permutation threads start in

    RaceChecker* race = nullptr;            // set while race checking is on (racecheck.h)
    AsyncCopyState* async_copies = nullptr;  // cp.async copies in flight (async_copy.h)

    ~Worker() {
        if (async_copies != nullptr) { async_copies_release(*this); }  // (found by LeakSanitizer)
        for (Fiber* f : all_fibers) {
            f->stack.release();
            delete f;
        }
    }

    Fiber* acquire_fiber();
    Fiber* next_runnable();
    void switch_away(Context& from);
    void run_block(dim3 block_idx);
    void block_current_fiber(Fiber* self, const char* reason);
    void on_thread_finished();
    void release_barrier();
    void yield_current_fiber(Fiber* self);
    [[noreturn]] void report_deadlock();
    // The race checker keeps guard zones of kSharedGuardBytes on both sides of the dynamic
    // shared memory, where any access is out of bounds.
    static constexpr size_t kSharedGuardBytes =
#if defined(HOSTCUDA_RACECHECK)
        4096;
#else
        0;
#endif
    unsigned char* shared_base() {
        uintptr_t p = reinterpret_cast<uintptr_t>(dynamic_shared.data()) + kSharedGuardBytes;
        return reinterpret_cast<unsigned char*>((p + 15) & ~static_cast<uintptr_t>(15));
    }
    // Which thread the k-th fiber start runs.
    int thread_to_start(int k) const {
        switch (order) {
            case ScheduleOrder::Forward: return k;
            case ScheduleOrder::Reverse: return num_threads - 1 - k;
            case ScheduleOrder::Random: return start_order[k];
        }
        return k;
    }
    uint32_t random_below(uint32_t n) { return static_cast<uint32_t>(splitmix64(rng) % n); }
};

inline dim3 unflatten(int linear, dim3 dims) {
    return dim3(linear % dims.x, (linear / dims.x) % dims.y, linear / (dims.x * dims.y));
}

// The function every fiber runs: claim unstarted threads of the current block and run
// them; when none are left, park as idle until the next block needs a fiber.
inline void fiber_main() {
    fiber_started();
    for (;;) {
        Worker& w = *tls.worker;
        Fiber* self = tls.fiber;
        while (w.next_unstarted < w.num_threads) {
            int t = w.thread_to_start(w.next_unstarted++);
            self->linear_tid = t;
            self->thread_idx = unflatten(t, tls.block_dim);
            tls.thread_idx = self->thread_idx;
            w.body(w.body_arg);
            if (w.async_copies != nullptr) { async_copies_thread_exited(w, t); }
            w.on_thread_finished();
        }
        self->linear_tid = -1;
        w.idle_fibers.push_back(self);
        w.switch_away(self->context);
    }
}

inline Fiber* Worker::acquire_fiber() {
    if (!idle_fibers.empty()) {
        Fiber* f = idle_fibers.back();
        idle_fibers.pop_back();
        return f;
    }
    Fiber* f = new Fiber();
    f->stack.allocate(kFiberStackBytes);
    f->context.prepare(f->stack, fiber_main);
    all_fibers.push_back(f);
    return f;
}

inline bool all_threads_at_barrier(const Worker& w) {
    return w.next_unstarted == w.num_threads && w.barrier_arrived + w.finished == w.num_threads;
}

inline void Worker::release_barrier() {
    barrier_result = barrier_predicate_count;
    barrier_predicate_count = 0;
    barrier_arrived = 0;
    if (race != nullptr) { race_block_barrier(*this); }
    // forward and reverse: resume in thread order (random: the scheduler loop picks at random)
    auto ascending = [](const Fiber* a, const Fiber* b) { return a->linear_tid < b->linear_tid; };
    auto descending = [](const Fiber* a, const Fiber* b) { return a->linear_tid > b->linear_tid; };
    if (order == ScheduleOrder::Forward && !std::is_sorted(barrier_waiters.begin(), barrier_waiters.end(), ascending)) {
        std::sort(barrier_waiters.begin(), barrier_waiters.end(), ascending);
    } else if (order == ScheduleOrder::Reverse &&
               !std::is_sorted(barrier_waiters.begin(), barrier_waiters.end(), descending)) {
        std::sort(barrier_waiters.begin(), barrier_waiters.end(), descending);
    }
    for (Fiber* f : barrier_waiters) { run_queue.push_back(f); }
    barrier_waiters.clear();
}

inline void Worker::on_thread_finished() {
    finished++;
    // The exiting thread may have been the last one a pending barrier waited for.
    if (barrier_arrived > 0 && all_threads_at_barrier(*this)) { release_barrier(); }
}

// Parks the running fiber and switches to the scheduler loop, first making sure that a
// fiber exists to start the threads that have not started yet.
inline void Worker::block_current_fiber(Fiber* self, const char* reason) {
    self->waiting_for = reason;
    if (next_unstarted < num_threads) { run_queue.push_back(acquire_fiber()); }
    switch_away(self->context);
    self->waiting_for = nullptr;
}

// Lets the schedule pick what runs next; `self` must already be in the run queue.
inline void Worker::yield_current_fiber(Fiber* self) { switch_away(self->context); }

// The fiber that runs next, taken off the run queue (the front; a random schedule swaps a
// random one to the front first), or null when none can run.
inline Fiber* Worker::next_runnable() {
    if (run_queue.empty()) { return nullptr; }
    if (order == ScheduleOrder::Random && run_queue.size() > 1) {
        std::swap(run_queue.front(), run_queue[random_below(static_cast<uint32_t>(run_queue.size()))]);
    }
    Fiber* f = run_queue.front();
    run_queue.pop_front();
    return f;
}

// Leaves the running fiber (its context `from`) for the next runnable one, switching to it
// directly, or for the scheduler loop of run_block when none can run (the block is done, or
// deadlocked). A direct switch is one context switch per blocked thread instead of two (to
// the loop and out of it): warp collectives, which park every lane, cost about half as much.
// The order is the one the loop would pick, so every schedule runs the same interleaving.
inline void Worker::switch_away(Context& from) {
    Fiber* next = next_runnable();
    if (next == nullptr) {
        switch_context(from, scheduler);
        return;
    }
    tls.fiber = next;
    tls.thread_idx = next->thread_idx;
    if (&next->context != &from) { switch_context(from, next->context); }
}

inline void Worker::run_block(dim3 block_idx) {
    tls.block_idx = block_idx;
    next_unstarted = 0;
    finished = 0;
    barrier_arrived = 0;
    barrier_predicate_count = 0;
    if (order == ScheduleOrder::Random) {
        uint64_t block_linear = block_idx.x + static_cast<uint64_t>(tls.grid_dim.x) *
                                                  (block_idx.y + static_cast<uint64_t>(tls.grid_dim.y) * block_idx.z);
        rng = current_schedule().seed;
        rng = splitmix64(rng) ^ launch_id;
        rng = splitmix64(rng) ^ block_linear;
        start_order.resize(num_threads);
        for (int i = 0; i < num_threads; i++) { start_order[i] = i; }
        for (int i = num_threads - 1; i > 0; i--) { std::swap(start_order[i], start_order[random_below(i + 1)]); }
    }
    if (race != nullptr) { race_block_started(*this); }
    run_queue.push_back(acquire_fiber());
    // (fibers pass control among themselves, switch_away; this loop runs again only when
    // none of them can)
    while (Fiber* f = next_runnable()) {
        tls.fiber = f;
        tls.thread_idx = f->thread_idx;
        switch_context(scheduler, f->context);
    }
    tls.fiber = nullptr;
    if (finished != num_threads) { report_deadlock(); }
}

inline void Worker::report_deadlock() {
    fprintf(stderr,
            "host backend: kernel '%s', block (%u,%u,%u): deadlock: %d of %d threads finished, the "
            "others wait forever:\n",
            kernel_name, tls.block_idx.x, tls.block_idx.y, tls.block_idx.z, finished, num_threads);
    int shown = 0;
    for (Fiber* f : all_fibers) {
        if (f->linear_tid >= 0 && f->waiting_for != nullptr && shown++ < 8) {
            fprintf(stderr, "  thread (%u,%u,%u) (warp %d lane %d) waits in %s\n", f->thread_idx.x,
                    f->thread_idx.y, f->thread_idx.z, f->linear_tid / kWarpSize,
                    f->linear_tid % kWarpSize, f->waiting_for);
        }
    }
    die("a __syncthreads or warp collective that not every required thread reaches "
        "(divergent barrier, or a lane in the mask that exited)");
}

// ----------------------------------------------------------------------------------------
// operations called from inside kernels

inline Worker& current_worker(const char* what) {
    if (tls.fiber == nullptr) { die("%s called outside a kernel", what); }
    return *tls.worker;
}

// __syncthreads_count semantics; plain __syncthreads passes 0.
inline int block_barrier(int predicate) {
    Worker& w = current_worker("__syncthreads");
#if defined(HOSTCUDA_MUTATION_SYNCTHREADS_NOOP)
    return predicate != 0;
#endif
    w.barrier_arrived++;
    w.barrier_predicate_count += predicate != 0;
    Fiber* self = tls.fiber;
    w.barrier_waiters.push_back(self);
    if (!all_threads_at_barrier(w)) {
        w.block_current_fiber(self, "__syncthreads");
    } else {
        w.release_barrier();  // the last to arrive resumes in the schedule's order, like the others
        w.yield_current_fiber(self);
    }
    return w.barrier_result;
}

// Lanes of warp `warp` that exist in a block of `num_threads` threads.
inline uint32_t existing_lanes(int warp, int num_threads) {
    int n = std::min(kWarpSize, num_threads - warp * kWarpSize);
    return n >= kWarpSize ? 0xffffffffu : ((1u << n) - 1u);
}

// A warp collective: every lane in `mask` posts `value` (and, for shuffles, the lane it
// reads from). The last to arrive computes each lane's result.
inline uint64_t warp_collective(CollectiveKind kind, uint32_t mask, uint64_t value, int source_lane,
                                const char* name,
                                void (*exchange)(const uint64_t* lane_values, uint32_t participants) = nullptr) {
    Worker& w = current_worker(name);
    Fiber* self = tls.fiber;
    int lane = self->linear_tid % kWarpSize;
    int warp = self->linear_tid / kWarpSize;
    WarpCollective& c = w.warps[warp];
    uint32_t participants = mask & existing_lanes(warp, w.num_threads);
    if (!(participants >> lane & 1u)) {
        die("kernel '%s': %s called by lane %d of warp %d with mask 0x%08x that excludes it", w.kernel_name,
            name, lane, warp, mask);
    }
    if (c.arrived == 0) {
        c.participants = participants;
        c.kind = kind;
        c.exchange = exchange;
    } else if (c.participants != participants || c.kind != kind || c.exchange != exchange) {
        die("kernel '%s': warp %d: lane %d calls %s (mask 0x%08x) while other lanes wait in a "
            "different collective (mask 0x%08x); divergent warp collectives are not supported",
            w.kernel_name, warp, lane, name, participants, c.participants);
    }
    c.value[lane] = value;
    c.source_lane[lane] = source_lane;
    c.fiber[lane] = self;
    c.arrived |= 1u << lane;
    if (c.arrived != c.participants) {
        w.block_current_fiber(self, name);
        return self->collective_result;
    }
    // last to arrive: compute every participant's result and wake them
    if (kind == CollectiveKind::Exchange) { c.exchange(c.value, participants); }
    uint64_t votes = 0;
    for (int l = 0; l < kWarpSize; l++) {
        if ((participants >> l & 1u) && c.value[l] != 0) { votes |= 1ull << l; }
    }
    for (int l = 0; l < kWarpSize; l++) {
        if (!(participants >> l & 1u)) { continue; }
        uint64_t result = 0;
        switch (kind) {
            case CollectiveKind::Shuffle: {
                int src = c.source_lane[l];
                result = (src >= 0 && src < kWarpSize && (participants >> src & 1u)) ? c.value[src] : c.value[l];
                break;
            }
            case CollectiveKind::Ballot: result = votes; break;
            case CollectiveKind::All: result = votes == participants; break;
            case CollectiveKind::Any: result = votes != 0; break;
            case CollectiveKind::SyncWarp:
            case CollectiveKind::Exchange: break;
        }
        c.fiber[l]->collective_result = result;
    }
    c.arrived = 0;
    if (kind == CollectiveKind::SyncWarp && w.race != nullptr) { race_syncwarp(w, warp, participants); }
    // every participant, this one included, resumes in the schedule's order
    for (int i = 0; i < kWarpSize; i++) {
        int l = w.order == ScheduleOrder::Reverse ? kWarpSize - 1 - i : i;
        if (participants >> l & 1u) { w.run_queue.push_back(c.fiber[l]); }
    }
    w.yield_current_fiber(self);
    return self->collective_result;
}

// Puts the running thread at the back of its block's run queue (starting the next thread
// first if some have not started) and lets the others run: the interleaving a GPU gives a
// read-modify-write that is not atomic. For the atomics mutation only (device_functions.h):
// with it every thread of a block reads before any writes, so lost updates show on any
// machine, whatever the load (racing OS threads alone only show them when two run at once).
inline void reschedule_current_thread() {
    Worker& w = current_worker("atomic (mutation)");
    Fiber* self = tls.fiber;
    if (w.next_unstarted < w.num_threads) { w.run_queue.push_back(w.acquire_fiber()); }
    w.run_queue.push_back(self);
    w.yield_current_fiber(self);
}

inline uint32_t active_lanes() {
    Worker& w = current_worker("__activemask");
    int warp = tls.fiber->linear_tid / kWarpSize;
    return existing_lanes(warp, w.num_threads);
}

inline unsigned char* dynamic_shared_memory() { return current_worker("dynamic shared memory").shared_base(); }

// ----------------------------------------------------------------------------------------
// the worker pool: runs index ranges [0, n) in chunks on all workers, caller included

class Pool {
public:
    static Pool& instance() {
        static Pool pool;
        return pool;
    }
    int num_workers() const { return static_cast<int>(threads_.size()) + 1; }

    // Calls fn(ctx, i) for every i in [0, n); returns when all are done. The caller works
    // too. Not reentrant: a task must not call parallel_for.
    //
    // Workers join a job only while it is open; when the caller has run out of chunks it
    // closes the job and waits only for the workers that joined (they are running). So a
    // worker that is asleep or descheduled never delays a launch: its share is done by
    // whoever is awake.
    void parallel_for(int64_t n, int64_t chunk, void (*fn)(void*, int64_t), void* ctx) {
        if (threads_.empty() || n <= chunk || in_parallel_region) {
            for (int64_t i = 0; i < n; i++) { fn(ctx, i); }
            return;
        }
        std::lock_guard<std::mutex> serialize(launch_mutex_);
        job_fn_ = fn;
        job_ctx_ = ctx;
        job_n_ = n;
        job_chunk_ = chunk;
        next_.store(0, std::memory_order_relaxed);
        finished_.store(0, std::memory_order_relaxed);
        uint64_t generation = (state_.load(std::memory_order_relaxed) >> 32) + 1;
        {
            std::lock_guard<std::mutex> lock(mutex_);
            state_.store(generation << 32, std::memory_order_release);  // open, nobody joined
        }
        wake_.notify_all();
        run_chunks();
        uint64_t closed = state_.fetch_or(kClosed, std::memory_order_acq_rel);
        uint64_t joined = closed & kJoinedMask;
        for (int spin = 0; finished_.load(std::memory_order_acquire) != joined; spin++) {
            if (spin < 1000) {
                cpu_relax();
            } else {
                std::this_thread::yield();
            }
        }
    }

    ~Pool() {
        {
            std::lock_guard<std::mutex> lock(mutex_);
            stop_ = true;
            state_.fetch_add(1ull << 32);
        }
        wake_.notify_all();
        for (auto& t : threads_) { t.join(); }
    }

    static inline thread_local bool in_parallel_region = false;

private:
    static constexpr uint64_t kClosed = 1ull << 31;
    static constexpr uint64_t kJoinedMask = kClosed - 1;

    Pool() {
        int n = static_cast<int>(std::thread::hardware_concurrency());
        const char* env = getenv("HOSTCUDA_THREADS");
        if (env != nullptr && env[0] != '\0') { n = parse_thread_count(env); }  // (empty: unset)
        n = std::max(1, std::min(n, kMaxWorkers));
        for (int i = 1; i < n; i++) {
            threads_.emplace_back([this] { thread_main(); });
        }
    }
    static void cpu_relax() {
#if defined(__x86_64__)
        __builtin_ia32_pause();
#endif
    }
    void run_chunks() {
        in_parallel_region = true;
        for (;;) {
            int64_t start = next_.fetch_add(job_chunk_, std::memory_order_relaxed);
            if (start >= job_n_) { break; }
            int64_t end = std::min(job_n_, start + job_chunk_);
            for (int64_t i = start; i < end; i++) { job_fn_(job_ctx_, i); }
        }
        in_parallel_region = false;
    }
    // Joins the open job of generation `generation`; false if it is closed or superseded.
    bool join(uint64_t generation) {
        uint64_t s = state_.load(std::memory_order_acquire);
        while ((s >> 32) == generation && !(s & kClosed)) {
            if (state_.compare_exchange_weak(s, s + 1, std::memory_order_acq_rel)) { return true; }
        }
        return false;
    }
    void thread_main() {
        uint64_t seen = 0;
        for (;;) {
            // spin briefly (launches come in quick succession), then sleep
            uint64_t gen = state_.load(std::memory_order_acquire) >> 32;
            for (int spin = 0; gen == seen && spin < 20000; spin++) {
                cpu_relax();
                gen = state_.load(std::memory_order_acquire) >> 32;
            }
            if (gen == seen) {
                std::unique_lock<std::mutex> lock(mutex_);
                wake_.wait(lock, [&] { return (state_.load() >> 32) != seen || stop_; });
                gen = state_.load() >> 32;
            }
            seen = gen;
            if (stop_) { return; }
            if (join(gen)) {
                run_chunks();
                finished_.fetch_add(1, std::memory_order_acq_rel);
            }
        }
    }

    std::vector<std::thread> threads_;
    std::mutex launch_mutex_;
    std::mutex mutex_;
    std::condition_variable wake_;
    std::atomic<uint64_t> state_{0};  // generation << 32 | closed bit | number of workers joined
    std::atomic<int64_t> next_{0};
    std::atomic<uint64_t> finished_{0};
    std::atomic<bool> stop_{false};
    void (*job_fn_)(void*, int64_t) = nullptr;
    void* job_ctx_ = nullptr;
    int64_t job_n_ = 0;
    int64_t job_chunk_ = 1;
};

inline Worker& this_thread_worker() {
    static thread_local Worker worker;
    return worker;
}

struct GridLaunch {
    const char* kernel_name;
    dim3 grid, block;
    size_t shared_bytes;
    void (*body)(void*);
    void* body_arg;
    uint64_t id;  // unique per launch, so a worker knows when to take the new parameters
};

// HOSTCUDA_BLOCK_ORDER=reverse: the blocks of a launch are taken last first. The workers take
// blocks in increasing linear index, as GPUs do in practice but CUDA does not promise; a kernel
// whose blocks wait for one another must not rely on it, and a run with one worker
// (HOSTCUDA_THREADS=1) in reverse shows one that does: it waits forever.
inline bool blocks_reversed() {
    static const bool reversed = [] {
        const char* env = getenv("HOSTCUDA_BLOCK_ORDER");
        if (env == nullptr || env[0] == '\0' || strcmp(env, "forward") == 0) { return false; }
        if (strcmp(env, "reverse") == 0) { return true; }
        die("HOSTCUDA_BLOCK_ORDER='%s': expected forward or reverse", env);
    }();
    return reversed;
}

inline void run_block_task(void* ctx, int64_t block_linear) {
    const GridLaunch& launch = *static_cast<const GridLaunch*>(ctx);
    if (blocks_reversed()) {
        block_linear = static_cast<int64_t>(launch.grid.x) * launch.grid.y * launch.grid.z - 1 - block_linear;
    }
    Worker& w = this_thread_worker();
    if (w.launch_id != launch.id) {
        w.launch_id = launch.id;
        tls.worker = &w;
        tls.block_dim = launch.block;
        tls.grid_dim = launch.grid;
        w.kernel_name = launch.kernel_name;
        w.body = launch.body;
        w.body_arg = launch.body_arg;
        w.num_threads = static_cast<int>(launch.block.x * launch.block.y * launch.block.z);
        size_t bytes = launch.shared_bytes + 16 + 2 * Worker::kSharedGuardBytes;
        if (w.dynamic_shared.size() < bytes) { w.dynamic_shared.resize(bytes); }
        w.dynamic_shared_bytes = launch.shared_bytes;
        w.order = current_schedule().order;
        race_launch_started(w);
    }
    dim3 b(static_cast<unsigned>(block_linear % launch.grid.x),
           static_cast<unsigned>((block_linear / launch.grid.x) % launch.grid.y),
           static_cast<unsigned>(block_linear / (static_cast<int64_t>(launch.grid.x) * launch.grid.y)));
    w.run_block(b);
}

// HOSTCUDA_PROFILE=1: at exit, print the wall time spent in each kernel (by name).
class KernelProfile {
public:
    static KernelProfile* instance() {
        static KernelProfile* profile = getenv("HOSTCUDA_PROFILE") != nullptr ? new KernelProfile() : nullptr;
        return profile;
    }
    void add(const char* name, double seconds) {
        Entry& e = entries_[name];
        e.seconds += seconds;
        e.launches++;
    }
    ~KernelProfile() = default;

private:
    struct Entry {
        double seconds = 0.0;
        long launches = 0;
    };
    KernelProfile() { atexit([] { instance()->print(); }); }
    void print() const {
        std::vector<std::pair<std::string, Entry>> rows(entries_.begin(), entries_.end());
        std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.seconds > b.second.seconds; });
        double total = 0.0;
        for (const auto& r : rows) { total += r.second.seconds; }
        fprintf(stderr, "host backend profile: %.3f s in kernels\n%10s %8s %10s  %s\n", total, "seconds", "share", "launches", "kernel");
        for (const auto& r : rows) {
            fprintf(stderr, "%10.3f %7.1f%% %10ld  %s\n", r.second.seconds, 100.0 * r.second.seconds / total,
                    r.second.launches, r.first.c_str());
        }
    }
    std::map<std::string, Entry> entries_;
};

// Runs every block of the launch and returns when all are done.
inline void run_grid(GridLaunch launch) {
    static std::atomic<uint64_t> launch_counter{0};
    launch.id = ++launch_counter;
    int64_t num_blocks = static_cast<int64_t>(launch.grid.x) * launch.grid.y * launch.grid.z;
    int64_t threads_per_block = static_cast<int64_t>(launch.block.x) * launch.block.y * launch.block.z;
    // Small grids are not worth waking the pool for.
    Pool& pool = Pool::instance();
    int64_t chunk = std::max<int64_t>(1, num_blocks / (8 * pool.num_workers()));
    if (num_blocks * threads_per_block < 4096) { chunk = num_blocks; }
    KernelProfile* profile = KernelProfile::instance();
    auto start = profile != nullptr ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point();
    if (CostRecorder* cost = CostRecorder::instance()) {
        cost->measure(launch.kernel_name, [&] { pool.parallel_for(num_blocks, chunk, run_block_task, &launch); });
    } else {
        pool.parallel_for(num_blocks, chunk, run_block_task, &launch);
    }
    if (profile != nullptr) {
        profile->add(launch.kernel_name, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
    race_launch_finished(launch.kernel_name);
}

// The host path of an elementwise kernel (no barriers, shared memory or warp collectives)
// whose body is an inlinable function of the element index: body(i) for every i in [0, n),
// as plain loops over fixed chunks on the pool, which the compiler vectorises, instead of a
// fiber's function call per GPU thread (~3 ns each, several times the work of an AdamW
// element). Elements are independent, so the result does not depend on the workers.
// Profiled under `name`.
constexpr int64_t kElementwiseChunk = 1 << 14;

template <typename Body>
void elementwise_chunk(void* ctx, int64_t chunk) {
    // (a local copy: the captured pointers stay in registers, and the loop vectorises)
    auto [body, n] = *static_cast<const std::pair<Body, size_t>*>(ctx);
    size_t end = std::min(n, (size_t)(chunk + 1) * kElementwiseChunk);
    for (size_t i = (size_t)chunk * kElementwiseChunk; i < end; i++) { body(i); }
}

template <typename Body>
void run_elementwise(const char* name, size_t n, Body body) {
    KernelProfile* profile = KernelProfile::instance();
    auto start = profile != nullptr ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point();
    std::pair<Body, size_t> ctx{body, n};
    int64_t chunks = ((int64_t)n + kElementwiseChunk - 1) / kElementwiseChunk;
    if (CostRecorder* cost = CostRecorder::instance()) {
        cost->measure(name, [&] { Pool::instance().parallel_for(chunks, 1, elementwise_chunk<Body>, &ctx); });
    } else {
        Pool::instance().parallel_for(chunks, 1, elementwise_chunk<Body>, &ctx);
    }
    if (profile != nullptr) {
        profile->add(name, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
}

}  // namespace hostcuda
