"""Answers whose facts come from the cards, by construction.

The answer model does what a 135M model does reliably: it picks which of the shown products
fit the question, and for each, which of its card's facts says why. Every word a customer
reads is rendered by the system from the retrieved card: the name, link, price and rating of
the pick's line (:func:`pick_line`), and the reason, chosen by the model from the card's own
menu (:func:`reason_options`: what the card says it is built for, the lowest price / best
rating / most reviews among the shown products, the colour or brand the customer asked for).
Three layers make it a guarantee rather than a hope:

1. **While decoding** (:func:`answer_grammar`, vLLM structured outputs / xgrammar): the model
   can only write ``[n] reason`` lines (the first without its ``[``: ``n] reason``), ``n``
   among the shown products and never twice, at
   most :data:`MAX_PICKS` lines, each reason one of product n's menu. A free-worded reason
   was tried first (lower-case words only, no digits): the 135M model then wrote invented
   words and other products' names in most reasons (docs/benchmarks-history.md, "Answers").
2. **Repetition control**: the grammar allows each product once and a menu entry per pick;
   the request also carries a repetition penalty (:data:`REPETITION_PENALTY`).
3. **On the way out** (:class:`ReasonCheck`): a reason is held until it is complete, then
   dropped unless it is one of its card's menu entries and names no brand, product line or
   colour that is not its card's (a user catalog's descriptions can name other brands).
   Drops are counted (a metric, so a bad model or prompt shows up on a dashboard); the pick
   keeps its system-rendered line.

Streaming is kept: a pick's line (name, link, price, rating) is sent as soon as its number is
decoded; only its few reason words wait for their end.
"""

from __future__ import annotations

import itertools
import re
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from rufus.assistant.answer_checks import is_colour_name
from rufus.retrieval.catalog import Product
from rufus.retrieval.catalog_data import default_catalog
from rufus.retrieval.spelling import common_words

MAX_PICKS = 3
REPETITION_PENALTY = 1.1
MAX_REASON_CHARS = 60

_WORD = re.compile(r"[a-z]+(?:-[a-z]+)?")
_BUILT_FOR = re.compile(r"\b[Bb]uilt for ([A-Za-z][A-Za-z ,'-]{2,50}?)[.;]")
# One-word product lines that are also ordinary shopping words: a reason may say them.
ORDINARY = frozenset("""
structure revolution ghost launch ride guide authentic momentum solo elite dime yoga edge
charge inspire balance pace apex instinct multifunctional heritage essentials original tech
slim regular flip clip boom roam lift classic premier gourmet solution statement genesis
wireless connect switch quest legion latitude aspire recon beta authentics premiums
""".split())


def built_for(p: Product) -> str:
    """What the card's description says the product is built for ("long runs"), or "": the
    same words in the answer prompt's product line and in the reason menu."""
    m = _BUILT_FOR.search(p.description + ".")
    return m.group(1) if m else ""


def _use_items(use: str) -> list[str]:
    """"long runs, daily training and races" -> ["long runs", "daily training", "races"]."""
    return [u.strip() for u in re.split(r",\s*|\s+and\s+", use) if u.strip()]


