"""
report.py: a study's report (`python -m study report`): OUT/report/report.md and its PNG plots,
from the runs' JSONL logs (doc/formats.md "Training log") and checkpoints (study/spectra.py).

Layout: each arm's summary at its best rate; its sections in the report's order, figures beside
the tables; the findings, judged by study/findings.py. What each number means (an arm's rate and
loss, the noise floor, the representative run): doc/study.md "Report".
"""
import glob
import math
import os

from study import attention_patterns, curves, findings, match, paper_tables, spectra
from study import runs as run_files
from study.findings import (CANNOT_TELL, DOES_NOT_SHOW, SHOWS, SHOWS_SHORT, Rule, is_too_few,
                            with_interval)
from study.plots import (figure_legend, grid_of_axes, layer_axis, layer_colorbar, layer_colormap, layer_numbers,
                         plain_log_ticks, plt, save)
from study.runs import RunData  # noqa: F401  (the run as the report reads it)
from study.tables import fmt, mean_sd, table

REGIONS = ("query", "trace", "answer", "other")
# region, exercise and localisation measures read whole documents (issue 57: on windows they count
# only the targets of documents that begin in the window, on the knowledge build 54% of query, 34%
# of trace and 24% of answer tokens); windows only when named
REGION_DOCS = "whole_docs"
EVAL_METRICS = ("acc", "acc_norm", "perplexity", "word_perplexity")  # the report's columns, per eval set


# ----------------------------------------------------------------------------------------
# numbers

class ArmSummary:
    """An arm at its best rates: the finished runs there, their mean and sd. Rates are rate
    points, (lr, lr_other) as the study asks for them (study.Run.rate_point)."""

    def __init__(self, arm, data):
        self.arm = arm
        self.by_rate = {}
        for d in data:
            if d.run.arm is arm and d.final is not None:
                self.by_rate.setdefault(d.run.rate_point, []).append(d)
        self.rate_mean = {p: mean_sd([d.final_loss for d in ds])[0] for p, ds in self.by_rate.items()}
        self.rate = min(self.rate_mean, key=self.rate_mean.get) if self.rate_mean else None
        self.runs = sorted(self.by_rate.get(self.rate, []), key=lambda d: d.run.seed)
        self.mean, self.sd = mean_sd([d.final_loss for d in self.runs]) if self.runs else (None, None)
        self.diverged = [d for d in data if d.run.arm is arm and d.state == "diverged"]
        self.all_runs = [d for d in data if d.run.arm is arm]

    @property
    def ok(self):
        return self.mean is not None

    @property
    def rates_text(self):
        """The rates its runs at its chosen rate trained with (seeds share them; "a / b" if not)."""
        texts = list(dict.fromkeys(d.rates_text for d in self.runs))
        return " / ".join(texts) if texts else "—"

    def by_seed(self, key=None, docs="windows"):
        """{seed: the final loss (or a key of the final validation on `docs`: study/runs.py DOCS)}
        of the runs at the arm's rate: what the findings compare."""
        if key is None:
            return {d.run.seed: d.final_loss for d in self.runs}
        return {d.run.seed: d.value(key, docs) for d in self.runs}

    def final_mean(self, key, docs="windows"):
        """The seed mean of a key of the final validation on `docs` (None unless every run has it)."""
        values = [d.value(key, docs) for d in self.runs]
        return sum(values) / len(values) if values and None not in values else None

    def whole_docs_mean(self):
        """The seed mean of the final validation on whole documents (--val-whole-docs 2: logged
        beside the windows' headline as "whole_docs"; None unless every run has it)."""
        values = [d.final.get("whole_docs", {}).get("val_loss") for d in self.runs]
        return sum(values) / len(values) if values and None not in values else None

    def eval_mean(self, name, metric):
        """The seed mean of an eval-set metric at the end of the runs (None unless every run has it)."""
        values = [d.final_eval.get(name, {}).get(metric) for d in self.runs]
        return sum(values) / len(values) if values and None not in values else None

    def exercise_mean(self, exercise, region, docs=REGION_DOCS):
        values = [d.validation(docs).get("val_exercise", {}).get(exercise, {}).get(region) for d in self.runs]
        return sum(values) / len(values) if values and None not in values else None

    def exercises(self, docs=REGION_DOCS):
        names = []
        for d in self.runs:
            for name in d.validation(docs).get("val_exercise", {}):
                if name not in names:
                    names.append(name)
        return names

    @property
    def representative(self):
        return self.runs[0] if self.runs else None


def arm_size(summary):
    """(non-embedding parameters, FLOPs per token) of an arm: as its representative run's log header
    says the trainer counted them, else match.py's closed forms over the study file's flags (which
    do not see a vocabulary taken from --tokenizer)."""
    header = (summary.representative.header if summary.representative else None) or {}
    model = summary.arm.model()
    nonemb = header.get("non_embedding")
    flops = header.get("flops_per_token")
    return (nonemb if isinstance(nonemb, int) else match.parameter_counts(model)[1],
            flops if isinstance(flops, (int, float)) else match.flops_per_token(model))


def noise_floor(summaries):
    """The pooled seed-to-seed sd of the arms' final losses at their rates."""
    return findings.pooled_sd([[d.final_loss for d in s.runs] for s in summaries])


# ----------------------------------------------------------------------------------------
# skip: hybrids evaluated without their variant layers (study.skip_eval; study/runner.py
# post_evals writes eval_skip-attention.jsonl and eval_skip-block.jsonl in each hybrid run)

SKIP_EVALS = (("skip-attention", "skip-attn"), ("skip-block", "skip-block"))


def _arm_flags_without_layout(arm):
    """An arm's flags (study's, then its own) as {flag: value}, without --layout."""
    flags, out = arm.common + arm.flags, {}
    for i, f in enumerate(flags):
        if f.startswith("--") and f != "--layout":
            out[f] = flags[i + 1] if i + 1 < len(flags) and not flags[i + 1].startswith("--") else None
    return out


def uniform_partner(arm, arms):
    """The arm that trains the same model with --layout uniform (given, or train_san's default), or None."""
    key = (arm.preset, tuple(sorted(_arm_flags_without_layout(arm).items())))
    for a in arms:
        flags = a.common + a.flags
        layout = [flags[i + 1] for i in range(len(flags) - 1) if flags[i] == "--layout"]
        if (not layout or layout[-1] == "uniform") and (a.preset, tuple(sorted(_arm_flags_without_layout(a).items()))) == key:
            return a
    return None


def skip_mean(summary, name):
    """The seed mean, at the arm's rate, of the validation loss of evaluation `name` (None unless every run has it)."""
    values = [(run_files.read_final_eval(d.run, name) or {}).get("val_loss") for d in summary.runs]
    return sum(values) / len(values) if values and None not in values else None


