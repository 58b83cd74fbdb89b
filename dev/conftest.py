"""Fixtures shared by the data tests (dev/data/tests) and the tests that build on their
corpora (dev/test)."""
import os
import shutil
import sys

import pytest
# make test's two pytest processes share one queue of test files (--queue=PATH: dev/pytest_queue.py)
from pytest_queue import pytest_addoption, pytest_runtestloop, pytest_terminal_summary  # noqa: F401

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
