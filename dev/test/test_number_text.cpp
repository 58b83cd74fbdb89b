/*
Tests llmc/number_text.h (the strict number parsing of flags, checkpoint configs and saved
settings) and the numeric flags of llmc/cli.h built on it: each text below is either read to
the value written beside it (exact: small integers, powers of two, or strtod's own reading
compared bit for bit) or refused; a refused flag stops naming the option and the problem.
Also the writer side: shortest_real_text reads back to the same double, and is the shortest.
  make build/host-bf16/test_number_text
*/
#include <cfloat>
#include <climits>
#include <cstring>

#include "dev/test/data_test_util.h"
#include "llmc/cli.h"
#include "llmc/data/dataloader.h"  // SplitMix64
#include "llmc/number_text.h"

static bool integer_reads(const char* text, long long expected) {
    long long x = 0;
    return parse_whole_integer(text, &x) && x == expected;
}
static bool integer_refused(const char* text) {
    long long x = 12345;
    return !parse_whole_integer(text, &x) && x == 12345;  // a refusal leaves the target alone
}

TEST_CASE(whole_integers) {
    CHECK(integer_reads("0", 0));
    CHECK(integer_reads("42", 42));
    CHECK(integer_reads("-7", -7));
    CHECK(integer_reads("+7", 7));
    CHECK(integer_reads("9223372036854775807", LLONG_MAX));
    CHECK(integer_reads("-9223372036854775808", LLONG_MIN));
    for (const char* bad : {"", " 4", "4 ", "\t4", "abc", "4x", "0x10", "1e3", "1.0", "--1",
                            "9223372036854775808", "-9223372036854775809", "99999999999999999999"}) {
        if (!integer_refused(bad)) { fprintf(stderr, "  accepted '%s'\n", bad); CHECK(false); }
    }
    long long x;
    CHECK(!parse_whole_integer(nullptr, &x));
}

TEST_CASE(unsigned_64) {
    uint64_t x = 0;
    CHECK(parse_whole_unsigned64("18446744073709551615", &x) && x == UINT64_MAX);
    CHECK(parse_whole_unsigned64("42", &x) && x == 42);
    for (const char* bad : {"", "-1", "+1", " 1", "1 ", "18446744073709551616", "0x1", "abc"}) {
        x = 7;
        if (parse_whole_unsigned64(bad, &x) || x != 7) { fprintf(stderr, "  accepted '%s'\n", bad); CHECK(false); }
    }
}

TEST_CASE(finite_reals) {
    double x = 0;
    CHECK(parse_finite_real("0.5", &x) && x == 0.5);
    CHECK(parse_finite_real("-2", &x) && x == -2.0);
    CHECK(parse_finite_real(".25", &x) && x == 0.25);
    CHECK(parse_finite_real("3e-4", &x) && x == strtod("3e-4", nullptr));
    CHECK(parse_finite_real("1e308", &x) && x == 1e308);
    CHECK(parse_finite_real("4.9e-324", &x) && x > 0);  // the smallest subnormal: finite, kept
    for (const char* bad : {"", " 1", "1 ", "nan", "NaN", "inf", "-inf", "infinity", "1e400", "-1e400",
                            "abc", "1,5", "0.5x", "e5"}) {
        x = 9;
        if (parse_finite_real(bad, &x) || x != 9) { fprintf(stderr, "  accepted '%s'\n", bad); CHECK(false); }
    }
}

TEST_CASE(shortest_real_text_round_trips) {
    CHECK(shortest_real_text(0.5) == "0.5");
    CHECK(shortest_real_text(3e-4) == "0.0003");
    CHECK(shortest_real_text(0.1) == "0.1");
    CHECK(shortest_real_text(-2.0) == "-2");
    // values with no short form: every one reads back exactly, and one digit fewer would not
    SplitMix64 rng(1);
    for (int i = 0; i < 2000; i++) {
        uint64_t bits = rng.next();
        double value;
        memcpy(&value, &bits, sizeof(value));
        if (!std::isfinite(value)) { continue; }
        std::string text = shortest_real_text(value);
        double back;
        CHECK(parse_finite_real(text.c_str(), &back) && memcmp(&back, &value, sizeof(back)) == 0);
    }
    double third = 1.0 / 3.0;
    std::string text = shortest_real_text(third);
    char shorter[64];
    snprintf(shorter, sizeof(shorter), "%.*g", (int)text.size() - 3, third);  // ("0." and one digit less)
    CHECK(strtod(shorter, nullptr) != third);
    CHECK(strtod(text.c_str(), nullptr) == third);
}

// A flag of type T parsed from `text` in a child: the value it set, or the child's error.
template <typename T>
static bool flag_reads(const char* text, T expected) {
    T target{};
    Flag f = make_flag("--value", &target, "");
    return f.parse(text) && target == expected;
}
template <typename T>
static bool flag_refused(const char* text, const std::string& message) {
    return expect_fatal([&] {
        T target{};
        make_flag("--value", &target, "").parse(text);
    }, {"option --value", message});
}

TEST_CASE(numeric_flags) {
    CHECK(flag_reads<int>("2147483647", INT_MAX));
    CHECK(flag_reads<int>("-2147483648", INT_MIN));
    CHECK(flag_reads<long>("4294967297", 4294967297L));
    CHECK(flag_reads<uint64_t>("18446744073709551615", UINT64_MAX));
    CHECK(flag_reads<float>("3e-4", 3e-4f));
    CHECK(flag_reads<double>("0.95", 0.95));
    CHECK(flag_reads<std::string>("a b", std::string("a b")));
    // what an unchecked strtoll cast once did: wrap to 1, saturate, or read a prefix
    CHECK(flag_refused<int>("4294967297", "out of range (-2147483648 to 2147483647)"));
    CHECK(flag_refused<int>("-2147483649", "out of range"));
    CHECK(flag_refused<int>("1e3", "'1e3' is not an integer"));
    CHECK(flag_refused<int>("abc", "'abc' is not an integer"));
    CHECK(flag_refused<int>("", "'' is not an integer"));
    CHECK(flag_refused<long>("99999999999999999999", "is not an integer"));
    CHECK(flag_refused<uint64_t>("-1", "'-1' is not a non-negative integer"));
    CHECK(flag_refused<uint64_t>("18446744073709551616", "is not a non-negative integer"));
    CHECK(flag_refused<double>("nan", "'nan' is not a finite number"));
    CHECK(flag_refused<double>("inf", "'inf' is not a finite number"));
    CHECK(flag_refused<double>("0.1 ", "is not a finite number"));
    CHECK(flag_refused<float>("1e39", "1e39 is too large"));  // finite as a double, not as a float
    CHECK(flag_refused<float>("-1e39", "is too large"));
    CHECK(flag_reads<float>("3.4e38", 3.4e38f));
}

int main(int argc, char** argv) { return testing::run_all(argv[0], argc > 1 ? argv[1] : nullptr); }
