"""Checks of the study layer (study/match.py, spec.py, runner.py, report.py, spectra.py): match.py
against the SAN paper's Table 1 and the trainers' own counts; a toy study trained, resumed,
stopped and reported, its report's tables recomputed here from the runs' logs; broken study
files refused before any run; skip evaluations; spectra against torch.linalg. The trainer tests
need TRAIN_SAN_BIN (make test sets it) and are skipped without it; about 30 s on 2 busy cores.
"""
import dataclasses
import itertools
import json
import math
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import types

import numpy as np
import pytest
import torch

from attnref import container, san
from attnref.evalset import KIND_CLOZE, KIND_MC, write_evalset
from attnref.shards import ShardWriter, read_shard, write_shard
from study import match, spectra
from study import runner as study
from study import runs as run_files
from study.findings import Rule
from trainer_cli import default_build_env

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "dev", "data"))  # dev/data's evals, imported where a test builds eval sets

BIN = os.environ.get("TRAIN_SAN_BIN")
BIN = os.path.join(ROOT, BIN) if BIN else None  # relative to the repository root, as make test sets it
needs_bin = pytest.mark.skipif(not BIN, reason="TRAIN_SAN_BIN not set (make test sets it)")
PYTHON = sys.executable
STUDY = ["-m", "study"]  # the study layer's command line, run from the repository root


# ----------------------------------------------------------------------------------------
# match.py

def test_table1_partners_of_the_paper_san():
    """Table 1 of the SAN paper: the FFN partners' non-embedding counts, and their names."""
    found = match.partners(match.PRESETS["san20"])
    assert {k: match.preset_name(v) for k, v in found.items()} == {"iso-depth": "ffn20", "iso-param": "ffn4",
                                                                    "iso-FLOP": "ffn9"}
    assert match.parameter_counts(found["iso-depth"])[1] == 78_666_792
    assert match.parameter_counts(found["iso-param"])[1] == 15_733_768
    assert match.parameter_counts(found["iso-FLOP"])[1] == 35_400_338
    # the SAN itself: 15.74M non-embedding, 24.13M in all (the table's rounding)
    total, nonemb = match.parameter_counts(match.PRESETS["san20"])
    assert round(nonemb / 1e6, 2) == 15.74 and round(total / 1e6, 2) == 24.13
    # the printed report names the presets and their flags
    out = subprocess.run([PYTHON, "-m", "study", "match", "--preset", "san20"],
                         capture_output=True, text=True, check=True).stdout
    for name in ("ffn20", "ffn4", "ffn9"):
        assert f"[preset {name}]" in out and f"flags: --preset {name}" in out
    assert "78,666,792 non-embedding" in out and "6 x (non-embedding parameters + V x d) + 12 x L x T x d" in out


def test_partner_rules_by_brute_force():
    """iso-param is the closest count, iso-FLOP the deepest affordable arm, on small grids."""
    for layers, d, kv in itertools.product((3, 8, 13), (64, 96), (1, 2)):
        arm = match.Arm(n_layer=layers, n_embd=d, n_head=4, n_kv_head=kv, vocab_size=500, seq_len=96)
        p = match.partners(arm, max_layers=200)
        ffn = [dataclasses.replace(arm, ffn="swiglu", n_layer=n) for n in range(1, 201)]
        target = match.parameter_counts(arm)[1]
        best = min(abs(match.parameter_counts(a)[1] - target) for a in ffn)
        assert abs(match.parameter_counts(p["iso-param"])[1] - target) == best
        if p["iso-FLOP"] is None:  # even one FFN layer costs more than the whole SAN
            assert match.flops_per_token(ffn[0]) > match.flops_per_token(arm)
            continue
        assert match.flops_per_token(p["iso-FLOP"]) <= match.flops_per_token(arm)
        deeper = dataclasses.replace(p["iso-FLOP"], n_layer=p["iso-FLOP"].n_layer + 1)
        assert match.flops_per_token(deeper) > match.flops_per_token(arm)
        assert p["iso-depth"].n_layer == layers and p["iso-depth"].ffn == "swiglu"


def test_partner_mismatch_and_exact_depths():
    """An FFN layer at d_ff 4d holds 12 d^2 weights beside attention's W_q, W_k, W_v, W_o: 3 d^2
    with half as many kv heads (ratio 5), 4 d^2 with as many (ratio 4). So the iso-param partner
    is exact (up to norm gains and gates) at SAN depths that are multiples of 5 and 4 respectively."""
    for kv, ratio in ((2, 5), (4, 4)):
        arm = match.Arm(n_layer=1, n_embd=64, n_head=4, n_kv_head=kv, vocab_size=2048, seq_len=128)
        rows = match.exact_depths(arm, 16)
        assert [n for n, _, _, exact in rows if exact] == [n for n in range(1, 17) if n % ratio == 0]
        for n, partner, rel, _ in rows:
            at = dataclasses.replace(arm, n_layer=n)
            target = match.parameter_counts(at)[1]
            assert rel == pytest.approx(match.parameter_counts(partner)[1] / target - 1)
            if n % ratio == 0:
                assert partner.n_layer == n // ratio
    # the report prints each partner's mismatch: SAN 12 against its 2-layer iso-param partner is 17% short
    out = subprocess.run([PYTHON, "-m", "study", "match", "--preset", "demo", "--n-layer", "12", "--n-embd", "64",
                          "--vocab-size", "2048"], capture_output=True, text=True, check=True, cwd=ROOT).stdout
    san12 = match.Arm(n_layer=12, n_embd=64, n_head=4, n_kv_head=2, vocab_size=2048, seq_len=128)
    dparams, rel, _ = match.mismatch(match.partners(san12)["iso-param"], san12)
    assert round(100 * rel) == -17 and f"non-embedding parameters {dparams:+,} ({100 * rel:+.1f}%)" in out
    assert out.count("against the arm:") == 3
    listing = subprocess.run([PYTHON, "-m", "study", "match", "--preset", "demo", "--n-embd", "64", "--vocab-size",
                              "2048", "--exact-depths", "15"], capture_output=True, text=True, check=True, cwd=ROOT).stdout
    assert [line.split()[0] for line in listing.splitlines() if line.endswith("exact")] == ["L=5", "L=10", "L=15"]


CONFIGS = [dict(ffn=ffn, n_layer=layers, n_embd=d, n_head=h, n_kv_head=kv, vocab_size=v, seq_len=t, d_ff=dff,
                qk_norm=qk, residual=res, sandwich=sw)
           for (ffn, dff), (layers, d, h, kv), (v, t), qk, res, sw in itertools.product(
               (("none", 0), ("swiglu", 0), ("swiglu", 96)), ((2, 64, 4, 2), (5, 96, 6, 3), (3, 128, 8, 8)),
               ((250, 64), (1000, 200)), (0, 1), ("gated", "standard", "rezero", "none"), (0, 1))]


def test_counts_and_flops_equal_train_san_py():
    for c in CONFIGS:
        arm = match.Arm(**c)
        cfg = san.SANConfig(**{k: (bool(v) if k in ("qk_norm", "sandwich") else v) for k, v in c.items()})
        assert match.parameter_counts(arm) == san.count_parameters(cfg), c
        assert match.flops_per_token(arm) == san.flops_per_token(cfg), c
    assert set(match.PRESETS) <= set(san.PRESETS)
    for name in match.PRESETS:
        cfg = san.SANConfig(**san.PRESETS[name])
        mine = match.PRESETS[name]
        for field, value in dataclasses.asdict(mine).items():
            theirs = getattr(cfg, field)
            assert (theirs == mine.resolved_d_ff() if field == "d_ff" else theirs == value), (name, field)


