"""Runs that describe themselves (issue 28), for both trainers: a run without output flags
leaves a run directory (config, log.jsonl, final.bin, samples.txt); its config, read back with
--config, repeats the run; the log starts with a header record whose fields every checkpoint
holds as run.* keys; --print-config writes nothing; --resume DIR / auto, --keep-last; an
evaluation logs the checkpoint's step and prints no optimizer.

Each trainer run is a tiny model for a few steps on the toy corpus, from a temporary working
directory (a run directory goes to ./runs); the file takes about 20 s on 2 cores."""
import json
import os
import re
import shlex
import subprocess

import pytest

from trainer_cli import ROOT, run_binary, state_differences, write_pattern_corpus
from attnref.container import read_container


SAN = os.environ.get("TRAIN_SAN_BIN")
GPT2 = os.environ.get("TRAIN_GPT2_BIN") or (SAN and os.path.join(os.path.dirname(SAN), "train_gpt2"))
pytestmark = pytest.mark.skipif(not SAN, reason="TRAIN_SAN_BIN not set (make test sets it)")


def binary(trainer):
    path = os.path.join(ROOT, SAN if trainer == "san" else GPT2)
    if not os.path.exists(path):
        pytest.skip(f"{path} not built")
    return path


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_pattern_corpus(tmp_path_factory.mktemp("data"), {"toy_train_000000": 80, "toy_val_000000": 10})


def flags(data, *more):
    return ["--preset", "tiny", "--train-data", data / "toy_train_*.bin", "--val-data", data / "toy_val_*.bin",
            "--batch-size", 2, "--seq-len", 16, "--steps", 4, "--val-every", 2, "--val-batches", 1,
            "--sample-every", 2, "--sample-tokens", 4] + list(more)


def run_in(cwd, trainer, args, check=True):
    """The trainer run from `cwd`, with no --run-dir unless `args` give one (the default's run)."""
    args = [str(a) for a in args]
    if not any(a.startswith("--run-dir") for a in args):
        args = args + ["--run-dir", "auto"]  # (run_binary would pass --run-dir '')
    return run_binary(binary(trainer), args, check=check, cwd=cwd)


def run_dirs(cwd):
    runs = cwd / "runs"
    return sorted(runs.iterdir()) if runs.is_dir() else []


