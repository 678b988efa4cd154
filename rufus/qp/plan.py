"""Query plans: the JSON schema, the planner prompt, parsing and the documented fallback.

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
from typing import Any, Literal, TypedDict, cast

SCHEMA_PATH = Path(__file__).with_name("plan_schema.json")

# The plan's types: plan_schema.json as the type checker sees it (a plan stays a JSON object
# on the wire and in the logs; tests/unit/test_qp.py checks these against the schema).
Intent = Literal["product_search", "product_comparison", "product_question", "recommendation",
                 "order_status", "returns_refunds", "other"]
QueryType = Literal["keyword", "conversational"]


class PlanFilters(TypedDict, total=False):
    brand: str
    max_price: float


class Plan(TypedDict):
    """One query plan, schema-valid (plan_schema.json; key order is the generation order)."""

    intent: Intent
    query_type: QueryType
    search_queries: list[str]
    filters: PlanFilters


@lru_cache(maxsize=1)
def plan_schema() -> dict[str, Any]:
    return json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))


def intents() -> list[str]:
    return list(plan_schema()["properties"]["intent"]["enum"])


# The fine-tuned planner (scripts/train_qp_lora.py) needs no instructions: a short, fixed
# system message keeps training and per-request prefill cheap.
PLANNER_SYSTEM = "You are the query planner of a shopping assistant. Reply with the JSON plan."


def render_plan(plan: Plan | dict[str, Any]) -> str:
    """The exact text the model is shown (and learns to emit): compact, schema key order."""
    return json.dumps(plan, separators=(", ", ": "))


# Previous turns the planner's prompt keeps (the most recent ones); rufus_qp_medusa accepts
# more (rufus/qp/model.py MAX_HISTORY_TURNS) and drops the older ones.
HISTORY_TURNS_USED = 4


def build_messages(question: str, history: list[dict[str, str]] | None = None
                   ) -> list[dict[str, str]]:
    """Chat messages for one question; previous turns are given as context in the user turn.

    The system message is identical for every request, so the prefix cache serves it and
    only the question is prefilled per request. (The prompts of the un-tuned baselines that
    the eval compares against are in lab/qp/prompts.py.)
    """
    content = question
    if history:
        turns = "\n".join(f"{m['role']}: {m['content']}" for m in history[-HISTORY_TURNS_USED:])
        content = f"Previous conversation:\n{turns}\nQuestion: {question}"
    return [{"role": "system", "content": PLANNER_SYSTEM}, {"role": "user", "content": content}]


def prompt_context(prompt_text: str) -> str:
    """The customer's words in a rendered planner prompt (its last user turn: the question
    and the history :func:`build_messages` put there); the whole text if it has none."""
    tail = prompt_text.rsplit("<|im_start|>user\n", 1)
    return tail[-1].split("<|im_end|>", 1)[0]


def fallback_plan(question: str) -> Plan:
    """Documented fallback: unknown intent resolved as ``other``, question passed through."""
    q = " ".join(question.split())[:80] or "?"
    return {"intent": "other", "query_type": "conversational", "search_queries": [q],
            "filters": {}}


@dataclass(frozen=True)
class PlanOutcome:
    """What planning one question gave: a schema-valid plan, and whether it is the fallback
    (``error`` says why: no JSON, invalid JSON, a schema violation)."""

    plan: Plan
    fallback: bool
    error: str = ""



@lru_cache(maxsize=1)
def _validator() -> Any:
    """The schema checked once: ``jsonschema.validate`` re-checks the schema itself on every
    call, which cost more than everything else done to a plan after decoding."""
    import jsonschema

    cls = jsonschema.validators.validator_for(plan_schema())
    cls.check_schema(plan_schema())
    return cls(plan_schema())


def validate_plan(obj: Any) -> str:
    """'' when ``obj`` satisfies the schema, else the first violation (for logs/responses)."""
    import jsonschema

    try:
        _validator().validate(obj)
    except jsonschema.ValidationError as exc:
        where = "/".join(str(p) for p in exc.absolute_path) or "plan"
        return f"{where}: {exc.message}"
    return ""


def as_plan(obj: Any) -> Plan | None:
    """``obj`` as a :class:`Plan` when it satisfies the schema, else None."""
    return cast(Plan, obj) if not validate_plan(obj) else None


def parse_plan(text: str, question: str) -> PlanOutcome:
    """Parse the model's raw text; the first JSON object is taken, trailing chatter ignored."""
    start = text.find("{")
    if start < 0:
        return PlanOutcome(fallback_plan(question), True, "no JSON object in output")
    try:
        obj, _ = json.JSONDecoder().raw_decode(text[start:])
    except json.JSONDecodeError as exc:
        return PlanOutcome(fallback_plan(question), True, f"invalid JSON: {exc.msg}")
    err = validate_plan(obj)
    if err:
        return PlanOutcome(fallback_plan(question), True, f"schema: {err}")
    return PlanOutcome(cast(Plan, obj), False)


def render_prompt_ids(tokenizer: Any, question: str,
                      history: list[dict[str, str]] | None = None) -> list[int]:
    """Token ids of the chat-templated planner prompt (same path for server and scripts)."""
    return prompt_ids(tokenizer, build_messages(question, history))


def prompt_ids(tokenizer: Any, messages: list[dict[str, str]]) -> list[int]:
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return list(tokenizer.encode(text, add_special_tokens=False))


def structured_outputs() -> Any:
    """vLLM structured-output constraint (xgrammar) for the plan schema."""
    from vllm.sampling_params import StructuredOutputsParams

    return StructuredOutputsParams(json=plan_schema())


def load_eval(path: str | Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines()
            if line.strip()]


# The plan skeleton's seed, written next to the Medusa heads (rufus/qp/build.py
# ``write_plan_seed``) and read by the served planner at start.
SEED_FILE = "plan_seed.jsonl"


def plan_seed(tokenizer: Any, path: str | Path) -> list[tuple[list[int], list[int], str]]:
    """``(prompt ids, plan ids, the prompt's customer words)`` for each plan of a seed file
    (rufus/qp/build.py ``write_plan_seed``): what the torch planner's plan skeleton
    starts from. Missing file: []."""
    p = Path(path)
    if not p.is_file():
        return []
    out = []
    for r in load_eval(p):
        ids = render_prompt_ids(tokenizer, r["question"], r.get("history"))
        out.append((ids, list(tokenizer.encode(r["plan"], add_special_tokens=False)),
                    prompt_context(tokenizer.decode(ids, skip_special_tokens=False))))
    return out
