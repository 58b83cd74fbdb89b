"""End-to-end checks of the train_san binary (the host-backend build named by TRAIN_SAN_BIN,
which `make test` sets): command-line errors, a short run whose loss falls, and an exact
resume — 8 steps straight, and 8 steps resumed from the straight run's step-4 checkpoint,
must write byte-identical final checkpoints (model, AdamW state, data position and RNG)."""
import os
import subprocess

import pytest

from trainer_cli import ROOT, reference, run_binary, step_losses, write_pattern_corpus, state_differences

BIN = os.environ.get("TRAIN_SAN_BIN")
pytestmark = pytest.mark.skipif(not BIN, reason="TRAIN_SAN_BIN not set (make test sets it)")


def run(args, check=True):
    return run_binary(BIN, args, check)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_pattern_corpus(tmp_path_factory.mktemp("data"), {"toy_train_000000": 400, "toy_val_000000": 40})


def common(data, tmp, optimizer=("--optimizer", "adamw", "--lr", "3e-3")):
    return ["--preset", "tiny", "--train-data", str(data / "toy_train_*.bin"), "--val-data",
            str(data / "toy_val_*.bin"), "--batch-size", "4", "--sample-tokens", "0",
            "--val-batches", "2", "--checkpoint-dir", str(tmp)] + list(optimizer)


def test_help_lists_every_option_with_defaults():
    out = run(["-h"]).stdout
    for flag in ("--preset", "--n-layer", "--residual", "--doc-mask", "--lr", "--schedule", "--resume"):
        assert flag in out
    assert "gated" in out and "wsd" in out  # defaults are shown


def test_help_names_every_preset_file():
    """--preset's help lists presets/*.conf as the binary has them compiled in, none by hand."""
    line = next(line for line in run(["-h"]).stdout.splitlines() if line.lstrip().startswith("--preset"))
    listed = line.split("model preset: ")[1].split(";")[0].split(", ")
    files = sorted(f[:-len(".conf")] for f in os.listdir(os.path.join(ROOT, "presets")) if f.endswith(".conf"))
    assert listed == files, line


@pytest.mark.parametrize("args, message", [
    (["--no-such-flag", "1"], "unknown option '--no-such-flag'"),
    (["--n-layer", "abc"], "option --n-layer: 'abc' is not an integer"),
    (["--batch-size", "4294967297"], "option --batch-size: 4294967297 is out of range"),  # once wrapped to 1
    (["--steps", "1e3"], "option --steps: '1e3' is not an integer"),
    (["--seed", "-1"], "option --seed: '-1' is not a non-negative integer"),
    (["--lr", "nan"], "option --lr: 'nan' is not a finite number"),
    (["--residual", "sideways", "--train-data", "x"], "--residual"),
    (["--preset", "huge"], "unknown preset 'huge'"),
    (["--n-embd", "60", "--n-head", "8", "--train-data", "x"], "multiple of --n-head"),
    (["--train-data", "/nonexistent/*.bin"], "/nonexistent/*.bin"),
    (["--cudnn", "1", "--doc-mask", "0", "--train-data", "x"], "--cudnn 1: this build has no cuDNN attention"),  # host builds never do
    # cuDNN has no same-document mask: refused at start whatever the build, never logged as a cuDNN run
    (["--cudnn", "1", "--train-data", "x"], "--cudnn 1: cuDNN attention has no same-document mask, and this model has --doc-mask 1"),
    (["--cudnn", "1", "--doc-mask", "0", "--n-embd", "60", "--n-head", "6", "--train-data", "x"],
     "--cudnn 1: cuDNN attention takes head dims that are multiples of 8; this model's is 10"),
    (["--beta1", "1.5", "--train-data", "x"], "--beta1 must be in [0, 1), got 1.5"),
    (["--beta2", "1", "--train-data", "x"], "--beta2 must be in [0, 1), got 1"),
    (["--eps", "0", "--train-data", "x"], "--eps must be > 0, got 0"),
    (["--weight-decay", "-0.1", "--train-data", "x"], "--weight-decay must be >= 0"),
    (["--grad-clip", "-1", "--train-data", "x"], "--grad-clip must be >= 0"),
    (["--ns-steps", "1000000", "--train-data", "x"], "--ns-steps must be in [0, 100], got 1000000"),
    (["--warmup-frac", "1.5", "--train-data", "x"], "--warmup-frac must be in [0, 1], got 1.5"),
    (["--final-frac", "-0.5", "--train-data", "x"], "--final-frac must be in [0, 1], got -0.5"),
    (["--attention-kernels", "fast", "--train-data", "x"], "--attention-kernels"),
])
def test_bad_options_fail_clearly(args, message):
    proc = run(args, check=False)
    assert proc.returncode != 0
    assert message in proc.stderr


