"""What the answer model sees, what it may not write, and the replies that need no model.

Grounding: the answer model gets the retrieved products as a numbered list *without URLs*
and is asked to cite them as ``[n]``. :class:`LinkRenderer` turns each ``[n]`` in the
streamed text into a markdown link to product n's catalog URL and deletes any URL the model
writes itself, so every link a user sees comes from the retrieval results, whatever the
model produces.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from rufus.assistant.answer import reason_options
from rufus.retrieval.catalog import Product
from rufus.retrieval.price import parse_price_cap

HISTORY_TURNS = 4          # previous turns given to the answer model
# Per previous turn, by role: a customer's question nearly whole; an earlier answer only its
# opening, which names what it recommended first. Why: a follow-up's history is prefilled
# while the planner runs, and where that outlasts the plan the answer waits for it (whole
# answers did so on AVX2: docs/benchmarks-history.md, "Follow-ups"); the products the new answer
# needs are in its own prompt.
HISTORY_CHARS = {"user": 400, "assistant": 160}
# The products the answer prompt lists, the top of the cards (rufus_assistant's
# ``answer_products``): the answer recommends two or three, and every product line is
# prefilled after the plan, on the critical path (docs/benchmarks-history.md, "Follow-ups").
ANSWER_PRODUCTS = 4

SYSTEM_PRODUCTS = (
    "You are a helpful shopping assistant. Recommend the two or three numbered products below "
    "that best fit the question, best first: one line each, the product's number in brackets "
    "and why it fits, for example:\n[2] built for long runs\n[1] lowest price")
SYSTEM_GENERAL = (
    "You are a shopping assistant. This question is not about shopping: answer it in one or "
    "two sentences, then offer to help find products. Do not write links.")

# Intents answered without product search or the answer model: the model has no access to
# orders or return policies and would invent them; these say where the real answer is.
SERVICE_REPLIES = {
    "order_status": (
        "I can't see your orders from here. Open Your Orders in your account to see each "
        "order's status and tracking, or contact customer service with your order number."),
    "returns_refunds": (
        "Most items can be returned within 30 days of delivery. Start a return from Your "
        "Orders in your account: choose the item, pick a reason and print the label. Refunds "
        "go to the original payment method once the item is received."),
}


def clip(text: str, n: int) -> str:
    return text if len(text) <= n else text[: n - 3] + "..."


def product_lines(products: Sequence[Product], question: str,
                  menus: Sequence[Sequence[str]] | None = None) -> str:
    """One line per product: its number, its name (its model, else :func:`family`) and
    its reason menu (rufus.assistant.answer.reason_options), ``[1] Hoka Bondi 8 Women's
    Running Shoes: built for long runs; best rating``. The menu is what the
    grammar lets the model say of that product, so the model reads exactly the facts it
    chooses among. No price, rating or colour digits: every digit is a token for this
    tokenizer and a new prompt's prefill is most of the answer engine's work under load (the
    exact figures are on the card and in the system-rendered pick line; the menu says which
    product is the cheapest or best rated). docs/benchmarks-history.md, "Menu lines"."""
    menus = reason_options(products, question) if menus is None else menus
    return "\n".join(f"[{i}] {p.model or family(p)}: {'; '.join(menu)}"
                      for i, (p, menu) in enumerate(zip(products, menus, strict=True), start=1))


def previous_turns(history: Sequence[dict[str, str]] | None) -> list[dict[str, str]]:
    return [{"role": m["role"], "content": clip(m["content"], HISTORY_CHARS[m["role"]])}
            for m in (history or [])[-HISTORY_TURNS:] if m["role"] in ("user", "assistant")]


PRODUCTS_HEADER = "Products:\n"


def answer_prefix_messages(history: Sequence[dict[str, str]] | None) -> list[dict[str, str]]:
    """The start of a product-path answer prompt, known before the plan: the system message,
    the earlier turns and the header of the last user message (rufus/assistant/pipeline.py
    prefills it while the planner runs)."""
    return [{"role": "system", "content": SYSTEM_PRODUCTS}, *previous_turns(history),
            {"role": "user", "content": PRODUCTS_HEADER}]


def answer_messages(question: str, products: Sequence[Product],
                    history: Sequence[dict[str, str]] | None, general: bool = False,
                    menus: Sequence[Sequence[str]] | None = None) -> list[dict[str, str]]:
    """Chat messages for rufus_llm: system, previous turns, then products + question."""
    if general or not products:  # no products: the pipeline replies itself (no_results_reply)
        system, user = SYSTEM_GENERAL, question
    else:
        system = SYSTEM_PRODUCTS
        user = f"{PRODUCTS_HEADER}{product_lines(products, question, menus)}\n\nQuestion: {question}"
    return [{"role": "system", "content": system}, *previous_turns(history),
            {"role": "user", "content": user}]


# ------------------------------------------------------------------ fallback filters

def price_cap(text: str) -> float | None:
    """A price cap stated in the question ("under $80", "below 50 dollars", "under 1k",
    "under 30 euros" in US dollars): rufus.retrieval.price.parse_price_cap."""
    cap = parse_price_cap(text)
    return None if cap is None else round(cap.usd, 2)


# ------------------------------------------------------------------ link rendering

_CITE = re.compile(r"\[(\d{1,2})\]")
_URL = re.compile(r"(?:https?://|www\.)[^\s)\]]+", re.I)
_URL_STARTS = ("https://", "http://", "www.")
_MD_EMPTY_LINK = re.compile(r"\[([^\]\n]{1,200})\]\(\s*\)")


def family(p: Product) -> str:
    """The name a model writes for a product: its title up to the first comma (brand, line
    and kind, without colour/size variants)."""
    return p.title.split(",")[0].strip()


def diversify(products: Sequence[Product], k: int) -> list[Product]:
    """Top k with one listing per product model first (five colours of one shoe, or its men's
    and women's versions, are one choice for the customer), then the rest in rank order."""
    out: list[Product] = []
    seen: set[str] = set()
    for p in products:
        key = p.model or family(p)
        if key not in seen and len(out) < k:
            out.append(p)
            seen.add(key)
    for p in products:
        if len(out) >= k:
            break
        if p not in out:
            out.append(p)
    return out


class LinkRenderer:
    """Streaming filter over the answer text. ``[n]`` -> ``[title](url)`` of retrieved product
    n; a retrieved product's name written out (its :func:`family`) -> linked to it; any
    other URL removed. Holds back only what may still become one of these (an unfinished
    ``[nn``, URL, or product name), except that the answer's opening words are never held
    for a name: the first text reaches the customer as soon as the model writes it, not after
    a written-out name's every token (up to a dozen decode steps, most of the first answer
    token's tail on a slow CPU: docs/benchmarks.md); a name the answer opens with stays
    plain text (the card links it)."""

    def __init__(self, products: Sequence[Product]) -> None:
        self.products = list(products)
        self.buf = ""
        self.started = False  # some text has been released
        self.cited: list[str] = []
        names: dict[str, Product] = {}
        for p in self.products:
            f = family(p)
            if len(f) >= 8:
                names.setdefault(f.lower(), p)
        self.names = names
        self.maxlen = max((len(n) for n in names), default=0)
        self._name_re = (re.compile("|".join(re.escape(n) for n in sorted(names, key=len, reverse=True)),
                                    re.I) if names else None)

    def _cut(self, s: str) -> int:
        i = s.rfind("[")
        if i >= 0 and re.fullmatch(r"\[\d{0,2}", s[i:]):
            return i
        m = re.search(r"(?:https?://|www\.)\S*$", s, re.I)
        if m:
            return m.start()
        low = s.lower()
        for i in range(max(0, len(s) - self.maxlen), len(s)):
            if not self.started and not s[:i].strip():
                continue  # the answer's opening words: released, never held for a name
            if (i == 0 or not s[i - 1].isalnum()) and any(n.startswith(low[i:]) for n in self.names):
                return i
        for p in _URL_STARTS:
            for n in range(len(p) - 1, 0, -1):
                if low.endswith(p[:n]) and (len(s) == n or not s[-n - 1].isalnum()):
                    return len(s) - n
        return len(s)

    def _cite(self, p: Product) -> None:
        if p.id not in self.cited:
            self.cited.append(p.id)

    def _render(self, s: str) -> str:
        s = _URL.sub("", s)
        s = _MD_EMPTY_LINK.sub(r"\1", s)  # "[text](" + removed URL + ")" -> "text"
        parts = _CITE.split(s)  # text, number, text, number, ...
        out = []
        for j, part in enumerate(parts):
            if j % 2:
                n = int(part)
                if 1 <= n <= len(self.products):
                    p = self.products[n - 1]
                    self._cite(p)
                    out.append(f"[{p.title}]({p.url})")
            elif self._name_re is not None:
                def link(m: re.Match[str]) -> str:
                    p = self.names[m.group(0).lower()]
                    self._cite(p)
                    return f"[{m.group(0)}]({p.url})"

                out.append(self._name_re.sub(link, part))
            else:
                out.append(part)
        return "".join(out)

    def feed(self, delta: str) -> str:
        self.buf += delta
        cut = self._cut(self.buf)
        out, self.buf = self.buf[:cut], self.buf[cut:]
        self.started = self.started or bool(out.strip())
        return self._render(out)

    def flush(self) -> str:
        out, self.buf = self.buf, ""
        return self._render(out)


def cards(products: Sequence[Product]) -> list[dict[str, Any]]:
    return [p.card() for p in products]
