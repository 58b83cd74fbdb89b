/*
Host backend: fibers, i.e. stacks with a saved stack pointer that one OS thread switches
between cooperatively. A GPU thread that waits at __syncthreads or in a warp collective
is a fiber that switched away; the scheduler (scheduler.h) switches back when it may go on.

x86-64 uses a hand-written switch: it saves the callee-saved registers (System V ABI),
MXCSR and the x87 control word on the old stack, stores the stack pointer, loads the
new one and restores the same set. About ten instructions, no system call, so a switch
costs a few nanoseconds (dev/cuda/backend_overhead.cu measures it). Other
architectures fall back to ucontext, which is correct but slower.

Stacks come from mmap with a PROT_NONE guard page below them, so a kernel that
overflows its stack crashes at once instead of corrupting a neighbour.
*/
#pragma once

#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <sys/mman.h>
#include <unistd.h>

#if !defined(__x86_64__)
#include <ucontext.h>
#endif

namespace hostcuda {

struct FiberStack {
    char* base = nullptr;  // lowest mapped address (the guard page)
    size_t size = 0;       // whole mapping, guard included

    void allocate(size_t usable_bytes) {
        size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
        size = (usable_bytes + page - 1) / page * page + page;
        void* mem = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (mem == MAP_FAILED) {
            fprintf(stderr, "host backend: cannot map a fiber stack of %zu bytes\n", size);
            abort();
        }
        base = static_cast<char*>(mem);
        mprotect(base, page, PROT_NONE);
    }
    void release() {
        if (base != nullptr) { munmap(base, size); }
        base = nullptr;
    }
    char* top() const { return base + size; }
};

#if defined(__x86_64__)

// switch_context(&from_sp, to_sp): save the current context on its stack, store the stack
// pointer in *from_sp, resume the context whose stack pointer is to_sp.
extern "C" void hostcuda_switch_context(void** from_sp, void* to_sp);
__asm__(
    ".text\n"
    ".globl hostcuda_switch_context\n"
    ".weak hostcuda_switch_context\n"
    ".type hostcuda_switch_context,@function\n"
    "hostcuda_switch_context:\n"
    "    pushq %rbp\n"
    "    pushq %rbx\n"
    "    pushq %r12\n"
    "    pushq %r13\n"
    "    pushq %r14\n"
    "    pushq %r15\n"
    "    subq $8, %rsp\n"
    "    stmxcsr (%rsp)\n"
    "    fnstcw 4(%rsp)\n"
    "    movq %rsp, (%rdi)\n"
    "    movq %rsi, %rsp\n"
    "    ldmxcsr (%rsp)\n"
    "    fldcw 4(%rsp)\n"
    "    addq $8, %rsp\n"
    "    popq %r15\n"
    "    popq %r14\n"
    "    popq %r13\n"
    "    popq %r12\n"
    "    popq %rbx\n"
    "    popq %rbp\n"
    "    ret\n"
    ".size hostcuda_switch_context, .-hostcuda_switch_context\n");

// A saved execution context. `entry` runs on the fiber's stack the first time it is
// resumed and must never return (it switches away for the last time instead).
struct Context {
    void* sp = nullptr;

    void prepare(const FiberStack& stack, void (*entry)()) {
        uintptr_t top = reinterpret_cast<uintptr_t>(stack.top()) & ~static_cast<uintptr_t>(15);
        void** frame = reinterpret_cast<void**>(top);
        *--frame = nullptr;                              // fake return address of entry()
        *--frame = reinterpret_cast<void*>(entry);      // popped by `ret`
        for (int i = 0; i < 6; i++) { *--frame = nullptr; }  // rbp rbx r12 r13 r14 r15
        --frame;                                         // MXCSR and x87 control word
        unsigned int mxcsr;
        unsigned short fpucw;
        __asm__ volatile("stmxcsr %0" : "=m"(mxcsr));
        __asm__ volatile("fnstcw %0" : "=m"(fpucw));
        reinterpret_cast<unsigned int*>(frame)[0] = mxcsr;
        reinterpret_cast<unsigned short*>(frame)[2] = fpucw;
        sp = frame;
    }
};
inline void switch_context(Context& from, Context& to) { hostcuda_switch_context(&from.sp, to.sp); }

#else  // portable fallback

struct Context {
    ucontext_t uc;
    void prepare(const FiberStack& stack, void (*entry)()) {
        getcontext(&uc);
        uc.uc_stack.ss_sp = stack.base;
        uc.uc_stack.ss_size = stack.size;
        uc.uc_link = nullptr;
        makecontext(&uc, entry, 0);
    }
};
inline void switch_context(Context& from, Context& to) { swapcontext(&from.uc, &to.uc); }

#endif

}  // namespace hostcuda
