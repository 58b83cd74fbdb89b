"""The docs name only what exists: every repository path, make target and flag that README.md
and doc/*.md mention (the dated records under doc/*-runs/ aside: they say what was run then).

- Paths: the repository files and folders named (llmc/..., dev/..., scripts/..., doc/..., study/...,
  studies/..., attnref/..., the top-level sources); a glob must match something; placeholders
  (`<op>`, `NAME`, `YYYY`) are not paths.
- Tests: a test named as `dev/test/FILE.py::NAME` (doc/trainer.md's table of stops names the
  test of each row) is a test function of that file.
- make targets: every `make TARGET` inside code (backticks or a fenced block) is a target the
  Makefile knows (`make -pq`'s database), or a file a pattern rule builds.
- Flags: a command line in the docs that runs train_san or train_gpt2 (./train_san, the build/
  binaries) uses only flags their `-h` lists; every other --flag is one that some tool of the
  repository takes (an option string in its Python or shell sources, or the binaries' -h) or
  one of the outside tools' listed below.
- The package map: attnref/__init__.py names each of the package's modules.
Needs TRAIN_SAN_BIN and TRAIN_GPT2_BIN (make test sets them); skipped without them.
"""
import glob
import os
import re
import subprocess

import pytest

from trainer_cli import default_build_env

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BINS = {"train_san": os.environ.get("TRAIN_SAN_BIN", ""), "train_gpt2": os.environ.get("TRAIN_GPT2_BIN", "")}
needs_bins = pytest.mark.skipif(not all(b and os.path.exists(os.path.join(ROOT, b)) for b in BINS.values()),
                                reason="TRAIN_SAN_BIN / TRAIN_GPT2_BIN not set (make test sets them)")

# Flags of tools from outside the repository that the docs show, by tool.
OUTSIDE_FLAGS = {
    "srun / sbatch (Slurm)": {"--nodes", "--ntasks-per-node", "--gpus-per-node", "--mpi", "--account",
                              "--partition", "--qos", "--time", "--cpus-per-task", "--array", "--output", "--requeue",
                              "--signal", "--batch"},
    "lm_eval": {"--model", "--model_args", "--tasks", "--include_path", "--metadata", "--batch_size", "--device",
                "--output_path", "--limit"},
    "mpirun": {"--oversubscribe", "--allow-run-as-root", "--bind-to", "--map-by"},
    "pip / pytest / nvcc / git": {"--index-url", "--extra-index-url", "--upgrade", "--no-deps", "--collect-only",
                                  "--durations", "--gpu-architecture", "--depth"},
}
# headers of the toolkits the docs name
OUTSIDE_FILES = {"nccl.h", "mpi.h", "cudnn.h", "cublas_v2.h", "cublasLt.h", "cuda_runtime.h", "cuda_bf16.h",
                 "cudnn_frontend.h", "cblas.h"}
PATH_ROOTS = ("llmc/", "dev/", "scripts/", "doc/", "studies/", "attnref/", "study/", "presets/", ".ci/")
TOP_LEVEL = {f for f in os.listdir(ROOT) if os.path.isfile(os.path.join(ROOT, f)) and not f.startswith(".")}
PLACEHOLDER = re.compile(r"<|>|\bNAME\b|\bYYYY|\bTOPIC\b|\bN\b|\.\.\.|\{|\}|\bX\b")


def doc_files():
    files = [os.path.join(ROOT, "README.md")] + sorted(glob.glob(os.path.join(ROOT, "doc", "*.md")))
    return [f for f in files if os.path.isfile(f)]


def rel(path):
    return os.path.relpath(path, ROOT)


def code_of(text):
    """The code of a markdown text: fenced blocks (continuation lines joined) and inline spans."""
    blocks = re.findall(r"^```[^\n]*\n(.*?)^```", text, re.M | re.S)
    rest = re.sub(r"^```[^\n]*\n.*?^```", "", text, flags=re.M | re.S)
    spans = re.findall(r"`([^`\n]+)`", rest)
    lines = []
    for block in blocks:
        lines += re.sub(r"\\\n\s*", " ", block).splitlines()
    return lines + spans


