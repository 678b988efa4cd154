"""W8A8 checkpoint writer (rufus/launch/w8a8.py) on a tiny random Llama: compressed-tensors
tensor names, dtypes, shapes and scales; dequantized weights within half a step of the
originals; lm_head, embeddings and norms untouched; config format; idempotence; SmoothQuant
leaves the fp32 function unchanged."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from rufus.launch import w8a8
from rufus.launch.default_model import STAMP
from rufus.machine import precision
from tests.tiny_models import random_llama

LINEARS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
           "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")


@pytest.fixture()
def tiny(tmp_path: Path) -> Path:
    """This module's own tiny model, not conftest.py's: bf16 with an untied LM head (what
    the W8A8 writer quantizes), a fresh folder per test (tests edit its config)."""
    model = random_llama(vocab_size=64, hidden_size=32, intermediate_size=48,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=128, tie_word_embeddings=False
                         ).to(torch.bfloat16)
    with torch.no_grad():  # one all-zero row: its scale must stay finite, its values 0
        model.model.layers[0].mlp.down_proj.weight[3].zero_()
    src = tmp_path / "tiny-llama"
    model.save_pretrained(src, safe_serialization=True)
    (src / "tokenizer_config.json").write_text('{"model_max_length": 128}')
    (src / "chat_template.jinja").write_text("{{ messages }}")
    return src


def _tensors(path: Path) -> dict[str, torch.Tensor]:
    with safe_open(str(path), framework="pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}


def test_writes_compressed_tensors_w8a8(tiny: Path, tmp_path: Path):
    out = w8a8.build(tiny, tmp_path / "out", alpha=None)
    src_t = _tensors(tiny / "model.safetensors")
    out_t = _tensors(out / "model.safetensors")

    n_layers = 2
    quantized = {f"model.layers.{i}.{m}" for i in range(n_layers) for m in LINEARS}
    expected = (set(src_t) | {f"{m}.weight_scale" for m in quantized})
    assert set(out_t) == expected
    for mod in quantized:
        w, q, s = src_t[f"{mod}.weight"], out_t[f"{mod}.weight"], out_t[f"{mod}.weight_scale"]
        assert q.dtype == torch.int8 and q.shape == w.shape
        assert s.dtype == torch.float32 and s.shape == (w.shape[0], 1)
        assert bool((s > 0).all())
        w32 = w.float()
        # compressed-tensors' symmetric scale: absmax / 127.5 per output channel
        absmax = w32.abs().amax(dim=1, keepdim=True)
        nonzero = absmax[:, 0] > 0
        assert torch.allclose(s[nonzero], absmax[nonzero] / 127.5, rtol=1e-6)
        err = (q.float() * s - w32).abs()
        assert bool((err <= s / 2 * (1 + 1e-5) + 1e-12).all()), f"{mod}: error above scale/2"
        # the full int8 range is used (per channel)
        assert int(q.to(torch.int16).abs().amax(dim=1)[nonzero].min()) >= 127
    zero_row = out_t["model.layers.0.mlp.down_proj.weight"][3]
    assert bool((zero_row == 0).all())
    # everything else is bit-identical: lm_head, embeddings, norms
    for name, t in src_t.items():
        if not any(name.startswith(m) for m in quantized):
            assert out_t[name].dtype == t.dtype and torch.equal(out_t[name], t), name
    assert "lm_head.weight" in out_t and out_t["lm_head.weight"].dtype == torch.bfloat16

    cfg = json.loads((out / "config.json").read_text())
    src_cfg = json.loads((tiny / "config.json").read_text())
    assert {k: v for k, v in cfg.items() if k != "quantization_config"} == src_cfg
    qc = cfg["quantization_config"]
    assert qc["quant_method"] == "compressed-tensors"
    assert qc["format"] == "int-quantized"
    assert qc["quantization_status"] == "compressed"
    assert qc["ignore"] == ["lm_head"]
    (group,) = qc["config_groups"].values()
    assert group["targets"] == ["Linear"]
    wq, aq = group["weights"], group["input_activations"]
    assert {k: wq[k] for k in ("num_bits", "type", "symmetric", "strategy", "dynamic")} == \
        {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "channel", "dynamic": False}
    assert {k: aq[k] for k in ("num_bits", "type", "symmetric", "strategy", "dynamic")} == \
        {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "token", "dynamic": True}
    assert group["output_activations"] is None

    # compressed-tensors parses it back as the W8A8 preset
    from compressed_tensors.quantization import QuantizationConfig, preset_name_to_scheme
    parsed = QuantizationConfig.model_validate(qc)
    preset = preset_name_to_scheme("W8A8", ["Linear"])
    assert parsed.config_groups["group_0"].weights == preset.weights
    assert parsed.config_groups["group_0"].input_activations == preset.input_activations

    # tokenizer files travel; the stamp lists every file with its checksum
    assert (out / "tokenizer_config.json").read_text() == '{"model_max_length": 128}'
    assert (out / "chat_template.jinja").exists()
    stamp = json.loads((out / STAMP).read_text())
    assert set(stamp["files"]) == {p.name for p in out.iterdir() if p.name != STAMP}
    assert set(stamp["source_files"]) == {"model.safetensors", "config.json"}


def test_idempotent_and_rebuilds_when_stale(tiny: Path, tmp_path: Path, capsys):
    out = w8a8.build(tiny, tmp_path / "out", alpha=None)
    mtime = (out / "model.safetensors").stat().st_mtime_ns
    capsys.readouterr()
    w8a8.build(tiny, out, alpha=None)
    assert "ready" in capsys.readouterr().out
    assert (out / "model.safetensors").stat().st_mtime_ns == mtime  # not rewritten

    # a damaged output is rewritten
    (out / "config.json").write_text("{}")
    w8a8.build(tiny, out, alpha=None)
    assert "quantization_config" in json.loads((out / "config.json").read_text())

    # a changed source is re-quantized
    cfg = json.loads((tiny / "config.json").read_text())
    cfg["rms_norm_eps"] = 1e-5 if cfg.get("rms_norm_eps") != 1e-5 else 1e-6
    (tiny / "config.json").write_text(json.dumps(cfg))
    capsys.readouterr()
    w8a8.build(tiny, out, alpha=None)
    assert "quantizing" in capsys.readouterr().out
    assert json.loads((out / "config.json").read_text())["rms_norm_eps"] == cfg["rms_norm_eps"]
    assert not out.with_name(out.name + ".partial").exists()

    # another smoothing recipe is a rebuild too
    capsys.readouterr()
    w8a8.build(tiny, out, alpha=0.5, calib=[[1, 2, 3, 4, 5]])
    assert "rebuilding" in capsys.readouterr().out
    assert json.loads((out / STAMP).read_text())["recipe"]["smoothquant"]["alpha"] == 0.5


def test_default_out_and_refuses_quantized_source(tiny: Path, tmp_path: Path):
    assert w8a8.default_out(Path("/c/models/SmolLM2-135M-Instruct")) == \
        Path("/c/models/SmolLM2-135M-Instruct-w8a8")
    out = w8a8.build(tiny, alpha=None)  # default: next to the source
    assert out == tiny.parent / "tiny-llama-w8a8"
    with pytest.raises(SystemExit, match="quantization_config"):
        w8a8.build(out, tmp_path / "twice", alpha=None)


def test_quantize_weight_matches_compressed_tensors_round_trip():
    from compressed_tensors.quantization.lifecycle.forward import dequantize

    torch.manual_seed(1)
    w = torch.randn(16, 40)
    q, s = w8a8.quantize_weight(w)
    assert q.dtype == torch.int8 and s.shape == (16, 1)
    back = dequantize(x_q=q, scale=s)
    assert bool(((back - w).abs() <= s / 2 * (1 + 1e-5)).all())


def test_vllm_parses_it_as_int8_w8a8(tiny: Path, tmp_path: Path):
    """vLLM's own compressed-tensors parser maps the config to its int8 W8A8 scheme (dynamic
    per-token symmetric activations), the one CPUInt8ScaledMMLinearKernel serves on CPU.
    Imports vLLM (some seconds) but starts no engine."""
    ct = pytest.importorskip(
        "vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors")
    out = w8a8.build(tiny, tmp_path / "out", alpha=None)
    qc = json.loads((out / "config.json").read_text())["quantization_config"]
    cfg = ct.CompressedTensorsConfig.from_config(qc)
    assert cfg.ignore == ["lm_head"]
    target = cfg.target_scheme_map["Linear"]
    scheme = cfg._get_scheme_from_parts(target["weights"], target["input_activations"],
                                        format=target.get("format") or cfg.quant_format)
    assert type(scheme).__name__ == "CompressedTensorsW8A8Int8"
    assert scheme.strategy == "channel"
    assert scheme.is_static_input_scheme is False and scheme.input_symmetric is True


def _load_dequantized(model_dir: Path, ckpt: Path):
    from transformers import LlamaForCausalLM

    t = _tensors(ckpt / "model.safetensors")
    state = {k: (v.float() * t[k + "_scale"] if v.dtype == torch.int8 else v.float())
             for k, v in t.items() if not k.endswith("_scale")}
    model = LlamaForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    model.load_state_dict(state, strict=True)
    return model


def test_smoothquant_keeps_the_function_and_moves_scales(tiny: Path, tmp_path: Path):
    from transformers import LlamaForCausalLM

    torch.manual_seed(2)
    calib = [torch.randint(0, 64, (24,)).tolist() for _ in range(4)]
    src_t = _tensors(tiny / "model.safetensors")
    # the fold alone (no rounding), in fp32: same logits as the original
    dense = {k: v.float() for k, v in src_t.items()}
    groups = w8a8.smoothing_groups(set(dense))
    assert len(groups) == 2 * 3
    amax = w8a8.activation_absmax(tiny, calib, {g[0] for g in groups})
    smoothed = dict(dense)
    w8a8.smooth(smoothed, amax, 0.5)
    orig = LlamaForCausalLM.from_pretrained(tiny, dtype=torch.float32).eval()
    folded = LlamaForCausalLM.from_pretrained(tiny, dtype=torch.float32).eval()
    folded.load_state_dict(smoothed, strict=True)
    ids = torch.tensor([calib[0]])
    with torch.no_grad():
        ref = orig(ids).logits
        assert torch.allclose(folded(ids).logits, ref, atol=1e-4, rtol=1e-4)
    assert not torch.equal(smoothed["model.layers.0.input_layernorm.weight"],
                           dense["model.layers.0.input_layernorm.weight"])

    # the written checkpoint: same format, norms smoothed (still bf16), close to the original
    out = w8a8.build(tiny, tmp_path / "sq", alpha=0.5, calib=calib)
    out_t = _tensors(out / "model.safetensors")
    assert out_t["model.layers.0.input_layernorm.weight"].dtype == torch.bfloat16
    assert out_t["model.layers.1.mlp.up_proj.weight"].dtype == torch.int8
    assert torch.equal(out_t["lm_head.weight"], src_t["lm_head.weight"])
    assert torch.equal(out_t["model.embed_tokens.weight"], src_t["model.embed_tokens.weight"])
    with torch.no_grad():
        got = _load_dequantized(tiny, out)(ids).logits
    assert (got - ref).abs().max() < 0.05 * ref.abs().max()


def test_w8a8_only_on_vnni_or_amx_cpus():
    assert precision.cpu_runs_w8a8_well({"avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni"})
    assert precision.cpu_runs_w8a8_well({"avx2", "avx512f", "amx_tile", "amx_int8"})
    assert not precision.cpu_runs_w8a8_well({"avx2", "fma"})  # oneDNN int8 saturates and is slow
    assert not precision.cpu_runs_w8a8_well({"avx2", "fma", "avx512f"})


def test_the_calibration_questions_are_found_from_the_product_package():
    """setup writes the W8A8 copy on every machine: the calibration file must resolve from
    rufus/launch/ (a wrong parent made setup fail once)."""
    assert w8a8.CALIB_FILE.is_file(), w8a8.CALIB_FILE
