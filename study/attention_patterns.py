"""
attention_patterns.py: the attention-pattern indicators of "Deconstructing Attention" (radar
plots, its figures 1 and 8) and the pre-softmax logit distribution per layer (figures 2 and 6),
from the validation records train_san logs (attn_*, logit_abs_*: doc/formats.md).

    python -m study patterns --out DIR LABEL=LOG.jsonl ... [--reference LABEL=LOG.jsonl ...]

Layout: the radar's values (the paper's scaling), the figures, a table's rows, the study report's
section. The min-max set of the normalised axes, and why: doc/deconstructing.md
"Attention-pattern indicators".
"""
import argparse
import math
import os

from study import runs as run_files  # the JSONL log's records
from study.plots import plt  # pyplot on the Agg backend

AXES = ("Entropy", "Conc", "HeadDiv", "Sink", "LocFoc 0", "LocFoc 1", "LocFoc 2", "LocFoc 3")
NORMALISED = ("Entropy", "Conc", "HeadDiv")
LOCFOC_SCALE = 2.0


def layer_raw(record, layer):
    """The raw values of one layer (head means), by axis name, or None where the layer has no
    attention matrix (null in the log) or the record no indicators."""
    entropy = record.get("attn_entropy") or []
    if layer >= len(entropy) or entropy[layer] is None:  # (a shallower model: no such layer)
        return None
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    raw = {"Entropy": mean(record["attn_entropy"][layer]), "Conc": mean(record["attn_conc"][layer]),
           "HeadDiv": record["attn_headdiv"][layer], "Sink": mean(record["attn_sink"][layer])}
    for n, heads in enumerate(record["attn_locfoc"][layer]):
        raw[f"LocFoc {n}"] = mean(heads)
    return raw


def n_layers(records):
    return max((len(r.get("attn_entropy") or []) for r in records.values()), default=0)


def radar_values(records, layer, reference=None):
    """{label: [value per AXES]} for the runs with a matrix at `layer`: Entropy, Conc, HeadDiv
    min-max normalised across these runs (and the records of `reference`, {label: record}, when
    given), Sink as logged, LocFoc x 2."""
    raw = {label: layer_raw(r, layer) for label, r in records.items()}
    raw = {label: v for label, v in raw.items() if v is not None}
    scale = [v for v in (layer_raw(r, layer) for r in (reference or {}).values()) if v is not None]
    values = {label: [] for label in raw}
    for axis in AXES:
        column = [v[axis] for v in list(raw.values()) + scale]
        lo, hi = (min(column), max(column)) if column else (0.0, 0.0)
        for label, v in raw.items():
            if axis in NORMALISED:
                values[label].append((v[axis] - lo) / (hi - lo) if hi > lo else 0.5)
            elif axis.startswith("LocFoc"):
                values[label].append(LOCFOC_SCALE * v[axis])
            else:
                values[label].append(v[axis])
    return values


def _grid(n, per_row=4, polar=False):
    cols = min(n, per_row)
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.6 * cols, 3.4 * rows), squeeze=False,
                             subplot_kw={"projection": "polar"} if polar else None)
    flat = [a for row in axes for a in row]
    for a in flat[n:]:
        a.set_visible(False)
    return fig, flat[:n]


def _legend(fig, axes):
    handles, labels = [], []
    for ax in axes:  # every run once, from whichever layer draws it
        for h, lab in zip(*ax.get_legend_handles_labels()):
            if lab not in labels:
                handles.append(h)
                labels.append(lab)
    fig.legend(handles, labels, loc="lower center", ncol=min(4, len(labels)), fontsize=8)


def scale_text(records, reference=None):
    """What the normalised axes are normalised over, as a figure and the report say it."""
    extra = [label for label in (reference or {}) if label not in records]
    if not extra:
        return (f"Entropy, Conc, HeadDiv min-max per layer over the {len(records)} runs drawn"
                + (" (so each is 0 or 1, 0.5 where they agree)" if len(records) == 2 else ""))
    return f"Entropy, Conc, HeadDiv min-max per layer over the {len(records)} runs drawn and {len(extra)} more"


