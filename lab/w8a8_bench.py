"""The W8A8 answer model measured, behind scripts/bench_w8a8.py (its docstring and --help
say what each command does): vLLM's load, greedy agreement with the bf16 reference,
prefill and decode speed, teacher-forced quality without vLLM, and the int8 kernels alone.
The checkpoint itself is written by rufus/launch/w8a8.py."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about autumn leaves.",
    "Explain what a hash table is in two sentences.",
    "List three fruits that are red.",
    "How do I boil an egg?",
    "What is 17 times 23?",
    "Translate 'good morning' into Spanish.",
    "Give me a short tip for better sleep.",
    "What does a CPU cache do?",
    "Summarize the plot of Romeo and Juliet in one sentence.",
    "Suggest a name for a pet goldfish.",
    "Why is the sky blue?",
    "What are the benefits of drinking water?",
    "Recommend a good running shoe for beginners.",
    "How many legs does a spider have?",
    "Write a Python function that reverses a string.",
    "What is the difference between weather and climate?",
    "Describe a cat in five words.",
    "What should I pack for a beach trip?",
    "Is a tomato a fruit or a vegetable?",
]
AGREE_TOKENS = 32

# (name, out_features N, in_features K): the model's Linear shapes as vLLM fuses them.
SHAPES = [("gate_up", 3072, 576), ("down", 576, 1536), ("qkv", 960, 576), ("o", 576, 576)]


def say(msg: str) -> None:
    print(f"[bench_w8a8 {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def cmd_engine(a: argparse.Namespace) -> None:
    import random

    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    t0 = time.monotonic()
    # gpu_memory_utilization as rufus_llm's model.json: vLLM's 0.92 default refuses to start
    # where less of the NUMA node is free (seen on a 2-core AMX VM)
    llm = LLM(model=a.model, dtype=a.dtype, max_model_len=512, enable_prefix_caching=False,
              max_num_seqs=16, seed=0, gpu_memory_utilization=0.85)
    load_s = time.monotonic() - t0
    say(f"engine up in {load_s:.0f} s")
    tok = llm.get_tokenizer()
    texts = [tok.apply_chat_template([{"role": "user", "content": p}], tokenize=False,
                                     add_generation_prompt=True) for p in PROMPTS]
    greedy = SamplingParams(temperature=0.0, max_tokens=AGREE_TOKENS)
    outs = llm.generate(texts, greedy, use_tqdm=False)
    result = {"model": a.model, "dtype": a.dtype, "load_s": round(load_s, 1),
              "env": {k: os.environ[k] for k in ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA")
                      if k in os.environ},
              "greedy": [list(o.outputs[0].token_ids) for o in outs],
              "greedy_text": [o.outputs[0].text for o in outs]}
    say("sample: " + repr(result["greedy_text"][0]))
    if not a.speed:
        Path(a.json).write_text(json.dumps(result, indent=1))
        return
    rng = random.Random(0)
    vocab = min(tok.vocab_size, 40000)

    def rand_prompt(n: int) -> TokensPrompt:
        return TokensPrompt(prompt_token_ids=[rng.randrange(100, vocab) for _ in range(n)])

    one = SamplingParams(temperature=0.0, max_tokens=1)
    llm.generate([rand_prompt(128)], one, use_tqdm=False)  # warm-up
    ttft = []
    for _ in range(5):
        t = time.perf_counter()
        llm.generate([rand_prompt(128)], one, use_tqdm=False)
        ttft.append(time.perf_counter() - t)
    result["prefill128_ms"] = round(statistics.median(ttft) * 1000, 1)
    result["prefill128_all_ms"] = [round(x * 1000, 1) for x in ttft]
    say(f"128-token prompt, 1 output token: {result['prefill128_ms']} ms (median of 5)")
    batch = SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True)
    llm.generate([rand_prompt(32) for _ in range(16)], batch, use_tqdm=False)  # warm-up
    t = time.perf_counter()
    outs = llm.generate([rand_prompt(32) for _ in range(16)], batch, use_tqdm=False)
    dt = time.perf_counter() - t
    n_out = sum(len(o.outputs[0].token_ids) for o in outs)
    result["batch16x64_s"] = round(dt, 2)
    result["batch16x64_tok_s"] = round(n_out / dt, 1)
    single = SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True)
    t = time.perf_counter()
    outs = llm.generate([rand_prompt(32)], single, use_tqdm=False)
    dt = time.perf_counter() - t
    result["single64_tok_s"] = round(len(outs[0].outputs[0].token_ids) / dt, 1)
    say(f"16 x 64 tokens: {result['batch16x64_tok_s']} tok/s; 1 x 64: "
        f"{result['single64_tok_s']} tok/s")
    Path(a.json).write_text(json.dumps(result, indent=1))


def cmd_compare(a: argparse.Namespace) -> None:
    ref = json.loads(Path(a.ref).read_text())
    print(f"reference: {ref['model']} dtype={ref['dtype']} {ref.get('env', {})}")
    for other in a.others:
        o = json.loads(Path(other).read_text())
        same, firsts = 0, []
        for r, x in zip(ref["greedy"], o["greedy"], strict=True):
            r, x = r[:AGREE_TOKENS], x[:AGREE_TOKENS]
            if r == x:
                same += 1
                continue
            d = next((i for i, (p, q) in enumerate(zip(r, x, strict=False)) if p != q),
                     min(len(r), len(x)))
            firsts.append(d)
        n = len(ref["greedy"])
        print(f"{o['model']} dtype={o['dtype']} {o.get('env', {})}: identical first "
              f"{AGREE_TOKENS} tokens {same}/{n} ({same / n:.0%}); first divergence at token "
              f"{sorted(firsts)}")


def cmd_quality(a: argparse.Namespace) -> None:
    """Teacher-forced next-token agreement and KL against the fp32 model (transformers, no
    vLLM): bf16, and W8A8 simulated in fp32 (the checkpoint's int8 weights times their scales,
    each Linear input fake-quantized per token, symmetric int8 with scale absmax/127 as
    vLLM's dynamic quant does)."""
    import torch
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(a.threads)
    tok = AutoTokenizer.from_pretrained(a.src)
    runs = json.loads(Path(a.ref).read_text())["greedy"]
    texts = [tok.apply_chat_template([{"role": "user", "content": p}], tokenize=False,
                                     add_generation_prompt=True) for p in PROMPTS]
    seqs = [tok(t, add_special_tokens=False)["input_ids"] + g for t, g in zip(texts, runs,
                                                                           strict=True)]
    starts = [len(tok(t, add_special_tokens=False)["input_ids"]) for t in texts]

    def logits_of(model):
        out = []
        with torch.no_grad():
            for s in seqs:
                ids = torch.tensor([s])
                out.append(model(ids).logits[0].float().log_softmax(-1))
        return out

    base = AutoModelForCausalLM.from_pretrained(a.src, dtype=torch.float32).eval()
    ref = logits_of(base)

    def report(name, lp):
        agree = total = 0
        kl = []
        for r, x, st in zip(ref, lp, starts, strict=True):
            r, x = r[st - 1:-1], x[st - 1:-1]  # positions predicting the generated tokens
            agree += int((r.argmax(-1) == x.argmax(-1)).sum())
            total += r.shape[0]
            kl.append((r.exp() * (r - x)).sum(-1))
        kl = torch.cat(kl)
        print(f"| {name} | {agree}/{total} ({agree / total:.1%}) | {kl.mean():.4f} | "
              f"{kl.quantile(0.99):.4f} |", flush=True)

    print("teacher-forced on the prompts + the bf16 engine's greedy tokens; reference fp32")
    print("| variant | top-1 agrees with fp32 | mean KL | p99 KL |\n|---|---|---|---|")
    report("bf16 (weights and activations)",
           logits_of(AutoModelForCausalLM.from_pretrained(a.src, dtype=torch.bfloat16).eval()))
    with safe_open(str(Path(a.w8a8) / "model.safetensors"), framework="pt") as f:
        q = {k: f.get_tensor(k) for k in f.keys()}
    sim = AutoModelForCausalLM.from_pretrained(a.src, dtype=torch.float32).eval()
    state = {k: (v.float() * q[k + "_scale"] if v.dtype == torch.int8 else v.float())
             for k, v in q.items() if not k.endswith("_scale")}
    missing, unexpected = sim.load_state_dict(state, strict=False)
    assert not unexpected and all("lm_head" in k for k in missing), (missing, unexpected)
    hooks = [mod for name, mod in sim.named_modules() if f"{name}.weight_scale" in q]
    report("int8 weights only (fp32 activations)", logits_of(sim))

    def fake_quant(_mod, args):
        (x,) = args
        s = x.abs().amax(-1, keepdim=True).clamp(min=1e-10) / 127.0
        return (torch.clamp(torch.round(x / s), -127, 127) * s,)

    for mod in hooks:
        mod.register_forward_pre_hook(fake_quant)
    report(f"W8A8 simulated ({len(hooks)} Linear)", logits_of(sim))


def cmd_kernels(a: argparse.Namespace) -> None:
    import torch
    import torch.nn.functional as F
    from vllm import _custom_ops as ops

    torch.set_num_threads(1)
    torch.manual_seed(0)

    def bench(fn) -> float:
        for _ in range(3):
            fn()
        ts = []
        for _ in range(a.reps):
            t = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t)
        return statistics.median(ts) * 1e6

    env = {k: os.environ[k] for k in ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA") if k in os.environ}
    print(f"one thread; env {env or 'native'}; median of {a.reps}; microseconds per call")
    print("| shape (N x K) | rows | int8 w8a8 (quant + mm) | of which quant | fp32 F.linear "
          "| bf16 F.linear | int8 out dtype |")
    print("|---|---|---|---|---|---|---|")
    rows_out = []
    for name, n, k in SHAPES:
        w = torch.randn(n, k) * 0.05
        scale = (w.abs().amax(dim=1, keepdim=True) / 127.5).to(torch.float32)
        wq = torch.clamp(torch.round(w / scale), -128, 127).to(torch.int8)
        w_bf16 = w.to(torch.bfloat16)
        for out_dtype in (torch.bfloat16, torch.float32):
            handler = ops.create_onednn_scaled_mm(wq.t(), scale, out_dtype, True, False, 32)
            for m in a.rows:
                x32 = torch.randn(m, k)
                x = x32.to(out_dtype)

                def int8_path(x=x, m=m, n=n, handler=handler):
                    x_q, x_s, x_zp = ops.onednn_scaled_int8_quant(x, None, None, True)
                    out = torch.empty((m, n), dtype=x.dtype)
                    ops.onednn_scaled_mm(handler, x_q, out, x_s, x_zp, None, None)
                    return out

                def quant_only(x=x):
                    return ops.onednn_scaled_int8_quant(x, None, None, True)

                ref = F.linear(x32, w)
                err = (int8_path().float() - ref).abs().max().item() / ref.abs().max().item()
                t_int8 = bench(int8_path)
                t_q = bench(quant_only)
                if out_dtype == torch.bfloat16:
                    xb = x32.to(torch.bfloat16)
                    t_f32 = bench(lambda x32=x32, w=w: F.linear(x32, w))
                    t_bf16 = bench(lambda xb=xb, w_bf16=w_bf16: F.linear(xb, w_bf16))
                else:
                    t_f32 = t_bf16 = float("nan")
                row = {"shape": name, "n": n, "k": k, "rows": m, "out_dtype": str(out_dtype),
                       "int8_us": t_int8, "quant_us": t_q, "fp32_us": t_f32, "bf16_us": t_bf16,
                       "int8_rel_err": err}
                rows_out.append(row)
                print(f"| {name} {n}x{k} | {m} | {t_int8:.0f} | {t_q:.0f} | {t_f32:.0f} | "
                      f"{t_bf16:.0f} | {str(out_dtype)[6:]} (rel err {err:.3f}) |", flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps({"env": env, "rows": rows_out}, indent=1))


def main(argv: list[str] | None = None, doc: str = __doc__) -> None:
    ap = argparse.ArgumentParser(description=doc,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("engine")
    e.add_argument("--model", required=True)
    e.add_argument("--dtype", default="bfloat16")
    e.add_argument("--json", required=True)
    e.add_argument("--no-speed", dest="speed", action="store_false",
                   help="greedy agreement outputs only")
    c = sub.add_parser("compare")
    c.add_argument("ref")
    c.add_argument("others", nargs="+")
    k = sub.add_parser("kernels")
    k.add_argument("--rows", type=int, nargs="+", default=[1, 16, 128])
    k.add_argument("--reps", type=int, default=50)
    k.add_argument("--json", default="")
    q = sub.add_parser("quality")
    q.add_argument("--src", required=True, help="dense model directory")
    q.add_argument("--w8a8", required=True, help="W8A8 checkpoint written from --src")
    q.add_argument("--ref", required=True, help="an engine JSON whose greedy tokens to use")
    q.add_argument("--threads", type=int, default=1)
    a = ap.parse_args(argv)
    {"engine": cmd_engine, "compare": cmd_compare, "kernels": cmd_kernels,
     "quality": cmd_quality}[a.cmd](a)

