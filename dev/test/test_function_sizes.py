"""No function outside the tests runs over 120 lines, in C++/CUDA or Python (dev/function_sizes.py), and
the brace matcher that measures the C++ side finds what a reader would call a function."""
import os
import subprocess
import sys

import function_sizes

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SAMPLE = r'''
#include <vector>   // { in a comment
#define OPEN {
struct Config : Base {
    int n = 2;
    Config(int a, int b) : Base(a), n(b) {
        x = a;
    }
    bool operator()(int i) const { return i < n; }
};
template <int HD>
__global__ void __launch_bounds__(128) kernel(float* out, int n) {
    const char* s = "} {";
    char c = '{';
    auto f = [&](int i) {
        if (i > 0) {
            out[i] = 1;
        }
    };
    for (int i = 0; i < n; i++) { f(i); }
    const char* raw = R"x(}})x";
}
namespace {
int helper(std::vector<int> v) { return call(v, [](int a) { return a; }); }
}
'''


def test_the_brace_matcher_finds_functions_not_blocks():
    found = {name: (line, n) for name, line, n in function_sizes.cpp_functions(SAMPLE)}
    assert found == {"Config": (6, 3), "operator()": (9, 1), "kernel": (11, 12), "helper": (24, 1)}


def test_python_functions_count_from_their_decorators():
    text = "import functools\n\n@functools.cache\ndef f(x):\n    y = x\n    return y\n"
    assert function_sizes.python_functions(text) == [("f", 3, 4)]


def test_no_function_outside_the_tests_is_over_120_lines():
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "dev", "function_sizes.py"), "--max", "120"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_a_long_function_fails_the_check(tmp_path):
    path = tmp_path / "long.cpp"
    path.write_text("int f() {\n" + "    g();\n" * 130 + "}\n")
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "dev", "function_sizes.py"), str(path)], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and f"{path}:1 f 132" in proc.stdout, proc.stdout + proc.stderr
