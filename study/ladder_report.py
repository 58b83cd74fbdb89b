#!/usr/bin/env python3
"""
ladder_report.py: the findings of a scale ladder (study/ladder.py) against tokens, and the
rate sweep that chose each arm's rate.

    python -m study ladder report studies/ladders/cpu.toml [--out DIR]
    python -m study sweep studies/ladder_cpu_lr.toml [--out DIR]

`report` reads every rung's runs (OUT/rung-TOKENS/runs/*/log.jsonl and status.json, through
study/runs.py) and writes OUT/report/ladder.md with PNG figures; `sweep` reads one study
with a rate grid and writes the final loss per arm and rate, and each arm's best rate.

The verdicts are fixed here, before the ladder's runs (issue 31), and are not changed to fit
them. Numbers are final validation losses (nats per token, whole held-out documents) unless
said otherwise; a gap is SAN minus partner, paired by seed (same seed: same initialisation
and data order), its mean and sd over the seeds. The noise floor of a rung is the larger of the
pooled seed-to-seed sd of the arms' losses and |SAN - SAN-RMSNorm| (the paper's
optimizer-equivalence control) where that rung has the control. "Resolved" means larger than
both twice its own sd over seeds and the noise floor.

  Gap ordering (SAN paper finding 1: iso-depth > iso-FLOP > iso-param, SAN behind each).
    At a rung it *shows* when all three gaps are resolved and positive and both ordering margins
    (iso-depth - iso-FLOP, iso-FLOP - iso-param, paired by seed) are resolved and positive.
  iso-param gap shrinks with tokens (paper: 0.046 at 5B, 0.019 at 30B, 0.005 at 105B).
    *shows* when it is positive at every rung and falls from each rung to the next by more than
    twice the larger of the two rungs' sds and the larger floor.
  Localisation (finding 2: the SAN's deficit against its iso-param partner sits on query
    tokens), on held-out and, separately, training documents. At a rung it *shows* when the
    query delta exceeds the trace and the answer deltas, both margins resolved.
  Spectra (finding 3: routing matrices W_q, W_k freeze early, content matrices keep gaining
    stable rank, in the SAN most on W_o). Per run, the relative change of the layer-mean stable
    rank from the 25% milestone to the end; the margin = max(W_v, W_o) - max(W_q, W_k). At a
    rung it *shows* when the margin is positive in every seed and the SAN's W_o grows more than
    its iso-param partner's in every seed.
  Uniform variants behind standard attention, the hybrids recover (Deconstructing Attention).
    At a rung it *shows* when every uniform arm is behind standard by more than the floor,
    mlp-uniform the most, and every hybrid recovers at least half of its uniform arm's gap. With
    one seed the floor is the one the ladder file states ([ladder].deconstructing.floor).

For a finding over the ladder: *shows* when it shows at the largest rung that ran; *trend*
when not, but its quantity moved the paper's way from the second-largest to the largest rung
that ran (the smallest of the three gaps and two ordering margins grew; the iso-param gap's
size, |gap|, fell; the smallest localisation margin grew; the spectra margin grew; the smallest
uniform gap and the hybrids' recovery grew); *does not show* otherwise, and *cannot tell* when
the runs are missing.

Amended 2026-12-04, when the tuned CPU ladder gave the first negative gaps (the SAN ahead of
its partners): the rules above had been written for a SAN behind. The gap ordering's trend
quantity was the smaller ordering margin alone, which grows while every gap stays negative; the
iso-param gap's trend was "fell", which a negative gap moving away from zero also does, and its
*shows* did not ask for positive gaps. Both amendments only make a verdict harder to reach, and
the first ladder's verdicts (doc/study-runs/2026-12-03-ladder-cpu.md) are the same under them.

Gates and hidden-state effective ranks are reported against tokens without a verdict (the paper
gives them as diagnostics; "neutral for loss" needs a residual-ablation arm this ladder does not
have).
"""
import argparse
import glob
import math
import os
import sys

from study import ladder as ladder_files  # noqa: E402
from study import runs as run_files  # noqa: E402
from study import runner as study_runner  # noqa: E402

REGIONS = ("query", "trace", "answer")
PAPER_GAPS = {"iso_depth": 0.47, "iso_flop": 0.26, "iso_param": 0.005}
ROLES = {"iso_depth": "iso-depth", "iso_flop": "iso-FLOP", "iso_param": "iso-param"}


