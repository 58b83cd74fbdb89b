"""
spectra.py: singular values of every weight matrix of every layer of SAN-family checkpoints,
and their stable rank over training (SAN paper, finding 3: routing matrices W_q, W_k freeze
early, content matrices keep gaining rank, and without FFNs the gain moves to W_o).

    python -m study spectra RUN/ckpt/milestone_*.bin --out spectra/
    python -m study spectra final.bin

For each checkpoint (read with attnref/container.py's read_container, in fp32): the singular values
of attn.wq, attn.wk, attn.wv, attn.wo and, in FFN arms, ffn.w_gate, ffn.w_up, ffn.w_down of
every layer (numpy SVD in float64), and the stable rank ||W||_F^2 / sigma_max^2 (= sum s^2 /
max s^2). Prints a table of stable ranks (mean over layers) per checkpoint; with --out writes
spectra.json and three plots: the normalised singular values of the last checkpoint per matrix
(one line per layer), stable rank per matrix over the checkpoints' steps (mean over layers),
and stable rank per layer at each checkpoint.
"""
import argparse
import json
import os
import re
import sys

import numpy as np

from attnref.container import KIND_CHECKPOINT, ContainerError, read_container

MATRIX_KINDS = ("attn.wq", "attn.wk", "attn.wv", "attn.wo", "ffn.w_gate", "ffn.w_up", "ffn.w_down",
                "attn.w_gate", "attn.w_up", "attn.w_down")  # the last three: an mlp layer's sub-layer
MLP_KINDS = ("attn.w_gate", "attn.w_up", "attn.w_down")
ATTENTION_KINDS = ("attn.wq", "attn.wk", "attn.wv", "attn.wo")
LAYER_MATRIX = re.compile(r"layers\.(\d+)\.(.+)")


def stable_rank(singular_values):
    s = np.asarray(singular_values, dtype=np.float64)
    return float(np.sum(s * s) / np.max(s) ** 2) if s.size and np.max(s) > 0 else 0.0


def layer_mean(per_layer):
    """The mean over the layers that have the matrix (an mlp layer has no attn.wq ..., None)."""
    values = [v for v in per_layer if v is not None]
    return float(np.mean(values)) if values else float("nan")


def plottable(per_layer):
    return [np.nan if v is None else v for v in per_layer]


def checkpoint_spectra(path):
    """{"step": int, "singular_values": {kind: [per layer: list]}, "stable_rank": {kind: [per layer]}}.
    A layer without a kind's matrix (an mlp attention layer has no attn.wq, a standard one no
    attn.w_gate; meta layer_attention says which) holds None there; a matrix the layer's kind
    should have and the file lacks is an error."""
    _, meta, tensors = read_container(path, KIND_CHECKPOINT)
    n_layer = int(meta["n_layer"])
    sv, sr = {}, {}
    for name, array in tensors.items():
        m = LAYER_MATRIX.fullmatch(name)
        if not m or m.group(2) not in MATRIX_KINDS or array.ndim != 2:
            continue  # the embedding, gains, gates and optimizer state
        layer, kind = int(m.group(1)), m.group(2)
        s = np.linalg.svd(array.astype(np.float64), compute_uv=False)
        sv.setdefault(kind, [None] * n_layer)[layer] = s.tolist()
        sr.setdefault(kind, [None] * n_layer)[layer] = stable_rank(s)
    layer_kinds = meta["layer_attention"].split(",") if meta.get("layer_attention") else ["standard"] * n_layer
    ffn_kinds = [k for k in MATRIX_KINDS if k.startswith("ffn.")] if any(k.startswith("ffn.") for k in sr) else []
    for layer in range(n_layer):
        is_mlp = layer < len(layer_kinds) and layer_kinds[layer] == "mlp"
        for kind in list(MLP_KINDS if is_mlp else ATTENTION_KINDS) + ffn_kinds:
            if sr.get(kind, [None] * n_layer)[layer] is None:
                raise ContainerError(f"{path}: {kind} is missing for layer {layer}")
    order = [k for k in MATRIX_KINDS if k in sr]
    return {"path": path, "step": int(meta.get("step", 0)),
            "singular_values": {k: sv[k] for k in order}, "stable_rank": {k: sr[k] for k in order}}


