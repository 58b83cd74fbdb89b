"""
The knowledge corpus: dictionary entries as documents and SYNTH-format exercises whose
answers are dictionary facts, from the dictd databases of Debian's dict-gcide (Webster's
1913 + GCIDE additions), dict-wn (WordNet 3.0), dict-foldoc (computing) and dict-jargon
(the Jargon File). Nothing of their text is in this repository: it is read at build time.

Documents: one per definition block (dictd.Entry), its layout reflowed (logical_lines):
wrapped lines joined, indentation and the {cross-reference} braces dropped, GCIDE's
source tags ("[1913 Webster]") dropped.

Facts (EXTRACTORS: wordnet_facts, gcide_facts, ...), each a question with one answer:
  pos        the parts of speech WordNet / GCIDE / the Jargon File give a headword
  define     a WordNet sense's gloss (by part of speech and sense number), GCIDE's first
             definition of a headword's entry, FOLDOC's and the Jargon File's first sentence
  synonym    the other words of a WordNet sense (its [syn: ...] list)
  antonym    a WordNet sense's [ant: ...] list
  etymology  the bracket after a GCIDE entry's part of speech ("[AS. docga; akin to ...]")
  category   FOLDOC's <category> of a headword

Split (split_groups, split_of): by headword group, so every database's entry for a word lands
on the same side, and so does every word that shares a WordNet gloss with it (a gloss belongs
to a synset, and each member's entry states it): words joined by shared glosses form a group,
and crc32(the group's first key) % VAL_EVERY == VAL_EVERY - 1 holds the group out (about 5%).
One group is far larger than the rest (WordNet's core vocabulary, 27,699 of 220,526 keys): a
group of more than MAX_HELD_GROUP keys always trains. The held-out entries' documents are the
val documents; their facts are asked only in context (dict_lookup: the entry is in the query).
The training entries' facts are split again, 1 in VAL_EVERY (fact_unit: a WordNet gloss as a
whole, so a synset's members' questions fall together): those are asked in val exercises only,
so a val parametric question asks a fact that training states only in entry documents (its
own, and a shared gloss's synset members'), never in an exercise: training lookups quote no
entry that states a val fact, and MCQ distractors are drawn from the split's own facts.

Exercises (SYNTH columns, ChatML regions as synth_generator's):
  parametric  dict_define, dict_pos, dict_synonym, dict_antonym, dict_etymology,
              dict_category: a bare question; dict_mcq: a WordNet gloss among four
  in-context  dict_lookup: the entry's text, then a question whose answer is in it

fact_counts: distinct facts per database and kind, and per kind the entropy of its answers
(bits per fact: a part of speech is one of 39 answers, 1.7 bits).

Cost: load() of all four databases takes about 15 s of one core and 1.5 GB of memory
(288K entries, 64M characters, 772K facts).
"""
from __future__ import annotations

import math
import random
import re
import zlib
from collections import Counter
from dataclasses import dataclass

from dictd import Entry, read_database

DATABASES = ("gcide", "wn", "foldoc", "jargon")
SOURCE_NAME = {"gcide": "Webster's dictionary", "wn": "WordNet", "foldoc": "FOLDOC", "jargon": "the Jargon File"}
VAL_EVERY = 20
MAX_HELD_GROUP = 1000  # a headword group larger than this is never held out (split_groups)
MAX_ANSWER_CHARS = 320
PARAMETRIC = ("dict_define", "dict_pos", "dict_synonym", "dict_antonym", "dict_etymology", "dict_category",
              "dict_mcq")
CONTEXT = ("dict_lookup",)

_SOURCE_TAG = re.compile(r"^\s*\[(?:[^\]]*(?:Webster|PJC|WordNet|Century|RHD|MW|Chambers)[^\]]*)\]\s*$")
_LIST_ITEM = re.compile(r"^(?:\d+\.|(?:n|v|adj|adv) \d+:|\d+:|[a-z]\)|\([a-z]\)|[-*] )")
_SENTENCE_END = re.compile(r"(?<=[a-z)][a-z)])\. (?=[A-Z(\"])")  # not after "e.g"
_SPACES = re.compile(r"[ \t]{2,}")


