/*
Effective rank of a set of hidden states (the SAN paper's measure of how much of the
residual stream's width a layer uses), in double precision on the host:

    H: n x d (n tokens of width d), centred by subtracting the mean over tokens
    s = singular values of H;  p = s / sum(s);  erank = exp(-sum_i p_i log p_i)

s^2 are the eigenvalues of the Gram matrix of the smaller side (H^T H, d x d, or H H^T,
n x n). The Gram matrix is reduced to tridiagonal form by Householder reflections, and its
eigenvalues are found one by one by bisection on Sturm sequence counts: O(m^3) for the
reduction and O(m^2) per bisection step, well under a second for m = 512. Host-only C++17.
*/
#pragma once

#include <algorithm>
#include <cmath>
#include <vector>

// Eigenvalues (ascending) of the symmetric m x m matrix A (row-major; destroyed).
inline std::vector<double> symmetric_eigenvalues(std::vector<double>& A, int m) {
    auto at = [&](int i, int j) -> double& { return A[(size_t)i * m + j]; };
    // Householder: for column k, reflect rows/cols k+1.. so that A[k+2.., k] becomes 0.
    std::vector<double> v(m), p(m);
    for (int k = 0; k + 2 < m; k++) {
        double norm = 0.0;
        for (int i = k + 1; i < m; i++) { norm += at(i, k) * at(i, k); }
        norm = std::sqrt(norm);
        if (norm == 0.0) { continue; }
        double alpha = at(k + 1, k) > 0 ? -norm : norm;  // v = x - alpha e1 without cancellation
        double vnorm_sq = 0.0;
        for (int i = k + 1; i < m; i++) {
            v[i] = at(i, k) - (i == k + 1 ? alpha : 0.0);
            vnorm_sq += v[i] * v[i];
        }
        if (vnorm_sq == 0.0) { continue; }
        double inv = 1.0 / std::sqrt(vnorm_sq);
        for (int i = k + 1; i < m; i++) { v[i] *= inv; }
        // A' = H A H with H = I - 2 v v^T on the trailing block: A' = A - 2 v w^T - 2 w v^T,
        // where p = A v, K = v^T p, w = p - K v.
        double K = 0.0;
        for (int i = k + 1; i < m; i++) {
            double sum = 0.0;
            for (int j = k + 1; j < m; j++) { sum += at(i, j) * v[j]; }
            p[i] = sum;
            K += v[i] * sum;
        }
        for (int i = k + 1; i < m; i++) { p[i] -= K * v[i]; }
        for (int i = k + 1; i < m; i++) {
            for (int j = k + 1; j < m; j++) { at(i, j) -= 2.0 * (v[i] * p[j] + p[i] * v[j]); }
        }
        at(k + 1, k) = at(k, k + 1) = alpha;
        for (int i = k + 2; i < m; i++) { at(i, k) = at(k, i) = 0.0; }
    }
    std::vector<double> diag(m), off(std::max(0, m - 1));
    for (int i = 0; i < m; i++) { diag[i] = at(i, i); }
    for (int i = 0; i + 1 < m; i++) { off[i] = at(i + 1, i); }
    // Sturm count: the number of eigenvalues below x is the number of negative pivots of
    // the LDL^T factorisation of T - x I.
    auto count_below = [&](double x) {
        int count = 0;
        double q = 1.0;
        for (int i = 0; i < m; i++) {
            double e2 = i > 0 ? off[i - 1] * off[i - 1] : 0.0;
            q = diag[i] - x - (i > 0 ? e2 / q : 0.0);
            if (q == 0.0) { q = -1e-300; }
            count += q < 0.0;
        }
        return count;
    };
    double lo = 0.0, hi = 0.0;  // Gershgorin bounds
    for (int i = 0; i < m; i++) {
        double r = (i > 0 ? std::fabs(off[i - 1]) : 0.0) + (i + 1 < m ? std::fabs(off[i]) : 0.0);
        lo = std::min(lo, diag[i] - r);
        hi = std::max(hi, diag[i] + r);
    }
    double pad = 1e-12 * std::max(1.0, hi - lo);
    std::vector<double> eig(m);
    for (int k = 0; k < m; k++) {  // the (k+1)-th smallest: count_below(x) > k  <=>  x > eig[k]
        double a = lo - pad, b = hi + pad;
        for (int it = 0; it < 200 && b - a > 1e-15 * std::max(1.0, std::fabs(a) + std::fabs(b)); it++) {
            double mid = 0.5 * (a + b);
            if (count_below(mid) > k) { b = mid; } else { a = mid; }
        }
        eig[k] = 0.5 * (a + b);
    }
    return eig;
}

// Effective rank of H (n x d, row-major floats), centred over its n rows.
inline double effective_rank(const std::vector<float>& H, int n, int d) {
    std::vector<double> mean(d, 0.0);
    for (int i = 0; i < n; i++) {
        for (int j = 0; j < d; j++) { mean[j] += H[(size_t)i * d + j]; }
    }
    for (double& x : mean) { x /= n; }
    std::vector<double> X((size_t)n * d);
    for (int i = 0; i < n; i++) {
        for (int j = 0; j < d; j++) { X[(size_t)i * d + j] = H[(size_t)i * d + j] - mean[j]; }
    }
    const bool tokens_side = n <= d;  // Gram of the smaller side
    const int m = tokens_side ? n : d;
    std::vector<double> G((size_t)m * m, 0.0);
    if (tokens_side) {
        for (int i = 0; i < n; i++) {
            for (int k = 0; k <= i; k++) {
                double sum = 0.0;
                for (int j = 0; j < d; j++) { sum += X[(size_t)i * d + j] * X[(size_t)k * d + j]; }
                G[(size_t)i * m + k] = G[(size_t)k * m + i] = sum;
            }
        }
    } else {
        for (int i = 0; i < n; i++) {
            const double* row = &X[(size_t)i * d];
            for (int a = 0; a < d; a++) {
                double ra = row[a];
                double* out = &G[(size_t)a * m];
                for (int b = 0; b < d; b++) { out[b] += ra * row[b]; }
            }
        }
    }
    std::vector<double> eig = symmetric_eigenvalues(G, m);
    double total = 0.0;
    std::vector<double> s(m);
    for (int i = 0; i < m; i++) {
        s[i] = std::sqrt(std::max(0.0, eig[i]));
        total += s[i];
    }
    if (total <= 0.0) { return 0.0; }
    double entropy = 0.0;
    for (double x : s) {
        double p = x / total;
        if (p > 0.0) { entropy -= p * std::log(p); }
    }
    return std::exp(entropy);
}
