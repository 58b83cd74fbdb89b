"""
The study and ladder files (doc/study.md "Study files", "Scale ladder"): the Study / Arm / Run
they describe, and one reader of both. Every problem raises StudyError (LadderError for the
[ladder] table) naming the file and the field.

A study is arms (a train_san preset plus flags) x learning rates x seeds, every run with the
same token budget; a ladder file is a study file without `tokens` and with a [ladder] table of
token budgets (study/ladder.py writes one study file per rung).
"""
import dataclasses
import json
import math
import os
import re
import tomllib
from dataclasses import dataclass, field

from study import findings, match

# flags the runner sets itself from study fields; a study that sets them in `flags` is refused
RUNNER_FLAGS = {"--preset": "arm.preset", "--seed": "study.seeds", "--steps": "study.tokens or study.steps",
                "--batch-size": "study.batch_size", "--seq-len": "study.seq_len", "--grad-accum": "study.grad_accum",
                "--global-batch": "study.global_batch",
                "--log": "(the runner's)", "--checkpoint-dir": "(the runner's)", "--resume": "(the runner's)",
                "--save-every": "study.save_every", "--val-every": "study.val_every", "--lr": "arm.lr",
                "--lr-other": "arm.lr_other",
                "--milestones": "study.milestones"}

STUDY_KEYS = {"name", "out", "binary", "seeds", "tokens", "steps", "batch_size", "seq_len", "grad_accum", "global_batch",
              "val_every", "save_every", "milestones", "flags", "baseline", "gpus", "keep_checkpoints", "note",
              "skip_eval", "context_eval", "data_build", "paper"}
PAPERS = ("san", "deconstructing")  # study.paper: whose tables the report writes (study/paper_tables.py)
CONTEXT_EVAL_KEYS = {"sets", "contexts"}
ARM_KEYS = {"name", "preset", "flags", "lr", "lr_scale", "lr_other", "optional", "note", "seeds"}


class StudyError(Exception):
    pass


class LadderError(StudyError):
    """A ladder file's problem (its [ladder] table, or a study field a ladder sets per rung)."""


@dataclass
class Arm:
    name: str
    preset: str
    flags: list
    lrs: list            # [None] when the trainer's default rate is used
    seeds: list
    optional: bool = False
    note: str = ""
    common: list = field(default_factory=list)  # the study's flags, which come before the arm's
    lr_others: list = field(default_factory=lambda: [None])  # Muon's AdamW-side rates (--lr-other); [None]: default

    def model(self):
        """The match.Arm this arm trains (its preset plus the model flags it and the study set)."""
        arm = match.PRESETS[self.preset]
        changes = {}
        flag_field = {flag: name for name, flag in match.FLAG_OF_FIELD.items()}
        flags = self.common + self.flags
        for i in range(0, len(flags) - 1):
            f = flags[i]
            if f in flag_field:
                value = flags[i + 1]
                changes[flag_field[f]] = value if flag_field[f] in ("ffn", "residual") else int(value)
        return dataclasses.replace(arm, **changes)


@dataclass
class Run:
    index: int
    arm: Arm
    lr: object           # float or None
    seed: int
    id: str
    dir: str
    lr_other: object = None  # float or None: the trainer's default

    @property
    def rate_point(self):
        """(lr, lr_other) as the study asks for them; None: the trainer's default."""
        return (self.lr, self.lr_other)


@dataclass
class Study:
    path: str
    name: str
    out: str
    binary: str
    seeds: list
    steps: int
    batch_size: int
    seq_len: int
    grad_accum: int      # 0 when global_batch is given
    global_batch: int    # rows per optimizer step over every GPU; 0: batch_size x grad_accum x gpus
    val_every: int
    save_every: int
    milestones: bool
    flags: list
    baseline: str
    gpus: int
    keep_checkpoints: bool
    arms: list
    findings: list
    note: str = ""
    skip_eval: bool = False  # evaluate each hybrid arm's final checkpoint without its variant layers
    runs: list = field(default_factory=list)
    context_eval: dict = None  # [study.context_eval]: {"sets": [...], "contexts": [...]} (Table 4), or None
    data_build: list = None    # the command that builds the runs' input files (study.data_build), or None
    paper: str = ""            # study.paper: the paper whose tables the report writes beside its numbers, or ""

    @property
    def rows_per_step(self):
        return self.global_batch or self.batch_size * self.grad_accum * self.gpus

    @property
    def tokens_per_step(self):
        return self.rows_per_step * self.seq_len

    def arm(self, name):
        for a in self.arms:
            if a.name == name:
                return a
        return None


