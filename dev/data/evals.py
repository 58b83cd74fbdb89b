"""
Benchmark eval sets -> eval .bin (attnref/evalset.py; doc/formats.md, "Eval sets"),
following lm-evaluation-harness's 0-shot tasks (the SAN paper, "Evaluation conventions";
BOS prepended to every context). Reads the datasets' published files from the Hugging Face
Hub (needs the network) or, with --files, local copies of those files (.parquet, .jsonl,
.json, .jsonl.zst) in the same schema.

A multiple-choice task is lm-eval's (context, choices, gold) with target delimiter " ": each
continuation is delimiter + choice, and acc_norm divides by the characters of the choice
alone, as lm-eval does (the file's per-choice length).

  SAN paper:
  lambada    EleutherAI/lambada_openai (test; lm-eval's lambada_openai, the OpenAI-processed
             text): cloze; context = text without its last word, target = " " + last word
  lambada_standard
             cimec/lambada (test; lm-eval's lambada_standard, the original release): the same
             cloze (the SAN paper names LAMBADA without saying which; its study scores both)
  sciq       allenai/sciq (test): "{support}\\nQuestion: {question}\\nAnswer:", choices
             distractor1..3, correct_answer (gold 3)
  hellaswag  Rowan/hellaswag (validation): "{activity_label}: {ctx_a} {ctx_b.capitalize()}"
             cleaned as lm-eval does, four endings
  arc_easy   allenai/ai2_arc (ARC-Easy, test): "Question: {question}\\nAnswer:", choices.text
  Deconstructing paper (also arc_easy, sciq, hellaswag, lambada):
  piqa       baber/piqa (validation): "Question: {goal}\\nAnswer:", choices sol1, sol2
  boolq      aps/super_glue boolq (validation): "{passage}\\nQuestion: {question}?\\nAnswer:",
             choices "no", "yes"
  copa       aps/super_glue copa (validation): premise without its final character + " because"
             (cause) / " therefore" (effect); choices " " + choice with its first letter
             lowered; the default delimiter " " is added as well, so a continuation starts
             with two spaces, exactly as lm-eval scores it
  rte        nyu-mll/glue rte (validation; lm-eval's "rte"): "{sentence1}\\nQuestion:
             {sentence2} True or False?\\nAnswer:", choices "True" (entailment, label 0),
             "False"
  SAN paper, Table 4 (its tasks at chance):
  winogrande allenai/winogrande (winogrande_xl, validation; lm-eval's winogrande): partial
             evaluation: per option, the sentence up to "_" with the option in its place as the
             context, and the same continuation " " + the rest of the sentence (stripped)
             scored after each; gold = answer - 1
  mmlu       cais/mmlu ("all", test; lm-eval's mmlu, 0-shot): "The following are multiple choice
             questions (with answers) about {subject, _ as spaces}.\n\n{question}\nA. {choice 0}
             \nB. ...\nD. {choice 3}\nAnswer:", choices "A".."D", gold = answer; one set of all
             57 subjects (lm-eval's mmlu acc weights the subjects by their size: the same mean)
  wikitext   EleutherAI/wikitext_document_level wikitext-2-raw-v1 (test): rolling; each page
             detokenized as lm-eval's wikitext task does, scored whole in the model's
             windows; word perplexity over the words of the original page

  python dev/data/evals.py --tokenizer gpt2 --out data/evals_gpt2 [--only piqa wikitext] [--limit N]
  python dev/data/evals.py --tokenizer tok.model --out DIR --only copa --files copa=copa_val.parquet
"""
from __future__ import annotations

import argparse
import glob
import os
import re

from attnref.evalset import (KIND_CLOZE, KIND_MC, KIND_PARTIAL, KIND_ROLLING, make_item,
                             make_partial_item, make_rolling_item, write_evalset)
from attnref.tokenizer import tokenizer_fingerprint

# (repo, file patterns) per task; the first pattern that matches files decides
SOURCES = {
    "lambada": ("EleutherAI/lambada_openai", ["*en*test*.parquet", "*en/test*.parquet", "*test*en*.jsonl",
                                              "*lambada_test_en*"]),
    "lambada_standard": ("cimec/lambada", ["plain_text/test*.parquet", "*test*.parquet"]),
    "sciq": ("allenai/sciq", ["*test*.parquet", "*test*.json*"]),
    "hellaswag": ("Rowan/hellaswag", ["*validation*.parquet", "*val*.parquet", "*validation*.json*"]),
    "arc_easy": ("allenai/ai2_arc", ["ARC-Easy/test*.parquet", "*ARC-Easy*test*.parquet", "*ARC-Easy*Test*.json*"]),
    "piqa": ("baber/piqa", ["*validation*.parquet", "*valid*.parquet", "*valid*.jsonl"]),
    "boolq": ("aps/super_glue", ["boolq/validation*.parquet", "*boolq*validation*.parquet"]),
    "copa": ("aps/super_glue", ["copa/validation*.parquet", "*copa*validation*.parquet"]),
    "rte": ("nyu-mll/glue", ["rte/validation*.parquet", "*rte*validation*.parquet"]),
    "mmlu": ("cais/mmlu", ["all/test-*.parquet", "*all*test*.parquet"]),
    "winogrande": ("allenai/winogrande", ["winogrande_xl/validation-*.parquet", "*winogrande_xl*validation*.parquet"]),
    "wikitext": ("EleutherAI/wikitext_document_level", ["wikitext-2-raw-v1/test*.parquet",
                                                        "*wikitext-2-raw-v1*test*.parquet"]),
}

