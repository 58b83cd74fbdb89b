"""The capacity world (dev/data/bios.py): attributes independent and uniform, every person in
exactly E biographies that state their values, several templates, probes labelled per attribute,
and training windows that hold whole biographies."""
import json
import os
import subprocess
import sys
from collections import Counter

import numpy as np
import pytest

from conftest import REPO


@pytest.fixture(scope="module")
def world_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("capacity")
    subprocess.run([sys.executable, os.path.join(REPO, "dev/data/bios.py"), "--out", str(out), "--people", "40",
                    "--exposures", "12", "--seed", "3"], check=True, capture_output=True,
                   env={**os.environ, "PYTHONPATH": REPO})
    return out


def documents(path, bos):
    from attnref.shards import read_shard
    ids = read_shard(path)
    starts = np.flatnonzero(ids == bos).tolist() + [len(ids)]
    return ids, [ids[a:b] for a, b in zip(starts, starts[1:])]


def test_attributes_independent_and_uniform():
    from scipy.stats import chi2_contingency, chisquare
    import bios
    w = bios.World(20000, seed=5)
    attrs = list(bios.ATTRS)
    for a in attrs:
        d = len(bios.ATTRS[a][0])
        assert chisquare(np.bincount(w.values[a], minlength=d)).pvalue > 1e-3
    for i, a in enumerate(attrs):
        for b in attrs[i + 1:]:
            table = np.zeros((len(bios.ATTRS[a][0]), len(bios.ATTRS[b][0])))
            np.add.at(table, (w.values[a], w.values[b]), 1)
            assert chi2_contingency(table).pvalue > 1e-3, (a, b)
    assert len(set(w.names)) == 20000


def test_exposures_and_facts_exact(world_dir):
    import bios
    manifest = json.loads((world_dir / "manifest.json").read_text())
    vocab = (world_dir / "vocab.txt").read_text().split("\n")[:-1]
    world = json.loads((world_dir / "world.json").read_text())
    assert manifest["vocab_size"] == len(vocab) and vocab[:3] == bios.SPECIALS
    ids, docs = documents(world_dir / "capacity_train_000000.bin", bios.BOS)
    assert len(ids) == 40 * 12 * bios.BIO_TOKENS + 1 == manifest["train_tokens"]
    assert len(docs) == 40 * 12 and all(len(d) == bios.BIO_TOKENS for d in docs[:-1])
    assert len(docs[-1]) == bios.BIO_TOKENS + 1 and docs[-1][-1] == bios.EOS  # the closing EOS
    people = {name: i for i, name in enumerate(world["names"])}
    seen, templates, orders = Counter(), Counter(), set()
    for d in docs:
        words = [vocab[t] for t in d[1:1 + bios.BIO_TOKENS - 2]]
        person = people[" ".join(words[:2])]
        seen[person] += 1
        order = []
        for k in range(len(bios.ATTRS)):
            s = words[2 + k * 5: 7 + k * 5]
            attr = next(a for a, (_, ts) in bios.ATTRS.items() if " ".join(s[:3]) in ts)
            value_names = world["value_names"][attr]
            assert s[3] == value_names[world["values"][attr][person]] and s[4] == "."  # the person's value
            templates[attr, " ".join(s[:3])] += 1
            order.append(attr)
        assert sorted(order) == sorted(bios.ATTRS)  # every attribute once
        orders.add(tuple(order))
    assert set(seen.values()) == {12} and len(seen) == 40  # exactly E exposures each
    for attr, (_, ts) in bios.ATTRS.items():  # every template used, none most of the time
        counts = [templates[attr, t] for t in ts]
        assert min(counts) > 0.2 * sum(counts)
    assert len(orders) > 50


def test_probes(world_dir):
    import bios
    from attnref.shards import ANSWER, read_exercises, read_regions, regions_path, exercises_path
    vocab = (world_dir / "vocab.txt").read_text().split("\n")[:-1]
    world = json.loads((world_dir / "world.json").read_text())
    path = world_dir / "capacity_val_000000.bin"
    ids, docs = documents(path, bios.BOS)
    regions = read_regions(regions_path(path))
    ex, names = read_exercises(exercises_path(path))
    assert len(docs) == 40 * len(bios.ATTRS) * 3
    answers = np.flatnonzero(regions == ANSWER)
    assert len(answers) == len(docs)
    people = {name: i for i, name in enumerate(world["names"])}
    for pos in answers:
        attr = names[ex[pos]]
        start = pos - 6  # BOS first last w1 w2 w3 VALUE
        assert ids[start] == bios.BOS and set(ex[start:pos + 3]) == {ex[pos]}
        person = people[vocab[ids[start + 1]] + " " + vocab[ids[start + 2]]]
        assert vocab[ids[pos]] == world["value_names"][attr][world["values"][attr][person]]


def test_windows_hold_whole_biographies(world_dir):
    """Windows of T + 1 tokens at offsets k T (doc/data.md "Windows"), T a multiple of a biography:
    each starts at a BOS, and together they cover every biography."""
    import bios
    ids, _ = documents(world_dir / "capacity_train_000000.bin", bios.BOS)
    T = 4 * bios.BIO_TOKENS
    windows = (len(ids) - 1) // T
    assert windows * T == len(ids) - 1
    assert all(ids[k * T] == bios.BOS for k in range(windows))


def test_control_world_states_no_fact(tmp_path):
    """--fresh-values: the same people, counts and layout, but a person's biographies disagree on
    their values (so no value is a fact), and the values stay uniform."""
    import bios
    out = tmp_path / "control"
    subprocess.run([sys.executable, os.path.join(REPO, "dev/data/bios.py"), "--out", str(out), "--people", "30",
                    "--exposures", "20", "--fresh-values"], check=True, capture_output=True,
                   env={**os.environ, "PYTHONPATH": REPO})
    vocab = (out / "vocab.txt").read_text().split("\n")[:-1]
    _, docs = documents(out / "capacity_train_000000.bin", bios.BOS)
    told = {}
    for d in docs:
        words = [vocab[t] for t in d[1:bios.BIO_TOKENS - 1]]
        for k in range(len(bios.ATTRS)):
            s = words[2 + k * 5: 7 + k * 5]
            attr = next(a for a, (_, ts) in bios.ATTRS.items() if " ".join(s[:3]) in ts)
            told.setdefault((words[0], words[1], attr), []).append(s[3])
    assert len(told) == 30 * len(bios.ATTRS) and all(len(v) == 20 for v in told.values())
    born = [len(set(v)) for (_, _, a), v in told.items() if a == "born"]
    assert min(born) >= 10  # 20 draws of 64 years: a fact would give 1
    assert json.loads((out / "manifest.json").read_text())["fresh_values"] is True


def test_bad_arguments(tmp_path):
    for flag, value, what in (("--people", "0", "--people must be positive"),
                              ("--people", "100000", "more people than the name pools"),
                              ("--exposures", "0", "--exposures must be positive")):
        r = subprocess.run([sys.executable, os.path.join(REPO, "dev/data/bios.py"), "--out", str(tmp_path / "w"),
                            flag, value], capture_output=True, text=True, env={**os.environ, "PYTHONPATH": REPO})
        assert r.returncode != 0 and what in r.stderr
