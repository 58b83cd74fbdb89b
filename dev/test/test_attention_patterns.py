"""The radar plots and logit-distribution plots of study/attention_patterns.py (the study
report's "Attention patterns" section and scripts/deconstructing_demo.sh's table) over toy
validation records written here: the radar's values are the logged numbers as the paper scales
them (head means; Entropy, Conc, HeadDiv min-max normalised across the plotted runs, per layer;
Sink absolute; LocFoc x 2), layers without a matrix are left out, a study's arms are grouped by
kind with the standard arm, and the plots and the table come out of the command line."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from study import attention_patterns as ap

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

EDGES = [10.0 ** (i / 4) for i in range(-12, 17)]


def record(entropy, conc, headdiv, sink, locfoc, hist):
    """A validation record of two layers and two heads: per-layer values given as per-head lists
    (None: the layer has no attention matrix)."""
    return {"step": 10, "val_loss": 5.0, "attn_entropy": entropy, "attn_conc": conc, "attn_headdiv": headdiv,
            "attn_sink": sink, "attn_locfoc": locfoc, "logit_abs_levels": [0.5, 0.9, 0.99, 0.999, 1.0],
            "logit_abs_edges": EDGES, "logit_abs_hist": hist,
            "logit_abs_quantiles": [None if h is None else [0.5, 1.0, 2.0, 3.0, 4.0] for h in hist]}


def loc(a, b):
    return [[a, b], [a / 2, b / 2], [0.1, 0.1], [0.0, 0.2]]


HIST = [3] * 10 + [0] * 18
RUNS = {
    "standard": record([[1.0, 3.0], [4.0, 4.0]], [[1.0, 1.0], [2.0, 2.0]], [0.1, 0.3], [[0.2, 0.4], [0.5, 0.5]],
                       [loc(0.2, 0.4), loc(0.1, 0.1)], [HIST, HIST]),
    "mlp-hybrid": record([None, [6.0, 6.0]], [None, [4.0, 4.0]], [None, 0.5], [None, [0.1, 0.3]],
                         [None, loc(0.3, 0.3)], [None, HIST]),
    "approximate-uniform": record([[5.0, 7.0], [5.0, 5.0]], [[3.0, 5.0], [3.0, 3.0]], [0.2, 0.3],
                                  [[0.0, 0.1], [0.05, 0.05]], [loc(0.4, 0.4), loc(0.2, 0.2)], [HIST, HIST]),
}


def test_radar_values_are_the_logged_numbers_scaled_as_the_paper():
    # layer 1: only standard and approximate have a matrix; head means Entropy 2 vs 6, Conc 1 vs 4
    # HeadDiv 0.1 vs 0.2, Sink 0.3 vs 0.05, LocFoc 0 0.3 vs 0.4
    v = ap.radar_values(RUNS, 0)
    assert set(v) == {"standard", "approximate-uniform"}
    np.testing.assert_allclose(v["standard"], [0, 0, 0, 0.3, 0.6, 0.3, 0.2, 0.2])
    np.testing.assert_allclose(v["approximate-uniform"], [1, 1, 1, 0.05, 0.8, 0.4, 0.2, 0.2])
    # layer 2: three runs; Entropy 4, 6, 5 -> 0, 1, 0.5; Conc 2, 4, 3; HeadDiv 0.3, 0.5, 0.3
    v = ap.radar_values(RUNS, 1)
    np.testing.assert_allclose([v[k][:3] for k in ("standard", "mlp-hybrid", "approximate-uniform")],
                               [[0, 0, 0], [1, 1, 1], [0.5, 0.5, 0]])
    np.testing.assert_allclose(v["mlp-hybrid"][3:], [0.2, 0.6, 0.3, 0.2, 0.2])
    # a single run, or runs that agree: the normalised axes at 0.5
    assert ap.radar_values({"standard": RUNS["standard"]}, 0)["standard"][:3] == [0.5, 0.5, 0.5]


def test_runs_group_by_kind_with_the_standard_arm():
    arms = [("standard", ["--lr", "1e-3"], RUNS["standard"]),
            ("mlp-hybrid", ["--attention", "mlp", "--layout", "hybrid"], RUNS["mlp-hybrid"]),
            ("approximate-uniform", ["--attention", "approximate"], RUNS["approximate-uniform"])]
    groups = ap.groups_of_arms(arms)
    assert {k: list(v) for k, v in groups.items()} == {"mlp": ["standard", "mlp-hybrid"],
                                                       "approximate": ["standard", "approximate-uniform"]}


def test_report_section_and_command_line(tmp_path):
    md = ap.report_section({"mlp": {"standard": RUNS["standard"], "mlp-hybrid": RUNS["mlp-hybrid"]}}, str(tmp_path))
    assert "### mlp" in md and "![attention_radar_mlp.png](attention_radar_mlp.png)" in md
    for name in ("attention_radar_mlp.png", "logit_distribution_mlp.png"):
        assert (tmp_path / name).stat().st_size > 1000
    assert ap.report_section({}, str(tmp_path)) == []
    # no indicators logged (a run from before them): no section
    assert ap.report_section({"x": {"a": {"val_loss": 1.0}}}, str(tmp_path)) == []
    logs = []
    for label, r in RUNS.items():
        path = tmp_path / f"{label}.jsonl"
        path.write_text(json.dumps({"step": 1, "loss": 6.0}) + "\n" + json.dumps(r) + "\n")
        logs.append(f"{label}={path}")
    out = subprocess.run([sys.executable, "-m", "study", "patterns", "--out",
                          str(tmp_path / "plots")] + logs, capture_output=True, text=True, check=True).stdout
    rows = [line.split() for line in out.splitlines() if line.split()[:1] in (["1"], ["2"])]
    by = {(r[0], r[1]): r[2:] for r in rows}
    assert by[("1", "mlp-hybrid")][:8] == ["—"] * 8  # no matrix in layer 1
    assert by[("2", "approximate-uniform")][:4] == ["5", "3", "0.3", "0.05"]  # raw head means
    # a legend under the table says what each column holds
    legend = out[out.index("Entropy:"):]
    for column in ("Conc:", "HeadDiv:", "Sink:", "LocFoc N:", "|logit| p99, max:", "'—':"):
        assert column in legend, out
    assert (tmp_path / "plots" / "attention_radar.png").exists()
    assert (tmp_path / "plots" / "logit_distribution.png").exists()
    bad = subprocess.run([sys.executable, "-m", "study", "patterns", "--out",
                          str(tmp_path), "no-equals-sign"], capture_output=True, text=True)
    assert bad.returncode != 0 and "is not LABEL=LOG" in bad.stderr


@pytest.mark.parametrize("layer", [0, 1])
def test_raw_values_are_head_means(layer):
    raw = ap.layer_raw(RUNS["standard"], layer)
    r = RUNS["standard"]
    assert raw["Entropy"] == np.mean(r["attn_entropy"][layer]) and raw["HeadDiv"] == r["attn_headdiv"][layer]
    assert raw["LocFoc 3"] == np.mean(r["attn_locfoc"][layer][3])


def test_a_kind_is_compared_with_standard_arms_of_its_depth(tmp_path):
    """A study with other models beside its Deconstructing arms (the mini-study's 12- and
    24-layer SANs): only the standard arm of the variant's depth joins its group, and a layer
    that a shallower run does not have is no layer of it."""
    deeper = dict(RUNS["standard"])
    for key in ("attn_entropy", "attn_conc", "attn_headdiv", "attn_sink", "attn_locfoc"):
        deeper[key] = RUNS["standard"][key] * 3
    arms = [("san", ["--n-layer", "12"], deeper), ("standard", [], RUNS["standard"]),
            ("mlp-hybrid", ["--attention", "mlp", "--layout", "hybrid"], RUNS["mlp-hybrid"])]
    assert {k: list(v) for k, v in ap.groups_of_arms(arms).items()} == {"mlp": ["standard", "mlp-hybrid"]}
    n = len(RUNS["standard"]["attn_entropy"])
    assert ap.layer_raw(RUNS["standard"], n) is None and ap.layer_raw(deeper, n) is not None
    # runs of different depths in one figure (the 2026-12-04 mini-study's report stopped here): a
    # radar per layer of the deepest, the shallower run on its own layers only
    assert ap.plot_radars({"san": deeper, "standard": RUNS["standard"]}, str(tmp_path), "r.png") == "r.png"
    assert list(ap.radar_values({"san": deeper, "standard": RUNS["standard"]}, n)) == ["san"]


def test_radar_normalisation_over_a_study_or_a_reference_set(tmp_path, monkeypatch):
    """The min-max set (the paper does not name one): by default the runs drawn, so two runs sit
    at exactly 0 and 1; with a reference (a study's other runs, a fixed set) over the drawn runs
    and the reference together, so the two keep the larger set's scale; the figure's title and
    the report say which."""
    pair = {k: RUNS[k] for k in ("standard", "approximate-uniform")}
    alone = ap.radar_values(pair, 1)
    assert [alone[k][:3] for k in pair] == [[0, 0, 0.5], [1, 1, 0.5]]  # HeadDiv 0.3 = 0.3: 0.5
    # over all three runs (layer 2: Entropy 4, 6, 5; Conc 2, 4, 3; HeadDiv 0.3, 0.5, 0.3)
    wide = ap.radar_values(pair, 1, reference=RUNS)
    assert set(wide) == set(pair)  # the reference's own run is not drawn
    np.testing.assert_allclose([wide[k][:3] for k in pair], [[0, 0, 0], [0.5, 0.5, 0]])
    assert [wide[k][3:] for k in pair] == [alone[k][3:] for k in pair]  # Sink, LocFoc absolute
    assert "over the 2 runs drawn (so each is 0 or 1, 0.5 where they agree)" in ap.scale_text(pair)
    assert "over the 2 runs drawn and 1 more" in ap.scale_text(pair, RUNS)
    # the report: over="study" draws each group on the scale of every run of the section
    seen = {}
    real = ap.plot_radars

    def spy(records, out, name, title, reference=None):
        seen[name] = reference
        return real(records, out, name, title, reference=reference)
    monkeypatch.setattr(ap, "plot_radars", spy)
    groups = {"mlp": {"standard": RUNS["standard"], "mlp-hybrid": RUNS["mlp-hybrid"]},
              "approximate": {"standard": RUNS["standard"], "approximate-uniform": RUNS["approximate-uniform"]}}
    md = "\n".join(ap.report_section(groups, str(tmp_path), over="study"))
    assert all(sorted(r) == sorted(RUNS) for r in seen.values()) and len(seen) == 2
    assert "every run of this section" in md
    md = "\n".join(ap.report_section(groups, str(tmp_path)))
    assert all(r is None for r in seen.values()) and "with two runs each is 0 or 1" in md
    with pytest.raises(ValueError, match="over must be 'group' or 'study'"):
        ap.report_section(groups, str(tmp_path), over="all")
    # the command line: --reference runs widen the scale, are not drawn
    logs = {}
    for label, r in RUNS.items():
        logs[label] = tmp_path / f"{label}.jsonl"
        logs[label].write_text(json.dumps(r) + "\n")
    out = subprocess.run([sys.executable, "-m", "study", "patterns", "--out",
                          str(tmp_path / "plots")] + [f"{k}={logs[k]}" for k in pair]
                         + ["--reference", f"mlp-hybrid={logs['mlp-hybrid']}"],
                         capture_output=True, text=True, check=True, cwd=ROOT).stdout
    assert "over the 2 runs drawn and 1 more" in out and (tmp_path / "plots" / "attention_radar.png").exists()
