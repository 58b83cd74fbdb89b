"""A bounded fuzz of the trainer's checkpoint reading above the container (the host
train_san of TRAIN_SAN_BIN, which `make test` sets): dev/test/test_fuzz_readers.cpp mutates
the bytes of tensor files and so checks the container; this test keeps the container valid
and mutates what is inside it, the way a hand-edited, foreign or half-migrated checkpoint
would be wrong: each config key (model, optimizer, run settings, data position) set to
values drawn from a bank of hostile ones (0, negatives, values past int32, NaN, infinities,
other choices' names, empty text), and tensors dropped, reshaped or retyped.

Every mutant is resumed (`--resume MUTANT`, one step to go) and must either train that
step (exit 0) or be refused: exit 1 with "error: " and the mutant's path in the message,
so that a user learns which file is wrong. A signal (crash), another exit status, a hang
(20 s) or a refusal that names no file fails the test. Mutations are drawn from a seeded
generator, so every run resumes the same files.
Cost: ~210 resumes of a 1 x 16-token tiny model, ~10 s of CPU."""
import os
import random
import subprocess

import numpy as np
import pytest

from trainer_cli import ROOT, run_binary, write_pattern_corpus

import sys
sys.path.insert(0, ROOT)
from attnref.container import read_container, write_container  # noqa: E402

BIN = os.environ.get("TRAIN_SAN_BIN")
pytestmark = pytest.mark.skipif(not BIN, reason="TRAIN_SAN_BIN not set (make test sets it)")

CHECKPOINT_KIND = 1
VALUES_PER_KEY = 2
HOSTILE = ["0", "-1", "1", "2", "3", "7", "64", "-2147483649", "2147483648", "4294967298", "99999999999999",
           "1e300", "-1e-300", "nan", "inf", "-inf", "", "abc", "0x10", "1.5", " 4", "standard", "rms", "swiglu",
           "muon", "adamw", "3,7", "mlp,mlp", "/nonexistent/*.bin"]


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """A 2-step run's checkpoint after step 1: a resume of it trains one step."""
    d = tmp_path_factory.mktemp("fuzz")
    write_pattern_corpus(d, {"toy_train_000000": 60})
    run_binary(BIN, ["--preset", "tiny", "--train-data", d / "toy_train_*.bin", "--val-data", "", "--seq-len", 16,
                     "--batch-size", 1, "--steps", 2, "--save-every", 1, "--sample-tokens", 0,
                     "--checkpoint-dir", d / "run"])
    return d, d / "run" / "step_1.bin"


def dtype_name(a):
    return "int32" if np.issubdtype(a.dtype, np.integer) else "fp32"


def mutants(path):
    """(description, meta list, tensor list) of every mutant, in a fixed order."""
    _, meta, tensors = read_container(path, CHECKPOINT_KIND)
    rng = random.Random(20261201)
    items = [(n, a, dtype_name(a)) for n, a in tensors.items()]
    out = []
    for key in sorted(meta):
        for value in rng.sample(HOSTILE, VALUES_PER_KEY):
            out.append((f"{key}={value!r}", [(k, value if k == key else v) for k, v in meta.items()], items))
        out.append((f"without {key}", [(k, v) for k, v in meta.items() if k != key], items))
    names = list(tensors)
    for name in rng.sample(names, min(8, len(names))):
        a = tensors[name]
        others = [t for t in items if t[0] != name]
        out.append((f"without tensor {name}", list(meta.items()), others))
        out.append((f"tensor {name} flattened to {a.size - 1} elements", list(meta.items()),
                    others + [(name, a.reshape(-1)[:-1].copy(), dtype_name(a))]))
        retyped = "fp32" if dtype_name(a) == "int32" else "int32"
        out.append((f"tensor {name} as {retyped}", list(meta.items()),
                    others + [(name, a.astype(np.float32 if retyped == "fp32" else np.int32), retyped)]))
    return out


def test_every_mutant_resumes_or_is_refused_naming_the_file(base):
    d, path = base
    cases = mutants(path)
    assert len(cases) > 150, len(cases)
    failures, outcomes = [], {"resumed": 0, "refused": 0}
    for i, (what, meta, tensors) in enumerate(cases):
        mutant = d / f"mutant_{i:03d}.bin"
        write_container(mutant, CHECKPOINT_KIND, meta, tensors)
        try:
            proc = run_binary(BIN, ["--resume", mutant, "--checkpoint-dir", d / f"out_{i:03d}"], check=False,
                              timeout=20)
        except subprocess.TimeoutExpired as e:
            failures.append(f"{what}: no result in 20 s: {str(e.stdout or '')[-300:]}")
            continue
        text = proc.stdout + proc.stderr
        if proc.returncode == 0 and "Sanitizer" not in text:
            outcomes["resumed"] += 1
        elif proc.returncode == 1 and "error: " in proc.stderr and str(mutant) in proc.stderr:
            outcomes["refused"] += 1
        else:
            failures.append(f"{what} (exit {proc.returncode}): {text.strip()[-400:]}")
    print(f"{len(cases)} mutants: {outcomes}")
    assert not failures, f"{len(failures)} of {len(cases)} mutants:\n" + "\n".join(failures[:20])
    # the bank reaches both outcomes: values that the checks accept, and many they refuse
    assert outcomes["resumed"] > 0 and outcomes["refused"] > 100, outcomes
