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
    query delta is positive (the SAN behind on query tokens: the study report's rule too) and
    exceeds the trace and the answer deltas, both margins resolved.
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

Each rule is one function of study/findings.py, which study/report.py judges a single study
with too; how the rules were amended, when and why: doc/study-runs/README.md ("Verdict rules").

Gates and hidden-state effective ranks are reported against tokens without a verdict (the paper
gives them as diagnostics; "neutral for loss" needs a residual-ablation arm this ladder does not
have).
"""
import argparse
import glob
import os
import sys

from study import findings
from study import ladder as ladder_files
from study import runs as run_files
from study import runner as study_runner
from study.findings import Diff, paired
from study.plots import figure_legend, plt, save
from study.runs import RunData
from study.tables import fmt, mean_sd, pm, table

REGIONS = ("query", "trace", "answer")
PAPER_GAPS = {"iso_depth": 0.47, "iso_flop": 0.26, "iso_param": 0.005}
ROLES = {"iso_depth": "iso-depth", "iso_flop": "iso-FLOP", "iso_param": "iso-param"}


# ----------------------------------------------------------------------------------------
# numbers

class Rung:
    def __init__(self, tokens, path):
        self.tokens = tokens
        self.study = study_runner.load_study(path)
        self.runs = [RunData(r, final_step=self.study.steps) for r in self.study.runs]

    def arm_runs(self, name):
        """{seed: RunData} of the arm's finished runs (the ladder trains each arm at one rate)."""
        return {d.run.seed: d for d in self.runs if d.run.arm.name == name and d.final is not None}

    def has_arm(self, name):
        return self.study.arm(name) is not None

    def arm_mean(self, name, key="val_loss", docs="held_out"):
        return mean_sd([d.value(key, docs) for d in self.arm_runs(name).values()])

    def values(self, name, key="val_loss", docs="held_out"):
        """{seed: a key of the arm's final validation} (findings.paired pairs them by seed)."""
        return {seed: d.value(key, docs) for seed, d in self.arm_runs(name).items()}

    def paired(self, a, b, key="val_loss", docs="held_out"):
        """Diff (mean, sd, n) over seeds of a - b, paired by seed."""
        return paired(self.values(a, key, docs), self.values(b, key, docs))

    def pooled_sd(self, names):
        return findings.pooled_sd([[d.final["val_loss"] for d in self.arm_runs(name).values()] for name in names])


def noise_floor(rung, names, control=None):
    """(floor, pooled sd, |control delta| or None)."""
    pooled = rung.pooled_sd(names)
    ctl = None
    if control and rung.has_arm(control[1]) and rung.arm_runs(control[1]):
        m, _, _ = rung.paired(control[0], control[1])
        ctl = abs(m) if m is not None else None
    parts = [x for x in (pooled, ctl) if x is not None]
    return (max(parts) if parts else None), pooled, ctl


# ----------------------------------------------------------------------------------------
# the findings

def gap_ordering(rung, f, floor):
    """{role: (mean, sd, n)} of SAN - partner, the ordering margins, and whether it shows."""
    g = {role: rung.paired(f["san"], f[role]) for role in ROLES}
    if any(v[0] is None for v in g.values()):
        return None
    m1 = rung.paired(f["iso_flop"], f["iso_depth"])  # iso-depth gap - iso-FLOP gap = FLOP arm - depth arm
    m2 = rung.paired(f["iso_param"], f["iso_flop"])   # iso-FLOP gap - iso-param gap
    ok = findings.gap_ordering(g, (m1, m2), findings.resolved_against(floor)).shows
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
    _, ok = findings.localisation(d["query"], {r: Diff(m, sd, None) for r, (m, sd) in margins.items()},
                                  findings.resolved_against(floor))
    overall = rung.paired(san, ffn, "val_loss", docs)
    return {"deltas": d, "margins": margins, "shows": ok, "overall": overall}


def _spectra_growth(run_dir):
    """{kind: relative change of the layer-mean stable rank from the 25% milestone to the last}."""
    from study import spectra
    paths = sorted(glob.glob(os.path.join(run_dir, "ckpt", "milestone_*.bin")))
    if len(paths) < 3:
        return None
    series = sorted((spectra.checkpoint_spectra(p) for p in paths), key=lambda r: r["step"])
    return findings.stable_rank_growth(series, spectra.layer_mean)


def spectra_finding(rung, san, ffn):
    rows = []
    for seed, d in sorted(rung.arm_runs(san).items()):
        g = _spectra_growth(d.run.dir)
        partner = rung.arm_runs(ffn).get(seed)
        gf = _spectra_growth(partner.run.dir) if partner else None
        if g is None:
            continue
        rows.append({"seed": seed, "growth": g, "margin": findings.spectra_margin(g),
                     "ffn_wo": gf["attn.wo"] if gf else None})
    if not rows:
        return None
    ok = all(findings.spectra_shows(r["growth"], r["ffn_wo"], partner_needed=True) for r in rows)
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
    if "mlp" not in have or floor is None:
        return {"deltas": d, "shows": None, "standard": std}
    ok = findings.variants_behind(have, lambda u: u > floor)
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

def plot_gaps(points, floors, out):
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
    return save(fig, out, "gaps_vs_tokens.png")


def plot_regions(points, floors, out):
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.4), sharey=True, layout="constrained")
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
    figure_legend(fig, axes)
    return save(fig, out, "regions_vs_tokens.png", tight=False)


