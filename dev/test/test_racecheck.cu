/*
Deliberate shared-memory bugs, and what the host backend's schedules and race checker
make of them (doc/host-backend.md). Each bug kernel has a correct twin:
- neighbour_after_write: s[t] written, then s[t-1] or s[t+1] read without __syncthreads;
- neighbour_before_write: s[t+1] read, then s[t] overwritten without __syncthreads;
- double_buffer: the prefetch of the next tile goes into the buffer being read;
- async_copy_read: a cp.async destination read after __syncthreads but before its wait;
- shared_write_past_end: a loop bound one too far writes past dynamic shared memory;
- warp_neighbour: lanes exchange through shared memory with __syncwarp (fine inside a
  warp, a race across warps).
Checked for each: under the forward order (the backend's order before schedules existed)
the bugs that read a lower thread's slot, or read before a higher thread overwrites, give
the right numbers, i.e. pass a plain numeric test; the reverse order exposes them; the
correct twins give the same numbers under forward, reverse and random orders. In a
racecheck build (build/racecheck-PRECISION/test_racecheck) every bug is reported, under every
order, with the kernel, block, both threads and the byte offset, and the twins are clean;
the reports are collected with hostcuda::RaceCapture, so the test process goes on.

Host backend only: on a GPU the racy kernels have no defined result.
Usage: test_racecheck [name-filter]
*/
#include <vector>

#include "llmc/kernels/async_copy.cuh"
#include "llmc/cuda_common.h"
#include "dev/test/testing.h"

#if HOST_BACKEND

using hostcuda::RaceKind;
using hostcuda::RaceReport;
using hostcuda::Schedule;
using hostcuda::ScheduleOrder;

static const Schedule kForward{ScheduleOrder::Forward, 0};
static const Schedule kReverse{ScheduleOrder::Reverse, 0};
static const Schedule kRandom{ScheduleOrder::Random, 12345};
static const Schedule kSchedules[] = {kForward, kReverse, kRandom};

// What one launch did: its output and the hazards the checker reported.
struct Outcome {
    std::vector<float> out;
    std::vector<RaceReport> reports;
    size_t hazards = 0;
};

// Runs `launch` (which writes n floats to d_out) under `schedule`, collecting hazards.
template <typename Launch>
static Outcome run_under(Schedule schedule, float* d_out, size_t n, Launch launch) {
    hostcuda::set_schedule(schedule);
    cudaCheck(cudaMemset(d_out, 0, n * sizeof(float)));
    Outcome o;
    {
        hostcuda::RaceCapture capture;
        launch();
        cudaCheckLaunch();
        o.reports = capture.reports();
        o.hazards = capture.count();
    }
    hostcuda::set_schedule(kForward);
    o.out = copy_from_device(d_out, n);
    return o;
}

static size_t count_wrong(const std::vector<float>& got, const std::vector<float>& expect) {
    size_t bad = 0;
    for (size_t i = 0; i < got.size(); i++) { bad += got[i] != expect[i]; }
    return bad;
}

static std::vector<float> iota_floats(size_t n, float scale) {
    std::vector<float> v(n);
    for (size_t i = 0; i < n; i++) { v[i] = 1.0f + scale * (float)i; }
    return v;
}

// In a racecheck build: at least one hazard, and every kept report is a read/write pair of
// two threads `distance` apart at the byte `offset_of(reader)` of the array. (Offsets of
// static __shared__ arrays count from the start of the static window, where the array
// sits somewhere: the same unknown base for all reports.)
template <typename Offset>
static void check_neighbour_reports(const Outcome& o, const char* kernel, int distance, Offset offset_of) {
    if (!hostcuda::race_check_enabled()) { return; }
    CHECK(o.hazards > 0);
    CHECK(!o.reports.empty());
    long base = o.reports.empty() ? 0 : o.reports[0].offset;
    for (const RaceReport& r : o.reports) {
        CHECK(r.kernel.find(kernel) != std::string::npos);
        CHECK(r.kind == RaceKind::ReadAfterWrite || r.kind == RaceKind::WriteAfterRead);
        CHECK(r.other_thread >= 0 && std::abs(r.thread - r.other_thread) == distance);
        int reader = r.kind == RaceKind::ReadAfterWrite ? r.thread : r.other_thread;
        if (&r == &o.reports[0]) { base = r.offset - offset_of(reader); }
        CHECK_EQ(r.offset - offset_of(reader), base);
        CHECK(r.access_bytes == 4 && r.window_bytes > 0);
    }
}

