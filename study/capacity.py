"""
Knowledge capacity in bits (doc/study.md "Knowledge capacity"): how many bits of the capacity
world (dev/data/bios.py) a trained model stores, measured from its predictions of each attribute,
as Allen-Zhu & Li measure knowledge (Physics of Language Models 3.3).

An attribute a of N people, each value drawn uniformly and independently from D_a values, holds
N log2 D_a bits. A model whose mean cross-entropy on the attribute's value, given the person's
name, is L_a nats stores at least
    bits_a = N (log2 D_a - L_a / ln 2)
(a predictor that puts probability p on the true value saves log2(D_a p) bits against the
uniform guess: a perfect one N log2 D_a, a uniform one 0; a model worse than uniform is negative).
The world's values are one token each, so L_a is the probes' answer-token loss of the
attribute's exercise in the run's final whole-document validation (val_exercise[a]["answer"]).
bits/param divides the sum over attributes by the run's parameters (non-embedding, and all).

  python -m study capacity studies/capacity_cpu.toml [--world data/capacity-n600] [--curve] [--out FILE]

--curve adds the bits at every validation of the runs (the study's val_every), against the
exposures a person has had by then: step x tokens per step / (N x tokens per biography). Before
the end those points are on the schedule's way (a WSD run's stable rate), not decayed runs.
"""
import argparse
import json
import math
import os
import sys

from study import findings
from study.runs import RunData
from study.spec import StudyError, load_study


def attribute_bits(loss_nats, values, people):
    """Bits stored of one attribute: people x (log2 values - loss / ln 2)."""
    return people * (math.log2(values) - loss_nats / math.log(2))


def run_bits(final, manifest):
    """{attribute: bits} of a final validation record (val_exercise[a]["answer"] in nats), or None
    when the record lacks an attribute."""
    per = final.get("val_exercise", {}) if final else {}
    out = {}
    for attr, values in manifest["values"].items():
        loss = per.get(attr, {}).get("answer")
        if loss is None:
            return None
        out[attr] = attribute_bits(loss, values, manifest["people"])
    return out


def world_of(study, world=None):
    """The capacity world's directory: --world, else the directory of the study's --val-data."""
    if world is None:
        flags = study.flags
        if "--val-data" not in flags:
            raise StudyError(f"{study.path}: no --val-data in study.flags; give --world DIR")
        world = os.path.dirname(flags[flags.index("--val-data") + 1])
    path = os.path.join(world, "manifest.json")
    try:
        with open(path) as f:
            manifest = json.load(f)
    except OSError as e:
        raise StudyError(f"{path}: {e.strerror} (build the world: python dev/data/bios.py --out {world})") from None
    for key in ("people", "exposures", "values", "bits"):
        if key not in manifest:
            raise StudyError(f"{path}: no '{key}' (not a capacity world of dev/data/bios.py)")
    return manifest


def arm_table(study, manifest):
    """{arm: {seed: {"bits", "per_param", "per_param_all", "non_embedding", "parameters"}}} of finished runs."""
    table = {}
    for run in study.runs:
        data = RunData(run, final_step=study.steps)
        bits = run_bits(data.final, manifest)
        header = data.header or {}
        if bits is None or not header.get("non_embedding"):
            continue
        total = sum(bits.values())
        table.setdefault(run.arm.name, {})[run.seed] = {
            "bits": total, "by_attribute": bits, "non_embedding": header["non_embedding"],
            "parameters": header["parameters"], "per_param": total / header["non_embedding"],
            "per_param_all": total / header["parameters"]}
    return table


def exposures_at(step, study, manifest):
    """Biographies a person has been shown by step: every window holds whole biographies and an
    epoch shows each once (dev/data/bios.py), so step x tokens per step / (N x tokens a biography)."""
    return step * study.tokens_per_step / (manifest["people"] * manifest["bio_tokens"])


def curve(study, manifest):
    """{arm: {seed: {step: bits}}}: the bits at every validation of the study's finished runs."""
    out = {}
    for run in study.runs:
        data = RunData(run, final_step=study.steps)
        if data.final is None:
            continue
        points = {}
        for rec in data.val:
            bits = run_bits(rec, manifest)
            if bits is not None:
                points[rec["step"]] = sum(bits.values())
        out.setdefault(run.arm.name, {})[run.seed] = points
    return out