def test_named_paths_exist():
    pattern = re.compile(r"(?<![\w./-])((?:%s)[\w./*<>{}-]*[\w*/])" % "|".join(re.escape(r) for r in PATH_ROOTS))
    # a bare file name (attention.cuh, train_san.cu): some file of the repository has it
    bare = re.compile(r"(?<![\w./-])([\w-]+\.(?:cu|cuh|h|cpp|py|toml|sh))(?![\w/])")
    names = {os.path.basename(f) for f in subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True,
                                                         text=True).stdout.split()} | TOP_LEVEL
    missing = []
    for doc in doc_files():
        for lineno, line in enumerate(open(doc, encoding="utf-8").read().splitlines(), 1):
            for path in pattern.findall(line):
                path = path.rstrip(".")
                if PLACEHOLDER.search(path):
                    continue
                full = os.path.join(ROOT, path)   # (a playground named by its binary: dev/cuda/muon)
                if not (glob.glob(full) if "*" in path else any(os.path.exists(full + e) for e in ("", ".cu"))):
                    missing.append(f"{rel(doc)}:{lineno}: {path}")
            missing += [f"{rel(doc)}:{lineno}: {name}" for name in bare.findall(line)
                        if name not in names and name not in OUTSIDE_FILES]
    assert not missing, "paths named in the docs that do not exist:\n  " + "\n  ".join(missing)


def test_named_tests_exist():
    named, missing = 0, []
    for doc in doc_files():
        for lineno, line in enumerate(open(doc, encoding="utf-8").read().splitlines(), 1):
            for path, name in re.findall(r"(dev/test/[\w/]+\.py)::(\w+)", line):
                named += 1
                full = os.path.join(ROOT, path)
                if not (os.path.isfile(full) and re.search(rf"^def {name}\(", open(full, encoding="utf-8").read(), re.M)):
                    missing.append(f"{rel(doc)}:{lineno}: {path}::{name}")
    assert named > 0, "no test named as dev/test/FILE.py::NAME in the docs (doc/trainer.md's table of stops has them)"
    assert not missing, "tests named in the docs that do not exist:\n  " + "\n  ".join(missing)


def test_doc_commands_start_the_venvs_python():
    """A command in a fenced block starts Python as .venv/bin/python (and pip, pytest from there):
    pasted outside make, a bare `python` is the system's, without matplotlib, PyTorch or attnref."""
    bare = []
    for doc in doc_files():
        text = open(doc, encoding="utf-8").read()
        for m in re.finditer(r"^```[^\n]*\n(.*?)^```", text, re.M | re.S):
            first = text[:m.start()].count("\n") + 2
            for i, line in enumerate(m.group(1).splitlines()):
                if re.search(r"(?:^|[;&|(]|\bnice(?: -n \d+)?)\s*(?:python3?|pip3?|pytest)\s", line):
                    bare.append(f"{rel(doc)}:{first + i}: {line.strip()[:80]}")
    assert not bare, "commands that start a Python other than the venv's (.venv/bin/python):\n  " + "\n  ".join(bare)


def make_targets(variables=()):
    """The Makefile's targets (explicit ones and the files its rules would build) with these
    VAR=value settings: some targets exist only with theirs (build/host-fp32/NAME with PRECISION=FP32)."""
    proc = subprocess.run(["make", "-pRrq", "-f", "Makefile", *variables, ":"], cwd=ROOT, env=default_build_env(),
                          capture_output=True, text=True, timeout=120)
    targets = set()
    for line in proc.stdout.splitlines():
        m = re.match(r"^([^\s#:=%][^:=]*?):(?!=)", line)
        if m:
            targets.update(m.group(1).split())
    return targets


