"""A bounded, deterministic fuzz of the Python file readers, the counterpart of
dev/test/test_fuzz_readers.cpp: token shards and their region and exercise sidecars
(attnref/shards.py), tokenizer files (attnref/tokenizer.py read_tokenizer_bin), eval sets
(attnref/evalset.py read_evalset) and tensor containers (attnref/container.py
read_container), each checksummed kind also as the version (or CRC-less shard) from before
the checksums.

A seed of each kind is written by its writer and must read back; then CASES mutants of it
(1-3 of: flipped bits, a set byte, an aligned int32 set to an interesting value (mostly in the
header: 0, -1, extremes, the file size), truncation, appended garbage, a deleted or duplicated
chunk; drawn from a seeded generator, so every run reads the same files) are read. A mutant
passes when the reader returns or raises ValueError (ContainerError is one) naming the file;
anything else fails: another exception (an IndexError, a struct.error), a hang (5 s per
file) or a MemoryError. The fuzz runs in a child allowed 1 GiB of address space beyond what
its imports took, so a count taken on trust fails instead of swapping. Each checksummed seed must refuse every mutant that
changed the file, but for a shard or sidecar whose CRC slot and flag both became 0 (a file
from before the checksums, read unchecked by design) or whose only change is the flag set to
0 (its CRC is still checked). The result line gives kinds x mutants, failures and silent
acceptances (both must be 0). Cost: ~2,400 reads, ~3 s of CPU.
"""
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CASES = int(os.environ.get("FUZZ_CASES", "200"))

