/*
Host backend: the GPU whose limits the host backend reports, so that code which chooses its
kernels by the device (compute capability, opt-in shared memory per block) runs its choices on
the CPU too. HOSTCUDA_DEVICE=sm_75|...|sm_120 names one (unset: sm_90); the device properties and
attributes report it, cudaFuncSetAttribute refuses shared memory above its opt-in maximum and a
bf16 mma.sync stops the run below sm_80, as on the card. HOSTCUDA_GPU_ARCHS="80 90" pretends a GPU
build for those archs, so cudaFuncGetAttributes answers as the driver would (select_image).
Nothing else changes: the kernels run as they always do. doc/host-backend.md ("Which GPU it
pretends to be") and doc/build.md ("Which cards a build runs on") have the rest.
*/
#pragma once

#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "scheduler.h"  // die

namespace hostcuda {

struct EmulatedDevice {
    const char* name;  // as HOSTCUDA_DEVICE spells it
    int major, minor;
    size_t shared_per_block_optin;
    size_t shared_per_multiprocessor;
    int arch() const { return 10 * major + minor; }
};

// Shared memory per block (opt-in) and per multiprocessor, in bytes, from the CUDA C++
// Programming Guide's table of compute capabilities: sm_75 64 KiB / 64 KiB; sm_80 163 / 164 KiB;
// sm_86, sm_89, sm_120 99 / 100 KiB; sm_90, sm_100 227 / 228 KiB.
constexpr EmulatedDevice kEmulatedDevices[] = {
    {"sm_75", 7, 5, 64 * 1024, 64 * 1024},   {"sm_80", 8, 0, 163 * 1024, 164 * 1024},
    {"sm_86", 8, 6, 99 * 1024, 100 * 1024},  {"sm_89", 8, 9, 99 * 1024, 100 * 1024},
    {"sm_90", 9, 0, 227 * 1024, 228 * 1024}, {"sm_100", 10, 0, 227 * 1024, 228 * 1024},
    {"sm_120", 12, 0, 99 * 1024, 100 * 1024},
};
constexpr int kDefaultEmulatedDevice = 4;  // sm_90 (unset: the limits it has always reported)

// The device HOSTCUDA_DEVICE names (read once); an unknown name stops the run.
inline const EmulatedDevice& emulated_device() {
    static const EmulatedDevice* device = [] {
        const char* env = getenv("HOSTCUDA_DEVICE");
        if (env == nullptr || env[0] == '\0') { return &kEmulatedDevices[kDefaultEmulatedDevice]; }
        std::string known;
        for (const EmulatedDevice& d : kEmulatedDevices) {
            if (strcmp(env, d.name) == 0) { return &d; }
            known += known.empty() ? d.name : std::string(", ") + d.name;
        }
        die("HOSTCUDA_DEVICE='%s': expected one of %s (or unset: sm_90)", env, known.c_str());
    }();
    return *device;
}

// The image the driver runs on a card of compute capability `device` (10 x major + minor) from a
// build for `archs` ("80 90a": GPU_ARCHS' words), as the CUDA Programming Guide's compatibility
// rules say: machine code for sm_XY runs on X.Z for Z >= Y (sm_XYa on XY alone), preferred over
// PTX; the PTX (compute_ of the newest arch) is compiled at start for any card at least as new (a
// compute_XYa PTX for XY alone). Returns the arch the running code was compiled for (its
// __CUDA_ARCH__ / 10, cudaFuncAttributes::ptxVersion), 0 if nothing runs, -1 if `archs` is not a
// list of such words.
inline int select_image(int device, const char* archs) {
    int best_sass = 0, newest = 0;
    bool newest_specific = false, any = false;
    for (const char* p = archs; *p != '\0';) {
        if (*p == ' ') { p++; continue; }
        int arch = 0, digits = 0;
        for (; *p >= '0' && *p <= '9'; p++, digits++) { arch = 10 * arch + (*p - '0'); }
        bool specific = *p == 'a';
        if (specific) { p++; }
        if (digits < 2 || digits > 3 || (*p != ' ' && *p != '\0')) { return -1; }
        any = true;
        bool runs = specific ? arch == device : arch / 10 == device / 10 && arch <= device;
        if (runs && arch > best_sass) { best_sass = arch; }
        if (arch > newest || (arch == newest && !specific)) { newest = arch; newest_specific = specific; }
    }
    if (!any) { return -1; }
    if (best_sass > 0) { return best_sass; }
    bool ptx_runs = newest_specific ? newest == device : newest <= device;
    return ptx_runs ? newest : 0;
}

// HOSTCUDA_GPU_ARCHS (read once; nullptr: unset, code for every card, as the host backend runs
// every kernel); a bad value stops the run. Set ("80 90", the Makefile's GPU_ARCHS), the binary
// counts as a GPU build for those archs: machine code for each, PTX of the newest.
// cudaFuncGetAttributes then answers as the driver does (select_image): no kernel image for a card
// none of it runs on, else the arch of the code that runs (its ptxVersion), and a bf16 mma.sync in
// code below compute_80 stops the run as the GPU's trap stub would.
inline const char* emulated_build_archs() {
    static const char* archs = [] {
        const char* env = getenv("HOSTCUDA_GPU_ARCHS");
        if (env == nullptr || env[0] == '\0') { return (const char*)nullptr; }
        if (select_image(90, env) < 0) {
            die("HOSTCUDA_GPU_ARCHS='%s': expected compute capabilities like \"80 90\" or 90a (the Makefile's GPU_ARCHS)",
                env);
        }
        return env;
    }();
    return archs;
}

// The arch of the code that runs on the emulated card: its own unless HOSTCUDA_GPU_ARCHS says
// otherwise; 0 when none of that build runs on it.
inline int emulated_code_arch() {
    const char* archs = emulated_build_archs();
    return archs == nullptr ? emulated_device().arch() : select_image(emulated_device().arch(), archs);
}

// An sm_80 instruction (bf16 mma.sync) on an emulated older device, or in code built below
// compute_80: stop, as the GPU's kernel would (it traps).
inline void require_sm80(const char* kernel_name, const char* instruction) {
    const EmulatedDevice& d = emulated_device();
    if (d.arch() < 80) {
        die("kernel '%s': %s needs sm_80 or newer; the emulated device is %s (HOSTCUDA_DEVICE)", kernel_name,
            instruction, d.name);
    }
    if (emulated_code_arch() < 80) {
        die("kernel '%s': %s needs code built for sm_80 or newer; the emulated build's code for the %s is "
            "compute_%d (HOSTCUDA_GPU_ARCHS=%s), where the kernel is a trap stub", kernel_name, instruction, d.name,
            emulated_code_arch(), emulated_build_archs());
    }
}

}  // namespace hostcuda
