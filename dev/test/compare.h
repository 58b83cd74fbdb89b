/*
The one element-wise comparison of the C++ tests and the kernel playgrounds: a value is
within tolerance when

    |got - ref| <= tol.atol * max|ref| + tol.rtol * |ref| + tol.abs        (NaN never is)

  measure_error(got, ref, n, tol)      the count out of tolerance and the worst element (as
                                       a fraction of its allowance): what the others report
  compare(what, got, ref, n, tol)      records a test failure (dev/test/testing.h) and prints
                                       the worst element when out of tolerance (always with
                                       TEST_VERBOSE set: the measured errors tolerances cite)
  CHECK_CLOSE(what, got, ref, n, abs, rel)   compare() with tol {0, rel, abs}
  compare_l2(what, got, ref, n, tol)   ||got - ref|| / ||ref|| <= tol for the whole tensor
The playgrounds' validate_result (dev/cuda/common.h) prints measure_error's figures.
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

struct ErrorMeasure {
    size_t bad = 0, worst = 0;   // elements out of tolerance; the index of the worst one
    double worst_ratio = 0.0;    // its |error| / allowance (> 1: out of tolerance)
    double max_error = 0.0;      // the largest finite |error|
    double max_ref = 0.0;
};

template <typename Got, typename Ref>
ErrorMeasure measure_error(const Got* got, const Ref* ref, size_t n, Tolerance tol) {
    ErrorMeasure m;
    for (size_t i = 0; i < n; i++) { m.max_ref = std::fmax(m.max_ref, std::fabs((double)ref[i])); }
    for (size_t i = 0; i < n; i++) {
        double err = std::fabs((double)got[i] - (double)ref[i]);
        double allowed = tol.atol * m.max_ref + tol.rtol * std::fabs((double)ref[i]) + tol.abs;
        double ratio = allowed > 0.0 ? err / allowed : (err > 0.0 ? INFINITY : 0.0);
        if (!(ratio <= 1.0)) { m.bad++; }
        if (!(ratio <= m.worst_ratio)) {
            m.worst_ratio = ratio;
            m.worst = i;
        }
        if (std::isfinite(err) && err > m.max_error) { m.max_error = err; }
    }
    return m;
}

// Element-wise comparison under tol; reports the worst element and returns true if all pass.
template <typename Got, typename Ref>
bool compare(const std::string& what, const Got* got, const Ref* ref, size_t n, Tolerance tol) {
    ErrorMeasure m = measure_error(got, ref, n, tol);
    if (compare_verbose() || m.bad > 0) {
        printf("    %-40s %s worst err/allowed %.3f at [%zu]: %.9g vs %.9g (max|ref| %.3g)\n", what.c_str(),
               m.bad ? "FAIL" : "ok  ", m.worst_ratio, m.worst, n ? (double)got[m.worst] : 0.0,
               n ? (double)ref[m.worst] : 0.0, m.max_ref);
    }
    if (m.bad > 0) {
        testing::report_failure(__FILE__, __LINE__, what + ": " + std::to_string(m.bad) + " of " + std::to_string(n) +
                                                         " elements out of tolerance");
    }
    return m.bad == 0;
}

#define CHECK_CLOSE(what, got, ref, n, abs, rel) compare((what), (got), (ref), (n), Tolerance{0.0, (double)(rel), (double)(abs)})

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