# ----------------------------------------------------------------------------------------
# numbers

def mean_sd(values):
    values = [v for v in values if v is not None]
    if not values:
        return None, None
    n = len(values)
    mean = sum(values) / n
    return mean, (math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1)) if n > 1 else None)


def resolved(mean, sd, floor):
    """Larger than twice its sd over seeds and than the noise floor; never with one seed (no sd)
    or without a floor."""
    return mean is not None and sd is not None and floor is not None and mean > 2 * sd and mean > floor


class RunData:
    """One run's final validation record (None unless it finished), read through run_files."""

    def __init__(self, run, steps):
        self.run = run
        started = os.path.exists(os.path.join(run.dir, "log.jsonl"))
        self.state = (run_files.read_status(run) or {}).get("state", "unfinished" if started else "not run")
        train, self.val = run_files.read_log(os.path.join(run.dir, "log.jsonl"))
        self.train = train
        self.final = self.val[-1] if self.val and self.state == "done" and self.val[-1]["step"] == steps else None
        self.ms = [r["ms"] for r in train[1:] if "ms" in r]

    def value(self, key, docs="held_out"):
        if self.final is None:
            return None
        rec = self.final if docs == "held_out" else self.final.get("train_docs", {})
        return rec.get(key)


class Rung:
    def __init__(self, tokens, path):
        self.tokens = tokens
        self.study = study_runner.load_study(path)
        self.runs = [RunData(r, self.study.steps) for r in self.study.runs]

    def arm_runs(self, name):
        """{seed: RunData} of the arm's finished runs (the ladder trains each arm at one rate)."""
        return {d.run.seed: d for d in self.runs if d.run.arm.name == name and d.final is not None}

    def has_arm(self, name):
        return self.study.arm(name) is not None

    def arm_mean(self, name, key="val_loss", docs="held_out"):
        return mean_sd([d.value(key, docs) for d in self.arm_runs(name).values()])

    def paired(self, a, b, key="val_loss", docs="held_out"):
        """(mean, sd, n) over seeds of a - b, paired by seed."""
        ra, rb = self.arm_runs(a), self.arm_runs(b)
        diffs = [ra[s].value(key, docs) - rb[s].value(key, docs) for s in sorted(set(ra) & set(rb))
                 if ra[s].value(key, docs) is not None and rb[s].value(key, docs) is not None]
        m, sd = mean_sd(diffs)
        return m, sd, len(diffs)

    def pooled_sd(self, names):
        num = den = 0.0
        for name in names:
            values = [d.final["val_loss"] for d in self.arm_runs(name).values()]
            if len(values) > 1:
                _, sd = mean_sd(values)
                num += (len(values) - 1) * sd ** 2
                den += len(values) - 1
        return math.sqrt(num / den) if den else None


def noise_floor(rung, names, control=None):
    """(floor, pooled sd, |control delta| or None)."""
    pooled = rung.pooled_sd(names)
    ctl = None
    if control and rung.has_arm(control[1]) and rung.arm_runs(control[1]):
        m, _, _ = rung.paired(control[0], control[1])
        ctl = abs(m) if m is not None else None
    parts = [x for x in (pooled, ctl) if x is not None]
    return (max(parts) if parts else None), pooled, ctl


def verdict_over_ladder(per_rung, shows, quantity):
    """per_rung: [(tokens, value)] of the rungs that could be judged; shows(value) -> bool;
    quantity(value) -> the number that moves the paper's way when it grows."""
    if not per_rung:
        return "cannot tell"
    if shows(per_rung[-1][1]):
        return "shows"
    if len(per_rung) >= 2:
        a, b = quantity(per_rung[-2][1]), quantity(per_rung[-1][1])
        if a is not None and b is not None and b > a:
            return "trend"
    return "does not show"


def fmt(x, digits=4, signed=True):
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "—"
    return f"{x:+.{digits}f}" if signed else f"{x:.{digits}f}"


def pm(m, sd, digits=4):
    if m is None:
        return "—"
    return fmt(m, digits) + (f" ± {sd:.{digits}f}" if sd is not None else "")


def table(header, rows):
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return lines


# ----------------------------------------------------------------------------------------
# the findings

