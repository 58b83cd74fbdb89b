/*
The skeleton of a trainer's main, what train_san.cu and train_gpt2.cu do alike, so that a
trainer file holds its model and little else. trainer_main<Trainer>(argc, argv, name, presets(),
make_flags, read_config) parses the flags over a preset, takes the model config from a checkpoint
or a tokenizer, checks the options and every input file before printing anything about the model,
prints the run's summary, then builds the model and trains (llmc/train/training.h run_training).
A trainer describes its model with a struct (train_san.cu SANTrainer, train_gpt2.cu GPT2Trainer)
whose members are listed at trainer_main. What a run does and refuses: doc/trainer.md.
*/
#pragma once

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cmath>
#include <cstring>
#include <ctime>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "llmc/kernels/attention.cuh"
#include "llmc/cli.h"
#include "llmc/config_file.h"
#include "llmc/model/model.h"
#include "llmc/train/input_files.h"  // defines: check_start_files, check_run_files
#include "llmc/train/resume.h"
#include "llmc/data/tensor_file.h"
#include "llmc/data/tokenizer.h"
#include "llmc/train/train_options.h"
#include "llmc/train/training.h"
#include "llmc/utils.h"

// Checks the options against the model's context; resolves the gradient accumulation
// and the model's default rates; with a checkpoint to resume, continues its run.
inline void check_training_options(TrainOptions& o, int model_seq_len, const DefaultRates& rates,
                                   const TensorFileReader* resume = nullptr) {
    if (o.seq_len == 0) { o.seq_len = model_seq_len; }
    o.opt.check();
    if (o.val_whole_docs < 0 || o.val_whole_docs > 2) { fatal("--val-whole-docs must be 0, 1 or 2, got %d", o.val_whole_docs); }
    if (o.train_doc_eval < 0) { fatal("--train-doc-eval must be >= 0 (training documents to evaluate; 0: none), got %d", o.train_doc_eval); }
    o.rates_source = o.opt.lr < 0 ? rates.source : "";
    o.opt.resolve_rates(rates, o.lr_scale_gpus);
    if (o.batch_size <= 0 || o.seq_len <= 0 || o.seq_len > model_seq_len) {
        fatal("--batch-size must be > 0 and 0 < --seq-len <= %d", model_seq_len);
    }
    if (o.grad_accum < 0 || o.global_batch < 0) { fatal("--grad-accum and --global-batch must be >= 0"); }
    if (o.zero != 0 && o.zero != 1) { fatal("--zero must be 0 or 1, got %d", o.zero); }
    if (o.overlap_reduce != 0 && o.overlap_reduce != 1) { fatal("--overlap-reduce must be 0 or 1, got %d", o.overlap_reduce); }
    if (o.verify_data != 0 && o.verify_data != 1) { fatal("--verify-data must be 0 or 1, got %d", o.verify_data); }
    if (o.global_batch > 0) {  // rows per optimizer step over micro-batches and ranks
        const int rows = o.batch_size * o.world;
        if (o.global_batch % rows != 0) {
            fatal("--global-batch %d is not a multiple of --batch-size %d x %d ranks", o.global_batch, o.batch_size,
                  o.world);
        }
        int accum = o.global_batch / rows;
        if (o.grad_accum != 0 && o.grad_accum != accum) {
            fatal("--grad-accum %d contradicts --global-batch %d / (--batch-size %d x %d ranks) = %d micro-batches",
                  o.grad_accum, o.global_batch, o.batch_size, o.world, accum);
        }
        o.grad_accum = accum;
    }
    if (o.grad_accum == 0) { o.grad_accum = 1; }
    if (o.eval_every < 0) { fatal("option --eval-every: must be >= 0, not %d", o.eval_every); }
    if (o.indicator_context < 0) { fatal("option --indicator-context: must be >= 0 (0: the training context --seq-len), not %d", o.indicator_context); }
    if (o.eval_every > 0 && o.eval_sets.empty()) { fatal("--eval-every %d: no --eval-sets to score", o.eval_every); }
    if (o.extend_to != 0 && resume == nullptr) { fatal("--extend-to needs --resume CKPT (the run to extend)"); }
    if (o.resume_override != 0 && resume == nullptr) { fatal("--resume-override needs --resume CKPT"); }
    if (resume != nullptr) {
        if (o.steps == 0 && o.given.count("--steps")) { fatal("--steps 0 evaluates a model: use --init-from CKPT, not --resume"); }
        continue_saved_run(o, *resume);
        o.rates_source.clear();  // the saved run's rates
        check_build_precision(*resume, true, o.resume_override);
        o.opt.check();
        continue_on_ranks(o, *resume);
        if (o.batch_size <= 0 || o.seq_len <= 0 || o.seq_len > model_seq_len) {
            fatal("the saved run's rows (%d x %d tokens) do not fit the model's context %d", o.batch_size, o.seq_len,
                  model_seq_len);
        }
    }
    o.grad_groups = checked_grad_groups(o.grad_groups, o.world, o.batch_size);
    o.global_batch = o.grad_accum * o.batch_size * o.world;
    if (o.steps < 0) { fatal("--steps must be >= 0"); }
    if (o.steps == 0 && o.init_from.empty() && !o.model_loaded) {
        fatal("--steps 0 evaluates a model: it needs --init-from CKPT");
    }
    if (o.train_doc_eval > 0 && (o.train_data.empty() || o.val_data.empty())) {
        fatal("--train-doc-eval %d evaluates documents of --train-data at each validation: it needs --train-data and --val-data",
              o.train_doc_eval);
    }
    if (o.steps > 0 && o.train_data.empty()) { fatal("--train-data is required (e.g. \"data/offline/synth/synth_train_*.bin\"; make demo builds it)"); }
    if (o.milestones != 0 && o.steps > 0 && o.checkpoint_dir.empty()) {
        fatal("--milestones 1 needs --checkpoint-dir (--paper-setup 1 turns milestones on; --milestones 0 turns them off)");
    }
    if (o.overwrite != 0 && o.overwrite != 1) { fatal("--overwrite must be 0 or 1, got %d", o.overwrite); }
    if (o.check_tokenizer != 0 && o.check_tokenizer != 1) { fatal("--check-tokenizer must be 0 or 1, got %d", o.check_tokenizer); }
    if (o.spike_window < 2) { fatal("--spike-window must be >= 2, got %d", o.spike_window); }
    if (!(o.spike_guard == 0.0 || o.spike_guard > 1.0)) {
        fatal("--spike-guard must be 0 (off) or a factor > 1, got %g", o.spike_guard);
    }
    if (o.steps > 0) { o.opt.schedule.check(o.steps); }
    o.eval_contexts = parse_eval_contexts(o.eval_context, o.seq_len);  // (after a resume has set --seq-len)
    if (!o.eval_contexts.empty() && o.eval_sets.empty()) { fatal("--eval-context %s: no --eval-sets to score", o.eval_context.c_str()); }
}


