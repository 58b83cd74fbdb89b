"""The benchmark eval-set builders (evals.py; MMLU from the files a user provides, as every
builder here) and the SlimPajama shard builder on fixture
files written here in each dataset's published format (parquet with the Hub's columns,
zstandard JSON lines for SlimPajama): prompts, choices, gold and normalisation lengths are
compared with lm-evaluation-harness's own task files (its YAML templates and Python
helpers, read from the installed lm_eval), WikiText's detokenizer, word count and rolling
windows with lm-eval's functions, and that every network script says so without the network.
About 6 s on 2 cores (4 s of it five Python start-ups)."""
import ast
import os
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import evals
from attnref.evalset import (KIND_MC, KIND_PARTIAL, KIND_ROLLING, partial_request, read_evalset, rolling_requests,
                             write_evalset)
from attnref.shards import read_shard

lm_eval = pytest.importorskip("lm_eval")
from lm_eval.tasks._yaml_loader import load_yaml  # noqa: E402
from lm_eval.utils import apply_template, get_rolling_token_windows, make_disjoint_window  # noqa: E402

TASKS_DIR = os.path.join(os.path.dirname(lm_eval.__file__), "tasks")
LM_EVAL_YAML = {"piqa": "piqa/piqa.yaml", "boolq": "super_glue/boolq/default.yaml",
                "copa": "super_glue/copa/default.yaml", "rte": "glue/rte/default.yaml",
                "sciq": "sciq/sciq.yaml", "arc_easy": "arc/arc_easy.yaml",
                "mmlu": "mmlu/default/mmlu_high_school_biology.yaml"}

# rows in each dataset's schema (the columns of the published parquet files)
ROWS = {
    "piqa": [{"goal": "How do I open a jar?", "sol1": "Twist the lid.", "sol2": "Eat the lid.", "label": 0},
             {"goal": "Keep bread fresh", "sol1": "leave it in the sun", "sol2": "put it in a bag", "label": 1}],
    "boolq": [{"question": "is the sun a star", "passage": "The Sun is the star at the centre of the Solar System.",
               "idx": 0, "label": 1},
              {"question": "can fish fly", "passage": "Most fish swim.", "idx": 1, "label": 0}],
    "copa": [{"premise": "My body cast a shadow over the grass.", "choice1": "The sun was rising.",
              "choice2": "The grass was cut.", "question": "cause", "idx": 0, "label": 0},
             {"premise": "The man broke his toe. ", "choice1": "He dropped a hammer on his foot.",
              "choice2": "He got a hole in his sock.", "question": "effect", "idx": 1, "label": 0}],
    "rte": [{"sentence1": "No weapons of mass destruction were found in Iraq.",
             "sentence2": "Weapons of mass destruction found in Iraq.", "label": 1, "idx": 0},
            {"sentence1": "A cat sat on the mat.", "sentence2": "A cat sat.", "label": 0, "idx": 1}],
    "sciq": [{"question": "What do plants make?", "distractor1": "light", "distractor2": "air", "distractor3": "soil",
              "correct_answer": "food", "support": "  Plants make food."}],
    "arc_easy": [{"id": "x", "question": "Which is a gas?", "choices": {"text": ["rock", "steam", "ice"],
                                                                         "label": ["A", "B", "C"]}, "answerKey": "B"}],
    "mmlu": [{"question": " Which organelle makes energy? ", "subject": "high_school_biology",
              "choices": ["nucleus", "mitochondria", "ribosome", "cell wall"], "answer": 1},
             {"question": "What is 2 + 2?", "subject": "high_school_biology", "choices": ["3", "4", "5", "22"],
              "answer": 1}],
}

WIKI_PAGE = (" = Valkyria Chronicles III = \n \n Senjō no Valkyria 3 : Unrecorded Chronicles ( Japanese : 戦場のヴァルキュリア3 "
             ", lit . Valkyria of the Battlefield 3 ) , commonly referred to as Valkyria Chronicles III outside Japan , "
             "is a tactical role @-@ playing video game . It sold 1 @,@ 000 copies at 3 @.@ 5 \" stars \" ; the "
             "players ' choices ' matter ' . It 's 20 ° N warm ! Really ? \n = = Gameplay = = \n = = = Plot = = = \n "
             "[ note ] { braces } N \n")


