/*
The training run shared by the trainers (train_san.cu, train_gpt2.cu): the options and
flags that are not about the model, and run_training(), which reads the data, trains with
gradient accumulation under the learning-rate schedule, validates (overall and per token
region when the shards have region sidecars), samples, logs and writes checkpoints that
resume exactly (model, optimizer, data position and sampling RNG; doc/formats.md "Resume
state").

A model type used with run_training provides:
    LossStats forward(inputs, targets, B, T, dloss_scale, std::vector<float>* row_losses)
    void backward();  void zero_grad();  float update(opt, lr_matrix, lr_other);
    int64_t steps_done();  save_checkpoint(path, opt, extra);
    std::vector<int> sample(prompt, n, temperature, rng);
    int64_t count_loss_targets(targets, n)   targets that enter the loss
    double loss_value(const LossStats&)      the training loss the statistics stand for
    double z_loss_coefficient()              0 for models without a z-loss
    const std::vector<int>& loss_targets()   the last forward's targets, < 0 where masked
    std::string first_nonfinite_tensor(); accumulate_in_fp32(); end_micro_batch();  (ModelParameters)
and optionally (SAN) the per-layer measurements logged at every validation:
    LayerMeasurements measure(inputs, B, T)
*/
#pragma once

#include <array>
#include <cerrno>
#include <sys/stat.h>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "cli.h"
#include "cuda_common.h"
#include "dataloader.h"
#include "optimizer.h"
#include "spectrum.h"
#include "tensor_file.h"
#include "tokenizer.h"
#include "utils.h"

struct TrainOptions {
    OptimizerConfig opt = [] {
        OptimizerConfig c;
        c.lr = -1.0;  // the model's default (OptimizerConfig::resolve_rates)
        return c;
    }();
    int lr_scale_gpus = 1;
    std::string train_data, val_data, tokenizer_path, log_path, checkpoint_dir, resume_path, init_from;
    int batch_size = 8, seq_len = 0;
    int grad_accum = 0;    // 0: global_batch / batch_size when a global batch is set, else 1
    int global_batch = 0;  // rows per optimizer step over all micro-batches (0: batch_size x grad_accum)
    int grad_fp32 = 0;     // accumulate gradients in fp32 (bf16 builds)
    long steps = 100;
    int val_every = 50, val_batches = 8, sample_every = 0, sample_tokens = 64, save_every = 0, log_every = 1;
    int milestones = 0;    // checkpoints at 0/25/50/75/100% of the steps
    int val_whole_docs = 0;  // validate on rows of whole documents (DataLoaderConfig::whole_documents)
    int spike_window = 128;
    double spike_z = 5.0;
    float temperature = 1.0f;
    uint64_t seed = 42;
    int shuffle = 1;
};

