"""The knowledge corpus from dictd databases: fixtures in the dictd format (written here, in the
layouts of Debian's dict-wn, dict-gcide, dict-foldoc and dict-jargon), read back entry by entry,
their facts, the split by headword, the exercises, and a small --knowledge build end to end."""
import gzip
import json
import os
import subprocess
import sys
import zlib

import numpy as np
import pytest

from conftest import REPO

DIGITS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"


def b64(n: int) -> str:
    """dictd's base64 number, written independently of dictd.py."""
    s = DIGITS[n % 64]
    while n >= 64:
        n //= 64
        s = DIGITS[n % 64] + s
    return s


def write_dictd(directory, name, blocks, compress=True):
    """blocks: [(headwords, text or bytes)]; a block with several headwords is indexed once per headword."""
    data, index = b"", []
    for headwords, text in blocks:
        raw = text if isinstance(text, bytes) else text.encode("utf-8")
        for h in headwords:
            index.append(f"{h}\t{b64(len(data))}\t{b64(len(raw))}\n")
        data += raw
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, name + ".index"), "w", encoding="utf-8") as f:
        f.writelines(sorted(index))
    if compress:
        with gzip.open(os.path.join(directory, name + ".dict.dz"), "wb") as f:
            f.write(data)
    else:
        with open(os.path.join(directory, name + ".dict"), "wb") as f:
            f.write(data)


WN_DOG = """dog
    n 1: a member of the genus Canis (probably descended from the
         common wolf) that has been domesticated by man since
         prehistoric times; "the dog barked all night" [syn: {dog},
         {domestic dog}, {Canis familiaris}]
    2: metal supports for logs in a fireplace [syn: {andiron},
       {firedog}, {dog}, {dog-
       iron}]
    v 1: go after with the intent to catch [syn: {chase}, {dog}]
"""
WN_HOT = """hot
    adj 1: used of physical heat; having a high or higher than
           desirable temperature [ant: {cold}]
"""
GCIDE_DOG = """Dog \\Dog\\ (d[add]g), n. [AS. docga; akin to D. dog
   mastiff.]
   1. (Zool.) A quadruped of the genus {Canis}, esp. the
      domestic dog.
      [1913 Webster]

   2. A mean, worthless fellow; a wretch.
      [1913 Webster]
"""
GCIDE_SPADE = """Spade \\Spade\\, n. [AS. spada; akin to G. spaten.]
   An implement for digging the ground, caf\u2019 style.
   [1913 Webster]
""".encode("cp1252")
FOLDOC_LISP = """Lisp

   <language> LISt Processing language.  A symbolic language
   based on lists. More text follows here.

   (1994-11-18)

"""
JARGON_HACK = """hack
 n.

    1. n. Originally, a quick job that produces what is needed, but not
    well. More text.

"""


def wordnet_words(n):
    """n made-up WordNet entries, so that both sides of the split have some."""
    blocks = []
    for i in range(n):
        w = f"zorb{i}"
        blocks.append(([w], f"{w}\n    n 1: a made-up thing number {i} used in\n         tests [syn: {{{w}}}, "
                            f"{{zorbling {i}}}]\n    v 1: to make thing {i} again\n"))
    return blocks


def synset_pairs(n):
    """n pairs of made-up WordNet words whose one sense shares its gloss (a synset's members, each
    with its own entry, as WordNet's are): some pairs straddle a split by headword."""
    blocks = []
    for i in range(n):
        for a, b in ((f"blip{i}", f"blop{i}"), (f"blop{i}", f"blip{i}")):
            blocks.append(([a], f"{a}\n    n 1: a thing that blip {i} and blop {i} share [syn: {{{b}}}]\n"))
    return blocks


@pytest.fixture(scope="module")
def dictd_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("dictd")
    info = (["00-database-info"], "00-database-info\nThis file was converted from the original database\n")
    write_dictd(d, "wn", [info, (["dog"], WN_DOG), (["hot"], WN_HOT)] + wordnet_words(240) + synset_pairs(60))
    write_dictd(d, "gcide", [info, (["dog"], GCIDE_DOG), (["spade", "spades"], GCIDE_SPADE)])
    write_dictd(d, "foldoc", [info, (["lisp"], FOLDOC_LISP)], compress=False)
    write_dictd(d, "jargon", [(["hack"], JARGON_HACK)])
    return str(d)


