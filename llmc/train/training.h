/*
The training loop shared by the trainers: run_training() (a TrainingRun: its constructor
reads the data and checks where the run will write; its run() is the main loop) trains with
gradient accumulation under the learning-rate schedule, validates (overall and per token
region when the shards have region sidecars; llmc/train/evaluation.h), scores eval sets
(--eval-sets; llmc/train/eval_scoring.h), samples (from BOS or a --prompt; valid UTF-8), logs
and writes checkpoints that resume exactly (model, optimizer, data position and sampling
RNG; doc/formats.md "Resume state"). The options and their
rules are llmc/train/train_options.h and llmc/train/resume.h; main's sequence is llmc/train/trainer.h.

Over several ranks (doc/multi-gpu.md "What each rank does"): each rank reads its rows of every
global and validation batch, the optimizer sums the ranks' gradients (llmc/parallel/data_parallel.h)
in gradient groups that give the same bits on any rank count (llmc/parallel/grad_groups.h), and
every logged number is over all ranks; samples and eval-set scoring run on rank 0 alone (no
collective inside them), which alone writes the log and the checkpoints.

What it asks of the model (besides llmc/model/model.h, which every model gets):
    cfg.vocab_size, cfg.bos_id                 the real vocabulary; the token samples start from
    int doc_start_token()                      the token that starts a document (-1: none)
    bool counts_in_loss(int target)            whether a target enters the loss
    LossStats forward(inputs, targets, B, T, dloss_scale, std::vector<float>* row_losses)
    void backward();  double loss_value(const LossStats&);  double z_loss_coefficient();
    const std::vector<int>& loss_targets()     the last forward's targets, < 0 where masked
    float* logits                              the last forward's (B*T, Vp) fp32 logits (eval sets)
    zero_grad(), update(lr_matrix, lr_other), steps_done(), first_nonfinite_tensor(),
    accumulate_in_fp32(), end_micro_batch()    (llmc/model/parameters.h ModelParameters)
and optionally (SAN) the per-layer measurements logged at every validation:
    LayerMeasurements measure(inputs, B, T)
*/
#pragma once

#include <sys/stat.h>

#include <cerrno>
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

#include "llmc/parallel/comm.h"
#include "llmc/cuda_common.h"
#include "llmc/data/dataloader.h"
#include "llmc/kernels/attention.cuh"  // defines: attention_kernels_for
#include "llmc/train/eval_scoring.h"
#include "llmc/train/evaluation.h"
#include "llmc/model/model.h"
#include "llmc/train/resume.h"
#include "llmc/config_file.h"  // defines: config_text
#include "llmc/train/output_lock.h"  // defines: OutputLocks
#include "llmc/train/run_log.h"
#include "llmc/train/run_record.h"
#include "llmc/train/save_clock.h"  // defines: SaveClock
#include "llmc/train/stop_signal.h"  // defines: arm_stop_signals, set_stop_notes, stop_signal, drop_lost_console
#include "llmc/data/tensor_file.h"
#include "llmc/data/tokenizer.h"
#include "llmc/parallel/grad_groups.h"  // defines: GradientGroups
#include "llmc/train/train_options.h"
#include "llmc/utils.h"

// The steps at which milestone checkpoints are written: round(p * steps / 100) for p in
// 0, 25, 50, 75, 100, as {percent, step}.
inline std::vector<std::pair<int, long>> milestone_steps(long steps) {
    std::vector<std::pair<int, long>> out;
    for (int p : {0, 25, 50, 75, 100}) { out.push_back({p, (long)std::floor(p * (double)steps / 100.0 + 0.5)}); }
    return out;
}

// The attention kernels a model's calls take (attention_kernels_for), by its head dim and, where
// its config has one (the SAN's), its document mask: what the banner, the log and the checkpoints
// record.
template <typename Config, typename = void>
struct ConfigHasDocMask : std::false_type {};
template <typename Config>
struct ConfigHasDocMask<Config, std::void_t<decltype(Config::doc_mask)>> : std::true_type {};
template <typename Config>
bool config_doc_mask(const Config& c) {
    if constexpr (ConfigHasDocMask<Config>::value) { return c.doc_mask != 0; }
    return false;
}
template <typename Config>
const char* attention_kernels_of(const Config& c) {
    return attention_kernels_for(c.head_dim(), config_doc_mask(c));
}

// One training run of `model` as the options say: the data, the log, the sampling RNG and
// the checkpoints written so far, which the steps, validations, samples and saves share.
// `checkpoint`: the file given with --resume (its data position and RNG are restored; the
// model has already loaded its state), or null. `comm`: the ranks (the model distributed
// over them), or null for one. The constructor reads the data and checks where the run
// will write, before any step; run() trains (or, with --steps 0, evaluates).
template <typename Model>
class TrainingRun {
public:
    TrainingRun(Model& model, const TrainOptions& o, const Tokenizer& tokenizer, const TensorFileReader* checkpoint,
                const Comm* comm)
        : model(model), o(o), tokenizer(tokenizer), checkpoint(checkpoint), comm(comm),
          rank(comm != nullptr ? comm->rank : 0), world(comm != nullptr ? comm->world : 1),
          spikes(o.spike_window, o.spike_z), groups(o.grad_groups, comm), loss_guard(o.spike_guard, o.spike_window),
          val_guard(o.spike_guard, 8) {
        if (world != o.world) { fatal("run_training: %d ranks, but the options were checked for %d", world, o.world); }
        {
            // (on --resume the data settings come from the checkpoint: errors until training starts name it)
            std::unique_ptr<FatalContext> resuming;
            if (checkpoint != nullptr) {
                resuming = std::make_unique<FatalContext>("resuming " + checkpoint->path(), checkpoint->path());
            }
            open_training_data();
            open_validation_data();
            open_train_doc_sample();
            check_start_not_overwritten();
            continue_from_checkpoint();
        }
        encode_prompt();
        read_measure_slice();
        if (!o.eval_sets.empty()) { evals.load(o.eval_sets, model.cfg.vocab_size, o.eval_contexts); }
        // the outputs last, once every input has been read: a run refused for its inputs leaves nothing
        {
            std::unique_ptr<FatalContext> resuming;  // (a resume's output places come from the checkpoint)
            if (checkpoint != nullptr) {
                resuming = std::make_unique<FatalContext>("resuming " + checkpoint->path(), checkpoint->path());
            }
            check_checkpoint_dir();
            lock_outputs();
            remove_unfinished_saves();
            check_log_is_this_runs();
            prepare_run_dir();
            check_earlier_run_kept();
        }
        open_log();
    }
    ~TrainingRun() { close_log(); }
    TrainingRun(const TrainingRun&) = delete;
    TrainingRun& operator=(const TrainingRun&) = delete;

