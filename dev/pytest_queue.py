"""`pytest --queue=PATH`: the tests taken a file at a time from a queue that every pytest given
the same PATH shares, so that make test's two processes end together whatever else shares the
cores (make test: two processes on one queue; dev/conftest.py loads this plugin).

The queue is the test files, heaviest first by dev/test/queue_weights.json; PATH holds a
fingerprint of that order and the index of the next file, under a lock. A process takes the next
file when it is free and runs all of the file's tests, so a module fixture is built once."""
import fcntl
import hashlib
import json
import os

import pytest

_WEIGHTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "test", "queue_weights.json")
DEFAULT_WEIGHT = 0.3  # seconds, for a test queue_weights.json does not name (most take less)
_TAKEN = pytest.StashKey()  # (files this process ran, files in the queue)


def pytest_addoption(parser):
    parser.addoption("--queue", default=None, metavar="PATH",
                     help="take the test files from the queue at PATH, shared with every pytest given the same PATH")


def queue_order(nodeids, weights):
    """The test files of nodeids, heaviest first (the sum of their tests' weights), ties by name."""
    load = {}
    for nodeid in nodeids:
        name = nodeid.split("::")[0]
        load[name] = load.get(name, 0.0) + weights.get(nodeid, DEFAULT_WEIGHT)
    return sorted(load, key=lambda name: (-load[name], name))


def take(path, fingerprint):
    """The next index of the queue at path: 0, 1, 2, ... over every process that takes from it.
    Refuses a queue made for another order of files (another selection of tests)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        text = os.pread(fd, 4096, 0).decode()
        if text:
            made_for, _, index = text.partition(" ")
            if made_for != fingerprint:
                raise pytest.UsageError(f"--queue {path}: made for another selection of tests "
                                        "(give each run a queue of its own)")
            index = int(index)
        else:
            index = 0
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{fingerprint} {index + 1}".encode(), 0)
        return index
    finally:
        os.close(fd)  # (and the lock with it)


@pytest.hookimpl(tryfirst=True)
def pytest_runtestloop(session):
    path = session.config.getoption("--queue")
    if path is None or session.config.option.collectonly:
        return None  # pytest's own loop
    if session.testsfailed and not session.config.option.continue_on_collection_errors:
        raise session.Interrupted(f"{session.testsfailed} error(s) during collection")
    with open(_WEIGHTS) as f:
        weights = json.load(f)
    files = {}
    for item in session.items:
        files.setdefault(item.nodeid.split("::")[0], []).append(item)
    order = queue_order([item.nodeid for item in session.items], weights)
    fingerprint = hashlib.sha256("\n".join(order).encode()).hexdigest()[:16]
    taken = []

    def mine():
        while (k := take(path, fingerprint)) < len(order):
            taken.append(order[k])
            yield from files[order[k]]

    items = mine()
    item = next(items, None)
    while item is not None:
        nextitem = next(items, None)  # (the next file is taken before a file's last test: its teardown needs it)
        item.config.hook.pytest_runtest_protocol(item=item, nextitem=nextitem)
        if session.shouldfail:
            raise session.Failed(session.shouldfail)
        if session.shouldstop:
            raise session.Interrupted(session.shouldstop)
        item = nextitem
    session.config.stash[_TAKEN] = (len(taken), len(order))
    return True


def pytest_terminal_summary(terminalreporter, config):
    if _TAKEN in config.stash:
        taken, total = config.stash[_TAKEN]
        terminalreporter.write_line(f"queue {config.getoption('--queue')}: this process ran {taken} of the {total} "
                                    "test files (the others: the processes beside it)")