// The run directory (--run-dir; llmc/train/run_record.h): auto names a fresh one,
// runs/<preset>-<arm>-<UTC time>, for a run that gives neither --checkpoint-dir nor --log and
// does not resume (a resume keeps the saved run's outputs) and trains (an evaluation, --steps 0,
// writes none unless --run-dir names one); the checkpoints and the log go there unless those
// flags say otherwise. Every rank takes rank 0's name. Nothing is created
// here (TrainingRun does, once the run's inputs are checked).
inline void choose_run_dir(TrainOptions& t, const std::string& preset, const std::string& arm, bool resuming,
                           const Comm& comm) {
    if (t.run_dir == "auto") {
        const bool outputs_given = t.given.count("--checkpoint-dir") || t.given.count("--log");
        t.run_dir.clear();
        if (!resuming && !outputs_given && t.steps != 0) {
            char name[1024] = {0};
            if (comm.is_main()) { snprintf(name, sizeof(name), "%s", new_run_dir_name(preset, arm, time(nullptr)).c_str()); }
            comm.broadcast_host(name, sizeof(name), 0);
            t.run_dir = name;
        }
    }
    if (t.run_dir.empty()) { return; }
    // (a resume into another --run-dir writes there: as if the flags were given, to which a saved
    // run's outputs give way)
    auto taken = [&](const char* flag) {
        if (resuming) { t.given.insert(flag); } else { t.outputs_from_run_dir.insert(flag); }
    };
    if (!t.given.count("--checkpoint-dir")) {
        t.checkpoint_dir = t.run_dir;
        taken("--checkpoint-dir");
    }
    if (!t.given.count("--log")) {
        t.log_path = t.run_dir + "/log.jsonl";
        taken("--log");
    }
}

