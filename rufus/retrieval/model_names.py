"""Which product models a question names ("weber spirit", "galaxy buds 2 pro", "sony xm4"):
by their words after the brand, split at letter-digit boundaries; see
rufus/retrieval/taxonomy.py's docstring for the rules. A part of :class:`Taxonomy` (a base
class of it), apart because matching names is its own problem."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rufus.retrieval.base import STOPWORDS, norm_brand
from rufus.retrieval.question_words import stems
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


class ModelIndex:
    """The models and the words that name them; :class:`Taxonomy` fills these in."""

    _models: list[ModelName]
    _first: dict[str, set[str]]
    _noun_words: set[str]

    def models_in(self, ws: Sequence[str]) -> list[tuple[int, int, ModelName, bool]]:
        """(start, end, model, line) of every model ``ws`` (tokens) names, the brand before it
        included; see the module docstring. ``line``: a product line was named, more than
        :data:`LINE_MODELS` models equally ("apple watch"), not one model."""
        have = set(ws)
        starts: dict[str, list[int]] = {}
        for i, w in enumerate(ws):
            starts.setdefault(w, []).append(i)
        cands: dict[tuple[str, str], list[tuple[tuple[int, float], int, int, ModelName]]] = {}
        for m in self._models:
            first = m.words[0]
            bw = list(m.brand_words)
            if first not in have:
                if not bw or bw[0] not in have:
                    continue
                # the brand, then the name's last words: "sony xm4" (WH-1000XM4), "lg c4"
                # (OLED evo C4), "away carry-on" (The Carry-On)
                tail = self._tail(ws, bw, m.words)
                if tail is not None:
                    cands.setdefault((norm_brand(m.brand), first), []).append(
                        ((len(m.words), 1.0), tail[0], tail[1], m))
                continue
            best_run, at, branded = 0, -1, False
            for i in starts[first]:
                run = 0
                while run < len(m.words) and i + run < len(ws) and ws[i + run] == m.words[run]:
                    run += 1
                # the brand right before it ("jbl flip"): one word of the model is enough;
                # the longest run wins ("dyson v8 vs v15 detect": V15 Detect is the second)
                b = i >= len(bw) and ws[i - len(bw):i] == bw
                if (run, b) > (best_run, branded):
                    best_run, at, branded = run, i, b
            named_alone = (len(m.words) == 1 and len(first) > 4 and not first.isdigit()
                           and first not in common_words() and len(self._first.get(first, ())) == 1)
            # two words of the name in a row, one of them a name ("airpods pro"), not plain
            # words ("cast iron" is no Cast Iron Kettlebell, "dash cam" no Dash Cam Mini 2)
            run_ok = best_run >= 2 and not first.isdigit() and (any(
                self._namelike(w) or w.isdigit() for w in m.words[:best_run])
                # the whole name, not a type's words: "ticket to ride", not "orthopedic dog bed"
                or (best_run == len(m.words) >= 3 and not set(stems(m.words)) & self._noun_words))
            if not (branded or run_ok or named_alone):
                tail = self._tail(ws, bw, m.words)  # "g-shock ga2100 or dw5600e"
                if tail is not None:
                    cands.setdefault((norm_brand(m.brand), first), []).append(
                        ((len(m.words), 1.0), tail[0], tail[1], m))
                continue
            # the name's words said where it is named ("duo crisp" is no Duo 7-in-1 because
            # "10-in-1" came earlier in the question)
            near = set(ws[at:at + len(m.words) + 2])
            hits = sum(1 for w in m.words if w in near)
            score = (hits, hits / len(m.words))  # most words named, then the fewest unnamed
            start = at - len(bw) if branded else at
            if best_run < len(m.words) and m.words[-1] not in ws[start:at + best_run]:
                # "bowflex selecttech 552 vs 1090": 1090's number is said further on
                tail = self._tail(ws, bw, m.words)
                if tail is not None and tail[0] >= at + best_run:
                    cands.setdefault((norm_brand(m.brand), first), []).append(
                        ((len(m.words), 1.0), tail[0], tail[1], m))
                    continue
            cands.setdefault((norm_brand(m.brand), first), []).append((score, start, at + best_run, m))
        out = []
        for group in cands.values():
            # per place in the question, its best ("dyson v8 vs v15 detect": both)
            for sc, s, e, m in group:
                rivals = [g for g in group if g[1] < e and s < g[2]]
                best = max(g[0] for g in rivals)
                if sc == best:
                    out.append((s, e, m, len([g for g in rivals if g[0] == best]) > LINE_MODELS))
        # a name inside a longer one is the longer one's ("flip 6" of "galaxy z flip 6",
        # "series 9" of "oral-b io series 9")
        out = [x for x in out if not any(o[0] <= x[0] and x[1] <= o[1] and o[1] - o[0] > x[1] - x[0]
                                         for o in out)]
        return sorted(out, key=lambda x: x[0])

    @staticmethod
    def _tail(ws: Sequence[str], bw: Sequence[str], words: Sequence[str]) -> tuple[int, int] | None:
        """(start, end) of the brand followed by at least the name's last two words ("sony
        xm4"); or of the name's last words with a model number ("millennium falcon 75192",
        "dw5600e"), or the number alone where the brand is named too ("bowflex ... vs 1090")."""
        nb = len(bw)
        if not nb or len(words) < 2:
            return None
        for i in range(len(ws) - nb):
            if list(ws[i:i + nb]) != list(bw):
                continue
            for k in range(len(words) - 1, 1, -1):
                if list(ws[i + nb:i + nb + k]) == list(words[-k:]):
                    return i, i + nb + k
        branded = any(list(ws[i:i + nb]) == list(bw) for i in range(len(ws) - nb + 1))
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
