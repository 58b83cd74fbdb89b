"""
Figure helpers of the study reports: matplotlib without a display, a grid of panels, and
saving a figure into the report directory.
"""
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after the backend is chosen)

DPI = 110


def grid_of_axes(n, per_row=4):
    """A figure with n panels, at most per_row to a row; returns (figure, flat list of axes)."""
    cols, rows = min(n, per_row), -(-n // per_row)
    fig, axes = plt.subplots(rows, cols, figsize=(4 * cols, 3.5 * rows), squeeze=False)
    flat = [ax for row in axes for ax in row]
    for ax in flat[n:]:
        ax.set_visible(False)
    return fig, flat


def save(fig, out, name, tight=True):
    """Writes the figure to out/name (tight layout unless it has its own) and closes it; returns name."""
    os.makedirs(out, exist_ok=True)
    if tight:
        fig.tight_layout()
    fig.savefig(os.path.join(out, name), dpi=DPI)
    plt.close(fig)
    return name
