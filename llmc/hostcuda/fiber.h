/*
Host backend: fibers, i.e. stacks with a saved stack pointer that one OS thread switches between
cooperatively. A GPU thread that waits at __syncthreads or in a warp collective is a fiber that
switched away; the scheduler (scheduler.h) switches back when it may go on. x86-64 switches in
about ten hand-written instructions (a few ns, no system call), other architectures with
ucontext; stacks have a guard page; under AddressSanitizer every switch is announced to it.
Why each of these, next to its code below; doc/host-backend.md ("How it executes a launch",
"AddressSanitizer and UBSan") has how launches use fibers and what ASan needed.
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

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/common_interface_defs.h>
#define HOSTCUDA_ASAN_FIBERS 1
#endif

namespace hostcuda {

// A stack from mmap with a PROT_NONE guard page below it, so that a kernel that overflows its
// stack crashes at once instead of corrupting a neighbour.
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
// pointer in *from_sp, resume the context whose stack pointer is to_sp. The context is the
// callee-saved registers of the System V ABI, MXCSR and the x87 control word: about ten
// instructions and no system call, so a switch costs a few nanoseconds
// (dev/cuda/backend_overhead.cu measures it).
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
    const void* stack_bottom = nullptr;  // for ASan: the stack this context runs on
    size_t stack_size = 0;

    void prepare(const FiberStack& stack, void (*entry)()) {
        stack_bottom = stack.base;
        stack_size = stack.size;
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
inline void raw_switch(Context& from, Context& to) { hostcuda_switch_context(&from.sp, to.sp); }

#else  // portable fallback: ucontext, correct but slower (a system call per switch)

struct Context {
    ucontext_t uc;
    const void* stack_bottom = nullptr;  // for ASan: the stack this context runs on
    size_t stack_size = 0;
    void prepare(const FiberStack& stack, void (*entry)()) {
        stack_bottom = stack.base;
        stack_size = stack.size;
        getcontext(&uc);
        uc.uc_stack.ss_sp = stack.base;
        uc.uc_stack.ss_size = stack.size;
        uc.uc_link = nullptr;
        makecontext(&uc, entry, 0);
    }
};
inline void raw_switch(Context& from, Context& to) { swapcontext(&from.uc, &to.uc); }

#endif

#if defined(HOSTCUDA_ASAN_FIBERS)
// ASan keeps its own idea of the current stack: told nothing, it takes a fiber's stack for a wild
// region of the OS thread's stack and reports false errors (or misses real ones) at exceptions
// and longjmp. So every switch is announced (__sanitizer_start_switch_fiber /
// __sanitizer_finish_switch_fiber), and a context learns its own stack bounds when it is first
// switched away from (the worker's scheduler runs on the OS thread's stack, whose bounds only
// ASan knows).
// The context that switched to the running one, whose stack bounds the switch's end records.
inline thread_local Context* asan_switched_from = nullptr;

// Called first thing on a stack that a switch (or a fiber's first start) has just entered.
inline void asan_switch_done(void* fake_stack) {
    Context* from = asan_switched_from;
    const void* bottom = nullptr;
    size_t size = 0;
    __sanitizer_finish_switch_fiber(fake_stack, &bottom, &size);
    if (from != nullptr) {
        from->stack_bottom = bottom;
        from->stack_size = size;
    }
}
#endif

// Saves the running context in `from` and resumes `to`; returns when something switches
// back to `from`. A fiber's first start enters its entry function instead, which must call
// fiber_started().
inline void switch_context(Context& from, Context& to) {
#if defined(HOSTCUDA_ASAN_FIBERS)
    void* fake_stack = nullptr;
    asan_switched_from = &from;
    __sanitizer_start_switch_fiber(&fake_stack, to.stack_bottom, to.stack_size);
    raw_switch(from, to);
    asan_switch_done(fake_stack);
#else
    raw_switch(from, to);
#endif
}

inline void fiber_started() {
#if defined(HOSTCUDA_ASAN_FIBERS)
    asan_switch_done(nullptr);
#endif
}

}  // namespace hostcuda
