/*
Host backend: pinned memory under queued copies (HOSTCUDA_QUEUED_COPIES=1, or
hostcuda::queued_copies_check(true) before the pinned buffers are allocated).

On a GPU a cudaMemcpyAsync between device memory and pinned host memory (cudaMallocHost) runs
when its stream gets there: until the host has waited past it (an event recorded after it, or
the whole stream or device), the host must not write the copy's pinned source nor read its
pinned destination. Here every copy runs at once, so a host that does so anyway reads and
writes the right values and the mistake shows only on a GPU. In this mode a queued copy's
pinned pages are protected until a wait covers the copy: a source read-only, a destination
not at all. The host's forbidden access then faults, and the backend dies naming the copy.

A wait covers the copies queued before the point it waits for: cudaEventSynchronize and a
successful cudaEventQuery those before the event's cudaEventRecord; cudaStreamSynchronize,
cudaDeviceSynchronize and a synchronous cudaMemcpy all (every stream is one queue here).
Pinned allocations get whole pages of their own in this mode. Not seen: kernels that read
pinned memory (mapped), and pageable host memory (a GPU copies it before the call returns).
Not with HOSTCUDA_COST (both protect pages). dev/test/test_backend_misuse.cu checks both kinds
of access and the waits that allow them; test_gpt2's loss_queue case runs the training loop's
micro-batches in this mode.
*/
#pragma once

#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <vector>

namespace hostcuda {

class QueuedCopies {
public:
    static constexpr uintptr_t kPage = 4096;

    static QueuedCopies& get() {
        static QueuedCopies* q = new QueuedCopies();  // never destroyed: frees at exit still find it
        return *q;
    }
    bool on() const { return on_; }
    void enable(bool on) {
        const char* cost = getenv("HOSTCUDA_COST");
        if (on && cost != nullptr && cost[0] != '\0') {
            fprintf(stderr, "host backend: HOSTCUDA_QUEUED_COPIES and HOSTCUDA_COST both protect pages; use one\n");
            exit(EXIT_FAILURE);
        }
        if (on && !handler_installed_) {
            struct sigaction sa = {};
            sa.sa_sigaction = on_fault;
            sa.sa_flags = SA_SIGINFO;
            sigemptyset(&sa.sa_mask);
            sigaction(SIGSEGV, &sa, &previous_);
            handler_installed_ = true;
        }
        on_ = on;
    }

    // Before the backend itself copies into or out of [p, p + bytes): its pages open.
    void open(const void* p, size_t bytes) {
        if (!on_ || bytes == 0) { return; }
        std::lock_guard<std::mutex> lock(mutex_);
        protect(first_page(p), end_page(p, bytes), PROT_READ | PROT_WRITE);
    }
    // After the copy has run: [p, p + bytes) (pinned) is its source or destination until a wait
    // covers it; `other` is the copy's other end, for the message.
    void queue(const char* call, const void* p, size_t bytes, bool destination) {
        if (!on_ || bytes == 0) { return; }
        std::lock_guard<std::mutex> lock(mutex_);
        pending_.push_back({first_page(p), end_page(p, bytes), reinterpret_cast<uintptr_t>(p), bytes, ++last_,
                            destination, call});
        apply(pending_.back().first, pending_.back().end);
    }
    // The position an event recorded now marks: the copies queued so far.
    long mark() const { return last_; }
    // A wait that covers the copies up to `upto` (mark()), or every copy (upto -1).
    void waited(long upto = -1) {
        if (!on_) { return; }
        std::lock_guard<std::mutex> lock(mutex_);
        release([&](const Entry& e) { return upto < 0 || e.seq <= upto; });
    }
    // cudaFreeHost: its copies go with it (a GPU would fault or corrupt; not checked here).
    void freed(const void* p, size_t bytes) {
        if (!on_ || bytes == 0) { return; }
        std::lock_guard<std::mutex> lock(mutex_);
        uintptr_t first = first_page(p), end = end_page(p, bytes);
        release([&](const Entry& e) { return e.first < end && e.end > first; });
        protect(first, end, PROT_READ | PROT_WRITE);
    }

private:
    struct Entry {
        uintptr_t first, end;  // pages [first, end)
        uintptr_t start;
        size_t bytes;
        long seq;
        bool destination;
        const char* call;
    };

    static uintptr_t first_page(const void* p) { return reinterpret_cast<uintptr_t>(p) / kPage * kPage; }
    static uintptr_t end_page(const void* p, size_t bytes) {
        return (reinterpret_cast<uintptr_t>(p) + bytes + kPage - 1) / kPage * kPage;
    }
    static void protect(uintptr_t first, uintptr_t end, int prot) {
        if (end > first) { mprotect(reinterpret_cast<void*>(first), end - first, prot); }
    }
    // Each page of [first, end) as strict as the copies still on it ask.
    void apply(uintptr_t first, uintptr_t end) {
        for (uintptr_t page = first; page < end; page += kPage) {
            int prot = PROT_READ | PROT_WRITE;
            for (const Entry& e : pending_) {
                if (page < e.first || page >= e.end) { continue; }
                prot = e.destination ? PROT_NONE : (prot == PROT_NONE ? PROT_NONE : PROT_READ);
            }
            protect(page, page + kPage, prot);
        }
    }
    template <typename Covered>
    void release(Covered covered) {
        std::vector<Entry> gone;
        std::vector<Entry> kept;
        for (const Entry& e : pending_) { (covered(e) ? gone : kept).push_back(e); }
        pending_.swap(kept);
        for (const Entry& e : gone) { apply(e.first, e.end); }
    }

    // A fault on a page a queued copy holds: the host touched it too early. Any other: the
    // handler there was before (the default: a crash).
    static void on_fault(int sig, siginfo_t* info, void* context) {
        QueuedCopies& q = get();
        uintptr_t a = reinterpret_cast<uintptr_t>(info->si_addr);
        for (const Entry& e : q.pending_) {
            if (a < e.first || a >= e.end) { continue; }
            fprintf(stderr,
                    "host backend (HOSTCUDA_QUEUED_COPIES): the host touched %p, in the pinned %s of a queued %s "
                    "(%zu bytes at %p, copy #%ld), before waiting for it (an event recorded after the copy, or "
                    "the stream); on a GPU the copy may not have run yet\n",
                    info->si_addr, e.destination ? "destination" : "source", e.call, e.bytes,
                    reinterpret_cast<void*>(e.start), e.seq);
            abort();
        }
        if (q.previous_.sa_flags & SA_SIGINFO && q.previous_.sa_sigaction != nullptr) {
            q.previous_.sa_sigaction(sig, info, context);
            return;
        }
        signal(sig, SIG_DFL);  // (the access faults again, now fatally)
    }

    bool on_ = false, handler_installed_ = false;
    long last_ = 0;
    std::vector<Entry> pending_;
    std::mutex mutex_;
    struct sigaction previous_ = {};

    QueuedCopies() {
        const char* env = getenv("HOSTCUDA_QUEUED_COPIES");
        if (env != nullptr && strcmp(env, "0") != 0 && strcmp(env, "") != 0) { enable(true); }
    }
};

// Turns the check on or off (tests; the environment's HOSTCUDA_QUEUED_COPIES sets it at start).
// Pinned memory allocated before it was on has no pages of its own: turn it on first.
inline void queued_copies_check(bool on) { QueuedCopies::get().enable(on); }

}  // namespace hostcuda
