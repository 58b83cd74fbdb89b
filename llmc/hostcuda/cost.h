/*
Host backend: what each kernel launch costs a GPU, counted while it runs on the CPU, for the
roofline model of a training step (dev/cost_model.py). On with HOSTCUDA_COST=FILE; at exit FILE
gets one line per kernel name: launches, tensor-core and FMA FLOPs (mma.sync and GEMMs: the
scalar kernels' own arithmetic is not seen), bytes read and written (the launch's footprint in
device memory, in 4 KiB pages: each page's first read or write faults once, as the allocations
are protected around the launch). Launches run as always; only the counting is added. What is
counted and how the model uses it: doc/gpu-runs/cost-model.md "What is counted, per kernel launch".
*/
#pragma once

#include <signal.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace hostcuda {

constexpr size_t kCostPage = 4096;

class CostRecorder {
public:
    // The recorder, when HOSTCUDA_COST names a file (else nullptr: nothing is counted).
    static CostRecorder* instance() {
        static CostRecorder* recorder = [] {
            const char* path = getenv("HOSTCUDA_COST");
            return path != nullptr && path[0] != '\0' ? new CostRecorder(path) : nullptr;
        }();
        return recorder;
    }

    // allocations (page-aligned and padded to whole pages in this mode: runtime.h) and frees
    void add_allocation(void* p, size_t bytes) {
        std::lock_guard<std::mutex> lock(mutex_);
        size_t pages = (bytes + kCostPage - 1) / kCostPage;
        regions_[reinterpret_cast<uintptr_t>(p)] = Region{reinterpret_cast<uintptr_t>(p), pages, nullptr};
    }
    void remove_allocation(void* p) {
        std::lock_guard<std::mutex> lock(mutex_);
        regions_.erase(reinterpret_cast<uintptr_t>(p));
    }

    // Around one launch (or host-side elementwise pass): protect (PROT_NONE) every device
    // allocation, run, count, unprotect. Each page's first read or write faults once (a page
    // read, then written, counts as both), so a byte counts once per launch however often the
    // kernel touches it, rounded up to pages; the cost is a few faults per page touched.
    template <typename Run>
    void measure(const char* name, Run run) {
        std::lock_guard<std::mutex> lock(mutex_);
        active_.clear();
        for (auto& [start, r] : regions_) {
            r.state = std::make_unique<std::atomic<uint8_t>[]>(r.pages);
            for (size_t i = 0; i < r.pages; i++) { r.state[i].store(0, std::memory_order_relaxed); }
            active_.push_back(&r);
            mprotect(reinterpret_cast<void*>(r.start), r.pages * kCostPage, PROT_NONE);
        }
        tensor_flops_.store(0);
        current().store(this);
        run();
        current().store(nullptr);
        uint64_t read = 0, written = 0;
        for (Region* r : active_) {
            mprotect(reinterpret_cast<void*>(r->start), r->pages * kCostPage, PROT_READ | PROT_WRITE);
            for (size_t i = 0; i < r->pages; i++) {
                uint8_t s = r->state[i].load(std::memory_order_relaxed);
                read += (s & 1) ? kCostPage : 0;
                written += (s & 2) ? kCostPage : 0;
            }
            r->state.reset();
        }
        active_.clear();
        add_locked(name, tensor_flops_.load(), 0, read, written);
    }

    // Work counted by formula, outside any launch: a GEMM's 2 M N K (tensor FLOPs in bf16, as
    // cuBLAS's tensor cores on a GPU; FMA FLOPs in fp32) and its operands' sizes (A and B read, C
    // written, and read when beta != 0); cudaMemset's and cudaMemcpy's sizes (host <-> device
    // copies under their own names).
    void add(const char* name, uint64_t tensor_flops, uint64_t fma_flops, uint64_t read, uint64_t written) {
        std::lock_guard<std::mutex> lock(mutex_);
        add_locked(name, tensor_flops, fma_flops, read, written);
    }

    struct Totals {
        uint64_t launches = 0, tensor_flops = 0, fma_flops = 0, read = 0, written = 0;
    };
    // What was counted so far under `name` (the tests read it; the file is written at exit).
    Totals totals_of(const std::string& name) {
        std::lock_guard<std::mutex> lock(mutex_);
        auto it = totals_.find(name);
        return it == totals_.end() ? Totals{} : it->second;
    }