    // The main loop: each step zeroes the gradients, runs the micro-batches' forward and
    // backward passes, updates, logs, and now and then validates, scores the eval sets,
    // samples and saves; a stop signal saves and ends the run. Then the final validation,
    // eval scores, sample and checkpoint. Returns the exit status: 0, or 128 + the stop signal.
    int run() {
        if (o.steps == 0) {  // evaluate the model given with --init-from, logged at the steps it was trained for
            evaluate_and_sample(o.record.evaluated_step);
            print_run_dir();
            return 0;
        }
        begin_steps();
        const auto [first_note, second_note] = stop_notes(first_step + 1);
        set_stop_notes(first_note, second_note);
        for (long step = first_step; step < o.steps; step++) {
            drop_lost_console();  // (its reader gone, the run goes on: llmc/train/stop_signal.h)
            Timer timer;
            model.zero_grad();
            std::vector<double> group_loss(groups.local(), 0.0);  // each group's share of the mean loss
            for (int micro = 0; micro < o.grad_accum; micro++) { micro_batch(micro, group_loss); }
            groups.combine(model);
            const double loss = groups.total(group_loss);
            if (!std::isfinite(loss)) { diverged(step + 1, "the loss", loss); }
            guard(loss_guard, step + 1, "the training loss", loss, "steps");
            double lr_multiplier = o.opt.schedule.multiplier(step, o.steps);
            float grad_norm = model.update(o.opt.lr * lr_multiplier, o.opt.lr_other * lr_multiplier);
            if (!std::isfinite(grad_norm)) { diverged(step + 1, "the gradient norm", grad_norm); }
            cudaCheck(cudaDeviceSynchronize());
            const double ms = timer.ms();
            save_clock.step_s = ms / 1e3;
            const long done = step + 1;
            report_step(done, loss, o.opt.lr * lr_multiplier, grad_norm, ms);
            if (due(o.val_every, done)) { validate(done); }
            if (due(o.eval_every, done)) { score_evals(done); }
            if (due(o.sample_every, done)) { print_sample(done); }
            if (due(o.save_every, done)) { save("step_" + std::to_string(done) + ".bin"); }
            save_milestones(done);
            save_if_time(done);
            if (int status = stop_if_signalled(done)) { return status; }
        }
        if (o.overlap_reduce != 0 && world > 1) {
            printf("gradient reduction: %ld layer buckets started during the backward pass\n", model.optimizer->early_total());
        }
        set_stop_notes("the training is done; the final evaluation and final.bin come first (again: stop at once, "
                       "without final.bin)", "stopped before final.bin; " + lost_since_last_save(o.steps));
        evaluate_and_sample(o.steps);
        save("final.bin");
        if (world > 1 && (int)comm->max(log.failure().empty() ? 0.0 : 1.0) != 0) { stop_for_the_log(o.steps, true); }
        print_summary();
        print_run_dir();  // (the last line, as it names the run directory at the start)
        return 0;
    }

private:
    Model& model;
    const TrainOptions& o;
    const Tokenizer& tokenizer;
    const TensorFileReader* checkpoint;  // the --resume file, or null
    const Comm* comm;                    // null for one rank
    const int rank, world;
    std::unique_ptr<DataLoader> train_loader;      // none when only evaluating (--steps 0)
    std::unique_ptr<DataLoader> val;               // none without --val-data
    std::unique_ptr<DataLoader> val_docs;          // --val-whole-docs 2: whole documents beside the windows
    std::unique_ptr<DataLoader> train_docs;        // --train-doc-eval: the sample of whole training documents
    LogFile log;                                   // rank 0's --log file (llmc/train/run_log.h)
    std::string last_saved;                        // path of the checkpoint written last,
    long last_saved_step = -1;                     // and after how many steps
    std::vector<int> sample_start;                 // BOS, then the --prompt's tokens
    std::vector<int> measure_inputs;               // the per-layer measurements' slice
    int measure_B = 0, measure_T = 0;
    std::vector<int> indicator_inputs;             // --indicator-context: the indicators' own slice (empty: measure_inputs)
    int indicator_B = 0, indicator_T = 0;
    EvalSuite evals;                               // the --eval-sets
    // the steps' running state (begin_steps)
    long first_step = 0;                           // the steps done before this run
    double total_ms = 0.0;                         // the time of this run's steps so far
    double tokens_per_step = 0.0, peak = 0.0, flops = 0.0;
    SpikeDetector spikes;
    GradientGroups groups;                         // --grad-groups: this rank's share of the step's sum
    DivergenceGuard loss_guard, val_guard;         // --spike-guard, on the training and the validation loss
    Timer run_timer;                               // since the run began (the end's summary)
    double last_train_loss = NAN;                  // the last step's training loss
    double last_val_loss = 0.0;                    // the last validation's loss (a checkpoint's run.val_loss)
    long last_val_step = -1;                       // and after how many steps (-1: none in this run yet)
    std::string good_checkpoint;                   // the newest step_K.bin saved with a finite validation loss
    std::pair<int64_t, int64_t> step_shard{-1, -1};  // the shard of this step's first row, and of the step before
    Timer since_save;                              // since the last checkpoint (or the first step): --save-minutes
    SaveClock save_clock;                          // the last step's and save's times against --stop-grace
    std::string timed_save;                        // the path of the last save --save-minutes made, until a newer one

    // The training data's rows for this rank; the validation data and the measurement
    // slice start from it.
    DataLoaderConfig data_config() const {
        DataLoaderConfig cfg;
        cfg.rank = rank;
        cfg.nproc = world;
        cfg.pattern = o.train_data;
        cfg.B = o.batch_size;
        cfg.T = o.seq_len;
        cfg.shuffle = o.shuffle != 0;
        cfg.seed = o.seed;
        cfg.doc_start_token = model.doc_start_token();
        cfg.vocab_size = model.cfg.vocab_size;
        cfg.verify_data = o.verify_data != 0;
        return cfg;
    }

    void open_training_data() {
        if (o.steps == 0) { return; }
        train_loader = std::make_unique<DataLoader>(data_config());
        printf("train data: %s\n", describe_data(*train_loader).c_str());
    }

