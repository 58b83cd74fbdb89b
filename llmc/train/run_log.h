/*
What a run writes besides validation (host-only C++17): JSON-lines pieces (json_string,
append_json_array), loss-spike detection (SpikeDetector), the GPU peak rates behind the
MFU figure (peak_flops_for), and the one-line summary of the data a loader matched
(describe_data).
*/
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "llmc/cuda_common.h"
#include "llmc/data/dataloader.h"
#include "llmc/train/run_record.h"  // defines: json_string

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
