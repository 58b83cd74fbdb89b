/*
A minimal test harness for the C++/CUDA test binaries: named test cases, CHECK macros
that report file:line and keep going, and a summary whose exit status is non-zero when any
check failed (element-wise comparisons: dev/test/compare.h). Header-only, host code.
*/
#pragma once

#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

namespace testing {

struct Registry {
    struct Case {
        std::string name;  // (owned: the binaries name cases after the files they find)
        std::function<void()> run;
    };
    std::vector<Case> cases;
    int failed_checks = 0;
    const char* current = "";
    static Registry& get() {
        static Registry r;
        return r;
    }
};

inline bool register_case(std::string name, std::function<void()> fn) {
    Registry::get().cases.push_back({std::move(name), std::move(fn)});
    return true;
}

inline void report_failure(const char* file, int line, const std::string& what) {
    Registry::get().failed_checks++;
    fprintf(stderr, "  FAILED %s:%d [%s]: %s\n", file, line, Registry::get().current, what.c_str());
}

// Runs every case whose name contains `filter` (all when null); returns the exit status.
inline int run_all(const char* program, const char* filter) {
    Registry& r = Registry::get();
    int failed_cases = 0, ran = 0;
    for (auto& c : r.cases) {
        if (filter != nullptr && strstr(c.name.c_str(), filter) == nullptr) { continue; }
        r.current = c.name.c_str();
        int before = r.failed_checks;
        c.run();
        bool ok = r.failed_checks == before;
        failed_cases += !ok;
        ran++;
        printf("%s %s\n", ok ? "  ok  " : "  FAIL", c.name.c_str());
        fflush(stdout);
    }
    printf("%s: %d of %d test cases passed\n", program, ran - failed_cases, ran);
    return failed_cases == 0 && ran > 0 ? 0 : 1;
}

}  // namespace testing

#define TEST_CASE(name)                                                              \
    static void test_##name();                                                       \
    static const bool registered_##name = testing::register_case(#name, test_##name); \
    static void test_##name()

#define CHECK(cond)                                                                 \
    do {                                                                            \
        if (!(cond)) { testing::report_failure(__FILE__, __LINE__, "CHECK(" #cond ")"); } \
    } while (0)

#define CHECK_EQ(a, b)                                                                         \
    do {                                                                                       \
        auto check_a_ = (a);                                                                   \
        auto check_b_ = (b);                                                                   \
        if (!(check_a_ == check_b_)) {                                                         \
            testing::report_failure(__FILE__, __LINE__,                                        \
                                    std::string(#a " == " #b ": ") + std::to_string(check_a_) + \
                                        " vs " + std::to_string(check_b_));                    \
        }                                                                                      \
    } while (0)

#define TEST_MAIN()                                                                        \
    int main(int argc, char** argv) { return testing::run_all(argv[0], argc > 1 ? argv[1] : nullptr); }
