/*
Host backend: the GPU whose limits the host backend reports, so that code which chooses its
kernels by the device (compute capability, opt-in shared memory per block) runs its choices on
the CPU too. HOSTCUDA_DEVICE=sm_75|sm_80|sm_86|sm_89|sm_90|sm_100|sm_120 names one; unset,
the host backend is an sm_90 (the limits it has always reported). What follows from it:
cudaGetDeviceProperties and cudaDeviceGetAttribute report its compute capability and shared
memory; cudaFuncSetAttribute refuses a dynamic shared-memory limit above its opt-in maximum
(as the driver does); a bf16 mma.sync stops the run below sm_80 (on the GPU its kernel
traps: llmc/kernels/mma.cuh). Nothing else changes: the kernels run as they always do.

Shared memory per block (opt-in) and per multiprocessor, in bytes, from the CUDA C++
Programming Guide's table of compute capabilities: sm_75 64 KiB / 64 KiB; sm_80 163 / 164 KiB;
sm_86, sm_89, sm_120 99 / 100 KiB; sm_90, sm_100 227 / 228 KiB.
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

constexpr EmulatedDevice kEmulatedDevices[] = {
    {"sm_75", 7, 5, 64 * 1024, 64 * 1024},   {"sm_80", 8, 0, 163 * 1024, 164 * 1024},
    {"sm_86", 8, 6, 99 * 1024, 100 * 1024},  {"sm_89", 8, 9, 99 * 1024, 100 * 1024},
    {"sm_90", 9, 0, 227 * 1024, 228 * 1024}, {"sm_100", 10, 0, 227 * 1024, 228 * 1024},
    {"sm_120", 12, 0, 99 * 1024, 100 * 1024},
};
constexpr int kDefaultEmulatedDevice = 4;  // sm_90

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

// An sm_80 instruction (bf16 mma.sync) on an emulated older device: stop, as the GPU's kernel
// would (it traps).
inline void require_sm80(const char* kernel_name, const char* instruction) {
    const EmulatedDevice& d = emulated_device();
    if (d.arch() < 80) {
        die("kernel '%s': %s needs sm_80 or newer; the emulated device is %s (HOSTCUDA_DEVICE)", kernel_name,
            instruction, d.name);
    }
}

}  // namespace hostcuda
