/*
Small helpers for the data-side C++ tests (test_dataloader.cpp, test_tokenizer.cpp,
test_evalset.cpp): CHECK (dev/test/testing.h), a fresh temporary directory for
fixture files, raw file writing, a file's CRC filled in (sealed), and expect_fatal(), which runs code that should stop with
fatal() in a forked child and checks its exit status and its error message.
*/
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "dev/test/testing.h"  // CHECK
#include "llmc/data/crc32.h"    // defines: crc32, crc32_update


inline std::string make_temp_dir(const char* tag) {
    const char* base = getenv("TMPDIR");
    std::string tmpl = std::string(base && *base ? base : "/tmp") + "/attn_" + tag + "_XXXXXX";
    std::vector<char> buf(tmpl.begin(), tmpl.end());
    buf.push_back('\0');
    if (mkdtemp(buf.data()) == nullptr) {
        perror("mkdtemp");
        exit(2);
    }
    return std::string(buf.data());
}

inline void remove_dir(const std::string& dir) {
    std::string cmd = "rm -rf '" + dir + "'";
    if (system(cmd.c_str()) != 0) { fprintf(stderr, "warning: could not remove %s\n", dir.c_str()); }
}

inline void write_bytes(const std::string& path, const std::vector<uint8_t>& bytes) {
    FILE* f = fopen(path.c_str(), "wb");
    if (!f) { perror(path.c_str()); exit(2); }
    if (!bytes.empty() && fwrite(bytes.data(), 1, bytes.size(), f) != bytes.size()) { perror("fwrite"); exit(2); }
    fclose(f);
}

template <typename T>
inline void append_le(std::vector<uint8_t>& out, T v) {  // little-endian append
    for (size_t i = 0; i < sizeof(T); i++) { out.push_back((uint8_t)(((uint64_t)v >> (8 * i)) & 0xFF)); }
}

// a 256-int32 header with the first entries given
inline std::vector<uint8_t> header_bytes(std::vector<int32_t> first) {
    std::vector<uint8_t> out;
    first.resize(256, 0);
    for (int32_t v : first) { append_le<uint32_t>(out, (uint32_t)v); }
    return out;
}

// The bytes with header int `slot` set to the CRC-32 of all the other bytes, as a version-2
// tokenizer or eval-set file holds it (llmc/data/crc32.h crc32_without_slot); a test that changes
// a file's structure seals it again, so the structural check is reached, not the checksum.
inline std::vector<uint8_t> sealed(std::vector<uint8_t> b, int slot) {
    if (b.size() < 1024) { return b; }
    uint32_t c = crc32_update(crc32(b.data(), 4 * (size_t)slot), b.data() + 4 * slot + 4, b.size() - 4 * (size_t)slot - 4);
    memcpy(&b[4 * (size_t)slot], &c, 4);
    return b;
}

// Runs fn in a forked child process, its stdout and stderr captured into *output; returns
// the child's wait status. `prepare` runs in the child before fn (an alarm, an exit hook).
inline int run_in_child(const std::function<void()>& fn, std::string* output,
                        const std::function<void()>& prepare = nullptr) {
    int pipefd[2];
    if (pipe(pipefd) != 0) { perror("pipe"); exit(2); }
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) { perror("fork"); exit(2); }
    if (pid == 0) {
        close(pipefd[0]);
        dup2(pipefd[1], 1);
        dup2(pipefd[1], 2);
        if (prepare) { prepare(); }
        fn();
        fflush(stdout);
        fflush(stderr);
        _exit(0);
    }
    close(pipefd[1]);
    output->clear();
    char buf[4096];
    ssize_t n;
    while ((n = read(pipefd[0], buf, sizeof(buf))) > 0) { output->append(buf, (size_t)n); }
    close(pipefd[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    return status;
}

// Runs fn in a child process; true if it exited with a non-zero status and its stderr
// contains every one of `needles`.
inline bool expect_fatal(const std::function<void()>& fn, const std::vector<std::string>& needles) {
    std::string msg;
    int status = run_in_child(fn, &msg);
    bool failed = WIFEXITED(status) && WEXITSTATUS(status) != 0;
    bool ok = failed;
    for (const std::string& s : needles) { ok = ok && msg.find(s) != std::string::npos; }
    if (!ok) {
        fprintf(stderr, "  expected a fatal error mentioning:");
        for (const std::string& s : needles) { fprintf(stderr, " [%s]", s.c_str()); }
        fprintf(stderr, "\n  got (exit %s): %s\n", failed ? "non-zero" : "zero", msg.c_str());
    }
    return ok;
}

// The summary line and exit status of a data test's main().
inline int report(const char* name) {
    int failed = testing::Registry::get().failed_checks;
    if (failed == 0) {
        printf("%s: all checks passed\n", name);
        return 0;
    }
    printf("%s: %d checks FAILED\n", name, failed);
    return 1;
}
