"""The README's commands run as pasted, and so do those of the docs its tour moved to
(TESTED_DOCS: doc/trainer.md, doc/testing.md, doc/export.md). Every ```bash block of these files is preceded
by a marker comment saying how it is checked:

    <!-- readme-test: cpu -->                         run here, as written
    <!-- readme-test: cpu (300 -> 6, 100 -> 2) -->    run here with those numbers scaled down
    <!-- readme-test: gpu ... --> / <!-- readme-test: skip (why) -->   not run here

A block without a marker fails this test, so a new command cannot slip in unchecked. The cpu
blocks run one after another (TESTED_DOCS in order, each top to bottom) with bash -e in one
scratch directory that stands in for the repository root (so a later block can use an earlier block's checkpoints): links to every
top-level entry of the repository, ./train_san and ./train_gpt2 (the builds under test, as
`make` copies them there) and data/offline (a small offline build: SentencePiece vocab 1000,
a few hundred documents).
The only substitution is the marker's numbers (step counts, so the commands take seconds):
each "A -> B" replaces the number A, wherever it stands alone as a number, by B.
The blocks run in the environment of a shell, not of make: without PYTHONPATH (make exports it,
and so does dev/conftest.py, as the checkout) and the other variables make and its test recipe
set, so a block that imports attnref or study works only where the venv has them installed
(scripts/setup.sh), as for a user who pastes it.
About 27 s on 2 cores.
"""
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SAN = os.environ.get("TRAIN_SAN_BIN")
GPT2 = os.environ.get("TRAIN_GPT2_BIN") or (SAN and os.path.join(os.path.dirname(SAN), "train_gpt2"))
MARKER = re.compile(r"<!-- readme-test: (cpu|gpu|skip)(?: \((.*?)\))? -->")
TESTED_DOCS = ("README.md", "doc/trainer.md", "doc/testing.md", "doc/export.md")


def shell_environment():
    """os.environ without what make adds (its own variables, the Makefile's exports) and what the
    test recipe and dev/conftest.py set."""
    makefile = open(os.path.join(ROOT, "Makefile")).read()
    added = {"MAKEFLAGS", "MAKELEVEL", "MFLAGS", "MAKE_TERMOUT", "MAKE_TERMERR", "PYTHONPATH"}
    added |= set(re.findall(r"^export\s+(\w+)", makefile, re.M))
    return {k: v for k, v in os.environ.items() if k not in added and not re.fullmatch(r"HAS_MPIRUN|TRAIN_\w+_BIN", k)}


def readme_blocks():
    """[(kind, substitutions, code, where)] of the bash blocks of TESTED_DOCS, in order."""
    blocks = []
    for name in TESTED_DOCS:
        blocks += doc_blocks(name)
    return blocks


def doc_blocks(name):
    text = open(os.path.join(ROOT, name)).read()
    blocks, pos = [], 0
    for m in re.finditer(r"```bash\n(.*?)```", text, re.S):
        before = text[pos:m.start()].rstrip().splitlines()
        marker = MARKER.fullmatch(before[-1].strip()) if before else None
        lineno = text[:m.start()].count("\n") + 1
        line = f"{name} line {lineno}"
        if marker is None:
            raise AssertionError(f"{line}: bash block without a <!-- readme-test: ... --> marker")
        subs = []
        if marker.group(1) == "cpu" and marker.group(2):
            for pair in marker.group(2).split(","):
                a, b = (x.strip() for x in pair.split("->"))
                subs.append((a, b))
        blocks.append((marker.group(1), subs, m.group(1), line))
        pos = m.end()
    return blocks


def test_every_block_is_marked():
    kinds = [b[0] for b in readme_blocks()]
    assert "cpu" in kinds


@pytest.mark.skipif(not SAN, reason="TRAIN_SAN_BIN not set (make test sets it)")
def test_cpu_blocks_run_as_pasted(tmp_path):
    if not os.path.exists(os.path.join(ROOT, GPT2)):
        pytest.skip(f"{GPT2} not built")
    work = tmp_path / "work"
    (work / "data").mkdir(parents=True)
    subprocess.run([sys.executable, os.path.join(ROOT, "dev/data/build_offline.py"), "--out",
                    str(work / "data" / "offline"), "--vocab-size", "1000", "--synth-train-docs", "400",
                    "--synth-val-docs", "100", "--shard-tokens", "200000", "--eval-items", "10"],
                   check=True, capture_output=True)
    for entry in os.listdir(ROOT):
        if entry not in ("data", "logs", "runs", "train_san", "train_gpt2") and not entry.startswith("ckpt"):
            os.symlink(os.path.join(ROOT, entry), work / entry)
    for name, path in (("train_san", SAN), ("train_gpt2", GPT2)):
        os.symlink(os.path.join(ROOT, path), work / name)
    for kind, subs, code, line in readme_blocks():
        if kind != "cpu":
            continue
        for a, b in subs:
            code = re.sub(rf"(?<![0-9.]){re.escape(a)}(?![0-9])", b, code)
        proc = subprocess.run(["bash", "-e", "-c", code], cwd=work, env=shell_environment(), capture_output=True,
                              text=True, timeout=600)
        assert proc.returncode == 0, f"the block at {line} failed:\n{code}\n{proc.stdout[-3000:]}\n{proc.stderr}"
