/*
Host-side utilities shared by the trainers, the loaders and the tests: checked file I/O
whose errors name the file and what was being read, checked allocation, and an atomic
file writer (write to "<path>.tmp", fsync, rename) so a crash never leaves a half-written
checkpoint under the real name. Plain C++17, no CUDA.
*/
#pragma once

#include <cerrno>
#include <chrono>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <utility>
#include <vector>
#include <fcntl.h>
#include <unistd.h>

// What the program is in the middle of, for fatal()'s message: while a FatalContext lives,
// an error that does not name `subject` already ends with " (<what>)". So a value read from a
// checkpoint that fails a check meant for flags ("--doc-mask must be 0 or 1") still names the
// file it came from. `what` may be a function, called only when an error needs it (a checkpoint
// save's "how to go on" costs path look-ups).
struct FatalContext {
    std::string what, subject;
    std::function<std::string()> what_later;  // (set: what fatal() says instead of `what`)
    FatalContext* outer;
    FatalContext(std::string what_, std::string subject_)
        : what(std::move(what_)), subject(std::move(subject_)), outer(current()) {
        current() = this;
    }
    FatalContext(std::function<std::string()> what_, std::string subject_)
        : subject(std::move(subject_)), what_later(std::move(what_)), outer(current()) {
        current() = this;
    }
    ~FatalContext() { current() = outer; }
    FatalContext(const FatalContext&) = delete;
    FatalContext& operator=(const FatalContext&) = delete;
    static FatalContext*& current() {
        static thread_local FatalContext* innermost = nullptr;
        return innermost;
    }
};

// Print "error: <message>" (and the innermost FatalContext) and exit(1). printf-style.
[[noreturn]] __attribute__((format(printf, 1, 2))) inline void fatal(const char* fmt, ...) {
    fflush(stdout);
    va_list args;
    va_start(args, fmt);
    char message[2048];
    vsnprintf(message, sizeof(message), fmt, args);
    va_end(args);
    const FatalContext* context = FatalContext::current();
    FatalContext::current() = nullptr;  // (what_later fails alone: its own fatal() names no context)
    if (context != nullptr && strstr(message, context->subject.c_str()) == nullptr) {
        const std::string what = context->what_later ? context->what_later() : context->what;
        fprintf(stderr, "error: %s (%s)\n", message, what.c_str());
    } else {
        fprintf(stderr, "error: %s\n", message);
    }
    exit(EXIT_FAILURE);
}

// ----------------------------------------------------------------------------------------
// allocation

inline void* malloc_check(size_t size, const char* file, int line) {
    void* ptr = malloc(size);
    if (ptr == nullptr && size > 0) {
        fatal("out of memory: malloc(%zu bytes) failed at %s:%d", size, file, line);
    }
    return ptr;
}
#define mallocCheck(size) malloc_check(size, __FILE__, __LINE__)

// ----------------------------------------------------------------------------------------
// checked files: every failure names the file, the operation and what was expected

class CheckedFile {
public:
    // mode as for fopen; fails with the OS reason when the file cannot be opened
    CheckedFile(const std::string& path, const char* mode) : path_(path) {
        file_ = fopen(path.c_str(), mode);
        if (file_ == nullptr) {
            fatal("cannot open file '%s' (mode \"%s\"): %s", path.c_str(), mode, strerror(errno));
        }
    }
    ~CheckedFile() {
        if (file_ != nullptr) { fclose(file_); }
    }
    CheckedFile(const CheckedFile&) = delete;
    CheckedFile& operator=(const CheckedFile&) = delete;

    const std::string& path() const { return path_; }
    FILE* handle() { return file_; }

    // Reads exactly `bytes` bytes; `what` names the item for the error message.
    void read(void* dst, size_t bytes, const char* what) {
        long offset = ftell(file_);
        size_t got = fread(dst, 1, bytes, file_);
        if (got != bytes) {
            if (ferror(file_)) {
                fatal("file '%s': read error while reading %s at byte %ld: %s", path_.c_str(), what,
                      offset, strerror(errno));
            }
            fatal("file '%s' is truncated: expected %zu bytes of %s at byte %ld, found only %zu",
                  path_.c_str(), bytes, what, offset, got);
        }
    }
    template <typename T>
    T read_value(const char* what) {
        T value;
        read(&value, sizeof(T), what);
        return value;
    }
    template <typename T>
    void read_vector(std::vector<T>& dst, size_t count, const char* what) {
        dst.resize(count);
        read(dst.data(), count * sizeof(T), what);
    }