def skip_section(study, summaries):
    """The report's skip table: each hybrid arm's loss, the same checkpoints without the variant
    attention sub-layers (skip-attn) and without the variant blocks (skip-block), and the loss of
    the arm with the variant in every layer."""
    rows = []
    for s in summaries.values():
        skips = [skip_mean(s, name) for name, _ in SKIP_EVALS] if s.ok else [None, None]
        if skips == [None, None]:
            continue
        partner = uniform_partner(s.arm, [x.arm for x in summaries.values()])
        uniform = summaries[partner.name] if partner else None
        rows.append([s.arm.name, fmt(s.mean)] + [fmt(x) for x in skips]
                    + [partner.name if partner else "—", fmt(uniform.mean if uniform else None)])
    if not rows:
        return []
    return ["## Skip: hybrids without their variant layers", "",
            "Each hybrid's final checkpoint evaluated (`--steps 0 --init-from final.bin`) without its non-standard "
            "layers' attention sub-layers (skip-attn, `--skip-nonstandard attention`) and without those layers' "
            "whole blocks (skip-block, `--skip-nonstandard block`). The paper's words (section 4.2: the layers are "
            "*removed*; section 5: information flows \"solely through the residual connections\") describe "
            "skip-block (doc/deconstructing.md \"skip\"). Seed means at each arm's rate.", "",
            table(["arm", "hybrid", "skip-attn", "skip-block", "uniform arm", "uniform"], rows), ""]


# ----------------------------------------------------------------------------------------
# findings: each returns (verdict, text); verdict is SHOWS, DOES_NOT_SHOW or CANNOT_TELL

def _need(summaries, f, roles, why, diverged_counts=False):
    """Why a finding cannot be judged (an arm skipped, then an arm without finished runs), or
    None. With diverged_counts, an arm whose runs all diverged is judged too."""
    for role in roles:
        if why.get(f[role]):
            return f"arm {f[role]} ({role}) was not run: {why[f[role]]}"
    for role in roles:
        s = summaries[f[role]]
        if not s.ok and not (diverged_counts and s.diverged):
            return f"arm {f[role]} ({role}) has no finished runs" + (" (every run diverged)" if s.diverged else "")
    return None


def finding_gap_ordering(f, summaries, floor, why):
    missing = _need(summaries, f, ("san", "iso_depth", "iso_flop", "iso_param"), why)
    if missing:
        return CANNOT_TELL, missing, None
    rule = Rule("unpaired", floor)
    loss = {role: summaries[f[role]].by_seed() for role in ("san", "iso_depth", "iso_flop", "iso_param")}
    gaps = {role: rule.diff(loss["san"], loss[role]) for role in ("iso_depth", "iso_flop", "iso_param")}
    margins = (rule.diff(loss["iso_flop"], loss["iso_depth"]), rule.diff(loss["iso_param"], loss["iso_flop"]))
    text = (f"SAN − FFN final validation loss [95% t-interval]: iso-depth {with_interval(gaps['iso_depth'])}, "
            f"iso-FLOP {with_interval(gaps['iso_flop'])}, iso-param {with_interval(gaps['iso_param'])} nats (paper at "
            f"105B tokens: +0.47, +0.26, +0.005); ordering margins iso-depth − iso-FLOP {with_interval(margins[0])}, "
            f"iso-FLOP − iso-param {with_interval(margins[1])}; noise floor {fmt(floor)}.")
    result = findings.gap_ordering(gaps, margins, rule)
    p = findings.p_all_clear(findings.gap_ordering_numbers(gaps, margins), rule)
    if is_too_few(result.verdict):
        return result.verdict, text + f" Every arm needs at least {rule.min_seeds} seeds to judge the gaps.", p
    ahead = [role.replace("iso_", "iso-").replace("flop", "FLOP") for role in result.ahead]
    if ahead:  # the paper's finding is a SAN behind each partner, not only the gaps' order
        return DOES_NOT_SHOW, text + (f" The SAN is not behind its {', '.join(ahead)} partner"
                                      f"{'s' if len(ahead) > 1 else ''}; the paper has it behind each"
                                      + (", though the gaps keep the paper's order." if result.ordered else ".")), p
    if result.verdict != SHOWS:
        return DOES_NOT_SHOW, text + (" Not every gap and margin is positive beyond its interval"
                                      + (" and the noise floor." if floor is not None else ".")), p
    return SHOWS, text + " Every gap and both ordering margins are positive beyond their intervals" + (
        " and the noise floor." if floor is not None else "."), p


def finding_localisation(f, summaries, floor, why):
    missing = _need(summaries, f, ("san", "ffn"), why)
    if missing:
        return CANNOT_TELL, missing, None
    san, ffn = summaries[f["san"]], summaries[f["ffn"]]
    rule = Rule("unpaired", floor)
    regions = [r for r in ("query", "trace", "answer")
               if san.final_mean(f"val_loss_{r}", REGION_DOCS) is not None and ffn.final_mean(f"val_loss_{r}", REGION_DOCS) is not None]
    if "query" not in regions or len(regions) < 2:
        return CANNOT_TELL, ("the logs have no per-region losses on whole documents (runs without --val-whole-docs "
                               "1 or 2, or validation data without region sidecars)"), None
    d, margins, behind, verdict, p = region_localisation(san, ffn, regions, rule)
    text = (f"SAN − FFN ({f['ffn']}) per region [95% t-interval]: " + ", ".join(f"{r} {with_interval(v)}" for r, v in d.items())
            + " nats; query margins " + ", ".join(f"query − {r} {with_interval(m)}" for r, m in margins.items())
            + f" (overall {san.mean - ffn.mean:+.4f}).")
    text += localisation_on_training_documents(san, ffn, rule) + localisation_on_eval_sets(san, ffn)
    if is_too_few(verdict):
        return verdict, text + f" Both arms need at least {rule.min_seeds} seeds to judge the regions.", p
    if not behind:
        return DOES_NOT_SHOW, text + " The SAN has no deficit on query tokens to place (it is not behind there).", p
    if verdict == SHOWS:
        return SHOWS, text + " The deficit is positive on query tokens and larger there than on the other regions, beyond the intervals.", p
    return DOES_NOT_SHOW, text + " The deficit is not shown, beyond the intervals, to be positive on query tokens and largest there.", p


def region_localisation(san, ffn, regions, rule, docs=REGION_DOCS):
    """findings.localisation of SAN − FFN per region (of the final validation on whole held-out
    documents, or on the sample of training documents, docs="train_docs"): (deltas, query margins,
    behind on query tokens, verdict, p). A margin is the
    query delta minus a region's delta: each arm's per-seed query − region loss, then SAN − FFN."""
    def values(arm, r):
        return arm.by_seed(f"val_loss_{r}", docs)

    def query_minus(arm, r):
        q, other = values(arm, "query"), values(arm, r)
        return {s: q[s] - other[s] for s in q if q[s] is not None and other.get(s) is not None}

    d = {r: rule.diff(values(san, r), values(ffn, r)) for r in regions}
    margins = {r: rule.diff(query_minus(san, r), query_minus(ffn, r)) for r in regions if r != "query"}
    behind, verdict = findings.localisation(d["query"], margins, rule)
    return d, margins, behind, verdict, findings.p_all_clear(findings.localisation_numbers(d["query"], margins), rule)


