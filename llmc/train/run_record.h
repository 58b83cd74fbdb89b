/*
What a run says about itself (host-only C++17): the record that starts its JSONL log and whose
fields every checkpoint holds as run.* keys (RunRecord: the command, every flag's resolved
value, the rates used, the commit and build, the host, the start time, the ranks), and its
run directory (runs/<preset>-<arm>-<UTC time> by default: the resolved config, the log,
the checkpoints, the samples), with the lookups --resume DIR and --resume auto make and the
pruning --keep-last N does. The commit comes from the build (attn_build_commit).
doc/formats.md "Run directory" and "Training log" describe the files.
*/
#pragma once

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cstdint>
#include <ctime>
#include <string>
#include <utility>
#include <vector>

#include "llmc/number_text.h"  // defines: parse_finite_real
#include "llmc/utils.h"

// `text` (UTF-8) as a JSON string literal; `ascii`: characters outside ASCII as \\u escapes
// (checkpoint keys are ASCII text).
inline std::string json_string(const std::string& text, bool ascii = false) {
    std::string out = "\"";
    char buf[16];
    for (size_t i = 0; i < text.size(); i++) {
        const unsigned char c = (unsigned char)text[i];
        if (c == '"' || c == '\\') {
            out += '\\';
            out += (char)c;
        } else if (c < 0x20) {
            snprintf(buf, sizeof(buf), "\\u%04x", c);
            out += buf;
        } else if (c < 0x80 || !ascii) {
            out += (char)c;
        } else {  // one UTF-8 sequence as its code point (a malformed byte as itself, U+0080..U+00FF)
            const int length = c >= 0xf0 ? 4 : c >= 0xe0 ? 3 : c >= 0xc0 ? 2 : 1;
            unsigned code = length == 1 ? c : c & (0x7f >> length);
            bool ok = length > 1 && i + length <= text.size();
            for (int k = 1; ok && k < length; k++) {
                ok = ((unsigned char)text[i + k] & 0xc0) == 0x80;
                code = code << 6 | ((unsigned char)text[i + k] & 0x3f);
            }
            if (!ok) {
                code = c;
            } else {
                i += length - 1;
            }
            if (code >= 0x10000) {  // a surrogate pair
                code -= 0x10000;
                snprintf(buf, sizeof(buf), "\\u%04x\\u%04x", 0xd800 + (code >> 10), 0xdc00 + (code & 0x3ff));
            } else {
                snprintf(buf, sizeof(buf), "\\u%04x", code);
            }
            out += buf;
        }
    }
    return out + "\"";
}

// The commit comes from the build: the Makefile links every binary with a one-line object that
// defines attn_build_commit ("<12 hex digits>", with "+dirty" when the tree had changes to
// tracked files, or "unknown" outside git); a binary built without it (nvcc by hand) says
// "unknown".
// (a weak default that the Makefile's build-commit object, linked into every binary, overrides;
// not const, so that the compiler reads it rather than folding in the default)
extern "C" {
__attribute__((weak)) const char* attn_build_commit = "unknown";
}

// The commit the binary was built from, and whether the tree had uncommitted changes then.
struct BuildCommit {
    std::string commit = "unknown";
    bool dirty = false;
};
inline BuildCommit build_commit() {
    BuildCommit b;
    if (attn_build_commit == nullptr || attn_build_commit[0] == '\0') { return b; }
    b.commit = attn_build_commit;
    const std::string mark = "+dirty";
    if (b.commit.size() > mark.size() && b.commit.compare(b.commit.size() - mark.size(), mark.size(), mark) == 0) {
        b.commit.resize(b.commit.size() - mark.size());
        b.dirty = true;
    }
    return b;
}

// A time as UTC text: 2026-12-03T17:30:00Z, or (compact, for file names) 20261203T173000Z.
inline std::string utc_time_text(time_t t, bool compact = false) {
    struct tm parts;
    gmtime_r(&t, &parts);
    char text[32];
    strftime(text, sizeof(text), compact ? "%Y%m%dT%H%M%SZ" : "%Y-%m-%dT%H:%M:%SZ", &parts);
    return text;
}

inline std::string host_name() {
    char name[256] = {0};
    if (gethostname(name, sizeof(name) - 1) != 0) { return "unknown"; }
    return name;
}

