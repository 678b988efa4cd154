"""Prompts of the un-tuned baselines the planner eval compares against (never served).

The served planner is the fine-tuned model with a one-line system message
(rufus/qp/plan.py ``build_messages``). Before fine-tuning, the default model was prompted
with instructions (``zeroshot``) and with seven worked examples (``fewshot``); the eval
keeps both so the gain of the LoRA stays measurable (docs/architecture.md, "Query planner").
"""

from __future__ import annotations

from typing import Any

from rufus.qp.plan import build_messages, render_plan

SYSTEM = (
    "You are the query planner of a shopping assistant. Read the customer's question and "
    "answer with one JSON object only, no other text: "
    '{"intent": one of product_search | product_comparison | product_question | '
    "recommendation | order_status | returns_refunds | other, "
    '"query_type": "keyword" for short keyword queries or "conversational" for sentences, '
    '"search_queries": 1-3 short product search queries, '
    '"filters": {"brand": ..., "max_price": ...} only when the question states them}.'
)

STYLES = ("finetuned", "fewshot", "zeroshot")

# Hand-written; none of these questions appear in data/qp/{eval,train,calib}.jsonl.
FEW_SHOT: list[tuple[str, dict[str, Any]]] = [
    ("sony headphones under $100", {
        "intent": "product_search", "query_type": "keyword",
        "search_queries": ["sony headphones"], "filters": {"brand": "sony", "max_price": 100}}),
    ("which vacuum is better for pet hair, bissell or hoover?", {
        "intent": "product_comparison", "query_type": "conversational",
        "search_queries": ["bissell pet hair vacuum", "hoover pet hair vacuum"],
        "filters": {}}),
    ("does the apple pencil 2 work with the ipad 9th generation", {
        "intent": "product_question", "query_type": "conversational",
        "search_queries": ["apple pencil 2"], "filters": {"brand": "apple"}}),
    ("what's a nice gift for a friend who likes baking", {
        "intent": "recommendation", "query_type": "conversational",
        "search_queries": ["baking gifts", "baking tools"], "filters": {}}),
    ("where's my package with the printer ink", {
        "intent": "order_status", "query_type": "conversational",
        "search_queries": ["printer ink order"], "filters": {}}),
    ("how do i send back a dress that doesn't fit", {
        "intent": "returns_refunds", "query_type": "conversational",
        "search_queries": ["dress return"], "filters": {}}),
    ("how tall is mount everest", {
        "intent": "other", "query_type": "conversational",
        "search_queries": ["how tall is mount everest"], "filters": {}}),
]


def baseline_messages(question: str, history: list[dict[str, str]] | None = None,
                      style: str = "finetuned") -> list[dict[str, str]]:
    """``finetuned``: the served prompt; ``zeroshot``: instructions as the system message;
    ``fewshot``: instructions plus the worked examples as previous turns."""
    if style not in STYLES:
        raise ValueError(f"prompt style must be one of {STYLES}, got {style!r}")
    msgs = build_messages(question, history)
    if style == "finetuned":
        return msgs
    shots: list[dict[str, str]] = []
    if style == "fewshot":
        for q, plan in FEW_SHOT:
            shots += [{"role": "user", "content": q},
                      {"role": "assistant", "content": render_plan(plan)}]
    return [{"role": "system", "content": SYSTEM}, *shots, msgs[-1]]
