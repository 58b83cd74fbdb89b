"""Where a run writes (issue 41; the fp32 host train_san of TRAIN_SAN_FP32_BIN, which `make test`
sets; llmc/train/output_lock.h, llmc/train/resume.h check_saved_output_places).

- One writer per place: while a run trains, a second run into its --checkpoint-dir, or into
  another checkpoint directory but with its --log, is refused before writing anything, naming
  the first run's pid; the first run goes on and ends as it would have. Its lock files are gone
  once it has ended.
- A fresh run into a --checkpoint-dir that holds any checkpoint of an earlier run (a finished
  run's final.bin, a stopped or killed run's step_K.bin, a killed run's stale lock file beside it)
  is refused and leaves the files as they were, naming the directory, the command that continues
  the earlier run and --overwrite 1, with which it replaces them.
- A fresh run whose --log holds an earlier run's log (a rerun of a stopped demo: the same --log
  and --checkpoint-dir) is refused and leaves the files as they were, naming the log, the
  command that continues the earlier run from its checkpoint (which then works, going on in
  that log) and --overwrite 1, which replaces the log. An empty file is nobody's log.
- A resume from a copy of another run's checkpoint, whose saved run directory names a directory
  that holds some other run here, is refused (naming --run-dir) and leaves that run's files as
  they were (it used to overwrite its final.bin and prune its step files); given --run-dir it
  resumes there. A resume whose saved outputs have a '..' component is refused, even from its
  own directory.
Cost: 15 runs of a few tiny-preset steps, ~8 s on 2 cores."""
import json
import os
import shutil
import signal
import subprocess

import pytest

from trainer_cli import ROOT, run_binary, write_pattern_corpus

BIN = os.environ.get("TRAIN_SAN_FP32_BIN")
pytestmark = pytest.mark.skipif(not BIN, reason="TRAIN_SAN_FP32_BIN not set (make test sets it)")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_pattern_corpus(tmp_path_factory.mktemp("data"), {"toy_train_000000": 400})


def args(data, steps=4):
    return ["--preset", "tiny", "--train-data", data / "toy_train_*.bin", "--sample-tokens", "0", "--steps", steps]


def run(a, check=False, cwd=ROOT):
    return run_binary(BIN, a, check, cwd=cwd)


def snapshot(directory):
    """{name: bytes} of the files in a directory."""
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