def gap_ordering(rung, f, floor):
    """{role: (mean, sd, n)} of SAN - partner, the ordering margins, and whether it shows."""
    g = {role: rung.paired(f["san"], f[role]) for role in ROLES}
    if any(v[0] is None for v in g.values()):
        return None
    m1 = rung.paired(f["iso_flop"], f["iso_depth"])  # iso-depth gap - iso-FLOP gap = FLOP arm - depth arm
    m2 = rung.paired(f["iso_param"], f["iso_flop"])   # iso-FLOP gap - iso-param gap
    ok = all(resolved(v[0], v[1], floor) for v in g.values()) and all(resolved(m[0], m[1], floor) for m in (m1, m2))
    return {"gaps": g, "margins": (m1, m2), "shows": ok, "floor": floor}


def localisation(rung, san, ffn, docs, floor):
    d = {r: rung.paired(san, ffn, f"val_loss_{r}", docs) for r in REGIONS}
    if any(v[0] is None for v in d.values()):
        return None
    margins = {}
    for r in ("trace", "answer"):
        ra, rb = rung.arm_runs(san), rung.arm_runs(ffn)
        diffs = []
        for s in sorted(set(ra) & set(rb)):
            dq = ra[s].value("val_loss_query", docs) - rb[s].value("val_loss_query", docs)
            dr = ra[s].value(f"val_loss_{r}", docs) - rb[s].value(f"val_loss_{r}", docs)
            diffs.append(dq - dr)
        margins[r] = mean_sd(diffs)
    ok = all(resolved(m, sd, floor) for m, sd in margins.values())
    overall = rung.paired(san, ffn, "val_loss", docs)
    return {"deltas": d, "margins": margins, "shows": ok, "overall": overall}


def _spectra_growth(run_dir):
    """{kind: relative change of the layer-mean stable rank from the 25% milestone to the last}."""
    from study import spectra
    paths = sorted(glob.glob(os.path.join(run_dir, "ckpt", "milestone_*.bin")))
    if len(paths) < 3:
        return None
    series = sorted((spectra.checkpoint_spectra(p) for p in paths), key=lambda r: r["step"])
    out = {}
    for kind in ("attn.wq", "attn.wk", "attn.wv", "attn.wo"):
        if kind in series[1]["stable_rank"]:
            a = spectra.layer_mean(series[1]["stable_rank"][kind])
            b = spectra.layer_mean(series[-1]["stable_rank"][kind])
            out[kind] = (b - a) / a
    return out


def spectra_finding(rung, san, ffn):
    rows = []
    for seed, d in sorted(rung.arm_runs(san).items()):
        g = _spectra_growth(d.run.dir)
        partner = rung.arm_runs(ffn).get(seed)
        gf = _spectra_growth(partner.run.dir) if partner else None
        if g is None:
            continue
        margin = max(g["attn.wv"], g["attn.wo"]) - max(g["attn.wq"], g["attn.wk"])
        rows.append({"seed": seed, "growth": g, "margin": margin, "ffn_wo": gf["attn.wo"] if gf else None})
    if not rows:
        return None
    ok = all(r["margin"] > 0 and r["ffn_wo"] is not None and r["growth"]["attn.wo"] > r["ffn_wo"] for r in rows)
    return {"rows": rows, "shows": ok, "margin": mean_sd([r["margin"] for r in rows])}


def deconstructing(rung, standard, kinds, floor):
    """{kind: (uniform delta, hybrid delta)} vs standard (seed means), and whether it shows."""
    std, _ = rung.arm_mean(standard)
    if std is None:
        return None
    d = {}
    for kind in kinds:
        u, _ = rung.arm_mean(f"{kind}-uniform")
        h, _ = rung.arm_mean(f"{kind}-hybrid")
        d[kind] = (u - std if u is not None else None, h - std if h is not None else None)
    have = {k: v for k, v in d.items() if v[0] is not None and v[1] is not None}
    if "mlp" not in have:
        return {"deltas": d, "shows": None, "standard": std}
    if floor is None:
        return {"deltas": d, "shows": None, "standard": std}
    fl = floor
    ok = (all(u > fl for u, _ in have.values()) and all(have["mlp"][0] >= u for u, _ in have.values())
          and all(h <= 0.5 * u for u, h in have.values()))
    recovery = min((u - h) / u for u, h in have.values() if u > 0) if any(u > 0 for u, _ in have.values()) else None
    return {"deltas": d, "shows": ok, "standard": std, "min_uniform": min(u for u, _ in have.values()),
            "recovery": recovery}


