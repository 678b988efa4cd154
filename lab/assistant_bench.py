"""The shopping assistant's closed-loop benchmark behind scripts/bench_assistant.py (what it
measures and how: that script's docstring, its --help): conversations of every intent, or
the held-out questions each asked once, through ``rufus_assistant``, against the answer
model alone with the same prompts in the same run."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lab.loadgen import pct_nearest as pct

CONVERSATIONS: list[list[str]] = [
    ["running shoes under $80", "any from nike?"],
    ["wireless earbuds under $50"],
    ["which is better for pet hair, a dyson or a shark vacuum?"],
    ["does the ipad air work with the apple pencil?"],
    ["gift ideas for someone who likes camping"],
    ["where is my order? it should have arrived yesterday"],
    ["how do i return shoes that don't fit?"],
    ["65 inch tv", "which one has the best reviews?"],
    ["how tall is mount everest"],
    ["laptop for college under $600"],
    ["i need a coffee maker", "something under $100?"],
    ["sony headphones"],
]
PRODUCT_INTENTS = ("product_search", "product_comparison", "product_question", "recommendation")


def eval_conversations() -> list[list[str]]:
    """``--questions eval``: the planner's held-out questions with a product intent
    (data/qp/eval.jsonl, 198 of 263), each a one-turn conversation asked once, so that no
    answer prompt repeats and every one is prefilled cold, as a new customer's question is
    (the default mix cycles 12 conversations, so most of its turns hit vLLM's prefix cache)."""
    from rufus.qp.plan import load_eval
    return [[r["question"]] for r in load_eval(Path(__file__).parents[1] / "data/qp/eval.jsonl")
            if r["intent"] in PRODUCT_INTENTS and not r.get("history")]


def followup_conversations() -> list[list[str]]:
    """``--questions followups``: the held-out follow-up questions with a product intent
    (data/qp/eval.jsonl, 22 of 263), each as a two-turn conversation asked once: the earlier
    question, then the follow-up with the answer the assistant actually gave as history. The
    follow-up's answer prompt carries that history, so this is the cold tail of multi-turn
    conversations (the default mix has three follow-ups, all repeated after their first
    occurrence)."""
    from rufus.qp.plan import load_eval
    return [[r["history"][0]["content"], r["question"]]
            for r in load_eval(Path(__file__).parents[1] / "data/qp/eval.jsonl")
            if r["intent"] in PRODUCT_INTENTS and r.get("history")
            and r["history"][0]["role"] == "user"]


@dataclass
class Turn:
    cards_s: float = float("nan")
    first_token_s: float = float("nan")
    total_s: float = float("nan")
    answered: bool = False      # the answer model produced the text (not a service reply)
    followup: bool = False      # asked with history (a later turn of its conversation)
    fallback: bool = False      # the planner gave no plan (error or RUFUS_ASSISTANT_PLAN_TIMEOUT_S)
    server: dict[str, float] = field(default_factory=dict)
    text: str = ""
    error: str = ""


async def assistant_turn(io: Any, question: str, history: list[dict[str, str]]) -> Turn:
    from rufus.client import RequestFailed, output_str

    t = Turn(followup=bool(history))
    t0 = time.monotonic()
    tensors: dict[str, Any] = {"question": question}
    if history:
        tensors["history"] = history
    try:
        async with contextlib.aclosing(io.stream("rufus_assistant", tensors)) as s:
            async for outs in s:
                if "products" in outs:
                    t.cards_s = time.monotonic() - t0
                    t.fallback = bool(outs["fallback"].reshape(-1)[0])
                text = output_str(outs, "text_output")
                if text and t.first_token_s != t.first_token_s:
                    t.first_token_s = time.monotonic() - t0
                t.text += text
                if "timings" in outs:
                    t.server = json.loads(output_str(outs, "timings"))
                    t.answered = output_str(outs, "finish_reason") != "service"
    except RequestFailed as exc:
        t.error = str(exc)[:200]
    t.total_s = time.monotonic() - t0
    return t


async def baseline_turn(io: Any, messages: list[dict[str, str]], max_tokens: int) -> Turn:
    from rufus.client import output_str

    t = Turn(answered=True)
    t0 = time.monotonic()
    tensors = {"messages": messages, "stream": True, "exclude_input_in_output": True,
               "sampling_parameters": {"max_tokens": max_tokens, "temperature": 0.0}}
    async with contextlib.aclosing(io.stream("rufus_llm", tensors)) as s:
        async for outs in s:
            if output_str(outs, "text_output") and t.first_token_s != t.first_token_s:
                t.first_token_s = time.monotonic() - t0
    t.total_s = time.monotonic() - t0
    return t


async def run_level(url: str, concurrency: int, n_conv: int, mode: str,
                    prompts: list[list[dict[str, str]]], max_tokens: int,
                    conversations: list[list[str]] = CONVERSATIONS) -> tuple[list[Turn], float]:
    from rufus.client import AsyncStreams

    io = AsyncStreams(url)
    turns: list[Turn] = []
    next_conv = 0

    async def worker() -> None:
        nonlocal next_conv
        while next_conv < n_conv:
            i = next_conv
            next_conv += 1
            if mode == "baseline":
                turns.append(await baseline_turn(io, prompts[i % len(prompts)], max_tokens))
                continue
            history: list[dict[str, str]] = []
            for q in conversations[i % len(conversations)]:
                t = await assistant_turn(io, q, history)
                turns.append(t)
                history += [{"role": "user", "content": q}, {"role": "assistant", "content": t.text}]

    t0 = time.monotonic()
    try:
        await asyncio.gather(*(worker() for _ in range(concurrency)))
    finally:
        await io.close()
    return turns, time.monotonic() - t0


def baseline_prompts() -> list[list[dict[str, str]]]:
    """The answer prompts the assistant builds for the first turn of each conversation,
    retrieved locally with the question as the query (what rufus_llm sees, same size)."""
    from rufus.assistant.pipeline import fallback_plan, search_queries
    from rufus.assistant.prompt import ANSWER_PRODUCTS, answer_messages
    from rufus.retrieval import default_retriever
    from rufus.retrieval.base import Filters

    r = default_retriever()
    out = []
    for conv in CONVERSATIONS:
        q = conv[0]
        plan = fallback_plan(q)
        prods = r.search(search_queries(plan, q, []), Filters.from_plan(plan["filters"]), 5)
        out.append(answer_messages(q, prods[:ANSWER_PRODUCTS], None))
    return out


def prompt_tokens(prompts: list[list[dict[str, str]]]) -> dict[str, float]:
    """The work an answer carries (the issue's "count the work"): tokens of each first-turn
    answer prompt, and of the part after the prefix that is prefilled while the planner runs
    (products and question: prefilled after the plan, on the critical path)."""
    from transformers import AutoTokenizer

    from rufus.assistant.prompt import answer_prefix_messages
    from rufus.machine.caches import default_model_dir

    tok = AutoTokenizer.from_pretrained(default_model_dir())

    def count(messages: list[dict[str, str]], generation: bool) -> int:
        return len(tok.apply_chat_template(messages, add_generation_prompt=generation,
                                           tokenize=True, return_dict=False))

    prefix = count(answer_prefix_messages(None), False)
    full = [count(m, True) for m in prompts if m[0]["content"] == answer_prefix_messages(None)[0]["content"]]
    return {"prompts": len(full), "mean_total": sum(full) / len(full),
            "mean_after_prefix": sum(full) / len(full) - prefix, "prefix": prefix}


def main(argv: list[str] | None = None, doc: str = __doc__) -> int:
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--url", help="Triton gRPC address; default: start a tritonserver here")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16])
    ap.add_argument("--conversations", type=int, nargs="+", default=[12, 16, 32],
                    help="conversations per level (one value per --concurrency)")
    ap.add_argument("--max-tokens", type=int, default=160,
                    help="answer length (rufus_assistant's answer_max_tokens; baseline too)")
    ap.add_argument("--plan-timeout", type=float, default=60.0,
                    help="RUFUS_ASSISTANT_PLAN_TIMEOUT_S of the server this script starts: high, so "
                         "the plan stage shows the planner's latency, not the timeout (default 60)")
    ap.add_argument("--no-baseline", action="store_true")
    ap.add_argument("--questions", choices=("mix", "eval", "followups"), default="mix",
                    help="mix: 12 conversations of every intent, cycled (repeats hit the prefix "
                         "cache); eval: the held-out product questions, each asked once (every "
                         "answer prompt cold); followups: the held-out follow-up questions, "
                         "each a two-turn conversation asked once (cold prompts with history)")
    ap.add_argument("--json", help="write the raw per-level results here")
    a = ap.parse_args(argv)
    srv = None
    if a.url is None:
        from rufus.launch.server import TritonServer, free_port

        srv = TritonServer(models=["rufus_qp_medusa", "rufus_llm", "rufus_assistant"],
                           grpc_port=free_port(), http_port=free_port(), metrics_port=free_port(),
                           log_path="build/bench_assistant_triton.log",
                           extra_env={"RUFUS_ANSWER_MAX_TOKENS": str(a.max_tokens),
                                      "RUFUS_ASSISTANT_PLAN_TIMEOUT_S": str(a.plan_timeout)})
        srv.start()
        print(f"starting tritonserver (log {srv.log_path})", flush=True)
        srv.wait_ready(900)
        a.url = f"127.0.0.1:{srv.grpc_port}"
    try:
        prompts = baseline_prompts()
        work = prompt_tokens(prompts)
        print(f"answer prompts (product path, first turns): {work['mean_total']:.0f} tokens, "
              f"{work['mean_after_prefix']:.0f} after the prefix prefilled while planning",
              flush=True)
        asyncio.run(run_level(a.url, 2, 2, "assistant", prompts, a.max_tokens))  # warm-up
        asyncio.run(run_level(a.url, 2, 2, "baseline", prompts, a.max_tokens))
        levels = list(zip(a.concurrency, a.conversations, strict=False))
        from rufus.machine.cpu import describe

        convs = {"eval": eval_conversations, "followups": followup_conversations}.get(
            a.questions, lambda: CONVERSATIONS)()
        results: dict[str, Any] = {"cpu": describe(), "prompt_tokens": work,
                                   "questions": a.questions}
        print(f"load average at start {os.getloadavg()[0]:.1f} (2 cores)", flush=True)
        for c, n in levels:
            time.sleep(2)  # idle gap: vLLM's CPU worker busy-polls 1 s after its last request
            if a.questions != "mix" and n > len(convs):
                print(f"--conversations {n} > {len(convs)} {a.questions} conversations: some "
                      "repeat", flush=True)
            turns, wall = asyncio.run(run_level(a.url, c, n, "assistant", prompts, a.max_tokens,
                                                convs))
            base: list[Turn] = []
            if not a.no_baseline:
                time.sleep(2)
                base, _ = asyncio.run(run_level(a.url, c, max(n, c), "baseline", prompts,
                                                a.max_tokens))
            ok = [t for t in turns if not t.error]
            llm = [t for t in ok if t.answered]
            stage = {k: [t.server.get(k, float("nan")) for t in ok if k in t.server]
                     for k in ("plan_s", "retrieval_s", "answer_ttft_s")}
            row = {
                "concurrency": c, "conversations": n, "turns": len(turns),
                "errors": len(turns) - len(ok), "fallbacks": sum(t.fallback for t in ok),
                "conv_per_s": n / wall, "wall_s": wall,
                "cards_p50": pct([t.cards_s for t in ok], 0.5),
                "cards_p99": pct([t.cards_s for t in ok], 0.99),
                "ttfat_p50": pct([t.first_token_s for t in llm], 0.5),
                "ttfat_p99": pct([t.first_token_s for t in llm], 0.99),
                **{f"{k.removesuffix('_s')}_p50": pct(v, 0.5) for k, v in stage.items()},
                **{f"{k.removesuffix('_s')}_p99": pct(v, 0.99) for k, v in stage.items()},
                # grounding at a glance: answers that link at least one retrieved product,
                # and the distinct products an answer links (LinkRenderer's [n] -> link)
                "linked_answers": sum(bool(re.search(r"\]\(https?://", t.text))
                                      for t in llm) / max(len(llm), 1),
                "links_per_answer": sum(len(set(re.findall(r"\]\((https?://[^)\s]+)\)", t.text)))
                                        for t in llm) / max(len(llm), 1),
                # later turns alone (their prompts carry history)
                "followup_ttfat_p50": pct([t.first_token_s for t in llm if t.followup], 0.5),
                "followup_ttfat_p99": pct([t.first_token_s for t in llm if t.followup], 0.99),
                "baseline_ttft_p50": pct([t.first_token_s for t in base], 0.5),
                "baseline_ttft_p99": pct([t.first_token_s for t in base], 0.99),
                "load": os.getloadavg()[0],
                # per answered turn: first answer token, plan, answer TTFT (s), 1 if a follow-up
                "answered_turns": [[round(t.first_token_s, 4), round(t.server.get("plan_s", -1), 4),
                                    round(t.server.get("answer_ttft_s", -1), 4), int(t.followup)]
                                   for t in llm],
            }
            results[str(c)] = row
            ms = {k: v * 1000 for k, v in row.items() if k.endswith(("_p50", "_p99"))}
            print(f"c={c:2d} conv/s {row['conv_per_s']:.2f} ({row['turns']} turns, {row['errors']} errors, "
                  f"{row['fallbacks']} fallback plans, "
                  f"load {row['load']:.1f}) | cards p50/p99 {ms['cards_p50']:.0f}/{ms['cards_p99']:.0f} ms | "
                  f"first answer token p50/p99 {ms['ttfat_p50']:.0f}/{ms['ttfat_p99']:.0f} ms | "
                  f"plan {ms['plan_p50']:.0f}/{ms['plan_p99']:.0f} | retrieval {ms['retrieval_p50']:.1f}/"
                  f"{ms['retrieval_p99']:.1f} | answer TTFT {ms['answer_ttft_p50']:.0f}/"
                  f"{ms['answer_ttft_p99']:.0f} | follow-ups' first answer token "
                  f"{ms['followup_ttfat_p50']:.0f}/{ms['followup_ttfat_p99']:.0f} | answers "
                  f"linking a product {row['linked_answers']:.0%}, "
                  f"{row['links_per_answer']:.1f} products each"
                  f" | baseline rufus_llm TTFT {ms['baseline_ttft_p50']:.0f}/{ms['baseline_ttft_p99']:.0f}"
                  f" | TTFAT/baseline p50 {row['ttfat_p50'] / row['baseline_ttft_p50']:.2f}x",
                  flush=True)
        if a.json:
            with open(a.json, "w") as f:
                json.dump(results, f, indent=1)
    finally:
        if srv is not None:
            srv.stop()
    return 0

