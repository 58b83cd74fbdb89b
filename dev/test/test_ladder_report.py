"""Checks of study/ladder.py and study/ladder_report.py on synthetic run directories (no
trainer): the rung study files, the paired gaps and noise floor against numbers computed here,
and the verdict rules (shows / trend / does not show) on losses built to meet or miss them.
Under a second of CPU."""
import json
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from study import ladder  # noqa: E402
from study import ladder_report  # noqa: E402
from study import runner as study  # noqa: E402

LADDER = """
[study]
name = "toy-ladder"
out = "{out}"
seeds = [42, 43]
batch_size = 2
seq_len = 8
flags = ["--vocab-size", "256"]

[ladder]
tokens = [64, 256]
evaluations = 2
arm_rungs = {{ san-rms = [256] }}
norm_control = {{ zcn = "san", rms = "san-rms" }}

[[arm]]
name = "san"
preset = "tiny"
lr = 0.04

[[arm]]
name = "ffn-iso-depth"
preset = "tiny"
flags = ["--ffn", "swiglu"]

[[arm]]
name = "ffn-iso-flop"
preset = "tiny"
flags = ["--ffn", "swiglu", "--n-layer", "1"]

[[arm]]
name = "ffn-iso-param"
preset = "tiny"
flags = ["--ffn", "swiglu", "--n-layer", "1", "--n-embd", "32"]

[[arm]]
name = "san-rms"
preset = "tiny"
lr = 0.04
flags = ["--norm", "rms"]

[[finding]]
kind = "gap_ordering"
san = "san"
iso_depth = "ffn-iso-depth"
iso_flop = "ffn-iso-flop"
iso_param = "ffn-iso-param"

[[finding]]
kind = "localisation"
san = "san"
ffn = "ffn-iso-param"
"""


