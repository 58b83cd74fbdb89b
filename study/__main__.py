"""
python -m study COMMAND ...: the study layer's one command line (doc/study.md).

  run STUDY.toml [--binary B] [--only i,j] [--dry-run]   train every unfinished run, resumable
  slurm STUDY.toml [--partition P] ...                   an sbatch job-array script, a task per run
  report STUDY.toml [--out DIR]                          report.md and PNG plots from the runs' logs
  ladder run|files LADDER.toml [--up-to TOKENS]          a study at each rung of a token ladder
  ladder report LADDER.toml [--out DIR]                  each finding against tokens
  sweep STUDY.toml [--out DIR]                           a rate sweep's table and each arm's best rates
  match [--preset P] [--n-layer N] ...                   iso-depth / iso-param / iso-FLOP partners
  capacity STUDY.toml [--world DIR] [--out FILE]         bits of knowledge stored, per arm and parameter
  spectra CKPT... --out DIR                              singular values and stable ranks
  compare RUN... [--out PNG]                             runs side by side: final losses, rates, curves
  tensorboard RUN... --out DIR [--follow]                TensorBoard event files from JSONL logs
  patterns LABEL=LOG... --out DIR                        attention-pattern radar and logit plots
"""
import difflib
import sys


def _ladder(argv):
    if argv and argv[0] == "report":
        from study import ladder_report
        return ladder_report.main(argv)
    from study import ladder
    return ladder.main(argv)


def _sweep(argv):
    from study import ladder_report
    return ladder_report.main(["sweep"] + argv)


def _module_main(name, prefix=()):
    def call(argv):
        module = __import__(f"study.{name}", fromlist=["main"])
        return module.main(list(prefix) + argv)
    return call


COMMANDS = {
    "run": _module_main("runner", ("run",)),
    "slurm": _module_main("runner", ("slurm",)),
    "report": _module_main("runner", ("report",)),
    "ladder": _ladder,
    "sweep": _sweep,
    "match": _module_main("match"),
    "capacity": _module_main("capacity"),
    "spectra": _module_main("spectra"),
    "compare": _module_main("compare"),
    "tensorboard": _module_main("to_tensorboard"),
    "patterns": _module_main("attention_patterns"),
}


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 0 if argv else 2
    if argv[0] not in COMMANDS:
        close = difflib.get_close_matches(argv[0], COMMANDS, n=1)
        sys.stderr.write(f"python -m study: unknown command '{argv[0]}'" + (f" (did you mean {close[0]}?)" if close else "")
                         + f"; commands: {', '.join(COMMANDS)}\n")
        return 2
    return COMMANDS[argv[0]](argv[1:]) or 0


if __name__ == "__main__":
    sys.exit(main())
