/*
The start-up card check: before the first kernel launch (LAUNCH calls card_check_once()), ask the
driver which of the binary's images runs on the card (cudaFuncGetAttributes of an empty kernel);
stop with one line naming the card, the build's archs and the `make GPU_ARCHS=<cc>` to run when
none does, keep the arch the running code was compiled for (card_code_arch()), and warn once at a
bf16 trainer's start when the card or the code is older than sm_80. The host backend answers as
the driver would (llmc/hostcuda/emulated_device.h), so all of this runs in the host tests. The
cases and why we warn rather than refuse: doc/build.md "Which cards a build runs on".
*/
#pragma once

#include <cstdio>
#include <string>

#include "utils.h"  // fatal

// The GPU_ARCHS this binary was built for (the Makefile passes them to nvcc); on the host backend
// those HOSTCUDA_GPU_ARCHS pretends, "" when it pretends code for every card.
inline std::string card_build_archs() {
#if HOST_BACKEND
    const char* archs = hostcuda::emulated_build_archs();
    return archs == nullptr ? "" : archs;
#elif defined(LLMC_GPU_ARCHS)
    return LLMC_GPU_ARCHS;
#else
    return "?";
#endif
}

struct CardFacts {
    std::string name;         // the card's, as cudaGetDeviceProperties gives it
    int device_arch = 0;      // 10 x major + minor
    int code_arch = 0;        // what the code that runs was compiled for; 0: no image runs
    std::string build_archs;  // card_build_archs()
};

// The rebuild a card needs. (Nothing here depends on the build's precision: the kernel tests that
// never touch floatX compile to one object for both, dev/test/test_build_config.py.)
inline std::string card_rebuild_command(const CardFacts& f) { return "make GPU_ARCHS=" + std::to_string(f.device_arch); }

// Why this build cannot run on the card ("" if it can): one line, with what to run.
inline std::string card_refusal(const CardFacts& f) {
    if (f.code_arch != 0) { return ""; }
    char line[1024];
    snprintf(line, sizeof(line),
             "this GPU build has code for GPU_ARCHS=\"%s\" only; the GPU is %s (sm_%d), which runs none of it (no "
             "kernel image for it): rebuild for it with `%s` (GPU_ARCHS=\"%s %d\" builds for both; with this "
             "build's PRECISION and USE_CUDNN where they are not the defaults)",
             f.build_archs.c_str(), f.name.c_str(), f.device_arch, card_rebuild_command(f).c_str(),
             f.build_archs.c_str(), f.device_arch);
    return line;
}

// What a bf16 run loses on this card or with this build's code for it ("" if nothing): the
// tensor cores (bf16 mma.sync) need sm_80 on both.
inline std::string card_warning(const CardFacts& f, bool bf16) {
    if (!bf16 || f.code_arch == 0) { return ""; }
    char line[1024];
    if (f.device_arch < 80) {
        snprintf(line, sizeof(line),
                 "the GPU is %s (sm_%d), older than sm_80: it has no bf16 tensor cores, so the attention runs its "
                 "scalar kernels and cuBLAS's bf16 GEMMs run without tensor cores (expect several times the step "
                 "time of an sm_80 card; doc/build.md)",
                 f.name.c_str(), f.device_arch);
    } else if (f.code_arch < 80) {
        snprintf(line, sizeof(line),
                 "this build's code for the GPU, %s (sm_%d), is compute_%d (GPU_ARCHS=\"%s\"), where the tensor-core "
                 "attention kernels are trap stubs: the scalar ones run, several times slower; `%s` builds them",
                 f.name.c_str(), f.device_arch, f.code_arch, f.build_archs.c_str(), card_rebuild_command(f).c_str());
    } else {
        return "";
    }
    return line;
}

__global__ void card_check_probe_kernel() {}

// The facts of the current device, read once (at the first launch or the first attention choice).
inline const CardFacts& card_facts() {
    static const CardFacts facts = [] {
        CardFacts f;
        int id = 0, major = 0, minor = 0;
        cudaCheck(cudaGetDevice(&id));
        cudaCheck(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, id));
        cudaCheck(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, id));
        cudaDeviceProp prop;
        cudaCheck(cudaGetDeviceProperties(&prop, id));
        f.name = prop.name;
        f.device_arch = 10 * major + minor;
        f.build_archs = card_build_archs();
        cudaFuncAttributes attributes;
        cudaError_t error = cudaFuncGetAttributes(&attributes, card_check_probe_kernel);
        if (error == cudaErrorNoKernelImageForDevice || error == cudaErrorInvalidDeviceFunction) {
            cudaGetLastError();  // (answered here: not a launch error for a later cudaCheckLaunch)
            f.code_arch = 0;
        } else {
            cudaCheck(error);
            f.code_arch = attributes.ptxVersion;
        }
        return f;
    }();
    return facts;
}

// The arch the running code was compiled for (the attention's choice of kernels): a build for
// sm_75 runs on an sm_90 through its PTX, where the tensor-core kernels are trap stubs, so the
// attention asks this arch, not the card's, whether it may take them.
inline int card_code_arch() { return card_facts().code_arch; }

// Stops a build that cannot run on this card (before the first launch: LAUNCH calls it), else
// the first kernel would die with "no kernel image is available".
inline void card_check_once() {
    static const bool checked = [] {
        std::string refusal = card_refusal(card_facts());
        if (!refusal.empty()) { fatal("%s", refusal.c_str()); }
        return true;
    }();
    (void)checked;
}

// The trainers' start (a bf16 run's speed is theirs to warn about): what a bf16 run loses on this
// card or with this build's code for it (older than sm_80: no tensor cores), once on stderr.
inline void card_warn_once(bool bf16) {
    static const bool warned = [bf16] {
        card_check_once();
        std::string warning = card_warning(card_facts(), bf16);
        if (!warning.empty()) {
            fflush(stdout);
            fprintf(stderr, "warning: %s\n", warning.c_str());
        }
        return true;
    }();
    (void)warned;
}