def logical_lines(text: str, headwords=()) -> list[str]:
    """The block's lines with wrapped lines joined; "" between paragraphs; braces kept.

    Leading lines that are just a headword (WordNet, FOLDOC, the Jargon File) stand alone.
    After them a physical line continues the current logical line unless a blank line came
    before it, it is indented less than the logical line's first line, or it is indented as
    much and starts a numbered sense or list item.
    """
    out: list[str] = []
    first_indent = None
    blank_before = True
    in_headwords = True
    for raw in text.split("\n"):
        if _SOURCE_TAG.match(raw):
            continue
        stripped = raw.strip()
        if not stripped:
            blank_before = True
            continue
        indent = len(raw) - len(raw.lstrip(" \t"))
        alone = in_headwords and stripped.lower() in headwords
        in_headwords = alone
        new = (alone or blank_before or first_indent is None or indent < first_indent
               or (indent == first_indent and _LIST_ITEM.match(stripped)))
        if new:
            if out and blank_before:
                out.append("")
            out.append(stripped)
            first_indent = indent
        elif out[-1].endswith("-") and out[-1][-2:-1].isalpha():
            out[-1] += stripped  # a word hyphenated at the wrap
        else:
            out[-1] += " " + stripped
        blank_before = False
        if alone:
            first_indent = None
    return [_SPACES.sub(" ", line) for line in out]


def document_text(lines: list[str]) -> str:
    return "\n".join(lines).replace("{", "").replace("}", "")


def headword_key(word: str) -> str:
    return word.strip().lower()


def split_of(key: str, val_every: int = VAL_EVERY) -> str:
    """'val' for 1 in val_every keys (stable: a CRC-32 of the key), else 'train'."""
    return "val" if zlib.crc32(key.encode("utf-8")) % val_every == val_every - 1 else "train"


@dataclass
class Fact:
    source: str       # database
    kind: str         # pos, define, synonym, antonym, etymology, category
    word: str         # the headword as the entry writes it
    question: str     # what is asked (without the word's quotes around it)
    answer: str
    key: str          # the headword key (split_of)
    entry: int        # index of the entry (document) that states it

    def fact_id(self) -> tuple:
        return (self.source, self.kind, self.key, self.question, self.answer)


def _clip(text: str, limit: int = MAX_ANSWER_CHARS) -> str:
    """text cut to at most limit characters at a clause end (';', '.', ',') when it is longer."""
    text = text.strip().replace("{", "").replace("}", "")
    if len(text) <= limit:
        return text
    cut = max(text.rfind(c, 0, limit) for c in ";.,")
    return text[:cut].rstrip(" ;,") + "." if cut > limit // 3 else text[:limit].rsplit(" ", 1)[0] + " ..."


def _stop(text: str) -> str:
    """text ended by a full stop unless it ends in one already."""
    return text if text.endswith((".", "!", "?", "...")) else text + "."


def _braced(text: str) -> list[str]:
    return [w.strip() for w in re.findall(r"\{([^{}]*)\}", text)]


WN_POS = {"n": "noun", "v": "verb", "adj": "adjective", "adv": "adverb"}
_WN_SENSE = re.compile(r"^(?:(n|v|adj|adv) )?(\d+): (.*)$")


def wordnet_facts(word: str, lines: list[str], key: str, index: int) -> list[Fact]:
    facts, pos_seen, pos = [], [], None
    for line in lines[1:]:
        m = _WN_SENSE.match(line)
        if m is None:
            continue
        pos = m.group(1) or pos
        if pos is None:
            continue
        sense, body = int(m.group(2)), m.group(3)
        if WN_POS[pos] not in pos_seen:
            pos_seen.append(WN_POS[pos])
        gloss = re.split(r'; "|\s\[(?:syn|ant):', body)[0].strip().rstrip(";")
        where = f"sense {sense} of the {WN_POS[pos]}"
        if gloss:
            facts.append(Fact("wn", "define", word, f"{where} '{word}' in WordNet", _clip(gloss), key, index))
        for kind, tag in (("synonym", "syn"), ("antonym", "ant")):
            m2 = re.search(r"\[" + tag + r": ((?:\{[^{}]*\}(?:, )?)+)\]", body)
            words = _braced(m2.group(1)) if m2 else []
            words = [w for w in words if w.lower() != key]
            if words:
                facts.append(Fact("wn", kind, word, f"{where} '{word}' in WordNet", ", ".join(words), key, index))
    if pos_seen:
        facts.append(Fact("wn", "pos", word, f"'{word}' in WordNet", " and ".join(pos_seen), key, index))
    return facts


