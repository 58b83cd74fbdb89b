/*
The training loop shared by the trainers. run_training() builds a TrainingRun: its constructor
reads the data, restores a --resume and readies the outputs; run() is the main loop (gradient
accumulation under the learning-rate schedule, validation, eval sets, samples, the log and
checkpoints that resume exactly: doc/formats.md "Resume state"). Layout: constructor and run(),
then the steps they take, top to bottom: setup, the step, eval, saves and stops, the end. What it
asks of the model is listed at TrainingRun. Elsewhere: the files a run writes (output_places.h,
run_outputs.h), its options (train_options.h, resume.h), main's sequence (trainer.h); what each
rank does: doc/multi-gpu.md (rank 0 alone samples, scores eval sets and writes).
*/
#pragma once

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

#include "llmc/cuda_common.h"  // defines: cudaCheck, HOST_BACKEND, PRECISION_NAME
#include "llmc/data/dataloader.h"  // defines: DataLoader, DataLoaderConfig, DocDraw
#include "llmc/data/tensor_file.h"  // defines: TensorFileReader
#include "llmc/data/tokenizer.h"  // defines: Tokenizer, complete_utf8
#include "llmc/kernels/attention.cuh"  // defines: attention_kernels_for
#include "llmc/model/model.h"  // defines: count_loss_targets, flops_per_token, sample, save_checkpoint
#include "llmc/parallel/comm.h"  // defines: Comm
#include "llmc/parallel/grad_groups.h"  // defines: GradientGroups
#include "llmc/train/eval_scoring.h"  // defines: EvalSuite
#include "llmc/train/evaluation.h"  // defines: evaluate, validation_json, has_measure, LayerMeasurements
#include "llmc/train/output_places.h"  // defines: OutputPlaces, milestone_steps
#include "llmc/train/resume.h"  // defines: data_difference, run_setting_keys, data_tokens
#include "llmc/train/run_log.h"  // defines: SpikeDetector, DivergenceGuard, describe_data, peak_flops_per_second
#include "llmc/train/run_outputs.h"  // defines: RunOutputs
#include "llmc/train/stop_signal.h"  // defines: arm_stop_signals, set_stop_notes, stop_signal, drop_lost_console
#include "llmc/train/train_options.h"  // defines: TrainOptions
#include "llmc/utils.h"  // defines: fatal, FatalContext, Timer

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
//
// What it asks of the model (besides llmc/model/model.h):
//     cfg.vocab_size, cfg.bos_id; int doc_start_token() (-1: none); bool counts_in_loss(int target)
//     LossStats forward(inputs, targets, B, T, dloss_scale, std::vector<float>* row_losses)
//     void backward();  double loss_value(const LossStats&);  double z_loss_coefficient();
//     const std::vector<int>& loss_targets() (< 0 where masked); float* logits ((B*T, Vp) fp32)
//     zero_grad(), update(lr_matrix, lr_other), steps_done(), first_nonfinite_tensor(),
//     accumulate_in_fp32(), end_micro_batch() (llmc/model/parameters.h ModelParameters)
// and optionally (SAN) LayerMeasurements measure(inputs, B, T), logged at every validation.
template <typename Model>
class TrainingRun {
public:
    TrainingRun(Model& model, const TrainOptions& o, const Tokenizer& tokenizer, const TensorFileReader* checkpoint,
                const Comm* comm)
        : model(model), o(o), tokenizer(tokenizer), checkpoint(checkpoint), comm(comm),
          rank(comm != nullptr ? comm->rank : 0), world(comm != nullptr ? comm->world : 1),
          out(o, checkpoint, rank, world),
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
            OutputPlaces{o, checkpoint, rank}.check_start_not_overwritten((long)model.steps_done());
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
            OutputPlaces{o, checkpoint, rank}.prepare();
        }
        out.open_log((long)model.steps_done(), attention_kernels_of(model.cfg));
    }
    ~TrainingRun() { out.close_log(); }
    TrainingRun(const TrainingRun&) = delete;
    TrainingRun& operator=(const TrainingRun&) = delete;

    // The main loop: each step zeroes the gradients, runs the micro-batches' forward and
    // backward passes, updates, logs, and now and then validates, scores the eval sets,
    // samples and saves; a stop signal saves and ends the run. Then the final validation,
    // eval scores, sample and checkpoint. Returns the exit status: 0, or 128 + the stop signal.
    int run() {
        if (o.steps == 0) {  // evaluate the model given with --init-from, logged at the steps it was trained for
            evaluate_and_sample(o.record.evaluated_step);
            out.print_run_dir();
            return 0;
        }
        begin_steps();
        const auto [first_note, second_note] = out.stop_notes(first_step + 1);
        set_stop_notes(first_note, second_note);
        for (long step = first_step; step < o.steps; step++) {
            drop_lost_console();  // (its reader gone, the run goes on: llmc/train/stop_signal.h)
            Timer timer;
            model.zero_grad();
            // the forwards queue their loss sums (no wait per micro-batch); read once, all queued
            model.begin_loss_queue(o.grad_accum * groups.local());
            std::vector<QueuedLoss> queued;
            for (int micro = 0; micro < o.grad_accum; micro++) { micro_batch(micro, queued); }
            groups.combine(model);
            const double loss = groups.total(group_losses(queued));
            if (!std::isfinite(loss)) { diverged(step + 1, "the loss", loss); }
            guard(loss_guard, step + 1, "the training loss", loss, "steps");
            double lr_multiplier = o.opt.schedule.multiplier(step, o.steps);
            float grad_norm = model.update(o.opt.lr * lr_multiplier, o.opt.lr_other * lr_multiplier);
            if (!std::isfinite(grad_norm)) { diverged(step + 1, "the gradient norm", grad_norm); }
            cudaCheck(cudaDeviceSynchronize());
            const double ms = timer.ms();
            out.step_took(ms / 1e3);
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
                       "without final.bin)", "stopped before final.bin; " + out.lost_since_last_save(o.steps));
        evaluate_and_sample(o.steps);
        save("final.bin");
        if (world > 1 && (int)comm->max(out.log.failure().empty() ? 0.0 : 1.0) != 0) { stop_for_the_log(o.steps, true); }
        print_summary();
        out.print_run_dir();  // (the last line, as it names the run directory at the start)
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
    RunOutputs out;                                // the log, the checkpoints' names, the stop notes
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
    std::pair<int64_t, int64_t> step_shard{-1, -1};  // the shard of this step's first row, and of the step before

    // ---- setup: the data, the resume, the prompt and the measurement slice ---------------------

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
            out.resumed_with_validation(std::isfinite(last_val_loss));
        }
    }

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

    // ---- the step: before the first, the micro-batches, the guards, the progress line ----------

    // Before the first step: the throughput constants, fp32 gradient accumulation
    // (--grad-fp32), the 0% milestone of a fresh run, the --save-minutes clock, the save when the
    // log fails, and the stop-signal handlers.
    void begin_steps() {
        tokens_per_step = (double)o.grad_accum * o.batch_size * o.seq_len * world;
        peak = peak_flops_per_second();
        flops = flops_per_token(model.cfg);
        first_step = (long)model.steps_done();
        if (o.grad_fp32 != 0) { model.accumulate_in_fp32(); }
        out.begin_steps(first_step);
        if (first_step == 0) { save_milestones(0); }
        out.log.on_failure = [this](const std::string& why) { return save_before_log_stop(why); };
        out.log.deferred = world > 1;
        arm_stop_signals(world > 1);
    }

    // A forward's loss, its sums still on their way (model.begin_loss_queue): what weighs its
    // share of the step's mean loss.
    struct QueuedLoss {
        LossStats stats;  // the count; the sums NaN until read_loss_queue
        int group;
        int64_t counted, count_all;
    };

    // One micro-batch's forward and backward passes, group by group (llmc/parallel/grad_groups.h);
    // appends each group's queued loss to `queued`.
    void micro_batch(int micro, std::vector<QueuedLoss>& queued) {
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
            queued.push_back({s, g, counted, count_all});
        }
    }

    // Each group's share of the step's mean loss, from the micro-batches' sums (one wait for the
    // last of their copies, every backward queued before it), added in the micro-batches' order.
    std::vector<double> group_losses(const std::vector<QueuedLoss>& queued) {
        std::vector<LossStats> sums = model.read_loss_queue();
        if (sums.size() != queued.size()) { fatal("the loss queue holds %zu sums for %zu forwards", sums.size(), queued.size()); }
        std::vector<double> group_loss(groups.local(), 0.0);
        for (size_t i = 0; i < queued.size(); i++) {
            const QueuedLoss& q = queued[i];
            LossStats s = q.stats;
            s.ce_sum = sums[i].ce_sum;
            s.lse_sq_sum = sums[i].lse_sq_sum;
            group_loss[q.group] += model.loss_value(s) * (double)q.counted / (double)q.count_all / o.grad_accum;
        }
        return group_loss;
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
              !out.saved_any() ? "" : "; the last checkpoint written is ",
              !out.saved_any() ? "" : (out.newest() + " (step " + std::to_string(out.last_saved_step()) + ")").c_str());
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
        if (!out.log.is_open()) { return; }
        char record[256];
        snprintf(record, sizeof(record), "{\"step\": %ld, \"loss\": %.6f, \"lr\": %.6e, \"grad_norm\": %.6f, \"ms\": %.2f",
                 done, loss, lr, grad_norm, ms);
        std::string line = record;
        if (spike_z > 0.0) {
            snprintf(record, sizeof(record), ", \"loss_spike_z\": %.3f", spike_z);
            line += record;
        }
        out.log.record(line + "}");
    }

    // ---- eval: validation, eval sets, samples --------------------------------------------------

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
        if (out.log.is_open()) {
            out.log.record(validation_json(step, r, m, val_docs != nullptr ? &docs : nullptr, train_docs != nullptr ? &seen : nullptr));
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
        if (out.log.is_open()) { out.log.record("{\"step\": " + std::to_string(step) + ", \"eval\": " + results + "}"); }
    }

    // Prints a sample and logs it; rank 0 alone samples (llmc/model/sampling.h sample_rng: the
    // step's own generator).
    void print_sample(long step) {
        if (o.sample_tokens <= 0 || rank != 0) { return; }
        std::mt19937_64 rng = sample_rng(o.seed, step);
        std::vector<int> tokens = sample(model, sample_start, o.sample_tokens, o.temperature, rng, o.kv_cache != 0);
        std::string text;
        if (tokenizer.loaded()) {
            text = complete_utf8(tokenizer.decode(tokens));  // a partial character at the end is held back
        } else {
            for (int t : tokens) { text += std::to_string(t) + " "; }
        }
        printf("sample: %s\n", text.c_str());
        if (out.log.is_open()) { out.log.record("{\"step\": " + std::to_string(step) + ", \"sample\": " + json_string(text) + "}"); }
        out.append_sample(step, text);
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

    // ---- saves and stops (the files: llmc/train/run_outputs.h) ---------------------------------

    // Writes the model, optimizer and data position to --checkpoint-dir/name (RunOutputs::save
    // names, times and keeps the files). Nothing of the run changes by it: the samples' random
    // numbers are a function of the seed and the step.
    // `timed`: a --save-minutes save, which the next checkpoint makes redundant (and removes).
    void save(const std::string& name, bool timed = false) {
        if (o.checkpoint_dir.empty()) { return; }
        const std::vector<std::pair<std::string, std::string>> keys = checkpoint_keys();
        out.save(name, (long)model.steps_done(), last_val_step >= 0 && std::isfinite(last_val_loss), timed,
                 [&](const std::string& path) { save_checkpoint(model, path, keys); });
    }
    // What a checkpoint holds beside the model: the run's settings, where the data goes on, the
    // guards' windows, the run record and the last validation.
    std::vector<std::pair<std::string, std::string>> checkpoint_keys() const {
        DataPosition pos = train_loader->position();
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
        return extra;
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
        if (o.save_minutes <= 0.0 || o.checkpoint_dir.empty() || done >= o.steps || out.last_saved_step() == done) { return; }
        bool now = out.ms_since_save() >= o.save_minutes * 60e3;
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
        if (world == 1 && done > first_step && done > out.last_saved_step()) {
            printf("%s: saving step %ld before the run stops\n", why.c_str(), done);
            save("step_" + std::to_string(done) + ".bin");
        }
        return out.newest().empty() ? "" : "; continue from " + out.newest() + " with: " + out.continue_command();
    }

    // Over several ranks, after a step in which rank 0 could not write the log: every rank saves
    // the step, then the run stops as a one-rank run does at once (save_before_log_stop), naming the
    // log and the command that continues.
    [[noreturn]] void stop_for_the_log(long done, bool finished = false) {
        if (!o.checkpoint_dir.empty() && out.last_saved_step() != done && done > first_step) {
            if (rank == 0) { printf("%s: saving step %ld before the run stops\n", out.log.failure().c_str(), done); }
            save("step_" + std::to_string(done) + ".bin");
        }
        comm->barrier();  // (no rank leaves before rank 0 has renamed the file into place)
        if (rank != 0) { exit(EXIT_FAILURE); }  // (rank 0 says why)
        const std::string& newest = out.newest();
        fatal("%s; the run stops (its log would be incomplete)%s", out.log.failure().c_str(),
              o.checkpoint_dir.empty() ? "; nothing was saved (no --checkpoint-dir)"
              : finished               ? "; the training is done: final.bin is whole"
              : newest.empty()         ? ""
                                       : ("; continue from " + newest + " with: " + out.continue_command()).c_str());
    }

    // On SIGINT/SIGTERM/SIGHUP before the last step: checkpoint here; returns the exit status, 128 +
    // the signal (0: go on). Over several ranks all stop after the same step (the checkpoint is
    // a collective): a signal any rank has seen counts for all. Every rank returns only once rank
    // 0 has renamed the file into place: a launcher ends the whole job when its first rank exits
    // with a non-zero status, and would kill rank 0 in the middle of the write.
    int stop_if_signalled(long done) {
        // (with it, over several ranks, whether rank 0's log failed: LogFile::deferred; 1000 + ...)
        const bool log_failed = !out.log.failure().empty();
        // (the signal read with the next step's notes set in one lock: a note names the step it stops at)
        int local = stop_signal();
        if (done < o.steps) {
            auto [first, second] = out.stop_notes(done + 1);
            local = stop_signal_or_next_notes(std::move(first), std::move(second));
        }
        const int seen = world > 1 ? (int)comm->max((double)local + (log_failed ? 1000.0 : 0.0)) : local;
        if (seen >= 1000) { stop_for_the_log(done); }
        const int stop = seen;
        if (stop == 0 || done >= o.steps) { return 0; }
        if (!o.checkpoint_dir.empty() && out.last_saved_step() != done) { save("step_" + std::to_string(done) + ".bin"); }
        // the command continues the run to its outputs as it stands: a resume restores them
        // (llmc/train/resume.h RunSetting::output)
        printf("%s: stopped after step %ld of %ld; %s\n", strsignal(stop), done, o.steps,
               o.checkpoint_dir.empty() ? "no --checkpoint-dir, so nothing was saved"
                                        : ("continue with: " + out.continue_command()).c_str());
        out.close_log();
        if (world > 1) { comm->barrier(); }
        return 128 + stop;
    }

    // ---- the end -------------------------------------------------------------------------------

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
};

// Trains `model` as the options say (TrainingRun above); returns the exit status (0, or 128 +
// the signal that stopped the run).
template <typename Model>
int run_training(Model& model, const TrainOptions& o, const Tokenizer& tokenizer, const TensorFileReader* checkpoint,
                  const Comm* comm = nullptr) {
    return TrainingRun<Model>(model, o, tokenizer, checkpoint, comm).run();
}