DELIMITER = " "  # lm-eval's default target_delimiter, put before every choice


def lambada_example(row):
    text = row["text"]
    ctx, last = text.rsplit(" ", 1)
    return ctx, [" " + last], 0


def sciq_example(row):
    ctx = f"{row['support'].lstrip()}\nQuestion: {row['question']}\nAnswer:"
    return ctx, [row["distractor1"], row["distractor2"], row["distractor3"], row["correct_answer"]], 3


def _hellaswag_clean(text: str) -> str:
    text = text.strip()
    text = text.replace(" [title]", ". ")
    text = re.sub("\\[.*?\\]", "", text)
    return text.replace("  ", " ")


def hellaswag_example(row):
    ctx = row["ctx_a"] + " " + row["ctx_b"].capitalize()
    query = _hellaswag_clean(row["activity_label"] + ": " + ctx)
    return query, [_hellaswag_clean(e) for e in row["endings"]], int(row["label"])


def arc_example(row):
    ch = row["choices"]
    ctx = f"Question: {row['question']}\nAnswer:"
    return ctx, list(ch["text"]), list(ch["label"]).index(row["answerKey"])


def piqa_example(row):
    return f"Question: {row['goal']}\nAnswer:", [row["sol1"], row["sol2"]], int(row["label"])


def boolq_example(row):
    # super_glue's integer label; the original BoolQ release has a boolean "answer"
    label = int(row["label"]) if "label" in row else int(bool(row["answer"]))
    return f"{row['passage']}\nQuestion: {row['question']}?\nAnswer:", ["no", "yes"], label


def copa_example(row):
    connector = {"cause": "because", "effect": "therefore"}[row["question"]]
    ctx = row["premise"].strip()[:-1] + " " + connector  # the premise's final period goes

    def lowered(choice):
        return " " + choice[0].lower() + choice[1:]
    return ctx, [lowered(row["choice1"]), lowered(row["choice2"])], int(row["label"])


def rte_example(row):
    # GLUE's fields; SuperGLUE's copy of RTE names them premise / hypothesis
    first, second = (row["sentence1"], row["sentence2"]) if "sentence1" in row else (row["premise"], row["hypothesis"])
    return f"{first}\nQuestion: {second} True or False?\nAnswer:", ["True", "False"], int(row["label"])


def mmlu_example(row):
    subject = " ".join(row["subject"].split("_"))
    c = list(row["choices"])
    if len(c) != 4:
        raise RuntimeError(f"an MMLU row with {len(c)} choices (expected 4): {row['question'][:60]!r}")
    ctx = (f"The following are multiple choice questions (with answers) about {subject}.\n\n"
           f"{row['question'].strip()}\nA. {c[0]}\nB. {c[1]}\nC. {c[2]}\nD. {c[3]}\nAnswer:")
    return ctx, ["A", "B", "C", "D"], int(row["answer"])


def winogrande_example(row):
    sentence = row["sentence"]
    if sentence.count("_") != 1 or str(row["answer"]) not in ("1", "2"):
        raise RuntimeError(f"a Winogrande row needs one '_' and answer 1 or 2: {sentence[:60]!r}")
    i = sentence.index("_")
    contexts = [sentence[:i] + row["option1"], sentence[:i] + row["option2"]]
    return contexts, DELIMITER + sentence[i + 1:].strip(), int(row["answer"]) - 1


# lm-eval's wikitext detokenizer: the rules that undo WikiText's tokenization, in order
_WIKITEXT_RULES = [
    ("str", "s '", "s'"), ("re", r"/' [0-9]/", r"/'[0-9]/"),
    ("str", " @-@ ", "-"), ("str", " @,@ ", ","), ("str", " @.@ ", "."),
    ("str", " : ", ": "), ("str", " ; ", "; "), ("str", " . ", ". "), ("str", " ! ", "! "), ("str", " ? ", "? "),
    ("str", " , ", ", "),
    ("re", r"\(\s*([^\)]*?)\s*\)", r"(\1)"), ("re", r"\[\s*([^\]]*?)\s*\]", r"[\1]"),
    ("re", r"{\s*([^}]*?)\s*}", r"{\1}"), ("re", r"\"\s*([^\"]*?)\s*\"", r'"\1"'),
    ("re", r"'\s*([^']*?)\s*'", r"'\1'"),
    ("str", "= = = =", "===="), ("str", "= = =", "==="), ("str", "= =", "=="),
    ("str", " \u00b0 ", "\u00b0"), ("str", " \n", "\n"), ("str", "\n ", "\n"), ("str", " N ", " 1 "),
    ("str", " 's", "'s"),
]


