"""
runs.py: what a study run's directory holds, read (and its status written) for
study/runner.py, which runs studies, and the reports (study/report.py, study/ladder_report.py:
RunData, one run as they read it); a module of its own, so that neither side imports the other:

  status.json   the runner's record of the run: {"state": "done" | "diverged" | "guard" | "failed" | "interrupted", ...}
  log.jsonl     the trainer's JSONL log (doc/formats.md "Training log")
  eval_NAME.jsonl, eval_NAME.json
                an evaluation of the final checkpoint (study/runner.py post_evals): its log,
                and the runner's record that it finished ({"flags": [...]})

Runs are anything with a `.dir` (study/runner.py's Run). The readers of one log (run_header,
rates_used, tokens_per_step, read_log) serve study/compare.py and study/to_tensorboard.py too.
"""
import json
import os


def read_status(run):
    """The run's status.json, or None when there is none (or it is unreadable)."""
    try:
        with open(os.path.join(run.dir, "status.json")) as f:
            return json.load(f)
    except (OSError, json.JSONDecodeError):
        return None


def write_status(run, state, **extra):
    tmp = os.path.join(run.dir, "status.json.tmp")
    with open(tmp, "w") as f:
        json.dump(dict(state=state, **extra), f)
        f.write("\n")
    os.replace(tmp, os.path.join(run.dir, "status.json"))


def post_eval_log(run, name):
    return os.path.join(run.dir, f"eval_{name}.jsonl")


def post_eval_record(run, name):
    return os.path.join(run.dir, f"eval_{name}.json")


def step_records(path):
    """The records of a JSONL log that carry a step, in file order, as the run that went on wrote
    them: a resume record {"step": K, "resume": ...} drops the records of steps after K before it
    (logged after that checkpoint, before the run stopped; doc/formats.md "Training log"). Lines
    that do not parse (a run killed mid-write) are skipped; a log that cannot be read has none."""
    try:
        with open(path) as f:
            return resolve_resumes(f)
    except OSError:
        return []


def step_record(line):
    """The record of a log line if it carries a step, else None (a header, or a line cut short)."""
    try:
        rec = json.loads(line)
    except json.JSONDecodeError:
        return None
    return rec if isinstance(rec, dict) and "step" in rec else None


def resolve_resumes(lines):
    """step_records of the lines of a log (text lines, in file order)."""
    records = []
    for rec in filter(None, map(step_record, lines)):
        if "resume" in rec:
            records = [r for r in records if r["step"] <= rec["step"]]
        records.append(rec)
    return records


def first_resume(path):
    """(resume record, the header record before it) when the log's first step record is a resume
    record: a run resumed into a directory of its own (`--resume A/step_K.bin --run-dir B`),
    whose log starts at step K + 1; else None. (A run resumed in its own directory continues its
    log, and an extension's log starts as a copy of the saved run's: both hold the steps up to K.)"""
    header = None
    try:
        with open(path) as f:
            for line in f:
                header = header_of(line) or header
                rec = step_record(line)
                if rec is not None:
                    return (rec, header) if "resume" in rec else None
    except OSError:
        pass
    return None


def log_of_checkpoint_dir(directory):
    """The log of the run that saved checkpoints into `directory`: a run directory's log.jsonl,
    or a study run's (OUT/runs/<id>/ckpt/ beside OUT/runs/<id>/log.jsonl); None when neither is there."""
    for log in (os.path.join(directory, "log.jsonl"), os.path.join(os.path.dirname(directory), "log.jsonl")
                if os.path.basename(os.path.normpath(directory)) == "ckpt" else None):
        if log and os.path.isfile(log):
            return log
    return None


def resumed_from_log(path):
    """(log, K) of the run that a log resumed from when the log starts at its resume record
    (first_resume): the log beside the checkpoint it names, which holds the steps up to K. The
    checkpoint's path is as the trainer was given it, relative to where it ran: that is found
    from the header's run_dir (the log lies at WHERE/run_dir/log.jsonl), else taken from here,
    else as a sibling of the log's directory (runs/A beside runs/B). The checkpoint itself need
    not exist any more (pruned, or deleted once the run finished). (None, K) when no such log is
    found; None when the log does not start at a resume."""
    found = first_resume(path)
    if found is None:
        return None
    rec, header = found
    checkpoint = str(rec["resume"])
    log_dir = os.path.dirname(os.path.abspath(path))
    bases = []
    run_dir = (header or {}).get("run_dir")
    if isinstance(run_dir, str) and run_dir and not os.path.isabs(run_dir):
        parts = os.path.normpath(run_dir).split(os.sep)
        if log_dir.split(os.sep)[-len(parts):] == parts:
            bases.append(os.sep.join(log_dir.split(os.sep)[:-len(parts)]) or os.sep)
    bases.append(os.getcwd())
    candidates = [os.path.dirname(os.path.join(base, checkpoint)) for base in bases]
    saved_dir = os.path.basename(os.path.dirname(os.path.normpath(checkpoint)))
    if saved_dir:
        candidates.append(os.path.join(os.path.dirname(log_dir), saved_dir))
    for directory in candidates:
        log = log_of_checkpoint_dir(directory)
        if log and not os.path.samefile(log, path):
            return log, rec["step"]
    return None, rec["step"]


