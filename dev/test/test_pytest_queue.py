"""make test's two pytest processes on one queue of test files (--queue=PATH, dev/pytest_queue.py):
the order by hand, every index taken once by processes racing for it, and two pytests on a queue
running every test once, each file's tests in one process with its module fixture built once."""
import multiprocessing
import os
import subprocess
import sys
import textwrap

import pytest
import pytest_queue

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_the_heaviest_file_first():
    weights = {"a.py::x": 5, "b.py::y": 4, "b.py::z": 3, "d.py::v": 0.3}
    nodeids = ["a.py::x", "b.py::y", "b.py::z", "c.py::w", "d.py::v"]
    # b 7, a 5, then c and d at 0.3 each (c by the default weight), ties by name
    assert pytest_queue.queue_order(nodeids, weights) == ["b.py", "a.py", "c.py", "d.py"]


def _take_until(path, n, out):
    got = []
    while (k := pytest_queue.take(path, "f" * 16)) < n:
        got.append(k)
    out.put(got)


def test_every_index_taken_once_by_racing_processes(tmp_path):
    path, n = str(tmp_path / "queue"), 400
    out = multiprocessing.get_context("fork").Queue()
    procs = [multiprocessing.get_context("fork").Process(target=_take_until, args=(path, n, out)) for _ in range(4)]
    for p in procs:
        p.start()
    taken = [out.get(timeout=60) for _ in procs]
    for p in procs:
        p.join()
    assert sorted(k for got in taken for k in got) == list(range(n))


def test_a_queue_of_another_selection_is_refused(tmp_path):
    path = str(tmp_path / "queue")
    assert [pytest_queue.take(path, "a" * 16) for _ in range(3)] == [0, 1, 2]
    with pytest.raises(pytest.UsageError, match="another selection of tests"):
        pytest_queue.take(path, "b" * 16)


def test_two_pytests_on_one_queue_run_every_test_once(tmp_path):
    tests, log = tmp_path / "tests", tmp_path / "log"
    tests.mkdir()
    (tests / "pytest.ini").write_text("[pytest]\n")
    for f in range(5):
        (tests / f"test_f{f}.py").write_text(textwrap.dedent(f"""\
            import os, time, pytest
            def note(what):
                with open({str(log)!r}, "a") as out:
                    out.write(f"{{os.getpid()}} {{what}}\\n")
            @pytest.fixture(scope="module")
            def built():
                note("fixture f{f}")
            @pytest.mark.parametrize("k", range(3))
            def test_t(built, k):
                time.sleep(0.15)
                note(f"test f{f}-{{k}}")
            """))
    queue = str(tmp_path / "queue")
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "dev"))
    cmd = [sys.executable, "-m", "pytest", "-p", "pytest_queue", f"--queue={queue}", "-p", "no:cacheprovider",
           "-c", str(tests / "pytest.ini"), "--rootdir", str(tests), str(tests)]
    runs = [subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for _ in range(2)]
    outputs = [run.communicate(timeout=120)[0] for run in runs]
    assert [run.returncode for run in runs] == [0, 0], outputs
    lines = [line.split(" ", 1) for line in log.read_text().splitlines()]
    ran = [what for _, what in lines if what.startswith("test ")]
    assert sorted(ran) == sorted(f"test f{f}-{k}" for f in range(5) for k in range(3))
    assert sorted(what for _, what in lines if what.startswith("fixture ")) == [f"fixture f{f}" for f in range(5)]
    for f in range(5):  # a file's tests in the process that built its fixture
        assert len({pid for pid, what in lines if what.split("-")[0] in (f"test f{f}", f"fixture f{f}")}) == 1
    counts = sorted(int(out.split("this process ran ")[1].split(" ")[0]) for out in outputs)
    assert sum(counts) == 5 and "of the 5 test files" in outputs[0]


def test_the_weights_name_tests_that_exist():
    import json
    weights = json.load(open(os.path.join(ROOT, "dev", "test", "queue_weights.json")))
    assert all(os.path.exists(os.path.join(ROOT, nodeid.split("::")[0])) for nodeid in weights)
