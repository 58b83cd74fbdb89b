"""
ckpt_diff.py -- whether two checkpoints or debug states hold the same state: every tensor bit
for bit and every config key but run.* (how a run was set up, which may differ between two
ways to the same state: straight, or interrupted and resumed).

  python -m attnref.ckpt_diff A.bin B.bin [--all-keys]

Exit status: 0 the same, 1 different (each difference, then whether the parameters are the
same), 2 a file cannot be read.
"""
import argparse
import sys

import numpy as np

from attnref.container import ContainerError, read_container


def bits(a):
    """The array's values as integers of the same width, so NaNs and signed zeros compare exactly."""
    a = np.ascontiguousarray(a)
    return a.view({1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize]) if a.dtype.kind == "f" else a


def differences(a, b, all_keys=False):
    """[text] of how the files at paths a and b differ (empty: the same state)."""
    return compare(a, b, all_keys)[0]


def compare(a, b, all_keys=False):
    """(differences as differences() gives them, the verdict on the model's parameters: the
    tensors but the optimizer's opt.*, which a reader of the diff asks about first)."""
    kind_a, meta_a, tensors_a = read_container(a)
    kind_b, meta_b, tensors_b = read_container(b)
    out = []
    if kind_a != kind_b:
        out.append(f"file kind: {kind_a} vs {kind_b}")
    keep = (lambda k: True) if all_keys else (lambda k: not k.startswith("run."))
    for key in sorted(k for k in set(meta_a) | set(meta_b) if keep(k)):
        if meta_a.get(key) != meta_b.get(key):
            out.append(f"key {key}: {meta_a.get(key, '(absent)')} vs {meta_b.get(key, '(absent)')}")
    if list(tensors_a) != list(tensors_b):
        out.append(f"tensors: {list(tensors_a)} vs {list(tensors_b)}")
    is_param = lambda name: not name.startswith("opt.")  # noqa: E731
    params = [n for n in tensors_a if is_param(n)]
    differing = [n for n in dict.fromkeys(list(tensors_a) + list(tensors_b))
                 if is_param(n) and (n not in tensors_a or n not in tensors_b)]
    for name in tensors_a:
        if name not in tensors_b:
            continue
        x, y = np.asarray(tensors_a[name]), np.asarray(tensors_b[name])
        if x.shape != y.shape or x.dtype != y.dtype:
            out.append(f"tensor {name}: shape {x.shape} {x.dtype} vs {y.shape} {y.dtype}")
        elif not np.array_equal(bits(x), bits(y)):
            n = int(np.count_nonzero(bits(x) != bits(y)))
            with np.errstate(invalid="ignore"):
                gap = float(np.nanmax(np.abs(x.astype(np.float64) - y.astype(np.float64)))) if x.dtype.kind == "f" else 0
            out.append(f"tensor {name}: {n} of {x.size} values differ (largest gap {gap:.3g})")
        else:
            continue
        differing += [name] if is_param(name) else []
    if differing:
        verdict = f"the parameters differ: {len(differing)} of {len(params)} tensors ({', '.join(differing[:4])}" + (
            ", ...)" if len(differing) > 4 else ")")
    else:
        verdict = f"the parameters are the same, bit for bit ({len(params)} tensors)"
    return out, verdict


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--all-keys", action="store_true", help="compare the run.* keys too")
    args = ap.parse_args(argv)
    try:
        diff, verdict = compare(args.a, args.b, args.all_keys)
    except ContainerError as e:
        print(f"ckpt_diff: {e}", file=sys.stderr)
        return 2
    for line in diff:
        print(line)
    if not diff:
        print(f"{args.a} and {args.b} hold the same state")
    else:  # (what differs may be the optimizer state or a key alone)
        print(verdict)
    return 1 if diff else 0


if __name__ == "__main__":
    sys.exit(main())