GCIDE_POS = [("v. t.", "transitive verb"), ("v. i.", "intransitive verb"), ("n. pl.", "plural noun"),
             ("p. p.", "past participle"), ("p. a.", "participial adjective"), ("p. pr.", "present participle"),
             ("n.", "noun"), ("a.", "adjective"), ("adv.", "adverb"), ("prep.", "preposition"),
             ("conj.", "conjunction"), ("interj.", "interjection"), ("pron.", "pronoun"), ("v.", "verb"),
             ("imp.", "past tense")]
_GCIDE_HEAD = re.compile(r"^(?P<word>[^\\]+?) \\[^\\]+\\(?: \([^)]*\))?,? (?P<rest>.*)$")
_NOT_ETYMOLOGY = re.compile(r"^(?:imp\.|pl\.|p\. |Obs|Colloq|R\.|Archaic|Written|Prov|Rare|Poetic|Slang|Scot|"
                            r"Local|U\. S|Eng|Law|Cant|Vulgar|Low)")


def _bracket_after(text: str, start: int) -> tuple[str, int] | None:
    """The balanced [...] that starts at text[start] ('[' expected), and the index after it."""
    if start >= len(text) or text[start] != "[":
        return None
    depth = 0
    for i in range(start, len(text)):
        depth += {"[": 1, "]": -1}.get(text[i], 0)
        if depth == 0:
            return text[start + 1:i], i + 1
    return None


def gcide_facts(word: str, lines: list[str], key: str, index: int) -> list[Fact]:
    m = _GCIDE_HEAD.match(lines[0]) if lines else None
    if m is None:
        return []
    rest = m.group("rest")
    pos = next((name for abbr, name in GCIDE_POS if rest.startswith(abbr)), None)
    if pos is None:
        return []
    facts = [Fact("gcide", "pos", word, f"'{word}' in Webster's dictionary", pos, key, index)]
    after = rest[next(len(a) for a, n in GCIDE_POS if n == pos):].lstrip()
    etymology = None
    while after.startswith("["):  # the head's brackets: inflections, etymology, usage labels
        got = _bracket_after(after, 0)
        if got is None:
            break
        inner, end = got
        after = after[end:].lstrip()
        # ("?" is a character the conversion lost: no fact to state)
        if (etymology is None and "?" not in inner and not _NOT_ETYMOLOGY.match(inner)
                and re.search(r"[A-Z][A-Za-z]*\.|\bfr\.|\+", inner)):
            etymology = inner
    if etymology is not None:
        facts.append(Fact("gcide", "etymology", word, f"the {pos} '{word}' in Webster's dictionary",
                          _clip(etymology), key, index))
    # the definition: what follows the head's brackets, or else the first line that is not a
    # note, a synonym list or a quotation ("... --Shak.")
    candidates = [after] + [ln for ln in lines[1:] if not ln.startswith(("Note:", "Syn.", "Syn:", '"'))]
    for text in candidates:
        definition = re.sub(r"^(?:\d+\. )?(?:\([A-Z][A-Za-z. ]*\) )?", "", text).strip()
        if len(definition) > 8 and not re.search(r" --\s?[A-Z][^.]*\.?$", definition):
            facts.append(Fact("gcide", "define", word, f"the {pos} '{word}' in Webster's dictionary",
                              _clip(definition), key, index))
            break
    return facts


_FOLDOC_CATEGORY = re.compile(r"^<([^<>]+)> (?:\([^)]*\) )?(.*)$")


def foldoc_facts(word: str, lines: list[str], key: str, index: int) -> list[Fact]:
    for line in lines[1:]:
        m = _FOLDOC_CATEGORY.match(line)
        if m:
            facts = [Fact("foldoc", "category", word, f"'{word}' in FOLDOC", m.group(1), key, index)]
            first = re.split(_SENTENCE_END, m.group(2))[0].rstrip(".")
            if len(first) > 8:
                facts.append(Fact("foldoc", "define", word, f"'{word}' in FOLDOC", _stop(_clip(first)), key, index))
            return facts
    return []