def step_records_with_history(path, seen=()):
    """step_records of a log, preceded, when it starts at a resume record (resumed_from_log), by
    the records of steps up to the resume's step K from the log of the run it resumed from (and
    that log's history likewise): the records of the whole run, as a run that went straight
    through would have logged them. Without that log, those of this log alone."""
    origin = resumed_from_log(path)
    key = os.path.abspath(path)
    if not origin or origin[0] is None or os.path.abspath(origin[0]) in seen:
        return step_records(path)
    earlier_log, resume_step = origin
    earlier = [r for r in step_records_with_history(earlier_log, seen + (key,)) if r["step"] <= resume_step]
    return earlier + step_records(path)


def read_log(path, history=False):
    """(train records, validation records) of a JSONL log, one per step: a resumed run
    appends, so a step logged twice (after the last checkpoint, before a crash) keeps its
    last record. history: with the steps before a resume from another run's directory
    (step_records_with_history)."""
    train, val = {}, {}
    for rec in (step_records_with_history(path) if history else step_records(path)):
        if "val_loss" in rec:
            val[rec["step"]] = rec
        elif "loss" in rec:  # not the sample and eval-set records of the same step
            train[rec["step"]] = rec
    return [train[k] for k in sorted(train)], [val[k] for k in sorted(val)]


def read_evals(path):
    """{step: {set: {metric: value}}} of a JSONL log's eval-set records (the trainer's
    --eval-sets; doc/formats.md "Training log"), the last record of each step."""
    return {rec["step"]: rec["eval"] for rec in step_records(path) if isinstance(rec.get("eval"), dict)}


def read_final_eval(run, name):
    """The validation record of the run's evaluation `name` of its final checkpoint
    (eval_NAME.jsonl, study/runner.py post_evals) once it succeeded (its record is written), or None."""
    if not os.path.exists(post_eval_record(run, name)):
        return None
    _, val = read_log(post_eval_log(run, name))
    return val[-1] if val else None


def run_header(path):
    """The "run" record of a JSONL log (doc/formats.md "Training log": what ran, with which
    config, rates, commit and build), or None when the log has none (or cannot be read). A
    resumed run writes a fresh one before its resume record: the last one describes the run
    that went on."""
    header = None
    try:
        with open(path) as f:
            for line in f:
                header = header_of(line) or header
    except OSError:
        pass
    return header


def header_of(line):
    """The "run" dict of a log line that is a header record, else None."""
    if '"run"' not in line:  # (the cheap test, before parsing: most lines are steps)
        return None
    try:
        rec = json.loads(line)
    except json.JSONDecodeError:
        return None
    return rec["run"] if isinstance(rec, dict) and isinstance(rec.get("run"), dict) and "step" not in rec else None


def rates_used(path, header=None, train=None):
    """The peak rates a run trained with: {"optimizer", "lr", "lr_other", "source"}, from the log
    header's "rates" (source "header"), else, for logs written before the header held them, the
    largest rate its training records logged (source "logged": the matrix group's scheduled rate,
    the peak once the run is past its warm-up; optimizer and lr_other unknown, None), else None."""
    header = run_header(path) if header is None else header
    rates = (header or {}).get("rates")
    if isinstance(rates, dict) and isinstance(rates.get("lr"), (int, float)):
        return {"optimizer": rates.get("optimizer"), "lr": float(rates["lr"]),
                "lr_other": float(rates["lr_other"]) if isinstance(rates.get("lr_other"), (int, float)) else None,
                "source": "header"}
    train = read_log(path)[0] if train is None else train
    logged = [r["lr"] for r in train if isinstance(r.get("lr"), (int, float))]
    if logged:
        return {"optimizer": None, "lr": float(max(logged)), "lr_other": None, "source": "logged"}
    return None


def fmt_rates(rates):
    """The rates as a table cell: "adamw 0.0006", "muon 0.02 (rest 0.0003)", "adamw 0.0006 (other
    0.001)"; a rate derived from an older log's training records says so ("0.0006 (max logged)")."""
    if rates is None:
        return "unknown"
    if rates["source"] != "header":
        return f"{rates['lr']:g} (max logged)"
    text = f"{rates['optimizer']} {rates['lr']:g}" if rates.get("optimizer") else f"{rates['lr']:g}"
    other = rates.get("lr_other")
    if other is not None and other != rates["lr"]:
        text += f" ({'rest' if rates.get('optimizer') == 'muon' else 'other'} {other:g})"
    return text


