"""The NxDI planner engine against a fake of NxDI's API (the real SDK exists only on Neuron
hosts): the NeuronConfig it asks for, compile-once/load, the heads exported in NxDI's
layout, generation through the torch engine's serving surface, and backend selection."""

from __future__ import annotations

import asyncio
import sys
import types
from pathlib import Path
from typing import Any

import pytest
import torch

from rufus.qp.backends import NxdiMedusaBackend, create_backend
from rufus.qp.decoder.nxdi_engine import NxdiPlannerEngine, NxdiRuntime, NxdiSettings

HIDDEN, VOCAB = 8, 12
WORDS = ["<unk>", "<|im_end|>", "a", "b", "c", "d", "e", "f", "g", "h", "i", "j"]
TREE = [[0], [0, 0], [0, 0, 0]]


class FakeNxdi:
    """Records every call; ``script`` is what generate appends to the prompt."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.script: list[int] = [2, 3, 4, 1, 5, 6]

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        fake = self

        class NeuronConfig:
            def __init__(self, **kw: Any) -> None:
                self.kw = kw
                fake.calls.append(("NeuronConfig", kw))

        class LlamaInferenceConfig:
            def __init__(self, neuron_config: Any, load_config: Any = None) -> None:
                self.neuron_config = neuron_config
                fake.calls.append(("LlamaInferenceConfig", load_config))

        class NeuronLlamaForCausalLM:
            def __init__(self, model_path: str, config: Any) -> None:
                fake.calls.append(("model", model_path))
                self.config = config

            def compile(self, path: str) -> None:
                fake.calls.append(("compile", path))
                Path(path).mkdir(parents=True, exist_ok=True)
                (Path(path) / "model.pt").write_text("compiled")

            def load(self, path: str) -> None:
                fake.calls.append(("load", path))

            def reset(self) -> None:
                fake.calls.append(("reset", None))

            @classmethod
            def save_quantized_state_dict(cls, model_path: str, config: Any) -> None:
                qdir = Path(config.neuron_config.kw["quantized_checkpoints_path"])
                fake.calls.append(("quantize", (model_path, str(qdir))))
                assert qdir.is_dir()  # a directory: NxDI saves safetensors there
                (qdir / "model.safetensors").write_text("int8")

        class HuggingFaceGenerationAdapter:
            def __init__(self, model: Any) -> None:
                self.model = model

            def generate(self, ids: torch.Tensor, **kw: Any) -> torch.Tensor:
                fake.calls.append(("generate", kw))
                assert kw["assistant_model"].model is self.model  # Medusa: its own draft
                assert kw["do_sample"] is False
                return torch.cat([ids, torch.tensor([fake.script])], dim=1)

        def load_pretrained_config(path: str) -> Any:
            return ("hf-config", path)

        mods = {
            "neuronx_distributed_inference": types.ModuleType("neuronx_distributed_inference"),
            "neuronx_distributed_inference.models": types.ModuleType("m"),
            "neuronx_distributed_inference.models.config": types.ModuleType("c"),
            "neuronx_distributed_inference.models.llama": types.ModuleType("l"),
            "neuronx_distributed_inference.models.llama.modeling_llama": types.ModuleType("ml"),
            "neuronx_distributed_inference.utils": types.ModuleType("u"),
            "neuronx_distributed_inference.utils.hf_adapter": types.ModuleType("h"),
        }
        mods["neuronx_distributed_inference.models.config"].NeuronConfig = NeuronConfig
        ml = mods["neuronx_distributed_inference.models.llama.modeling_llama"]
        ml.LlamaInferenceConfig = LlamaInferenceConfig
        ml.NeuronLlamaForCausalLM = NeuronLlamaForCausalLM
        ha = mods["neuronx_distributed_inference.utils.hf_adapter"]
        ha.HuggingFaceGenerationAdapter = HuggingFaceGenerationAdapter
        ha.load_pretrained_config = load_pretrained_config
        for name, mod in mods.items():
            monkeypatch.setitem(sys.modules, name, mod)

    def names(self) -> list[str]:
        return [c[0] for c in self.calls]


@pytest.fixture
def dirs(tmp_path: Path) -> tuple[Path, Path]:
    from safetensors.torch import save_file
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace
    from transformers import PreTrainedTokenizerFast

    model = tmp_path / "planner"
    model.mkdir()
    tok = Tokenizer(WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<unk>"))
    tok.pre_tokenizer = Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", eos_token="<|im_end|>",
                            pad_token="<unk>").save_pretrained(model)
    save_file({"model.embed_tokens.weight": torch.randn(VOCAB, HIDDEN)},
              str(model / "model.safetensors"))
    heads = tmp_path / "heads"
    heads.mkdir()
    save_file({f"blocks.{k}.layers.0.weight": torch.randn(HIDDEN, HIDDEN) for k in range(3)},
              str(heads / "model.safetensors"))
    return model, heads


def test_runtime_config_compile_once_and_heads(dirs: tuple[Path, Path], tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeNxdi()
    fake.install(monkeypatch)
    model, heads = dirs
    s = NxdiSettings(model=str(model), compiled_path=str(tmp_path / "neff"), medusa_dir=str(heads),
                     tree=TREE, num_heads=3, max_len=256, max_new_tokens=64)
    rt = NxdiRuntime(s)
    rt.load()
    kw = dict(fake.calls)["NeuronConfig"]
    assert kw["is_medusa"] is True and kw["batch_size"] == 1
    assert kw["medusa_speculation_length"] == len(TREE) + 1 and kw["num_medusa_heads"] == 3
    assert kw["medusa_tree"] == TREE and kw["max_new_tokens"] == 64 and kw["seq_len"] == 256
    assert kw["torch_dtype"] is torch.bfloat16
    assert fake.names()[-2:] == ["compile", "load"]
    sd = torch.load(model / "medusa_heads.pt")
    assert set(sd) == {f"medusa_head_{i}.{p}" for i in range(3)
                       for p in ("0.linear.weight", "0.linear.bias", "1.weight")}
    assert sd["medusa_head_0.1.weight"].shape == (VOCAB, HIDDEN)
    NxdiRuntime(s).load()  # compiled artifacts exist: load only
    assert fake.names().count("compile") == 1
    assert rt.generate([2, 3], 8, {1}, 0) == fake.script
    assert fake.names()[-1] == "reset"  # KV cache cleared after every generation
    assert "quantize" not in fake.names() and "quantized" not in kw


def test_int8_uses_nxdi_quantization(dirs: tuple[Path, Path], tmp_path: Path,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """dtype int8: NxDI's per-channel int8 weight-only quantization, bf16 activations; the
    checkpoint quantized once (before compiling) into its own directory, with the heads."""
    fake = FakeNxdi()
    fake.install(monkeypatch)
    model, heads = dirs
    qdir = tmp_path / "planner-int8"
    s = NxdiSettings(model=str(model), compiled_path=str(tmp_path / "neff8"),
                     medusa_dir=str(heads), tree=TREE, num_heads=3, dtype="int8",
                     quantized_path=str(qdir))
    NxdiRuntime(s).load()
    kw = dict(fake.calls)["NeuronConfig"]
    assert kw["torch_dtype"] is torch.bfloat16 and kw["quantized"] is True
    assert kw["quantization_type"] == "per_channel_symmetric"
    assert kw["quantization_dtype"] == "int8" and kw["quantized_checkpoints_path"] == str(qdir)
    assert kw["modules_to_not_convert"] == ["lm_head", "medusa_head"]
    assert kw["is_medusa"] is True and kw["medusa_tree"] == TREE
    assert fake.names()[-3:] == ["model", "compile", "load"]
    assert dict(fake.calls)["quantize"] == (str(model), str(qdir))
    assert fake.names().index("quantize") < fake.names().index("compile")
    # NxDI reads medusa_heads.pt next to the checkpoint it loads: the quantized one
    assert set(torch.load(qdir / "medusa_heads.pt")) == set(torch.load(model / "medusa_heads.pt"))
    NxdiRuntime(s).load()  # quantized and compiled already: load only
    assert fake.names().count("quantize") == 1 and fake.names().count("compile") == 1


def test_engine_int8_paths(dirs: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """The engine's defaults for int8: its own compiled graph and quantized checkpoint."""
    seen: list[NxdiSettings] = []

    class Recorder(NxdiRuntime):
        def load(self) -> None:
            seen.append(self.s)

    model, heads = dirs
    args = {"model": str(model), "dtype": "int8", "max_model_len": 256}
    engine = NxdiPlannerEngine(args, tree_paths=TREE, medusa_dir=str(heads), num_heads=3,
                               runtime_cls=Recorder)
    engine.shutdown()
    assert seen[0].dtype == "int8"
    assert seen[0].compiled_path == str(model.with_name("planner-neuron-int8"))
    assert seen[0].quantized_path == str(model.with_name("planner-int8"))