def indicator_mean(per_layer, locfoc=False):
    """The mean of an indicator over the layers that have it (null: no attention matrix) and
    their heads; attn_locfoc [layer][N][head] at N = 0."""
    values = []
    for layer in per_layer or []:
        if layer is None:
            continue
        if locfoc:
            layer = layer[0]
        values += layer if isinstance(layer, list) else [layer]
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


# ----------------------------------------------------------------------------------------
# plots

def _plt():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def plot_gaps(points, floors, out):
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for i, role in enumerate(ROLES):
        xs = [t for t, r in points]
        ys = [r["gaps"][role][0] for t, r in points]
        es = [r["gaps"][role][1] or 0.0 for t, r in points]
        ax.errorbar(xs, ys, yerr=es, marker="o", capsize=3, color=f"C{i}", label=f"SAN − {ROLES[role]}")
        ax.axhline(PAPER_GAPS[role], color=f"C{i}", ls=":", lw=0.8)
    ft = [t for t, fl in floors if fl is not None]
    fv = [fl for t, fl in floors if fl is not None]
    if ft:
        ax.fill_between(ft, [-v for v in fv], fv, color="grey", alpha=0.25, label="noise floor")
    ax.axhline(0, color="black", lw=0.5)
    ax.set(xscale="log", xlabel="training tokens per run", ylabel="final val loss gap (nats)",
           title="SAN − partner (dotted: the paper at 105B tokens)")
    ax.legend(fontsize=8)
    return _save(fig, out, "gaps_vs_tokens.png")


def plot_regions(points, floors, out):
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    for ax, docs in zip(axes, ("held_out", "train_docs")):
        pts = [(t, r[docs]) for t, r in points if r.get(docs)]
        for i, region in enumerate(REGIONS):
            ax.errorbar([t for t, _ in pts], [r["deltas"][region][0] for _, r in pts],
                        yerr=[r["deltas"][region][1] or 0.0 for _, r in pts], marker="o", capsize=3,
                        color=f"C{i}", label=region)
        ft = [t for t, fl in floors if fl is not None]
        fv = [fl for t, fl in floors if fl is not None]
        if ft:
            ax.fill_between(ft, [-v for v in fv], fv, color="grey", alpha=0.25, label="noise floor")
        ax.axhline(0, color="black", lw=0.5)
        ax.set(xscale="log", xlabel="training tokens per run",
               title="held-out documents" if docs == "held_out" else "training documents")
    axes[0].set_ylabel("SAN − iso-param, per region (nats)")
    axes[0].legend(fontsize=8)
    return _save(fig, out, "regions_vs_tokens.png")


def plot_measurements(rungs, arms, out):
    plt = _plt()
    keys = [("gate_attn_mean", "attention gate (mean over layers)"), ("gate_ffn_mean", "FFN gate (mean over layers)"),
            ("erank_mean", "hidden-state effective rank (mean)")]
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    for ax, (key, title) in zip(axes, keys):
        for i, arm in enumerate(arms):
            xs, ys, es = [], [], []
            for rung in rungs:
                m, sd = rung.arm_mean(arm, key)
                if m is not None:
                    xs.append(rung.tokens)
                    ys.append(m)
                    es.append(sd or 0.0)
            if xs:
                ax.errorbar(xs, ys, yerr=es, marker="o", capsize=3, color=f"C{i}", label=arm)
        ax.set(xscale="log", xlabel="training tokens per run", title=title)
    axes[0].legend(fontsize=8)
    return _save(fig, out, "measurements_vs_tokens.png")


def plot_deconstructing(points, out):
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    kinds = list(points[0][1]["deltas"]) if points else []
    for ax, which, title in ((axes[0], 0, "uniform − standard"), (axes[1], 1, "hybrid − standard")):
        for i, kind in enumerate(kinds):
            pts = [(t, r["deltas"][kind][which]) for t, r in points if r["deltas"][kind][which] is not None]
            if pts:
                ax.plot([t for t, _ in pts], [v for _, v in pts], "o-", color=f"C{i}", label=kind)
        ax.axhline(0, color="black", lw=0.5)
        ax.set(xscale="log", xlabel="training tokens per run", title=title)
    axes[0].set_ylabel("final val loss Δ (nats)")
    axes[0].legend(fontsize=8)
    return _save(fig, out, "deconstructing_vs_tokens.png")