def train_docs_mean(summary, key):
    """The seed mean of a key of the final validation's "train_docs" (None unless every run has it)."""
    values = [d.final.get("train_docs", {}).get(key) for d in summary.runs]
    return sum(values) / len(values) if values and None not in values else None


def train_docs_region_table(summaries, baseline):
    """The report's region table over the sample of training documents (markdown lines; none
    unless the baseline's runs logged it)."""
    if not baseline.ok or train_docs_mean(baseline, "val_loss_query") is None:
        return []
    rows = []
    for s in (x for x in summaries.values() if x.ok):
        row = [s.arm.name, fmt(train_docs_mean(s, "val_tokens"), 0)]
        for r in ("all",) + REGIONS:
            key = "val_loss" if r == "all" else f"val_loss_{r}"
            v, b = train_docs_mean(s, key), train_docs_mean(baseline, key)
            row += [fmt(v), fmt(v - b if v is not None and b is not None else None, signed=True)]
        rows.append(row)
    return ["### Loss per region on training documents", "",
            "The same decomposition over a fixed sample of whole training documents (--train-doc-eval: the SAN "
            f"paper's localisation is over documents the model has seen), final validation; Δ = arm − {baseline.arm.name}.",
            "", table(["arm", "targets", "all", "Δ all"] + [x for r in REGIONS for x in (r, f"Δ {r}")], rows), ""]


def localisation_on_training_documents(san, ffn, rule):
    """The finding's sentence on training documents ("" without them)."""
    regions = [r for r in ("query", "trace", "answer")
               if train_docs_mean(san, f"val_loss_{r}") is not None and train_docs_mean(ffn, f"val_loss_{r}") is not None]
    if "query" not in regions:
        return ""
    d, _, behind, verdict, _ = region_localisation(san, ffn, regions, rule, docs="train_docs")
    judged = ("no deficit on query tokens" if not behind else
              f"{verdict} to judge" if is_too_few(verdict) else
              "the deficit is positive and largest on query tokens beyond the intervals" if verdict == SHOWS else
              "the deficit is not shown to be positive and largest on query tokens")
    return " On training documents (--train-doc-eval): " + ", ".join(f"{r} {with_interval(v)}" for r, v in d.items()) + f" ({judged})."


def localisation_on_eval_sets(san, ffn):
    """The finding's sentence on the LAMBADA and SciQ eval sets ("" without them): SAN − FFN of
    each metric, and which arm it favours."""
    parts = []
    names = sorted({n for d in san.runs for n in d.final_eval if n.startswith(("lambada", "sciq"))})
    for name in names:
        for metric in ("acc", "acc_norm", "perplexity"):
            a, b = san.eval_mean(name, metric), ffn.eval_mean(name, metric)
            if a is None or b is None:
                continue
            better = "SAN" if (a < b if metric == "perplexity" else a > b) else "FFN" if a != b else "neither"
            parts.append(f"{name} {metric} {a - b:+.4f} (favours {better})")
    if not parts:
        return ""
    return (" Eval sets, SAN − FFN (the paper: LAMBADA favours the FFN model, SciQ the SAN): " + "; ".join(parts)
            + ".")


def finding_qk_norm(f, summaries, floor, why):
    missing = _need(summaries, f, ("with_qk_norm", "without_qk_norm"), why, diverged_counts=True)
    if missing:
        return CANNOT_TELL, missing, None
    w, wo = summaries[f["with_qk_norm"]], summaries[f["without_qk_norm"]]
    n_w, n_wo = len(w.diverged), len(wo.diverged)
    parts = [f"diverged runs: with QK-norm {n_w} of {len(w.all_runs)}, without {n_wo} of {len(wo.all_runs)}"]
    logit = {}
    for name, s in (("with", w), ("without", wo)):
        rep = s.representative
        if rep is not None and rep.final.get("max_logit"):
            logit[name] = max(rep.final["max_logit"])
    if logit:
        parts.append("largest pre-softmax logit at the end: " + ", ".join(f"{k} {v:.1f}" for k, v in logit.items()))
    if w.ok and wo.ok:
        gap = wo.mean - w.mean
        ci = findings.interval(Rule("unpaired").diff(wo.by_seed(), w.by_seed()))
        parts.append(f"final loss with {w.mean:.4f}, without {wo.mean:.4f} ({gap:+.4f}"
                     + (f" [{ci[0]:+.4f}, {ci[1]:+.4f}]" if ci else " [no interval]")
                     + (f", {gap / floor:+.0f} noise floors)" if floor else ")"))
    text = "; ".join(parts) + "."
    # without a divergence: did the stacks without QK-norm (and not those with it) train unstably?
    unstable_with, unstable_without = ([(d.run.id, u) for d in s.runs if (u := findings.instability(d.val, d.train, floor))]
                                       for s in (w, wo))
    rule = Rule("unpaired", floor)
    counts = (len(w.all_runs), len(wo.all_runs), n_w, n_wo, len(unstable_with), len(unstable_without))
    verdict, p = findings.qk_norm(*counts, rule), findings.qk_norm_p(*counts)  # (the Fisher p it judges)
    if is_too_few(verdict):
        return verdict, text + (f" Each stack needs at least {rule.min_seeds} runs for a divergence count to tell "
                                "from chance (one-sided Fisher exact test)."), p
    if n_w or n_wo:
        return verdict, text + (f" The stack without QK-norm diverged more often (one-sided Fisher p = {p:.3f})."
                                if verdict == SHOWS else
                                f" Not more divergences without QK-norm than chance allows (one-sided Fisher p = {p:.3f})."), p
    said = " ".join(f"{name}: {why_unstable}." for name, why_unstable in unstable_without + unstable_with)
    if verdict == SHOWS_SHORT:
        return verdict, text + " No run diverged, but the stack without QK-norm trained unstably more often than chance allows: " + said, p
    if unstable_with:
        return verdict, text + " No run diverged; runs with QK-norm trained unstably too: " + said, p
    if unstable_without:
        return verdict, text + (f" No run diverged; runs without QK-norm trained unstably, but not more often than "
                                f"chance allows (one-sided Fisher p = {p:.3f}): " + said), p
    return verdict, text + " No run without QK-norm diverged or trained unstably at this depth, scale and rate.", p


