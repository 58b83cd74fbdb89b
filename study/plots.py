"""
Figure helpers of the study reports: matplotlib without a display, a grid of panels, saving a
figure into the report directory, and what every plot of layers or runs shares: integer layer
ticks, one legend for a figure of panels, and a colour bar that says which colour is which layer.
"""
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after the backend is chosen)
from matplotlib.colors import BoundaryNorm  # noqa: E402
from matplotlib.ticker import FuncFormatter, MaxNLocator, NullFormatter  # noqa: E402

DPI = 110
# Layers are numbered from 1 on every plot (as the attention-pattern panels title them), the
# layer next to the embedding first; the checkpoint's tensor names count from 0.
LAYER_AXIS_LABEL = "layer (1 = first)"


def grid_of_axes(n, per_row=4, panel=(4, 3.5), **kwargs):
    """A figure with n panels, at most per_row to a row, each `panel` inches (kwargs: plt.subplots'
    others, e.g. layout); returns (figure, flat list of axes)."""
    cols, rows = min(n, per_row), -(-n // per_row)
    fig, axes = plt.subplots(rows, cols, figsize=(panel[0] * cols, panel[1] * rows), squeeze=False, **kwargs)
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


def plain_log_ticks(ax, which="y"):
    """A log axis's tick labels as plain numbers (13.5, 0.002), not matplotlib's mathtext
    (1.35x10^1): the decades, and the ticks between them where the axis spans under 1.5 decades
    (where matplotlib labels those too). Call once the plotted data set the limits."""
    lo, hi = sorted(ax.get_ylim() if which == "y" else ax.get_xlim())
    axis = ax.yaxis if which == "y" else ax.xaxis
    plain = FuncFormatter(lambda v, _: f"{v:g}")
    axis.set_major_formatter(plain)
    axis.set_minor_formatter(plain if lo > 0 and hi / lo < 10 ** 1.5 else NullFormatter())


def layer_numbers(per_layer):
    """The x values of a per-layer list: 1, 2, ... (LAYER_AXIS_LABEL)."""
    return list(range(1, len(per_layer) + 1))


def integer_ticks(axis):
    """Ticks only at whole numbers on an axis of layers (a default locator puts some at 0.5)."""
    axis.set_major_locator(MaxNLocator(integer=True))


def layer_axis(ax):
    """The x axis of a plot against layers: labelled, whole-number ticks."""
    ax.set_xlabel(LAYER_AXIS_LABEL)
    integer_ticks(ax.xaxis)


def figure_legend(fig, axes, **kwargs):
    """One legend for a figure of panels, every label once, from whichever panel draws it: a
    legend on one panel leaves out what only the others draw (an arm without FFN matrices is
    absent from the FFN panels, a kind of matrix from some arms). Returns it, or None when no
    panel labels anything."""
    handles, labels = [], []
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            if label not in labels:
                handles.append(handle)
                labels.append(label)
    if not labels:
        return None
    options = dict(loc="outside lower center", ncols=min(4, len(labels)), fontsize=8, frameon=False)
    options.update(kwargs)
    return fig.legend(handles, labels, **options)


def layer_colormap(n_layers, cmap_name="viridis"):
    """(colour of layer index i (0-based), mappable for layer_colorbar): one colour per layer."""
    cmap = plt.get_cmap(cmap_name)
    norm = BoundaryNorm([k + 0.5 for k in range(n_layers + 1)], cmap.N)
    return (lambda i: cmap(norm(i + 1))), matplotlib.cm.ScalarMappable(norm=norm, cmap=cmap)


def layer_colorbar(fig, axes, mappable, n_layers):
    """The key of lines coloured by layer: a colour bar labelled "layer", ticks at whole layers
    (at most a dozen of them)."""
    bar = fig.colorbar(mappable, ax=axes)
    step = -(-n_layers // 12)
    bar.set_ticks(list(range(1, n_layers + 1, step)))
    bar.set_label(LAYER_AXIS_LABEL)
    return bar