// What a run says about itself: the first record of its JSONL log ({"run": {...}}, no "step":
// the step-record readers skip it) and, as run.* keys, part of every checkpoint it writes.
struct RunRecord {
    std::string program;       // train_san, train_gpt2
    std::string command;       // the command line as a shell would take it
    std::string config_file;   // --config FILE, or ""
    std::vector<std::pair<std::string, std::string>> settings;  // every flag (name without --) and its resolved value
    bool training = true;      // false: an evaluation (--steps 0), which has no rates
    std::string optimizer;
    double lr = 0.0, lr_other = 0.0;  // the peak rates used: the matrix group's and the other group's
    std::string rates_source;  // where default rates came from (DefaultRates::source); "": given or resumed
    std::string evaluated;     // an evaluation's checkpoint
    long evaluated_step = 0;   // and the steps it was trained for
    std::string id;            // the run's own name (new_run_id), kept by its resumes: whose log a log is
    std::string started, host, run_dir;
    int ranks = 1;
    int64_t parameters = 0, non_embedding = 0;
    double flops_per_token = 0.0;
    std::vector<std::pair<std::string, std::string>> notes;  // more fields: name -> JSON value (train_san: skipped layers)
    std::string tokenizer_fingerprint;  // 8 hex digits: the tokenizer of the run's tokens (input_files.h); "": unknown

    // The fields as one JSON object; `executor`, `precision`, `attention_kernels`: the build's.
    std::string json(const char* executor, const char* precision, const char* attention_kernels, bool ascii = false) const {
        const BuildCommit b = build_commit();
        auto text = [&](const std::string& t) { return json_string(t, ascii); };
        // (the id first: what a resume reads back from a log's first line, before any text of a flag)
        std::string out = "{\"run_id\": " + text(id) + ", \"executor\": " + text(executor) + ", \"precision\": " + text(precision) +
                          ", \"attention_kernels\": " + text(attention_kernels) + ", \"program\": " + text(program) +
                          ", \"command\": " + text(command);
        if (!config_file.empty()) { out += ", \"config_file\": " + text(config_file); }
        out += ", \"config\": {";
        for (size_t i = 0; i < settings.size(); i++) {
            out += (i > 0 ? ", " : "") + text(settings[i].first) + ": " + text(settings[i].second);
        }
        out += "}";
        char number[64];
        if (training) {
            snprintf(number, sizeof(number), "%.9g, \"lr_other\": %.9g", lr, lr_other);
            out += ", \"rates\": {\"optimizer\": " + text(optimizer) + ", \"lr\": " + number;
            if (!rates_source.empty()) { out += ", \"default_from\": " + text(rates_source); }
            out += "}";
        } else {
            out += ", \"evaluation\": {\"checkpoint\": " + text(evaluated) + ", \"step\": " + std::to_string(evaluated_step) + "}";
        }
        out += ", \"git_commit\": " + text(b.commit) + ", \"git_dirty\": " + (b.dirty ? "true" : "false") +
               ", \"host\": " + text(host) + ", \"started\": " + text(started) + ", \"ranks\": " + std::to_string(ranks) +
               ", \"run_dir\": " + (run_dir.empty() ? std::string("null") : text(run_dir));
        snprintf(number, sizeof(number), "%.6g", flops_per_token);
        out += ", \"parameters\": " + std::to_string(parameters) + ", \"non_embedding\": " + std::to_string(non_embedding) +
               ", \"flops_per_token\": " + number;
        for (const auto& [name, value] : notes) { out += ", " + text(name) + ": " + value; }
        return out + "}";
    }

