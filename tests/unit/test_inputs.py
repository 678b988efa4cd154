"""Each model's inputs and outputs are declared once; config.pbtxt must say the same."""

from __future__ import annotations

import re

import pytest

from rufus.assistant.triton_model import (
    ASSISTANT_INPUT_SPECS,
    ASSISTANT_OUTPUT_SPECS,
    AssistantModel,
)
from rufus.launch.server import ROOT
from rufus.qp.model import QP_INPUT_SPECS, QP_OUTPUT_SPECS, QueryPlannerModel
from rufus.serving.llm import LLM_INPUT_SPECS, LLM_OUTPUT_SPECS, LLMModel

ENTRY = re.compile(r"\{\s*name:\s*\"(\w+)\"\s+data_type:\s*(\w+)\s+dims:\s*\[\s*([-\d,\s]+)\]"
                   r"(\s+optional:\s*true)?\s*\}")


def pbtxt_io(model: str) -> tuple[list[tuple], list[tuple]]:
    text = (ROOT / "model_repository" / model / "config.pbtxt").read_text()
    text = "\n".join(line.split("#")[0] for line in text.splitlines())
    blocks = {}
    for kind in ("input", "output"):
        m = re.search(kind + r"\s*\[(.*?)\n\]", text, re.S)
        assert m, f"{model}: no {kind} block"
        blocks[kind] = [(n, t, tuple(int(d) for d in dims.split(",")), bool(opt))
                        for n, t, dims, opt in ENTRY.findall(m.group(1))]
    return blocks["input"], blocks["output"]


@pytest.mark.parametrize("model, inputs, outputs", [
    ("rufus_llm", LLM_INPUT_SPECS, LLM_OUTPUT_SPECS),
    ("rufus_qp_medusa", QP_INPUT_SPECS, QP_OUTPUT_SPECS),
    ("rufus_assistant", ASSISTANT_INPUT_SPECS, ASSISTANT_OUTPUT_SPECS),
])
def test_table_matches_config_pbtxt(model, inputs, outputs):
    cfg_in, cfg_out = pbtxt_io(model)
    assert cfg_in == [(s.name, s.data_type, s.dims, s.optional) for s in inputs]
    assert cfg_out == [(s.name, s.data_type, s.dims, False) for s in outputs]


def test_every_model_declares_its_io_in_one_table():
    assert LLMModel.INPUT_SPECS is LLM_INPUT_SPECS and LLMModel.OUTPUT_SPECS is LLM_OUTPUT_SPECS
    assert QueryPlannerModel.INPUT_SPECS is QP_INPUT_SPECS
    assert AssistantModel.INPUT_SPECS is ASSISTANT_INPUT_SPECS


def test_auto_complete_adds_every_declared_input():
    class Cfg:
        def __init__(self):
            self.inputs, self.outputs = [], []

        def as_dict(self):
            return {"input": [], "output": []}

        def add_input(self, i):
            self.inputs.append(i)

        def add_output(self, o):
            self.outputs.append(o)

        def set_model_transaction_policy(self, p):
            self.policy = p

        def set_max_batch_size(self, n):
            self.mbs = n

    for model, specs in ((LLMModel, LLM_INPUT_SPECS), (QueryPlannerModel, QP_INPUT_SPECS),
                         (AssistantModel, ASSISTANT_INPUT_SPECS)):
        cfg = model.auto_complete_config(Cfg())
        assert [i["name"] for i in cfg.inputs] == [s.name for s in specs]
        assert cfg.policy == {"decoupled": True}


def test_multi_lora_json_convention(tmp_path):
    from rufus.serving.config import lora_enabled
    from rufus.serving.llm import load_loras

    assert load_loras(tmp_path, {}) is None
    # one rule for "LoRA on", shared with load_engine_config's choice of weights
    assert not lora_enabled(tmp_path, {}) and lora_enabled(tmp_path, {"enable_lora": "true"})
    with pytest.raises(FileNotFoundError, match=r"multi_lora\.json"):
        load_loras(tmp_path, {"enable_lora": "true"})
    (tmp_path / "multi_lora.json").write_text('{"a": "adapters/a", "b": "/abs/b"}')
    assert lora_enabled(tmp_path, {})
    assert load_loras(tmp_path, {}) == {"a": str((tmp_path / "adapters/a").resolve()),
                                        "b": "/abs/b"}
    (tmp_path / "multi_lora.json").write_text('["a"]')
    with pytest.raises(ValueError, match="adapter name"):
        load_loras(tmp_path, {})


# ----------------------------------------------------------------- conversation key (issue 27)
def test_conversation_key_is_taken_out_of_the_request_parameters():
    """tritonserver forwards the x-rufus-conversation header as a request parameter: it is
    routing metadata, removed before a model reads its parameters, and validated."""
    import json as _json

    from rufus.client import CONVERSATION_HEADER as H
    from rufus.errors import InvalidInput
    from rufus.serving.validation import split_conversation

    assert split_conversation(None, H) == (None, "")
    plain = '{"temperature": 0.5}'
    assert split_conversation(plain, H) == (plain, "")  # not parsed again: same text back
    rest, key = split_conversation(_json.dumps({H: "conv-1", "temperature": 0.5}), H)
    assert key == "conv-1" and _json.loads(rest) == {"temperature": 0.5}
    assert split_conversation(_json.dumps({H: "c"}), H) == (None, "c")
    for bad, why in (("a b", "printable ASCII"), ("x" * 129, "1-128"), (7, "string")):
        with pytest.raises(InvalidInput) as info:
            split_conversation(_json.dumps({H: bad}), H)
        assert info.value.field == H and why in info.value.reason