JARGON_POS = {"n.": "noun", "adj.": "adjective", "v.": "verb", "vt.": "transitive verb", "vi.": "intransitive verb",
              "adv.": "adverb", "interj.": "interjection", "excl.": "exclamation", "prep.": "preposition"}


def jargon_facts(word: str, lines: list[str], key: str, index: int) -> list[Fact]:
    facts = []
    # the line after the headword: its pronunciation ("/an'see/,") and part of speech ("n., vt.")
    header = re.sub(r"^/[^/]*/,?\s*", "", lines[1])
    pos = [JARGON_POS[p] for p in re.split(r",\s*", header) if p in JARGON_POS]
    if pos:
        facts.append(Fact("jargon", "pos", word, f"'{word}' in the Jargon File", " and ".join(pos), key, index))
    body = [ln for ln in lines[2 if pos or header != lines[1] else 1:] if ln]
    if body:
        text = re.sub(r"^(?:\[[^\]]*\] )?(?:\d+\. )?(?:(?:n|adj|v|vt|vi|adv|interj)\. )?(?:\[[^\]]*\] )?", "", body[0])
        first = re.split(_SENTENCE_END, text)[0].rstrip(".")
        if len(first) > 8:
            facts.append(Fact("jargon", "define", word, f"'{word}' in the Jargon File", _stop(_clip(first)), key,
                              index))
    return facts


EXTRACTORS = {"wn": wordnet_facts, "gcide": gcide_facts, "foldoc": foldoc_facts, "jargon": jargon_facts}


@dataclass
class Corpus:
    documents: list[dict]   # {"source", "word", "key", "split", "text"}, one per entry
    facts: list[Fact]       # distinct facts (fact_id), in reading order
    key_split: dict         # headword key -> 'train' | 'val' (split_groups)
    val_every: int = VAL_EVERY

    def fact_split(self, fact: Fact) -> str:
        """Which exercises may ask a fact: 'context' for held-out entries, else 'train' or 'val'."""
        if self.key_split[fact.key] == "val":
            return "context"
        return split_of(fact_unit(fact), self.val_every)


def display_word(entry: Entry) -> str:
    """The headword as the block's first line writes it (the indexes lower-case it)."""
    first = entry.text.split("\n", 1)[0].split("\\")[0].strip()
    return first if first.lower() == entry.headwords[0] else entry.headwords[0]


def fact_unit(fact: Fact) -> str:
    """What the fact split holds out together: a WordNet gloss with every sense that states it
    (its synset's members), any other fact alone."""
    if fact.source == "wn" and fact.kind == "define":
        return "wn\tdefine\t" + fact.answer
    return "\t".join(map(str, fact.fact_id()))


def split_groups(keys, facts: list[Fact], val_every: int = VAL_EVERY) -> dict:
    """key -> 'train' | 'val': keys that share a WordNet gloss are one group (union-find), held out
    together by split_of(the group's first key); a group of more than MAX_HELD_GROUP keys trains."""
    parent = {k: k for k in keys}

    def root(k):
        while parent[k] != k:
            parent[k] = parent[parent[k]]
            k = parent[k]
        return k
    first_key = {}
    for f in facts:
        if f.source == "wn" and f.kind == "define":
            other = first_key.setdefault(f.answer, f.key)
            a, b = root(other), root(f.key)
            if a != b:
                parent[max(a, b)] = min(a, b)  # the root is the group's first key
    size = Counter(root(k) for k in parent)
    return {k: "train" if size[root(k)] > MAX_HELD_GROUP else split_of(root(k), val_every) for k in parent}


def load(directory: str, databases=DATABASES, val_every: int = VAL_EVERY) -> Corpus:
    documents, facts, seen = [], [], set()
    for name in databases:
        for entry in read_database(directory, name):
            lines = logical_lines(entry.text, entry.headwords)
            if not lines or (len(lines) == 1 and lines[0].lower() in entry.headwords):
                continue  # a headword without a definition
            word, key = display_word(entry), headword_key(entry.headwords[0])
            index = len(documents)
            documents.append({"source": name, "word": word, "key": key, "text": document_text(lines)})
            for fact in EXTRACTORS[name](word, lines, key, index):
                if fact.fact_id() not in seen:
                    seen.add(fact.fact_id())
                    facts.append(fact)
    key_split = split_groups(sorted({d["key"] for d in documents}), facts, val_every)
    for d in documents:
        d["split"] = key_split[d["key"]]
    return Corpus(documents, facts, key_split, val_every)


