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
    double loss_value(const LossStats&)      the loss the statistics stand for
    const std::vector<int>& loss_targets()   the last forward's targets, < 0 where masked
*/
#pragma once

#include <cerrno>
#include <sys/stat.h>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "cli.h"
#include "cuda_common.h"
#include "dataloader.h"
#include "optimizer.h"
#include "tensor_file.h"
#include "tokenizer.h"
#include "utils.h"

struct TrainOptions {
    OptimizerConfig opt = [] {
        OptimizerConfig c;
        c.lr = -1.0;  // the optimizer's default (OptimizerConfig::resolve_rates)
        return c;
    }();
    int lr_scale_gpus = 1;
    std::string train_data, val_data, tokenizer_path, log_path, checkpoint_dir, resume_path, init_from;
    int batch_size = 8, seq_len = 0, grad_accum = 1;
    long steps = 100;
    int val_every = 50, val_batches = 8, sample_every = 0, sample_tokens = 64, save_every = 0, log_every = 1;
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
        make_flag("--grad-accum", &o.grad_accum, "micro-batches per optimizer step"),
        make_flag("--steps", &o.steps, "optimizer steps"),
        make_flag("--optimizer", &p.optimizer, "adamw | muon (Muon on the matrices, AdamW without decay on the rest)"),
        make_flag("--lr", &p.lr, "peak rate of the matrix group (<0: muon 0.02, adamw 6e-4)"),
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
        make_flag("--val-batches", &o.val_batches, "validation micro-batches"),
        make_flag("--sample-every", &o.sample_every, "sample every N steps (0: only at the end)"),
        make_flag("--sample-tokens", &o.sample_tokens, "tokens per sample (0: no samples)"),
        make_flag("--temperature", &o.temperature, "sampling temperature (0: greedy)"),
        make_flag("--log", &o.log_path, "machine-readable log (JSON lines); empty: none"),
        make_flag("--log-every", &o.log_every, "print a progress line every N steps"),
        make_flag("--checkpoint-dir", &o.checkpoint_dir, "where checkpoints go (empty: none)"),
        make_flag("--save-every", &o.save_every, "checkpoint every N steps (0: only at the end)"),
        make_flag("--resume", &o.resume_path, "checkpoint to resume exactly (model, optimizer, data position, RNG)"),
        make_flag("--init-from", &o.init_from, "checkpoint to take the model config and parameters from"),
    };
    flags.insert(flags.end(), more.begin(), more.end());
}

// The checkpoint to start from (--resume or --init-from), or "".
inline std::string start_checkpoint(const TrainOptions& o) {
    if (!o.resume_path.empty() && !o.init_from.empty()) { fatal("--resume and --init-from are exclusive"); }
    return o.resume_path.empty() ? o.init_from : o.resume_path;
}

// Checks the options against the model's context; resolves the default rates.
inline void check_training_options(TrainOptions& o, int model_seq_len) {
    if (o.seq_len == 0) { o.seq_len = model_seq_len; }
    o.opt.check();
    o.opt.resolve_rates(o.lr_scale_gpus);
    if (o.batch_size <= 0 || o.seq_len <= 0 || o.seq_len > model_seq_len) {
        fatal("--batch-size must be > 0 and 0 < --seq-len <= %d", model_seq_len);
    }
    if (o.grad_accum <= 0 || o.steps <= 0) { fatal("--grad-accum and --steps must be positive"); }
    if (o.train_data.empty()) { fatal("--train-data is required (e.g. \"data/offline/synth/synth_train_*.bin\"; make demo builds it)"); }
    o.opt.schedule.check(o.steps);
}

inline void print_optimizer(const OptimizerConfig& opt) {
    if (opt.is_muon()) {
        printf("optimizer: muon (%s order, momentum %g, %d NS steps in %s) lr %g, adamw on the rest lr %g", opt.muon_order.c_str(),
               opt.muon_momentum, opt.ns_steps, opt.ns_fp32 || PRECISION_MODE == PrecisionMode::FP32 ? "fp32" : "bf16", opt.lr,
               opt.lr_other);
    } else {
        printf("optimizer: adamw lr %g (other %g)", opt.lr, opt.lr_other);
    }
    printf("; wd %g clip %g, schedule %s\n", opt.weight_decay, opt.grad_clip, opt.schedule.kind.c_str());
}

// Validation loss over the first `batches` batches, overall and per token region (the
// region of each target) when the shards have region sidecars.
struct ValResult {
    double loss = 0.0;
    double region_loss[4] = {0, 0, 0, 0};
    int64_t region_count[4] = {0, 0, 0, 0};
    bool has_regions = false;
};

