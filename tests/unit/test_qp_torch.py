"""The torch planner decoder on a tiny random Llama: the forward pass equals transformers',
Medusa tree decoding equals plain greedy decoding (float32), prefix reuse and KV compaction
keep it so across requests, and the tree / grammar plumbing behaves."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from rufus.qp.backends import TorchBackend, create_backend
from rufus.qp.decoder.medusa_decode import Decoder, Tree, prompt_lookup
from rufus.qp.decoder.torch_llama import MedusaHeads, TorchLlama
from tests.tiny_models import TINY_VOCAB

VOCAB = TINY_VOCAB  # of the tiny model (conftest.py's ``tiny``)


def causal(start: int, n: int) -> torch.Tensor | None:
    """Attention mask for ``n`` new tokens after ``start`` cached ones (None for one)."""
    if n == 1:
        return None
    m = torch.ones(n, start + n, dtype=torch.bool)
    m[:, start:] = torch.ones(n, n, dtype=torch.bool).tril()
    return m


def test_forward_matches_transformers(tiny: tuple[Path, Path]) -> None:
    from transformers import AutoModelForCausalLM

    model_dir, _ = tiny
    ids = list(range(3, 40))
    ref = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        want = ref(torch.tensor([ids])).logits[0]
    m = TorchLlama(model_dir, "float32", 128)
    got = m.logits(m.forward(torch.tensor(ids), torch.arange(len(ids)), 0,
                             causal(0, len(ids))))
    assert torch.allclose(got, want, atol=1e-4)
    # split prefill (what prefix reuse does) gives the same logits
    m.forward(torch.tensor(ids[:10]), torch.arange(10), 0, causal(0, 10))
    rest = m.logits(m.forward(torch.tensor(ids[10:]), torch.arange(10, len(ids)), 10,
                              causal(10, len(ids) - 10)))
    assert torch.allclose(rest, want[10:], atol=1e-4)


def test_tree_structure(tiny: tuple[Path, Path]) -> None:
    t = Tree.from_paths([[0, 0], [0], [1], [0, 1], [0, 0, 0]])
    assert t.paths == [(0,), (1,), (0, 0), (0, 1), (0, 0, 0)]
    assert t.parent == [-1, 0, 0, 1, 1, 3]
    assert t.depth == [0, 1, 1, 2, 2, 3]
    assert t.max_rank == 1 and t.max_depth == 3
    with pytest.raises(ValueError, match="parent"):
        Tree.from_paths([[0, 0]])

    class Heads:  # distinct tokens per (head, rank), so the trie keeps the tree's shape
        def topk(self, hidden: torch.Tensor, k: int, heads: int = 0) -> list[list[int]]:
            return [[10 + 10 * h + r for r in range(k)] for h in range(heads)]

    d = Decoder(TorchLlama(tiny[0], "float32", 64), None, None, {1})
    d.tree, d.heads = t, Heads()  # type: ignore[assignment]
    draft = d.draft([5, 6], torch.zeros(64), None)
    assert draft.tokens == [10, 11, 20, 21, 30] and draft.depth == t.depth
    assert draft.children[1] == [3, 4]
    assert draft.mask[5].tolist() == [True, True, False, True, False, True]


def test_medusa_equals_greedy_across_requests(tiny: tuple[Path, Path]) -> None:
    model_dir, heads_dir = tiny
    m_ar = TorchLlama(model_dir, "float32", 256)
    m_md = TorchLlama(model_dir, "float32", 256)
    ar = Decoder(m_ar, None, None, eos_ids={1})
    tree = Tree.from_paths([[0], [1], [0, 0], [0, 1], [0, 0, 0]])
    md = Decoder(m_md, MedusaHeads(heads_dir, torch.float32, 3), tree, eos_ids={1})
    accepted = 0
    for prompt in ([5, 6, 7, 8, 9], [5, 6, 7, 30, 31, 32], [50, 51], [5, 6, 7, 8, 9]):
        want = [t for s in ar.generate(prompt, 60) for t in s.tokens]
        steps = list(md.generate(prompt, 60))
        got = [t for s in steps for t in s.tokens]
        assert got == want
        assert steps[-1].finish_reason in ("stop", "length")
        assert all(s.finish_reason is None for s in steps[:-1])
        accepted += sum(s.accepted for s in steps)
        # the cache holds the prompt and every token but the last: the next request reuses it
        assert md.cached == prompt + got[:-1]
    assert accepted == 0  # random heads: every draft rejected, one token per step


class OracleHeads:
    """Drafts the true greedy continuation at rank 0 (its last draft wrong every other
    step) and a wrong token at rank 1: partial acceptance along non-contiguous tree nodes,
    so the KV compaction is exercised."""

    num_heads = 3

    def __init__(self, decoder: Decoder, prompt: list[int], want: list[int]) -> None:
        self.decoder, self.prompt, self.want, self.calls = decoder, prompt, want, 0

    def topk(self, hidden: torch.Tensor, k: int, heads: int = 0) -> list[list[int]]:
        done = len(self.decoder.cached) - len(self.prompt) + 1  # tokens emitted so far
        nxt = [*self.want[done:], 0, 0, 0, 0][1:4]  # after the root token
        self.calls += 1
        if self.calls % 2:
            nxt[2] = (nxt[2] + 1) % VOCAB
        return [[t, (t + 3) % VOCAB][:k] for t in nxt]


def test_medusa_accepts_correct_drafts(tiny: tuple[Path, Path]) -> None:
    model_dir, _ = tiny
    prompt = [5, 6, 7, 8, 9]
    want = [t for s in Decoder(TorchLlama(model_dir, "float32", 256), None, None, {1})
            .generate(prompt, 40) for t in s.tokens]
    tree = Tree.from_paths([[0], [1], [0, 1], [0, 0], [0, 0, 1], [0, 0, 0]])
    md = Decoder(TorchLlama(model_dir, "float32", 256), None, None, {1})
    md.tree, md.heads = tree, OracleHeads(md, prompt, want)  # type: ignore[assignment]
    steps = list(md.generate(prompt, 40))
    assert [t for s in steps for t in s.tokens] == want
    assert sum(s.accepted for s in steps) > len(want) // 2
    assert max(len(s.tokens) for s in steps) == 4  # 3 drafts + the verified token


def test_logprobs_and_length_limit(tiny: tuple[Path, Path]) -> None:
    model_dir, _ = tiny
    d = Decoder(TorchLlama(model_dir, "float32", 64), None, None, eos_ids=set())
    steps = list(d.generate([3, 4, 5], 7, logprobs=3))
    toks = [t for s in steps for t in s.tokens]
    assert len(toks) == 7 and steps[-1].finish_reason == "length"
    for s in steps:
        assert s.logprobs is not None
        for tok, pos in zip(s.tokens, s.logprobs, strict=True):
            assert pos[tok][1] == 1  # greedy: the chosen token has rank 1
            assert len(pos) >= 3
    with pytest.raises(ValueError, match="exceeds"):
        list(d.generate(list(range(60)), 10))


def test_grammar_constrains_choice(tiny: tuple[Path, Path]) -> None:
    """A real xgrammar grammar over a toy vocabulary: the decoder emits exactly what the
    grammar allows, picking the model's preferred token where it has a choice, and stops
    when the grammar is complete (the certain stop token costs no forward pass), in plain
    decoding, Medusa, and Medusa with grammar-forced and prompt-lookup drafts alike."""
    import xgrammar as xgr

    from rufus.qp.decoder.grammar import Grammar

    vocab = ["<eos>"] + [chr(ord("a") + i) for i in range(26)] + [f"w{i}" for i in range(69)]
    info = xgr.TokenizerInfo(vocab, stop_token_ids=[0])
    compiled = xgr.GrammarCompiler(info).compile_grammar('root ::= "abc" [a-z] [a-z] "xyz"')

    def encode(text: str) -> list[int]:
        return [vocab.index(c) for c in text]

    model_dir, heads_dir = tiny
    outs = []
    for heads, tree, drafts in (
            (None, None, 0),
            (MedusaHeads(heads_dir, torch.float32, 3), Tree.from_paths([[0], [1], [0, 0]]), 0),
            (MedusaHeads(heads_dir, torch.float32, 3), Tree.from_paths([[0], [1], [0, 0]]), 8)):
        d = Decoder(TorchLlama(model_dir, "float32", 64), heads, tree, eos_ids={0},
                    grammar_drafts=drafts, lookup_drafts=drafts)
        steps = list(d.generate([3, 4, 5], 20, Grammar(compiled, VOCAB, encode)))
        toks = [t for s in steps for t in s.tokens]
        assert toks[:3] == [1, 2, 3] and 1 <= toks[3] <= 26 and 1 <= toks[4] <= 26
        assert toks[5:] == [24, 25, 26] and steps[-1].finish_reason == "stop"
        if drafts:  # "abc" forced (drafted after the first pick), then "yz" after the "x"
            assert len(steps) <= 4 and sum(s.accepted for s in steps) >= 4
        outs.append(toks)
    assert outs[0] == outs[1] == outs[2]


def test_prompt_lookup_drafts(tiny: tuple[Path, Path]) -> None:
    """Prompt-lookup drafts copy what followed the last occurrence of the emitted suffix;
    with them the output is still exactly plain greedy decoding (float32)."""
    model_dir, _ = tiny
    d = Decoder(TorchLlama(model_dir, "float32", 256), None, None, {1}, lookup_drafts=4)
    assert prompt_lookup([7, 8, 9, 5, 7, 8], 4) == [9, 5, 7, 8]  # "7 8" seen before
    assert prompt_lookup([7, 8, 9, 5, 6], 4) == []
    assert prompt_lookup([7, 8, 9, 8], 2) == [9, 8]  # 1-token suffix, latest occurrence
    plain = Decoder(TorchLlama(model_dir, "float32", 256), None, None, {1})
    for prompt in ([5, 6, 7, 8, 9, 5, 6, 7, 8, 9], [11, 12, 13, 11, 12, 13, 11]):
        want = [t for s in plain.generate(prompt, 40) for t in s.tokens]
        steps = list(d.generate(prompt, 40))
        assert [t for s in steps for t in s.tokens] == want
        assert d.cached == prompt + want[:-1]


def test_torch_backends(tiny: tuple[Path, Path]) -> None:
    model_dir, heads_dir = tiny
    args = {"model": str(model_dir), "dtype": "float32", "max_model_len": 128,
            "medusa_model": str(heads_dir), "num_medusa_heads": 3,
            "medusa_tree": [[0], [0, 0]], "medusa_speculation_length": 3,
            "vllm_num_speculative_tokens": 2, "enable_prefix_caching": True}
    b = create_backend(args)  # torch_medusa is the default
    assert isinstance(b, TorchBackend) and b.name == "torch_medusa"
    assert b.engine_args(args) == {"model": str(model_dir), "dtype": "float32",
                                   "max_model_len": 128}
    assert b.tokens_per_step_max == 3
    ar = create_backend({**args, "qp_backend": "torch_autoregressive"})
    assert ar.medusa is None and ar.engine_factory() is not None
    # the extra drafts go to the speculative path only: the plain reference stays plain
    drafting = {**args, "grammar_drafts": 16, "lookup_drafts": 6, "max_draft_nodes": 24}
    assert create_backend(drafting).engine_args(drafting)["lookup_drafts"] == 6
    assert "grammar_drafts" not in ar.engine_args(drafting)
    # the copied brand changes what is decoded: the plain reference has it too
    copying = {**args, "copy_fields": ["brand"]}
    assert ar.engine_args(copying)["copy_fields"] == b.engine_args(copying)["copy_fields"]
    missing = create_backend({**args, "medusa_model": "/nonexistent"})
    assert missing.name == "torch_autoregressive"
    assert callable(b.engine_factory())  # the engine itself is exercised by the real server


def test_copy_constraint_keeps_brand_to_the_customers_words() -> None:
    """While the brand value is open only continuations of a run of the customer's words
    (or a closing quote after a whole run) are allowed; the model's preference decides among
    them; outside the value nothing changes."""
    import xgrammar as xgr

    from rufus.qp.decoder.grammar import CopyConstraint, Grammar, TokenText, copy_spans
    from rufus.qp.plan import build_messages, prompt_context

    assert copy_spans("Where's my Weber grill? Levi's.", 2) >= {
        "weber", "weber grill", "levi's", "grill levi's", "where's my"}
    assert "grill?" not in copy_spans("weber grill?")
    prompt = ("<|im_start|>system\nYou plan.<|im_end|>\n<|im_start|>user\n"
              + build_messages("any cheaper?", [{"role": "user", "content": "anker bank"}])[1][
                  "content"] + "<|im_end|>\n<|im_start|>assistant\n")
    assert "anker bank" in prompt_context(prompt) and "You plan" not in prompt_context(prompt)

    vocab = ["<eos>", '{"', "brand", '": "', '"}', 'ber"}', "we", "ber", "xy", "web", "er"]
    info = xgr.TokenizerInfo(vocab, stop_token_ids=[0])
    compiled = xgr.GrammarCompiler(info).compile_grammar(
        'root ::= "{\\"brand\\": \\"" [a-z]+ "\\"}"')
    text = TokenText.of(compiled)

    def run(copy: CopyConstraint | None, prefs: list[list[str]]) -> str:
        g = Grammar(compiled, len(vocab), copy=copy)
        out = ""
        for pref in prefs:  # each step: the tokens in the model's order of preference
            logits = torch.zeros(len(vocab))
            for rank, t in enumerate(pref):
                logits[vocab.index(t)] = 10.0 - rank
            out += vocab[g.choose(logits)]
        return out

    steps = [['{"'], ["brand"], ['": "'], ["ber", "we", "xy"], ["xy", 'ber"}', "ber"]]
    assert run(None, steps) == '{"brand": "berxy'  # unconstrained: the garble
    copy = CopyConstraint(["brand"], "a weber grill", text)
    assert run(copy, steps) == '{"brand": "weber"}'
    assert copy.allowed() is None  # the value is closed
    fresh = CopyConstraint(["brand"], "a weber grill", text)
    fresh.text = '{"brand": "'
    allowed = {vocab[i] for i in fresh.allowed() or []}
    assert {"we", "web"} <= allowed and not allowed & {"ber", "xy", 'ber"}'}


def test_torch_threads_setting() -> None:
    from rufus.qp.decoder.cores import parse_threads
    from rufus.serving.config import ConfigError

    assert parse_threads("auto") is None
    assert parse_threads(1) == 1 and parse_threads("2") == 2
    assert parse_threads(0) >= 1  # unset: every core this process may run on
    for bad in ("two", -1, True, 1.5, ["auto"]):
        with pytest.raises(ConfigError, match="torch_threads"):
            parse_threads(bad)
    with pytest.raises(ConfigError, match="torch_threads"):
        create_backend({"model": "m", "torch_threads": "many"}).engine_args(
            {"model": "m", "torch_threads": "many"})
    for bad in (0, "4", True, 65):
        with pytest.raises(ConfigError, match="torch_max_batch"):
            create_backend({"model": "m"}).engine_args({"model": "m", "torch_max_batch": bad})


class Ticks:
    """A fake /proc: the clock, the host's busy ticks and this process's own, set by hand."""

    def __init__(self) -> None:
        self.t, self.busy, self.own = 0.0, 0, 0


def test_core_watch_counts_only_other_processes() -> None:
    from rufus.qp.decoder.cores import CoreWatch

    f = Ticks()
    w = CoreWatch(2, {0, 1}, busy=lambda: f.busy, own=lambda: f.own, clock=lambda: f.t,
                  hz=100, start=False)
    assert w.threads() == 2  # nothing known yet: both cores
    for _ in range(4):  # this process alone keeps both cores busy: still both
        f.t += 0.05
        f.busy += 10
        f.own += 10
        w.sample()
    assert w.others() == 0 and w.threads() == 2
    for _ in range(4):  # another process takes a core (vLLM's worker serving): one thread
        f.t += 0.05
        f.busy += 10
        f.own += 5
        w.sample()
    assert abs(w.others() - 1.0) < 1e-9 and w.threads() == 1
    for _ in range(4):  # a light neighbour (under a quarter core) leaves the core to us
        f.t += 0.05
        f.busy += 1
        w.sample()
    assert w.threads() == 2
    assert CoreWatch(4, {0, 1}, busy=lambda: 0, start=False).max_threads == 2


def test_core_watch_falls_back_to_one_thread_when_proc_is_unreadable() -> None:
    from rufus.qp.decoder.cores import CoreWatch

    def unreadable() -> int:
        raise OSError("no /proc/stat")

    w = CoreWatch(2, {0, 1}, busy=unreadable)
    assert w.broken and w.threads() == 1
    w.close()


def test_core_watch_reads_this_hosts_proc() -> None:
    import os

    from rufus.qp.decoder.cores import read_busy, read_own

    if not os.path.exists("/proc/stat"):
        pytest.skip("Linux /proc only")
    cpus = os.sched_getaffinity(0)
    assert read_busy(cpus) > 0 and read_own() >= 0


def test_torch_engine_auto_threads_follow_idle_cores(tiny: tuple[Path, Path]) -> None:
    """torch_threads "auto": the team is re-sized before passes, and the output does not
    depend on it (the same greedy tokens as a fixed single thread)."""
    import asyncio

    from vllm.sampling_params import RequestOutputKind, SamplingParams

    from rufus.qp.decoder.torch_engine import TorchPlannerEngine

    model_dir, heads_dir = tiny
    with_tokenizer(model_dir)
    base = {"model": str(model_dir), "dtype": "float32", "max_model_len": 128}
    prompt = {"prompt_token_ids": [5, 9, 2, 7, 11, 3]}

    async def run(eng: TorchPlannerEngine) -> list[int]:
        sp = SamplingParams(max_tokens=24, temperature=0,
                            output_kind=RequestOutputKind.FINAL_ONLY)
        out = [o async for o in eng.generate(prompt, sp, "r1")]
        return list(out[-1].outputs[0].token_ids)

    fixed = TorchPlannerEngine({**base, "torch_threads": 1}, tree_paths=[[0], [0, 0]],
                               medusa_dir=str(heads_dir), num_heads=3)
    auto = TorchPlannerEngine({**base, "torch_threads": "auto"}, tree_paths=[[0], [0, 0]],
                              medusa_dir=str(heads_dir), num_heads=3)
    try:
        assert fixed._cores is None and auto._cores is not None
        sizes: list[int] = []
        auto._set_threads = sizes.append
        wanted = iter([2, 2, 1] * 20)
        auto._cores.threads = lambda: next(wanted)
        auto._threads = 1
        assert asyncio.run(run(auto)) == asyncio.run(run(fixed))
        assert sizes[:2] == [2, 1]  # changed only when the idle-core count did
    finally:
        fixed.shutdown()
        auto.shutdown()


def with_tokenizer(model_dir: Path) -> None:
    """The engine loads a tokenizer from the model directory; any will do for token ids."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    if not (model_dir / "tokenizer.json").exists():
        tk = Tokenizer(models.WordLevel({f"t{i}": i for i in range(VOCAB)}, unk_token="t0"))
        PreTrainedTokenizerFast(tokenizer_object=tk, eos_token="t1").save_pretrained(model_dir)