// The command line as a POSIX shell would take it back.
inline std::string command_line_text(int argc, char** argv) {
    std::string out;
    for (int i = 0; i < argc; i++) { out += (i > 0 ? " " : "") + shell_word(argv[i]); }
    return out;
}

// What the run says about itself (TrainOptions::record: the log's first record, the run.*
// checkpoint keys, the run directory's config): the command, every flag's resolved value,
// the rates used, the host and the start time. The config's rates are the peak rates before
// --lr-scale-gpus (`unscaled`: resolved from the flags; a resumed run's: the saved rates over
// the scale), so that the file, read back, trains at the rates this run used. Flags that
// belong to one invocation (--config, --resume, --run-dir, ...) and outputs the run directory
// chose are left out.
inline void describe_run(TrainOptions& t, const std::vector<Flag>& flags, const OptimizerConfig& unscaled, bool resuming,
                         const char* program, int argc, char** argv, const Comm& comm) {
    std::set<std::string> skip = {"--config", "--print-config", "--run-dir", "--resume", "--resume-override", "--extend-to"};
    skip.insert(t.outputs_from_run_dir.begin(), t.outputs_from_run_dir.end());
    RunRecord& r = t.record;
    r.program = program;
    r.command = command_line_text(argc, argv);
    r.config_file = t.config_path;
    r.settings = flag_settings(flags, skip);
    const double scale_matrix = t.opt.is_muon() ? std::sqrt((double)t.lr_scale_gpus) : (double)t.lr_scale_gpus;
    for (auto& [key, value] : r.settings) {
        if (key == "lr") { value = shortest_real_text(resuming ? t.opt.lr / scale_matrix : unscaled.lr); }
        if (key == "lr-other") { value = shortest_real_text(resuming ? t.opt.lr_other / t.lr_scale_gpus : unscaled.lr_other); }
    }
    r.training = t.steps > 0;
    r.optimizer = t.opt.name();
    r.lr = t.opt.lr;
    r.lr_other = t.opt.lr_other;
    r.rates_source = t.rates_source;
    r.started = utc_time_text(time(nullptr));
    r.host = host_name();
    r.run_dir = t.run_dir;
    r.ranks = comm.world;
    if (r.id.empty()) {  // (a resume keeps the saved run's: continue_saved_run; every rank takes rank 0's)
        char id[32] = {0};
        if (comm.is_main()) { snprintf(id, sizeof(id), "%s", new_run_id().c_str()); }
        comm.broadcast_host(id, sizeof(id), 0);
        r.id = id;
    }
}

