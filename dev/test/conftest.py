"""Checks shared by every test: the tests leave no run directory in the repository
(each trainer run names its outputs, or none: trainer_cli.run_binary passes --run-dir '')."""
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RUNS = os.path.join(ROOT, "runs")


def run_dirs():
    return set(os.listdir(RUNS)) if os.path.isdir(RUNS) else set()


@pytest.fixture(autouse=True)
def no_run_directory_left_in_the_repository():
    before = run_dirs()
    yield
    new = sorted(run_dirs() - before)
    assert not new, f"this test left run directories in {RUNS}: {new} (give the trainer --run-dir or its outputs)"