def plot(results, out):
    from study.plots import (figure_legend, grid_of_axes, layer_axis, layer_colorbar, layer_colormap, layer_numbers,
                             plain_log_ticks, plt,
                             save)
    last = results[-1]
    kinds = list(last["stable_rank"])
    names = []

    fig, axes = grid_of_axes(len(kinds), panel=(3.2, 3.4), layout="constrained")  # (at most 4 to a row)
    n_layers = max(len(last["singular_values"][kind]) for kind in kinds)
    layer_color, mappable = layer_colormap(n_layers)
    for ax, kind in zip(axes, kinds):
        for i, s in enumerate(last["singular_values"][kind]):
            if s is None:
                continue
            s = np.asarray(s)
            ax.plot(np.arange(1, len(s) + 1), s / s[0], color=layer_color(i), lw=1)
        ax.set(title=kind, xlabel="index i (largest first)", yscale="log")
        plain_log_ticks(ax)
    for ax in axes[::4]:
        ax.set_ylabel(f"σ_i / σ_max at step {last['step']}")
    layer_colorbar(fig, axes[:len(kinds)], mappable, n_layers)  # which line is which layer
    names.append(save(fig, out, "singular_values.png", tight=False))

    fig, ax = plt.subplots(figsize=(6, 4))
    steps = [r["step"] for r in results]
    for i, kind in enumerate(kinds):
        ax.plot(steps, [layer_mean(r["stable_rank"][kind]) for r in results], "o-", color=f"C{i}", label=kind)
    ax.set(title="stable rank over training (mean over layers)", xlabel="training step",
           ylabel="stable rank ‖W‖²_F / σ²_max")
    ax.legend(fontsize=8)
    names.append(save(fig, out, "stable_rank_over_training.png"))

    fig, axes = grid_of_axes(len(kinds), panel=(3.2, 3.4), layout="constrained")
    cmap = plt.get_cmap("viridis")
    for ax, kind in zip(axes, kinds):
        for j, r in enumerate(results):
            per_layer = plottable(r["stable_rank"][kind])
            ax.plot(layer_numbers(per_layer), per_layer, "o-", ms=3, color=cmap(j / max(1, len(results) - 1)),
                    label=f"step {r['step']}")
        ax.set_title(kind)
        layer_axis(ax)
    for ax in axes[::4]:
        ax.set_ylabel("stable rank ‖W‖²_F / σ²_max")
    figure_legend(fig, axes[:len(kinds)], ncols=min(6, len(results)))
    names.append(save(fig, out, "stable_rank_per_layer.png", tight=False))
    return names


def main(argv=None):
    ap = argparse.ArgumentParser(description="Singular values and stable ranks of SAN-family checkpoints.")
    ap.add_argument("checkpoints", nargs="+", help="checkpoint files (e.g. RUN/ckpt/milestone_*.bin)")
    ap.add_argument("--out", help="directory for spectra.json and the plots")
    args = ap.parse_args(argv)
    try:
        results = sorted((checkpoint_spectra(p) for p in args.checkpoints), key=lambda r: r["step"])
    except (ContainerError, KeyError) as e:
        sys.exit(f"spectra.py: {e}")
    kinds = list(results[-1]["stable_rank"])
    print("stable rank (mean over layers)")
    print(f"{'step':>8}  " + "  ".join(f"{k:>10}" for k in kinds) + "  checkpoint")
    for r in results:
        print(f"{r['step']:>8}  " + "  ".join(f"{layer_mean(r['stable_rank'][k]):>10.3f}" for k in kinds) + f"  {r['path']}")
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "spectra.json"), "w") as f:
            json.dump(results, f)
        names = plot(results, args.out)
        print(f"wrote {args.out}/spectra.json, " + ", ".join(names))


if __name__ == "__main__":
    main()
