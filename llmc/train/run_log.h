/*
What a run writes besides validation (host-only C++17): the --log file (LogFile: every record
checked, non-finite numbers as JSON null), JSON-lines pieces (json_string, append_json_array),
loss-spike detection (SpikeDetector) and the divergence guard (DivergenceGuard), the GPU peak
rates behind the MFU figure (peak_flops_for), and the one-line summary of the data a loader
matched (describe_data).
*/
#pragma once

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "llmc/cuda_common.h"
#include "llmc/data/dataloader.h"
#include "llmc/train/run_record.h"  // defines: json_string

// A JSON record as printf wrote it, with every non-finite number (printf's nan, -nan, inf,
// -inf outside strings) made JSON's null, and "nonfinite": true added to the record when there
// was one: the log stays valid JSON (a reader that parses it keeps the record) and says so.
inline std::string json_with_null_for_nonfinite(const std::string& record) {
    std::string out;
    bool in_string = false, replaced = false;
    for (size_t i = 0; i < record.size(); i++) {
        const char c = record[i];
        if (in_string) {
            out += c;
            if (c == '\\' && i + 1 < record.size()) {
                out += record[++i];
            } else if (c == '"') {
                in_string = false;
            }
            continue;
        }
        if (c == '"') { in_string = true; }
        size_t sign = c == '-' ? 1 : 0;
        if (record.compare(i + sign, 3, "nan") == 0 || record.compare(i + sign, 3, "inf") == 0) {
            size_t end = i + sign + 3;  // (glibc prints "nan", "inf"; "infinity" and "nan(...)" too)
            while (end < record.size() && (isalnum((unsigned char)record[end]) || record[end] == '(' || record[end] == ')' || record[end] == '_')) { end++; }
            out += "null";
            replaced = true;
            i = end - 1;
            continue;
        }
        out += c;
    }
    if (replaced && !out.empty() && out.back() == '}') { out.insert(out.size() - 1, ", \"nonfinite\": true"); }
    return out;
}

// The --log file of a run (rank 0's): each record written as one line and flushed at once, so
// a run that stops leaves whole records; a record that cannot be written (a full disk, a
// broken pipe) stops the run naming the file, rather than leaving a log cut short behind a
// run that seems to have succeeded. `on_failure` (when set) runs first, once: the training
// saves what it has trained (llmc/train/training.h), and what it returns ends the message.
class LogFile {
public:
    std::function<std::string(const std::string& why)> on_failure;
    // Over several ranks the save cannot start where a write fails (rank 0 alone writes the log;
    // a checkpoint is a collective): when `deferred`, a failed record is kept (failure()) and
    // the run goes on to the step's end, where every rank saves and stops (llmc/train/training.h).
    bool deferred = false;
    const std::string& failure() const { return failure_; }
    LogFile() = default;
    LogFile(const LogFile&) = delete;
    LogFile& operator=(const LogFile&) = delete;
    ~LogFile() {
        if (file_ != nullptr) { fclose(file_); }
    }
    // `append`: a resumed run continues the log; else it is written anew. A last line cut short
    // (the disk filled, or the run was killed, in the middle of a record) is ended first, so that
    // it stays a line of its own, which readers skip, and the records after it parse.
    void open(const std::string& path, bool append) {
        path_ = path;
        bool cut_short = false;
        struct stat st;
        if (append && stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode)) {  // (a pipe: nothing to read back)
            FILE* f = fopen(path.c_str(), "rb");
            cut_short = f != nullptr && fseek(f, -1, SEEK_END) == 0 && fgetc(f) != '\n';
            if (f != nullptr) { fclose(f); }
        }
        file_ = fopen(path.c_str(), append ? "a" : "w");
        if (file_ == nullptr) { fatal("--log: cannot open '%s' for writing: %s", path.c_str(), strerror(errno)); }
        if (cut_short && (fputc('\n', file_) == EOF || fflush(file_) != 0)) { failed("write to"); }
    }
    bool is_open() const { return file_ != nullptr; }
    // One JSON record (without the newline).
    void record(const std::string& json) {
        if (file_ == nullptr) { return; }  // (a deferred failure closed it)
        const std::string line = json_with_null_for_nonfinite(json) + "\n";
        if (fwrite(line.data(), 1, line.size(), file_) != line.size() || fflush(file_) != 0) { failed("write to"); }
    }
    // Closes the file; the data on disk (fsync), or the run stops naming the file.
    void close() {
        if (file_ == nullptr) { return; }
        FILE* f = file_;
        file_ = nullptr;
        bool ok = fflush(f) == 0;
        ok = (fsync(fileno(f)) == 0 || errno == EINVAL || errno == EROFS) && ok;  // (a pipe or /dev/null has no fsync)
        ok = fclose(f) == 0 && ok;
        if (!ok) { failed("close"); }
    }

