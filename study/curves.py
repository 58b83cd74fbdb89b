"""
curves.py: what the loss-curve plots of study/report.py and study/compare.py share:
a tokens axis in units a reader takes in at a glance (K, M, B tokens), and the smoothing of
training losses.
"""

TOKEN_UNITS = ((1e9, "B"), (1e6, "M"), (1e3, "K"))


def token_unit(largest):
    """(divisor, name) that puts `largest` tokens between 1 and 1000 of the unit ("M": millions);
    (1, "") below a thousand."""
    for divisor, name in TOKEN_UNITS:
        if largest >= divisor:
            return divisor, name
    return 1, ""


def token_axis_label(divisor_name):
    return f"tokens ({divisor_name})" if divisor_name else "tokens"


def ema_decay(n):
    """The EMA's decay for a run of n steps: 0.9, less for runs under 180 steps so that the line
    lags the steps by at most 5% of the run (an EMA of decay d lags a steady trend by d/(1-d)
    steps: 9 at 0.9, most of a 20-step run)."""
    return min(0.9, n / (n + 20))


def ema(values, decay=None):
    """Exponential moving average, started at the first value (no bias towards 0); its decay
    ema_decay(len(values)) unless given."""
    decay = ema_decay(len(values)) if decay is None else decay
    smooth, average = [], None
    for v in values:
        average = v if average is None else decay * average + (1 - decay) * v
        smooth.append(average)
    return smooth


RAW_ALPHA = 0.2
LOSS_AXIS_LABEL = "cross-entropy (nats)"
SMOOTHING_NOTE = "faint: each step; line: EMA 0.9, less under 180 steps"


def plot_raw_and_smoothed(ax, xs, losses, color, label=None):
    """A training-loss curve as each loss plot draws it: every step's loss faint, its EMA over
    the whole run (ema: a run's records from its first step, so the smoothing restarts nowhere)
    as the line that carries the label."""
    ax.plot(xs, losses, color=color, alpha=RAW_ALPHA, lw=0.8)
    ax.plot(xs, ema(losses), color=color, lw=1.4, label=label)