def test_b64_numbers():
    from dictd import b64_decode_number, b64_encode_number
    for n in (0, 1, 63, 64, 4095, 4096, 30958182):
        assert b64_decode_number(b64(n)) == n and b64_encode_number(n) == b64(n)
    assert b64_decode_number("BA") == 64 and b64_decode_number("/") == 63
    with pytest.raises(ValueError, match="bad digit"):
        b64_decode_number("A=")


def test_read_database(dictd_dir):
    from dictd import read_database
    gcide = read_database(dictd_dir, "gcide")
    assert [e.headwords for e in gcide] == [["dog"], ["spade", "spades"]]  # metadata out, shared block once
    assert gcide[0].text == GCIDE_DOG
    assert "caf\u2019 style" in gcide[1].text  # the Windows-1252 byte of an older database
    assert read_database(dictd_dir, "foldoc")[0].text == FOLDOC_LISP  # a plain .dict
    assert len(read_database(dictd_dir, "wn")) == 2 + 240 + 120


def test_read_database_errors(tmp_path):
    from dictd import read_database
    with pytest.raises(FileNotFoundError, match="dict-wn"):
        read_database(str(tmp_path), "wn")
    write_dictd(tmp_path, "x", [(["a"], "a\n  text\n")])
    (tmp_path / "x.index").write_text("a\tA\tZZ\n")
    with pytest.raises(ValueError, match=r"x.index:1: block 0\+\d+ runs past the end"):
        read_database(str(tmp_path), "x")
    (tmp_path / "x.index").write_text("a A B\n")
    with pytest.raises(ValueError, match="x.index:1: expected"):
        read_database(str(tmp_path), "x")


def test_logical_lines():
    from knowledge import document_text, logical_lines
    lines = logical_lines(WN_DOG, ["dog"])
    assert lines[0] == "dog" and len(lines) == 4
    assert lines[1].startswith("n 1: a member") and lines[1].endswith("{Canis familiaris}]")
    assert "the common wolf" in lines[1]
    assert lines[2] == "2: metal supports for logs in a fireplace [syn: {andiron}, {firedog}, {dog}, {dog-iron}]"
    assert lines[3] == "v 1: go after with the intent to catch [syn: {chase}, {dog}]"
    g = logical_lines(GCIDE_DOG, ["dog"])
    assert g[0].startswith("Dog \\Dog\\ (d[add]g), n. [AS. docga; akin to D. dog mastiff.] 1. (Zool.) A quadruped")
    assert g[1:] == ["", "2. A mean, worthless fellow; a wretch."]  # source tags dropped
    assert "{" not in document_text(lines) and "Canis familiaris]" in document_text(lines)


def test_facts(dictd_dir):
    import knowledge
    corpus = knowledge.load(dictd_dir)
    facts = {(f.source, f.kind, f.question): f.answer for f in corpus.facts}
    assert facts[("wn", "pos", "'dog' in WordNet")] == "noun and verb"
    assert facts[("wn", "define", "sense 2 of the noun 'dog' in WordNet")] == "metal supports for logs in a fireplace"
    assert facts[("wn", "define", "sense 1 of the noun 'dog' in WordNet")].endswith("since prehistoric times")
    assert facts[("wn", "synonym", "sense 1 of the noun 'dog' in WordNet")] == "domestic dog, Canis familiaris"
    assert facts[("wn", "synonym", "sense 2 of the noun 'dog' in WordNet")] == "andiron, firedog, dog-iron"
    assert facts[("wn", "antonym", "sense 1 of the adjective 'hot' in WordNet")] == "cold"
    assert facts[("gcide", "pos", "'Dog' in Webster's dictionary")] == "noun"
    assert facts[("gcide", "etymology", "the noun 'Dog' in Webster's dictionary")] == \
        "AS. docga; akin to D. dog mastiff."
    assert facts[("gcide", "define", "the noun 'Dog' in Webster's dictionary")] == \
        "A quadruped of the genus Canis, esp. the domestic dog."
    assert facts[("gcide", "define", "the noun 'Spade' in Webster's dictionary")].startswith("An implement for digging")
    assert facts[("foldoc", "category", "'Lisp' in FOLDOC")] == "language"
    assert facts[("foldoc", "define", "'Lisp' in FOLDOC")] == "LISt Processing language."
    assert facts[("jargon", "pos", "'hack' in the Jargon File")] == "noun"
    assert facts[("jargon", "define", "'hack' in the Jargon File")] == \
        "Originally, a quick job that produces what is needed, but not well."
    # distinct: 4 WordNet facts per made-up word (pos, define n, define v, synonym), 3 per synset member
    # (pos, define, synonym); WordNet's dog 7 (pos, 3 senses with a definition and synonyms), hot 3;
    # GCIDE's Dog and Spade 3 each; FOLDOC and Jargon 2 each
    assert len(corpus.facts) == len(set(f.fact_id() for f in corpus.facts)) == \
        4 * 240 + 3 * 120 + 7 + 3 + 3 + 3 + 2 + 2
    assert knowledge.fact_counts(corpus)["total"] == len(corpus.facts)


