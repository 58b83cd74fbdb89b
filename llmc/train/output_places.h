/*
Where a run writes (its --run-dir, --checkpoint-dir and --log), made ready by rank 0 before the
first step: the checkpoint directory created and writable, each place locked against a second
run (llmc/train/output_lock.h), the saves a killed run left unfinished removed, a resumed log
checked to be this run's, the run directory made with the resolved config, and a fresh run
refused where it would replace an earlier run's work. All of it fails at the start, not after
hours of training. What the run writes as it goes is llmc/train/run_outputs.h.
*/
#pragma once

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "llmc/config_file.h"  // defines: config_text
#include "llmc/data/tensor_file.h"  // defines: TensorFileReader
#include "llmc/train/output_lock.h"  // defines: OutputLocks
#include "llmc/train/resume.h"  // defines: same_file, shell_word
#include "llmc/train/run_record.h"  // defines: newest_checkpoint, unfinished_saves, log_owner, resolved_path, path_inside
#include "llmc/train/train_options.h"  // defines: TrainOptions, start_checkpoint
#include "llmc/utils.h"  // defines: fatal, AtomicFileWriter, copy_file

// The steps at which milestone checkpoints are written: round(p * steps / 100) for p in
// 0, 25, 50, 75, 100, as {percent, step}.
inline std::vector<std::pair<int, long>> milestone_steps(long steps) {
    std::vector<std::pair<int, long>> out;
    for (int p : {0, 25, 50, 75, 100}) { out.push_back({p, (long)std::floor(p * (double)steps / 100.0 + 0.5)}); }
    return out;
}

// The places of one run as the options name them; `checkpoint`: the --resume file, or null; `rank`:
// this process's (rank 0 alone writes).
struct OutputPlaces {
    const TrainOptions& o;
    const TensorFileReader* checkpoint;
    int rank;

    // Once every input has been read (a run refused for its inputs leaves nothing): each place
    // made ready, in this order.
    void prepare() const {
        check_checkpoint_dir();
        lock_outputs();
        remove_unfinished_saves();
        check_log_is_this_runs();
        prepare_run_dir();
        check_earlier_run_kept();
    }

    // Refuses a run that would write one of its checkpoints (those after the `done` steps it starts
    // from) over the checkpoint it starts from.
    void check_start_not_overwritten(long done) const {
        const std::string start_file = start_checkpoint(o);
        if (o.checkpoint_dir.empty() || start_file.empty() || o.steps == 0) { return; }
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

private:
    // Creates --checkpoint-dir (and its parents) and checks that it can be written: fail now, not
    // after hours of training.
    void check_checkpoint_dir() const {
        if (o.checkpoint_dir.empty()) { return; }
        make_directories(o.checkpoint_dir, "--checkpoint-dir");
        if (access(o.checkpoint_dir.c_str(), W_OK | X_OK) != 0) {
            fatal("--checkpoint-dir '%s': cannot write there: %s", o.checkpoint_dir.c_str(), strerror(errno));
        }
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
};