// The flags of TrainOptions, appended to a trainer's model flags.
inline void add_training_flags(std::vector<Flag>& flags, TrainOptions& o) {
    OptimizerConfig& p = o.opt;
    std::vector<Flag> more = {
        make_flag("--train-data", &o.train_data, "training shards (glob, comma-separated globs)"),
        make_flag("--val-data", &o.val_data, "validation shards (glob); empty: no validation"),
        make_flag("--tokenizer", &o.tokenizer_path, "tokenizer .bin to decode samples (and take V from)"),
        make_flag("--batch-size", &o.batch_size, "rows per micro-batch B"),
        make_flag("--seq-len", &o.seq_len, "tokens per row (0: the model's T)"),
        make_flag("--grad-accum", &o.grad_accum, "micro-batches per optimizer step (0: --global-batch / --batch-size, or 1)"),
        make_flag("--global-batch", &o.global_batch, "rows per optimizer step (0: batch-size x grad-accum)"),
        make_flag("--grad-fp32", &o.grad_fp32, "accumulate gradients in fp32 in bf16 builds 0|1"),
        make_flag("--steps", &o.steps, "optimizer steps"),
        make_flag("--optimizer", &p.optimizer, "adamw | muon (Muon on the matrices, AdamW without decay on the rest)"),
        make_flag("--lr", &p.lr, "peak rate of the matrix group (<0: the model's default for the optimizer)"),
        make_flag("--lr-other", &p.lr_other, "peak rate of embeddings/gains/gates/biases (<0: muon 3e-4, adamw same as --lr)"),
        make_flag("--lr-scale-gpus", &o.lr_scale_gpus, "scale the rates for N GPUs: AdamW rates x N, the Muon rate x sqrt(N)"),
        make_flag("--muon-order", &p.muon_order, "keller (momentum, then orthogonalise, shape factor) | paper (orthogonalise, then momentum)"),
        make_flag("--muon-momentum", &p.muon_momentum, "Muon momentum"),
        make_flag("--ns-steps", &p.ns_steps, "Newton-Schulz steps"),
        make_flag("--ns-fp32", &p.ns_fp32, "Newton-Schulz in fp32 also in bf16 builds 0|1"),
        make_flag("--weight-decay", &p.weight_decay, "decoupled weight decay (matrices only)"),
        make_flag("--beta1", &p.beta1, "AdamW beta1"),
        make_flag("--beta2", &p.beta2, "AdamW beta2"),
        make_flag("--eps", &p.eps, "AdamW epsilon"),
        make_flag("--grad-clip", &p.grad_clip, "global grad-norm clip (0: off)"),
        make_flag("--schedule", &p.schedule.kind, "wsd | cosine | linear | constant"),
        make_flag("--warmup-frac", &p.schedule.warmup_frac, "warmup fraction of the steps"),
        make_flag("--decay-frac", &p.schedule.decay_frac, "wsd: decay fraction of the steps"),
        make_flag("--final-frac", &p.schedule.final_frac, "final rate as a fraction of the peak"),
        make_flag("--seed", &o.seed, "seed of init, data order and sampling"),
        make_flag("--shuffle", &o.shuffle, "shuffle training windows 0|1"),
        make_flag("--val-every", &o.val_every, "validate every N steps (and at the end; 0: only at the end)"),
        make_flag("--val-batches", &o.val_batches, "validation micro-batches (0: the whole validation set once)"),
        make_flag("--val-whole-docs", &o.val_whole_docs, "validate on rows of whole documents (none split; longer ones skipped) 0|1"),
        make_flag("--sample-every", &o.sample_every, "sample every N steps (0: only at the end)"),
        make_flag("--sample-tokens", &o.sample_tokens, "tokens per sample (0: no samples)"),
        make_flag("--temperature", &o.temperature, "sampling temperature (0: greedy)"),
        make_flag("--log", &o.log_path, "machine-readable log (JSON lines); empty: none"),
        make_flag("--log-every", &o.log_every, "print a progress line every N steps"),
        make_flag("--spike-window", &o.spike_window, "loss-spike detection: steps in the running window"),
        make_flag("--spike-z", &o.spike_z, "loss-spike detection: z-score above which a step is logged as a spike (0: off)"),
        make_flag("--checkpoint-dir", &o.checkpoint_dir, "where checkpoints go (empty: none)"),
        make_flag("--milestones", &o.milestones, "also checkpoint at 0/25/50/75/100% of the steps (milestone_NNN.bin) 0|1"),
        make_flag("--save-every", &o.save_every, "checkpoint every N steps (0: only at the end)"),
        make_flag("--resume", &o.resume_path, "checkpoint to resume exactly (model, optimizer, data position, RNG)"),
        make_flag("--init-from", &o.init_from, "checkpoint to take the model config and parameters from (with --steps 0: evaluate it)"),
    };
    flags.insert(flags.end(), more.begin(), more.end());
}

// The checkpoint to start from (--resume or --init-from), or "".
inline std::string start_checkpoint(const TrainOptions& o) {
    if (!o.resume_path.empty() && !o.init_from.empty()) { fatal("--resume and --init-from are exclusive"); }
    return o.resume_path.empty() ? o.init_from : o.resume_path;
}

