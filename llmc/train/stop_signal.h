/*
Graceful stop on SIGINT and SIGTERM (Ctrl-C, `kill`, a cluster's time limit): the handler
only records which signal came (all a signal handler may safely do); the training loop asks
stop_signal() at each step boundary, writes a resumable checkpoint there and exits with
128 + the signal number, the shell's code for "ended by that signal", so a script (e.g.
scripts/study.py) sees an interrupted run as unfinished. The handlers are installed with
SA_RESETHAND: a second Ctrl-C while the checkpoint is being written kills at once, and the
atomic write (utils.h) leaves the previous file under the final name. SA_RESTART keeps the
data loader's reads from failing with EINTR.
With several processes (mpirun forwards the signal to every rank, each may see it at a
different step) the ranks must agree before acting, e.g. a max all-reduce of stop_signal()
at the step boundary, so that all stop after the same step.
*/
#pragma once

#include <csignal>

inline volatile sig_atomic_t g_stop_signal = 0;

inline void record_stop_signal(int sig) { g_stop_signal = sig; }

inline void install_stop_signal_handlers() {
    struct sigaction sa = {};
    sa.sa_handler = record_stop_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESETHAND | SA_RESTART;
    sigaction(SIGINT, &sa, nullptr);
    sigaction(SIGTERM, &sa, nullptr);
}

// The signal that asked the run to stop, or 0.
inline int stop_signal() { return g_stop_signal; }
