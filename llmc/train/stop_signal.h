/*
Graceful stop on SIGINT, SIGTERM, SIGHUP and SIGUSR1 (Ctrl-C, `kill`, a cluster's time limit, a
closed terminal or a dropped ssh session; SIGUSR1 is the warning a launcher sends ahead of the kill:
Slurm's `--signal=USR1@120`, scripts/mpirun.sh's copy of a stop, which Open MPI's mpirun passes
on to every rank without killing them: doc/multi-gpu.md "Stopping on a cluster"): the training loop asks stop_signal() at each step boundary,
writes a resumable checkpoint there and exits with 128 + the signal number, the shell's code for
"ended by that signal", so a script (e.g. study/runner.py) sees an interrupted run as unfinished.

The signals are taken by one thread that waits for them (sigwaitinfo), with them blocked in every
other thread: a trainer calls start_stop_signal_thread() first thing, before any thread
exists, so every thread it starts inherits the mask. A handler running on a compute thread
is not safe here: interrupted inside oneDNN's JIT GEMM kernels, runs lost a gradient to NaN or
corrupted the heap (about 1 run in 7 with SIGINT at a random step, none with OpenBLAS or the
own GEMM). The waiting thread also may print, so the user hears at once what will happen:
  - before training starts (and in an evaluation): the signal ends the process, as by default;
  - the first during training: "stopping after step N ..." with what the stop will save;
  - a second, one process: what is lost (the steps since the newest checkpoint) and the
    command that continues from there, then the signal's default action;
  - over several ranks (mpirun, srun) a repeated signal is only recorded: a launcher passes the
    signal it received on to every rank, which the user or the cluster has often signalled
    already (pkill, Ctrl-C to the process group, Slurm), and that second copy must not kill a
    rank in the middle of the save. The launcher's own SIGKILL after its grace period (Open
    MPI's odls_base_sigkill_timeout, Slurm's KillWait) is the hard stop. Each rank may see the
    signal at a different step, or only one rank sees it, so the ranks agree before acting (a
    max all-reduce of stop_signal() at the step boundary: llmc/train/training.h).
  - a repeated SIGHUP is only recorded too: a hang-up reaches a job twice (the shell passes its
    own on to its jobs, and the kernel signals the terminal's foreground group), and neither
    copy is a person asking again. A run started under nohup (SIGHUP ignored) keeps ignoring it.
  - so is the copy a parent process passes on (study/runner.py, a script's `trap 'kill $child'`):
    Ctrl-C signals the terminal's whole foreground group, the parent too, and a cluster signals
    every process of the job, so the trainer gets the signal itself and then its parent's copy.
    A repeated signal counts as a second only when it comes from the same side (the parent, or
    not) as the first: two Ctrl-C at the terminal, or two `kill PARENT`, still stop at once.

The console may go away while the run goes on: `./train_san ... | tee train.log` loses its
tee to the same Ctrl-C, a closed terminal takes stdout with it. SIGPIPE is ignored, so a
write there fails (EPIPE, EIO) instead of killing the run before its save, and drop_lost_console()
points such a stream at /dev/null: the run goes on, its --log file records it, a stop saves.
*/
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>

// What a stop signal does now; the training loop keeps it current (set_stop_notes).
struct StopSignalState {
    std::mutex mutex;
    std::atomic<int> signal{0};  // the first signal during training, or 0
    bool first_from_parent = false;  // whether the parent process sent it
    bool armed = false;          // training: a signal stops at the step boundary
    bool several_ranks = false;
    std::string first_note;      // printed on the first signal
    std::string second_note;     // printed on a second one (one process), before it ends the process
};

inline StopSignalState& stop_signal_state() {
    static StopSignalState state;
    return state;
}

// The signal's default action for the whole process (SIGINT, SIGTERM, SIGHUP, SIGUSR1: end it).
[[noreturn]] inline void end_by_signal(int sig) {
    fflush(stdout);
    signal(sig, SIG_DFL);
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, sig);
    pthread_sigmask(SIG_UNBLOCK, &set, nullptr);
    raise(sig);
    _exit(128 + sig);  // (not reached: the default action ends the process)
}

// Whether the reader of `fd` is gone: a pipe whose read end is closed (POLLERR) or a terminal
// that hung up (POLLHUP). A file or /dev/null is never gone.
inline bool console_gone(int fd) {
    pollfd p = {fd, 0, 0};
    return poll(&p, 1, 0) == 1 && (p.revents & (POLLERR | POLLHUP)) != 0;
}

// Points stdout and stderr, where their reader is gone, at /dev/null: what the run prints
// after that is dropped at once, rather than failing write by write. Called at every step
// boundary and before a signal's note.
inline void drop_lost_console() {
    for (FILE* stream : {stdout, stderr}) {
        const int fd = fileno(stream);
        if (!console_gone(fd)) { continue; }
        fflush(stream);  // (fails: what it held had nowhere to go)
        const int null_fd = open("/dev/null", O_WRONLY);
        if (null_fd >= 0) {
            dup2(null_fd, fd);
            close(null_fd);
        }
        clearerr(stream);
    }
}

