"""The time per kernel of an Nsight Compute run (scripts/gpu_check.sh's profile stage): reads the CSV
that `ncu --metrics gpu__time_duration.sum --csv --log-file F` writes and prints one row per kernel
(templates kept, arguments dropped): launches, launches per step, total and per-step time, mean time
per launch and share of the total, slowest first. Usage:

    python dev/gpu_profile.py PROFILE.csv [--steps N]

--steps: the training steps the profiled run took (per-step columns divide by it; the run's set-up
kernels count too, so the figures are upper bounds for a step). ncu runs each kernel alone (it
serialises launches), so the total is the sum of kernel times, not a step's wall time."""
import argparse
import csv
import io
import sys
from collections import defaultdict

UNIT_NS = {"nsecond": 1.0, "ns": 1.0, "usecond": 1e3, "us": 1e3, "msecond": 1e6, "ms": 1e6, "second": 1e9, "s": 1e9}
METRIC = "gpu__time_duration.sum"


def kernel_base_name(name):
    """'void f<64, 2>(float *, int)' -> 'f<64, 2>': the name up to its top-level argument list."""
    name = name.strip()
    if name.startswith("void "):
        name = name[5:]
    depth = 0
    for i, ch in enumerate(name):
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif ch == "(" and depth == 0:
            return name[:i].strip()
    return name


def read_profile(text):
    """{kernel: [durations in ns]} from ncu's CSV (lines before its header, ncu's own ==PROF==
    messages, are skipped). Raises ValueError naming what is missing."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID"')), None)
    if start is None:
        raise ValueError("no ncu CSV header (a line starting with \"ID\") found")
    rows = csv.DictReader(io.StringIO("\n".join(lines[start:])))
    for column in ("Kernel Name", "Metric Name", "Metric Unit", "Metric Value"):
        if column not in rows.fieldnames:
            raise ValueError(f"the CSV has no '{column}' column")
    durations = defaultdict(list)
    for row in rows:
        if row["Metric Name"] != METRIC:
            continue
        unit = row["Metric Unit"].strip()
        if unit not in UNIT_NS:
            raise ValueError(f"unknown unit '{unit}' of {METRIC} (kernel {row['Kernel Name']})")
        value = float(row["Metric Value"].replace(",", ""))
        durations[kernel_base_name(row["Kernel Name"])].append(value * UNIT_NS[unit])
    if not durations:
        raise ValueError(f"no {METRIC} rows")
    return durations


def table(durations, steps):
    total_ns = sum(sum(d) for d in durations.values())
    launches = sum(len(d) for d in durations.values())
    out = [f"{'kernel':<60} {'launches':>8} {'/step':>7} {'total ms':>9} {'ms/step':>8} {'mean us':>8} {'share':>6}"]
    for name, d in sorted(durations.items(), key=lambda kv: -sum(kv[1])):
        ns = sum(d)
        out.append(f"{name[:60]:<60} {len(d):>8} {len(d) / steps:>7.1f} {ns / 1e6:>9.3f} {ns / 1e6 / steps:>8.3f} "
                   f"{ns / len(d) / 1e3:>8.2f} {100 * ns / total_ns:>5.1f}%")
    out.append(f"{'all kernels':<60} {launches:>8} {launches / steps:>7.1f} {total_ns / 1e6:>9.3f} "
               f"{total_ns / 1e6 / steps:>8.3f} {'':>8} 100.0%")
    return "\n".join(out)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("csv", help="ncu's --csv --log-file output")
    parser.add_argument("--steps", type=int, default=1, help="training steps the profiled run took")
    args = parser.parse_args(argv)
    if args.steps < 1:
        parser.error(f"--steps must be at least 1 (got {args.steps})")
    try:
        with open(args.csv) as f:
            durations = read_profile(f.read())
    except (OSError, ValueError) as e:
        sys.exit(f"gpu_profile: {args.csv}: {e}")
    print(table(durations, args.steps))


if __name__ == "__main__":
    main()
