"""Which product models a question names ("weber spirit", "galaxy buds 2 pro", "sony xm4"):
by their words after the brand, split at letter-digit boundaries; see
rufus/retrieval/taxonomy.py's docstring for the rules. Shoppers shorten names, so a model
is also named by its other names (:func:`name_aliases`: no generation, "xt5", "ps5"), its
last words or number alone ("lp120xusb", "sonicare 9300"), or a part of it
(:meth:`ModelIndex._part`: "fire stick 4k max", "kayano 31", "lego hogwarts castle",
"oneblade"). A part of :class:`Taxonomy` (a base class of it), apart because matching names
is its own problem."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

from rufus.retrieval.base import STOPWORDS, norm_brand
from rufus.retrieval.question_words import stems, tokens
from rufus.retrieval.spelling import common_words, stem1

LINE_MODELS = 2  # more models than this named equally: a product line, not models to compare


@dataclass(frozen=True)
class ModelName:
    """A model of the catalog, by the words that name it."""

    model: str
    brand: str  # display
    category: str
    words: tuple[str, ...]  # the model's tokens after the brand's
    brand_words: tuple[str, ...] = ()  # the brand's tokens


# "(2nd Gen)", "12th generation", "(2024)": a generation said after the name, often left out
_GENERATION = re.compile(r"\s*\(?\b(?:\d+(?:st|nd|rd|th)\s+gen(?:eration)?|gen\s*\d+|(?:19|20)\d\d)\)?\s*$",
                         re.I)
# "PlayStation 5": a two-part name before a number, said by its initials ("ps5")
_CAMEL_NUMBER = re.compile(r"\b([A-Z][a-z]+(?:[A-Z][a-z]+)+)(?=\s*\d)")
# "AT-LP60X": a model code's letter prefix, which shoppers leave out ("lp60x"); not before
# digits alone ("WH-1000XM5" is no "1000xm5" of the earbuds' WF-1000XM5)
_CODE_PREFIX = re.compile(r"\b[A-Za-z]{1,4}-(?=[A-Za-z]+\d)")
# "QuietComfort Ultra": a two-part word before another word, said by its initials ("qc ultra")
_CAMEL_WORD = re.compile(r"\b([A-Z][a-z]+(?:[A-Z][a-z]+)+)(?=\s+[A-Za-z])")


def name_aliases(m: ModelName) -> list[ModelName]:
    """The other names shoppers give ``m``: its generation left out ("fire tv stick 4k max"
    for "(2nd Gen)"), a hyphen between letters dropped ("xt5" for X-T5), a two-part word
    before a number or a word by its initials ("ps5" for PlayStation 5, "qc ultra" for
    QuietComfort Ultra). Each as a ModelName of its own, of two words at least (a one-word
    "kindle" is the line, not Kindle (2024)); and a brand's "&" said "and" ("tuft and needle
    original")."""
    texts = [_GENERATION.sub("", m.model), re.sub(r"(?<=[A-Za-z])-(?=[A-Za-z])", "", m.model),
             _CODE_PREFIX.sub("", m.model),  # "AT-LP60X": "lp60x"
             _CAMEL_NUMBER.sub(lambda x: "".join(c for c in x.group(1) if c.isupper()), m.model),
             _CAMEL_WORD.sub(lambda x: "".join(c for c in x.group(1) if c.isupper()), m.model)]
    out: list[ModelName] = []
    for text in texts:
        ws = tokens(text)
        bw = list(m.brand_words)
        rest = tuple(ws[len(bw):] if ws[:len(bw)] == bw else ws)
        if len(rest) >= 2 and rest != m.words and all(rest != a.words for a in out):
            out.append(ModelName(m.model, m.brand, m.category, rest, m.brand_words))
    if "&" in m.brand:
        said = tuple(tokens(m.brand.replace("&", " and ")))
        out.append(ModelName(m.model, m.brand, m.category, m.words, said))
    return out