def plot_measurements(rungs, arms, out):
    keys = [("gate_attn_mean", "attention gate (mean over layers)", "gate value"),
            ("gate_ffn_mean", "FFN gate (mean over layers)", "gate value"),
            ("erank_mean", "hidden-state effective rank (mean)", "effective rank (dimensions)")]
    fig, axes = plt.subplots(1, 3, figsize=(14, 4.4), layout="constrained")
    for ax, (key, title, ylabel) in zip(axes, keys):
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
        ax.set(xscale="log", xlabel="training tokens per run", ylabel=ylabel, title=title)
    figure_legend(fig, axes)  # (an arm without FFN gates is absent from that panel, not from the legend)
    return save(fig, out, "measurements_vs_tokens.png", tight=False)


def plot_deconstructing(points, out):
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.4), sharey=True, layout="constrained")
    kinds = list(points[0][1]["deltas"]) if points else []
    for ax, which, title in ((axes[0], 0, "uniform − standard"), (axes[1], 1, "hybrid − standard")):
        for i, kind in enumerate(kinds):
            pts = [(t, r["deltas"][kind][which]) for t, r in points if r["deltas"][kind][which] is not None]
            if pts:
                ax.plot([t for t, _ in pts], [v for _, v in pts], "o-", color=f"C{i}", label=kind)
        ax.axhline(0, color="black", lw=0.5)
        ax.set(xscale="log", xlabel="training tokens per run", title=title)
    axes[0].set_ylabel("final val loss Δ (nats)")
    figure_legend(fig, axes)
    return save(fig, out, "deconstructing_vs_tokens.png", tight=False)


def plot_sweep(study, data, out, axis):
    """Final loss against the swept rate (`axis`: "lr" or "lr_other"), a line per arm (and per
    value of the other rate, for a 2-D grid)."""
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
    ax.set(xscale="log", xlabel=SWEEP_AXIS_LABEL[axis], ylabel="final val loss (nats)",
           title=f"{study.name}: {study.steps} steps x {study.tokens_per_step:,} tokens")
    if many:
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    else:
        ax.legend(fontsize=8)
    return save(fig, out, "sweep.png")


SWEEP_AXIS_LABEL = {"lr": "peak rate of the matrices (--lr)",
                    "lr_other": "Muon's AdamW side: embedding, gains, gates (--lr-other)"}


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
    return [table(["rung (tokens)", "run", "state", "steps", "final val loss", "ms/step"], rows)]


