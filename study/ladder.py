#!/usr/bin/env python3
"""
ladder.py: one study (study/runner.py's format) trained at several token budgets, the rungs of
a scale ladder, so that a finding can be followed against tokens (issue 31; doc/study.md "Scale
ladder").

    python -m study ladder run studies/ladders/cpu.toml [--up-to TOKENS] [--dry-run]
    python -m study ladder files studies/ladders/cpu.toml      # write the rung study files only

Ladder files live in studies/ladders/ (they are not study files: study/runner.py refuses the
[ladder] table). A ladder file is a study file with `tokens` left out of [study] and a [ladder] table:

    [ladder]
    tokens = [102_400, 409_600, 1_638_400]   # the rungs, smallest first
    evaluations = 4                          # validations (and checkpoints) per run: val_every =
                                             # save_every = steps // evaluations (and at the end)
    arm_rungs = { san-rms = [1_638_400] }    # an arm trained only at these rungs (default: all)
    norm_control = { zcn = "san", rms = "san-rms" }          # for study/ladder_report.py: the
    deconstructing = { standard = "standard", kinds = [...] } # noise-floor control, the variant grid

For each rung, `files` writes OUT/rung-TOKENS/study.toml (the study with that budget, out =
OUT/rung-TOKENS, name NAME-rTOKENS) and `run` runs `python -m study run` on each rung in
order, smallest first; that skips finished runs and resumes interrupted ones, so an interrupted
ladder continues where it stopped. `python -m study ladder report` reports across the rungs
(study/ladder_report.py).
"""
import argparse
import os
import signal
import subprocess
import sys

from study import checkout_env
from study.spec import LadderError, load_ladder  # noqa: F401  (LadderError: what its callers catch)


def _toml_value(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    raise LadderError(f"cannot write {v!r} to TOML")


def _toml_table(lines, header, table):
    lines.append(header)
    subtables = []
    for key, value in table.items():
        if isinstance(value, dict):
            subtables.append((key, value))
        else:
            lines.append(f"{key} = {_toml_value(value)}")
    for key, value in subtables:
        _toml_table(lines, f"[{header.strip('[]')}.{key}]", value)


def dumps(doc):
    """The TOML of a study file's tables: [study] (with subtables), [[arm]], [[finding]]."""
    lines = []
    _toml_table(lines, "[study]", doc["study"])
    for kind in ("arm", "finding"):
        for table in doc.get(kind, []):
            lines.append("")
            _toml_table(lines, f"[[{kind}]]", table)
    return "\n".join(lines) + "\n"


def rung_dir(raw, tokens):
    out = raw["study"].get("out", os.path.join("logs", "studies", raw["study"]["name"]))
    return os.path.join(out, f"rung-{tokens}")


def rung_study(raw, tokens, steps, arm_rungs, evaluations):
    """The study file's tables for one rung."""
    study = dict(raw["study"])
    study.update(name=f"{study['name']}-r{tokens}", out=rung_dir(raw, tokens), tokens=tokens,
                 val_every=steps // evaluations, save_every=steps // evaluations)
    arms = [a for a in raw["arm"] if tokens in arm_rungs.get(a["name"], [tokens])]
    names = {a["name"] for a in arms}
    # a finding whose arms are not all at this rung is left to the rungs that have them
    findings = [f for f in raw.get("finding", [])
                if all(v in names for k, v in f.items() if k not in ("kind", "title"))]
    doc = {"study": study, "arm": arms}
    if findings:
        doc["finding"] = findings
    return doc


def write_rung_files(path, out=None):
    """Writes each rung's study file (under `out` in place of the ladder's [study].out when
    given); returns [(tokens, file)]."""
    raw, rungs, arm_rungs, evaluations, _ = load_ladder(path)
    if out is not None:
        raw["study"]["out"] = out
    files = []
    for tokens, steps in rungs:
        d = rung_dir(raw, tokens)
        os.makedirs(d, exist_ok=True)
        f = os.path.join(d, "study.toml")
        with open(f, "w") as out:
            out.write(f"# rung {tokens:,} tokens ({steps} steps) of {path}, written by study/ladder.py\n")
            out.write(dumps(rung_study(raw, tokens, steps, arm_rungs, evaluations)))
        files.append((tokens, f))
    return files


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
