"""Lines per function in the repository's C++/CUDA and Python sources, to keep the rule that no
function outside the tests runs over 120 lines (doc/testing.md; dev/test/test_function_sizes.py).

    python dev/function_sizes.py [--max 120] [--all] [FILE ...]

Lists every function longer than --max lines, longest first (FILE:LINE NAME LINES, from the line its
signature starts on to its closing brace or last line), and exits 1 if one outside the tests (dev/test/,
test_*.cu, test_*.py) is among them; --all lists the tests' too. Without FILEs: the files git tracks.

C++ is read by a brace matcher, not a parser: comments, string and character literals and
preprocessor lines are blanked, then a `{` opens a function when the text since the previous ; { }
ends in NAME(ARGS) with balanced parentheses (and optional qualifiers or a constructor's
initialiser list), NAME not a control keyword. Lambdas and local classes count with the function
around them. Python functions come from the ast (methods and nested functions each count alone).
"""
import argparse
import ast
import os
import re
import subprocess
import sys

CONTROL = {"if", "for", "while", "switch", "catch", "return", "else", "do", "sizeof", "decltype", "alignas",
           "static_assert", "defined", "requires"}
TYPE_HEADS = ("struct", "class", "union", "enum", "namespace")
QUALIFIERS = re.compile(r"(\s|const|noexcept|override|final|mutable|volatile|&|->[^{;()]*)*$")
CPP_EXTENSIONS = (".h", ".cu", ".cuh", ".cpp", ".c")


def blank_cpp(text):
    """`text` with comments, literals (raw strings too) and preprocessor lines turned into spaces;
    newlines stay, so offsets and line numbers do not move."""
    out, i, n = [], 0, len(text)
    while i < n:
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
        elif text.startswith('R"', i) and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            m = re.match(r'R"([^(\s]{0,16})\(', text[i:])
            end = text.find(")" + m.group(1) + '"', i) if m else -1
            j = n if end < 0 else end + len(m.group(1)) + 2
        elif text[i] in "\"'" and not (text[i] == "'" and i > 0 and text[i - 1].isalnum()):  # (not a digit separator)
            j = i + 1
            while j < n and text[j] not in (text[i], "\n"):
                j += 2 if text[j] == "\\" else 1
            j = min(j + 1, n)
        else:
            out.append(text[i])
            i += 1
            continue
        out.append(re.sub(r"[^\n]", " ", text[i:j]))
        i = j
    return re.sub(r"^[ \t]*#.*$", lambda m: " " * len(m.group(0)), "".join(out), flags=re.M)


def _matching_open(head, close):
    depth = 0
    for k in range(close, -1, -1):
        depth += head[k] == ")"
        depth -= head[k] == "("
        if depth == 0:
            return k
    return -1


def function_name(head):
    """The name of the function whose body a `{` after `head` opens, or None."""
    if head.startswith(TYPE_HEADS) or head.count("(") != head.count(")"):
        return None
    while True:
        q = QUALIFIERS.search(head)
        body = head[:q.start()] if q else head
        if not body.endswith(")"):
            return None
        open_at = _matching_open(body, len(body) - 1)
        m = re.search(r"(~?[A-Za-z_]\w*|operator\s*\(\)|operator\s*[^\s\w(]+|operator\s+\w+)\s*$", body[:open_at]) if open_at > 0 else None
        if m is None:
            return None
        before = body[:m.start()].rstrip()
        init_list = re.search(r"\)\s*(const\s*|noexcept\s*)*:(?!:)", body)
        if before.endswith((":", ",")) and not before.endswith("::") and init_list:
            head = body[:init_list.start() + 1]  # a constructor's initialiser list: the name is before it
            continue
        name = m.group(1)
        first = re.match(r"[A-Za-z_]\w*", head)
        if name in CONTROL or (first and first.group(0) in CONTROL) or before.endswith(("=", "return", "[", "]")):
            return None
        return name


def cpp_functions(text):
    """[(name, first line, lines)] of the outermost functions in C++ source `text`."""
    text = blank_cpp(text)
    stack, last, found = [], 0, []   # stack: (name or None, first line, inside a function)
    for i, ch in enumerate(text):
        if ch == ";":
            last = i + 1
        elif ch == "{":
            head = " ".join(text[last:i].split())
            name = function_name(head)
            inside = any(s[0] is not None or s[2] for s in stack)
            start = last + len(text[last:i]) - len(text[last:i].lstrip())
            stack.append((name, text.count("\n", 0, start) + 1, inside))
            last = i + 1
        elif ch == "}":
            if stack:
                name, line, inside = stack.pop()
                if name is not None and not inside:
                    found.append((name, line, text.count("\n", 0, i) + 2 - line))
            last = i + 1
    return found


def python_functions(text):
    out = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            first = min([node.lineno] + [d.lineno for d in node.decorator_list])
            out.append((node.name, first, node.end_lineno - first + 1))
    return out


def is_test(path):
    base = os.path.basename(path)
    return path.startswith("dev/test/") or base.startswith("test_")


def functions(path):
    with open(path, encoding="utf-8", errors="replace") as f:
        text = f.read()
    return python_functions(text) if path.endswith(".py") else cpp_functions(text)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--max", type=int, default=120, help="the longest a function may be")
    p.add_argument("--all", action="store_true", help="list the tests' functions too")
    p.add_argument("files", nargs="*")
    args = p.parse_args(argv)
    files = args.files or subprocess.check_output(["git", "ls-files", "*.py"] + ["*" + e for e in CPP_EXTENSIONS],
                                                  text=True).split()
    over = []
    for path in files:
        if path.endswith(".py") or path.endswith(CPP_EXTENSIONS):
            over += [(n, path, line, name) for name, line, n in functions(path) if n > args.max]
    shown = [o for o in over if args.all or not is_test(o[1])]
    for n, path, line, name in sorted(shown, reverse=True):
        print(f"{path}:{line} {name} {n}{' (test)' if is_test(path) else ''}")
    return 1 if any(not is_test(o[1]) for o in over) else 0


if __name__ == "__main__":
    sys.exit(main())