    // The run.* checkpoint keys of the record (run.ranks, run.precision and the settings a resume
    // restores are written beside them: llmc/train/training.h save); ASCII text without line breaks.
    std::vector<std::pair<std::string, std::string>> checkpoint_keys(const char* executor, const char* attention_kernels) const {
        const BuildCommit b = build_commit();
        auto one_line = [](const std::string& t) {  // (the JSON text of t, without its quotes)
            std::string j = json_string(t, true);
            return j.substr(1, j.size() - 2);
        };
        std::string config = "{";
        for (size_t i = 0; i < settings.size(); i++) {
            config += (i > 0 ? ", " : "") + json_string(settings[i].first, true) + ": " + json_string(settings[i].second, true);
        }
        config += "}";
        std::vector<std::pair<std::string, std::string>> keys = {
            {"run.program", program},         {"run.command", one_line(command)},  {"run.config", config},
            {"run.git_commit", b.commit},     {"run.git_dirty", b.dirty ? "1" : "0"},
            {"run.executor", executor},       {"run.attention_kernels", attention_kernels},
            {"run.host", one_line(host)},     {"run.started", started},          {"run.id", id}};
        // (what an evaluation of the file compares its data with: llmc/train/input_files.h)
        if (!tokenizer_fingerprint.empty()) { keys.push_back({"run.tokenizer_fingerprint", tokenizer_fingerprint}); }
        return keys;
    }
};

// A fresh run's id: 16 hex digits from the kernel's random numbers (the clock and the pid where
// they cannot be read), so two runs never share one, on one host or many.
inline std::string new_run_id() {
    uint64_t x = 0;
    FILE* f = fopen("/dev/urandom", "rb");
    if (f == nullptr || fread(&x, sizeof(x), 1, f) != 1) {
        x = (uint64_t)time(nullptr) * 6364136223846793005ull ^ (uint64_t)getpid() * 1442695040888963407ull;
    }
    if (f != nullptr) { fclose(f); }
    char text[20];
    snprintf(text, sizeof(text), "%016llx", (unsigned long long)x);
    return text;
}

// Whose log the file at `path` is: `is_log` when its first line is a run's record ({"run": ...}),
// `id` that run's run_id ("" in logs from before run ids). Reads the first line only.
struct LogOwner {
    bool is_log = false;
    std::string id;
};
inline LogOwner log_owner(const std::string& path) {
    LogOwner owner;
    FILE* f = fopen(path.c_str(), "rb");
    if (f == nullptr) { return owner; }
    char line[256] = {0};
    const size_t got = fread(line, 1, sizeof(line) - 1, f);
    fclose(f);
    const std::string head(line, got);
    owner.is_log = head.rfind("{\"run\": {", 0) == 0;
    const std::string key = "{\"run\": {\"run_id\": \"";
    if (head.rfind(key, 0) == 0) {
        const size_t end = head.find('"', key.size());
        if (end != std::string::npos) { owner.id = head.substr(key.size(), end - key.size()); }
    }
    return owner;
}

// ---- run directories ------------------------------------------------------------------------

inline bool is_directory(const std::string& path) {
    struct stat st;
    return stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}
inline bool is_file(const std::string& path) {
    struct stat st;
    return stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

// `path` as the file it names: the longest part that exists with every symbolic link followed
// (realpath), then the rest as written; relative to the working directory. What two names of one
// file (a symlinked log, a directory reached through a link) have in common.
inline std::string resolved_path(const std::string& path) {
    std::string head = path.empty() ? "." : path, tail;
    while (true) {
        if (char* real = realpath(head.c_str(), nullptr)) {
            std::string out = real;
            free(real);
            return tail.empty() ? out : (out == "/" ? "" : out) + "/" + tail;
        }
        if (head == "." || head == "/") { return path; }  // (the working directory is gone: as written)
        const size_t slash = head.find_last_of('/');
        const std::string last = slash == std::string::npos ? head : head.substr(slash + 1);
        tail = tail.empty() ? last : last + "/" + tail;
        head = slash == std::string::npos ? "." : slash == 0 ? "/" : head.substr(0, slash);
    }
}

// Whether the resolved path `path` is `root` or lies under it (both resolved_path's).
inline bool path_inside(const std::string& path, const std::string& root) {
    return path == root || (path.size() > root.size() && path.compare(0, root.size(), root) == 0 &&
                            (root == "/" || path[root.size()] == '/'));
}

// The names in a directory (none when it cannot be read).
inline std::vector<std::string> directory_names(const std::string& dir) {
    std::vector<std::string> out;
    DIR* d = opendir(dir.c_str());
    if (d == nullptr) { return out; }
    while (dirent* e = readdir(d)) {
        if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0) { out.push_back(e->d_name); }
    }
    closedir(d);
    std::sort(out.begin(), out.end());
    return out;
}