def test_split_by_headword(dictd_dir):
    import knowledge
    corpus = knowledge.load(dictd_dir)
    group = {d["key"]: d["key"].replace("blop", "blip") for d in corpus.documents}  # a pair's first key
    want = {k: "val" if zlib.crc32(g.encode()) % 20 == 19 else "train" for k, g in group.items()}
    assert [d["split"] for d in corpus.documents] == [want[d["key"]] for d in corpus.documents]
    sides = {}
    for d in corpus.documents:
        sides.setdefault(d["key"], set()).add(d["split"])
    assert all(len(s) == 1 for s in sides.values()) and len(sides["dog"]) == 1  # dog: wn and gcide together
    assert 5 <= sum(s == {"val"} for s in sides.values()) <= 30
    straddle = [i for i in range(60) if (want[f"blip{i}"] == "val") != (zlib.crc32(f"blop{i}".encode()) % 20 == 19)]
    assert straddle  # what a split by headword alone would do to a synset: the fixture has such pairs


def exercise_text(d):
    return "\n".join((d["query"], d["synthetic_reasoning"], d["synthetic_answer"]))


def test_held_out_glosses_stay_out_of_training(dictd_dir):
    """A held-out word's WordNet glosses appear in no training entry and no training exercise
    (a gloss shared with a training word would, and so would a distractor drawn from it)."""
    import knowledge
    corpus = knowledge.load(dictd_dir)
    held = {f.answer for f in corpus.facts if f.source == "wn" and f.kind == "define"
            and corpus.fact_split(f) == "context"}
    assert len(held) >= 10
    train_texts = [d["text"] for d in corpus.documents if d["split"] == "train"]
    train_texts += [exercise_text(d) for d in knowledge.exercises(corpus, "train", 3000, 5)]
    assert not [g for g in held if any(g in t for t in train_texts)]


def test_val_facts_only_in_entries(dictd_dir):
    """A val parametric question's fact is in no training exercise: its gloss is neither asked (a
    shared gloss is held out with its synset) nor a distractor, and no training lookup quotes an
    entry that states a val fact; val MCQ options are val glosses, none seen in a training exercise."""
    import knowledge
    corpus = knowledge.load(dictd_dir)
    val = list(knowledge.exercises(corpus, "val", 400, 6))
    train = list(knowledge.exercises(corpus, "train", 3000, 5))
    train_text = [exercise_text(d) for d in train]
    glosses = {d["meta"]["answer"] for d in val if d["meta"]["kind"] == "define" and d["exercise"] != "dict_lookup"}
    assert len(glosses) >= 10 and any(d["exercise"] == "dict_mcq" for d in val)
    assert not [g for g in glosses if any(g in t for t in train_text)]
    stating = {corpus.documents[f.entry]["text"] for f in corpus.facts if corpus.fact_split(f) == "val"}
    quoted = [d["query"].split("\n\n", 1)[1].rsplit("\n\nQuestion: ", 1)[0] for d in train
              if d["exercise"] == "dict_lookup"]
    assert len(quoted) > 300 and not stating & set(quoted)
    for d in val:
        if d["exercise"] == "dict_mcq":
            options = [line[3:] for line in d["query"].split("\n")[1:]]
            assert len(options) == 4 and not [o for o in options if any(o in t for t in train_text)]


def test_fact_counts_bits_by_kind(dictd_dir):
    from scipy.stats import entropy
    import knowledge
    corpus = knowledge.load(dictd_dir)
    counts = knowledge.fact_counts(corpus)
    kinds = counts["by_kind"]
    assert sum(k["facts"] for k in kinds.values()) == counts["total"] == len(corpus.facts)
    for kind, got in kinds.items():
        answers = [f.answer for f in corpus.facts if f.kind == kind]
        freq = np.unique(answers, return_counts=True)[1]
        assert got["facts"] == len(answers) and got["answers"] == len(freq)
        assert got["bits_per_fact"] == pytest.approx(entropy(freq, base=2), abs=1e-3)
        assert got["bits"] == pytest.approx(entropy(freq, base=2) * len(answers), abs=1)
    assert kinds["pos"]["answers"] < 10 < kinds["define"]["answers"]  # few parts of speech, many glosses