// --print-config: the rates of each parameter group and the data each pattern matches.
inline void print_rates_and_data(const TrainOptions& t) {
    if (t.steps > 0) {
        printf("rates: matrices %g (%s), embeddings/gains/gates/biases %g (adamw)%s\n", t.opt.lr, t.opt.name(),
               t.opt.lr_other, t.lr_scale_gpus != 1 ? " (after --lr-scale-gpus)" : "");
    }
    auto describe = [](const char* flag, const std::string& patterns) {
        if (patterns.empty()) {
            printf("%s: none\n", flag);
            return std::vector<std::string>();
        }
        std::vector<std::string> files = glob_shards(patterns, flag);
        int64_t tokens = 0;
        int with_regions = 0;
        for (const std::string& f : files) {
            ShardInfo s = inspect_shard(f);
            tokens += s.ntok;
            with_regions += !s.regions_path.empty();
        }
        printf("%s: %zu file%s, %" PRId64 " tokens (%s%s)%s\n", flag, files.size(), files.size() == 1 ? "" : "s", tokens,
               files.front().c_str(), files.size() > 1 ? (" .. " + files.back()).c_str() : "",
               with_regions > 0 ? ", with region sidecars" : "");
        return files;
    };
    const std::vector<std::string> train = t.steps > 0 ? describe("--train-data", t.train_data) : std::vector<std::string>();
    for (const std::string& v : describe("--val-data", t.val_data)) {  // (as the run warns: training.h)
        for (const std::string& f : train) {
            if (same_file(v, f)) {
                printf("warning: %s is in both the training and the validation data: the validation loss is not held "
                       "out\n", v.c_str());
            }
        }
    }
    if (!t.eval_sets.empty()) { printf("--eval-sets: %s\n", t.eval_sets.c_str()); }
    printf("run directory: %s (--print-config writes nothing)\n",
           t.run_dir.empty() ? "none" : ("would be " + t.run_dir).c_str());
}

// A parameter count as -h prints it: 41.2K, 124M, 1.72B.
inline std::string short_count(int64_t n) {
    char text[32];
    if (n < 1000) {
        snprintf(text, sizeof(text), "%" PRId64, n);
    } else if (n < 1000000) {
        snprintf(text, sizeof(text), "%.1fK", n / 1e3);
    } else if (n < 1000000000) {
        snprintf(text, sizeof(text), n < 10000000 ? "%.2fM" : "%.0fM", n / 1e6);
    } else {
        snprintf(text, sizeof(text), "%.2fB", n / 1e9);
    }
    return text;
}

// The presets as -h lists them, smallest first: each one's layers, width, vocabulary,
// parameters (count_parameters: the padded vocabulary's embedding rows included) and default
// peak rates (Trainer::default_rates), with where they come from; `with_muon`: the trainer has
// Muon, so a Muon rate column.
template <typename Trainer, typename Config>
std::string preset_sizes(const std::map<std::string, Config>& presets, bool with_muon) {
    std::vector<std::pair<int64_t, std::string>> rows;  // {parameters, line}
    int name_width = (int)strlen("preset");
    for (const auto& kv : presets) { name_width = std::max(name_width, (int)kv.first.size()); }
    char line[512], muon[32] = "";
    for (const auto& [name, preset] : presets) {
        Config c = preset;
        c.resolve_and_check();
        const int64_t total = count_parameters(c).total;
        const DefaultRates rates = Trainer::default_rates(c);
        if (with_muon) { snprintf(muon, sizeof(muon), " %7g %7g", rates.muon, rates.muon_other); }
        snprintf(line, sizeof(line), "  %-*s %6d %6d %7d %10s%s %8g  %s\n", name_width, name.c_str(), c.n_layer, c.n_embd,
                 c.vocab_size, short_count(total).c_str(), muon, rates.adamw, rates.source.c_str());
        rows.push_back({total, line});
    }
    std::stable_sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    snprintf(line, sizeof(line), "  %-*s %6s %6s %7s %10s%s %8s  %s\n", name_width, "preset", "layers", "width", "vocab",
             "parameters", with_muon ? " muon lr   other" : "", "adamw lr", "default rates from");
    std::string out = "presets: parameters at the preset's vocabulary (--tokenizer changes it), and default peak rates per\n"
                      "device at that vocabulary (--lr overrides them";
    out += with_muon ? "; \"other\": the AdamW rate of the non-matrix group under Muon, --lr-other):\n" : "):\n";
    out += line;
    for (const auto& row : rows) { out += row.second; }
    return out;
}