// N of a name "<prefix>N.bin" (N decimal digits), else -1.
inline long numbered_name(const std::string& name, const std::string& prefix) {
    if (name.rfind(prefix, 0) != 0 || name.size() <= prefix.size() + 4 || name.compare(name.size() - 4, 4, ".bin") != 0) {
        return -1;
    }
    const std::string digits = name.substr(prefix.size(), name.size() - prefix.size() - 4);
    if (digits.empty() || digits.size() > 15 || digits.find_first_not_of("0123456789") != std::string::npos) { return -1; }
    return std::stol(digits);
}

// The checkpoints a run in `dir` wrote, newest first by name: final.bin, the step_N.bin by steps,
// then the milestone_P.bin by percentage.
inline std::vector<std::string> checkpoints_newest_first(const std::string& dir) {
    std::vector<std::pair<long, std::string>> steps, milestones;
    for (const std::string& n : directory_names(dir)) {
        if (numbered_name(n, "step_") >= 0) { steps.push_back({numbered_name(n, "step_"), n}); }
        if (numbered_name(n, "milestone_") >= 0) { milestones.push_back({numbered_name(n, "milestone_"), n}); }
    }
    std::sort(steps.rbegin(), steps.rend());
    std::sort(milestones.rbegin(), milestones.rend());
    std::vector<std::string> out;
    if (is_file(dir + "/final.bin")) { out.push_back(dir + "/final.bin"); }
    for (const auto& s : steps) { out.push_back(dir + "/" + s.second); }
    for (const auto& m : milestones) { out.push_back(dir + "/" + m.second); }
    return out;
}

// The checkpoint a run in `dir` wrote last (checkpoints_newest_first); "" when there is none.
inline std::string newest_checkpoint(const std::string& dir) {
    std::vector<std::string> all = checkpoints_newest_first(dir);
    return all.empty() ? "" : all.front();
}

// The value of `key` in the config text of the tensor file at `path` (doc/formats.md "Model
// checkpoints": the text follows the 64-byte header, its length at byte 16), or "" when the file
// or the key is not there. Reads the header and the text only (at most 1 MiB of it): a quick look
// to choose among files, each of which is read and checked in full when it is used.
inline std::string checkpoint_text_value(const std::string& path, const std::string& key) {
    FILE* f = fopen(path.c_str(), "rb");
    if (f == nullptr) { return ""; }
    unsigned char header[64];
    std::string text;
    if (fread(header, 1, 64, f) == 64 && memcmp(header, "ATTNFILE", 8) == 0) {
        uint64_t meta_bytes;
        memcpy(&meta_bytes, header + 16, 8);
        text.resize((size_t)std::min<uint64_t>(meta_bytes, 1 << 20));
        text.resize(fread(&text[0], 1, text.size(), f));
    }
    fclose(f);
    const std::string start = key + "=";
    for (size_t at = 0; at < text.size();) {
        size_t end = text.find('\n', at);
        if (end == std::string::npos) { end = text.size(); }
        if (text.compare(at, start.size(), start) == 0) { return text.substr(at + start.size(), end - at - start.size()); }
        at = end + 1;
    }
    return "";
}

// Whether a checkpoint was saved after a validation whose loss was not finite (run.val_loss;
// files without the key: no).
inline bool saved_after_nonfinite_validation(const std::string& path) {
    const std::string v = checkpoint_text_value(path, "run.val_loss");
    double x;
    return !v.empty() && !parse_finite_real(v.c_str(), &x);
}