KIND_NAME = {"pos": "part of speech", "define": "definition", "synonym": "synonyms", "antonym": "antonyms",
             "etymology": "etymology", "category": "category"}
QUESTIONS = {
    "pos": ["Which part of speech is {q}?", "What part of speech does {q} have?"],
    "define": ["What does {q} mean?", "Give the definition of {q}.", "How is {q} defined?"],
    "synonym": ["Give the synonyms of {q}.", "Which words mean the same as {q}?"],
    "antonym": ["Give the antonyms of {q}.", "Which words mean the opposite of {q}?"],
    "etymology": ["What is the etymology of {q}?", "Where does {q} come from?"],
    "category": ["What kind of thing is {q}?", "Which category does {q} belong to?"],
}


def _cap(text: str) -> str:
    return text[:1].upper() + text[1:]


def _article(text: str) -> str:
    return "an" if text[:1].lower() in "aeiou" else "a"


def answer_sentence(fact: Fact) -> str:
    """The answer a document gives: the fact, stated with its question."""
    q = fact.question
    return {
        "pos": f"{_cap(q)} is {_article(fact.answer)} {fact.answer}.",
        "define": f"{_cap(q)}: {fact.answer}",
        "synonym": f"Synonyms of {q}: {fact.answer}.",
        "antonym": f"Antonyms of {q}: {fact.answer}.",
        "etymology": f"Etymology of {q}: {fact.answer}",
        "category": f"{_cap(q)} is {_article(fact.answer)} {fact.answer}.",
    }[fact.kind]


def parametric_exercise(fact: Fact, rng: random.Random) -> tuple[str, str, str, str]:
    """(exercise, query, reasoning, answer): a bare question (like the generator's recall)."""
    query = rng.choice(QUESTIONS[fact.kind]).format(q=fact.question)
    answer = answer_sentence(fact)
    reasoning = "" if rng.random() < 0.3 else (
        f"The question asks for the {KIND_NAME[fact.kind]} of {fact.question}. "
        f"I recall the entry for '{fact.word}' in {SOURCE_NAME[fact.source]}: {_stop(fact.answer)}")
    return f"dict_{fact.kind}", query, reasoning, answer


def mcq_exercise(fact: Fact, distractors: list[str], rng: random.Random) -> tuple[str, str, str, str]:
    """Four definitions, one right (like the generator's mcq)."""
    options = distractors + [fact.answer]
    rng.shuffle(options)
    gold = "ABCD"[options.index(fact.answer)]
    query = f"Which of these is {fact.question}?\n" + "\n".join(f"{'ABCD'[i]}) {o}" for i, o in enumerate(options))
    reasoning = f"I need {fact.question}. I recall that it is: {_stop(fact.answer)} That is option {gold}."
    return "dict_mcq", query, reasoning, f"{gold}) {fact.answer}"


def lookup_exercise(fact: Fact, entry_text: str, rng: random.Random) -> tuple[str, str, str, str]:
    """The entry in the query, then a question it answers (like the generator's rag)."""
    question = rng.choice(QUESTIONS[fact.kind]).format(q=fact.question)
    query = f"Read the dictionary entry and answer the question.\n\n{entry_text}\n\nQuestion: {question}"
    reasoning = (f"The entry is from {SOURCE_NAME[fact.source]}. It gives the {KIND_NAME[fact.kind]} of "
                 f"{fact.question}: {_stop(fact.answer)} So that is the answer.")
    return "dict_lookup", query, reasoning, answer_sentence(fact)


MAX_LOOKUP_CHARS = 1200  # entries longer than this are not quoted in a query
LOOKUP_SHARE, MCQ_SHARE = 0.25, 0.1
# which kind of fact a question asks (then a fact of that kind, uniformly): by the facts' counts
# a third would be parts of speech, mostly "noun"
KIND_WEIGHTS = {"define": 0.4, "synonym": 0.2, "pos": 0.12, "etymology": 0.12, "category": 0.08, "antonym": 0.08}


