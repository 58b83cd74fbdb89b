"""
Numbers and markdown tables of the study reports (report.py, ladder_report.py): one way to
print a loss, a difference and a mean ± sd, so that both reports read the same.
"""
import math


def mean_sd(values):
    """(mean, sample sd with ddof 1) of the values that are not None; sd is None for one value,
    both None for none."""
    values = [v for v in values if v is not None]
    if not values:
        return None, None
    n = len(values)
    mean = sum(values) / n
    return mean, (math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1)) if n > 1 else None)


def fmt(x, digits=4, signed=False):
    """x to `digits` decimals (signed: with its sign, for differences); "—" for a missing value."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "—"
    return f"{x:+.{digits}f}" if signed else f"{x:.{digits}f}"


def pm(mean, sd, digits=4):
    """A signed mean ± its sd ("—" without a mean; the mean alone without an sd)."""
    if mean is None:
        return "—"
    return fmt(mean, digits, signed=True) + (f" ± {sd:.{digits}f}" if sd is not None else "")


def table(header, rows):
    """A markdown table (one string, a line per row)."""
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)
