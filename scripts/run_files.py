"""
run_files.py: what a study run's directory holds, read (and its status written) for both
scripts/study.py, which runs studies, and scripts/study_report.py, which reports them (a module
of its own, so that neither imports the other):

  status.json   the runner's record of the run: {"state": "done" | "diverged" | "failed", ...}
  log.jsonl     the trainer's JSONL log (doc/formats.md "Training log")
  eval_NAME.jsonl, eval_NAME.json
                an evaluation of the final checkpoint (scripts/study.py post_evals): its log,
                and the runner's record that it finished ({"flags": [...]})

Runs are anything with a `.dir` (scripts/study.py's Run).
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
    records = []
    try:
        with open(path) as f:
            for line in f:
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if not isinstance(rec, dict) or "step" not in rec:
                    continue
                if "resume" in rec:
                    records = [r for r in records if r["step"] <= rec["step"]]
                records.append(rec)
    except OSError:
        pass
    return records


def read_log(path):
    """(train records, validation records) of a JSONL log, one per step: a resumed run
    appends, so a step logged twice (after the last checkpoint, before a crash) keeps its
    last record."""
    train, val = {}, {}
    for rec in step_records(path):
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
    (eval_NAME.jsonl, scripts/study.py post_evals) once it succeeded (its record is written), or None."""
    if not os.path.exists(post_eval_record(run, name)):
        return None
    _, val = read_log(post_eval_log(run, name))
    return val[-1] if val else None
