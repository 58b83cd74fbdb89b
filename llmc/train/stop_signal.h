/*
Graceful stop on SIGINT and SIGTERM (Ctrl-C, `kill`, a cluster's time limit): the handler
only records which signal came (all a signal handler may safely do); the training loop asks
stop_signal() at each step boundary, writes a resumable checkpoint there and exits with
128 + the signal number, the shell's code for "ended by that signal", so a script (e.g.
study/runner.py) sees an interrupted run as unfinished. SA_RESTART keeps the data loader's
reads from failing with EINTR.
One process: the handlers are installed with SA_RESETHAND, so a second Ctrl-C while the
checkpoint is being written kills at once, and the atomic write (utils.h) leaves the
previous file under the final name.
Several ranks (mpirun, srun): each rank may see the signal at a different step, or only one
rank sees it, so the ranks agree before acting (a max all-reduce of stop_signal() at the step
boundary: llmc/train/training.h) and all stop after the same step. A repeated signal is only
recorded there: a launcher passes the signal it received on to every rank, which the user or
the cluster has often signalled already (pkill, Ctrl-C to the process group, Slurm), and that
second copy must not kill a rank in the middle of the save. The launcher's own SIGKILL after
its grace period (Open MPI's odls_base_sigkill_timeout, Slurm's KillWait) is the hard stop.
*/
#pragma once

#include <csignal>

inline volatile sig_atomic_t g_stop_signal = 0;

inline void record_stop_signal(int sig) { g_stop_signal = sig; }

// `several_ranks`: a repeated signal is recorded, not fatal (above).
inline void install_stop_signal_handlers(bool several_ranks = false) {
    struct sigaction sa = {};
    sa.sa_handler = record_stop_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART | (several_ranks ? 0 : SA_RESETHAND);
    sigaction(SIGINT, &sa, nullptr);
    sigaction(SIGTERM, &sa, nullptr);
}

// The signal that asked the run to stop, or 0.
inline int stop_signal() { return g_stop_signal; }