// Checks the options against the model's context; resolves the gradient accumulation
// and the model's default rates.
inline void check_training_options(TrainOptions& o, int model_seq_len, const DefaultRates& rates) {
    if (o.seq_len == 0) { o.seq_len = model_seq_len; }
    o.opt.check();
    o.opt.resolve_rates(rates, o.lr_scale_gpus);
    if (o.batch_size <= 0 || o.seq_len <= 0 || o.seq_len > model_seq_len) {
        fatal("--batch-size must be > 0 and 0 < --seq-len <= %d", model_seq_len);
    }
    if (o.grad_accum < 0 || o.global_batch < 0) { fatal("--grad-accum and --global-batch must be >= 0"); }
    if (o.global_batch > 0) {
        if (o.global_batch % o.batch_size != 0) {
            fatal("--global-batch %d is not a multiple of --batch-size %d", o.global_batch, o.batch_size);
        }
        int accum = o.global_batch / o.batch_size;
        if (o.grad_accum != 0 && o.grad_accum != accum) {
            fatal("--grad-accum %d contradicts --global-batch %d / --batch-size %d = %d micro-batches", o.grad_accum,
                  o.global_batch, o.batch_size, accum);
        }
        o.grad_accum = accum;
    }
    if (o.grad_accum == 0) { o.grad_accum = 1; }
    o.global_batch = o.grad_accum * o.batch_size;
    if (o.steps < 0) { fatal("--steps must be >= 0"); }
    if (o.steps == 0 && o.init_from.empty()) { fatal("--steps 0 evaluates a model: it needs --init-from CKPT"); }
    if (o.steps > 0 && o.train_data.empty()) { fatal("--train-data is required (e.g. \"data/offline/synth/synth_train_*.bin\"; make demo builds it)"); }
    if (o.milestones != 0 && o.steps > 0 && o.checkpoint_dir.empty()) {
        fatal("--milestones 1 needs --checkpoint-dir (--paper-setup 1 turns milestones on; --milestones 0 turns them off)");
    }
    if (o.spike_window < 2) { fatal("--spike-window must be >= 2, got %d", o.spike_window); }
    if (o.steps > 0) { o.opt.schedule.check(o.steps); }
}

// Where the gradients are summed over micro-batches, as printed and logged.
inline const char* gradient_precision(const TrainOptions& o) {
    return o.grad_fp32 != 0 || PRECISION_MODE == PrecisionMode::FP32 ? "fp32" : PRECISION_NAME;
}

inline void print_optimizer(const TrainOptions& o) {
    const OptimizerConfig& opt = o.opt;
    if (opt.is_muon()) {
        printf("optimizer: muon (%s order, momentum %g, %d NS steps in %s) lr %g, adamw on the rest lr %g", opt.muon_order.c_str(),
               opt.muon_momentum, opt.ns_steps, opt.ns_fp32 || PRECISION_MODE == PrecisionMode::FP32 ? "fp32" : "bf16", opt.lr,
               opt.lr_other);
    } else {
        printf("optimizer: adamw lr %g (other %g)", opt.lr, opt.lr_other);
    }
    if (o.lr_scale_gpus != 1) { printf(" (rates scaled for %d GPUs)", o.lr_scale_gpus); }
    printf("; wd %g clip %g, schedule %s (warmup %g, decay %g, final %g)\n", opt.weight_decay, opt.grad_clip,
           opt.schedule.kind.c_str(), opt.schedule.warmup_frac, opt.schedule.decay_frac, opt.schedule.final_frac);
    printf("batch: %d rows per step = %d micro-batches x %d rows of %d tokens; gradients accumulated in %s\n",
           o.global_batch, o.grad_accum, o.batch_size, o.seq_len, gradient_precision(o));
}

// Validation over the first `batches` batches (0, or more than there are: one pass over the
// data): cross-entropy only, token-weighted (the sum over every counted target divided by
// their number); the z-loss term is reported apart (its coefficient times the mean lse^2).
// Per region (of the target token) and per SYNTH exercise x region, when the shards have
// sidecars: only targets whose whole document is in the row count there, so that no
// region's loss mixes in tokens whose context was cut (in window rows, the targets of a
// row's leading fragment of a document are left out; whole-document rows have none).
constexpr int kRegions = 4;
inline const char* region_name(int region) {
    static const char* names[kRegions] = {"other", "query", "trace", "answer"};
    return names[region];
}