@pytest.mark.parametrize("typed, meant", [("--stpes", "--steps"), ("--learning-rat", None), ("--lr-othr", "--lr-other"),
                                          ("--batch_size", "--batch-size"), ("--no-such-flag", None), ("--lx", "--lr")])
def test_unknown_option_suggests_the_nearest(typed, meant):
    """An unknown option names the flag within two edits (a swap of neighbours is one), when one
    flag is nearest and the name is long enough for the guess to mean something."""
    proc = run([typed, "1"], check=False)
    assert proc.returncode != 0 and f"unknown option '{typed}'" in proc.stderr
    if meant:
        assert f"(did you mean {meant}?)" in proc.stderr, proc.stderr
    else:
        assert "did you mean" not in proc.stderr, proc.stderr


@pytest.mark.parametrize("threads", ["abc", "0", "2x", "257", " 2"])
def test_bad_host_thread_count_fails_clearly(data, tmp_path, threads):
    """HOSTCUDA_THREADS that is not a count of 1 to 256 stops the first launch (it once read
    'abc' as one worker and '2x' as two)."""
    env = dict(os.environ, HOSTCUDA_THREADS=threads)
    proc = run_binary(BIN, common(data, tmp_path) + ["--steps", "1"], check=False, env=env)
    assert proc.returncode != 0
    assert f"HOSTCUDA_THREADS='{threads}': expected a number of worker threads from 1 to 256" in proc.stderr


def test_bad_host_gemm_is_refused(data, tmp_path):
    env = dict(os.environ, HOSTCUDA_GEMM="mkl")
    proc = run_binary(BIN, common(data, tmp_path) + ["--steps", "1"], check=False, env=env)
    assert proc.returncode != 0
    assert "HOSTCUDA_GEMM='mkl': expected 'own', 'openblas' or 'onednn'" in proc.stderr


@pytest.mark.parametrize("gemm", ["own", "openblas", "onednn"])
def test_results_do_not_depend_on_worker_threads(data, tmp_path, gemm):
    """Two steps with 1 and with 2 host-backend workers write byte-identical checkpoints: every
    kernel and every host GEMM splits its work the same way whatever the number of workers.
    The sizes give the GEMMs several tiles and the classifier many rows (work for both)."""
    finals = []
    for threads in ("1", "2"):
        out = tmp_path / threads
        out.mkdir()
        env = dict(os.environ, HOSTCUDA_THREADS=threads, HOSTCUDA_GEMM=gemm)
        proc = run_binary(BIN, common(data, out) + ["--steps", "2", "--val-every", "0", "--batch-size", "8",
                                                    "--vocab-size", "3000", "--n-embd", "128", "--n-head", "4",
                                                    "--n-kv-head", "2"], check=False, env=env)
        if f"HOSTCUDA_GEMM={gemm}: this build has no" in proc.stderr:
            pytest.skip(f"built without {gemm}")
        assert proc.returncode == 0, proc.stderr
        finals.append(out / "final.bin")
    assert state_differences(*finals) == []


def test_loss_falls(data, tmp_path):
    out = run(common(data, tmp_path) + ["--steps", "30", "--val-every", "0", "--schedule", "constant"]).stdout
    losses = step_losses(out)
    assert len(losses) >= 2
    assert losses[-1] < losses[0] - 1.0, out


@pytest.mark.parametrize("optimizer", [("--optimizer", "adamw", "--lr", "3e-3"), ("--optimizer", "muon"),
                                       ("--optimizer", "muon", "--muon-order", "paper")])
def test_resume_is_exact(data, tmp_path, optimizer):
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    straight.mkdir()
    resumed.mkdir()
    run(common(data, straight, optimizer) + ["--steps", "8", "--save-every", "4"])
    # as if the run had been killed after step 4: resume from its step-4 checkpoint
    run(common(data, resumed, optimizer) + ["--steps", "8", "--resume", str(straight / "step_4.bin")])
    assert state_differences((straight / "final.bin"), (resumed / "final.bin")) == []