def _by_kind(facts: list[Fact]) -> dict[str, list[Fact]]:
    pools: dict[str, list[Fact]] = {}
    for f in facts:
        pools.setdefault(f.kind, []).append(f)
    return pools


def _pick(pools: dict[str, list[Fact]], rng: random.Random) -> Fact:
    kinds = sorted(pools)
    return rng.choice(pools[rng.choices(kinds, [KIND_WEIGHTS[k] for k in kinds])[0]])


def exercises(corpus: Corpus, split: str, num_docs: int, seed: int):
    """Yields num_docs SYNTH-format documents for split ('train' or 'val'), deterministic in seed.

    train: questions about the training facts (parametric, mcq) and lookups of training entries
    that state no val fact; val: parametric questions about the held-out facts of training
    entries, lookups of held-out entries. Shares: LOOKUP_SHARE lookups, MCQ_SHARE four-way
    WordNet definitions (the distractors: other glosses the split asks), the rest bare questions.
    """
    rng = random.Random(seed)
    side = {id(f): corpus.fact_split(f) for f in corpus.facts}
    asked = _by_kind([f for f in corpus.facts if side[id(f)] == split])
    states_val = {f.entry for f in corpus.facts if side[id(f)] == "val"}  # (a shared gloss: every member's)
    quoted = _by_kind([f for f in corpus.facts if len(corpus.documents[f.entry]["text"]) <= MAX_LOOKUP_CHARS
                       and (side[id(f)] == "context" if split == "val"
                            else side[id(f)] == "train" and f.entry not in states_val)])
    mcq = [f for f in asked.get("define", []) if f.source == "wn"]
    glosses = sorted({f.answer for f in mcq})
    if not asked or not quoted:
        raise ValueError(f"no {split} facts to ask (facts: {len(corpus.facts)}); the dictionaries are too small")
    for i in range(num_docs):
        mode = rng.random()
        if mode < LOOKUP_SHARE:
            fact = _pick(quoted, rng)
            ex, q, r, a = lookup_exercise(fact, corpus.documents[fact.entry]["text"], rng)
        elif mode < LOOKUP_SHARE + MCQ_SHARE and mcq and len(glosses) > 3:
            fact = rng.choice(mcq)
            distractors = set()
            while len(distractors) < 3:
                g = rng.choice(glosses)
                if g != fact.answer:
                    distractors.add(g)
            ex, q, r, a = mcq_exercise(fact, sorted(distractors), rng)
        else:
            fact = _pick(asked, rng)
            ex, q, r, a = parametric_exercise(fact, rng)
        yield {"synth_id": f"dict_{split}_{seed}_{i}", "language": "en", "exercise": ex, "query": q,
               "synthetic_reasoning": r, "synthetic_answer": a,
               "meta": {"source": fact.source, "kind": fact.kind, "key": fact.key, "answer": fact.answer}}


def answer_bits(answers: list[str]) -> float:
    """The entropy (bits) of the answers' empirical distribution: what naming one answer among
    the kind's answers carries, on average (a fact's text may carry more; none carries less)."""
    n = len(answers)
    return -sum(c / n * math.log2(c / n) for c in Counter(answers).values()) if n else 0.0


def fact_counts(corpus: Corpus) -> dict:
    """Distinct facts per database and kind, and in all; per kind its facts, distinct answers and
    answer entropy (bits per fact, and bits = facts x bits per fact)."""
    counts: dict = {}
    answers: dict = {}
    for f in corpus.facts:
        counts.setdefault(f.source, {}).setdefault(f.kind, 0)
        counts[f.source][f.kind] += 1
        answers.setdefault(f.kind, []).append(f.answer)
    by_kind = {}
    for kind, a in sorted(answers.items()):
        bits = answer_bits(a)
        by_kind[kind] = {"facts": len(a), "answers": len(set(a)), "bits_per_fact": round(bits, 3),
                         "bits": round(bits * len(a))}
    return {"total": len(corpus.facts), "by_source": counts, "by_kind": by_kind}