    // Opens --val-data and says what it holds, warning where it is not held out from the
    // training data or holds fewer batches than --val-batches.
    void open_validation_data() {
        if (o.val_data.empty()) { return; }
        DataLoaderConfig cfg = data_config();
        cfg.pattern = o.val_data;
        cfg.shuffle = false;
        if (o.val_whole_docs != 0) {  // 1: the validation; 2: a second one beside the windows
            DataLoaderConfig docs = cfg;
            docs.whole_documents = true;
            docs.doc_start_token = model.cfg.bos_id;
            (o.val_whole_docs == 2 ? val_docs : val) = std::make_unique<DataLoader>(docs);
        }
        if (val == nullptr) { val = std::make_unique<DataLoader>(cfg); }
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
            const DataLoader& docs = o.val_whole_docs == 2 ? *val_docs : *val;
            printf("validation%s: whole documents, %lld packed into %lld rows (%lld longer than %d tokens skipped)\n",
                   o.val_whole_docs == 2 ? " (also, beside the windows)" : "", (long long)docs.num_documents(),
                   (long long)docs.num_rows(), (long long)docs.num_skipped_documents(), o.seq_len + 1);
        }
    }

    // --train-doc-eval N: the SAN paper's localisation over documents it trained on (its eval
    // code draws a fixed sample of training documents): a loader of its own over --train-data,
    // so the training loader's position and RNG are untouched; every rank its rows, as the
    // validation's. The sample depends on the files, N and --train-doc-seed alone, so it is the
    // same at every validation, after a resume and in every arm of a study.
    void open_train_doc_sample() {
        if (o.train_doc_eval == 0) { return; }
        DataLoaderConfig cfg = data_config();
        cfg.shuffle = false;
        cfg.whole_documents = true;
        cfg.doc_start_token = model.cfg.bos_id;
        cfg.sample_documents = o.train_doc_eval;
        cfg.sample_seed = o.train_doc_seed;
        cfg.sample_draw = o.train_doc_draw;
        FatalContext context("--train-doc-eval " + std::to_string(o.train_doc_eval), "--train-doc-eval");
        train_docs = std::make_unique<DataLoader>(cfg);
        const DataLoader& s = *train_docs;
        const long long packed = s.num_documents(), skipped = s.num_skipped_documents();
        if (o.train_doc_draw == DocDraw::PaperHead) {  // (the SAN paper code's rule: DocDraw::PaperHead)
            printf("training documents (--train-doc-eval %d, --train-doc-draw paper, seed %llu): 1 in %d of the first %lld "
                   "documents: %lld sampled, %lld longer than %d tokens skipped, %lld packed into %lld rows%s\n",
                   o.train_doc_eval, (unsigned long long)o.train_doc_seed, kPaperSampleEvery,
                   (long long)s.num_documents_visited(), packed + skipped, skipped, o.seq_len + 1, packed,
                   (long long)s.num_rows(), packed < o.train_doc_eval ? " (the data ends before that many are kept)" : "");
            return;
        }
        if (o.train_doc_draw == DocDraw::Exercises) {  // (the exercises that fit a row, whatever else the data holds)
            printf("training documents (--train-doc-eval %d, --train-doc-draw exercises, seed %llu): %lld drawn of the "
                   "%lld exercises of at most %d tokens (a query token), packed into %lld rows%s\n",
                   o.train_doc_eval, (unsigned long long)o.train_doc_seed, packed, (long long)s.num_drawable_documents(),
                   o.seq_len + 1, (long long)s.num_rows(), packed < o.train_doc_eval ? " (every one: the data holds fewer)" : "");
            return;
        }
        printf("training documents (--train-doc-eval %d, seed %llu): %lld drawn, %lld longer than %d tokens skipped, "
               "%lld packed into %lld rows\n", o.train_doc_eval, (unsigned long long)o.train_doc_seed, packed + skipped,
               skipped, o.seq_len + 1, packed, (long long)s.num_rows());
    }

    // The run directory (--run-dir, llmc/train/run_record.h): made by rank 0 with the resolved
    // config; a fresh run does not go into a directory that holds a run already (its log and
    // checkpoints would be overwritten).
    void prepare_run_dir() const {
        if (o.run_dir.empty() || rank != 0) { return; }
        const std::string config = o.run_dir + "/config";
        if (checkpoint == nullptr) {
            std::string held = is_file(o.log_path) && o.log_path == o.run_dir + "/log.jsonl" ? "log.jsonl" : "";
            const std::string newest = o.checkpoint_dir == o.run_dir ? newest_checkpoint(o.run_dir) : "";
            if (!newest.empty()) { held += (held.empty() ? "" : ", ") + newest.substr(o.run_dir.size() + 1); }
            if (!newest.empty()) {
                fatal("--run-dir %s holds a run already (%s): continue it with: %s --resume %s; or give another --run-dir",
                      o.run_dir.c_str(), held.c_str(), shell_word(o.program).c_str(), shell_word(o.run_dir).c_str());
            }
            if (!held.empty()) {  // (stopped before its first checkpoint: nothing to resume)
                fatal("--run-dir %s holds a run that saved no checkpoint (%s), so there is nothing to continue: give "
                      "another --run-dir, or remove %s to start there again", o.run_dir.c_str(), held.c_str(),
                      o.run_dir.c_str());
            }
        }
        make_directories(o.run_dir, "--run-dir");
        if (!o.extended_from.empty()) {  // (an extension beside its run: llmc/train/resume.h extend_beside)
            for (const char* name : {"log.jsonl", "samples.txt"}) {
                const std::string from = o.extended_from + "/" + name, to = o.run_dir + "/" + name;
                if ((name[0] == 's' || o.log_path == to) && is_file(from) && !is_file(to)) { copy_file(from, to, "--extend-to"); }
            }
        }
        if (checkpoint == nullptr || !is_file(config)) {  // (a resumed run's directory has its config)
            const BuildCommit b = build_commit();
            std::string text = config_text(o.record.settings, {
                o.record.program + " at " + o.record.started + ", commit " + b.commit + (b.dirty ? " (with changes)" : "") +
                    (checkpoint != nullptr ? ", resuming " + checkpoint->path() : ""),
                "command: " + o.record.command,
                "every flag's resolved value; repeat the run with: " + o.program + " --config " + config});
            AtomicFileWriter out(config);
            out.file().write(text.data(), text.size(), "the run's config");
            out.commit();
        }
        printf("run directory: %s (config, %s%s)\n", o.run_dir.c_str(),
               o.log_path == o.run_dir + "/log.jsonl" ? "log.jsonl, " : "",
               o.checkpoint_dir == o.run_dir ? "checkpoints, samples.txt" : "samples.txt");
    }

    // Rank 0 (which alone writes) takes the lock of each place it writes (llmc/train/output_lock.h),
    // before it writes there: a second run into any of them is refused, naming this one.
    void lock_outputs() const {
        if (rank != 0) { return; }
        const std::string holder = "pid " + std::to_string(getpid()) + " on " + o.record.host + ", started " +
                                   o.record.started + ": " + o.record.command + "\n";
        if (!o.run_dir.empty()) {
            make_directories(o.run_dir, "--run-dir");
            OutputLocks::take(o.run_dir + "/.lock", "--run-dir " + o.run_dir, holder);
        }
        if (!o.checkpoint_dir.empty() && !(is_directory(o.run_dir) && same_file(o.checkpoint_dir, o.run_dir))) {
            make_directories(o.checkpoint_dir, "--checkpoint-dir");
            OutputLocks::take(o.checkpoint_dir + "/.lock", "--checkpoint-dir " + o.checkpoint_dir, holder);
        }
        struct stat st;  // (a log that is a device or a pipe, e.g. /dev/null, is nobody's file)
        if (!o.log_path.empty() && (stat(o.log_path.c_str(), &st) != 0 || S_ISREG(st.st_mode))) {
            // (DIR/.NAME.lock, hidden as DIR/.lock, beside the file the name leads to: a symlink
            // b -> a takes a's lock)
            const std::string real = resolved_path(o.log_path);
            const size_t slash = real.find_last_of('/');
            const std::string lock = real.substr(0, slash + 1) + "." + real.substr(slash + 1) + ".lock";
            OutputLocks::take(lock, "--log " + o.log_path, holder);
        }
    }

    // A fresh run does not replace an earlier run's work unless --overwrite 1: any checkpoint in its
    // --checkpoint-dir (a checkpoint is hours of work; a stopped or killed run's step_K.bin as much as
    // a finished run's final.bin: a fresh run's saves of the same steps would replace them), or its
    // --log (a log is one run's: written anew, the earlier run's records would be gone, and a
    // directory would hold the checkpoints of one run beside the log of another). An empty file is
    // nobody's log. (A killed run's lock file is no run: the lock was taken before this, and the
    // checkpoints are looked at whatever lock files lie beside them.)
    void check_earlier_run_kept() const {
        if (checkpoint != nullptr || o.overwrite != 0 || rank != 0) { return; }
        const std::string newest = o.steps == 0 || o.checkpoint_dir.empty() ? "" : newest_checkpoint(o.checkpoint_dir);
        struct stat st;
        if (!o.log_path.empty() && stat(o.log_path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 0) {
            // (its checkpoint, if --checkpoint-dir holds one: a resume goes on in this log)
            const std::string resume = newest.empty() ? "Give" : "Continue that run with: " + shell_word(o.program) +
                                                                     " --resume " + shell_word(newest) +
                                                                     outputs_outside(o.checkpoint_dir) + "; or give";
            fatal("--log %s holds the log of an earlier run: this run would replace it (a log is one run's). %s another "
                  "--log, or --overwrite 1 to replace it", o.log_path.c_str(), resume.c_str());
        }
        if (!newest.empty()) {
            fatal("--checkpoint-dir %s holds a checkpoint of an earlier run (%s): this run would replace its checkpoints. "
                  "Continue that run with: %s --resume %s; or give another --checkpoint-dir, or --overwrite 1 to "
                  "replace them", o.checkpoint_dir.c_str(), newest.substr(o.checkpoint_dir.size() + 1).c_str(),
                  shell_word(o.program).c_str(), shell_word(o.checkpoint_dir).c_str());
        }
    }

    // A resume appends to its --log only when the log is this run's (or, from a step-0 checkpoint,
    // writes it anew): its first line is a run's record with this run's id (a log from before run
    // ids: any run's record). Another run's log
    // (a copy resumed where a run of the same name lies, a --log given by mistake) or a file that
    // is no log at all (a shell's start-up file a crafted checkpoint names) is refused untouched.
    void check_log_is_this_runs() const {
        struct stat st;
        if (checkpoint == nullptr || rank != 0 || o.log_path.empty() ||
            stat(o.log_path.c_str(), &st) != 0 || !S_ISREG(st.st_mode) || st.st_size == 0) {
            return;
        }
        const LogOwner owner = log_owner(o.log_path);
        if (!owner.is_log) {
            fatal("--log %s is not a run's log (its first line is no {\"run\": ...} record): a resume appends only to "
                  "its own run's log. Give another --log", o.log_path.c_str());
        }
        if (!owner.id.empty() && owner.id != o.record.id) {
            fatal("--log %s is the log of another run (run id %s; %s is of run %s): a resume appends only to its own "
                  "run's log. Give another --log", o.log_path.c_str(), owner.id.c_str(), checkpoint->path().c_str(),
                  o.record.id.c_str());
        }
    }

    // At the end of the training, one line: the steps, the time, the last losses.
    void print_summary() const {
        if (rank != 0) { return; }
        const double s = run_timer.ms() / 1e3;
        char took[32], val[64] = "";
        snprintf(took, sizeof(took), s < 120 ? "%.1f s" : s < 7200 ? "%.1f min" : "%.2f h", s < 120 ? s : s < 7200 ? s / 60 : s / 3600);
        if (last_val_step >= 0) { snprintf(val, sizeof(val), ", val loss %.4f (step %ld)", last_val_loss, last_val_step); }
        printf("done: steps %ld-%ld of %ld in %s; training loss %.4f (step %ld)%s\n", first_step + 1, o.steps, o.steps,
               took, last_train_loss, o.steps, val);
    }

    // At the end: what the run directory holds.
    void print_run_dir() const {
        if (o.run_dir.empty() || rank != 0) { return; }
        std::string names;
        for (const std::string& n : directory_names(o.run_dir)) {
            if (n[0] != '.') { names += (names.empty() ? "" : ", ") + n; }  // (not the lock file)
        }
        printf("run directory: %s: %s\n", o.run_dir.c_str(), names.c_str());
    }

    // Creates --checkpoint-dir (and its parents) and checks that it can be written: fail now, not
    // after hours of training.
    void check_checkpoint_dir() const {
        if (o.checkpoint_dir.empty()) { return; }
        make_directories(o.checkpoint_dir, "--checkpoint-dir");
        if (access(o.checkpoint_dir.c_str(), W_OK | X_OK) != 0) {
            fatal("--checkpoint-dir '%s': cannot write there: %s", o.checkpoint_dir.c_str(), strerror(errno));
        }
    }

    // Refuses a run that would write one of its checkpoints (those after the steps already
    // done) over the checkpoint it starts from.
    void check_start_not_overwritten() const {
        const std::string start_file = start_checkpoint(o);
        if (o.checkpoint_dir.empty() || start_file.empty() || o.steps == 0) { return; }
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

    // On --resume: the data goes on where the saved run left off, and the sampling RNG too.
    void continue_from_checkpoint() {
        if (checkpoint == nullptr) { return; }
        std::string why = data_difference(*checkpoint, *train_loader, o);
        if (!why.empty()) {
            fatal("--resume %s: the data would not continue where the saved run left off: %s", checkpoint->path().c_str(),
                  why.c_str());
        }
        DataPosition pos{checkpoint->integer("resume.data_epoch"), checkpoint->integer("resume.data_step"),
                         checkpoint->uint64("resume.data_fingerprint")};
        train_loader->set_position(pos);
        printf("resumed from %s at step %" PRId64 "\n", checkpoint->path().c_str(), model.steps_done());
        // the guard goes on with the saved run's recent losses: its first step is checked as any other
        for (auto [key, g] : {std::make_pair("resume.loss_window", &loss_guard), std::make_pair("resume.val_window", &val_guard)}) {
            if (checkpoint->has_key(key) && !g->restore(checkpoint->str(key))) {
                checkpoint->fail("%s '%s' is not a list of finite, non-negative losses", key, checkpoint->str(key).c_str());
            }
        }
        // the last validation goes on into the checkpoints (as in the run that went on), and a
        // step file of this directory with a finite one is the one --keep-last keeps
        if (checkpoint->has_key("run.val_loss") && checkpoint->has_key("run.val_step")) {
            const std::string v = checkpoint->str("run.val_loss");
            double loss = NAN;
            last_val_loss = parse_finite_real(v.c_str(), &loss) ? loss : NAN;
            last_val_step = (long)checkpoint->integer("run.val_step");
            const std::string& path = checkpoint->path();
            const std::string base = path.substr(path.find_last_of('/') + 1);
            const std::string dir = path.find('/') == std::string::npos ? "." : path.substr(0, path.find_last_of('/'));
            if (std::isfinite(last_val_loss) && base.rfind("step_", 0) == 0 && !o.checkpoint_dir.empty() &&
                same_file(dir, o.checkpoint_dir)) {
                good_checkpoint = base;
            }
        }
    }

    // Rank 0 opens --log: appended to when the run continues one, else written anew.
    void open_log() {
        if (o.log_path.empty() || rank != 0) { return; }
        const bool resumed = checkpoint != nullptr && model.steps_done() > 0;
        log.open(o.log_path, resumed);
        // what ran, with which settings, rates, commit and build (no "step": the step-record
        // readers skip it); a resumed run appends its own
        log.record("{\"run\": " + o.record.json(HOST_BACKEND ? "host backend" : "GPU", PRECISION_NAME,
                                                attention_kernels_of(model.cfg)) + "}");
        // the records after this step that the log already holds (written after the checkpoint, before
        // the run stopped) are superseded by what follows: readers drop them (doc/formats.md)
        if (resumed) {
            log.record("{\"step\": " + std::to_string(model.steps_done()) + ", \"resume\": " +
                       json_string(checkpoint->path()) + "}");
        }
    }

    void close_log() { log.close(); }

    // The sample's start: BOS, then the --prompt encoded with the tokenizer.
    void encode_prompt() {
        sample_start = {model.cfg.bos_id};
        if (o.prompt.empty()) { return; }
        if (!tokenizer.loaded()) { fatal("--prompt needs --tokenizer (the file that encodes it)"); }
        std::vector<int> p = tokenizer.encode(o.prompt);
        sample_start.insert(sample_start.end(), p.begin(), p.end());
        printf("prompt: %zu tokens:", p.size());
        for (int id : p) { printf(" %d", id); }
        printf("\n");
    }

    // The measurement slice: the first windows of the validation data (SAN paper's code),
    // the same on every rank; for models with per-layer measurements. The attention-pattern
    // indicators take windows of their own when --indicator-context asks for another length.
    void read_measure_slice() {
        if (!has_measure<Model>::value || val == nullptr) { return; }
        measure_T = std::min(kMeasureTokens, o.seq_len);
        measure_inputs = first_validation_windows(measure_T, measure_B);
        indicator_T = o.indicator_context == 0 ? o.seq_len : std::min(o.indicator_context, o.seq_len);
        indicator_inputs.clear();
        if (indicator_T == measure_T) { return; }
        indicator_inputs = first_validation_windows(indicator_T, indicator_B);
        print_indicator_cost();
    }
    // the first `rows` (at most kIndicatorRows, fewer where a batch's activations or the data
    // hold fewer) windows of Tn tokens of the validation data, back to back
    std::vector<int> first_validation_windows(int Tn, int& rows) const {
        DataLoaderConfig cfg = data_config();
        cfg.pattern = o.val_data;
        cfg.shuffle = false;
        cfg.rank = 0;
        cfg.nproc = 1;
        cfg.B = 1;  // one row at a time: the rows of a batch of kIndicatorRows, however many the data has
        cfg.T = Tn;
        DataLoader slice(cfg);
        rows = (int)std::min<int64_t>({kIndicatorRows, o.batch_size * o.seq_len / Tn, slice.steps_per_epoch()});
        std::vector<int> inputs;
        for (int b = 0; b < rows; b++) {
            slice.next_batch();
            inputs.insert(inputs.end(), slice.inputs.begin(), slice.inputs.end());
        }
        return inputs;
    }
    // What --indicator-context adds to each validation: a forward pass over its windows, and on
    // the host, in double, every head's scores of every (query, key) pair of every layer
    // (2 hd flops a pair; the softmax and indicators are a few more per pair).
    void print_indicator_cost() const {
        if constexpr (has_measure<Model>::value) {
            const auto& c = model.cfg;
            const double pairs = (double)indicator_T * (indicator_T + 1) / 2.0;
            const double flops = 2.0 * indicator_B * c.n_head * pairs * c.head_dim() * c.n_layer;
            printf("attention-pattern indicators: %d windows of %d tokens (--indicator-context %d%s; the effective ranks "
                   "and max_logit stay on %d of %d): per validation one more forward pass of %d tokens and %.3g "
                   "(query, key) pairs per head and layer scored on the host in double (~%.3g GFLOP)\n",
                   indicator_B, indicator_T, o.indicator_context, o.indicator_context == 0 ? ": the training context" : "",
                   std::min(measure_B, kMeasureRows), measure_T, indicator_B * indicator_T, indicator_B * pairs, flops / 1e9);
        }
    }

    // Writes the model, optimizer and data position to --checkpoint-dir/name. Nothing of the run
    // changes by it: the samples' random numbers are a function of the seed and the step.
    // `timed`: a --save-minutes save, which the next checkpoint makes redundant (and removes).
    void save(const std::string& name, bool timed = false) {
        if (o.checkpoint_dir.empty()) { return; }
        DataPosition pos = train_loader->position();
        std::string path = o.checkpoint_dir + "/" + name;
        std::vector<std::pair<std::string, std::string>> extra = run_setting_keys(o);
        extra.insert(extra.end(), {{"resume.data_epoch", std::to_string(pos.epoch)},
                                   {"resume.data_step", std::to_string(pos.step)},
                                   {"resume.data_fingerprint", std::to_string(pos.fingerprint)},
                                   {"resume.data_shards", std::to_string(train_loader->num_shards())},
                                   {"resume.data_tokens", std::to_string(data_tokens(*train_loader))},
                                   {"resume.loss_window", loss_guard.text()},
                                   {"resume.val_window", val_guard.text()},
                                   {"run.ranks", std::to_string(world)},
                                   {"run.precision", PRECISION_NAME}});
        std::vector<std::pair<std::string, std::string>> record =
            o.record.checkpoint_keys(HOST_BACKEND ? "host backend" : "GPU", attention_kernels_of(model.cfg));
        extra.insert(extra.end(), record.begin(), record.end());
        if (last_val_step >= 0) {  // (what --keep-last and --resume DIR go by)
            extra.insert(extra.end(), {{"run.val_loss", std::isfinite(last_val_loss) ? shortest_real_text(last_val_loss) : "nan"},
                                       {"run.val_step", std::to_string(last_val_step)}});
        }
        const std::string newest = newest_checkpoint_path();  // (a failed write, e.g. a full disk: how to go on)
        const FatalContext failing("the run stops; " + (newest.empty() ? "it saved no checkpoint before: start it again "
                                   "with room under --checkpoint-dir " + o.checkpoint_dir : "once " + o.checkpoint_dir +
                                   " has room, continue from " + newest + " with: " + continue_command()), "continue from");
        Timer write;
        save_checkpoint(model, path, extra);
        printf("saved %s%s\n", path.c_str(), timed ? " (--save-minutes: replaced by the next checkpoint)" : "");
        note_save_time(path, write.ms() / 1e3);
        last_saved = path;
        last_saved_step = (long)model.steps_done();
        since_save = Timer();
        if (!timed_save.empty() && timed_save != path && rank == 0 && remove(timed_save.c_str()) == 0) {
            printf("removed %s (the timed save before %s)\n", timed_save.c_str(), name.c_str());
        }
        timed_save = timed ? path : "";
        if (name.rfind("step_", 0) != 0) { return; }
        if (last_val_step >= 0 && std::isfinite(last_val_loss)) { good_checkpoint = name; }
        if (o.keep_last > 0 && rank == 0) {
            // (the newest with a finite validation loss stays, however many newer ones have none)
            for (const std::string& gone : prune_step_checkpoints(o.checkpoint_dir, o.keep_last, good_checkpoint)) {
                printf("removed %s/%s (--keep-last %d)\n", o.checkpoint_dir.c_str(), gone.c_str(), o.keep_last);
            }
        }
    }

    // The milestone checkpoints (--milestones) due after `done` steps, and the eval sets scored
    // there (--milestone-evals; once a step: not again where --eval-every or the end scores them).
    void save_milestones(long done) {
        if (o.milestones == 0) { return; }
        bool saved = false;
        for (const auto& [percent, at] : milestone_steps(o.steps)) {
            if (at == done) {
                char name[32];
                snprintf(name, sizeof(name), "milestone_%03d.bin", percent);
                save(name);
                saved = true;
            }
        }
        const bool scored = done == o.steps || (done > 0 && due(o.eval_every, done));
        if (saved && o.milestone_evals != 0 && !scored) { score_evals(done); }
    }

    // --save-minutes: a checkpoint once that long has passed since the last one (or the first step), so
    // that what cannot save on its way out (a crash, kill -9, a power cut) loses at most that much;
    // each replaces the one before. Rank 0's clock decides for every rank (the save is collective).
    void save_if_time(long done) {
        if (o.save_minutes <= 0.0 || o.checkpoint_dir.empty() || done >= o.steps || last_saved_step == done) { return; }
        bool now = since_save.ms() >= o.save_minutes * 60e3;
        if (world > 1) { now = comm->max(rank == 0 && now ? 1.0 : 0.0) > 0.0; }
        if (now) { save("step_" + std::to_string(done) + ".bin", true); }
    }

    // When the log cannot be written (a full disk, a pipe closed): the steps trained since the last
    // checkpoint are saved before the run stops, where they can be (--checkpoint-dir may be on
    // another disk; a save that fails too stops with its own error). One rank alone: the others
    // cannot join a save from here. Returns the end of the error message: how to continue.
    std::string save_before_log_stop(const std::string& why) {
        if (o.checkpoint_dir.empty()) { return "; nothing was saved (no --checkpoint-dir)"; }
        const long done = (long)model.steps_done();
        if (world == 1 && done > first_step && done > last_saved_step) {
            printf("%s: saving step %ld before the run stops\n", why.c_str(), done);
            save("step_" + std::to_string(done) + ".bin");
        }
        const std::string newest = newest_checkpoint_path();
        return newest.empty() ? "" : "; continue from " + newest + " with: " + continue_command();
    }

    // Prints a sample and logs it; rank 0 alone samples (llmc/model/sampling.h sample_rng: the
    // step's own generator).
    void print_sample(long step) {
        if (o.sample_tokens <= 0 || rank != 0) { return; }
        std::mt19937_64 rng = sample_rng(o.seed, step);
        std::vector<int> out = sample(model, sample_start, o.sample_tokens, o.temperature, rng, o.kv_cache != 0);
        std::string text;
        if (tokenizer.loaded()) {
            text = complete_utf8(tokenizer.decode(out));  // a partial character at the end is held back
        } else {
            for (int t : out) { text += std::to_string(t) + " "; }
        }
        printf("sample: %s\n", text.c_str());
        if (log.is_open()) { log.record("{\"step\": " + std::to_string(step) + ", \"sample\": " + json_string(text) + "}"); }
        if (!o.run_dir.empty()) {
            const std::string path = o.run_dir + "/samples.txt";
            FILE* f = fopen(path.c_str(), "a");
            if (f == nullptr) { fatal("--run-dir: cannot append to %s: %s", path.c_str(), strerror(errno)); }
            const bool written = fprintf(f, "step %ld: %s\n", step, text.c_str()) >= 0;
            if (fclose(f) != 0 || !written) { fatal("--run-dir: cannot write %s: %s", path.c_str(), strerror(errno)); }
        }
    }

    // The validation loss (and the per-layer measurements, for a model that has them),
    // printed and logged.
    void validate(long step) {
        if (val == nullptr) { return; }
        ValResult r = evaluate(model, *val, o.val_batches, comm);
        print_validation(step, r);
        ValResult docs;
        if (val_docs != nullptr) {
            docs = evaluate(model, *val_docs, o.val_batches, comm);
            printf("(whole documents) ");
            print_validation(step, docs);
        }
        ValResult seen;  // --train-doc-eval: every document of the sample, once
        if (train_docs != nullptr) {
            seen = evaluate(model, *train_docs, 0, comm);
            printf("(training documents) ");
            print_validation(step, seen);
        }
        LayerMeasurements m;
        if constexpr (has_measure<Model>::value) {
            m = model.measure(measure_inputs.data(), measure_B, measure_T);
            if (!indicator_inputs.empty()) {  // (a second pass: the indicators over windows of --indicator-context)
                LayerMeasurements wide = model.measure(indicator_inputs.data(), indicator_B, indicator_T);
                m.indicators = std::move(wide.indicators);
                m.logits = std::move(wide.logits);
            }
        }
        if (log.is_open()) {
            log.record(validation_json(step, r, m, val_docs != nullptr ? &docs : nullptr, train_docs != nullptr ? &seen : nullptr));
        }
        last_val_loss = r.loss;
        last_val_step = step;
        if (o.steps > 0) { guard(val_guard, step, "the validation loss", r.loss, "validations"); }
    }

    // Scores the eval sets (llmc/train/eval_scoring.h) into one {"step", "eval"} record; rank 0
    // alone: one forward pass per batch of requests, nothing to reduce.
    void score_evals(long step) {
        if (evals.empty() || rank != 0) { return; }
        std::string results = evals.score(model, step, o.batch_size, o.seq_len, model.cfg.vocab_size,
                                          model.cfg.padded_vocab());
        if (log.is_open()) { log.record("{\"step\": " + std::to_string(step) + ", \"eval\": " + results + "}"); }
    }

    // What the run does after its last step (and, with --steps 0, instead of steps).
    void evaluate_and_sample(long step) {
        validate(step);
        score_evals(step);
        print_sample(step);
    }

    // Whether something done every `every` steps is due after `done` steps (the last step's
    // comes after the loop).
    bool due(int every, long done) const { return every > 0 && done % every == 0 && done != o.steps; }

    // Before the first step: the throughput constants, fp32 gradient accumulation
    // (--grad-fp32), the 0% milestone of a fresh run, the --save-minutes clock, the save when the
    // log fails, and the stop-signal handlers.
    void begin_steps() {
        tokens_per_step = (double)o.grad_accum * o.batch_size * o.seq_len * world;
        peak = peak_flops_per_second();
        flops = flops_per_token(model.cfg);
        first_step = (long)model.steps_done();
        if (o.grad_fp32 != 0) { model.accumulate_in_fp32(); }
        save_clock.grace = o.stop_grace;
        if (first_step == 0) { save_milestones(0); }
        since_save = Timer();
        log.on_failure = [this](const std::string& why) { return save_before_log_stop(why); };
        log.deferred = world > 1;
        arm_stop_signals(world > 1);
    }

    // One micro-batch's forward and backward passes, group by group (llmc/parallel/grad_groups.h);
    // adds each group's share of the step's mean loss into group_loss.
    void micro_batch(int micro, std::vector<double>& group_loss) {
        DataLoader& train = *train_loader;
        train.next_batch();
        if (micro == 0) { step_shard = {train.batch_shard(), step_shard.first}; }
        // each micro-batch's loss is a mean over its own counted targets (as llm.c); over
        // several ranks, over the targets of all ranks' rows: the optimizer's sum over ranks of
        // this gradient is then one rank's gradient of world x B rows
        int64_t count = count_loss_targets(model, train.targets.data(), o.batch_size * o.seq_len);
        const int64_t count_all = std::max<int64_t>(world > 1 ? (int64_t)comm->sum((double)count) : count, 1);
        float scale = 1.0f / (float)(count_all * o.grad_accum);
        const int rows = o.batch_size / groups.local(), n = rows * o.seq_len;
        for (int g = 0; g < groups.local(); g++) {
            const int* inputs = train.inputs.data() + (size_t)g * n;
            const int* targets = train.targets.data() + (size_t)g * n;
            const int64_t counted = count_loss_targets(model, targets, n);
            groups.begin(model, g, micro);
            LossStats s = model.forward(inputs, targets, rows, o.seq_len, scale, nullptr);
            // the last micro-batch's backward may start reducing each layer (--overlap-reduce;
            // with one group per rank: more are added up first)
            model.overlap_reduction(o.overlap_reduce != 0 && micro == o.grad_accum - 1 && groups.local() == 1);
            model.backward();
            model.overlap_reduction(false);
            model.end_micro_batch();
            groups.end(model, g);
            group_loss[g] += model.loss_value(s) * (double)counted / (double)count_all / o.grad_accum;
        }
    }

    // --spike-guard: stops the run (before anything of this step is saved) when `value` is a
    // divergence (DivergenceGuard), naming the step and the checkpoint to go back to. Every rank
    // sees the same value (the losses are over all ranks), so all stop here.
    // A finite jump may be the data's (the training data turning to a shard of another corpus):
    // where the step read another shard than the one before, the stop says so ("stopped by the
    // guard", which the study runner retries rather than files as diverged), and how to pass it.
    void guard(DivergenceGuard& g, long step, const char* what, double value, const char* window) {
        const std::string why = g.check(value);
        if (why.empty()) { return; }
        std::string tensor = std::isfinite(value) ? "" : model.first_nonfinite_tensor();
        const std::string detail = std::isfinite(value) ? why + " " + window : why;
        std::string verdict = "the run diverged";
        const auto [now, before] = step_shard;
        if (std::isfinite(value) && &g == &loss_guard && now >= 0 && before >= 0 && now != before) {
            verdict = "stopped by the guard where the data changes (this step read " + train_loader->shards()[now].path +
                      ", the step before " + train_loader->shards()[before].path + "): a divergence, or the new data's " +
                      "loss; if it is the data's (a shard of another corpus), pass it with --spike-guard 0";
        } else if (std::isfinite(value)) {
            verdict += " (a jump that is the data's, a shard of another corpus, passes with --spike-guard 0)";
        }
        fatal("step %ld: %s is %g (%s; --spike-guard %g): %s; stopped before saving%s%s%s",
              step, what, value, detail.c_str(), o.spike_guard, verdict.c_str(),
              tensor.empty() ? "" : (" (first non-finite: " + tensor + ")").c_str(),
              last_saved.empty() ? "" : "; the last checkpoint written is ",
              last_saved.empty() ? "" : (last_saved + " (step " + std::to_string(last_saved_step) + ")").c_str());
    }

    // Stops the run, naming the first tensor that is not finite.
    [[noreturn]] void diverged(long step, const char* what, double value) {
        std::string tensor = model.first_nonfinite_tensor();
        fatal("step %ld: %s is %g: the run diverged (%s)", step, what, value,
              tensor.empty() ? "every parameter and gradient is finite" : ("first non-finite: " + tensor).c_str());
    }

    // A step's progress line (every --log-every steps, the first and the last), its loss
    // spike if any, and its log record.
    void report_step(long done, double loss, double lr, float grad_norm, double ms) {
        total_ms += ms;
        last_train_loss = loss;
        double eta_s = total_ms / (done - first_step) * (o.steps - done) / 1e3;
        if (done % o.log_every == 0 || done == o.steps || done == first_step + 1) {
            double tokens_per_second = tokens_per_step / (ms / 1e3);
            printf("step %5ld/%ld | loss %.4f | lr %.3e | norm %6.3f | %7.1f ms | %8.0f tok/s", done, o.steps, loss,
                   lr, grad_norm, ms, tokens_per_second);
            if (peak > 0.0) { printf(" | MFU %4.1f%%", 100.0 * flops * tokens_per_second / peak); }
            printf(" | eta %.0fs\n", eta_s);
        }
        double spike_z = spikes.observe(loss);
        if (spike_z > 0.0) { printf("step %ld: loss spike (%.4f, z-score %.1f over the last %d steps)\n", done, loss, spike_z, o.spike_window); }
        if (!log.is_open()) { return; }
        char record[256];
        snprintf(record, sizeof(record), "{\"step\": %ld, \"loss\": %.6f, \"lr\": %.6e, \"grad_norm\": %.6f, \"ms\": %.2f",
                 done, loss, lr, grad_norm, ms);
        std::string line = record;
        if (spike_z > 0.0) {
            snprintf(record, sizeof(record), ", \"loss_spike_z\": %.3f", spike_z);
            line += record;
        }
        log.record(line + "}");
    }

    // The command that continues this run from its newest checkpoint: --resume with the run
    // directory where the checkpoint lies in it (as the refusal of a second fresh run says).
    // (the checkpoint written last, else the one this run resumed from; "" for neither)
    std::string newest_checkpoint_path() const {
        return !last_saved.empty() ? last_saved : checkpoint != nullptr ? checkpoint->path() : "";
    }
    std::string continue_command() const {
        const std::string launcher = world > 1 ? "mpirun -np " + std::to_string(world) + " " : "";
        const std::string newest = newest_checkpoint_path();
        const bool in_run_dir = !o.run_dir.empty() && newest.rfind(o.run_dir + "/", 0) == 0;
        return launcher + shell_word(o.program) + " --resume " + shell_word(in_run_dir ? o.run_dir : newest) +
               outputs_outside(newest.find('/') == std::string::npos ? "." : newest.substr(0, newest.find_last_of('/')));
    }
    // The flags that name this run's outputs outside `dir` (where its checkpoint lies): a resume
    // takes from the file only the places inside it (llmc/train/resume.h check_saved_output_places).
    std::string outputs_outside(const std::string& dir) const {
        const std::string tree = resolved_path(dir);
        auto outside = [&](const std::string& p) { return !p.empty() && !path_inside(resolved_path(p), tree); };
        std::string flags;
        const bool run_dir = outside(o.run_dir);
        if (run_dir) { flags += " --run-dir " + shell_word(o.run_dir); }
        if (outside(o.log_path) && !(run_dir && o.log_path == o.run_dir + "/log.jsonl")) { flags += " --log " + shell_word(o.log_path); }
        return flags;
    }
    // What a stop without saving loses during step `step` (or once it is done).
    std::string lost_since_last_save(long step) const {
        const long from = last_saved.empty() ? first_step + 1 : last_saved_step + 1;
        const std::string steps = from == step ? "step " + std::to_string(step)
                                               : "steps " + std::to_string(from) + ".." + std::to_string(step);
        const std::string lost = steps + (from == step ? " is lost" : " are lost");
        if (newest_checkpoint_path().empty()) { return lost + " (the run saved no checkpoint)"; }
        return lost + "; continue from step " + std::to_string(from - 1) + " with: " + continue_command();
    }
    // Records how long a save took; one longer than --stop-grace is said at once: a stop at a time
    // limit would not finish it.
    void note_save_time(const std::string& path, double seconds) {
        if (save_clock.saved(path, seconds, rank == 0) && rank == 0) {
            printf("warning: saving %s took %s, more than --stop-grace %g s (the launcher's wait from its stop signal to "
                   "its kill): a stop at a time limit would be killed during its save (the checkpoint before it "
                   "stays whole; the next start removes the unfinished .tmp); have the launcher warn earlier "
                   "(Slurm: --signal=USR1@SECONDS, doc/multi-gpu.md \"Stopping on a cluster\")\n",
                   path.c_str(), save_clock.save_text().c_str(), o.stop_grace);
        }
    }
    // The saves a killed run did not finish (NAME.bin.tmp in --checkpoint-dir: llmc/utils.h
    // AtomicFileWriter) are removed and named, once this run holds the directory's lock: no live
    // run writes there, and the checkpoints before them are whole.
    void remove_unfinished_saves() const {
        if (rank != 0 || o.checkpoint_dir.empty()) { return; }
        for (const std::string& name : unfinished_saves(o.checkpoint_dir)) {
            const std::string path = o.checkpoint_dir + "/" + name;
            if (unlink(path.c_str()) == 0) {
                printf("removed %s: a save that a killed run did not finish (the checkpoints before it are whole)\n",
                       path.c_str());
            } else {
                printf("warning: %s is a save that a killed run did not finish, and cannot be removed: %s\n", path.c_str(),
                       strerror(errno));
            }
        }
    }

    // What Ctrl-C (or SIGTERM, SIGHUP) says during step `done` (llmc/train/stop_signal.h prints
    // it): the first signal's note, and a second's.
    std::pair<std::string, std::string> stop_notes(long done) const {
        const std::string step = "step " + std::to_string(done) + " of " + std::to_string(o.steps);
        std::string first;
        if (o.checkpoint_dir.empty()) {
            first = "stopping after " + step + " (no --checkpoint-dir: nothing will be saved)";
        } else {
            first = "stopping after " + step + ", saving " + o.checkpoint_dir + "/step_" + std::to_string(done) + ".bin";
        }
        first += world > 1 ? " (every rank stops there; a repeated signal is ignored)" : " (again: stop at once, without saving)";
        if (!o.checkpoint_dir.empty()) { first += "; " + save_clock.fit(newest_checkpoint_path()); }
        return {first, "stopped without saving; " + lost_since_last_save(done)};
    }

    // Over several ranks, after a step in which rank 0 could not write the log: every rank saves
    // the step, then the run stops as a one-rank run does at once (save_before_log_stop), naming the
    // log and the command that continues.
    [[noreturn]] void stop_for_the_log(long done, bool finished = false) {
        if (!o.checkpoint_dir.empty() && last_saved_step != done && done > first_step) {
            if (rank == 0) { printf("%s: saving step %ld before the run stops\n", log.failure().c_str(), done); }
            save("step_" + std::to_string(done) + ".bin");
        }
        comm->barrier();  // (no rank leaves before rank 0 has renamed the file into place)
        if (rank != 0) { exit(EXIT_FAILURE); }  // (rank 0 says why)
        const std::string newest = newest_checkpoint_path();
        fatal("%s; the run stops (its log would be incomplete)%s", log.failure().c_str(),
              o.checkpoint_dir.empty() ? "; nothing was saved (no --checkpoint-dir)"
              : finished               ? "; the training is done: final.bin is whole"
              : newest.empty()         ? ""
                                       : ("; continue from " + newest + " with: " + continue_command()).c_str());
    }

    // On SIGINT/SIGTERM/SIGHUP before the last step: checkpoint here; returns the exit status, 128 +
    // the signal (0: go on). Over several ranks all stop after the same step (the checkpoint is
    // a collective): a signal any rank has seen counts for all. Every rank returns only once rank
    // 0 has renamed the file into place: a launcher ends the whole job when its first rank exits
    // with a non-zero status, and would kill rank 0 in the middle of the write.
    int stop_if_signalled(long done) {
        // (with it, over several ranks, whether rank 0's log failed: LogFile::deferred; 1000 + ...)
        const bool log_failed = !log.failure().empty();
        // (the signal read with the next step's notes set in one lock: a note names the step it stops at)
        int local = stop_signal();
        if (done < o.steps) {
            auto [first, second] = stop_notes(done + 1);
            local = stop_signal_or_next_notes(std::move(first), std::move(second));
        }
        const int seen = world > 1 ? (int)comm->max((double)local + (log_failed ? 1000.0 : 0.0)) : local;
        if (seen >= 1000) { stop_for_the_log(done); }
        const int stop = seen;
        if (stop == 0 || done >= o.steps) { return 0; }
        if (!o.checkpoint_dir.empty() && last_saved_step != done) { save("step_" + std::to_string(done) + ".bin"); }
        // the command continues the run to its outputs as it stands: a resume restores them
        // (llmc/train/resume.h RunSetting::output)
        printf("%s: stopped after step %ld of %ld; %s\n", strsignal(stop), done, o.steps,
               o.checkpoint_dir.empty() ? "no --checkpoint-dir, so nothing was saved"
                                        : ("continue with: " + continue_command()).c_str());
        close_log();
        if (world > 1) { comm->barrier(); }
        return 128 + stop;
    }
};

// Trains `model` as the options say (TrainingRun above); returns the exit status (0, or 128 +
// the signal that stopped the run).
template <typename Model>
int run_training(Model& model, const TrainOptions& o, const Tokenizer& tokenizer, const TensorFileReader* checkpoint,
                  const Comm* comm = nullptr) {
    return TrainingRun<Model>(model, o, tokenizer, checkpoint, comm).run();
}
