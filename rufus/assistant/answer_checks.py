"""Measures one assistant answer against the product cards shown with it.

The checks look at the answer text and the cards only, never at how the answer was made
(free model text or rendered picks), so the same numbers compare both. Pure functions, no
I/O: ``scripts/eval_answers.py`` applies them to live answers, and the unit tests give each
check an answer that must fail it.

Defects (:class:`AnswerDefects`), from a user report on the 135M answer model:

- ``loop``: a sentence said twice, a word 4-gram said three times, a phrase repeated
  back to back, or one card linked from two list items.
- ``invented``: a link that is no card's, a link title that is not its card's (its title,
  its name before the comma or its model), a catalog
  brand or product line that no shown card has, a numbered item that links no card.
- ``contradictions``: a price, rating, colour or size stated next to a card that differs
  from the card.

A markdown link ``[title](url)`` is one token everywhere: its title is the card's by
definition, and two cards with one title are still two different products.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from rufus.retrieval.catalog import Product
from rufus.retrieval.catalog_data import CategorySpec, default_categories

# Single-word catalog names that are also ordinary English: matched only as the catalog
# spells them (capitalised), so "instant results" or "a gap" names no brand.
CASE_SENSITIVE = frozenset("""
amazon apple beats champion converse costa gap global google instant insignia lee meta
ninja oster rogue shark stanley valve yeti balance beta classic detroit elixir gazelle
quest rambler recon switch tungsten jester denali legion latitude aspire lift
""".split())
# Words that name no product alone: a product line made only of these (and of the
# category tables' nouns, uses and attribute values) is ordinary text, never a name.
ORDINARY = frozenset("""
a an and the of for with in on to by all
structure revolution ghost launch ride guide authentic authentics momentum solo elite dime
yoga edge charge inspire balance pace apex instinct multifunctional heritage essentials
original tech slim regular flip clip boom roam lift classic premier gourmet solution
statement genesis wireless connect switch quest premiums pro plus max mini standard
signature premium daily gentle heavy cotton wide mouth digital hand cordless combo wooden
puzzle pretend play set round nonstick ceramic hybrid pan specialty lightweight athletic fit
vinyl adjustable rubber hex neoprene cast iron enameled dutch oven pre-seasoned skillet
hydrating cleanser moisturizing lotion facial moisturizer skin workwear pocket jersey print
bluetooth mouse arc ergonomic keyboard programmable body only little people laugh learn
travel laptop backpack tab go life space one live tour studio buds fit air court vision
""".split())
LIST_ITEM = re.compile(r"^\s*(?:(\d{1,2})[.)]|[-*\u2022])\s+")
_LINK = re.compile(r"\[([^\[\]\n]{1,300})\]\(\s*(\S+?)\s*\)")
_PH = re.compile("\ue000(\\d+)\ue001")       # a link's placeholder in the working text
# an inline "2. " that starts a new numbered item (after a sentence, colon or link)
_INLINE_ITEM = re.compile(r"(?<=[.:;!?\ue001])[ \t]+(?=\d{1,2}[.)][ \t]+\S)")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
_QUOTED = re.compile(r"(?:^|(?<=[\s(]))[\"\u201c][^\"\u201c\u201d\n]{1,120}[\"\u201d]")
_TOKEN = re.compile(r"\ue000\d+\ue001|[a-z0-9]+(?:['\u2019.-][a-z0-9]+)*")
_MARKDOWN = re.compile(r"[*_`#~]+")
_PRICE = re.compile(r"\$\s?(\d{1,3}(?:,\d{3})+|\d+)(?:\.(\d{1,2}))?(?!\d)")
# a price after these words is the customer's budget, not a card's price
_BUDGET_BEFORE = re.compile(
    r"\b(?:under|below|less than|over|above|up to|within|budget(?: of)?|max(?:imum)?|at most|"
    r"cheaper than|more than|than|save|saves|off|around|about|from)\s*$", re.I)
# a rating after these words is a bound ("over 4 stars"), not a card's rating
_BOUND_BEFORE = re.compile(r"\b(?:under|below|over|above|at least|more than|less than|than|"
                           r"nearly|almost|around|about|up to|from)\s*$", re.I)
_BUDGET_AFTER = re.compile(r"^\s*(?:budget|or less|or under|and under|limit|cap|off)\b", re.I)
_NUM = r"(\d(?:\.\d+)?)"
_RATINGS = (
    re.compile(rf"(?<![\d.$]){_NUM}\s*(?:/\s*5|out of (?:5|five))(?:\.0)?(?:\s*stars?)?\b", re.I),
    re.compile(rf"(?<![\d.$]){_NUM}[\s-]*stars?\b(?![\s-]*reviews?)", re.I),
    re.compile(rf"\brated\s+(?:at\s+)?{_NUM}(?![\d.]*\s*(?:%|percent))", re.I),
    re.compile(rf"\brating\s*(?:of|:|is)?\s*{_NUM}(?![\d.]*\s*(?:%|percent))", re.I),
)
_SIZE = re.compile(r"\bsize\s+(\d{1,2}(?:\.\d)?|XXS|XS|S|M|L|XL|XXL)\b(?!\.\d)", re.I)
_INCH = re.compile(r"(?<![\d.])(\d{1,3}(?:\.\d)?)\s*(?:-\s*)?(?:inch(?:es)?\b|\"|\u201d|\u2033)",
                   re.I)


@dataclass
class AnswerDefects:
    """What one answer got wrong; :attr:`ok` when nothing."""

    loop: bool = False
    loop_detail: str = ""
    invented: list[str] = field(default_factory=list)
    contradictions: list[str] = field(default_factory=list)
    cites_shown: bool = False
    tokens: int | None = None   # the answer's token count, set by the caller when known

    @property
    def ok(self) -> bool:
        return not self.loop and not self.invented and not self.contradictions

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "loop": self.loop, "loop_detail": self.loop_detail,
                "invented": list(self.invented), "contradictions": list(self.contradictions),
                "cites_shown": self.cites_shown, "tokens": self.tokens}


# Words that make a catalog colour a colour claim in prose; a colour name without one
# ("Stars", "Light", "Studio", "Otto") is a maker's fancy name and plain text elsewhere.
COLOUR_WORDS = frozenset("""
black white blue red green pink grey gray silver gold purple navy beige brown orange yellow
teal tan olive ivory cream charcoal graphite lavender violet maroon burgundy coral mint sage
turquoise khaki espresso walnut oak chrome bronze copper rose aqua cyan magenta indigo
""".split())


def is_colour_name(name: str) -> bool:
    return any(w in COLOUR_WORDS for w in re.findall(r"[a-z]+", name.lower()))


def _name_pattern(sources: Iterable[str], flags: int) -> re.Pattern[str] | None:
    """One regex for many names (regex sources), longest first: "New Balance" before
    "Balance"."""
    ordered = sorted(set(sources), key=lambda n: (-len(n), n))
    if not ordered:
        return None
    return re.compile(r"(?<![\w'-])(?:" + "|".join(ordered) + r")(?![\w'-])", flags)


def _words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9]+(?:['-][a-z0-9]+)*", text.lower())


def _only_ordinary(name: str, vocab: frozenset[str]) -> bool:
    return all(w in vocab for w in _words(name))


def _line_source(line: str, is_ordinary: Callable[[str], bool]) -> str:
    """A product line as a regex: one ending in a model number also matches any other
    number after its name ("Adrenaline GTS 23" for "Adrenaline GTS 24"), so an invented
    model of a real line is caught too."""
    m = re.fullmatch(r"(.*[^\d\s])\s+\d{1,4}", line)
    if m and not is_ordinary(m.group(1)):
        return re.escape(m.group(1)) + r"\s+\d{1,4}"
    return re.escape(line)


class CatalogFacts:
    """The catalog's names and colours, to recognise them in free text: brands, product
    lines (from the category tables, for the brands the catalog has) and every colour an
    attribute takes. Ordinary-word lines ("Classic", "Pet Hair Eraser") are left out: they
    are more often plain words than names."""

    def __init__(self, brands: Iterable[str], lines: Iterable[str], colors: Iterable[str],
                 ordinary: Iterable[str] = ()) -> None:
        self.ordinary = ORDINARY | {w.lower() for w in ordinary}
        self.brands = frozenset(b for b in brands if b.strip())
        self.lines = frozenset(x for x in lines if x.strip() and not self._is_ordinary(x))
        self.colors = tuple(sorted({c for c in colors if c.strip()}, key=lambda c: (-len(c), c)))
        sources = {n: re.escape(n) for n in self.brands}
        sources.update((x, _line_source(x, self._is_ordinary)) for x in self.lines)
        # an ordinary word and a number ("Go 4", "Ghost 16"): only as the catalog writes it
        exact = {n for n in sources if n.lower() in CASE_SENSITIVE or (
            n in self.lines and self._is_ordinary(re.sub(r"\d+", " ", n)))}
        self._names_ci = _name_pattern((sources[n] for n in sources if n not in exact), re.I)
        self._names_cs = _name_pattern((sources[n] for n in exact), 0)
        self._colors = _name_pattern((re.escape(c) for c in self.colors), re.I)

    type_names: re.Pattern[str] | None = None  # the catalog's product types, as a pattern

    def _is_ordinary(self, name: str) -> bool:
        """Only ordinary words ("Pet Hair Eraser"), or only a number ("574")."""
        words = _words(name)
        return all(w.isdigit() for w in words) or _only_ordinary(name, self.ordinary)

    @classmethod
    def from_products(cls, products: Iterable[Product],
                      categories: Sequence[CategorySpec] | None = None) -> CatalogFacts:
        """From a catalog (the default one or a user's own): its brands, its product models
        (their names after the brand: "WH-1000XM5", "Spirit II E-310") and its colours. A
        model name that is an ordinary word and a number ("Go 4", "Flip 6") is known with its
        brand ("JBL Flip 6"): alone it is too often plain text ("go 4 miles")."""
        cats = default_categories() if categories is None else categories
        brands: set[str] = set()
        colors: set[str] = set()
        models: dict[str, str] = {}
        values: set[str] = set()
        for p in products:
            brands.add(p.brand)
            colour = p.attributes.get("color")
            if isinstance(colour, str) and is_colour_name(colour):
                colors.add(colour)
            if p.model:
                models.setdefault(p.model, p.brand)
            values.update(v for k, v in p.attributes.items() if isinstance(v, str) and k != "color")
        brand_words = {w for b in brands for w in _words(b)}
        ordinary: set[str] = set()
        for text in (*(t for c in cats for t in (*c.nouns, *c.uses, c.name)), *values):
            ordinary.update(w for w in _words(text) if not any(ch.isdigit() for ch in w)
                            and w not in brand_words)
        vocab = ORDINARY | ordinary
        lines: set[str] = set()
        for model, brand in models.items():
            x = model[len(brand):].strip() if model.lower().startswith(brand.lower()) else model
            if x:
                lines.add(f"{brand} {x}" if re.search(r"\d", x) and _only_ordinary(
                    re.sub(r"\d+", " ", x), vocab) else x)
        facts = cls(brands, lines, colors, ordinary)
        brand_keys = {re.sub(r"[^a-z0-9]", "", b.lower()) for b in brands}
        names = sorted({n for c in cats for n in (c.name, *c.nouns)
                        if re.sub(r"[^a-z0-9]", "", n.lower()) not in brand_keys},  # "crocs"
                       key=len, reverse=True)
        if names:
            facts.type_names = re.compile(
                r"(?<![\w'-])(?:" + "|".join(re.escape(n) for n in names) + r")(?![\w'-])", re.I)
        return facts

    def names_in(self, text: str) -> list[str]:
        """Catalog brands and product lines named in ``text``, as written there."""
        found: list[tuple[int, int, str]] = []
        taken: list[tuple[int, int]] = []
        for pat in (self._names_ci, self._names_cs):
            if pat is None:
                continue
            for m in pat.finditer(text):
                if not any(s < m.end() and m.start() < e for s, e in taken):
                    taken.append(m.span())
                    found.append((m.start(), m.end(), m.group(0)))
        return [name for _, _, name in sorted(found)]

    def colors_in(self, text: str) -> list[re.Match[str]]:
        return list(self._colors.finditer(text)) if self._colors is not None else []


# ------------------------------------------------------------------ text structure

@dataclass
class _Item:
    number: int | None      # a numbered list item's number
    listed: bool            # a list item (numbered or bulleted), not a paragraph
    text: str = ""          # links as placeholders


def _blank(text: str, pattern: re.Pattern[str]) -> str:
    """``text`` with every match replaced by spaces (positions unchanged)."""
    return pattern.sub(lambda m: " " * len(m.group(0)), text)


def _items(body: str) -> list[_Item]:
    """Numbered / bulleted items and paragraphs. A line that starts no item continues the
    current one; a blank line ends it."""
    items: list[_Item] = []
    cur: _Item | None = None
    for raw in body.splitlines():
        for line in _INLINE_ITEM.split(raw):
            if not line.strip():
                cur = None
                continue
            m = LIST_ITEM.match(line)
            if m:
                cur = _Item(int(m.group(1)) if m.group(1) else None, True, line[m.end():])
                items.append(cur)
            elif cur is None:
                cur = _Item(None, False, line)
                items.append(cur)
            else:
                cur.text += " " + line
    return items


def _sentences(text: str) -> list[tuple[int, str]]:
    """(offset, sentence) pieces of one item."""
    out, start = [], 0
    for m in _SENTENCE_END.finditer(text):
        out.append((start, text[start:m.start()]))
        start = m.end()
    out.append((start, text[start:]))
    return [(o, s) for o, s in out if s.strip()]


def _tokens(text: str, urls: Sequence[str]) -> list[str]:
    """Lower-case words; a link is one token named by its URL."""
    out = []
    for t in _TOKEN.findall(_MARKDOWN.sub(" ", text.lower())):
        m = _PH.fullmatch(t)
        out.append(f"<{urls[int(m.group(1))]}>" if m else t.rstrip("."))
    return out


def _strip_facts(text: str) -> str:
    """Prices and ratings out: rendered facts ("4.6 out of 5 stars") repeat by design."""
    text = _PRICE.sub(" ", text)
    for pat in _RATINGS:
        text = pat.sub(" ", text)
    return text


def _back_to_back(tokens: Sequence[str]) -> str:
    """A phrase said again right after itself: one word 4 times, two words 3 times, three
    or four words twice ("with a shoe with a shoe")."""
    for n, times in ((1, 4), (2, 3), (3, 2), (4, 2)):
        for i in range(len(tokens) - n * times + 1):
            gram = tokens[i:i + n]
            if all(tokens[i + k * n:i + (k + 1) * n] == gram for k in range(1, times)):
                return f"{' '.join(gram)!r} {times} times in a row"
    return ""


def _find_loop(items: Sequence[_Item], urls: Sequence[str]) -> str:
    sentences: Counter[str] = Counter()
    stream: list[str] = []
    for item in items:
        for _, s in _sentences(item.text):
            toks = _tokens(s, urls)
            if len(toks) >= 2:
                sentences[" ".join(toks)] += 1
        stream += _tokens(_strip_facts(item.text), urls)
    for s, n in sentences.most_common(1):
        if n >= 2:
            return f"sentence said {n} times: {s[:80]!r}"
    grams = Counter(tuple(stream[i:i + 4]) for i in range(len(stream) - 3))
    for g, n in grams.most_common(1):
        if n >= 3:
            return f"4-gram said {n} times: {' '.join(g)!r}"
    run = _back_to_back(stream)
    if run:
        return run
    where: dict[str, list[int]] = {}
    for k, item in enumerate(items):
        if item.listed:
            for url in dict.fromkeys(urls[int(i)] for i in _PH.findall(item.text)):
                where.setdefault(url, []).append(item.number or k + 1)
    for url, nums in where.items():
        if len(nums) >= 2:
            return f"one card linked from items {', '.join(map(str, nums))}: {url}"
    return ""


# ------------------------------------------------------------------ facts

def _num_in(title: str, n: str) -> bool:
    """Whether number ``n`` stands on its own in ``title`` ("10" in "Shoes, Black, 10",
    not in "1080v14" or "10.9")."""
    n = n.rstrip("0").rstrip(".") if "." in n else n
    return re.search(rf"(?<![\d.]){re.escape(n)}(?!\.?\d)", title) is not None


def _family(title: str) -> str:
    """A product's name as people write it: its title before the first comma."""
    return title.split(",")[0].strip()


def _cents(whole: str, frac: str | None) -> int:
    return int(whole.replace(",", "")) * 100 + int((frac or "0").ljust(2, "0"))


def _facts(sentence: str) -> list[tuple[int, str, str]]:
    """(offset, kind, value) of each price, rating and size stated in ``sentence``."""
    out: list[tuple[int, str, str]] = []
    for m in _PRICE.finditer(sentence):
        if _BUDGET_BEFORE.search(sentence[:m.start()]) or _BUDGET_AFTER.match(sentence[m.end():]):
            continue
        out.append((m.start(), "price", f"{_cents(m.group(1), m.group(2))}"))
    taken: list[tuple[int, int]] = []
    for pat in _RATINGS:
        for m in pat.finditer(sentence):
            if any(s < m.end() and m.start() < e for s, e in taken):
                continue
            taken.append(m.span())
            if float(m.group(1)) <= 5 and not _BOUND_BEFORE.search(sentence[:m.start()]):
                out.append((m.start(), "rating", m.group(1)))
    for m in _SIZE.finditer(sentence):
        out.append((m.start(), "size", m.group(1)))
    for m in _INCH.finditer(sentence):
        out.append((m.start(), "inch", m.group(1)))
    return out


def _contradiction(kind: str, value: str, card: dict[str, Any]) -> str:
    title = str(card.get("title", ""))
    name = _family(title)[:60]
    if kind == "price":
        want = round(float(card.get("price", 0)) * 100)
        if int(value) != want:
            return f"price ${int(value) / 100:.2f} but {name} is ${want / 100:.2f}"
    elif kind == "rating":
        want_r = round(float(card.get("rating", 0)), 1)
        if round(float(value), 1) != want_r:
            return f"rating {value} but {name} is rated {want_r:.1f}"
    elif kind == "size":
        attrs = card.get("attributes") or {}
        listed = attrs.get("sizes")
        sizes: list[Any] = listed if isinstance(listed, list) else []
        if isinstance(attrs.get("size"), str):
            sizes = [*sizes, attrs["size"]]
        # the card's sizes (a shoe's size list) or, for a card without them, its title
        found = (any(s.upper().rstrip("CYK") == value.upper() or s.upper() == value.upper()
                     for s in sizes) or (not sizes and (
            _num_in(title, value) if value[0].isdigit() else re.search(
                rf"(?<![\w']){re.escape(value.upper())}(?![\w'])", title) is not None)))
        if not found:
            return f"size {value} but the card is {title[:80]!r}"
    elif kind == "inch":
        inches = [v for k, v in (card.get("attributes") or {}).items() if k.endswith("_in")
                  and isinstance(v, int | float) and not isinstance(v, bool)]
        if not _num_in(title, value) and not any(abs(float(v) - float(value)) < 1e-6 for v in inches):
            return f"{value} inch but the card is {title[:80]!r}"
    elif kind == "color":
        if re.search(rf"(?<![\w-]){re.escape(value)}(?![\w-])", title, re.I) is None:
            return f"colour {value} but the card is {title[:80]!r}"
    return ""


# ------------------------------------------------------------------ the check

def _check_tables(body: str, urls: Sequence[str], by_url: dict[str, dict[str, Any]],
                  d: AnswerDefects) -> str:
    """A markdown table (a comparison): each cell checked against its column's card (the
    header row links one card per column); the body returned without the table, whose rows
    name several cards at once and would read as one item's facts."""
    out: list[str] = []
    columns: list[dict[str, Any] | None] = []
    for line in body.split("\n"):
        if not line.lstrip().startswith("|"):
            columns = []
            out.append(line)
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not columns:  # the header: which card each column is
            for c in cells:
                m = _PH.search(c)
                columns.append(by_url.get(urls[int(m.group(1))]) if m else None)
            out.append("")
            continue
        for i, cell in enumerate(cells[1:], start=1):
            card = columns[i] if i < len(columns) else None
            if card is None:
                continue
            for _pos, kind, value in _facts(cell):
                why = _contradiction(kind, value, card)
                if why:
                    d.contradictions.append(f"table row {cells[0][:30]!r}: {why}")
        out.append("")
    return "\n".join(out)


def check_answer(text: str, cards: list[dict[str, Any]], facts: CatalogFacts,
                 question: str = "") -> AnswerDefects:
    """Every defect of ``text`` (the answer as the customer sees it, links rendered) given
    the ``cards`` shown with it (dicts with title, brand, price, rating, url). A name the
    ``question`` used is the customer's, not invented ("no Nike headphones here")."""
    d = AnswerDefects()
    by_url = {str(c.get("url", "")).strip(): c for c in cards if c.get("url")}
    links: list[tuple[str, str]] = []

    def placeholder(m: re.Match[str]) -> str:
        links.append((m.group(1), m.group(2)))
        return f"\ue000{len(links) - 1}\ue001"

    body = _LINK.sub(placeholder, text)
    urls = [u for _, u in links]

    # links: a shown card's, titled with that card's title (or its name before the comma)
    for title, url in links:
        card = by_url.get(url)
        if card is None:
            d.invented.append(f"link to {url}, which is no shown card")
            continue
        d.cites_shown = True
        shown = " ".join(_MARKDOWN.sub("", title).split()).lower()
        own = str(card.get("title", ""))
        mine = own.replace("[", "(").replace("]", ")").lower()  # a renderer's escaping
        model = str(card.get("model", "")).lower()  # a comparison table names the model
        if shown not in (own.lower(), mine, _family(own).lower(), _family(mine), model) or not shown:
            d.invented.append(f"link title {title[:80]!r} is not its card's {own[:80]!r}")

    body = _check_tables(body, urls, by_url, d)
    items = _items(body)
    d.loop_detail = _find_loop(items, urls)
    d.loop = bool(d.loop_detail)

    # names outside links and outside quotes (a note quoting the customer's words), and
    # outside the names of the catalog's product types ("dash cams" names no brand Dash)
    free = _blank(_blank(body, _PH), _QUOTED)
    if facts.type_names is not None:
        free = _blank(free, facts.type_names)
    for name in dict.fromkeys(facts.names_in(free)):
        pat = re.compile(rf"(?<![\w'-]){re.escape(name)}(?![\w'-])", re.I)
        if not pat.search(question) and not any(
                str(c.get("brand", "")).lower() == name.lower() or pat.search(str(c.get("title", "")))
                for c in cards):
            d.invented.append(f"names {name!r}, which no shown card is")

    # each shown card's name (its title before the comma), where no other card has it
    fams = Counter(_family(str(c.get("title", ""))).lower() for c in cards)
    families = {_family(str(c.get("title", ""))).lower(): c for c in cards}
    families = {f: c for f, c in families.items() if len(f) >= 8 and fams[f] == 1}
    named = _name_pattern((re.escape(f) for f in families), re.I)
    for k, item in enumerate(items):
        card_links = [(m.start(), by_url[urls[int(m.group(1))]]) for m in _PH.finditer(item.text)
                      if urls[int(m.group(1))] in by_url]
        if named is not None:  # a shown card's name written out: refers to it, cites nothing
            card_links = sorted(card_links + [(m.start(), families[m.group(0).lower()])
                                              for m in named.finditer(_blank(item.text, _PH))],
                                key=lambda x: x[0])
        if item.number is not None and not card_links:
            plain = " ".join(_PH.sub("[link]", item.text).split())
            d.invented.append(f"list item {item.number} links no shown card: {plain[:80]!r}")
        previous: dict[str, Any] | None = None
        for off, sentence in _sentences(item.text):
            here = [(p - off, c) for p, c in card_links if off <= p < off + len(sentence)]
            visible = _blank(_blank(sentence, _PH), _QUOTED)
            found = _facts(visible) + [(m.start(), "color", m.group(0)) for m in facts.colors_in(visible)]
            for pos, kind, value in sorted(found):
                before = [c for p, c in here if p < pos]
                after = [c for p, c in here if p > pos]
                card = before[-1] if before else after[0] if after else previous
                if card is None:
                    continue
                why = _contradiction(kind, value, card)
                if why:
                    d.contradictions.append(f"item {item.number or k + 1}: {why}")
            if here:
                previous = here[-1][1]
    return d
