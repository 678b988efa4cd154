"""The needs a question says instead of a product type ("boil water for tea", "my phone
dies"): each type's weighted words, its need phrases, and the nearest type to a need. A part of
:class:`rufus.retrieval.taxonomy.Taxonomy` (a base class of it), apart because it is the one
part that scores rather than matches."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from rufus.retrieval.base import STOPWORDS
from rufus.retrieval.catalog_data import CategorySpec
from rufus.retrieval.question_words import ENTHUSIASTS, during, stems, tokens
from rufus.retrieval.spelling import common_words, edit_distance, stem1

# A one-word noun that heads other types' nouns too ("camera": security camera, action
# camera) takes the sense of the one its other words score this many times higher
# ("good first camera" is no action camera for its "first person video": 1.75 times).
SENSE_LEAD = 2.0


# A need's words that say nothing of the product type (classify).
NEED_STOP = frozenset("""
something thing things want need looking get buy good best great new old really time day days
help make makes keep like just also even every home house room use used using one two work
tired paying pay whats easiest easy way always lot lots stuff right now people who whos
someone somebody love loves starting start every thanks thank needed please hello write tell
joke question answer
""".split())
NOUN_WEIGHT, NEED_WEIGHT = 3, 2  # a noun's head word; a use's, a need's or a noun's other words
DESCRIPTION_WEIGHT = 0.5  # a model's words (its title, description and string specs)
IDF_POWER = 1.0
CLASSIFY_MIN = 2.0  # the nearest type's score, at least (tuned on the first held-out set)
CLASSIFY_COVER = 0.0  # share of a need's words the type must have (0.34-0.6 measured worse)
CLASSIFY_WORDS = 2  # and at least this many of them (one shared word is a coincidence)
CLASSIFY_LEAD = 1.0  # and at least as high as the next type's (1.3 measured worse: docs/catalog.md)



def content_stems(ws: Iterable[str]) -> list[str]:
    """The stems of a need's words that may say what it is (classify)."""
    return stems(w for w in ws if w not in STOPWORDS and w not in NEED_STOP
                 and not w.isdigit() and len(w) > 2)


def one_deleted(w: str) -> set[str]:
    """``w`` and ``w`` less any one letter: a symmetric-delete index of one edit."""
    return {w, *(w[:i] + w[i + 1:] for i in range(len(w)))}


def in_order(seq: Sequence[str], st: Sequence[str]) -> bool:
    """Whether ``seq`` is said word for word in ``st``."""
    n = len(seq)
    return any(tuple(st[i:i + n]) == tuple(seq) for i in range(len(st) - n + 1))


class WordWeights(dict[str, float]):
    """A type's weighted stems (classify): as a ``Counter``, a word not in it weighs 0, but
    the weights need not be whole (:data:`DESCRIPTION_WEIGHT`)."""

    def __missing__(self, key: str) -> float:
        return 0


# words that say the customer's own product is to be replaced: it is what is wanted
REPLACED = frozenset({"broke", "broken", "cracked", "died", "dead", "replace", "replacing",
                      "replacement", "new", "upgrade", "upgrading", "another"})
RUNNER_UP = 1.2  # ... and the next type at this multiple
OWNED_FACTOR = 1.5  # the nearest type beats the customer's own at this multiple of its score
NEED_NEAR = 0.9  # a need said in full wins at this share of the best type's score


