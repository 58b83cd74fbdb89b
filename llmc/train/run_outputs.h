/*
What a run writes as it goes (rank 0 writes; every rank keeps the same account): the --log, the
checkpoints' names, times and pruning, the samples file of the run directory, and the words of a
stop: what Ctrl-C would lose and the command that continues the run. The training loop
(llmc/train/training.h) decides when to save and writes the model; RunOutputs names, times and
keeps the files. The places themselves are made ready before the first step (output_places.h).

The newest checkpoint is kept here as it is written (and at a resume), and the command that
continues from it is made once per checkpoint: a stop's notes are set at every step, and the
command resolves paths (doc/multi-gpu.md "Stopping on a cluster").
*/
#pragma once

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "llmc/cuda_common.h"  // defines: HOST_BACKEND, PRECISION_NAME
#include "llmc/data/tensor_file.h"  // defines: TensorFileReader
#include "llmc/train/output_places.h"  // defines: OutputPlaces
#include "llmc/train/run_log.h"  // defines: LogFile
#include "llmc/train/run_record.h"  // defines: json_string, directory_names, prune_step_checkpoints
#include "llmc/train/save_clock.h"  // defines: SaveClock
#include "llmc/train/train_options.h"  // defines: TrainOptions
#include "llmc/utils.h"  // defines: fatal, FatalContext, Timer

class RunOutputs {
public:
    // `checkpoint`: the --resume file, or null; `rank` of `world` ranks.
    RunOutputs(const TrainOptions& o, const TensorFileReader* checkpoint, int rank, int world)
        : o(o), checkpoint(checkpoint), rank(rank), world(world), places{o, checkpoint, rank},
          newest_(checkpoint != nullptr ? checkpoint->path() : "") {}

    LogFile log;  // rank 0's --log file (llmc/train/run_log.h)

    // Rank 0 opens --log: appended to when the run continues one (`steps_done` > 0), else written
    // anew. `attention_kernels`: the model's (the run record names them).
    void open_log(long steps_done, const char* attention_kernels) {
        if (o.log_path.empty() || rank != 0) { return; }
        const bool resumed = checkpoint != nullptr && steps_done > 0;
        log.open(o.log_path, resumed);
        // what ran, with which settings, rates, commit and build (no "step": the step-record
        // readers skip it); a resumed run appends its own
        log.record("{\"run\": " + o.record.json(HOST_BACKEND ? "host backend" : "GPU", PRECISION_NAME,
                                                attention_kernels) + "}");
        // the records after this step that the log already holds (written after the checkpoint, before
        // the run stopped) are superseded by what follows: readers drop them (doc/formats.md)
        if (resumed) {
            log.record("{\"step\": " + std::to_string(steps_done) + ", \"resume\": " +
                       json_string(checkpoint->path()) + "}");
        }
    }
    void close_log() { log.close(); }

    // On --resume from a checkpoint that holds a validation: a step file of --checkpoint-dir whose
    // loss is finite (`finite`) is the one --keep-last keeps.
    void resumed_with_validation(bool finite) {
        const std::string& path = checkpoint->path();
        const std::string base = path.substr(path.find_last_of('/') + 1);
        const std::string dir = path.find('/') == std::string::npos ? "." : path.substr(0, path.find_last_of('/'));
        if (finite && base.rfind("step_", 0) == 0 && !o.checkpoint_dir.empty() && same_file(dir, o.checkpoint_dir)) {
            good_checkpoint = base;
        }
    }

    // Before the first step: the steps already done, and the --save-minutes clock started.
    void begin_steps(long first) {
        first_step = first;
        save_clock.grace = o.stop_grace;
        since_save = Timer();
    }
    void step_took(double seconds) { save_clock.step_s = seconds; }