static void check_clean(const Outcome& o) { CHECK_EQ(o.hazards, (size_t)0); }

// ----------------------------------------------------------------------------------------
// write s[t], read a neighbour's slot

__global__ void neighbour_after_write(const float* in, float* out, int direction, bool barrier) {
    __shared__ float s[256];
    int n = blockDim.x, t = threadIdx.x;
    s[t] = in[blockIdx.x * n + t];
    if (barrier) { __syncthreads(); }
    int j = min(max(t + direction, 0), n - 1);
    out[blockIdx.x * n + t] = s[j];
}

TEST_CASE(missing_syncthreads_write_then_read_neighbour) {
    int blocks = 8, n = 256;
    std::vector<float> in = iota_floats((size_t)blocks * n, 0.5f);
    float* d_in = copy_to_device(in);
    float* d_out = cudaMallocElements(float, in.size());
    for (int direction : {-1, +1}) {
        std::vector<float> expect(in.size());
        for (int b = 0; b < blocks; b++)
            for (int t = 0; t < n; t++) expect[b * n + t] = in[b * n + std::min(std::max(t + direction, 0), n - 1)];
        for (bool barrier : {true, false}) {
            for (const Schedule& s : kSchedules) {
                Outcome o = run_under(s, d_out, in.size(),
                                      [&] { LAUNCH(blocks, n, 0, 0, neighbour_after_write)(d_in, d_out, direction, barrier); });
                size_t wrong = count_wrong(o.out, expect);
                if (barrier) {
                    CHECK_EQ(wrong, (size_t)0);
                    check_clean(o);
                    continue;
                }
                // The lower-numbered writer runs first under forward, last under reverse.
                bool writer_first = (direction < 0) == (s.order == ScheduleOrder::Forward);
                if (s.order != ScheduleOrder::Random) { CHECK(writer_first ? wrong == 0 : wrong > 0); }
                check_neighbour_reports(o, "neighbour_after_write", 1, [&](int reader) { return 4L * (reader + direction); });
            }
        }
    }
    cudaCheck(cudaFree(d_in));
    cudaCheck(cudaFree(d_out));
}

// read s[t+1], then overwrite s[t]: the read must come before the neighbour's write

__global__ void neighbour_before_write(const float* in, float* out, bool barrier) {
    __shared__ float s[256];
    int n = blockDim.x, t = threadIdx.x;
    s[t] = in[blockIdx.x * n + t];
    __syncthreads();
    float right = s[min(t + 1, n - 1)];
    if (barrier) { __syncthreads(); }
    s[t] = 2.0f * right;
    __syncthreads();
    out[blockIdx.x * n + t] = s[t];
}

TEST_CASE(missing_syncthreads_read_neighbour_then_write) {
    int blocks = 8, n = 256;
    std::vector<float> in = iota_floats((size_t)blocks * n, 0.25f);
    std::vector<float> expect(in.size());
    for (int b = 0; b < blocks; b++)
        for (int t = 0; t < n; t++) expect[b * n + t] = 2.0f * in[b * n + std::min(t + 1, n - 1)];
    float* d_in = copy_to_device(in);
    float* d_out = cudaMallocElements(float, in.size());
    for (bool barrier : {true, false}) {
        for (const Schedule& s : kSchedules) {
            Outcome o = run_under(s, d_out, in.size(), [&] { LAUNCH(blocks, n, 0, 0, neighbour_before_write)(d_in, d_out, barrier); });
            size_t wrong = count_wrong(o.out, expect);
            if (barrier) {
                CHECK_EQ(wrong, (size_t)0);
                check_clean(o);
                continue;
            }
            if (s.order == ScheduleOrder::Forward) { CHECK_EQ(wrong, (size_t)0); }  // passes the old order
            if (s.order == ScheduleOrder::Reverse) { CHECK(wrong > 0); }
            check_neighbour_reports(o, "neighbour_before_write", 1, [](int reader) { return 4L * (reader + 1); });
        }
    }
    cudaCheck(cudaFree(d_in));
    cudaCheck(cudaFree(d_out));
}

