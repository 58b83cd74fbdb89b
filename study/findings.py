"""
The findings of both papers, each judged once: the study report (study/report.py: one study,
differences of seed means) and the ladder report (study/ladder_report.py: differences paired by
seed, at each rung and across the rungs) call the same rule and differ only in what they pass:
the differences (Diff: a mean, its sd over seeds when paired, how many seeds) and `clears`, the
test a difference must pass to count (positive; or resolved against the noise floor).

  gap_ordering     SAN paper finding 1: SAN behind each partner, iso-depth > iso-FLOP > iso-param
  localisation     finding 2: the SAN's deficit sits on query tokens (and there is one)
  spectra_shows    finding 3: routing matrices change less than content ones, W_o above the FFN's
  qk_norm          finding 4: deep attention stacks diverge (or train unstably) without QK-norm
  variants_behind  Deconstructing Attention: uniform variants behind standard, mlp the most, and
                   each hybrid recovers at least half of its uniform arm's gap
  over_ladder      a finding across the rungs: shows / trend / does not show / cannot tell
The reports' texts say what each rule found; doc/study.md ("Report", "Scale ladder") states them.
"""
import math
from collections import namedtuple

from study.tables import mean_sd

Diff = namedtuple("Diff", "mean sd n")  # arm a − arm b: the mean, its sd over seeds (None unpaired or one seed), seeds
GapOrdering = namedtuple("GapOrdering", "shows ahead ordered")  # ahead: roles of the partners the SAN is not behind
ATTENTION_MATRICES = ("attn.wq", "attn.wk", "attn.wv", "attn.wo")


# ----------------------------------------------------------------------------------------
# differences and the noise floor

def paired(a, b):
    """Diff of a − b over the seeds both have ({seed: value}; None values left out)."""
    diffs = [a[s] - b[s] for s in sorted(set(a) & set(b)) if a[s] is not None and b[s] is not None]
    mean, sd = mean_sd(diffs)
    return Diff(mean, sd, len(diffs))


def unpaired(a, b, n=None):
    """Diff of two seed means (no sd: the seeds are not paired)."""
    return Diff(a - b, None, n)


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


def positive(diff):
    return diff.mean > 0


def resolved(mean, sd, floor):
    """Larger than twice its sd over seeds and than the noise floor; never with one seed (no sd)
    or without a floor."""
    return mean is not None and sd is not None and floor is not None and mean > 2 * sd and mean > floor


def resolved_against(floor):
    """The `clears` test of differences paired by seed: resolved against this floor."""
    return lambda diff: resolved(diff.mean, diff.sd, floor)


# ----------------------------------------------------------------------------------------
# the findings

def gap_ordering(gaps, margins, clears):
    """gaps: {"iso_depth", "iso_flop", "iso_param": Diff of SAN − partner}; margins: the two
    ordering margins (iso-depth gap − iso-FLOP gap, iso-FLOP gap − iso-param gap) as Diffs.
    It shows when every gap and both margins clear: the SAN behind each partner, in the paper's order."""
    return GapOrdering(shows=all(clears(g) for g in gaps.values()) and all(clears(m) for m in margins),
                       ahead=[role for role, g in gaps.items() if g.mean <= 0],
                       ordered=all(m.mean > 0 for m in margins))


def localisation(query, margins, clears):
    """query: Diff of SAN − FFN on query tokens; margins: {region: Diff of the query delta minus
    that region's delta}. Returns (behind, shows): whether the SAN has a deficit on query tokens
    to place at all, and whether it shows (a deficit, and every margin clears: largest on query)."""
    behind = query.mean > 0
    return behind, behind and all(clears(m) for m in margins.values())


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
    """Content minus routing: max(W_v, W_o) growth − max(W_q, W_k) growth."""
    return max(growth["attn.wv"], growth["attn.wo"]) - max(growth["attn.wq"], growth["attn.wk"])


def spectra_shows(growth, partner_wo, partner_needed):
    """The routing matrices change less than the content matrices, and W_o grows more than the
    FFN partner's W_o (partner_wo; None when it has no milestones: then it shows only if the
    partner is not needed)."""
    if partner_wo is None:
        return spectra_margin(growth) > 0 and not partner_needed
    return spectra_margin(growth) > 0 and growth["attn.wo"] > partner_wo


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


def qk_norm(diverged_with, diverged_without, unstable_with, unstable_without):
    """The verdict on QK-norm from the runs that diverged and those that trained unstably (counts
    or lists) with and without it: "shows" when only the stack without it diverged; "shows, short
    of a divergence" when nothing diverged but only the stack without it trained unstably."""
    if diverged_without and not diverged_with:
        return "shows"
    if diverged_with:
        return "does not show"
    if unstable_without and not unstable_with:
        return "shows, short of a divergence"
    return "does not show"


def variants_behind(deltas, behind):
    """deltas: {kind: (uniform − standard, hybrid − standard)} of the kinds judged, mlp among
    them. Shows when every uniform arm is behind standard (behind(gap)), mlp-uniform the most,
    and every hybrid recovers at least half of its uniform arm's gap."""
    return (all(behind(u) for u, _ in deltas.values()) and all(deltas["mlp"][0] >= u for u, _ in deltas.values())
            and all(h <= 0.5 * u for u, h in deltas.values()))


def over_ladder(per_rung, shows, quantity):
    """A finding across the rungs. per_rung: [(tokens, result)] of the rungs that could be judged;
    shows(result) -> bool; quantity(result) -> the number that moves the paper's way when it
    grows. "shows" at the largest rung; else "trend" when the quantity grew from the second-
    largest rung to the largest; else "does not show"; "cannot tell" without a rung."""
    if not per_rung:
        return "cannot tell"
    if shows(per_rung[-1][1]):
        return "shows"
    if len(per_rung) >= 2:
        a, b = quantity(per_rung[-2][1]), quantity(per_rung[-1][1])
        if a is not None and b is not None and b > a:
            return "trend"
    return "does not show"