def plot_radars(records, out, name="attention_radar.png", title="attention-pattern indicators per layer",
                reference=None):
    """One radar per layer, the normalised axes over `records` and `reference` (radar_values);
    returns the file name, or None when no run has indicators."""
    L = n_layers(records)
    if L == 0 or not any(radar_values(records, l) for l in range(L)):
        return None
    fig, axes = _grid(L, polar=True)
    angles = [2 * math.pi * i / len(AXES) for i in range(len(AXES))]
    top = max([1.0] + [x for l in range(L) for vals in radar_values(records, l, reference).values() for x in vals])
    color = {label: f"C{i % 10}" for i, label in enumerate(records)}  # a run keeps its colour in every layer
    for l, ax in enumerate(axes):
        for label, vals in radar_values(records, l, reference).items():
            ax.plot(angles + angles[:1], vals + vals[:1], label=label, color=color[label])
            ax.fill(angles + angles[:1], vals + vals[:1], alpha=0.08, color=color[label])
        ax.set_xticks(angles)
        ax.set_xticklabels(AXES, fontsize=7)
        ax.tick_params(axis="y", labelsize=6)
        ax.set_ylim(0, top)
        ax.set_title(f"layer {l + 1}", fontsize=9)
    _legend(fig, axes)
    fig.suptitle(f"{title}\n({scale_text(records, reference)}; Sink absolute; LocFoc x {LOCFOC_SCALE:g})", fontsize=9)
    fig.tight_layout(rect=(0, 0.08, 1, 0.95))
    fig.savefig(os.path.join(out, name), dpi=110)
    plt.close(fig)
    return name


def plot_logits(records, out, name="logit_distribution.png"):
    """Per layer, each run's |logit| histogram as a fraction of its pairs per bin (log-x);
    returns the file name, or None when no run logged one."""
    L = max((len(r.get("logit_abs_hist") or []) for r in records.values()), default=0)
    if L == 0:
        return None
    fig, axes = _grid(L)
    for l, ax in enumerate(axes):
        for i, (label, r) in enumerate(records.items()):
            counts = (r.get("logit_abs_hist") or [None] * L)[l]
            if counts is None:
                continue
            total = sum(counts)
            ax.stairs([c / total for c in counts], r["logit_abs_edges"], label=label, color=f"C{i % 10}")
        ax.set_xscale("log")
        ax.set_title(f"layer {l + 1}", fontsize=9)
        ax.set_xlabel("|q.k| / sqrt(hd)", fontsize=8)
    axes[0].set_ylabel("fraction of pairs")
    _legend(fig, axes)
    fig.suptitle("pre-softmax logit magnitude per layer (the first bin also counts |x| < 1e-3, the last |x| >= 1e4)",
                 fontsize=9)
    fig.tight_layout(rect=(0, 0.08, 1, 0.95))
    fig.savefig(os.path.join(out, name), dpi=110)
    plt.close(fig)
    return name


def indicator_rows(records):
    """[layer, run, Entropy, Conc, HeadDiv, Sink, LocFoc 0..3, |logit| p99, max]: raw head means
    ("—" where the layer has none)."""
    rows = []
    for l in range(n_layers(records)):
        for label, r in records.items():
            raw = layer_raw(r, l)
            q = (r.get("logit_abs_quantiles") or [None] * (l + 1))[l]
            cells = [f"{raw[a]:.4g}" for a in AXES] if raw else ["—"] * len(AXES)
            logit = [f"{q[2]:.3g}", f"{q[-1]:.3g}"] if q else ["—", "—"]
            rows.append([str(l + 1), label] + cells + logit)
    return rows


HEADER = ["layer", "run"] + list(AXES) + ["|logit| p99", "|logit| max"]
# what each column holds, printed under the table (doc/deconstructing.md "Attention-pattern indicators")
LEGEND = """Entropy: -sum a log a over the whole matrix (higher: closer to mean pooling); Conc: ||A||_F
(higher: focus on few tokens); HeadDiv: the spread across heads; Sink: the attention on the first
token; LocFoc N: the attention at distance N (0: the token itself); |logit| p99, max: the
pre-softmax scores. Raw means over heads and validation windows; '—': no attention matrix."""


