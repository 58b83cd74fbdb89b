"""
The papers' own tables in a study's report (study.paper = "deconstructing" or "san"): the eval
numbers the runs logged, laid out as the paper lays them out, with the paper's published numbers
beside each row where it gives them (papers/*.md). Which tables and columns, and why: doc/study.md
"The papers' tables". Seed means at each arm's rate; "—" unless every run has the number.
"""
import os

from study import runs as run_files
from study.tables import fmt, table

# Table 1's columns: (header, eval set, metric, x100: a percentage)
TABLE1 = (("ARC-E", "arc_easy", "acc", True), ("BoolQ", "boolq", "acc", True), ("COPA", "copa", "acc", True),
          ("PIQA", "piqa", "acc", True), ("SciQ", "sciq", "acc", True), ("RTE", "rte", "acc", True),
          ("HellaSwag", "hellaswag", "acc", True), ("WikiText ppl", "wikitext", "word_perplexity", False),
          ("LAMBADA acc", "lambada", "acc", True), ("LAMBADA ppl", "lambada", "perplexity", False))
NLU = ("arc_easy", "boolq", "copa", "piqa", "sciq", "rte", "hellaswag")  # averaged as "NLU avg" (our reading)

# The paper's 500M results (papers/DECONSTRUCTING.md "Findings"): (kind, layout) -> (NLU average,
# WikiText perplexity); layout "skip" is a hybrid without its variant layers.
PAPER_TABLE1 = {
    ("standard", "uniform"): (51.9, 38.1),
    ("mlp", "uniform"): (40.0, 993.5), ("mlp", "hybrid"): (48.7, 45.8), ("mlp", "skip"): (37.8, 2e5),
    ("approximate", "uniform"): (50.2, 47.9), ("approximate", "hybrid"): (51.6, 39.4),
    ("approximate", "skip"): (39.8, 2e6),
    ("nonapprox", "uniform"): (39.3, 9e4), ("nonapprox", "hybrid"): (52.9, 39.4), ("nonapprox", "skip"): (37.5, 5e5),
    ("rndembqk", "uniform"): (48.0, 84.8), ("rndembqk", "hybrid"): (49.8, 39.3), ("rndembqk", "skip"): (39.5, 2e4),
    ("fixedseqqk", "uniform"): (50.0, 79.1), ("fixedseqqk", "hybrid"): (52.6, 38.5),
    ("fixedseqqk", "skip"): (39.2, 2e5),
    ("staticembqk", "uniform"): (49.4, 79.9), ("staticembqk", "hybrid"): (51.8, 38.7),
    ("staticembqk", "skip"): (39.7, 7e4),
}
PAPER_CHANCE = 39.9  # the paper's chance NLU average
# Its appendix C, Table 4 (papers/DECONSTRUCTING.md): WikiText perplexity by context, the values given
PAPER_TABLE4 = {"paper: standard": {128: 69.9, 2048: 38.1},
                "paper: mlp uniform": dict.fromkeys((128, 256, 512, 1024, 2048), 993.5)}

# The SAN paper's gaps (papers/SAN.md, finding 1), SAN - partner in nats, by the budget's steps
# (iso-depth and iso-FLOP are given without a budget: read as the 105B headline)
PAPER_GAPS = {5000: {"iso_param": 0.046}, 30000: {"iso_param": 0.019},
              100000: {"iso_depth": 0.47, "iso_flop": 0.26, "iso_param": 0.005}}
GAP_ROLES = (("iso_depth", "iso-depth"), ("iso_flop", "iso-FLOP"), ("iso_param", "iso-param"))

# The SAN paper's Table 4 tasks: (eval set, metrics, chance accuracy or None)
TABLE4 = (("lambada", ("acc", "perplexity"), None), ("lambada_standard", ("acc", "perplexity"), None),
          ("sciq", ("acc", "acc_norm"), 0.25), ("hellaswag", ("acc", "acc_norm"), 0.25),
          ("arc_easy", ("acc", "acc_norm"), 0.25), ("piqa", ("acc", "acc_norm"), 0.5), ("winogrande", ("acc",), 0.5),
          ("mmlu", ("acc",), 0.25))