template <typename Model>
ValResult evaluate(Model& model, DataLoader& val, int batches) {
    val.reset();
    ValResult r;
    double weighted = 0.0;
    int64_t count = 0;
    std::vector<float> row_losses;
    for (int k = 0; k < batches; k++) {
        val.next_batch();
        LossStats s = model.forward(val.inputs.data(), val.targets.data(), val.B, val.T, 0.0f, &row_losses);
        weighted += model.loss_value(s) * s.count;
        count += s.count;
        if (!val.has_regions) { continue; }
        r.has_regions = true;
        const std::vector<int>& counted = model.loss_targets();
        for (int b = 0; b < val.B; b++) {
            for (int t = 0; t < val.T; t++) {
                int i = b * val.T + t;
                if (counted[i] < 0) { continue; }
                int region = val.regions[(size_t)b * (val.T + 1) + t + 1];
                r.region_loss[region] += row_losses[i];
                r.region_count[region]++;
            }
        }
    }
    r.loss = count > 0 ? weighted / count : 0.0;
    for (int g = 0; g < 4; g++) { r.region_loss[g] = r.region_count[g] > 0 ? r.region_loss[g] / r.region_count[g] : 0.0; }
    return r;
}

// Trains `model` as the options say (flops_per_token: for the MFU shown on a GPU). `checkpoint` is the file given with --resume (its
// data position and RNG are restored; the model has already loaded its state) or null.
// doc_start_token: the token the data loader marks document starts with (-1: none).
// Peak dense FLOP/s of this device for the build's precision, for the MFU figure; 0 where
// unknown (the host backend, GPUs other than sm_90).
inline double peak_flops_per_second() {
    if (HOST_BACKEND) { return 0.0; }
    cudaDeviceProp prop;
    cudaCheck(cudaGetDeviceProperties(&prop, 0));
    if (prop.major != 9) { return 0.0; }
    // H100/H200 SXM: 989 TFLOP/s dense bf16 on tensor cores; fp32 builds use plain fp32 (67)
    return PRECISION_MODE == PrecisionMode::FP32 ? 67e12 : 989e12;
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
    DataLoader train(train_cfg);
    std::unique_ptr<DataLoader> val;
    if (!o.val_data.empty()) {
        DataLoaderConfig val_cfg = train_cfg;
        val_cfg.pattern = o.val_data;
        val_cfg.shuffle = false;
        val = std::make_unique<DataLoader>(val_cfg);
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
        train.set_position(pos);
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
        DataPosition pos = train.position();
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
    auto validate = [&](long step) {
        if (val == nullptr) { return; }
        ValResult r = evaluate(model, *val, o.val_batches);
        static const char* names[4] = {"other", "query", "trace", "answer"};
        printf("step %ld: val loss %.4f", step, r.loss);
        for (int g = 0; g < 4 && r.has_regions; g++) {
            if (r.region_count[g] > 0) { printf(" | %s %.4f", names[g], r.region_loss[g]); }
        }
        printf("\n");
        if (log == nullptr) { return; }
        fprintf(log, "{\"step\": %ld, \"val_loss\": %.6f", step, r.loss);
        for (int g = 0; g < 4 && r.has_regions; g++) {
            if (r.region_count[g] > 0) { fprintf(log, ", \"val_loss_%s\": %.6f", names[g], r.region_loss[g]); }
        }
        fprintf(log, "}\n");
        fflush(log);
    };

    const double tokens_per_step = (double)o.grad_accum * o.batch_size * o.seq_len;
    const double peak = peak_flops_per_second();
    double total_ms = 0.0;
    const long first_step = (long)model.steps_done();
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
            loss += model.loss_value(s) / o.grad_accum;
        }
        if (!std::isfinite(loss)) { fatal("step %ld: loss is %f: the run diverged", step + 1, loss); }
        double f = o.opt.schedule.multiplier(step, o.steps);
        float grad_norm = model.update(o.opt, o.opt.lr * f, o.opt.lr_other * f);
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
        if (log != nullptr) {
            fprintf(log, "{\"step\": %ld, \"loss\": %.6f, \"lr\": %.6e, \"grad_norm\": %.6f, \"ms\": %.2f}\n", done, loss,
                    o.opt.lr * f, grad_norm, ms);
            fflush(log);
        }
        if (o.val_every > 0 && done % o.val_every == 0 && done != o.steps) { validate(done); }
        if (o.sample_every > 0 && done % o.sample_every == 0 && done != o.steps) { print_sample(); }
        if (o.save_every > 0 && done % o.save_every == 0 && done != o.steps) { save("step_" + std::to_string(done) + ".bin"); }
    }
    validate(o.steps);
    print_sample();
    save("final.bin");
    if (log != nullptr) { fclose(log); }
}
