"""The answer's guarantees (rufus/assistant/answer.py): the grammar, the renderer, the check.

The grammar is exercised with xgrammar and the default model's real tokenizer, driven by an
adversary that puts the highest logit on the worst token it can find at every step (a digit,
"$", a capitalised brand, a product number already used or out of range): whatever it
prefers, only grammatical answers come out, and each renders to facts of its cards.
"""

from __future__ import annotations

import random
import re

import pytest

from rufus.assistant.answer import (
    CatalogNames,
    PickRenderer,
    ReasonCheck,
    answer_grammar,
    pick_line,
    reason_options,
    reason_text,
)
from rufus.retrieval.catalog import Product


def product(i: int, brand: str = "Brooks", line: str = "Ghost 16", colour: str = "Black",
            price: float = 120.0, rating: float = 4.5, reviews: int = 100,
            use: str = "long runs") -> Product:
    return Product(
        id=f"P{i:06d}", title=f"{brand} {line} Men's Running Shoes, {colour}, 10", brand=brand,
        category="running_shoes", price=price, rating=rating, review_count=reviews,
        description=f"{brand} {line} running shoes built for {use}. color: {colour}; size: 10.",
        url=f"https://shop.example.com/p/P{i:06d}/x", image_url="", attributes={
            "gender": "Men's", "color": colour, "size": "10"})


PRODUCTS = [
    product(1, "Brooks", "Ghost 16", "Black", 129.99, 4.6, 900, "long runs"),
    product(2, "Nike", "Pegasus 41", "Blue", 99.95, 4.2, 5000, "daily training"),
    product(3, "Saucony", "Guide 17", "Red", 89.00, 4.4, 30, "race day"),
    product(4, "Hoka", "Clifton 9", "Grey", 139.49, 4.3, 80, "long runs"),
]
NAMES = CatalogNames.default()


def test_reason_options_are_facts_of_the_card():
    opts = reason_options(PRODUCTS, "blue nike running shoes")
    # only what sets a product apart: PRODUCTS[3] is built for long runs too, and that is
    # all it has, so it keeps it
    assert opts[0] == ["best rating"]
    assert opts[1] == ["in blue", "from Nike", "built for daily training", "most reviews"]
    assert opts[3] == ["built for long runs"]
    assert "lowest price" in opts[2] and "best rating" not in opts[2]
    assert all(o for o in opts)
    assert reason_options([PRODUCTS[0]], "x") == [["built for long runs"]]


def test_the_system_words_each_menu_key():
    """The model writes a short key; the customer reads the system's words for it."""
    assert [reason_text(k) for k in ("lowest price", "best rating", "most reviews", "in blue",
                                     "from Nike", "built for long runs")] == [
        "the lowest price of these", "the best rating of these", "the most reviewed of these",
        "in blue, as you asked", "from Nike, as you asked", "built for long runs"]


def test_renderer_renders_facts_from_the_card_as_soon_as_the_number_is_decoded():
    opts = reason_options(PRODUCTS, "running shoes")
    r = PickRenderer(PRODUCTS, NAMES, opts)
    assert r.feed("[") == ""
    first = r.feed("2")  # rendered at the digit: the grammar allows only "] " after it
    assert first == pick_line(1, PRODUCTS[1]) and r.feed("] ") == ""
    assert "$99.95" in first and "4.2 stars" in first and PRODUCTS[1].url in first
    assert r.feed("most") == ""  # a reason waits for its end
    assert r.feed(" reviews\n[3] ") == ": the most reviewed of these.\n" + pick_line(2, PRODUCTS[2])
    assert r.feed("lowest price") == ""
    assert r.flush() == ": the lowest price of these.\n"
    assert r.picked == [PRODUCTS[1], PRODUCTS[2]] and r.dropped == []
    cut = PickRenderer(PRODUCTS, NAMES, reason_options(PRODUCTS, "x"))
    assert cut.feed("[1] built for") == pick_line(1, PRODUCTS[0])
    assert cut.flush() == ".\n" and cut.dropped == ["format"]  # cut by max_tokens: no half reason


@pytest.mark.parametrize("raw, dropped", [
    ("[1] built for race day", ["format"]),          # another card's fact
    ("[1 built for long runs", ["format"]),          # no "]" after the number
    ("[1] cheap and great, 5 stars", ["format"]),    # not on the menu
    ("Sure! Here are some: [1] x", ["format"]),       # no header where one is due
    ("[1] best rating\n[1] best rating", ["format"]),  # the same card twice
    ("[9] built for long runs", ["format"]),          # no such card
])
def test_renderer_drops_what_the_grammar_forbids(raw, dropped):
    drops: list[str] = []
    r = PickRenderer(PRODUCTS, NAMES, reason_options(PRODUCTS, "running shoes"),
                     on_drop=drops.append)
    out = r.feed(raw) + r.flush()
    assert drops == dropped
    assert "race day" not in out and "5 stars" not in out and "Sure" not in out


