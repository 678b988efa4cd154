"""Answers the system writes from the cards alone: a product's attribute, a comparison table,
the products an earlier answer showed.

- **An attribute question** ("bose quietcomfort 45 battery life", "is the manduka prolite
  latex free?", "does the second one come in blue?"): the first line states the card's value
  for the model asked about (rufus.retrieval.attributes maps the words to the key), or says
  the card does not state it. Never a guess; no model call.
- **A comparison** ("A vs B", "compare the first two", "which lasts longer, A or B?"): every
  named product shown and linked, a markdown table of price, rating and the specs where they
  differ; where the question asks "which" and names what decides it ("lasts longer",
  "lighter"), the pick and that spec. A "which" with no deciding spec ("which is better for
  flights") is the answer model's: it picks one of the compared products from a menu of
  their differences (:func:`difference_menus`), under the answer grammar.
- **Follow-ups by position** ("the first two", "the second one", "the last one", "both"):
  the products the previous answer listed, read back from its links (the client sends the
  history as it does today, with the answer's text).

:func:`plan` decides which applies (None: the usual picks); the renderers return the lines.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from rufus.assistant.answer import pick_line
from rufus.retrieval.attributes import asked_keys, better, differing, label, value_keys, value_text
from rufus.retrieval.base import norm_brand
from rufus.retrieval.catalog import Product
from rufus.retrieval.constraints import COLOURS, WORD_NUMBERS, Constraint

Kind = Literal["attribute", "colour", "variant", "details", "compare", "picks"]
MAX_COMPARED = 4
MAX_ROWS = 8  # spec rows of a comparison table (price and rating besides)

_LINK = re.compile(r"\[([^\]\n]{1,300})\]\((https?://[^)\s]+)\)")
_ORD = {"first": 1, "1st": 1, "second": 2, "2nd": 2, "third": 3, "3rd": 3, "fourth": 4,
        "4th": 4, "fifth": 5, "5th": 5, "last": -1, "top": 1}
_COUNT = {"two": 2, "2": 2, "three": 3, "3": 3, "four": 4, "4": 4}
# After "the second": what makes it a reference to a listed product, not "the first time".
_REF_NEXT = frozenset("""
one ones pick option product item listing choice pair model set of and or vs is does do has have
come comes
weigh weighs cost costs last lasts work works support supports in with better worth good
""".split())
# "is the first waterproof", "the second lighter": an attribute word right after it.
_ATTRIBUTE_NEXT = frozenset("""
waterproof lighter heavier cheaper better quieter louder bigger smaller available worth
""".split())
_ORDINAL = re.compile(r"\b(?P<the>the\s+|your\s+)?(?P<ord>first|second|third|fourth|fifth|last|"
                      r"1st|2nd|3rd|4th|5th|top)\b(?:\s+(?P<n>two|three|four|2|3|4)\b)?"
                      r"(?:\s+(?P<next>[a-z]+))?")
# "number 2", "#2", "option three"
_NUMBERED = re.compile(r"(?:\bnumber\s*|#\s*)(?P<n>[1-5]|one|two|three|four|five)\b|"
                       r"\b(?:no\.?|option|pick|item)\s*(?P<d>[1-5])\b")
_WORD_NUMBER = {"one": 1, **{w: n for w, n in WORD_NUMBERS.items() if n <= 5}}
_PAIR = re.compile(r"(?:\b(?:compare|between|of)\s+|^\s*)(?:#|number\s+)?([1-5])\s*"
                   r"(?:and|&|vs\.?|or|,)\s*(?:#|number\s+)?([1-5])\b")
_BOTH = re.compile(r"\b(?:both(?:\s+of\s+(?:them|those|these))?|those\s+two|these\s+two|the\s+two|"
                   r"all\s+(?:three|3)|those\s+three)\b")
_IT = re.compile(r"\b(?:it|that\s+one|this\s+one)\b")
# "any that empty themselves?", "ones with ...": a narrowing of the earlier search, not "it"
_NARROWING = re.compile(r"\b(?:any|ones|those|these|others|them|they)\b")
# "is a lighter than b": a comparative asks which, too
_COMPARATIVE = re.compile(r"\b\w+er\s+than\b|\b(?:more|less)\s+\w+\s+than\b")
_VERSUS = re.compile(r"\b(?:vs|versus|against)\b|\bcompared?\s+(?:to|with)\b")
# "the lightest of a, b and c", "widest angle out of": a superlative asks which, too
_SUPERLATIVE = re.compile(r"\b(?:best|most|least|(?!(?:inter|lat|hon|for|re|requ|gu|ch|n|w|v|qu|dig|"
                          r"sugg|cont|prot|t|b|pr)est\b)[a-z]{2,}est)\b")
# "a vs b", "which ... a or b": two products asked about (one recognised is not the answer)
_ONE_OF_TWO = re.compile(r"\b(?:vs|versus)\b|\bwhich\b.*\bor\b|\bcompared?\s+(?:to|with)\b")
_WHICH = re.compile(r"\b(?:which|better|or|should\s+i\s+(?:get|buy|go\s+with|pick|choose)|"
                    r"what\s+(?:one|would\s+you))\b")
# A question that wants other products, not a fact about the one named.
_SEARCHING = re.compile(r"\b(?:alternatives?|similar|like\s+the|instead|cheaper|other|others|"
                        r"than|recommend|suggest|show\s+me|options|accessor\w+)\b")
# A question about the one product named: "is the x ...?", "how loud is the x", "x vegan?"
_ASKS = re.compile(r"^\s*(?:is|are|does|do|can|could|will|would|how|what|whats|what's|which|has|"
                   r"have|roughly|about)\b|\?\s*$")
# words that ask about two products or more (a comparison), not one
_TWO_ASKED = re.compile(r"\b(?:vs\.?|versus|or|compare[sd]?|comparing|comparison|difference|"
                        r"differences|between|and|better|which)\b")
_MADE_WHERE = re.compile(r"\bwhere\b.{0,40}\b(?:made|manufactured|built|assembled)\b|"
                         r"\bmade\s+in\s+(?:what|which)\b|\bcountry\s+of\s+origin\b")
# ... but not a request for an opinion (the usual picks show it first)
_OPINION = re.compile(r"\b(?:worth|good|best|recommend|review|reviews|love)\b")
# A size the question asks for ("size 8", "in a kids 12c", "in king").
_SIZE_ASK = re.compile(r"\bsize\s+(?P<a>\d{1,2}(?:\.5)?\s*[ck]?|"
                       r"(?!(?:in|of|on|for|is|and|or|the|mah)\b)[a-z]{1,3})\b|"
                       r"\b(?P<b>\d{1,2}(?:\.5)?c)\b")
_DETAILS = re.compile(r"\b(?:tell\s+me\s+(?:more|about)|more\s+about|details?|specs?|"
                      r"specifications|what\s+about|info(?:rmation)?)\b")
_COLOUR_ASK = re.compile(r"\b(?:come|comes|available|sold|get\s+it|have\s+it|in)\b")


_ITEM = re.compile(r"^\s*(\d+)\.\s+\[[^\]\n]{1,300}\]\((https?://[^)\s]+)\)", re.M)


def previous_links(history: Sequence[Mapping[str, str]]) -> list[str]:
    """The product URLs the last assistant turn listed, in order, each once: its last
    numbered list (the answer's picks; an OpenAI client's copy starts with the cards' list,
    numbered too), else every link (a comparison table's header)."""
    for turn in reversed(history):
        if turn.get("role") != "assistant":
            continue
        text = turn.get("content", "")
        blocks: list[list[str]] = []
        for m in _ITEM.finditer(text):
            if m.group(1) == "1" or not blocks:
                blocks.append([])
            blocks[-1].append(m.group(2))
        if blocks:
            return list(dict.fromkeys(blocks[-1]))
        return list(dict.fromkeys(url for _, url in _LINK.findall(text)))
    return []


def positions(question: str, shown: int) -> list[int]:
    """0-based positions of the previous answer's products that ``question`` refers to
    ("compare the first two" -> [0, 1]; "the last one" -> [shown - 1]); [] when none."""
    if shown <= 0:
        return []
    q = question.lower()
    out: list[int] = []
    q = _fix_ordinals(q)
    for m in _ORDINAL.finditer(q):
        ordinal, n, nxt = _ORD[m.group("ord")], m.group("n"), m.group("next") or ""
        if n:  # "the first two", "top 3"
            count = _COUNT[n]
            out += list(range(count)) if ordinal > 0 else list(range(shown - count, shown))
            continue
        # "the second one", "the first?", "is the last waterproof": the; "first one": a
        # product noun after it; not "the first time", "my first apartment"
        before = q[:m.start()].rstrip()
        if m.group("the"):
            ok = not nxt or nxt in _REF_NEXT or nxt in _ATTRIBUTE_NEXT
        else:  # "first one", or the second of a list: "the 1st and 3rd", "first or second"
            ok = nxt in ("one", "pick", "option", "product", "item", "choice") or (
                bool(out) and before.endswith(("and", "or", ",", "&", "vs"))) or (
                # "first vs second?": the first of a list of ordinals
                nxt in ("and", "or", "vs", "versus") and bool(_ORDINAL.search(q, m.end())))
        if ok:
            out.append(shown - 1 if ordinal < 0 else ordinal - 1)
    for m in _NUMBERED.finditer(q):
        n = m.group("n") or m.group("d")
        out.append((_WORD_NUMBER.get(n) or int(n)) - 1)
    for m in _PAIR.finditer(q):  # "compare 1 and 3"
        out += [int(m.group(1)) - 1, int(m.group(2)) - 1]
    if not out and _BOTH.search(q):
        out = list(range(min(3 if re.search(r"\b(?:three|3)\b", q) else 2, shown)))
    return [i for i in dict.fromkeys(out) if 0 <= i < shown]


def _fix_ordinals(q: str) -> str:
    """"the thrid one", "the secnd": an ordinal with one typo."""
    from rufus.retrieval.attributes import typo_of

    words = ("first", "second", "third", "fourth", "fifth")
    return re.sub(r"[a-z]{5,6}", lambda m: next(
        (w for w in words if m.group(0) != w and typo_of(m.group(0), w)), m.group(0)), q)


def refers_to_it(question: str) -> bool:
    """"does it come in blue?", "how much does that one weigh?": the one product before."""
    q = question.lower()
    return bool(_IT.search(q)) and not _NARROWING.search(q)


def colour_asked(question: str) -> str | None:
    """The colour a "does it come in blue?" asks about, or None."""
    q = question.lower()
    for c in COLOURS:
        if re.search(rf"\b{c}\b", q) and _COLOUR_ASK.search(q):
            return "grey" if c == "gray" else c
    return None


@dataclass
class CardAnswer:
    """What the system answers from the cards: ``products`` to show (in order), the keys
    asked (best first), the colour (kind colour) or size (kind variant) asked, and for a
    comparison whether it asks "which"."""

    kind: Kind
    products: list[Product]
    keys: list[str] = field(default_factory=list)
    value: str = ""  # the colour or size asked ("blue", "9"; "" when the words name none)
    which: bool = False
    asked: str = ""  # the attribute as asked, when no card states it


def brand_models(question: str, products: Sequence[Product]) -> list[Product]:
    """The products of brands the question names whose shown listings are all one model
    ("le creuset or staub dutch oven?": each brand's one dutch oven), in the question's order."""
    ws = re.findall(r"[a-z0-9]+", question.lower())
    text = " " + " ".join(ws) + " "
    by_brand: dict[str, list[Product]] = {}
    for p in products:
        by_brand.setdefault(p.brand, []).append(p)
    out = []
    for brand, ps in by_brand.items():
        bw = " ".join(re.findall(r"[a-z0-9]+", brand.lower()))
        if bw and f" {bw} " in text and len({p.model for p in ps}) == 1 and ps[0].model:
            out.append((text.index(f" {bw} "), ps[0]))
    return [p for _, p in sorted(out, key=lambda x: x[0])]


def targets(question: str, products: Sequence[Product], models: Sequence[str]) -> list[Product]:
    """The products a question is about, one listing per model, from a search's results
    and the models it recognised by name: what :func:`plan` answers from the cards."""
    named = [next(p for p in products if p.model == m)
             for m in models if any(p.model == m for p in products)]
    if not named and products and len({p.model for p in products}) == 1 \
            and products[0].model and norm_brand(products[0].brand) in norm_brand(question):
        named = list(products[:1])  # "the le creuset dutch oven": its only one
    if len(named) < 2:  # "le creuset or staub dutch oven?": each brand's one model
        more = brand_models(question, products)
        if len({p.model for p in [*named, *more]}) >= 2:
            named = list({p.model: p for p in [*named, *more]}.values())
    if len(named) >= 3:  # "sonos arc vs bose 900 vs samsung q990c": no TV among soundbars
        top, n = Counter(p.category for p in named).most_common(1)[0]
        if n >= 2 and n == len(named) - 1:
            named = [p for p in named if p.category == top]
    return named


def _name(p: Product) -> str:
    return p.model or p.title.split(",")[0]


def plan(question: str, targets: Sequence[Product], catalog_keys: Iterable[str],
         by_reference: bool = False) -> CardAnswer | None:
    """Whether ``question`` about ``targets`` (the models it names, or the earlier answer's
    products it refers to) is answered from the cards, and how; None: the usual picks."""
    q = question.lower()
    targets = list(dict.fromkeys(targets))[:MAX_COMPARED]
    if not targets:
        return None
    ignore = [_name(p) for p in targets] + [p.category.replace("_", " ") for p in targets]
    own = list(dict.fromkeys(k for p in targets for k in p.attributes))
    keys = asked_keys(question, own, ignore)
    if not keys and len(targets) == 1:  # "can it play 78s": a value its card lists
        keys = value_keys(question, targets[0].attributes, ignore)
    if len(targets) >= 2 and not keys and not _TWO_ASKED.search(q) and not by_reference and (
            _MADE_WHERE.search(q) or (_ASKS.search(q) and not _OPINION.search(q))):
        # "denim weight of levis 501s": one name two models share, a spec no card states
        return CardAnswer("attribute", targets[:1], [],
                          asked="country of origin" if _MADE_WHERE.search(q) else "")
    if len(targets) >= 2:  # two products named or referred to: compare them
        # "a vs b battery life": the spec named decides, as "which lasts longer" would
        which = bool(_WHICH.search(q) or _COMPARATIVE.search(q) or _SUPERLATIVE.search(q)
                     or (keys and _VERSUS.search(q)))
        return CardAnswer("compare", targets, keys, which=which)
    if (_SEARCHING.search(q) or _ONE_OF_TWO.search(q)) and not by_reference:
        return None  # "a vs b" with b not recognised: the usual picks, not a's card alone
    colour = colour_asked(question)
    if colour:
        return CardAnswer("colour", targets, value=colour)
    size = _SIZE_ASK.search(q)
    if size or re.search(r"\b(?:come|comes|available|make\s+(?:it|them))\s+in\b", q):
        value = (size.group("a") or size.group("b")).replace(" ", "").upper() if size else ""
        return CardAnswer("variant", targets, value=value, asked=question)
    if keys:
        return CardAnswer("attribute", targets, keys)
    elsewhere = asked_keys(question, set(catalog_keys) - set(own), ignore)
    if elsewhere:  # asked about what this card does not state
        return CardAnswer("attribute", targets, [], asked=label(elsewhere[0]))
    if by_reference and _DETAILS.search(q):
        return CardAnswer("details", targets)
    if _MADE_WHERE.search(q):  # no card states a country of origin
        return CardAnswer("attribute", targets, [], asked="country of origin")
    if _ASKS.search(q) and not _OPINION.search(q):
        # "how loud is the dyson v8, in decibels?": nothing on the card says
        return CardAnswer("attribute", targets, [], asked="")
    if by_reference:  # "is the third one good for lattes?": the picks, over that product
        return CardAnswer("picks", targets)
    return None


def render_attribute(a: CardAnswer) -> list[str]:
    p = a.products[0]
    if not a.keys:
        first = (f"The product card for **{_name(p)}** does not state its {a.asked}." if a.asked
                 else f"The product card for **{_name(p)}** does not state that.")
    else:
        k = a.keys[0]
        first = f"**{_name(p)}** — {label(k)}: **{value_text(k, p.attributes[k])}** (from its product card)."
    return [first + "\n\n", pick_line(1, p) + ".\n"]


def render_colour(a: CardAnswer, listings: Sequence[Product]) -> list[str]:
    """``listings``: every listing of the product's model (its colours)."""
    p = a.products[0]
    mine = [x for x in listings if x.model == p.model] or [p]
    want = a.value
    hit = [x for x in mine if want in str(x.attributes.get("color", "")).lower().replace("gray", "grey")]
    colours = list(dict.fromkeys(str(x.attributes.get("color", "")) for x in mine
                                 if x.attributes.get("color")))
    if hit:
        c = hit[0].attributes.get("color", want)
        return [f"Yes: **{_name(p)}** comes in {c}.\n\n", pick_line(1, hit[0]) + ".\n"]
    listed = ", ".join(colours) if colours else "no colours"
    return [f"No: **{_name(p)}** does not come in {want}; its listings are in {listed}.\n\n",
            pick_line(1, p) + ".\n"]


def _sizes(p: Product) -> list[str]:
    v = p.attributes.get("sizes")
    if isinstance(v, list):
        return [str(x) for x in v]
    one = p.attributes.get("size")
    return [str(one)] if isinstance(one, str) and one else []


def render_variant(a: CardAnswer, listings: Sequence[Product]) -> list[str]:
    """"does the second one come in size 8?", "does the last one come in king?": which of
    the model's listings has that size (or the value named), from their cards."""
    p = a.products[0]
    mine = [x for x in listings if x.model == p.model] or [p]
    want = a.value
    q = f" {a.asked.lower()} "
    for x in mine:
        sizes = _sizes(x)
        if (want and any(s.upper() == want for s in sizes)) or (
                not want and any(f" {s.lower()} " in q for s in sizes)):
            hit = want or next(s for s in sizes if f" {s.lower()} " in q)
            return [f"Yes: **{_name(p)}** comes in size {hit}.\n\n", pick_line(1, x) + ".\n"]
    have = list(dict.fromkeys(s for x in mine for s in _sizes(x)))
    if not have:
        return [f"The product card for **{_name(p)}** lists no sizes.\n\n", pick_line(1, p) + ".\n"]
    what = f"size {want}" if want else "that size"
    return [f"No: **{_name(p)}** does not come in {what}; its listings come in "
            f"{', '.join(have[:14])}.\n\n", pick_line(1, p) + ".\n"]


def render_details(a: CardAnswer) -> list[str]:
    p = a.products[0]
    specs = "; ".join(f"{label(k)}: {value_text(k, v)}" for k, v in p.attributes.items()
                      if k not in ("color",))
    return [f"**{_name(p)}** — {specs or 'no specs on its card'}.\n\n", pick_line(1, p) + ".\n"]


def _cell(p: Product, k: str) -> str:
    v = p.attributes.get(k)
    return "not stated" if v is None else value_text(k, v)


def _row_label(k: str) -> str:
    s = label(k)
    return s[:1].upper() + s[1:]


def render_table(a: CardAnswer) -> list[str]:
    """The comparison's header line and markdown table (price, rating, the differing specs,
    the asked ones first)."""
    ps = a.products
    names = [_name(p) for p in ps]
    head = "Comparing " + ", ".join(f"**{n}**" for n in names[:-1]) + f" and **{names[-1]}**:\n\n"
    rows = [k for k in a.keys if any(k in p.attributes for p in ps)]
    if rows and not a.which:  # "battery life of the sony xm5s" (a name two models share):
        # the asked spec's value of each, first, before the table
        k = rows[0]
        head = (f"{_row_label(k)}: " + "; ".join(f"**{n}** {_cell(p, k)}" for n, p in
                                                  zip(names, ps, strict=True)) + ".\n\n" + head)
    rows += [k for k in differing([p.attributes for p in ps], skip=("sizes", "gender")) if k not in rows]
    lines = ["| | " + " | ".join(f"[{n}]({p.url})" for n, p in zip(names, ps, strict=True)) + " |",
             "|---|" + "---|" * len(ps),
             "| Price | " + " | ".join(f"${p.price:.2f}" for p in ps) + " |",
             "| Rating | " + " | ".join(f"{p.rating:.1f} stars" for p in ps) + " |"]
    lines += ["| " + _row_label(k) + " | " + " | ".join(_cell(p, k) for p in ps) + " |"
              for k in rows[:MAX_ROWS]]
    return [head, "\n".join(lines) + "\n"]


def decide(a: CardAnswer, question: str) -> str | None:
    """A "which" the question's own words decide ("lasts longer", "lighter", "cheaper"):
    the pick line and the spec that decides it; None when no asked spec tells them apart."""
    ps = a.products
    q = question.lower()
    if re.search(r"\b(?:cheaper|cheapest|less\s+expensive|lower\s+price|best\s+value)\b", q):
        prices = [p.price for p in ps]
        if len(set(prices)) > 1:
            i = prices.index(min(prices))
            vs = " vs ".join(f"${x:.2f}" for x in prices)
            return f"\nThe lower price: **[{_name(ps[i])}]({ps[i].url})**, {vs}.\n"
    for k in a.keys:
        vals = [p.attributes.get(k) for p in ps]
        if all(v is None for v in vals):
            continue
        if all(isinstance(v, bool) or v is None for v in vals):
            if len({bool(v) for v in vals}) == 1:
                continue
            i = next(j for j, v in enumerate(vals) if v is True)
            who = f"**[{_name(ps[i])}]({ps[i].url})**"
            return f"\nThe pick on {label(k)}: {who} has it; " + ", ".join(
                f"{_name(p)}: {_cell(p, k)}" for j, p in enumerate(ps) if j != i) + ".\n"
        nums = [float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None
                for v in vals]
        known = [x for x in nums if x is not None]
        if len(known) < 2 or len(set(known)) == 1:
            continue
        sign = better(k, question)
        best = max(known) if sign > 0 else min(known)
        i = nums.index(best)
        vs = " vs ".join(f"{_cell(p, k)} ({_name(p)})" for p in ps)
        return f"\nThe pick on {label(k)}: **[{_name(ps[i])}]({ps[i].url})** — {vs}.\n"
    return None


def difference_menus(products: Sequence[Product], question: str) -> list[list[str]]:
    """Per compared product, what sets it apart from the others (menu keys for the answer
    grammar, as rufus.assistant.answer.reason_options): "more battery life", "lighter",
    "has noise cancelling", "lowest price" ... Every product has at least one."""
    menus: list[list[str]] = [[] for _ in products]
    for k in differing([p.attributes for p in products], skip=("sizes", "gender")):
        vals = [p.attributes.get(k) for p in products]
        if all(isinstance(v, bool) or v is None for v in vals):
            for j, v in enumerate(vals):
                if v is True and any(x is not True for x in vals):
                    menus[j].append(f"has {label(k)}")
            continue
        nums = [float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None
                for v in vals]
        known = [x for x in nums if x is not None]
        if len(known) < 2 or len(set(known)) == 1:
            continue
        sign = better(k)
        best = max(known) if sign > 0 else min(known)
        j = nums.index(best)
        word = "lighter" if "weight" in k else ("more " if sign > 0 else "less ") + label(k)
        menus[j].append(word)
    prices = [p.price for p in products]
    ratings = [p.rating for p in products]
    for j, p in enumerate(products):
        if p.price == min(prices) and len(set(prices)) > 1:
            menus[j].append("lowest price")
        if p.rating == max(ratings) and len(set(ratings)) > 1:
            menus[j].append("best rating")
        if not menus[j]:
            menus[j].append(f"a {p.category.replace('_', ' ')} to consider")
        menus[j] = [re.sub(r"[^A-Za-z0-9 ,'-]", " ", m).strip()[:60] for m in dict.fromkeys(menus[j])]
    return menus


def met_text(constraints: Sequence[Constraint], p: Product) -> str:
    """What of the question ``p``'s card meets, in the card's words ("6 qt", "sleeps 4
    people", "stability support for flat feet", "waterproof"), for its pick line."""
    out: list[str] = []
    for c in constraints:
        if not c.met(p) or c.kind in ("brand", "gender", "colour"):
            continue
        if c.kind == "number":
            k = next((k for k in c.keys if isinstance(p.attributes.get(k), int | float)), None)
            if k:
                out.append(f"{label(k)} {value_text(k, p.attributes[k])}")
        elif c.kind == "feature":
            k = c.keys[0]
            v = p.attributes.get(k)
            out.append(str(v) if isinstance(v, str) else label(k))
        elif c.kind == "size":
            out.append(f"in size {c.value}")
        elif c.kind == "value":
            k = c.keys[0]
            v = str(p.attributes.get(k, c.value))
            words = f"{v} {label(k)}" if label(k) not in v.lower() else v
            if c.text and c.text.lower() not in words.lower():
                words += f" for {c.text}"
            out.append(words)
    return ", ".join(dict.fromkeys(out))


def shared_met(met: Mapping[str, str]) -> tuple[str, dict[str, str]]:
    """What every shown card meets, said once ("All of these: stability support for flat
    feet."), and per card only what differs ("capacity 6 qt" beside "capacity 6.3 qt"): the
    same words on every pick line read as a loop."""
    parts = {pid: [x for x in text.split(", ") if x] for pid, text in met.items()}
    if not parts:
        return "", {}
    common = [x for x in next(iter(parts.values())) if all(x in ps for ps in parts.values())]
    rest = {pid: ", ".join(x for x in ps if x not in common) for pid, ps in parts.items()}
    line = f"All of these: {', '.join(common)}." if common and len(parts) > 1 else ""
    if len(parts) == 1:
        rest = {pid: ", ".join(ps) for pid, ps in parts.items()}
    return line, rest