def test_a_second_run_into_the_same_checkpoint_dir_or_log_is_refused(data, tmp_path):
    first_dir, first_log = tmp_path / "first", tmp_path / "first.jsonl"
    a = [str(x) for x in args(data, steps=100000) + ["--checkpoint-dir", first_dir, "--log", first_log, "--run-dir="]]
    first = subprocess.Popen([os.path.join(ROOT, BIN)] + a, cwd=ROOT, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        for line in first.stdout:
            if line.startswith("step "):
                break
        same_dir = run(args(data) + ["--checkpoint-dir", first_dir, "--log", tmp_path / "second.jsonl"])
        assert same_dir.returncode == 1
        assert f"--checkpoint-dir {first_dir} is in use by another run (pid {first.pid} on " in same_dir.stderr
        assert not (tmp_path / "second.jsonl").exists()  # refused before writing anything
        same_log = run(args(data) + ["--checkpoint-dir", tmp_path / "second", "--log", first_log])
        assert same_log.returncode == 1
        assert f"--log {first_log} is in use by another run (pid {first.pid} on " in same_log.stderr
    finally:
        first.send_signal(signal.SIGTERM)
        out, err = first.communicate(timeout=60)
    assert first.returncode == 143, err  # the first run saved and stopped as a signalled run does
    assert [p.name for p in first_dir.iterdir() if p.name.startswith(".")] == []  # its lock is gone
    assert not (tmp_path / ".first.jsonl.lock").exists()


def refused_into(data, directory, held):
    """A fresh run into `directory` (which holds the checkpoint `held`) is refused, naming the directory,
    the command that continues the earlier run and --overwrite 1, and leaves its files as they were (a
    killed run's stale lock file it takes, and removes, as any run there would)."""
    def kept(d):
        return {name: data for name, data in snapshot(d).items() if not name.startswith(".")}
    before = kept(directory)
    proc = run(args(data, steps=3) + ["--checkpoint-dir", directory])
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert (f"--checkpoint-dir {directory} holds a checkpoint of an earlier run ({held}): this run would replace its "
            f"checkpoints. Continue that run with: {os.path.join(ROOT, BIN)} --resume {directory}; or give another "
            f"--checkpoint-dir, or --overwrite 1 to replace them") in proc.stderr, proc.stderr
    assert kept(directory) == before


def test_a_fresh_run_does_not_replace_a_final_checkpoint(data, tmp_path):
    assert run(args(data) + ["--checkpoint-dir", tmp_path]).returncode == 0
    before = snapshot(tmp_path)
    refused_into(data, tmp_path, "final.bin")
    assert run(args(data, steps=3) + ["--checkpoint-dir", tmp_path, "--overwrite", "1"]).returncode == 0
    assert snapshot(tmp_path)["final.bin"] != before["final.bin"]


def test_a_fresh_run_does_not_replace_a_stopped_or_killed_runs_checkpoints(data, tmp_path):
    # (issue 53: only final.bin was looked at, so a fresh run replaced a stopped run's step_K.bin, exit 0)
    stopped, killed = tmp_path / "stopped", tmp_path / "killed"
    a = [str(x) for x in args(data, steps=100000) + ["--save-every", 2, "--run-dir="]]
    for directory, sig in ((stopped, signal.SIGTERM), (killed, signal.SIGKILL)):
        proc = subprocess.Popen([os.path.join(ROOT, BIN)] + a + ["--checkpoint-dir", str(directory)], cwd=ROOT,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for line in proc.stdout:
            if line.startswith(f"saved {directory}/step_4.bin"):
                break
        proc.send_signal(sig)
        proc.communicate(timeout=60)
        assert proc.returncode == (143 if sig == signal.SIGTERM else -9)
    assert (killed / ".lock").exists()  # the killed run's lock file stays (it holds no lock): it hides nothing
    for directory in (stopped, killed):
        newest = max((p for p in directory.iterdir() if p.name.startswith("step_")), key=lambda p: int(p.stem[5:]))
        refused_into(data, directory, newest.name)
    # the two ways on: the earlier run continues, or --overwrite 1 starts a new one there
    assert run(["--resume", stopped, "--steps", 6, "--resume-override", 1]).returncode == 0
    assert run(args(data, steps=3) + ["--checkpoint-dir", killed, "--overwrite", "1"]).returncode == 0
    assert (killed / "final.bin").exists() and not (killed / ".lock").exists()


def test_a_fresh_run_does_not_replace_an_earlier_runs_log(data, tmp_path):
    ckpt, log = tmp_path / "ckpt", tmp_path / "log.jsonl"
    assert run(args(data, steps=3) + ["--save-every", 2, "--checkpoint-dir", ckpt, "--log", log]).returncode == 0
    (ckpt / "final.bin").unlink()  # (as a run stopped after step 2 leaves its directory: step_2.bin and the log)
    before, logged = snapshot(ckpt), log.read_bytes()
    again = run(args(data) + ["--checkpoint-dir", ckpt, "--log", log])
    assert again.returncode == 1, again.stdout + again.stderr
    # (the log lies outside the checkpoint's directory: the command names it, a resume takes only places inside)
    resume = f"{os.path.join(ROOT, BIN)} --resume {ckpt}/step_2.bin --log {log}"
    assert (f"--log {log} holds the log of an earlier run: this run would replace it (a log is one run's). Continue "
            f"that run with: {resume}; or give another --log, or --overwrite 1 to replace it") in again.stderr, again.stderr
    assert snapshot(ckpt) == before and log.read_bytes() == logged
    assert run(resume.split()[1:]).returncode == 0  # the command given: the earlier run goes on in its log
    steps = [json.loads(line).get("step") for line in log.read_text().splitlines()]
    assert steps[:4] == [None, 1, 2, 3] and steps[-2:] == [2, 3], steps  # (its resume record, then step 3 again)
    # no checkpoint to continue from: the other two ways out
    other = tmp_path / "other.jsonl"
    assert run(args(data) + ["--log", other]).returncode == 0
    refused = run(args(data) + ["--log", other])
    assert refused.returncode == 1 and (f"(a log is one run's). Give another --log, or --overwrite 1 to replace it"
                                        in refused.stderr), refused.stderr
    replaced = run(args(data, steps=2) + ["--log", other, "--overwrite", 1])
    assert replaced.returncode == 0, replaced.stderr
    assert max(json.loads(line).get("step", 0) for line in other.read_text().splitlines()) == 2
    empty = tmp_path / "empty.jsonl"
    empty.touch()
    assert run(args(data) + ["--log", empty]).returncode == 0


def test_a_resume_does_not_write_into_a_directory_that_does_not_hold_its_checkpoint(data, tmp_path):
    elsewhere, here = tmp_path / "elsewhere", tmp_path / "here"
    elsewhere.mkdir()
    here.mkdir()
    keep = ["--save-every", "2", "--keep-last", "1"]
    # a colleague's run, saved with run.run_dir = runs/exp1 in their tree, and a copy of its step 2
    assert run(args(data, steps=6) + keep + ["--run-dir", "runs/exp1"], cwd=elsewhere).returncode == 0
    (here / "colleague").mkdir()
    shutil.copy(elsewhere / "runs" / "exp1" / "step_4.bin", here / "colleague" / "step_4.bin")
    # another run here, in a directory of the same name
    assert run(args(data, steps=6) + keep + ["--seed", "7", "--run-dir", "runs/exp1"], cwd=here).returncode == 0
    before = snapshot(here / "runs" / "exp1")
    proc = run(["--resume", "colleague/step_4.bin"], cwd=here)
    assert proc.returncode == 1
    assert ("--resume colleague/step_4.bin: the saved run wrote to --checkpoint-dir runs/exp1, --log runs/exp1/log.jsonl"
            in proc.stderr), proc.stderr
    assert "does not hold this checkpoint" in proc.stderr and "--run-dir colleague-resumed" in proc.stderr
    assert snapshot(here / "runs" / "exp1") == before
    proc = run(["--resume", "colleague/step_4.bin", "--run-dir", "colleague-resumed"], cwd=here)
    assert proc.returncode == 0, proc.stderr
    assert (here / "colleague-resumed" / "final.bin").exists() and snapshot(here / "runs" / "exp1") == before
    # from its own directory a resume goes on there
    (elsewhere / "runs" / "exp1" / "final.bin").unlink()
    proc = run(["--resume", "runs/exp1"], cwd=elsewhere)
    assert proc.returncode == 0, proc.stderr
    assert (elsewhere / "runs" / "exp1" / "final.bin").exists()


def test_a_resume_does_not_follow_saved_parent_steps(data, tmp_path):
    cwd = tmp_path / "a" / "b"
    cwd.mkdir(parents=True)
    assert run(args(data) + ["--save-every", "2", "--run-dir", "../x"], cwd=cwd).returncode == 0
    (tmp_path / "a" / "x" / "final.bin").unlink()
    before = snapshot(tmp_path / "a" / "x")
    proc = run(["--resume", "../x/step_2.bin"], cwd=cwd)
    assert proc.returncode == 1
    assert "the file names its outputs with '..' (--checkpoint-dir ../x, --log ../x/log.jsonl)" in proc.stderr, proc.stderr
    assert snapshot(tmp_path / "a" / "x") == before


def test_a_resume_writes_only_inside_the_checkpoints_tree(data, tmp_path):
    # (issue 53) a file's paths led writes anywhere: an absolute --log, a link on the way out of the
    # directory, a file that is no log at all (a shell start-up file)
    outside = tmp_path / "outside"
    outside.mkdir()
    ck = tmp_path / "ck"
    assert run(args(data) + ["--save-every", 2, "--checkpoint-dir", ck, "--log", outside / "log.jsonl"]).returncode == 0
    logged = (outside / "log.jsonl").read_bytes()
    proc = run(["--resume", ck / "step_2.bin"])
    assert proc.returncode == 1
    assert (f"the file names --log {outside}/log.jsonl, which lies outside the checkpoint's directory {ck}: a resume "
            f"writes only where the checkpoint lies unless told. To continue there, give --log {outside}/log.jsonl"
            in proc.stderr), proc.stderr
    assert (outside / "log.jsonl").read_bytes() == logged
    # a relative log inside the directory, which a link leads out of
    inside = tmp_path / "inside"
    (inside / "ck2" / "logs").mkdir(parents=True)
    assert run(args(data) + ["--save-every", 2, "--checkpoint-dir", "ck2", "--log", "ck2/logs/log.jsonl"],
               cwd=inside).returncode == 0
    shutil.move(inside / "ck2" / "logs", outside / "logs")
    (inside / "ck2" / "logs").symlink_to(outside / "logs")
    logged = (outside / "logs" / "log.jsonl").read_bytes()
    proc = run(["--resume", "ck2/step_2.bin"], cwd=inside)
    assert proc.returncode == 1
    assert f"--log ck2/logs/log.jsonl, which lies outside the checkpoint's directory {inside}/ck2 (it is {outside}/logs/log.jsonl)" \
        in proc.stderr, proc.stderr
    assert (outside / "logs" / "log.jsonl").read_bytes() == logged
    # a file named as the log that is no run's log is never appended to
    (inside / "ck2" / "logs").unlink()
    (inside / "ck2" / "logs").mkdir()
    (inside / "ck2" / "logs" / "log.jsonl").write_text("export PS1='$(date)'\n")
    proc = run(["--resume", "ck2/step_2.bin"], cwd=inside)
    assert proc.returncode == 1 and "--log ck2/logs/log.jsonl is not a run's log" in proc.stderr, proc.stderr
    assert (inside / "ck2" / "logs" / "log.jsonl").read_text() == "export PS1='$(date)'\n"


def test_a_resume_never_appends_to_another_runs_log(data, tmp_path):
    # (issue 53) a checkpoint saved with --run-dir runs/exp1 --checkpoint-dir ckpt/exp1, copied to the same
    # place in a tree that holds another runs/exp1, appended to that run's log
    mine, theirs = tmp_path / "mine", tmp_path / "theirs"
    outputs = ["--save-every", 2, "--run-dir", "runs/exp1", "--checkpoint-dir", "ckpt/exp1"]
    for tree, seed in ((mine, 1), (theirs, 2)):
        (tree / "runs" / "exp1").mkdir(parents=True)  # (before issue 53 a log in a --run-dir not yet made was refused)
        assert run(args(data) + outputs + ["--seed", seed], cwd=tree).returncode == 0
    (theirs / "ckpt" / "exp1" / "step_2.bin").write_bytes((mine / "ckpt" / "exp1" / "step_2.bin").read_bytes())
    before = snapshot(theirs / "runs" / "exp1")
    proc = run(["--resume", "ckpt/exp1/step_2.bin"], cwd=theirs)
    assert proc.returncode == 1 and "the file names --log runs/exp1/log.jsonl, which lies outside" in proc.stderr, proc.stderr
    # told the place, it still does not append to a log whose first record is another run's
    proc = run(["--resume", "ckpt/exp1/step_2.bin", "--run-dir", "runs/exp1"], cwd=theirs)
    mine_id = json.loads((mine / "runs" / "exp1" / "log.jsonl").read_text().splitlines()[0])["run"]["run_id"]
    theirs_id = json.loads(before["log.jsonl"].decode().splitlines()[0])["run"]["run_id"]
    assert proc.returncode == 1 and theirs_id != mine_id
    assert (f"--log runs/exp1/log.jsonl is the log of another run (run id {theirs_id}; ckpt/exp1/step_2.bin is of run "
            f"{mine_id})") in proc.stderr, proc.stderr
    assert snapshot(theirs / "runs" / "exp1") == before
    # in its own tree the resume goes on in its own log, named as its run's
    assert run(["--resume", "ckpt/exp1/step_2.bin", "--run-dir", "runs/exp1"], cwd=mine).returncode == 0
    heads = [json.loads(line)["run"] for line in (mine / "runs" / "exp1" / "log.jsonl").read_text().splitlines()
             if line.startswith('{"run"')]
    assert [h["run_id"] for h in heads] == [mine_id, mine_id]
    # a --run-dir apart from the --checkpoint-dir is made by the run, the log's directory with it
    assert run(args(data, steps=1) + ["--run-dir", "runs/exp2", "--checkpoint-dir", "ckpt/exp2"], cwd=mine).returncode == 0
    assert (mine / "runs" / "exp2" / "log.jsonl").exists()


def test_a_symlinked_log_takes_the_lock_of_the_file_it_names(data, tmp_path):
    # (issue 53: the lock was .b.jsonl.lock, so a run with --log b.jsonl -> a.jsonl truncated A's log)
    a_log, b_log = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    b_log.symlink_to(a_log)
    a = [str(x) for x in args(data, steps=100000) + ["--checkpoint-dir", tmp_path / "a", "--log", a_log, "--run-dir="]]
    first = subprocess.Popen([os.path.join(ROOT, BIN)] + a, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
    try:
        for line in first.stdout:
            if line.startswith("step "):
                break
        second = run(args(data) + ["--checkpoint-dir", tmp_path / "b", "--log", b_log, "--overwrite", 1])
        assert second.returncode == 1
        assert f"--log {b_log} is in use by another run (pid {first.pid} on " in second.stderr, second.stderr
    finally:
        first.send_signal(signal.SIGTERM)
        first.communicate(timeout=60)
    assert first.returncode == 143
    lines = a_log.read_text().splitlines()
    assert [json.loads(line).get("step") for line in lines[:2]] == [None, 1]  # A's log whole: its record, its steps
    assert sum(line.startswith('{"run"') for line in lines) == 1