def test_default_optimizer_is_muon(data, tmp_path):
    out = run(common(data, tmp_path, ()) + ["--steps", "1"]).stdout
    # tiny at its own vocabulary is not the swept model (dev/test/test_presets.py): the paper's SAN lock
    assert "optimizer: muon (keller order" in out and "lr 0.02," in out and "(default rates of the SAN paper's SAN arm)" in out


def test_corrupt_checkpoint_is_refused(data, tmp_path):
    run(common(data, tmp_path) + ["--steps", "2"])
    path = tmp_path / "final.bin"
    blob = path.read_bytes()
    (tmp_path / "truncated.bin").write_bytes(blob[: len(blob) // 2])
    proc = run(common(data, tmp_path) + ["--steps", "4", "--resume", str(tmp_path / "truncated.bin")], check=False)
    assert proc.returncode != 0 and "truncated.bin" in proc.stderr
    (tmp_path / "badmagic.bin").write_bytes(b"NOTATTN!" + blob[8:])
    proc = run(common(data, tmp_path) + ["--steps", "4", "--resume", str(tmp_path / "badmagic.bin")], check=False)
    assert proc.returncode != 0 and "magic" in proc.stderr


def progress(out):
    """(loss, grad norm) of every progress line."""
    rows = [line.split("|") for line in out.splitlines() if line.startswith("step ") and "|" in line]
    return [(float(r[1].split()[1]), float(r[3].split()[1])) for r in rows]


def test_grad_accumulation_matches_the_larger_batch(data, tmp_path):
    """8 rows in one micro-batch and 2 x 4 rows read the same windows; with every target
    counted (no document mask) each micro-batch's mean and the accumulation by 1/2 give the
    same gradient, so the first step's loss and gradient norm agree up to rounding (a
    missing 1/grad_accum would double the norm; Adam itself would hide it in the loss)."""
    base = common(data, tmp_path) + ["--doc-mask", "0", "--steps", "2", "--shuffle", "0", "--val-data", "",
                                     "--overwrite", "1"]  # (both runs write final.bin into tmp_path)
    one = progress(run(base + ["--batch-size", "8", "--grad-accum", "1"]).stdout)
    two = progress(run(base + ["--batch-size", "4", "--grad-accum", "2"]).stdout)
    assert len(one) == len(two) == 2
    for (loss_a, norm_a), (loss_b, norm_b) in zip(one, two):
        assert abs(loss_a - loss_b) <= 2e-3 * loss_a
        assert abs(norm_a - norm_b) <= 2e-2 * norm_a


def test_checkpoint_dir_is_created_up_front(data, tmp_path):
    (tmp_path / "file").write_text("x")
    proc = run(common(data, tmp_path / "file" / "dir") + ["--steps", "1"], check=False)  # under a file
    assert proc.returncode != 0 and "cannot create" in proc.stderr
    assert not any(line.startswith("step ") for line in proc.stdout.splitlines())  # failed before training
    proc = run(common(data, tmp_path / "made" / "with" / "parents") + ["--steps", "1"])  # mkdir -p
    assert (tmp_path / "made" / "with" / "parents" / "final.bin").exists(), proc.stdout
    proc = run(common(data, tmp_path / "file") + ["--steps", "1"], check=False)
    assert proc.returncode != 0 and "is not a directory" in proc.stderr


def test_reference_reads_the_trainers_checkpoint(data, tmp_path):
    """The CUDA trainer's checkpoint, evaluated by train_san.py, gives the validation loss
    the trainer printed (one validation batch: both average over its counted targets)."""
    out = run(common(data, tmp_path) + ["--steps", "5", "--val-batches", "1"]).stdout
    cuda_val = float([l for l in out.splitlines() if l.startswith("step 5: val loss")][0].split()[4])
    ref = reference("train_san.py", ["--load-checkpoint", tmp_path / "final.bin", "--val-data", data / "toy_val_*.bin",
                                     "--val-batches", "1", "--batch-size", "4", "--device", "cpu"])
    assert ref.returncode == 0, ref.stderr
    ref_val = float([l for l in ref.stdout.splitlines() if l.startswith("val loss")][-1].split()[2])
    # the trainer ran in floatX (bf16 activations in the default build); the reference in fp32
    assert abs(cuda_val - ref_val) <= 5e-3 * ref_val, (cuda_val, ref_val)


def logged_lrs(path):
    """{step: lr} of a JSONL run log's step records."""
    import json
    return {r["step"]: r["lr"] for r in map(json.loads, path.read_text().splitlines()) if "lr" in r and "loss" in r}


def checkpoint_meta(path):
    from attnref.container import KIND_CHECKPOINT, read_container
    return read_container(path, KIND_CHECKPOINT)[1]


def test_schedule_steps_set_the_horizon(data, tmp_path):
    """--schedule-steps 12 on a 6-step run (doc/san-model.md "Schedules"): the logged rates are
    the cosine over 12 steps, written out here (at step 6 the rate is 0.81x peak, not the final
    0.1x), and the reference's; the horizon is saved, a resume that changes it is refused (also
    from a file without one), one that leaves it continues at the same rates, and --extend-to
    keeps the horizon, past which the last rate holds."""
    import math
    from attnref.optim import lr_multiplier
    lr, H, W, final = 3e-3, 12, 2, 0.1
    expect = {s + 1: lr * (s / W if s < W else final + (1 - final) * 0.5 * (1 + math.cos(math.pi * (s - W) / (H - W))))
              for s in range(H)}
    flags = ["--val-data", "", "--schedule", "cosine", "--warmup-frac", str(W / H), "--final-frac", str(final)]
    straight = tmp_path / "straight"
    run(common(data, straight) + flags + ["--schedule-steps", str(H), "--steps", "6", "--save-every", "3",
                                          "--log", str(straight / "log.jsonl")])
    got = logged_lrs(straight / "log.jsonl")
    assert sorted(got) == [1, 2, 3, 4, 5, 6]
    for step, rate in got.items():
        assert rate == pytest.approx(expect[step], rel=1e-6), (step, rate, expect[step])
        ref = lr * lr_multiplier(step - 1, 6, "cosine", W / H, 0.15, final, horizon=H)
        assert rate == pytest.approx(ref, rel=1e-6)
    assert got[6] / lr == pytest.approx(0.1 + 0.45 * (1 + math.cos(0.3 * math.pi)), abs=1e-6)  # p = 3 / 10: 0.81
    assert checkpoint_meta(straight / "final.bin")["opt.schedule_steps"] == "12"
    # a resume that changes the horizon is refused by name; one that keeps it continues alike
    proc = run(["--resume", str(straight / "step_3.bin"), "--schedule-steps", "20", "--checkpoint-dir",
                str(tmp_path / "no")], check=False)
    assert proc.returncode != 0 and "--schedule-steps (schedule_steps 20; the saved run's 12)" in proc.stderr, proc.stderr
    resumed = tmp_path / "resumed"
    run(["--resume", str(straight / "step_3.bin"), "--checkpoint-dir", str(resumed), "--log", str(resumed / "log.jsonl")])
    assert logged_lrs(resumed / "log.jsonl") == {s: got[s] for s in (4, 5, 6)}
    # --extend-to keeps the horizon: the cosine goes on to step 12, then holds its last rate
    extended = tmp_path / "extended"
    proc = run(["--resume", str(straight / "final.bin"), "--extend-to", "14", "--checkpoint-dir", str(extended),
                "--log", str(extended / "log.jsonl")])
    assert "keeps its horizon of 12 steps" in proc.stdout, proc.stdout
    more = logged_lrs(extended / "log.jsonl")
    assert sorted(more) == list(range(7, 15))
    for step, rate in more.items():
        assert rate == pytest.approx(expect[min(step, H)], rel=1e-6), (step, rate)
    # a run over its own steps writes no horizon (its file is the one it wrote before the key),
    # and a resume of it that gives one is refused
    plain = tmp_path / "plain"
    run(common(data, plain) + flags + ["--steps", "4", "--save-every", "2"])
    assert "opt.schedule_steps" not in checkpoint_meta(plain / "final.bin")
    proc = run(["--resume", str(plain / "step_2.bin"), "--schedule-steps", "12", "--checkpoint-dir",
                str(tmp_path / "no")], check=False)
    assert proc.returncode != 0 and "--schedule-steps (schedule_steps 12; the saved run's 0)" in proc.stderr, proc.stderr


@pytest.mark.parametrize("args, message", [
    (["--schedule-steps", "-1"], "--schedule-steps must be >= 0"),
    (["--schedule-steps", "10", "--steps", "20", "--warmup-frac", "0.6", "--decay-frac", "0.6"],
     "exceed the 10 steps of the schedule (--schedule-steps)"),
])
def test_bad_schedule_steps_fail_clearly(data, tmp_path, args, message):
    proc = run(common(data, tmp_path) + args, check=False)
    assert proc.returncode != 0 and message in proc.stderr, proc.stderr


SMALL = ["--vocab-size", "250", "--max-seq-len", "64", "--n-layer", "2", "--n-embd", "64", "--n-head", "4",
         "--n-kv-head", "4", "--d-ff", "128"]  # a SAN-paper preset at the tiny model's size


@pytest.mark.parametrize("preset", ["san20", "ffn20", "ffn4", "ffn9"])
def test_paper_preset_without_paper_setup_warns(data, tmp_path, preset):
    """A SAN-paper preset trained without --paper-setup 1 runs keller-order Muon at the paper's
    rates (tuned for its paper-order Muon): one warning line naming the flag. None with the
    setup, with the order given as the paper's, or for the other presets."""
    base = ["--preset", preset, "--train-data", str(data / "toy_train_*.bin"), "--val-data", "", "--batch-size", "4",
            "--sample-tokens", "0", "--steps", "1"] + SMALL
    warning = f"warning: --preset {preset} without --paper-setup 1: keller-order Muon at the SAN paper's rates"
    out = run(base).stdout
    lines = [l for l in out.splitlines() if l.startswith("warning: --preset")]
    assert len(lines) == 1 and lines[0].startswith(warning) and "--paper-setup 1 trains the paper's recipe" in lines[0], out
    for more in (["--paper-setup", "1", "--global-batch", "4", "--lr-scale-gpus", "1", "--milestones", "0"],
                 ["--muon-order", "paper"]):
        assert "warning: --preset" not in run(base + more).stdout
    assert "warning: --preset" not in run(base[2:] + ["--preset", "tiny"]).stdout
    # the reference (train_san.py) warns for the same flags with the same line
    import train_san
    for more in ([], ["--paper-setup", "1", "--global-batch", "4", "--lr-scale-gpus", "1"], ["--muon-order", "paper"],
                 ["--optimizer", "adamw"]):
        milestones = ["--milestones", "0"] if "--paper-setup" in more else []   # (the reference saves none)
        binary = [l for l in run(base + more + milestones).stdout.splitlines() if l.startswith("warning: --preset")]
        assert [w for w in [train_san.paper_preset_warning(train_san.parse_args(base + more))] if w] == binary, more


def test_val_whole_docs_2_validates_on_both(data, tmp_path):
    """--val-whole-docs 2 (studies/san_paper.toml): the headline validation stays on windows and
    the same validation on whole documents is logged beside it ("whole_docs"): each equal to the
    run that validates on that alone, training untouched."""
    import json
    logs = {}
    for mode in (0, 1, 2):
        path = tmp_path / f"log{mode}.jsonl"
        out = run(common(data, tmp_path / f"run{mode}") + ["--steps", "2", "--val-every", "1", "--val-whole-docs",
                                                           str(mode), "--log", str(path)]).stdout
        logs[mode] = [json.loads(l) for l in path.read_text().splitlines()]
        if mode == 2:
            assert "validation (also, beside the windows): whole documents" in out, out
            assert "(whole documents) step 2: val loss" in out, out
    val = {m: [r for r in logs[m] if "val_loss" in r] for m in logs}
    assert [r["step"] for r in val[2]] == [1, 2] and all("whole_docs" not in r for r in val[0] + val[1])
    for both, windows, docs in zip(val[2], val[0], val[1]):
        assert both["val_loss"] == windows["val_loss"] and both["val_tokens"] == windows["val_tokens"]
        assert both["whole_docs"]["val_loss"] == docs["val_loss"] and both["whole_docs"]["val_tokens"] == docs["val_tokens"]
    assert val[0][0]["val_tokens"] != val[1][0]["val_tokens"]  # (two different validations)
    train = {m: [r["loss"] for r in logs[m] if "loss" in r] for m in logs}
    assert train[0] == train[1] == train[2]
    proc = run(common(data, tmp_path) + ["--val-whole-docs", "3"], check=False)
    assert proc.returncode != 0 and "--val-whole-docs must be 0, 1 or 2, got 3" in proc.stderr


FP32_BIN = os.environ.get("TRAIN_SAN_FP32_BIN")


@pytest.mark.skipif(not FP32_BIN or not os.path.exists(os.path.join(ROOT, FP32_BIN or "")),
                    reason="TRAIN_SAN_FP32_BIN not set (make test sets it)")
def test_a_checkpoint_of_the_other_precision_is_no_resume(data, tmp_path):
    """A bf16 build's checkpoint (run.precision=bf16) resumed by the fp32 build is refused by name
    unless --resume-override 1 (then the change is printed); --init-from notes it in one line; the
    same build resumes it silently."""
    run(common(data, tmp_path) + ["--steps", "4", "--save-every", "2"])
    step2 = str(tmp_path / "step_2.bin")
    other = subprocess.run([os.path.join(ROOT, FP32_BIN), "--resume", step2, "--checkpoint-dir", str(tmp_path / "a")],
                           cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert other.returncode != 0 and "trained by a bf16 build and this one is fp32" in other.stderr, other.stderr
    forced = run_binary(FP32_BIN, ["--resume", step2, "--resume-override", "1", "--checkpoint-dir", tmp_path / "b"])
    assert "resume: --resume-override 1: precision fp32 (the saved run's bf16)" in forced.stdout
    init = run_binary(FP32_BIN, ["--steps", "0", "--init-from", step2, "--val-data", str(data / "toy_val_*.bin"),
                                 "--sample-tokens", "0"])
    assert f"note: {step2} was written by a bf16 build; this fp32 build starts from its values" in init.stdout
    same = run(["--resume", step2, "--checkpoint-dir", tmp_path / "c"])
    assert "precision" not in same.stdout


def profiled_kernels(stderr):
    """The kernels of the host backend's profile (HOSTCUDA_PROFILE=1: seconds, share, launches,
    kernel), as launched (`attention_forward_kernel<HD, Tile>`)."""
    return {line.split(None, 3)[3] for line in stderr.splitlines() if "%" in line and len(line.split(None, 3)) == 4}


@pytest.mark.parametrize("kernels, banner, kernel_name", [
    ("tensor-cores", "tensor-cores attention kernels", "attention_forward_tc_kernel"),
    ("scalar", "scalar attention kernels", "attention_forward_kernel"),
])
def test_attention_kernels_switch_takes_the_path_it_names(data, tmp_path, kernels, banner, kernel_name):
    """--attention-kernels (a GPU user's way back from the tensor-core kernels) changes the
    kernels the run launches (the host backend's profile), and the banner and the log's run
    record say which (bf16 build: fp32 builds always run the scalar ones)."""
    import json
    log = tmp_path / "log.jsonl"
    proc = run_binary(BIN, common(data, tmp_path) + ["--steps", "1", "--val-every", "0", "--attention-kernels", kernels,
                                              "--log", str(log)], check=True, env={**os.environ, "HOSTCUDA_PROFILE": "1"})
    if "(host backend, bf16," not in proc.stdout:
        pytest.skip("a bf16 build decides between the two")
    assert banner in proc.stdout, proc.stdout
    profiled = {kernel.split("<")[0] for kernel in profiled_kernels(proc.stderr)}
    assert kernel_name in profiled, proc.stderr
    other = "attention_forward_kernel" if kernels == "tensor-cores" else "attention_forward_tc_kernel"
    assert other not in profiled, proc.stderr
    run_record = json.loads(log.read_text().splitlines()[0])
    assert run_record["run"]["attention_kernels"] == kernels and run_record["run"]["precision"] == "bf16"


def test_tensor_core_backward_needs_no_block_order(data, tmp_path):
    """The tensor-core backward's blocks wait for one another (the dq turns): with the blocks
    taken last first on one worker (HOSTCUDA_BLOCK_ORDER=reverse, HOSTCUDA_THREADS=1) the run
    ends, and with the same loss, as a GPU that dispatches blocks in any order needs; waiting on
    lower blockIdx instead hangs there."""
    args = common(data, tmp_path) + ["--steps", "2", "--val-every", "0", "--attention-kernels", "tensor-cores",
                                     "--max-seq-len", "256", "--doc-mask", "0",  # 4 key blocks, each after the last
                                     "--overwrite", "1"]  # (the three runs share the directory)
    env = {**os.environ, "HOSTCUDA_THREADS": "1"}
    forward = run_binary(BIN, args, check=True, env=env)
    if "(host backend, bf16," not in forward.stdout:
        pytest.skip("a bf16 build runs the tensor-core kernels")
    reverse = run_binary(BIN, args, check=True, env={**env, "HOSTCUDA_BLOCK_ORDER": "reverse"}, timeout=60)
    assert step_losses(reverse.stdout) == step_losses(forward.stdout)
    bad = run_binary(BIN, args, check=False, env={**env, "HOSTCUDA_BLOCK_ORDER": "sideways"})
    assert bad.returncode != 0 and "HOSTCUDA_BLOCK_ORDER='sideways'" in bad.stderr, bad.stderr


HEAD_DIM_128 = ["--n-embd", "256", "--n-head", "2", "--n-kv-head", "1", "--steps", "1", "--val-every", "0"]


@pytest.mark.parametrize("device, why", [
    # 99 KiB a block: the tensor-core backward's 64-row tiles at hd 128 do not fit
    ("sm_86", r"the tensor-core kernels need (\d+) B of shared memory per block; the device \(sm_86\) allows 101376"),
    # no bf16 mma.sync (and 64 KiB a block: the scalar kernels take 32-row tiles at hd 128)
    ("sm_75", r"the device is sm_75; the tensor-core kernels need sm_80 or newer \(bf16 mma.sync\)"),
])
def test_attention_kernels_follow_the_devices_limits(data, tmp_path, device, why):
    """On a device that cannot run the tensor-core attention (HOSTCUDA_DEVICE: the host backend
    reports that GPU's compute capability and shared memory), a run that asks for it runs the
    scalar kernels, says why once, names them in the banner and the log, and trains exactly as
    a run on the scalar kernels does. Without the check the tensor-core kernels' launch fails
    (sm_86: cudaFuncSetAttribute above the device's limit) or their mma.sync stops (sm_75)."""
    import json
    import re
    log = tmp_path / "log.jsonl"
    (tmp_path / "device").mkdir()
    (tmp_path / "scalar").mkdir()
    env = {**os.environ, "HOSTCUDA_PROFILE": "1", "HOSTCUDA_DEVICE": device}
    proc = run_binary(BIN, common(data, tmp_path / "device") + HEAD_DIM_128 + [
        "--attention-kernels", "tensor-cores", "--log", str(log)], check=False, env=env)
    if "--attention-kernels tensor-cores: the tensor-core attention needs a bf16 build" in proc.stderr:
        pytest.skip("a bf16 build decides between the two")
    assert proc.returncode == 0, proc.stderr
    note = re.search(r"attention: falling back to the scalar kernels \((.*); hd 128\)", proc.stderr)
    assert note and re.fullmatch(why, note.group(1)), proc.stderr
    if device == "sm_86":
        assert int(re.fullmatch(why, note.group(1)).group(1)) > 101376
    assert proc.stderr.count("falling back to the scalar kernels") == 1, proc.stderr
    assert "scalar attention kernels" in proc.stdout, proc.stdout
    assert json.loads(log.read_text().splitlines()[0])["run"]["attention_kernels"] == "scalar"
    # (on sm_75 the scalar dk/dv kernel's 64-row tiles would need 66,304 B at hd 128, over the 64 KiB
    # a block may have there: it runs 32-row tiles, and the comparison below says they are exact)
    kernels = {k.split("<")[0] for k in profiled_kernels(proc.stderr)}
    assert not any("_tc_kernel" in k for k in kernels), kernels
    assert {"attention_forward_kernel", "attention_backward_dq_kernel", "attention_backward_dkdv_kernel"} <= kernels
    reference = run_binary(BIN, common(data, tmp_path / "scalar") + HEAD_DIM_128 + ["--attention-kernels", "scalar"])
    assert "falling back" not in reference.stderr
    assert state_differences(tmp_path / "device" / "final.bin", tmp_path / "scalar" / "final.bin") == []


def test_attention_kernels_at_head_dim_128_on_an_sm_90(data, tmp_path):
    """The control of the test above: the default device (an sm_90's limits) runs the tensor-core
    kernels at hd 128, without a note, and they train differently from the scalar ones (bf16
    rounding of P and dS), so the bit-for-bit comparison above can tell the two apart."""
    (tmp_path / "tc").mkdir()
    (tmp_path / "scalar").mkdir()
    env = {k: v for k, v in os.environ.items() if k != "HOSTCUDA_DEVICE"}
    proc = run_binary(BIN, common(data, tmp_path / "tc") + HEAD_DIM_128 + ["--attention-kernels", "tensor-cores"],
                      check=False, env={**env, "HOSTCUDA_PROFILE": "1"})
    if "--attention-kernels tensor-cores: the tensor-core attention needs a bf16 build" in proc.stderr:
        pytest.skip("a bf16 build decides between the two")
    assert proc.returncode == 0, proc.stderr
    assert "falling back" not in proc.stderr and "tensor-cores attention kernels" in proc.stdout
    assert "attention_backward_tc_kernel<HD>" in profiled_kernels(proc.stderr), proc.stderr
    run_binary(BIN, common(data, tmp_path / "scalar") + HEAD_DIM_128 + ["--attention-kernels", "scalar"], env=env)
    assert state_differences(tmp_path / "tc" / "final.bin", tmp_path / "scalar" / "final.bin") != []


def test_an_unknown_emulated_device_is_refused(data, tmp_path):
    proc = run_binary(BIN, common(data, tmp_path) + ["--steps", "1"], check=False,
                      env={**os.environ, "HOSTCUDA_DEVICE": "sm_99"})
    assert proc.returncode != 0 and "HOSTCUDA_DEVICE='sm_99': expected one of sm_75, sm_80" in proc.stderr, proc.stderr


def test_sync_check_is_announced(data, tmp_path):
    """--sync-check 1 (every launch waited for, a fault named by kernel) says it is on."""
    out = run(common(data, tmp_path) + ["--steps", "1", "--val-every", "0", "--sync-check", "1"]).stdout
    assert "sync check: on" in out, out


def test_a_preset_off_its_swept_vocabulary_or_shape_says_which_rates_it_trains_at(data, tmp_path):
    """presets/tiny.conf's tuned rates were swept at V 8192: at its own shape and that vocabulary
    they are the defaults and nothing is said; at another vocabulary or shape one note names the
    tuned rates, why they do not apply and the SAN paper's rates used instead; with --lr given, none."""
    from attnref import presets
    tuned = next(s for s in presets.load_presets()["tiny"].swept if s.ffn == "none")
    paper = presets.read_rates("san-paper", "san")
    base = ["--preset", "tiny", "--train-data", str(data / "toy_train_*.bin"), "--val-data", "", "--batch-size", "4",
            "--sample-tokens", "0", "--steps", "1"]

    def notes(*more):
        out = run(base + list(more) + ["--run-dir", str(tmp_path / f"r{len(os.listdir(tmp_path))}")]).stdout
        return [line for line in out.splitlines() if line.startswith("note: --preset")]
    assert notes("--vocab-size", str(tuned.vocab_size)) == []
    head = (f"note: --preset tiny's tuned rates (muon {tuned.muon:g}, other {tuned.muon_other:g}; adamw {tuned.adamw:g}) "
            f"are for its own shape at vocabulary {tuned.vocab_size}; this run has ")
    tail = (f", so it trains at the rates of {paper.source}: muon {paper.muon:g}, other {paper.muon_other:g} "
            "(--lr / --lr-other set them)")
    assert notes("--vocab-size", "4096") == [head + "vocabulary 4096" + tail]
    assert notes("--vocab-size", str(tuned.vocab_size), "--n-layer", "3") == [head + "another shape" + tail]
    assert notes("--vocab-size", "4096", "--lr", "0.01") == []
    # an evaluation of such a model trains at no rate: no note
    trained = sorted(tmp_path.iterdir())[1] / "final.bin"  # (r1: the --vocab-size 4096 run)
    assert notes("--steps", "0", "--init-from", str(trained), "--vocab-size", "4096", "--train-data", "",
                 "--val-data", str(data / "toy_val_*.bin"),
                 "--val-batches", "1") == []