// `from_parent`: the parent process sent the signal (a copy of one it got, passed on).
inline void on_stop_signal(int sig, bool from_parent) {
    StopSignalState& s = stop_signal_state();
    std::lock_guard<std::mutex> lock(s.mutex);
    if (!s.armed) { end_by_signal(sig); }
    drop_lost_console();
    if (s.signal.load() == 0) {
        s.signal = sig;
        s.first_from_parent = from_parent;
        printf("\n%s: %s\n", strsignal(sig), s.first_note.c_str());
        fflush(stdout);
        return;
    }
    if (s.several_ranks || sig == SIGHUP || from_parent != s.first_from_parent) { return; }
    printf("\n%s again: %s\n", strsignal(sig), s.second_note.c_str());
    end_by_signal(sig);
}

inline std::atomic<bool>& stop_signal_thread_started() {
    static std::atomic<bool> started{false};
    return started;
}

inline pthread_t g_stop_signal_thread;

// Whether the parent process sent a signal (SI_USER, SI_QUEUE: a process did, si_pid; the
// terminal's come as SI_KERNEL). One the handler below passed on carries the answer in its value.
inline bool sent_by_parent(const siginfo_t& info) {
    if (info.si_code == SI_QUEUE && info.si_pid == getpid()) { return info.si_value.sival_int == 1; }
    return (info.si_code == SI_USER || info.si_code == SI_QUEUE) && info.si_pid == getppid();
}

// Blocks SIGINT, SIGTERM, SIGUSR1 and SIGHUP in the calling thread (and so in every thread it starts
// after this) and starts the thread that takes them; ignores SIGPIPE. Call before any other
// thread exists where possible; threads started earlier (OpenBLAS starts its pool when the
// library loads) pass a signal on.
inline void start_stop_signal_thread() {
    if (stop_signal_thread_started().exchange(true)) { return; }
    signal(SIGPIPE, SIG_IGN);
    struct sigaction hangup = {};
    sigaction(SIGHUP, nullptr, &hangup);
    const bool nohup = hangup.sa_handler == SIG_IGN;  // (started under nohup: it stays ignored)
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGUSR1);
    if (!nohup) { sigaddset(&set, SIGHUP); }
    pthread_sigmask(SIG_BLOCK, &set, nullptr);
    std::thread taker([set] {
        for (;;) {
            siginfo_t info;
            const int sig = sigwaitinfo(&set, &info);
            if (sig > 0) { on_stop_signal(sig, sent_by_parent(info)); }
        }
    });
    g_stop_signal_thread = taker.native_handle();
    taker.detach();
    // A thread that does not block them runs this handler, which passes the signal on. (It also
    // undoes an ignored disposition: a shell starts background jobs with SIGINT ignored, and an
    // ignored signal is discarded before sigwait could see it.)
    struct sigaction sa = {};
    sa.sa_flags = SA_SIGINFO;
    sa.sa_sigaction = [](int sig, siginfo_t* info, void*) {
        sigval sender;
        sender.sival_int = sent_by_parent(*info) ? 1 : 0;  // (what the taker would have read from info)
        pthread_sigqueue(g_stop_signal_thread, sig, sender);
    };
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, nullptr);
    sigaction(SIGTERM, &sa, nullptr);
    sigaction(SIGUSR1, &sa, nullptr);
    if (!nohup) { sigaction(SIGHUP, &sa, nullptr); }
}

// From here on a signal stops the run at a step boundary. (A program that did not start the
// thread first, e.g. a test, starts it now: its earlier threads may still take a signal.)
inline void arm_stop_signals(bool several_ranks) {
    start_stop_signal_thread();
    StopSignalState& s = stop_signal_state();
    std::lock_guard<std::mutex> lock(s.mutex);
    s.several_ranks = several_ranks;
    s.armed = true;
}

// What the next signal will say: `first` for the first one, `second` for a repeated one.
inline void set_stop_notes(std::string first, std::string second) {
    StopSignalState& s = stop_signal_state();
    std::lock_guard<std::mutex> lock(s.mutex);
    s.first_note = std::move(first);
    s.second_note = std::move(second);
}

// The signal that asked the run to stop, or 0.
inline int stop_signal() { return stop_signal_state().signal.load(); }

// The signal that asked the run to stop, or 0; when 0, `first` and `second` become the notes of
// the step that follows. One lock with the signal's note: a signal named step N in its note
// stops the run at N's boundary, never one step later.
inline int stop_signal_or_next_notes(std::string first, std::string second) {
    StopSignalState& s = stop_signal_state();
    std::lock_guard<std::mutex> lock(s.mutex);
    const int sig = s.signal.load();
    if (sig == 0) {
        s.first_note = std::move(first);
        s.second_note = std::move(second);
    }
    return sig;
}