def _initial_runs(words: Sequence[str], pos: int = 0) -> Iterator[tuple[int, str]]:
    """(last position, initials) of every run of two to four letter-only words in ``words``
    from ``pos`` on ("ucs": Ultimate Collector Series)."""
    for p in range(pos, len(words) - 1):
        for k in range(2, 5):
            run = words[p:p + k]
            if len(run) == k and all(x.isalpha() for x in run):
                yield p + k - 1, "".join(x[0] for x in run)


def _said_at(words: Sequence[str], w: str, pos: int) -> int:
    """Where in ``words``, from ``pos`` on, the shopper's word ``w`` ends: the word itself,
    or the initials of two to four words in a row; -1."""
    if w in words[pos:]:
        return words.index(w, pos)
    if len(w) >= 3 and w.isalpha():
        return next((end for end, initials in _initial_runs(words, pos) if initials == w), -1)
    return -1


# words of a size or count in a model's name ("1000 Piece", "12 Inch", "24 Pack")
_SPEC_WORDS = frozenset({"piece", "pc", "pcs", "pack", "count", "ct", "inch", "in", "oz", "qt",
                         "quart", "gb", "tb", "lb", "mm", "cm", "ft", "w", "watt", "mah", "l",
                         "ml", "person", "people", "burner", "cup", "gallon", "liter", "litre"})
_BETWEEN_NAMES = frozenset({"vs", "versus", "or", "and", "compared", "than", "v"})


def _window(ws: Sequence[str], at: int, n: int, run: int) -> list[str]:
    """The words where a name of ``n`` words said from ``at`` may be: up to two past it,
    cut at a word that starts another name ("vs", "or") after its first ``run`` words."""
    window = list(ws[at:at + n + 2])
    cut = next((i for i, w in enumerate(window) if i >= run and w in _BETWEEN_NAMES), len(window))
    return window[:cut]


def _brand_before(ws: Sequence[str], bw: Sequence[str], i: int) -> bool:
    """Whether the brand's words ``bw`` end right before position ``i`` ("jbl | flip"); true
    of no words."""
    return i >= len(bw) and list(ws[i - len(bw):i]) == list(bw)


def _listed_after_brand(ws: Sequence[str], bw: Sequence[str], i: int) -> bool:
    """Whether the name said at ``i`` follows "vs" / "or" (and "the") after its brand was
    said earlier ("instant pot duo vs duo crisp", "ecobee enhanced vs premium"): the brand
    is said for it too."""
    j = i - 1
    if j >= 0 and ws[j] in ("the", "a", "an"):
        j -= 1
    nb = len(bw)
    return (nb > 0 and j >= nb and ws[j] in _BETWEEN_NAMES
            and any(list(ws[k:k + nb]) == list(bw) for k in range(j - nb + 1)))