def binary_counts(flags, tmp_path):
    """(total, non-embedding, MFLOPs per token) that train_san prints for these model flags.
    The run stops after printing them, before any step: its --checkpoint-dir cannot be made
    (a path inside a file). (Missing data no longer does: input files are checked first.)"""
    shard = tmp_path / "counts_train.bin"
    write_shard(str(shard), np.arange(3, 3 + 64) % 200 + 3)
    proc = subprocess.run([BIN] + flags + ["--batch-size", "1", "--seq-len", "8", "--steps", "1",
                                           "--train-data", str(shard), "--checkpoint-dir", str(shard / "ckpt")],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    m = re.search(r"parameters: (\d+) total, (\d+) non-embedding; ([\d.]+) MFLOPs/token", proc.stdout)
    assert m, proc.stdout + proc.stderr
    return int(m.group(1)), int(m.group(2)), float(m.group(3))


@needs_bin
@pytest.mark.parametrize("preset, flags", [
    ("tiny", []), ("tiny-ffn", []), ("demo", []),
    ("demo", ["--ffn", "swiglu", "--sandwich", "1", "--residual", "rezero", "--qk-norm", "0", "--n-kv-head", "4"]),
    # the paper presets at one layer (cheap) check every field but the depth, which
    # test_counts_and_flops_equal_train_san_py checks against train_san.py
    ("san20", ["--n-layer", "1"]), ("ffn20", ["--n-layer", "1"]), ("ffn4", ["--n-layer", "1"]),
    ("ffn9", ["--n-layer", "1", "--d-ff", "1000"]),
    ("qwen-cpu", []), ("qwen3-cpu", []), ("qwen-500m", ["--n-layer", "1"])])
def test_counts_equal_train_san_binary(preset, flags, tmp_path):
    arm = match.PRESETS[preset]
    names = {flag: field for field, flag in match.FLAG_OF_FIELD.items()}
    for flag, value in zip(flags[::2], flags[1::2]):
        arm = dataclasses.replace(arm, **{names[flag]: value if names[flag] in ("ffn", "residual") else int(value)})
    total, nonemb, mflops = binary_counts(["--preset", preset] + flags, tmp_path)
    assert (total, nonemb) == match.parameter_counts(arm)
    assert abs(mflops - match.flops_per_token(arm) / 1e6) <= 0.005 + 1e-9


# ----------------------------------------------------------------------------------------
# a toy study

VOCAB, BOS, EOS = 250, 2, 1


@pytest.fixture(scope="module")
def toy_data(tmp_path_factory):
    """Documents in four exercises: a query (one of a few patterns) and an answer that
    depends on it, with region labels (1 query, 3 answer, 0 other) and exercise sidecars."""
    rng = np.random.default_rng(0)
    d = tmp_path_factory.mktemp("toy")
    patterns = [rng.integers(10, VOCAB, size=4) for _ in range(6)]
    for split, n in (("train", 600), ("val", 60)):
        w = ShardWriter(d, "toy", split, 1 << 16, VOCAB, with_regions=True, with_exercises=True)
        for _ in range(n):
            k = rng.integers(len(patterns))
            query, answer = patterns[k], patterns[(k + 1) % len(patterns)][::-1]
            toks = [BOS] + list(query) + [4] + list(answer) + [EOS]
            regions = [0] + [1] * len(query) + [0] + [3] * len(answer) + [0]
            w.add(toks, regions, ["recall", "math", "rag", "mcq"][k % 4])
        w.close()
    # eval sets the runs score at the end: the answer to a query among three, and as a cloze
    mc, cloze = [], []
    for i in range(12):
        k = i % len(patterns)
        answers = [list(patterns[(k + j) % len(patterns)][::-1]) for j in (1, 2, 3)]
        ctx = [BOS] + list(patterns[k]) + [4]
        mc.append({"context": ctx, "choices": answers, "gold": 0, "choice_chars": [4, 5, 6]})
        cloze.append({"context": ctx, "choices": [answers[0]], "gold": 0, "choice_chars": [4]})
    write_evalset(d / "toy_mc.bin", mc, KIND_MC, VOCAB, "toy")
    write_evalset(d / "toy_cloze.bin", cloze, KIND_CLOZE, VOCAB, "toy")
    return d


FINDINGS = """
[[finding]]
kind = "localisation"
san = "san"
ffn = "ffn"

[[finding]]
kind = "spectra"
san = "san"
"""


def write_study(path, out, data, extra_study="", arms=None, findings=FINDINGS, more_flags=""):
    arms = arms if arms is not None else """
[[arm]]
name = "san"
preset = "tiny"

[[arm]]
name = "ffn"
preset = "tiny-ffn"
lr = 0.03
"""
    path.write_text(f"""
[study]
name = "toy"
out = "{out}"
seeds = [7]
batch_size = 4
seq_len = 32
steps = 6
val_every = 3
save_every = 3
milestones = true
keep_checkpoints = true
flags = ["--train-data", "{data}/toy_train_*.bin", "--val-data", "{data}/toy_val_*.bin", "--val-batches", "4",
         "--sample-tokens", "0", "--optimizer", "adamw", "--eval-sets", "{data}/toy_mc.bin,{data}/toy_cloze.bin"{more_flags}]
{extra_study}
{arms}
{findings}
""")
    return str(path)


def study_cmd(*args):
    env = dict(os.environ)
    return subprocess.run([PYTHON, *STUDY] + [str(a) for a in args], capture_output=True, text=True, cwd=ROOT, env=env,
                          timeout=300)


def md_table(text, first_header, after=None):
    """Rows (dicts) of the markdown table whose header starts with first_header (the first such
    table after the line `after`, if given)."""
    lines = text.splitlines()
    start = lines.index(after) if after else 0
    for i, line in enumerate(lines):
        if i < start:
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and cells[0] == first_header:
            rows = []
            for row in lines[i + 2:]:
                if not row.startswith("|"):
                    break
                rows.append(dict(zip(cells, [c.strip() for c in row.strip().strip("|").split("|")])))
            return rows
    raise AssertionError(f"no table starting with '{first_header}' in the report")


def first_number(text):
    return float(re.search(r"\d[\d.e+-]*", text).group(0))


def peak_rate(log):
    """The matrix group's peak rate of a run: its log header's, else the largest its steps logged."""
    records = [json.loads(line) for line in open(log)]
    headers = [r["run"] for r in records if "run" in r and "step" not in r]
    if headers and "rates" in headers[-1]:
        return headers[-1]["rates"]["lr"]
    return max(r["lr"] for r in records if "loss" in r and "lr" in r)


def final_val(log):
    val = [json.loads(line) for line in open(log) if "val_loss" in line]
    return val[-1]


# the study the report is checked on: two seeds of the SAN (a noise floor), two rates of the FFN
TOY_ARMS = """
[[arm]]
name = "san"
preset = "tiny"
seeds = [7, 8]

[[arm]]
name = "ffn"
preset = "tiny-ffn"
lr = [0.003, 0.03]
"""
TOY_RUNS = ("san_s7", "san_s8", "ffn_lr0.003_s7", "ffn_lr0.03_s7")


@pytest.fixture(scope="module")
def toy_study(toy_data, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("study")
    out = tmp / "out"
    # (validated on windows, and on whole documents beside them: the report's extra column)
    path = write_study(tmp / "toy.toml", out, toy_data, arms=TOY_ARMS, more_flags=', "--val-whole-docs", "2"')
    proc = study_cmd("run", path, "--binary", BIN)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return path, out, proc.stdout


@needs_bin
def test_toy_study_runs_with_progress(toy_study):
    path, out, stdout = toy_study
    for i, run in enumerate(TOY_RUNS):
        assert f"run {i + 1}/4: {run}" in stdout
    assert re.search(r"\[4/4 ffn_lr0.03_s7\] step +6/6 .*\| study eta", stdout)
    for run in TOY_RUNS:
        assert json.load(open(out / "runs" / run / "status.json"))["state"] == "done"
        assert (out / "runs" / run / "ckpt" / "milestone_100.bin").exists()
    # everything is finished: a second run does nothing
    again = study_cmd("run", path, "--binary", BIN)
    assert again.returncode == 0 and "0 to run now" in again.stdout and "$ " not in again.stdout


@needs_bin
def test_toy_study_report_tables_match_the_logs(toy_study):
    path, out, _ = toy_study
    assert study.main(["report", path, "--binary", BIN]) == 0  # in-process: torch and matplotlib are loaded once
    report = (out / "report" / "report.md").read_text()
    final = {run: final_val(out / "runs" / run / "log.jsonl") for run in TOY_RUNS}
    # the FFN's rate is its better one; the SAN's loss is its seed mean, sd over the seeds
    best_lr = min(("0.003", "0.03"), key=lambda lr: final[f"ffn_lr{lr}_s7"]["val_loss"])
    san_losses = [final[r]["val_loss"] for r in ("san_s7", "san_s8")]
    san_mean, san_sd = np.mean(san_losses), np.std(san_losses, ddof=1)
    rows = {r["arm"]: r for r in md_table(report, "arm")}
    # each arm's rates are those its runs trained with: the FFN's asked-for one, the SAN's its preset's
    # default (from the log's header record, or in older logs the largest rate its steps logged)
    assert first_number(rows["ffn"]["rates"]) == float(best_lr)
    assert first_number(rows["san"]["rates"]) == peak_rate(out / "runs" / "san_s7" / "log.jsonl") and "default" not in report
    # (the trainer's logs have the header: the rate came from it, the preset's AdamW default for the tiny SAN)
    header = run_files.run_header(out / "runs" / "san_s7" / "log.jsonl")
    assert header["rates"]["lr"] == first_number(rows["san"]["rates"]) and header["config"]["preset"] == "tiny"
    assert rows["san"]["seeds"] == "2" and rows["ffn"]["seeds"] == "1"
    assert abs(float(rows["san"]["val loss"]) - san_mean) <= 5e-5 and abs(float(rows["san"]["sd"]) - san_sd) <= 5e-5
    ffn_loss = final[f"ffn_lr{best_lr}_s7"]["val_loss"]
    assert abs(float(rows["ffn"]["val loss"]) - ffn_loss) <= 5e-5 and rows["ffn"]["sd"] == "—"
    assert abs(float(rows["ffn"]["Δ vs san"]) - (ffn_loss - san_mean)) <= 1e-4
    # the whole-document validation beside the windows' headline (--val-whole-docs 2)
    san_docs = np.mean([final[r]["whole_docs"]["val_loss"] for r in ("san_s7", "san_s8")])
    ffn_docs = final[f"ffn_lr{best_lr}_s7"]["whole_docs"]["val_loss"]
    assert ffn_docs != ffn_loss
    assert abs(float(rows["san"]["whole docs"]) - san_docs) <= 5e-5 and abs(float(rows["ffn"]["whole docs"]) - ffn_docs) <= 5e-5
    assert abs(float(rows["ffn"]["Δ whole docs"]) - (ffn_docs - san_docs)) <= 1e-4
    for arm, preset in (("san", "tiny"), ("ffn", "tiny-ffn")):
        assert rows[arm]["non-emb params"] == f"{match.parameter_counts(match.PRESETS[preset])[1]:,}"
    # the noise floor: the pooled seed sd, here the SAN's (the only arm with two seeds)
    assert re.search(r"Noise floor \(pooled seed-to-seed sd\): ([\d.]+) nats", report).group(1) == f"{san_sd:.4f}"
    # eval sets: the seed means of the runs' last eval records at each arm's rate
    evals = {run: run_files.read_evals(out / "runs" / run / "log.jsonl") for run in TOY_RUNS}
    # scored at the milestones of 6 steps (0/25/50/75%: 0, 2, 3, 5; --milestone-evals) and at the end; the report
    # reads the end's
    assert all(sorted(e) == [0, 2, 3, 5, 6] for e in evals.values())
    eval_rows = {r["arm"]: r for r in md_table(report[report.index("## Eval sets"):], "arm")}
    for arm, runs in (("san", ("san_s7", "san_s8")), ("ffn", (f"ffn_lr{best_lr}_s7",))):
        for name, metric in (("toy_mc", "acc"), ("toy_mc", "acc_norm"), ("toy_cloze", "acc"),
                             ("toy_cloze", "perplexity")):
            want = np.mean([evals[r][6][name][metric] for r in runs])
            assert abs(float(eval_rows[arm][f"{name} {metric}"]) - want) <= 5e-5, (arm, name, metric)
    # the rate sweep
    lr_row = {r["arm"]: r for r in md_table(report[report.index("## Learning-rate sweeps"):], "arm")}["ffn"]
    for lr in ("0.003", "0.03"):
        assert abs(float(lr_row[f"lr {lr}"]) - final[f"ffn_lr{lr}_s7"]["val_loss"]) <= 5e-5
    # region and exercise tables use the seed means at each arm's rate, on whole documents (the
    # windows' region losses differ: issue 57)
    def mean(runs, get):
        return float(np.mean([get(final[r]) for r in runs]))
    runs_of = {"san": ("san_s7", "san_s8"), "ffn": (f"ffn_lr{best_lr}_s7",)}
    assert final["san_s7"]["whole_docs"]["val_loss_query"] != final["san_s7"]["val_loss_query"]
    logs = {arm: {key: mean(runs, lambda rec: rec["whole_docs"][key]) for key in final[runs[0]]["whole_docs"]
                  if key.startswith("val_loss_")} for arm, runs in runs_of.items()}
    for arm, runs in runs_of.items():
        logs[arm]["val_exercise"] = {e: {g: mean(runs, lambda rec: rec["whole_docs"]["val_exercise"][e][g]) for g in regions}
                                     for e, regions in final[runs[0]]["whole_docs"]["val_exercise"].items()}
        rep = final[runs[0]]  # the representative run: the first seed
        logs[arm].update(gate_attn_mean=rep["gate_attn_mean"], max_logit=rep["max_logit"])
    # per region: value and difference to the SAN
    regions = {r["arm"]: r for r in md_table(report[report.index("## Loss per region"):], "arm")}
    for arm, rec in logs.items():
        for region in ("query", "answer", "other"):
            assert abs(float(regions[arm][region]) - rec[f"val_loss_{region}"]) <= 5e-5
            assert abs(float(regions[arm][f"Δ {region}"]) - (rec[f"val_loss_{region}"] - logs["san"][f"val_loss_{region}"])) <= 1e-4
    # per exercise x region: the FFN's difference to the SAN
    ex_rows = md_table(report[report.index("## Loss per exercise"):], "exercise")
    assert {r["exercise"] for r in ex_rows} == set(logs["san"]["val_exercise"])
    for r in ex_rows:
        san = logs["san"]["val_exercise"][r["exercise"]][r["region"]]
        ffn = logs["ffn"]["val_exercise"][r["exercise"]][r["region"]]
        assert abs(float(r["san"]) - san) <= 5e-5 and abs(float(r["Δ ffn"]) - (ffn - san)) <= 1e-4
    # measurements: gates and largest logits of the last validation
    meas = {r["arm"]: r for r in md_table(report[report.index("## Measurements"):], "arm")}
    for arm, rec in logs.items():
        assert abs(float(meas[arm]["gate attn (mean)"]) - rec["gate_attn_mean"]) <= 5e-4
        assert abs(float(meas[arm]["max logit (largest)"]) - max(rec["max_logit"])) <= 5e-3
    # the finding is judged from the same numbers
    d = {g: logs["san"][f"val_loss_{g}"] - logs["ffn"][f"val_loss_{g}"] for g in ("query", "trace", "answer")
         if f"val_loss_{g}" in logs["san"]}
    assert f"query {d['query']:+.4f}" in report
    # stable rank over training: the representative runs' milestones (spectra.py is checked against torch below)
    sr_rows = md_table(report[report.index("### Stable rank over training"):], "arm")
    for arm, run in (("san", "san_s7"), ("ffn", f"ffn_lr{best_lr}_s7")):
        series = sorted((spectra.checkpoint_spectra(str(p)) for p in (out / "runs" / run / "ckpt").glob("milestone_*.bin")),
                        key=lambda r: r["step"])
        for r in (r for r in sr_rows if r["arm"] == arm):
            for point in series:
                assert abs(float(r[f"step {point['step']}"]) - np.mean(point["stable_rank"][r["matrix"]])) <= 5e-3
        assert len([r for r in sr_rows if r["arm"] == arm]) == (4 if arm == "san" else 7)
    # every plot the report shows exists and is a PNG
    images = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", report)
    for name in ("final_loss.png", "loss_curves.png", "lr_curves.png", "regions.png", "exercises.png", "gates.png", "erank.png",
                 "max_logit.png", "spectra.png", "stable_rank_training.png"):
        assert name in images
    for name in images:
        with open(out / "report" / name, "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"


@needs_bin
def test_toy_study_resumes_an_interrupted_run(toy_study):
    path, out, _ = toy_study
    run = out / "runs" / "san_s7"
    before = final_val(run / "log.jsonl")
    # as if the run had been stopped after its step-3 checkpoint
    os.remove(run / "status.json")
    os.remove(run / "ckpt" / "final.bin")
    proc = study_cmd("run", path, "--binary", BIN)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "run 1/1: san_s7 (resuming from step 3)" in proc.stdout
    after = final_val(run / "log.jsonl")
    assert after["step"] == 6 and after["val_loss"] == before["val_loss"]


def test_slurm_script(toy_data, tmp_path):
    path = write_study(tmp_path / "toy.toml", tmp_path / "out", toy_data)
    proc = study_cmd("slurm", path, "--binary", "/nonexistent/train_san", "--partition", "gpu", "--max-parallel", "2")
    assert proc.returncode == 0, proc.stderr
    script = (tmp_path / "out" / "slurm" / "study.sbatch").read_text()
    assert "#SBATCH --array=0-1%2" in script and "#SBATCH --partition=gpu" in script
    assert '--only "$SLURM_ARRAY_TASK_ID"' in script and "run " + path in script
    # Slurm's SIGUSR1 120 s before the limit reaches the runner (the script execs it), which passes it
    # on through mpirun without a kill (doc/multi-gpu.md "Stopping on a cluster")
    assert "#SBATCH --signal=B:USR1@120" in script and "\nexec " in script
    proc = study_cmd("slurm", path, "--binary", "/nonexistent/train_san", "--stop-warning", "0")
    assert proc.returncode == 0 and "--signal" not in (tmp_path / "out" / "slurm" / "study.sbatch").read_text()
    proc = study_cmd("slurm", path, "--binary", "/nonexistent/train_san", "--stop-warning", "-1")
    assert proc.returncode != 0 and "--stop-warning must be >= 0 seconds" in proc.stderr, proc.stderr


def test_slurm_script_quotes_what_it_writes(toy_data, tmp_path):
    """Values from the study file and the command line reach the script as single shell words: a
    space, a quote and a $(...) in `out` and --partition stay inside their #SBATCH values, and the script's command (run
    with --python standing in: a script that prints one argument a line) gets the study's path
    and the trainer's as one argument each."""
    out = tmp_path / "it's $(touch INJECTED) x"
    path = write_study(tmp_path / "toy study.toml", out, toy_data)
    args = tmp_path / "print args"
    args.write_text('#!/bin/sh\nfor a in "$@"; do printf "%s\\n" "$a"; done\n')
    args.chmod(0o755)
    proc = study_cmd("slurm", path, "--binary", "/nonexistent/train san", "--python", args,
                     "--partition", "gpu $(touch INJECTED)")
    assert proc.returncode == 0, proc.stderr
    script = out / "slurm" / "study.sbatch"
    directives = dict(line[len("#SBATCH --"):].split("=", 1) for line in script.read_text().splitlines()
                      if line.startswith("#SBATCH --") and "=" in line)
    assert shlex.split(directives["output"]) == [os.path.join(str(out), "slurm", "%A_%a.out")]
    assert shlex.split(directives["partition"]) == ["gpu $(touch INJECTED)"]
    run = subprocess.run(["bash", str(script)], capture_output=True, text=True, cwd=tmp_path,
                         env=dict(os.environ, SLURM_ARRAY_TASK_ID="1"), timeout=60)
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines() == ["-m", "study", "run", path, "--binary", "/nonexistent/train san", "--only", "1"]
    assert not list(tmp_path.rglob("INJECTED")) and not os.path.exists(os.path.join(ROOT, "INJECTED"))


@pytest.mark.parametrize("field", ["study.out", "--partition"])
def test_slurm_refuses_a_newline(toy_data, tmp_path, field):
    """A newline in a value would end its #SBATCH line and make the rest a shell command:
    refused, naming the study file and the value, before anything is written."""
    path = write_study(tmp_path / "toy.toml", tmp_path / "out", toy_data)
    partition = "gpu"
    if field == "study.out":
        text = open(path).read()
        old = f'out = "{tmp_path / "out"}"'
        assert old in text
        open(path, "w").write(text.replace(old, old[:-1] + '\\ntouch INJECTED"', 1))
    else:
        partition = "gpu\ntouch INJECTED"
    proc = study_cmd("slurm", path, "--binary", "/nonexistent/train_san", "--partition", partition)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert path in proc.stderr and field in proc.stderr and "control character" in proc.stderr, proc.stderr
    assert not list(tmp_path.rglob("study.sbatch"))


# ----------------------------------------------------------------------------------------
# broken study files

BROKEN = [
    ("unknown preset", 'preset = "tiny"', 'preset = "huge"', "arm 'san': unknown preset 'huge'"),
    ("missing seeds", "seeds = [7]", "", "[study]: missing field 'seeds'"),
    ("missing arm name", 'name = "ffn"', "", "[[arm]] #2: missing field 'name'"),
    ("unknown field", "val_every = 3", "val_evry = 3", "[study]: unknown field 'val_evry'"),
    ("runner flag", '"--val-batches", "4"', '"--steps", "4"', "--steps is set by the runner"),
    ("both budgets", "steps = 6", "steps = 6\ntokens = 100", "exactly one of 'tokens'"),
    ("bad finding", 'ffn = "ffn"', 'ffn = "ffm"', "ffn = 'ffm' is not an arm"),
    ("bad toml", "seeds = [7]", "seeds = [7", "not valid TOML"),
    ("skip_eval not a bool", "val_every = 3", 'val_every = 3\nskip_eval = "yes"', "study.skip_eval must be true or false"),
]


@pytest.mark.parametrize("what, old, new, message", BROKEN, ids=[b[0] for b in BROKEN])
def test_broken_study_stops_before_any_run(toy_data, tmp_path, what, old, new, message):
    path = write_study(tmp_path / "toy.toml", tmp_path / "out", toy_data)
    text = open(path).read()
    assert old in text
    open(path, "w").write(text.replace(old, new, 1))
    proc = study_cmd("run", path, "--binary", BIN or "/nonexistent/train_san")
    assert proc.returncode == 2
    assert path in proc.stderr and message in proc.stderr, proc.stderr
    assert not (tmp_path / "out").exists()


@needs_bin
def test_unknown_flag_stops_unless_the_arm_is_optional(toy_data, tmp_path):
    arms = """
[[arm]]
name = "san"
preset = "tiny"
flags = ["--no-such-flag", "1"]

[[arm]]
name = "ffn"
preset = "tiny-ffn"
"""
    path = write_study(tmp_path / "toy.toml", tmp_path / "out", toy_data, arms=arms)
    proc = study_cmd("run", path, "--binary", BIN)
    assert proc.returncode == 2 and "arm 'san'" in proc.stderr and "--no-such-flag" in proc.stderr
    assert not (tmp_path / "out").exists()
    path = write_study(tmp_path / "toy.toml", tmp_path / "out", toy_data, arms=arms.replace('"1"]', '"1"]\noptional = true'))
    proc = study_cmd("run", path, "--binary", BIN, "--dry-run")
    assert proc.returncode == 0 and "arm san: skipped (this train_san has no --no-such-flag)" in proc.stdout
    assert "san_s7" not in proc.stdout.split("skipped")[1]


# ----------------------------------------------------------------------------------------
# spectra

def check_spectra_against_torch(path, model):
    result = spectra.checkpoint_spectra(path)
    params = dict(model.ordered_parameters())
    kinds = ["attn.wq", "attn.wk", "attn.wv", "attn.wo"] + (["ffn.w_gate", "ffn.w_up", "ffn.w_down"]
                                                             if model.cfg.ffn == "swiglu" else [])
    assert list(result["stable_rank"]) == kinds
    for kind in kinds:
        assert len(result["stable_rank"][kind]) == model.cfg.n_layer
        for layer in range(model.cfg.n_layer):
            w = params[f"layers.{layer}.{kind}"].detach().double()
            s = torch.linalg.svdvals(w)
            np.testing.assert_allclose(result["singular_values"][kind][layer], s.numpy(), rtol=1e-9, atol=1e-12)
            fro2 = float((w * w).sum())
            spectral = float(torch.linalg.matrix_norm(w, ord=2))
            assert math.isclose(result["stable_rank"][kind][layer], fro2 / spectral ** 2, rel_tol=1e-9)


def test_spectra_of_a_reference_checkpoint(tmp_path):
    cfg = san.SANConfig(**dict(san.PRESETS["tiny-ffn"], n_layer=3))
    model = san.SAN(cfg).init_weights(0)
    with torch.no_grad():  # layers that differ, so a mix-up of layers or matrices shows
        for i, (name, p) in enumerate(model.ordered_parameters()):
            if p.ndim == 2:
                p.mul_(1.0 + 0.1 * i)
    path = str(tmp_path / "ckpt.bin")
    container.save_checkpoint(path, model, step=5)
    check_spectra_against_torch(path, model)
    assert spectra.checkpoint_spectra(path)["step"] == 5


def test_spectra_of_a_hybrid_with_mlp_layers(tmp_path):
    """An mlp layer has no attn.wq ... (its sub-layer is attn.w_gate/w_up/w_down): those layers
    hold None, the means skip them; a standard layer without attn.wq is still an error."""
    cfg = san.SANConfig(**dict(san.PRESETS["tiny-ffn"], n_layer=3, attention="mlp", layout="2"))
    model = san.SAN(cfg).init_weights(0)
    path = str(tmp_path / "hybrid.bin")
    container.save_checkpoint(path, model, step=3)
    sp = spectra.checkpoint_spectra(path)
    params = dict(model.ordered_parameters())
    for kind, layers in (("attn.wq", [1]), ("attn.w_gate", [0, 2])):
        got = sp["stable_rank"][kind]
        assert [l for l, v in enumerate(got) if v is not None] == layers, (kind, got)
        want = [spectra.stable_rank(torch.linalg.svdvals(params[f"layers.{l}.{kind}"].detach().double()).numpy()) for l in layers]
        assert spectra.layer_mean(got) == pytest.approx(np.mean(want), rel=1e-9)
    kind, meta, tensors = container.read_container(path)
    del tensors["layers.1.attn.wq"]
    broken = str(tmp_path / "broken.bin")
    container.write_container(broken, kind, list(meta.items()),
                              [(n, a, "int32" if a.dtype.kind in "iu" else "fp32") for n, a in tensors.items()])
    with pytest.raises(container.ContainerError, match="attn.wq is missing for layer 1"):
        spectra.checkpoint_spectra(broken)


@needs_bin
def test_spectra_of_trainer_milestones(toy_study, tmp_path):
    _, out, _ = toy_study
    ckpt = out / "runs" / "ffn_lr0.03_s7" / "ckpt"
    model, step, _, _ = san.load_checkpoint(str(ckpt / "milestone_050.bin"))
    check_spectra_against_torch(str(ckpt / "milestone_050.bin"), model)
    files = sorted(str(p) for p in ckpt.glob("milestone_*.bin"))
    spectra.main(files + ["--out", str(tmp_path)])
    saved = json.load(open(tmp_path / "spectra.json"))
    steps = [r["step"] for r in saved]
    assert len(files) == 5 and steps[0] == 0 and steps[-1] == 6 and steps == sorted(set(steps))
    for name in ("singular_values.png", "stable_rank_over_training.png", "stable_rank_per_layer.png"):
        assert (tmp_path / name).exists()


@needs_bin
def test_interrupted_study_stops_cleanly_and_resumes(toy_data, tmp_path):
    path = write_study(tmp_path / "toy.toml", tmp_path / "out", toy_data)
    proc = subprocess.Popen([PYTHON, *STUDY, "run", path, "--binary", BIN], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    for line in proc.stdout:
        if "] step" in line:  # a trainer is running
            proc.terminate()
            break
    out = line + proc.stdout.read()
    assert proc.wait(timeout=60) == 130, out
    interrupted = re.search(r"stopped by SIGTERM during (\S+)[ ;]", out).group(1)
    # (the runner alone was signalled: it passed the signal on, and the trainer saved)
    assert json.load(open(tmp_path / "out" / "runs" / interrupted / "status.json"))["state"] == "interrupted"
    again = study_cmd("run", path, "--binary", BIN)
    assert again.returncode == 0 and f": {interrupted}" in again.stdout
    for run in ("san_s7", "ffn_lr0.03_s7"):
        assert json.load(open(tmp_path / "out" / "runs" / run / "status.json"))["state"] == "done"


@needs_bin
def test_ctrl_c_lets_the_trainer_save_and_says_how_to_continue(toy_data, tmp_path):
    """Ctrl-C at a terminal signals its whole foreground group, the runner and the trainer it
    started (here: SIGINT to the process group of a session of its own). The trainer's own
    first-signal save finishes (the runner's SIGTERM on top used to make it a second signal: a
    stop without saving), its stop lines reach stdout.log, status.json records the stop and
    what was kept, and the runner prints the command that continues, which resumes there."""
    steps = 300  # (a few ms each: the signal lands among them)
    path = tmp_path / "toy.toml"
    path.write_text(f"""
[study]
name = "toy"
out = "{tmp_path / 'out'}"
seeds = [7]
batch_size = 4
seq_len = 32
steps = {steps}
val_every = {steps}
save_every = 0
flags = ["--train-data", "{toy_data}/toy_train_*.bin", "--val-data", "{toy_data}/toy_val_*.bin", "--val-batches", "1",
         "--sample-tokens", "0", "--optimizer", "adamw"]

[[arm]]
name = "san"
preset = "tiny"
""")
    proc = subprocess.Popen([PYTHON, *STUDY, "run", path, "--binary", BIN], stdout=subprocess.PIPE, text=True, cwd=ROOT,
                            start_new_session=True)
    for line in proc.stdout:
        if "] step" in line:  # the trainer is training
            os.killpg(proc.pid, signal.SIGINT)
            break
    out = line + proc.stdout.read()
    assert proc.wait(timeout=120) == 130, out
    run_dir = tmp_path / "out" / "runs" / "san_s7"
    status = json.load(open(run_dir / "status.json"))
    k = status["step"]
    assert status["state"] == "interrupted" and status["returncode"] == 128 + signal.SIGINT, status
    assert 1 <= k < steps and os.path.exists(run_dir / "ckpt" / f"step_{k}.bin"), status
    log = (run_dir / "stdout.log").read_text()
    assert f"Interrupt: stopping after step {k} of {steps}" in log and f"Interrupt: stopped after step {k} of" in log
    again = f"{os.path.relpath(PYTHON, ROOT)} -m study run {path} --binary {BIN}"  # the venv's Python, as run
    assert (f"study toy: stopped by SIGINT during san_s7 (saved up to step {k} in {run_dir}/ckpt/step_{k}.bin); "
            f"continue the study with: {again}") in out, out
    resumed = study_cmd(*again.split()[3:])
    assert resumed.returncode == 0 and f"san_s7 (resuming from step {k})" in resumed.stdout, resumed.stdout
    assert json.load(open(run_dir / "status.json"))["state"] == "done"


# ----------------------------------------------------------------------------------------
# the shipped study files

@pytest.mark.parametrize("name", sorted(f for f in os.listdir(os.path.join(ROOT, "studies")) if f.endswith(".toml")))
def test_shipped_study_files_load(name):
    s = study.load_study(os.path.join(ROOT, "studies", name))
    assert s.runs
    if name.startswith("mini_"):  # the mini-studies' FFN arms are the SAN arm's partners
        found = match.partners(s.arm("san").model())
        for role, arm in (("iso-depth", "ffn-iso-depth"), ("iso-param", "ffn-iso-param"), ("iso-FLOP", "ffn-iso-flop")):
            assert s.arm(arm).model() == found[role], (name, role)


@needs_bin
def test_diverged_run_is_finished_and_reported(toy_data, tmp_path):
    """A run whose loss blows up (an absurd rate) is recorded as diverged, not retried, listed
    in the report and counted by the QK-norm finding."""
    arms = """
[[arm]]
name = "stable"
preset = "tiny"

[[arm]]
name = "blowup"
preset = "tiny"
flags = ["--qk-norm", "0"]
lr = 1e5
lr_other = 1e5
"""
    findings = '[[finding]]\nkind = "qk_norm"\nwith_qk_norm = "stable"\nwithout_qk_norm = "blowup"\n'
    path = write_study(tmp_path / "toy.toml", tmp_path / "out", toy_data, arms=arms, findings=findings)
    proc = study_cmd("run", path, "--binary", BIN)
    assert proc.returncode == 0 and "1 diverged (blowup_lr100000_lo100000_s7)" in proc.stdout, proc.stdout + proc.stderr
    status = json.load(open(tmp_path / "out" / "runs" / "blowup_lr100000_lo100000_s7" / "status.json"))
    assert status["state"] == "diverged" and "diverged" in status["message"]
    assert "0 to run now" in study_cmd("run", path, "--binary", BIN).stdout  # not retried
    assert study.main(["report", path, "--binary", BIN]) == 0
    report = (tmp_path / "out" / "report" / "report.md").read_text()
    assert f"Diverged: `blowup_lr100000_lo100000_s7` at step {status['step']}" in report
    rows = {r["arm"]: r for r in md_table(report, "arm")}
    assert rows["blowup"]["seeds"] == "0" and rows["blowup"]["val loss"] == "—"
    # counted, but one run a stack is too few for a verdict (study/findings.py: three at least)
    assert "**too few seeds (1).** diverged runs: with QK-norm 0 of 1, without 1 of 1" in report


@needs_bin
def test_a_guard_stop_where_the_data_changes_is_not_filed_as_diverged(toy_data, tmp_path):
    """(issue 53) A run that the divergence guard stops where its training data turns to another
    corpus (shard a: the toy documents for STEPS_ON_A steps, then shard b: random tokens) is
    recorded as stopped by the guard (status "guard"), not as diverged: the summary and the report
    list it apart, saying how to pass it, and the next `run` tries it again (a diverged run is
    final)."""
    steps_on_a, rows, seq = 10, 4, 32  # (write_study's batch and context)
    (tmp_path / "g").mkdir()
    toy = read_shard(str(toy_data / "toy_train_000000.bin"))
    write_shard(str(tmp_path / "g" / "g_train_000000.bin"), toy[:steps_on_a * rows * seq + 1])
    write_shard(str(tmp_path / "g" / "g_train_000001.bin"), np.random.default_rng(1).integers(10, VOCAB, size=4 * rows * seq + 1))
    arms = f"""
[[arm]]
name = "switch"
preset = "tiny"
flags = ["--train-data", "{tmp_path}/g/g_train_*.bin", "--shuffle", "0", "--spike-window", "4"]
lr = 0.03
lr_other = 0.03
"""
    path = write_study(tmp_path / "toy.toml", tmp_path / "out", toy_data, arms=arms, findings="")
    text = open(path).read()  # (longer than write_study's 6 steps: shard a, then into shard b)
    open(path, "w").write(text.replace("\nsteps = 6\n", f"\nsteps = {steps_on_a + 2}\n"))
    proc = study_cmd("run", path, "--binary", BIN)
    run_id = "switch_lr0.03_lo0.03_s7"
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert f"0 diverged, 1 stopped by the guard ({run_id}: a loss jump" in proc.stdout, proc.stdout + proc.stderr
    assert "--spike-guard 0 in the arm's flags passes it" in proc.stdout
    status = json.load(open(tmp_path / "out" / "runs" / run_id / "status.json"))
    assert status["state"] == "guard" and status["step"] == steps_on_a + 1, status
    assert "stopped by the guard where the data changes" in status["message"]
    assert study.main(["report", path, "--binary", BIN]) == 0
    report = (tmp_path / "out" / "report" / "report.md").read_text()
    assert f"Stopped by the guard (a loss jump; `--spike-guard 0` in the arm's flags passes it" in report
    assert "Diverged:" not in report
    assert "1 to run now" in study_cmd("run", path, "--binary", BIN).stdout  # tried again


def test_qk_norm_finding_without_a_divergence_judges_instability():
    """No run diverged: the finding 'shows, short of a divergence' when the stack without
    QK-norm trained unstably (validation loss back up by more than the noise floor, or the
    gradient norm up more than tenfold) more often than chance allows (3 runs of 3, none with
    it), 'does not show' otherwise, and 'too few seeds' under three runs a stack; the figures in
    its text are recomputed here from stand-in summaries."""
    from study import report as study_report

    def arm(name, loss, logits, grad_norms, val_losses, runs=3, unstable_runs=None):
        """`runs` runs NAME_s1.. that each trained so; with unstable_runs, the others calm."""
        made = []
        for i in range(runs):
            calm = unstable_runs is not None and i >= unstable_runs
            made.append(types.SimpleNamespace(run=types.SimpleNamespace(id=f"{name}{i + 1}"), final={"max_logit": logits},
                                              train=[{"grad_norm": g} for g in ([1.0, 1.0] if calm else grad_norms)],
                                              val=[{"val_loss": v} for v in ([6.0, 5.0, 4.0] if calm else val_losses)]))
        return types.SimpleNamespace(ok=True, mean=loss, diverged=[], all_runs=made, runs=made, representative=made[0],
                                     by_seed=lambda: dict.fromkeys(range(runs), loss))

    f = {"with_qk_norm": "with", "without_qk_norm": "without"}
    stable = arm("with_s", 4.0, [1.5, 4.0, 2.0], [1.0, 0.9], [6.0, 5.0, 4.0])
    rising = arm("without_s", 5.5, [30.0, 100.0], [1.0, 1.2], [6.0, 5.4, 5.5])  # +0.1 > the floor
    exploding = arm("without_s", 5.5, [30.0, 100.0], [1.0, 170.0], [6.0, 5.6, 5.5])
    for without, reason in ((rising, "validation loss rose from 5.4000 to 5.5000"),
                            (exploding, "gradient norm grew from 1 to 170")):
        verdict, text, p = study_report.finding_qk_norm(f, {"with": stable, "without": without}, 0.02, {})
        assert verdict == "shows, short of a divergence" and p == pytest.approx(1 / 20), text  # 1 / C(6, 3)
        assert f"without_s1: {reason}." in text and "with_s1:" not in text
        assert f"({5.5 - 4.0:+.4f} [{5.5 - 4.0:+.4f}, {5.5 - 4.0:+.4f}], {(5.5 - 4.0) / 0.02:+.0f} noise floors)" in text
    # a rise within the noise floor is not instability; neither is a norm up only 9-fold
    calm = arm("without_s", 5.5, [30.0, 100.0], [1.0, 9.0], [6.0, 5.49, 5.5])
    verdict, text, _ = study_report.finding_qk_norm(f, {"with": stable, "without": calm}, 0.02, {})
    assert verdict == "does not show" and "diverged or trained unstably" in text
    # both unstable: not the paper's finding
    verdict, text, _ = study_report.finding_qk_norm(f, {"with": exploding, "without": exploding}, None, {})
    assert verdict == "does not show" and "with QK-norm trained unstably too" in text
    assert "noise floors" not in text and "(+0.0000 [+0.0000, +0.0000])" in text
    # one run of three without QK-norm unstable: not more often than chance (p = 0.5)
    once = arm("without_s", 5.5, [30.0, 100.0], [1.0, 170.0], [6.0, 5.6, 5.5], unstable_runs=1)
    verdict, text, _ = study_report.finding_qk_norm(f, {"with": stable, "without": once}, 0.02, {})
    assert verdict == "does not show" and "not more often than chance allows (one-sided Fisher p = 0.500)" in text
    # one run a stack: no verdict
    verdict, text, _ = study_report.finding_qk_norm(f, {"with": arm("with_s", 4.0, [1.5], [1.0, 0.9], [6.0, 5.0, 4.0], runs=1),
                                                     "without": arm("without_s", 5.5, [30.0], [1.0, 170.0], [6.0, 5.6],
                                                                    runs=1)}, 0.02, {})
    assert verdict == "too few seeds (1)" and "at least 3 runs" in text


# ----------------------------------------------------------------------------------------
# skip evaluations of hybrids (study.skip_eval)

def section_table(text, heading):
    """Rows (dicts) of the first markdown table after the line `heading`."""
    return md_table(text[text.index(heading + "\n"):], next(
        line.strip().strip("|").split("|")[0].strip() for line in text[text.index(heading + "\n"):].splitlines()
        if line.startswith("|")))


@needs_bin
def test_skip_evaluations_of_hybrids_are_run_once_and_reported(toy_data, tmp_path):
    """skip_eval: each hybrid arm's final checkpoint is evaluated without its variant attention
    sub-layers and without its variant blocks, once (a rerun skips them; a lost record is redone);
    the report's skip table holds those evaluations' losses beside the hybrid's and the uniform arm's."""
    arms = """
[[arm]]
name = "mlp-hybrid"
preset = "tiny-ffn"
flags = ["--attention", "mlp", "--layout", "hybrid"]

[[arm]]
name = "mlp-uniform"
preset = "tiny-ffn"
flags = ["--attention", "mlp"]
"""
    out = tmp_path / "out"
    path = write_study(tmp_path / "toy.toml", out, toy_data, extra_study="skip_eval = true", arms=arms, findings="")
    proc = study_cmd("run", path, "--binary", BIN)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    hybrid, uniform = out / "runs" / "mlp-hybrid_s7", out / "runs" / "mlp-uniform_s7"
    assert sorted(f for f in os.listdir(hybrid) if f.startswith("eval_")) == sorted(
        f"eval_skip-{m}.{ext}" for m in ("attention", "block") for ext in ("jsonl", "json", "log"))
    assert not [f for f in os.listdir(uniform) if f.startswith("eval_")]
    skip = {m: final_val(hybrid / f"eval_skip-{m}.jsonl")["val_loss"] for m in ("attention", "block")}
    whole = final_val(hybrid / "log.jsonl")["val_loss"]
    assert len({whole, skip["attention"], skip["block"]}) == 3  # each mode reached the trainer

    assert study.main(["report", path, "--binary", BIN]) == 0
    report = (out / "report" / "report.md").read_text()
    rows = section_table(report, "## Skip: hybrids without their variant layers")
    assert rows == [{"arm": "mlp-hybrid", "hybrid": f"{whole:.4f}", "skip-attn": f"{skip['attention']:.4f}",
                     "skip-block": f"{skip['block']:.4f}", "uniform arm": "mlp-uniform",
                     "uniform": f"{final_val(uniform / 'log.jsonl')['val_loss']:.4f}"}]

    os.remove(hybrid / "eval_skip-block.jsonl")  # lost: the next run redoes that one only
    redo = study_cmd("run", path, "--binary", BIN)
    assert redo.returncode == 0 and "mlp-hybrid_s7: eval skip-block" in redo.stdout, redo.stdout
    assert "eval skip-attention" not in redo.stdout
    assert final_val(hybrid / "eval_skip-block.jsonl")["val_loss"] == skip["block"]


# the context-length evaluation ([study.context_eval], the Deconstructing paper's Table 4)

def wikitext_fixture(d):
    """A WikiText eval set built as from the Hub (dev/data/evals.py --files, rows in the
    dataset's schema) with a small SentencePiece tokenizer trained on the same pages, and
    training shards of those pages: (eval set path, tokenizer)."""
    import evals
    from attnref.tokenizer import train_sentencepiece
    rng = np.random.default_rng(3)
    words = ["the", "game", "battle", "river", "king", "song", "was", "is", "a", "of", "in", "1 @,@ 000", "@-@"]
    pages = []
    for i in range(8):
        body = " . ".join(" ".join(rng.choice(words, size=int(rng.integers(4, 12)))) for _ in range(int(rng.integers(3, 9))))
        pages.append(f" = Page {i} = \n \n {body} . \n")
    with open(d / "test.jsonl", "w") as f:
        for p in pages:
            f.write(json.dumps({"page": p}) + "\n")
    tok = train_sentencepiece([line for p in pages for line in evals.wikitext_detokenize(p).split("\n") if line],
                              d / "tok", vocab_size=400, num_threads=1, hard_vocab_limit=False)
    evals.main(["--tokenizer", tok.model_file, "--out", str(d), "--only", "wikitext", "--files",
                f"wikitext={d / 'test.jsonl'}"])
    for split, n in (("train", 200), ("val", 20)):
        tokens = []
        for _ in range(n):
            tokens += [tok.bos_id] + tok.encode(evals.wikitext_detokenize(pages[int(rng.integers(len(pages)))]))
        write_shard(d / f"wiki_{split}_000000.bin", np.array(tokens, dtype=np.int64))
    return d / "wikitext.bin", tok


def context_study(path, out, data, tok, wikitext, contexts):
    path.write_text(f"""
[study]
name = "ctx"
out = "{out}"
seeds = [7]
batch_size = 4
seq_len = 32
steps = 4
val_every = 4
save_every = 4
flags = ["--train-data", "{data}/wiki_train_*.bin", "--val-data", "{data}/wiki_val_*.bin", "--val-batches", "2",
         "--sample-tokens", "0", "--optimizer", "adamw", "--vocab-size", "{tok.vocab_size}", "--bos-id", "{tok.bos_id}"]

[study.context_eval]
sets = ["{wikitext}"]
contexts = {contexts}

[[arm]]
name = "san"
preset = "tiny"

[[arm]]
name = "ffn"
preset = "tiny-ffn"
""")
    return str(path)


@needs_bin
def test_context_length_table(tmp_path):
    """After each run, `--steps 0 --init-from final.bin --eval-context` scores the WikiText set at
    each context (eval_context.jsonl); the report's table is those numbers; a second `run`
    evaluates nothing, new contexts evaluate again, a missing set is skipped and said so."""
    from study import report as study_report
    wikitext, tok = wikitext_fixture(tmp_path)
    out = tmp_path / "out"
    path = context_study(tmp_path / "ctx.toml", out, tmp_path, tok, wikitext, [8, 16, 64])  # tiny's context: 64
    proc = study_cmd("run", path, "--binary", BIN)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count(": eval context\n") == 2 and "--eval-context 8,16,64" in proc.stdout
    logs = {}
    for run in ("san_s7", "ffn_s7"):
        evals = run_files.read_evals(out / "runs" / run / "eval_context.jsonl")
        (step,) = evals  # evaluated once, logged at the checkpoint's step
        assert step > 0
        logs[run] = evals[step]["wikitext"]
        assert json.load(open(out / "runs" / run / "eval_context.json"))["flags"][:4] == [
            "--eval-sets", str(wikitext), "--eval-context", "8,16,64"]
        # each context is its own number; 64 is the model's context, the scores at --seq-len
        assert len({logs[run][f"word_perplexity@{n}"] for n in (8, 16, 64)}) == 3
        assert logs[run]["word_perplexity@64"] == logs[run]["word_perplexity"]
    assert study.main(["report", path, "--binary", BIN]) == 0
    report = (out / "report" / "report.md").read_text()
    rows = {r["arm"]: r for r in md_table(report[report.index("## Perplexity by context length"):], "arm")}
    assert set(rows) == {"san", "ffn"}
    for arm in ("san", "ffn"):
        for n in (8, 16, 64):
            assert abs(float(rows[arm][str(n)]) - logs[f"{arm}_s7"][f"word_perplexity@{n}"]) <= 5e-3, (arm, n)
    # done: not run again
    again = study_cmd("run", path, "--binary", BIN)
    assert again.returncode == 0 and "eval context" not in again.stdout, again.stdout
    # other contexts are another evaluation; while the set is missing it is skipped, not failed
    path = context_study(tmp_path / "ctx.toml", out, tmp_path, tok, wikitext, [8, 32])
    os.rename(wikitext, tmp_path / "away.bin")
    skipped = study_cmd("run", path, "--binary", BIN, "--only", "0")
    assert skipped.returncode == 0 and f"san_s7: eval context skipped ({wikitext} does not exist)" in skipped.stdout
    os.rename(tmp_path / "away.bin", wikitext)
    rerun = study_cmd("run", path, "--binary", BIN, "--only", "0")
    assert rerun.returncode == 0 and "--eval-context 8,32" in rerun.stdout and "ffn_s7" not in rerun.stdout
    (evals,) = run_files.read_evals(out / "runs" / "san_s7" / "eval_context.jsonl").values()
    evals = evals["wikitext"]
    assert evals["word_perplexity@8"] == logs["san_s7"]["word_perplexity@8"] and "word_perplexity@16" not in evals
    # a report of a study whose runs are not evaluated yet shows the table empty
    md = study_report.context_length_section(study.load_study(path), {})
    assert md[0] == "## Perplexity by context length"


def test_context_length_table_sets_the_papers_rows_beside(tmp_path):
    """study.paper = "deconstructing": the WikiText context table has the paper's Table 4 rows
    (standard 69.9 at 128 and 38.1 at 2,048; uniform mlp 993.5 at every context), "—" where the
    paper gives none; another set, or a study without the paper, has none."""
    from study import report as study_report
    path = tmp_path / "d.toml"
    for paper, name in (("deconstructing", "wikitext"), ("deconstructing", "other"), ("", "wikitext")):
        path.write_text(f"""
[study]
name = "d"
out = "{tmp_path / 'out'}"
{f'paper = "{paper}"' if paper else ""}
seeds = [1]
batch_size = 2
seq_len = 2048
steps = 2

[study.context_eval]
sets = ["{tmp_path / name}.bin"]
contexts = [128, 512, 2048]

[[arm]]
name = "standard"
preset = "qwen-500m"
""")
        md = "\n".join(study_report.context_length_section(study.load_study(str(path)), {}))
        rows = {r["arm"]: r for r in md_table(md, "arm")}
        if (paper, name) == ("deconstructing", "wikitext"):
            assert rows["paper: standard"] == {"arm": "paper: standard", "128": "69.9", "512": "—", "2048": "38.1"}
            assert [rows["paper: mlp uniform"][n] for n in ("128", "512", "2048")] == ["993.5"] * 3
        else:
            assert not rows


@pytest.mark.parametrize("table, message", [
    ('{sets = ["w.bin"], contexts = [8, 128]}', "[study.context_eval].contexts: 128 is longer than arm 'san''s context 64"),
    ('{sets = ["w.bin"], contexts = [8, 8]}', "[study.context_eval].contexts repeats a context"),
    ('{sets = [], contexts = [8]}', "[study.context_eval].sets must be a non-empty list"),
    ('{sets = ["w.bin"], contexts = [0]}', "[study.context_eval].contexts must be a non-empty list of positive"),
    ('{sets = ["w.bin"], context = [8]}', "[study.context_eval]: unknown field 'context'"),
])
def test_bad_context_eval_is_named(toy_data, tmp_path, table, message):
    path = write_study(tmp_path / "toy.toml", tmp_path / "out", toy_data, extra_study=f"context_eval = {table}")
    proc = study_cmd("run", path, "--binary", BIN or "/nonexistent/train_san")
    assert proc.returncode == 2 and path in proc.stderr and message in proc.stderr, proc.stderr


def test_training_document_regions_and_eval_sets_in_the_localisation(tmp_path):
    """--train-doc-eval's decomposition ("train_docs" in the validation records) gets its own
    region table beside the held-out one, and the localisation finding states it and the
    LAMBADA / SciQ differences; every figure is recomputed here from toy logs (two SAN seeds,
    one FFN run) read by the report's own RunData / ArmSummary."""
    from study import report as study_report

    def val(seed_shift, query, trace, answer, lambada_acc, sciq_acc, held_out_query=5.0):
        docs = {"val_loss": 3.0 + seed_shift, "val_tokens": 900, "val_loss_query": query + seed_shift,
                "val_loss_trace": trace + seed_shift, "val_loss_answer": answer + seed_shift, "val_loss_other": 1.0}
        held_out = {"val_loss": 4.0 + seed_shift, "val_loss_query": held_out_query, "val_loss_trace": 3.0,
                    "val_loss_answer": 3.5, "val_loss_other": 1.5}
        return [{"step": 10, **held_out, "whole_docs": held_out, "train_docs": docs},
                {"step": 10, "eval": {"lambada": {"n": 8, "acc": lambada_acc, "perplexity": 90.0 - 100 * lambada_acc},
                                      "sciq": {"n": 8, "acc": sciq_acc, "acc_norm": sciq_acc - 0.1}}}]

    san_arm, ffn_arm = types.SimpleNamespace(name="san"), types.SimpleNamespace(name="ffn")
    logs = {"san_s1": (san_arm, val(0.0, 4.6, 2.9, 3.3, 0.20, 0.60)), "san_s2": (san_arm, val(0.02, 4.6, 2.9, 3.3, 0.30, 0.70)),
            "ffn_s1": (ffn_arm, val(0.0, 4.3, 2.95, 3.25, 0.40, 0.55, held_out_query=4.8))}
    data = []
    for name, (arm, records) in logs.items():
        run = types.SimpleNamespace(id=name, arm=arm, lr=None, lr_other=None, rate_point=(None, None), seed=int(name[-1]),
                                    dir=str(tmp_path / name))
        os.makedirs(run.dir)
        with open(os.path.join(run.dir, "log.jsonl"), "w") as f:
            f.write("".join(json.dumps(r) + "\n" for r in [{"step": 10, "loss": 4.0}] + records))
        run_files.write_status(run, "done")
        data.append(study_report.RunData(run, 100))
    summaries = {a.name: study_report.ArmSummary(a, data) for a in (san_arm, ffn_arm)}
    md = "\n".join(study_report.train_docs_region_table(summaries, summaries["san"]))
    assert md.startswith("### Loss per region on training documents")
    rows = {r["arm"]: r for r in md_table(md, "arm")}
    want = {"san": {"all": 3.01, "query": 4.61, "trace": 2.91, "answer": 3.31, "other": 1.0},
            "ffn": {"all": 3.0, "query": 4.3, "trace": 2.95, "answer": 3.25, "other": 1.0}}
    for arm, regions in want.items():
        assert rows[arm]["targets"] == "900"
        for r, v in regions.items():
            assert abs(float(rows[arm][r]) - v) <= 5e-5, (arm, r)
            assert abs(float(rows[arm][f"Δ {r}"]) - (v - want["san"][r])) <= 5e-5, (arm, r)
    verdict, text, _ = study_report.finding_localisation({"san": "san", "ffn": "ffn"}, summaries, None, {})
    assert verdict == "too few seeds (1)"  # (judged on the held-out regions; one FFN run: no interval)
    assert (f"On training documents (--train-doc-eval): query {4.61 - 4.3:+.4f} [no interval], trace "
            f"{2.91 - 2.95:+.4f} [no interval], answer {3.31 - 3.25:+.4f} [no interval] (too few seeds (1) to judge)") in text
    assert f"lambada acc {0.25 - 0.40:+.4f} (favours FFN)" in text
    assert f"lambada perplexity {(90 - 25.0) - (90 - 40.0):+.4f} (favours FFN)" in text
    assert f"sciq acc {0.65 - 0.55:+.4f} (favours SAN); sciq acc_norm {0.55 - 0.45:+.4f} (favours SAN)" in text
    # without train_docs in the logs: no table, no sentence
    for d in data:
        d.final.pop("train_docs")
    assert study_report.train_docs_region_table(summaries, summaries["san"]) == []
    assert "training documents" not in study_report.finding_localisation({"san": "san", "ffn": "ffn"}, summaries, None, {})[1]


@needs_bin
def test_san_paper_eval_sets_reach_the_runs_and_the_report(tmp_path):
    """studies/san_paper.toml passes LAMBADA (both variants), SciQ and Table 4's other tasks
    (HellaSwag, ARC-easy, PIQA, Winogrande, MMLU) to every run: built here by dev/data/evals.py from --files
    fixtures (the Hub is out of reach) with a small SentencePiece tokenizer, substituted for the
    study's paths in a one-run toy study (its --eval-sets list taken from the shipped file's run
    command), whose report shows each set's metrics equal to the run's logged eval record."""
    import evals
    from attnref.tokenizer import train_sentencepiece
    paper = study.load_study(os.path.join(ROOT, "studies", "san_paper.toml"))
    lists = {tuple(c[c.index("--eval-sets") + 1].split(",")) for c in (study.run_command(paper, r) for r in paper.runs)}
    assert len(lists) == 1  # every run scores the same sets
    shipped = lists.pop()
    sets = ["lambada", "lambada_standard", "sciq", "hellaswag", "arc_easy", "piqa", "winogrande", "mmlu"]
    assert [os.path.basename(p) for p in shipped] == [f"{name}.bin" for name in sets]
    words = ["the", "old", "man", "looked", "at", "sea", "and", "said", "hello", "boat", "water", "cells", "energy"]
    rng = np.random.default_rng(3)
    texts = [" ".join(rng.choice(words, size=9)) for _ in range(6)]
    fixtures = tmp_path / "fixtures"
    fixtures.mkdir()
    (fixtures / "lambada.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts[:3]))
    (fixtures / "lambada_standard.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts[3:]))
    (fixtures / "sciq.jsonl").write_text("".join(json.dumps(
        {"support": t, "question": "what did he say?", "distractor1": "sea", "distractor2": "boat",
         "distractor3": "cells", "correct_answer": "hello"}) + "\n" for t in texts[:4]))
    (fixtures / "hellaswag.jsonl").write_text("".join(json.dumps(
        {"activity_label": "Sailing", "ctx_a": t, "ctx_b": "the man", "endings": ["looked", "said", "boat", "sea"],
         "label": "1"}) + "\n" for t in texts[:3]))
    (fixtures / "arc_easy.jsonl").write_text("".join(json.dumps(
        {"question": t + "?", "choices": {"text": ["sea", "boat", "water"], "label": ["A", "B", "C"]}, "answerKey": "C"})
        + "\n" for t in texts[:3]))
    (fixtures / "piqa.jsonl").write_text("".join(json.dumps({"goal": t, "sol1": "the sea", "sol2": "the boat", "label": 0})
                                                 + "\n" for t in texts[:3]))
    (fixtures / "winogrande.jsonl").write_text("".join(json.dumps(
        {"sentence": "the old man looked at _ and said hello", "option1": "sea", "option2": "boat", "answer": "1"})
        + "\n" for _ in range(3)))
    (fixtures / "mmlu.jsonl").write_text("".join(json.dumps(
        {"question": t + "?", "subject": "sea_and_boats", "choices": ["sea", "boat", "water", "cells"], "answer": 2})
        + "\n" for t in texts[:3]))
    tok = train_sentencepiece(texts * 20 + words, tmp_path / "tok", vocab_size=300, num_threads=1,
                              hard_vocab_limit=False)
    evals.main(["--tokenizer", str(tmp_path / "tok.model"), "--out", str(tmp_path / "evals"), "--only", *sets,
                "--files"] + [f"{t}={fixtures / t}.jsonl" for t in sets])
    built = ",".join(str(tmp_path / "evals" / os.path.basename(p)) for p in shipped)
    # one toy run (the tokenizer's vocabulary; the toy corpus's tokens are below it)
    data = tmp_path / "toy"
    data.mkdir()
    w = ShardWriter(data, "toy", "train", 1 << 16, tok.vocab_size)
    for i in range(200):
        w.add([BOS] + list(rng.integers(10, VOCAB, size=12)) + [EOS])
    w.close()
    shutil.copy(data / "toy_train_000000.bin", data / "toy_val_000000.bin")
    out = tmp_path / "out"
    path = tmp_path / "evals.toml"
    path.write_text(f"""
[study]
name = "evals"
out = "{out}"
seeds = [7]
batch_size = 2
seq_len = 32
steps = 2
val_every = 2
flags = ["--train-data", "{data}/toy_train_*.bin", "--val-data", "{data}/toy_val_*.bin", "--val-batches", "1",
         "--vocab-size", "{tok.vocab_size}", "--sample-tokens", "0", "--eval-sets", "{built}"]
baseline = "san"

[[arm]]
name = "san"
preset = "tiny"
""")
    proc = study_cmd("run", path, "--binary", BIN)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert study.main(["report", str(path), "--binary", BIN]) == 0
    report = (out / "report" / "report.md").read_text()
    logged = run_files.read_evals(out / "runs" / "san_s7" / "log.jsonl")[2]
    row = md_table(report[report.index("## Eval sets"):], "arm")[0]
    checked = 0
    for name in sets:
        for metric in ("acc", "acc_norm", "perplexity"):
            if metric in logged[name]:
                assert abs(float(row[f"{name} {metric}"]) - logged[name][metric]) <= 5e-5, (name, metric)
                checked += 1
    assert checked == 2 * len(sets) - 1  # cloze: acc, perplexity; multiple choice: acc, acc_norm; partial: acc


# ----------------------------------------------------------------------------------------
# the rates in the report come from the logs' header records

def header_record(lr, lr_other, optimizer="adamw", preset="tiny", **counts):
    """A log's header record as the trainers write it (doc/formats.md "Training log")."""
    return {"run": {**counts, "executor": "host backend", "precision": "bf16", "attention_kernels": "scalar", "program": "train_san",
                    "command": f"./train_san --preset {preset}", "config": {"preset": preset, "lr": f"{lr:g}",
                                                                           "batch-size": "4", "seq-len": "32"},
                    "rates": {"optimizer": optimizer, "lr": lr, "lr_other": lr_other}, "ranks": 1}}


def write_fake_run(run_dir, header, peak_lr, losses, val_losses, steps=40):
    """A finished run's directory: log.jsonl (header, training records at the scheduled rate:
    a warm-up of 4 steps to peak_lr, validation records) and status.json."""
    os.makedirs(run_dir, exist_ok=True)
    records = [header] + [{"step": s, "loss": losses[s - 1], "lr": peak_lr * min(1.0, s / 4), "grad_norm": 1.0, "ms": 5.0}
                          for s in range(1, steps + 1)]
    records += [{"step": steps * (k + 1) // len(val_losses), "val_loss": v} for k, v in enumerate(val_losses)]
    with open(os.path.join(run_dir, "log.jsonl"), "w") as f:
        f.write("".join(json.dumps(r) + "\n" for r in records))
    with open(os.path.join(run_dir, "status.json"), "w") as f:
        json.dump({"state": "done", "steps": steps}, f)


def test_report_shows_the_rates_each_run_used(tmp_path):
    """Two arms that leave `lr` to the trainer ran at different rates (the tiny SAN at 6e-4, the
    FFN arm at 2.4e-3, as the issue found): the report's run table, arm table and finding say
    each run's own rates, read from its log's header record, and warn that the gap is unswept;
    a log without the header's rates shows the largest rate its training records logged, marked."""
    out = tmp_path / "out"
    path = tmp_path / "rates.toml"
    path.write_text(f"""
[study]
name = "rates"
out = "{out}"
seeds = [1, 2]
batch_size = 4
seq_len = 32
steps = 40
flags = ["--optimizer", "adamw"]

[[arm]]
name = "san"
preset = "tiny"

[[arm]]
name = "ffn"
preset = "tiny-ffn"

[[arm]]
name = "old"
preset = "tiny"
seeds = [1]

[[arm]]
name = "swept"
preset = "tiny"
lr = [1e-3, 2e-3]
seeds = [1]

[[arm]]
name = "other"
preset = "tiny"
flags = ["--optimizer", "muon"]
lr = 0.02
lr_other = [1e-3, 4e-3]
seeds = [1]

[[finding]]
kind = "localisation"
san = "san"
ffn = "ffn"
""")
    losses = [5.0 - 0.02 * s for s in range(40)]
    for seed, shift in ((1, 0.0), (2, 0.01)):
        write_fake_run(out / "runs" / f"san_s{seed}", header_record(6e-4, 6e-4), 6e-4, losses, [4.5 + shift, 4.2 + shift])
        # (the trainer's own counts: with a vocabulary from --tokenizer they differ from match.py's)
        write_fake_run(out / "runs" / f"ffn_s{seed}", header_record(2.4e-3, 1e-3, non_embedding=70_001, flops_per_token=1.234e6),
                       2.4e-3, losses, [4.4 + shift, 4.0 + shift])
    # a log from before the header held the rates: its training records tell the peak
    old_header = {"run": {"executor": "host backend", "precision": "bf16", "attention_kernels": "scalar"}}
    write_fake_run(out / "runs" / "old_s1", old_header, 1e-3, losses, [4.6, 4.3])
    # a sweep whose trainer scaled the rates it was given (as --lr-scale-gpus 4 does): the grid is named as asked
    write_fake_run(out / "runs" / "swept_lr0.001_s1", header_record(4e-3, 4e-3), 4e-3, losses, [4.6, 4.35])
    write_fake_run(out / "runs" / "swept_lr0.002_s1", header_record(2e-3, 2e-3), 2e-3, losses, [4.6, 4.25])
    # a sweep of Muon's AdamW side, whose second point ran at twice the rate it asked for
    write_fake_run(out / "runs" / "other_lr0.02_lo0.001_s1", header_record(0.02, 1e-3, "muon"), 0.02, losses, [4.6, 4.4])
    write_fake_run(out / "runs" / "other_lr0.02_lo0.004_s1", header_record(0.02, 8e-3, "muon"), 0.02, losses, [4.6, 4.2])
    assert study.main(["report", str(path), "--binary", "/nonexistent/train_san"]) == 0
    report = (out / "report" / "report.md").read_text()
    runs = {r["run"]: r for r in md_table(report, "run")}
    assert runs["san_s1"]["rates"] == runs["san_s2"]["rates"] == "adamw 0.0006"
    assert runs["ffn_s1"]["rates"] == runs["ffn_s2"]["rates"] == "adamw 0.0024 (other 0.001)"
    assert runs["old_s1"]["rates"] == "0.001 (max logged)"
    arms = {r["arm"]: r for r in md_table(report, "arm")}
    assert arms["san"]["rates"] == "adamw 0.0006" and arms["ffn"]["rates"] == "adamw 0.0024 (other 0.001)"
    assert abs(float(arms["ffn"]["val loss"]) - 4.005) <= 5e-5
    assert (arms["ffn"]["non-emb params"], arms["ffn"]["MFLOPs/token"]) == ("70,001", "1.23")  # the header's
    assert arms["san"]["non-emb params"] == f"{match.parameter_counts(match.PRESETS['tiny'])[1]:,}"  # none: match.py's
    assert "Rates used: san adamw 0.0006; ffn adamw 0.0024 (other 0.001). The arms trained at different rates" in report
    assert "default" not in report
    assert runs["swept_lr0.001_s1"]["rates"] == "adamw 0.004" and arms["swept"]["rates"] == "adamw 0.002"  # (its best)
    assert "their log headers say some runs trained at others: swept 0.001 ran at 0.004; " \
           "other --lr-other 0.004 ran at 0.008." in report
    # the sweeps' table has a column per rate point (lr, lr_other), and the arm its best point's rates
    sweeps = {r["arm"]: r for r in md_table(report, "arm", after="## Learning-rate sweeps")}
    assert sweeps["other"]["lr 0.02, other 0.001"] == "4.4000" and sweeps["other"]["lr 0.02, other 0.004"] == "4.2000"
    assert sweeps["swept"]["lr 0.002"] == "4.2500" and sweeps["swept"]["lr 0.02, other 0.004"] == "—"
    assert arms["other"]["rates"] == "muon 0.02 (rest 0.008)"


def append_eval(path, step, evals):
    with open(path, "a") as f:
        f.write(json.dumps({"step": step, "eval": evals}) + "\n")


def table1_evals(base):
    """An eval record of Table 1's sets whose numbers follow from `base`."""
    accs = {name: base + 0.01 * i for i, name in enumerate(["arc_easy", "boolq", "copa", "piqa", "sciq", "rte", "hellaswag"])}
    out = {name: {"acc": a, "acc_norm": a + 0.05} for name, a in accs.items()}
    out["wikitext"] = {"word_perplexity": 40.0 / base, "token_perplexity": 20.0 / base}
    out["lambada"] = {"acc": base / 2, "perplexity": 30.0 / base}
    return out


def test_report_writes_the_deconstructing_papers_table1(tmp_path):
    """study.paper = "deconstructing": the report writes Table 1 (ten columns and the NLU average
    of the seven accuracies, in %), a row per arm and a "(skip)" row per hybrid from its
    skip-block evaluation, with the paper's NLU average and WikiText perplexity beside each."""
    out = tmp_path / "out"
    path = tmp_path / "decon.toml"
    path.write_text(f"""
[study]
name = "decon"
out = "{out}"
paper = "deconstructing"
seeds = [1, 2]
batch_size = 4
seq_len = 32
steps = 40
skip_eval = true

[[arm]]
name = "standard"
preset = "tiny"

[[arm]]
name = "mlp-hybrid"
preset = "tiny"
flags = ["--attention", "mlp", "--layout", "hybrid"]
""")
    losses = [5.0 - 0.02 * s for s in range(40)]
    bases = {("standard", 1): 0.50, ("standard", 2): 0.54, ("mlp-hybrid", 1): 0.40, ("mlp-hybrid", 2): 0.44}
    for (arm, seed), base in bases.items():
        run_dir = out / "runs" / f"{arm}_s{seed}"
        write_fake_run(run_dir, header_record(4e-4, 4e-4), 4e-4, losses, [4.5, 4.2])
        append_eval(run_dir / "log.jsonl", 20, table1_evals(0.1))  # a milestone's: not the end's
        append_eval(run_dir / "log.jsonl", 40, table1_evals(base))
    for seed, base in ((1, 0.26), (2, 0.28)):  # the hybrid without its variant blocks
        run_dir = out / "runs" / f"mlp-hybrid_s{seed}"
        append_eval(run_dir / "eval_skip-block.jsonl", 0, table1_evals(base))
        (run_dir / "eval_skip-block.json").write_text(json.dumps({"flags": []}))
    assert study.main(["report", str(path), "--binary", "/nonexistent/train_san"]) == 0
    report = (out / "report" / "report.md").read_text()
    rows = {r["arm"]: r for r in md_table(report, "arm", "## The Deconstructing paper's Table 1")}
    assert list(rows) == ["standard", "mlp-hybrid", "mlp-hybrid (skip)"]
    for arm, b, paper in (("standard", (0.50, 0.54), ("51.9", "38.1")), ("mlp-hybrid", (0.40, 0.44), ("48.7", "45.8")),
                          ("mlp-hybrid (skip)", (0.26, 0.28), ("37.8", "200000"))):
        row, base = rows[arm], sum(b) / 2
        assert float(row["ARC-E"]) == pytest.approx(100 * base, abs=0.05)
        assert float(row["HellaSwag"]) == pytest.approx(100 * (base + 0.06), abs=0.05)
        assert float(row["NLU avg"]) == pytest.approx(100 * (base + 0.03), abs=0.05)  # the mean of base + 0.00 .. 0.06
        assert float(row["WikiText ppl"]) == pytest.approx(sum(40.0 / x for x in b) / 2, abs=0.005)
        assert float(row["LAMBADA acc"]) == pytest.approx(100 * base / 2, abs=0.05)
        assert float(row["LAMBADA ppl"]) == pytest.approx(sum(30.0 / x for x in b) / 2, abs=0.005)
        assert (row["paper NLU avg"], row["paper WikiText ppl"]) == paper


def test_report_of_the_san_paper_names_its_table4_and_budget_rows(tmp_path):
    """study.paper = "san": the report tables the gap to each matched partner beside the paper's
    at the study's budget (5,000 steps: iso-param 0.046, the others not given), Table 4's tasks
    at the end of the runs with each task's chance accuracy, and says that milestone
    evaluations are not the paper's budget rows."""
    out = tmp_path / "out"
    path = tmp_path / "san.toml"
    arms = "".join(f'\n[[arm]]\nname = "{a}"\npreset = "tiny"\n' for a in ("san", "depth", "flop", "param"))
    path.write_text(f"""
[study]
name = "san"
out = "{out}"
paper = "san"
seeds = [1]
batch_size = 4
seq_len = 32
steps = 5000
{arms}
[[finding]]
kind = "gap_ordering"
san = "san"
iso_depth = "depth"
iso_flop = "flop"
iso_param = "param"
""")
    finals = {"san": 4.2, "depth": 3.7, "flop": 3.95, "param": 4.15}
    for arm, final in finals.items():
        run_dir = out / "runs" / f"{arm}_s1"
        write_fake_run(run_dir, header_record(6e-4, 6e-4), 6e-4, [5.0 - 1e-4 * s for s in range(5000)], [4.5, final],
                       steps=5000)
    run_dir = out / "runs" / "san_s1"
    append_eval(run_dir / "log.jsonl", 5000, {"mmlu": {"acc": 0.2512}, "lambada": {"acc": 0.1, "perplexity": 90.0}})
    assert study.main(["report", str(path), "--binary", "/nonexistent/train_san"]) == 0
    report = (out / "report" / "report.md").read_text()
    gaps = {r["matching"]: r for r in md_table(report, "matching", "## The SAN paper's gaps at this budget")}
    for label, arm in (("iso-depth", "depth"), ("iso-FLOP", "flop"), ("iso-param", "param")):
        assert float(gaps[label]["gap"]) == pytest.approx(finals["san"] - finals[arm], abs=5e-5)
    assert [gaps[k]["paper"] for k in ("iso-depth", "iso-FLOP", "iso-param")] == ["—", "—", "+0.046"]
    rows = {r["arm"]: r for r in md_table(report, "arm", "## The SAN paper's Table 4 tasks")}
    assert rows["san"] == {"arm": "san", "lambada acc": "0.1000", "lambada perplexity": "90.0000", "mmlu acc": "0.2512"}
    assert rows["chance"]["mmlu acc"] == "0.25" and rows["chance"]["lambada acc"] == "—"
    budget = report[report.index("## Budget rows"):]
    assert "not those rows" in budget and "studies/ladders/san_paper_budgets.toml" in budget


def test_report_judges_its_findings_as_one_family(tmp_path):
    """Two mlp-collapse findings, each of which would show alone (its p, from study/findings.py on
    the same losses, between 0.025 and 0.05): judged as the report's family (Holm) neither passes,
    and the report says why; the same study with one of them shows it."""
    from study import findings
    std = [3.0, 3.01, 2.99]
    uni = [s + 1.0 + e for s, e in zip(std, (0.0, 0.004, -0.004))]

    def hybrid(d):  # recovers d nats more than half the uniform gap, with some seed noise
        return [(u + s - d) / 2 + e for u, s, e in zip(uni, std, (0.01, -0.01, 0.0))]

    def p_of(hyb):
        floor = findings.pooled_sd([std, uni, hyb, uni, hyb])
        rule = Rule("unpaired", floor)
        diffs = findings.variant_diffs({"standard": dict(enumerate(std)), "mlp-uniform": dict(enumerate(uni)),
                                        "mlp-hybrid": dict(enumerate(hyb))}, "standard", ["mlp"], rule)
        return findings.variants_behind(diffs, rule), findings.p_all_clear(findings.variant_numbers(diffs), rule)
    hyb = next(h for h in (hybrid(0.002 * k) for k in range(1, 200)) if 0.03 < p_of(h)[1] <= 0.045)
    assert p_of(hyb)[0] == "shows"
    finding = '\n[[finding]]\nkind = "mlp_collapse"\nstandard = "standard"\nuniform = "uni{k}"\nhybrid = "hyb{k}"\n'
    arms = "".join(f'\n[[arm]]\nname = "{a}"\npreset = "tiny"\n' for a in ("standard", "uni1", "hyb1", "uni2", "hyb2"))
    for name, findings_text in (("two", finding.format(k=1) + finding.format(k=2)), ("one", finding.format(k=1))):
        out = tmp_path / name
        path = tmp_path / f"{name}.toml"
        path.write_text(f'[study]\nname = "{name}"\nout = "{out}"\nseeds = [1, 2, 3]\nbatch_size = 4\nseq_len = 32\n'
                        f'steps = 40\n{arms}{findings_text}')
        for arm, losses in (("standard", std), ("uni1", uni), ("hyb1", hyb), ("uni2", uni), ("hyb2", hyb)):
            for seed, final in zip((1, 2, 3), losses):
                write_fake_run(out / "runs" / f"{arm}_s{seed}", header_record(6e-4, 6e-4), 6e-4, [5.0] * 40,
                               [4.5, final])
        assert study.main(["report", str(path), "--binary", "/nonexistent/train_san"]) == 0
        report = (out / "report" / "report.md").read_text()
        verdicts = re.findall(r"^\*\*(.+?)\.\*\* ", report[report.index("## Findings"):], re.M)
        if name == "two":
            assert verdicts == ["does not show", "does not show"]
            assert report.count("Alone it would show, but its p = ") == 2 and "among the report's 2 findings" in report
        else:
            assert verdicts == ["shows"] and "passes its Holm threshold 0.05 " in report


def test_final_loss_figure_is_readable(tmp_path):
    """final_loss.png: bars from 0 or a broken axis whose lower panel starts at 0; the seeds
    drawn above the error bars; the legend and the title inside the figure, off the data."""
    from study import report as study_report
    from matplotlib.transforms import Bbox

    def summary(name, losses):
        runs = [types.SimpleNamespace(final_loss=v, rates_text="adamw 0.001") for v in losses]
        mean, sd = study_report.mean_sd(losses)
        return types.SimpleNamespace(ok=True, arm=types.SimpleNamespace(name=name), runs=runs, mean=mean, sd=sd)

    for losses in ({"san": [4.61, 4.63], "ffn": [4.52, 4.55]},    # differences of hundredths: broken axis
                   {"san": [0.9, 1.5], "ffn": [3.0, 3.4]}):        # a range that 0 does not squash: from 0
        summaries = {k: summary(k, v) for k, v in losses.items()}
        fig = study_report.final_loss_figure(summaries, 0.015, summaries["san"])
        fig.canvas.draw()
        axes = fig.axes
        assert axes[-1].get_ylim()[0] == 0  # the lowest panel starts at 0
        data = axes[0]
        lo, hi = data.get_ylim()
        for s in summaries.values():  # every seed and bar top is in view
            assert all(lo < d.final_loss < hi for d in s.runs) and lo < s.mean < hi
        assert (len(axes) == 2) == (min(min(v) for v in losses.values()) > 2)
        seeds = [line for line in data.lines if line.get_marker() == "o"]
        bars = [c for c in data.collections if c.get_label() == "seed mean ± sd" or "LineCollection" in type(c).__name__]
        assert seeds and bars and min(x.get_zorder() for x in seeds) > max(c.get_zorder() for c in bars)
        renderer = fig.canvas.get_renderer()
        figure_box = Bbox.from_bounds(0, 0, *fig.canvas.get_width_height())
        legend = fig.legends[0].get_window_extent(renderer)
        title = fig._suptitle.get_window_extent(renderer)
        for box in (legend, title):
            assert figure_box.x0 <= box.x0 and box.x1 <= figure_box.x1 and figure_box.y0 <= box.y0 and box.y1 <= figure_box.y1
        for ax in axes:
            assert not legend.overlaps(ax.get_window_extent(renderer)) and not title.overlaps(ax.get_window_extent(renderer))
        study_report.plt.close(fig)


# ----------------------------------------------------------------------------------------
# before a run: the trainer and the data it needs are there, or named with what makes them

def needs_study(path, out, train, val, binary, extra=""):
    path.write_text(f"""
[study]
name = "needs"
out = "{out}"
binary = "{binary}"
seeds = [7]
batch_size = 4
seq_len = 32
steps = 2
val_every = 2
flags = ["--train-data", "{train}", "--val-data", "{val}", "--val-batches", "1", "--sample-tokens", "0", "--vocab-size", "2048"]
{extra}

[[arm]]
name = "san"
preset = "tiny"
""")
    return str(path)


def test_dry_run_checks_the_trainer_and_the_data(toy_data, tmp_path):
    """--dry-run lists the runs, then names each missing thing with the command that makes it
    (an offline tier's dev/data/build_offline.py with the study's vocabulary; a glob it knows no
    recipe for, as such; a trainer that is no build of this repository) and exits 1; a plain
    `run` stops on the same list (exit 2) before any run starts."""
    tier = "data/offline-missing-for-a-test"  # (relative: the study's paths are from the working directory)
    assert not os.path.exists(os.path.join(ROOT, tier))
    path = needs_study(tmp_path / "needs.toml", tmp_path / "out", f"{tier}/synth/synth_train_*.bin",
                       f"{tmp_path}/nowhere/val_*.bin", tmp_path / "train_san")
    proc = study_cmd("run", path, "--dry-run")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert re.search(r"^\[0\] san_s7: \S*train_san --preset tiny", proc.stdout, re.M)  # the runs, all the same
    lines = proc.stdout[proc.stdout.index("cannot run yet:"):].splitlines()[1:]
    assert lines == [
        f"  the trainer {tmp_path}/train_san does not exist: build it, or give --binary PATH",
        f"  no file matches {tier}/synth/synth_train_*.bin: build it with "
        f"`{os.path.relpath(PYTHON, ROOT)} dev/data/build_offline.py --out {tier} --vocab-size 2048`",
        f"  no file matches {tmp_path}/nowhere/val_*.bin: no recipe is known here (doc/data.md lists the datasets "
        "and their scripts; study.data_build can name one)"], proc.stdout
    proc = study_cmd("run", path)
    assert proc.returncode == 2 and "cannot run yet:" in proc.stderr and f"{tier}/synth/synth_train_*.bin" in proc.stderr
    assert not (tmp_path / "out").exists()
    # everything there: the dry run says so and exits 0
    if BIN:
        path = needs_study(tmp_path / "needs.toml", tmp_path / "out", f"{toy_data}/toy_train_*.bin",
                           f"{toy_data}/toy_val_*.bin", BIN)
        proc = study_cmd("run", path, "--dry-run")
        assert proc.returncode == 0 and "the trainer and every input file are there" in proc.stdout, proc.stdout


def test_a_dry_run_from_another_directory_says_where_paths_are_from(tmp_path):
    """A study file of this repository run from elsewhere: its relative paths are the working
    directory's, which one line says (naming the repository to cd to), and the command that
    builds the missing data names the build script where it is (it named it as from the root)."""
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run([PYTHON, *STUDY, "run", os.path.join(ROOT, "studies", "mini_cpu.toml"), "--dry-run"],
                          capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert (f"are taken from the working directory {tmp_path}, not from the repository {ROOT}; to use its builds "
            f"and data, run from there: cd {ROOT}") in proc.stdout, proc.stdout
    build = re.search(r"build them with `([^`]*)`", proc.stdout).group(1).split()
    assert os.path.isfile(os.path.join(tmp_path, build[1])) and build[1].endswith("dev/data/build_offline.py"), build
    assert "are taken from" not in study_cmd("run", os.path.join(ROOT, "studies", "mini_cpu.toml"), "--dry-run").stdout


def dry_run_commands(name):
    """{(run id, what): argv} of `python -m study run studies/NAME --dry-run` as it prints them
    ("[i] ID: CMD" for a run, "[i] ID then eval NAME: CMD" for an evaluation of its checkpoint)."""
    proc = study_cmd("run", os.path.join(ROOT, "studies", name), "--dry-run")
    out = {}
    for m in re.finditer(r"^\[\d+\] (\S+?)(?: then eval (\S+))?: (.*)$", proc.stdout, re.M):
        out[(m.group(1), m.group(2) or "train")] = shlex.split(m.group(3))
    assert out, proc.stdout + proc.stderr
    return out


def flag_value(argv, flag):
    values = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == flag]
    return values[-1] if values else None


TABLE1_SETS = ["arc_easy", "boolq", "copa", "piqa", "sciq", "rte", "hellaswag", "wikitext", "lambada"]


def test_deconstructing_paper_dry_run_scores_table1_at_full_context():
    """studies/deconstructing_paper.toml as a researcher runs it (--dry-run): every training
    command runs the paper's recipe (--deconstructing-setup 1), measures the indicators over the
    whole context (--indicator-context 0, not 257) and scores Table 1's eleven columns' sets
    (--eval-sets), and so does every hybrid's skip evaluation (the paper's skip rows); the
    schedule is Table 9's 120,000-step horizon over the 28,611 steps of 15B tokens."""
    cmds = dry_run_commands("deconstructing_paper.toml")
    train = {k: v for k, v in cmds.items() if k[1] == "train"}
    skips = {k: v for k, v in cmds.items() if k[1].startswith("skip-")}
    assert len(train) == 13 and len(skips) == 12
    for key, argv in list(train.items()) + list(skips.items()):
        assert flag_value(argv, "--deconstructing-setup") == "1", key
        assert flag_value(argv, "--indicator-context") == "0", key
        sets = flag_value(argv, "--eval-sets")
        assert sets and [os.path.basename(p)[:-4] for p in sets.split(",")] == TABLE1_SETS, (key, sets)
    for argv in train.values():
        assert flag_value(argv, "--steps") == "28611"
        import train_san
        a = train_san.parse_args([x for f in ("--preset", "--deconstructing-setup", "--steps") for x in (f, flag_value(argv, f))])
        assert a.schedule_steps == 120000 and a.schedule == "cosine"


def test_san_paper_dry_run_trains_the_papers_steps(tmp_path):
    """studies/san_paper.toml: "105B" is the paper code's 100,000 steps of 512 x 2048 tokens (not
    105e9 / 1,048,576 = 100,136), and every run scores Table 4's tasks; the budget ladder's rungs
    are 5,000, 30,000 and 100,000 steps, each a run of its own."""
    cmds = dry_run_commands("san_paper.toml")
    for key, argv in cmds.items():
        if key[1] == "train":
            assert flag_value(argv, "--steps") == "100000", key
            assert [os.path.basename(p)[:-4] for p in flag_value(argv, "--eval-sets").split(",")] == \
                ["lambada", "lambada_standard", "sciq", "hellaswag", "arc_easy", "piqa", "winogrande", "mmlu"]
    from study import ladder
    rungs = ladder.write_rung_files(os.path.join(ROOT, "studies", "ladders", "san_paper_budgets.toml"), out=str(tmp_path))
    assert [study.load_study(f).steps for _, f in rungs] == [5000, 30000, 100000]


def test_the_trainers_make_targets():
    """A trainer under build/ is named (and built) by its make target with its precision: the
    Makefile's build directory follows PRECISION, so the target exists only with it; `make -n`
    confirms the Makefile knows each."""
    for binary, precision in (("build/host-fp32/train_san", "FP32"), ("build/host-bf16/train_gpt2", "BF16")):
        cmd = study.make_command(os.path.join(ROOT, binary))
        assert cmd[0] == "make" and cmd[-2:] == [binary, f"PRECISION={precision}"]  # (-C ROOT from elsewhere)
        dry = subprocess.run(cmd[:1] + ["-n"] + cmd[1:], cwd=ROOT, env=default_build_env(), capture_output=True, text=True,
                             timeout=120)
        assert dry.returncode == 0 and "No rule" not in dry.stderr, dry.stderr
    assert study.make_command(os.path.join(ROOT, "train_san"))[-1] == "train_san"
    assert study.make_command("/opt/elsewhere/train_san") is None


def test_shipped_mini_studies_build_their_data_as_mini_study_sh_does():
    """The mini-studies' data_build is the build that scripts/mini_study.sh runs for them (its
    `data=` and `build_args=` per mode), so either way of running them trains on the same corpus."""
    script = open(os.path.join(ROOT, "scripts", "mini_study.sh")).read()
    for mode, name in (("cpu", "mini_cpu.toml"), ("gpu", "mini_gpu.toml")):
        case = re.search(rf"--{mode}\) (.*?);;", script, re.S).group(1)
        data = re.search(r"\bdata=(\S+)", case).group(1)
        build_args = re.search(r"build_args=\(([^)]*)\)", case).group(1).split()
        s = study.load_study(os.path.join(ROOT, "studies", name))
        assert s.data_build == ["dev/data/build_offline.py", "--out", data] + build_args, name
        assert all(p.startswith(data + "/") for a in s.arms for p in study.arm_inputs(s, a)), name


@needs_bin
def test_run_builds_the_data_the_study_file_says_how(toy_data, tmp_path):
    """study.data_build runs (announced) when an input is missing, then the runs train on what it built."""
    builder = tmp_path / "build_toy.py"
    builder.write_text(f"import shutil, sys\nshutil.copytree({str(toy_data)!r}, sys.argv[1])\n")
    built = tmp_path / "built"
    path = needs_study(tmp_path / "needs.toml", tmp_path / "out", f"{built}/toy_train_*.bin", f"{built}/toy_val_*.bin", BIN,
                       extra=f'data_build = ["{builder}", "{built}"]')
    dry = study_cmd("run", path, "--dry-run")  # the dry run names it, builds nothing
    assert dry.returncode == 1 and f"build them with `{os.path.relpath(PYTHON, ROOT)} {builder} {built}`" in dry.stdout
    assert not built.exists()
    proc = study_cmd("run", path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (f"missing; building the data as the study file says (study.data_build): {os.path.relpath(PYTHON, ROOT)} "
            f"{builder} {built}") in proc.stdout
    assert json.load(open(tmp_path / "out" / "runs" / "san_s7" / "status.json"))["state"] == "done"


def test_findings_need_the_san_behind():
    """The gap ordering and the localisation are findings about a SAN behind its partners: gaps
    in the paper's order but negative (the SAN ahead, as the tuned CPU mini-study has it), or a
    query delta that is no deficit, do not show them; three seeds a SAN behind in the paper's
    order do, two seeds give no verdict (study/findings.py; the rules on noise: test_findings.py)."""
    from study import report as study_report

    def arm(losses, regions=None):
        """A stand-in summary of seeds 1, 2, 3.. with these final losses and per-region losses per seed."""
        regions, seeds = regions or {}, dict(enumerate(losses, 1))

        def by_seed(key=None, docs=None):
            if key is None:
                return seeds
            region = key.replace("val_loss_", "")
            return {s: regions[region][s - 1] if region in regions else None for s in seeds}

        def final_mean(key, docs=None):
            values = list(by_seed(key).values())
            return None if None in values else sum(values) / len(values)
        return types.SimpleNamespace(ok=True, mean=sum(losses) / len(losses), diverged=[], runs=[], by_seed=by_seed,
                                     final_mean=final_mean)

    def seeds(v, wobble=(0.0, 0.004, -0.003)):
        return [v + w for w in wobble]
    f = {"san": "san", "iso_depth": "d", "iso_flop": "f", "iso_param": "p"}
    ahead = {"san": arm(seeds(0.70)), "d": arm(seeds(0.705)), "f": arm(seeds(0.73)), "p": arm(seeds(0.74))}
    verdict, text, _ = study_report.finding_gap_ordering(f, ahead, 0.01, {})
    assert verdict == "does not show" and "not behind its iso-depth, iso-FLOP, iso-param partners" in text \
        and "though the gaps keep the paper's order" in text
    behind = {"san": arm(seeds(0.90)), "d": arm(seeds(0.50, (0.003, 0.0, -0.002))), "f": arm(seeds(0.65, (0.0, -0.003, 0.004))),
              "p": arm(seeds(0.80, (-0.002, 0.002, 0.0)))}   # +0.40 > +0.25 > +0.10
    verdict, text, _ = study_report.finding_gap_ordering(f, behind, 0.005, {})
    assert verdict == "shows" and "iso-depth +0.4" in text and "[" in text
    two = {k: arm(list(a.by_seed().values())[:2]) for k, a in behind.items()}
    verdict, text, _ = study_report.finding_gap_ordering(f, two, 0.005, {})
    assert verdict == "too few seeds (2)" and "[+" in text
    g = {"san": "san", "ffn": "p"}
    no_deficit = {"san": arm(seeds(0.70), {"query": seeds(1.10), "trace": seeds(0.50), "answer": seeds(0.70)}),
                  "p": arm(seeds(0.74), {"query": seeds(1.11), "trace": seeds(0.57), "answer": seeds(0.76)})}  # query -0.01
    verdict, text, _ = study_report.finding_localisation(g, no_deficit, None, {})
    assert verdict == "does not show" and "no deficit on query tokens" in text
    deficit = {"san": arm(seeds(0.80), {"query": seeds(1.30), "trace": seeds(0.60), "answer": seeds(0.80)}),
               "p": arm(seeds(0.74, (0.002, -0.002, 0.0)), {"query": seeds(1.11, (0.002, -0.002, 0.0)),
                                                             "trace": seeds(0.57, (0.0, 0.003, 0.0)),
                                                             "answer": seeds(0.76, (-0.003, 0.0, 0.002))})}
    verdict, text, _ = study_report.finding_localisation(g, deficit, None, {})
    assert verdict == "shows" and "query − trace +0.1" in text


def test_spectra_finding_over_every_seed(monkeypatch):
    """The study report's spectra finding reads the milestones of every seed at the arm's rate
    (stood in for here), not the representative run's alone: three seeds whose W_o gains more
    than W_q / W_k and more than the FFN's show; every matrix losing rank does not; two seeds
    give no verdict. Relative changes are printed as percents with their intervals."""
    from study import findings
    from study import report as study_report

    def arm(name, seeds):
        runs = [types.SimpleNamespace(run=types.SimpleNamespace(seed=s, dir=f"/{name}/{s}", id=f"{name}_s{s}"))
                for s in seeds]
        return types.SimpleNamespace(ok=True, diverged=[], runs=runs)

    def growths(san_wo, routing, ffn_wo):
        g = {f"/san/{s}": {"attn.wq": routing + 0.01 * k, "attn.wk": routing, "attn.wv": 0.0, "attn.wo": san_wo + 0.02 * k}
             for k, s in enumerate((1, 2, 3))}
        g.update({f"/ffn/{s}": {"attn.wo": ffn_wo - 0.01 * k} for k, s in enumerate((1, 2, 3))})
        monkeypatch.setattr(findings, "run_stable_rank_growth", lambda run_dir: g.get(run_dir))
    f = {"san": "san", "ffn": "ffn"}
    milestones = {"san": [{}, {}, {}]}  # (the representative's series: only its length is asked)
    summaries = {"san": arm("san", (1, 2, 3)), "ffn": arm("ffn", (1, 2, 3))}
    growths(0.30, 0.0, 0.05)
    verdict, text, _ = study_report.finding_spectra(f, summaries, 0.01, {}, milestones)
    assert verdict == "shows", text
    assert "mean over 3 seeds" in text and "W_o's gain +32.0% [" in text and "SAN W_o − ffn W_o +" in text
    growths(-0.10, -0.40, -0.30)  # W_o loses less than routing and than the FFN's, but loses
    assert study_report.finding_spectra(f, summaries, 0.01, {}, milestones)[0] == "does not show"
    two = {"san": arm("san", (1, 2)), "ffn": arm("ffn", (1, 2))}
    growths(0.30, 0.0, 0.05)
    assert study_report.finding_spectra(f, two, 0.01, {}, milestones)[0] == "too few seeds (2)"
    # the FFN partner is optional: skipped, or without finished runs, the SAN's spectra are judged alone
    verdict, text, _ = study_report.finding_spectra(f, summaries, 0.01, {"ffn": "not in --only"}, milestones)
    assert verdict == "shows" and "SAN W_o −" not in text, text
    assert " [95% t-intervals]. Without the FFN partner: arm ffn (ffn) was not run: not in --only. W_o keeps" in text, text
    failed = {**summaries, "ffn": types.SimpleNamespace(ok=False, diverged=[], runs=[])}
    verdict, text, _ = study_report.finding_spectra(f, failed, 0.01, {}, milestones)
    assert verdict == "shows" and "arm ffn (ffn) has no finished runs" in text, text


def test_an_unknown_command_names_the_nearest():
    """`python -m study compair` says which command was meant, and lists them all."""
    proc = study_cmd("compair")
    assert proc.returncode == 2
    assert proc.stderr.startswith("python -m study: unknown command 'compair' (did you mean compare?); commands: run,")
    assert "did you mean" not in study_cmd("zzz").stderr