def lm_eval_requests(task, row):
    """(context, [delimiter + choice], [choice], gold) as lm-eval builds a multiple-choice
    request from its task config (doc_to_text / doc_to_choice / doc_to_target)."""
    cfg = load_yaml(os.path.join(TASKS_DIR, LM_EVAL_YAML[task]))

    def render(spec):
        if callable(spec):
            return spec(row)
        if isinstance(spec, (list, int)):
            return spec
        if spec in row:
            return row[spec]
        return apply_template(spec, row)
    ctx = cfg.get("description", "") + render(cfg["doc_to_text"])  # 0-shot: the description, then the doc
    choices = render(cfg["doc_to_choice"])
    if isinstance(choices, str):
        choices = ast.literal_eval(choices)
    gold = render(cfg["doc_to_target"])
    if isinstance(gold, str):
        gold = choices.index(gold) if gold in choices else int(gold)
    delim = cfg.get("target_delimiter", " ")
    return ctx, [delim + c for c in choices], choices, gold


def write_parquet(path, rows):
    pq.write_table(pa.Table.from_pylist(rows), path)
    return str(path)


@pytest.mark.parametrize("task", list(LM_EVAL_YAML))
def test_multiple_choice_items_are_lm_eval_requests(task, small_tok, tmp_path):
    src = write_parquet(tmp_path / f"{task}_validation.parquet", ROWS[task])
    evals.main(["--tokenizer", small_tok.model_file, "--out", str(tmp_path / "out"), "--only", task,
                "--files", f"{task}={src}"])
    es = read_evalset(tmp_path / "out" / f"{task}.bin")
    assert es["kind"] == KIND_MC and len(es["items"]) == len(ROWS[task]) and es["bos"]
    for row, it in zip(ROWS[task], es["items"]):
        ctx, conts, choices, gold = lm_eval_requests(task, row)
        assert it["context"][0] == small_tok.bos_id
        assert small_tok.decode(it["context"][1:]) == ctx  # the tokenizer decodes losslessly
        assert [small_tok.decode(c) for c in it["choices"]] == conts
        assert it["choice_chars"] == [len(c) for c in choices]  # lm-eval's acc_norm length: the choice alone
        assert it["gold"] == gold
    if task == "copa":  # lm-eval's choices carry a space and the delimiter adds one
        assert all(small_tok.decode(c).startswith("  ") for c in es["items"][0]["choices"])


def test_mmlu_refuses_a_row_without_four_choices(small_tok, tmp_path):
    src = write_parquet(tmp_path / "mmlu_test.parquet", [dict(ROWS["mmlu"][0], choices=["a", "b", "c"])])
    with pytest.raises(SystemExit, match=r"mmlu: an MMLU row with 3 choices \(expected 4\)"):
        evals.main(["--tokenizer", small_tok.model_file, "--out", str(tmp_path), "--only", "mmlu",
                    "--files", f"mmlu={src}"])


WINOGRANDE_ROWS = [
    {"sentence": "The trophy did not fit in the suitcase because _ was too big.", "option1": "the trophy",
     "option2": "the suitcase", "answer": "1"},
    {"sentence": "Sarah gave Maria a book because _ had finished reading it.", "option1": "Sarah", "option2": "Maria",
     "answer": "2"},
]


