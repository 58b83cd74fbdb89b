/*
What a run started from a checkpoint keeps (host-only C++17): --resume continues the saved run,
its settings from the checkpoint (run_settings) and flags that would change them refused by name
unless --resume-override 1 (continue_saved_run), its outputs from it too unless given, --extend-to
N training it on; a build of the other precision is refused (check_build_precision); the data must
continue where it left off (data_difference); on another rank count the rows per micro-batch carry
over (continue_on_ranks); with --resume or --init-from, model flags that contradict the
checkpoint's config are refused (check_model_flags). Each function says the rest; the keys:
doc/formats.md "Resume state"; what a user sees: doc/trainer.md.
*/
#pragma once

#include <sys/stat.h>

#include <cctype>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <set>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "llmc/cli.h"
#include "llmc/cuda_common.h"  // defines: PRECISION_NAME
#include "llmc/data/dataloader.h"
#include "llmc/number_text.h"
#include "llmc/parallel/grad_groups.h"  // defines: grad_groups_fit
#include "llmc/data/tensor_file.h"
#include "llmc/train/train_options.h"
#include "llmc/utils.h"

// ---- what a resume continues ------------------------------------------------------------
// A checkpoint holds the settings of the run that wrote it (opt.* from OptimizerConfig, run.*
// from run_setting_keys below: steps, data, batch, seed, validation and checkpoint cadence).
// --resume continues that run: every setting comes from the file; a flag given that
// changes one is refused, unless --resume-override 1 (then each change is printed).
// --extend-to N is the one way to train a finished run further: the total becomes N and
// the schedule is recomputed over N steps (printed), unless it has its own horizon
// (--schedule-steps), which it keeps.

// A saved setting's value as a number: the whole text, finite, and (unless `wide`) within an
// int; anything else is refused with the key (a resume's FatalContext names the file).
inline double parse_setting_real(const char* key, const std::string& text) {
    double x;
    if (!parse_finite_real(text.c_str(), &x)) { fatal("checkpoint key %s: '%s' is not a finite number", key, text.c_str()); }
    return x;
}
inline long long parse_setting_integer(const char* key, const std::string& text, bool wide) {
    long long x;
    if (!parse_whole_integer(text.c_str(), &x)) { fatal("checkpoint key %s: '%s' is not an integer", key, text.c_str()); }
    if (!wide && (x < INT32_MIN || x > INT32_MAX)) { fatal("checkpoint key %s: %lld does not fit a 32-bit int", key, x); }
    return x;
}

// `text` as one word of a POSIX shell command line (single-quoted unless it is plainly safe).
inline std::string shell_word(const std::string& text) {
    bool plain = !text.empty();
    for (char c : text) { plain = plain && (isalnum((unsigned char)c) || strchr("_./-+=:,@%", c) != nullptr); }
    if (plain) { return text; }
    std::string out = "'";
    for (char c : text) { out += c == '\'' ? std::string("'\\''") : std::string(1, c); }
    return out + "'";
}