def test_make_targets_exist():
    targets = {(): make_targets()}
    assert {"test", "demo", "host"} <= targets[()], sorted(targets[()])[:40]
    missing = []
    for doc in doc_files():
        for code in code_of(open(doc, encoding="utf-8").read()):
            assignment = r"""\b[A-Z_]+=(?:"[^"]*"|'[^']*'|[^\s;&|]*)"""   # VAR=value
            variables = tuple(sorted(set(re.findall(assignment, code))))
            if variables not in targets:
                targets[variables] = make_targets(variables)
            code = re.sub(assignment, "", code)
            for m in re.finditer(r"(?:^|[;&|(]\s*|\s)make((?:\s+(?:-[^\s;&|]+|[\w./%-]+))*)", code):
                for word in m.group(1).split():
                    if word.startswith("-") or PLACEHOLDER.search(word):
                        continue
                    if word not in targets[variables]:
                        missing.append(f"{rel(doc)}: make {word}  (in `{code.strip()[:80]}`)")
    assert not missing, "make targets named in the docs that the Makefile lacks:\n  " + "\n  ".join(missing)


def help_flags(binary):
    proc = subprocess.run([os.path.join(ROOT, binary), "-h"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    return set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", proc.stdout + proc.stderr))


def repository_flags():
    """Option strings of the repository's own tools: Python sources, shell scripts, the Makefile
    (not the tests')."""
    flags = set()
    files = glob.glob(os.path.join(ROOT, "**", "*.py"), recursive=True) + \
        glob.glob(os.path.join(ROOT, "**", "*.sh"), recursive=True) + [os.path.join(ROOT, "Makefile")]
    for path in files:
        if "/build/" in path or "/tests/" in path or "/dev/test/" in path:   # tests name wrong flags on purpose
            continue
        flags.update(re.findall(r"(?<![\w-])(--[a-z][a-z0-9_-]*)", open(path, encoding="utf-8").read()))
    return flags


FLAG = re.compile(r"(?<![\w-])(--[a-z][a-z0-9_-]*)")
TRAINER = re.compile(r"(?:^|[\s;&|(])(?:\./|build/[\w-]+/|\S*/)?(train_san|train_gpt2)(?![\w.])")


@needs_bins
def test_trainer_command_lines_use_their_flags():
    known = {name: help_flags(path) for name, path in BINS.items()}
    wrong = []
    for doc in doc_files():
        for code in code_of(open(doc, encoding="utf-8").read()):
            m = TRAINER.search(code)
            if not m or re.search(r"(--[\w-]+|=)\s*\S*$", code[:m.start(1)]):   # a flag's value (--binary ./train_san)
                continue
            command = re.split(r"[;|]|&&", code[m.end():])[0]
            for flag in FLAG.findall(command):
                if flag not in known[m.group(1)]:
                    wrong.append(f"{rel(doc)}: {m.group(1)} {flag}  (in `{code.strip()[:80]}`)")
    assert not wrong, "trainer flags in the docs that -h does not list:\n  " + "\n  ".join(wrong)


@needs_bins
def test_every_flag_named_is_some_tools():
    known = repository_flags().union(*(help_flags(p) for p in BINS.values())).union(*OUTSIDE_FLAGS.values())
    unknown = []
    for doc in doc_files():
        for lineno, line in enumerate(open(doc, encoding="utf-8").read().splitlines(), 1):
            unknown += [f"{rel(doc)}:{lineno}: {flag}" for flag in FLAG.findall(line) if flag not in known]
    assert not unknown, "flags in the docs that no tool takes:\n  " + "\n  ".join(unknown)


def test_attnref_names_its_modules():
    import attnref
    listed = set(re.findall(r"^  (\w+\.py) ", attnref.__doc__, re.M))
    modules = {os.path.basename(p) for p in glob.glob(os.path.join(ROOT, "attnref", "*.py"))} - {"__init__.py"}
    assert listed == modules, f"attnref/__init__.py lists {sorted(listed - modules)} but not {sorted(modules - listed)}"