def tokens_per_step(header):
    """Tokens per optimizer step over every rank, from the log header's resolved config
    (--global-batch rows, else batch-size x grad-accum x ranks, times seq-len), or None when the
    header lacks them (older logs)."""
    config = (header or {}).get("config")
    if not isinstance(config, dict):
        return None

    def number(key):
        try:
            return int(float(config[key]))
        except (KeyError, TypeError, ValueError):
            return None

    seq_len, batch = number("seq-len"), number("batch-size")
    accum, ranks, global_batch = number("grad-accum") or 1, header.get("ranks") or 1, number("global-batch") or 0
    rows = global_batch if global_batch > 0 else (batch * accum * ranks if batch else None)
    return rows * seq_len if rows and seq_len and seq_len > 0 else None


def rate_text(rate):
    """One requested rate as reports name it: "0.02", or "default" for None (the trainer's)."""
    return "default" if rate is None else f"{rate:g}"


def rate_key(rate):
    """Sorts requested rates, the trainer's default (None) first."""
    return (rate is not None, rate or 0.0)


def rate_label(point):
    """A requested (lr, lr_other) as reports name it: "0.02", "default", "0.02, other 0.0048"."""
    lr, other = point
    return rate_text(lr) + (f", other {other:g}" if other is not None else "")


def rate_order(point):
    """Sorts rate points, the trainer's defaults (None) first."""
    return tuple(rate_key(x) for x in point)


def swept_axis(arms):
    """Which requested rate a sweep's arms (study.Arm) vary: "lr_other" when each arm has one lr
    and some arm a grid of Muon's AdamW-side rates, else "lr" (a 2-D grid is drawn against lr, a
    line per lr_other)."""
    if all(len(a.lrs) == 1 for a in arms) and any(len(a.lr_others) > 1 for a in arms):
        return "lr_other"
    return "lr"


# What a run's validation ran over (RunData.value): held-out windows, whole held-out documents, and
# the sample of whole training documents. Region and localisation measures read whole documents
# (issue 57): in a window whose document began in an earlier one, the query is not visible.
DOCS = ("windows", "whole_docs", "train_docs")


class RunData:
    """One run as the reports read it: its state, the log's records (train, val, header), the
    rates it trained with, its final validation record and its eval-set scores at the end.
    final is None unless the run finished ("done") and, with final_step, unless its last
    validation is at that step. absent_because: why the run's arm was not run (state "skipped")."""

    def __init__(self, run, tokens_per_step=None, absent_because=None, final_step=None):
        self.run = run
        log = os.path.join(run.dir, "log.jsonl")
        self.status = read_status(run) or {}
        started = os.path.exists(log)
        self.state = self.status.get("state", "unfinished" if started else "skipped" if absent_because else "not run")
        self.train, self.val = read_log(log)
        self.header = run_header(log)
        # the rates the trainer used, not the study's request: an arm without `lr` runs at its
        # preset's default, which only the log knows
        self.rates = rates_used(log, self.header or {}, self.train)
        self.tokens_per_step = tokens_per_step
        done = self.val and self.state == "done"
        self.final = self.val[-1] if done and (final_step is None or self.val[-1]["step"] == final_step) else None
        evals = read_evals(log)
        self.final_eval = evals[max(evals)] if evals and self.state == "done" else {}

    @property
    def final_loss(self):
        return self.final["val_loss"] if self.final else None

    @property
    def ms(self):
        """Milliseconds of its training steps after the first (which pays for warm-up)."""
        return [r["ms"] for r in self.train[1:] if "ms" in r]

    @property
    def rates_text(self):
        """The rates it trained with; a run with no log yet shows the study's request."""
        return fmt_rates(self.rates) if self.rates else rate_label(self.run.rate_point)

    def value(self, key, docs="windows"):
        """A key of its final validation record: on the held-out windows (docs="windows": the
        headline), on whole held-out documents (docs="whole_docs": --val-whole-docs 2 logs them
        as "whole_docs", --val-whole-docs 1 validates on nothing else) or on the sample of whole
        training documents (docs="train_docs", --train-doc-eval); None when it has none."""
        if self.final is None:
            return None
        return self.validation(docs).get(key)

    def validation(self, docs):
        """Its final validation's keys on `docs` (value()), {} when the run did not log them."""
        if docs not in DOCS:
            raise ValueError(f"docs is one of {', '.join(DOCS)}, not {docs!r}")
        if self.final is None:
            return {}
        if docs == "whole_docs" and "whole_docs" not in self.final:
            whole = str(((self.header or {}).get("config") or {}).get("val-whole-docs", "0")) == "1"
            return self.final if whole else {}
        return self.final if docs == "windows" else self.final.get(docs, {})
