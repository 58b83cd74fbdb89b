/*
The options of a training run that are not about the model (TrainOptions), their flags
(appended to a trainer's model flags: llmc/cli.h), and how the run prints them. The rules
that check and resolve them live in llmc/train/trainer.h (check_training_options); what a
resume keeps of them, in llmc/train/resume.h. Host-only C++17.
*/
#pragma once

#include <cstdint>
#include <cstdio>
#include <set>
#include <string>
#include <vector>

#include "llmc/choices.h"
#include "llmc/cli.h"
#include "llmc/cuda_common.h"
#include "llmc/data/dataloader.h"  // defines: DocDraw
#include "llmc/optim/optimizer.h"
#include "llmc/train/run_record.h"
#include "llmc/utils.h"

// Which of our attention kernels bf16 builds run (llmc/kernels/attention.cuh): auto = the tensor-core
// ones on a GPU, the scalar ones on the host backend (where they are several times faster).
enum class AttentionKernels { Auto, TensorCores, Scalar };
inline const Choices<AttentionKernels> kAttentionKernels{{"auto", "tensor-cores", "scalar"}};
// --train-doc-draw: how --train-doc-eval draws its documents (DataLoaderConfig::sample_draw)
inline const Choices<DocDraw> kDocDraws{{"uniform", "paper", "exercises"}};

struct TrainOptions {
    OptimizerConfig opt = [] {
        OptimizerConfig c;
        c.lr = -1.0;  // the model's default (OptimizerConfig::resolve_rates)
        return c;
    }();
    int lr_scale_gpus = 1;
    int zero = 0;   // ZeRO stage over the ranks (llmc/parallel/data_parallel.h)
    int overlap_reduce = 0;  // reduce each layer's gradients during the last backward pass
    int grad_groups = 0;     // G: the step's gradient as a sum of G row groups (0: the rank count; llmc/parallel/grad_groups.h)
    int world = 1;  // ranks of this run (trainer_main sets it from its Comm; no flag)
    std::string train_data, val_data, tokenizer_path, log_path, checkpoint_dir, resume_path, init_from;
    int batch_size = 8, seq_len = 0;
    int grad_accum = 0;    // 0: global_batch / (batch_size x world) when a global batch is set, else 1
    int global_batch = 0;  // rows per optimizer step over all micro-batches and ranks (0: batch_size x grad_accum x world)
    int grad_fp32 = 0;     // accumulate gradients in fp32 (bf16 builds)
    long steps = 100;
    int val_every = 50, val_batches = 8, sample_every = 0, sample_tokens = 64, save_every = 0, log_every = 1;
    int milestones = 0;    // checkpoints at 0/25/50/75/100% of the steps
    double save_minutes = 30.0;  // a checkpoint at least this often, replacing the previous such one (0: off; doc/trainer.md)
    double stop_grace = 30.0;    // seconds from a stop signal to the launcher's kill (Slurm's KillWait): what a stop says fits
    int val_whole_docs = 0;  // validate on rows of whole documents (DataLoaderConfig::whole_documents); 2: also, beside windows
    int train_doc_eval = 0;  // also validate on a seeded sample of this many whole training documents (DataLoaderConfig::sample_documents)
    uint64_t train_doc_seed = 0;  // the seed of that sample
    DocDraw train_doc_draw = DocDraw::Uniform;  // how it is drawn (--paper-setup 1: the paper's rule, seed 3407)
    int spike_window = 128;
    double spike_z = 5.0;
    double spike_guard = 3.0;  // stop when a loss is more than K x the recent median (0: off)
    float temperature = 1.0f;
    uint64_t seed = 42;
    int shuffle = 1;
    int verify_data = 1;     // check the CRC-32 of every data file once, as the loaders open them
    long extend_to = 0;      // --resume a run and train it on to this many steps (a new schedule)
    std::string extended_from;  // --extend-to of a run in its run directory: that directory (llmc/train/resume.h)
    int resume_override = 0; // --resume: let the flags given change the saved run's settings
    std::string prompt;      // text to continue in the samples (encoded with --tokenizer)
    int kv_cache = 1;        // sample with a KV cache (llmc/kernels/kv_cache.cuh)
    std::string eval_sets;   // eval .bin files scored by llmc/train/eval_scoring.h (comma list)
    int eval_every = 0;      // score them every N steps (and at the end)
    int milestone_evals = 1; // score them at the milestone checkpoints too (--milestones)
    int indicator_context = 257;  // tokens per window of the attention-pattern indicators (0: seq_len)
    std::string eval_context;        // windows to score the rolling sets in besides --seq-len (comma list)
    std::vector<int> eval_contexts;  // eval_context parsed (check_training_options)
    int cudnn = 0;           // cuDNN attention where the build has it (llmc/kernels/attention_cudnn.cuh)
    AttentionKernels attention_kernels = AttentionKernels::Auto;  // llmc/kernels/attention.cuh attention_tensor_cores()
    int sync_check = 0;      // wait after every launch and name a faulting kernel (llmc/launch_check.h)
    std::string run_dir = "auto";  // the run's directory (llmc/train/run_record.h); auto: a fresh one under runs/ unless outputs are given
    std::set<std::string> outputs_from_run_dir;  // --checkpoint-dir, --log: those the run directory set
    int keep_last = 0;       // keep only the N newest step_K.bin checkpoints (0: all)
    int overwrite = 0;       // a fresh run may replace the final.bin in its --checkpoint-dir and an earlier run's --log
    int check_tokenizer = 1; // the tokenizer each data file records against --tokenizer and the rest (input_files.h)
    int print_config = 0;    // print the resolved config, rates, sizes and data, and exit
    std::string config_path; // --config FILE (llmc/config_file.h: read before the other flags)
    RunRecord record;        // what the run says about itself (trainer_main fills it)
    std::string rates_source;     // where the default matrix rate came from (DefaultRates::source); "": --lr or resumed
    std::set<std::string> given;  // the flags given on the command line or in --config (llmc/cli.h parse_flags)
    std::string program;          // argv[0]: the commands a run prints to continue it name it
    bool model_loaded = false;    // the trainer loaded a model from another file (train_gpt2 --init-from-llmc)
};

