"""Checks of every plot the study layer draws, through matplotlib's own objects (no pixels):
each figure is kept as it is saved (Figure.savefig wrapped), then its axes labels, legend
entries, ticks and lines are read back.

- A toy study (a SAN and an FFN arm, two seeds, a swept arm; logs with regions, exercises,
  gates, per-layer measurements; final and milestone checkpoints for the spectra), reported by
  `python -m study report`: loss_curves.png (each step's loss faint, its EMA as the line, both
  axes in nats), final_loss.png, lr_curves.png, regions.png, exercises.png, gates.png (a colour
  bar of layers, a legend of gate kinds), erank.png and max_logit.png (y labels, whole-layer
  ticks), spectra.png (every arm in the legend, the SAN too), stable_rank_training.png.
- study/spectra.py's three plots: singular_values.png has a colour bar of layers.
- study/ladder_report.py's five plots: labelled axes, a legend that holds what any panel draws.
- study/compare.py: a run resumed into a directory of its own draws the curves of the run that
  went straight through (the smoothing restarted nowhere), and labels its axes with units.
- study/attention_patterns.py's radar and logit plots: every run in the legend.
No trainer; about 10 s.
"""
import json
import re
import os
import types

import numpy as np
import pytest

from matplotlib.figure import Figure

from attnref import container
from study import attention_patterns, compare, curves, ladder_report, spectra
from study import runner as study

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

N_LAYER = 3
STEPS = 40