// ----------------------------------------------------------------------------------------
// double buffering: compute on buf[cur] while the next tile is loaded into buf[cur ^ 1].
// The buggy variant flips the index one step early, so `next` equals `cur`: the prefetch
// overwrites the tile the block is reading in the same barrier interval.

__global__ void double_buffer(const float* in, float* out, int tiles, bool flip_early) {
    __shared__ float buf[2][256];
    int n = blockDim.x, t = threadIdx.x;
    const float* src = in + (size_t)blockIdx.x * tiles * n;
    int right = min(t + 1, n - 1);
    int cur = 0;
    buf[cur][t] = src[t];
    __syncthreads();
    float acc = 0.0f;
    for (int k = 0; k < tiles; k++) {
        float x = buf[cur][right];
        int next = flip_early ? cur : cur ^ 1;
        if (k + 1 < tiles) { buf[next][t] = src[(size_t)(k + 1) * n + t]; }
        acc += x * (float)(k + 1);
        __syncthreads();
        cur = next;
    }
    out[blockIdx.x * n + t] = acc;
}

TEST_CASE(double_buffer_flipped_too_early) {
    int blocks = 4, n = 128, tiles = 6;
    std::vector<float> in = iota_floats((size_t)blocks * tiles * n, 1.0f / 64);  // exact sums
    std::vector<float> expect((size_t)blocks * n, 0.0f);
    for (int b = 0; b < blocks; b++)
        for (int t = 0; t < n; t++)
            for (int k = 0; k < tiles; k++)
                expect[b * n + t] += in[((size_t)b * tiles + k) * n + std::min(t + 1, n - 1)] * (float)(k + 1);
    float* d_in = copy_to_device(in);
    float* d_out = cudaMallocElements(float, expect.size());
    for (bool bug : {false, true}) {
        for (const Schedule& s : kSchedules) {
            Outcome o = run_under(s, d_out, expect.size(), [&] { LAUNCH(blocks, n, 0, 0, double_buffer)(d_in, d_out, tiles, bug); });
            size_t wrong = count_wrong(o.out, expect);
            if (!bug) {
                CHECK_EQ(wrong, (size_t)0);
                check_clean(o);
                continue;
            }
            if (s.order == ScheduleOrder::Forward) { CHECK_EQ(wrong, (size_t)0); }
            if (s.order == ScheduleOrder::Reverse) { CHECK(wrong > 0); }
            // the read of buf[cur][t + 1] and the prefetch into it by thread t + 1
            check_neighbour_reports(o, "double_buffer", 1, [](int reader) { return 4L * (reader + 1); });
        }
    }
    cudaCheck(cudaFree(d_in));
    cudaCheck(cudaFree(d_out));
}

// ----------------------------------------------------------------------------------------
// cp.async: every thread copies its element, then all read a neighbour's. The bug waits for
// its copies only after reading: __syncthreads does not complete a cp.async.

__global__ void async_copy_read(const float* in, float* out, bool wait_before_reading) {
    float* s = dynamic_shared_memory<float>();
    int n = blockDim.x, t = threadIdx.x;
    s[t] = -1.0f;
    __syncthreads();
    cp_async_4(&s[t], &in[blockIdx.x * n + t]);
    cp_async_commit_group();
    if (wait_before_reading) { cp_async_wait_group<0>(); }
    __syncthreads();
    out[blockIdx.x * n + t] = s[(t + 1) % n];
    cp_async_wait_all();
}

