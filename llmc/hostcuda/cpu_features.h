/*
Host backend: the best vector instruction set this CPU and its OS offer, read from cpuid and
xgetbv (not from a table of model numbers, which goes stale: OpenBLAS 0.3.21 calls a 2024
Xeon "Prescott" and runs SSE3 kernels on it).

    best_cpu_isa()        CpuIsa::avx512_core_bf16 on a Zen 4/5 or Cooper Lake, ...
    cpu_isa_name(isa)     "avx512_core_bf16"

The levels are oneDNN's (each includes the ones before it), so the GEMM's choice can be checked
against the CPU's (dev/test/test_gemm.cu). x86-64 only; elsewhere best_cpu_isa() is `unknown`.
*/
#pragma once

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace hostcuda {

enum class CpuIsa { unknown, sse41, avx, avx2, avx512_core, avx512_core_vnni, avx512_core_bf16, avx512_core_amx };

inline const char* cpu_isa_name(CpuIsa isa) {
    switch (isa) {
        case CpuIsa::sse41: return "sse41";
        case CpuIsa::avx: return "avx";
        case CpuIsa::avx2: return "avx2";
        case CpuIsa::avx512_core: return "avx512_core";
        case CpuIsa::avx512_core_vnni: return "avx512_core_vnni";
        case CpuIsa::avx512_core_bf16: return "avx512_core_bf16";
        case CpuIsa::avx512_core_amx: return "avx512_core_amx";
        default: return "unknown";
    }
}

#if defined(__x86_64__) || defined(__i386__)
// AMX's tile data is off until a process asks Linux for it (as oneDNN does before using AMX)
inline bool os_grants_amx() {
#if defined(__linux__) && defined(SYS_arch_prctl)
    const long kReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
    return syscall(SYS_arch_prctl, kReqXcompPerm, kXfeatureXtiledata) == 0;
#else
    return false;
#endif
}

inline CpuIsa best_cpu_isa() {
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) { return CpuIsa::unknown; }
    bool sse41 = c & (1u << 19), avx = c & (1u << 28), fma = c & (1u << 12), osxsave = c & (1u << 27);
    if (!sse41) { return CpuIsa::unknown; }
    unsigned long long xcr0 = 0;
    if (osxsave) {
        unsigned lo, hi;
        __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
        xcr0 = ((unsigned long long)hi << 32) | lo;
    }
    bool os_avx = (xcr0 & 0x6) == 0x6, os_avx512 = (xcr0 & 0xe6) == 0xe6, os_amx = (xcr0 & 0x60000) == 0x60000;
    if (!avx || !os_avx) { return CpuIsa::sse41; }
    unsigned b7 = 0, c7 = 0, d7 = 0, a7_1 = 0;
    if (__get_cpuid_count(7, 0, &a, &b, &c, &d)) { b7 = b, c7 = c, d7 = d; }
    if (__get_cpuid_count(7, 1, &a, &b, &c, &d)) { a7_1 = a; }
    bool avx2 = (b7 & (1u << 5)) && fma;
    // avx512_core: F, DQ, BW and VL (Skylake-SP and later)
    bool avx512_core = os_avx512 && (b7 & (1u << 16)) && (b7 & (1u << 17)) && (b7 & (1u << 30)) && (b7 & (1u << 31));
    bool vnni = c7 & (1u << 11), bf16 = a7_1 & (1u << 5);
    bool amx = (d7 & (1u << 22)) && (d7 & (1u << 24)) && (d7 & (1u << 25)) && os_amx;
    if (!avx2) { return CpuIsa::avx; }
    if (!avx512_core) { return CpuIsa::avx2; }
    if (!vnni) { return CpuIsa::avx512_core; }
    if (!bf16) { return CpuIsa::avx512_core_vnni; }
    if (!amx || !os_grants_amx()) { return CpuIsa::avx512_core_bf16; }
    return CpuIsa::avx512_core_amx;
}
#else
inline CpuIsa best_cpu_isa() { return CpuIsa::unknown; }
#endif

}  // namespace hostcuda