// Trainer::configure_model(model, o) where the trainer has one.
template <typename Trainer, typename Model, typename Options>
auto configure_model_if_any(Model& model, Options& o, int) -> decltype(Trainer::configure_model(model, o)) {
    return Trainer::configure_model(model, o);
}
template <typename Trainer, typename Model, typename Options>
void configure_model_if_any(Model&, Options&, long) {}

// Step 1 of trainer_main: the flags, over the --config file's settings and a preset's model
// config (llmc/cli.h parse_with_preset), with the checks that need no file.
template <typename Trainer, typename Options, typename Config>
Options parse_trainer_options(int argc, char** argv, const char* name, const std::map<std::string, Config>& presets,
                              std::vector<Flag> (*make_flags)(Options&)) {
    // --config FILE: its settings go before the command line's flags, which win (llmc/config_file.h)
    CommandLine args = with_config_file(argc, argv);
    bool has_muon = false;  // the trainer offers Muon (-h's preset table shows its rate)
    {
        Options probe;
        const std::vector<Flag> flags = make_flags(probe);
        check_config_keys(args, flags);
        for (const Flag& f : flags) { has_muon |= f.name == "--muon-order"; }
    }
    const int n_words = args.argc();
    char** words = args.argv();
    Options o = parse_with_preset<Options>(n_words, words, presets, make_flags, name,
                                           [&](Options& opts) { Trainer::set_defaults(opts, n_words, words); },
                                           help_asked(n_words, words) ? preset_sizes<Trainer>(presets, has_muon) : std::string());
    TrainOptions& t = o.train;
    t.program = argv[0];
    t.config_path = args.config_path;
    if (t.print_config != 0 && t.print_config != 1) { fatal("--print-config must be 0 or 1, got %d", t.print_config); }
    if (t.keep_last < 0) { fatal("--keep-last must be >= 0 (0: keep every checkpoint), got %d", t.keep_last); }
    if (!(t.save_minutes >= 0.0) || !std::isfinite(t.save_minutes)) {
        fatal("--save-minutes must be >= 0 (0: no timed checkpoints), got %g", t.save_minutes);
    }
    if (!(t.stop_grace >= 0.0) || !std::isfinite(t.stop_grace)) { fatal("--stop-grace must be >= 0 seconds, got %g", t.stop_grace); }
    if (!t.resume_path.empty()) {  // --resume DIR, --resume auto: the newest checkpoint there
        t.resume_path = resolve_resume_path(t.resume_path, t.given.count("--run-dir") && t.run_dir != "auto" ? t.run_dir : "");
    }
    return o;
}

// What a run starts from: the tokenizer and the checkpoint of --resume or --init-from.
struct StartFiles {
    std::string checkpoint_path;  // empty: a fresh model
    std::unique_ptr<TensorFileReader> checkpoint;
    Tokenizer tokenizer;
    // until training starts, an error names the checkpoint the run starts from (a value read
    // from it may fail a check written for the flag that sets it)
    std::unique_ptr<FatalContext> context;
    const TensorFileReader* resume(const TrainOptions& t) const { return t.resume_path.empty() ? nullptr : checkpoint.get(); }
};

