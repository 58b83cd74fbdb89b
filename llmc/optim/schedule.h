/*
Learning-rate schedules: the multiplier f(s) of the peak rate at optimizer step s over a horizon
of S steps (the run's steps, or --schedule-steps when given; steps past it keep its last rate).
Linear warmup, then wsd, cosine, linear or constant (formulas at multiplier()). The SAN paper
code's convention (optax's, and Hugging Face's schedulers'): step s (0-based) runs at the rate of
progress s, so the first update of a warmup runs at rate 0, and step counts are floored.
Host-only C++17. The formulas, defaults and why: doc/san-model.md "Schedules".
*/
#pragma once

#include <algorithm>
#include <cmath>
#include <string>

#include "llmc/choices.h"
#include "llmc/utils.h"

enum class ScheduleKind { WSD, Cosine, Linear, Constant };
inline const Choices<ScheduleKind> kScheduleKinds{{"wsd", "cosine", "linear", "constant"}};

struct Schedule {
    ScheduleKind kind = ScheduleKind::WSD;
    double warmup_frac = 0.05, decay_frac = 0.15, final_frac = 0.05;
    long horizon = 0;  // S (--schedule-steps); 0: the run's steps

    // The steps S the schedule runs over in a run of `run_steps`.
    long steps(long run_steps) const { return horizon > 0 ? horizon : run_steps; }

    const char* name() const { return kScheduleKinds.name(kind); }
    // Rounds to nearest, halves up (floor(x + 0.5)), as the reference does (the horizon of
    // --deconstructing-setup).
    static long round_steps(double fraction, long total) { return (long)std::floor(fraction * total + 0.5); }
    // The schedule's step counts W, D: floor(fraction * total), as the SAN paper code's int(); 1e-9
    // of slack so that a fraction written for a whole count (2,000 of 120,000) gives that count.
    static long floor_steps(double fraction, long total) { return (long)std::floor(fraction * total + 1e-9); }

    void check_fractions() const {
        if (!(warmup_frac >= 0.0 && warmup_frac <= 1.0)) { fatal("--warmup-frac must be in [0, 1], got %g", warmup_frac); }
        if (!(decay_frac >= 0.0 && decay_frac <= 1.0)) { fatal("--decay-frac must be in [0, 1], got %g", decay_frac); }
        if (!(final_frac >= 0.0 && final_frac <= 1.0)) { fatal("--final-frac must be in [0, 1], got %g", final_frac); }
        if (horizon < 0) { fatal("--schedule-steps must be >= 0 (0: --steps), got %ld", horizon); }
    }
    void check(long run_steps) const {
        const long total = steps(run_steps);
        if (total <= 0) { fatal("schedule: the number of steps must be positive, got %ld", total); }
        long W = floor_steps(warmup_frac, total), D = kind == ScheduleKind::WSD ? floor_steps(decay_frac, total) : 0;
        if (W + D > total) {
            fatal("schedule: warmup (%ld steps) + decay (%ld steps) exceed the %ld steps of the %s", W, D, total,
                  horizon > 0 ? "schedule (--schedule-steps)" : "run");
        }
    }

    // f(s). Linear warmup f = s / W over W = floor(warmup_frac * S) steps, then
    //     wsd       constant, and over the last D = floor(decay_frac * S) steps a cosine from 1
    //               towards final_frac: f = cos_to_final((s - (S - D)) / D), the last step one
    //               step short of it;
    //     cosine    cosine from 1 towards final_frac over the steps after warmup, p = (s - W) / (S - W);
    //     linear    linear from 1 towards final_frac over the same p;
    //     constant  1 (after the warmup).
    double multiplier(long s, long run_steps) const {
        const long total = steps(run_steps);
        s = std::min(s, total - 1);  // past the horizon: its last rate
        long W = floor_steps(warmup_frac, total);
        if (s < W) { return (double)s / W; }
        if (kind == ScheduleKind::Constant) { return 1.0; }
        auto cosine = [&](double p) { return final_frac + (1.0 - final_frac) * 0.5 * (1.0 + std::cos(M_PI * p)); };
        if (kind == ScheduleKind::WSD) {
            long D = floor_steps(decay_frac, total);
            if (s < total - D) { return 1.0; }
            return cosine((double)(s - (total - D)) / D);
        }
        double p = (double)(s - W) / (double)(total - W);
        return kind == ScheduleKind::Cosine ? cosine(p) : 1.0 - (1.0 - final_frac) * p;
    }
};
