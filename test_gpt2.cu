/*
test_gpt2.cu: checks the CUDA GPT-2 trainer (train_gpt2.cu, included with TESTING) against
debug states written by the PyTorch reference train_gpt2.py (doc/formats.md "GPT-2
checkpoints" and "Debug state"), on whichever executor built it (host backend in
`make test`, the GPU in gpu_check.sh):

  1. parameter count: the trainer's count, a count written out here from the
     architecture, and the reference's tensors agree;
  2. forward: logits and loss;
  3. backward: the gradient of every parameter tensor;
  4. training: 10 AdamW steps on the debug batch: the loss and grad norm before each step,
     the scheduled rates, and the final parameters;
  5. resume: 4 steps, save a checkpoint, 6 more; versus load + the same 6: bit-identical;
  6. llm.c compatibility: the llm.c model files (fp32 version 3, bf16 version 5) that
     train_gpt2.py wrote from the same initial parameters load (load_llmc) to exactly
     those parameters (bf16: rounded to bf16), and the fp32 file gives bit-identical logits;
  7. the training loop's loss queue: micro-batches that do not wait for their loss sums read
     them later, the same bit for bit (check_loss_queue).

Usage: test_gpt2 [DEBUG_STATE_DIR (default build/debug-states-gpt2)] [name-filter]
`make test` writes the debug states (dev/test/make_gpt2_debug_states.py) before running it.
TEST_VERBOSE=1 prints every measured error.

Tolerances: |got - ref| <= atol * max|ref of that tensor| + rtol * |ref|, set 3-10x above
the errors measured on the host backend (doc/gpt2.md lists them). The reference is
computed in fp64, so the fp32 figures are this trainer's own rounding error; bf16 keeps 8
mantissa bits in every activation and gradient, hence its looser figures. Final
parameters are compared per tensor in relative L2 norm and per element within a fraction
of the learning rate (Adam moves an element whose gradient is ~0 by up to ~lr per step on
rounding noise alone).
*/
#define TESTING
#include "train_gpt2.cu"

#include <dirent.h>
#include <unistd.h>

#include <algorithm>

#include "dev/test/debug_state.h"
#include "dev/test/testing.h"

#if defined(ENABLE_FP32)
// measured (host backend, 2 configs): logits 0.08 / loss 0.04 / grads 0.04 / grads L2 0.06 of
// these, trajectory 0.006, final L2 0.23 (matrices) and 0.02 (others), final per element 0.011 lr
constexpr Tolerances kTol = {
    .logits = {8e-7, 4e-6},
    .loss = {0, 5e-7},
    .grads = {4e-6, 2e-5},
    .traj_loss = {0, 5e-7},
    .traj_norm = {0, 6e-6},
    .grads_l2_matrix = 3e-6,
    .grads_l2_other = 4e-6,
    .final_l2_matrix = 3e-5,
    .final_l2_other = 3e-5,
    .final_lr_fraction = 0.06,
};
#else
// measured: logits 0.24 / loss 0.06 / grads 0.18 / grads L2 0.18 and 0.2 of these, traj loss
// 0.18, traj norm 0.2, final L2 0.23 and 0.26, final per element 3.6 lr (5.9 lr on the key
// bias, whose gradient is 0 in exact arithmetic: Adam moves it by rounding noise)
constexpr Tolerances kTol = {
    .logits = {1.5e-2, 1.5e-2},
    .loss = {0, 2e-4},
    .grads = {4.5e-2, 3e-2},
    .traj_loss = {0, 3e-3},
    .traj_norm = {0, 8e-2},
    .grads_l2_matrix = 4e-2,
    .grads_l2_other = 4e-2,
    .final_l2_matrix = 0.1,
    .final_l2_other = 0.4,
    .final_lr_fraction = 20.0,
};
#endif

