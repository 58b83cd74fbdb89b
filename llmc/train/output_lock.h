/*
One writer per output (host-only C++17): a run holds an exclusive flock on a lock file for each
place it writes (its checkpoint and run directories: DIR/.lock; its log DIR/NAME: DIR/.NAME.lock)
from before it writes anything there until it exits. A second run that would write there is
refused at its start, naming the holder, instead of two runs interleaving their checkpoints and
log lines (two saves of step_6.bin at once left a corrupt file under its final name). The lock is
the kernel's: it goes with the process however it ends (kill -9 included), so a lock file left by
a crash holds no lock. What a run guarantees about its outputs: doc/formats.md "Run directory".
*/
#pragma once

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "llmc/utils.h"

class OutputLocks {
public:
    // Locks `lock_path` for this process's lifetime; `what` names the output for the refusal
    // (e.g. "--checkpoint-dir runs/x"); `holder` is what the file says of this run (the pid,
    // host, start time and command, which a refused run prints). Locking a path twice is a
    // no-op. After taking the lock the file is checked to still be the one under the name (a run
    // exiting removes it): otherwise the lock is taken again.
    static void take(const std::string& lock_path, const std::string& what, const std::string& holder) {
        OutputLocks& all = instance();
        for (const Held& h : all.held_) {
            if (h.path == lock_path) { return; }
        }
        for (int attempt = 0; attempt < 100; attempt++) {
            const int fd = open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
            if (fd < 0) { fatal("%s: cannot create the lock file %s: %s", what.c_str(), lock_path.c_str(), strerror(errno)); }
            if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
                const int err = errno;
                char text[1024] = {0};
                const ssize_t got = pread(fd, text, sizeof(text) - 1, 0);
                close(fd);
                if (err != EWOULDBLOCK) { fatal("%s: cannot lock %s: %s", what.c_str(), lock_path.c_str(), strerror(err)); }
                std::string by = got > 0 ? std::string(text, (size_t)got) : "a run that has not written its name yet";
                while (!by.empty() && by.back() == '\n') { by.pop_back(); }
                fatal("%s is in use by another run (%s; it holds %s): give another place, or wait for it to end",
                      what.c_str(), by.c_str(), lock_path.c_str());
            }
            struct stat by_fd, by_name;
            if (fstat(fd, &by_fd) != 0 || stat(lock_path.c_str(), &by_name) != 0 || by_fd.st_ino != by_name.st_ino ||
                by_fd.st_dev != by_name.st_dev) {
                close(fd);  // removed by the run that held it, between our open and our lock: again
                continue;
            }
            if (ftruncate(fd, 0) != 0 || pwrite(fd, holder.data(), holder.size(), 0) != (ssize_t)holder.size()) {
                fatal("%s: cannot write the lock file %s: %s", what.c_str(), lock_path.c_str(), strerror(errno));
            }
            all.held_.push_back({lock_path, fd});
            return;
        }
        fatal("%s: cannot take the lock %s: it keeps being replaced", what.c_str(), lock_path.c_str());
    }

    // Removes the lock files while still holding them (a run that opened one meanwhile sees it
    // gone once it has the lock, and takes a new one), then lets go; one that a killed run left
    // stays, harmless, until the next run there takes and removes it. Run at exit (also after
    // fatal()), and by
    // trainer_main once the run is over (before leaving MPI: a launcher may kill a rank there).
    static void release() {
        for (const Held& h : instance().held_) {
            unlink(h.path.c_str());
            close(h.fd);
        }
        instance().held_.clear();
    }

private:
    struct Held {
        std::string path;
        int fd;
    };
    std::vector<Held> held_;

    static OutputLocks& instance() {
        static OutputLocks* all = [] {
            auto* locks = new OutputLocks();  // (never destroyed: release() runs at exit)
            atexit(release);
            return locks;
        }();
        return *all;
    }
};
