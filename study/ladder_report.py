"""
ladder_report.py: a scale ladder's findings against tokens, and a rate sweep's table.

    python -m study ladder report studies/ladders/cpu.toml [--out DIR]   # OUT/report/ladder.md
    python -m study sweep studies/ladder_cpu_lr.toml [--out DIR]         # OUT/report-sweep/sweep.md

Reads each rung's runs through the ladder's spec.Ladder and writes only the report and its
figures. Per rung, study/findings.py's rules with arms paired by seed against the rung's noise
floor; over the rungs, each finding's p-value, its numbers judged as one Holm family. The rules
were fixed before the runs (issue 31) and are stated in doc/study.md "Scale ladder".
"""
import argparse
import os
import sys

from study import findings
from study import runs as run_files
from study.findings import Rule, paired, with_interval
from study.plots import figure_legend, plt, save
from study.runs import RunData
from study.spec import LadderError, StudyError, load_ladder, load_study
from study.tables import fmt, mean_sd, pm, table

REGIONS = ("query", "trace", "answer")
PAPER_GAPS = {"iso_depth": 0.47, "iso_flop": 0.26, "iso_param": 0.005}
ROLES = {"iso_depth": "iso-depth", "iso_flop": "iso-FLOP", "iso_param": "iso-param"}


# ----------------------------------------------------------------------------------------
# numbers

class Rung:
    def __init__(self, tokens, study):
        self.tokens = tokens
        self.study = study
        self.runs = [RunData(r, final_step=self.study.steps) for r in self.study.runs]

    def arm_runs(self, name):
        """{seed: RunData} of the arm's finished runs (the ladder trains each arm at one rate)."""
        return {d.run.seed: d for d in self.runs if d.run.arm.name == name and d.final is not None}

    def has_arm(self, name):
        return self.study.arm(name) is not None

    def arm_mean(self, name, key="val_loss", docs="windows"):
        return mean_sd([d.value(key, docs) for d in self.arm_runs(name).values()])

    def values(self, name, key="val_loss", docs="windows"):
        """{seed: a key of the arm's final validation} (findings.paired pairs them by seed)."""
        return {seed: d.value(key, docs) for seed, d in self.arm_runs(name).items()}

    def paired(self, a, b, key="val_loss", docs="windows"):
        """findings.Diff over seeds of a - b, paired by seed."""
        return paired(self.values(a, key, docs), self.values(b, key, docs))

    def pooled_sd(self, names):
        return findings.pooled_sd([[d.final["val_loss"] for d in self.arm_runs(name).values()] for name in names])


def noise_floor(rung, names, control=None):
    """(floor, pooled sd, |control delta| or None)."""
    pooled = rung.pooled_sd(names)
    ctl = None
    if control and rung.has_arm(control[1]) and rung.arm_runs(control[1]):
        m = rung.paired(control[0], control[1]).mean
        ctl = abs(m) if m is not None else None
    parts = [x for x in (pooled, ctl) if x is not None]
    return (max(parts) if parts else None), pooled, ctl


# ----------------------------------------------------------------------------------------
# the findings

def gap_ordering(rung, f, rule):
    """{role: Diff of SAN − partner}, the ordering margins, the verdict at the rung, and the five
    numbers that must all clear, per seed (findings.over_ladder judges them over the rungs)."""
    g = {role: rung.paired(f["san"], f[role]) for role in ROLES}
    if any(v.mean is None for v in g.values()):
        return None
    m1 = rung.paired(f["iso_flop"], f["iso_depth"])  # iso-depth gap - iso-FLOP gap = FLOP arm - depth arm
    m2 = rung.paired(f["iso_param"], f["iso_flop"])   # iso-FLOP gap - iso-param gap
    per_arm = {role: rung.values(f[role]) for role in ("san",) + tuple(ROLES)}
    seeds = sorted(set.intersection(*(set(k for k, v in values.items() if v is not None) for values in per_arm.values())))
    v = {role: [values[s] for s in seeds] for role, values in per_arm.items()}
    numbers = {f"SAN − {ROLES[role]}": [a - b for a, b in zip(v["san"], v[role])] for role in ROLES}
    numbers["depth − FLOP"] = [a - b for a, b in zip(v["iso_flop"], v["iso_depth"])]
    numbers["FLOP − param"] = [a - b for a, b in zip(v["iso_param"], v["iso_flop"])]
    verdict = findings.gap_ordering(g, (m1, m2), rule).verdict
    return {"gaps": g, "margins": (m1, m2), "verdict": verdict, "floor": rule.floor, "numbers": numbers,
            "iso_param_seeds": numbers["SAN − iso-param"]}


