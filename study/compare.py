"""
compare.py: training runs side by side: a table of what each ran and where it ended (overall and
per region, on held-out and training documents), what made each (its log header), and a PNG of
their loss curves.

    python -m study compare RUN... [--out PATH] [--x tokens|steps]

A RUN is a run directory, a JSONL log, or a study's output directory (doc/study.md "Comparing
runs"); for curves while runs train, study/to_tensorboard.py.
"""
import argparse
import glob
import os
import sys

from study import curves
from study import runs as run_files

REGIONS = ("query", "trace", "answer")


class CompareError(Exception):
    pass


def log_paths(arg):
    """The JSONL logs of a RUN argument: a run directory's log.jsonl, the file named, or every run's
    of a study's output directory (OUT/runs/<id>/log.jsonl, in name order)."""
    if os.path.isfile(arg):
        return [arg]
    if os.path.isfile(os.path.join(arg, "log.jsonl")):
        return [os.path.join(arg, "log.jsonl")]
    study_runs = sorted(glob.glob(os.path.join(glob.escape(arg), "runs", "*", "log.jsonl")))
    if study_runs:
        return study_runs
    raise CompareError(f"{arg}: " + ("the directory holds no log.jsonl (nor runs/*/log.jsonl)" if os.path.isdir(arg)
                                     else "no such file"))


class RunLog:
    """One run's log, read once: header, training and validation records, rates, tokens per step."""

    def __init__(self, path):
        self.path = path
        self.header = run_files.run_header(self.path)
        # A run resumed into a directory of its own logs from its resume step on: its curves take
        # the steps before from the log it resumed from, so that they, and the smoothing that
        # runs over them, equal those of the run had it gone straight through.
        self.resumed_from = run_files.resumed_from_log(self.path)
        self.train, self.val = run_files.read_log(self.path, history=True)
        if not self.train and not self.val:
            raise CompareError(f"{self.path}: no training or validation records (doc/formats.md \"Training log\")")
        self.rates = run_files.rates_used(self.path, self.header or {}, self.train)
        self.tokens_per_step = run_files.tokens_per_step(self.header)
        self.final = self.val[-1] if self.val else {}
        self.steps = max(r["step"] for r in self.train + self.val)
        self.name = None

    def final_loss(self, region=None, of="held_out"):
        """The last validation's loss (of a region; of the training-document sample), or None."""
        rec = self.final.get("train_docs", {}) if of == "train_docs" else self.final
        return rec.get("val_loss" if region is None else f"val_loss_{region}")


def name_runs(runs):
    """Names each run (anything with a .path) by its directory (a log named otherwise: by the file,
    without .jsonl), with as many parent folders as it takes to tell runs of the same name apart."""
    def parts(run):
        path = os.path.abspath(run.path)
        if os.path.basename(path) == "log.jsonl":
            path = os.path.dirname(path)
        elif path.endswith(".jsonl"):
            path = path[:-len(".jsonl")]
        return path.split(os.sep)

    depth = 1
    while True:
        names = ["/".join(parts(r)[-depth:]) for r in runs]
        if len(set(names)) == len(names) or depth > max(len(parts(r)) for r in runs):
            break
        depth += 1
    for run, name in zip(runs, names):
        run.name = name


def fmt_loss(x):
    return "—" if x is None else f"{x:.4f}"


def table_rows(runs):
    """(header, rows) of the comparison; the region and training-document columns only when some run logged them."""
    header = ["run", "steps", "tokens", "non-emb params", "MFLOPs/token", "rates", "val at", "val loss"]
    regions = [r for r in REGIONS if any(run.final_loss(r) is not None for run in runs)]
    docs = any(run.final_loss(of="train_docs") is not None for run in runs)
    docs_regions = [r for r in REGIONS if any(run.final_loss(r, "train_docs") is not None for run in runs)] if docs else []
    header += regions + (["train docs"] if docs else []) + [f"docs {r}" for r in docs_regions]
    rows = []
    for run in runs:
        tokens = f"{run.steps * run.tokens_per_step:,}" if run.tokens_per_step else "?"
        h = run.header or {}  # (the trainer's counts, as the study report's arm table shows them)
        nonemb, flops = h.get("non_embedding"), h.get("flops_per_token")
        row = [run.name, str(run.steps), tokens, f"{nonemb:,}" if isinstance(nonemb, int) else "?",
               f"{flops / 1e6:.2f}" if isinstance(flops, (int, float)) else "?", run_files.fmt_rates(run.rates),
               str(run.final["step"]) if run.final else "—", fmt_loss(run.final_loss())]
        row += [fmt_loss(run.final_loss(r)) for r in regions]
        if docs:
            row += [fmt_loss(run.final_loss(of="train_docs"))]
            row += [fmt_loss(run.final_loss(r, "train_docs")) for r in docs_regions]
        rows.append(row)
    return header, rows