class Ladder:
    """What every section of the ladder report reads: the ladder file's tables, its rungs, the
    output directory and each rung's noise floor (floors: [(tokens, floor)], floor_of by tokens)."""

    def __init__(self, path, out):
        self.path = path
        self.raw, self.rungs = load_rungs(path)
        self.out = out or os.path.join(self.raw["study"].get("out", "logs"), "report")
        self.control = self.raw["ladder"].get("norm_control")
        gaps = _finding(self.raw, "gap_ordering")
        self.quartet = [gaps[r] for r in ("san", "iso_depth", "iso_flop", "iso_param")] if gaps else []
        self.floors, self.floor_rows = [], []
        for rung in self.rungs:
            fl, pooled, ctl = noise_floor(rung, self.quartet, (self.control["zcn"], self.control["rms"])
                                          if self.control else None)
            self.floors.append((rung.tokens, fl))
            self.floor_rows.append([f"{rung.tokens:,}", fmt(pooled), fmt(ctl), fmt(fl)])
        self.floor_of = dict(self.floors)


def write_report(path, out=None):
    """ladder.md and its figures in `out` (default OUT/report); returns (its path, [(finding, verdict)])."""
    lad = Ladder(path, out)
    os.makedirs(lad.out, exist_ok=True)
    lines = [f"# Scale ladder: {lad.raw['study']['name']}", "", lad.raw["study"].get("note", ""), "",
             f"Ladder file `{path}`; rungs " + ", ".join(f"{r.tokens:,}" for r in lad.rungs)
             + " tokens per run. Verdict rules: study/ladder_report.py (fixed before the runs).", ""]
    lines += ["## Runs", ""] + runs_table(lad.rungs) + [""]
    lines += ["## Noise floor", "",
              "Pooled seed-to-seed sd of the four arms' final losses, and |SAN − SAN-RMSNorm| (ZCN vs RMSNorm, "
              "no decay on gains: the paper's optimizer-equivalence control, 0.0015 nats there) where the rung has it; "
              "the floor is the larger.", ""]
    lines += [table(["rung", "pooled seed sd", "|ZCN − RMSNorm|", "floor"], lad.floor_rows), ""]
    verdicts = []
    for section in (gap_sections, localisation_section, spectra_section, measurements_section,
                    deconstructing_section):
        lines += section(lad, verdicts)
    lines += ["## Verdicts", "", table(["finding", "verdict"], verdicts), ""]
    with open(os.path.join(lad.out, "ladder.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    return os.path.join(lad.out, "ladder.md"), verdicts


def gap_sections(lad, verdicts):
    """Finding 1 at each rung and over the ladder, and the iso-param gap's shrinking."""
    fg = _finding(lad.raw, "gap_ordering")
    if not fg:
        return []
    lines = ["## Gap ordering (SAN paper finding 1)", "",
             "SAN − partner, final validation loss, mean ± sd over seeds (paired by seed); paper at 105B tokens: "
             "iso-depth +0.47, iso-FLOP +0.26, iso-param +0.005 (0.046 at 5B, 0.019 at 30B).", ""]
    rows, gap_points = [], []
    for rung in lad.rungs:
        r = gap_ordering(rung, fg, lad.floor_of[rung.tokens])
        if r is None:
            continue
        gap_points.append((rung.tokens, r))
        g, (m1, m2) = r["gaps"], r["margins"]
        rows.append([f"{rung.tokens:,}", *(pm(g[k][0], g[k][1]) for k in ROLES), pm(m1[0], m1[1]), pm(m2[0], m2[1]),
                     str(g["iso_param"][2]), "shows" if r["shows"] else "no"])
    lines += [table(["rung", "iso-depth", "iso-FLOP", "iso-param", "depth − FLOP", "FLOP − param", "seeds",
                     "shows at rung"], rows), ""]
    if gap_points:
        lines += [f"![gaps]({plot_gaps(gap_points, lad.floors, lad.out)})", ""]
    # the trend's quantity: the smallest of the five numbers that must all be positive to show
    v = findings.over_ladder(gap_points, lambda r: r["shows"],
                             lambda r: min([r["margins"][0][0], r["margins"][1][0]]
                                           + [r["gaps"][k][0] for k in ("iso_depth", "iso_flop", "iso_param")]))
    verdicts.append(("Gap ordering iso-depth > iso-FLOP > iso-param", v))
    verdicts.append(("iso-param gap shrinks with tokens", iso_param_shrinks(gap_points, lad.floor_of)))
    return lines


def iso_param_shrinks(gap_points, floor_of):
    """The iso-param gap falls with tokens, from above zero (the SAN behind its partner)."""
    pts = [(t, r["gaps"]["iso_param"]) for t, r in gap_points]
    falls = len(pts) >= 2 and all(b[0] > 0 for _, b in pts) and all(
        a[0] - b[0] > max(2 * max(a[1] or 0, b[1] or 0), floor_of[ta] or 0, floor_of[tb] or 0)
        for (ta, a), (tb, b) in zip(pts, pts[1:]))
    if len(pts) < 2:
        return "cannot tell"
    if falls:
        return "shows"
    if abs(pts[-1][1][0]) < abs(pts[-2][1][0]):
        return "trend"
    return "does not show"


def localisation_section(lad, verdicts):
    """Finding 2 on held-out documents and, separately, on training documents."""
    fl_ = _finding(lad.raw, "localisation")
    if not fl_:
        return []
    lines = ["## Localisation (SAN paper finding 2)", "",
             f"SAN − {fl_['ffn']} per region (mean ± sd over seeds), and the query margins (query delta minus "
             "the trace / answer delta).", ""]
    reg_points = []
    for docs, title in (("held_out", "held-out documents"), ("train_docs", "training documents (--train-doc-eval)")):
        rows, pts = [], []
        for rung in lad.rungs:
            r = localisation(rung, fl_["san"], fl_["ffn"], docs, lad.floor_of[rung.tokens])
            if r is None:
                continue
            pts.append((rung.tokens, r))
            rows.append([f"{rung.tokens:,}", pm(*r["overall"][:2]), *(pm(*r["deltas"][k][:2]) for k in REGIONS),
                         pm(*r["margins"]["trace"]), pm(*r["margins"]["answer"]), "shows" if r["shows"] else "no"])
        lines += [f"{title}:", "", table(["rung", "overall", "query", "trace", "answer", "query − trace",
                                          "query − answer", "shows at rung"], rows), ""]
        for t, r in pts:
            for p in reg_points:
                if p[0] == t:
                    p[1][docs] = r
                    break
            else:
                reg_points.append((t, {docs: r}))
        v = findings.over_ladder(pts, lambda r: r["shows"],
                                 lambda r: min(r["margins"]["trace"][0], r["margins"]["answer"][0]))
        verdicts.append((f"Localisation on query tokens ({title.split(' (')[0]})", v))
    if reg_points:
        lines += [f"![regions]({plot_regions(reg_points, lad.floors, lad.out)})", ""]
    return lines


def spectra_section(lad, verdicts):
    fs = _finding(lad.raw, "spectra")
    if not fs:
        return []
    lines = ["## Spectra (SAN paper finding 3)", "",
             f"Relative change of the layer-mean stable rank from the 25% milestone to the end, per seed of "
             f"{fs['san']}; margin = max(W_v, W_o) − max(W_q, W_k); W_o of {fs['ffn']} beside it.", ""]
    rows, pts = [], []
    for rung in lad.rungs:
        r = spectra_finding(rung, fs["san"], fs["ffn"])
        if r is None:
            continue
        pts.append((rung.tokens, r))
        for row in r["rows"]:
            g = row["growth"]
            rows.append([f"{rung.tokens:,}", row["seed"], *(f"{g[k]:+.1%}" for k in findings.ATTENTION_MATRICES),
                         f"{row['margin']:+.1%}", f"{row['ffn_wo']:+.1%}" if row["ffn_wo"] is not None else "—",
                         "shows" if r["shows"] else "no"])
    lines += [table(["rung", "seed", "W_q", "W_k", "W_v", "W_o", "margin", "FFN W_o", "shows at rung"], rows), ""]
    verdicts.append(("Spectra: routing freezes, content (W_o) keeps gaining",
                     findings.over_ladder(pts, lambda r: r["shows"], lambda r: r["margin"][0])))
    return lines


def measurements_section(lad, verdicts):
    """Gates and effective ranks against tokens (diagnostics: no verdict)."""
    if not lad.quartet:
        return []
    meas_arms = lad.quartet + ([lad.control["rms"]] if lad.control else [])
    lines = ["## Gates and effective rank", "",
             "At the final validation, mean over layers, mean ± sd over seeds (no verdict: diagnostics).", ""]
    rows = []
    for rung in lad.rungs:
        for arm in meas_arms:
            if not rung.has_arm(arm) or not rung.arm_runs(arm):
                continue
            rows.append([f"{rung.tokens:,}", arm, *(pm(*rung.arm_mean(arm, k), digits=3).lstrip("+")
                                                    for k in ("gate_attn_mean", "gate_ffn_mean", "erank_mean"))])
    lines += [table(["rung", "arm", "attn gate", "ffn gate", "effective rank"], rows), ""]
    lines += [f"![measurements]({plot_measurements(lad.rungs, meas_arms, lad.out)})", ""]
    return lines


def deconstructing_section(lad, verdicts):
    """Each variant kind, uniform and hybrid, against standard attention; its attention patterns."""
    fd = lad.raw["ladder"].get("deconstructing")
    if not fd:
        return []
    kinds = fd["kinds"]
    lines = ["## Deconstructing Attention: each kind, uniform and hybrid, against standard", "",
             "Final validation loss Δ vs the standard arm (seed means).", ""]
    rows, pts = [], []
    for rung in lad.rungs:
        # one seed: the floor is the ladder file's stated one (or this rung's, with seeds)
        r = deconstructing(rung, fd["standard"], kinds, fd.get("floor", lad.floor_of.get(rung.tokens)))
        if r is None:
            continue
        pts.append((rung.tokens, r))
        for k in kinds:
            u, h = r["deltas"][k]
            rows.append([f"{rung.tokens:,}", k, fmt(u, signed=True), fmt(h, signed=True)])
    lines += [table(["rung", "kind", "uniform − standard", "hybrid − standard"], rows), ""]
    if pts:
        lines += [f"![deconstructing]({plot_deconstructing(pts, lad.out)})", ""]
    lines += ["Attention-pattern indicators at the final validation (doc/deconstructing.md \"Attention-pattern "
              "indicators\"), the mean over the layers that have an attention matrix and their heads; local focus "
              "at distance 0 (the diagonal).", ""]
    rows = []
    for rung in lad.rungs:
        for arm in [fd["standard"]] + [f"{k}-{l}" for k in kinds for l in ("uniform", "hybrid")]:
            runs = rung.arm_runs(arm)
            if not runs:
                continue
            rec = runs[min(runs)].final
            rows.append([f"{rung.tokens:,}", arm] + [fmt(indicator_mean(rec.get(k), k == "attn_locfoc"), 3)
                                                     for k in ("attn_entropy", "attn_conc", "attn_sink", "attn_headdiv",
                                                               "attn_locfoc")])
    lines += [table(["rung", "arm", "entropy", "concentration", "sink", "head diversity", "local focus (N=0)"],
                    rows), ""]
    judged = [(t, r) for t, r in pts if r["shows"] is not None]
    verdicts.append(("Uniform variants behind standard (mlp most), hybrids recover",
                     findings.over_ladder(judged, lambda r: r["shows"], lambda r: r["min_uniform"])))
    return lines


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
        lines += [table(header, body), ""]
    else:
        lines += [table(["arm"] + [run_files.rate_label(p) for p in points],
                        [[arm.name] + [cells.get(p, "—") for p in points] for arm, cells in rows]), ""]
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
