# attn.c: builds what this machine can, says what it skipped, `make test` runs every check it can.
#
# Every .cu file is built twice from the same source:
#   build/host-<precision>/NAME  with the host C++ compiler and the host backend (llmc/hostcuda.h): always
#   build/gpu-<precision>/NAME   with nvcc for the GPU_ARCHS: when nvcc is found (no GPU needed)
# and, on request (make test-racecheck, or make build/racecheck-<precision>/NAME), a third time:
#   build/racecheck-<precision>/NAME  the host build with shared-memory race checking (slow)
#   build/asan-<precision>/NAME       the host build under AddressSanitizer + UBSan (make test-asan)
# Trainers (train_*.cu) and their tests (test_*.cu) at the top level are also copied to ./NAME,
# from the GPU build when a GPU is present, else from the host build.
#
# Switches (make VAR=value):
#   PRECISION=BF16|FP32          type of parameters/activations (floatX); default BF16
#   GPU_ARCHS="80 86 89 90"      nvcc targets: machine code for each, PTX of the last (a fat binary);
#                                default: the first GPU's compute capability (nvidia-smi), 90 without one
#   GPU_COMPUTE_CAPABILITY=NN    the same for one target (the older switch)
#   USE_CUDNN=0|1                cuDNN attention (GPU only; needs the cudnn-frontend headers)
#   NO_MULTI_GPU=1               build without MPI and NCCL;  NO_USE_MPI=1: without MPI only
#   HAS_GPU=0|1                  override GPU detection (nvidia-smi)
#   HOST_GEMM=onednn|openblas|own  host GEMM (default: oneDNN where libdnnl-dev is installed, else OpenBLAS)
#   DEBUG_INFO=-g1|-g            debug information of host builds (default: line tables only)
#   HOST_MARCH=native|x86-64-v3  instruction set of host builds (default: this CPU's); another
#                                value builds in build/host-<precision>-<march> (the bench's --isa)
#   NVCC=path  HOST_CXX=g++      compilers

.DEFAULT_GOAL := all
SHELL := /bin/bash
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
# make test and test-all: one job more than the cores (the venv's download, and pytest, which
# waits on the trainers it starts, each hold a job slot with a core partly idle). The demo's
# output is not held back until it ends (--output-sync would: the trainer's lines, its ETA).
ifeq ($(MAKELEVEL),0)
  MAKEFLAGS += --jobs=$(if $(filter test test-all,$(MAKECMDGOALS)),$(shell echo $$(( $(JOBS) + 1 ))),$(JOBS))
  MAKEFLAGS += $(if $(filter demo,$(MAKECMDGOALS)),,--output-sync=target)
endif