// Whether two paths name the same existing file.
inline bool same_file(const std::string& a, const std::string& b) {
    struct stat sa, sb;
    return stat(a.c_str(), &sa) == 0 && stat(b.c_str(), &sb) == 0 && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

// One setting of a run: its checkpoint key, the flags that set it, and its value as text.
// `output`: where the run's outputs go and what they show (--checkpoint-dir, --log, --tokenizer,
// the samples, the eval sets): a resume restores them from the file so that `--resume CKPT`
// alone continues the run to the same outputs, and a flag given sets them without a refusal
// (they change no number of the run). Two ways to the same state may differ in them, as in
// every run.* key: attnref/ckpt_diff.py leaves those out.
struct RunSetting {
    std::string key;
    std::vector<std::string> flags;
    std::function<std::string(const TrainOptions&)> get;
    std::function<void(TrainOptions&, const std::string&)> set;
    std::string absent = "";  // what a file without the key ran with ("": unknown, the flags' value stands)
    bool output = false;
};

// A text setting's value as one line of a checkpoint's config text (\n and \ escaped) and back.
inline std::string escape_setting(const std::string& v) {
    std::string out;
    for (char c : v) { out += c == '\n' ? std::string("\\n") : c == '\\' ? std::string("\\\\") : std::string(1, c); }
    return out;
}
inline std::string unescape_setting(const std::string& v) {
    std::string out;
    for (size_t i = 0; i < v.size(); i++) {
        if (v[i] == '\\' && i + 1 < v.size()) {
            out += v[i + 1] == 'n' ? '\n' : v[i + 1];
            i++;
        } else {
            out += v[i];
        }
    }
    return out;
}

// Builds the table of RunSettings, one call per setting: its checkpoint key, the flags that set
// it, and the TrainOptions field it reads and sets (a member, or a function to it for a nested one).
struct RunSettingTable {
    std::vector<RunSetting> out;

    void text(const char* key, std::vector<std::string> flags, std::string TrainOptions::*field) {
        out.push_back({key, flags, [field](const TrainOptions& o) { return o.*field; },
                       [field](TrainOptions& o, const std::string& v) { o.*field = v; }});
    }
    // a text that may hold \n (a path, the prompt), escaped in the file
    void path(const char* key, const char* flag, std::string TrainOptions::*field) {
        out.push_back({key, {flag}, [field](const TrainOptions& o) { return escape_setting(o.*field); },
                       [field](TrainOptions& o, const std::string& v) { o.*field = unescape_setting(v); }});
    }
    // a setting with fixed values, as its name (an unknown name in a file fails, naming it)
    template <typename Ref, typename C>
    void choice(const char* key, std::vector<std::string> flags, Ref field, const C& choices) {
        out.push_back({key, flags, [field, &choices](const TrainOptions& o) { return std::string(choices.name(field(const_cast<TrainOptions&>(o)))); },
                       [key, field, &choices](TrainOptions& o, const std::string& v) {
                           if (!choices.parse(v, &field(o))) { fatal("checkpoint key %s: unknown value '%s'", key, v.c_str()); }
                       }});
    }
    void real(const char* key, std::vector<std::string> flags, std::function<double&(TrainOptions&)> ref) {
        out.push_back({key, flags, [ref](const TrainOptions& o) { return shortest_real_text(ref(const_cast<TrainOptions&>(o))); },
                       [key, ref](TrainOptions& o, const std::string& v) { ref(o) = parse_setting_real(key, v); }});
    }
    // an integer field of any width; the file's value must fit an int unless `wide` (run.steps, the seeds)
    template <typename Ref>
    void integer(const char* key, std::vector<std::string> flags, Ref ref, bool wide = false) {
        using T = std::remove_reference_t<decltype(ref(std::declval<TrainOptions&>()))>;
        out.push_back({key, flags, [ref](const TrainOptions& o) { return std::to_string((long long)ref(const_cast<TrainOptions&>(o))); },
                       [key, ref, wide](TrainOptions& o, const std::string& v) { ref(o) = (T)parse_setting_integer(key, v, wide); }});
    }
    template <typename T>
    void integer(const char* key, std::vector<std::string> flags, T TrainOptions::*field, bool wide = false) {
        integer(key, flags, [field](TrainOptions& o) -> T& { return o.*field; }, wide);
    }
    // what a file without the last setting's key ran with
    void absent(const char* value) { out.back().absent = value; }
};

// The settings of what the run computes: the optimizer, the schedule, the data, the batch, the
// seed, validation and checkpoint cadence. A resume keeps them (a flag that changes one is refused).
inline void add_trained_settings(RunSettingTable& t) {
    t.integer("run.steps", {"--steps"}, &TrainOptions::steps, true);
    t.choice("opt.optimizer", {"--optimizer"}, [](TrainOptions& o) -> OptimizerKind& { return o.opt.optimizer; }, kOptimizerKinds);
    t.real("opt.lr", {"--lr", "--lr-scale-gpus"}, [](TrainOptions& o) -> double& { return o.opt.lr; });
    t.real("opt.lr_other", {"--lr-other", "--lr-scale-gpus"}, [](TrainOptions& o) -> double& { return o.opt.lr_other; });
    t.integer("run.lr_scale_gpus", {"--lr-scale-gpus"}, &TrainOptions::lr_scale_gpus);
    t.real("opt.weight_decay", {"--weight-decay"}, [](TrainOptions& o) -> double& { return o.opt.weight_decay; });
    t.real("opt.beta1", {"--beta1"}, [](TrainOptions& o) -> double& { return o.opt.beta1; });
    t.real("opt.beta2", {"--beta2"}, [](TrainOptions& o) -> double& { return o.opt.beta2; });
    t.real("opt.eps", {"--eps"}, [](TrainOptions& o) -> double& { return o.opt.eps; });
    t.real("opt.grad_clip", {"--grad-clip"}, [](TrainOptions& o) -> double& { return o.opt.grad_clip; });
    t.choice("opt.muon_order", {"--muon-order"}, [](TrainOptions& o) -> MuonOrder& { return o.opt.muon_order; }, kMuonOrders);
    t.real("opt.muon_momentum", {"--muon-momentum"}, [](TrainOptions& o) -> double& { return o.opt.muon_momentum; });
    t.integer("opt.ns_steps", {"--ns-steps"}, [](TrainOptions& o) -> int& { return o.opt.ns_steps; });
    t.integer("opt.ns_fp32", {"--ns-fp32"}, [](TrainOptions& o) -> int& { return o.opt.ns_fp32; });
    t.choice("opt.schedule", {"--schedule"}, [](TrainOptions& o) -> ScheduleKind& { return o.opt.schedule.kind; }, kScheduleKinds);
    t.real("opt.warmup_frac", {"--warmup-frac"}, [](TrainOptions& o) -> double& { return o.opt.schedule.warmup_frac; });
    t.real("opt.decay_frac", {"--decay-frac"}, [](TrainOptions& o) -> double& { return o.opt.schedule.decay_frac; });
    t.real("opt.final_frac", {"--final-frac"}, [](TrainOptions& o) -> double& { return o.opt.schedule.final_frac; });
    // written only when set (OptimizerConfig::write): a file without it ran over its own steps
    t.integer("opt.schedule_steps", {"--schedule-steps"}, [](TrainOptions& o) -> long& { return o.opt.schedule.horizon; }, true);
    t.absent("0");
    t.integer("opt.decay_embedding", {"--decay-embedding"}, [](TrainOptions& o) -> int& { return o.opt.decay_embedding; });
    t.absent("0");  // (also written only when set)
    t.text("run.train_data", {"--train-data"}, &TrainOptions::train_data);
    t.integer("run.batch_size", {"--batch-size"}, &TrainOptions::batch_size);
    t.integer("run.grad_accum", {"--grad-accum", "--global-batch", "--batch-size"}, &TrainOptions::grad_accum);
    // written only when it is not the rank count (run_setting_keys); absent: 0, which a resume
    // reads as the saved run's rank count (continue_on_ranks)
    t.integer("run.grad_groups", {"--grad-groups"}, &TrainOptions::grad_groups);
    t.absent("0");
    t.integer("run.seq_len", {"--seq-len"}, &TrainOptions::seq_len);
    t.integer("run.grad_fp32", {"--grad-fp32"}, &TrainOptions::grad_fp32);
    t.integer("run.shuffle", {"--shuffle"}, &TrainOptions::shuffle);
    t.integer("run.seed", {"--seed"}, &TrainOptions::seed, true);
    t.text("run.val_data", {"--val-data"}, &TrainOptions::val_data);
    t.integer("run.val_every", {"--val-every"}, &TrainOptions::val_every);
    t.integer("run.val_batches", {"--val-batches"}, &TrainOptions::val_batches);
    t.integer("run.val_whole_docs", {"--val-whole-docs"}, &TrainOptions::val_whole_docs);
    // written only when --train-doc-eval is on (run_setting_keys): the checkpoints of runs
    // without it stay as they were; a file without them ran without
    t.integer("run.train_doc_eval", {"--train-doc-eval"}, &TrainOptions::train_doc_eval);
    t.absent("0");
    t.integer("run.train_doc_seed", {"--train-doc-seed"}, &TrainOptions::train_doc_seed, true);
    t.absent("0");
    t.choice("run.train_doc_draw", {"--train-doc-draw"}, [](TrainOptions& o) -> DocDraw& { return o.train_doc_draw; }, kDocDraws);
    t.absent("uniform");  // (files from before issue 47 drew uniformly)
    t.integer("run.save_every", {"--save-every"}, &TrainOptions::save_every);
    t.integer("run.milestones", {"--milestones"}, &TrainOptions::milestones);
}

// The outputs (RunSetting::output): where the run writes and what it shows. Absent in files from
// before 2026-12-03: the flags' values stand.
inline void add_output_settings(RunSettingTable& t) {
    t.path("run.run_dir", "--run-dir", &TrainOptions::run_dir);
    t.path("run.checkpoint_dir", "--checkpoint-dir", &TrainOptions::checkpoint_dir);
    t.integer("run.keep_last", {"--keep-last"}, &TrainOptions::keep_last);
    t.path("run.log", "--log", &TrainOptions::log_path);
    t.integer("run.log_every", {"--log-every"}, &TrainOptions::log_every);
    t.path("run.tokenizer", "--tokenizer", &TrainOptions::tokenizer_path);
    t.integer("run.sample_every", {"--sample-every"}, &TrainOptions::sample_every);
    t.integer("run.sample_tokens", {"--sample-tokens"}, &TrainOptions::sample_tokens);
    t.out.push_back({"run.temperature", {"--temperature"},
                     [](const TrainOptions& o) { return shortest_float_text(o.temperature); },
                     [](TrainOptions& o, const std::string& v) { o.temperature = (float)parse_setting_real("run.temperature", v); }});
    t.path("run.prompt", "--prompt", &TrainOptions::prompt);
    t.integer("run.kv_cache", {"--kv-cache"}, &TrainOptions::kv_cache);
    t.path("run.eval_sets", "--eval-sets", &TrainOptions::eval_sets);
    t.integer("run.eval_every", {"--eval-every"}, &TrainOptions::eval_every);
}

// The saved run's settings: one table of key, flags, value (the trained settings, then the
// outputs, which flags given set freely).
inline std::vector<RunSetting> run_settings() {
    RunSettingTable t;
    add_trained_settings(t);
    const size_t first_output = t.out.size();
    add_output_settings(t);
    for (size_t i = first_output; i < t.out.size(); i++) { t.out[i].output = true; }
    return t.out;
}

// The run.* keys a checkpoint of this run holds (the opt.* keys come from OptimizerConfig);
// the --train-doc-eval ones only when it is on, run.grad_groups only when not the rank count.
inline std::vector<std::pair<std::string, std::string>> run_setting_keys(const TrainOptions& o) {
    std::vector<std::pair<std::string, std::string>> out;
    for (const RunSetting& s : run_settings()) {
        if (s.key.rfind("run.train_doc_", 0) == 0 && o.train_doc_eval == 0) { continue; }
        if (s.key == "run.grad_groups" && o.grad_groups == o.world) { continue; }
        if (s.key.rfind("run.", 0) == 0) { out.push_back({s.key, s.get(o)}); }
    }
    return out;
}

// Whether a path has a ".." component.
inline bool has_parent_step(const std::string& path) {
    for (size_t at = 0; at <= path.size();) {
        size_t end = path.find('/', at);
        if (end == std::string::npos) { end = path.size(); }
        if (path.compare(at, end - at, "..") == 0 && end - at == 2) { return true; }
        at = end + 1;
    }
    return false;
}

// The places a resume would write to because the checkpoint names them (`written`: {flag, path}
// of the run directory, checkpoint directory and log taken from the file) are the saved run's
// own only when the checkpoint lies there: a copy of a colleague's checkpoint, or a file moved
// since, must not write over (and --keep-last prune) the run that happens to be at that path
// now. So they are followed only when the checkpoint's directory is the saved checkpoint or run
// directory, and never when they have a ".." component (text from a file must not lead out of
// the tree), and only where they lie in the checkpoint's directory once resolved (no absolute
// path, no symbolic link out); otherwise the resume is refused, saying what to give.
inline void check_saved_output_places(const TensorFileReader& ckpt, const std::vector<std::pair<std::string, std::string>>& written) {
    if (written.empty()) { return; }
    const std::string& path = ckpt.path();
    const std::string home = path.find('/') == std::string::npos ? "." : path.substr(0, path.find_last_of('/'));
    bool at_home = false;
    for (const char* key : {"run.checkpoint_dir", "run.run_dir"}) {
        if (ckpt.has_key(key) && !ckpt.str(key).empty()) { at_home = at_home || same_file(unescape_setting(ckpt.str(key)), home); }
    }
    std::string list;
    bool parent = false;
    for (const auto& [flag, place] : written) {
        list += (list.empty() ? "" : ", ") + flag + " " + place;
        parent = parent || has_parent_step(place);
    }
    if (parent) {
        fatal("--resume %s: the file names its outputs with '..' (%s), which a resume does not follow: give this run's "
              "outputs with --run-dir DIR (or --checkpoint-dir and --log)", path.c_str(), list.c_str());
    }
    if (!at_home) {
        fatal("--resume %s: the saved run wrote to %s, which does not hold this checkpoint (a copy, or a directory "
              "moved since): resumed there it would write over whatever run is there now. Give this run's outputs "
              "with --run-dir DIR (e.g. --run-dir %s-resumed), or --checkpoint-dir and --log", path.c_str(),
              list.c_str(), shell_word(home).c_str());
    }
    // the checkpoint's own tree: text from a file never leads a write elsewhere, whether by an
    // absolute path (a shell's start-up file, the original of a copied run) or by a symbolic link
    // on the way: each place is resolved and must lie in the checkpoint's resolved directory
    const std::string tree = resolved_path(home);
    for (const auto& [flag, place] : written) {
        const std::string real = resolved_path(place);
        if (path_inside(real, tree)) { continue; }  // (an absolute path too, where it leads nowhere else)
        fatal("--resume %s: the file names %s %s, which lies outside the checkpoint's directory %s%s: a resume writes "
              "only where the checkpoint lies unless told. To continue there, give %s %s", path.c_str(), flag.c_str(),
              place.c_str(), tree.c_str(), real == place ? "" : (" (it is " + real + ")").c_str(), flag.c_str(),
              shell_word(place).c_str());
    }
}

// --extend-to of a finished run in its own directory would write final.bin over the file it
// starts from, and its milestones over the saved run's: it goes beside it, DIR-to-N. A run in
// its run directory continues as a run directory of its own there (its config, checkpoints,
// and a log and samples.txt that start as copies of the saved run's, so its curves and a later
// --resume DIR-to-N see the whole run); the saved run's directory stays as it was.
inline void extend_beside(TrainOptions& o, const TensorFileReader& ckpt, std::vector<std::string>& restored) {
    if (o.extend_to == 0 || o.given.count("--checkpoint-dir") || o.checkpoint_dir.empty() ||
        !same_file(o.checkpoint_dir + "/final.bin", ckpt.path())) {
        return;
    }
    const std::string beside = o.checkpoint_dir + "-to-" + std::to_string(o.extend_to);
    const bool whole_run = !o.run_dir.empty() && !o.given.count("--run-dir") && same_file(o.run_dir, o.checkpoint_dir);
    if (!newest_checkpoint(beside).empty()) {
        fatal("--extend-to %ld: %s holds this extension already (%s): continue it with --resume %s", o.extend_to,
              beside.c_str(), newest_checkpoint(beside).c_str(), shell_word(beside).c_str());
    }
    if (whole_run) {
        o.extended_from = o.run_dir;
        if (!o.given.count("--log") && o.log_path == o.run_dir + "/log.jsonl") { o.log_path = beside + "/log.jsonl"; }
        o.run_dir = beside;
    }
    o.checkpoint_dir = beside;
    for (std::string& r : restored) {
        if (r.rfind("--checkpoint-dir ", 0) == 0) { r = "--checkpoint-dir " + beside + " (beside the saved run's)"; }
        if (whole_run && r.rfind("--run-dir ", 0) == 0) {
            r = "--run-dir " + beside + " (beside the saved run's: its log and samples continue there)";
        }
        if (whole_run && r.rfind("--log ", 0) == 0) { r = "--log " + o.log_path; }
    }
}

// The directories DIR-to-N beside `dir` that hold a checkpoint (the extensions of its run).
inline std::vector<std::string> extensions_of(const std::string& dir) {
    const size_t slash = dir.find_last_of('/');
    const std::string parent = slash == std::string::npos ? "." : dir.substr(0, slash);
    const std::string base = (slash == std::string::npos ? dir : dir.substr(slash + 1)) + "-to-";
    std::vector<std::string> out;
    for (const std::string& n : directory_names(parent)) {
        const std::string d = (slash == std::string::npos ? "" : parent + "/") + n;
        if (n.rfind(base, 0) == 0 && !newest_checkpoint(d).empty()) { out.push_back(d); }
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
    std::vector<std::string> restored;  // the outputs taken from the file
    std::vector<std::pair<std::string, std::string>> written;  // of them, where the run writes: {flag, path}
    for (const RunSetting& s : run_settings()) {
        if (!ckpt.has_key(s.key) && s.absent.empty()) { continue; }
        s.set(saved, ckpt.has_key(s.key) ? ckpt.str(s.key) : s.absent);
        std::string from_file = s.get(saved), from_flags = s.get(o);
        if (from_file == from_flags) { continue; }
        if (s.output) {  // a flag given wins; else the saved run's
            if (o.given.count(s.flags[0])) {
                s.set(saved, from_flags);
            } else {
                restored.push_back(s.flags[0] + " " + (from_file.empty() ? "''" : from_file));
                if (s.key == "run.run_dir" || s.key == "run.checkpoint_dir" || s.key == "run.log") {
                    written.push_back({s.flags[0], unescape_setting(ckpt.str(s.key))});
                }
            }
            continue;
        }
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
    check_saved_output_places(ckpt, written);
    std::set<std::string> given = o.given;
    long extend_to = o.extend_to;
    int override_ = o.resume_override;
    o = saved;
    o.given = given;
    o.extend_to = extend_to;
    o.resume_override = override_;
    // the saved run's id goes on (a file from before run ids: this run names itself)
    o.record.id = ckpt.has_key("run.id") ? ckpt.str("run.id") : "";
    if (o.record.id.size() > 32 || o.record.id.find_first_not_of("0123456789abcdef") != std::string::npos) {
        ckpt.fail("run.id '%s' is not a run id (hex digits)", o.record.id.c_str());
    }
    long done = (long)ckpt.integer("step");
    if (done < 0) { ckpt.fail("step is %ld: a saved run has done 0 or more steps", done); }
    printf("resume: continuing the run saved in %s at step %ld of %ld (optimizer, schedule, steps and data settings "
           "from the file)\n", ckpt.path().c_str(), done, o.steps);
    for (const std::string& c : changes) { printf("resume: --resume-override 1: %s\n", c.c_str()); }
    extend_beside(o, ckpt, restored);
    if (!restored.empty()) {
        std::string list;
        for (const std::string& r : restored) { list += (list.empty() ? "" : ", ") + r; }
        printf("resume: outputs as the saved run's: %s\n", list.c_str());
    }
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
        std::string how = sch.horizon > 0 ? "keeps its horizon of " + std::to_string(sch.horizon) + " steps (--schedule-steps)"
                                          : "is recomputed over " + std::to_string(o.extend_to) + " steps";
        printf("extend: %ld -> %ld steps; the %s schedule %s: step %ld runs at lr %.3e (step %ld of the saved run ran "
               "at %.3e)\n", o.steps, o.extend_to, sch.name(), how.c_str(), done + 1, o.opt.lr * after, done,
               o.opt.lr * before);
        // a WSD run past the start of its decay climbs back up (its schedule is recomputed over
        // the new length, unless a --schedule-steps horizon holds it): its annealed gains are undone
        // (0-based step S - D still runs at the peak; the rate falls from the next one)
        const long decay_from = o.steps - Schedule::floor_steps(sch.decay_frac, o.steps) + 1;
        if (sch.kind == ScheduleKind::WSD && sch.horizon == 0 && decay_from < o.steps && done > decay_from) {
            printf("hint: this WSD run was in its decay (from step %ld of %ld), so extending it raises the rate again; "
                   "WSD runs are best extended from a checkpoint before the decay (--save-every N or --milestones 1 "
                   "write them)\n", decay_from + 1, o.steps);
        }
        o.steps = o.extend_to;
    } else if (done >= o.steps) {
        const std::string& path = ckpt.path();
        std::string extended;
        for (const std::string& d : extensions_of(path.find('/') == std::string::npos ? "." : path.substr(0, path.find_last_of('/')))) {
            extended += (extended.empty() ? " It was extended in " : ", ") + d + " (--resume " + shell_word(d) + ")";
        }
        fatal("--resume %s: that run finished (%ld of %ld steps).%s%s --extend-to N trains it on to N steps with the "
              "schedule recomputed over N; --steps 0 --init-from %s evaluates it", path.c_str(), done, o.steps,
              extended.c_str(), extended.empty() ? "" : ".", path.c_str());
    }
}

// ---- the build's precision against a checkpoint's ---------------------------------------
// run.precision: the precision of the build that wrote the file (bf16 or fp32; files from
// before 2026-12-03 and the reference's have none, and are taken as they are). Resumed on the
// other precision a run is no longer the same run (other rounding from its first step), so
// --resume refuses it unless --resume-override 1; --init-from starts a new run anyway and says
// so in one line.
inline void check_build_precision(const TensorFileReader& ckpt, bool resuming, int resume_override) {
    if (!ckpt.has_key("run.precision") || ckpt.str("run.precision") == PRECISION_NAME) { return; }
    const std::string saved = ckpt.str("run.precision");
    if (!resuming) {
        printf("note: %s was written by a %s build; this %s build starts from its values\n", ckpt.path().c_str(),
               saved.c_str(), PRECISION_NAME);
    } else if (resume_override == 0) {
        fatal("--resume %s: the run was trained by a %s build and this one is %s: continued here it would no longer be "
              "the same run. Resume it with a %s build, add --resume-override 1 to continue it in %s anyway, or start a "
              "new run from the model with --init-from", ckpt.path().c_str(), saved.c_str(), PRECISION_NAME,
              saved.c_str(), PRECISION_NAME);
    } else {
        printf("resume: --resume-override 1: precision %s (the saved run's %s)\n", PRECISION_NAME, saved.c_str());
    }
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

inline int64_t data_tokens(const DataLoader& d) {
    int64_t tokens = 0;
    for (const ShardInfo& s : d.shards()) { tokens += s.ntok; }
    return tokens;
}

// How many ranks wrote the checkpoint (files from before run.ranks: 1).
inline int saved_rank_count(const TensorFileReader& ckpt) {
    if (!ckpt.has_key("run.ranks")) { return 1; }
    int ranks = ckpt.int32("run.ranks");
    if (ranks < 1) { ckpt.fail("run.ranks is %d: a run has at least one rank", ranks); }
    return ranks;
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
    // rows per micro-batch over the ranks: the unit of the data position
    const long long saved_ranks = saved_rank_count(ckpt);
    if (ckpt.has_key("run.batch_size") && ckpt.integer("run.batch_size") * saved_ranks != (long long)o.batch_size * o.world) {
        why += std::string(why.empty() ? "" : "; ") + "rows per micro-batch: " + std::to_string(o.batch_size) + " x " +
               std::to_string(o.world) + " ranks now, " + std::to_string(ckpt.integer("run.batch_size")) + " x " +
               std::to_string(saved_ranks) + " when saved";
    }
    differs("run.shuffle", o.shuffle, "--shuffle");
    if (o.shuffle) { differs("run.seed", (long long)o.seed, "--seed (the shuffle order)"); }
    return why;
}

// --resume on another rank count than the saved run's (run.ranks; files without it: 1
// rank): the same rows per micro-batch over all ranks, so the global batch, the data
// position (counted in those rows) and the schedule carry over; --batch-size becomes the
// saved rows / o.world (printed). A rank count that does not divide them is refused.
inline void continue_on_ranks(TrainOptions& o, const TensorFileReader& ckpt) {
    const long long saved_ranks = saved_rank_count(ckpt);
    if (o.grad_groups == 0) { o.grad_groups = (int)saved_ranks; }  // (the saved run's default)
    if (saved_ranks == o.world) { return; }
    const long long rows = (long long)o.batch_size * saved_ranks;
    if (rows % o.world != 0) {
        fatal("--resume %s: the saved run read %lld rows per micro-batch (%lld ranks x --batch-size %d); %d ranks cannot "
              "split them evenly: resume on a rank count that divides %lld", ckpt.path().c_str(), rows, saved_ranks,
              o.batch_size, o.world, rows);
    }
    printf("resume: %d ranks now, %lld when saved: --batch-size %lld per rank keeps the %lld rows per micro-batch\n",
           o.world, saved_ranks, rows / o.world, rows);
    o.batch_size = (int)(rows / o.world);
    // the gradient groups carry over where the new count splits them (the same bits); else
    // one group per rank, and the sums' order changes
    if (!grad_groups_fit(o.grad_groups, o.world)) {
        printf("resume: %d gradient groups when saved do not split over %d ranks: %d groups from now on (the sums' order "
               "changes: the run continues to rounding, not bit for bit; --grad-groups in the first run keeps the bits)\n",
               o.grad_groups, o.world, o.world);
        o.grad_groups = o.world;
    }
}