struct LossSum {
    double sum = 0.0;
    int64_t count = 0;
    void add(double x) { sum += x, count++; }
    double mean() const { return count > 0 ? sum / (double)count : 0.0; }
};

struct ValResult {
    double loss = 0.0, z_loss = 0.0;
    int64_t count = 0;
    bool has_regions = false, has_exercises = false;
    LossSum region[kRegions];
    std::vector<std::string> exercise_names;
    std::vector<std::array<LossSum, kRegions + 1>> exercise;  // [exercise][region], [.][kRegions]: all regions
};

template <typename Model>
ValResult evaluate(Model& model, DataLoader& val, int batches) {
    val.reset();
    ValResult r;
    r.has_regions = val.has_regions;
    r.has_exercises = val.has_exercises;
    r.exercise_names = val.exercise_names;
    r.exercise.resize(val.exercise_names.size());
    if (batches <= 0 || batches > val.steps_per_epoch()) { batches = (int)val.steps_per_epoch(); }  // each batch once
    const int doc_start = val.config().doc_start_token;
    double ce_sum = 0.0, lse_sq_sum = 0.0;
    std::vector<float> row_losses;
    for (int k = 0; k < batches; k++) {
        val.next_batch();
        LossStats s = model.forward(val.inputs.data(), val.targets.data(), val.B, val.T, 0.0f, &row_losses);
        ce_sum += s.ce_sum;
        lse_sq_sum += s.lse_sq_sum;
        r.count += s.count;
        if (!val.has_regions && !val.has_exercises) { continue; }
        const std::vector<int>& counted = model.loss_targets();
        for (int b = 0; b < val.B; b++) {
            // until the row's first document start, the context of a target was cut
            bool whole = false;
            for (int t = 0; t < val.T; t++) {
                int i = b * val.T + t;
                whole = whole || (doc_start >= 0 && val.inputs[i] == doc_start);
                if (counted[i] < 0 || !whole) { continue; }
                size_t target = (size_t)b * (val.T + 1) + t + 1;  // the target token's position
                int region = val.has_regions ? val.regions[target] : REGION_OTHER;
                r.region[region].add(row_losses[i]);
                if (val.has_exercises) {
                    auto& e = r.exercise[val.exercises[target]];
                    e[region].add(row_losses[i]);
                    e[kRegions].add(row_losses[i]);
                }
            }
        }
    }
    if (r.count > 0) {
        r.loss = ce_sum / (double)r.count;
        r.z_loss = model.z_loss_coefficient() * lse_sq_sum / (double)r.count;
    }
    return r;
}

// Per-layer measurements for the SAN paper's analyses, logged at every validation (a model
// provides them with measure(); doc/san-model.md "Measurements").
struct LayerMeasurements {
    std::vector<double> attn_gate, ffn_gate;  // residual gate values (sigmoid(g) gated, g rezero); empty: none
    std::vector<double> erank;                // effective rank of the residual stream after each layer
    std::vector<double> max_logit;            // largest |pre-softmax attention logit| of each layer
};

template <typename Model, typename = void>
struct has_measure : std::false_type {};
template <typename Model>
struct has_measure<Model, std::void_t<decltype(std::declval<Model&>().measure((const int*)nullptr, 0, 0))>>
    : std::true_type {};

// The slice of validation data measure() runs on: the first 2 windows of 257 tokens (the
// SAN paper's code), fewer where the run's rows are shorter or the activations smaller.
constexpr int kMeasureRows = 2, kMeasureTokens = 257;