def finding_mlp_collapse(f, summaries, floor, why):
    missing = _need(summaries, f, ("standard", "uniform", "hybrid"), why)
    if missing:
        return CANNOT_TELL, missing, None
    rule = Rule("unpaired", floor)
    values = {"standard": summaries[f["standard"]].by_seed(), "mlp-uniform": summaries[f["uniform"]].by_seed(),
              "mlp-hybrid": summaries[f["hybrid"]].by_seed()}
    diffs = findings.variant_diffs(values, "standard", ["mlp"], rule)
    d = diffs["mlp"]
    std, uni, hyb = (summaries[f[r]].mean for r in ("standard", "uniform", "hybrid"))
    text = (f"final loss: standard {std:.4f}, uniform mlp {uni:.4f} ({with_interval(d['uniform'])}), hybrid mlp "
            f"{hyb:.4f} ({with_interval(d['hybrid'])}); uniform − 2 hybrid + standard {with_interval(d['recovery'])} "
            "(positive: the hybrid recovers more than half of the uniform gap); [95% t-intervals].")
    verdict, p = findings.variants_behind(diffs, rule), findings.p_all_clear(findings.variant_numbers(diffs), rule)
    if verdict == SHOWS:
        return SHOWS, text + " Uniform mlp (no token mixing) collapses; the hybrid recovers most of the gap.", p
    return verdict, text, p


def finding_spectra(f, summaries, floor, why, milestones):
    missing = _need(summaries, f, ("san",), why)
    if missing:
        return CANNOT_TELL, missing, None
    # the FFN partner is optional (the verdict does not need it): without its runs, judged without it
    no_partner = _need(summaries, f, ("ffn",), why) if "ffn" in f else None
    if f["san"] not in milestones or len(milestones[f["san"]]) < 3:
        return CANNOT_TELL, f"arm {f['san']} has no milestone checkpoints (study.milestones = true writes them)", None
    rule = Rule("unpaired", None)  # relative changes of stable rank: the loss's noise floor is not theirs

    def growths(arm):
        out = {d.run.seed: findings.run_stable_rank_growth(d.run.dir) for d in summaries[arm].runs}
        return {seed: g for seed, g in out.items() if g is not None}
    san = growths(f["san"])
    ffn = growths(f["ffn"]) if "ffn" in f and not no_partner else {}
    kinds = [k for k in findings.ATTENTION_MATRICES if all(k in g for g in san.values())]
    text = (f"{f['san']}: stable rank change from the 25% milestone to the end, mean over {len(san)} seeds: "
            + ", ".join(f"{k.split('.')[1]} {sum(g[k] for g in san.values()) / len(san):+.1%}" for k in kinds) + ".")
    diffs = findings.spectra_diffs(san, ffn, rule)
    text += (f" W_o's gain {with_interval(diffs['gain'], 1, percent=True)}, W_o − max(W_q, W_k) "
             f"{with_interval(diffs['margin'], 1, percent=True)}"
             + (f", SAN W_o − {f['ffn']} W_o {with_interval(diffs['partner'], 1, percent=True)}" if diffs["partner"] else "")
             + " [95% t-intervals]." + (f" Without the FFN partner: {no_partner}." if no_partner else ""))
    verdict = findings.spectra(diffs, rule, partner_needed=False)
    p = findings.p_all_clear(findings.spectra_numbers(diffs), rule)
    if verdict == SHOWS:
        return SHOWS, text + " W_o keeps gaining stable rank, more than the routing matrices (W_q, W_k)" + (
            ", and more than the FFN arm's W_o." if diffs["partner"] else "."), p
    return verdict, text, p


def finding_rates(f, summaries):
    """The rates each arm of a finding trained with (markdown lines): at a few steps a gap in
    rate can decide a comparison, so it is said beside the verdict, with a warning when the
    arms ran at different rates that the study did not sweep."""
    arms = [summaries[name] for key, name in f.items() if key not in ("kind", "title") and name in summaries]
    arms = [s for s in dict.fromkeys(arms) if s.ok]
    if not arms:
        return []
    line = "Rates used: " + "; ".join(f"{s.arm.name} {s.rates_text}" for s in arms) + "."
    if len({s.rates_text for s in arms}) > 1 and not all(len(s.rate_mean) > 1 for s in arms):
        line += (" The arms trained at different rates and not every one was swept: part of the difference may be the "
                 "rates', not the architectures' (give the arms `lr` grids).")
    return [line, ""]


JUDGES = {"gap_ordering": finding_gap_ordering, "localisation": finding_localisation, "qk_norm": finding_qk_norm,
          "mlp_collapse": finding_mlp_collapse, "spectra": finding_spectra}  # by kind (findings.KINDS)


# ----------------------------------------------------------------------------------------
# plots

def plot_loss_curves(summaries, out):
    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.5))
    ok = [x for x in summaries.values() if x.ok]
    largest = max((r["step"] * d.tokens_per_step for s in ok for d in s.runs for r in d.train + d.val), default=0)
    unit, unit_name = curves.token_unit(largest)
    for i, s in enumerate(ok):
        color = f"C{i % 10}"
        for k, d in enumerate(s.runs):
            tok = [r["step"] * d.tokens_per_step / unit for r in d.train]
            curves.plot_raw_and_smoothed(a, tok, [r["loss"] for r in d.train], color,
                                         label=s.arm.name if k == 0 else None)
            b.plot([r["step"] * d.tokens_per_step / unit for r in d.val], [r["val_loss"] for r in d.val], "o-",
                   color=color, ms=3, lw=1, label=s.arm.name if k == 0 else None)
    a.set(title=f"training loss, each seed at the arm's rate\n({curves.SMOOTHING_NOTE})",
          xlabel=curves.token_axis_label(unit_name), ylabel=curves.LOSS_AXIS_LABEL)
    b.set(title="validation loss", xlabel=curves.token_axis_label(unit_name), ylabel=curves.LOSS_AXIS_LABEL)
    a.legend(fontsize=8)
    b.legend(fontsize=8)
    return save(fig, out, "loss_curves.png")