// The optimizers of a trainer without Muon (train_gpt2: its fused qkv matrix would be
// orthogonalised as one).
inline const Choices<OptimizerKind> kAdamWOnly{{"adamw"}};

// The flags of TrainOptions, appended to a trainer's model flags; `with_muon`: the trainer
// offers Muon (train_gpt2 does not, and lists none of its flags).
inline void add_training_flags(std::vector<Flag>& flags, TrainOptions& o, bool with_muon = true) {
    OptimizerConfig& p = o.opt;
    std::vector<Flag> more = {
        make_flag("--train-data", &o.train_data, "training shards (glob, comma-separated globs)"),
        make_flag("--val-data", &o.val_data, "validation shards (glob); empty: no validation"),
        make_flag("--tokenizer", &o.tokenizer_path, "tokenizer .bin: sets the vocabulary size, decodes samples, encodes --prompt"),
        make_flag("--batch-size", &o.batch_size, "rows per micro-batch B (per rank)"),
        make_flag("--seq-len", &o.seq_len, "tokens per row of a batch, at most the model's context --max-seq-len (0: all of it)"),
        make_flag("--grad-accum", &o.grad_accum, "micro-batches per optimizer step (0: --global-batch / (--batch-size x ranks), or 1)"),
        make_flag("--global-batch", &o.global_batch, "rows per optimizer step over micro-batches and ranks (0: batch-size x grad-accum x ranks)"),
        make_flag("--grad-fp32", &o.grad_fp32, "accumulate gradients in fp32 in bf16 builds 0|1"),
        make_flag("--steps", &o.steps, "optimizer steps"),
        with_muon ? make_flag("--optimizer", &p.optimizer, kOptimizerKinds, "Muon on the matrices, AdamW without decay on the rest")
                  : make_flag("--optimizer", &p.optimizer, kAdamWOnly, "the one optimizer of this trainer"),
        make_flag("--lr", &p.lr, "peak rate of the matrix group (<0: the model's default for the optimizer)"),
        make_flag("--lr-other", &p.lr_other, with_muon ? "peak rate of embeddings/gains/gates/biases (<0: the model's default under muon (-h: \"other\"), adamw: same as --lr)" : "peak rate of embeddings/gains/biases (<0: same as --lr)"),
        make_flag("--lr-scale-gpus", &o.lr_scale_gpus, with_muon ? "scale the rates for N GPUs: AdamW rates x N, the Muon rate x sqrt(N)" : "scale the rates for N GPUs: x N"),
        make_flag("--weight-decay", &p.weight_decay, "decoupled weight decay (matrices; the embeddings too with --decay-embedding 1)"),
        make_flag("--decay-embedding", &p.decay_embedding, "1: the embeddings decay too (Hugging Face-style: every matrix; gains, gates, biases never) 0|1"),
        make_flag("--beta1", &p.beta1, "AdamW beta1"),
        make_flag("--beta2", &p.beta2, "AdamW beta2"),
        make_flag("--eps", &p.eps, "AdamW epsilon"),
        make_flag("--grad-clip", &p.grad_clip, "global grad-norm clip (0: off)"),
        make_flag("--schedule", &p.schedule.kind, kScheduleKinds, ""),
        make_flag("--schedule-steps", &p.schedule.horizon, "steps the schedule runs over (0: --steps; past them the last rate holds)"),
        make_flag("--warmup-frac", &p.schedule.warmup_frac, "warmup fraction of the schedule's steps"),
        make_flag("--decay-frac", &p.schedule.decay_frac, "wsd: decay fraction of the schedule's steps"),
        make_flag("--final-frac", &p.schedule.final_frac, "final rate as a fraction of the peak"),
        make_flag("--seed", &o.seed, "seed of init, data order and sampling"),
        make_flag("--shuffle", &o.shuffle, "shuffle training windows 0|1"),
        make_flag("--verify-data", &o.verify_data, "check the CRC-32 of each token shard and sidecar once, reading it whole when the run opens it; 0: skip (huge corpora) 0|1"),
        make_flag("--val-every", &o.val_every, "validate every N steps (and at the end; 0: only at the end)"),
        make_flag("--val-batches", &o.val_batches, "validation micro-batches (0: the whole validation set once)"),
        make_flag("--val-whole-docs", &o.val_whole_docs, "validate on rows of whole documents (none split; longer ones skipped) 0|1, or 2: on windows and also on whole documents (logged as whole_docs)"),
        make_flag("--train-doc-eval", &o.train_doc_eval, "at each validation, also the loss per region and exercise over a seeded sample of N whole documents of --train-data (those longer than --seq-len + 1 tokens skipped; logged as train_docs; 0: none)"),
        make_flag("--train-doc-seed", &o.train_doc_seed, "seed of the --train-doc-eval sample (the same documents at every validation, on resume, and for every run with the same data and seed; --paper-setup 1: 3407, the SAN paper code's)"),
        make_flag("--train-doc-draw", &o.train_doc_draw, kDocDraws, "how --train-doc-eval draws: uniform over all training documents; paper: the SAN paper code's 1 in 10 of the training data's head in file order (Python's random with --train-doc-seed) until N are kept (--paper-setup 1 sets it); or exercises: uniform over the documents of at most --seq-len + 1 tokens with a query token, so that N exercises are evaluated on data that mixes them with other documents"),
        make_flag("--eval-sets", &o.eval_sets, "eval .bin files to score (comma list; dev/data/evals.py): acc, acc_norm, perplexity, word perplexity"),
        make_flag("--eval-every", &o.eval_every, "score the eval sets every N steps (and at the end; 0: only at the end)"),
        make_flag("--indicator-context", &o.indicator_context, "tokens per window of the attention-pattern indicators and logit distribution at validation: 4 windows of min(N, --seq-len) (0: --seq-len, the training context; --deconstructing-setup 1 sets 0; 257: the SAN paper code's measurement slice, which the effective ranks and max_logit keep)"),
        make_flag("--milestone-evals", &o.milestone_evals, "also score the eval sets at each milestone checkpoint of --milestones (0/25/50/75%: the SAN paper reports LAMBADA and SciQ at an intermediate checkpoint) 0|1"),
        make_flag("--eval-context", &o.eval_context, "also score the rolling eval sets (WikiText) in windows of N tokens, each N <= --seq-len (comma list, e.g. 128,256,512; logged as word_perplexity@N)"),
        make_flag("--sample-every", &o.sample_every, "sample every N steps (0: only at the end)"),
        make_flag("--sample-tokens", &o.sample_tokens, "tokens per sample (0: no samples)"),
        make_flag("--temperature", &o.temperature, "sampling temperature (0: greedy)"),
        make_flag("--log", &o.log_path, "machine-readable log (JSON lines; default: the run directory's log.jsonl); empty: none"),
        make_flag("--log-every", &o.log_every, "print a progress line every N steps"),
        make_flag("--spike-window", &o.spike_window, "loss-spike detection: steps in the running window"),
        make_flag("--spike-z", &o.spike_z, "loss-spike detection: z-score above which a step is logged as a spike (0: off)"),
        make_flag("--spike-guard", &o.spike_guard, "divergence guard: stop (before saving) when the training loss is more than K x the median of the last --spike-window steps, or a validation loss K x that of the last 8 validations, or either is not finite (0: off; the run then stops only on a non-finite training loss)"),
        make_flag("--config", &o.config_path, "a file of `key = value` lines (flag names without --) read before the flags, which win; RUN/config repeats a run"),
        make_flag("--print-config", &o.print_config, "print the resolved config, the rates per group, the sizes, FLOPs/token and the data files, and exit 0|1"),
        make_flag("--run-dir", &o.run_dir, "the run's directory: config, log.jsonl, checkpoints, samples.txt (auto: runs/<preset>-<arm>-<UTC time>, unless --checkpoint-dir or --log is given or nothing trains, --steps 0; empty: none)"),
        make_flag("--checkpoint-dir", &o.checkpoint_dir, "where checkpoints go (empty: none; default: the run directory)"),
        make_flag("--overwrite", &o.overwrite, "a fresh run may write its final.bin over one in --checkpoint-dir, and its --log over an earlier run's (0: refused; another run writing there is refused always) 0|1"),
        make_flag("--check-tokenizer", &o.check_tokenizer, "refuse data (shards, eval sets) that records another tokenizer than --tokenizer or the other data (0: do not compare, for the same pieces written twice) 0|1"),
        make_flag("--keep-last", &o.keep_last, "keep only the N newest step_K.bin checkpoints of --save-every (milestones and final.bin stay; 0: all)"),
        make_flag("--milestones", &o.milestones, "also checkpoint at 0/25/50/75/100% of the steps (milestone_NNN.bin) 0|1"),
        make_flag("--save-every", &o.save_every, "checkpoint every N steps (0: only at the end)"),
        make_flag("--save-minutes", &o.save_minutes, "also checkpoint once M minutes have passed since the last checkpoint (or the start), each such file replacing the one before, so a crash, kill -9 or full disk loses at most M minutes of training (0: off)"),
        make_flag("--stop-grace", &o.stop_grace, "seconds the launcher waits between its stop signal and its kill (Slurm's KillWait, 30 by default): a stop and a slow save say whether the step and its save fit in them"),
        make_flag("--resume", &o.resume_path, "checkpoint to continue exactly: model, optimizer, schedule, steps and data settings all from the file; a run directory: its newest checkpoint; auto: that of --run-dir, else of the newest run under runs/"),
        make_flag("--resume-override", &o.resume_override, "with --resume: the flags given may change the saved run's settings (each is printed) 0|1"),
        make_flag("--extend-to", &o.extend_to, "with --resume: train the saved run on to N steps in total, the schedule recomputed over N unless it has --schedule-steps (printed)"),
        make_flag("--init-from", &o.init_from, "checkpoint to take the model config and parameters from (with --steps 0: evaluate it)"),
        make_flag("--prompt", &o.prompt, "text the samples continue (encoded with --tokenizer; empty: start at BOS)"),
        make_flag("--kv-cache", &o.kv_cache, "sample with a KV cache (one position per token) 0|1"),
        make_flag("--cudnn", &o.cudnn, "cuDNN attention (USE_CUDNN=1 GPU builds; refused with a document mask, which cuDNN lacks) 0|1"),
        make_flag("--attention-kernels", &o.attention_kernels, kAttentionKernels,
                  "our attention kernels in bf16 builds: auto = tensor-cores on a GPU, scalar on the host backend (faster there)"),
        make_flag("--sync-check", &o.sync_check, "debug a GPU fault: wait after every kernel launch and name the kernel that failed, with its launch shape and call site (slow; also ATTN_SYNC_CHECK=1) 0|1"),
        make_flag("--zero", &o.zero, "over several ranks (mpirun): 0 every rank holds all optimizer state | 1 ZeRO-1: optimizer state and master weights sharded over the ranks"),
        make_flag("--overlap-reduce", &o.overlap_reduce, "over several ranks: reduce each layer's gradients on a second stream as soon as the last micro-batch's backward has them (not with --grad-fp32 1) 0|1"),
        make_flag("--grad-groups", &o.grad_groups, "the step's gradient as a fixed sum of this many row groups, the same bits on any rank count that gives each rank a power of two of them (0: the rank count; e.g. 2 on 1 rank = 2 ranks bit for bit)"),
    };
    if (with_muon) {
        std::vector<Flag> muon = {
            make_flag("--muon-order", &p.muon_order, kMuonOrders, "keller: momentum, then orthogonalise, shape factor; paper: orthogonalise, then momentum"),
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

// Where the gradients are summed over micro-batches, as printed and logged.
inline const char* gradient_precision(const TrainOptions& o) {
    return o.grad_fp32 != 0 || PRECISION_MODE == PrecisionMode::FP32 ? "fp32" : PRECISION_NAME;
}

inline void print_optimizer(const TrainOptions& o) {
    const OptimizerConfig& opt = o.opt;
    if (opt.is_muon()) {
        printf("optimizer: muon (%s order, momentum %g, %d NS steps in %s) lr %g, adamw on the rest lr %g", kMuonOrders.name(opt.muon_order),
               opt.muon_momentum, opt.ns_steps, opt.ns_fp32 || PRECISION_MODE == PrecisionMode::FP32 ? "fp32" : "bf16", opt.lr,
               opt.lr_other);
    } else {
        printf("optimizer: adamw lr %g (other %g)", opt.lr, opt.lr_other);
    }
    if (!o.rates_source.empty()) { printf(" (default rates of %s)", o.rates_source.c_str()); }
    if (o.lr_scale_gpus != 1) { printf(" (rates scaled for %d GPUs)", o.lr_scale_gpus); }
    printf("; wd %g%s clip %g, schedule %s (warmup %g, decay %g, final %g", opt.weight_decay,
           opt.decay_embedding ? " (embeddings too)" : "", opt.grad_clip, opt.schedule.name(), opt.schedule.warmup_frac,
           opt.schedule.decay_frac, opt.schedule.final_frac);
    if (opt.schedule.horizon > 0) { printf("; over %ld steps", opt.schedule.horizon); }
    printf("); adamw betas %g/%g eps %g\n", opt.beta1, opt.beta2, opt.eps);
    if (o.world > 1 && o.lr_scale_gpus != o.world) {
        printf("note: %d ranks, rates %s (--lr-scale-gpus %d): they never follow the rank count by themselves\n",
               o.world, o.lr_scale_gpus == 1 ? "as given" : "scaled", o.lr_scale_gpus);
    }
    printf("batch: %d rows per step = %d micro-batches x %d rows", o.global_batch, o.grad_accum, o.batch_size);
    if (o.world > 1) { printf(" x %d ranks", o.world); }
    printf(" of %d tokens; gradients accumulated in %s", o.seq_len, gradient_precision(o));
    if (o.grad_groups != o.world) { printf(", in %d groups (%d per rank)", o.grad_groups, o.grad_groups / o.world); }
    printf("\n");
    if (o.world > 1) {
        printf("ranks: %d; gradients summed over them in %s; zero %d%s\n", o.world, gradient_precision(o), o.zero,
               o.overlap_reduce == 0 ? ""
               : o.grad_fp32 != 0 && PRECISION_MODE != PrecisionMode::FP32
                   ? "; --overlap-reduce ignored: the fp32 accumulator is filled after the backward pass"
                   : "; reduction overlapped with the backward pass (per layer)");
    }
}
