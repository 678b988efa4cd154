"""The I/O of the search eval behind scripts/eval_search.py: held-out questions searched
in-process (the question as the plan's one query, no planner: the search alone) or through
``rufus_assistant`` over gRPC (the planner's plan, the cards the customer gets), scored with
rufus.retrieval.search_eval (the checks and rates are product code, unit-tested)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import time
from pathlib import Path
from typing import Any

from lab.eval_answers import catalog_products, cpu
from rufus.retrieval.search_eval import meetable, rates, score

ROOT = Path(__file__).resolve().parents[1]
QUESTIONS = ROOT / "data" / "retrieval" / "heldout_search.jsonl"
CARDS = 5  # the assistant's product cards per turn (AssistantSettings.num_products)


def offline(items: list[dict[str, Any]]) -> list[list[Any]]:
    from rufus.assistant.prompt import diversify
    from rufus.retrieval import GroundedSearch, default_retriever

    search = GroundedSearch(default_retriever())
    out = []
    for it in items:
        found = search.search([it["q"]], {}, it["q"], 4 * CARDS)
        out.append(diversify(found.products, CARDS))
    return out


async def live(url: str, items: list[dict[str, Any]], timeout: float,
               plans: list[Any] | None = None) -> list[list[Any]]:
    from rufus.client import AsyncStreams, RequestFailed, output_str

    io = AsyncStreams(url)
    out: list[list[Any]] = []
    try:
        for i, it in enumerate(items, start=1):
            cards: list[Any] = []
            plan = None
            try:
                async with contextlib.aclosing(io.stream("rufus_assistant", {"question": it["q"]},
                                                         timeout=timeout)) as s:
                    async for outs in s:
                        if "plan" in outs:
                            plan = json.loads(output_str(outs, "plan") or "null")
                        if "products" in outs:
                            cards = json.loads(output_str(outs, "products") or "[]")
            except (RequestFailed, TimeoutError) as exc:
                print(f"  error: {str(exc)[:200]}")
            out.append(cards)
            if plans is not None:
                plans.append(plan)
            print(f"[{i}/{len(items)}] {len(cards)} cards: {it['q'][:60]}", flush=True)
    finally:
        await io.close()
    return out


def scaled(products: list[Any], n: int) -> list[Any]:
    """The catalog ``n`` times over: every listing cloned with a new id and its model's name
    suffixed (" #2", " #3", ...), so each type has ``n`` times the models and listings."""
    import dataclasses

    out = list(products)
    for i in range(2, n + 1):
        out += [dataclasses.replace(p, id=f"{p.id}-{i}", model=f"{p.model} #{i}",
                                    title=p.title.replace(p.model, f"{p.model} #{i}", 1))
                for p in products]
    return out


def cost(items: list[dict[str, Any]], scale: int, repeat: int) -> dict[str, Any]:
    """Seconds per query of the grounded search (the assistant's retrieval step: type
    resolution, constraints, the engine, relaxation), over the held-out questions."""
    import statistics

    from rufus.assistant.prompt import diversify
    from rufus.retrieval import GroundedSearch
    from rufus.retrieval.catalog_data import default_catalog, default_categories
    from rufus.retrieval.sqlite_fts import SqliteFtsRetriever

    products = scaled(list(default_catalog()), scale)
    search = GroundedSearch(SqliteFtsRetriever.build(products, categories=default_categories()))
    _ = search.vocabulary, search.taxonomy  # built at start-up, as the assistant does
    times = []
    for _r in range(repeat):
        for it in items:
            t0 = time.perf_counter()
            found = search.search([it["q"]], {}, it["q"], 4 * CARDS)
            diversify(found.products, CARDS)
            times.append(time.perf_counter() - t0)
    times.sort()
    def pct(q: float) -> float:
        return times[min(len(times) - 1, int(q * len(times)))] * 1000
    return {"listings": len(products), "queries": len(times), "p50_ms": pct(0.5),
            "p99_ms": pct(0.99), "mean_ms": statistics.fmean(times) * 1000}


def main(argv: list[str] | None = None, doc: str = __doc__) -> int:
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--url", help="Triton gRPC address: ask rufus_assistant (default: in-process search)")
    ap.add_argument("--questions", type=Path, default=QUESTIONS)
    ap.add_argument("--out", type=Path, default=ROOT / "build" / "eval_search.json")
    ap.add_argument("--timeout", type=float, default=120.0)
    ap.add_argument("--show", type=int, default=15, help="failures to print per check")
    ap.add_argument("--cost", action="store_true",
                    help="time the grounded search per query instead (p50 / p99), in-process")
    ap.add_argument("--scale", type=int, default=1, help="with --cost: the catalog N times over")
    ap.add_argument("--repeat", type=int, default=3, help="with --cost: passes over the questions")
    a = ap.parse_args(argv)
    items = [json.loads(x) for x in a.questions.read_text(encoding="utf-8").splitlines() if x.strip()]
    if a.cost:
        r = cost(items, a.scale, a.repeat)
        print(f"grounded search, {r['listings']} listings, {r['queries']} queries ({cpu()['flags']}): "
              f"p50 {r['p50_ms']:.2f} ms, p99 {r['p99_ms']:.2f} ms, mean {r['mean_ms']:.2f} ms")
        return 0
    catalog = catalog_products()
    t0 = time.monotonic()
    plans: list[Any] = []
    cards = asyncio.run(live(a.url, items, a.timeout, plans)) if a.url else offline(items)
    rows = [score(it, cs, meetable(it, catalog) if it["kind"] == "constraint" else True)
            for it, cs in zip(items, cards, strict=True)]
    for row, plan in zip(rows, plans, strict=False):
        row["plan"] = plan
    r = rates(rows)
    report = {"mode": f"live {a.url}" if a.url else "in-process search", "cpu": cpu(),
              "wall_s": time.monotonic() - t0, "rates": r, "records": rows}
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(report, indent=1), encoding="utf-8")
    print(f"{report['mode']}: {r['questions']} questions, {r['cards']} cards")
    print(f"  product-type relevance of cards: {r['type_relevance']:.1%} (goal >= 98%)")
    print(f"  constraints met by every card: {r['constraints_met']:.1%} of "
          f"{r['constraint_questions_meetable']} meetable constraint questions (goal >= 90%)")
    print(f"  product questions with cards of the asked type: {r['product_type_right']:.1%} of "
          f"{r['product_questions']} (goal >= 90%)")
    for label, bad in (("wrong type", [x for x in rows if x["wrong_type"]]),
                       ("constraint missed", [x for x in rows if x["misses"] and x["meetable"]]),
                       ("no cards", [x for x in rows if not x["cards"]])):
        for x in bad[:a.show]:
            print(f"  {label}: {x['q']!r} -> {x['titles'][:3]}")
    print(f"report: {a.out}")
    return 0