def final_loss_figure(summaries, floor, baseline):
    """The figure of final_loss.png: a bar per arm (seed mean ± sd) with its seeds as dots. Bar
    lengths mean something only from 0, but arms differ by hundredths of a nat on a loss of
    several: when 0 would squash the differences flat, the axis is broken (a short panel from 0
    under the data's range, with break marks), never silently cut."""
    ok = [s for s in summaries.values() if s.ok]
    xs = list(range(len(ok)))
    means, sds = [s.mean for s in ok], [s.sd or 0 for s in ok]
    values = [d.final_loss for s in ok for d in s.runs] + [m + e * sign for m, e in zip(means, sds) for sign in (-1, 1)]
    if floor and baseline.ok:
        values += [baseline.mean - floor, baseline.mean + floor]
    lo, hi = min(values), max(values)
    pad = 0.15 * (hi - lo) + 0.01
    top = (lo - pad, hi + pad)
    broken = top[1] - top[0] < 0.4 * top[1]  # from 0, the data's range would fill under 40% of the height
    width = max(5.5, 1.1 * len(ok))
    if broken:
        fig, (ax, stump) = plt.subplots(2, 1, sharex=True, figsize=(width, 5), height_ratios=(7, 1), layout="constrained")
        panels = (ax, stump)
    else:
        fig, ax = plt.subplots(figsize=(width, 4.6), layout="constrained")
        stump, panels = None, (ax,)
    colors = [f"C{i % 10}" for i in xs]
    for panel in panels:
        panel.bar(xs, means, color=colors, alpha=0.55, zorder=1)
    if floor and baseline.ok:
        ax.axhspan(baseline.mean - floor, baseline.mean + floor, color="grey", alpha=0.3, zorder=0,
                   label=f"baseline ({baseline.arm.name}) ± noise floor")
    ax.errorbar(xs, means, yerr=sds, fmt="none", ecolor="0.15", elinewidth=1.2, capsize=5, zorder=2,
                label="seed mean ± sd")
    for i, s in enumerate(ok):  # the seeds spread a little sideways, so that equal losses stay distinct
        n = len(s.runs)
        offsets = [0.0] if n == 1 else [0.18 * (k / (n - 1) - 0.5) for k in range(n)]
        ax.plot([i + o for o in offsets], [d.final_loss for d in s.runs], "o", ms=6, mfc="white", mec="black",
                mew=1.2, zorder=3, label="seeds" if i == 0 else None)
    ax.set_ylim(*top)
    ax.set_ylabel("cross-entropy (nats)" + (", axis broken" if broken else ""))
    if broken:
        stump.set_ylim(0, 0.12 * (top[1] - top[0]))
        stump.set_yticks([0])
        ax.spines["bottom"].set_visible(False)
        stump.spines["top"].set_visible(False)
        ax.tick_params(bottom=False)
        marks = dict(marker=[(-1, -0.5), (1, 0.5)], markersize=12, linestyle="none", color="k", mec="k", mew=1,
                     clip_on=False)
        ax.plot([0, 1], [0, 0], transform=ax.transAxes, **marks)
        stump.plot([0, 1], [1, 1], transform=stump.transAxes, **marks)
    else:
        ax.set_ylim(0, top[1])
    panels[-1].set_xticks(xs, [s.arm.name for s in ok], rotation=30, ha="right")
    fig.suptitle("Final validation loss per arm\nbars: seed mean ± sd at the arm's rate; dots: its seeds", fontsize=11)
    fig.legend(loc="outside lower center", ncols=3, fontsize=8, frameon=False)
    return fig


def plot_final(summaries, floor, baseline, out):
    # (its constrained layout keeps the title, the labels and the legend inside)
    return save(final_loss_figure(summaries, floor, baseline), out, "final_loss.png", tight=False)


AXIS_LABEL = {"lr": "peak rate, as the study asks (--lr)",
              "lr_other": "Muon's AdamW-side rate, as the study asks (--lr-other)"}


def plot_lr(summaries, out):
    fig, ax = plt.subplots(figsize=(6, 4))
    swept = [s for s in summaries.values() if len(s.rate_mean) > 1]
    axis = run_files.swept_axis([s.arm for s in swept])
    for i, s in enumerate(swept):
        # one line per value of the rate not on the x axis
        lines = {}
        for p in s.rate_mean:
            x, other = (p[1], p[0]) if axis == "lr_other" else p
            if x is not None:
                lines.setdefault(other, []).append((x, p))
        for other, pts in lines.items():
            if len(pts) < 2:
                continue
            pts.sort()
            label = s.arm.name + (f" (other {other:g})" if axis == "lr" and other is not None and len(lines) > 1 else "")
            ax.plot([x for x, _ in pts], [s.rate_mean[p] for _, p in pts], "o-", color=f"C{i % 10}", label=label)
            for x, p in pts:
                ax.plot([x] * len(s.by_rate[p]), [d.final_loss for d in s.by_rate[p]], ".", color=f"C{i % 10}", ms=3)
    ax.set_xscale("log")
    plain_log_ticks(ax, "x")
    ax.set(title="learning-rate sweeps (seed means; dots: seeds)", xlabel=AXIS_LABEL[axis],
           ylabel="final validation loss (nats)")
    if ax.lines:
        ax.legend(fontsize=8)
    return save(fig, out, "lr_curves.png")


def plot_regions(summaries, baseline, out):
    others = [s for s in summaries.values() if s.ok and s is not baseline]
    fig, ax = plt.subplots(figsize=(8, 4))
    width = 0.8 / max(1, len(others))
    for k, s in enumerate(others):
        ys = [None if s.final_mean(f"val_loss_{r}", REGION_DOCS) is None or baseline.final_mean(f"val_loss_{r}", REGION_DOCS) is None
              else s.final_mean(f"val_loss_{r}", REGION_DOCS) - baseline.final_mean(f"val_loss_{r}", REGION_DOCS) for r in REGIONS]
        ax.bar([i + k * width for i in range(len(REGIONS))], [y or 0 for y in ys], width, label=s.arm.name)
    ax.axhline(0, color="k", lw=0.8)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(REGIONS))], REGIONS)
    ax.set(title=f"validation loss per region, whole documents: arm − {baseline.arm.name}", xlabel="target region",
           ylabel=f"Δ validation loss vs {baseline.arm.name} (nats)")
    if others:
        ax.legend(fontsize=8)
    return save(fig, out, "regions.png")


def plot_exercises(summaries, baseline, exercises, out):
    others = [s for s in summaries.values() if s.ok and s is not baseline]
    grid = [[(s.exercise_mean(e, "all") - baseline.exercise_mean(e, "all"))
             if s.exercise_mean(e, "all") is not None and baseline.exercise_mean(e, "all") is not None else float("nan")
             for s in others] for e in exercises]
    # (at least as wide as the title: one arm beside the baseline clipped it)
    fig, ax = plt.subplots(figsize=(max(4.5, 1.5 + 1.2 * len(others)), 1 + 0.45 * len(exercises)))
    finite = [abs(v) for row in grid for v in row if v == v]
    lim = max(finite) if finite else 1.0
    im = ax.imshow(grid, cmap="RdBu_r", vmin=-lim, vmax=lim, aspect="auto")
    ax.set_xticks(range(len(others)), [s.arm.name for s in others], rotation=30, ha="right")
    ax.set_yticks(range(len(exercises)), exercises)
    for i, row in enumerate(grid):
        for j, v in enumerate(row):
            if v == v:
                ax.text(j, i, f"{v:+.3f}", ha="center", va="center", fontsize=7)
    fig.colorbar(im, ax=ax, label=f"arm − {baseline.arm.name} (nats)")
    ax.set(title="validation loss per exercise", xlabel="arm", ylabel="exercise")
    return save(fig, out, "exercises.png")


LAYER_MEASURE_LABEL = {"erank": "effective rank (dimensions)",
                       "max_logit": "largest |pre-softmax logit| (q·k / √d_head)"}


def plot_layers(summaries, key, title, out, name, log=False):
    fig, ax = plt.subplots(figsize=(7, 4))
    drawn = False
    for i, s in enumerate(summaries.values()):
        rep = s.representative
        if rep is None or not rep.final.get(key):
            continue
        values = rep.final[key]
        ax.plot(layer_numbers(values), values, "o-", ms=3, color=f"C{i % 10}", label=s.arm.name)
        drawn = True
    if not drawn:
        plt.close(fig)
        return None
    if log:
        ax.set_yscale("log")
        plain_log_ticks(ax)
    ax.set(title=title + "\n(end of training, each arm's representative run)", ylabel=LAYER_MEASURE_LABEL.get(key, key))
    layer_axis(ax)
    ax.legend(fontsize=8)
    return save(fig, out, name)


