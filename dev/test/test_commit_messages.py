"""Every commit since the rule began follows scripts/commit-msg: a subject of at most 72
characters and a body (merges: the subject alone). Skipped outside a git checkout or in a
shallow one that lacks the first commit of the rule."""
import os
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HOOK = os.path.join(ROOT, "scripts", "commit-msg")
RULE_BEGAN = "9a3d9ef"  # the last commit before the rule; every later one is checked


def git(*args):
    return subprocess.run(["git", "-C", ROOT, *args], capture_output=True, text=True)


def check(message, merge, tmp_path):
    f = tmp_path / "msg"
    f.write_text(message)
    return subprocess.run([HOOK, str(f)] + (["--merge"] if merge else []), capture_output=True, text=True)


@pytest.mark.parametrize("message, merge, ok", [
    ("Short subject\n\nWhat and why.\n", False, True),
    ("Short subject\n\nWhat and why.\n\n# Please enter the commit message\n", False, True),
    ("Short subject\n", False, False),                  # no body
    ("Short subject\nno blank line\n", False, False),   # body not separated
    ("x" * 73 + "\n\nbody\n", False, False),            # 73 characters
    ("x" * 72 + "\n\nbody\n", False, True),
    ("Merge branch 'b'\n", True, True),
    ("Merge branch 'b': " + "y" * 60 + "\n", True, False),
])
def test_the_rule(message, merge, ok, tmp_path):
    r = check(message, merge, tmp_path)
    assert (r.returncode == 0) == ok, r.stderr


def test_every_commit_since_the_rule_began_follows_it(tmp_path):
    if git("rev-parse", "--git-dir").returncode != 0:
        pytest.skip("not a git checkout")
    if git("cat-file", "-e", RULE_BEGAN + "^{commit}").returncode != 0:
        pytest.skip(f"commit {RULE_BEGAN} is not in this (shallow?) clone")
    bad = []
    for sha in git("rev-list", f"{RULE_BEGAN}..HEAD").stdout.split():
        message = git("log", "-1", "--format=%B", sha).stdout
        merge = len(git("log", "-1", "--format=%P", sha).stdout.split()) > 1
        r = check(message, merge, tmp_path)
        if r.returncode != 0:
            bad.append(f"{sha[:9]}: {r.stderr.strip().splitlines()[0]}")
    assert not bad, "commits that break scripts/commit-msg:\n" + "\n".join(bad)
