"""The offline-testable parts of the network scripts: lm-eval prompt construction for the
benchmark eval sets (on rows written here in each dataset's schema) and the plain-text
corpus writer used by fineweb.py / tinyshakespeare.py."""
import numpy as np

import evals
from attnref.evalset import read_evalset
from attnref.shards import read_shard
from text_corpus import write_corpus


def test_lambada_sciq_arc_hellaswag_prompts(small_tok, tmp_path):
    ctx, conts, gold = evals.lambada_example({"text": "he looked at the old man and said hello"})
    assert (ctx, conts, gold) == ("he looked at the old man and said", [" hello"], 0)
    row = {"support": "  Mesophiles grow best in moderate temperature.", "question": "What grows best at moderate "
           "temperature?", "distractor1": "x", "distractor2": "y", "distractor3": "z", "correct_answer": "mesophiles"}
    ctx, conts, gold = evals.sciq_example(row)
    assert ctx == ("Mesophiles grow best in moderate temperature.\nQuestion: What grows best at moderate temperature?"
                   "\nAnswer:")
    assert conts == ["x", "y", "z", "mesophiles"] and gold == 3  # lm-eval's choices; the delimiter " " goes first
    row = {"question": "Which is a gas?", "choices": {"text": ["rock", "steam", "ice"], "label": ["A", "B", "C"]},
           "answerKey": "B"}
    assert evals.arc_example(row) == ("Question: Which is a gas?\nAnswer:", ["rock", "steam", "ice"], 1)
    row = {"activity_label": "Baking cookies", "ctx_a": "A woman mixes dough.", "ctx_b": "she",
           "endings": ["puts it [title] in the oven.", "eats  it.", "a", "b"], "label": "0"}
    ctx, conts, gold = evals.hellaswag_example(row)
    assert ctx == "Baking cookies: A woman mixes dough. She"
    assert conts == ["puts it.  in the oven.".replace("  ", " "), "eats it.", "a", "b"] and gold == 0
    n = evals.build("sciq", [evals_row for evals_row in [{**row_sciq()}] * 3], small_tok, tmp_path / "s.bin")
    e = read_evalset(tmp_path / "s.bin")
    assert n == 3 and len(e["items"]) == 3 and e["items"][0]["gold"] == 3
    it = e["items"][0]
    assert small_tok.decode(it["context"][1:]) + small_tok.decode(it["choices"][3]) == (
        "Plants make food.\nQuestion: What do plants make?\nAnswer: food")
    assert it["choice_chars"] == [len("light"), len("air"), len("soil"), len("food")]  # lm-eval's acc_norm length


def row_sciq():
    return {"support": "Plants make food.", "question": "What do plants make?", "distractor1": "light",
            "distractor2": "air", "distractor3": "soil", "correct_answer": "food"}


def test_text_corpus_writer(small_tok, tmp_path, kjv_chapters):
    texts = [c["text"] for c in kjv_chapters[:40]]
    s = write_corpus(texts, small_tok.model_file, tmp_path, "tc", shard_tokens=20000, val_tokens=5000, workers=2,
                     chunk=4)
    assert s["val"]["docs"] + s["train"]["docs"] == 40 and s["val"]["tokens"] >= 5000
    ids = []
    for split in ("val", "train"):
        ids += np.concatenate([read_shard(p) for p in sorted(tmp_path.glob(f"tc_{split}_*.bin"))]).tolist()
    want = []
    for t in texts:
        want += [small_tok.bos_id] + small_tok.encode(t) + [small_tok.eos_id]
    assert ids == want