def groups_of_arms(arms):
    """{kind: {arm: record}} from [(arm name, its trainer flags, its final validation record)]:
    for each non-standard --attention kind, its arms (uniform, hybrid, other layouts) after
    the standard-attention arms of as many layers (a study's other models, e.g. the SAN arms of
    the mini-study beside its Deconstructing arms, are not theirs to compare with)."""
    def flag(flags, name, default):
        values = [flags[i + 1] for i in range(len(flags) - 1) if flags[i] == name]
        return values[-1] if values else default

    def depth(record):
        return len((record or {}).get("attn_entropy") or [])
    groups = {}
    for name, flags, r in arms:
        kind = flag(flags, "--attention", "standard")
        if kind != "standard":
            group = groups.setdefault(kind, {})
            if not group:
                group.update({n: rs for n, fs, rs in arms if flag(fs, "--attention", "standard") == "standard"
                              and depth(rs) == depth(r)})
            group[name] = r
    return groups


def report_section(groups, out, over="group"):
    """The study report's markdown lines: `groups` maps a title (a kind) to its {label: record}
    (standard, the kind uniform, the kind hybrid); one radar and one logit plot per group.
    `over`: the set the radars' min-max is taken over: "group" (each plot's runs) or "study"
    (every run of every group, so the plots share one scale)."""
    if over not in ("group", "study"):
        raise ValueError(f"attention_patterns.report_section: over must be 'group' or 'study', not {over!r}")
    study = {label: r for records in groups.values() for label, r in records.items()} if over == "study" else None
    sections = []
    for title, records in groups.items():
        safe = "".join(c if c.isalnum() or c in "-_" else "_" for c in title)
        radar = plot_radars(records, out, f"attention_radar_{safe}.png", f"{title}: attention-pattern indicators",
                            reference=study)
        logits = plot_logits(records, out, f"logit_distribution_{safe}.png")
        if radar is None and logits is None:
            continue
        sections += [f"### {title}", ""]
        sections += [f"![{radar}]({radar})", ""] if radar else []
        sections += [f"![{logits}]({logits})", ""] if logits else []
    if not sections:
        return []
    return ["## Attention patterns", "",
          "The indicators of \"Deconstructing Attention\" (section 4.4) of each arm's representative run at the last "
          "validation, from the first 4 rows of the validation data (doc/deconstructing.md \"Attention-pattern "
          "indicators\"): Entropy, Conc and HeadDiv min-max normalised per layer across "
          + ("the runs of a plot (the paper does not say over which set; with two runs each is 0 or 1)" if over == "group"
             else "every run of this section (one scale for all plots)") + ", Sink and LocFoc "
          f"absolute, LocFoc x {LOCFOC_SCALE:g}; a layer without an attention matrix (mlp, Taylor separate) is left "
          "out of its radar.", ""] + sections


def _table(header, rows):
    widths = [max(len(x) for x in col) for col in zip(header, *rows)]
    line = lambda cells: "  ".join(c.rjust(w) for c, w in zip(cells, widths))  # noqa: E731
    return "\n".join([line(header)] + [line(r) for r in rows])


def last_validation(path):
    records = [r for r in run_files.step_records(path) if "val_loss" in r]
    if not records:
        raise SystemExit(f"attention_patterns: {path} has no validation record")
    return records[-1]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="+", metavar="LABEL=LOG", help="a run's label and its JSONL log")
    p.add_argument("--out", required=True, help="folder for the PNGs")
    p.add_argument("--reference", nargs="+", default=[], metavar="LABEL=LOG",
                   help="more runs the radar's min-max is taken over, not drawn (e.g. all the runs of a study)")
    args = p.parse_args(argv)

    def read(items):
        records = {}
        for item in items:
            label, sep, path = item.partition("=")
            if not sep or not label or not path:
                raise SystemExit(f"attention_patterns: '{item}' is not LABEL=LOG")
            records[label] = last_validation(path)
        return records
    records, reference = read(args.runs), read(args.reference)
    os.makedirs(args.out, exist_ok=True)
    print(_table(HEADER, indicator_rows(records)))
    print(LEGEND)
    print(scale_text(records, reference) + " (the radar's axes)")
    for name in (plot_radars(records, args.out, reference=reference), plot_logits(records, args.out)):
        if name:
            print(f"wrote {os.path.join(args.out, name)}")


if __name__ == "__main__":
    main()
