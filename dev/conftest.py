"""Fixtures shared by the data tests (dev/data/tests) and the tests that build on their
corpora (dev/test)."""
import os
import shutil
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "data"))
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
