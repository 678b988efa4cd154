"""Query planner pieces that need no engine: schema, parsing/fallback, request validation,
Medusa knob validation."""

from __future__ import annotations

import json

import numpy as np
import pytest

from lab.qp.prompts import FEW_SHOT
from rufus.errors import InvalidInput
from rufus.launch.server import ROOT
from rufus.qp.backends import (
    AutoregressiveBackend,
    VllmMedusaBackend,
    create_backend,
    load_tree,
)
from rufus.qp.model import PlanSink, parse_plan_request
from rufus.qp.plan import (
    fallback_plan,
    intents,
    load_eval,
    parse_plan,
    render_plan,
    validate_plan,
)
from rufus.serving.config import ConfigError


def s(v: str) -> np.ndarray:
    return np.array([v.encode()], dtype=np.object_)


GOOD = {"intent": "product_search", "query_type": "keyword", "search_queries": ["usb c cable"],
        "filters": {"max_price": 20}}


def test_few_shot_examples_and_fallback_validate() -> None:
    for _, plan in FEW_SHOT:
        assert validate_plan(plan) == ""
    assert validate_plan(fallback_plan("  where   is my order ")) == ""
    assert fallback_plan("where is my order")["search_queries"] == ["where is my order"]


def test_eval_set_intents_are_in_schema() -> None:
    rows = load_eval(ROOT / "data/qp/eval.jsonl")
    assert len(rows) >= 50
    assert {r["intent"] for r in rows} == set(intents())
    train = {r["question"] for r in load_eval(ROOT / "data/qp/train.jsonl")}
    assert not train & {r["question"] for r in rows}, "eval must be held out"


def test_parse_plan_valid_with_trailing_text() -> None:
    res = parse_plan(render_plan(GOOD) + "\nHope this helps!", "q")
    assert not res.fallback and res.plan == GOOD


@pytest.mark.parametrize("text,reason", [
    ("I think you want shoes", "no JSON"),
    ('{"intent": "product_search", "query_type": ', "invalid JSON"),
    ('{"intent": "buy", "query_type": "keyword", "search_queries": ["x"], "filters": {}}',
     "schema: intent"),
    ('{"intent": "other", "query_type": "keyword", "search_queries": [], "filters": {}}',
     "schema: search_queries"),
    ('{"intent": "other", "query_type": "keyword", "search_queries": ["x"], '
     '"filters": {"colour": "red"}}', "schema: filters"),
])
def test_parse_plan_fallback(text: str, reason: str) -> None:
    res = parse_plan(text, "red shoes")
    assert res.fallback and reason in res.error
    assert res.plan == fallback_plan("red shoes")