def keep_figures(monkeypatch):
    """{file name: Figure} of every figure saved from now on (a closed figure keeps its axes and
    artists, so it can be read after the plot function returns)."""
    figures = {}
    save = Figure.savefig

    def keep(fig, fname, *args, **kwargs):
        figures[os.path.basename(str(fname))] = fig
        return save(fig, fname, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", keep)
    return figures


@pytest.fixture
def drawn(monkeypatch):
    return keep_figures(monkeypatch)


# ----------------------------------------------------------------------------------------
# reading a figure

def data_axes(fig):
    """The figure's panels, without colour bars and hidden (unused) grid cells."""
    return [ax for ax in fig.axes if ax.get_visible() and not is_colorbar(ax)]


def is_colorbar(ax):
    return ax.get_label() == "<colorbar>"


def colorbars(fig):
    return [ax for ax in fig.axes if is_colorbar(ax)]


def legend_labels(fig):
    """Every entry of the figure's legends, its own and its panels'."""
    legends = list(fig.legends) + [ax.get_legend() for ax in fig.axes if ax.get_legend() is not None]
    return [t.get_text() for legend in legends for t in legend.get_texts()]


def visible_ticks(ax, which="x"):
    ax.figure.canvas.draw()
    lo, hi = sorted(ax.get_xlim() if which == "x" else ax.get_ylim())
    ticks = ax.get_xticks() if which == "x" else ax.get_yticks()
    return [t for t in ticks if lo - 1e-9 <= t <= hi + 1e-9]


def assert_whole_numbers(ticks, what):
    assert ticks and all(float(t).is_integer() for t in ticks), f"{what}: ticks {list(ticks)}"


def assert_layer_axis(ax, what, n_layer=N_LAYER):
    """Layers along x: labelled, ticks at whole layers only, numbered from 1."""
    assert "layer" in ax.get_xlabel(), (what, ax.get_xlabel())
    ticks = visible_ticks(ax)
    assert_whole_numbers(ticks, what)
    xs = sorted({x for line in ax.lines for x in line.get_xdata()})
    assert xs == list(range(1, n_layer + 1)), (what, xs)


def assert_layer_colorbar(fig, what, n_layer=N_LAYER):
    """Lines coloured by layer come with a key: a colour bar labelled layer, at whole layers."""
    bars = colorbars(fig)
    assert len(bars) == 1, f"{what}: no colour bar says which line is which layer"
    bar = bars[0]
    assert "layer" in bar.get_ylabel(), (what, bar.get_ylabel())
    ticks = visible_ticks(bar, "y")
    assert_whole_numbers(ticks, what)
    assert min(ticks) == 1 and max(ticks) <= n_layer, (what, ticks)


def assert_labelled(ax, what, x_unit=None, y_unit=None):
    assert ax.get_xlabel().strip() and ax.get_ylabel().strip(), (what, ax.get_xlabel(), ax.get_ylabel())
    if x_unit:
        assert x_unit in ax.get_xlabel(), (what, ax.get_xlabel())
    if y_unit:
        assert y_unit in ax.get_ylabel(), (what, ax.get_ylabel())


# ----------------------------------------------------------------------------------------
# a toy study, its logs and checkpoints written here

STUDY = """
[study]
name = "plots"
out = "{out}"
seeds = [1, 2]
batch_size = 4
seq_len = 32
steps = {steps}
flags = ["--optimizer", "adamw"]
baseline = "san"

[[arm]]
name = "san"
preset = "tiny"

[[arm]]
name = "ffn"
preset = "tiny-ffn"

[[arm]]
name = "swept"
preset = "tiny"
lr = [1e-3, 2e-3]
seeds = [1]
"""

EXERCISES = ("copy", "sort")


def losses_of(shift):
    """A noisy falling training loss, so that the EMA and the raw curve differ."""
    rng = np.random.default_rng(round(1000 * (1 + shift)))
    return [float(5.0 - 0.03 * s + 0.2 * rng.standard_normal() + shift) for s in range(STEPS)]


def validation(step, loss, ffn):
    """A validation record with what the report plots: regions, exercises, gates, per-layer measurements."""
    rec = {"step": step, "val_loss": loss, "val_tokens": 1000,
           **{f"val_loss_{r}": loss + k * 0.1 for k, r in enumerate(("query", "trace", "answer", "other"))},
           "val_exercise": {e: {"all": loss + 0.05 * k, "query": loss} for k, e in enumerate(EXERCISES)},
           "gate_attn": [0.5 + 0.1 * l for l in range(N_LAYER)],
           "erank": [10.0 + l for l in range(N_LAYER)], "max_logit": [3.0 * (l + 1) for l in range(N_LAYER)]}
    if ffn:
        rec["gate_ffn"] = [0.4 + 0.1 * l for l in range(N_LAYER)]
    # --val-whole-docs 2: the same on whole documents, which the region plots read
    rec["whole_docs"] = {k: v for k, v in rec.items() if k.startswith("val_")}
    return rec


def header(lr):
    return {"run": {"executor": "host backend", "precision": "bf16", "program": "train_san",
                    "config": {"batch-size": "4", "seq-len": "32"},
                    "rates": {"optimizer": "adamw", "lr": lr, "lr_other": lr}, "ranks": 1}}


def write_checkpoint(path, step, ffn, seed):
    """A checkpoint container with the layers' weight matrices (what spectra.py reads)."""
    rng = np.random.default_rng(seed + step)
    kinds = spectra.ATTENTION_KINDS + (("ffn.w_gate", "ffn.w_up", "ffn.w_down") if ffn else ())
    tensors = [(f"layers.{l}.{kind}", rng.standard_normal((16, 16)) * (1 + 0.1 * l), "fp32")
               for l in range(N_LAYER) for kind in kinds]
    container.write_container(str(path), container.KIND_CHECKPOINT, [("n_layer", str(N_LAYER)), ("step", str(step))],
                              tensors)


def write_run(run_dir, lr, shift, ffn, seed, checkpoints=False):
    os.makedirs(run_dir, exist_ok=True)
    losses = losses_of(shift)
    records = [header(lr)] + [{"step": s, "loss": losses[s - 1], "lr": lr, "grad_norm": 1.0, "ms": 5.0}
                              for s in range(1, STEPS + 1)]
    records += [validation(STEPS // 2, 4.5 + shift, ffn), validation(STEPS, 4.2 + shift, ffn)]
    with open(os.path.join(run_dir, "log.jsonl"), "w") as f:
        f.write("".join(json.dumps(r) + "\n" for r in records))
    with open(os.path.join(run_dir, "status.json"), "w") as f:
        json.dump({"state": "done", "steps": STEPS}, f)
    if checkpoints:
        os.makedirs(os.path.join(run_dir, "ckpt"))
        for step in (0, STEPS // 2):
            write_checkpoint(os.path.join(run_dir, "ckpt", f"milestone_{step:03d}.bin"), step, ffn, seed)
        write_checkpoint(os.path.join(run_dir, "ckpt", "final.bin"), STEPS, ffn, seed)
    return losses


@pytest.fixture(scope="module")
def toy_report(tmp_path_factory):
    """The toy study reported (once for the tests below); (figures by file name, {run id: its training losses})."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        drawn = keep_figures(monkeypatch)
        return report_toy_study(tmp_path_factory.mktemp("toy"), drawn)


def report_toy_study(tmp_path, drawn):
    out = tmp_path / "out"
    path = tmp_path / "plots.toml"
    path.write_text(STUDY.format(out=out, steps=STEPS))
    losses = {}
    for seed in (1, 2):
        # the SAN arm is written last in name order neither way: the spectra legend must hold both
        losses[f"san_s{seed}"] = write_run(out / "runs" / f"san_s{seed}", 6e-4, 0.01 * seed, False, seed, seed == 1)
        losses[f"ffn_s{seed}"] = write_run(out / "runs" / f"ffn_s{seed}", 2.4e-3, -0.1 + 0.01 * seed, True, seed,
                                           seed == 1)
    write_run(out / "runs" / "swept_lr0.001_s1", 1e-3, 0.05, False, 1)
    write_run(out / "runs" / "swept_lr0.002_s1", 2e-3, 0.03, False, 1)
    assert study.main(["report", str(path), "--binary", "/nonexistent/train_san"]) == 0
    return drawn, losses


# ----------------------------------------------------------------------------------------
# the study report

def test_report_draws_every_plot(toy_report):
    figures, _ = toy_report
    assert {"loss_curves.png", "final_loss.png", "lr_curves.png", "regions.png", "exercises.png", "gates.png",
            "erank.png", "max_logit.png", "spectra.png", "stable_rank_training.png"} <= set(figures)


def test_report_loss_curves_raw_faint_and_smoothed(toy_report):
    """Training loss: each seed's every-step loss faint, its EMA over the run as the line; both
    panels' axes in tokens and nats; an entry per arm."""
    figures, losses = toy_report
    train_ax, val_ax = data_axes(figures["loss_curves.png"])
    for ax in (train_ax, val_ax):
        assert_labelled(ax, "loss_curves.png", x_unit="tokens", y_unit="nats")
    raw = [list(line.get_ydata()) for line in train_ax.lines if line.get_alpha() is not None and line.get_alpha() < 0.5]
    smooth = [list(line.get_ydata()) for line in train_ax.lines if line.get_alpha() is None]
    for run in ("san_s1", "san_s2", "ffn_s1", "ffn_s2"):
        assert losses[run] in raw, f"{run}: its every-step loss is not drawn faint"
        assert curves.ema(losses[run]) in smooth, f"{run}: its EMA is not drawn"
    assert set(train_ax.get_legend_handles_labels()[1]) == {"san", "ffn", "swept"}
    assert set(val_ax.get_legend_handles_labels()[1]) == {"san", "ffn", "swept"}


def test_report_per_layer_measurements_are_labelled_at_whole_layers(toy_report):
    """erank.png, max_logit.png: a y label that says what and in what, layers 1..L at whole-number ticks."""
    figures, _ = toy_report
    for name, unit in (("erank.png", "effective rank"), ("max_logit.png", "logit")):
        (ax,) = data_axes(figures[name])
        assert unit in ax.get_ylabel(), (name, ax.get_ylabel())
        assert_layer_axis(ax, name)
        assert set(legend_labels(figures[name])) == {"san", "ffn", "swept"}


def test_report_spectra_legend_holds_every_arm(toy_report):
    """spectra.png: the SAN has no FFN matrices, and its legend on the last (FFN) panel left it out."""
    figures, _ = toy_report
    fig = figures["spectra.png"]
    assert sorted(legend_labels(fig)) == ["ffn", "san"]
    panels = data_axes(fig)
    assert [ax.get_title() for ax in panels] == list(spectra.ATTENTION_KINDS) + ["ffn.w_gate", "ffn.w_up", "ffn.w_down"]
    assert "stable rank" in panels[0].get_ylabel()
    for ax in panels:
        assert_layer_axis(ax, f"spectra.png {ax.get_title()}")


def test_report_stable_rank_over_training(toy_report):
    """stable_rank_training.png: a y label, and a legend of every matrix kind (the SAN's panel has no FFN kinds)."""
    figures, _ = toy_report
    fig = figures["stable_rank_training.png"]
    panels = data_axes(fig)
    assert len(panels) == 2
    assert "stable rank" in panels[0].get_ylabel() and all("step" in ax.get_xlabel() for ax in panels)
    assert sorted(legend_labels(fig)) == sorted(spectra.ATTENTION_KINDS + ("ffn.w_gate", "ffn.w_up", "ffn.w_down"))
    # a kind keeps its colour in every panel
    colours = {}
    for ax in panels:
        for line in ax.lines:
            colours.setdefault(line.get_label(), set()).add(line.get_color())
    assert all(len(c) == 1 for c in colours.values()), colours


def test_report_gates_say_which_layer_and_which_gate(toy_report):
    figures, _ = toy_report
    fig = figures["gates.png"]
    panels = data_axes(fig)
    assert [ax.get_title().split(":")[0] for ax in panels] == ["san", "ffn", "swept"]
    assert_labelled(panels[0], "gates.png", x_unit="tokens", y_unit="gate")
    assert_layer_colorbar(fig, "gates.png")
    assert sorted(legend_labels(fig)) == ["FFN gate", "attention gate"]


def test_report_bar_and_sweep_plots_are_labelled(toy_report):
    """final_loss.png, lr_curves.png, regions.png, exercises.png: axes labelled, losses in nats."""
    figures, _ = toy_report
    (final,) = [ax for ax in data_axes(figures["final_loss.png"]) if ax.get_ylabel()]
    assert "nats" in final.get_ylabel()
    (lr,) = data_axes(figures["lr_curves.png"])
    assert_labelled(lr, "lr_curves.png", x_unit="--lr", y_unit="nats")
    assert legend_labels(figures["lr_curves.png"]) == ["swept"]
    (regions,) = data_axes(figures["regions.png"])
    assert_labelled(regions, "regions.png", x_unit="region", y_unit="nats")
    assert [t.get_text() for t in regions.get_xticklabels()] == ["query", "trace", "answer", "other"]
    assert set(legend_labels(figures["regions.png"])) == {"ffn", "swept"}
    (exercises,) = data_axes(figures["exercises.png"])
    assert_labelled(exercises, "exercises.png")
    assert [t.get_text() for t in exercises.get_yticklabels()] == list(EXERCISES)
    assert "nats" in colorbars(figures["exercises.png"])[0].get_ylabel()


# ----------------------------------------------------------------------------------------
# spectra.py

def test_spectra_plots(tmp_path, drawn):
    """singular_values.png had no key to its layer colours; the per-layer plots are at whole layers."""
    paths = []
    for step in (0, 10, 20):
        paths.append(str(tmp_path / f"milestone_{step:03d}.bin"))
        write_checkpoint(paths[-1], step, True, 1)
    spectra.main(paths + ["--out", str(tmp_path / "spectra")])
    kinds = list(spectra.ATTENTION_KINDS) + ["ffn.w_gate", "ffn.w_up", "ffn.w_down"]
    fig = drawn["singular_values.png"]
    assert [ax.get_title() for ax in data_axes(fig)] == kinds
    assert_layer_colorbar(fig, "singular_values.png")
    assert all(ax.get_xlabel() for ax in data_axes(fig)) and "σ" in data_axes(fig)[0].get_ylabel()
    (over,) = data_axes(drawn["stable_rank_over_training.png"])
    assert_labelled(over, "stable_rank_over_training.png", x_unit="step", y_unit="stable rank")
    assert legend_labels(drawn["stable_rank_over_training.png"]) == kinds
    fig = drawn["stable_rank_per_layer.png"]
    assert legend_labels(fig) == ["step 0", "step 10", "step 20"]
    assert "stable rank" in data_axes(fig)[0].get_ylabel()
    for ax in data_axes(fig):
        assert_layer_axis(ax, f"stable_rank_per_layer.png {ax.get_title()}")


# ----------------------------------------------------------------------------------------
# ladder_report.py

def test_ladder_plots(tmp_path, drawn):
    out = str(tmp_path)
    floors = [(64, 0.01), (256, 0.008)]
    gaps = [(t, {"gaps": {role: (0.1 / k, 0.01) for role in ladder_report.ROLES}}) for k, t in enumerate((64, 256), 1)]
    ladder_report.plot_gaps(gaps, floors, out)
    (ax,) = data_axes(drawn["gaps_vs_tokens.png"])
    assert_labelled(ax, "gaps_vs_tokens.png", x_unit="tokens", y_unit="nats")
    assert set(legend_labels(drawn["gaps_vs_tokens.png"])) >= {f"SAN − {r}" for r in ladder_report.ROLES.values()}

    # only the training-document panel has a rung with the regions: its entries were absent from the legend
    deltas = {"deltas": {r: (0.01, 0.002) for r in ladder_report.REGIONS}}
    ladder_report.plot_regions([(64, {"whole_docs": None, "train_docs": deltas}),
                                (256, {"whole_docs": None, "train_docs": deltas})], floors, out)
    fig = drawn["regions_vs_tokens.png"]
    assert set(legend_labels(fig)) == set(ladder_report.REGIONS) | {"noise floor"}
    assert "nats" in data_axes(fig)[0].get_ylabel() and all("tokens" in ax.get_xlabel() for ax in data_axes(fig))

    # the FFN gate is logged by the FFN arm only; each panel is its own quantity
    means = {("san", "gate_attn_mean"): 0.5, ("san", "erank_mean"): 9.0, ("ffn", "gate_attn_mean"): 0.6,
             ("ffn", "gate_ffn_mean"): 0.4, ("ffn", "erank_mean"): 11.0}
    rungs = [types.SimpleNamespace(tokens=t, arm_mean=lambda arm, key: (means.get((arm, key)), 0.01)) for t in (64, 256)]
    ladder_report.plot_measurements(rungs, ["san", "ffn"], out)
    fig = drawn["measurements_vs_tokens.png"]
    for ax in data_axes(fig):
        assert_labelled(ax, f"measurements_vs_tokens.png {ax.get_title()}", x_unit="tokens")
    assert "effective rank" in data_axes(fig)[2].get_ylabel()
    assert sorted(legend_labels(fig)) == ["ffn", "san"]

    # a kind measured only against the hybrids is drawn only in the right-hand panel
    points = [(t, {"deltas": {"uniform": (0.02, 0.03), "mlp": (None, 0.05)}}) for t in (64, 256)]
    ladder_report.plot_deconstructing(points, out)
    fig = drawn["deconstructing_vs_tokens.png"]
    assert sorted(legend_labels(fig)) == ["mlp", "uniform"]
    assert "nats" in data_axes(fig)[0].get_ylabel()

    arm = types.SimpleNamespace(name="san")
    runs = [types.SimpleNamespace(run=types.SimpleNamespace(arm=arm, lr=lr, lr_other=None, rate_point=(lr, None)),
                                  final={"val_loss": 4.0 + lr}) for lr in (0.01, 0.02)]
    sweep = types.SimpleNamespace(arms=[arm], name="toy", steps=10, tokens_per_step=128)
    ladder_report.plot_sweep(sweep, runs, out, "lr")
    (ax,) = data_axes(drawn["sweep.png"])
    assert_labelled(ax, "sweep.png", x_unit="--lr", y_unit="nats")
    assert legend_labels(drawn["sweep.png"]) == ["san"]


# ----------------------------------------------------------------------------------------
# compare.py: a resumed run's curves are the straight run's

def write_log(path, records):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write("".join(json.dumps(r) + "\n" for r in records))


def compare_header(run_dir):
    return {"run": {"program": "train_san", "run_dir": run_dir, "ranks": 1,
                    "config": {"batch-size": "2", "seq-len": "8"},
                    "rates": {"optimizer": "adamw", "lr": 1e-3, "lr_other": 1e-3}}}


def test_compare_draws_a_resumed_run_as_the_straight_run(tmp_path, drawn, monkeypatch):
    """`train_san --resume runs/a/step_8.bin --run-dir runs/b` logs from step 9 on (after its
    header and resume record); run a had logged to step 12 before it stopped. compare.py draws
    b's curves, raw and smoothed, and validation, equal to those of the run that went straight
    through: steps 1-8 from a's log, the rest from b's."""
    losses = [5.0 - 0.1 * s + (0.3 if s % 3 == 0 else 0.0) for s in range(20)]

    def train(steps):
        return [{"step": s, "loss": losses[s - 1], "lr": 1e-3, "grad_norm": 1.0, "ms": 1.0} for s in steps]

    def val(step):
        return {"step": step, "val_loss": 4.0 - 0.05 * step}

    root = tmp_path / "repo"
    write_log(str(root / "runs" / "straight" / "log.jsonl"),
              [compare_header("runs/straight")] + train(range(1, 9)) + [val(8)] + train(range(9, 21)) + [val(16), val(20)])
    # the first run stopped after step 12, its last checkpoint at step 8; its steps 9-12 run again in b
    write_log(str(root / "runs" / "a" / "log.jsonl"),
              [compare_header("runs/a")] + train(range(1, 9)) + [val(8)] + [{"step": s, "loss": 9.0} for s in range(9, 13)])
    write_log(str(root / "runs" / "b" / "log.jsonl"),
              [compare_header("runs/b"), {"step": 8, "resume": "runs/a/step_8.bin"}] + train(range(9, 21))
              + [val(16), val(20)])
    monkeypatch.chdir(tmp_path)  # not where the trainer ran: the header's run_dir says where that was
    png = tmp_path / "compare.png"
    assert compare.main([str(root / "runs" / "straight"), str(root / "runs" / "b"), "--out", str(png)]) == 0
    fig = drawn["compare.png"]
    train_ax, val_ax = data_axes(fig)
    for ax in (train_ax, val_ax):
        assert_labelled(ax, "compare.png", x_unit="tokens", y_unit="nats")

    def curves_of(ax, colour):
        return [(list(line.get_xdata()), list(line.get_ydata())) for line in ax.lines if line.get_color() == colour]

    straight, resumed = "C0", "C1"
    assert curves_of(train_ax, straight) and curves_of(train_ax, resumed) == curves_of(train_ax, straight)
    assert curves_of(val_ax, straight) and curves_of(val_ax, resumed) == curves_of(val_ax, straight)
    assert [line.get_alpha() for line in train_ax.lines if line.get_color() == resumed] == [curves.RAW_ALPHA, None]
    labels = legend_labels(fig)
    assert len(labels) == 2 and labels[0].startswith("straight") and labels[1].startswith("b")


def test_compare_says_when_the_log_a_run_resumed_from_is_missing(tmp_path, capsys):
    write_log(str(tmp_path / "runs" / "b" / "log.jsonl"),
              [compare_header("runs/b"), {"step": 8, "resume": "runs/gone/step_8.bin"},
               {"step": 9, "loss": 4.0}, {"step": 10, "loss": 3.9}, {"step": 10, "val_loss": 3.8}])
    assert compare.main([str(tmp_path / "runs" / "b"), "--out", str(tmp_path / "c.png")]) == 0
    assert "b: resumed at step 8 from a run whose log was not found; its curves start at step 9" in capsys.readouterr().out


# ----------------------------------------------------------------------------------------
# attention_patterns.py (labelled before this test; kept so)

def test_attention_pattern_plots(tmp_path, drawn):
    def record(shift):
        heads = [[0.5 + shift, 0.6]] * N_LAYER
        edges = [10.0 ** (k / 4 - 3) for k in range(29)]
        return {"attn_entropy": heads, "attn_conc": heads, "attn_sink": heads, "attn_headdiv": [0.1 + shift] * N_LAYER,
                "attn_locfoc": [[[0.2, 0.3]] * 4] * N_LAYER, "logit_abs_edges": edges,
                "logit_abs_hist": [[1 + k for k in range(28)]] * N_LAYER}

    records = {"standard": record(0.0), "uniform": record(0.2)}
    attention_patterns.plot_radars(records, str(tmp_path))
    attention_patterns.plot_logits(records, str(tmp_path))
    for name in ("attention_radar.png", "logit_distribution.png"):
        fig = drawn[name]
        assert legend_labels(fig) == ["standard", "uniform"], name
        assert [ax.get_title() for ax in data_axes(fig)] == [f"layer {l}" for l in range(1, N_LAYER + 1)], name
    panels = data_axes(drawn["logit_distribution.png"])
    assert panels[0].get_ylabel() and all(ax.get_xlabel() for ax in panels)


# ----------------------------------------------------------------------------------------
# what every figure of the report shares

def texts_outside(fig):
    """The titles, axis labels and tick labels of a figure's panels that reach past its edges
    (as saved: a clipped title was the first thing a reader saw)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    canvas = FigureCanvasAgg(fig)  # (a closed figure keeps no canvas of its own)
    canvas.draw()
    renderer, box = canvas.get_renderer(), fig.bbox
    out = []
    for ax in fig.axes:
        if not ax.get_visible():
            continue
        texts = [ax.title, ax._left_title, ax._right_title, ax.xaxis.label, ax.yaxis.label]
        for axis in (ax.xaxis, ax.yaxis):
            lo, hi = sorted(axis.get_view_interval())
            texts += [t.label1 for t in axis.get_major_ticks() + axis.get_minor_ticks()
                      if lo - 1e-9 <= t.get_loc() <= hi + 1e-9]  # (the ticks drawn)
        for text in texts:
            if text.get_visible() and text.get_text():
                e = text.get_window_extent(renderer)
                if e.x0 < box.x0 - 1 or e.x1 > box.x1 + 1 or e.y0 < box.y0 - 1 or e.y1 > box.y1 + 1:
                    out.append(text.get_text())
    return out


def test_no_text_of_a_report_figure_is_clipped(toy_report):
    figures, _ = toy_report
    clipped = {name: texts_outside(fig) for name, fig in figures.items()}
    assert {name: t for name, t in clipped.items() if t} == {}


def test_log_axes_label_their_ticks_as_plain_numbers(toy_report):
    """A log axis spanning less than a decade (max_logit.png, lr_curves.png) got tick labels like
    1.35x10^1 (mathtext); every tick label of the report is a plain number now."""
    figures, _ = toy_report
    for name in ("max_logit.png", "lr_curves.png"):
        fig = figures[name]
        fig.canvas.draw()
        for ax in data_axes(fig):
            for axis in (ax.xaxis, ax.yaxis):
                if axis.get_scale() != "log":
                    continue
                labels = [t.get_text() for t in axis.get_ticklabels(which="both") if t.get_text()]
                assert labels and all(re.fullmatch(r"-?[0-9.]+(e-?[0-9]+)?", t) for t in labels), (name, labels)


def test_a_figure_of_many_panels_wraps_its_rows(toy_report):
    """spectra.png (seven matrix kinds with an FFN arm) was one row of seven narrow panels: at
    most four to a row now."""
    figures, _ = toy_report
    fig = figures["spectra.png"]
    rows = {round(ax.get_position().y0, 3) for ax in data_axes(fig)}
    assert len(data_axes(fig)) == 7 and len(rows) == 2, rows


def test_the_ema_lags_a_short_run_little():
    """The loss curves' EMA line: 0.9 lagged a steady trend by 9 steps, most of a 20-step run; its
    decay now keeps the lag of a steady fall within 5% of the run, and is 0.9 on long runs."""
    for n in (20, 40, 100, 180, 1000):
        ramp = [float(-i) for i in range(n)]
        lag = curves.ema(ramp)[-1] - ramp[-1]  # (steps behind a fall of one nat per step)
        assert lag <= n / 20 + 1e-9, (n, lag)
    assert curves.ema_decay(1000) == 0.9 and curves.ema([1.0, 0.0], decay=0.5) == [1.0, 0.5]


def test_the_exercises_plot_of_one_arm_keeps_its_title(tmp_path, drawn):
    """One arm beside the baseline made a figure narrower than its title (the SYNTH exercises'
    names: the generator's five)."""
    from study import report as study_report
    exercises = ["mcq", "math", "memorization", "recall", "rag"]

    def arm(name, shift):
        return types.SimpleNamespace(ok=True, arm=types.SimpleNamespace(name=name),
                                     exercise_mean=lambda e, region: 1.0 + shift + 0.1 * exercises.index(e))
    base = arm("san", 0.0)
    study_report.plot_exercises({"san": base, "ffn-iso-param": arm("ffn-iso-param", -0.05)}, base, exercises,
                                str(tmp_path))
    assert texts_outside(drawn["exercises.png"]) == []
