"""Query plans: the JSON schema, the few-shot prompt, parsing and the documented fallback.

The planner must never fail a request because the model wrote something odd: every output
is parsed and validated against ``plan_schema.json``; anything that does not validate is
replaced by :func:`fallback_plan` (the question passed through as the only search query)
and flagged, so the caller can still retrieve.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

SCHEMA_PATH = Path(__file__).with_name("plan_schema.json")


@lru_cache(maxsize=1)
def plan_schema() -> dict[str, Any]:
    return json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))


def intents() -> list[str]:
    return list(plan_schema()["properties"]["intent"]["enum"])


SYSTEM = (
    "You are the query planner of a shopping assistant. Read the customer's question and "
    "answer with one JSON object only, no other text: "
    '{"intent": one of product_search | product_comparison | product_question | '
    "recommendation | order_status | returns_refunds | other, "
    '"query_type": "keyword" for short keyword queries or "conversational" for sentences, '
    '"search_queries": 1-3 short product search queries, '
    '"filters": {"brand": ..., "max_price": ...} only when the question states them}.'
)

# The fine-tuned planner (scripts/train_qp_lora.py) needs no instructions: a short, fixed
# system message keeps training and per-request prefill cheap.
PLANNER_SYSTEM = "You are the query planner of a shopping assistant. Reply with the JSON plan."
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


def render_plan(plan: dict[str, Any]) -> str:
    """The exact text the model is shown (and learns to emit): compact, schema key order."""
    return json.dumps(plan, separators=(", ", ": "))


def build_messages(question: str, history: list[dict[str, str]] | None = None,
                   style: str = "finetuned") -> list[dict[str, str]]:
    """Chat messages for one question; previous turns are given as context in the user turn.

    The system message and few-shot turns are identical for every request, so vLLM's prefix
    cache serves them and only the question is prefilled per request.
    """
    if style not in STYLES:
        raise ValueError(f"prompt style must be one of {STYLES}, got {style!r}")
    msgs = [{"role": "system", "content": PLANNER_SYSTEM if style == "finetuned" else SYSTEM}]
    if style == "fewshot":
        for q, plan in FEW_SHOT:
            msgs += [{"role": "user", "content": q},
                     {"role": "assistant", "content": render_plan(plan)}]
    content = question
    if history:
        turns = "\n".join(f"{m['role']}: {m['content']}" for m in history[-4:])
        content = f"Previous conversation:\n{turns}\nQuestion: {question}"
    msgs.append({"role": "user", "content": content})
    return msgs


def fallback_plan(question: str) -> dict[str, Any]:
    """Documented fallback: unknown intent resolved as ``other``, question passed through."""
    q = " ".join(question.split())[:80] or "?"
    return {"intent": "other", "query_type": "conversational", "search_queries": [q],
            "filters": {}}


@dataclass
class PlanResult:
    plan: dict[str, Any]
    fallback: bool
    error: str = ""


def validate_plan(obj: Any) -> str:
    """'' when ``obj`` satisfies the schema, else the first violation (for logs/responses)."""
    import jsonschema

    try:
        jsonschema.validate(obj, plan_schema())
    except jsonschema.ValidationError as exc:
        where = "/".join(str(p) for p in exc.absolute_path) or "plan"
        return f"{where}: {exc.message}"
    return ""


def parse_plan(text: str, question: str) -> PlanResult:
    """Parse the model's raw text; the first JSON object is taken, trailing chatter ignored."""
    start = text.find("{")
    if start < 0:
        return PlanResult(fallback_plan(question), True, "no JSON object in output")
    try:
        obj, _ = json.JSONDecoder().raw_decode(text[start:])
    except json.JSONDecodeError as exc:
        return PlanResult(fallback_plan(question), True, f"invalid JSON: {exc.msg}")
    err = validate_plan(obj)
    if err:
        return PlanResult(fallback_plan(question), True, f"schema: {err}")
    return PlanResult(obj, False)


def render_prompt_ids(tokenizer: Any, question: str,
                      history: list[dict[str, str]] | None = None,
                      style: str = "finetuned") -> list[int]:
    """Token ids of the chat-templated planner prompt (same path for server and scripts)."""
    text = tokenizer.apply_chat_template(build_messages(question, history, style),
                                         add_generation_prompt=True, tokenize=False)
    return list(tokenizer.encode(text, add_special_tokens=False))


def structured_outputs() -> Any:
    """vLLM structured-output constraint (xgrammar) for the plan schema."""
    from vllm.sampling_params import StructuredOutputsParams

    return StructuredOutputsParams(json=plan_schema())


def load_eval(path: str | Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines()
            if line.strip()]
