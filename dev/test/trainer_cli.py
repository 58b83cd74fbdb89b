"""What the end-to-end trainer tests share: running a trainer binary (optionally under
scripts/mpirun.sh) and writing the toy corpus they train on.

The toy corpus is learnable in a few steps: each document is BOS followed by one of four
fixed short token patterns repeated six times, so the loss falls fast and row target
counts vary (documents end at different positions of a row)."""
import contextlib
import importlib
import io
import os
import signal
import subprocess

import numpy as np

from attnref.shards import write_shard
from attnref import ckpt_diff

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def hangup_ends():
    """A preexec_fn: SIGHUP's default action in the child, whatever the tests run under (a make
    test started with nohup passes an ignored SIGHUP on, and a trainer started so keeps ignoring
    it, as it should)."""
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


def default_build_env():
    """os.environ without make's own variables (MAKEFLAGS carries a parent make's VAR=value) and
    HOST_MARCH: a make started with it sees the default build (build/host-<precision>)."""
    return {k: v for k, v in os.environ.items() if not k.startswith("MAKE") and k != "HOST_MARCH"}


def state_differences(a, b):
    """How two checkpoints' states differ (attnref/ckpt_diff.py: tensors bit for bit, keys but
    run.*, which hold where each run wrote its outputs); [] for the same state."""
    return ckpt_diff.differences(a, b)

def reference(script, args):
    """`python SCRIPT ARGS` for the PyTorch references (train_san.py, train_gpt2.py), run in this
    process: their main(argv) with stdout and stderr captured, as a CompletedProcess. A process
    of its own would import torch again, ~3 s of CPU a run; pytest has it imported already."""
    module = importlib.import_module(os.path.splitext(os.path.basename(script))[0])
    argv = [str(a) for a in args]
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = module.main(argv)
        except SystemExit as e:  # argparse's errors and -h
            rc = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    return subprocess.CompletedProcess([script] + argv, rc or 0, out.getvalue(), err.getvalue())


VOCAB = 250  # the toy corpus's tokens are 3 .. VOCAB-1 (the tiny presets' vocabulary is larger)
BOS = 2
MPIRUN = os.path.join(ROOT, "scripts", "mpirun.sh")


def run_binary(binary, args, check=True, ranks=1, timeout=300, cwd=ROOT, **kw):
    """Runs `binary` (a path relative to the repository root, or absolute) with `args` from
    `cwd` (the root); with ranks > 1 under scripts/mpirun.sh. With `check`, a non-zero exit
    fails the calling test with the command's output. A trainer run writes no run directory
    (--run-dir ''), unless the arguments name one: the tests say where their outputs go."""
    args = [str(a) for a in args]
    if not any(a == "--run-dir" or a.startswith("--run-dir=") for a in args):
        args.append("--run-dir=")
    cmd = ([MPIRUN, "-np", str(ranks)] if ranks > 1 else []) + [os.path.join(ROOT, binary)] + args
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, **kw)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


def write_pattern_corpus(directory, docs_per_shard, seed=0):
    """Writes one token shard per entry of `docs_per_shard` ({shard name: documents}) into
    `directory` (NAME.bin) and returns the directory. One generator draws the patterns and
    then every shard's documents in order, so a given mapping always writes the same files."""
    rng = np.random.default_rng(seed)
    patterns = [rng.integers(3, VOCAB, size=n) for n in (3, 4, 5, 6)]
    for name, n_docs in docs_per_shard.items():
        tokens = []
        for _ in range(n_docs):
            tokens += [BOS] + list(np.tile(patterns[rng.integers(len(patterns))], 6))
        write_shard(os.path.join(str(directory), f"{name}.bin"), np.array(tokens, dtype=np.int64))
    return directory


def step_losses(stdout):
    """The training losses of the progress lines ("step k/n | loss X | ...")."""
    return [float(line.split("|")[1].split()[1]) for line in stdout.splitlines()
            if line.startswith("step ") and "|" in line]