def test_step_packs_several_sequences_into_one_pass(tiny: tuple[Path, Path]) -> None:
    """Decoder.step with several runs (own cache regions, Medusa drafts, joining at different
    passes) emits exactly what each sequence decodes alone (float32)."""
    model_dir, heads_dir = tiny
    heads = MedusaHeads(heads_dir, torch.float32, 3)
    tree = Tree.from_paths([[0], [1], [0, 0], [0, 0, 0]])
    prompts = [[5, 9, 2, 7, 11, 3], [4, 4, 8], [5, 9, 2, 6, 6, 6, 6, 1, 30], [17]]
    alone = Decoder(TorchLlama(model_dir, "float32", 128), heads, tree, {1}, lookup_drafts=3)
    want = [[t for s in alone.generate(p, 30) for t in s.tokens] for p in prompts]
    d = Decoder(TorchLlama(model_dir, "float32", 128, slots=3), heads, tree, {1},
                lookup_drafts=3)
    got: dict[int, list[int]] = {}
    runs = {i: d.start(prompts[i], 30, slot=i) for i in range(3)}
    out = {i: [] for i in range(len(prompts))}
    waiting = [3]
    while runs:
        ids = list(runs)
        for i, st in zip(ids, d.step([runs[i] for i in ids]), strict=True):
            out[i] += st.tokens
            if st.finish_reason is not None:
                slot = runs.pop(i).slot
                got[i] = out[i]
                if waiting:  # the queued sequence takes the freed region at the next pass
                    j = waiting.pop()
                    runs[j] = d.start(prompts[j], 30, slot=d.best_slot(prompts[j], [slot]))
    assert [got[i] for i in range(len(prompts))] == want
    # a region keeps its last sequence's KV: the same prompt again is sent back to it
    for slot in range(3):
        p = next(p for p in prompts if d.slot_cached[slot][:len(p)] == p)
        assert d.best_slot([*p, 1], [0, 1, 2]) == slot


