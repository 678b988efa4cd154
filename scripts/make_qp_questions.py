"""Write the query planner's training and calibration question sets (seeded, templated).

These questions (with a target plan each) drive the planner's LoRA fine-tune and Medusa
self-distillation (train) and the Medusa tree search (calibration);
they are built from templates that share no sentence with the hand-written held-out eval
set (data/qp/eval.jsonl), so eval figures are not measured on training text.

    .venv/bin/python scripts/make_qp_questions.py   # writes data/qp/{train,calib}.jsonl
"""

from __future__ import annotations

import json
import random
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PRODUCTS = [
    "bluetooth speaker", "gaming mouse", "mechanical keyboard", "air fryer", "yoga mat",
    "electric toothbrush", "standing desk", "robot vacuum", "rain jacket", "backpack",
    "baby stroller", "dog bed", "blender", "smart watch", "4k monitor", "tent",
    "electric kettle", "noise cancelling headphones", "phone case", "desk lamp",
    "winter boots", "carry-on suitcase", "espresso machine", "toaster", "vitamin c serum",
    "board game", "kitchen knife set", "portable charger", "webcam", "sleeping bag",
]
BRANDS = ["sony", "lg", "nike", "adidas", "logitech", "apple", "anker", "philips",
          "ninja", "cuisinart", "north face", "samsonite", "bose", "jbl", "lenovo"]
PAIRS = [("sony wh-1000xm4", "bose 700"), ("fitbit versa 4", "garmin venu sq"),
         ("ipad air", "samsung galaxy tab s9"), ("roku ultra", "fire tv stick 4k"),
         ("nespresso vertuo", "keurig k-elite"), ("vitamix e310", "ninja professional"),
         ("pixel 8", "iphone 14"), ("hoka clifton", "brooks ghost"),
         ("logitech mx master 3", "razer basilisk"), ("weber spirit", "traeger pro 575"),
         ("lg c3 oled", "samsung s90c"), ("dyson airwrap", "shark flexstyle")]
PEOPLE = ["my mom", "a teenager", "my wife", "a coworker", "my grandfather", "a college student",
          "my sister who loves cooking", "a 10 year old boy", "a gamer", "a new dog owner"]
ACTIVITIES = ["a beach vacation", "working from home", "a baby shower", "learning guitar",
              "starting a garden", "a road trip", "home workouts", "a dorm room"]
FEATURES = ["is it waterproof", "does it come with a warranty", "how heavy is it",
            "what colors does it come in", "is it compatible with android",
            "how long is the cable", "does it need batteries", "is it easy to clean"]
ITEMS = ["jacket", "laptop", "phone case", "lamp", "shoes", "vacuum", "coffee grinder"]

