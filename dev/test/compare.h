/*
Comparisons of a trainer's tensors with a PyTorch debug state (doc/formats.md "Debug
state"), for the trainer tests (test_gpt2.cu; test_san.cu has the same two functions
inline and can switch to this header):

  compare(what, got, ref, n, tol)      every element: |got - ref| <= tol.atol * max|ref|
                                       + tol.rtol * |ref| + tol.abs; reports the worst
                                       element (as a fraction of its allowance)
  compare_l2(what, got, ref, n, tol)   ||got - ref|| / ||ref|| <= tol for the whole tensor

Both record a test failure (dev/test/testing.h) and print a line when out of tolerance, and
always print one with TEST_VERBOSE set (the measured errors the tolerances are set from).
*/
#pragma once

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "dev/test/testing.h"

struct Tolerance {
    double atol, rtol, abs = 0.0;  // allowed = atol * max|ref| + rtol * |ref| + abs
};

inline bool compare_verbose() { return getenv("TEST_VERBOSE") != nullptr; }

// Relative L2 error ||got - ref|| / ||ref|| of one tensor.
inline bool compare_l2(const std::string& what, const float* got, const float* ref, size_t n, double tol) {
    double diff = 0.0, norm = 0.0;
    for (size_t i = 0; i < n; i++) {
        diff += ((double)got[i] - ref[i]) * ((double)got[i] - ref[i]);
        norm += (double)ref[i] * ref[i];
    }
    double rel = norm > 0.0 ? std::sqrt(diff / norm) : std::sqrt(diff);
    bool ok = rel <= tol;
    if (compare_verbose() || !ok) {
        printf("    %-40s %s relative L2 error %.3g (tol %.3g)\n", what.c_str(), ok ? "ok  " : "FAIL", rel, tol);
    }
    if (!ok) { testing::report_failure(__FILE__, __LINE__, what + ": relative L2 error out of tolerance"); }
    return ok;
}

// Element-wise comparison under tol; reports the worst element and returns true if all pass.
inline bool compare(const std::string& what, const float* got, const float* ref, size_t n, Tolerance tol) {
    double max_ref = 0.0;
    for (size_t i = 0; i < n; i++) { max_ref = std::fmax(max_ref, (double)std::fabs(ref[i])); }
    size_t bad = 0, worst = 0;
    double worst_ratio = 0.0;
    for (size_t i = 0; i < n; i++) {
        double err = std::fabs((double)got[i] - (double)ref[i]);
        double allowed = tol.atol * max_ref + tol.rtol * std::fabs(ref[i]) + tol.abs;
        double ratio = allowed > 0.0 ? err / allowed : (err > 0.0 ? INFINITY : 0.0);
        if (!(ratio <= 1.0)) { bad++; }
        if (!(ratio <= worst_ratio)) {
            worst_ratio = ratio;
            worst = i;
        }
    }
    if (compare_verbose() || bad > 0) {
        printf("    %-40s %s worst err/allowed %.3f at [%zu]: %.9g vs %.9g (max|ref| %.3g)\n", what.c_str(),
               bad ? "FAIL" : "ok  ", worst_ratio, worst, n ? got[worst] : 0.0f, n ? ref[worst] : 0.0f, max_ref);
    }
    if (bad > 0) {
        testing::report_failure(__FILE__, __LINE__, what + ": " + std::to_string(bad) + " of " + std::to_string(n) +
                                                         " elements out of tolerance");
    }
    return bad == 0;
}