def log_records(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def config_settings(path):
    """{key: value text} of a run directory's config (comments left out)."""
    out = {}
    for line in path.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            key, value = (part.strip() for part in line.split("=", 1))
            out[key] = json.loads(value) if value.startswith('"') else value
    return out


@pytest.mark.parametrize("trainer", ["san", "gpt2"])
def test_a_run_without_output_flags_leaves_a_run_directory(data, tmp_path, trainer):
    out = run_in(tmp_path, trainer, flags(data)).stdout
    (run,) = run_dirs(tmp_path)
    arm = "san" if trainer == "san" else "gpt2"
    assert re.fullmatch(rf"tiny-{arm}-\d{{8}}T\d{{6}}Z", run.name), run.name
    assert sorted(p.name for p in run.iterdir()) == ["config", "final.bin", "log.jsonl", "samples.txt"]
    assert f"run directory: runs/{run.name} (config, log.jsonl, checkpoints, samples.txt)" in out
    assert f"run directory: runs/{run.name}: config, final.bin, log.jsonl, samples.txt" in out
    records = log_records(run / "log.jsonl")
    header = records[0]["run"]
    # the samples: one line per sample the log holds, at its step
    samples = [r for r in records if "sample" in r]
    lines = (run / "samples.txt").read_text().splitlines()
    assert [int(l.split(":")[0].split()[1]) for l in lines] == [r["step"] for r in samples] == [2, 4]
    # the header: the command, every flag's value as given or defaulted, the rates of the banner
    assert header["program"] == f"train_{trainer}" and header["ranks"] == 1
    assert shlex.split(header["command"])[1:] == [str(a) for a in flags(data)] + ["--run-dir", "auto"]
    config = header["config"]
    assert config["steps"] == "4" and config["seq-len"] == "16" and config["train-data"] == str(data / "toy_train_*.bin")
    assert config == config_settings(run / "config")
    banner_lr = re.search(r"^optimizer: (\w+) .*?lr ([0-9.e-]+)", out, re.M)
    assert header["rates"]["optimizer"] == banner_lr.group(1)
    assert header["rates"]["lr"] == pytest.approx(float(banner_lr.group(2)), rel=1e-6)
    assert float(config["lr"]) == header["rates"]["lr"]
    params = re.search(r"^parameters: (\d+) total, (\d+) non-embedding", out, re.M)
    assert (header["parameters"], header["non_embedding"]) == tuple(map(int, params.groups()))
    assert header["run_dir"] == f"runs/{run.name}" and re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", header["started"])
    # the commit the binary was built from: one this repository has (or unknown outside git)
    if header["git_commit"] != "unknown":
        assert subprocess.run(["git", "cat-file", "-e", header["git_commit"] + "^{commit}"], cwd=ROOT).returncode == 0
    assert isinstance(header["git_dirty"], bool)
    # the same record in the checkpoint, as run.* keys
    _, meta, _ = read_container(run / "final.bin")
    assert json.loads(meta["run.config"]) == config
    assert json.loads('"' + meta["run.command"] + '"') == header["command"]
    assert meta["run.git_commit"] == header["git_commit"] and meta["run.started"] == header["started"]
    assert meta["run.git_dirty"] == ("1" if header["git_dirty"] else "0")


@pytest.mark.parametrize("trainer", ["san", "gpt2"])
def test_the_config_of_a_run_repeats_it(data, tmp_path, trainer):
    """--config RUN/config: the same settings and the same trained state (same seed); a flag
    given on the command line wins over the file."""
    run_in(tmp_path, trainer, flags(data, "--lr", "0.003", "--seed", "7"))
    (first,) = run_dirs(tmp_path)
    run_in(tmp_path, trainer, ["--config", first / "config"])
    second = [d for d in run_dirs(tmp_path) if d != first][0]
    assert config_settings(second / "config") == config_settings(first / "config")
    assert state_differences(first / "final.bin", second / "final.bin") == []
    run_in(tmp_path, trainer, ["--config", first / "config", "--steps", "3"])
    third = [d for d in run_dirs(tmp_path) if d not in (first, second)][0]
    expected = dict(config_settings(first / "config"), steps="3")
    assert config_settings(third / "config") == expected
    # --config RUN (the directory): its config file, not an empty list of settings
    run_in(tmp_path, trainer, ["--config", first])
    fourth = [d for d in run_dirs(tmp_path) if d not in (first, second, third)][0]
    assert config_settings(fourth / "config") == config_settings(first / "config")


def test_config_file_errors_name_the_file_and_line(data, tmp_path):
    config = tmp_path / "bad.conf"
    config.write_text("# a comment\npreset = tiny\n\nstpes = 3\n")
    proc = run_in(tmp_path, "san", ["--config", config], check=False)
    assert proc.returncode == 1
    assert f"--config {config} line 4: unknown setting 'stpes' (did you mean --steps?)" in proc.stderr
    config.write_text("# the letter O for a zero\nsteps = 6O\n")
    proc = run_in(tmp_path, "san", ["--config", config], check=False)
    assert proc.returncode == 1 and f"option --steps: '6O' is not an integer (--config {config} line 2)" in proc.stderr
    config.write_text("steps 3\n")
    proc = run_in(tmp_path, "san", ["--config", config], check=False)
    assert proc.returncode == 1 and f"--config {config} line 1: expected `key = value`" in proc.stderr
    config.write_text('prompt = "unclosed\n')
    proc = run_in(tmp_path, "san", ["--config", config], check=False)
    assert proc.returncode == 1 and "has no closing quote" in proc.stderr
    proc = run_in(tmp_path, "san", ["--config", tmp_path / "missing.conf"], check=False)
    assert proc.returncode == 1 and "missing.conf: cannot read it" in proc.stderr
    (tmp_path / "empty_dir").mkdir()
    proc = run_in(tmp_path, "san", ["--config", tmp_path / "empty_dir"], check=False)
    assert proc.returncode == 1 and f"--config {tmp_path / 'empty_dir'} is a directory with no file `config`" in proc.stderr
    assert run_dirs(tmp_path) == []


def test_print_config_prints_the_resolved_run_and_writes_nothing(data, tmp_path):
    out = run_in(tmp_path, "san", flags(data, "--optimizer", "adamw", "--print-config", "1")).stdout
    assert run_dirs(tmp_path) == []
    printed = dict(re.findall(r"^([a-z0-9-]+) += (.*)$", out, re.M))
    assert printed["preset"] == "tiny" and printed["optimizer"] == "adamw" and printed["steps"] == "4"
    # the rate the preset's AdamW default resolves to, per group, as the optimizer banner says
    lr = re.search(r"^optimizer: adamw lr ([0-9.e-]+) \(other ([0-9.e-]+)\)", out, re.M).groups()
    assert f"rates: matrices {lr[0]} (adamw), embeddings/gains/gates/biases {lr[1]} (adamw)" in out
    assert float(printed["lr"]) == float(lr[0])
    assert re.search(r"^--train-data: 1 file, \d+ tokens \(.*toy_train_000000\.bin\)$", out, re.M), out
    assert "run directory: would be runs/tiny-san-" in out and "(--print-config writes nothing)" in out
    assert not any(l.startswith("step ") for l in out.splitlines())


def test_resume_a_run_directory_and_auto(data, tmp_path):
    """--resume DIR takes the newest checkpoint there (final.bin, else the step_N.bin of the
    most steps); --resume auto that of the run directory changed last; --keep-last keeps the
    newest step checkpoints; a fresh run into a directory that holds a run is refused."""
    run_in(tmp_path, "san", flags(data, "--steps", "6", "--save-every", "1", "--keep-last", "2"))
    (run,) = run_dirs(tmp_path)
    assert sorted(p.name for p in run.glob("*.bin")) == ["final.bin", "step_4.bin", "step_5.bin"]
    straight = tmp_path / "straight.bin"
    (run / "final.bin").rename(straight)
    out = run_in(tmp_path, "san", ["--resume", run]).stdout
    assert f"resume: {run}/step_5.bin (the newest checkpoint of {run})" in out
    assert state_differences(straight, run / "final.bin") == []
    (run / "final.bin").unlink()
    (run / "step_5.bin").unlink()
    out = run_in(tmp_path, "san", ["--resume", "auto"]).stdout
    assert "resume: runs/" + run.name + "/step_4.bin (the newest checkpoint of the run directory changed last" in out
    assert state_differences(straight, run / "final.bin") == []
    # the resumed runs appended to the run's log, each after its own header
    records = log_records(run / "log.jsonl")
    assert [i for i, r in enumerate(records) if "run" in r][1:] == [i - 1 for i, r in enumerate(records) if "resume" in r]
    proc = run_in(tmp_path, "san", flags(data, "--run-dir", run), check=False)
    assert proc.returncode == 1
    assert (f"--run-dir {run} holds a run already (log.jsonl, final.bin): continue it with: "
            f"{binary('san')} --resume {run};") in proc.stderr


def test_an_evaluation_logs_the_checkpoints_step_and_no_optimizer(data, tmp_path):
    run_in(tmp_path, "san", flags(data, "--optimizer", "adamw", "--run-dir", tmp_path / "trained"))
    ckpt = tmp_path / "trained" / "final.bin"
    proc = run_binary(binary("san"), ["--steps", 0, "--init-from", ckpt, "--val-data", data / "toy_val_*.bin",
                                      "--batch-size", 2, "--val-batches", 1, "--sample-tokens", 0,
                                      "--log", tmp_path / "eval.jsonl"])
    assert "optimizer" not in proc.stdout and "training:" not in proc.stdout, proc.stdout
    assert f"evaluation: the model of {ckpt} after 4 steps; no training" in proc.stdout
    header, *rest = log_records(tmp_path / "eval.jsonl")
    assert header["run"]["evaluation"] == {"checkpoint": str(ckpt), "step": 4} and "rates" not in header["run"]
    assert [r["step"] for r in rest if "val_loss" in r] == [4]


def test_extend_to_continues_as_a_run_directory_beside_the_saved_run(data, tmp_path):
    """--resume RUN --extend-to N: RUN-to-N holds the whole extended run (config, checkpoints, a
    log and samples that start as RUN's), the final lines name it, RUN stays byte for byte as it
    was, and a later --resume RUN points to the extension."""
    run_in(tmp_path, "san", flags(data, "--run-dir", "runs/r"))
    run = tmp_path / "runs" / "r"
    before = {p.name: p.read_bytes() for p in run.iterdir() if not p.name.startswith(".")}
    # (as a user types it: no --run-dir, which run_in and run_binary would add)
    proc = subprocess.run([binary("san"), "--resume", "runs/r", "--extend-to", "8"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    extended = tmp_path / "runs" / "r-to-8"
    assert {p.name: p.read_bytes() for p in run.iterdir() if not p.name.startswith(".")} == before
    assert {"config", "final.bin", "log.jsonl", "samples.txt"} <= {p.name for p in extended.iterdir()}
    assert proc.stdout.splitlines()[-1].startswith("run directory: runs/r-to-8: config, final.bin, log.jsonl")
    # the log: the saved run's records, then the extension's header, its resume record and steps 5..8
    records = log_records(extended / "log.jsonl")
    assert records[:len(log_records(run / "log.jsonl"))] == log_records(run / "log.jsonl")
    steps = [r["step"] for r in records if "loss" in r and "val_loss" not in r]
    assert steps == list(range(1, 9)), steps
    samples = (extended / "samples.txt").read_text()
    assert samples.startswith((run / "samples.txt").read_text()) and "step 8: " in samples
    refused = run_in(tmp_path, "san", ["--resume", "runs/r"], check=False)
    assert refused.returncode == 1 and "It was extended in runs/r-to-8 (--resume runs/r-to-8)" in refused.stderr


def test_an_evaluation_writes_no_run_directory_unless_asked(data, tmp_path):
    """--steps 0 --init-from CKPT trains nothing: it leaves no runs/<preset>-<arm>-<time> in the
    working directory (one in a read-only directory failed); --run-dir DIR still names one."""
    run_in(tmp_path, "san", flags(data, "--run-dir", tmp_path / "trained"))
    evaluate = ["--steps", 0, "--init-from", tmp_path / "trained" / "final.bin", "--val-data", data / "toy_val_*.bin",
                "--batch-size", 2, "--val-batches", 1, "--sample-tokens", 0]
    out = run_in(tmp_path, "san", evaluate).stdout
    assert run_dirs(tmp_path) == [] and "run directory" not in out, out
    out = run_in(tmp_path, "san", evaluate + ["--run-dir", tmp_path / "asked"]).stdout
    assert sorted(p.name for p in (tmp_path / "asked").iterdir()) == ["config", "log.jsonl"], out
