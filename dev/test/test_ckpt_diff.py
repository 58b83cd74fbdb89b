"""attnref/ckpt_diff.py on files written here (attnref/container.py): the same state compares
equal (NaNs included, bit for bit), and each kind of difference is named: a value (one bit of
one float), a key outside run.* (those only with --all-keys), a tensor missing, a shape; the
command's exit status is 0 / 1 / 2 (the same, different, unreadable)."""
import subprocess
import sys

import numpy as np

from attnref import ckpt_diff
from attnref.container import KIND_CHECKPOINT, write_container


META = [("model", "san"), ("n_layer", "2"), ("run.save_every", "0"), ("resume.data_step", "7")]


def tensors():
    w = np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)
    w[0, 0] = np.nan
    return [("wte", w, "fp32"), ("gain", np.zeros(4, np.float32), "bf16"), ("fixed_qk.tokens", np.arange(5), "int32")]


def write(path, meta=META, ts=None):
    write_container(str(path), KIND_CHECKPOINT, meta, tensors() if ts is None else ts)
    return path


def test_the_same_state_compares_equal(tmp_path):
    a, b = write(tmp_path / "a.bin"), write(tmp_path / "b.bin", [m for m in META if m[0] != "run.save_every"] +
                                             [("run.save_every", "5")])
    assert ckpt_diff.differences(a, a) == []
    assert ckpt_diff.differences(a, b) == []                  # run.* left out
    assert ckpt_diff.differences(a, b, all_keys=True) == ["key run.save_every: 0 vs 5"]


def test_each_difference_is_named(tmp_path):
    a = write(tmp_path / "a.bin")
    ts = tensors()
    w = ts[0][1].copy()
    w.view(np.uint32)[2, 3] ^= 1                              # the lowest bit of one value
    flipped = write(tmp_path / "flip.bin", ts=[("wte", w, "fp32")] + ts[1:])
    assert ckpt_diff.differences(a, flipped) == [f"tensor wte: 1 of 12 values differ (largest gap "
                                                 f"{abs(float(w[2, 3]) - float(ts[0][1][2, 3])):.3g})"]
    key = write(tmp_path / "key.bin", [m if m[0] != "resume.data_step" else ("resume.data_step", "8") for m in META])
    assert ckpt_diff.differences(a, key) == ["key resume.data_step: 7 vs 8"]
    fewer = write(tmp_path / "fewer.bin", ts=ts[:2])
    assert ckpt_diff.differences(a, fewer) == [f"tensors: {['wte', 'gain', 'fixed_qk.tokens']} vs {['wte', 'gain']}"]
    shape = write(tmp_path / "shape.bin", ts=[("wte", ts[0][1].reshape(4, 3), "fp32")] + ts[1:])
    assert ckpt_diff.differences(a, shape) == ["tensor wte: shape (3, 4) float32 vs (4, 3) float32"]


def test_exit_status(tmp_path):
    a, b = write(tmp_path / "a.bin"), write(tmp_path / "b.bin", META[:1] + [("n_layer", "3")] + META[2:])
    (tmp_path / "junk.bin").write_bytes(b"not a checkpoint")
    cmd = [sys.executable, "-m", "attnref.ckpt_diff"]
    same = subprocess.run(cmd + [str(a), str(a)], capture_output=True, text=True)
    assert same.returncode == 0 and "hold the same state" in same.stdout
    other = subprocess.run(cmd + [str(a), str(b)], capture_output=True, text=True)
    assert other.returncode == 1 and other.stdout.splitlines() == [
        "key n_layer: 2 vs 3", "the parameters are the same, bit for bit (3 tensors)"]
    bad = subprocess.run(cmd + [str(a), str(tmp_path / "junk.bin")], capture_output=True, text=True)
    assert bad.returncode == 2 and "junk.bin" in bad.stderr


def test_the_verdict_on_the_parameters(tmp_path):
    """After the differences, one line says whether the model's parameters (every tensor but
    the optimizer's opt.*) are the same: two runs whose optimizer states alone differ have."""
    moment = np.ones(4, np.float32)
    a = write(tmp_path / "a.bin", ts=tensors() + [("opt.m.gain", moment, "fp32")])
    b = write(tmp_path / "b.bin", ts=tensors() + [("opt.m.gain", moment * 2, "fp32")])
    diff, verdict = ckpt_diff.compare(a, b)
    assert diff == ["tensor opt.m.gain: 4 of 4 values differ (largest gap 1)"]
    assert verdict == "the parameters are the same, bit for bit (3 tensors)"
    ts = tensors()
    c = write(tmp_path / "c.bin", ts=[ts[0], ("gain", np.ones(4, np.float32), "bf16"), ts[2],
                                      ("opt.m.gain", moment, "fp32")])
    assert ckpt_diff.compare(a, c)[1] == "the parameters differ: 1 of 3 tensors (gain)"
    fewer = write(tmp_path / "fewer.bin", ts=ts[:2] + [("opt.m.gain", moment, "fp32")])
    assert ckpt_diff.compare(a, fewer)[1] == "the parameters differ: 1 of 3 tensors (fixed_qk.tokens)"