def test_request_parsing_and_errors_name_the_field() -> None:
    req = parse_plan_request({"question": s("red shoes")}, None, 96)
    assert req.question == "red shoes"
    assert req.generate.sampling == {"max_tokens": 96, "temperature": 0.0}
    assert req.generate.messages[-1] == {"role": "user", "content": "red shoes"}
    hist = json.dumps([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hey"}])
    req = parse_plan_request({"question": s("and cheaper?"), "history": s(hist)}, None, 96)
    assert "Previous conversation" in req.generate.messages[-1]["content"]
    cases = [
        ({}, "question"),
        ({"question": s("  ")}, "question"),
        ({"question": np.array([b"\xff\xfe"], dtype=np.object_)}, "question"),
        ({"question": s("x" * 5000)}, "question"),
        ({"question": s("q"), "history": s("[1]")}, "history[0]"),
        ({"question": s("q"), "history": s("nope")}, "history"),
        ({"question": s("q"), "sampling_parameters": s('{"temperature": 1}')},
         "sampling_parameters"),
        ({"question": s("q"), "sampling_parameters": s('{"max_tokens": 0}')},
         "sampling_parameters.max_tokens"),
        ({"question": s("q"), "sampling_parameters": s("{bad")}, "sampling_parameters"),
    ]
    for inputs, field in cases:
        with pytest.raises(InvalidInput) as exc:
            parse_plan_request(inputs, None, 96)
        assert exc.value.field == field, (inputs, exc.value)


def test_plan_sink_adds_plan_and_renames_prompt_errors() -> None:
    sent = []

    class Inner:
        def send(self, outputs, error, final):  # type: ignore[no-untyped-def]
            sent.append((outputs, error, final))

        def is_cancelled(self) -> bool:
            return False

    from rufus.errors import InvalidInput

    sink = PlanSink(Inner(), "usb c cable")
    sink.send({"text_output": s(render_plan(GOOD))}, None, True)
    out = sent[-1][0]
    assert json.loads(out["plan"][0]) == GOOD and not out["fallback"][0]
    sink.send({"text_output": s("nonsense")}, None, True)
    assert sent[-1][0]["fallback"][0]
    sink.send(None, InvalidInput("question", "prompt has 5000 tokens"), True)
    assert sent[-1][1].message.startswith("question: prompt has")
    # Prompt errors name what the client sent through the request's prompt_field (typed),
    # not by rewriting the message (issue 11/12): the question alone, else the history.
    assert parse_plan_request({"question": s("q")}, None, 96).generate.prompt_field == "question"
    hist = s(json.dumps([{"role": "user", "content": "x"}]))
    assert parse_plan_request({"question": s("q"), "history": hist}, None,
                              96).generate.prompt_field == "history"


def test_backend_selection_and_knobs(tmp_path) -> None:
    heads = tmp_path / "heads"
    heads.mkdir()
    (heads / "config.json").write_text("{}")
    tree = [[0], [1], [0, 0], [0, 0, 0]]
    args = {"model": "m", "dtype": "bfloat16", "qp_backend": "vllm_medusa",
            "medusa_model": str(heads), "num_medusa_heads": 3, "medusa_speculation_length": 5,
            "medusa_tree": tree, "vllm_num_speculative_tokens": 3}
    b = create_backend(args)
    assert isinstance(b, VllmMedusaBackend)
    ea = b.engine_args(args)
    assert ea["speculative_config"] == {"method": "medusa", "model": str(heads),
                                        "num_speculative_tokens": 3}
    assert ea["model_loader_extra_config"] == {"enable_weights_track": False}
    assert "medusa_tree" not in ea and "qp_backend" not in ea
    ar = create_backend({**args, "qp_backend": "autoregressive"})
    assert isinstance(ar, AutoregressiveBackend) and "speculative_config" not in ar.engine_args(args)
    # missing heads: serve autoregressively rather than fail
    assert isinstance(create_backend({**args, "medusa_model": str(tmp_path / "none")}),
                      AutoregressiveBackend)
    for bad in ({"medusa_speculation_length": 9}, {"medusa_tree": [[0, 0]]},
                {"medusa_tree": [[0], [0, 0], [0, 0, 0], [0, 0, 0, 0]]},
                {"qp_backend": "tpu"}, {"vllm_num_speculative_tokens": 4}):
        with pytest.raises(ConfigError):
            create_backend({**args, **bad})
    f = tmp_path / "tree.json"
    f.write_text(json.dumps({"medusa_tree": tree}))
    assert load_tree(str(f)) == tree


def test_committed_tree_matches_model_json() -> None:
    d = ROOT / "model_repository/rufus_qp_medusa/1"
    mj = json.loads((d / "model.json").read_text())
    # "measured": grown per machine at setup; the committed tree is the fallback
    tree = load_tree(str(d / ("medusa_tree.json" if mj["medusa_tree"] == "measured"
                              else mj["medusa_tree"])))
    assert mj["medusa_speculation_length"] == len(tree) + 1
    assert max(len(p) for p in tree) <= mj["num_medusa_heads"]


def test_plan_sink_grounds_filters_but_keeps_the_raw_text() -> None:
    sent = []

    class Inner:
        def send(self, outputs, error, final):  # type: ignore[no-untyped-def]
            sent.append(outputs)

        def is_cancelled(self) -> bool:
            return False

    raw = render_plan({**GOOD, "filters": {"brand": "apple", "max_price": 20}})
    hist = [{"role": "user", "content": "usb c cables under $20"}]
    PlanSink(Inner(), "usb c cable", hist, ground=True).send({"text_output": s(raw)}, None, True)
    assert json.loads(sent[-1]["plan"][0])["filters"] == {"max_price": 20}  # brand not written
    assert bytes(sent[-1]["text_output"][0]).decode() == raw
    PlanSink(Inner(), "usb c cable").send({"text_output": s(raw)}, None, True)
    assert json.loads(sent[-1]["plan"][0])["filters"] == {"brand": "apple", "max_price": 20}
    assert create_backend({"qp_backend": "torch_autoregressive"}).ground_filters
    assert not create_backend({"qp_backend": "autoregressive",
                               "ground_filters": False}).ground_filters


def test_slo_ms_parameter_is_read_apart_from_sampling() -> None:
    req = parse_plan_request({"question": s("red shoes")}, '{"slo_ms": 1500, "max_tokens": 64}', 96)
    assert req.slo_s == 1.5 and req.generate.sampling["max_tokens"] == 64
    assert "slo_ms" not in req.generate.sampling
    assert parse_plan_request({"question": s("red shoes")}, None, 96).slo_s is None
    for bad in ('{"slo_ms": 0}', '{"slo_ms": "fast"}', '{"slo_ms": true}', '{"slo_ms": 1e9}'):
        with pytest.raises(InvalidInput) as exc:
            parse_plan_request({"question": s("red shoes")}, bad, 96)
        assert exc.value.field == "parameters.slo_ms"


def test_plan_sink_tells_the_ticket_when_the_plan_is_done() -> None:
    from rufus.serving.admission import AdmissionSettings, SloAdmission

    class Inner:
        def send(self, outputs, error, final):
            pass

    adm = SloAdmission(AdmissionSettings(slo_s=0.3))
    ticket = adm.admit()
    sink = PlanSink(Inner(), "usb c cable", ticket=ticket)
    sink.send({"text_output": s('{"intent": "product_search"')}, None, False)
    assert adm.waiting == 1                       # not done yet
    sink.send({"text_output": s('{"intent": "product_search"}')}, None, True)
    assert (adm.waiting, adm.decoding) == (0, 1)  # the plan is done: measured
    ticket.done()
    assert (adm.waiting, adm.decoding) == (0, 0)


def test_the_plan_types_are_the_schema():
    """rufus.qp.plan's Plan, PlanFilters, Intent and QueryType say what plan_schema.json says,
    so the type checker checks plans against the schema the decoder is held to."""
    import typing

    from rufus.qp.plan import Intent, Plan, PlanFilters, QueryType, as_plan, plan_schema

    props = plan_schema()["properties"]
    assert Plan.__required_keys__ == frozenset(plan_schema()["required"]) == frozenset(props)
    assert list(typing.get_args(Intent)) == props["intent"]["enum"]
    assert list(typing.get_args(QueryType)) == props["query_type"]["enum"]
    assert PlanFilters.__optional_keys__ == frozenset(props["filters"]["properties"])
    assert as_plan(fallback_plan("tents")) == fallback_plan("tents")
    assert as_plan({"intent": "shopping"}) is None
