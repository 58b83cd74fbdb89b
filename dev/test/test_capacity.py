"""study/capacity.py: bits stored from a model's attribute losses, checked against exact
arithmetic on predictors whose predictions are known (perfect, uniform, partly right, any
distribution), and the report over a study's runs (paired by seed) from run logs written here."""
import json
import math
import os

import numpy as np
import pytest

from study import capacity, findings
from study.spec import load_study


def test_perfect_and_uniform_predictors():
    assert capacity.attribute_bits(0.0, 64, 1000) == pytest.approx(1000 * 6)
    assert capacity.attribute_bits(math.log(28), 28, 500) == pytest.approx(0, abs=1e-9)
    # worse than uniform stores negative bits (nothing is clipped away)
    assert capacity.attribute_bits(math.log(28) + 0.5, 28, 10) < 0


def test_known_predictions():
    """A predictor with a known distribution per person: the bits equal sum_i log2(D p_i(true))."""
    rng = np.random.default_rng(0)
    N, D = 300, 16
    truth = rng.integers(0, D, N)
    probs = rng.dirichlet(np.full(D, 0.3), N)
    p_true = probs[np.arange(N), truth]
    exact = float(np.sum(np.log2(D * p_true)))
    mean_loss = float(-np.mean(np.log(p_true)))
    assert capacity.attribute_bits(mean_loss, D, N) == pytest.approx(exact, rel=1e-12)
    # right with certainty on a fraction f of the people, uniform on the others: f N log2 D
    f = 0.3
    loss = (1 - f) * math.log(D)
    assert capacity.attribute_bits(loss, D, N) == pytest.approx(f * N * math.log2(D))


def write_run(run, params, non_embedding, losses, done=True, step=10):
    os.makedirs(run.dir, exist_ok=True)
    with open(os.path.join(run.dir, "log.jsonl"), "w") as f:
        f.write(json.dumps({"run": {"parameters": params, "non_embedding": non_embedding}}) + "\n")
        f.write(json.dumps({"step": step, "loss": 1.0, "lr": 0.01, "grad_norm": 1.0, "ms": 1.0}) + "\n")
        f.write(json.dumps({"step": step, "val_loss": 1.0,
                            "val_exercise": {a: {"all": 1.0, "answer": v} for a, v in losses.items()}}) + "\n")
    with open(os.path.join(run.dir, "status.json"), "w") as f:
        json.dump({"state": "done" if done else "running"}, f)


@pytest.fixture
def study_with_runs(tmp_path):
    world = tmp_path / "world"
    world.mkdir()
    manifest = {"people": 100, "exposures": 100, "values": {"a": 16, "b": 4}, "bits": 100 * (4 + 2)}
    (world / "manifest.json").write_text(json.dumps(manifest))
    path = tmp_path / "s.toml"
    path.write_text(f"""[study]
name = "cap"
out = "{tmp_path / 'logs'}"
binary = "/bin/true"
seeds = [1, 2, 3]
batch_size = 2
seq_len = 8
steps = 10
flags = ["--val-data", "{world}/capacity_val_*.bin"]
baseline = "san"

[[arm]]
name = "san"
preset = "demo"
flags = ["--n-layer", "15"]

[[arm]]
name = "ffn"
preset = "demo"
flags = ["--ffn", "swiglu", "--n-layer", "3"]
""")
    return load_study(str(path)), manifest


def test_report_pairs_by_seed(study_with_runs):
    study, manifest = study_with_runs
    ln2 = math.log(2)
    # loss in bits per attribute, chosen per arm and seed; nats in the log
    bits_loss = {("san", 1): (1.0, 0.5), ("san", 2): (1.5, 0.5), ("san", 3): (2.0, 1.0),
                 ("ffn", 1): (0.5, 0.5), ("ffn", 2): (1.0, 0.0), ("ffn", 3): (1.0, 0.5)}
    for run in study.runs:
        la, lb = bits_loss[run.arm.name, run.seed]
        write_run(run, 2000, 1000 if run.arm.name == "san" else 990, {"a": la * ln2, "b": lb * ln2})
    table = capacity.arm_table(study, capacity.world_of(study))
    want = {k: 100 * (4 - la) + 100 * (2 - lb) for k, (la, lb) in bits_loss.items()}
    for (arm, seed), bits in want.items():
        assert table[arm][seed]["bits"] == pytest.approx(bits)
        assert table[arm][seed]["per_param_all"] == pytest.approx(bits / 2000)
    text = capacity.report(study, manifest)
    diff = findings.paired({s: want["san", s] / 1000 for s in (1, 2, 3)}, {s: want["ffn", s] / 990 for s in (1, 2, 3)})
    assert findings.with_interval(diff, 3) in text
    assert "| san | 3 | 1,000 |" in text