private:
    void failed(const char* what) {
        const int err = errno;
        if (file_ != nullptr) { fclose(file_); }
        file_ = nullptr;
        std::string why = "--log " + path_ + ": cannot " + what + " the log: " + strerror(err);
        if (deferred) {
            failure_ = why;
            return;
        }
        std::string after;
        if (on_failure) {
            const auto save = std::move(on_failure);
            on_failure = nullptr;  // (once: a save that fails stops with its own error)
            after = save(why);
        }
        fatal("%s; the run stops (its log would be incomplete)%s", why.c_str(), after.c_str());
    }
    std::string path_;
    std::string failure_;
    FILE* file_ = nullptr;
};

inline void append_json_array(std::string& out, const char* key, const std::vector<double>& values) {
    if (values.empty()) { return; }
    char buf[64];
    out += ", \"";
    out += key;
    out += "\": [";
    double sum = 0.0;
    for (size_t i = 0; i < values.size(); i++) {
        snprintf(buf, sizeof(buf), "%s%.6g", i > 0 ? ", " : "", values[i]);
        out += buf;
        sum += values[i];
    }
    snprintf(buf, sizeof(buf), "], \"%s_mean\": %.6g", key, sum / values.size());
    out += buf;
}

// Loss-spike detection: a step's loss is a spike when its z-score against the previous
// `window` steps' losses (mean, population standard deviation) is above `threshold`.
// Checked once the window is full; not carried across a resume (the window refills).
class SpikeDetector {
public:
    SpikeDetector(int window, double threshold) : window_(window), threshold_(threshold) {}
    // The z-score of `loss` if it is a spike, else 0; then adds it to the window.
    double observe(double loss) {
        double z = 0.0;
        if ((int)recent_.size() == window_ && threshold_ > 0.0) {
            double mean = 0.0, var = 0.0;
            for (double x : recent_) { mean += x; }
            mean /= window_;
            for (double x : recent_) { var += (x - mean) * (x - mean); }
            double sd = std::sqrt(var / window_);
            if (sd > 0.0 && (loss - mean) / sd > threshold_) { z = (loss - mean) / sd; }
            recent_.erase(recent_.begin());
        }
        recent_.push_back(loss);
        return z;
    }

private:
    int window_;
    double threshold_;
    std::vector<double> recent_;
};

// The divergence guard (--spike-guard K): a value (the training loss of a step, or a validation
// loss) more than K times the median of the recent ones, or not finite, means the run has
// diverged, and it stops before saving (so no checkpoint of the diverged model is written and
// none of the good ones is pruned for it). A loss that falls leaves the median above the latest
// values, so the guard is lenient where losses move fast; healthy runs' spikes stay well under 2x
// (the loss is a cross-entropy: a model that has learnt anything is far from K times worse).
// The median of the last `window` values; the first value of a run has none and passes (a
// resume's first is checked against the saved run's window: text/restore). K = 0: off.
class DivergenceGuard {
public:
    DivergenceGuard(double factor, int window) : factor_(factor), window_(window) {}
    bool on() const { return factor_ > 0.0; }
    // "" when `value` is fine, else why it is a divergence; then adds it to the window.
    std::string check(double value) {
        std::string why;
        if (!on()) { return why; }
        char text[160];
        if (!std::isfinite(value)) {
            why = "not finite";
        } else if (!recent_.empty()) {
            std::vector<double> sorted = recent_;
            std::sort(sorted.begin(), sorted.end());
            const size_t n = sorted.size();
            const double median = n % 2 == 1 ? sorted[n / 2] : 0.5 * (sorted[n / 2 - 1] + sorted[n / 2]);
            if (value > factor_ * median) {
                snprintf(text, sizeof(text), "%.4g x the median %.4g of the last %zu", value / median, median, n);
                why = text;
            }
        }
        recent_.push_back(value);
        if ((int)recent_.size() > window_) { recent_.erase(recent_.begin()); }
        return why;
    }