def test_winogrande_items_are_lm_eval_partial_requests(small_tok, tmp_path):
    """winogrande: lm-eval's partial evaluation (its preprocess_winogrande: doc_to_choice gives
    one context per option, doc_to_target the shared continuation after the target delimiter,
    doc_to_text the gold index): per choice, the option's context then the continuation; the
    scored requests are exactly lm-eval's (context, continuation) pairs."""
    from importlib import util
    spec = util.spec_from_file_location("pwg", os.path.join(TASKS_DIR, "winogrande", "preprocess_winogrande.py"))
    pw = util.module_from_spec(spec)
    spec.loader.exec_module(pw)
    cfg = load_yaml(os.path.join(TASKS_DIR, "winogrande", "default.yaml"))
    assert cfg["output_type"] == "multiple_choice" and cfg["metric_list"][0]["metric"] == "acc"
    src = write_parquet(tmp_path / "winogrande_validation.parquet", WINOGRANDE_ROWS)
    evals.main(["--tokenizer", small_tok.model_file, "--out", str(tmp_path / "out"), "--only", "winogrande",
                "--files", f"winogrande={src}"])
    es = read_evalset(tmp_path / "out" / "winogrande.bin")
    assert es["kind"] == KIND_PARTIAL and len(es["items"]) == 2
    for row, it in zip(WINOGRANDE_ROWS, es["items"]):
        contexts, target, gold = pw.doc_to_choice(row), " " + pw.doc_to_target(row), pw.doc_to_text(row)
        assert it["gold"] == gold and it["context"] == [small_tok.bos_id]
        for c, ctx in enumerate(contexts):
            req_ctx, req_cont = partial_request(it, c)
            assert req_ctx[0] == small_tok.bos_id and small_tok.decode(req_ctx[1:]) == ctx
            assert small_tok.decode(req_cont) == target


def test_partial_items_leave_a_token_to_score(tmp_path):
    item = {"context": [2], "choices": [[5, 6], [7]], "choice_chars": [1, 1], "gold": 0}
    with pytest.raises(ValueError, match="leave a token to score"):
        write_evalset(tmp_path / "p.bin", [item], KIND_PARTIAL, 64, "")
    write_evalset(tmp_path / "p.bin", [dict(item, choice_chars=[1, 0])], KIND_PARTIAL, 64, "")
    assert partial_request(read_evalset(tmp_path / "p.bin")["items"][0], 0) == ([2, 5], [6])


def test_rte_from_superglue_fields_and_boolq_from_the_original_release():
    glue = ROWS["rte"][0]
    sg = {"premise": glue["sentence1"], "hypothesis": glue["sentence2"], "label": 1, "idx": 0}
    assert evals.rte_example(sg) == evals.rte_example(glue)
    orig = {"question": "can fish fly", "passage": "Most fish swim.", "answer": False}
    assert evals.boolq_example(orig) == evals.boolq_example(ROWS["boolq"][1])


def test_wikitext_detokenizer_and_words_are_lm_eval_s():
    from importlib import util
    spec = util.spec_from_file_location("pw", os.path.join(TASKS_DIR, "wikitext", "preprocess_wikitext.py"))
    pw = util.module_from_spec(spec)
    spec.loader.exec_module(pw)
    doc = {"page": WIKI_PAGE}
    assert evals.wikitext_detokenize(WIKI_PAGE) == pw.wikitext_detokenizer(doc)
    assert evals.wikitext_detokenize(WIKI_PAGE) != WIKI_PAGE
    results = pw.process_results(doc, [-1.0])
    assert evals.wikitext_words(WIKI_PAGE) == results["word_perplexity"][1]


@pytest.mark.parametrize("max_len", [1, 2, 3, 5, 8])
def test_rolling_requests_are_lm_eval_windows(max_len):
    for n in range(0, 20):
        tokens = list(range(100, 100 + n))
        want = [make_disjoint_window(w) for w in get_rolling_token_windows(tokens, 7, max_len, 1)]
        got = rolling_requests(7, tokens, max_len)
        assert [(list(a), list(b)) for a, b in want] == got
        assert sum(len(b) for _, b in got) == n  # every token predicted once
        assert all(len(a) + len(b) <= max_len + 1 for a, b in got)


def test_wikitext_items(small_tok, tmp_path):
    rows = [{"page": WIKI_PAGE}, {"page": " \n"}, {"page": " = Short = \n A page . \n"}]
    src = write_parquet(tmp_path / "test-00000-of-00001.parquet", rows)
    evals.main(["--tokenizer", small_tok.model_file, "--out", str(tmp_path), "--only", "wikitext",
                "--files", f"wikitext={src}"])
    es = read_evalset(tmp_path / "wikitext.bin")
    assert es["kind"] == KIND_ROLLING and len(es["items"]) == 2  # the blank page is left out
    for row, it in zip([rows[0], rows[2]], es["items"]):
        assert it["context"] == [small_tok.bos_id]
        assert it["choices"][0] == small_tok.encode(evals.wikitext_detokenize(row["page"]))  # no BOS in the text
        assert it["choice_chars"] == [evals.wikitext_words(row["page"])]