    // An emulated mma.sync inside a measured launch: 2 x 16 x 8 x 16 per m16n8k16 (mma.h).
    static void count_tensor_flops(uint64_t flops) {
        if (CostRecorder* r = current().load(std::memory_order_relaxed)) { r->tensor_flops_.fetch_add(flops, std::memory_order_relaxed); }
    }

private:
    struct Region {
        uintptr_t start;
        size_t pages;
        std::unique_ptr<std::atomic<uint8_t>[]> state;  // per page: 1 read, 2 written (during a launch)
    };
    explicit CostRecorder(const char* path) : path_(path) {
#if !defined(__x86_64__)
        fprintf(stderr, "HOSTCUDA_COST: the cost counts read x86-64 page faults; this is another processor\n");
        exit(EXIT_FAILURE);
#endif
        struct sigaction sa = {};
        sa.sa_sigaction = on_fault;
        sa.sa_flags = SA_SIGINFO;
        sigemptyset(&sa.sa_mask);
        sigaction(SIGSEGV, &sa, nullptr);
        atexit([] { instance()->write(); });
    }

    static std::atomic<CostRecorder*>& current() {
        static std::atomic<CostRecorder*> c{nullptr};
        return c;
    }

    void add_locked(const char* name, uint64_t tensor_flops, uint64_t fma_flops, uint64_t read, uint64_t written) {
        Totals& t = totals_[name];
        t.launches++;
        t.tensor_flops += tensor_flops;
        t.fma_flops += fma_flops;
        t.read += read;
        t.written += written;
    }

    // A fault on a protected page during a launch: note it, open the page for what was asked
    // (reading, or reading and writing), and let the access run again. Any other fault: the
    // default action (a crash, as without the recorder).
    static void on_fault(int sig, siginfo_t* info, void* context) {
        CostRecorder* r = current().load();
        uintptr_t a = reinterpret_cast<uintptr_t>(info->si_addr);
        if (r != nullptr) {
            for (Region* region : r->active_) {  // (a few hundred regions: a scan is cheap beside the fault)
                if (a < region->start || a >= region->start + region->pages * kCostPage) { continue; }
                size_t page = (a - region->start) / kCostPage;
#if defined(__x86_64__)
                bool write = (static_cast<ucontext_t*>(context)->uc_mcontext.gregs[REG_ERR] & 2) != 0;
#else
                bool write = true;
#endif
                region->state[page].fetch_or(write ? 2 : 1, std::memory_order_relaxed);
                mprotect(reinterpret_cast<void*>(region->start + page * kCostPage), kCostPage,
                         write ? PROT_READ | PROT_WRITE : PROT_READ);
                return;
            }
        }
        signal(sig, SIG_DFL);  // (the access faults again, now fatally)
    }

    // FILE, one tab-separated line per kernel name:
    //     name  launches  tensor_flops  fma_flops  bytes_read  bytes_written
    void write() {
        std::string tmp = path_ + ".tmp";
        FILE* f = fopen(tmp.c_str(), "w");
        if (f == nullptr) {
            fprintf(stderr, "HOSTCUDA_COST=%s: cannot write %s\n", path_.c_str(), tmp.c_str());
            return;
        }
        for (const auto& [name, t] : totals_) {
            fprintf(f, "%s\t%llu\t%llu\t%llu\t%llu\t%llu\n", name.c_str(), (unsigned long long)t.launches,
                    (unsigned long long)t.tensor_flops, (unsigned long long)t.fma_flops, (unsigned long long)t.read,
                    (unsigned long long)t.written);
        }
        if (fclose(f) != 0 || rename(tmp.c_str(), path_.c_str()) != 0) {
            fprintf(stderr, "HOSTCUDA_COST=%s: cannot write it\n", path_.c_str());
        }
    }

    std::string path_;
    std::mutex mutex_;
    std::map<uintptr_t, Region> regions_;
    std::vector<Region*> active_;
    std::atomic<uint64_t> tensor_flops_{0};
    std::map<std::string, Totals> totals_;
};

}  // namespace hostcuda
