/*
How long a run's saves take against the launcher's grace (doc/multi-gpu.md "Stopping on a
cluster"): a launcher kills --stop-grace seconds after its stop signal (Slurm's KillWait, Open
MPI's 1 s), and a stop first ends the step in progress, then saves it. The training loop records
each step's and each save's time here; a stop's note says whether the two fit, and a save longer
than the grace is said once, when it happens.
*/
#pragma once

#include <sys/stat.h>

#include <cstdio>
#include <string>

#include "llmc/number_text.h"  // defines: shortest_real_text

struct SaveClock {
    double grace = 30.0;       // --stop-grace: seconds from the stop signal to the kill
    double save_s = -1.0;      // the last save's seconds (-1: none yet)
    double save_mb = 0.0;      // its size, where this process wrote it (rank 0), else 0
    double step_s = 0.0;       // the last step's seconds

    // Records a save of `path` that took `seconds` (`wrote`: this process wrote the file); returns
    // whether it is the first to take longer than the grace (the caller warns once).
    bool saved(const std::string& path, double seconds, bool wrote) {
        struct stat st;
        save_mb = wrote && stat(path.c_str(), &st) == 0 ? st.st_size / 1e6 : 0.0;
        const bool first_too_slow = seconds > grace && !(save_s > grace);
        save_s = seconds;
        return first_too_slow;
    }

    // "12.3 s (1490 MB, 121 MB/s)": the last save's time, and its size and rate where known.
    std::string save_text() const {
        char text[96];
        if (save_mb > 0.0 && save_s > 0.0) {
            snprintf(text, sizeof(text), "%.1f s (%.0f MB, %.0f MB/s)", save_s, save_mb, save_mb / save_s);
        } else {
            snprintf(text, sizeof(text), "%.1f s", save_s);
        }
        return text;
    }

    // Whether the step in progress and its save fit in the grace, by the last step's and the last
    // save's times; `kept`: the checkpoint a kill during the save leaves ("" for none).
    std::string fit(const std::string& kept) const {
        if (save_s < 0.0) { return "no save of this run timed yet against --stop-grace " + shortest_real_text(grace) + " s"; }
        char text[192];
        const double need = step_s + save_s;
        snprintf(text, sizeof(text), "the step took %.1f s and the last save %s: %.1f s, %s --stop-grace %g s", step_s,
                 save_text().c_str(), need, need <= grace ? "within" : "MORE than", grace);
        std::string out = text;
        if (need > grace) { out += " (killed during the save, the run keeps " + (kept.empty() ? "no checkpoint" : kept) + ")"; }
        return out;
    }
};
