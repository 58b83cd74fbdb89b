"""
ladder.py: one study trained at several token budgets, the rungs of a scale ladder, so that a
finding can be followed against tokens (doc/study.md "Scale ladder"; the file's format and the
Ladder it loads to: study/spec.py).

    python -m study ladder run studies/ladders/cpu.toml [--up-to TOKENS] [--dry-run]
    python -m study ladder files studies/ladders/cpu.toml      # write the rung study files only

`files` writes OUT/rung-TOKENS/study.toml for each rung; `run` runs `python -m study run` on
each, smallest first, which skips finished runs and resumes interrupted ones.
"""
import argparse
import signal
import subprocess
import sys

from study import checkout_env
from study.spec import LadderError, load_ladder, write_study


def write_rung_files(path, out=None):
    """Writes each rung's study file (under `out` in place of the ladder's [study].out when
    given); returns [(tokens, file)]."""
    ladder = load_ladder(path)
    if out is not None:
        ladder.tables["study"]["out"] = out
    return [(tokens, write_study(ladder.rung_tables(tokens), ladder.rung_file(tokens),
                                 f"rung {tokens:,} tokens ({steps} steps) of {path}, written by study/ladder.py"))
            for tokens, steps in ladder.rungs]


def run_forwarding_signals(cmd):
    """Runs cmd; SIGINT / SIGTERM to the ladder go to the rung's runner, which stops its run so that the
    next call resumes it (exit status 130)."""
    proc = subprocess.Popen(cmd, env=checkout_env())

    def forward(signum, frame):
        proc.send_signal(signum)
    old = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        return proc.wait()
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def main(argv=None):
    ap = argparse.ArgumentParser(description="Trains a study at each rung of a token-budget ladder (study/runner.py).")
    ap.add_argument("command", choices=("run", "files"))
    ap.add_argument("ladder", help="the ladder file (a study file with [ladder])")
    ap.add_argument("--up-to", type=int, help="run only the rungs of at most this many tokens")
    ap.add_argument("--dry-run", action="store_true", help="print each rung's commands (python -m study run --dry-run)")
    ap.add_argument("--binary", help="the trainer (default: study.binary)")
    args = ap.parse_args(argv)
    try:
        files = write_rung_files(args.ladder)
    except LadderError as e:
        sys.stderr.write(f"ladder.py: {e}\n")
        return 2
    if args.command == "files":
        for tokens, f in files:
            print(f"rung {tokens:,}: {f}")
        return 0
    status = 0
    for tokens, f in files:
        if args.up_to is not None and tokens > args.up_to:
            print(f"ladder: rung {tokens:,} left for later (--up-to {args.up_to:,})", flush=True)
            continue
        cmd = [sys.executable, "-m", "study", "run", f]
        cmd += ["--binary", args.binary] if args.binary else []
        cmd += ["--dry-run"] if args.dry_run else []
        print(f"ladder: rung {tokens:,}: {' '.join(cmd)}", flush=True)
        rc = run_forwarding_signals(cmd)
        if rc == 130:  # interrupted: the next call resumes
            return rc
        status = status or rc
    return status


if __name__ == "__main__":
    sys.exit(main())
