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
OUT/rung-TOKENS, name NAME-rTOKENS) and `run` runs `study.py run` on each rung in order, smallest
first; study.py skips finished runs and resumes interrupted ones, so an interrupted ladder
continues where it stopped. python -m study ladder reports across the rungs.
"""
import argparse
import os
import signal
import subprocess
import sys
import tomllib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LADDER_KEYS = {"tokens", "evaluations", "arm_rungs", "norm_control", "deconstructing"}


class LadderError(Exception):
    pass


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


def load_ladder(path):
    """(the study tables without [ladder], the rungs [(tokens, steps)], arm_rungs, evaluations,
    the [ladder] table)."""
    try:
        with open(path, "rb") as f:
            raw = tomllib.load(f)
    except OSError as e:
        raise LadderError(f"{path}: cannot read ({e.strerror})") from None
    except tomllib.TOMLDecodeError as e:
        raise LadderError(f"{path}: not valid TOML ({e})") from None
    ladder = raw.pop("ladder", None)
    if not isinstance(ladder, dict):
        raise LadderError(f"{path}: needs a [ladder] table (tokens = [...])")
    unknown = set(ladder) - LADDER_KEYS
    if unknown:
        raise LadderError(f"{path}: [ladder]: unknown field(s) {', '.join(sorted(unknown))} "
                          f"(known: {', '.join(sorted(LADDER_KEYS))})")
    study = raw.get("study", {})
    for key in ("tokens", "steps", "val_every", "save_every"):
        if key in study:
            raise LadderError(f"{path}: [study].{key} is set per rung by the ladder; leave it out")
    tokens = ladder.get("tokens")
    if not isinstance(tokens, list) or not tokens or not all(isinstance(t, int) and t > 0 for t in tokens) \
            or sorted(set(tokens)) != tokens:
        raise LadderError(f"{path}: [ladder].tokens must be increasing positive integers")
    evaluations = ladder.get("evaluations", 4)
    if not isinstance(evaluations, int) or evaluations <= 0:
        raise LadderError(f"{path}: [ladder].evaluations must be a positive integer")
    arm_rungs = ladder.get("arm_rungs", {})
    names = [a.get("name") for a in raw.get("arm", [])]
    for arm, rungs in arm_rungs.items():
        if arm not in names:
            raise LadderError(f"{path}: [ladder].arm_rungs: '{arm}' is not an arm")
        if not isinstance(rungs, list) or not all(t in tokens for t in rungs):
            raise LadderError(f"{path}: [ladder].arm_rungs.{arm} must list rungs of [ladder].tokens")
    rows = study.get("batch_size", 0) * study.get("grad_accum", 1) * study.get("gpus", 1)
    if "global_batch" in study:
        rows = study["global_batch"]
    per_step = rows * study.get("seq_len", 0)
    if per_step <= 0:
        raise LadderError(f"{path}: [study] needs batch_size and seq_len")
    rungs = []
    for t in tokens:
        if t % per_step:
            raise LadderError(f"{path}: rung {t:,} is not a whole number of {per_step:,}-token steps")
        steps = t // per_step
        if steps < evaluations:
            raise LadderError(f"{path}: rung {t:,} has {steps} steps, fewer than {evaluations} evaluations")
        rungs.append((t, steps))
    return raw, rungs, arm_rungs, evaluations, ladder


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
    """Runs cmd; SIGINT / SIGTERM to the ladder go to study.py, which stops its run so that the
    next call resumes it (exit status 130)."""
    # the child imports this checkout's study package, installed or not
    path = os.pathsep.join([ROOT] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else []))
    proc = subprocess.Popen(cmd, env=dict(os.environ, PYTHONPATH=path))

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
    ap.add_argument("--dry-run", action="store_true", help="print each rung's commands (study.py run --dry-run)")
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
