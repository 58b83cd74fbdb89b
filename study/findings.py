"""
The findings of both papers, each judged once (doc/study.md "Verdict rules"; amendments, with
RULES_DATE, in doc/study-runs/README.md). The study report (arms unpaired) and the ladder report
(paired by seed, per rung and across the rungs) build a Rule, its pairing and noise floor, and
pass it to the same rule functions with each arm's values by seed.

Layout: Student's t; contrasts of arms; one function per finding's rule; the rules across a
ladder and Holm over a report's family; KINDS, the one table of finding kinds (their arms, rule
and wording), read by study/spec.py and both reports.
"""
import functools
import math
from collections import namedtuple

from study.tables import mean_sd

RULES_DATE = "2026-12-07"
MIN_SEEDS = 3
LEVEL = 0.95
SHOWS, DOES_NOT_SHOW, CANNOT_TELL, TREND = "shows", "does not show", "cannot tell", "trend"
SHOWS_SHORT = "shows, short of a divergence"  # qk_norm: instabilities, not divergences, tell

# a contrast of arms: its mean, sd over seeds of the paired values (None unpaired), seeds (the
# fewest of any arm), standard error and degrees of freedom of its t-interval (None: no interval)
Diff = namedtuple("Diff", "mean sd n se dof")
GapOrdering = namedtuple("GapOrdering", "verdict ahead ordered")  # ahead: roles the SAN is not behind
ATTENTION_MATRICES = ("attn.wq", "attn.wk", "attn.wv", "attn.wo")


def too_few(n):
    return f"too few seeds ({n or 0})"


def is_too_few(verdict):
    return verdict.startswith("too few")


# ----------------------------------------------------------------------------------------
# Student's t (integer degrees of freedom: a fractional dof is rounded down, the wider interval)