PRECISION ?= BF16
# The card this machine has (the first GPU's compute capability, 8.6 -> 86); 90 where nvidia-smi
# does not answer with one.
GPU_DETECTED_ARCH := $(shell nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n 1 | tr -d ' .\r' | grep -E '^[0-9]+$$')
GPU_COMPUTE_CAPABILITY ?= $(or $(GPU_DETECTED_ARCH),90)
GPU_ARCHS ?= $(GPU_COMPUTE_CAPABILITY)
export GPU_ARCHS
USE_CUDNN ?= 0
NO_MULTI_GPU ?= 0
NO_USE_MPI ?= 0
HOST_CXX ?= g++
NVCC ?= $(shell command -v nvcc 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
HAS_GPU ?= $(shell nvidia-smi -L >/dev/null 2>&1 && echo 1 || echo 0)
PYTHON := .venv/bin/python
# Every Python the Makefile runs imports this checkout's attnref and study packages first (the venv
# may be shared by several checkouts, and its editable install names only one of them)
export PYTHONPATH := $(CURDIR)$(if $(PYTHONPATH),:$(PYTHONPATH))

ifeq ($(PRECISION),BF16)
  PRECISION_FLAGS := -DENABLE_BF16
else ifeq ($(PRECISION),FP32)
  PRECISION_FLAGS := -DENABLE_FP32
else
  $(error PRECISION must be BF16 or FP32, not '$(PRECISION)')
endif
precision := $(shell echo $(PRECISION) | tr A-Z a-z)
HOST_MARCH ?= native
MARCH_SUFFIX := $(if $(filter-out native,$(HOST_MARCH)),-$(HOST_MARCH))
HOST_DIR := build/host-$(precision)$(MARCH_SUFFIX)
# (cuDNN builds get a directory of their own, so that switching USE_CUDNN back and forth rebuilds neither)
GPU_DIR := build/gpu-$(precision)$(if $(filter 1,$(USE_CUDNN)),-cudnn)
GPU_ARCH_CHECK_DIR := build/gpu-$(precision)-arch-check

# what this machine cannot build, said at the end of the build
SKIPPED :=

# ---- compiler cache ----------------------------------------------------------------------
# ccache (Debian's `ccache`, in the full tier of scripts/apt-packages.txt) serves compiles it
# has seen, in any checkout: paths in the objects are relative (-fdebug-prefix-map, and
# CCACHE_BASEDIR for ccache's own hashing), so a fresh clone (CI) reuses the previous run's
# work. CCACHE= (empty) builds without it.
CCACHE ?= $(shell command -v ccache 2>/dev/null)
ifneq ($(CCACHE),)
  export CCACHE_BASEDIR := $(CURDIR)
  export CCACHE_NOHASHDIR := 1
endif

# ---- host backend build ------------------------------------------------------------------
# -O3: the vectoriser makes the host-backend kernels' inner loops several times faster.
# -fno-math-errno: sqrtf and friends become instructions the vectoriser can use (kernels never
# read errno, and the values are the same). -fno-trapping-math: a loop with a select between
# float results (x == x ? expf(x) : x) vectorises without AVX-512's masked instructions, i.e.
# also on AVX2 (nothing here reads floating-point exception flags).
# DEBUG_INFO=-g1: line tables (backtraces, addr2line of the race checker's reports, perf)
# at ~70% of the compile time of full -g (test_san: 42 s against 58 s); DEBUG_INFO=-g for gdb.
DEBUG_INFO ?= -g1
HOST_CXXFLAGS := -std=c++17 -O3 -march=$(HOST_MARCH) -fno-math-errno -fno-trapping-math $(DEBUG_INFO) -fdebug-prefix-map=$(CURDIR)=. -Wall -Wno-unknown-pragmas -I. -pthread -MMD -MP $(PRECISION_FLAGS)
HOST_LDFLAGS := -pthread

# The host GEMM (llmc/hostcuda/gemm.h): oneDNN where libdnnl-dev is installed (its kernels are
# chosen by the CPU's feature bits), else OpenBLAS where libopenblas-dev is (chosen by a table of
# CPU models that goes stale), else our own, which stays the tests' reference. HOST_GEMM=onednn
# also links OpenBLAS when it is there (HOSTCUDA_GEMM=openblas picks it at run time);
# HOST_GEMM=openblas builds without oneDNN, HOST_GEMM=own without either.
HOST_MULTIARCH := $(shell $(HOST_CXX) -dumpmachine 2>/dev/null)
HAVE_ONEDNN := $(if $(and $(wildcard /usr/lib/$(HOST_MULTIARCH)/libdnnl.so /usr/lib/libdnnl.so /usr/lib64/libdnnl.so),\
  $(wildcard /usr/include/dnnl.h /usr/include/oneapi/dnnl/dnnl.h)),1)
# (both OpenBLAS's library and a cblas.h header, as Debian's libopenblas-dev installs them)
HAVE_OPENBLAS := $(if $(and $(wildcard /usr/lib/$(HOST_MULTIARCH)/libopenblas.so /usr/lib/libopenblas.so /usr/lib64/libopenblas.so),\
  $(wildcard /usr/include/cblas.h /usr/include/$(HOST_MULTIARCH)/cblas.h /usr/include/openblas/cblas.h)),1)
HOST_GEMM ?= $(if $(HAVE_ONEDNN),onednn,$(if $(HAVE_OPENBLAS),openblas,own))
OPENBLAS_FLAGS := -DHOSTCUDA_OPENBLAS $(if $(wildcard /usr/include/openblas/cblas.h),-I/usr/include/openblas)
ifeq ($(HOST_GEMM),onednn)
  ifneq ($(HAVE_ONEDNN),1)
    $(error HOST_GEMM=onednn: libdnnl-dev is not installed)
  endif
  HOST_CXXFLAGS += -DHOSTCUDA_ONEDNN $(if $(HAVE_OPENBLAS),$(OPENBLAS_FLAGS))
  BLAS_LIBS := -ldnnl -lgomp $(if $(HAVE_OPENBLAS),-lopenblas)
else ifeq ($(HOST_GEMM),openblas)
  HOST_CXXFLAGS += $(OPENBLAS_FLAGS)
  BLAS_LIBS := -lopenblas
  SKIPPED += "oneDNN: host GEMM is OpenBLAS (apt-get install libdnnl-dev for kernels chosen by the CPU's features, or HOST_GEMM=openblas was given)"
else ifeq ($(HOST_GEMM),own)
  SKIPPED += "oneDNN/OpenBLAS: host GEMM is our own (apt-get install libdnnl-dev for the ~5x faster one, or HOST_GEMM=own was given)"
else
  $(error HOST_GEMM must be onednn, openblas or own, not '$(HOST_GEMM)')
endif
HOST_LDFLAGS += $(BLAS_LIBS)

# ---- race-checking host build ------------------------------------------------------------
# build/racecheck-<precision>/NAME: the host build with every load and store instrumented
# (-fsanitize=thread code, linked without ThreadSanitizer's runtime: llmc/hostcuda/racecheck.h
# implements the hooks and checks shared memory only). doc/host-backend.md has the details.
RACECHECK_DIR := build/racecheck-$(precision)$(MARCH_SUFFIX)
RACECHECK_CXXFLAGS := $(HOST_CXXFLAGS) -DHOSTCUDA_RACECHECK -fsanitize=thread --param tsan-instrument-func-entry-exit=0
# what `make test-racecheck` runs once more under a random thread order with race checking:
# the race checker's own test, the backend tests, the attention, norm, residual + norm and embedding tests, and every
# kernel playground (classifier; muon: the Newton-Schulz kernels).
# Not test_muon: its double-precision reference dominates and runs ~30x slower instrumented,
# while its kernels are the ones dev/cuda/muon.cu runs.
RACECHECK_SEED ?= 1
RACECHECKED_TESTS := test_racecheck test_backend test_attention test_norm_rope_swiglu test_residual_norm test_embedding
RACECHECK_PLAYGROUNDS = $(filter-out $(BENCHMARK_ONLY),$(PLAYGROUNDS))
RACECHECK_TEST_NAMES = $(RACECHECKED_TESTS) $(RACECHECK_PLAYGROUNDS)
# the small playgrounds at -O1: 37 instead of 54 s of CPU to build cold, their runs 1.6 s instead
# of 1.3 (the attention playgrounds stay at -O3: at -O1 they run twice as long instrumented)
RACECHECK_AT_O1 = $(filter-out attention_forward attention_backward taylor_attention,$(RACECHECK_PLAYGROUNDS))

# ---- AddressSanitizer + UndefinedBehaviorSanitizer host build ------------------------------
# build/asan-<precision>/NAME: the host build with -fsanitize=address,undefined, halting at the
# first report (the fibers tell ASan about their stack switches: llmc/hostcuda/fiber.h). -O1
# keeps the build cheap; the checks do not depend on the optimisation level.
ASAN_DIR := build/asan-$(precision)$(MARCH_SUFFIX)
ASAN_SANITIZERS := -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer
ASAN_CXXFLAGS = $(filter-out -O3,$(HOST_CXXFLAGS)) -O1 $(ASAN_SANITIZERS)
ASAN_OPTIONS_RUN := ASAN_OPTIONS=halt_on_error=1:detect_leaks=1:abort_on_error=0:strict_string_checks=1 \
  UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
# What `make test-asan` runs (BF16 only): a representative subset that fits the 10-minute
# budget of `make test` (~90 s of CPU to build, ~20 s to run; 2026-12-01, 2 cores under load):
# the reader fuzz and the data-side tests (every file reader: bad input comes from outside),
# the backend and tensor-core tests (fibers and their stack switches, shared memory, warp
# collectives, cp.async), and the attention and norm tests (the kernels with the most index
# arithmetic; the tensor-core attention's global loads). Left out: test_san and test_gpt2 (a
# whole trainer under ASan: test_san took 250 s of CPU instead of ~10), test_muon and test_gemm
# (double-precision references, slow instrumented), test_racecheck (its TSan hooks do not
# combine with ASan), and the dev/cuda playgrounds (their kernels are the ones the tests
# above launch, or simple elementwise ones).
ASAN_TEST_NAMES = test_fuzz_readers test_dataloader test_tokenizer test_evalset test_number_text test_backend test_mma \
  test_attention test_norm_rope_swiglu

# ---- GPU build ---------------------------------------------------------------------------
# Machine code for every arch of GPU_ARCHS and the PTX of the newest, which the driver compiles
# at start on a card newer than all of them (another GPU_ARCHS rebuilds: build-flags, below).
$(foreach a,$(GPU_ARCHS),$(if $(shell echo '$(a)' | grep -E '^[0-9]{2,3}a?$$'),,\
  $(error GPU_ARCHS: '$(a)' is not a compute capability like 80, 86, 90 or 90a (GPU_ARCHS="$(GPU_ARCHS)"))))
# An arch this nvcc cannot build is named here, not left to nvcc's own error (CUDA 13 dropped sm_70).
NVCC_GPU_CODES := $(if $(NVCC),$(patsubst sm_%,%,$(filter sm_%,$(shell $(NVCC) --list-gpu-code 2>/dev/null))))
$(foreach a,$(GPU_ARCHS),$(if $(NVCC_GPU_CODES),$(if $(filter $(patsubst %a,%,$(a)),$(NVCC_GPU_CODES)),,\
  $(error GPU_ARCHS: this nvcc ($(NVCC)) cannot build sm_$(a); it builds sm_$(subst $(eval) , sm_,$(strip $(NVCC_GPU_CODES))) (a V100, sm_70, needs CUDA 12: CUDA 13 has no sm_70)))))
GPU_ARCH_NEWEST := $(shell printf '%s\n' $(GPU_ARCHS) | sort -n | tail -n 1)
NVCC_ARCH_FLAGS := $(foreach a,$(GPU_ARCHS),--generate-code arch=compute_$(a),code=sm_$(a)) \
  --generate-code arch=compute_$(GPU_ARCH_NEWEST),code=compute_$(GPU_ARCH_NEWEST)
# nvcc's -O is the host code's; the device code's is cicc's and ptxas's own (optimised unless told).
# Without a GPU, make test and test-all build with nvcc only to prove the code compiles, never to
# run it: host code at -O0 (the fat binary is the -O3 build's byte for byte) and device code
# unoptimised, for less than half the CPU (test_san.cu: 80 -> 45 -> 23 s, test_gpt2.cu 30 -> 20 s;
# 2026-12-07). A user's `make gpu` and make test on a GPU machine build optimised (the flags stamp
# rebuilds between).
NVCC_HOST_OPT ?= -O3
NVCC_DEVICE_OPT ?=
NO_GPU_CHECK_BUILD := $(if $(filter 1,$(HAS_GPU)),,NVCC_HOST_OPT=-O0 NVCC_DEVICE_OPT='-Xcicc -O0 -Xptxas -O0')
NVCC_COMMON_FLAGS := -std=c++17 $(NVCC_HOST_OPT) $(NVCC_DEVICE_OPT) -I. -MMD -MP -lineinfo -Xcompiler -fdebug-prefix-map=$(CURDIR)=. $(PRECISION_FLAGS)
NVCC_FLAGS = $(NVCC_COMMON_FLAGS) $(NVCC_ARCH_FLAGS) -DLLMC_GPU_ARCHS='"$(GPU_ARCHS)"'  # (llmc/card_check.h names them)
NVCC_LDFLAGS := -lcublas -lcublasLt

ifeq ($(NVCC),)
  SKIPPED += "GPU binaries: nvcc not found (install the CUDA toolkit or set NVCC=)"
else
  CUDA_ROOT := $(abspath $(dir $(NVCC))/..)
  ifeq ($(USE_CUDNN),1)
    # the header-only cudnn-frontend: a copy carried to a GPU machine in build/cudnn-frontend,
    # the venv's (scripts/setup.sh installs it), or a system-wide one
    CUDNN_FRONTEND ?= $(patsubst %/,%,$(dir $(firstword $(wildcard build/cudnn-frontend/include/cudnn_frontend.h \
      .venv/lib/python3*/site-packages/include/cudnn_frontend.h /usr/local/include/cudnn_frontend.h \
      $(CUDA_ROOT)/include/cudnn_frontend.h))))
    ifeq ($(CUDNN_FRONTEND),)
      SKIPPED += "cuDNN attention: USE_CUDNN=1 but cudnn_frontend.h not found (run scripts/setup.sh or set CUDNN_FRONTEND=dir)"
    else
      NVCC_COMMON_FLAGS += -DENABLE_CUDNN -I$(CUDNN_FRONTEND)
      NVCC_LDFLAGS += -lcudnn -lnvrtc  # nvrtc: the frontend's runtime-compiled engines
    endif
  endif
  ifneq ($(NO_MULTI_GPU),1)
    ifneq ($(wildcard $(CUDA_ROOT)/include/nccl.h /usr/include/nccl.h /usr/local/include/nccl.h),)
      NVCC_COMMON_FLAGS += -DMULTI_GPU
      NVCC_LDFLAGS += -lnccl
    else
      SKIPPED += "NCCL: nccl.h not found (GPU binaries are single-GPU)"
    endif
  endif
endif

# MPI starts multi-process runs (and stands in for NCCL on the host backend)
ifneq ($(NO_MULTI_GPU),1)
ifneq ($(NO_USE_MPI),1)
  MPI_CFLAGS := $(shell mpicxx --showme:compile 2>/dev/null)
  MPI_LIBS := $(shell mpicxx --showme:link 2>/dev/null)
  ifneq ($(MPI_LIBS),)
    HOST_CXXFLAGS += -DUSE_MPI $(MPI_CFLAGS)
    HOST_LDFLAGS += $(MPI_LIBS)
    NVCC_COMMON_FLAGS += -DUSE_MPI $(filter -I%,$(MPI_CFLAGS))
    NVCC_LDFLAGS += $(filter -L% -l%,$(MPI_LIBS))
  else
    SKIPPED += "MPI: mpicxx not found (no multi-process runs; apt-get install libopenmpi-dev)"
  endif
endif
endif

# ---- what to build -----------------------------------------------------------------------
CU_SOURCES := $(wildcard dev/test/test_*.cu dev/cuda/*.cu train_*.cu test_*.cu)
CPP_TESTS := $(wildcard dev/test/test_*.cpp)
TOP_LEVEL := $(basename $(wildcard train_*.cu test_*.cu))
TRAINERS := $(basename $(wildcard train_*.cu))
# the trainers with a test_X.cu beside them, and those tests (one compile for both: below)
TESTED_TRAINERS := $(filter $(patsubst test_%,train_%,$(basename $(wildcard test_*.cu))),$(TRAINERS))
TRAINER_TESTS := $(patsubst train_%,test_%,$(TESTED_TRAINERS))

HOST_BINS := $(addprefix $(HOST_DIR)/,$(notdir $(basename $(CU_SOURCES) $(CPP_TESTS))))
GPU_BINS := $(if $(NVCC),$(addprefix $(GPU_DIR)/,$(notdir $(basename $(CU_SOURCES)))))
# what `make test` runs: the test binaries and the dev/cuda playground files (which validate
# every kernel version); not the trainers and not benchmark-only programs
BENCHMARK_ONLY := backend_overhead gemm_peak
# multi-rank tests: on the host, run as MPI_TEST_RANKS ranks under scripts/mpirun.sh (skipped
# when mpirun or MPI is missing); on a GPU, as one rank (NCCL with one GPU)
MPI_TEST_NAMES := test_comm test_data_parallel
MPI_TEST_RANKS ?= 2
HAS_MPIRUN := $(if $(and $(MPI_LIBS),$(shell command -v mpirun 2>/dev/null)),1,0)
TEST_NAMES := $(filter-out train_% $(BENCHMARK_ONLY) $(MPI_TEST_NAMES),$(notdir $(basename $(CU_SOURCES) $(CPP_TESTS))))
GPU_TEST_NAMES := $(filter-out train_% $(BENCHMARK_ONLY),$(notdir $(basename $(CU_SOURCES))))
BEST_DIR := $(if $(and $(NVCC),$(filter 1,$(HAS_GPU))),$(GPU_DIR),$(HOST_DIR))

.PHONY: all host gpu gpu-arch-check skipped test test-all checks test-host host-test-binaries test-mpi test-racecheck test-asan \
  test-gpu test-python gpu-build test-all-gpu-builds mutation-check setup setup-system setup-venv setup-demo clean \
  report demo ready-to-check build-trainers-bf16 build-trainers-fp32 debug-states check-host-bf16 \
  check-host-fp32 check-python-1 check-python-2 check-gpu-bf16 check-gpu-fp32 help
all: report
host: $(HOST_BINS)
gpu: $(GPU_BINS)

skipped:
	@for s in $(SKIPPED); do echo "make: skipped: $$s"; done
report: host gpu $(TOP_LEVEL) skipped
	@echo "make: built host-backend binaries in $(HOST_DIR)$(if $(NVCC),; GPU binaries (sm $(GPU_ARCHS) + PTX $(GPU_ARCH_NEWEST)) in $(GPU_DIR))$(if $(TOP_LEVEL),; ./$(TOP_LEVEL) from $(BEST_DIR))"

vpath %.cu dev/test dev/cuda .
vpath %.cpp dev/test

# The commit every binary reports in its logs and checkpoints (llmc/train/run_record.h): a
# one-line object linked into each, rewritten only when the commit or the tree's state
# (+dirty: uncommitted changes to tracked files) changes, so that only then do binaries relink.
BUILD_COMMIT := $(shell c=$$(git rev-parse --short=12 HEAD 2>/dev/null) && { git diff --quiet HEAD -- 2>/dev/null && echo $$c || echo $$c+dirty; } || echo unknown)
BUILD_COMMIT_OBJ := build/build_commit.o
# The generated files are written under a name of their own shell's (PID), then replace the target
# only when their text changed: make test runs several makes at once (one per variant), and a
# shared temporary name let one rename the other's file away. (shell: $$t is the new file)
REPLACE_IF_CHANGED = if cmp -s $$t $@; then rm $$t; else mv $$t $@; fi
$(BUILD_COMMIT_OBJ): FORCE
	@mkdir -p $(dir $@)
	@t=$@.$$$$; printf 'const char* attn_build_commit = "%s";\n' '$(BUILD_COMMIT)' > $$t.c; \
	if [ -f $@ ] && cmp -s $$t.c $(@:.o=.c); then rm $$t.c; \
	else $(HOST_CXX) -x c -c $$t.c -o $$t.o && mv $$t.c $(@:.o=.c) && mv $$t.o $@; fi
.PHONY: FORCE
FORCE:

# The presets, recipes and default rates (presets/*.conf and presets/{gpt2,recipes,rates}/*.conf) compiled into the trainers
# (llmc/train/preset_files.h): each file's text as a raw string literal. Written on every make and
# replaced only when a file was added, removed or changed, so that only then do binaries rebuild
# (the .d files name it for the binaries that include it).
PRESET_FILES := $(sort $(wildcard presets/*.conf presets/gpt2/*.conf presets/recipes/*.conf presets/rates/*.conf))
PRESET_INC := build/generated/preset_files.inc
$(PRESET_INC): FORCE
	@mkdir -p $(dir $@)
	@t=$@.$$$$; for f in $(PRESET_FILES); do \
	  if grep -q ')conf"' $$f; then echo "$$f: contains )conf\" (the end of the string it is compiled in as)" >&2; rm -f $$t; exit 1; fi; \
	  printf '{"%s", R"conf(' $$f; cat $$f; printf ')conf"},\n'; \
	done > $$t && $(REPLACE_IF_CHANGED)

# Every build folder records what its binaries are built with, in DIR/build-flags: the compiler
# and its version, the flags, and so the libraries this machine has (MPI, oneDNN, OpenBLAS, NCCL,
# cuDNN), the -march and the GPU_ARCHS. Each binary depends on its folder's stamp, which is
# rewritten only when that text changes: a `make demo` before set-up installed MPI, another
# GPU_ARCHS, or a removed library rebuilds exactly the binaries built without it.
HOST_CXX_VERSION = $(shell $(HOST_CXX) -dumpfullversion 2>/dev/null)
NVCC_VERSION = $(shell $(NVCC) --version 2>/dev/null | tail -n 1)
BUILD_STAMP = @t=$@.$$$$; printf '%s\n' '$(STAMP_TEXT)' > $$t && $(REPLACE_IF_CHANGED)
$(HOST_DIR)/build-flags: STAMP_TEXT = $(HOST_CXX) $(HOST_CXX_VERSION): $(HOST_CXXFLAGS) / link: $(HOST_LDFLAGS)
$(RACECHECK_DIR)/build-flags: STAMP_TEXT = $(HOST_CXX) $(HOST_CXX_VERSION): $(RACECHECK_CXXFLAGS) / -O1: $(RACECHECK_AT_O1) / link: $(HOST_LDFLAGS)
$(ASAN_DIR)/build-flags: STAMP_TEXT = $(HOST_CXX) $(HOST_CXX_VERSION): $(ASAN_CXXFLAGS) / link: $(HOST_LDFLAGS)
$(GPU_DIR)/build-flags: STAMP_TEXT = $(NVCC) $(NVCC_VERSION): $(NVCC_FLAGS) / link: $(NVCC_LDFLAGS)
$(GPU_ARCH_CHECK_DIR)/build-flags: STAMP_TEXT = $(NVCC) $(NVCC_VERSION): $(NVCC_COMMON_FLAGS)
$(addsuffix /build-flags,$(HOST_DIR) $(RACECHECK_DIR) $(ASAN_DIR) $(GPU_DIR) $(GPU_ARCH_CHECK_DIR)): FORCE
	@mkdir -p $(@D)
	$(BUILD_STAMP)

# Every binary is compiled to NAME.o and linked in a second step, so that a compiler cache
# can serve the compile (CCACHE, below); -MT names the binary in the .d file, not the object.
# (racecheck: a one-step -fsanitize=thread link would also pull in ThreadSanitizer's runtime)
$(HOST_DIR)/%: %.cu $(BUILD_COMMIT_OBJ) $(HOST_DIR)/build-flags | $(PRESET_INC)
	$(CCACHE) $(HOST_CXX) $(HOST_CXXFLAGS) -MT $@ -x c++ -c $< -o $@.o
	$(HOST_CXX) $@.o $(BUILD_COMMIT_OBJ) -o $@ $(HOST_LDFLAGS) && rm -f $@.o
$(HOST_DIR)/%: %.cpp $(BUILD_COMMIT_OBJ) $(HOST_DIR)/build-flags | $(PRESET_INC)
	$(CCACHE) $(HOST_CXX) $(HOST_CXXFLAGS) -MT $@ -c $< -o $@.o
	$(HOST_CXX) $@.o $(BUILD_COMMIT_OBJ) -o $@ $(HOST_LDFLAGS) && rm -f $@.o
$(RACECHECK_DIR)/%: %.cu $(BUILD_COMMIT_OBJ) $(RACECHECK_DIR)/build-flags | $(PRESET_INC)
	$(CCACHE) $(HOST_CXX) $(RACECHECK_CXXFLAGS) $(if $(filter $(notdir $@),$(RACECHECK_AT_O1)),-O1) -MT $@ -x c++ -c $< -o $@.o
	$(HOST_CXX) $@.o $(BUILD_COMMIT_OBJ) -o $@ $(HOST_LDFLAGS) && rm -f $@.o
$(ASAN_DIR)/%: %.cu $(BUILD_COMMIT_OBJ) $(ASAN_DIR)/build-flags | $(PRESET_INC)
	$(CCACHE) $(HOST_CXX) $(ASAN_CXXFLAGS) -MT $@ -x c++ -c $< -o $@.o
	$(HOST_CXX) $@.o $(BUILD_COMMIT_OBJ) -o $@ $(HOST_LDFLAGS) $(ASAN_SANITIZERS) && rm -f $@.o
$(ASAN_DIR)/%: %.cpp $(BUILD_COMMIT_OBJ) $(ASAN_DIR)/build-flags | $(PRESET_INC)
	$(CCACHE) $(HOST_CXX) $(ASAN_CXXFLAGS) -MT $@ -c $< -o $@.o
	$(HOST_CXX) $@.o $(BUILD_COMMIT_OBJ) -o $@ $(HOST_LDFLAGS) $(ASAN_SANITIZERS) && rm -f $@.o
$(GPU_DIR)/%: %.cu $(BUILD_COMMIT_OBJ) $(GPU_DIR)/build-flags | $(PRESET_INC)
	$(CCACHE) $(NVCC) $(NVCC_FLAGS) -MT $@ -c $< -o $@.o
	$(NVCC) $@.o $(BUILD_COMMIT_OBJ) -o $@ $(NVCC_LDFLAGS) && rm -f $@.o

# A trainer and its test from one compile: test_X.cu includes train_X.cu whole, its entry point
# as train_X_main, so ./train_X is linked from test_X's object with the two mains swapped. The
# trainers are the costliest compiles there are (train_san: ~1 min of CPU on the host, more
# with nvcc), and the binary the tests check is then the one that trains.
OBJCOPY ?= objcopy
SWAP_MAINS = $(OBJCOPY) --redefine-sym main=test_$*_main --redefine-sym train_$*_main=main $< $@.o
$(HOST_DIR)/%.o: %.cu $(HOST_DIR)/build-flags | $(PRESET_INC)
	$(CCACHE) $(HOST_CXX) $(HOST_CXXFLAGS) -MT $@ -x c++ -c $< -o $@
$(GPU_DIR)/%.o: %.cu $(GPU_DIR)/build-flags | $(PRESET_INC)
	$(CCACHE) $(NVCC) $(NVCC_FLAGS) -MT $@ -c $< -o $@
.SECONDARY: $(foreach d,$(HOST_DIR) $(GPU_DIR),$(addprefix $(d)/,$(addsuffix .o,$(TRAINER_TESTS))))
$(addprefix $(HOST_DIR)/,$(TRAINER_TESTS)): $(HOST_DIR)/%: $(HOST_DIR)/%.o $(BUILD_COMMIT_OBJ)
	$(HOST_CXX) $< $(BUILD_COMMIT_OBJ) -o $@ $(HOST_LDFLAGS)
$(addprefix $(HOST_DIR)/,$(TESTED_TRAINERS)): $(HOST_DIR)/train_%: $(HOST_DIR)/test_%.o $(BUILD_COMMIT_OBJ)
	$(SWAP_MAINS)
	$(HOST_CXX) $@.o $(BUILD_COMMIT_OBJ) -o $@ $(HOST_LDFLAGS) && rm -f $@.o
$(addprefix $(GPU_DIR)/,$(TRAINER_TESTS)): $(GPU_DIR)/%: $(GPU_DIR)/%.o $(BUILD_COMMIT_OBJ)
	$(NVCC) $< $(BUILD_COMMIT_OBJ) -o $@ $(NVCC_LDFLAGS)
$(addprefix $(GPU_DIR)/,$(TESTED_TRAINERS)): $(GPU_DIR)/train_%: $(GPU_DIR)/test_%.o $(BUILD_COMMIT_OBJ)
	$(SWAP_MAINS)
	$(NVCC) $@.o $(BUILD_COMMIT_OBJ) -o $@ $(NVCC_LDFLAGS) && rm -f $@.o
# The trainers' device code for sm_80 and sm_90 where GPU_ARCHS lacks them (make test-all; make
# test on a GPU machine), so that a construct one of them does not have (an sm_90-only
# instruction, an sm_80 resource limit) cannot slip in: -cubin runs the front end and ptxas but no
# host compile, ~17 s of CPU a trainer and arch (train_san, 2-core EPYC, 2026-12-05). Not in make
# test without a GPU, whose nvcc build is for sm_90: no code path differs between sm_80 and sm_90
# today (the kernels test __CUDA_ARCH__ >= 700 / 800 only), and its ~35 s of CPU cold is make
# test's budget. (-c: ccache takes an nvcc call without it for a link and never caches it.)
GPU_ARCH_CHECKS := $(if $(NVCC),$(foreach a,$(filter-out $(GPU_ARCHS),80 90),\
  $(foreach t,$(TRAINERS),$(GPU_ARCH_CHECK_DIR)/$(t)-sm$(a).cubin)))
define GPU_ARCH_CHECK_RULE
$(GPU_ARCH_CHECK_DIR)/$(1)-sm$(2).cubin: $(1).cu $(GPU_ARCH_CHECK_DIR)/build-flags
	$$(CCACHE) $$(NVCC) $$(NVCC_COMMON_FLAGS) -MT $$@ -c -arch=sm_$(2) -cubin $$< -o $$@
endef
$(foreach a,80 90,$(foreach t,$(TRAINERS),$(eval $(call GPU_ARCH_CHECK_RULE,$(t),$(a)))))
gpu-arch-check: $(GPU_ARCH_CHECKS)
$(TOP_LEVEL): %: $(BEST_DIR)/%
	cp $< $@

-include $(wildcard $(HOST_DIR)/*.d $(GPU_DIR)/*.d $(RACECHECK_DIR)/*.d $(ASAN_DIR)/*.d $(GPU_ARCH_CHECK_DIR)/*.d)

# ---- tests -------------------------------------------------------------------------------
# `make test`: set up what is missing (Debian packages, venv), then every check this machine
# can run, in both precisions. Exits non-zero if anything failed.
# Three makes, each on all the job slots. The Debian packages first, in this make: the builds
# detect what they install, so the rest runs in makes that read the Makefile again. Then what
# the checks share (ready-to-check: the venv's download beside the trainers' compiles, then the
# debug states); then every check side by side: pytest as two processes, the host tests of
# both precisions, the race checker, ASan, the mutants, the nvcc builds (one after another, a
# core idled through the download and through most of pytest). Each check is a make of its own
# (its PRECISION) and no two of them build the same file.
# Without a GPU the nvcc builds only prove that the code compiles for the GPU: the trainers and
# their tests (whose objects hold every kernel the trainers launch; host and device code), and
# the trainers' device code for sm_80 and sm_90 (gpu-arch-check). `make test-all` adds what
# compiles the same kernels again without a GPU to run them: the kernel tests and playgrounds
# built with nvcc, and the trainers' tests in FP32 with nvcc. With a GPU, make test builds
# and runs everything in both precisions.
# Budget: a first make test within 12 minutes on 2 cores, venv and Debian packages included,
# within 6 with ccache warm (doc/bench-runs/2026-12-07-fresh-machine.md has the measured phases).
CHECKS := check-python-1 check-python-2 check-host-bf16 check-host-fp32 test-racecheck test-asan mutation-check \
  $(if $(NVCC),gpu-build) $(if $(filter 1,$(HAS_GPU)),check-gpu-bf16 check-gpu-fp32)
test: setup-system
	@$(MAKE) --no-print-directory ready-to-check
	@$(MAKE) --no-print-directory checks
	@$(MAKE) --no-print-directory $(TOP_LEVEL) skipped
	@echo "make test: all checks passed$(if $(filter 1,$(HAS_GPU)),, (no GPU here: GPU tests run in scripts/gpu_check.sh))"
test-all: setup-system
	@$(MAKE) --no-print-directory ready-to-check
	@$(MAKE) --no-print-directory checks test-all-gpu-builds TEST_ALL=1
	@$(MAKE) --no-print-directory report
	@echo "make test-all: all checks passed"
checks: $(CHECKS)
# What the checks share, made first: the venv, the trainers of both precisions (pytest runs
# them) and the debug states (both test-host runs read them). Then no check waits on another:
# make (4.3) starts a target whose prerequisites finished while other jobs ran only once those
# jobs end, so pytest, the longest check, started last.
ready-to-check: setup-venv build-trainers-bf16 build-trainers-fp32 debug-states

build-trainers-bf16 build-trainers-fp32: build-trainers-%:
	@$(MAKE) --no-print-directory $(addprefix build/host-$*$(MARCH_SUFFIX)/,$(TRAINERS)) PRECISION=$(call upper,$*)
debug-states: setup-venv
	@$(MAKE) --no-print-directory $(DEBUG_STATES) $(DEBUG_STATES_GPT2)
check-host-bf16 check-host-fp32: check-host-%:
	@$(MAKE) --no-print-directory test-host PRECISION=$(call upper,$*)
# (pytest as two processes taking the test files from one queue, dev/pytest_queue.py: whichever is
# free takes the next, so both end together however the compiles beside them load the cores; one
# process left a core idle once the compiles were done. A queue of its own for each make.)
PYTEST_QUEUE := build/pytest-queue/$(shell date +%s%N)
check-python-1 check-python-2: check-python-%:
	@mkdir -p $(dir $(PYTEST_QUEUE)) && $(MAKE) --no-print-directory test-python PYTEST_ARGS=--queue=$(PYTEST_QUEUE)
check-gpu-bf16 check-gpu-fp32: check-gpu-%: $(if $(NVCC),gpu-build)
	@$(MAKE) --no-print-directory test-gpu PRECISION=$(call upper,$*)
upper = $(shell echo $(1) | tr a-z A-Z)

gpu-build:
ifeq ($(HAS_GPU),1)
	$(MAKE) --no-print-directory gpu gpu-arch-check PRECISION=BF16
	$(MAKE) --no-print-directory gpu PRECISION=FP32
else
	$(MAKE) --no-print-directory $(addprefix build/gpu-bf16/,$(TRAINERS) $(TRAINER_TESTS)) $(if $(filter 1,$(TEST_ALL)),gpu-arch-check) \
	  PRECISION=BF16 $(NO_GPU_CHECK_BUILD)
endif
test-all-gpu-builds: $(if $(NVCC),gpu-build)
ifneq ($(NVCC),)
	$(MAKE) --no-print-directory gpu PRECISION=BF16 $(NO_GPU_CHECK_BUILD)
	$(MAKE) --no-print-directory $(addprefix build/gpu-fp32/,$(TRAINER_TESTS)) PRECISION=FP32 $(NO_GPU_CHECK_BUILD)
endif

setup-system:
	@SKIP_VENV=1 bash scripts/setup.sh
setup-venv:
	@SKIP_APT=1 bash scripts/setup.sh
setup:
	@bash scripts/setup.sh
setup-demo:
	@bash scripts/setup.sh --tier demo

# The main job (README): set up what it needs (the demo tier: no PyTorch), build what the demo runs (./train_san: the GPU build where
# there is a GPU, else the host build; not every binary), and run it (scripts/demo.sh).
# (train_san by a second make: the first one read the Makefile before set-up, which may have
# installed what the build detects, e.g. OpenBLAS)
demo: setup-demo
	@$(MAKE) --no-print-directory train_san
	@bash scripts/demo.sh $(ARGS)

# debug states of the PyTorch reference that test_san compares the trainer against
# (the references are train_*.py over the attnref package, shard and tokenizer formats included)
ATTNREF := $(wildcard attnref/*.py)
DEBUG_STATES := build/debug-states/.complete
$(DEBUG_STATES): train_san.py $(ATTNREF) dev/test/make_debug_states.py
	$(PYTHON) dev/test/make_debug_states.py $(dir $@)
	@touch $@

# and those of train_gpt2.py that test_gpt2 compares the GPT-2 trainer against
DEBUG_STATES_GPT2 := build/debug-states-gpt2/.complete
$(DEBUG_STATES_GPT2): train_gpt2.py $(ATTNREF) dev/test/make_gpt2_debug_states.py
	$(PYTHON) dev/test/make_gpt2_debug_states.py $(dir $@)
	@touch $@

# What test-host leaves out (TEST_HOST_OMITS). In FP32: the data-side C++ tests (dev/test/*.cpp
# do not depend on PRECISION); the dev/cuda playgrounds (every llmc kernel they validate runs in
# FP32 inside test_san, test_gpt2 and the kernel tests; ~60 s of CPU to build in FP32); the
# kernel tests that do not use floatX (PRECISION_FREE: their FP32 object is the BF16 one, byte
# for byte; dev/test/test_build_config.py checks it; test_comm is not: its no-GPU message names
# the host build of its precision). Unless TEST_ALL=1 (make test-all): what make test runs under
# the race checker (test-racecheck, BF16: the same validations, instrumented at the same -O3,
# under a random thread order), not twice: the playgrounds, and in BF16 the kernel tests of
# RACECHECKED_TESTS (~45 s of CPU to build cold; their FP32 builds run plain, and ASan runs
# test_backend, test_attention and test_norm_rope_swiglu once more). `make host` builds all.
PRECISION_FREE := test_backend test_backend_misuse test_gemm test_mma test_racecheck
PLAYGROUNDS := $(notdir $(basename $(wildcard dev/cuda/*.cu)))
TEST_HOST_OMITS := $(if $(filter FP32,$(PRECISION)),$(notdir $(basename $(CPP_TESTS))) $(PLAYGROUNDS) $(PRECISION_FREE)) \
  $(if $(filter 1,$(TEST_ALL)),,$(PLAYGROUNDS) $(if $(filter BF16,$(PRECISION)),$(RACECHECKED_TESTS)))
HOST_TEST_BINS := $(filter-out $(addprefix $(HOST_DIR)/,$(TEST_HOST_OMITS)),$(HOST_BINS))
host-test-binaries: $(HOST_TEST_BINS)
test-host: $(HOST_TEST_BINS) $(DEBUG_STATES) $(DEBUG_STATES_GPT2)
	@bash scripts/run_tests.sh $(HOST_DIR) $(filter-out $(TEST_HOST_OMITS),$(TEST_NAMES))
	@$(MAKE) --no-print-directory test-mpi

# test_comm ~1 s, test_data_parallel ~2 s, for 2 ranks on 2 cores
HOST_MPI_TESTS = $(filter-out $(TEST_HOST_OMITS),$(MPI_TEST_NAMES))
test-mpi: $(addprefix $(HOST_DIR)/,$(HOST_MPI_TESTS))
ifeq ($(HAS_MPIRUN),1)
	@TEST_WRAPPER="scripts/mpirun.sh -np $(MPI_TEST_RANKS)" bash scripts/run_tests.sh $(HOST_DIR) $(HOST_MPI_TESTS)
else
	@echo "make: skipped: multi-rank tests ($(MPI_TEST_NAMES)): $(if $(MPI_LIBS),mpirun not found,built without MPI) (apt-get install openmpi-bin libopenmpi-dev)"
endif

test-gpu: gpu $(DEBUG_STATES) $(DEBUG_STATES_GPT2)
	@bash scripts/run_tests.sh $(GPU_DIR) $(GPU_TEST_NAMES)

# The kernels once more, instrumented, under a random thread order (HOSTCUDA_SCHEDULE): any
# shared-memory race or out-of-bounds access fails the run; results must not change.
test-racecheck: $(addprefix $(RACECHECK_DIR)/,$(RACECHECK_TEST_NAMES))
	@HOSTCUDA_SCHEDULE=random:$(RACECHECK_SEED) bash scripts/run_tests.sh $(RACECHECK_DIR) $(RACECHECK_TEST_NAMES)

# The host tests once more under AddressSanitizer + UBSan: any out-of-bounds access, use after
# free, leak or undefined behaviour fails the run.
test-asan: $(addprefix $(ASAN_DIR)/,$(ASAN_TEST_NAMES))
	@$(ASAN_OPTIONS_RUN) bash scripts/run_tests.sh $(ASAN_DIR) $(ASAN_TEST_NAMES)

# (the Python tests also run the trainer binary end to end: CLI errors, exact resume)
# (and the fp32 builds of both trainers, for the comparisons that need fp32 agreement: the
# eval-set scoring against the reference takes train_gpt2 from beside train_san)
test-python: setup $(if $(wildcard train_san.cu),$(HOST_DIR)/train_san $(HOST_DIR)/train_gpt2)
	$(if $(wildcard train_san.cu),@$(MAKE) --no-print-directory $(addprefix build/host-fp32$(MARCH_SUFFIX)/,train_san train_gpt2) PRECISION=FP32)
	HAS_MPIRUN=$(HAS_MPIRUN) TRAIN_SAN_BIN=$(HOST_DIR)/train_san TRAIN_GPT2_BIN=$(HOST_DIR)/train_gpt2 TRAIN_SAN_FP32_BIN=build/host-fp32$(MARCH_SUFFIX)/train_san $(PYTHON) -m pytest $(PYTEST_ARGS)

# The backend tests must FAIL against a deliberately broken backend. (-O1: the mutants only have
# to fail, and compile in ~60% of the time)
mutation-check:
	@MPI_LINK="$(MPI_LIBS)" BLAS_LINK="$(BLAS_LIBS)" bash scripts/mutation_check.sh \
	  "$(CCACHE) $(HOST_CXX) $(filter-out -O3,$(HOST_CXXFLAGS)) -O1" build/mutants

# scripts read lists from here, e.g. `make -s print-GPU_TEST_NAMES`
print-%:
	@echo $($*)

# `make help`: the targets a person runs, one line each (the lines below that start with `#>`;
# dev/test/test_make_help.py checks that each is a target and that every other .PHONY target is
# named on the `#-` line, the ones the Makefile uses for itself)
help:
	@echo "make TARGET [VAR=value ...]   (switches: the top of the Makefile, doc/build.md)"
	@sed -n 's/^#> /  /p' $(firstword $(MAKEFILE_LIST))
#> all (default)         build what this machine can: host backend always, nvcc builds where nvcc is; ./train_san ...
#> demo                  the main job: set up, build ./train_san, train a small SAN on the offline data (ARGS="...")
#> test                  every check this machine can run (doc/testing.md)
#> test-all              make test, plus the builds a machine without a GPU compiles to no new effect
#> train_san train_gpt2  one trainer, copied to ./ (the GPU build where there is a GPU)
#> host gpu              every host-backend binary / every nvcc binary (build/{host,gpu}-<precision>/)
#> test-host             the host-backend C++ tests of PRECISION (then test-mpi)
#> test-mpi              the multi-rank tests under scripts/mpirun.sh
#> test-python           the Python tests (pytest), the trainers end to end among them
#> test-racecheck        the kernel tests under the shared-memory race checker
#> test-asan             the host tests under AddressSanitizer and UBSan
#> test-gpu              the tests on the GPU
#> gpu-build             the nvcc builds make test checks (every binary on a GPU machine)
#> gpu-arch-check        the nvcc binaries hold machine code for each of GPU_ARCHS
#> mutation-check        the backend tests fail against deliberately broken backends
#> setup setup-demo      the Debian packages and the Python venv (the demo tier: no PyTorch)
#> print-VAR             a Makefile variable's value (make -s print-TEST_NAMES)
#> clean                 remove build/ and the ./ copies
#> help                  this list
#- checks ready-to-check build-trainers-bf16 build-trainers-fp32 debug-states check-host-bf16 check-host-fp32
#- check-python-1 check-python-2 check-gpu-bf16 check-gpu-fp32 skipped report setup-system setup-venv
#- host-test-binaries test-all-gpu-builds FORCE

clean:
	rm -rf build $(TOP_LEVEL)
