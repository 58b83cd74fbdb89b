/*
Graceful stop on SIGINT, SIGTERM, SIGHUP and SIGUSR1 (Ctrl-C, `kill`, a closed terminal, a
cluster's time limit or a launcher's warning ahead of its kill): the training loop asks
stop_signal() at each step boundary, saves a checkpoint there and exits with 128 + the signal,
so a script sees the run as unfinished. What each stop keeps: doc/trainer.md "Stopping, and what
is kept"; on a cluster: doc/multi-gpu.md "Stopping on a cluster".
One thread takes the signals (start_stop_signal_thread) and prints at once what the stop will
do (set_stop_notes); a second signal stops at once (on_stop_signal says which copies count).
A console that goes away (a `| tee` ended by the same Ctrl-C) is dropped, not fatal
(drop_lost_console).
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

// A signal: before training (or in an evaluation) it ends the process, as by default; the first
// during training prints what the stop will save; a second from one process prints what is lost
// and the command that continues, then ends it. Only recorded, not a second: a repeat over
// several ranks (a launcher passes on the signal the user or cluster already sent each rank, and
// that copy must not kill a rank mid-save; the launcher's SIGKILL after its grace is the hard
// stop), a repeated SIGHUP (a hang-up reaches a job twice: the shell's and the terminal's), and
// a copy from the other side (`from_parent`: the parent process passed it on, as study/runner.py
// does, while Ctrl-C signals the whole foreground group). The ranks agree on a stop at the step
// boundary (a max all-reduce of stop_signal(): llmc/train/training.h).
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
// after this) and starts the thread that takes them (sigwaitinfo); ignores SIGPIPE, so a write to
// a lost console fails instead of killing the run before its save. Why a thread: a handler that
// interrupted oneDNN's JIT GEMM kernels lost a gradient to NaN or corrupted the heap (about 1 run
// in 7 with SIGINT at a random step). Call before any other thread exists where possible;
// threads started earlier (OpenBLAS starts its pool when the library loads) pass a signal on.
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