    void write(const void* src, size_t bytes, const char* what) {
        if (fwrite(src, 1, bytes, file_) != bytes) {
            int err = errno;
            remove_if_asked();
            fatal("file '%s': failed to write %zu bytes of %s: %s", path_.c_str(), bytes, what,
                  strerror(err));
        }
    }
    void seek(long offset, int whence = SEEK_SET) {
        if (fseek(file_, offset, whence) != 0) {
            fatal("file '%s': cannot seek to byte %ld: %s", path_.c_str(), offset, strerror(errno));
        }
    }
    long tell() { return ftell(file_); }
    long size() {
        long here = tell();
        seek(0, SEEK_END);
        long end = tell();
        seek(here);
        return end;
    }
    // Flushes and closes; reports a failure (e.g. disk full) instead of losing it silently.
    void close() {
        if (file_ == nullptr) { return; }
        bool ok = fflush(file_) == 0 && fsync(fileno(file_)) == 0;
        ok = (fclose(file_) == 0) && ok;
        file_ = nullptr;
        if (!ok) {
            int err = errno;
            remove_if_asked();
            fatal("file '%s': failed to flush/close: %s", path_.c_str(), strerror(err));
        }
    }
    // A write or close that fails deletes the file before stopping (a partial temporary
    // file would only fill the disk further).
    void remove_on_failure() { remove_on_failure_ = true; }

private:
    void remove_if_asked() {
        if (remove_on_failure_) { unlink(path_.c_str()); }
    }
    std::string path_;
    FILE* file_ = nullptr;
    bool remove_on_failure_ = false;
};

// Writes a file atomically: the caller writes into `file()`, which is "<path>.tmp";
// commit() closes it and renames it over `path`. If commit() is never reached (crash,
// fatal error) the old file under `path` is untouched.
class AtomicFileWriter {
public:
    explicit AtomicFileWriter(const std::string& path)
        : path_(path), tmp_path_(path + ".tmp"), file_(tmp_path_, "wb") {
        file_.remove_on_failure();
    }
    CheckedFile& file() { return file_; }
    void commit() {
        file_.close();  // flushed and fsynced: the data is on disk before its name changes
        if (rename(tmp_path_.c_str(), path_.c_str()) != 0) {
            int err = errno;
            unlink(tmp_path_.c_str());
            fatal("cannot rename '%s' to '%s': %s", tmp_path_.c_str(), path_.c_str(), strerror(err));
        }
        // and the rename itself on disk (a filesystem that cannot sync a directory is no error)
        size_t slash = path_.rfind('/');
        std::string dir = slash == std::string::npos ? "." : path_.substr(0, slash + 1);
        int fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY);
        if (fd >= 0) {
            fsync(fd);
            ::close(fd);
        }
    }

private:
    std::string path_;
    std::string tmp_path_;
    CheckedFile file_;
};

inline bool file_exists(const std::string& path) { return access(path.c_str(), F_OK) == 0; }

// Copies the file `from` to `to` atomically (AtomicFileWriter); `what` names the cause in errors.
inline void copy_file(const std::string& from, const std::string& to, const char* what) {
    FILE* in = fopen(from.c_str(), "rb");
    if (in == nullptr) { fatal("%s: cannot read %s: %s", what, from.c_str(), strerror(errno)); }
    AtomicFileWriter out(to);
    char buffer[1 << 16];
    size_t n;
    while ((n = fread(buffer, 1, sizeof(buffer), in)) > 0) { out.file().write(buffer, n, from.c_str()); }
    const bool failed = ferror(in) != 0;
    fclose(in);
    if (failed) { fatal("%s: cannot read %s", what, from.c_str()); }
    out.commit();
}

// Wall-clock milliseconds since construction.
struct Timer {
    std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
    double ms() const { return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count(); }
};