def plot_sweep(study, data, out, axis):
    """Final loss against the swept rate (`axis`: "lr" or "lr_other"), a line per arm (and per
    value of the other rate, for a 2-D grid)."""
    plt = _plt()
    many = len(study.arms) > 10   # past the default cycle's 10 colours: tab20, the legend beside the axes
    fig, ax = plt.subplots(figsize=(9.6, 4.8) if many else (6.4, 4.2))
    for i, arm in enumerate(study.arms):
        lines = {}
        for d in data:
            if d.run.arm is arm and d.final:
                x, other = (d.run.lr_other, d.run.lr) if axis == "lr_other" else d.run.rate_point
                lines.setdefault(other, []).append((x, d.final["val_loss"]))
        color = plt.cm.tab20(i % 20) if many else f"C{i}"
        for other, pts in sorted(lines.items(), key=lambda kv: run_files.rate_key(kv[0])):
            pts.sort()
            label = arm.name + (f" (other {other:g})" if len(lines) > 1 else "")
            ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", color=color, label=label)
    ax.set(xscale="log", xlabel=SWEEP_AXIS_LABEL[axis], ylabel="final val loss",
           title=f"{study.name}: {study.steps} steps x {study.tokens_per_step:,} tokens")
    if many:
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    else:
        ax.legend(fontsize=8)
    return _save(fig, out, "sweep.png")


SWEEP_AXIS_LABEL = {"lr": "peak rate of the matrices (--lr)",
                    "lr_other": "Muon's AdamW side: embedding, gains, gates (--lr-other)"}


def _save(fig, out, name):
    os.makedirs(out, exist_ok=True)
    fig.tight_layout()
    fig.savefig(os.path.join(out, name), dpi=110)
    _plt().close(fig)
    return name


# ----------------------------------------------------------------------------------------
# the reports

def load_rungs(path):
    raw, _, _, _, table_ = ladder_files.load_ladder(path)
    raw["ladder"] = table_
    rungs = [Rung(t, f) for t, f in ladder_files.write_rung_files(path)]
    return raw, rungs


def _finding(raw, kind):
    for f in raw.get("finding", []):
        if f["kind"] == kind:
            return f
    return None


def runs_table(rungs):
    rows = []
    for rung in rungs:
        for d in rung.runs:
            ms = sum(d.ms) / len(d.ms) if d.ms else None
            rows.append([f"{rung.tokens:,}", d.run.id, d.state,
                         f"{d.train[-1]['step'] if d.train else 0}/{rung.study.steps}",
                         fmt(d.final["val_loss"], signed=False) if d.final else "—",
                         f"{ms:.0f}" if ms else "—"])
    return table(["rung (tokens)", "run", "state", "steps", "final val loss", "ms/step"], rows)