// The parameter count written out from the architecture (not from parameter_spec).
static int64_t expected_parameter_count(const GPT2Config& c) {
    int64_t d = c.n_embd, padded_vocab = (c.vocab_size + 127) / 128 * 128;
    int64_t layer = 2 * d /*ln_1*/ + 3 * d * d + 3 * d /*c_attn*/ + d * d + d /*attn c_proj*/ + 2 * d /*ln_2*/ +
                    4 * d * d + 4 * d /*c_fc*/ + 4 * d * d + d /*mlp c_proj*/;
    return padded_vocab * d + (int64_t)c.seq_len * d + c.n_layer * layer + 2 * d /*ln_f*/;
}

static bool ends_with(const std::string& s, const std::string& suffix) {
    return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}


static void check_state(const std::string& path) {
    StateCheck how;
    how.expected_parameters = expected_parameter_count(read_config(TensorFileReader(path, TENSOR_FILE_DEBUG_STATE)));
    how.tolerances = [](const OptimizerConfig&) -> const Tolerances& { return kTol; };
    how.final_l2 = [](const ParamSpec& s, const float* got, const float* ref, const Tolerances& tol) {
        if (!ends_with(s.name, "attn.c_attn.bias")) { return false; }
        // the key bias has a zero gradient in exact arithmetic (a constant added to every
        // score of a row), so Adam moves it by rounding noise alone in both
        // implementations: per element only; the query and value biases in L2
        size_t d = s.numel() / 3;
        compare_l2("final." + s.name + "[q]", got, ref, d, tol.final_l2_other);
        compare_l2("final." + s.name + "[v]", got + 2 * d, ref + 2 * d, d, tol.final_l2_other);
        return true;
    };
    how.resume_file = "build/test_gpt2_resume_" + std::to_string(getpid()) + ".bin";
    check_state<GPT2>(path, how);
}

// llm.c model files of the state's initial parameters (written by train_gpt2.py --write-llmc)
static void check_llmc(const std::string& state_path, const std::string& llmc_prefix) {
    DebugCase<GPT2> dc(state_path);
    const GPT2Config& c = dc.cfg;
    for (const char* dtype : {"fp32", "bf16"}) {
        std::string path = llmc_prefix + "." + dtype + ".llmc";
        LlmcModel m = load_llmc(path, c.bos_id);
        CHECK(m.cfg.vocab_size == c.vocab_size && m.cfg.seq_len == c.seq_len && m.cfg.n_layer == c.n_layer &&
              m.cfg.n_embd == c.n_embd && m.cfg.n_head == c.n_head && m.cfg.bos_id == c.bos_id);
        CHECK_EQ(m.values.size(), dc.init.size());
        if (m.values.size() != dc.init.size()) { continue; }
        size_t mismatches = 0;
        for (size_t i = 0; i < dc.init.size(); i++) {
            float want = dc.init[i];
            if (strcmp(dtype, "bf16") == 0) { want = __bfloat162float(__float2bfloat16_rn(want)); }
            mismatches += memcmp(&m.values[i], &want, sizeof(float)) != 0;
        }
        if (compare_verbose() || mismatches) {
            printf("    llm.c %s file: %zu of %zu parameters differ from the debug state's\n", dtype, mismatches, dc.init.size());
        }
        CHECK_EQ(mismatches, (size_t)0);
    }
    // the fp32 file through the model: the same logits, bit for bit
    LlmcModel m = load_llmc(llmc_prefix + ".fp32.llmc", -1);
    CHECK_EQ(m.cfg.bos_id, 0);  // not in the file: the default for a non-GPT-2 vocabulary
    GPT2 from_state(c, dc.B, dc.T), from_llmc(c, dc.B, dc.T);
    from_state.set_parameters(dc.init);
    from_llmc.set_parameters(m.values);
    from_state.forward(dc.inputs.data(), dc.targets.data(), dc.B, dc.T, 0.0f);
    from_llmc.forward(dc.inputs.data(), dc.targets.data(), dc.B, dc.T, 0.0f);
    size_t n = (size_t)dc.B * dc.T * c.padded_vocab();
    std::vector<float> la = copy_from_device(from_state.logits, n), lb = copy_from_device(from_llmc.logits, n);
    CHECK(memcmp(la.data(), lb.data(), n * sizeof(float)) == 0);
}