def t_cdf(t, dof):
    """P(T <= t) for Student's t with integer dof >= 1, from the closed forms of P(|T| < t) as
    a finite series in cos(theta), theta = atan(t / sqrt(dof)) (odd dof: arc plus series; even:
    sine times series)."""
    theta = math.atan(abs(t) / math.sqrt(dof))
    s, c2 = math.sin(theta), math.cos(theta) ** 2
    if dof % 2:
        term, series = math.cos(theta), 0.0
        for k in range(1, (dof - 1) // 2 + 1):  # c + (2/3) c^3 + (2*4)/(3*5) c^5 + ... up to c^(dof-2)
            series += term
            term *= c2 * (2 * k) / (2 * k + 1)
        inside = 2 / math.pi * (theta + s * series)
    else:
        term, series = 1.0, 0.0
        for k in range(dof // 2):  # 1 + (1/2) c^2 + (1*3)/(2*4) c^4 + ... up to c^(dof-2)
            series += term
            term *= c2 * (2 * k + 1) / (2 * k + 2)
        inside = s * series
    return 0.5 + math.copysign(0.5 * inside, t)


@functools.lru_cache(maxsize=None)
def t_quantile(p, dof):
    """The t with t_cdf(t, floor(dof)) = p, for 0.5 <= p < 1, by bisection."""
    dof = int(math.floor(dof))
    if dof < 1 or not 0.5 <= p < 1:
        raise ValueError(f"t_quantile needs dof >= 1 and 0.5 <= p < 1 (got {p}, {dof})")
    lo, hi = 0.0, 1.0
    while t_cdf(hi, dof) < p:
        lo, hi = hi, 2 * hi
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if t_cdf(mid, dof) < p else (lo, mid)
    return (lo + hi) / 2


def interval(diff, level=LEVEL):
    """The two-sided t-interval of a Diff, (low, high); None without a standard error."""
    if diff is None or diff.mean is None or diff.se is None or diff.dof is None or diff.dof < 1:
        return None
    half = t_quantile(0.5 + level / 2, diff.dof) * diff.se
    return diff.mean - half, diff.mean + half


def with_interval(diff, digits=4, percent=False):
    """"+0.0123 [-0.0040, +0.0290]": a signed mean and its 95% interval ("—" without a mean);
    percent: relative changes, "+6.3% [+1.0%, +11.6%]" (digits after the point of the percent)."""
    if diff is None or diff.mean is None:
        return "—"
    form = f"+.{digits}%" if percent else f"+.{digits}f"
    ci = interval(diff)
    return format(diff.mean, form) + (f" [{format(ci[0], form)}, {format(ci[1], form)}]" if ci else " [no interval]")


# ----------------------------------------------------------------------------------------
# contrasts of arms, paired by seed or not

def _values(by_seed):
    return {s: v for s, v in by_seed.items() if v is not None}


def contrast_paired(terms):
    """Diff of sum(coef * arm value), formed seed by seed over the seeds every arm has.
    terms: [(coef, {seed: value})]."""
    arms = [_values(values) for _, values in terms]
    seeds = sorted(set.intersection(*(set(a) for a in arms))) if arms else []
    per_seed = [sum(c * a[s] for (c, _), a in zip(terms, arms)) for s in seeds]
    mean, sd = mean_sd(per_seed)
    n = len(per_seed)
    return Diff(mean, sd, n, sd / math.sqrt(n) if sd is not None else None, n - 1 if n > 1 else None)


def contrast_unpaired(terms):
    """Diff of sum(coef * arm mean) of independent arms: Welch's standard error
    sqrt(sum coef^2 sd^2 / n), with min(n) - 1 dof (never more than the true Welch dof)."""
    stats = [(c, len(_values(v)), *mean_sd(list(_values(v).values()))) for c, v in terms]
    if not stats or any(n == 0 for _, n, _, _ in stats):
        return Diff(None, None, 0, None, None)
    mean = sum(c * m for c, _, m, _ in stats)
    n = min(n for _, n, _, _ in stats)
    if n < 2:
        return Diff(mean, None, n, None, None)
    se = math.sqrt(sum(c * c * sd * sd / k for c, k, _, sd in stats))
    return Diff(mean, None, n, se, n - 1)


def paired(a, b):
    """Diff of a − b paired by seed ({seed: value}; None values left out)."""
    return contrast_paired([(1, a), (-1, b)])


def unpaired(a, b):
    """Diff of the seed means a − b, the arms' seeds independent."""
    return contrast_unpaired([(1, a), (-1, b)])


def pooled_sd(samples):
    """The pooled seed-to-seed sd of several arms' values (a list of values per arm):
    sqrt(sum (n_i - 1) sd_i^2 / sum (n_i - 1)); None without an arm of two or more seeds."""
    num = den = 0
    for values in samples:
        if len(values) > 1:
            _, sd = mean_sd(values)
            num += (len(values) - 1) * sd ** 2
            den += len(values) - 1
    return math.sqrt(num / den) if den else None


class Rule:
    """How a report judges differences: paired by seed or not, against which noise floor (None:
    none), with how many seeds at least and at which interval level."""

    def __init__(self, pairing, floor=None, min_seeds=MIN_SEEDS, level=LEVEL):
        if pairing not in ("paired", "unpaired"):
            raise ValueError(f"pairing is 'paired' or 'unpaired', not {pairing!r}")
        self.pairing, self.floor, self.min_seeds, self.level = pairing, floor, min_seeds, level

    def contrast(self, terms):
        return (contrast_paired if self.pairing == "paired" else contrast_unpaired)(terms)

    def diff(self, a, b):
        """a − b ({seed: value} each)."""
        return self.contrast([(1, a), (-1, b)])

    def enough(self, *diffs):
        return all(d is not None and (d.n or 0) >= self.min_seeds for d in diffs)

    def seeds(self, *diffs):
        return min((d.n or 0) if d is not None else 0 for d in diffs)

    def clears(self, diff):
        """Positive beyond noise: enough seeds, the interval above zero, the mean above the floor."""
        ci = interval(diff, self.level)
        return (self.enough(diff) and ci is not None and ci[0] > 0
                and (self.floor is None or diff.mean > self.floor))

    def describe(self, floor_text=None, trend=True):
        """The line a report prints with its findings (floor_text: how the floor is set, where
        it is not this rule's one number; trend: whether the report judges across rungs)."""
        pairing = ("paired by seed (n − 1 dof)" if self.pairing == "paired"
                   else "unpaired (Welch's standard error, min(n) − 1 dof)")
        floor = (f", and its mean is above {floor_text}" if floor_text else
                 f", and its mean is above the noise floor {self.floor:.4f}" if self.floor is not None else "")
        across = ("; over the ladder, every such number must clear at the largest rung or rise beyond its "
                  "interval with its mean above zero there, and the report's findings are one family (Holm)"
                  if trend else "; the report's findings are one family: each one's p (twice the largest one-sided p "
                  f"of the differences it needs, or its Fisher p) must pass Holm's step-down at {1 - self.level:.0%}")
        return (f"Verdict rules: at least {self.min_seeds} seeds per arm (fewer: \"too few seeds\"); a difference "
                f"counts when its {self.level:.0%} t-interval, {pairing}, excludes zero in the paper's direction{floor}"
                f"{across} (study/findings.py, {RULES_DATE}).")


def _judged(diffs, rule, shows):
    """The verdict on diffs that must all be judged: too few seeds, else shows(), else not."""
    if not rule.enough(*diffs):
        return too_few(rule.seeds(*diffs))
    return SHOWS if shows() else DOES_NOT_SHOW


# ----------------------------------------------------------------------------------------
# the findings of one study (or one rung)

def gap_ordering_numbers(gaps, margins):
    """The differences the gap ordering needs to clear: the three gaps and both margins."""
    return list(gaps.values()) + list(margins)


def gap_ordering(gaps, margins, rule):
    """gaps: {"iso_depth", "iso_flop", "iso_param": Diff of SAN − partner}; margins: the two
    ordering margins (iso-depth gap − iso-FLOP gap, iso-FLOP gap − iso-param gap) as Diffs.
    It shows when every gap and both margins clear: the SAN behind each partner, in the paper's order."""
    diffs = gap_ordering_numbers(gaps, margins)
    return GapOrdering(verdict=_judged(diffs, rule, lambda: all(rule.clears(d) for d in diffs)),
                       ahead=[role for role, g in gaps.items() if g.mean is not None and g.mean <= 0],
                       ordered=all(m.mean is not None and m.mean > 0 for m in margins))


def localisation_numbers(query, margins):
    """The differences the localisation needs to clear: the query deficit and each margin."""
    return [query] + list(margins.values())


def localisation(query, margins, rule):
    """query: Diff of SAN − FFN on query tokens; margins: {region: Diff of the query delta minus
    that region's delta}. Returns (behind, verdict): whether the SAN's mean is behind on query
    tokens at all, and the verdict: it shows when the query deficit clears (a positive deficit
    beyond noise) and so does every margin (the deficit largest on query tokens)."""
    diffs = localisation_numbers(query, margins)
    behind = query.mean is not None and query.mean > 0
    return behind, _judged(diffs, rule, lambda: all(rule.clears(d) for d in diffs))


def stable_rank_growth(series, layer_mean):
    """{attention matrix: relative change of its layer-mean stable rank from the 25% milestone
    (series[1]) to the last}, of milestone spectra in step order (study/spectra.py)."""
    growth = {}
    for kind in ATTENTION_MATRICES:
        if kind in series[1]["stable_rank"]:
            a, b = layer_mean(series[1]["stable_rank"][kind]), layer_mean(series[-1]["stable_rank"][kind])
            growth[kind] = (b - a) / a
    return growth


def spectra_margin(growth):
    """Content against routing: W_o's growth − max(W_q, W_k) growth (the SAN's content matrix:
    "without FFNs the accumulation moves to W_o"; the larger routing change, so that either
    routing matrix moving counts against the finding)."""
    return growth["attn.wo"] - max(growth["attn.wq"], growth["attn.wk"])


def run_stable_rank_growth(run_dir):
    """stable_rank_growth of a run's milestone checkpoints (RUN/ckpt/milestone_*.bin), or None
    with fewer than 3 (the 25% milestone and a later one are needed)."""
    import glob
    import os

    from study import spectra  # (torch: loaded only when a report reads checkpoints)
    paths = sorted(glob.glob(os.path.join(run_dir, "ckpt", "milestone_*.bin")))
    if len(paths) < 3:
        return None
    series = sorted((spectra.checkpoint_spectra(p) for p in paths), key=lambda r: r["step"])
    return stable_rank_growth(series, spectra.layer_mean)


def spectra_diffs(san_growth, ffn_growth, rule):
    """The spectra finding's three differences from per-seed growths ({seed: stable_rank_growth}):
    "gain" W_o's own growth (content gains stable rank), "margin" spectra_margin (more than the
    routing matrices), "partner" SAN W_o − FFN W_o (None without FFN growths)."""
    gain = rule.contrast([(1, {s: g["attn.wo"] for s, g in san_growth.items()})])
    margin = rule.contrast([(1, {s: spectra_margin(g) for s, g in san_growth.items()})])
    partner = (rule.diff({s: g["attn.wo"] for s, g in san_growth.items()},
                         {s: g["attn.wo"] for s, g in ffn_growth.items()}) if ffn_growth else None)
    return {"gain": gain, "margin": margin, "partner": partner}


def spectra_numbers(diffs):
    """The differences the spectra finding needs to clear: W_o's gain, the margin and (given) the partner's."""
    return [diffs["gain"], diffs["margin"]] + ([diffs["partner"]] if diffs["partner"] is not None else [])


def spectra(diffs, rule, partner_needed):
    """Shows when W_o gains stable rank, more than W_q and W_k, and more than the FFN partner's
    W_o (without partner growths: does not show if the partner is needed)."""
    judged = spectra_numbers(diffs)
    if diffs["partner"] is None and partner_needed:
        return DOES_NOT_SHOW
    return _judged(judged, rule, lambda: all(rule.clears(d) for d in judged))


def instability(val, train, floor):
    """Why a finished run trained unstably, or None: its validation loss went back up (the end
    is above its best validation by more than the noise floor, 0.01 without one: the schedules
    never raise the rate late, so only instability does that), or its gradient norm grew more
    than tenfold from the first logged step to the last. val, train: the log's records."""
    reasons = []
    losses = [v["val_loss"] for v in val if v.get("val_loss") is not None]
    if len(losses) >= 2 and losses[-1] - min(losses[:-1]) > (floor or 0.01):
        reasons.append(f"validation loss rose from {min(losses[:-1]):.4f} to {losses[-1]:.4f}")
    norms = [t["grad_norm"] for t in train if t.get("grad_norm") is not None]
    if len(norms) >= 2 and norms[-1] > 10 * norms[0]:
        reasons.append(f"gradient norm grew from {norms[0]:.3g} to {norms[-1]:.3g}")
    return " and ".join(reasons) or None


def more_often_p(k_a, n_a, k_b, n_b):
    """One-sided Fisher exact p: the chance that, of the k_a + k_b events among n_a + n_b runs
    falling at random, at least k_a fall in group a."""
    k, n = k_a + k_b, n_a + n_b
    return sum(math.comb(n_a, x) * math.comb(n_b, k - x) for x in range(k_a, min(k, n_a) + 1)) / math.comb(n, k)


def qk_norm(runs_with, runs_without, diverged_with, diverged_without, unstable_with, unstable_without, rule):
    """The verdict on QK-norm from the numbers of runs with and without it and of those that
    diverged or (finished but) trained unstably: "shows" when the stack without it diverged more
    often than chance allows (one-sided Fisher p <= 1 − level: every run of three without, none
    with, is p = 0.05); "shows, short of a divergence" the same of instabilities when nothing
    diverged."""
    if min(runs_with, runs_without) < rule.min_seeds:
        return too_few(min(runs_with, runs_without))
    alpha = 1 - rule.level + 1e-12  # (3 of 3 against 0 of 3 is exactly 0.05)
    if qk_norm_p(runs_with, runs_without, diverged_with, diverged_without, unstable_with, unstable_without) > alpha:
        return DOES_NOT_SHOW
    return SHOWS if diverged_with or diverged_without else SHOWS_SHORT


def qk_norm_p(runs_with, runs_without, diverged_with, diverged_without, unstable_with, unstable_without):
    """The one-sided Fisher p qk_norm judges: of the divergences when a run diverged, else of the
    instabilities; 1 with neither."""
    if diverged_with or diverged_without:
        return more_often_p(diverged_without, runs_without, diverged_with, runs_with)
    if unstable_with or unstable_without:
        return more_often_p(unstable_without, runs_without, unstable_with, runs_with)
    return 1.0


def variant_diffs(values, standard, kinds, rule):
    """values: {arm: {seed: final loss}} with standard, KIND-uniform and KIND-hybrid arms.
    Returns {kind: {"uniform": uniform − standard, "hybrid": hybrid − standard, "recovery":
    uniform − 2 hybrid + standard (positive: the hybrid recovers more than half of the uniform
    gap), "mlp_most": mlp-uniform − this uniform (None for mlp)}} as Diffs, kinds with both arms."""
    out = {}
    std = values.get(standard) or {}
    for kind in kinds:
        uni, hyb = values.get(f"{kind}-uniform"), values.get(f"{kind}-hybrid")
        if not uni or not hyb:
            continue
        out[kind] = {"uniform": rule.diff(uni, std), "hybrid": rule.diff(hyb, std),
                     "recovery": rule.contrast([(1, uni), (-2, hyb), (1, std)]),
                     "mlp_most": (rule.diff(values["mlp-uniform"], uni)
                                  if kind != "mlp" and values.get("mlp-uniform") else None)}
    return out


def variant_numbers(diffs):
    """The differences variants_behind needs to clear: each uniform gap, recovery and mlp margin."""
    return [d[key] for d in diffs.values() for key in ("uniform", "recovery", "mlp_most") if d[key] is not None]


def variants_behind(diffs, rule):
    """diffs: variant_diffs with mlp among them. Shows when every uniform arm is behind standard,
    mlp-uniform further behind than every other uniform arm, and every hybrid recovers more than
    half of its uniform arm's gap: every one of those differences clears."""
    if "mlp" not in diffs:
        return CANNOT_TELL
    judged = variant_numbers(diffs)
    return _judged(judged, rule, lambda: all(rule.clears(d) for d in judged))


# ----------------------------------------------------------------------------------------
# across the rungs of a ladder (doc/study.md "Scale ladder": the verdict rules over a ladder)

# A finding over the ladder: p, the one-sided p-value of its claim that every number its per-rung
# rule asks to clear holds (trend or better); p_shows, that of its per-rung rule at the largest
# rung; status: None when judged (judge_family turns p into the verdict), else the verdict itself
# ("too few seeds (n)", "cannot tell"). numbers: {name: (p, p at the largest rung, p of the slope)}.
OverLadder = namedtuple("OverLadder", "p p_shows status numbers")
FAMILY_ALPHA = (1 - LEVEL) / 2  # one-sided, as a 95% interval excluding zero on the paper's side


def p_positive(diff, floor=None):
    """The one-sided p-value that a Diff's true value is above zero (1 − t_cdf(mean / se)); 1 when
    its mean is not above the floor, or without an interval. p <= (1 − level) / 2 exactly when its
    two-sided interval excludes zero on the positive side (and the mean is above the floor)."""
    if diff is None or diff.mean is None or diff.se is None or diff.dof is None or diff.dof < 1:
        return 1.0
    if floor is not None and diff.mean <= floor:
        return 1.0
    if diff.se == 0:
        return 0.0 if diff.mean > 0 else 1.0
    return 1.0 - t_cdf(diff.mean / diff.se, int(math.floor(diff.dof)))


def trend_slope(points):
    """The least-squares slope of values against log4(tokens) (per 4x tokens) as a Diff with
    its standard error and n − 2 dof, over points [(tokens, [per-seed values])] (every seed a
    point); None with fewer than 3 rungs or 3 values."""
    xy = [(math.log(t) / math.log(4), v) for t, values in points for v in values if v is not None]
    if len({t for t, values in points if any(v is not None for v in values)}) < 3 or len(xy) < 3:
        return None
    n = len(xy)
    mx, my = sum(x for x, _ in xy) / n, sum(y for _, y in xy) / n
    sxx = sum((x - mx) ** 2 for x, _ in xy)
    slope = sum((x - mx) * (y - my) for x, y in xy) / sxx
    residual = sum((y - my - slope * (x - mx)) ** 2 for x, y in xy)
    se = math.sqrt(residual / (n - 2) / sxx) if n > 2 else None
    return Diff(slope, None, n, se, n - 2 if n > 2 else None)


def over_ladder(points, rule):
    """A finding across the rungs. points: [(tokens, {number: [per-seed values]})] of the rungs that
    could be judged, smallest first; the numbers are every paired contrast its per-rung rule asks to
    clear (gaps, margins, the query deficit, W_o's gain ...), per seed; rule: pairing "paired" and the
    largest rung's floor. Each number holds over the ladder when it clears at the largest rung, or
    when its slope against log tokens is above zero beyond its interval *and* its mean at the largest
    rung is above zero (the per-rung rule's sign condition: a number rising while below zero, a W_o
    that loses less rank, is not the paper's finding): its p-value is twice the smaller of the two
    (either way counts). The finding's p is the largest of its numbers' (every one must hold);
    p_shows the largest at the largest rung. "too few seeds (n)" when that rung has fewer than
    min_seeds; "cannot tell" without a rung."""
    if not points:
        return OverLadder(None, None, CANNOT_TELL, {})
    last = points[-1][1]
    n = min((len([v for v in values if v is not None]) for values in last.values()), default=0)
    if n < rule.min_seeds:
        return OverLadder(None, None, too_few(n), {})
    numbers = {}
    for name, values in last.items():
        at_last = contrast_paired([(1, dict(enumerate(values)))])
        p_last = p_positive(at_last, rule.floor)
        slope = trend_slope([(t, nums[name]) for t, nums in points if name in nums])
        p_slope = p_positive(slope) if at_last.mean is not None and at_last.mean > 0 else 1.0
        numbers[name] = (min(1.0, 2 * min(p_last, p_slope)), p_last, p_slope)
    return OverLadder(max(q for q, _, _ in numbers.values()), max(p for _, p, _ in numbers.values()), None, numbers)


def iso_param_shrinks(points, rule):
    """The iso-param gap shrinks with tokens from above zero (the paper: 0.046 at 5B, 0.019 at
    30B, 0.005 at 105B). points: [(tokens, gap Diff, [per-seed gaps])], smallest rung first.
    Its claim: the slope against log tokens is below zero beyond its interval, the gap clears at
    the smallest rung (it starts above zero) and its mean is above zero at every rung; p is the
    larger of the slope's and the first gap's p-values (1 when a mean is not above zero); p_shows
    adds every rung's gap, which must all clear. "cannot tell" under 3 rungs."""
    if len(points) < 3:
        return OverLadder(None, None, CANNOT_TELL, {})
    if not rule.enough(points[-1][1]):
        return OverLadder(None, None, too_few(rule.seeds(points[-1][1])), {})
    slope = trend_slope([(t, [-v for v in values if v is not None]) for t, _, values in points])
    p_fall = p_positive(slope)
    p_gaps = [p_positive(g, rule.floor) for _, g, _ in points]
    if not all(g.mean is not None and g.mean > 0 for _, g, _ in points):
        p_fall = 1.0
    numbers = {"slope": (p_fall, None, p_fall), "first gap": (p_gaps[0], p_gaps[0], None)}
    return OverLadder(max(p_fall, p_gaps[0]), max([p_fall] + p_gaps), None, numbers)


def holm(pvalues, alpha=FAMILY_ALPHA):
    """Holm's step-down over a family of p-values: [the threshold each was compared with, or None
    when the step-down stopped before it] in the order given. The k-th smallest p (from 1) passes at
    alpha / (m − k + 1) while every smaller one has passed; the chance that any true null passes
    is at most alpha, whatever the dependence between them."""
    order = sorted(range(len(pvalues)), key=lambda i: pvalues[i])
    thresholds, m = [None] * len(pvalues), len(pvalues)
    for k, i in enumerate(order):
        thresholds[i] = alpha / (m - k)
        if pvalues[i] > thresholds[i]:
            break
    return thresholds


def judge_family(results, alpha=FAMILY_ALPHA):
    """The verdicts of a family of findings over one ladder (OverLadder each, the report's order):
    Holm over the p of those judged. A finding passes when its p is at most its Holm threshold:
    "shows" when p_shows is too (every number clears at the largest rung at that level), else
    "trend"; "does not show" when it does not pass; the status of one not judged. Returns
    [(verdict, threshold or None)]."""
    judged = [i for i, r in enumerate(results) if r.status is None]
    thresholds = dict(zip(judged, holm([results[i].p for i in judged], alpha)))
    out = []
    for i, r in enumerate(results):
        if r.status is not None:
            out.append((r.status, None))
            continue
        thr = thresholds[i]
        if thr is None or r.p > thr:
            out.append((DOES_NOT_SHOW, thr))
        else:
            out.append((SHOWS if r.p_shows <= thr else TREND, thr))
    return out



# ----------------------------------------------------------------------------------------
# the findings of one study report, one family (issue 57)

STUDY_ALPHA = 1 - LEVEL  # a finding alone shows exactly when its p is at most this


def p_all_clear(diffs, rule):
    """The p-value of a finding that needs every one of diffs to clear: twice the largest one-sided
    p_positive against the rule's floor (an intersection-union test), so that p <= 1 − level
    exactly when every diff clears."""
    return min(1.0, 2 * max((p_positive(d, rule.floor) for d in diffs), default=1.0))


def judge_study(results, alpha=STUDY_ALPHA):
    """The verdicts of a study report's findings as one family. results: [(verdict, p)] in the
    report's order, each its own rule's verdict and p-value (p_all_clear, qk_norm_p; None when not
    judged: too few seeds, cannot tell). Holm over the p of those judged (judge_family): a finding
    keeps its own verdict when its p passes its threshold, else it does not show; one not judged
    keeps its status. Returns [(verdict, threshold or None)]."""
    family = [OverLadder(p, p, None if p is not None else verdict, {}) for verdict, p in results]
    return [(own if v == SHOWS else v, thr) for (own, _), (v, thr) in zip(results, judge_family(family, alpha))]


# ----------------------------------------------------------------------------------------
# the finding kinds: the one place a kind is defined. A study file's [[finding]] names a kind
# and, for each role, an arm; the ladder's `[ladder].deconstructing` is a variants_behind finding.

Kind = namedtuple("Kind", "roles optional rule title over_ladder")
# roles: the arms it needs (a [[finding]]'s fields), optional: arms it uses when given; rule:
# the function of this module that judges it; title: its heading in a study report; over_ladder:
# the verdicts a ladder report gives it across the rungs (none: judged per study only)
KINDS = {
    "gap_ordering": Kind(("san", "iso_depth", "iso_flop", "iso_param"), (), gap_ordering,
                         "Gap ordering: iso-depth > iso-FLOP > iso-param (SAN paper, finding 1)",
                         ("Gap ordering iso-depth > iso-FLOP > iso-param", "iso-param gap shrinks with tokens")),
    "localisation": Kind(("san", "ffn"), (), localisation,
                         "The SAN's deficit sits on query tokens (SAN paper, finding 2)",
                         ("Localisation on query tokens (held-out documents)",
                          "Localisation on query tokens (training documents)")),
    "qk_norm": Kind(("with_qk_norm", "without_qk_norm"), (), qk_norm,
                    "Deep attention stacks diverge without QK-norm (SAN paper, finding 4)", ()),
    "mlp_collapse": Kind(("standard", "uniform", "hybrid"), (), variants_behind,
                         "Uniform mlp collapses, the hybrid recovers (Deconstructing Attention)", ()),
    "spectra": Kind(("san",), ("ffn",), spectra,
                    "Routing matrices freeze early, content matrices keep gaining stable rank (SAN paper, finding 3)",
                    ("Spectra: routing freezes, content (W_o) keeps gaining",)),
    # standard is an arm; KIND-uniform and KIND-hybrid are the arms of each of `kinds`
    "variants_behind": Kind(("standard",), (), variants_behind,
                            "Uniform variants behind standard (mlp most), hybrids recover (Deconstructing Attention)",
                            ("Uniform variants behind standard (mlp most), hybrids recover",)),
}
STUDY_KINDS = ("gap_ordering", "localisation", "qk_norm", "mlp_collapse", "spectra")  # a study file's [[finding]]s


def arms_of(finding):
    """The arm names a finding (a [[finding]] table) reads, role by role."""
    kind = KINDS[finding["kind"]]
    return [finding[role] for role in kind.roles + kind.optional if role in finding]
