/*
Numbers as text, read strictly and written exactly. Command-line flags, checkpoint configs and
a resume's saved settings all go through these, so that "abc", "4 ", " 4", "0x10", "1e99999",
"nan" or a value past the target type is refused where it is read, not turned into 0, a
saturated value or a wrapped one (`--batch-size 4294967297` once trained with batch 1).
Host-only C++17.
*/
#pragma once

#include <cctype>
#include <cerrno>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>

// A decimal integer that is the whole text (an optional sign, digits; no leading space) and
// fits a long long.
inline bool parse_whole_integer(const char* text, long long* out) {
    if (text == nullptr || *text == '\0' || isspace((unsigned char)*text)) { return false; }
    char* end = nullptr;
    errno = 0;
    long long x = strtoll(text, &end, 10);
    if (*end != '\0' || errno == ERANGE) { return false; }
    *out = x;
    return true;
}

// The same for an unsigned 64-bit value (seeds, fingerprints): digits only, so "-1" is refused
// rather than read as 2^64 - 1.
inline bool parse_whole_unsigned64(const char* text, uint64_t* out) {
    if (text == nullptr || !isdigit((unsigned char)*text)) { return false; }
    char* end = nullptr;
    errno = 0;
    unsigned long long x = strtoull(text, &end, 10);
    if (*end != '\0' || errno == ERANGE) { return false; }
    *out = (uint64_t)x;
    return true;
}

// A real number that is the whole text and finite (strtod's syntax: "3e-4", ".5"; not "nan",
// "inf" or a value that overflows a double).
inline bool parse_finite_real(const char* text, double* out) {
    if (text == nullptr || *text == '\0' || isspace((unsigned char)*text)) { return false; }
    char* end = nullptr;
    double x = strtod(text, &end);
    if (*end != '\0' || !std::isfinite(x)) { return false; }
    *out = x;
    return true;
}

// The shortest text that reads back to the same double (how checkpoints store reals).
inline std::string shortest_real_text(double value) {
    char text[40];
    for (int precision = 1; precision <= 17; precision++) {
        snprintf(text, sizeof(text), "%.*g", precision, value);
        if (strtod(text, nullptr) == value) { break; }
    }
    return text;
}

// The shortest text that reads back to the same float.
inline std::string shortest_float_text(float value) {
    char text[40];
    for (int precision = 1; precision <= 9; precision++) {
        snprintf(text, sizeof(text), "%.*g", precision, (double)value);
        if (strtof(text, nullptr) == value) { break; }
    }
    return text;
}