GATE_STYLES = (("gate_attn", "-", "attention gate"), ("gate_ffn", "--", "FFN gate"))


def plot_gates(summaries, out):
    reps = [s for s in summaries.values() if s.representative and s.representative.val
            and s.representative.val[-1].get("gate_attn")]
    if not reps:
        return None
    fig, axes = grid_of_axes(len(reps))
    fig.set_layout_engine("constrained")  # (room for the colour bar and the legend of line styles)
    n_layers = max(len(s.representative.val[-1]["gate_attn"]) for s in reps)
    layer_color, mappable = layer_colormap(n_layers)
    for ax, s in zip(axes, reps):
        val = [r for r in s.representative.val if r.get("gate_attn")]
        unit, unit_name = curves.token_unit(val[-1]["step"] * s.representative.tokens_per_step)
        tok = [r["step"] * s.representative.tokens_per_step / unit for r in val]
        for key, style, kind in GATE_STYLES:
            if not val[-1].get(key):
                continue
            for layer in range(len(val[-1][key])):
                # the line-style legend needs one labelled line per kind of gate
                ax.plot(tok, [r[key][layer] for r in val], color=layer_color(layer), lw=1, ls=style,
                        label=kind if layer == 0 else None)
        ax.set(title=f"{s.arm.name}: gates", xlabel=curves.token_axis_label(unit_name))
    axes[0].set_ylabel("gate value (sigmoid(g), or g for rezero)")
    layer_colorbar(fig, axes[:len(reps)], mappable, n_layers)
    legend = figure_legend(fig, axes[:len(reps)])
    for handle in legend.legend_handles:  # the legend is of line styles; the colour bar says the layer
        handle.set_color("0.3")
    return save(fig, out, "gates.png", tight=False)


def spectra_of(summaries):
    """{arm: stable ranks of the representative run's final checkpoint} where it exists."""
    result = {}
    for s in summaries.values():
        rep = s.representative
        if rep is None:
            continue
        path = os.path.join(rep.run.dir, "ckpt", "final.bin")
        if os.path.exists(path):
            result[s.arm.name] = spectra.checkpoint_spectra(path)
    return result


def milestone_spectra(summaries):
    """{arm: spectra of the representative run's milestone checkpoints, in step order}, for
    arms with at least two milestones."""
    result = {}
    for s in summaries.values():
        rep = s.representative
        if rep is None:
            continue
        paths = sorted(glob.glob(os.path.join(rep.run.dir, "ckpt", "milestone_*.bin")))
        if len(paths) >= 2:
            result[s.arm.name] = sorted((spectra.checkpoint_spectra(p) for p in paths), key=lambda r: r["step"])
    return result


def mean_stable_rank(sp, kind):
    return spectra.layer_mean(sp["stable_rank"][kind])


STABLE_RANK_LABEL = "stable rank ‖W‖²_F / σ²_max"


def kind_color(kind):
    """A matrix kind's colour, the same in every panel (an arm without FFN matrices shifts no colour)."""
    return f"C{spectra.MATRIX_KINDS.index(kind) % 10}"


def plot_spectra_training(milestones, out):
    fig, axes = grid_of_axes(len(milestones))
    fig.set_layout_engine("constrained")
    for ax, (arm, series) in zip(axes, milestones.items()):
        steps = [r["step"] for r in series]
        for kind in (k for k in spectra.MATRIX_KINDS if k in series[-1]["stable_rank"]):
            ax.plot(steps, [mean_stable_rank(r, kind) for r in series], "o-", ms=3, color=kind_color(kind), label=kind)
        ax.set(title=f"{arm}: stable rank (mean over layers)", xlabel="training step")
    axes[0].set_ylabel(STABLE_RANK_LABEL)
    figure_legend(fig, axes[:len(milestones)])
    return save(fig, out, "stable_rank_training.png", tight=False)


def plot_spectra(spec, out):
    kinds = [k for k in spectra.MATRIX_KINDS if any(k in sp["stable_rank"] for sp in spec.values())]
    if not kinds:
        return None
    fig, axes = grid_of_axes(len(kinds), panel=(3.2, 3.4), layout="constrained")  # (7 kinds: two rows)
    for ax, kind in zip(axes, kinds):
        for i, (arm, sp) in enumerate(spec.items()):
            if kind in sp["stable_rank"]:
                per_layer = spectra.plottable(sp["stable_rank"][kind])
                ax.plot(layer_numbers(per_layer), per_layer, "o-", ms=3, color=f"C{i % 10}", label=arm)
        ax.set_title(kind)
        layer_axis(ax)
    for ax in axes[::4]:
        ax.set_ylabel(STABLE_RANK_LABEL)
    # every arm, the SAN too: it has no FFN matrices, so a legend on the last (FFN) panel left it out
    figure_legend(fig, axes[:len(kinds)])
    return save(fig, out, "spectra.png", tight=False)


# ----------------------------------------------------------------------------------------
# the report

def context_length_section(study, summaries):
    """The Deconstructing paper's Table 4 ([study.context_eval]): per rolling eval set, the word
    perplexity of each arm (rows) at each context (columns), from the `--steps 0 --init-from
    final.bin --eval-context ...` evaluation of its runs (study/runner.py post_evals); seed
    means at each arm's rate, "—" unless every one of those runs has the number."""
    if not study.context_eval:
        return []
    contexts = study.context_eval["contexts"]
    md = ["## Perplexity by context length", "",
          "Word perplexity of each rolling eval set scored in windows of each context (lm-eval's rolling "
          "log-likelihood with that maximum length; `--eval-context`), from the final checkpoint of each run "
          "(`--steps 0 --init-from final.bin`), seed means at each arm's rate: the Deconstructing paper's "
          "Table 4 (doc/deconstructing.md).", ""]
    records = {d.run.id: run_files.read_evals(run_files.post_eval_log(d.run, "context"))
               for s in summaries.values() for d in s.runs}

    def word_perplexity(s, name, n):
        values = []
        for d in s.runs:
            evals = records[d.run.id]
            values.append(evals[max(evals)].get(name, {}).get(f"word_perplexity@{n}") if evals else None)
        return sum(values) / len(values) if values and None not in values else None

    for path in study.context_eval["sets"]:
        name = os.path.basename(path)[:-4] if path.endswith(".bin") else os.path.basename(path)
        rows = [[s.arm.name] + [fmt(word_perplexity(s, name, n), 2) for n in contexts]
                for s in summaries.values() if s.ok] + paper_tables.context_rows(study, name, contexts)
        md += [f"`{name}` ({path}):", "", table(["arm"] + [str(n) for n in contexts], rows), ""]
    return md