def localisation(rung, san, ffn, docs, rule):
    """SAN − FFN per region, the query margins (query delta − region delta, paired by seed), the
    verdict at the rung and its three numbers per seed (the query deficit and both margins)."""
    d = {r: rung.paired(san, ffn, f"val_loss_{r}", docs) for r in REGIONS}
    if any(v.mean is None for v in d.values()):
        return None
    value = {(arm, r): rung.values(arm, f"val_loss_{r}", docs) for arm in (san, ffn) for r in REGIONS}
    margins = {r: rule.contrast([(1, value[san, "query"]), (-1, value[ffn, "query"]), (-1, value[san, r]), (1, value[ffn, r])])
               for r in ("trace", "answer")}
    seeds = sorted(set.intersection(*(set(k for k, v in x.items() if v is not None) for x in value.values())))
    def margin(s, r):
        return value[san, "query"][s] - value[ffn, "query"][s] - value[san, r][s] + value[ffn, r][s]
    _, verdict = findings.localisation(d["query"], margins, rule)
    overall = rung.paired(san, ffn, "val_loss", docs)
    numbers = {"query deficit": [value[san, "query"][s] - value[ffn, "query"][s] for s in seeds],
               **{f"query − {r}": [margin(s, r) for s in seeds] for r in ("trace", "answer")}}
    return {"deltas": d, "margins": margins, "verdict": verdict, "overall": overall, "numbers": numbers}


def spectra_finding(rung, san, ffn, rule):
    """Per seed of the SAN: the growths, the margin and the partner's W_o; the three differences
    of findings.spectra_diffs and the verdict at the rung."""
    san_growth, ffn_growth = {}, {}
    for seed, d in sorted(rung.arm_runs(san).items()):
        g = findings.run_stable_rank_growth(d.run.dir)
        if g is not None:
            san_growth[seed] = g
            partner = rung.arm_runs(ffn).get(seed)
            gf = findings.run_stable_rank_growth(partner.run.dir) if partner else None
            if gf is not None:
                ffn_growth[seed] = gf
    if not san_growth:
        return None
    rows = [{"seed": seed, "growth": g, "margin": findings.spectra_margin(g),
             "ffn_wo": ffn_growth[seed]["attn.wo"] if seed in ffn_growth else None} for seed, g in san_growth.items()]
    diffs = findings.spectra_diffs(san_growth, ffn_growth, rule)
    numbers = {"W_o gain": [r["growth"]["attn.wo"] for r in rows], "margin": [r["margin"] for r in rows],
               "SAN W_o − FFN W_o": [r["growth"]["attn.wo"] - r["ffn_wo"] for r in rows if r["ffn_wo"] is not None]}
    return {"rows": rows, "diffs": diffs, "verdict": findings.spectra(diffs, rule, partner_needed=True),
            "numbers": numbers}


def deconstructing(rung, standard, kinds, rule):
    """{kind: (uniform delta, hybrid delta)} vs standard (seed means), their Diffs
    (findings.variant_diffs), the verdict, and the numbers that must all clear, per seed (each
    uniform gap, each recovery, mlp-uniform − each other uniform)."""
    std, _ = rung.arm_mean(standard)
    if std is None:
        return None
    values = {a: rung.values(a) for a in [standard] + [f"{k}-{l}" for k in kinds for l in ("uniform", "hybrid")]}
    diffs = findings.variant_diffs(values, standard, kinds, rule)
    d = {k: (diffs[k]["uniform"].mean, diffs[k]["hybrid"].mean) if k in diffs else (None, None) for k in kinds}
    seeds = sorted(set.intersection(*(set(k for k, v in values[a].items() if v is not None)
                                      for a in [standard] + [f"{k}-{l}" for k in diffs for l in ("uniform", "hybrid")])))
    numbers = {}
    for k in diffs:
        uni, hyb, std_ = (values[f"{k}-uniform"], values[f"{k}-hybrid"], values[standard])
        numbers[f"{k} uniform"] = [uni[s] - std_[s] for s in seeds]
        numbers[f"{k} recovery"] = [uni[s] - 2 * hyb[s] + std_[s] for s in seeds]
        if k != "mlp" and "mlp" in diffs:
            numbers[f"mlp − {k}"] = [values["mlp-uniform"][s] - uni[s] for s in seeds]
    return {"deltas": d, "diffs": diffs, "verdict": findings.variants_behind(diffs, rule), "standard": std,
            "numbers": numbers}


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
    for ax, docs in zip(axes, ("whole_docs", "train_docs")):
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
               title="held-out documents (whole)" if docs == "whole_docs" else "training documents (whole)")
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
    """(the ladder file's spec.Ladder, its Rungs): each rung's study as its file would load, none written."""
    ladder = load_ladder(path)
    return ladder, [Rung(t, ladder.rung_study(t)) for t, _ in ladder.rungs]


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


