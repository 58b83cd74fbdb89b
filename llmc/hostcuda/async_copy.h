/*
Host backend: cp.async (global -> shared copies that complete asynchronously), as the PTX ISA
defines them, for llmc/kernels/async_copy.cuh. Each thread has its own sequence of groups; the
source is read when the copy is issued, the destination written only when the issuing thread
waits for its group (or exits), so a kernel that reads a destination too early reads stale data
here too, and the race checker (racecheck.h) reports the access. Stricter than the PTX ISA: a wait
with copies in the open group dies. The functions below say what each instruction does; why the
stricter rule, and the tests: doc/host-backend.md "cp.async".
*/
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

#include "racecheck.h"
#include "scheduler.h"

namespace hostcuda {

struct AsyncCopy {
    unsigned char* dst;
    unsigned char data[16];
    uint32_t bytes;
    uint32_t group;  // the issuing thread's group number
};

// The copies in flight of one GPU thread.
struct AsyncThreadCopies {
    std::vector<AsyncCopy> in_flight;
    uint32_t committed = 0;  // groups committed so far; the open group has this number
};

struct AsyncCopyState {
    std::vector<AsyncThreadCopies> threads = std::vector<AsyncThreadCopies>(kMaxThreadsPerBlock);
};

HOSTCUDA_UNINSTRUMENTED inline AsyncThreadCopies& async_copies_of_current_thread(const char* what) {
    Worker& w = current_worker(what);
    if (w.async_copies == nullptr) { w.async_copies = new AsyncCopyState(); }
    return w.async_copies->threads[tls.fiber->linear_tid];
}

inline void async_copies_release(Worker& w) {
    delete w.async_copies;
    w.async_copies = nullptr;
}

HOSTCUDA_UNINSTRUMENTED inline void async_copy_land(Worker& w, const AsyncCopy& c, int owner) {
    if (w.race != nullptr) { w.race->async_landed(c.dst, c.bytes, owner); }
    memcpy(c.dst, c.data, c.bytes);
}

// Lands the thread's copies of groups < `before_group`, in issue order.
HOSTCUDA_UNINSTRUMENTED inline void async_copy_land_groups(Worker& w, AsyncThreadCopies& t, uint32_t before_group,
                                                           int owner) {
    size_t kept = 0;
    for (size_t i = 0; i < t.in_flight.size(); i++) {
        if (t.in_flight[i].group < before_group) {
            async_copy_land(w, t.in_flight[i], owner);
        } else {
            t.in_flight[kept++] = t.in_flight[i];
        }
    }
    t.in_flight.resize(kept);
}

HOSTCUDA_UNINSTRUMENTED inline void async_copy_issue(void* dst, const void* src, uint32_t bytes, const char* name) {
    AsyncThreadCopies& t = async_copies_of_current_thread(name);
    Worker& w = *tls.worker;
    uintptr_t d = reinterpret_cast<uintptr_t>(dst), s = reinterpret_cast<uintptr_t>(src);
    if ((d | s) % bytes != 0) {
        die("kernel '%s': %s with a destination (%p) or source (%p) not aligned to %u bytes", w.kernel_name, name,
            dst, src, bytes);
    }
    if (w.race != nullptr) { w.race->async_issued(dst, bytes, __builtin_return_address(0)); }
    AsyncCopy c;
    c.dst = static_cast<unsigned char*>(dst);
    memcpy(c.data, src, bytes);
    c.bytes = bytes;
    c.group = t.committed;
    t.in_flight.push_back(c);
}

// cp.async.commit_group: the thread's copies since its last commit form the open group; this
// closes it (an empty group is allowed).
HOSTCUDA_UNINSTRUMENTED inline void async_copy_commit_group() {
    async_copies_of_current_thread("cp_async_commit_group").committed++;
}

// A wait (wait_group or wait_all) with copies in the open group dies, stricter than the PTX ISA:
// wait_group never waits for them, so a kernel that waits before committing reads copies that may
// not have landed; and wait_all's implicit commit is easy to lose when the code around it
// changes, so every kernel commits its copies explicitly.
// Copies are kept in issue order, so the open group's are at the back.
HOSTCUDA_UNINSTRUMENTED inline void async_copy_refuse_uncommitted(const AsyncThreadCopies& t, const char* wait) {
    if (!t.in_flight.empty() && t.in_flight.back().group == t.committed) {
        die("kernel '%s': thread %d reaches %s with cp.async copies it never committed (call "
            "cp_async_commit_group() after issuing them)", tls.worker->kernel_name, tls.fiber->linear_tid, wait);
    }
}

// cp.async.wait_group N: returns when all but the N most recent committed groups of this thread
// have completed. Nothing else completes a copy: not __syncthreads, not another thread's wait.
HOSTCUDA_UNINSTRUMENTED inline void async_copy_wait_group(uint32_t pending_groups_allowed) {
    AsyncThreadCopies& t = async_copies_of_current_thread("cp_async_wait_group");
    async_copy_refuse_uncommitted(t, "cp_async_wait_group");
    if (t.committed > pending_groups_allowed) {
        async_copy_land_groups(*tls.worker, t, t.committed - pending_groups_allowed, tls.fiber->linear_tid);
    }
}

// cp.async.wait_all = commit_group + wait_group 0.
HOSTCUDA_UNINSTRUMENTED inline void async_copy_wait_all() {
    AsyncThreadCopies& t = async_copies_of_current_thread("cp_async_wait_all");
    async_copy_refuse_uncommitted(t, "cp_async_wait_all");
    t.committed++;
    async_copy_land_groups(*tls.worker, t, t.committed, tls.fiber->linear_tid);
}

// A thread that exits with copies in flight: they complete (the hardware finishes them).
HOSTCUDA_UNINSTRUMENTED inline void async_copies_thread_exited(Worker& w, int linear_tid) {
    AsyncThreadCopies& t = w.async_copies->threads[linear_tid];
    if (!t.in_flight.empty()) { async_copy_land_groups(w, t, UINT32_MAX, linear_tid); }
    t.committed = 0;
}

}  // namespace hostcuda