class ModelIndex:
    """The models and the words that name them; :class:`Taxonomy` fills these in."""

    _models: list[ModelName]
    _first: dict[str, set[str]]
    _first_models: dict[str, set[str]]
    _by_brand_word: dict[tuple[str, str], set[str]]  # (brand, a name's word) -> its models
    _noun_words: set[str]
    _owners: dict[str, set[str]]  # a name's word -> the brands whose names use it
    _word_models: dict[str, int]  # a name's word -> how many models' names have it
    _word_texts: dict[str, int]  # a name's word -> how many models' listing texts say it
    _nouns: list[tuple[tuple[str, ...], str]]  # stemmed noun -> category, longest first
    _by_word: dict[str, list[int]]  # a name's word or initials -> positions in _models

    def models_in(self, ws: Sequence[str]) -> list[tuple[int, int, ModelName, bool]]:
        """(start, end, model, line) of every model ``ws`` (tokens) names, the brand before it
        included; see the module docstring. ``line``: a product line was named, more than
        :data:`LINE_MODELS` models equally ("apple watch"), not one model."""
        # a plural of a name's word is that word ("wayfarers", "xm5s")
        ws = [w[:-1] if len(w) > 3 and w.endswith("s") and w not in self._by_word
              and w[:-1] in self._by_word else w for w in ws]
        have = set(ws)
        starts: dict[str, list[int]] = {}
        for i, w in enumerate(ws):
            starts.setdefault(w, []).append(i)
        cands: dict[tuple[str, str], list[tuple[tuple[int, float], int, int, ModelName]]] = {}
        # only the models one of whose words (or initials) the question says can match
        maybe = sorted({i for w in have for i in self._by_word.get(w, ())})
        for m in (self._models[i] for i in maybe):
            hit = self._match(ws, have, starts, m)
            if hit is not None:
                cands.setdefault((norm_brand(m.brand), m.words[0]), []).append((*hit, m))
        out = []
        for group in cands.values():
            # per place in the question, its best ("dyson v8 vs v15 detect": both)
            for sc, s, e, m in group:
                rivals = [g for g in group if g[1] < e and s < g[2]]
                best = max(g[0] for g in rivals)
                if sc == best:
                    out.append((s, e, m, len({g[3].model for g in rivals if g[0] == best}) > LINE_MODELS))
        # a name inside a longer one is the longer one's ("flip 6" of "galaxy z flip 6",
        # "series 9" of "oral-b io series 9")
        out = [x for x in out if not any(o[0] <= x[0] and x[1] <= o[1] and o[1] - o[0] > x[1] - x[0]
                                         for o in out)]
        # names overlapping across brands: the one whose brand is said ("weber spirit e310"
        # is no Vitamix E310)
        def said_brand(m: ModelName) -> bool:
            bw = list(m.brand_words)
            return bool(bw) and any(ws[i:i + len(bw)] == bw for i in range(len(ws)))
        out = [x for x in out if said_brand(x[2]) or not any(
            o[0] < x[1] and x[0] < o[1] and norm_brand(o[2].brand) != norm_brand(x[2].brand)
            and said_brand(o[2]) for o in out)]
        # a size or count said alone ("1000 pieces", "12 inch") is a spec, not a model's name,
        # though names end in it ("Ravensburger ... 1000 Piece")
        out = [x for x in out if not (any(w in _SPEC_WORDS for w in ws[x[0]:x[1]]) and all(
            w.isdigit() or w in _SPEC_WORDS for w in ws[x[0]:x[1]]))]
        seen = {(s, e, m.model): (s, e, m, line) for s, e, m, line in out}  # aliases: once
        return sorted(seen.values(), key=lambda x: x[0])

    def _match(self, ws: Sequence[str], have: set[str], starts: Mapping[str, list[int]],
               m: ModelName) -> tuple[tuple[int, float], int, int] | None:
        """(score, start, end) where ``ws`` names ``m``, or None: its words from the first on
        (the brand before them, a second word, or a first word no other brand uses), else
        its last words or number (:meth:`_tail`), else a part of it (:meth:`_part`)."""
        first = m.words[0]
        bw = list(m.brand_words)
        if first not in have:
            return self._fallback(ws, bw, m, False)
        best_run, at, branded, best_hits = 0, -1, False, 0
        for i in starts[first]:
            run = 0
            while run < len(m.words) and i + run < len(ws) and ws[i + run] == m.words[run]:
                run += 1
            # the brand right before it ("jbl flip"): one word of the model is enough;
            # the longest run wins ("dyson v8 vs v15 detect": V15 Detect is the second),
            # then the place its other words are said ("arizona vs the arizona eva": the EVA
            # is the second)
            b = _brand_before(ws, bw, i) or _listed_after_brand(ws, bw, i)
            hits = len(set(_window(ws, i, len(m.words), run)) & set(m.words))
            if (run, hits, b) > (best_run, best_hits, branded):
                best_run, at, branded, best_hits = run, i, b, hits
        # one word that is a product type's noun names no model ("35 lb kettlebell" is no
        # Rogue Kettlebell)
        named_alone = (len(m.words) == 1 and len(first) > 4 and not first.isdigit()
                       and first not in common_words() and len(self._first.get(first, ())) == 1
                       and stem1(first) not in self._noun_words)
        # two words of the name in a row, one of them a name ("airpods pro"), not plain
        # words ("cast iron" is no Cast Iron Kettlebell, "dash cam" no Dash Cam Mini 2)
        run_ok = best_run >= 2 and not first.isdigit() and (any(
            self._namelike(w) or w.isdigit() for w in m.words[:best_run])
            # the whole name, not a type's words: "ticket to ride", not "orthopedic dog bed"
            or (best_run == len(m.words) >= 3 and not set(stems(m.words)) & self._noun_words)
            # a letter and a word, the whole name ("k elite", "k mini": K-Elite, K-Mini)
            or (best_run == len(m.words) == 2 and len(first) == 1 and first.isalpha()))
        if not (branded or run_ok or named_alone):  # "g-shock ga2100 or dw5600e"
            line = self._first.get(first) == {norm_brand(m.brand)} and self._namelike(first)
            if (line and len(first) > 4 and self._first_models.get(first) == {m.model}
                    and "for" not in ws[:at]):  # not what it is for ("for an ironman")
                # a line word of one model only names it ("where is the moccamaster made")
                return (1, 1 / len(m.words)), at, at + best_run
            return self._fallback(ws, bw, m, line)
        # the name's words said where it is named ("duo crisp" is no Duo 7-in-1 because
        # "10-in-1" came earlier in the question)
        # ... up to a word that starts another name ("birkenstock arizona vs the arizona eva":
        # the first is the Arizona, not the EVA)
        near = set(_window(ws, at, len(m.words), best_run))
        hits = sum(1 for w in m.words if w in near)
        start = at - len(bw) if branded and _brand_before(ws, bw, at) else at
        if best_run < len(m.words) and m.words[-1] not in ws[start:at + best_run]:
            # "bowflex selecttech 552 vs 1090": 1090's number is said further on
            tail = self._tail(ws, bw, m.words)
            if tail is not None and tail[0] >= at + best_run:
                return (len(m.words), 1.0), tail[0], tail[1]
        # most words named, then the fewest name words unnamed: a number or a short word
        # left unsaid is a spec of the base model ("instant pot duo" is the Duo 7-in-1, not
        # the Duo Crisp)
        named = [w for w in m.words if not w.isdigit() and len(w) > 2] or list(m.words)
        return (hits, sum(1 for w in named if w in near) / len(named)), start, at + best_run

    def _fallback(self, ws: Sequence[str], bw: Sequence[str], m: ModelName,
                  line: bool) -> tuple[tuple[int, float], int, int] | None:
        """Where the name is not said from its first word on: its last words or number
        (``line``: the model's own line word is said, "sonicare ... 9300"), else a part."""
        tail = self._tail(ws, bw, m.words, line)
        if tail is not None:
            return (len(m.words), 1.0), tail[0], tail[1]
        part = self._part(ws, bw, m)
        if part is None:
            return None
        s, e, hits = part
        return (hits, hits / len(m.words)), s, e

    def _part(self, ws: Sequence[str], bw: Sequence[str], m: ModelName) -> tuple[int, int, int] | None:
        """(start, end, words) of the name said in part, as shoppers shorten it: its words in
        order with some left out ("fire stick 4k max": Fire TV Stick 4K Max), after the brand
        ("lego hogwarts castle"), from a word only this brand's names use ("superlight 2",
        "kayano 31"), or a name word only this model has, alone ("oneblade")."""
        words, nb, brand = m.words, len(bw), norm_brand(m.brand)
        lead = self._first.get(words[0]) == {brand}  # a first word no other brand's names use
        best: tuple[int, int, int] | None = None
        for i, w in enumerate(ws):
            pos = -1 if w in STOPWORDS else _said_at(words, w, 0)
            if pos < 0:
                continue
            j = i + 1
            while j < len(ws) and _said_at(words, ws[j], pos + 1) >= 0:
                pos, j = _said_at(words, ws[j], pos + 1), j + 1
            said = ws[i:j]
            own = [x for x in said if not x.isdigit() and self._owners.get(x) == {brand}
                   and stem1(x) not in self._noun_words and x not in STOPWORDS]
            plain = [x for x in said if x not in STOPWORDS and stem1(x) not in self._noun_words]
            after_brand = nb > 0 and (_brand_before(ws, bw, i) or _listed_after_brand(ws, bw, i))
            ok = ((after_brand and len(said) >= 2 and plain)
                  # right after the brand, a word of only one of its models ("ecobee
                  # premium", "ray ban wayfarer")
                  or (after_brand and len(said) == 1 and w not in STOPWORDS and not w.isdigit()
                      and self._by_brand_word.get((brand, w)) == {m.model})
                  or (len(said) >= 2 and any(self._namelike(x) for x in own))
                  or (len(said) >= 3 and said[0] == words[0] and (own or lead)
                      and not self._is_type(said))
                  or (len(said) == 1 and w != words[0] and self._alone(w, ws[:i])))
            if ok and (best is None or j - i > best[2]):
                best = (i - nb if _brand_before(ws, bw, i) else i, j, j - i)
        return best

    def _is_type(self, said: Sequence[str]) -> bool:
        """``said`` is a product type's noun ("orthopedic dog bed"): the type named, no
        evidence of the model ("bedsure orthopedic dog bed"); "nest learning thermostat" is."""
        st = tuple(stems(said))
        return any(n == st for n, _ in self._nouns)

    def _alone(self, w: str, before: Sequence[str]) -> bool:
        """A name word that names its model alone ("oneblade", "paperwhite"): one model's
        name and one model's listing text have it (not "womens" of a jeans' name), and it is
        not what the thing is for ("a watch for an ironman")."""
        return (self._namelike(w) and len(w) > 4 and self._word_models.get(w) == 1
                and self._word_texts.get(w, 0) <= 1 and "for" not in before)

    def _index_words(self, models: Sequence[ModelName], texts: Sequence[str] = ()) -> None:
        """Per word of the models' names: the brands using it and how many models have it;
        per word, how many models' listing texts (``texts``, one a model) say it."""
        self._owners = {}
        counts: dict[str, set[str]] = {}
        # word or initials -> the models (positions in ``models``) a question saying it may
        # name: every rule of _match needs one of the name's words or initials said
        self._by_word = {}
        for n, m in enumerate(models):
            initials = {i for _, i in _initial_runs(m.words) if len(i) >= 3}
            for w in {*m.words, *initials}:
                self._by_word.setdefault(w, []).append(n)
        for m in models:
            for w in m.words:
                self._owners.setdefault(w, set()).add(norm_brand(m.brand))
                counts.setdefault(w, set()).add(m.model)
        self._word_models = {w: len(ms) for w, ms in counts.items()}
        self._word_texts = {}
        for t in texts:
            for w in set(tokens(t)):
                if w in counts:
                    self._word_texts[w] = self._word_texts.get(w, 0) + 1

    @staticmethod
    def _tail(ws: Sequence[str], bw: Sequence[str], words: Sequence[str],
              line: bool = False) -> tuple[int, int] | None:
        """(start, end) of the brand followed by at least the name's last two words ("sony
        xm4"); or of the name's last words with a model number ("millennium falcon 75192",
        "lp120xusb"), or the number alone where the brand or the model's own line word
        (``line``) is named too ("bowflex ... vs 1090", "sonicare 9300")."""
        nb = len(bw)
        if not nb or len(words) < 2:
            return None
        for i in range(len(ws) - nb):
            if list(ws[i:i + nb]) != list(bw):
                continue
            for k in range(len(words) - 1, 1, -1):
                if list(ws[i + nb:i + nb + k]) == list(words[-k:]):
                    return i, i + nb + k
        branded = line or any(list(ws[i:i + nb]) == list(bw) for i in range(len(ws) - nb + 1))
        for k in range(len(words) - 1, 0, -1):
            tail = list(words[-k:])
            if not any(len(w) >= 3 and w.isdigit() for w in tail) or (k == 1 and not branded):
                continue
            for i in range(len(ws) - k + 1):
                if list(ws[i:i + k]) == tail:
                    return i, i + k
        return None

    def _namelike(self, w: str) -> bool:
        """A word that names (a product line's "airpods", "xps"), not a plain or type word."""
        return (not w.isdigit() and len(w) > 3 and w not in common_words()
                and stem1(w) not in self._noun_words and w not in STOPWORDS)