def test_unfinished_runs_left_out(study_with_runs):
    study, manifest = study_with_runs
    for run in study.runs:
        write_run(run, 2000, 1000, {"a": 1.0, "b": 1.0}, done=run.seed != 3)
    table = capacity.arm_table(study, manifest)
    assert sorted(table["san"]) == [1, 2]
    assert "too few seeds (2)" in capacity.report(study, manifest)


def test_missing_world(tmp_path, study_with_runs, capsys):
    study, _ = study_with_runs
    assert capacity.main([study.path, "--world", str(tmp_path / "nowhere")]) == 2
    err = capsys.readouterr().err
    assert "nowhere/manifest.json" in err and "bios.py" in err


def test_curve_every_validation(study_with_runs):
    """--curve: the bits of every validation record of a finished run, at exposures
    step x tokens per step / (N x tokens a biography), and san − ffn per non-embedding parameter
    paired by seed, exactly."""
    study, manifest = study_with_runs
    manifest = dict(manifest, bio_tokens=8)
    ln2 = math.log(2)
    # per (arm, seed): the losses in bits of a and b at step 5, then at step 10 (the final one);
    # bits = 100 (4 - la) + 100 (2 - lb)
    losses = {("san", 1): ((3.0, 1.5), (1.0, 0.5)), ("san", 2): ((2.5, 1.0), (1.0, 0.0)),
              ("san", 3): ((3.5, 2.0), (2.0, 1.0)), ("ffn", 1): ((4.0, 2.0), (3.0, 1.0)),
              ("ffn", 2): ((3.0, 2.0), (2.5, 1.5)), ("ffn", 3): ((3.5, 2.0), (3.0, 2.0))}
    non_emb = {"san": 1000, "ffn": 500}
    for run in study.runs:
        (la5, lb5), (la, lb) = losses[run.arm.name, run.seed]
        write_run(run, 2000, non_emb[run.arm.name], {"a": la * ln2, "b": lb * ln2}, done=True)
        log = os.path.join(run.dir, "log.jsonl")
        with open(log) as f:
            header, *rest = f.readlines()
        early = json.dumps({"step": 5, "val_loss": 1.0, "val_exercise": {
            "a": {"answer": la5 * ln2}, "b": {"answer": lb5 * ln2}}}) + "\n"
        with open(log, "w") as f:  # the step-5 validation before the final one, as the trainer logs them
            f.writelines([header, early] + rest)
    got = capacity.curve(study, manifest)
    want = {(arm, seed): {step: 100 * (4 - la) + 100 * (2 - lb) for step, (la, lb) in zip((5, 10), pair)}
            for (arm, seed), pair in losses.items()}
    for (arm, seed), points in want.items():
        assert got[arm][seed] == pytest.approx(points)
    # batch 2 x seq 8 = 16 tokens a step; 100 people x 8 tokens: step 5 is 0.1 exposures, step 10 is 0.2
    assert capacity.exposures_at(5, study, manifest) == pytest.approx(0.1)
    assert capacity.exposures_at(10, study, manifest) == pytest.approx(0.2)
    text = capacity.curve_report(study, manifest)
    # step 5: san 150, 250, 50 bits (mean 150, sd 100); ffn 0, 100, 50 (mean 50, sd 50)
    diff = findings.paired({s: want["san", s][5] / 1000 for s in (1, 2, 3)}, {s: want["ffn", s][5] / 500 for s in (1, 2, 3)})
    assert f"| 5 | 0.1 | 150 ± 100 [0.150] | 50 ± 50 [0.100] | {findings.with_interval(diff, 3)} |" in text
    assert "| 10 | 0.2 |" in text
    # a seed that has not finished is left out of the curve, and the pairing says so
    write_run(study.runs[-1], 2000, 500, {"a": 1.0, "b": 1.0}, done=False)
    assert sorted(capacity.curve(study, manifest)["ffn"]) == [1, 2]
    assert findings.too_few(2) in capacity.curve_report(study, manifest)