def curve_report(study, manifest):
    """Markdown: per validation step, the exposures by then, each arm's bits (mean ± sd over its
    finished seeds) and bits per non-embedding parameter, and the baseline − partner difference in
    bits per non-embedding parameter, paired by seed (95% t-interval)."""
    points = curve(study, manifest)
    table = arm_table(study, manifest)
    arms = [a.name for a in study.arms if points.get(a.name)]
    non_emb = {a: next(iter(table[a].values()))["non_embedding"] for a in arms}
    base = study.baseline
    partners = [a for a in arms if a != base] if base in arms else []
    steps = sorted({s for seeds in points.values() for p in seeds.values() for s in p})
    lines = ["", "Bits stored at each validation (mean ± sd over seeds; bits / non-emb param in brackets), and "
             f"{base} − partner in bits / non-emb param paired by seed [95% t-interval]:", "",
             "| step | exposures | " + " | ".join(f"{a} ({len(points[a])} seeds)" for a in arms) +
             "".join(f" | {base} − {a}" for a in partners) + " |",
             "|---|---|" + "---|" * (len(arms) + len(partners))]
    for step in steps:
        cells = []
        for a in arms:
            vals = [p[step] for p in points[a].values() if step in p]
            cells.append(f"{_mean_sd(vals, ',.0f')} [{sum(vals) / len(vals) / non_emb[a]:.3f}]" if vals else "")
        for a in partners:
            diff = findings.paired(*({s: p[step] / non_emb[arm] for s, p in points[arm].items() if step in p}
                                     for arm in (base, a)))
            cells.append(findings.with_interval(diff, 3) if diff.n >= findings.MIN_SEEDS else findings.too_few(diff.n))
        lines.append(f"| {step:,} | {exposures_at(step, study, manifest):g} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _mean_sd(values, form):
    """"m ± sd" over seeds in format form ("m" alone for one seed)."""
    m = sum(values) / len(values)
    if len(values) < 2:
        return format(m, form)
    sd = math.sqrt(sum((v - m) ** 2 for v in values) / (len(values) - 1))
    return f"{format(m, form)} ± {format(sd, form)}"


def report(study, manifest):
    """Markdown: bits and bits/param per arm, then each partner against the baseline, paired by seed."""
    table = arm_table(study, manifest)
    lines = [f"# Knowledge capacity: {study.name}", "",
             f"World: {manifest['people']:,} people x {manifest['exposures']} exposures, "
             f"{manifest['bits']:,.0f} bits ({', '.join(f'{a} {v}' for a, v in manifest['values'].items())} values).",
             "Bits stored = sum over attributes of N (log2 D - loss / ln 2), loss the final whole-document "
             "answer-token loss of the attribute's probes (study/capacity.py).", "",
             "| arm | seeds | non-embedding params | bits stored | of the world | bits / non-emb param | bits / param (all) |",
             "|---|---|---|---|---|---|---|"]
    for arm in study.arms:
        seeds = table.get(arm.name, {})
        if not seeds:
            lines.append(f"| {arm.name} | 0 | | | | | |")
            continue
        rows = list(seeds.values())
        bits = [r["bits"] for r in rows]
        share = sum(bits) / len(bits) / manifest["bits"]
        lines.append(f"| {arm.name} | {len(rows)} | {rows[0]['non_embedding']:,} | {_mean_sd(bits, ',.0f')} | "
                     f"{share:.1%} | {_mean_sd([r['per_param'] for r in rows], '.3f')} | "
                     f"{_mean_sd([r['per_param_all'] for r in rows], '.3f')} |")
    attrs = list(manifest["values"])
    lines += ["", "Bits stored per attribute, mean over seeds (of N log2 D):", "",
              "| arm | " + " | ".join(f"{a} (of {manifest['people'] * math.log2(manifest['values'][a]):,.0f})"
                                     for a in attrs) + " |", "|---|" + "---|" * len(attrs)]
    for arm in study.arms:
        rows = list(table.get(arm.name, {}).values())
        if rows:
            lines.append(f"| {arm.name} | " + " | ".join(
                f"{sum(r['by_attribute'][a] for r in rows) / len(rows):,.0f}" for a in attrs) + " |")
    base = study.baseline
    lines += ["", f"Paired by seed, {base} − partner, mean [95% t-interval] (study/findings.py):", "",
              "| partner | bits stored | bits / non-emb param | bits / param (all) |", "|---|---|---|---|"]
    for arm in study.arms:
        if arm.name == base:
            continue
        cells = []
        for key, digits in (("bits", 0), ("per_param", 3), ("per_param_all", 3)):
            a = {s: r[key] for s, r in table.get(base, {}).items()}
            b = {s: r[key] for s, r in table.get(arm.name, {}).items()}
            diff = findings.paired(a, b)
            cells.append(findings.with_interval(diff, digits) if diff.n >= findings.MIN_SEEDS
                         else findings.too_few(diff.n))
        lines.append(f"| {arm.name} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m study capacity", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("study", help="the study file (its runs trained on a capacity world)")
    ap.add_argument("--world", help="the world's directory (default: that of the study's --val-data)")
    ap.add_argument("--curve", action="store_true", help="add the bits at every validation against exposures")
    ap.add_argument("--out", help="also write the report here")
    args = ap.parse_args(argv)
    try:
        study = load_study(args.study)
        manifest = world_of(study, args.world)
        text = report(study, manifest)
        if args.curve:
            text += curve_report(study, manifest)
    except StudyError as e:
        sys.stderr.write(f"python -m study capacity: {e}\n")
        return 2
    sys.stdout.write(text)
    if args.out:
        with open(args.out + ".tmp", "w") as f:
            f.write(text)
        os.replace(args.out + ".tmp", args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
