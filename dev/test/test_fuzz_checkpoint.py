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
Cost: ~210 resumes of a 1 x 16-token tiny model, ~10 s of CPU; the flipped-byte test ~40
refused resumes, under 1 s."""
import os
import random
import subprocess

import numpy as np
import pytest

from trainer_cli import run_binary, write_pattern_corpus
from attnref.container import read_container, write_container

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
            # (from the test's directory: a mutated output path, e.g. run.log '2', lands there)
            proc = run_binary(BIN, ["--resume", mutant, "--checkpoint-dir", d / f"out_{i:03d}"], check=False,
                              timeout=20, cwd=d)
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


def container_layout(raw):
    """(meta_bytes, data_offset, [(name, start, nbytes)]) of a version-2 container's bytes."""
    import struct
    meta_bytes, n, data_offset = struct.unpack_from("<QQQ", raw, 16)
    spans = []
    for i in range(n):
        name, offset, nbytes = struct.unpack_from("<64s40xQQ", raw, 64 + meta_bytes + 128 * i)
        spans.append((name.split(b"\0", 1)[0].decode(), data_offset + offset, nbytes))
    return meta_bytes, data_offset, spans


def test_a_flipped_byte_anywhere_is_refused_naming_the_tensor(base):
    """The checkpoint of the issue: a byte flipped in a tensor's data (each tensor once, at a
    seeded position), in the header's CRC, in the config text and in the tensor table: the
    trainer's --resume refuses each, naming the file and the tensor (or the header) with both
    CRCs, and attnref's read_container (export_hf, import_hf, spectra, ckpt_diff read through it)
    refuses the same files the same way. A version-1 copy (no checksums) still resumes, with
    its note."""
    from attnref.container import ContainerError
    d, path = base
    raw = path.read_bytes()
    assert raw[8] == 2, "the trainer writes version 2"
    meta_bytes, data_offset, spans = container_layout(raw)
    rng = random.Random(27)
    cases = [(48, "checksum mismatch in the header, config text or tensor table"),
             (64 + rng.randrange(meta_bytes), "checksum mismatch in the header, config text or tensor table"),
             (64 + meta_bytes + rng.randrange(data_offset - 64 - meta_bytes),
              "checksum mismatch in the header, config text or tensor table")]
    cases += [(start + rng.randrange(nbytes), f"tensor '{name}': checksum mismatch") for name, start, nbytes in spans
              if nbytes > 0]
    assert len(cases) > 20, len(cases)
    failures = []
    for i, (at, needle) in enumerate(cases):
        bad = bytearray(raw)
        bad[at] ^= 1 << (i % 8)
        mutant = d / f"flipped_{i:03d}.bin"
        mutant.write_bytes(bytes(bad))
        proc = run_binary(BIN, ["--resume", mutant, "--checkpoint-dir", d / f"flip_out_{i:03d}"], check=False,
                          timeout=20)
        if not (proc.returncode == 1 and needle in proc.stderr and str(mutant) in proc.stderr
                and "stored CRC32" in proc.stderr):
            failures.append(f"byte {at} (train_san, expected {needle!r}): exit {proc.returncode}: "
                            f"{(proc.stdout + proc.stderr).strip()[-300:]}")
        try:
            read_container(mutant, CHECKPOINT_KIND)
            failures.append(f"byte {at}: read_container accepted it")
        except ContainerError as e:
            if needle.replace("'", "") not in str(e).replace("'", "") or str(mutant) not in str(e):
                failures.append(f"byte {at}: read_container said {e}, expected {needle!r}")
    assert not failures, f"{len(failures)} of {len(cases)} flipped files:\n" + "\n".join(failures[:20])

    # version 1: the same bytes without the checksums (as written before them) still resume
    old = bytearray(raw)
    old[8] = 1
    old[48:52] = bytes(4)
    for i in range(len(spans)):
        at = 64 + meta_bytes + 128 * i + 120
        old[at:at + 4] = bytes(4)
    v1 = d / "version1.bin"
    v1.write_bytes(bytes(old))
    proc = run_binary(BIN, ["--resume", v1, "--checkpoint-dir", d / "v1_out"], check=False, timeout=20)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"note: '{v1}' is an attn.c tensor file of version 1, without checksums" in proc.stderr, proc.stderr
    assert (d / "v1_out" / "final.bin").read_bytes()[8] == 2  # saved again: version 2
    _, meta, _ = read_container(v1, CHECKPOINT_KIND)
    assert meta["model"] == "san"