def write_report(path, out=None):
    raw, rungs = load_rungs(path)
    out = out or os.path.join(raw["study"].get("out", "logs"), "report")
    os.makedirs(out, exist_ok=True)
    lines = [f"# Scale ladder: {raw['study']['name']}", "", raw["study"].get("note", ""), "",
             f"Ladder file `{path}`; rungs " + ", ".join(f"{r.tokens:,}" for r in rungs)
             + " tokens per run. Verdict rules: study/ladder_report.py (fixed before the runs).", ""]
    lines += ["## Runs", ""] + runs_table(rungs) + [""]

    fg = _finding(raw, "gap_ordering")
    fc = raw["ladder"].get("norm_control")
    quartet = [fg[r] for r in ("san", "iso_depth", "iso_flop", "iso_param")] if fg else []
    floors, gap_points = [], []
    lines += ["## Noise floor", "",
              "Pooled seed-to-seed sd of the four arms' final losses, and |SAN − SAN-RMSNorm| (ZCN vs RMSNorm, "
              "no decay on gains: the paper's optimizer-equivalence control, 0.0015 nats there) where the rung has it; "
              "the floor is the larger.", ""]
    rows = []
    for rung in rungs:
        fl, pooled, ctl = noise_floor(rung, quartet, (fc["zcn"], fc["rms"]) if fc else None)
        floors.append((rung.tokens, fl))
        rows.append([f"{rung.tokens:,}", fmt(pooled, signed=False), fmt(ctl, signed=False), fmt(fl, signed=False)])
    lines += table(["rung", "pooled seed sd", "|ZCN − RMSNorm|", "floor"], rows) + [""]
    floor_of = dict(floors)

    verdicts = []
    if fg:
        lines += ["## Gap ordering (SAN paper finding 1)", "",
                  "SAN − partner, final validation loss, mean ± sd over seeds (paired by seed); paper at 105B tokens: "
                  "iso-depth +0.47, iso-FLOP +0.26, iso-param +0.005 (0.046 at 5B, 0.019 at 30B).", ""]
        rows = []
        for rung in rungs:
            r = gap_ordering(rung, fg, floor_of[rung.tokens])
            if r is None:
                continue
            gap_points.append((rung.tokens, r))
            g, (m1, m2) = r["gaps"], r["margins"]
            rows.append([f"{rung.tokens:,}", *(pm(g[k][0], g[k][1]) for k in ROLES), pm(m1[0], m1[1]), pm(m2[0], m2[1]),
                         str(g["iso_param"][2]), "shows" if r["shows"] else "no"])
        lines += table(["rung", "iso-depth", "iso-FLOP", "iso-param", "depth − FLOP", "FLOP − param", "seeds",
                        "shows at rung"], rows) + [""]
        if gap_points:
            lines += [f"![gaps]({plot_gaps(gap_points, floors, out)})", ""]
        # the trend's quantity: the smallest of the five numbers that must all be positive to show
        v = verdict_over_ladder(gap_points, lambda r: r["shows"],
                                lambda r: min([r["margins"][0][0], r["margins"][1][0]]
                                              + [r["gaps"][k][0] for k in ("iso_depth", "iso_flop", "iso_param")]))
        verdicts.append(("Gap ordering iso-depth > iso-FLOP > iso-param", v))
        # the iso-param gap falls with tokens, from above zero (the SAN behind its partner)
        pts = [(t, r["gaps"]["iso_param"]) for t, r in gap_points]
        falls = len(pts) >= 2 and all(b[0] > 0 for _, b in pts) and all(
            a[0] - b[0] > max(2 * max(a[1] or 0, b[1] or 0), floor_of[ta] or 0, floor_of[tb] or 0)
            for (ta, a), (tb, b) in zip(pts, pts[1:]))
        if len(pts) < 2:
            v2 = "cannot tell"
        elif falls:
            v2 = "shows"
        elif abs(pts[-1][1][0]) < abs(pts[-2][1][0]):
            v2 = "trend"
        else:
            v2 = "does not show"
        verdicts.append(("iso-param gap shrinks with tokens", v2))

    fl_ = _finding(raw, "localisation")
    if fl_:
        lines += ["## Localisation (SAN paper finding 2)", "",
                  f"SAN − {fl_['ffn']} per region (mean ± sd over seeds), and the query margins (query delta minus "
                  "the trace / answer delta).", ""]
        reg_points = []
        for docs, title in (("held_out", "held-out documents"), ("train_docs", "training documents (--train-doc-eval)")):
            rows, pts = [], []
            for rung in rungs:
                r = localisation(rung, fl_["san"], fl_["ffn"], docs, floor_of[rung.tokens])
                if r is None:
                    continue
                pts.append((rung.tokens, r))
                rows.append([f"{rung.tokens:,}", pm(*r["overall"][:2]), *(pm(*r["deltas"][k][:2]) for k in REGIONS),
                             pm(*r["margins"]["trace"]), pm(*r["margins"]["answer"]), "shows" if r["shows"] else "no"])
            lines += [f"{title}:", ""] + table(["rung", "overall", "query", "trace", "answer", "query − trace",
                                                "query − answer", "shows at rung"], rows) + [""]
            for t, r in pts:
                for p in reg_points:
                    if p[0] == t:
                        p[1][docs] = r
                        break
                else:
                    reg_points.append((t, {docs: r}))
            v = verdict_over_ladder(pts, lambda r: r["shows"],
                                    lambda r: min(r["margins"]["trace"][0], r["margins"]["answer"][0]))
            verdicts.append((f"Localisation on query tokens ({title.split(' (')[0]})", v))
        if reg_points:
            lines += [f"![regions]({plot_regions(reg_points, floors, out)})", ""]

    fs = _finding(raw, "spectra")
    if fs:
        lines += ["## Spectra (SAN paper finding 3)", "",
                  f"Relative change of the layer-mean stable rank from the 25% milestone to the end, per seed of "
                  f"{fs['san']}; margin = max(W_v, W_o) − max(W_q, W_k); W_o of {fs['ffn']} beside it.", ""]
        rows, pts = [], []
        for rung in rungs:
            r = spectra_finding(rung, fs["san"], fs["ffn"])
            if r is None:
                continue
            pts.append((rung.tokens, r))
            for row in r["rows"]:
                g = row["growth"]
                rows.append([f"{rung.tokens:,}", row["seed"], *(f"{g[k]:+.1%}" for k in ("attn.wq", "attn.wk", "attn.wv", "attn.wo")),
                             f"{row['margin']:+.1%}", f"{row['ffn_wo']:+.1%}" if row["ffn_wo"] is not None else "—",
                             "shows" if r["shows"] else "no"])
        lines += table(["rung", "seed", "W_q", "W_k", "W_v", "W_o", "margin", "FFN W_o", "shows at rung"], rows) + [""]
        verdicts.append(("Spectra: routing freezes, content (W_o) keeps gaining",
                         verdict_over_ladder(pts, lambda r: r["shows"], lambda r: r["margin"][0])))

    meas_arms = quartet + ([fc["rms"]] if fc else [])
    if quartet:
        lines += ["## Gates and effective rank", "",
                  "At the final validation, mean over layers, mean ± sd over seeds (no verdict: diagnostics).", ""]
        rows = []
        for rung in rungs:
            for arm in meas_arms:
                if not rung.has_arm(arm) or not rung.arm_runs(arm):
                    continue
                rows.append([f"{rung.tokens:,}", arm, *(pm(*rung.arm_mean(arm, k), digits=3).lstrip("+")
                                                        for k in ("gate_attn_mean", "gate_ffn_mean", "erank_mean"))])
        lines += table(["rung", "arm", "attn gate", "ffn gate", "effective rank"], rows) + [""]
        lines += [f"![measurements]({plot_measurements(rungs, meas_arms, out)})", ""]

    fd = raw["ladder"].get("deconstructing")
    if fd:
        kinds = fd["kinds"]
        lines += ["## Deconstructing Attention: each kind, uniform and hybrid, against standard", "",
                  "Final validation loss Δ vs the standard arm (seed means).", ""]
        rows, pts = [], []
        for rung in rungs:
            # one seed: the floor is the ladder file's stated one (or this rung's, with seeds)
            r = deconstructing(rung, fd["standard"], kinds, fd.get("floor", floor_of.get(rung.tokens)))
            if r is None:
                continue
            pts.append((rung.tokens, r))
            for k in kinds:
                u, h = r["deltas"][k]
                rows.append([f"{rung.tokens:,}", k, fmt(u), fmt(h)])
        lines += table(["rung", "kind", "uniform − standard", "hybrid − standard"], rows) + [""]
        if pts:
            lines += [f"![deconstructing]({plot_deconstructing(pts, out)})", ""]
        lines += ["Attention-pattern indicators at the final validation (doc/deconstructing.md \"Attention-pattern "
                  "indicators\"), the mean over the layers that have an attention matrix and their heads; local focus "
                  "at distance 0 (the diagonal).", ""]
        rows = []
        for rung in rungs:
            for arm in [fd["standard"]] + [f"{k}-{l}" for k in kinds for l in ("uniform", "hybrid")]:
                runs = rung.arm_runs(arm)
                if not runs:
                    continue
                rec = runs[min(runs)].final
                rows.append([f"{rung.tokens:,}", arm] + [fmt(indicator_mean(rec.get(k), k == "attn_locfoc"), 3, False)
                                                         for k in ("attn_entropy", "attn_conc", "attn_sink", "attn_headdiv",
                                                                   "attn_locfoc")])
        lines += table(["rung", "arm", "entropy", "concentration", "sink", "head diversity", "local focus (N=0)"],
                       rows) + [""]
        judged = [(t, r) for t, r in pts if r["shows"] is not None]
        verdicts.append(("Uniform variants behind standard (mlp most), hybrids recover",
                         verdict_over_ladder(judged, lambda r: r["shows"], lambda r: r["min_uniform"])))

    lines += ["## Verdicts", ""] + table(["finding", "verdict"], verdicts) + [""]
    with open(os.path.join(out, "ladder.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    return os.path.join(out, "ladder.md"), verdicts


def write_sweep(path, out=None):
    """The sweep's table and figure: final loss per arm and rate point (lr, lr_other), the best of
    each arm, and whether it lies at the edge of the arm's grid in a rate the arm sweeps. Returns
    (path, {arm: (rate point, loss, edge)})."""
    study = study_runner.load_study(path)
    data = [RunData(r, study.steps) for r in study.runs]
    out = out or os.path.join(study.out, "report-sweep")
    os.makedirs(out, exist_ok=True)
    points = sorted({d.run.rate_point for d in data}, key=run_files.rate_order)
    axis = run_files.swept_axis(study.arms)
    lines = [f"# Rate sweep: {study.name}", "", study.note, "",
             f"{study.steps} steps x {study.tokens_per_step:,} tokens; final validation loss per arm and peak rate "
             "(one seed; * = the arm's best; an edge best says the grid should be extended).", ""]
    rows, best = [], {}
    for arm in study.arms:
        losses = {d.run.rate_point: d.final["val_loss"] for d in data if d.run.arm is arm and d.final}
        states = {d.run.rate_point: d.state for d in data if d.run.arm is arm}
        if losses:
            b = min(losses, key=losses.get)
            edge = any(len(grid) > 1 and x in (min(grid), max(grid)) for x, grid in zip(b, (arm.lrs, arm.lr_others)))
            best[arm.name] = (b, losses[b], edge)
        rows.append((arm, {p: (f"{losses[p]:.4f}" + ("*" if best.get(arm.name, (None,))[0] == p else ""))
                           if p in losses else states.get(p, "—") for p in points}))
    # a column per value of the swept rate and the arm's fixed other rate beside it, when every arm
    # sweeps that rate alone; else a column per rate point
    k = 1 if axis == "lr_other" else 0
    fixed_grid = (lambda arm: arm.lr_others) if k == 0 else (lambda arm: arm.lrs)
    if all(len(fixed_grid(arm)) == 1 for arm, _ in rows):
        values = sorted({p[k] for p in points}, key=run_files.rate_key)
        fixed = ("--lr", "--lr-other")[1 - k]
        show_fixed = any(p[1 - k] is not None for p in points)
        header = ["arm"] + ([fixed] if show_fixed else []) + [run_files.rate_text(v) for v in values]
        body = []
        for arm, cells in rows:
            other = fixed_grid(arm)[0]
            by_value = {p[k]: c for p, c in cells.items() if p[1 - k] == other}
            body.append([arm.name] + ([run_files.rate_text(other)] if show_fixed else [])
                        + [by_value.get(v, "—") for v in values])
        lines += [f"Columns: {('--lr', '--lr-other')[k]}.", ""]
        lines += table(header, body) + [""]
    else:
        lines += table(["arm"] + [run_files.rate_label(p) for p in points],
                       [[arm.name] + [cells.get(p, "—") for p in points] for arm, cells in rows]) + [""]
    lines += [f"- {a}: best {run_files.rate_label(b)} ({loss:.4f})" + (" — at the grid's edge" if edge else "")
              for a, (b, loss, edge) in best.items()]
    lines += ["", f"![sweep]({plot_sweep(study, data, out, axis)})", ""]
    with open(os.path.join(out, "sweep.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    return os.path.join(out, "sweep.md"), best


def main(argv=None):
    ap = argparse.ArgumentParser(description="Reports a scale ladder (study/ladder.py) or a rate sweep.")
    ap.add_argument("command", choices=("report", "sweep"))
    ap.add_argument("file", help="the ladder file (report) or the sweep's study file (sweep)")
    ap.add_argument("--out", help="report directory")
    args = ap.parse_args(argv)
    try:
        if args.command == "report":
            path, verdicts = write_report(args.file, args.out)
            for name, v in verdicts:
                print(f"  {name}: {v}")
        else:
            path, best = write_sweep(args.file, args.out)
            for name, (point, loss, edge) in best.items():
                print(f"  {name}: {run_files.rate_label(point)} ({loss:.4f})" + (" at the grid's edge" if edge else ""))
    except (ladder_files.LadderError, study_runner.StudyError) as e:
        sys.stderr.write(f"ladder_report.py: {e}\n")
        return 2
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