class NeedIndex:
    """Needs and the nearest type to them; :class:`Taxonomy` fills these in."""

    specs: dict[str, CategorySpec]
    count: dict[str, int]
    _texts: list[tuple[str, str]]
    _noun_words: set[str]
    _head_types: dict[str, set[str]]
    _noun_types: dict[str, set[str]]
    _doc: dict[str, WordWeights]
    _df: dict[str, set[str]]
    _need_phrases: dict[frozenset[str], set[str]]
    _own: dict[str, set[str]]
    _need_deletes: dict[str, set[str]]
    _need_by_word: dict[str, list[frozenset[str]]]
    _verbatim: dict[frozenset[str], tuple[str, ...]]

    def need_word(self, word: str) -> bool:
        """Whether ``word`` (lower case) is a word of some type's need phrase: the search
        does not spell-correct it toward a catalog word ("bender" is no "fender")."""
        return stem1(word) in self._need_by_word

    def _index_need(self, c: str, need: str) -> None:
        """Index one need phrase of ``c`` by its content stems. A need of common words only
        ("tell time", "work from home") keeps its plain words, to be matched only as said,
        word for word (:meth:`_need_said`): scattered, they say nothing."""
        key = frozenset(content_stems(tokens(need)))
        self._own.setdefault(c, set()).update(key)
        if not key:
            plain = [w for w in tokens(need) if w.isalpha() and len(w) > 2 and w not in STOPWORDS]
            if len(plain) < 2:
                return
            key = frozenset(stems(plain))
            self._verbatim[key] = tuple(stems(tokens(need)))
        if key not in self._need_phrases:
            for w in key:
                self._need_by_word.setdefault(w, []).append(key)
        self._need_phrases.setdefault(key, set()).add(c)

    def _index_docs(self) -> None:
        """Each type's weighted stems (its nouns, uses, needs and its models' words), the
        types per stem, the need phrases and the one-edit typos of their words."""
        for c in self.count:
            doc = self._doc.setdefault(c, WordWeights())
            spec = self.specs.get(c)
            # a noun's head word weighs most ("chair" of "lawn chair"), its modifiers like
            # a need's words ("lawn" is no lawn mower)
            for noun in (*(spec.nouns if spec else ()), spec.name if spec else "", c.replace("_", " ")):
                ws = stems(tokens(noun))
                for i, w in enumerate(ws):
                    doc[w] += NOUN_WEIGHT if i == len(ws) - 1 else NEED_WEIGHT
            for w in stems(tokens(" ".join(spec.uses + spec.needs) if spec else "")):
                doc[w] += NEED_WEIGHT
            for need in (spec.needs if spec else ()):
                self._index_need(c, need)
        for p_cat, text in self._texts:
            for w in set(stems(tokens(text))):
                self._doc[p_cat][w] += DESCRIPTION_WEIGHT
        self._texts = []
        for w in self._need_by_word:  # typos of a need's words ("bagles"), one edit
            if len(w) >= 5 and w.isalpha():
                for d in one_deleted(w):
                    self._need_deletes.setdefault(d, set()).add(w)
        for c, doc in self._doc.items():
            for w in doc:
                self._df.setdefault(w, set()).add(c)

    def _need_of(self, ws: Sequence[str], negated: set[int], excluded: set[str]
                 ) -> tuple[str | None, frozenset[str], list[str], list[str]]:
        """The need said in full (:meth:`_need_said`) and its stems, the words a need is read
        from (a negated noun's count toward none) and those of the main clause (no "while"
        clause: :func:`during`). A need said only in the "while" clause is when, not what:
        "walk while i'm on zoom calls" asks for no headset."""
        when = during(ws)
        need_ws = [w for i, w in enumerate(ws) if i not in negated]
        main_ws = [w for i, w in enumerate(ws) if i not in negated and i not in when]
        need, key = self._need_said(stems(need_ws), excluded, need_ws)
        if when and key and not key & set(stems(main_ws)) and content_stems(main_ws):
            need, key = None, frozenset()
        return need, key, need_ws, main_ws

    def _need_near(self, need: str | None, key: frozenset[str], need_ws: Sequence[str]) -> bool:
        """Whether the question's words score ``need``'s type within :data:`NEED_NEAR` of the
        best type: a need said in full then names the type ("keep an eye on her ... while i
        cook" is a baby monitor, not a microwave); one far behind does not ("dust and
        dander" of allergies is an air purifier's, not a vacuum's), nor one the best type
        shares ("screen free" of board games and puzzles: the best of them)."""
        ranked = self.classify_scores(need_ws)
        if not need or not ranked or ranked[0][1] <= 0:
            return False
        best, top = ranked[0]
        if best != need and best in self._need_phrases.get(key, ()):
            return False
        return dict(ranked).get(need, 0.0) >= NEED_NEAR * top

    def _for_owned(self, owned: list[str], need: str | None, need_ws: Sequence[str],
                   excluded: set[str]) -> list[str]:
        """What a question wants that opens on the customer's own product (``owned``, "my old
        tv has no apps"): the need said in full, else the nearest type when the question's
        words score it :data:`OWNED_FACTOR` times the owned type (a streaming device);
        else the owned type itself ("my tv broke, need a new one": replaced, not added to)."""
        if set(need_ws) & REPLACED:
            return owned
        if need and need not in owned:
            return [need]
        ranked = [cs for cs in self.classify_scores(need_ws) if cs[0] not in excluded]
        if not ranked or ranked[0][0] in owned or ranked[0][1] < CLASSIFY_MIN:
            return owned
        mine = max((v for c, v in ranked if c in owned), default=0.0)
        runner_up = ranked[1][1] if len(ranked) > 1 else 0.0
        # a clear nearest type only: far above the owned one and ahead of the next
        clear = ranked[0][1] >= OWNED_FACTOR * mine and ranked[0][1] >= RUNNER_UP * runner_up
        return [ranked[0][0]] if clear else owned

    def _nearest(self, need_ws: Sequence[str], main_ws: Sequence[str], made: Sequence[str],
                 excluded: set[str]) -> list[str]:
        """The nearest type (:meth:`classify`). What a place or thing is turned into says it
        first ("turn the wall into a movie screen": a projector, whatever "living room" says
        of TVs). With a "while" clause, the main clause says what the product does and the
        rest picks among the types it scores ("cleans the floors while i'm at work": a robot
        vacuum; "walk while i'm on zoom calls": a treadmill, no headset)."""
        chosen = self.classify(made, excluded) if made else []
        if not chosen and len(main_ws) < len(need_ws) and content_stems(main_ws):
            does = {c for c, v in self.classify_scores(main_ws) if v > 0}
            chosen = self.classify(need_ws, excluded | (set(self._doc) - does))
        return chosen or self.classify(need_ws, excluded)

    def _base_degree(self, ws: list[str]) -> list[str]:
        """``ws`` with the base of each comparative or superlative said after it when a need
        has that base ("faster" -> "faster fast", "quietest" -> "quietest quiet"): "dry my
        hair faster" says the need "dry hair fast". English words only (no typo: "projecter"),
        no type's noun ("speaker")."""
        out: list[str] = []
        for w in ws:
            out.append(w)
            if (len(w) < 5 or not w.endswith(("er", "est")) or stem1(w) in self._noun_words
                    or w not in common_words()):
                continue
            root = w[:-2] if w.endswith("er") else w[:-3]
            forms = [root[:-1] + "y" if root.endswith("i") else "", root, root + "e",
                     root[:-1] if len(root) > 3 and root[-1] == root[-2] else ""]
            base = next((f for f in forms if len(f) > 2 and stem1(f) in self._need_by_word), None)
            if base:
                out.append(base)
        return out

    def _need_typos(self, ws: list[str]) -> list[str]:
        """``ws`` with each typo of a need's word replaced by it ("bagles every morning" says
        "bagels", a toaster's need): a word of five letters or more that no type's text has
        and no common word, one edit from exactly one need word with its first letter."""
        out = ws
        for i, w in enumerate(ws):
            s = stem1(w)
            if len(s) < 5 or not s.isalpha() or s in self._df or w in common_words():
                continue
            near = {c for d in one_deleted(s) for c in self._need_deletes.get(d, ()) if c[0] == s[0]}
            near = {c for c in near if edit_distance(s, c) <= 1}
            if len(near) == 1:
                out = out if out is not ws else list(ws)
                out[i] = near.pop()
        return out

    def _ranked_among(self, cats: Iterable[str], ws: Sequence[str]) -> list[tuple[str, float]]:
        """``cats`` by their :meth:`classify_scores` for ``ws``, best first (0 when none)."""
        scores = dict(self.classify_scores(ws))
        return sorted(((c, scores.get(c, 0.0)) for c in cats), key=lambda cs: (-cs[1], cs[0]))

    def _sense(self, noun: Sequence[str], cat: str, ws: Sequence[str], excluded: set[str]) -> str:
        """A one-word noun heading other types' nouns too ("camera") is the one of them its
        other words score :data:`SENSE_LEAD` times higher than ``cat`` ("camera to keep an
        eye on the dog" is a security camera), else ``cat``."""
        if len(noun) != 1 or len(self._head_types.get(noun[0], ())) < 2:
            return cat
        ranked = self._ranked_among(self._head_types[noun[0]] - excluded, ws)
        own = dict(ranked).get(cat, 0.0)
        best, score = ranked[0] if ranked else (cat, 0.0)
        return best if score >= max(CLASSIFY_MIN, SENSE_LEAD * own) else cat

    def _interest(self, ws: Sequence[str], st: Sequence[str], need_ws: Sequence[str],
                  excluded: set[str]) -> list[str]:
        """The type for a person named by what they love ("gift for a coffee lover"): among
        the types whose nouns have the word before (coffee makers), the best scored."""
        for i in range(1, len(ws)):
            if ws[i] in ENTHUSIASTS and ws[i - 1] not in STOPWORDS:
                cats = self._noun_types.get(st[i - 1], set()) - excluded
                if cats:
                    return [self._ranked_among(cats, need_ws)[0][0]]
        return []

    def _need_said(self, st: Sequence[str], excluded: Iterable[str] = (),
                   ws: Sequence[str] = ()) -> tuple[str | None, frozenset[str]]:
        """The type whose need phrase the question says in full (every content word of it),
        the longest such phrase first, and that phrase's stems; (None, empty) when none is.
        The ``excluded`` types (a negated noun's) have none. Of tied phrases, the one said
        most tightly, then first ("light for reading | in bed" is a lamp, no e-reader); of
        types sharing it, the one the question's words ``ws`` (else ``st``) score best ("dry my hair":
        a hair dryer, not a towel)."""
        have = set(st)
        found: dict[frozenset[str], set[str]] = {}
        for key in {k for w in have for k in self._need_by_word.get(w, ())}:
            cats = self._need_phrases[key] - set(excluded)
            # one word is a need only when few types have it ("allergies", not "work")
            if (not cats or not key <= have
                    or (len(key) == 1 and len(self._df.get(next(iter(key)), ())) > 3)
                    or (key in self._verbatim and not in_order(self._verbatim[key], st))):
                continue
            found[key] = cats
        if not found:
            return None, frozenset()
        longest = max(len(k) for k in found)

        def place(key: frozenset[str]) -> tuple[int, int]:
            """(spread, start) of ``key`` in the question: the tightest, then the first."""
            at = [st.index(w) for w in key]
            return max(at) - min(at), min(at)

        tied = [k for k in found if len(k) == longest]
        best = min(place(k) for k in tied)
        keys = [k for k in tied if place(k) == best]
        cats = {c for k in keys for c in found[k]}
        cat = next(iter(cats)) if len(cats) == 1 else self._ranked_among(cats, ws or st)[0][0]
        return cat, next(k for k in keys if cat in found[k])

    def classify(self, ws: Sequence[str], excluded: Iterable[str] = ()) -> list[str]:
        """The nearest type to the need ``ws`` says (:meth:`classify_scores`), the
        ``excluded`` types (a negated noun's) left out; none when it is not clear."""
        out = set(excluded)
        ranked = [cs for cs in self.classify_scores(ws) if cs[0] not in out]
        if not ranked or ranked[0][1] < CLASSIFY_MIN:
            return []
        if len(ranked) > 1 and ranked[0][1] < CLASSIFY_LEAD * ranked[1][1]:
            return []
        # most of the need's words must be the type's: one shared word ("lawn" of "lawn
        # chair") does not make a lawn mower a camping chair
        content = set(content_stems(ws))
        doc = self._doc[ranked[0][0]]
        have = {w for w in content if w in doc}
        if content and (len(have) < CLASSIFY_COVER * len(content)
                        or len(have) < min(CLASSIFY_WORDS, len(content))):
            return []
        return [ranked[0][0]]

    def classify_scores(self, ws: Sequence[str]) -> list[tuple[str, float]]:
        """The category whose words (nouns and names, uses, types and descriptions of its
        models) best match the stems ``st``, when it leads the next by :data:`CLASSIFY_LEAD`
        and scores at least :data:`CLASSIFY_MIN`; else none."""
        qs = set(content_stems(ws))
        score: dict[str, float] = {}
        n = max(len(self._doc), 1)
        for w in qs:
            df = len(self._df.get(w, ()))
            if not df:
                continue
            idf = math.log(1 + n / df) ** IDF_POWER  # >1: one rare word ("shave") outweighs
            # several common ones ("who", "starting")
            for c in self._df[w]:
                tf = self._doc[c][w]
                score[c] = score.get(c, 0.0) + idf * tf / (tf + 1.0)
        return sorted(score.items(), key=lambda kv: -kv[1])