// Step 2: open the start files and settle the model config: a checkpoint's (model flags that
// contradict it are refused), else the flags' with the tokenizer's vocabulary and BOS id.
template <typename Trainer, typename Options, typename Config>
void open_start_files(Options& o, StartFiles& start, std::vector<Flag> (*make_flags)(Options&),
                      Config (*read_config)(const TensorFileReader&)) {
    TrainOptions& t = o.train;
    start.checkpoint_path = start_checkpoint(t);
    check_start_files(t);  // every path is checked before the model is printed (and check_run_files)
    Tokenizer& tokenizer = start.tokenizer;
    if (!t.tokenizer_path.empty()) {
        FatalContext reading("--tokenizer", "--tokenizer");
        tokenizer.load(t.tokenizer_path);
    }
    const bool bos_given = t.given.count("--bos-id") != 0;
    const bool elsewhere = Trainer::start_elsewhere(o, bos_given);
    const std::string& path = start.checkpoint_path;
    if (!path.empty()) {
        start.context = std::make_unique<FatalContext>((t.resume_path.empty() ? "the model of " : "resuming ") + path, path);
        {
            const char* flag = t.resume_path.empty() ? "--init-from" : "--resume";
            FatalContext reading(flag, flag);
            start.checkpoint = std::make_unique<TensorFileReader>(path, TENSOR_FILE_CHECKPOINT);
        }
        Config from_file = read_config(*start.checkpoint);
        Options from_flags = o;  // what the flags say, where the tokenizer would have set nothing
        if (tokenizer.loaded() && !t.given.count("--vocab-size")) { from_flags.model.vocab_size = from_file.vocab_size; }
        if (tokenizer.loaded() && !bos_given) { from_flags.model.bos_id = from_file.bos_id; }
        from_flags.model.resolve_and_check();
        check_model_flags(from_flags, from_file, make_flags, path);
        if (tokenizer.loaded() && tokenizer.vocab_size != from_file.vocab_size) {
            fatal("--tokenizer %s has a vocabulary of %d; the model in %s has %d", t.tokenizer_path.c_str(),
                  tokenizer.vocab_size, path.c_str(), from_file.vocab_size);
        }
        o.model = from_file;
    } else if (!elsewhere && tokenizer.loaded()) {
        o.model.vocab_size = tokenizer.vocab_size;
        if (tokenizer.bos_id >= 0 && !bos_given) { o.model.bos_id = tokenizer.bos_id; }
    }
    o.model.resolve_and_check();
}

// A resume without --tokenizer loads the saved run's.
inline void load_saved_tokenizer(const TrainOptions& t, StartFiles& start, int model_vocab_size) {
    if (t.tokenizer_path.empty() || start.tokenizer.loaded()) { return; }
    const std::string saved = "--tokenizer (saved in " + start.checkpoint_path + ")";
    check_input_file(saved, t.tokenizer_path);
    FatalContext reading(saved, start.checkpoint_path);
    start.tokenizer.load(t.tokenizer_path);
    if (start.tokenizer.vocab_size != model_vocab_size) {
        fatal("--tokenizer %s (the saved run's) has a vocabulary of %d; the model has %d", t.tokenizer_path.c_str(),
              start.tokenizer.vocab_size, model_vocab_size);
    }
}

// --cudnn, --attention-kernels and --sync-check: the process-wide kernel switches.
template <typename Config>
void set_kernel_switches(const TrainOptions& t, const Config& c) {
    card_warn_once(PRECISION_MODE == PrecisionMode::BF16);  // a card or build without bf16 tensor cores (llmc/card_check.h)
    // (a run whose every attention call would run our kernels must not be logged as a cuDNN run)
    if (t.cudnn != 0 && config_doc_mask(c)) {
        fatal("--cudnn 1: cuDNN attention has no same-document mask, and this model has --doc-mask 1 (every "
              "attention call would run our kernels): pass --doc-mask 0 to train on cuDNN, or leave out --cudnn");
    }
    if (t.cudnn != 0 && c.head_dim() % 8 != 0) {
        fatal("--cudnn 1: cuDNN attention takes head dims that are multiples of 8; this model's is %d", c.head_dim());
    }
    if (t.cudnn != 0 && !kAttentionHasCudnn) {
        fatal("--cudnn 1: this build has no cuDNN attention (it needs a bf16 GPU build with USE_CUDNN=1)");
    }
    attention_prefer_cudnn() = t.cudnn != 0;
    if (t.attention_kernels == AttentionKernels::TensorCores && PRECISION_MODE != PrecisionMode::BF16) {
        fatal("--attention-kernels tensor-cores: the tensor-core attention needs a bf16 build (this one is %s)",
              PRECISION_NAME);
    }
    if (t.attention_kernels != AttentionKernels::Auto) {
        attention_tensor_cores() = t.attention_kernels == AttentionKernels::TensorCores;
    }
    if (t.sync_check != 0) { sync_check() = true; }
    if (sync_check()) { printf("sync check: on (every kernel launch waits and reports a fault by kernel name)\n"); }
}