inline void append_json_array(std::string& out, const char* key, const std::vector<double>& values) {
    if (values.empty()) { return; }
    char buf[64];
    out += ", \"";
    out += key;
    out += "\": [";
    double sum = 0.0;
    for (size_t i = 0; i < values.size(); i++) {
        snprintf(buf, sizeof(buf), "%s%.6g", i > 0 ? ", " : "", values[i]);
        out += buf;
        sum += values[i];
    }
    snprintf(buf, sizeof(buf), "], \"%s_mean\": %.6g", key, sum / values.size());
    out += buf;
}

// Loss-spike detection: a step's loss is a spike when its z-score against the previous
// `window` steps' losses (mean, population standard deviation) is above `threshold`.
// Checked once the window is full; not carried across a resume (the window refills).
class SpikeDetector {
public:
    SpikeDetector(int window, double threshold) : window_(window), threshold_(threshold) {}
    // The z-score of `loss` if it is a spike, else 0; then adds it to the window.
    double observe(double loss) {
        double z = 0.0;
        if ((int)recent_.size() == window_ && threshold_ > 0.0) {
            double mean = 0.0, var = 0.0;
            for (double x : recent_) { mean += x; }
            mean /= window_;
            for (double x : recent_) { var += (x - mean) * (x - mean); }
            double sd = std::sqrt(var / window_);
            if (sd > 0.0 && (loss - mean) / sd > threshold_) { z = (loss - mean) / sd; }
            recent_.erase(recent_.begin());
        }
        recent_.push_back(loss);
        return z;
    }

private:
    int window_;
    double threshold_;
    std::vector<double> recent_;
};

// The steps at which milestone checkpoints are written: round(p * steps / 100) for p in
// 0, 25, 50, 75, 100, as {percent, step}.
inline std::vector<std::pair<int, long>> milestone_steps(long steps) {
    std::vector<std::pair<int, long>> out;
    for (int p : {0, 25, 50, 75, 100}) { out.push_back({p, (long)std::floor(p * (double)steps / 100.0 + 0.5)}); }
    return out;
}

// Trains `model` as the options say (flops_per_token: for the MFU shown on a GPU). `checkpoint` is the file given with --resume (its
// data position and RNG are restored; the model has already loaded its state) or null.
// doc_start_token: the token the data loader marks document starts with (-1: none).
// Peak dense FLOP/s of a GPU (by its name as the driver reports it) for the build's
// precision, for the MFU figure: bf16 tensor cores with fp32 accumulation, or plain fp32
// (no TF32) in fp32 builds; 0 where unknown. Data-sheet figures, dense (no sparsity).
struct GpuPeak {
    const char* name_part;  // matched as a substring; the first match wins (more specific first)
    double bf16, fp32;      // TFLOP/s
};
inline double peak_flops_for(const std::string& device_name, bool fp32_build) {
    static const GpuPeak peaks[] = {
        {"H200", 989, 67},     {"H100 PCIe", 756, 51}, {"H100", 989, 67},    {"GH200", 989, 67},
        {"B200", 2250, 80},    {"A100", 312, 19.5},    {"L40S", 362, 91.6},  {"L40", 181, 90.5},
        {"L4", 121, 30.3},     {"A10G", 70, 31.2},     {"A10", 125, 31.2},   {"RTX 4090", 165, 82.6},
        {"RTX 3090", 71, 35.6}, {"A6000", 155, 38.7},
    };
    for (const GpuPeak& p : peaks) {
        if (device_name.find(p.name_part) != std::string::npos) { return (fp32_build ? p.fp32 : p.bf16) * 1e12; }
    }
    return 0.0;
}
inline double peak_flops_per_second() {
    if (HOST_BACKEND) { return 0.0; }
    cudaDeviceProp prop;
    cudaCheck(cudaGetDeviceProperties(&prop, 0));
    return peak_flops_for(prop.name, PRECISION_MODE == PrecisionMode::FP32);
}