TEST_CASE(async_copy_read_before_wait) {
    int blocks = 4, n = 64;
    std::vector<float> in = iota_floats((size_t)blocks * n, 1.0f);
    std::vector<float> expect(in.size());
    for (int b = 0; b < blocks; b++)
        for (int t = 0; t < n; t++) expect[b * n + t] = in[b * n + (t + 1) % n];
    float* d_in = copy_to_device(in);
    float* d_out = cudaMallocElements(float, in.size());
    for (bool wait : {true, false}) {
        for (const Schedule& s : kSchedules) {
            Outcome o = run_under(s, d_out, in.size(),
                                  [&] { LAUNCH(blocks, n, n * sizeof(float), 0, async_copy_read)(d_in, d_out, wait); });
            if (wait) {
                CHECK_EQ(count_wrong(o.out, expect), (size_t)0);
                check_clean(o);
                continue;
            }
            // the copies land at the late wait, so reads before a neighbour's wait see the old -1
            size_t stale_reads = 0;
            for (float x : o.out) { stale_reads += x == -1.0f; }
            CHECK(stale_reads > 0);
            if (!hostcuda::race_check_enabled()) { continue; }
            // a read before the neighbour's wait, or (if the neighbour already ran to its late
            // wait) a read of what its copy wrote in this barrier interval: both are bugs
            CHECK(o.hazards > 0);
            size_t not_waited = 0;
            for (const RaceReport& r : o.reports) {
                not_waited += r.kind == RaceKind::AsyncCopyNotWaited;
                CHECK(r.kind == RaceKind::AsyncCopyNotWaited || r.kind == RaceKind::ReadAfterWrite);
                CHECK_EQ(r.other_thread, (r.thread + 1) % n);
                CHECK_EQ(r.offset, 4L * r.other_thread);
                CHECK(r.dynamic && !r.is_write);
            }
            CHECK(not_waited > 0);
        }
    }
    cudaCheck(cudaFree(d_in));
    cudaCheck(cudaFree(d_out));
}

// Groups are per thread and wait_group<N> leaves the N most recent in flight.
__global__ void async_copy_groups(const float* in, float* out) {
    float* s = dynamic_shared_memory<float>();  // [3][n]
    int n = blockDim.x, t = threadIdx.x;
    for (int g = 0; g < 3; g++) { s[g * n + t] = -1.0f; }
    for (int g = 0; g < 3; g++) {
        cp_async_4(&s[g * n + t], &in[g * n + t]);
        cp_async_commit_group();
    }
    cp_async_wait_group<1>();  // groups 0 and 1 landed, group 2 may be in flight
    out[0 * n + t] = s[0 * n + t];
    out[1 * n + t] = s[1 * n + t];
    cp_async_wait_group<0>();
    out[2 * n + t] = s[2 * n + t];
}

__global__ void async_copy_group_in_flight(const float* in, float* out) {
    float* s = dynamic_shared_memory<float>();  // [2 * blockDim.x]
    int t = threadIdx.x;
    s[2 * t] = s[2 * t + 1] = -1.0f;
    cp_async_8(&s[2 * t], &in[2 * t]);   // the thread's own 8 bytes
    cp_async_commit_group();
    cp_async_wait_group<1>();            // allows the one group in flight
    out[t] = s[2 * t];                   // own destination, too early
    cp_async_wait_all();
}

TEST_CASE(async_copy_groups_are_per_thread) {
    int n = 32;
    std::vector<float> in = iota_floats(3 * n, 1.0f);
    float* d_in = copy_to_device(in);
    float* d_out = cudaMallocElements(float, 3 * n);
    for (const Schedule& s : kSchedules) {
        Outcome o = run_under(s, d_out, 3 * n, [&] { LAUNCH(1, n, 3 * n * sizeof(float), 0, async_copy_groups)(d_in, d_out); });
        CHECK_EQ(count_wrong(o.out, in), (size_t)0);
        check_clean(o);
    }
    // reading one's own destination while its group may be in flight: stale, and reported
    int m = 16;
    Outcome o = run_under(kForward, d_out, m,
                          [&] { LAUNCH(1, m, 2 * m * sizeof(float), 0, async_copy_group_in_flight)(d_in, d_out); });
    CHECK_EQ(count_wrong(o.out, std::vector<float>(m, -1.0f)), (size_t)0);
    if (hostcuda::race_check_enabled()) {
        CHECK_EQ(o.hazards, (size_t)m);
        for (const RaceReport& r : o.reports) {
            CHECK(r.kind == RaceKind::AsyncCopyNotWaited && r.thread == r.other_thread);
        }
    }
    cudaCheck(cudaFree(d_in));
    cudaCheck(cudaFree(d_out));
}

// ----------------------------------------------------------------------------------------
// a loop bound one too far: thread 0 also writes element n, past the n floats launched

