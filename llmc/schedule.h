/*
Learning-rate schedules (doc/san-model.md, "Schedules"): the multiplier f(s) of the peak
rate at optimizer step s = 0..S-1 of S. Linear warmup over W = round(warmup_frac * S)
steps, then
    wsd       constant, and over the last D = round(decay_frac * S) steps a cosine from 1
              down to final_frac (reached exactly at the last step);
    cosine    cosine from 1 to final_frac over the steps after warmup;
    linear    linear from 1 to final_frac over the steps after warmup;
    constant  1 (after the warmup).
Host-only C++17.
*/
#pragma once

#include <cmath>
#include <string>

#include "utils.h"

struct Schedule {
    std::string kind = "wsd";
    double warmup_frac = 0.05, decay_frac = 0.15, final_frac = 0.05;

    static bool valid_kind(const std::string& k) {
        return k == "wsd" || k == "cosine" || k == "linear" || k == "constant";
    }
    // Rounds to nearest, halves up (floor(x + 0.5)), as the reference does.
    static long round_steps(double fraction, long total) { return (long)std::floor(fraction * total + 0.5); }

    void check(long total) const {
        if (!valid_kind(kind)) { fatal("--schedule: unknown schedule '%s' (wsd, cosine, linear, constant)", kind.c_str()); }
        if (total <= 0) { fatal("schedule: the number of steps must be positive, got %ld", total); }
        long W = round_steps(warmup_frac, total), D = kind == "wsd" ? round_steps(decay_frac, total) : 0;
        if (W + D > total) {
            fatal("schedule: warmup (%ld steps) + decay (%ld steps) exceed the %ld steps of the run", W, D, total);
        }
    }

    double multiplier(long s, long total) const {
        long W = round_steps(warmup_frac, total);
        if (s < W) { return (double)(s + 1) / W; }
        if (kind == "constant") { return 1.0; }
        auto cosine = [&](double p) { return final_frac + (1.0 - final_frac) * 0.5 * (1.0 + std::cos(M_PI * p)); };
        if (kind == "wsd") {
            long D = round_steps(decay_frac, total);
            if (s < total - D) { return 1.0; }
            return cosine((double)(s - (total - D) + 1) / D);
        }
        double p = (double)(s - W + 1) / (double)(total - W);
        return kind == "cosine" ? cosine(p) : 1.0 - (1.0 - final_frac) * p;
    }
};