def arm_flag(arm, flag, default):
    """The last value of `flag` in the arm's flags (the study's, then its own)."""
    flags = arm.common + arm.flags
    values = [flags[i + 1] for i in range(len(flags) - 1) if flags[i] == flag]
    return values[-1] if values else default


def kind_layout(arm):
    return arm_flag(arm, "--attention", "standard"), arm_flag(arm, "--layout", "uniform")


def seed_mean(values):
    return sum(values) / len(values) if values and None not in values else None


def skip_evals(summary, name="skip-block"):
    """Per run of the arm at its rate, the {set: metrics} of its evaluation `name` of its final
    checkpoint (eval_NAME.jsonl's eval-set record, once the evaluation finished), or None."""
    out = []
    for d in summary.runs:
        evals = run_files.read_evals(run_files.post_eval_log(d.run, name)) \
            if os.path.exists(run_files.post_eval_record(d.run, name)) else {}
        out.append(evals[max(evals)] if evals else None)
    return out


def table1_cells(evals):
    """Table 1's cells from per-seed eval records ({set: {metric: value}} or None each): the ten
    columns and the NLU average, seed means, as numbers (None where a seed lacks one)."""
    def mean(name, metric, scale):
        values = [e.get(name, {}).get(metric) if e is not None else None for e in evals]
        m = seed_mean(values)
        return m * 100 if m is not None and scale else m
    cols = [mean(name, metric, pct) for _, name, metric, pct in TABLE1]
    nlu = [mean(name, "acc", True) for name in NLU]
    return cols, (sum(nlu) / len(nlu) if None not in nlu else None)


def context_rows(study, set_name, contexts):
    """The paper's rows of the context-length table of `set_name` (WikiText only), "—" where the
    paper gives no number."""
    if study.paper != "deconstructing" or set_name != "wikitext":
        return []
    return [[label] + [fmt(values[n], 1) if n in values else "—" for n in contexts]
            for label, values in PAPER_TABLE4.items()]


def deconstructing_table1(r):
    """The Deconstructing paper's Table 1 from the runs' end-of-run eval records and the hybrids'
    skip-block evaluations, with the paper's NLU average and WikiText perplexity beside."""
    rows = []
    for s in r.summaries.values():
        if not s.ok:
            continue
        kind, layout = kind_layout(s.arm)
        lines = [(s.arm.name, layout, [d.final_eval for d in s.runs])]
        if layout != "uniform" and kind != "standard":
            skips = skip_evals(s)
            if any(e is not None for e in skips):
                lines.append((s.arm.name + " (skip)", "skip" if layout == "hybrid" else None, skips))
        for name, how, evals in lines:
            cols, nlu = table1_cells(evals)
            paper = PAPER_TABLE1.get((kind, how))  # (the layout ablation's layouts: no row of Table 1)
            rows.append([name] + [fmt(c, 1 if i != 7 and i != 9 else 2) for i, c in enumerate(cols)] + [fmt(nlu, 1)]
                        + ([fmt(paper[0], 1), f"{paper[1]:g}"] if paper else ["—", "—"]))
    if not rows:
        return []
    headers = ["arm"] + [h for h, _, _, _ in TABLE1] + ["NLU avg", "paper NLU avg", "paper WikiText ppl"]
    return ["## The Deconstructing paper's Table 1", "",
            "Zero-shot, scored by the trainer at the end of each run as lm-eval 0.4.8 scores the tasks (acc in %, "
            "WikiText word perplexity, LAMBADA OpenAI perplexity; dev/data/evals.py); \"(skip)\": the hybrid's final "
            "checkpoint without its variant blocks (`--skip-nonstandard block`). NLU avg: the mean of the seven "
            f"accuracies (the paper's average is over its NLU tasks; its chance level, {PAPER_CHANCE}, does not pin down "
            "which, so this is our reading). Beside each row: the paper's 500M NLU average and WikiText perplexity "
            "of that kind and layout (papers/DECONSTRUCTING.md; the paper's per-task columns are not quoted there). "
            "Seed means at each arm's rate.", "",
            table(headers, rows), ""]