def test_exercises(dictd_dir):
    import knowledge
    corpus = knowledge.load(dictd_dir)
    val_keys = {d["key"] for d in corpus.documents if d["split"] == "val"}
    docs = {s: list(knowledge.exercises(corpus, s, 600, 5)) for s in ("train", "val")}
    texts = {}
    for e in corpus.documents:
        texts.setdefault(e["key"], []).append(e["text"])
    asked = {s: {(d["meta"]["key"], d["meta"]["kind"], d["meta"]["answer"]) for d in docs[s]
                 if d["exercise"] != "dict_lookup"} for s in docs}
    assert not asked["train"] & asked["val"]  # a val question asks a fact no training exercise asks
    for split, ds in docs.items():
        names = {d["exercise"] for d in ds}
        assert {"dict_lookup", "dict_define", "dict_pos", "dict_synonym", "dict_mcq"} <= names
        assert names <= set(knowledge.PARAMETRIC + knowledge.CONTEXT)
        for d in ds:
            held_out = d["meta"]["key"] in val_keys
            if d["exercise"] == "dict_lookup":
                assert held_out == (split == "val")  # held-out entries are only quoted, and only in val
                entry = d["query"].split("\n\n", 1)[1].rsplit("\n\nQuestion: ", 1)[0]
                assert entry in texts[d["meta"]["key"]]
                assert d["meta"]["answer"].replace("{", "").replace("}", "") in entry or d["meta"]["kind"] in (
                    "pos", "synonym", "antonym")  # the answer is in the quoted entry
            else:
                assert not held_out and d["meta"]["answer"] not in d["query"].split("\n")[0]
                assert d["meta"]["answer"] in d["synthetic_answer"]
    assert sorted(json.dumps(d) for d in knowledge.exercises(corpus, "val", 50, 9)) == \
        sorted(json.dumps(d) for d in knowledge.exercises(corpus, "val", 50, 9))


@pytest.fixture(scope="module")
def built(tmp_path_factory, dictd_dir, kjv_chapters):
    out = tmp_path_factory.mktemp("offline-knowledge")
    cmd = [sys.executable, os.path.join(REPO, "dev/data/build_offline.py"), "--out", str(out), "--vocab-size", "1000",
           "--synth-train-docs", "300", "--synth-val-docs", "50", "--eval-items", "10", "--knowledge",
           "--dictd-dir", dictd_dir, "--knowledge-train-docs", "400", "--knowledge-val-docs", "80"]
    subprocess.run(cmd, check=True, capture_output=True)
    return out


def test_build_knowledge(built, dictd_dir):
    import knowledge
    from attnref.shards import ANSWER, QUERY, exercises_path, read_exercises, read_regions, read_shard, regions_path
    from attnref.tokenizer import SPTokenizer
    tok = SPTokenizer(built / "tokenizer.model")
    corpus = knowledge.load(dictd_dir)
    manifest = json.loads((built / "manifest.json").read_text())
    assert manifest["knowledge_facts"]["total"] == len(corpus.facts)
    for split in ("train", "val"):
        # dict/: every entry of the split, in order, BOS text EOS
        ids = np.concatenate([read_shard(p) for p in sorted((built / "dict").glob(f"dict_{split}_*.bin"))])
        starts = np.flatnonzero(ids == tok.bos_id).tolist() + [len(ids)]
        texts = [tok.decode(ids[a + 1:b - 1]) for a, b in zip(starts, starts[1:])]
        assert texts == [d["text"] for d in corpus.documents if d["split"] == split]
        assert manifest["corpora"][f"dict_{split}"]["docs"] == len(texts)
        # knowledge/: the exercises, with the generator's regions and their exercise names
        paths = sorted((built / "knowledge").glob(f"knowledge_{split}_*.bin"))
        ids = np.concatenate([read_shard(p) for p in paths])
        regs = np.concatenate([read_regions(regions_path(p)) for p in paths])
        names = []
        for p in paths:
            e, table = read_exercises(exercises_path(p))
            names += [table[i] for i in e]
        seed = manifest["args"]["seed"] + (1000003 if split == "val" else 0)
        want = list(knowledge.exercises(corpus, split, 400 if split == "train" else 80, seed))
        starts = np.flatnonzero(ids == tok.bos_id).tolist() + [len(ids)]
        assert len(starts) - 1 == len(want)
        for k, d in enumerate(want):
            a, b = starts[k], starts[k + 1]
            assert set(names[a:b]) == {d["exercise"]}
            answer = tok.decode(ids[a:b][regs[a:b] == ANSWER])
            assert answer.startswith("assistant\n") and answer.endswith(d["synthetic_answer"])
            assert tok.decode(ids[a:b][regs[a:b] == QUERY]) == "user\n" + d["query"]
    cmd = [sys.executable, os.path.join(REPO, "dev/data/build_offline.py"), "--out", str(built), "--is-current"]
    assert subprocess.run(cmd).returncode == 1  # a knowledge build is not the default build
    assert subprocess.run(cmd + ["--knowledge"]).returncode == 0


