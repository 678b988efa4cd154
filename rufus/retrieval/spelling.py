"""Words as the search index sees them: the stemmer FTS5 uses, typo distance, common English
words (never typos) and how a category key reads to a customer."""

from __future__ import annotations

import functools
import re
from pathlib import Path

# Common English words (lab/common_words.py writes the list): never typos, even when the
# catalog lacks them ("firm" is not "fire").
COMMON_WORDS_PATH = Path(__file__).with_name("common_words.txt")


@functools.cache
def common_words() -> frozenset[str]:
    """The words in :data:`COMMON_WORDS_PATH` (read once; empty if the file is missing)."""
    try:
        text = COMMON_WORDS_PATH.read_text()
    except FileNotFoundError:
        return frozenset()
    return frozenset(line.strip() for line in text.splitlines()
                     if line.strip().isalpha())  # the "# ..." header line is no word


_WORD = re.compile(r"[a-z0-9]+")
_QUERY_WORD = re.compile(r"[A-Za-z0-9]+(?:['\u2019][A-Za-z]+)?")


def words(text: str) -> list[str]:
    """Lower-case words as the index sees them (apostrophes dropped: "Levi's" -> "levis")."""
    return _WORD.findall(text.lower().replace("'", "").replace("\u2019", ""))


def _cons(w: str, i: int) -> bool:
    c = w[i]
    if c in "aeiou":
        return False
    return c != "y" or i == 0 or not _cons(w, i - 1)


def _measure(w: str) -> int:
    n, vowel = 0, False
    for i in range(len(w)):
        v = not _cons(w, i)
        n += int(vowel and not v)
        vowel = v
    return n


def _has_vowel(w: str) -> bool:
    return any(not _cons(w, i) for i in range(len(w)))


def stem1(w: str) -> str:
    """Porter stemmer step 1 (plurals, -ed, -ing, -y): the part of FTS5's porter tokenizer
    that decides whether "shoe", "shoes", "hike" and "hiking" are the same word."""
    if len(w) <= 2:
        return w
    if w.endswith(("sses", "ies")):
        w = w[:-2]
    elif w.endswith("s") and not w.endswith("ss"):
        w = w[:-1]
    if w.endswith("eed"):
        if _measure(w[:-3]) > 0:
            w = w[:-1]
    else:
        for suf in ("ed", "ing"):
            if w.endswith(suf) and _has_vowel(w[:-len(suf)]):
                w = w[:-len(suf)]
                if w.endswith(("at", "bl", "iz")):
                    w += "e"
                elif len(w) >= 2 and w[-1] == w[-2] and _cons(w, len(w) - 1) and w[-1] not in "lsz":
                    w = w[:-1]
                elif (_measure(w) == 1 and len(w) >= 3 and _cons(w, len(w) - 3)
                      and not _cons(w, len(w) - 2) and _cons(w, len(w) - 1) and w[-1] not in "wxy"):
                    w += "e"
                break
    if w.endswith("y") and _has_vowel(w[:-1]):
        w = w[:-1] + "i"
    return w


def edit_distance(a: str, b: str) -> int:
    """Damerau-Levenshtein distance (optimal string alignment: a transposition costs 1)."""
    prev2: list[int] = []
    prev = list(range(len(b) + 1))
    for i in range(1, len(a) + 1):
        cur = [i] + [0] * len(b)
        for j in range(1, len(b) + 1):
            cur[j] = min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] != b[j - 1]))
            if i > 1 and j > 1 and a[i - 1] == b[j - 2] and a[i - 2] == b[j - 1]:
                cur[j] = min(cur[j], prev2[j - 2] + 1)
        prev2, prev = prev, cur
    return prev[-1]


def max_typo_distance(word: str) -> int:
    """How far a typo may be from its word: none under 4 letters, 1 for 4-7, 2 for 8+."""
    return 0 if len(word) < 4 else 1 if len(word) < 8 else 2


def _deletes(word: str, depth: int) -> set[str]:
    out, frontier = {word}, {word}
    for _ in range(depth):
        frontier = {w[:i] + w[i + 1:] for w in frontier for i in range(len(w))}
        out |= frontier
    return out


_PLURALS_OF_CATEGORY = {"tv": "TVs", "tshirt": "T-shirts", "mouse": "computer mice",
                        "kitchen knife": "kitchen knives", "cookware": "cookware",
                        "skincare": "skincare"}


def category_display(key: str) -> str:
    """What a customer reads for a category key: "running_shoes" -> "running shoes",
    "laptop" -> "laptops", "tv" -> "TVs"."""
    name = " ".join(key.replace("_", " ").replace("-", " ").split())
    if name.lower() in _PLURALS_OF_CATEGORY:
        return _PLURALS_OF_CATEGORY[name.lower()]
    if not name or name.endswith("s"):
        return name
    return name + ("es" if name.endswith(("ch", "sh", "x")) else "s")


# Contractions without their apostrophe ("whats", "thats"): words, never typos ("hats").
CONTRACTIONS = frozenset("""
whats thats hows whos wheres whens whys im ive id ill youre youve youd theyre theyve weve
dont doesnt didnt cant couldnt wont wouldnt shouldnt isnt arent wasnt werent hasnt havent
lets heres theres its itll shes hes
""".split())