// --resume DIR: the newest checkpoint there; --resume auto: the newest of the run directory
// `run_dir` (given with --run-dir), else of the run directory under runs/ changed last that
// holds one. A checkpoint saved after a non-finite validation loss (run.val_loss: a run with
// --spike-guard 0 that diverged) is passed over, saying so, for the newest good one. Prints
// what it took; a path to a file is returned as it is.
inline std::string resolve_resume_path(const std::string& resume, const std::string& run_dir) {
    if (resume != "auto" && !is_directory(resume)) { return resume; }
    std::string dir = resume, why;
    if (resume == "auto" && !run_dir.empty()) {
        dir = run_dir;
        why = "the newest checkpoint of --run-dir " + run_dir;
    } else if (resume == "auto") {
        time_t newest = 0;
        dir.clear();
        for (const std::string& n : directory_names("runs")) {
            const std::string d = "runs/" + n;
            struct stat st;
            if (stat(d.c_str(), &st) != 0 || !S_ISDIR(st.st_mode) || newest_checkpoint(d).empty()) { continue; }
            if (dir.empty() || st.st_mtime > newest || (st.st_mtime == newest && d > dir)) {
                dir = d;
                newest = st.st_mtime;
            }
        }
        if (dir.empty()) {
            fatal("--resume auto: no run directory under runs/ holds a checkpoint (give --resume CKPT or --resume DIR)");
        }
        why = "the newest checkpoint of the run directory changed last under runs/";
    } else {
        why = "the newest checkpoint of " + dir;
    }
    if (!is_directory(dir)) { fatal("--resume auto: --run-dir %s is not a directory", dir.c_str()); }
    const std::vector<std::string> all = checkpoints_newest_first(dir);
    if (all.empty()) {
        fatal("--resume %s: %s holds no checkpoint (final.bin, step_N.bin or milestone_P.bin)", resume.c_str(), dir.c_str());
    }
    // not one saved after a non-finite validation loss, while an older one is good
    std::string path = all.front();
    for (const std::string& p : all) {
        if (saved_after_nonfinite_validation(p)) { continue; }
        if (p != path) {
            printf("resume: passing over %s: saved after a validation loss that is not finite (a diverged run); %s is "
                   "the newest with a finite one\n", path.c_str(), p.c_str());
        }
        path = p;
        break;
    }
    printf("resume: %s (%s)\n", path.c_str(), why.c_str());
    return path;
}

// A fresh run directory's name: runs/<preset>-<arm>-<UTC time>, with -2, -3 .. when it exists.
inline std::string new_run_dir_name(const std::string& preset, const std::string& arm, time_t now) {
    const std::string base = "runs/" + preset + (arm.empty() ? "" : "-" + arm) + "-" + utc_time_text(now, true);
    std::string name = base;
    for (int i = 2; access(name.c_str(), F_OK) == 0; i++) { name = base + "-" + std::to_string(i); }
    return name;
}

// Creates `dir` and its parents (mkdir -p); fails naming `flag`.
inline void make_directories(const std::string& dir, const char* flag) {
    for (size_t i = 1; i <= dir.size(); i++) {
        if (i < dir.size() && dir[i] != '/') { continue; }
        const std::string part = dir.substr(0, i);
        if (mkdir(part.c_str(), 0755) != 0 && errno != EEXIST) {
            fatal("%s '%s': cannot create %s: %s", flag, dir.c_str(), part.c_str(), strerror(errno));
        }
    }
    if (!is_directory(dir)) { fatal("%s '%s' is not a directory", flag, dir.c_str()); }
}

// --keep-last N: deletes the step_K.bin files in `dir` but the N of the most steps and `keep`
// (the newest with a finite validation loss; milestones and final.bin stay); returns the names
// deleted.
inline std::vector<std::string> prune_step_checkpoints(const std::string& dir, int keep_last, const std::string& keep = "") {
    std::vector<std::pair<long, std::string>> steps;
    for (const std::string& n : directory_names(dir)) {
        long s = numbered_name(n, "step_");
        if (s >= 0) { steps.push_back({s, n}); }
    }
    std::sort(steps.begin(), steps.end());
    std::vector<std::string> deleted;
    for (size_t i = 0; keep_last > 0 && i + keep_last < steps.size(); i++) {
        const std::string path = dir + "/" + steps[i].second;
        if (steps[i].second != keep && unlink(path.c_str()) == 0) { deleted.push_back(steps[i].second); }
    }
    return deleted;
}

// The checkpoint files a save did not finish in `dir`: NAME.tmp where NAME is a checkpoint's name
// (step_N.bin, milestone_P.bin, final.bin; the temp file of llmc/utils.h AtomicFileWriter).
inline std::vector<std::string> unfinished_saves(const std::string& dir) {
    std::vector<std::string> out;
    for (const std::string& n : directory_names(dir)) {
        if (n.size() <= 4 || n.compare(n.size() - 4, 4, ".tmp") != 0) { continue; }
        const std::string name = n.substr(0, n.size() - 4);
        if (name == "final.bin" || numbered_name(name, "step_") >= 0 || numbered_name(name, "milestone_") >= 0) {
            out.push_back(n);
        }
    }
    return out;
}