class LadderReport:
    """What every section of the ladder report reads: the ladder (spec.Ladder), its rungs, the
    output directory and each rung's noise floor (floors: [(tokens, floor)], floor_of by tokens)."""

    def __init__(self, path, out, figures=True):
        self.path, self.figures = path, figures
        self.ladder, self.rungs = load_rungs(path)
        self.out = out or os.path.join(self.ladder.out, "report")
        self.control = self.ladder.norm_control
        gaps = self.ladder.finding("gap_ordering")
        self.quartet = [gaps[r] for r in ("san", "iso_depth", "iso_flop", "iso_param")] if gaps else []
        self.floors, self.floor_rows = [], []
        for rung in self.rungs:
            fl, pooled, ctl = noise_floor(rung, self.quartet, (self.control["zcn"], self.control["rms"])
                                          if self.control else None)
            self.floors.append((rung.tokens, fl))
            self.floor_rows.append([f"{rung.tokens:,}", fmt(pooled), fmt(ctl), fmt(fl)])
        self.floor_of = dict(self.floors)


def write_report(path, out=None, figures=True):
    """ladder.md and its figures in `out` (default OUT/report); returns (its path, [(finding, verdict)]).
    figures=False: the text alone (drawing is most of a report's time; the verdicts do not need it)."""
    lad = LadderReport(path, out, figures)
    os.makedirs(lad.out, exist_ok=True)
    lines = [f"# Scale ladder: {lad.ladder.name}", "", lad.ladder.tables["study"].get("note", ""), "",
             f"Ladder file `{path}`; rungs " + ", ".join(f"{r.tokens:,}" for r in lad.rungs)
             + " tokens per run.", "", Rule("paired").describe("the rung's noise floor"), ""]
    lines += ["## Runs", ""] + runs_table(lad.rungs) + [""]
    lines += ["## Noise floor", "",
              "Pooled seed-to-seed sd of the four arms' final losses, and |SAN − SAN-RMSNorm| (ZCN vs RMSNorm, "
              "no decay on gains: the paper's optimizer-equivalence control, 0.0015 nats there) where the rung has it; "
              "the floor is the larger.", ""]
    lines += [table(["rung", "pooled seed sd", "|ZCN − RMSNorm|", "floor"], lad.floor_rows), ""]
    judged = []  # [(finding, findings.OverLadder)]
    for section in (gap_sections, localisation_section, spectra_section, measurements_section,
                    deconstructing_section):
        lines += section(lad, judged)
    verdicts = findings.judge_family([r for _, r in judged])
    lines += ["## Verdicts", "", VERDICTS_TEXT.format(alpha=findings.FAMILY_ALPHA, m=sum(r.status is None for _, r in judged)), ""]
    lines += [table(["finding", "verdict", "p", "Holm threshold", "its numbers: p (at the largest rung, of the slope)"],
                    [[name, v, fmt_p(r.p), fmt_p(thr), numbers_text(r.numbers)]
                     for (name, r), (v, thr) in zip(judged, verdicts)]), ""]
    with open(os.path.join(lad.out, "ladder.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    return os.path.join(lad.out, "ladder.md"), [(name, v) for (name, _), (v, _) in zip(judged, verdicts)]


VERDICTS_TEXT = ("Over the ladder (study/findings.py `over_ladder`, `judge_family`): each number a finding's per-rung "
                 "rule asks to clear holds when it clears at the largest rung, or when its slope against log tokens is "
                 "above zero beyond its interval with its mean at the largest rung above zero; its p is twice the "
                 "smaller of the two one-sided p-values, and the finding's p is the largest of its numbers'. The {m} "
                 "findings judged are one family: Holm's step-down at {alpha:g} one-sided (the 95% intervals' side) "
                 "decides which hold — *shows* when every number also clears at the largest rung at that threshold, "
                 "else *trend* — so that a ladder with no effect gets a false verdict in at most 2.5% of ladders. The "
                 "\"at rung\" verdicts above are each rung's own rule, not adjusted for the family.")


def fmt_p(p):
    return "—" if p is None else f"{p:.3g}"


def numbers_text(numbers):
    """"query deficit 0.21 (0.21, 0.6); ...": each number's p, its p at the largest rung and of its slope."""
    return "; ".join(f"{name} {fmt_p(q)} ({fmt_p(last)}, {fmt_p(slope)})" for name, (q, last, slope) in numbers.items()) or "—"


def gap_sections(lad, verdicts):
    """Finding 1 at each rung and over the ladder, and the iso-param gap's shrinking."""
    fg = lad.ladder.finding("gap_ordering")
    if not fg:
        return []
    lines = ["## Gap ordering (SAN paper finding 1)", "",
             "SAN − partner, final validation loss, mean over seeds [95% t-interval] (paired by seed); paper at 105B "
             "tokens: iso-depth +0.47, iso-FLOP +0.26, iso-param +0.005 (0.046 at 5B, 0.019 at 30B).", ""]
    rows, gap_points = [], []
    for rung in lad.rungs:
        r = gap_ordering(rung, fg, Rule("paired", lad.floor_of[rung.tokens]))
        if r is None:
            continue
        gap_points.append((rung.tokens, r))
        g, (m1, m2) = r["gaps"], r["margins"]
        rows.append([f"{rung.tokens:,}", *(with_interval(g[k]) for k in ROLES), with_interval(m1), with_interval(m2),
                     str(g["iso_param"].n), r["verdict"]])
    lines += [table(["rung", "iso-depth", "iso-FLOP", "iso-param", "depth − FLOP", "FLOP − param", "seeds",
                     "at rung"], rows), ""]
    if gap_points:
        if lad.figures:
            lines += [f"![gaps]({plot_gaps(gap_points, lad.floors, lad.out)})", ""]
    ordering, shrinks = findings.KINDS["gap_ordering"].over_ladder
    verdicts.append((ordering, over_ladder(gap_points, lad.floor_of)))
    verdicts.append((shrinks, iso_param_shrinks(gap_points, lad.floor_of)))
    return lines


def iso_param_shrinks(gap_points, floor_of):
    """The iso-param gap falls with tokens, from above zero (findings.iso_param_shrinks), every
    rung's gap judged against the largest of the rungs' floors (the stricter)."""
    points = [(t, r["gaps"]["iso_param"], r["iso_param_seeds"]) for t, r in gap_points]
    floors = [floor_of[t] for t, _, _ in points if floor_of[t] is not None]
    return findings.iso_param_shrinks(points, Rule("paired", max(floors) if floors else None))


def over_ladder(points, floor_of=None):
    """findings.over_ladder of a section's [(tokens, result)] (results with "numbers"), the largest
    rung judged against its floor; a rung whose finding cannot be told there is left out."""
    points = [(t, r) for t, r in points if r["verdict"] != findings.CANNOT_TELL]
    floor = floor_of.get(points[-1][0]) if points and floor_of else None
    return findings.over_ladder([(t, r["numbers"]) for t, r in points], Rule("paired", floor))


def localisation_section(lad, verdicts):
    """Finding 2 on held-out documents and, separately, on training documents."""
    fl_ = lad.ladder.finding("localisation")
    if not fl_:
        return []
    lines = ["## Localisation (SAN paper finding 2)", "",
             f"SAN − {fl_['ffn']} per region, and the query margins (query delta minus the trace / answer delta), "
             "mean over seeds [95% t-interval], paired by seed, on whole documents (windows are not used here: "
             "they count only the targets of documents that begin in the window, a sample that favours "
             "document beginnings and short documents).", ""]
    reg_points = []
    for docs, title, verdict in zip(("whole_docs", "train_docs"), ("held-out documents (whole: --val-whole-docs)",
                                    "training documents (whole: --train-doc-eval)"),
                                    findings.KINDS["localisation"].over_ladder):
        rows, pts = [], []
        for rung in lad.rungs:
            r = localisation(rung, fl_["san"], fl_["ffn"], docs, Rule("paired", lad.floor_of[rung.tokens]))
            if r is None:
                continue
            pts.append((rung.tokens, r))
            rows.append([f"{rung.tokens:,}", with_interval(r["overall"]), *(with_interval(r["deltas"][k]) for k in REGIONS),
                         with_interval(r["margins"]["trace"]), with_interval(r["margins"]["answer"]), r["verdict"]])
        lines += [f"{title}:", "", table(["rung", "overall", "query", "trace", "answer", "query − trace",
                                          "query − answer", "at rung"], rows) if rows else
                  "(no rung's runs logged these documents' region losses: nothing to judge)", ""]
        for t, r in pts:
            for p in reg_points:
                if p[0] == t:
                    p[1][docs] = r
                    break
            else:
                reg_points.append((t, {docs: r}))
        verdicts.append((verdict, over_ladder(pts, lad.floor_of)))
    if reg_points:
        if lad.figures:
            lines += [f"![regions]({plot_regions(reg_points, lad.floors, lad.out)})", ""]
    return lines


def spectra_section(lad, verdicts):
    fs = lad.ladder.finding("spectra")
    if not fs:
        return []
    lines = ["## Spectra (SAN paper finding 3)", "",
             f"Relative change of the layer-mean stable rank from the 25% milestone to the end, per seed of "
             f"{fs['san']}; margin = W_o − max(W_q, W_k); W_o of {fs['ffn']} beside it. Under the table, over the "
             "seeds [95% t-interval]: W_o's gain, the margin, and SAN W_o − FFN W_o (paired by seed).", ""]
    rows, pts, judged = [], [], []
    for rung in lad.rungs:
        r = spectra_finding(rung, fs["san"], fs["ffn"], Rule("paired"))
        if r is None:
            continue
        pts.append((rung.tokens, r))
        for row in r["rows"]:
            g = row["growth"]
            rows.append([f"{rung.tokens:,}", row["seed"], *(f"{g[k]:+.1%}" for k in findings.ATTENTION_MATRICES),
                         f"{row['margin']:+.1%}", f"{row['ffn_wo']:+.1%}" if row["ffn_wo"] is not None else "—"])
        d = r["diffs"]
        judged.append([f"{rung.tokens:,}", *(with_interval(d[k], 1, percent=True) for k in ("gain", "margin", "partner")),
                       r["verdict"]])
    lines += [table(["rung", "seed", "W_q", "W_k", "W_v", "W_o", "margin", "FFN W_o"], rows), ""]
    lines += [table(["rung", "W_o gain", "margin", "SAN W_o − FFN W_o", "at rung"], judged), ""]
    verdicts.append((findings.KINDS["spectra"].over_ladder[0], over_ladder(pts)))
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
    if lad.figures:
        lines += [f"![measurements]({plot_measurements(lad.rungs, meas_arms, lad.out)})", ""]
    return lines


def deconstructing_section(lad, verdicts):
    """Each variant kind, uniform and hybrid, against standard attention; its attention patterns."""
    fd = lad.ladder.finding("variants_behind")
    if not fd:
        return []
    kinds = fd["kinds"]
    lines = ["## Deconstructing Attention: each kind, uniform and hybrid, against standard", "",
             "Final validation loss Δ vs the standard arm, mean over seeds [95% t-interval], paired by seed; "
             "uniform − 2 hybrid + standard > 0: the hybrid recovers more than half of the uniform gap.", ""]
    rows, pts = [], []
    for rung in lad.rungs:
        # the floor: the ladder file's stated one, else this rung's
        r = deconstructing(rung, fd["standard"], kinds, Rule("paired", fd.get("floor", lad.floor_of.get(rung.tokens))))
        if r is None:
            continue
        pts.append((rung.tokens, r))
        for k in kinds:
            d = r["diffs"].get(k)
            rows.append([f"{rung.tokens:,}", k] + ([with_interval(d[x]) for x in ("uniform", "hybrid", "recovery")]
                                                   + [with_interval(d["mlp_most"]) if d["mlp_most"] else "—"]
                                                   if d else ["—"] * 4) + [r["verdict"]])
    lines += [table(["rung", "kind", "uniform − standard", "hybrid − standard", "uniform − 2 hybrid + standard",
                     "mlp-uniform − uniform", "at rung"], rows), ""]
    if pts:
        if lad.figures:
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
    floors = {t: fd.get("floor", lad.floor_of.get(t)) for t, _ in pts}
    verdicts.append((findings.KINDS["variants_behind"].over_ladder[0], over_ladder(pts, floors)))
    return lines


def write_sweep(path, out=None):
    """The sweep's table and figure: final loss per arm and rate point (lr, lr_other), the best of
    each arm, and whether it lies at the edge of the arm's grid in a rate the arm sweeps. Returns
    (path, {arm: (rate point, loss, edge)})."""
    study = load_study(path)
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
    except (LadderError, StudyError) as e:
        sys.stderr.write(f"ladder_report.py: {e}\n")
        return 2
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
