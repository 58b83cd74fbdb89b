"""dev/cost_model.py (issue 55, target 3): its arithmetic on counts written here (a step as the
difference of two runs, the affine extrapolation in the batch, the roofline time of a kernel on a
card), then the whole tool on the host train_san (TRAIN_SAN_BIN) at the tiny preset with AdamW,
whose GEMM FLOPs per step are known by hand: 6 x tokens x (the matrices' parameters + the
classifier's V_pad x d), and whose other kernels' counts must grow with the batch."""
import os

import pytest

import cost_model


BIN = os.environ.get("TRAIN_SAN_BIN")


def counts(launches, tensor=0, fma=0, read=0, written=0):
    return dict(launches=launches, tensor_flops=tensor, fma_flops=fma, read=read, written=written)


def test_a_step_is_the_difference_and_the_batch_extrapolates(tmp_path):
    one = tmp_path / "one.tsv"
    two = tmp_path / "two.tsv"
    one.write_text("init_kernel\t1\t0\t0\t4096\t4096\nnorm\t3\t0\t0\t8192\t4096\n")
    two.write_text("init_kernel\t1\t0\t0\t4096\t4096\nnorm\t6\t0\t0\t16384\t8192\nadamw\t2\t0\t0\t100\t50\n")
    step = cost_model.difference(cost_model.read_counts(two), cost_model.read_counts(one))
    assert step == {"norm": counts(3, read=8192, written=4096), "adamw": counts(2, read=100, written=50)}
    # at 1 row a norm reads 8 KB, at 2 rows 16 KB; the optimizer's bytes do not grow with the batch
    at2 = {"norm": counts(3, read=16384, written=8192), "adamw": counts(2, read=100, written=50)}
    at8 = cost_model.at_batch(step, at2, 8)
    assert at8["norm"] == counts(3, read=8 * 8192, written=8 * 4096)
    assert at8["adamw"] == counts(2, read=100, written=50)
    bad = tmp_path / "bad.tsv"
    bad.write_text("norm\t3\t0\n")
    with pytest.raises(ValueError, match="bad.tsv:1: expected 6 tab-separated fields, got 3"):
        cost_model.read_counts(bad)


def test_a_kernel_takes_the_time_of_what_binds_it():
    card = dict(tensor=1e15, fma=1e14, memory=2e12, link=5e10)
    # 1 TFLOP on tensor cores (1 ms) against 1 GB (0.5 ms): tensor-bound
    assert cost_model.kernel_time(counts(1, tensor=10**12, read=10**9), card) == (1e-3, "tensor")
    # 1 GB read + 1 GB written at 2 TB/s: 1 ms, memory-bound beside 0.1 ms of FMA
    assert cost_model.kernel_time(counts(1, fma=10**10, read=10**9, written=10**9), card) == (1e-3, "memory")
    assert cost_model.kernel_time(counts(1, read=10**8, written=10**8), card, "cudaMemcpy host to device") == \
        (2e-3, "host link")
    text, totals = cost_model.table({"a": counts(2, tensor=10**12), "b": counts(1, read=10**9, written=10**9)}, card, 1000)
    assert totals["step_seconds"] == pytest.approx(2e-3) and totals["launches"] == 3
    assert totals["tokens_per_second"] == pytest.approx(5e5) and totals["tensor_share"] == pytest.approx(0.5)
    assert "| a | 2 | 1000.00 | 0.00 | 0.0 | 0.0 | tensor | 1.000 | 50.0% |" in text


@pytest.mark.skipif(not BIN, reason="TRAIN_SAN_BIN not set (make test sets it)")
def test_the_tool_on_the_tiny_preset_counts_the_gemms_by_hand(tmp_path):
    extra = ["--optimizer", "adamw", "--n-layer", "2", "--n-embd", "64", "--n-head", "4", "--n-kv-head", "2"]
    step1, step2 = cost_model.measure(BIN, "tiny", 250, extra, str(tmp_path))
    gemms = [name for name in step1 if name.startswith("gemm")]
    assert len(gemms) == 1, step1.keys()
    # per layer W_q 64x64, W_k and W_v 64x32 (2 kv heads of 16), W_o 64x64; the classifier 256x64
    # (vocabulary 250 padded to 128s); forward 2 N P, backward 4 N P (dx and dW)
    params = 2 * (64 * 64 + 2 * 64 * 32 + 64 * 64) + 256 * 64
    for step, rows in ((step1, 1), (step2, 2)):
        c = step[gemms[0]]
        assert c["tensor_flops"] + c["fma_flops"] == 6 * rows * 64 * params, (rows, c)
    at4 = cost_model.at_batch(step1, step2, 4)
    assert at4[gemms[0]]["tensor_flops"] + at4[gemms[0]]["fma_flops"] == 6 * 4 * 64 * params
    # every kernel launches as often at either batch; the activations' kernels move more bytes at 2 rows
    assert {n: c["launches"] for n, c in step1.items()} == {n: c["launches"] for n, c in step2.items()}
    grows = [n for n in step1 if step2[n]["read"] + step2[n]["written"] > step1[n]["read"] + step1[n]["written"]]
    assert any("attention" in n for n in grows) and any("norm" in n for n in grows), grows


@pytest.mark.skipif(not BIN, reason="TRAIN_SAN_BIN not set (make test sets it)")
def test_the_depth_extrapolates_as_measured(tmp_path):
    """--layers: counts at 1 and 2 layers extrapolated to 3 are the counts measured at 3 (FLOPs and
    launches exactly; bytes within a page per kernel and launch, the footprint's rounding)."""
    extra = ["--optimizer", "adamw", "--n-embd", "64", "--n-head", "4", "--n-kv-head", "2"]
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    modelled = cost_model.measure(BIN, "tiny", 250, extra, str(tmp_path / "a"), layers=3)
    measured = cost_model.measure(BIN, "tiny", 250, extra + ["--n-layer", "3"], str(tmp_path / "b"))
    for m, d in zip(modelled, measured):
        assert set(m) == set(d)
        for name in d:
            for k in ("launches", "tensor_flops", "fma_flops"):
                assert m[name][k] == d[name][k], (name, k, m[name], d[name])
            for k in ("read", "written"):
                assert abs(m[name][k] - d[name][k]) <= 4096 * d[name]["launches"], (name, k, m[name], d[name])


def test_a_report_from_saved_counts(tmp_path, capsys):
    """--from-counts models saved step counts (--save-counts' JSON) at any batch and card without the
    trainer: a norm of 1 MB a row read and written, at 3 rows on a 1 TB/s card: 6 MB, 6 us."""
    saved = tmp_path / "counts.json"
    step1 = {"norm": counts(1, read=10**6, written=10**6)}
    step2 = {"norm": counts(1, read=2 * 10**6, written=2 * 10**6)}
    saved.write_text(__import__("json").dumps({"steps": [step1, step2]}))
    cost_model.CARDS["test-card"] = dict(name="a test card", tensor=1e15, fma=1e14, memory=1e12, link=1e10)
    try:
        cost_model.main(["--trainer", "none", "--preset", "p", "--seq-len", "10", "--vocab", "5", "--batch-size", "3",
                         "--card", "test-card", "--from-counts", str(saved)])
    finally:
        del cost_model.CARDS["test-card"]
    out = capsys.readouterr().out
    assert "## B 3 x T 10 (30 tokens a step) on a test card" in out
    assert "Modelled step: 0.01 ms" in out and "| norm | 1 | 0.00 | 0.00 | 3.0 | 3.0 | memory | 0.006 | 100.0% |" in out