def _fail(path, msg):
    raise StudyError(f"{path}: {msg}")


def _check_keys(path, where, table, allowed, required=()):
    if not isinstance(table, dict):
        _fail(path, f"{where} must be a table")
    for key in table:
        if key not in allowed:
            _fail(path, f"{where}: unknown field '{key}' (known: {', '.join(sorted(allowed))})")
    for key in required:
        if key not in table:
            _fail(path, f"{where}: missing field '{key}'")


def _rate_grid(path, where, value):
    """An arm's rate field: [None] when absent (the trainer's default), else its rates, from one
    number or a non-empty list of numbers."""
    if value is None:
        return [None]
    values = value if isinstance(value, list) else [value]
    if not values:
        _fail(path, f"{where}: an empty grid")
    return [_typed(path, where, x, float, "a number or a list of numbers") for x in values]


def _check_rate_grid(path, where, rates):
    if any(r is not None and r <= 0 for r in rates):
        _fail(path, f"{where}: rates must be positive")
    if len(set(rates)) != len(rates):
        _fail(path, f"{where}: the grid repeats a rate")


def _typed(path, where, value, typ, what):
    ok = isinstance(value, typ) and not (typ is int and isinstance(value, bool))
    if typ is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not ok:
        _fail(path, f"{where} must be {what}, not {value!r}")
    return value


def _flag_list(path, where, value):
    if not isinstance(value, list) or not all(isinstance(v, (str, int, float)) and not isinstance(v, bool) for v in value):
        _fail(path, f"{where} must be a list of strings, e.g. [\"--norm\", \"rms\"]")
    flags = [str(v) for v in value]
    for f in flags:
        if f in RUNNER_FLAGS:
            _fail(path, f"{where}: {f} is set by the runner; use {RUNNER_FLAGS[f]} instead")
    return flags


def read_toml(path, error=StudyError):
    """The tables of a study or ladder file; an unreadable or invalid file raises `error` naming it."""
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except OSError as e:
        raise error(f"{path}: cannot read ({e.strerror})") from None
    except tomllib.TOMLDecodeError as e:
        raise error(f"{path}: not valid TOML ({e})") from None


def load_study(path, binary=None):
    """Parses and checks a study file; every problem raises StudyError naming the file."""
    return study_from_tables(path, read_toml(path), binary)


def study_from_tables(path, raw, binary=None):
    """The Study of a study file's tables (as tomllib reads them); `path` names it in errors."""
    _check_keys(path, "the file", raw, {"study", "arm", "finding"}, ("study", "arm"))
    s = raw["study"]
    _check_keys(path, "[study]", s, STUDY_KEYS, ("name", "seeds", "batch_size", "seq_len"))
    fields = _study_fields(path, s, binary)
    raw_arms = raw["arm"]
    if not isinstance(raw_arms, list) or not raw_arms:
        _fail(path, "needs at least one [[arm]]")
    arms = []
    for i, a in enumerate(raw_arms):
        arms.append(_arm(path, i, a, arms, fields["flags"], fields["seeds"]))
    baseline = _typed(path, "study.baseline", s.get("baseline", arms[0].name), str, "a string")
    if not any(a.name == baseline for a in arms):
        _fail(path, f"study.baseline '{baseline}' is not an arm")
    study = Study(path=path, arms=arms, baseline=baseline, findings=_findings(path, raw.get("finding", []), [a.name for a in arms]),
                  **fields)
    if "context_eval" in s:
        study.context_eval = _context_eval(path, s["context_eval"], arms)
    if "data_build" in s:
        build = s["data_build"]
        if not isinstance(build, list) or not build or not all(isinstance(x, str) and x for x in build):
            _fail(path, 'study.data_build must be a command as a list of strings, e.g. ["dev/data/build_offline.py", '
                        '"--out", "data/offline-v2048"]')
        study.data_build = list(build)
    study.runs = _runs(arms, study.out)
    return study


