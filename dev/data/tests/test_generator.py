"""The SYNTH-format generator: deterministic, consistent with its world, in-context answers
in the query, parametric answers absent from the query but stated in other documents."""
import re

from synth_generator import ATTRS, World, generate


def docs(n, seed, **kw):
    return list(generate(n, seed, **kw))


def test_deterministic_given_seed():
    a, b, c = docs(500, 4), docs(500, 4), docs(500, 5)
    assert a == b
    assert a != c
    assert World(1234).people == World(1234).people
    assert World(1234).people != World(99).people


def test_columns_and_mix():
    ds = docs(2000, 1)
    keys = {"synth_id", "language", "exercise", "query", "synthetic_reasoning", "synthetic_answer", "meta"}
    assert all(set(d) == keys and d["language"] == "en" for d in ds)
    kinds = {d["exercise"] for d in ds}
    assert kinds == {"memorization", "recall", "mcq", "rag", "math"}
    assert len({d["synth_id"] for d in ds}) == len(ds)
    assert all("<|im_" not in d["query"] + d["synthetic_reasoning"] + d["synthetic_answer"] for d in ds)


def test_in_context_answers_are_in_the_query():
    world = World()
    for d in docs(1500, 2):
        m = d["meta"]
        if d["exercise"] == "rag":
            assert m["person"] not in world.names  # fresh people: memory cannot help
            assert str(m["value"]) in d["query"] and str(m["value"]) in d["synthetic_answer"]
            assert m["person"] in d["query"]
        if d["exercise"] == "math":
            nums = [int(x) for x in re.findall(r"\d+", d["query"])]
            q = d["query"]
            if "boxes with" in q:
                want = nums[0] * nums[1] - nums[2]
            elif "Monday" in q:
                want = sum(nums)
            else:
                want = nums[0] // nums[1]
                assert nums[0] % nums[1] == 0
            assert m["value"] == want and d["synthetic_answer"] == f"The answer is {want}."


def test_parametric_answers_come_from_other_documents():
    world = World()
    by_name = {p["name"]: p for p in world.people}
    ds = docs(3000, 3)
    stated = {}  # person -> facts stated in memorization documents
    for d in ds:
        if d["exercise"] == "memorization":
            p = by_name[d["meta"]["person"]]
            for a in ATTRS:
                assert str(p[a]) in d["synthetic_answer"]  # consistent with the world
            stated[p["name"]] = d["meta"]["facts"]
    assert set(stated) == set(by_name)  # cover_world: every person has an entry
    for d in ds:
        if d["exercise"] in ("recall", "mcq"):
            m = d["meta"]
            assert by_name[m["person"]][m["attr"]] == m["value"]
            assert stated[m["person"]][m["attr"]] == m["value"]
            if d["exercise"] == "recall":
                assert str(m["value"]) not in d["query"]  # must be recalled, not read
            assert str(m["value"]) in d["synthetic_answer"]
    val = docs(300, 77, cover_world=False)
    assert sum(d["exercise"] == "memorization" for d in val) < 150
