/*
The training run shared by the trainers (train_san.cu, train_gpt2.cu): the options and
flags that are not about the model, and run_training(), which reads the data, trains with
gradient accumulation under the learning-rate schedule, validates (overall and per token
region when the shards have region sidecars), samples (from BOS or a --prompt; valid
UTF-8), logs and writes checkpoints that resume exactly (model, optimizer, data position
and sampling RNG; doc/formats.md "Resume state"). A resume continues the saved run: its
settings come from the checkpoint and flags that would change them are refused by name
(continue_saved_run); model flags that contradict a checkpoint are refused by name too
(check_model_flags). At the start the run prints the data it matched.

A model type used with run_training provides:
    LossStats forward(inputs, targets, B, T, dloss_scale, std::vector<float>* row_losses)
    void backward();  void zero_grad();  float update(opt, lr_matrix, lr_other);
    int64_t steps_done();  save_checkpoint(path, opt, extra);
    std::vector<int> sample(prompt, n, temperature, rng, use_kv_cache);
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
#include <functional>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "cli.h"
#include "cuda_common.h"
#include "dataloader.h"
#include "eval_scoring.h"
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
    long extend_to = 0;      // --resume a run and train it on to this many steps (a new schedule)
    int resume_override = 0; // --resume: let the flags given change the saved run's settings
    std::string prompt;      // text to continue in the samples (encoded with --tokenizer)
    int kv_cache = 1;        // sample with a KV cache (llmc/kv_cache.cuh)
    std::string eval_sets;   // eval .bin files scored by llmc/eval_scoring.h (comma list)
    int eval_every = 0;      // score them every N steps (and at the end)
    std::set<std::string> given;  // the flags given on the command line (llmc/cli.h parse_flags)
    bool model_loaded = false;    // the trainer loaded a model from another file (train_gpt2 --init-from-llmc)
};

// The flags of TrainOptions, appended to a trainer's model flags; `with_muon`: the trainer
// offers Muon (train_gpt2 does not, and lists none of its flags).
inline void add_training_flags(std::vector<Flag>& flags, TrainOptions& o, bool with_muon = true) {
    OptimizerConfig& p = o.opt;
    std::vector<Flag> more = {
        make_flag("--train-data", &o.train_data, "training shards (glob, comma-separated globs)"),
        make_flag("--val-data", &o.val_data, "validation shards (glob); empty: no validation"),
        make_flag("--tokenizer", &o.tokenizer_path, "tokenizer .bin: sets the vocabulary size, decodes samples, encodes --prompt"),
        make_flag("--batch-size", &o.batch_size, "rows per micro-batch B"),
        make_flag("--seq-len", &o.seq_len, "tokens per row (0: the model's T)"),
        make_flag("--grad-accum", &o.grad_accum, "micro-batches per optimizer step (0: --global-batch / --batch-size, or 1)"),
        make_flag("--global-batch", &o.global_batch, "rows per optimizer step (0: batch-size x grad-accum)"),
        make_flag("--grad-fp32", &o.grad_fp32, "accumulate gradients in fp32 in bf16 builds 0|1"),
        make_flag("--steps", &o.steps, "optimizer steps"),
        make_flag("--optimizer", &p.optimizer, with_muon ? "adamw | muon (Muon on the matrices, AdamW without decay on the rest)" : "adamw (the one optimizer of this trainer)"),
        make_flag("--lr", &p.lr, "peak rate of the matrix group (<0: the model's default for the optimizer)"),
        make_flag("--lr-other", &p.lr_other, with_muon ? "peak rate of embeddings/gains/gates/biases (<0: muon 3e-4, adamw same as --lr)" : "peak rate of embeddings/gains/biases (<0: same as --lr)"),
        make_flag("--lr-scale-gpus", &o.lr_scale_gpus, with_muon ? "scale the rates for N GPUs: AdamW rates x N, the Muon rate x sqrt(N)" : "scale the rates for N GPUs: x N"),
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
        make_flag("--eval-sets", &o.eval_sets, "eval .bin files to score (comma list; dev/data/evals.py): acc, acc_norm, perplexity, word perplexity"),
        make_flag("--eval-every", &o.eval_every, "score the eval sets every N steps (and at the end; 0: only at the end)"),
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
        make_flag("--resume", &o.resume_path, "checkpoint to continue exactly: model, optimizer, schedule, steps and data settings all from the file"),
        make_flag("--resume-override", &o.resume_override, "with --resume: the flags given may change the saved run's settings (each is printed) 0|1"),
        make_flag("--extend-to", &o.extend_to, "with --resume: train the saved run on to N steps in total, the schedule recomputed over N (printed)"),
        make_flag("--init-from", &o.init_from, "checkpoint to take the model config and parameters from (with --steps 0: evaluate it)"),
        make_flag("--prompt", &o.prompt, "text the samples continue (encoded with --tokenizer; empty: start at BOS)"),
        make_flag("--kv-cache", &o.kv_cache, "sample with a KV cache (one position per token) 0|1"),
    };
    if (with_muon) {
        std::vector<Flag> muon = {
            make_flag("--muon-order", &p.muon_order, "keller (momentum, then orthogonalise, shape factor) | paper (orthogonalise, then momentum)"),
            make_flag("--muon-momentum", &p.muon_momentum, "Muon momentum"),
            make_flag("--ns-steps", &p.ns_steps, "Newton-Schulz steps"),
            make_flag("--ns-fp32", &p.ns_fp32, "Newton-Schulz in fp32 also in bf16 builds 0|1"),
        };
        more.insert(more.begin() + 13, muon.begin(), muon.end());  // after --lr-scale-gpus
    }
    flags.insert(flags.end(), more.begin(), more.end());
}

// The checkpoint to start from (--resume or --init-from), or "".
inline std::string start_checkpoint(const TrainOptions& o) {
    if (!o.resume_path.empty() && !o.init_from.empty()) { fatal("--resume and --init-from are exclusive"); }
    return o.resume_path.empty() ? o.init_from : o.resume_path;
}

// ---- what a resume continues ------------------------------------------------------------
// A checkpoint holds the settings of the run that wrote it (opt.* from OptimizerConfig, run.*
// from run_setting_keys below: steps, data, batch, seed, validation and checkpoint cadence).
// --resume continues that run: every setting comes from the file; a flag given that
// changes one is refused, unless --resume-override 1 (then each change is printed).
// --extend-to N is the one way to train a finished run further: the total becomes N and
// the schedule is recomputed over N steps (printed).

// Shortest text that reads back to the same double (as TensorFileWriter writes reals).
inline std::string real_text(double value) {
    char text[40];
    for (int precision = 1; precision <= 17; precision++) {
        snprintf(text, sizeof(text), "%.*g", precision, value);
        if (strtod(text, nullptr) == value) { break; }
    }
    return text;
}

// One setting of a run: its checkpoint key, the flags that set it, and its value as text.
// Where the outputs go (--checkpoint-dir, --log) is no setting of the run: each command
// line says it (so a resumed run's checkpoints equal the uninterrupted run's, byte for byte).
struct RunSetting {
    std::string key;
    std::vector<std::string> flags;
    std::function<std::string(const TrainOptions&)> get;
    std::function<void(TrainOptions&, const std::string&)> set;
};

inline std::vector<RunSetting> run_settings() {
    std::vector<RunSetting> out;
    auto text = [&](const char* key, std::vector<std::string> flags, std::string TrainOptions::*field) {
        out.push_back({key, flags, [field](const TrainOptions& o) { return o.*field; },
                       [field](TrainOptions& o, const std::string& v) { o.*field = v; }});
    };
    auto opt_text = [&](const char* key, std::vector<std::string> flags, std::string OptimizerConfig::*field) {
        out.push_back({key, flags, [field](const TrainOptions& o) { return o.opt.*field; },
                       [field](TrainOptions& o, const std::string& v) { o.opt.*field = v; }});
    };
    auto real = [&](const char* key, std::vector<std::string> flags, std::function<double&(TrainOptions&)> ref) {
        out.push_back({key, flags, [ref](const TrainOptions& o) { return real_text(ref(const_cast<TrainOptions&>(o))); },
                       [ref](TrainOptions& o, const std::string& v) { ref(o) = strtod(v.c_str(), nullptr); }});
    };
    auto integer = [&](const char* key, std::vector<std::string> flags, std::function<long long(const TrainOptions&)> get,
                       std::function<void(TrainOptions&, long long)> set) {
        out.push_back({key, flags, [get](const TrainOptions& o) { return std::to_string(get(o)); },
                       [set](TrainOptions& o, const std::string& v) { set(o, strtoll(v.c_str(), nullptr, 10)); }});
    };
    integer("run.steps", {"--steps"}, [](const TrainOptions& o) { return (long long)o.steps; },
            [](TrainOptions& o, long long v) { o.steps = (long)v; });
    opt_text("opt.optimizer", {"--optimizer"}, &OptimizerConfig::optimizer);
    real("opt.lr", {"--lr", "--lr-scale-gpus"}, [](TrainOptions& o) -> double& { return o.opt.lr; });
    real("opt.lr_other", {"--lr-other", "--lr-scale-gpus"}, [](TrainOptions& o) -> double& { return o.opt.lr_other; });
    integer("run.lr_scale_gpus", {"--lr-scale-gpus"}, [](const TrainOptions& o) { return (long long)o.lr_scale_gpus; },
            [](TrainOptions& o, long long v) { o.lr_scale_gpus = (int)v; });
    real("opt.weight_decay", {"--weight-decay"}, [](TrainOptions& o) -> double& { return o.opt.weight_decay; });
    real("opt.beta1", {"--beta1"}, [](TrainOptions& o) -> double& { return o.opt.beta1; });
    real("opt.beta2", {"--beta2"}, [](TrainOptions& o) -> double& { return o.opt.beta2; });
    real("opt.eps", {"--eps"}, [](TrainOptions& o) -> double& { return o.opt.eps; });
    real("opt.grad_clip", {"--grad-clip"}, [](TrainOptions& o) -> double& { return o.opt.grad_clip; });
    opt_text("opt.muon_order", {"--muon-order"}, &OptimizerConfig::muon_order);
    real("opt.muon_momentum", {"--muon-momentum"}, [](TrainOptions& o) -> double& { return o.opt.muon_momentum; });
    integer("opt.ns_steps", {"--ns-steps"}, [](const TrainOptions& o) { return (long long)o.opt.ns_steps; },
            [](TrainOptions& o, long long v) { o.opt.ns_steps = (int)v; });
    integer("opt.ns_fp32", {"--ns-fp32"}, [](const TrainOptions& o) { return (long long)o.opt.ns_fp32; },
            [](TrainOptions& o, long long v) { o.opt.ns_fp32 = (int)v; });
    out.push_back({"opt.schedule", {"--schedule"}, [](const TrainOptions& o) { return o.opt.schedule.kind; },
                   [](TrainOptions& o, const std::string& v) { o.opt.schedule.kind = v; }});
    real("opt.warmup_frac", {"--warmup-frac"}, [](TrainOptions& o) -> double& { return o.opt.schedule.warmup_frac; });
    real("opt.decay_frac", {"--decay-frac"}, [](TrainOptions& o) -> double& { return o.opt.schedule.decay_frac; });
    real("opt.final_frac", {"--final-frac"}, [](TrainOptions& o) -> double& { return o.opt.schedule.final_frac; });
    text("run.train_data", {"--train-data"}, &TrainOptions::train_data);
    integer("run.batch_size", {"--batch-size"}, [](const TrainOptions& o) { return (long long)o.batch_size; },
            [](TrainOptions& o, long long v) { o.batch_size = (int)v; });
    integer("run.grad_accum", {"--grad-accum", "--global-batch", "--batch-size"},
            [](const TrainOptions& o) { return (long long)o.grad_accum; },
            [](TrainOptions& o, long long v) { o.grad_accum = (int)v; });
    integer("run.seq_len", {"--seq-len"}, [](const TrainOptions& o) { return (long long)o.seq_len; },
            [](TrainOptions& o, long long v) { o.seq_len = (int)v; });
    integer("run.grad_fp32", {"--grad-fp32"}, [](const TrainOptions& o) { return (long long)o.grad_fp32; },
            [](TrainOptions& o, long long v) { o.grad_fp32 = (int)v; });
    integer("run.shuffle", {"--shuffle"}, [](const TrainOptions& o) { return (long long)o.shuffle; },
            [](TrainOptions& o, long long v) { o.shuffle = (int)v; });
    integer("run.seed", {"--seed"}, [](const TrainOptions& o) { return (long long)o.seed; },
            [](TrainOptions& o, long long v) { o.seed = (uint64_t)v; });
    text("run.val_data", {"--val-data"}, &TrainOptions::val_data);
    integer("run.val_every", {"--val-every"}, [](const TrainOptions& o) { return (long long)o.val_every; },
            [](TrainOptions& o, long long v) { o.val_every = (int)v; });
    integer("run.val_batches", {"--val-batches"}, [](const TrainOptions& o) { return (long long)o.val_batches; },
            [](TrainOptions& o, long long v) { o.val_batches = (int)v; });
    integer("run.val_whole_docs", {"--val-whole-docs"}, [](const TrainOptions& o) { return (long long)o.val_whole_docs; },
            [](TrainOptions& o, long long v) { o.val_whole_docs = (int)v; });
    integer("run.save_every", {"--save-every"}, [](const TrainOptions& o) { return (long long)o.save_every; },
            [](TrainOptions& o, long long v) { o.save_every = (int)v; });
    integer("run.milestones", {"--milestones"}, [](const TrainOptions& o) { return (long long)o.milestones; },
            [](TrainOptions& o, long long v) { o.milestones = (int)v; });
    return out;
}

// The run.* keys a checkpoint of this run holds (the opt.* keys come from OptimizerConfig).
inline std::vector<std::pair<std::string, std::string>> run_setting_keys(const TrainOptions& o) {
    std::vector<std::pair<std::string, std::string>> out;
    for (const RunSetting& s : run_settings()) {
        if (s.key.rfind("run.", 0) == 0) { out.push_back({s.key, s.get(o)}); }
    }
    return out;
}

// --resume: the saved run's settings replace the options (resolved from the flags); a flag
// given that changes one fails, or with --resume-override 1 wins and is printed. Keys the
// file lacks (files from before they were saved) keep the flags' values.
inline void continue_saved_run(TrainOptions& o, const TensorFileReader& ckpt) {
    TrainOptions saved = o;
    std::vector<std::string> changes;
    // --lr-scale-gpus given counts against the rates only when it changes the scale
    bool scale_changed = o.given.count("--lr-scale-gpus") && ckpt.has_key("run.lr_scale_gpus") &&
                         ckpt.integer("run.lr_scale_gpus") != o.lr_scale_gpus;
    for (const RunSetting& s : run_settings()) {
        if (!ckpt.has_key(s.key)) { continue; }
        s.set(saved, ckpt.str(s.key));
        std::string from_file = s.get(saved), from_flags = s.get(o);
        if (from_file == from_flags) { continue; }
        std::string flag;
        for (const std::string& f : s.flags) {
            if (o.given.count(f) && (f != "--lr-scale-gpus" || scale_changed)) { flag = f; break; }
        }
        if (flag.empty()) { continue; }  // not asked for: the saved value stands
        std::string name = s.key.substr(s.key.find('.') + 1);
        changes.push_back(flag + " (" + name + " " + from_flags + "; the saved run's " + from_file + ")");
        if (o.resume_override != 0) { s.set(saved, from_flags); }
    }
    if (!changes.empty() && o.resume_override == 0) {
        std::string list;
        for (const std::string& c : changes) { list += "\n    " + c; }
        fatal("--resume %s continues the saved run with its own settings; these flags change them:%s\n"
              "Leave them out, add --resume-override 1 to change them anyway, or --extend-to N to train a finished "
              "run further (new total, new schedule); --init-from starts a new run from the model.",
              ckpt.path().c_str(), list.c_str());
    }
    std::set<std::string> given = o.given;
    long extend_to = o.extend_to;
    int override_ = o.resume_override;
    o = saved;
    o.given = given;
    o.extend_to = extend_to;
    o.resume_override = override_;
    long done = (long)ckpt.integer("step");
    printf("resume: continuing the run saved in %s at step %ld of %ld (optimizer, schedule, steps and data settings "
           "from the file)\n", ckpt.path().c_str(), done, o.steps);
    for (const std::string& c : changes) { printf("resume: --resume-override 1: %s\n", c.c_str()); }
    if (o.checkpoint_dir.empty()) { printf("warning: no --checkpoint-dir: this run writes no checkpoint\n"); }
    if (o.extend_to > 0) {
        if (o.extend_to <= done) {
            fatal("--extend-to %ld: the run in %s has done %ld steps already; give a larger total", o.extend_to,
                  ckpt.path().c_str(), done);
        }
        Schedule sch = o.opt.schedule;
        sch.check(o.extend_to);
        double before = done > 0 && done <= o.steps ? sch.multiplier(done - 1, o.steps) : 0.0;
        double after = sch.multiplier(done, o.extend_to);
        printf("extend: %ld -> %ld steps; the %s schedule is recomputed over %ld steps: step %ld runs at lr %.3e "
               "(step %ld of the saved run ran at %.3e)\n", o.steps, o.extend_to, sch.kind.c_str(), o.extend_to,
               done + 1, o.opt.lr * after, done, o.opt.lr * before);
        o.steps = o.extend_to;
    } else if (done >= o.steps) {
        fatal("--resume %s: that run finished (%ld of %ld steps). --extend-to N trains it on to N steps with the "
              "schedule recomputed over N; --steps 0 --init-from %s evaluates it", ckpt.path().c_str(), done, o.steps,
              ckpt.path().c_str());
    }
}

// Checks the options against the model's context; resolves the gradient accumulation
// and the model's default rates; with a checkpoint to resume, continues its run.
inline void check_training_options(TrainOptions& o, int model_seq_len, const DefaultRates& rates,
                                   const TensorFileReader* resume = nullptr) {
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
    if (o.extend_to != 0 && resume == nullptr) { fatal("--extend-to needs --resume CKPT (the run to extend)"); }
    if (o.resume_override != 0 && resume == nullptr) { fatal("--resume-override needs --resume CKPT"); }
    if (resume != nullptr) {
        if (o.steps == 0 && o.given.count("--steps")) { fatal("--steps 0 evaluates a model: use --init-from CKPT, not --resume"); }
        continue_saved_run(o, *resume);
        o.opt.check();
        if (o.batch_size <= 0 || o.seq_len <= 0 || o.seq_len > model_seq_len) {
            fatal("the saved run's rows (%d x %d tokens) do not fit the model's context %d", o.batch_size, o.seq_len,
                  model_seq_len);
        }
    }
    o.global_batch = o.grad_accum * o.batch_size;
    if (o.steps < 0) { fatal("--steps must be >= 0"); }
    if (o.steps == 0 && o.init_from.empty() && !o.model_loaded) {
        fatal("--steps 0 evaluates a model: it needs --init-from CKPT");
    }
    if (o.steps > 0 && o.train_data.empty()) { fatal("--train-data is required (e.g. \"data/offline/synth/synth_train_*.bin\"; make demo builds it)"); }
    if (o.milestones != 0 && o.steps > 0 && o.checkpoint_dir.empty()) {
        fatal("--milestones 1 needs --checkpoint-dir (--paper-setup 1 turns milestones on; --milestones 0 turns them off)");
    }
    if (o.spike_window < 2) { fatal("--spike-window must be >= 2, got %d", o.spike_window); }
    if (o.steps > 0) { o.opt.schedule.check(o.steps); }
}

// ---- model flags against a checkpoint -------------------------------------------------------
// With --resume or --init-from the model config comes from the file; model flags given (or
// a --preset) that say otherwise are an error naming them. `from_flags`: the options as the
// flags would have made them without the checkpoint; the trainer's make_flags lists the
// flags; `model_from_file`: the checkpoint's config. `vocab_flag`: the flags that set the
// vocabulary size besides --vocab-size (--tokenizer sets it too).
template <typename Options, typename Config, typename MakeFlags>
void check_model_flags(const Options& from_flags, const Config& model_from_file, MakeFlags make_flags,
                       const std::string& path) {
    const std::set<std::string>& given = from_flags.train.given;
    Options a = from_flags, b = from_flags;
    b.model = model_from_file;
    std::vector<Flag> fa = make_flags(a), fb = make_flags(b);
    std::vector<std::string> wrong;
    std::string by_preset;
    for (size_t i = 0; i < fa.size(); i++) {
        std::string va = fa[i].show(), vb = fb[i].show();
        if (va == vb) { continue; }
        if (given.count(fa[i].name)) {
            wrong.push_back(fa[i].name + " " + va + " (the checkpoint's " + vb + ")");
        } else if (given.count("--preset")) {
            by_preset += (by_preset.empty() ? "" : ", ") + fa[i].name.substr(2) + " " + va + " (the checkpoint's " + vb + ")";
        }
    }
    if (!by_preset.empty()) { wrong.push_back("--preset " + from_flags.preset + ": " + by_preset); }
    if (wrong.empty()) { return; }
    std::string list;
    for (const std::string& w : wrong) { list += "\n    " + w; }
    fatal("the model comes from the checkpoint %s; these flags contradict it:%s\nLeave them out (the model config is "
          "the file's).", path.c_str(), list.c_str());
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

// `text` (valid UTF-8) as a JSON string literal.
inline std::string json_string(const std::string& text) {
    std::string out = "\"";
    for (unsigned char c : text) {
        if (c == '"' || c == '\\') {
            out += '\\';
            out += (char)c;
        } else if (c < 0x20) {
            char buf[8];
            snprintf(buf, sizeof(buf), "\\u%04x", c);
            out += buf;
        } else {
            out += (char)c;
        }
    }
    return out + "\"";
}

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

// "N shards, M tokens (first .. last)" of a loader's files, for the start-of-run summary.
inline std::string describe_data(const DataLoader& d) {
    int64_t tokens = 0;
    for (const ShardInfo& s : d.shards()) { tokens += s.ntok; }
    auto base = [](const std::string& p) { return p.substr(p.find_last_of('/') + 1); };
    const std::vector<ShardInfo>& sh = d.shards();
    std::string out = std::to_string(sh.size()) + (sh.size() == 1 ? " shard, " : " shards, ") +
                      std::to_string(tokens) + " tokens (" + base(sh.front().path);
    if (sh.size() > 1) { out += " .. " + base(sh.back().path); }
    return out + ")";
}
inline int64_t data_tokens(const DataLoader& d) {
    int64_t tokens = 0;
    for (const ShardInfo& s : d.shards()) { tokens += s.ntok; }
    return tokens;
}

// Whether two paths name the same existing file.
inline bool same_file(const std::string& a, const std::string& b) {
    struct stat sa, sb;
    return stat(a.c_str(), &sa) == 0 && stat(b.c_str(), &sb) == 0 && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

// Why a resumed data loader would not continue where the saved run left off, named from
// the keys the checkpoint holds ("" when nothing differs that they show).
inline std::string data_difference(const TensorFileReader& ckpt, const DataLoader& d, const TrainOptions& o) {
    std::string why;
    auto differs = [&](const char* key, long long now, const char* what) {
        if (ckpt.has_key(key) && ckpt.integer(key) != now) {
            why += std::string(why.empty() ? "" : "; ") + what + " " + std::to_string(now) + " now, " +
                   std::to_string(ckpt.integer(key)) + " when saved";
        }
    };
    differs("resume.data_shards", (long long)d.num_shards(), "training shards:");
    differs("resume.data_tokens", (long long)data_tokens(d), "training tokens:");
    differs("run.seq_len", o.seq_len, "--seq-len");
    differs("run.batch_size", o.batch_size, "--batch-size");
    differs("run.shuffle", o.shuffle, "--shuffle");
    if (o.shuffle) { differs("run.seed", (long long)o.seed, "--seed (the shuffle order)"); }
    return why;
}

template <typename Model>
void run_training(Model& model, const TrainOptions& o, const Tokenizer& tokenizer, const TensorFileReader* checkpoint,
                  int vocab_size, int doc_start_token, int bos_id, double flops_per_token) {
    const std::string start_file = start_checkpoint(o);
    DataLoaderConfig train_cfg;
    train_cfg.pattern = o.train_data;
    train_cfg.B = o.batch_size;
    train_cfg.T = o.seq_len;
    train_cfg.shuffle = o.shuffle != 0;
    train_cfg.seed = o.seed;
    train_cfg.doc_start_token = doc_start_token;
    train_cfg.vocab_size = vocab_size;
    std::unique_ptr<DataLoader> train_loader;  // none when only evaluating (--steps 0)
    if (o.steps > 0) {
        train_loader = std::make_unique<DataLoader>(train_cfg);
        printf("train data: %s\n", describe_data(*train_loader).c_str());
    }
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
        printf("val data:   %s; %lld batches of %d x %d\n", describe_data(*val).c_str(),
               (long long)val->steps_per_epoch(), o.batch_size, o.seq_len);
        if (train_loader != nullptr) {
            for (const ShardInfo& v : val->shards()) {
                for (const ShardInfo& t : train_loader->shards()) {
                    if (same_file(v.path, t.path)) {
                        printf("warning: %s is in both the training and the validation data: the validation loss "
                               "is not held out\n", v.path.c_str());
                    }
                }
            }
        }
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
    if (!o.checkpoint_dir.empty() && !start_file.empty() && o.steps > 0) {
        // every file this run will write (after the steps already done); none may be the
        // one it started from
        const long done = (long)model.steps_done();
        std::vector<std::string> names = {"final.bin"};
        for (long s = o.save_every; o.save_every > 0 && s < o.steps; s += o.save_every) {
            if (s > done) { names.push_back("step_" + std::to_string(s) + ".bin"); }
        }
        for (const auto& m : milestone_steps(o.steps)) {
            char name[32];
            snprintf(name, sizeof(name), "milestone_%03d.bin", m.first);
            if (o.milestones && (m.second > done || (m.second == 0 && done == 0))) { names.push_back(name); }
        }
        for (const std::string& n : names) {
            std::string path = o.checkpoint_dir + "/" + n;
            if (same_file(path, start_file)) {
                fatal("--checkpoint-dir %s: this run would write %s over the checkpoint it starts from (%s); give "
                      "another --checkpoint-dir", o.checkpoint_dir.c_str(), path.c_str(), start_file.c_str());
            }
        }
    }
    std::mt19937_64 rng(o.seed);
    if (checkpoint != nullptr) {
        std::string why = data_difference(*checkpoint, *train_loader, o);
        if (!why.empty()) {
            fatal("--resume %s: the data would not continue where the saved run left off: %s", checkpoint->path().c_str(),
                  why.c_str());
        }
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
        std::vector<std::pair<std::string, std::string>> extra = run_setting_keys(o);
        extra.insert(extra.end(), {{"resume.data_epoch", std::to_string(pos.epoch)},
                                   {"resume.data_step", std::to_string(pos.step)},
                                   {"resume.data_fingerprint", std::to_string(pos.fingerprint)},
                                   {"resume.data_shards", std::to_string(train_loader->num_shards())},
                                   {"resume.data_tokens", std::to_string(data_tokens(*train_loader))},
                                   {"resume.rng_seed", std::to_string(rng_seed)}});
        model.save_checkpoint(path, o.opt, extra);
        printf("saved %s\n", path.c_str());
    };
    // the sample's start: BOS, then the --prompt encoded with the tokenizer
    std::vector<int> sample_start = {bos_id};
    if (!o.prompt.empty()) {
        if (!tokenizer.loaded()) { fatal("--prompt needs --tokenizer (the file that encodes it)"); }
        std::vector<int> p = tokenizer.encode(o.prompt);
        sample_start.insert(sample_start.end(), p.begin(), p.end());
        printf("prompt: %zu tokens:", p.size());
        for (int id : p) { printf(" %d", id); }
        printf("\n");
    }
    auto print_sample = [&](long step) {
        if (o.sample_tokens <= 0) { return; }
        std::vector<int> out = model.sample(sample_start, o.sample_tokens, o.temperature, rng, o.kv_cache != 0);
        std::string text;
        if (tokenizer.loaded()) {
            text = complete_utf8(tokenizer.decode(out));  // a partial character at the end is held back
        } else {
            for (int t : out) { text += std::to_string(t) + " "; }
        }
        printf("sample: %s\n", text.c_str());
        if (log != nullptr) {
            fprintf(log, "{\"step\": %ld, \"sample\": %s}\n", step, json_string(text).c_str());
            fflush(log);
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
    // the eval sets (llmc/eval_scoring.h): one {"step", "eval"} record per scoring
    EvalSuite evals;
    if (o.eval_every < 0) { fatal("option --eval-every: must be >= 0, not %d", o.eval_every); }
    if (o.eval_every > 0 && o.eval_sets.empty()) { fatal("--eval-every %d: no --eval-sets to score", o.eval_every); }
    if (!o.eval_sets.empty()) { evals.load(o.eval_sets, vocab_size); }
    auto score_evals = [&](long step) {
        if (evals.empty()) { return; }
        std::string results = evals.score(model, step, o.batch_size, o.seq_len, vocab_size, model.cfg.padded_vocab());
        if (log != nullptr) {
            fprintf(log, "{\"step\": %ld, \"eval\": %s}\n", step, results.c_str());
            fflush(log);
        }
    };
    if (o.steps == 0) {  // evaluate the model given with --init-from
        validate(model.steps_done());
        score_evals(model.steps_done());
        print_sample(model.steps_done());
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
        if (o.eval_every > 0 && done % o.eval_every == 0 && done != o.steps) { score_evals(done); }
        if (o.sample_every > 0 && done % o.sample_every == 0 && done != o.steps) { print_sample(done); }
        if (o.save_every > 0 && done % o.save_every == 0 && done != o.steps) { save("step_" + std::to_string(done) + ".bin"); }
        save_milestones(done);
    }
    validate(o.steps);
    score_evals(o.steps);
    print_sample(o.steps);
    save("final.bin");
    if (log != nullptr) { fclose(log); }
}