    // Writes --checkpoint-dir/name with `write` (the model, optimizer and run state), after `done`
    // steps; `validated`: the last validation's loss is finite (a step file --keep-last keeps).
    // `timed`: a --save-minutes save, which the next checkpoint makes redundant (and removes).
    void save(const std::string& name, long done, bool validated, bool timed,
              const std::function<void(const std::string& path)>& write) {
        const std::string path = o.checkpoint_dir + "/" + name;
        const FatalContext failing([this] {  // (a failed write, e.g. a full disk: how to go on)
            return "the run stops; " + (newest_.empty() ? "it saved no checkpoint before: start it again with room "
                                        "under --checkpoint-dir " + o.checkpoint_dir : "once " + o.checkpoint_dir +
                                        " has room, continue from " + newest_ + " with: " + continue_command());
        }, "continue from");
        Timer clock;
        write(path);
        printf("saved %s%s\n", path.c_str(), timed ? " (--save-minutes: replaced by the next checkpoint)" : "");
        note_save_time(path, clock.ms() / 1e3);
        last_saved_step_ = done;
        newest_ = path;
        command_made = false;
        since_save = Timer();
        if (!timed_save.empty() && timed_save != path && rank == 0 && remove(timed_save.c_str()) == 0) {
            printf("removed %s (the timed save before %s)\n", timed_save.c_str(), name.c_str());
        }
        timed_save = timed ? path : "";
        if (name.rfind("step_", 0) != 0) { return; }
        if (validated) { good_checkpoint = name; }
        if (o.keep_last > 0 && rank == 0) {
            // (the newest with a finite validation loss stays, however many newer ones have none)
            for (const std::string& gone : prune_step_checkpoints(o.checkpoint_dir, o.keep_last, good_checkpoint)) {
                printf("removed %s/%s (--keep-last %d)\n", o.checkpoint_dir.c_str(), gone.c_str(), o.keep_last);
            }
        }
    }

    // The checkpoint written last, else the one this run resumed from ("" for neither).
    const std::string& newest() const { return newest_; }
    // After how many steps this run saved last (-1: not yet).
    long last_saved_step() const { return last_saved_step_; }
    bool saved_any() const { return last_saved_step_ >= 0; }
    double ms_since_save() const { return since_save.ms(); }

    // The command that continues this run from its newest checkpoint: --resume with the run
    // directory where the checkpoint lies in it (as the refusal of a second fresh run says).
    const std::string& continue_command() const {
        if (command_made) { return command; }
        const std::string launcher = world > 1 ? "mpirun -np " + std::to_string(world) + " " : "";
        const bool in_run_dir = !o.run_dir.empty() && newest_.rfind(o.run_dir + "/", 0) == 0;
        command = launcher + shell_word(o.program) + " --resume " + shell_word(in_run_dir ? o.run_dir : newest_) +
                  places.outputs_outside(newest_.find('/') == std::string::npos
                                             ? "." : newest_.substr(0, newest_.find_last_of('/')));
        command_made = true;
        return command;
    }

    // What a stop without saving loses during step `step` (or once it is done).
    std::string lost_since_last_save(long step) const {
        const long from = saved_any() ? last_saved_step_ + 1 : first_step + 1;
        const std::string steps = from == step ? "step " + std::to_string(step)
                                               : "steps " + std::to_string(from) + ".." + std::to_string(step);
        const std::string lost = steps + (from == step ? " is lost" : " are lost");
        if (newest_.empty()) { return lost + " (the run saved no checkpoint)"; }
        return lost + "; continue from step " + std::to_string(from - 1) + " with: " + continue_command();
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
        if (!o.checkpoint_dir.empty()) { first += "; " + save_clock.fit(newest_); }
        return {first, "stopped without saving; " + lost_since_last_save(done)};
    }

    // Appends a sample to the run directory's samples.txt.
    void append_sample(long step, const std::string& text) const {
        if (o.run_dir.empty()) { return; }
        const std::string path = o.run_dir + "/samples.txt";
        FILE* f = fopen(path.c_str(), "a");
        if (f == nullptr) { fatal("--run-dir: cannot append to %s: %s", path.c_str(), strerror(errno)); }
        const bool written = fprintf(f, "step %ld: %s\n", step, text.c_str()) >= 0;
        if (fclose(f) != 0 || !written) { fatal("--run-dir: cannot write %s: %s", path.c_str(), strerror(errno)); }
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

private:
    const TrainOptions& o;
    const TensorFileReader* checkpoint;  // the --resume file, or null
    const int rank, world;
    const OutputPlaces places;
    std::string newest_;                 // newest()
    long last_saved_step_ = -1;          // last_saved_step()
    mutable std::string command;         // continue_command(), made for newest_ when command_made
    mutable bool command_made = false;
    long first_step = 0;                 // the steps done before this run
    std::string good_checkpoint;         // the newest step_K.bin saved with a finite validation loss
    std::string timed_save;              // the path of the last save --save-minutes made, until a newer one
    Timer since_save;                    // since the last checkpoint (or the first step): --save-minutes
    SaveClock save_clock;                // the last step's and save's times against --stop-grace

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
};