class Report:
    """What every section of a study's report reads: the study, why arms were not run, the
    output directory, each run's data and each arm's summary, the baseline and the noise floor."""

    def __init__(self, study, why, out):
        self.study, self.why, self.out = study, why, out
        self.data = [RunData(run, study.tokens_per_step, why.get(run.arm.name)) for run in study.runs]
        self.summaries = {arm.name: ArmSummary(arm, self.data) for arm in study.arms}
        self.baseline = self.summaries[study.baseline]
        self.floor = noise_floor(self.summaries.values())
        self.milestones = {}  # {arm: milestone spectra}: filled by spectra_sections, read by the findings


def write_report(study, why, out=None):
    """report.md and its PNG plots in `out` (default OUT/report); returns report.md's path."""
    out = out or os.path.join(study.out, "report")
    os.makedirs(out, exist_ok=True)
    r = Report(study, why, out)
    md = [f"# Study {study.name}", ""]
    if study.note:
        md += [study.note, ""]
    md += [f"Study file `{study.path}`; {len(study.runs)} runs of {study.steps} steps x "
           f"{study.tokens_per_step:,} tokens ({study.steps * study.tokens_per_step:,} tokens each); "
           f"baseline arm `{study.baseline}`. Definitions: doc/study.md (\"Report\").", ""]
    md += runs_section(r) + final_loss_section(r) + eval_sets_section(r) + paper_tables.paper_sections(r)
    md += context_length_section(study, r.summaries)
    md += rate_sweep_section(r) + region_sections(r) + measurements_section(r) + spectra_sections(r)
    md += skip_section(study, r.summaries) + findings_section(r)
    path = os.path.join(out, "report.md")
    with open(path, "w") as fh:
        fh.write("\n".join(md))
    return path


def runs_section(r):
    md = ["## Runs", ""]
    rows = []
    for d in r.data:
        done = d.train[-1]["step"] if d.train else 0
        rows.append([d.run.id, d.run.arm.name, d.rates_text, d.run.seed, d.state, f"{done}/{r.study.steps}",
                     fmt(d.final_loss)])
    md += [table(["run", "arm", "rates", "seed", "state", "steps", "final val loss"], rows), ""]
    absent = [f"`{a.name}` ({r.why[a.name]})" for a in r.study.arms if r.why.get(a.name)]
    if absent:
        md += ["Arms not run: " + "; ".join(absent) + ".", ""]
    diverged = [d for d in r.data if d.state == "diverged"]
    if diverged:
        md += ["Diverged: " + "; ".join(f"`{d.run.id}` at step {d.status.get('step')}" for d in diverged) + ".", ""]
    guarded = [d for d in r.data if d.state == "guard"]
    if guarded:  # (a finite loss jump: a divergence, or the data's; not counted as diverged)
        md += ["Stopped by the guard (a loss jump; `--spike-guard 0` in the arm's flags passes it, running again "
               "retries): " + "; ".join(f"`{d.run.id}` at step {d.status.get('step')}" for d in guarded) + ".", ""]
    return md


def final_loss_section(r):
    summaries, baseline = r.summaries, r.baseline
    md = ["## Final validation loss per arm", ""]
    whole_docs = baseline.ok and baseline.whole_docs_mean() is not None
    rows = []
    for s in summaries.values():
        nonemb, flops = arm_size(s)
        delta = s.mean - baseline.mean if s.ok and baseline.ok else None
        rows.append([s.arm.name, f"{nonemb:,}", f"{flops / 1e6:.2f}", s.rates_text, len(s.runs),
                     fmt(s.mean), fmt(s.sd), fmt(delta, signed=True)])
        if whole_docs:
            v, b = s.whole_docs_mean() if s.ok else None, baseline.whole_docs_mean()
            rows[-1] += [fmt(v), fmt(v - b if v is not None and b is not None else None, signed=True)]
    extra = ["whole docs", "Δ whole docs"] if whole_docs else []
    md += [table(["arm", "non-emb params", "MFLOPs/token", "rates", "seeds", "val loss", "sd", f"Δ vs {r.study.baseline}"]
                 + extra, rows), ""]
    if whole_docs:
        md += ["The val loss is over windows of the validation data (the SAN paper's headline); \"whole docs\" is "
               "the same validation on whole documents (--val-whole-docs 2).", ""]
    md += [f"Noise floor (pooled seed-to-seed sd): {fmt(r.floor)} nats.", ""]
    if any(s.ok for s in summaries.values()):
        md += [f"![final loss]({plot_final(summaries, r.floor, baseline, r.out)})", "",
               f"![loss curves]({plot_loss_curves(summaries, r.out)})", ""]
    return md


def eval_sets_section(r):
    """The trainer's --eval-sets: their metrics at the end, seed means at each arm's rate."""
    columns = []
    for s in r.summaries.values():
        for d in s.runs:
            for name, metrics in d.final_eval.items():
                for metric in EVAL_METRICS:
                    if metric in metrics and (name, metric) not in columns:
                        columns.append((name, metric))
    if not columns:
        return []
    rows = [[s.arm.name] + [fmt(s.eval_mean(name, metric), 4) for name, metric in columns]
            for s in r.summaries.values() if s.ok]
    return ["## Eval sets", "", "Scored by the trainer at the end of each run as lm-evaluation-harness scores them "
            "(doc/san-model.md \"Validation and measurements\"); seed means at each arm's rate.", "",
            table(["arm"] + [f"{name} {metric}" for name, metric in columns], rows), ""]


def rate_sweep_section(r):
    swept = [s for s in r.summaries.values() if len(s.rate_mean) > 1]
    if not swept:
        return []
    md = ["## Learning-rate sweeps", ""]
    points = sorted({p for s in swept for p in s.rate_mean}, key=run_files.rate_order)
    md += [table(["arm"] + [f"lr {run_files.rate_label(p)}" for p in points],
                 [[s.arm.name] + [fmt(s.rate_mean.get(p)) for p in points] for s in swept]), ""]
    differ = []  # the grid is what the study asked; a trainer may scale it (--lr-scale-gpus, --paper-setup)
    for s in swept:
        for p in sorted(s.by_rate, key=run_files.rate_order):
            for key, asked in zip(("lr", "lr_other"), p):
                if asked is None:
                    continue
                used = sorted({d.rates[key] for d in s.by_rate[p]
                               if d.rates and d.rates["source"] == "header" and d.rates.get(key) is not None})
                if any(not math.isclose(u, asked, rel_tol=1e-6) for u in used):
                    differ.append(f"{s.arm.name} {'' if key == 'lr' else '--lr-other '}{asked:g} ran at "
                                  f"{', '.join(f'{u:g}' for u in used)}")
    if differ:
        md += ["The columns are the rates the study file asks for; their log headers say some runs trained at "
               "others: " + "; ".join(differ) + ".", ""]
    md += [f"![lr]({plot_lr(r.summaries, r.out)})", ""]
    return md