    // The window as text (the values, shortest round-trip, comma-separated) and back: a checkpoint
    // keeps it, so that a resume checks its first step against the steps before it (an empty
    // window passes any value, and the next ones are measured against that one). Returns false
    // for text that is not such a list (a loss is never negative: cross-entropy plus z-loss).
    std::string text() const {
        std::string out;
        for (double v : recent_) { out += (out.empty() ? "" : ",") + shortest_real_text(v); }
        return out;
    }
    bool restore(const std::string& text) {
        recent_.clear();
        for (size_t at = 0; at < text.size();) {
            size_t end = text.find(',', at);
            if (end == std::string::npos) { end = text.size(); }
            double v;
            if (!parse_finite_real(text.substr(at, end - at).c_str(), &v) || v < 0) { return false; }
            recent_.push_back(v);
            at = end + 1;
        }
        while ((int)recent_.size() > window_) { recent_.erase(recent_.begin()); }
        return true;
    }

private:
    double factor_;
    int window_;
    std::vector<double> recent_;
};

// Peak dense FLOP/s of a GPU (by its name as the driver reports it) for the build's
// precision, for the MFU figure: bf16 tensor cores with fp32 accumulation, or plain fp32
// (no TF32) in fp32 builds; 0 where unknown. Data-sheet figures, dense (no sparsity).
struct GpuPeak {
    const char* name_part;  // matched as a substring; the first match wins (more specific first)
    double bf16, fp32;      // TFLOP/s
};
inline double peak_flops_for(const std::string& device_name, bool fp32_build) {
    static const GpuPeak peaks[] = {
        {"H200", 989, 67},     {"H100 PCIe", 756, 51}, {"H100", 989, 67},    {"GH200", 989, 67},
        {"B200", 2250, 80},    {"A100", 312, 19.5},    {"L40S", 362, 91.6},  {"L40", 181, 90.5},
        {"L4", 121, 30.3},     {"A10G", 70, 31.2},     {"A10", 125, 31.2},   {"RTX 4090", 165, 82.6},
        {"RTX 3090", 71, 35.6}, {"A6000", 155, 38.7},
    };
    for (const GpuPeak& p : peaks) {
        if (device_name.find(p.name_part) != std::string::npos) { return (fp32_build ? p.fp32 : p.bf16) * 1e12; }
    }
    return 0.0;
}
inline double peak_flops_per_second() {
    if (HOST_BACKEND) { return 0.0; }
    cudaDeviceProp prop;
    cudaCheck(cudaGetDeviceProperties(&prop, 0));
    return peak_flops_for(prop.name, PRECISION_MODE == PrecisionMode::FP32);
}

// "N shards, M tokens (first .. last)" of a loader's files, for the start-of-run summary.
inline std::string describe_data(const DataLoader& d) {
    int64_t tokens = 0;
    for (const ShardInfo& s : d.shards()) { tokens += s.ntok; }
    auto base = [](const std::string& p) { return p.substr(p.find_last_of('/') + 1); };
    const std::vector<ShardInfo>& sh = d.shards();
    std::string out = std::to_string(sh.size()) + (sh.size() == 1 ? " shard, " : " shards, ") +
                      std::to_string(tokens) + " tokens (" + base(sh.front().path);
    if (sh.size() > 1) { out += " .. " + base(sh.back().path); }
    return out + ")";
}