__global__ void shared_write_past_end(float* out, int last) {
    float* s = dynamic_shared_memory<float>();
    int n = blockDim.x, t = threadIdx.x;
    for (int i = t; i <= last; i += n) { s[i] = (float)i; }
    __syncthreads();
    out[blockIdx.x * n + t] = s[t];
}

TEST_CASE(out_of_bounds_shared_write) {
    int blocks = 3, n = 64;
    std::vector<float> expect((size_t)blocks * n);
    for (int b = 0; b < blocks; b++)
        for (int t = 0; t < n; t++) expect[b * n + t] = (float)t;
    float* d_out = cudaMallocElements(float, expect.size());
    for (int last : {n - 1, n}) {
        Outcome o = run_under(kRandom, d_out, expect.size(),
                              [&] { LAUNCH(blocks, n, n * sizeof(float), 0, shared_write_past_end)(d_out, last); });
        CHECK_EQ(count_wrong(o.out, expect), (size_t)0);  // the numbers do not show it
        if (last == n - 1) {
            check_clean(o);
            continue;
        }
        if (!hostcuda::race_check_enabled()) { continue; }
        CHECK_EQ(o.hazards, (size_t)blocks);  // one per block: thread 0 writes s[n]
        for (const RaceReport& r : o.reports) {
            CHECK(r.kind == RaceKind::OutOfBounds && r.is_write && r.dynamic);
            CHECK_EQ(r.thread, 0);
            CHECK_EQ(r.offset, 4L * n);
            CHECK_EQ(r.window_bytes, (size_t)(4 * n));
            CHECK(r.kernel.find("shared_write_past_end") != std::string::npos);
        }
    }
    cudaCheck(cudaFree(d_out));
}

// ----------------------------------------------------------------------------------------
// __syncwarp orders the lanes of one warp, and nothing across warps

__global__ void warp_neighbour(const float* in, float* out, int partner_xor, bool syncwarp) {
    __shared__ float s[64];
    int t = threadIdx.x;
    s[t] = in[t];
    if (syncwarp) { __syncwarp(); }
    out[t] = s[t ^ partner_xor];
}

TEST_CASE(syncwarp_orders_lanes_of_one_warp_only) {
    int n = 64;
    std::vector<float> in = iota_floats(n, 1.0f);
    float* d_in = copy_to_device(in);
    float* d_out = cudaMallocElements(float, n);
    struct Case { int partner_xor; bool syncwarp; bool racy; };
    for (Case c : {Case{1, true, false}, Case{1, false, true}, Case{32, true, true}}) {
        for (const Schedule& s : kSchedules) {
            Outcome o = run_under(s, d_out, n, [&] { LAUNCH(1, n, 0, 0, warp_neighbour)(d_in, d_out, c.partner_xor, c.syncwarp); });
            if (!c.racy) {
                std::vector<float> expect(n);
                for (int t = 0; t < n; t++) expect[t] = in[t ^ c.partner_xor];
                CHECK_EQ(count_wrong(o.out, expect), (size_t)0);
                check_clean(o);
            } else if (hostcuda::race_check_enabled()) {
                CHECK(o.hazards > 0);
                for (const RaceReport& r : o.reports) { CHECK_EQ(r.thread ^ c.partner_xor, r.other_thread); }
            }
        }
    }
    cudaCheck(cudaFree(d_in));
    cudaCheck(cudaFree(d_out));
}

// ----------------------------------------------------------------------------------------

TEST_CASE(schedule_parsing) {
    CHECK(hostcuda::parse_schedule(nullptr).order == ScheduleOrder::Forward);
    CHECK(hostcuda::parse_schedule("forward").order == ScheduleOrder::Forward);
    CHECK(hostcuda::parse_schedule("reverse").order == ScheduleOrder::Reverse);
    Schedule r = hostcuda::parse_schedule("random:42");
    CHECK(r.order == ScheduleOrder::Random && r.seed == 42);
}

int main(int argc, char** argv) {
    printf("test_racecheck: race checking %s\n",
           hostcuda::race_check_enabled() ? "on" : "off (plain build, or HOSTCUDA_RACECHECK=0): no reports expected");
    return testing::run_all(argv[0], argc > 1 ? argv[1] : nullptr);
}

#else

int main() {
    printf("test_racecheck: host backend only (its kernels race on purpose; a GPU gives them no defined result)\n");
    return 0;
}

#endif