def wikitext_detokenize(page: str) -> str:
    for how, old, new in _WIKITEXT_RULES:
        page = re.sub(old, new, page) if how == "re" else page.replace(old, new)
    return page


def wikitext_words(page: str) -> int:
    """Words of the original page, as lm-eval's wikitext counts them (split on whitespace runs;
    a leading or trailing run counts an empty word, as re.split does)."""
    return len(re.split(r"\s+", page))


def wikitext_example(row):
    return wikitext_detokenize(row["page"]), wikitext_words(row["page"])


# task -> (row -> example, kind)
EXAMPLES = {"lambada": (lambada_example, KIND_CLOZE), "lambada_standard": (lambada_example, KIND_CLOZE),
            "sciq": (sciq_example, KIND_MC),
            "hellaswag": (hellaswag_example, KIND_MC), "arc_easy": (arc_example, KIND_MC),
            "piqa": (piqa_example, KIND_MC), "boolq": (boolq_example, KIND_MC), "copa": (copa_example, KIND_MC),
            "rte": (rte_example, KIND_MC), "mmlu": (mmlu_example, KIND_MC),
            "winogrande": (winogrande_example, KIND_PARTIAL),
            "wikitext": (wikitext_example, KIND_ROLLING)}


def encode_example(task: str, row, tok) -> dict:
    fn, kind = EXAMPLES[task]
    if kind == KIND_ROLLING:
        text, words = fn(row)
        return make_rolling_item(tok, text, words)
    if kind == KIND_PARTIAL:
        contexts, continuation, gold = fn(row)
        return make_partial_item(tok, contexts, continuation, gold)
    ctx, choices, gold = fn(row)
    if kind == KIND_CLOZE:
        return make_item(tok, ctx, choices, gold)
    return make_item(tok, ctx, [DELIMITER + c for c in choices], gold, norm_lengths=[len(c) for c in choices])


def build(task: str, rows, tok, path, limit: int = 0) -> int:
    kind = EXAMPLES[task][1]
    items = []
    for row in rows:
        if kind == KIND_ROLLING and not row["page"].strip():
            continue  # lm-eval's wikitext pages are never empty; a blank row predicts nothing
        items.append(encode_example(task, row, tok))
        if limit and len(items) >= limit:
            break
    how = {KIND_MC: "0-shot multiple choice", KIND_CLOZE: "0-shot cloze", KIND_PARTIAL: "0-shot partial evaluation",
           KIND_ROLLING: "rolling log-likelihood, word perplexity"}[kind]
    write_evalset(path, items, kind, tok.vocab_size, f"{task}: lm-eval-style {how}, BOS prepended; {len(items)} items",
                  tokenizer=tokenizer_fingerprint(tok))
    return len(items)


def task_rows(task: str, local_files: list[str] | None = None):
    from hf import download, iter_rows, list_files
    if local_files:
        for f in local_files:
            yield from iter_rows(f)
        return
    repo, patterns = SOURCES[task]
    files = list_files(repo, patterns, first_match=True)
    for f in files:
        yield from iter_rows(download(repo, f))


def parse_files(specs: list[str]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for spec in specs:
        task, sep, paths = spec.partition("=")
        if not sep or task not in SOURCES:
            raise SystemExit(f"--files {spec!r}: expected TASK=PATH[,PATH...] with TASK one of {', '.join(SOURCES)}")
        for p in paths.split(","):
            found = sorted(glob.glob(p))
            if not found:
                raise SystemExit(f"--files {spec!r}: no file matches {p}")
            out.setdefault(task, []).extend(found)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokenizer", default="gpt2", help="'gpt2' or a SentencePiece .model")
    ap.add_argument("--out", required=True)
    ap.add_argument("--only", nargs="*", default=list(SOURCES), choices=list(SOURCES))
    ap.add_argument("--limit", type=int, default=0, help="at most this many items per task (0 = all)")
    ap.add_argument("--files", nargs="*", default=[], metavar="TASK=PATH",
                    help="read TASK from local files (the dataset's own format) instead of the Hub")
    args = ap.parse_args(argv)
    local = parse_files(args.files)
    from attnref.tokenizer import load_tokenizer
    try:
        tok = load_tokenizer(args.tokenizer)
    except RuntimeError as e:
        raise SystemExit(f"--tokenizer {args.tokenizer}: {e}")
    os.makedirs(args.out, exist_ok=True)
    for task in args.only:
        try:
            n = build(task, task_rows(task, local.get(task)), tok, os.path.join(args.out, f"{task}.bin"), args.limit)
        except RuntimeError as e:
            raise SystemExit(f"{task}: {e}")
        print(f"{task}: {n} items -> {args.out}/{task}.bin")


if __name__ == "__main__":
    main()