// Step 4: the start-of-run summary: the build, the model, its size and the training (or the
// evaluation) to come. Fills the run record's model facts on the way.
template <typename Trainer, typename Options>
void print_run_summary(Options& o, const char* name, const StartFiles& start) {
    const TrainOptions& t = o.train;
    const ParameterCounts counts = count_parameters(o.model);
    RunRecord& record = o.train.record;
    record.parameters = counts.total;
    record.non_embedding = counts.non_embedding;
    record.flops_per_token = flops_per_token(o.model);
    if (t.steps == 0 && !t.init_from.empty()) {
        record.evaluated = t.init_from;
        record.evaluated_step = (long)start.checkpoint->integer("step");
    }
    if (t.print_config) {
        printf("%s", config_text(record.settings, {name + std::string(": the resolved config (--config FILE reads this format)")}).c_str());
    }
    printf("%s (%s, %s, %s attention kernels; GEMM: %s)\n", name, HOST_BACKEND ? "host backend" : "GPU", PRECISION_NAME,
           attention_kernels_of(o.model), gemm_backend_name().c_str());
    Trainer::print_model(o);
    printf("parameters: %" PRId64 " total, %" PRId64 " non-embedding; %.2f MFLOPs/token\n", counts.total,
           counts.non_embedding, record.flops_per_token / 1e6);
    if (t.steps > 0) {
        printf("training: %ld steps of %d x %d tokens\n", t.steps, t.global_batch, t.seq_len);
        print_optimizer(t);
    } else {  // an evaluation: no optimizer, no schedule
        printf("evaluation: %s%s; no training\n", record.evaluated.empty() ? "the model given" : ("the model of " + record.evaluated).c_str(),
               record.evaluated.empty() ? "" : (" after " + std::to_string(record.evaluated_step) + " steps").c_str());
    }
}

