"""Do answers answer? The checks behind ``scripts/eval_answers.py --questions
data/assistant/answers_heldout.jsonl`` (issue 58), each unit-tested on hand-written bad answers.

Held-out items (written before tuning) carry labels independent of the answer code:

- ``{"kind": "attribute", "q", "model", "key"}``: the first line must state the card's value
  of ``key`` for ``model`` (as the card shown has it), and no number the card does not have;
  ``key`` null: it must say the card does not state it.
- ``{"kind": "comparison", "q", "models", "which", "key", "better"}``: every model shown and
  linked, and at least one spec where they differ given with both values; a "which" with a
  ``key``: the pick line names the model that is better on it.
- ``{"kind": "followup", "turns", "category", "ref" | "constraints"}``: positional ``ref``
  (1-based, or "last"): the second turn's cards are the products the first answer listed at
  those positions; ``"narrow"``: the second turn's cards are all of ``category`` and meet
  ``constraints``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from rufus.retrieval.attributes import value_text
from rufus.retrieval.search_eval import meets

Card = dict[str, Any]
_LINK = re.compile(r"\[([^\]\n]{1,300})\]\((https?://[^)\s]+)\)")
_NUM = re.compile(r"(?<![\w.])\d+(?:\.\d+)?")
_NOT_STATED = re.compile(r"\b(?:does\s+not\s+state|not\s+stated|doesn't\s+(?:say|state)|"
                         r"does\s+not\s+say)\b", re.I)


def links(text: str) -> list[str]:
    return list(dict.fromkeys(u for _, u in _LINK.findall(text)))


def _first_line(answer: str) -> str:
    return next((ln for ln in answer.splitlines() if ln.strip()), "")


def _card_numbers(card: Card) -> set[float]:
    nums = {float(card.get("price", 0)), float(card.get("rating", 0))}
    for v in (card.get("attributes") or {}).values():
        if isinstance(v, str):
            nums |= {float(x) for x in re.findall(r"\d+(?:\.\d+)?", v)}  # "100m", "IPX7"
        if isinstance(v, int | float) and not isinstance(v, bool):
            nums.add(float(v))
            if v >= 1024 and v % 1024 == 0:
                nums.add(float(v) / 1024)
    for text in (card.get("title", ""), card.get("model", "")):
        nums |= {float(x) for x in _NUM.findall(str(text))}
    return nums


def check_attribute(item: dict[str, Any], answer: str, cards: Sequence[Card]) -> list[str]:
    """What is wrong with an attribute answer ([] when right)."""
    mine = [c for c in cards if c.get("model") == item["model"]]
    if not mine:
        return ["the model asked about is not shown"]
    card = mine[0]
    first = _first_line(answer)
    problems = []
    key = item.get("key")
    if key is None:
        if not _NOT_STATED.search(first):
            problems.append("says nothing of the card not stating it")
    else:
        v = (card.get("attributes") or {}).get(key)
        if v is None:
            problems.append(f"the shown card has no {key}")
        elif value_text(key, v).lower() not in first.lower():
            problems.append(f"first line lacks the card's {key} ({value_text(key, v)})")
    have = _card_numbers(card)
    stray = [x for x in _NUM.findall(first) if float(x) not in have]
    if stray:
        problems.append(f"numbers not on the card: {', '.join(stray[:3])}")
    return problems


def check_comparison(item: dict[str, Any], answer: str, cards: Sequence[Card]) -> list[str]:
    """What is wrong with a comparison answer ([] when complete)."""
    problems = []
    shown = {c.get("model"): c for c in cards}
    linked = set(links(answer))
    missing = [m for m in item["models"] if m not in shown]
    if missing:
        problems.append(f"not shown: {', '.join(missing)}")
    unlinked = [m for m in item["models"] if m in shown and shown[m].get("url") not in linked]
    if unlinked:
        problems.append(f"not linked: {', '.join(unlinked)}")
    if missing:
        return problems
    ms = [shown[m] for m in item["models"]]
    keys = {k for c in ms for k in (c.get("attributes") or {})} - {"color"}
    low = answer.lower()
    differs = False
    for k in sorted(keys):
        vals = [(c.get("attributes") or {}).get(k) for c in ms]
        present = [v for v in vals if v is not None]
        if len(present) < len(vals) or len({str(v) for v in present}) < 2:
            continue
        if all(value_text(k, v).lower() in low for v in present):
            differs = True
            break
    prices = [float(c.get("price", 0)) for c in ms]
    if not differs and len(set(prices)) > 1 and all(f"${p:.2f}" in answer for p in prices):
        differs = True
    if not differs:
        problems.append("no difference given with both values")
    if item.get("which"):
        after = answer.lower().split("|")[-1]
        pick_lines = [ln for ln in answer.splitlines()[-4:] if "pick" in ln.lower()
                      or re.match(r"\s*1\. \[", ln)]
        if not pick_lines and "pick" not in after:
            problems.append("asks which, and no pick")
        key, better = item.get("key"), item.get("better")
        if key and better and pick_lines:
            vals = [(c.get("attributes") or {}).get(key) for c in ms]
            nums = [float(v) if isinstance(v, int | float) and not isinstance(v, bool)
                    else (1.0 if v is True else 0.0 if v is False else None) for v in vals]
            known = [x for x in nums if x is not None]
            if len(known) >= 2 and len(set(known)) > 1:
                best = max(known) if better == "higher" else min(known)
                url = ms[nums.index(best)].get("url")  # a card without one is no pick's link
                if url is None or url not in " ".join(pick_lines):
                    problems.append(f"the pick is not the one with the {better} {key}")
    return problems


def check_followup(item: dict[str, Any], first_answer: str, cards: Sequence[Card],
                   model_of: dict[str, str] | None = None) -> list[str]:
    """What is wrong with a follow-up's second turn ([] when it kept the earlier context);
    ``model_of``: listing URL -> model (the catalog's)."""
    if not cards:
        return ["no cards"]
    ref = item.get("ref")
    if ref == "narrow":
        problems = []
        wrong = [c.get("title", "")[:40] for c in cards if c.get("category") != item["category"]]
        if wrong:
            problems.append(f"lost the product type: {', '.join(wrong[:2])}")
        for lab in item.get("constraints") or []:
            lab = {"attr": "color", "value": lab["color"]} if "color" in lab else lab
            bad = [c for c in cards if not meets(c, lab)]
            if bad:
                problems.append(f"{len(bad)} card(s) miss {lab}")
        return problems
    earlier = links(first_answer)
    want = []
    for r in ref or []:
        i = len(earlier) - 1 if r == "last" else int(r) - 1
        if 0 <= i < len(earlier):
            want.append(earlier[i])
    if not want:
        return ["the first answer listed too few products"]
    shown = {c.get("url") for c in cards}
    shown_models = {c.get("model") for c in cards}
    # a colour answer may show the model's listing in that colour: the same model counts
    lost = [u for u in want if u not in shown and (model_of or {}).get(u) not in shown_models]
    return [f"lost {len(lost)} of the {len(want)} products referred to"] if lost else []


def rates(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Per kind: how many, how many right, the share, and the wrong ones' questions."""
    out: dict[str, Any] = {}
    for kind in ("attribute", "comparison", "followup"):
        rs = [r for r in records if r.get("kind") == kind]
        good = [r for r in rs if not r.get("problems")]
        out[kind] = {"questions": len(rs), "right": len(good),
                     "rate": len(good) / len(rs) if rs else float("nan"),
                     "wrong": [{"q": r.get("q") or r.get("turns"), "problems": r["problems"]}
                               for r in rs if r.get("problems")]}
    return out