def test_torch_engine_batches_queued_plans(tiny: tuple[Path, Path]) -> None:
    """torch_max_batch 3: five concurrent requests (one aborted early) come back exactly as
    when sent one at a time."""
    import asyncio

    from vllm.sampling_params import RequestOutputKind, SamplingParams

    from rufus.qp.decoder.torch_engine import TorchPlannerEngine

    model_dir, heads_dir = tiny
    with_tokenizer(model_dir)
    eng = TorchPlannerEngine({"model": str(model_dir), "dtype": "float32",
                              "max_model_len": 128, "torch_threads": 1, "torch_max_batch": 3},
                             tree_paths=[[0], [0, 0]], medusa_dir=str(heads_dir), num_heads=3)
    prompts = [[5, 9, 2, 7, 11, 3], [4, 4, 8], [5, 9, 2, 6, 6, 6, 6, 1, 30], [17], [3, 3, 3]]

    async def one(i: int, abort_after: int = 0) -> list[int]:
        sp = SamplingParams(max_tokens=24, temperature=0, output_kind=RequestOutputKind.DELTA)
        ids: list[int] = []
        async for o in eng.generate({"prompt_token_ids": prompts[i]}, sp, f"r{i}"):
            ids += o.outputs[0].token_ids
            if abort_after and len(ids) >= abort_after:
                await eng.abort(f"r{i}")
        return ids

    async def together() -> list[list[int]]:
        return list(await asyncio.gather(*(one(i, 2 if i == 1 else 0)
                                           for i in range(len(prompts)))))

    try:
        alone = [asyncio.run(one(i)) for i in range(len(prompts))]
        both = asyncio.run(together())
        assert [b for i, b in enumerate(both) if i != 1] == [a for i, a in enumerate(alone)
                                                             if i != 1]
        assert both[1] == alone[1][:len(both[1])]  # aborted: a prefix, then it stopped
        assert not eng.errored and not eng._pending
    finally:
        eng.shutdown()