def format_table(header, rows):
    """Columns two spaces apart (no cell holds two spaces in a row, so the table splits back on them)."""
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows)]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip() for row in [header] + rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def provenance(run):
    """What made the run, from its log header: the command, commit and build (or that the log has no header)."""
    h = run.header or {}
    if not h:
        return f"{run.name}: no header record (a log from before the trainers wrote one)"
    parts = []
    if h.get("git_commit"):
        parts.append(f"commit {h['git_commit']}" + (" (dirty)" if h.get("git_dirty") else ""))
    build = ", ".join(str(h[k]) for k in ("executor", "precision") if h.get(k))
    if build:
        parts.append(build)
    if h.get("ranks"):
        parts.append(f"{h['ranks']} rank" + ("s" if h["ranks"] != 1 else ""))
    if h.get("started"):
        parts.append(f"started {h['started']}")
    line = f"{run.name}: " + "; ".join(parts)
    return line + (f"\n  $ {h['command']}" if h.get("command") else "")


def history_note(run):
    """Where the steps of a run resumed into a directory of its own come from, or None."""
    if run.resumed_from is None:
        return None
    log, step = run.resumed_from
    if log is None:
        return (f"{run.name}: resumed at step {step} from a run whose log was not found; its curves start at step "
                f"{step + 1}, their smoothing there")
    return f"{run.name}: steps up to {step} from {log} (the run it resumed from)"


def plot(runs, out, x_axis):
    from study.plots import plt

    if x_axis == "tokens":
        unit, unit_name = curves.token_unit(max(r.steps * r.tokens_per_step for r in runs))
        xlabel = curves.token_axis_label(unit_name)

        def xs(run, records):
            return [rec["step"] * run.tokens_per_step / unit for rec in records]
    else:
        xlabel = "training step"

        def xs(run, records):
            return [rec["step"] for rec in records]

    fig, (train_ax, val_ax) = plt.subplots(1, 2, figsize=(12, 4.8), layout="constrained")
    for i, run in enumerate(runs):
        color = f"C{i % 10}"
        label = f"{run.name} ({run_files.fmt_rates(run.rates)})"
        if run.train:
            curves.plot_raw_and_smoothed(train_ax, xs(run, run.train), [r["loss"] for r in run.train], color, label)
        if run.val:
            val_ax.plot(xs(run, run.val), [r["val_loss"] for r in run.val], "o-", color=color, ms=3, lw=1.2,
                        label=None if run.train else label)
    train_ax.set(title=f"training loss ({curves.SMOOTHING_NOTE})", xlabel=xlabel, ylabel=curves.LOSS_AXIS_LABEL)
    val_ax.set(title="validation loss", xlabel=xlabel, ylabel=curves.LOSS_AXIS_LABEL)
    fig.suptitle("Loss curves: " + ", ".join(r.name for r in runs), fontsize=11, wrap=True)
    fig.legend(loc="outside lower center", ncols=min(3, len(runs)), fontsize=8, frameon=False)
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main(argv=None):
    ap = argparse.ArgumentParser(
        description="Compares training runs: a table of final validation losses (overall, per region, on training "
                    "documents) with each run's steps, tokens and rates, and a PNG of their loss curves.",
        epilog="RUN: a run directory holding log.jsonl, or a JSONL log. For TensorBoard, study/to_tensorboard.py.")
    ap.add_argument("runs", nargs="+", metavar="RUN", help="run directory, JSONL log, or a study's output directory (its runs)")
    ap.add_argument("--out", help="the loss-curve PNG (default: compare.png beside the first run's log)")
    ap.add_argument("--x", choices=("tokens", "steps"), default="tokens",
                    help="the curves' x axis (tokens needs every log's header config; else steps, said so)")
    args = ap.parse_args(argv)
    try:
        runs = [RunLog(path) for arg in args.runs for path in log_paths(arg)]
    except CompareError as e:
        sys.stderr.write(f"compare.py: {e}\n")
        return 2
    name_runs(runs)
    print(format_table(*table_rows(runs)))
    print()
    for run in runs:
        print(provenance(run))
    notes = [n for n in map(history_note, runs) if n]
    if notes:
        print("\n" + "\n".join(notes))
    x_axis = args.x
    if x_axis == "tokens" and not all(r.tokens_per_step for r in runs):
        unknown = ", ".join(r.name for r in runs if not r.tokens_per_step)
        print(f"\ncurves against steps: the tokens per step of {unknown} are unknown (no config in the log header)")
        x_axis = "steps"
    out = args.out or os.path.join(os.path.dirname(os.path.abspath(runs[0].path)), "compare.png")
    plot(runs, out, x_axis)
    print(f"\nwrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