// A trainer's main, in five steps: (1) parse the flags over a preset (llmc/cli.h); (2) take the
// model config from a --resume or --init-from checkpoint (contradicting flags refused:
// llmc/train/resume.h) or a --tokenizer's vocabulary; (3) check the options, then every input
// file, before anything about the model is printed; (4) print the config, counts and optimizer;
// (5) build, initialise or load, and train (llmc/train/training.h run_training).
// Its arguments: the program name, the named model configs, its flags (the model's, then
// add_training_flags; Options holds `preset`, `model` (a Config) and `train` (TrainOptions)) and
// the reader of a checkpoint's config. The trainer describes the rest with a struct:
//     Model                      the model type (llmc/model/model.h LanguageModel<Config>)
//     set_defaults(o, argc, argv)      switches read before the other flags (--paper-setup)
//     start_elsewhere(o, bos_given)    a model from a file other than a checkpoint (GPT-2's
//                                      --init-from-llmc) into o.model; returns whether there is one
//     default_rates(cfg)         the model's default peak rates (llmc/optim/optimizer.h DefaultRates)
//     print_model(o)             the config lines of the start-of-run summary
//     arm_name(cfg)              the model's kind in a run directory's name (runs/<preset>-<arm>-<time>)
//     init_parameters(model, o)  parameters of a fresh run (seeded init, or the other file's)
// and optionally
//     configure_model(model, o)  run settings that are not model config, once the model is built
//                                (train_san's --skip-nonstandard)
template <typename Trainer, typename Options, typename Config>
int trainer_main(int argc, char** argv, const char* name, const std::map<std::string, Config>& presets,
                 std::vector<Flag> (*make_flags)(Options&), Config (*read_config)(const TensorFileReader&)) {
    setvbuf(stdout, nullptr, _IOLBF, 0);  // progress lines appear at once, also through pipes
    start_stop_signal_thread();  // before any other thread (llmc/train/stop_signal.h)
    Comm comm(&argc, &argv);  // the ranks, when started by mpirun or srun (llmc/parallel/comm.h)
    // rank 0 prints; every rank's errors reach stderr
    if (!comm.is_main() && freopen("/dev/null", "w", stdout) == nullptr) { fatal("rank %d: cannot silence stdout", comm.rank); }
    Options o = parse_trainer_options<Trainer>(argc, argv, name, presets, make_flags);
    TrainOptions& t = o.train;
    StartFiles start;
    open_start_files<Trainer>(o, start, make_flags, read_config);
    const Config& c = o.model;
    const TensorFileReader* resume = start.resume(t);

    // Step 3: the training options against the model, the run directory, the other input files
    t.world = comm.world;
    choose_run_dir(t, o.preset, Trainer::arm_name(c), resume != nullptr, comm);
    OptimizerConfig unscaled = t.opt;  // the rates as the config file writes them (before --lr-scale-gpus)
    const DefaultRates rates = Trainer::default_rates(c);
    unscaled.resolve_rates(rates, 1);
    check_training_options(t, c.seq_len, rates, resume);
    load_saved_tokenizer(t, start, c.vocab_size);
    set_kernel_switches(t, c);
    check_run_files(t);
    const TokenizerRecord tokens = check_data_tokenizers(t, start.tokenizer, start.checkpoint.get(),
                                                         t.resume_path.empty() ? "--init-from" : "--resume");
    if (tokens.present) {  // (the checkpoints record it: an evaluation of them compares its data)
        char hex[16];
        snprintf(hex, sizeof(hex), "%08x", tokens.fingerprint);
        t.record.tokenizer_fingerprint = hex;
    }
    if (!t.init_from.empty()) {
        if (t.steps > 0) {
            printf("init: model config and parameters from %s (saved at step %lld); the optimizer and schedule start "
                   "fresh\n", t.init_from.c_str(), start.checkpoint->integer("step"));
        }
        check_build_precision(*start.checkpoint, false, 0);
    }

    describe_run(t, make_flags(o), unscaled, resume != nullptr, name, argc, argv, comm);
    print_run_summary<Trainer>(o, name, start);
    if (t.print_config) {
        print_rates_and_data(t);
        return 0;
    }

    // Step 5: the model, its optimizer and parameters, and the training
    // (an allocation that fails names the sizes behind it and the flags that shrink them)
    char sizes[320];
    snprintf(sizes, sizeof(sizes), " (allocating the model for --batch-size %d x --seq-len %d; its largest buffer, the "
             "logits, is %.3g GB: rows x positions x vocabulary %d, fp32). Lower --batch-size and raise --grad-accum: "
             "the same rows per step, in more passes", t.batch_size, t.seq_len,
             4.0 * t.batch_size * t.seq_len * c.padded_vocab() / 1e9, c.padded_vocab());
    allocation_hint() = sizes;
    typename Trainer::Model model(c, t.batch_size, t.seq_len);
    model.distribute(comm, t.zero);
    model.build_optimizer(t.opt);
    allocation_hint().clear();
    // rank 0's share (ZeRO-1 splits the state by pieces and whole matrices: ranks differ a little)
    if (t.steps > 0) printf("optimizer state per rank: %.3f MiB (%zu bytes: AdamW moments, Muon momentum, fp32 master weights)\n",
           (double)model.optimizer->state_bytes() / (1 << 20), model.optimizer->state_bytes());
    if (start.checkpoint != nullptr) {
        model.load_parameters(*start.checkpoint, resume != nullptr);
    } else {
        Trainer::init_parameters(model, o);
    }
    configure_model_if_any<Trainer>(model, o, 0);  // (may add to t.record: train_san's skipped layers)
    start.context.reset();
    // (returned, not exit(): the ranks leave MPI together, in ~Comm, after a stop's checkpoint)
    const int status = run_training(model, t, start.tokenizer, resume, &comm);
    OutputLocks::release();  // (the run has written its last: another may write there now)
    return status;
}