def _study_fields(path, s, binary):
    """The [study] table's scalar fields, checked, as Study's keywords (arms, findings aside)."""
    name = _typed(path, "study.name", s["name"], str, "a string")
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
        _fail(path, f"study.name '{name}' may hold only letters, digits, '_', '.', '-'")
    seeds = s["seeds"]
    if not isinstance(seeds, list) or not seeds or not all(isinstance(x, int) and not isinstance(x, bool) for x in seeds):
        _fail(path, "study.seeds must be a non-empty list of integers")
    batch_size = _typed(path, "study.batch_size", s["batch_size"], int, "an integer")
    seq_len = _typed(path, "study.seq_len", s["seq_len"], int, "an integer")
    if "grad_accum" in s and "global_batch" in s:
        _fail(path, "[study] takes grad_accum or global_batch, not both")
    grad_accum = _typed(path, "study.grad_accum", s.get("grad_accum", 1), int, "an integer")
    global_batch = _typed(path, "study.global_batch", s.get("global_batch", 0), int, "an integer")
    gpus = _typed(path, "study.gpus", s.get("gpus", 1), int, "an integer")
    if min(batch_size, seq_len, grad_accum, gpus) <= 0 or global_batch < 0:
        _fail(path, "study.batch_size, seq_len, grad_accum, global_batch and gpus must be positive")
    if global_batch and global_batch % (batch_size * gpus):
        _fail(path, f"study.global_batch {global_batch} is not a multiple of batch_size x gpus = {batch_size * gpus}")
    if global_batch:
        grad_accum = 0
    rows = global_batch or batch_size * grad_accum * gpus
    if ("tokens" in s) == ("steps" in s):
        _fail(path, "[study] needs exactly one of 'tokens' (the budget per run) and 'steps'")
    if "tokens" in s:
        tokens = _typed(path, "study.tokens", s["tokens"], int, "an integer")
        steps = math.ceil(tokens / (rows * seq_len))
    else:
        steps = _typed(path, "study.steps", s["steps"], int, "an integer")
    if steps <= 0:
        _fail(path, "the token budget gives no steps")
    return dict(
        name=name, seeds=seeds, steps=steps, batch_size=batch_size, seq_len=seq_len, grad_accum=grad_accum,
        global_batch=global_batch, gpus=gpus,
        val_every=_typed(path, "study.val_every", s.get("val_every", max(1, steps // 10)), int, "an integer"),
        save_every=_typed(path, "study.save_every", s.get("save_every", max(1, steps // 4)), int, "an integer"),
        milestones=_typed(path, "study.milestones", s.get("milestones", False), bool, "true or false"),
        keep_checkpoints=_typed(path, "study.keep_checkpoints", s.get("keep_checkpoints", False), bool, "true or false"),
        flags=_flag_list(path, "study.flags", s.get("flags", [])),
        out=_typed(path, "study.out", s.get("out", os.path.join("logs", "studies", name)), str, "a string"),
        binary=binary or _typed(path, "study.binary", s.get("binary", "./train_san"), str, "a string"),
        note=_typed(path, "study.note", s.get("note", ""), str, "a string"),
        skip_eval=_typed(path, "study.skip_eval", s.get("skip_eval", False), bool, "true or false"),
        paper=_paper(path, s.get("paper", "")))


def _paper(path, value):
    if value not in ("",) + PAPERS:
        _fail(path, f"study.paper must be one of {', '.join(repr(p) for p in PAPERS)}, not {value!r}")
    return value


def _arm(path, i, a, arms, common, seeds):
    """[[arm]] number i (0-based), checked against the arms before it; `common`: the study's flags."""
    where = f"[[arm]] #{i + 1}"
    _check_keys(path, where, a, ARM_KEYS, ("name", "preset"))
    arm_name = _typed(path, f"{where}.name", a["name"], str, "a string")
    where = f"arm '{arm_name}'"
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", arm_name):
        _fail(path, f"{where}: the name may hold only letters, digits, '_', '.', '-'")
    if any(x.name == arm_name for x in arms):
        _fail(path, f"{where}: the name is used twice")
    preset = _typed(path, f"{where}.preset", a["preset"], str, "a string")
    if preset not in match.PRESETS:
        _fail(path, f"{where}: unknown preset '{preset}' (train_san has: {', '.join(match.PRESETS)})")
    lrs = _rate_grid(path, f"{where}.lr", a.get("lr", None))
    if "lr_scale" in a:
        scale = a["lr_scale"]
        if None in lrs:
            _fail(path, f"{where}: lr_scale multiplies lr, which is missing")
        if not isinstance(scale, list) or not scale:
            _fail(path, f"{where}.lr_scale must be a non-empty list of numbers")
        scale = [_typed(path, f"{where}.lr_scale", x, float, "a list of numbers") for x in scale]
        lrs = [float(f"{lr * m:.6g}") for lr in lrs for m in scale]
    _check_rate_grid(path, f"{where}.lr", lrs)
    # Muon's second rate (embedding, gains, gates: --lr-other); a grid crosses the lr grid
    lr_others = _rate_grid(path, f"{where}.lr_other", a.get("lr_other", None))
    _check_rate_grid(path, f"{where}.lr_other", lr_others)
    arm_seeds = a.get("seeds", seeds)
    if not isinstance(arm_seeds, list) or not arm_seeds or not all(isinstance(x, int) for x in arm_seeds):
        _fail(path, f"{where}.seeds must be a non-empty list of integers")
    arm = Arm(name=arm_name, preset=preset, flags=_flag_list(path, f"{where}.flags", a.get("flags", [])), lrs=lrs,
              seeds=arm_seeds, optional=_typed(path, f"{where}.optional", a.get("optional", False), bool, "true or false"),
              note=_typed(path, f"{where}.note", a.get("note", ""), str, "a string"), common=common, lr_others=lr_others)
    try:
        arm.model().check()
    except (ValueError, TypeError) as e:
        _fail(path, f"{where}: {e}")
    return arm


def _findings(path, raw_findings, arms):
    """The [[finding]] tables, each checked against findings.KINDS: a kind a study judges, its
    roles naming arms (`arms`: the arm names)."""
    out = []
    for i, f in enumerate(raw_findings):
        where = f"[[finding]] #{i + 1}"
        if not isinstance(f, dict) or "kind" not in f:
            _fail(path, f"{where}: missing field 'kind'")
        kind = f["kind"]
        if kind not in findings.STUDY_KINDS:
            _fail(path, f"{where}: unknown kind '{kind}' (known: {', '.join(findings.STUDY_KINDS)})")
        roles, optional = findings.KINDS[kind].roles, findings.KINDS[kind].optional
        _check_keys(path, f"{where} ({kind})", f, {"kind", "title", *roles, *optional}, roles)
        for role in (*roles, *optional):
            if role in f and f[role] not in arms:
                _fail(path, f"{where} ({kind}): {role} = '{f[role]}' is not an arm")
        out.append(dict(f))
    return out


def _runs(arms, out):
    """Every run of the arms, in the study's order (what --only's indices count)."""
    runs = []
    for arm in arms:
        for lr in arm.lrs:
            for lr_other in arm.lr_others:
                for seed in arm.seeds:
                    run_id = (arm.name + (f"_lr{lr:g}" if lr is not None else "")
                              + (f"_lo{lr_other:g}" if lr_other is not None else "") + f"_s{seed}")
                    runs.append(Run(index=len(runs), arm=arm, lr=lr, seed=seed, id=run_id,
                                    dir=os.path.join(out, "runs", run_id), lr_other=lr_other))
    return runs


def _context_eval(path, table, arms):
    """[study.context_eval]: the rolling eval sets (e.g. WikiText) and the contexts to score them
    at after each run (the Deconstructing paper's Table 4); every context fits every arm's model."""
    where = "[study.context_eval]"
    _check_keys(path, where, table, CONTEXT_EVAL_KEYS, ("sets", "contexts"))
    sets, contexts = table["sets"], table["contexts"]
    if not isinstance(sets, list) or not sets or not all(isinstance(x, str) and x for x in sets):
        _fail(path, f"{where}.sets must be a non-empty list of eval .bin files")
    if not isinstance(contexts, list) or not contexts or not all(
            isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in contexts):
        _fail(path, f"{where}.contexts must be a non-empty list of positive integers (tokens)")
    if len(set(contexts)) != len(contexts):
        _fail(path, f"{where}.contexts repeats a context")
    for arm in arms:
        longest = arm.model().seq_len
        if max(contexts) > longest:
            _fail(path, f"{where}.contexts: {max(contexts)} is longer than arm '{arm.name}''s context {longest} "
                        f"(--max-seq-len)")
    return {"sets": list(sets), "contexts": list(contexts)}


# ----------------------------------------------------------------------------------------
# writing derived study files (a ladder's rungs, a GPU lease's pair): the one writer

def _toml_value(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):  # a JSON string is a TOML basic string once DEL is escaped too
        return json.dumps(v, ensure_ascii=False).replace("\x7f", "\\u007f")
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    raise StudyError(f"cannot write {v!r} to TOML")


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


def dumps_study(tables, header):
    """A study file's text: `header` (a comment line saying where it came from), then its tables
    [study] (with subtables), [[arm]], [[finding]]; read back, it gives the same tables."""
    lines = ["# " + header]
    _toml_table(lines, "[study]", tables["study"])
    for kind in ("arm", "finding"):
        for table in tables.get(kind, []):
            lines.append("")
            _toml_table(lines, f"[[{kind}]]", table)
    return "\n".join(lines) + "\n"


def write_study(tables, path, header):
    """Writes dumps_study(tables, header) to path (making its directory); returns path."""
    if os.path.dirname(path):
        os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(dumps_study(tables, header))
    return path


# ----------------------------------------------------------------------------------------
# ladder files

LADDER_KEYS = {"tokens", "evaluations", "arm_rungs", "norm_control", "deconstructing"}


@dataclass
class Ladder:
    """A ladder file: its study tables (without [ladder], no budget) and each rung's budget."""
    path: str
    tables: dict         # [study], [[arm]], [[finding]] as read
    rungs: list          # [(tokens, steps)], smallest first
    evaluations: int     # validations (and checkpoints) per run
    arm_rungs: dict      # {arm: [tokens]}: an arm trained only at these rungs
    norm_control: dict = None  # {"zcn": arm, "rms": arm}: the noise-floor control, or None
    findings: list = field(default_factory=list)  # the [[finding]]s, and [ladder].deconstructing as variants_behind

    @property
    def name(self):
        return self.tables["study"]["name"]

    @property
    def out(self):
        return self.tables["study"].get("out", os.path.join("logs", "studies", self.name))

    def finding(self, kind):
        """The first finding of a kind (a dict), or None."""
        return next((f for f in self.findings if f["kind"] == kind), None)

    def rung_dir(self, tokens):
        return os.path.join(self.out, f"rung-{tokens}")

    def rung_file(self, tokens):
        return os.path.join(self.rung_dir(tokens), "study.toml")

    def rung_tables(self, tokens):
        """The study file's tables of one rung: its budget, name NAME-rTOKENS, out the rung's
        folder, the arms trained there and the findings whose arms all are."""
        steps = dict(self.rungs)[tokens]
        study = dict(self.tables["study"])
        study.update(name=f"{study['name']}-r{tokens}", out=self.rung_dir(tokens), tokens=tokens,
                     val_every=steps // self.evaluations, save_every=steps // self.evaluations)
        arms = [a for a in self.tables["arm"] if tokens in self.arm_rungs.get(a["name"], [tokens])]
        names = {a["name"] for a in arms}
        # a finding whose arms are not all at this rung is left to the rungs that have them
        kept = [f for f in self.tables.get("finding", []) if all(a in names for a in findings.arms_of(f))]
        return {"study": study, "arm": arms, **({"finding": kept} if kept else {})}

    def rung_study(self, tokens, binary=None):
        """The Study of one rung (as its file, rung_file, would load)."""
        return study_from_tables(self.rung_file(tokens), self.rung_tables(tokens), binary)


def _ladder_fail(path, msg):
    raise LadderError(f"{path}: {msg}")


def load_ladder(path):
    """Parses and checks a ladder file; every problem raises LadderError naming the file."""
    raw = read_toml(path, LadderError)
    ladder = raw.pop("ladder", None)
    if not isinstance(ladder, dict):
        _ladder_fail(path, "needs a [ladder] table (tokens = [...])")
    unknown = set(ladder) - LADDER_KEYS
    if unknown:
        _ladder_fail(path, f"[ladder]: unknown field(s) {', '.join(sorted(unknown))} "
                           f"(known: {', '.join(sorted(LADDER_KEYS))})")
    study = raw.get("study", {})
    for key in ("tokens", "steps", "val_every", "save_every"):
        if key in study:
            _ladder_fail(path, f"[study].{key} is set per rung by the ladder; leave it out")
    tokens = ladder.get("tokens")
    if not isinstance(tokens, list) or not tokens or not all(isinstance(t, int) and t > 0 for t in tokens) \
            or sorted(set(tokens)) != tokens:
        _ladder_fail(path, "[ladder].tokens must be increasing positive integers")
    evaluations = ladder.get("evaluations", 4)
    if not isinstance(evaluations, int) or evaluations <= 0:
        _ladder_fail(path, "[ladder].evaluations must be a positive integer")
    arm_rungs = ladder.get("arm_rungs", {})
    names = [a.get("name") for a in raw.get("arm", [])]
    for arm, rungs in arm_rungs.items():
        if arm not in names:
            _ladder_fail(path, f"[ladder].arm_rungs: '{arm}' is not an arm")
        if not isinstance(rungs, list) or not all(t in tokens for t in rungs):
            _ladder_fail(path, f"[ladder].arm_rungs.{arm} must list rungs of [ladder].tokens")
    rows = study.get("batch_size", 0) * study.get("grad_accum", 1) * study.get("gpus", 1)
    if "global_batch" in study:
        rows = study["global_batch"]
    per_step = rows * study.get("seq_len", 0)
    if per_step <= 0:
        _ladder_fail(path, "[study] needs batch_size and seq_len")
    rungs = []
    for t in tokens:
        if t % per_step:
            _ladder_fail(path, f"rung {t:,} is not a whole number of {per_step:,}-token steps")
        steps = t // per_step
        if steps < evaluations:
            _ladder_fail(path, f"rung {t:,} has {steps} steps, fewer than {evaluations} evaluations")
        rungs.append((t, steps))
    try:
        found = _findings(path, raw.get("finding", []), names)
    except StudyError as e:
        raise LadderError(str(e)) from None
    return Ladder(path=path, tables=raw, rungs=rungs, evaluations=evaluations, arm_rungs=arm_rungs,
                  norm_control=_norm_control(path, ladder.get("norm_control"), names),
                  findings=found + _deconstructing(path, ladder.get("deconstructing"), names))


def _norm_control(path, table, names):
    """[ladder].norm_control = { zcn = ARM, rms = ARM }, or None."""
    if table is None:
        return None
    if not isinstance(table, dict) or set(table) != {"zcn", "rms"} or not all(v in names for v in table.values()):
        _ladder_fail(path, "[ladder].norm_control must be { zcn = ARM, rms = ARM } naming two arms")
    return dict(table)


def _deconstructing(path, table, names):
    """[ladder].deconstructing = { standard = ARM, kinds = [...], floor = NATS }: a variants_behind
    finding (findings.KINDS) over the arms KIND-uniform and KIND-hybrid of each kind; [] without it."""
    if table is None:
        return []
    where = "[ladder].deconstructing"
    if not isinstance(table, dict) or not set(table) <= {"standard", "kinds", "floor"} or "standard" not in table \
            or "kinds" not in table:
        _ladder_fail(path, f"{where} must be {{ standard = ARM, kinds = [...] }} with an optional floor")
    if table["standard"] not in names:
        _ladder_fail(path, f"{where}.standard = '{table['standard']}' is not an arm")
    kinds = table["kinds"]
    if not isinstance(kinds, list) or not kinds or not all(isinstance(k, str) for k in kinds):
        _ladder_fail(path, f"{where}.kinds must be a non-empty list of variant kinds")
    floor = table.get("floor")
    if floor is not None and (not isinstance(floor, (int, float)) or isinstance(floor, bool) or floor < 0):
        _ladder_fail(path, f"{where}.floor must be a non-negative number (nats)")
    return [{"kind": "variants_behind", **table}]