def test_reason_check_names_and_repeats():
    check = ReasonCheck(NAMES)
    p = PRODUCTS[0]
    assert check.check("great for nike fans", p).dropped == "brand"
    assert check.check("a pegasus alternative", p).dropped == "product"
    assert check.check("comes in silver", p).dropped == "colour"
    assert check.check("soft soft soft soft", p).dropped == "repeat"
    assert check.check("built for long runs", p).reason == "built for long runs"
    assert check.check("built for long runs", p).dropped == "repeat"  # said already
    assert check.check("a black brooks shoe for the road", p).reason is not None
    assert check.check("a guide for easy days", p).reason is not None  # "Guide 17" is a Saucony line


def test_grammar_shape():
    g = answer_grammar(reason_options(PRODUCTS, "x"))
    assert g.startswith("root ::= p\n")
    with pytest.raises(ValueError):
        answer_grammar([])
    with pytest.raises(ValueError):
        answer_grammar([["a"], []])


# ------------------------------------------------------------------ xgrammar + the real tokenizer

@pytest.fixture(scope="module")
def tokenizer():
    xgr = pytest.importorskip("xgrammar")
    from rufus.machine.caches import default_model_dir

    path = default_model_dir()
    if not (path / "tokenizer.json").exists():
        pytest.skip(f"default model not built at {path} (make setup)")
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(path))
    info = xgr.TokenizerInfo.from_huggingface(tok, vocab_size=len(tok))
    return tok, info, xgr.GrammarCompiler(info)


def adversarial_decode(tokenizer, grammar: str, bad: list[int], seed: int, steps: int = 120) -> str:
    """Greedy decoding under the grammar where the "model" ranks the bad tokens first,
    then random ones: what the grammar lets through is what any model could emit."""
    import torch
    import xgrammar as xgr

    tok, info, compiler = tokenizer
    matcher = xgr.GrammarMatcher(compiler.compile_grammar(grammar))
    mask = xgr.allocate_token_bitmask(1, info.vocab_size)
    rng = random.Random(seed)
    out: list[int] = []
    for _ in range(steps):
        logits = torch.tensor([[rng.random() for _ in range(info.vocab_size)]])
        for rank, t in enumerate(bad):
            logits[0, t] = 100.0 - rank * 1e-3
        logits[0, tok.eos_token_id] = 50.0 if rng.random() < 0.2 else -1.0
        matcher.fill_next_token_bitmask(mask)
        xgr.apply_token_bitmask_inplace(logits, mask)
        t = int(logits.argmax())
        if t == tok.eos_token_id and matcher.is_terminated():
            break
        assert matcher.accept_token(t), tok.decode([t])
        if matcher.is_terminated():  # the stop token
            break
        out.append(t)
    return tok.decode(out)


def test_an_adversarial_model_cannot_leave_the_grammar(tokenizer):
    tok = tokenizer[0]
    words = ["9", "5", "$", " $", "Nike", " Nike", " Adidas", "http", "[1]", "[", "]", "\n",
             " 1", " stars", " Black", " black", "!", " the", " the best", " I", "1", "7"]
    bad = [i for w in words for i in tok.encode(w, add_special_tokens=False)]
    options = reason_options(PRODUCTS, "blue nike running shoes")
    grammar = answer_grammar(options)
    header = re.compile(r"\[?(\d)\] (.*)")
    for seed in range(6):
        raw = adversarial_decode(tokenizer, grammar, bad[seed % 3:], seed)
        lines = raw.split("\n")
        assert 1 <= len(lines) <= 3 and raw[0].isdigit(), raw
        assert all(line.startswith("[") for line in lines[1:]), raw
        seen = set()
        for line in lines:
            m = header.fullmatch(line)
            assert m, raw
            n = int(m.group(1))
            assert 1 <= n <= 4 and n not in seen, raw
            seen.add(n)
            assert m.group(2) in options[n - 1], raw
        r = PickRenderer(PRODUCTS, NAMES, options)
        text = r.feed(raw) + r.flush()
        assert r.dropped == [] or set(r.dropped) == {"repeat"}, (raw, r.dropped)
        for i, p in enumerate(r.picked, start=1):
            assert pick_line(i, p) in text
        prices = set(re.findall(r"\$\d+\.\d\d", text))
        assert prices <= {f"${p.price:.2f}" for p in PRODUCTS}, text
