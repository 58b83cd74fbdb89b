"""`make help` lists the targets a person runs, one line each, kept in step with the Makefile:
each target it names is one of the Makefile's (make's own database, `make -pq`), and each .PHONY
target is either named there or on the Makefile's `#-` line of the targets it uses for itself.
Reads the checkout's Makefile; builds nothing (~1 s)."""
import os
import re
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="no make")


def make(*args):
    proc = subprocess.run(["make", "--no-print-directory", *args], cwd=ROOT, capture_output=True, text=True, timeout=120)
    return proc


def test_make_help_names_the_makefiles_targets_and_every_phony_one():
    proc = make("-s", "help")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("make TARGET") and len(lines) > 10, proc.stdout
    named = []
    for line in lines[1:]:
        head = re.split(r"\s{2,}", line.strip())[0]
        assert head != line.strip(), f"no description: {line!r}"
        named += [n.replace("print-VAR", "print-%") for n in head.replace("(default)", "").split()]
    database = make("-pq", "help").stdout  # (question mode: prints make's rules, runs nothing)
    targets = set(re.findall(r"^([^\s:#=]+):(?!=)", database, re.M))
    assert [n for n in named if n not in targets] == [], "make help names what is no target"
    phony = set(re.search(r"^\.PHONY: (.*)$", database, re.M).group(1).split())
    internal = set()
    for line in open(os.path.join(ROOT, "Makefile")):
        if line.startswith("#- "):
            internal |= set(line[3:].split())
    assert not internal & set(named), "a target both named and internal"
    assert sorted(phony - set(named) - internal) == [], "a .PHONY target that make help neither names nor marks internal"
    assert sorted(internal - targets) == [], "the #- line names what is no target"