# (question template, query_type, search-query templates); filters come from the slots used.
K, C = "keyword", "conversational"
TEMPLATES: dict[str, list[tuple[str, str, list[str]]]] = {
    "product_search": [("{product}", K, ["{product}"]),
                       ("{brand} {product}", K, ["{brand} {product}"]),
                       ("{product} under ${price}", K, ["{product}"]),
                       ("best {product} for {activity}", K, ["{product} for {activity}"]),
                       ("i'm looking for a {product}", C, ["{product}"]),
                       ("show me {brand} {product}s", C, ["{brand} {product}"]),
                       ("can you find me a cheap {product}", C, ["cheap {product}"]),
                       ("{product} with good reviews", K, ["{product}"]),
                       ("I need a {product} for {person}", C, ["{product}"])],
    "product_comparison": [("{a} vs {b}", K, ["{a}", "{b}"]),
                           ("should I get the {a} or the {b}", C, ["{a}", "{b}"]),
                           ("compare the {a} with the {b}", C, ["{a}", "{b}"]),
                           ("{a} or {b}, which one is better", C, ["{a}", "{b}"]),
                           ("difference between {a} and {b}", C, ["{a}", "{b}"])],
    "product_question": [("{brand} {product}: {feature}?", C, ["{brand} {product}"]),
                         ("does the {brand} {product} have {spec}", C, ["{brand} {product}"]),
                         ("is the {brand} {product} {quality}", C, ["{brand} {product}"]),
                         ("how long does the {product} battery last", C, ["{product}"]),
                         ("what size is the {brand} {product}", C, ["{brand} {product}"])],
    "recommendation": [("what should I get {person}", C, ["gifts for {person}"]),
                       ("gift ideas for {person}", C, ["gifts for {person}"]),
                       ("what do I need for {activity}", C, ["{activity} essentials"]),
                       ("recommend something for {activity}", C, ["{activity} essentials"]),
                       ("suggest a good {product} for a beginner", C, ["beginner {product}"]),
                       ("what's a good present for {person} under ${price}", C,
                        ["gifts for {person}"])],
    "order_status": [("where is my {item} order", C, ["{item} order"]),
                     ("is my {item} out for delivery", C, ["{item} order"]),
                     ("my {item} hasn't arrived yet", C, ["{item} order"]),
                     ("when does my {item} ship", C, ["{item} order"]),
                     ("when will my {item} be delivered", C, ["{item} order"]),
                     ("track my {item} package", C, ["{item} order"])],
    "returns_refunds": [("return my {item}", C, ["{item} return"]),
                        ("how can I get a refund for the {item}", C, ["{item} refund"]),
                        ("I received the wrong {item}, I want to send it back", C,
                         ["{item} return"]),
                        ("is the {item} still returnable after 30 days", C, ["{item} return"]),
                        ("can I exchange my {item} for another one", C, ["{item} exchange"]),
                        ("refund status for my returned {item}", C, ["{item} refund"])],
    "other": [(q, C, [q]) for q in [
        "what time is it in tokyo", "write me a poem about {activity}",
        "who is the president of france", "how many legs does a spider have",
        "translate hello into spanish", "how do I update my email address",
        "what's 15 times 12", "good morning!", "can you sing a song",
        "what is the meaning of life", "how far is the moon", "who wrote romeo and juliet",
        "what is the boiling point of water", "hi there", "tell me something funny",
        "how do I reset my login", "what year did the titanic sink"]],
}


def sample(rng: random.Random, intent: str) -> tuple[str, dict[str, object]]:
    a, b = rng.choice(PAIRS)
    slots = dict(
        product=rng.choice(PRODUCTS), brand=rng.choice(BRANDS), a=a, b=b,
        person=rng.choice(PEOPLE), activity=rng.choice(ACTIVITIES),
        feature=rng.choice(FEATURES), item=rng.choice(ITEMS),
        spec=rng.choice(["a warranty", "a usb c port", "a remote", "a carrying case"]),
        quality=rng.choice(["waterproof", "dishwasher safe", "easy to clean", "noisy"]),
        price=rng.choice([25, 50, 100, 200, 500]),
    )
    template, qtype, queries = rng.choice(TEMPLATES[intent])
    filters: dict[str, object] = {}
    if "{brand}" in template:
        filters["brand"] = slots["brand"]
    if "{price}" in template:
        filters["max_price"] = slots["price"]
    plan = {"intent": intent, "query_type": qtype,
            "search_queries": [q.format(**slots) for q in queries], "filters": filters}
    return template.format(**slots), plan


def build(n: int, seed: int, exclude: set[str]) -> list[dict[str, object]]:
    rng = random.Random(seed)
    out: list[dict[str, object]] = []
    seen = set(exclude)
    intents = list(TEMPLATES)
    tries = 0
    while len(out) < n and tries < n * 50:
        tries += 1
        # round-robin over intents; small template pools (e.g. "other") simply run dry
        intent = intents[tries % len(intents)]
        q, plan = sample(rng, intent)
        if q in seen:
            continue
        seen.add(q)
        out.append({"question": q, "intent": intent, "plan": plan})
    return out


def main() -> None:
    d = ROOT / "data" / "qp"
    held_out = {json.loads(line)["question"] for line in (d / "eval.jsonl").open()}
    train = build(280, seed=1, exclude=held_out)
    calib = build(40, seed=2, exclude=held_out | {r["question"] for r in train})
    for name, rows in (("train", train), ("calib", calib)):
        path = d / f"{name}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        print(f"wrote {len(rows)} questions to {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