def fake_run(run, steps, loss, regions=None):
    """A finished run whose last validation (at `steps`) has `loss`, and per-region losses."""
    os.makedirs(run.dir, exist_ok=True)
    regions = regions or {"query": loss, "trace": loss, "answer": loss}
    rec = {"step": steps, "val_loss": loss, "gate_attn_mean": 0.5, "erank_mean": 10.0,
           **{f"val_loss_{r}": v for r, v in regions.items()},
           "train_docs": {"val_loss": loss, **{f"val_loss_{r}": v for r, v in regions.items()}}}
    with open(os.path.join(run.dir, "log.jsonl"), "w") as f:
        f.write(json.dumps({"run": {"executor": "test"}}) + "\n")
        for s in range(1, steps + 1):
            f.write(json.dumps({"step": s, "loss": 5.0, "ms": 10.0}) + "\n")
        f.write(json.dumps({"step": steps // 2, "val_loss": loss + 1}) + "\n")
        f.write(json.dumps(rec) + "\n")
    with open(os.path.join(run.dir, "status.json"), "w") as f:
        json.dump({"state": "done", "steps": steps}, f)


def make_ladder(tmp_path, losses):
    """losses: {tokens: {arm: [seed 42, seed 43] or ([...], regions per seed)}}."""
    path = tmp_path / "ladder.toml"
    path.write_text(LADDER.format(out=str(tmp_path / "out")))
    for tokens, f in ladder.write_rung_files(str(path)):
        s = study.load_study(f)
        for run in s.runs:
            spec = losses[tokens].get(run.arm.name)
            if spec is None:
                continue
            values, regions = spec if isinstance(spec, tuple) else (spec, None)
            k = s.seeds.index(run.seed)
            fake_run(run, s.steps, values[k], regions[k] if regions else None)
    return str(path)


def test_rung_files(tmp_path):
    path = make_ladder(tmp_path, {64: {}, 256: {}})
    files = dict(ladder.write_rung_files(path))
    small, large = study.load_study(files[64]), study.load_study(files[256])
    assert (small.steps, small.val_every, small.save_every) == (4, 2, 2)
    assert (large.steps, large.val_every) == (16, 8)
    assert [a.name for a in small.arms] == ["san", "ffn-iso-depth", "ffn-iso-flop", "ffn-iso-param"]
    assert large.arm("san-rms") is not None and large.out.endswith("rung-256")
    assert [r.id for r in small.runs][:2] == ["san_lr0.04_s42", "san_lr0.04_s43"]


def test_bad_ladder_files(tmp_path):
    path = tmp_path / "l.toml"
    path.write_text(LADDER.format(out=str(tmp_path)).replace("tokens = [64, 256]", "tokens = [72, 256]"))
    with pytest.raises(ladder.LadderError, match="whole number"):
        ladder.load_ladder(str(path))
    path.write_text(LADDER.format(out=str(tmp_path)).replace("san-rms = [256]", "nope = [256]"))
    with pytest.raises(ladder.LadderError, match="not an arm"):
        ladder.load_ladder(str(path))


def quartet(san, depth, flop, param):
    return {"san": san, "ffn-iso-depth": depth, "ffn-iso-flop": flop, "ffn-iso-param": param}


def test_gaps_floor_and_shows(tmp_path):
    # SAN 4.0 / 4.02; gaps ~0.5 > 0.3 > 0.1, seed sd 0.01 or 0.02; control off by 0.003
    small = quartet([4.2, 4.22], [3.9, 3.92], [3.95, 3.97], [4.0, 4.02])
    large = quartet([4.0, 4.02], [3.5, 3.52], [3.7, 3.72], [3.9, 3.92])
    large["san-rms"] = [4.003, 4.023]
    path = make_ladder(tmp_path, {64: small, 256: large})
    report, verdicts = ladder_report.write_report(path)
    raw, rungs = ladder_report.load_rungs(path)
    r = rungs[1]
    m, sd, n = r.paired("san", "ffn-iso-depth")
    assert n == 2 and m == pytest.approx(0.5) and sd == pytest.approx(0.0, abs=1e-12)
    floor, pooled, ctl = ladder_report.noise_floor(r, list(large)[:4], ("san", "san-rms"))
    assert pooled == pytest.approx(0.0141421, rel=1e-4) and ctl == pytest.approx(0.003)
    assert floor == pytest.approx(pooled)
    v = dict(verdicts)
    assert v["Gap ordering iso-depth > iso-FLOP > iso-param"] == "shows"
    assert v["iso-param gap shrinks with tokens"] == "shows"  # 0.2 -> 0.1
    text = open(report).read()
    assert "gaps_vs_tokens.png" in text and os.path.exists(os.path.join(os.path.dirname(report), "gaps_vs_tokens.png"))


def test_trend_and_does_not_show(tmp_path):
    # the ordering fails at both rungs, but its smallest margin grows: trend
    small = quartet([4.2, 4.2], [4.0, 4.0], [3.9, 3.9], [3.95, 3.95])     # depth 0.2 < flop 0.3
    large = quartet([4.0, 4.0], [3.75, 3.75], [3.74, 3.74], [3.8, 3.8])  # margins 0.01, 0.06
    path = make_ladder(tmp_path, {64: small, 256: large})
    v = dict(ladder_report.write_report(path)[1])
    assert v["Gap ordering iso-depth > iso-FLOP > iso-param"] == "trend"
    assert v["iso-param gap shrinks with tokens"] == "shows"  # 0.25 -> 0.2, seeds equal: no floor
    # the ordering moves away, the iso-param gap grows (0.25 -> 0.3) by less than the floor (0.07)
    large = quartet([4.0, 4.1], [3.9, 4.0], [3.6, 3.7], [3.7, 3.8])
    os.makedirs(tmp_path / "b")
    v = dict(ladder_report.write_report(make_ladder(tmp_path / "b", {64: small, 256: large}))[1])
    assert v["Gap ordering iso-depth > iso-FLOP > iso-param"] == "does not show"
    assert v["iso-param gap shrinks with tokens"] == "does not show"


def test_localisation(tmp_path):
    def reg(q, t, a):
        return {"query": q, "trace": t, "answer": a}
    base = quartet([4.0, 4.0], [3.5, 3.5], [3.7, 3.7], [3.9, 3.9])
    small = dict(base, san=([4.0, 4.0], [reg(4.1, 4.0, 4.0)] * 2), **{"ffn-iso-param": ([3.9, 3.9], [reg(4.0, 3.9, 3.9)] * 2)})
    large = dict(base, san=([4.0, 4.01], [reg(4.3, 3.9, 3.95), reg(4.31, 3.91, 3.96)]),
                 **{"ffn-iso-param": ([3.9, 3.91], [reg(4.0, 3.9, 3.9), reg(4.01, 3.91, 3.91)])})
    path = make_ladder(tmp_path, {64: small, 256: large})
    report, verdicts = ladder_report.write_report(path)
    v = dict(verdicts)
    # query delta 0.3 against trace 0.0 and answer 0.05 at the large rung; 0.0 margins at the small one
    assert v["Localisation on query tokens (held-out documents)"] == "shows"
    assert v["Localisation on query tokens (training documents)"] == "shows"
    _, rungs = ladder_report.load_rungs(path)
    r = ladder_report.localisation(rungs[1], "san", "ffn-iso-param", "held_out", 0.01)
    assert r["margins"]["answer"][0] == pytest.approx(0.25)
    # the SAN ahead on every region, least on query tokens: resolved margins, but no deficit on
    # query tokens to place, so it does not show (the study report's sign rule, study/findings.py)
    ahead = dict(base, san=([3.6, 3.61], [reg(3.99, 3.6, 3.6), reg(4.0, 3.61, 3.61)]),
                 **{"ffn-iso-param": ([3.9, 3.91], [reg(4.0, 3.9, 3.9), reg(4.01, 3.91, 3.91)])})
    os.makedirs(tmp_path / "ahead")
    path = make_ladder(tmp_path / "ahead", {64: small, 256: ahead})
    _, rungs = ladder_report.load_rungs(path)
    r = ladder_report.localisation(rungs[1], "san", "ffn-iso-param", "held_out", 0.01)
    assert r["deltas"]["query"][0] == pytest.approx(-0.01) and r["margins"]["trace"][0] == pytest.approx(0.29)
    assert r["shows"] is False


@pytest.mark.parametrize("name", sorted(f for f in os.listdir(os.path.join(ROOT, "studies", "ladders")) if f.endswith(".toml")))
def test_shipped_ladder_files_load(name, tmp_path):
    """Every rung of every shipped ladder is a study file study.py loads."""
    files = ladder.write_rung_files(os.path.join(ROOT, "studies", "ladders", name), out=str(tmp_path))
    assert len(files) >= 3
    for tokens, f in files:
        s = study.load_study(f)
        assert s.runs and s.steps * s.tokens_per_step == tokens


DECON = """
[study]
name = "toy-decon"
out = "{out}"
seeds = [42]
batch_size = 2
seq_len = 8

[ladder]
tokens = [64, 256]
evaluations = 2
deconstructing = {{ standard = "standard", kinds = ["mlp", "approximate"], floor = 0.02 }}

[[arm]]
name = "standard"
preset = "tiny"
""" + "".join(f"""
[[arm]]
name = "{k}-{l}"
preset = "tiny"
flags = ["--attention", "{k}", "--layout", "{l}"]
""" for k in ("mlp", "approximate") for l in ("uniform", "hybrid"))


def test_deconstructing_verdict(tmp_path):
    """Uniform arms behind standard by more than the stated floor, mlp most, hybrids recovering
    half: shows at the large rung; at the small one approximate-uniform is within the floor."""
    path = tmp_path / "d.toml"
    path.write_text(DECON.format(out=str(tmp_path / "out")))
    losses = {64: {"standard": 3.0, "mlp-uniform": 3.5, "mlp-hybrid": 3.05, "approximate-uniform": 3.01,
                   "approximate-hybrid": 3.0},
              256: {"standard": 2.0, "mlp-uniform": 2.8, "mlp-hybrid": 2.1, "approximate-uniform": 2.1,
                    "approximate-hybrid": 2.04}}
    for tokens, f in ladder.write_rung_files(str(path)):
        s = study.load_study(f)
        for run in s.runs:
            fake_run(run, s.steps, losses[tokens][run.arm.name])
    report, verdicts = ladder_report.write_report(str(path))
    assert dict(verdicts)["Uniform variants behind standard (mlp most), hybrids recover"] == "shows"
    _, rungs = ladder_report.load_rungs(str(path))
    r = ladder_report.deconstructing(rungs[0], "standard", ["mlp", "approximate"], 0.02)
    assert r["shows"] is False and r["deltas"]["mlp"] == (pytest.approx(0.5), pytest.approx(0.05))


SWEEP = """
[study]
name = "toy-sweep"
out = "{out}"
seeds = [42]
batch_size = 2
seq_len = 8
tokens = 64
flags = ["--vocab-size", "256"]

[[arm]]
name = "san"
preset = "tiny"
lr = 0.02
lr_other = [1e-3, 2e-3, 4e-3]

[[arm]]
name = "ffn"
preset = "tiny"
flags = ["--ffn", "swiglu"]
lr = [0.01, 0.02, 0.04]
lr_other = 2e-3
"""


def test_sweep_of_the_other_rate(tmp_path):
    """An arm may sweep Muon's AdamW side (lr_other) as it sweeps lr: the runs cross the grids,
    their ids and commands carry both rates, and the sweep report finds each arm's best point
    and whether it is at the edge of the rate the arm sweeps."""
    path = tmp_path / "sweep.toml"
    path.write_text(SWEEP.format(out=str(tmp_path / "out")))
    s = study.load_study(str(path))
    assert [r.id for r in s.runs] == ["san_lr0.02_lo0.001_s42", "san_lr0.02_lo0.002_s42", "san_lr0.02_lo0.004_s42",
                                      "ffn_lr0.01_lo0.002_s42", "ffn_lr0.02_lo0.002_s42", "ffn_lr0.04_lo0.002_s42"]
    cmd = study.run_command(s, s.runs[1])
    assert cmd[cmd.index("--lr") + 1] == "0.02" and cmd[cmd.index("--lr-other") + 1] == "0.002"
    # san's loss falls with lr_other (edge best at 4e-3); ffn's has an interior best at lr 0.02
    losses = {"san_lr0.02_lo0.001_s42": 3.0, "san_lr0.02_lo0.002_s42": 2.5, "san_lr0.02_lo0.004_s42": 2.0,
              "ffn_lr0.01_lo0.002_s42": 2.4, "ffn_lr0.02_lo0.002_s42": 2.2, "ffn_lr0.04_lo0.002_s42": 2.6}
    for run in s.runs:
        fake_run(run, s.steps, losses[run.id])
    report, best = ladder_report.write_sweep(str(path))
    assert best == {"san": ((0.02, 4e-3), 2.0, True), "ffn": ((0.02, 2e-3), 2.2, False)}
    text = open(report).read()
    assert ("| arm | 0.01, other 0.002 | 0.02, other 0.001 | 0.02, other 0.002 | 0.02, other 0.004 | "
            "0.04, other 0.002 |") in text
    assert "| san | — | 3.0000 | 2.5000 | 2.0000* | — |" in text
    assert "- san: best 0.02, other 0.004 (2.0000) — at the grid's edge" in text
    assert "- ffn: best 0.02, other 0.002 (2.2000)\n" in text
    # a sweep whose arms each vary the other rate alone: a column per value, the arm's lr beside it
    path.write_text(SWEEP.format(out=str(tmp_path / "out")).replace("lr = [0.01, 0.02, 0.04]\nlr_other = 2e-3",
                                                                     "lr = 0.04\nlr_other = [1e-3, 2e-3]"))
    s = study.load_study(str(path))
    for run in s.runs:
        if run.arm.name == "ffn":
            fake_run(run, s.steps, {1e-3: 2.3, 2e-3: 2.1}[run.lr_other])
    text = open(ladder_report.write_sweep(str(path))[0]).read()
    assert "| arm | --lr | 0.001 | 0.002 | 0.004 |" in text
    assert "| san | 0.02 | 3.0000 | 2.5000 | 2.0000* |" in text and "| ffn | 0.04 | 2.3000 | 2.1000* | — |" in text
    assert "- ffn: best 0.04, other 0.002 (2.1000) — at the grid's edge" in text


def test_bad_other_rate_grids(tmp_path):
    for bad, message in (("lr_other = [1e-3, 2e-3, 4e-3]", None), ("lr_other = []", "empty grid"),
                         ("lr_other = [1e-3, 1e-3]", "repeats a rate"), ("lr_other = -1e-3", "positive"),
                         ('lr_other = "fast"', "a number")):
        path = tmp_path / "sweep.toml"
        path.write_text(SWEEP.format(out=str(tmp_path / "out")).replace("lr_other = [1e-3, 2e-3, 4e-3]", bad))
        if message is None:
            study.load_study(str(path))
            continue
        with pytest.raises(study.StudyError, match=message):
            study.load_study(str(path))
    path.write_text(SWEEP.format(out=str(tmp_path / "out")).replace(
        'flags = ["--ffn", "swiglu"]', 'flags = ["--ffn", "swiglu", "--lr-other", "1e-3"]'))
    with pytest.raises(study.StudyError, match="arm.lr_other"):
        study.load_study(str(path))


def test_negative_gaps_are_not_the_papers_way(tmp_path):
    """The SAN ahead of every partner (negative gaps), in the paper's order and with its ordering
    margins growing: not a trend, since the gaps move away from the paper's sign; an iso-param gap
    that falls from -0.04 to -0.05 grows in size: not the paper's shrinking."""
    small = quartet([4.00, 4.00], [4.005, 4.005], [4.03, 4.03], [4.04, 4.04])  # gaps -0.005 / -0.03 / -0.04
    large = quartet([3.00, 3.00], [3.008, 3.008], [3.03, 3.03], [3.05, 3.05])  # gaps -0.008 / -0.03 / -0.05
    path = make_ladder(tmp_path, {64: small, 256: large})
    v = dict(ladder_report.write_report(path)[1])
    assert v["Gap ordering iso-depth > iso-FLOP > iso-param"] == "does not show"
    assert v["iso-param gap shrinks with tokens"] == "does not show"
    # the same gaps moving toward zero from below: the smallest quantity grows, |iso-param| falls
    large = quartet([3.00, 3.00], [3.002, 3.002], [3.01, 3.01], [3.02, 3.02])
    os.makedirs(tmp_path / "b")
    v = dict(ladder_report.write_report(make_ladder(tmp_path / "b", {64: small, 256: large}))[1])
    assert v["Gap ordering iso-depth > iso-FLOP > iso-param"] == "trend"
    assert v["iso-param gap shrinks with tokens"] == "trend"  # falls in size, never above zero: not "shows"
