"""How a question's words are read before any product type is matched: tokens and stems as
the taxonomy sees them, the words that end a phrase, negate, mark an accessory or an object,
and the clauses ("while ...", "turn ... into") that say when or what for. Word lists and pure
functions only, apart from the taxonomy (rufus/retrieval/taxonomy.py) that uses them."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from rufus.retrieval.spelling import stem1

_TOKEN = re.compile(r"[a-z]+|\d+(?:\.\d+)?")
# Words after a product noun that make it a modifier: the customer wants the accessory.
ACCESSORY = frozenset("""
case cases cover covers bag bags stand stands mount mounts charger chargers cable cables strap
straps band bands protector protectors accessory accessories part parts replacement
replacements pad pads tip tips holder holders sleeve sleeves skin skins remote remotes lens
lenses string strings table tables rack racks cleaner cleaners grinder grinders pod pods bean
beans filter filters battery batteries dock docks hook hooks light lights shelf shelves bin
bins box boxes tray trays lid lids liner liners brush brushes head heads refill refills
""".split())
# The words that open a phrase naming what is wanted ("i'm looking | for a tent").
WANT_OPENERS = frozenset({"for", "like"})
# After an accessory word, these make it a verb: "covers a room", "holds the heat".
VERB_OBJECT = frozenset({"a", "an", "the", "my", "your", "up", "more", "less", "well"})
# Words that end the first phrase of a question ("backpack | for my laptop").
PHRASE_END = frozenset("""
for with without under below over above in on to of by from near like than that who thats
at into between compatible fits fit sleeps holds keeps works rated has whose
inside within behind beside beneath underneath
""".split())
# A noun right after these is not wanted: "without a watch", "no tv".
NEGATIONS = frozenset({"without", "no", "not", "instead", "besides", "except"})
# A noun that is what the product acts on, not the product: "carry my laptop", "pack clothes",
# "keep my phone charged" (verb before it), "my phone dies" (after it).
OBJECT_BEFORE = frozenset("""
carry carrying pack packing store storing hold holding charge charging protect protecting
organize clean cleaning mount hang
""".split())
OBJECT_AFTER = frozenset("dies died dying dead charged broke broken".split())
# A verb of how a thing performs right after its noun says it is the customer's own ("the tv
# dialog sounds tinny": a soundbar is wanted), unless a relative word makes it a wish ("a
# speaker that sounds full").
JUDGED_AFTER = frozenset("sounds looks feels smells stopped quit leaks squeaks wobbles".split())
RELATIVES = frozenset({"that", "which", "who", "whose"})
# A one-word noun opening the question (or after "to") with one of these after it is a verb:
# "watch the driveway", "to monitor my blood pressure".
DETERMINERS = frozenset({"the", "a", "an", "my", "our", "your", "his", "her", "their", "this"})
# A cap on time says speed: "in under an hour", "less than 10 minutes" ask for "fast".
_DURATION = frozenset("second seconds minute minutes min mins hour hours hr hrs".split())
_DURATION_COUNT = frozenset({"a", "an", "one", "half", "few", "couple", "of"})
# "while" opens a clause of when the product is used, not what for ("walk while i'm on
# calls"), but not in "a while", "for a while".
WHILE = "while"
CHANGE_VERBS = frozenset("turn turning make making convert converting transform change".split())
# A product line after these, past the first phrase, is one the customer has, not the one
# wanted: "extra screen for working from home with my macbook" asks for a monitor.
POSSESSIVES = frozenset({"my", "our", "his", "her", "their", "your"})
# A person named by what they love ("a coffee lover", "tea enthusiasts"): the word before is
# the interest, and the types whose nouns have it are the gift ("fan" is a product type).
ENTHUSIASTS = frozenset("""
lover lovers enthusiast enthusiasts addict addicts junkie junkies buff buffs fanatic fanatics
aficionado aficionados connoisseur connoisseurs snob snobs nerd nerds geek geeks
""".split())


def said_fast(ws: Sequence[str]) -> list[str]:
    """``ws`` with each cap on time ("under an hour", "less than 10 minutes", "within a
    few minutes") said as the need it is: "fast"."""
    out: list[str] = []
    i = 0
    while i < len(ws):
        cue = 2 if list(ws[i:i + 2]) == ["less", "than"] else 1 if ws[i] in ("under", "within") else 0
        j = i + cue
        while cue and j < len(ws) and j - i - cue < 3 and (ws[j] in _DURATION_COUNT or ws[j].isdigit()):
            j += 1
        if cue and j > i + cue and j < len(ws) and ws[j] in _DURATION:
            out.append("fast")
            i = j + 1
            continue
        out.append(ws[i])
        i += 1
    return out


def as_verb(ws: Sequence[str], s: int, e: int) -> bool:
    """A one-word noun that opens the question (or follows "to") with an article or
    possessive after it is a verb: "watch the driveway", "to monitor my sleep"."""
    return e == s + 1 and (s == 0 or ws[s - 1] == "to") and e < len(ws) and ws[e] in DETERMINERS


def judged(ws: Sequence[str], e: int) -> bool:
    """A verb of how it performs right after the noun ending at ``e`` (or a word on: "tv
    dialog sounds tinny"), not in a relative clause ("a speaker that sounds full")."""
    return e < len(ws) and ws[e] not in RELATIVES and bool(set(ws[e:e + 2]) & JUDGED_AFTER)


def during(ws: Sequence[str]) -> set[int]:
    """The positions of a "while" clause ("walk | while i'm on zoom calls"): when the product
    is used, not what it does. Not "a while", "for a while"."""
    for i, w in enumerate(ws):
        if w == WHILE and i > 0 and ws[i - 1] != "a":
            return set(range(i, len(ws)))
    return set()


def becomes(ws: Sequence[str]) -> list[str]:
    """The words after "into" when a verb of change comes before it ("turn the wall | into a
    movie screen", "make my garage into a gym"): what the product makes of the place."""
    for i, w in enumerate(ws):
        if w == "into" and set(ws[max(i - 6, 0):i]) & CHANGE_VERBS:
            return list(ws[i + 1:])
    return []


def tokens(text: str) -> list[str]:
    """Lower-case words and numbers, letters and digits apart ("buds2" -> "buds", "2";
    "wh-1000xm5" -> "wh", "1000", "xm", "5"), apostrophes dropped ("men's" -> "mens")."""
    t = text.lower().replace("'", "").replace("\u2019", "")
    return _TOKEN.findall(t)


def stems(ws: Iterable[str]) -> list[str]:
    """Each word stemmed as FTS5 does (numbers kept as they are)."""
    return [stem1(w) if w.isalpha() else w for w in ws]
