"""
The King James Bible from the Debian package bible-kjv (its `bible` program decodes the
text): an offline real-English corpus. One document per chapter: a heading line
"<Book> <chapter>" and then one verse per line (without verse numbers).
"""
from __future__ import annotations

import re
import shutil
import subprocess

BOOKS = ["Genesis", "Exodus", "Leviticus", "Numbers", "Deuteronomy", "Joshua", "Judges", "Ruth",
         "1 Samuel", "2 Samuel", "1 Kings", "2 Kings", "1 Chronicles", "2 Chronicles", "Ezra", "Nehemiah",
         "Esther", "Job", "Psalms", "Proverbs", "Ecclesiastes", "Song of Solomon", "Isaiah", "Jeremiah",
         "Lamentations", "Ezekiel", "Daniel", "Hosea", "Joel", "Amos", "Obadiah", "Jonah", "Micah", "Nahum",
         "Habakkuk", "Zephaniah", "Haggai", "Zechariah", "Malachi", "Matthew", "Mark", "Luke", "John", "Acts",
         "Romans", "1 Corinthians", "2 Corinthians", "Galatians", "Ephesians", "Philippians", "Colossians",
         "1 Thessalonians", "2 Thessalonians", "1 Timothy", "2 Timothy", "Titus", "Philemon", "Hebrews",
         "James", "1 Peter", "2 Peter", "1 John", "2 John", "3 John", "Jude", "Revelation"]

_VERSE = re.compile(r"^(\S+?)(\d+):(\d+) (.*)$")


def raw_verses() -> list[tuple[str, int, int, str]]:
    """(book abbreviation, chapter, verse, text) for all 31,102 verses, in order."""
    exe = shutil.which("bible")
    if exe is None:
        raise RuntimeError("the `bible` program is missing: install the Debian package bible-kjv "
                           "(bash scripts/setup.sh does)")
    # -f turns pretty-printing off: one verse per line, prefixed with its reference
    out = subprocess.run([exe, "-f", "gen1:1-rev22:21"], stdin=subprocess.DEVNULL, capture_output=True,
                         check=True).stdout.decode("utf-8")
    verses = []
    for line in out.splitlines():
        m = _VERSE.match(line)
        if m is None:
            if line.strip():
                raise RuntimeError(f"unexpected line from `bible`: {line[:80]!r}")
            continue
        verses.append((m.group(1), int(m.group(2)), int(m.group(3)), m.group(4).strip()))
    if len(verses) < 31000:
        raise RuntimeError(f"`bible` printed only {len(verses)} verses")
    return verses


def chapters() -> list[dict]:
    """[{book, chapter, verses: [text...], text}] in canonical order (1,189 chapters)."""
    out, abbrevs = [], []
    for abbr, ch, _v, text in raw_verses():
        if not abbrevs or abbrevs[-1] != abbr:
            abbrevs.append(abbr)
        if not out or out[-1]["abbr"] != abbr or out[-1]["chapter"] != ch:
            out.append({"abbr": abbr, "chapter": ch, "verses": []})
        out[-1]["verses"].append(text)
    if len(abbrevs) != len(BOOKS):
        raise RuntimeError(f"expected {len(BOOKS)} books, found {len(abbrevs)}")
    names = dict(zip(abbrevs, BOOKS))
    for c in out:
        c["book"] = names[c["abbr"]]
        c["text"] = f"{c['book']} {c['chapter']}\n" + "\n".join(c["verses"])
    return out


def split(chs: list[dict], val_every: int = 20):
    """Deterministic train/val split: every val_every-th chapter goes to validation."""
    train = [c for i, c in enumerate(chs) if i % val_every != val_every - 1]
    val = [c for i, c in enumerate(chs) if i % val_every == val_every - 1]
    return train, val