// The training loop's loss queue (llmc/model/model.h begin_loss_queue, read_loss_queue; used by
// llmc/train/training.h): two micro-batches' forwards and backwards that do not wait for their
// loss sums, which are NaN until read (a loss taken before then is not finite: the trainer stops),
// then read once: the sums that forwards waiting for them give, bit for bit, in the forwards'
// order. The host backend runs every copy at once, so it cannot show a read that comes too early;
// it counts the host's waits instead: none for the stream inside the queue (each forward waits
// only for the event after the last forward's id copies, and the read for the last sums' copy),
// and it runs with HOSTCUDA_QUEUED_COPIES' check (llmc/hostcuda/queued_copies.h): the host dies
// if it rewrites the staging or reads the sums before the wait that covers their copies.
static void check_loss_queue(const std::string& state_path) {
#if HOST_BACKEND
    hostcuda::queued_copies_check(true);  // (before the model's pinned buffers are allocated)
#endif
    DebugCase<GPT2> dc(state_path);
    GPT2 model(dc.cfg, dc.B, dc.T);
    model.set_parameters(dc.init);
    const int n = dc.B * dc.T;
    std::vector<int> inputs2(dc.inputs.rbegin(), dc.inputs.rend()), targets2(dc.targets.rbegin(), dc.targets.rend());
    const int* inputs[2] = {dc.inputs.data(), inputs2.data()};
    const int* targets[2] = {dc.targets.data(), targets2.data()};
    LossStats want[2];
    for (int i = 0; i < 2; i++) { want[i] = model.forward(inputs[i], targets[i], dc.B, dc.T, 0.5f / n); }
    CHECK(want[0].ce_sum != want[1].ce_sum);  // two batches, two sums

#if HOST_BACKEND
    const long stream_waits = hostcuda::host_waits().stream, event_waits = hostcuda::host_waits().event;
#endif
    model.begin_loss_queue(2);
    LossStats queued[2];
    for (int i = 0; i < 2; i++) {
        queued[i] = model.forward(inputs[i], targets[i], dc.B, dc.T, 0.5f / n);
        model.backward();
        CHECK(std::isnan(queued[i].ce_sum) && queued[i].count == want[i].count);
    }
    std::vector<LossStats> got = model.read_loss_queue();
#if HOST_BACKEND
    CHECK_EQ(hostcuda::host_waits().stream - stream_waits, 0L);
    CHECK_EQ(hostcuda::host_waits().event - event_waits, 3L);  // 2 forwards' staging, 1 read
#endif
    CHECK_EQ(got.size(), (size_t)2);
    for (size_t i = 0; i < got.size() && i < 2; i++) {
        CHECK(memcmp(&got[i].ce_sum, &want[i].ce_sum, sizeof(double)) == 0);
        CHECK(got[i].lse_sq_sum == 0.0);  // GPT-2 asks for no lse^2 sum
    }
    // closed again: a forward waits for its own sums
    LossStats again = model.forward(inputs[1], targets[1], dc.B, dc.T, 0.0f);
    CHECK(memcmp(&again.ce_sum, &want[1].ce_sum, sizeof(double)) == 0);
#if HOST_BACKEND
    hostcuda::queued_copies_check(false);
#endif
}

int main(int argc, char** argv) {
    // bf16 states through the tensor-core attention on the host too (the trainer's default
    // there is the scalar kernels, which test_attention and test_san check)
    attention_tensor_cores() = true;
    std::string dir = argc > 1 ? argv[1] : "build/debug-states-gpt2";
    const char* filter = argc > 2 ? argv[2] : nullptr;
    std::vector<std::string> files = debug_state_files(dir, "dev/test/make_gpt2_debug_states.py");
    for (const std::string& f : files) {
        std::string name = f.substr(0, f.size() - 4);
        std::string path = dir + "/" + f;
        testing::register_case(name, [path] { check_state(path); });
        if (f == files.front()) { testing::register_case("loss_queue", [path] { check_loss_queue(path); }); }
        std::string llmc = dir + "/llmc/" + name;
        if (file_exists(llmc + ".fp32.llmc")) {
            testing::register_case(name + "_llmc", [path, llmc] { check_llmc(path, llmc); });
        }
    }
    return testing::run_all(argv[0], filter);
}