def region_sections(r):
    """Loss per region (and on training documents), then per exercise; none without regions."""
    summaries, baseline = r.summaries, r.baseline
    if not (baseline.ok and baseline.final_mean("val_loss_query", REGION_DOCS) is not None):
        return []
    md = ["## Loss per region", "", f"Final validation loss per target region on whole held-out documents "
          f"(--val-whole-docs; windows are not used for regions); Δ = arm − {r.study.baseline}.", ""]
    rows = []
    for s in summaries.values():
        if not s.ok:
            continue
        row = [s.arm.name]
        for region in REGIONS:
            v, b = s.final_mean(f"val_loss_{region}", REGION_DOCS), baseline.final_mean(f"val_loss_{region}", REGION_DOCS)
            row += [fmt(v), fmt(v - b if v is not None and b is not None else None, signed=True)]
        rows.append(row)
    md += [table(["arm"] + [x for region in REGIONS for x in (region, f"Δ {region}")], rows), ""]
    if len(rows) > 1:
        md += [f"![regions]({plot_regions(summaries, baseline, r.out)})", ""]
    return md + train_docs_region_table(summaries, baseline) + exercise_section(r)


def exercise_section(r):
    summaries, baseline = r.summaries, r.baseline
    exercises = baseline.exercises()
    if not exercises:
        return []
    md = ["## Loss per exercise", "", f"Δ = arm − {r.study.baseline}, per exercise over all its targets and per region.", ""]
    others = [s for s in summaries.values() if s.ok and s is not baseline]
    rows = []
    for e in exercises:
        for region in ("all",) + REGIONS[:3]:
            b = baseline.exercise_mean(e, region)
            if b is None:
                continue
            row = [e, region, fmt(b)]
            for s in others:
                v = s.exercise_mean(e, region)
                row.append(fmt(v - b if v is not None else None, signed=True))
            rows.append(row)
    md += [table(["exercise", "region", r.study.baseline] + [f"Δ {s.arm.name}" for s in others], rows), ""]
    if others:
        md += [f"![exercises]({plot_exercises(summaries, baseline, exercises, r.out)})", ""]
    return md


def measurements_section(r):
    summaries, out = r.summaries, r.out
    md = ["## Measurements per layer", "",
          "Of each arm's representative run (its first seed at its rate), at the last validation.", ""]
    rows = []
    for s in summaries.values():
        rep = s.representative
        if rep is None:
            continue
        f = rep.final
        rows.append([s.arm.name, fmt(f.get("gate_attn_mean"), 3), fmt(f.get("gate_ffn_mean"), 3),
                     fmt(f.get("erank_mean"), 2), fmt(f.get("max_logit_mean"), 2),
                     fmt(max(f["max_logit"]) if f.get("max_logit") else None, 2)])
    md += [table(["arm", "gate attn (mean)", "gate ffn (mean)", "effective rank (mean)", "max logit (mean)",
                  "max logit (largest)"], rows), ""]
    for name in (plot_gates(summaries, out),
                 plot_layers(summaries, "erank", "effective rank of the residual stream", out, "erank.png"),
                 plot_layers(summaries, "max_logit", "largest pre-softmax logit", out, "max_logit.png", log=True)):
        if name:
            md += [f"![{name}]({name})", ""]
    md += attention_patterns.report_section(attention_patterns.groups_of_arms(  # radar plots, logit distributions
        [(s.arm.name, s.arm.common + s.arm.flags, s.representative.final) for s in summaries.values()
         if s.representative is not None]), out)
    return md


def spectra_sections(r):
    """The final checkpoints' stable ranks, and over training at the milestones (kept in r.milestones)."""
    md = []
    spec = spectra_of(r.summaries)
    if spec:
        md += ["## Weight spectra", "", "Stable rank ‖W‖²_F / σ²_max of each matrix, final checkpoint of each arm's "
               "representative run, mean over layers (per layer in the plot; study/spectra.py for milestones).", ""]
        kinds = [k for k in spectra.MATRIX_KINDS if any(k in sp["stable_rank"] for sp in spec.values())]
        rows = [[arm] + [fmt(mean_stable_rank(sp, k), 2) if k in sp["stable_rank"] else "—"
                         for k in kinds] for arm, sp in spec.items()]
        md += [table(["arm"] + kinds, rows), ""]
        name = plot_spectra(spec, r.out)
        if name:
            md += [f"![spectra]({name})", ""]
    r.milestones = milestones = milestone_spectra(r.summaries)
    if milestones:
        md += ["### Stable rank over training", "",
               "Mean over layers, at the milestone checkpoints of each arm's representative run.", ""]
        rows = []
        for arm, series in milestones.items():
            for kind in (k for k in spectra.MATRIX_KINDS if k in series[-1]["stable_rank"]):
                rows.append([arm, kind] + [fmt(mean_stable_rank(x, kind), 2) for x in series])
        width = max(len(series) for series in milestones.values())
        steps = next(series for series in milestones.values() if len(series) == width)
        md += [table(["arm", "matrix"] + [f"step {x['step']}" for x in steps], rows), ""]
        md += [f"![stable rank over training]({plot_spectra_training(milestones, r.out)})", ""]
    return md


def findings_section(r):
    """Each finding by its own rule, then the report's findings as one family (findings.judge_study):
    one that would show alone but does not pass its Holm threshold does not show."""
    if not r.study.findings:
        return []
    judged = []  # [(verdict, text, p)] by the finding's own rule
    for f in r.study.findings:
        milestones = (r.milestones,) if f["kind"] == "spectra" else ()
        judged.append(JUDGES[f["kind"]](f, r.summaries, r.floor, r.why, *milestones))
    results = [(v, p if v in (SHOWS, SHOWS_SHORT, DOES_NOT_SHOW) else None) for v, _, p in judged]
    family, m = findings.judge_study(results), sum(p is not None for _, p in results)
    md = ["## Findings", "", Rule("unpaired", r.floor).describe(trend=False), ""]
    for f, (own, text, p), (verdict, thr) in zip(r.study.findings, judged, family):
        if own in (SHOWS, SHOWS_SHORT, DOES_NOT_SHOW):
            text += family_text(own, verdict, p, thr, m)
        md += [f"### {f.get('title', findings.KINDS[f['kind']].title)}", "", f"**{verdict}.** {text}", ""]
        md += finding_rates(f, r.summaries)
    return md


def family_text(own, verdict, p, thr, m):
    """The sentence on a judged finding's place in the report's family of m findings."""
    if verdict != own:
        return (f" Alone it would show, but its p = {p:.3g} does not pass its Holm threshold "
                + (f"{thr:.3g}" if thr is not None else "(the step-down stopped before it)")
                + f" among the report's {m} findings, one family: it does not show.")
    if verdict == DOES_NOT_SHOW:
        return f" Its p = {p:.3g}" + (f" (Holm threshold {thr:.3g})." if thr is not None else
                                      " (Holm's step-down stopped before it).")
    return f" Its p = {p:.3g} passes its Holm threshold {thr:.3g} (the report's {m} findings are one family)."