def san_gaps(r):
    """The gap_ordering finding's gaps (seed means at each arm's rate) beside the paper's at this
    study's step count, where the paper gives one."""
    finding = next((f for f in r.study.findings if f["kind"] == "gap_ordering"), None)
    if finding is None:
        return []
    san = r.summaries[finding["san"]]
    paper = PAPER_GAPS.get(r.study.steps, {})
    rows = []
    for role, label in GAP_ROLES:
        partner = r.summaries[finding[role]]
        gap = san.mean - partner.mean if san.ok and partner.ok else None
        rows.append([label, finding[role], fmt(gap, 4, signed=True),
                     fmt(paper.get(role), 3, signed=True) if role in paper else "—"])
    return ["## The SAN paper's gaps at this budget", "",
            f"SAN − partner in final validation loss (nats; positive: the SAN is worse), seed means at each arm's "
            f"rate, after {r.study.steps:,} steps; beside it the paper's at that budget (papers/SAN.md: iso-param "
            "0.046 at 5B, 0.019 at 30B, 0.005 at 105B; iso-depth ~0.47 and iso-FLOP ~0.26 without a budget, read "
            "as the 105B headline; the paper code's budgets are 5,000, 30,000 and 100,000 steps of 1,048,576 "
            "tokens).", "",
            table(["matching", "partner", "gap", "paper"], rows), ""]


def san_table4(r):
    """The SAN paper's Table 4 tasks at the end of each arm's runs, and what the milestone
    evaluations are not."""
    columns = [(name, metric) for name, metrics, _ in TABLE4 for metric in metrics]
    present = {(name, metric) for s in r.summaries.values() for d in s.runs
               for name, metrics in d.final_eval.items() for metric in metrics}
    columns = [c for c in columns if c in present]
    md = []
    if columns:
        chance = {name: c for name, _, c in TABLE4}
        rows = [[s.arm.name] + [fmt(s.eval_mean(name, metric), 4) for name, metric in columns]
                for s in r.summaries.values() if s.ok]
        rows.append(["chance"] + [fmt(chance[name], 2) if metric.startswith("acc") and chance[name] else "—"
                                  for name, metric in columns])
        md += ["## The SAN paper's Table 4 tasks", "",
               "Zero-shot, scored by the trainer at the end of each run as lm-eval scores them (dev/data/evals.py); "
               "the last row is each task's chance accuracy (the paper finds its remaining tasks there). The "
               "paper's own numbers are not quoted in papers/SAN.md, so none stand beside these. Seed means at "
               "each arm's rate.", "",
               table(["arm"] + [f"{name} {metric}" for name, metric in columns], rows), ""]
    md += ["## Budget rows", "",
           f"These runs train {r.study.steps:,} steps. The paper's results at smaller budgets (its \"@5B\" and "
           "\"@31B\" rows) are separately trained runs, each to its own end with a fully decayed schedule; the "
           "milestone evaluations of these runs (0/25/50/75%) read checkpoints mid-plateau at peak rate and are "
           "not those rows. The budget rows are the ladder studies/ladders/san_paper_budgets.toml "
           "(`python -m study ladder report` tables them).", ""]
    return md


def paper_sections(r):
    """The sections of study.paper's tables ([] for a study without one)."""
    if r.study.paper == "deconstructing":
        return deconstructing_table1(r)
    if r.study.paper == "san":
        return san_gaps(r) + san_table4(r)
    return []
