"""
study: the study layer as a package: controlled studies of train_san arms, scale ladders and
their reports, run as `python -m study COMMAND ...` (study/__main__.py lists the commands;
doc/study.md is the manual).

  spec.py                the study and ladder files: Study / Arm / Run, Ladder; one reader, one writer
  runner.py              run (resumable), slurm, the evaluations of finished runs
  ladder.py              a study at several token budgets (the rungs of a scale ladder)
  gpu_lease.py           a study sized to one short GPU lease (scripts/gpu_study.sh): budget-aware
  runs.py                reading a run directory: log.jsonl, status.json, eval records
  findings.py            the finding kinds (KINDS) and the verdict of each (95% t-intervals, >= 3 seeds, Holm)
  tables.py, plots.py    markdown numbers and tables; figure helpers
  report.py              a study's report.md and plots
  ladder_report.py       a ladder's findings against tokens; a rate sweep's table
  match.py               iso-depth / iso-param / iso-FLOP partners
  spectra.py             singular values and stable ranks of checkpoints
  attention_patterns.py  attention-pattern indicators: tables, radar and logit plots
  compare.py, curves.py, to_tensorboard.py   ad-hoc runs side by side; TensorBoard event files
"""
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the checkout that holds this package


def checkout_env():
    """os.environ with this checkout first on PYTHONPATH, for the Python programs the study layer
    starts (a rung's `python -m study run`, a data builder under dev/data/): they import this
    checkout's attnref and study whether or not it is the one installed."""
    rest = [os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else []
    return dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT] + rest))