def test_fp32_linear_packs_few_row_passes_and_keeps_one_row_on_f_linear(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """fp32 (the choice where bf16 is emulated): a pass of several rows goes through oneDNN's
    pre-packed matmul and gives F.linear's values; one row is F.linear itself (bit-equal);
    RUFUS_LAB_OFF=fp32_packed keeps F.linear for every call."""
    import torch.nn.functional as F

    from rufus.qp.decoder.torch_llama import _packed_linear

    torch.manual_seed(0)
    w = torch.randn(96, 64)
    one, many = torch.randn(1, 64), torch.randn(7, 64)
    lin = _packed_linear(w)
    assert torch.equal(lin(one), F.linear(one, w))
    assert torch.allclose(lin(many), F.linear(many, w), atol=1e-4)
    assert lin(many).shape == (7, 96)
    monkeypatch.setenv("RUFUS_LAB_OFF", "fp32_packed")
    plain = _packed_linear(w)
    assert torch.equal(plain(many), F.linear(many, w))
    monkeypatch.setenv("RUFUS_LAB_OFF", "yes")
    from rufus.env import EnvError
    with pytest.raises(EnvError, match="RUFUS_LAB_OFF"):
        _packed_linear(w)


def test_plan_history_proposes_only_the_usual_follower() -> None:
    """Earlier plans' followers are proposed once seen ``min_count`` times and at least
    ``min_share`` of what followed there; a question shape seen often enough has its own."""
    from rufus.qp.decoder.medusa_decode import PlanHistory

    h = PlanHistory(min_share=0.5)
    h.add([1, 2, 3, 4, 5])
    assert h.predict([9, 1, 2, 3]) is None  # seen once
    h.add([1, 2, 3, 4, 6])
    assert h.predict([9, 1, 2, 3]) == 4 and h.predict([2, 3, 4]) is None  # 5 / 6: a tie
    h.add([1, 2, 3, 7], shape=2)
    h.add([1, 2, 3, 7], shape=2)
    assert h.predict([1, 2, 3], shape=2) == 7  # short questions' own follower
    h.add([1, 2, 3, 7], shape=2)
    assert h.predict([1, 2, 3]) == 7 == h.predict([1, 2, 3], shape=5)  # 3 of 5; no shape 5
    h.min_share = PlanHistory().min_share
    assert h.predict([1, 2, 3]) is None  # 3 of 5 is not the default's 80%
    h.add([9, 1, 2, 3, 5], seed=True)
    h.add([8, 1, 2, 3, 5], seed=True)
    assert h.predict([2, 3, 5]) is None and h.predict([1, 2, 3, 5], shape=4) is None
    h.add([7, 2, 3, 5, 6], seed=True)
    h.add([7, 2, 3, 5, 6], seed=True)
    assert h.predict([2, 3, 5]) == 6  # only the seed has seen it: the seed answers
    spread = PlanHistory()
    for t in (4, 5, 6, 4, 5, 6):
        spread.add([1, 2, 3, t])
    assert spread.predict([1, 2, 3]) is None  # a customer's words: no usual follower
    assert not spread.rare([1, 2, 3], 4) and spread.rare([9, 9, 9], 4) is False  # unseen
    assert PlanHistory().rare([7, 7, 7], 4) is False
    h2 = PlanHistory()
    for t in (5, 5, 5, 5, 5, 5, 5, 5, 5, 4):
        h2.add([1, 2, 3, t])
    assert h2.rare([1, 2, 3], 4) and not h2.rare([1, 2, 3], 5)  # 1 of 10: the model's is 5
    small = PlanHistory(max_keys=3)
    for i in range(5):
        small.add([i, i + 1, i + 2, i + 3, i + 4])
    assert len(small.next_counts) <= 3 + 2  # bounded (cleared, then refilled)


def test_word_drafts_continue_an_open_string_from_the_question() -> None:
    """Matched on text, so a word split differently in the question still continues."""
    from rufus.qp.decoder.grammar import TokenText, WordDrafts

    vocab = ['{"q": "', "es", "presso", " es", " maker", " too", '"', "x"]
    text = TokenText(vocab)

    def encode(s: str) -> list[int]:
        out, i = [], 0
        while i < len(s):
            t = max((t for t in range(len(vocab)) if s.startswith(vocab[t], i)),
                    key=lambda t: len(vocab[t]))
            out.append(t)
            i += len(vocab[t])
        return out

    w = WordDrafts("An espresso maker, too?", text, encode)
    assert w.shape == 4
    assert w.draft(4) == []  # no string open
    for t in (0, 1):  # {"q": "es
        w.advance(t)
    assert w.draft(4) == [2, 4]  # "presso maker", stopped at the comma
    assert w.draft(1) == [2]
    assert w.draft(4, extra="presso maker") == []  # the question goes on after a comma
    w.advance(6)  # the string closed
    assert w.draft(4) == []
    # two words start alike: the one not yet in the plan continues
    chars = TokenText([chr(c) for c in range(32, 127)])
    both = WordDrafts("roomba vs roborock", chars, lambda t: [ord(c) - 32 for c in t])
    both.text = '["roomba", "ro'
    assert "".join(chr(t + 32) for t in both.draft(6)) == "borock"


def test_word_drafts_plan_pieces_from_the_question() -> None:
    """A value's first letter continues a word of the question; a phrase's end drafts the
    string's close (the next compared product's query after ``vs``), a price phrase is not
    query words but ``max_price``, a brand is the first query's first word, and a
    follow-up's copied words stop at the history's next turn."""
    from rufus.qp.decoder.grammar import TokenText, WordDrafts

    chars = TokenText([chr(c) for c in range(32, 127)])

    def words(context: str, text: str) -> WordDrafts:
        w = WordDrafts(context, chars, lambda t: [ord(c) - 32 for c in t])
        w.text = text
        return w

    def drafted(w: WordDrafts, extra: str = "", limit: int = 40) -> str:
        return "".join(chr(t + 32) for t in w.draft(limit, extra))

    q = '{"search_queries": ["'
    w = words("garmin gps watch", q + "g")
    assert drafted(w) == "armin gps watch"  # one letter: the word it starts
    assert w.closer() is None and w.closer("armin gps") is None
    assert w.closer("armin gps watch") == '"],'  # the question ends: so does the query
    w = words("Wireless earbuds under $50", q + "wire")
    assert drafted(w) == "less earbuds" and w.closer("less earbuds") == '"],'
    assert w.price == "50" and w.number() is None
    w.text = q + 'wireless earbuds"], "filters":'
    assert w.hint() == ' {"max_price":' and w.hint(' {"') == 'max_price":'
    assert w.number(' {"max_price":') == " 50" and w.number(' {"max_price": ') == "50"
    assert words("wireless earbuds", q).hint('x"], "filters":') is None  # no price named
    w = words("roomba vs roborock vs eufy", q + "roomba")
    assert w.closer() == '",'  # a compared product's query ends at "vs"
    w.text += '", "'
    assert drafted(w) == "roborock" and w.closer("roborock") == '",'
    assert drafted(w, 'roborock", "') == "eufy" and w.closer('roborock", "eufy') == '"],'
    brand = q + 'garmin gps watch"], "filters": {"brand": "'
    w = words("garmin gps watch", brand)
    assert drafted(w) == "garmin" and w.closer("garmin") == '"'
    assert drafted(w, "gar") == "min" and w.closer("gar") is None
    assert words("sony tv", brand).draft(8) == []  # not a word of the question
    w = words("previous conversation: user: a standing desk for my office assistant: these "
              "desks are great question: cheaper ones?", q + "standing desk")
    assert drafted(w) == " for my office"  # not into the assistant's turn
    assert w.closer(" for my office") == '"],'


def test_skeleton_drafts_and_forced_rows_keep_greedy_output(tiny: tuple[Path, Path]) -> None:
    """With the plan skeleton (earlier outputs' followers, the grammar's forced text), the
    allowed-token logits of forced rows (int8: bit for bit through the kernel) and the
    certain end emitted without a pass, the output is plain greedy decoding's, in fewer
    passes once the skeleton is learnt."""
    import xgrammar as xgr

    from rufus.machine import int8_kernel
    from rufus.qp.decoder.grammar import Grammar

    vocab = ["<eos>"] + [chr(ord("a") + i) for i in range(26)] + [f"w{i}" for i in range(69)]
    info = xgr.TokenizerInfo(vocab, stop_token_ids=[0])
    compiled = xgr.GrammarCompiler(info).compile_grammar(
        'root ::= "abc" [a-z] [a-z] "xyz" [a-z] "k"')

    def encode(text: str) -> list[int]:
        return [vocab.index(c) for c in text]

    model_dir, _ = tiny
    for dtype in ("float32", "int8"):
        if dtype == "int8" and int8_kernel.load() is None:
            continue
        plain = Decoder(TorchLlama(model_dir, dtype, 64), None, None, eos_ids={0})
        served = Decoder(TorchLlama(model_dir, dtype, 64), None, None, eos_ids={0},
                         grammar_drafts=8, history_drafts=8)
        seen: list[dict[int, list[int]]] = []
        draft = served.draft

        def logged(*a: object, _draft=draft, _seen=seen, **k: object) -> object:
            d = _draft(*a, **k)
            _seen.append(d.allowed)
            # never the stop token nor the plan's last "k": their rows predict nothing
            assert 0 not in d.tokens and vocab.index("k") not in d.tokens
            return d

        served.draft = logged  # type: ignore[method-assign]
        if dtype == "int8":
            assert served.model.logits_some is not None
        for prompt in ([3, 4, 5], [3, 4, 5], [3, 4, 5], [6, 7]):
            want = [t for s in plain.generate(prompt, 20, Grammar(compiled, VOCAB, encode))
                    for t in s.tokens]
            seen.clear()
            steps = list(served.generate(prompt, 20, Grammar(compiled, VOCAB, encode)))
            assert [t for s in steps for t in s.tokens] == want, (dtype, prompt)
            assert steps[-1].finish_reason == "stop"
            assert seen[0][0] == [1]  # the root's allowed set: "a", forced
        # third time the same prompt: the skeleton drafts both free letters, and the last
        # letter's "k" is certain: two passes
        assert len(steps) <= 2
    plain_steps = list(plain.generate([3, 4, 5], 20, Grammar(compiled, VOCAB, encode)))
    assert len(plain_steps) == 10  # one per token (the certain stop token needs none)
