"""Fixtures shared by the data tests (dev/data/tests) and the tests that build on their
corpora (dev/test)."""
import os
import shutil
import sys

import pytest

# dev/data and dev/eval hold script modules (kjv, synth_generator, reference_eval, ...) that tests import
for _sub in ("data", "eval"):
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), _sub))
# the programs the tests start (python -m study, dev/data/*.py) import this checkout's packages
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
os.environ["PYTHONPATH"] = os.pathsep.join([_ROOT] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else []))


@pytest.fixture(scope="session")
def kjv_chapters():
    """The KJV chapters from the Debian bible-kjv package (the offline English corpus)."""
    if shutil.which("bible") is None:
        pytest.skip("bible-kjv is not installed (bash scripts/setup.sh installs it)")
    import kjv
    return kjv.chapters()


# `--shard=I/N`: only the I-th of N parts of the tests (dealt in turn, in collection order), so
# that make test runs the suite as two processes at once: pytest is the longest of its checks,
# and one process left a core idle once the compiles were done. (Dealt test by test, not file by
# file: the files' times differ 40-fold; a module fixture is then made in both processes.)
def pytest_addoption(parser):
    parser.addoption("--shard", default=None, metavar="I/N", help="run the I-th of N parts of the tests (1 <= I <= N)")


def pytest_collection_modifyitems(config, items):
    shard = config.getoption("--shard")
    if shard is None:
        return
    try:
        i, n = (int(x) for x in shard.split("/"))
        assert 1 <= i <= n
    except (ValueError, AssertionError):
        raise pytest.UsageError(f"--shard {shard}: give I/N with 1 <= I <= N, e.g. 1/2")
    config.hook.pytest_deselected(items=[item for k, item in enumerate(items) if k % n != i - 1])
    items[:] = items[i - 1::n]
