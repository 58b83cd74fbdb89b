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


def ema(values, decay=0.9):
    """Exponential moving average, started at the first value (no bias towards 0)."""
    smooth, average = [], None
    for v in values:
        average = v if average is None else decay * average + (1 - decay) * v
        smooth.append(average)
    return smooth