template <typename Model>
void run_training(Model& model, const TrainOptions& o, const Tokenizer& tokenizer, const TensorFileReader* checkpoint,
                  int vocab_size, int doc_start_token, int bos_id, double flops_per_token) {
    DataLoaderConfig train_cfg;
    train_cfg.pattern = o.train_data;
    train_cfg.B = o.batch_size;
    train_cfg.T = o.seq_len;
    train_cfg.shuffle = o.shuffle != 0;
    train_cfg.seed = o.seed;
    train_cfg.doc_start_token = doc_start_token;
    train_cfg.vocab_size = vocab_size;
    std::unique_ptr<DataLoader> train_loader;  // none when only evaluating (--steps 0)
    if (o.steps > 0) { train_loader = std::make_unique<DataLoader>(train_cfg); }
    std::unique_ptr<DataLoader> val;
    if (!o.val_data.empty()) {
        DataLoaderConfig val_cfg = train_cfg;
        val_cfg.pattern = o.val_data;
        val_cfg.shuffle = false;
        if (o.val_whole_docs != 0) {
            val_cfg.whole_documents = true;
            val_cfg.doc_start_token = bos_id;
        }
        val = std::make_unique<DataLoader>(val_cfg);
        if (o.val_batches > val->steps_per_epoch()) {
            printf("warning: --val-batches %d is more than the validation set holds (%lld batches): evaluating each once\n",
                   o.val_batches, (long long)val->steps_per_epoch());
        }
        if (o.val_whole_docs != 0) {
            printf("validation: whole documents, %lld packed into %lld rows (%lld longer than %d tokens skipped)\n",
                   (long long)val->num_documents(), (long long)val->num_rows(), (long long)val->num_skipped_documents(),
                   o.seq_len + 1);
        }
    }
    if (!o.checkpoint_dir.empty()) {  // fail now, not after hours of training
        if (mkdir(o.checkpoint_dir.c_str(), 0755) != 0 && errno != EEXIST) {
            fatal("--checkpoint-dir '%s': cannot create it: %s", o.checkpoint_dir.c_str(), strerror(errno));
        }
        struct stat st;
        if (stat(o.checkpoint_dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
            fatal("--checkpoint-dir '%s' is not a directory", o.checkpoint_dir.c_str());
        }
    }
    std::mt19937_64 rng(o.seed);
    if (checkpoint != nullptr) {
        DataPosition pos{checkpoint->integer("resume.data_epoch"), checkpoint->integer("resume.data_step"),
                         (uint64_t)std::stoull(checkpoint->str("resume.data_fingerprint"))};
        train_loader->set_position(pos);
        rng.seed((uint64_t)std::stoull(checkpoint->str("resume.rng_seed")));
        printf("resumed from %s at step %" PRId64 "\n", checkpoint->path().c_str(), model.steps_done());
    }
    FILE* log = nullptr;
    if (!o.log_path.empty()) {
        log = fopen(o.log_path.c_str(), model.steps_done() > 0 ? "a" : "w");
        if (log == nullptr) { fatal("cannot open log file '%s': %s", o.log_path.c_str(), strerror(errno)); }
    }
    auto save = [&](const std::string& name) {
        if (o.checkpoint_dir.empty()) { return; }
        DataPosition pos = train_loader->position();
        uint64_t rng_seed = rng();  // reseeding from a drawn value makes the resumed stream exact
        rng.seed(rng_seed);
        std::string path = o.checkpoint_dir + "/" + name;
        model.save_checkpoint(path, o.opt, {{"resume.data_epoch", std::to_string(pos.epoch)},
                                            {"resume.data_step", std::to_string(pos.step)},
                                            {"resume.data_fingerprint", std::to_string(pos.fingerprint)},
                                            {"resume.rng_seed", std::to_string(rng_seed)}});
        printf("saved %s\n", path.c_str());
    };
    auto print_sample = [&]() {
        if (o.sample_tokens <= 0) { return; }
        std::vector<int> out = model.sample({bos_id}, o.sample_tokens, o.temperature, rng);
        printf("sample: ");
        if (tokenizer.loaded()) {
            printf("%s\n", tokenizer.decode(out).c_str());
        } else {
            for (int t : out) { printf("%d ", t); }
            printf("\n");
        }
    };
    // the measurement slice: the first windows of the validation data (SAN paper's code)
    std::vector<int> measure_inputs;
    int measure_B = 0, measure_T = 0;
    if (has_measure<Model>::value && val != nullptr) {
        measure_T = std::min(kMeasureTokens, o.seq_len);
        measure_B = std::min(kMeasureRows, o.batch_size * o.seq_len / measure_T);
        DataLoaderConfig cfg = train_cfg;
        cfg.pattern = o.val_data;
        cfg.shuffle = false;
        cfg.B = measure_B;
        cfg.T = measure_T;
        DataLoader slice(cfg);
        slice.next_batch();
        measure_inputs = slice.inputs;
    }
    auto validate = [&](long step) {
        if (val == nullptr) { return; }
        ValResult r = evaluate(model, *val, o.val_batches);
        printf("step %ld: val loss %.4f", step, r.loss);
        for (int g = 0; g < kRegions && r.has_regions; g++) {
            if (r.region[g].count > 0) { printf(" | %s %.4f", region_name(g), r.region[g].mean()); }
        }
        if (r.z_loss > 0.0) { printf(" | z-loss %.2e", r.z_loss); }
        printf("\n");
        for (size_t e = 1; e < r.exercise.size(); e++) {  // 0: no exercise
            if (r.exercise[e][kRegions].count == 0) { continue; }
            printf("    %-14s %.4f", r.exercise_names[e].c_str(), r.exercise[e][kRegions].mean());
            for (int g = 1; g < kRegions; g++) {
                if (r.exercise[e][g].count > 0) { printf(" | %s %.4f", region_name(g), r.exercise[e][g].mean()); }
            }
            printf("\n");
        }
        LayerMeasurements m;
        if constexpr (has_measure<Model>::value) { m = model.measure(measure_inputs.data(), measure_B, measure_T); }
        if (log == nullptr) { return; }
        std::string line = "{\"step\": " + std::to_string(step);
        char buf[160];
        snprintf(buf, sizeof(buf), ", \"val_loss\": %.6f, \"val_z_loss\": %.6g, \"val_tokens\": %lld", r.loss, r.z_loss,
                 (long long)r.count);
        line += buf;
        for (int g = 0; g < kRegions && r.has_regions; g++) {
            if (r.region[g].count > 0) {
                snprintf(buf, sizeof(buf), ", \"val_loss_%s\": %.6f", region_name(g), r.region[g].mean());
                line += buf;
            }
        }
        if (r.has_exercises) {  // "val_exercise": {"recall": {"all": x, "query": y, ...}, ...}
            line += ", \"val_exercise\": {";
            bool first = true;
            for (size_t e = 1; e < r.exercise.size(); e++) {
                if (r.exercise[e][kRegions].count == 0) { continue; }
                snprintf(buf, sizeof(buf), "%s\"%s\": {\"all\": %.6f", first ? "" : ", ", r.exercise_names[e].c_str(),
                         r.exercise[e][kRegions].mean());
                line += buf;
                for (int g = 0; g < kRegions; g++) {
                    if (r.exercise[e][g].count == 0) { continue; }
                    snprintf(buf, sizeof(buf), ", \"%s\": %.6f", region_name(g), r.exercise[e][g].mean());
                    line += buf;
                }
                line += "}";
                first = false;
            }
            line += "}";
        }
        append_json_array(line, "gate_attn", m.attn_gate);
        append_json_array(line, "gate_ffn", m.ffn_gate);
        append_json_array(line, "erank", m.erank);
        append_json_array(line, "max_logit", m.max_logit);
        fprintf(log, "%s}\n", line.c_str());
        fflush(log);
    };
    if (o.steps == 0) {  // evaluate the model given with --init-from
        validate(model.steps_done());
        print_sample();
        if (log != nullptr) { fclose(log); }
        return;
    }
    // stops the run, naming the first tensor that is not finite
    auto diverged = [&](long step, const char* what, double value) {
        std::string tensor = model.first_nonfinite_tensor();
        fatal("step %ld: %s is %g: the run diverged (%s)", step, what, value,
              tensor.empty() ? "every parameter and gradient is finite" : ("first non-finite: " + tensor).c_str());
    };
    auto save_milestones = [&](long done) {
        if (o.milestones == 0) { return; }
        for (const auto& [percent, at] : milestone_steps(o.steps)) {
            if (at == done) {
                char name[32];
                snprintf(name, sizeof(name), "milestone_%03d.bin", percent);
                save(name);
            }
        }
    };

    const double tokens_per_step = (double)o.grad_accum * o.batch_size * o.seq_len;
    const double peak = peak_flops_per_second();
    double total_ms = 0.0;
    const long first_step = (long)model.steps_done();
    if (o.grad_fp32 != 0) { model.accumulate_in_fp32(); }
    SpikeDetector spikes(o.spike_window, o.spike_z);
    DataLoader& train = *train_loader;
    if (first_step == 0) { save_milestones(0); }
    for (long step = first_step; step < o.steps; step++) {
        Timer timer;
        model.zero_grad();
        double loss = 0.0;
        for (int micro = 0; micro < o.grad_accum; micro++) {
            train.next_batch();
            // each micro-batch's loss is a mean over its own counted targets (as llm.c)
            int64_t count = model.count_loss_targets(train.targets.data(), o.batch_size * o.seq_len);
            float scale = 1.0f / (float)(std::max<int64_t>(count, 1) * o.grad_accum);
            LossStats s = model.forward(train.inputs.data(), train.targets.data(), o.batch_size, o.seq_len, scale, nullptr);
            model.backward();
            model.end_micro_batch();
            loss += model.loss_value(s) / o.grad_accum;
        }
        if (!std::isfinite(loss)) { diverged(step + 1, "the loss", loss); }
        double f = o.opt.schedule.multiplier(step, o.steps);
        float grad_norm = model.update(o.opt, o.opt.lr * f, o.opt.lr_other * f);
        if (!std::isfinite(grad_norm)) { diverged(step + 1, "the gradient norm", grad_norm); }
        cudaCheck(cudaDeviceSynchronize());
        double ms = timer.ms();
        total_ms += ms;
        long done = step + 1;
        double eta_s = total_ms / (done - first_step) * (o.steps - done) / 1e3;
        if (done % o.log_every == 0 || done == o.steps || done == first_step + 1) {
            double tokens_per_second = tokens_per_step / (ms / 1e3);
            printf("step %5ld/%ld | loss %.4f | lr %.3e | norm %6.3f | %7.1f ms | %8.0f tok/s", done, o.steps, loss,
                   o.opt.lr * f, grad_norm, ms, tokens_per_second);
            if (peak > 0.0) { printf(" | MFU %4.1f%%", 100.0 * flops_per_token * tokens_per_second / peak); }
            printf(" | eta %.0fs\n", eta_s);
        }
        double spike_z = spikes.observe(loss);
        if (spike_z > 0.0) { printf("step %ld: loss spike (%.4f, z-score %.1f over the last %d steps)\n", done, loss, spike_z, o.spike_window); }
        if (log != nullptr) {
            fprintf(log, "{\"step\": %ld, \"loss\": %.6f, \"lr\": %.6e, \"grad_norm\": %.6f, \"ms\": %.2f", done, loss,
                    o.opt.lr * f, grad_norm, ms);
            if (spike_z > 0.0) { fprintf(log, ", \"loss_spike_z\": %.3f", spike_z); }
            fprintf(log, "}\n");
            fflush(log);
        }
        if (o.val_every > 0 && done % o.val_every == 0 && done != o.steps) { validate(done); }
        if (o.sample_every > 0 && done % o.sample_every == 0 && done != o.steps) { print_sample(); }
        if (o.save_every > 0 && done % o.save_every == 0 && done != o.steps) { save("step_" + std::to_string(done) + ".bin"); }
        save_milestones(done);
    }
    validate(o.steps);
    print_sample();
    save("final.bin");
    if (log != nullptr) { fclose(log); }
}