def test_files_option_errors(small_tok, tmp_path):
    with pytest.raises(SystemExit, match="TASK=PATH"):
        evals.main(["--tokenizer", small_tok.model_file, "--out", str(tmp_path), "--files", "nosuch=x.parquet"])
    with pytest.raises(SystemExit, match="no file matches"):
        evals.main(["--tokenizer", small_tok.model_file, "--out", str(tmp_path), "--files",
                    f"piqa={tmp_path}/missing.parquet"])


def test_builders_say_when_the_network_is_absent(small_tok, tmp_path):
    """Every network script, without the network (the Hub in offline mode), stops with a message
    that says so. (tiktoken's GPT-2 files, the default tokenizer, fail the same way
    without the network; not tested here, since a machine with the network would fetch them.)"""
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    tok = ["--tokenizer", small_tok.model_file, "--out", str(tmp_path)]
    for cmd in (["evals.py", "--only", "piqa"], ["slimpajama.py"], ["fineweb.py"], ["synth.py"],
                ["tinyshakespeare.py", "--url", "http://127.0.0.1:9/input.txt"]):  # a closed local port
        p = subprocess.run([sys.executable, os.path.join(here, cmd[0])] + tok + cmd[1:], capture_output=True,
                           text=True, env=env, timeout=120)
        assert p.returncode != 0
        assert "needs the network" in p.stderr and "Traceback" not in p.stderr, (cmd, p.stderr)


def write_jsonl_zst(path, rows):
    import json
    path.parent.mkdir(parents=True, exist_ok=True)
    with pa.output_stream(str(path), compression="zstd") as f:
        for r in rows:
            f.write((json.dumps(r) + "\n").encode("utf-8"))


def test_slimpajama_shards_from_its_jsonl_zst(small_tok, tmp_path, kjv_chapters):
    import slimpajama
    texts = [c["text"] for c in kjv_chapters[:30]]
    sets = ["RedPajamaC4", "RedPajamaBook", "RedPajamaGithub"]
    train = [{"text": t, "meta": {"redpajama_set_name": sets[i % 3]}} for i, t in enumerate(texts[:24])]
    val = [{"text": t, "meta": {"redpajama_set_name": sets[i % 3]}} for i, t in enumerate(texts[24:])]
    write_jsonl_zst(tmp_path / "sp/train/chunk1/example_train_0.jsonl.zst", train[:12])
    write_jsonl_zst(tmp_path / "sp/train/chunk2/example_train_0.jsonl.zst", train[12:])
    write_jsonl_zst(tmp_path / "sp/validation/chunk1/example_holdout_0.jsonl.zst", val)
    out = tmp_path / "out"
    slimpajama.main(["--tokenizer", small_tok.model_file, "--out", str(out), "--local", "--workers", "1",
                     "--train-files", str(tmp_path / "sp/train/chunk*/*.jsonl.zst"),
                     "--val-files", str(tmp_path / "sp/validation/chunk*/*.jsonl.zst"),
                     "--sets", "RedPajamaC4,RedPajamaBook", "--shard-tokens", "20000"])

    def ids(split):
        return np.concatenate([read_shard(p) for p in sorted(out.glob(f"slimpajama_{split}_*.bin"))]).tolist()

    def want(rows):
        w = []
        for r in rows:
            if r["meta"]["redpajama_set_name"] != "RedPajamaGithub":
                w += [small_tok.bos_id] + small_tok.encode(r["text"]) + [small_tok.eos_id]
        return w
    assert ids("val") == want(val)  # the held-out files, and nothing else
    assert ids("train") == want(train)
    with pytest.raises(SystemExit, match="unknown source"):
        slimpajama.main(["--tokenizer", small_tok.model_file, "--out", str(out), "--local", "--sets", "Wiki"])
