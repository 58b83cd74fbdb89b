"""Fixtures shared by the data tests (dev/data/tests) and the tests that build on their
corpora (dev/test)."""
import json
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


# `--shard=I/N`: only the I-th of N parts of the tests, so that make test runs the suite as two
# processes at once (pytest is the longest of its checks). The parts are dealt by time: each test,
# slowest first, to the part with the least so far, its time from dev/test/shard_weights.json
# (seconds, measured on a 2-core EPYC; SHARD_DEFAULT for a test not there), then each part run in
# collection order. (Dealt in turn, test by test, the parts took 236 s and 383 s, 2026-12-07.)
SHARD_DEFAULT = 0.3


def pytest_addoption(parser):
    parser.addoption("--shard", default=None, metavar="I/N", help="run the I-th of N parts of the tests (1 <= I <= N)")


def shard_parts(nodeids, n, weights):
    """[set of node ids] for each of n parts: longest processing time first, ties by node id."""
    loads, parts = [0.0] * n, [set() for _ in range(n)]
    for nodeid in sorted(nodeids, key=lambda x: (-weights.get(x, SHARD_DEFAULT), x)):
        k = min(range(n), key=lambda j: (loads[j], j))
        parts[k].add(nodeid)
        loads[k] += weights.get(nodeid, SHARD_DEFAULT)
    return parts


def pytest_collection_modifyitems(config, items):
    shard = config.getoption("--shard")
    if shard is None:
        return
    try:
        i, n = (int(x) for x in shard.split("/"))
        assert 1 <= i <= n
    except (ValueError, AssertionError):
        raise pytest.UsageError(f"--shard {shard}: give I/N with 1 <= I <= N, e.g. 1/2")
    with open(os.path.join(_ROOT, "dev", "test", "shard_weights.json")) as f:
        weights = json.load(f)
    mine = shard_parts([item.nodeid for item in items], n, weights)[i - 1]
    config.hook.pytest_deselected(items=[item for item in items if item.nodeid not in mine])
    items[:] = [item for item in items if item.nodeid in mine]