CHILD = r'''
import json, os, random, resource, signal, struct, sys
import numpy as np
root, cases, d = sys.argv[1], int(sys.argv[2]), sys.argv[3]   # d: the test's tmp_path
sys.path[:0] = [root]
from attnref import evalset, shards, tokenizer
from attnref import container

# after the imports (torch maps a lot): 1 GiB more address space than they took
in_use = int(open("/proc/self/statm").read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
resource.setrlimit(resource.RLIMIT_AS, (in_use + (1 << 30), in_use + (1 << 30)))

rng0 = np.random.default_rng(3)


class Pieces:  # a tokenizer for export_tokenizer_bin: ids 0..3 special, then bytes and merges
    kind, vocab_size, bos_id, eos_id, pad_id, unk_id = tokenizer.KIND_SENTENCEPIECE, 40, 2, 1, 0, 3

    def piece_bytes(self, i):
        if i < 4:
            return (tokenizer.T_CONTROL if i != 3 else tokenizer.T_UNKNOWN), [b"<pad>", b"</s>", b"<s>", b"<unk>"][i]
        return tokenizer.T_NORMAL, bytes([97 + i % 26]) * (1 + i % 3)


def seeds():
    """(name, path, bytes, reader, checksummed, shard CRC slot or None)"""
    out = []
    toks = rng0.integers(0, 300, size=400)
    for crc in (False, True):
        sfx = "_crc" if crc else ""
        for name, write, read, slot in [
                ("shard", lambda p: shards.write_shard(p, toks), shards.read_shard, shards.SHARD_CRC_SLOT),
                ("regions", lambda p: shards.write_regions(p, toks % 4), shards.read_regions, shards.REGIONS_CRC_SLOT),
                ("exercises", lambda p: shards.write_exercises(p, toks % 3, ["none", "rag", "math"]),
                 shards.read_exercises, shards.EXERCISES_CRC_SLOT)]:
            p = os.path.join(d, name + sfx + ".bin")
            write(p)
            b = bytearray(open(p, "rb").read())
            if not crc:  # as written before the checksums: CRC slot and flag 0
                b[4 * slot:4 * slot + 8] = bytes(8)
            out.append((name + sfx, p, bytes(b), read, crc, slot))
    for v2 in (False, True):
        p = os.path.join(d, "tok.bin")
        tokenizer.export_tokenizer_bin(Pieces(), p)
        b = open(p, "rb").read()
        if not v2:
            b = b[:4] + struct.pack("<i", 1) + b[8:36] + bytes(4) + b[40:]
        out.append(("tokenizer" + ("" if v2 else "_v1"), p, b, tokenizer.read_tokenizer_bin, v2, None))
        items = [{"context": [2] + rng0.integers(4, 60, size=1 + i % 5).tolist(),
                  "choices": [rng0.integers(4, 60, size=1 + (i + c) % 4).tolist() for c in range(1 + i % 3)],
                  "gold": 0} for i in range(10)]
        for it in items:
            it["choice_chars"] = [3 * len(c) for c in it["choices"]]
        p = os.path.join(d, "eval.bin")
        evalset.write_evalset(p, items, evalset.KIND_MC, 64, "fuzz")
        b = open(p, "rb").read()
        if not v2:
            b = b[:4] + struct.pack("<i", 1) + b[8:36] + bytes(4) + b[40:]
        out.append(("evalset" + ("" if v2 else "_v1"), p, b, evalset.read_evalset, v2, None))
    p = os.path.join(d, "ckpt.bin")
    container.write_container(p, 1, [("n_layer", "1"), ("lr", "0.001")],
                              [("wte", np.arange(48, dtype=np.float32).reshape(12, 4), "fp32"),
                               ("gate", np.ones(3, np.float32), "bf16"), ("ids", np.arange(5, dtype=np.int32), "int32")])
    out.append(("container", p, open(p, "rb").read(), container.read_container, True, None))
    return out


def mutate(b, rng):
    b = bytearray(b)
    ints = [0, 1, -1, 2, 255, 65536, 2**31 - 1, -2**31, 1023, 1024, len(b), len(b) // 4, 2 * len(b)]
    for _ in range(rng.randint(1, 3)):
        if not b:
            b.append(0)
        n, op = len(b), rng.randrange(8)
        if op == 0:
            for _ in range(rng.randint(1, 4)):
                b[rng.randrange(n)] ^= 1 << rng.randrange(8)
        elif op == 1:
            b[rng.randrange(n)] = rng.randrange(256)
        elif op in (2, 3) and n >= 4:
            w = rng.randrange(min(n // 4, 16)) if rng.randrange(4) else rng.randrange(n // 4)
            b[4 * w:4 * w + 4] = struct.pack("<I", (rng.choice(ints) + (rng.randint(-2, 2) if rng.randrange(4) == 0 else 0)) & 0xFFFFFFFF)
        elif op == 4:
            del b[rng.randrange(n + 1):]
        elif op == 5:
            b += bytes(rng.randrange(256) for _ in range(rng.randint(1, 64)))
        elif op == 6:
            at = rng.randrange(n)
            del b[at:at + rng.randint(1, 64)]
        else:
            at = rng.randrange(n)
            chunk = b[at:at + rng.randint(1, 64)]
            b[rng.randrange(n + 1):0] = chunk
    return bytes(b)


def alarm(*_):
    raise TimeoutError


signal.signal(signal.SIGALRM, alarm)
sys.stderr = open(os.devnull, "w")  # the readers' notes
report = {"kinds": 0, "mutants": 0, "read": 0, "refused": 0, "failures": [], "silent": []}
for ki, (name, path, seed, read, checksummed, slot) in enumerate(seeds()):
    report["kinds"] += 1
    with open(path, "wb") as f:
        f.write(seed)
    read(path)  # the seed reads
    for case in range(cases):
        rng = random.Random(ki * 100003 + case)
        b = mutate(seed, rng)
        with open(path, "wb") as f:
            f.write(b)
        report["mutants"] += 1
        signal.alarm(5)
        try:
            read(path)
            outcome = "read"
        except ValueError as e:
            outcome = "refused" if path in str(e) else f"refusal without the file: {e}"
        except TimeoutError:
            outcome = "hang (5 s)"
        except BaseException as e:  # noqa: B902 (MemoryError, IndexError, struct.error ...)
            outcome = f"{type(e).__name__}: {e}"
        finally:
            signal.alarm(0)
        if outcome in ("read", "refused"):
            report[outcome] += 1
        else:
            report["failures"].append(f"{name} case {case}: {outcome[:300]}")
        legacy = False
        if slot is not None and len(b) >= 1024:
            crc, flag = struct.unpack_from("<iI", b, 4 * slot)
            restored = b[:4 * slot + 4] + seed[4 * slot + 4:4 * slot + 8] + b[4 * slot + 8:]
            legacy = flag == 0 and (crc == 0 or restored == seed)
        if checksummed and outcome == "read" and b != seed and not legacy:
            report["silent"].append(f"{name} case {case}")
print(json.dumps(report))
'''


def test_python_readers_refuse_or_read_every_mutant(tmp_path):
    proc = subprocess.run([sys.executable, "-c", CHILD, ROOT, str(CASES), str(tmp_path)], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    report = json.loads(proc.stdout.splitlines()[-1])
    print(f"python readers: {report['kinds']} kinds x {CASES} mutants: {report['read']} read, {report['refused']} "
          f"refused, {len(report['failures'])} failures, {len(report['silent'])} changed checksummed files read")
    assert report["kinds"] == 11 and report["mutants"] == 11 * CASES
    assert not report["failures"], "\n".join(report["failures"][:20])
    assert not report["silent"], "\n".join(report["silent"][:20])
    assert report["read"] >= CASES // 20  # the mutants get past the magic numbers: some read