def documents_of(paths, bos_id):
    """[(tokens, regions, exercise names)] of each BOS-started document of the shards, in order."""
    from attnref.shards import exercises_path, read_exercises, read_regions, read_shard, regions_path
    ids = np.concatenate([read_shard(p) for p in paths])
    regs = np.concatenate([read_regions(regions_path(p)) for p in paths])
    names = []
    for p in paths:
        e, table = read_exercises(exercises_path(p))
        names += [table[i] for i in e]
    starts = np.flatnonzero(ids == bos_id).tolist() + [len(ids)]
    return [(tuple(ids[a:b]), tuple(regs[a:b]), tuple(sorted(set(names[a:b])))) for a, b in zip(starts, starts[1:])]


def test_mixed_corpus_interleaves_entries_and_exercises(built):
    """mixed/ holds every training entry (region other, exercise dict_entry) and every training
    exercise (its regions and name) exactly once, in an order where the two kinds are interleaved:
    the loader reads one shard at a time, so dict/ then knowledge/ would not be."""
    from attnref.shards import OTHER
    from attnref.tokenizer import SPTokenizer
    tok = SPTokenizer(built / "tokenizer.model")
    mixed = documents_of(sorted((built / "mixed").glob("mixed_train_*.bin")), tok.bos_id)
    exercises = documents_of(sorted((built / "knowledge").glob("knowledge_train_*.bin")), tok.bos_id)
    from attnref.shards import read_shard
    ids = np.concatenate([read_shard(p) for p in sorted((built / "dict").glob("dict_train_*.bin"))])
    starts = np.flatnonzero(ids == tok.bos_id).tolist() + [len(ids)]
    entries = [(tuple(ids[a:b]), (OTHER,) * (b - a), ("dict_entry",)) for a, b in zip(starts, starts[1:])]
    assert sorted(mixed) == sorted(entries + exercises)
    kinds = ["entry" if d[2] == ("dict_entry",) else "exercise" for d in mixed]
    runs = 1 + sum(a != b for a, b in zip(kinds, kinds[1:]))
    assert runs > len(mixed) // 4  # two blocks would be 2 runs; a shuffle of this mix has hundreds
    manifest = json.loads((built / "manifest.json").read_text())
    assert manifest["corpora"]["mixed_train"]["docs"] == len(mixed)
    assert manifest["corpora"]["mixed_train"]["exercises"]["dict_entry"] == len(entries)


def test_build_knowledge_missing_dictionaries(tmp_path, kjv_chapters):
    cmd = [sys.executable, os.path.join(REPO, "dev/data/build_offline.py"), "--out", str(tmp_path / "o"),
           "--vocab-size", "1000", "--synth-train-docs", "100", "--synth-val-docs", "20", "--eval-items", "5",
           "--knowledge", "--dictd-dir", str(tmp_path / "none")]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode != 0 and "--knowledge" in r.stderr and "gcide" in r.stderr


def test_default_build_over_a_knowledge_build(built, tmp_path, kjv_chapters):
    """A default build into a --knowledge build's folder leaves no dictionary shards of the old tokenizer."""
    import shutil
    out = tmp_path / "o"
    shutil.copytree(built, out)
    assert list((out / "dict").glob("dict_*.bin")) and list((out / "knowledge").glob("knowledge_*"))
    cmd = [sys.executable, os.path.join(REPO, "dev/data/build_offline.py"), "--out", str(out), "--vocab-size", "1000",
           "--synth-train-docs", "300", "--synth-val-docs", "50", "--eval-items", "10"]
    subprocess.run(cmd, check=True, capture_output=True)
    assert not list((out / "dict").glob("dict_*")) and not list((out / "knowledge").glob("knowledge_*"))
    manifest = json.loads((out / "manifest.json").read_text())
    assert "knowledge_facts" not in manifest and "knowledge" not in manifest["args"]
    assert not any(k.startswith(("dict_", "knowledge_")) for k in manifest["corpora"])
