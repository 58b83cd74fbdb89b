"""make test's two pytest processes (--shard=I/N, dev/conftest.py): every test in exactly one
part, the parts dealt longest first to the lightest (checked by hand on a small case and as a
property: no part exceeds another by more than its largest test)."""
import importlib.util
import os
import random

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
spec = importlib.util.spec_from_file_location("dev_conftest", os.path.join(ROOT, "dev", "conftest.py"))
dev_conftest = importlib.util.module_from_spec(spec)
spec.loader.exec_module(dev_conftest)


def test_longest_first_to_the_lightest_part():
    # a 5 -> part 0; b 4 -> 1; c 3 -> 1 (4 < 5); d 3 -> 0 (5 < 7); e 1 -> 1 (7 < 8)
    weights = {"a": 5, "b": 4, "c": 3, "d": 3, "e": 1}
    assert dev_conftest.shard_parts(list("edcba"), 2, weights) == [{"a", "d"}, {"b", "c", "e"}]


def test_every_test_in_one_part_and_the_parts_even():
    rng = random.Random(3)
    ids = [f"t{k}" for k in range(300)]
    weights = {x: rng.expovariate(1.0) * (30 if rng.random() < 0.05 else 1) for x in ids[:200]}
    for n in (1, 2, 3):
        parts = dev_conftest.shard_parts(ids, n, weights)
        assert sorted(x for p in parts for x in p) == sorted(ids)
        loads = [sum(weights.get(x, dev_conftest.SHARD_DEFAULT) for x in p) for p in parts]
        assert max(loads) - min(loads) <= max(weights.values()) + 1e-9


def test_the_weights_name_tests_that_exist():
    import json
    weights = json.load(open(os.path.join(ROOT, "dev", "test", "shard_weights.json")))
    assert all(os.path.exists(os.path.join(ROOT, nodeid.split("::")[0])) for nodeid in weights)