def _joined(items: Sequence[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _clean(text: str) -> str:
    """A menu entry as the grammar spells it: letters, spaces and light punctuation, at most
    :data:`MAX_REASON_CHARS`, cut at a word ("pressure relie" was cut mid-word)."""
    s = re.sub(r"\s+", " ", re.sub(r"[^A-Za-z0-9 ,'-]", " ", text)).strip()
    if len(s) > MAX_REASON_CHARS:  # a list ("built for a, b and c"): whole items only
        head = s[:MAX_REASON_CHARS + 1]
        cut = max(head.rfind(", "), head.rfind(" and "))
        s = head[:cut] if cut > 0 else head[:MAX_REASON_CHARS]
    return s.rstrip(" ,")


# What the model writes for a reason (the key, in the prompt's menu and the grammar) and
# what the customer reads (:func:`reason_text`): the short key is fewer prompt and decode
# tokens, the words around it are the system's.
LOWEST, BEST, MOST = "lowest price", "best rating", "most reviews"
_SAID = {LOWEST: "the lowest price of these", BEST: "the best rating of these",
         MOST: "the most reviewed of these"}
_AS_ASKED = re.compile(r"(?:in|from) .+")


def reason_text(key: str) -> str:
    """A menu key as the customer reads it: "lowest price" -> "the lowest price of these",
    "in red" -> "in red, as you asked"; "built for long runs" as it is."""
    if key in _SAID:
        return _SAID[key]
    if _AS_ASKED.fullmatch(key):
        return f"{key}, as you asked"
    return key


def reason_options(products: Sequence[Product], question: str) -> list[list[str]]:
    """Per shown product, the reasons the model may give (menu keys, :func:`reason_text`
    words them): each a fact of its card. Every product has at least one."""
    q = " " + " ".join(re.findall(r"[a-z0-9]+", question.lower())) + " "
    out: list[list[str]] = []
    lowest = min(p.price for p in products) if products else 0.0
    best = max(p.rating for p in products) if products else 0.0
    # what each product is built for, less what another shown product is built for too:
    # three hiking boots "built for day hikes and ..." read as a loop, and say nothing apart
    uses = [_use_items(built_for(p)) for p in products]
    common = Counter(u for us in uses for u in set(us))
    most = max(p.review_count for p in products) if products else 0
    for p in products:
        opts: list[str] = []
        colour = p.attributes.get("color", "")
        if isinstance(colour, str) and colour and f" {colour.lower()} " in q:
            opts.append(_clean(f"in {colour.lower()}"))
        if p.brand and f" {p.brand.lower()} " in q:
            opts.append(_clean(f"from {p.brand}"))
        mine = uses[products.index(p)]
        own = [u for u in mine if common[u] == 1] or mine[:1]
        if own:
            opts.append(_clean(f"built for {_joined(own)}"))
        if len(products) > 1:
            if p.price == lowest:
                opts.append(LOWEST)
            if p.rating == best:
                opts.append(BEST)
            if p.review_count == most:
                opts.append(MOST)
        if not opts:
            opts.append(_clean(f"a {p.category.replace('_', ' ')} that matches your search"))
        out.append(list(dict.fromkeys(o for o in opts if o)))
    # Only what sets a product apart, where it has such a fact: the model tends to copy the
    # reason of the line above, and one shared with another shown product ("built for
    # running" for two earbuds) is then withheld as a repeat (ReasonCheck), leaving the pick
    # without a reason (a third of picks did).
    shared = Counter(k for opts in out for k in opts)
    return [[k for k in opts if shared[k] == 1] or opts for opts in out]


def _quote(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def answer_grammar(options: Sequence[Sequence[str]], max_picks: int = MAX_PICKS) -> str:
    """xgrammar EBNF for an answer over ``len(options)`` shown products: ``[n] reason``
    lines, each ``n`` at most once and its reason one of ``options[n-1]``, 1..max_picks
    lines. The distinct-number rule is spelled out per set of numbers already used (with 4
    products and 3 picks, 11 rules); compiling one takes about a millisecond."""
    n_products = len(options)
    if not 1 <= n_products <= 9 or not all(options):
        raise ValueError(f"need 1-9 products, each with a reason; got {n_products}")
    picks = max(1, min(max_picks, n_products))
    rules: dict[str, str] = {}

    def after(used: frozenset[int]) -> str:
        """The rule for what follows "[" once ``used`` numbers were picked."""
        name = "p" + "".join(str(i) for i in sorted(used)) if used else "p"
        if name in rules:
            return name
        rules[name] = ""  # reserve (no cycles: ``used`` grows)
        alts = []
        for n in range(1, n_products + 1):
            if n in used:
                continue
            nxt = used | {n}
            alt = f'"{n}] " r{n}'
            if len(nxt) < picks:
                alt += f' ("\\n[" {after(nxt)})?'
            alts.append(alt)
        rules[name] = " | ".join(alts)
        return name

    first = after(frozenset())
    # The first line has no "[": the prefill pass itself then decodes the first pick's number,
    # which is rendered at once (the "[" cost a decode step before it, 65 ms on AVX2 fp32).
    lines = [f"root ::= {first}"]
    lines += [f"{name} ::= {body}" for name, body in rules.items()]
    lines += [f"r{n} ::= " + " | ".join(_quote(o) for o in opts)
              for n, opts in enumerate(options, start=1)]
    return "\n".join(lines) + "\n"


def _words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def _phrase(text: str) -> str:
    """A name as the reason grammar could write it: lower case, letters only."""
    return " ".join(w for w in re.findall(r"[a-z]+", text.lower()) if w)


# What a catalog name is, and so why a reason naming one not its card's is dropped.
NameKind = Literal["brand", "product", "colour"]
# Why a reason is withheld (rufus_assistant_reasons_dropped_total's ``why``): it names
# another product's brand, product line or colour, repeats itself or a reason shown,
# has no words, or is no menu entry / no pick line where one is due.
DropReason = NameKind | Literal["repeat", "short", "format"]


@dataclass
class CatalogNames:
    """The catalog's names a reason must not use unless they are its own card's: brands,
    product lines (without their model numbers) and colours. Built once per process from
    the catalog tables (:meth:`default`), plus the served catalog's brands (:meth:`add_brands`,
    from the search vocabulary)."""

    phrases: dict[str, NameKind] = field(default_factory=dict)   # phrase -> kind

    @classmethod
    def default(cls) -> CatalogNames:
        """From the default catalog's data (data/catalog/)."""
        return cls.from_products(default_catalog())

    @classmethod
    def from_products(cls, products: Iterable[Product]) -> CatalogNames:
        """From the catalog served (its index: the image carries no data/catalog/)."""
        names = cls()
        for p in products:
            names.add(p.brand, "brand")
            if p.model:
                line = p.model[len(p.brand):] if p.model.lower().startswith(p.brand.lower()) else p.model
                names.add(line, "product")
            colour = p.attributes.get("color")
            if isinstance(colour, str) and is_colour_name(colour):
                names.add(colour, "colour")
        return names

    def add(self, name: str, kind: NameKind) -> None:
        p = _phrase(name)
        if kind == "product" and (p in ORDINARY or len(p) < 4 or all(
                w in common_words() for w in p.split())):
            return  # ordinary words ("go", "ride", "everyday", "soft feel") name no product
        if len(p) >= 2:
            self.phrases.setdefault(p, kind)

    def add_brands(self, brands: Iterable[str]) -> None:
        """A catalog's own brands (a user catalog has brands the tables do not)."""
        for b in brands:
            self.add(b, "brand")


@dataclass(frozen=True)
class Verdict:
    reason: str | None        # the reason to show, None when dropped
    dropped: DropReason | Literal[""] = ""  # why (DropReason); "" when shown


class ReasonCheck:
    """Decides whether one pick's reason may be shown next to its card."""

    def __init__(self, names: CatalogNames) -> None:
        self.names = names
        self.shown: list[str] = []

    def check(self, reason: str, product: Product, options: Sequence[str] | None = None
              ) -> Verdict:
        reason = " ".join(reason.split()).rstrip(".")
        if options is not None and reason not in options:
            return Verdict(None, "format")
        words = _words(reason)
        if not words:
            return Verdict(None, "short")
        text = " " + " ".join(words) + " "
        own = " " + _phrase(f"{product.brand} {product.title} "
                             + " ".join(str(v) for v in product.attributes.values())) + " "
        for phrase, kind in self.names.phrases.items():
            if f" {phrase} " in text and f" {phrase} " not in own:
                return Verdict(None, kind)
        if _repeats(words) or reason in self.shown:
            return Verdict(None, "repeat")
        self.shown.append(reason)
        return Verdict(reason)


def _repeats(words: Sequence[str]) -> bool:
    """A word said three times, or a pair of words twice: a loop in the making."""
    if any(words.count(w) >= 3 for w in set(words) if len(w) > 3):
        return True
    pairs = list(itertools.pairwise(words))
    return len(pairs) != len(set(pairs))


def pick_line(i: int, p: Product, met: str = "") -> str:
    """A pick's system-rendered line; ``met``: what of the question its card meets, in the
    card's words ("capacity 6 qt", "stability support for flat feet")."""
    title = p.title.replace("[", "(").replace("]", ")")
    return f"{i}. [{title}]({p.url}) — ${p.price:.2f}, {p.rating:.1f} stars" + (f", {met}" if met else "")


# A pick's number is one digit (at most 9 products: answer_grammar), so its line is rendered
# as soon as the digit is decoded; the "] " after it is checked with the reason. That is two
# decode steps sooner than waiting for "] " (65 ms each on an AVX2 core in fp32).
_HEADER = re.compile(r"\s*\[?(\d)")
_CLOSE = re.compile(r"\] ?")


class PickRenderer:
    """Streaming: the model's ``[n] reason`` lines in, rendered markdown out.

    ``feed`` returns what can be shown now: a pick's line at once when its ``[n]`` is
    complete, its reason when the reason ends (newline, or the stream's end) and passed
    :class:`ReasonCheck`. Text that is not a pick header where one is due (impossible under
    :func:`answer_grammar`, possible for a client of this class without it) is dropped and
    counted, never shown."""

    def __init__(self, products: Sequence[Product], names: CatalogNames,
                 options: Sequence[Sequence[str]] | None = None,
                 on_drop: Callable[[DropReason], None] | None = None,
                 met: Mapping[str, str] | None = None) -> None:
        self.products = list(products)
        self.met = dict(met or {})  # product id -> what of the question its card meets
        self.options = [list(o) for o in options] if options is not None else None
        self.check = ReasonCheck(names)
        self.on_drop = on_drop or (lambda kind: None)
        self.buf = ""
        self.current: Product | None = None
        self.picked: list[Product] = []
        self.dropped: list[DropReason] = []

    def _drop(self, kind: DropReason) -> None:
        self.dropped.append(kind)
        self.on_drop(kind)

    def _end_reason(self, reason: str) -> str:
        assert self.current is not None
        opts = (self.options[self.products.index(self.current)]
                if self.options is not None else None)
        close = _CLOSE.match(reason)
        verdict = (self.check.check(reason[close.end():], self.current, opts) if close
                   else Verdict(None, "format"))
        self.current = None
        if verdict.reason is None:
            self._drop(verdict.dropped or "format")  # a withheld reason always says why
            return ".\n"
        return f": {reason_text(verdict.reason)}.\n"

    def feed(self, delta: str) -> str:
        self.buf += delta
        out: list[str] = []
        while self.buf:
            if self.current is None:
                m = _HEADER.match(self.buf)
                if m is None:
                    if re.fullmatch(r"\s*\[?", self.buf):
                        break  # a header may still come
                    nl = self.buf.find("\n")
                    if nl < 0:
                        break
                    self._drop("format")
                    self.buf = self.buf[nl + 1:]
                    continue
                n = int(m.group(1))
                self.buf = self.buf[m.end():]
                if not 1 <= n <= len(self.products) or self.products[n - 1] in self.picked:
                    self._drop("format")
                    self.current = None
                    nl = self.buf.find("\n")
                    self.buf = "" if nl < 0 else self.buf[nl + 1:]
                    continue
                p = self.products[n - 1]
                self.picked.append(p)
                self.current = p
                out.append(pick_line(len(self.picked), p, self.met.get(p.id, "")))
            else:
                nl = self.buf.find("\n")
                if nl < 0:
                    break
                reason, self.buf = self.buf[:nl], self.buf[nl + 1:]
                out.append(self._end_reason(reason))
        return "".join(out)

    def flush(self) -> str:
        """The stream ended: finish the pick in progress (its reason as far as it got)."""
        out = ""
        if self.current is not None:
            out = self._end_reason(self.buf)
        elif self.buf.strip():
            self._drop("format")
        self.buf = ""
        return out