def test_engine_serves_through_the_torch_engine_surface(dirs: tuple[Path, Path],
                                                        tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    from vllm.sampling_params import RequestOutputKind, SamplingParams, StructuredOutputsParams

    fake = FakeNxdi()
    fake.install(monkeypatch)
    model, heads = dirs
    backend = create_backend({"qp_backend": "nxdi", "model": str(model), "medusa_model": str(heads),
                              "num_medusa_heads": 3, "medusa_tree": TREE,
                              "vllm_num_speculative_tokens": 3, "max_model_len": 256,
                              "nxdi_compiled_path": str(tmp_path / "neff"), "max_num_seqs": 8})
    assert isinstance(backend, NxdiMedusaBackend)
    args = backend.engine_args({"model": str(model), "max_model_len": 256, "max_num_seqs": 8,
                                "nxdi_compiled_path": str(tmp_path / "neff"), "qp_backend": "nxdi"})
    assert args == {"model": str(model), "max_model_len": 256,
                    "nxdi_compiled_path": str(tmp_path / "neff")}
    engine = backend.engine_factory()(args)
    assert isinstance(engine, NxdiPlannerEngine)
    engine.warm_grammar({"type": "object"})  # nothing to compile on Neuron

    async def ask(max_tokens: int, schema: bool) -> Any:
        sp = SamplingParams(temperature=0.0, max_tokens=max_tokens,
                            output_kind=RequestOutputKind.FINAL_ONLY,
                            structured_outputs=StructuredOutputsParams(json={"type": "object"})
                            if schema else None)
        outs = [o async for o in engine.generate({"prompt_token_ids": [2, 3, 4]}, sp, "r")]
        return outs[-1].outputs[0]

    try:
        done = asyncio.run(ask(16, True))
        assert done.token_ids == [2, 3, 4, 1] and done.finish_reason == "stop"  # cut at EOS
        assert done.text == "a b c"
        cut = asyncio.run(ask(2, False))
        assert cut.token_ids == [2, 3] and cut.finish_reason == "length"
        gen = [kw for name, kw in fake.calls if name == "generate"]
        assert gen[0]["max_new_tokens"] == 16 and gen[0]["eos_token_id"] == [1]
        with pytest.raises(ValueError, match="compiled sequence length"):
            asyncio.run(ask(300, False))
        assert not engine.errored or engine.dead_error is not None
    finally:
        engine.shutdown()


def test_missing_sdk_fails_with_the_import_error(dirs: tuple[Path, Path], tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "neuronx_distributed_inference", None)
    model, heads = dirs
    s = NxdiSettings(model=str(model), compiled_path=str(tmp_path / "neff"), medusa_dir=str(heads),
                     tree=TREE, num_heads=3)
    with pytest.raises(ImportError):
        NxdiRuntime(s).load()
