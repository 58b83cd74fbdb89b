"""
Benchmark eval sets -> eval .bin (dev/data/evalset.py; doc/formats.md, "Eval sets"),
following lm-evaluation-harness's 0-shot prompts (the SAN paper, "Evaluation conventions";
BOS prepended to every context). Downloads from the Hugging Face Hub (needs the network).

  lambada    EleutherAI/lambada_openai (en, test): cloze, context = text without its last
             word, target = " " + last word
  sciq       allenai/sciq (test): "{support}\\nQuestion: {question}\\nAnswer:", choices
             " {distractor1..3}", " {correct_answer}" (gold 3)
  hellaswag  Rowan/hellaswag (validation): "{activity_label}: {ctx_a} {ctx_b.capitalize()}"
             cleaned as lm-eval does, four endings
  arc_easy   allenai/ai2_arc (ARC-Easy, test): "Question: {question}\\nAnswer:", " {choice}"

  python dev/data/evals.py --tokenizer gpt2 --out data/evals_gpt2 [--only sciq lambada] [--limit N]
"""
from __future__ import annotations

import argparse
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from evalset import KIND_CLOZE, KIND_MC, make_item, write_evalset  # noqa: E402

# (repo, file patterns) per task; the first matching files are read
SOURCES = {
    "lambada": ("EleutherAI/lambada_openai", ["*en*test*.parquet", "*en/test*.parquet", "*test*en*.jsonl",
                                              "*lambada_test_en*"]),
    "sciq": ("allenai/sciq", ["*test*.parquet", "*test*.json*"]),
    "hellaswag": ("Rowan/hellaswag", ["*validation*.parquet", "*val*.parquet", "*validation*.json*"]),
    "arc_easy": ("allenai/ai2_arc", ["ARC-Easy/test*.parquet", "*ARC-Easy*test*.parquet", "*ARC-Easy*Test*.json*"]),
}


def lambada_example(row):
    text = row["text"]
    ctx, last = text.rsplit(" ", 1)
    return ctx, [" " + last], 0


def sciq_example(row):
    ctx = f"{row['support'].lstrip()}\nQuestion: {row['question']}\nAnswer:"
    choices = [row["distractor1"], row["distractor2"], row["distractor3"], row["correct_answer"]]
    return ctx, [" " + c for c in choices], 3


def _hellaswag_clean(text: str) -> str:
    text = text.strip()
    text = text.replace(" [title]", ". ")
    text = re.sub("\\[.*?\\]", "", text)
    return text.replace("  ", " ")


def hellaswag_example(row):
    ctx = row["ctx_a"] + " " + row["ctx_b"].capitalize()
    query = _hellaswag_clean(row["activity_label"] + ": " + ctx)
    return query, [" " + _hellaswag_clean(e) for e in row["endings"]], int(row["label"])


def arc_example(row):
    ch = row["choices"]
    ctx = f"Question: {row['question']}\nAnswer:"
    return ctx, [" " + t for t in ch["text"]], list(ch["label"]).index(row["answerKey"])


EXAMPLES = {"lambada": (lambada_example, KIND_CLOZE), "sciq": (sciq_example, KIND_MC),
            "hellaswag": (hellaswag_example, KIND_MC), "arc_easy": (arc_example, KIND_MC)}


def build(task: str, rows, tok, path, limit: int = 0) -> int:
    fn, kind = EXAMPLES[task]
    items = []
    for row in rows:
        ctx, conts, gold = fn(row)
        items.append(make_item(tok, ctx, conts, gold))
        if limit and len(items) >= limit:
            break
    write_evalset(path, items, kind, tok.vocab_size,
                  f"{task}: lm-eval-style 0-shot, BOS prepended; {len(items)} items")
    return len(items)


def task_rows(task: str):
    from hf import download, iter_rows, list_files
    repo, patterns = SOURCES[task]
    for pattern in patterns:  # the first pattern that matches decides (no duplicate copies)
        try:
            files = list_files(repo, [pattern])
        except RuntimeError:
            continue
        for f in files:
            yield from iter_rows(download(repo, f))
        return
    raise RuntimeError(f"{task}: no data file in {repo} matches any of {patterns}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokenizer", default="gpt2", help="'gpt2' or a SentencePiece .model")
    ap.add_argument("--out", required=True)
    ap.add_argument("--only", nargs="*", default=list(SOURCES), choices=list(SOURCES))
    ap.add_argument("--limit", type=int, default=0, help="at most this many items per task (0 = all)")
    args = ap.parse_args()
    from tokenizer import load_tokenizer
    tok = load_tokenizer(args.tokenizer)
    os.makedirs(args.out, exist_ok=True)
    for task in args.only:
        n = build(task, task_rows(task), tok, os.path.join(args.out, f"{task}.bin"), args.limit)
        print(f"{task}: {n} items -> {args.out}/{task}.bin")


if __name__ == "__main__":
    main()
