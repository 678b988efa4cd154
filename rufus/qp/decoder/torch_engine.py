"""The torch Medusa decoder behind the small slice of vLLM's ``AsyncLLM`` that rufus uses.

:class:`rufus.serving.engine.EngineHost` and :func:`rufus.serving.generation.run_generate` drive an engine
through ``generate(prompt, sampling_params, request_id)`` (an async iterator of
``RequestOutput``-shaped objects), ``abort``, ``tokenizer``, ``model_config.max_model_len``,
``errored`` and ``shutdown``. :class:`TorchPlannerEngine` provides exactly that, so the
planner keeps rufus_llm's admission control, cancellation, metrics and error mapping while
decoding runs on :mod:`rufus.qp.decoder.medusa_decode` under the constraints of
:mod:`rufus.qp.decoder.grammar`.

Requests are decoded on one worker thread, so the asyncio loop stays free; each decoding
step is streamed back as a delta. One request alone is decoded at batch size 1 (the latency
the SLA is about). When plans queue, up to ``torch_max_batch`` of them share each forward
pass (continuous batching: a request joins at the next pass and leaves when done), each in
its own KV-cache region; the rest wait in FIFO order.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import json
import logging
import os
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from rufus.qp.plan import SEED_FILE
from rufus.qp.settings import DecoderKnobs
from rufus.serving.engine_api import Completion, Logprob, Output

log = logging.getLogger("rufus.qp.torch")

__all__ = ["Completion", "Logprob", "Output", "TorchPlannerEngine"]

class DecoderCrashed(RuntimeError):
    """The decoding thread failed outside any one request's input: the engine is dead."""


@dataclass
class _Request:
    request_id: str
    prompt: list[int]
    max_tokens: int
    logprobs: int
    schema: str | None
    delta: bool
    queue: asyncio.Queue[Any] = field(default_factory=asyncio.Queue)
    aborted: bool = False
    loop: asyncio.AbstractEventLoop | None = None
    # decoding state, touched by the decoding thread only
    run: Any = None
    slot: int = 0
    ids: list[int] = field(default_factory=list)
    lps: list[dict[int, Logprob]] = field(default_factory=list)
    cum: float = 0.0
    sent_text: str = ""
    sent_n: int = 0
    steps: int = 0
    drafted: int = 0
    accepted: int = 0
    t_start: float = 0.0

    def put(self, item: Any) -> None:
        """Hand an output, an error or the end (None) to the request's asyncio side."""
        assert self.loop is not None
        self.loop.call_soon_threadsafe(self.queue.put_nowait, item)

    def end(self, error: BaseException | None = None) -> None:
        """The request is over (with ``error``, if given)."""
        if error is not None:
            self.put(error)
        self.put(None)


class TorchPlannerEngine:
    """Greedy planner engine, plain or Medusa-tree decoding in PyTorch: batch 1 alone, up
    to ``torch_max_batch`` plans per forward pass when they queue."""

    def __init__(self, args: dict[str, Any], *, tree_paths: list[list[int]] | None,
                 medusa_dir: str | None, num_heads: int,
                 on_stats: Callable[[int, int, int], None] | None = None,
                 knobs: DecoderKnobs | None = None) -> None:
        from transformers import AutoTokenizer

        # the planner's model.json keys, typed (read once at load by rufus/qp/backends.py;
        # from ``args`` when the engine is built directly)
        self.knobs = DecoderKnobs.from_model_json(args) if knobs is None else knobs
        self.max_len = int(args.get("max_model_len", 1024))
        self.model_config = SimpleNamespace(max_model_len=self.max_len)
        self.output_processor = self
        self.on_stats = on_stats
        # Set once decoding itself fails (not a request's bad input): the decoder's state
        # (KV cache, thread) can no longer be trusted. EngineHost polls it and replaces us.
        self.errored = False
        self.dead_error: BaseException | None = None
        self._grammars: dict[str, Any] = {}
        self._xgr_compiler: Any = None
        self._encode: Callable[[str], list[int]] | None = None
        # string fields copied from the customer's words (constraints.CopyConstraint)
        self._copy_fields = self.knobs.copy_fields
        self._token_text: Any = None
        self._pending: dict[str, _Request] = {}
        # plans decoded together in one pass when they queue (1: strictly one at a time)
        self._max_batch = self.knobs.torch_max_batch
        self._init_queue()
        # Every torch op runs on this one thread, loading included: each thread that enters
        # an OpenMP parallel region gets its own thread team, and two teams on 2 cores made
        # each forward pass markedly slower (docs/benchmarks-history.md, "Query planner").
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="qp-decode")
        t0 = time.monotonic()
        model_dir = str(args["model"])
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        eos = {int(self.tokenizer.eos_token_id)}
        gen_cfg = Path(model_dir) / "generation_config.json"
        if gen_cfg.exists():
            e = json.loads(gen_cfg.read_text(encoding="utf-8")).get("eos_token_id")
            eos |= set(e if isinstance(e, list) else [e] if e is not None else [])
        # torch_threads "auto": a CoreWatch re-decides the team size before every pass
        self._cores: Any = None
        self._threads = 1
        self._set_threads: Callable[[int], None] = lambda n: None
        self.decoder = self._pool.submit(
            self._load, args, tree_paths, medusa_dir, num_heads, eos).result()
        log.info("torch planner engine: %s, %s, %s, %s, up to %d plans per pass, ready in "
                 "%.1f s", model_dir, args.get("dtype"),
                 f"Medusa tree of {self.decoder.tree.size - 1} nodes" if self.decoder.tree
                 else "autoregressive",
                 f"1-{self._cores.max_threads} threads (auto: one per idle core)"
                 if self._cores is not None else f"{self._threads} threads",
                 self._max_batch, time.monotonic() - t0)

    def _load(self, args: dict[str, Any], tree_paths: list[list[int]] | None,
              medusa_dir: str | None, num_heads: int, eos: set[int]) -> Any:
        """On the decoding thread: thread count, weights, heads, warm-up passes."""
        import torch

        from rufus.qp.decoder.cores import CoreWatch, parse_threads
        from rufus.qp.decoder.medusa_decode import Decoder, Tree
        from rufus.qp.decoder.torch_llama import MedusaHeads, TorchLlama

        # A fixed team stalls at every barrier when a busy neighbour (the answer model's vLLM
        # worker) holds one of its cores; "auto" (shipped) sizes it to the idle cores
        # (rufus/qp/decoder/cores.py; docs/benchmarks-history.md, "Round 4").
        knobs = self.knobs
        fixed = parse_threads(knobs.torch_threads)
        if fixed is None:
            self._cores = CoreWatch(len(os.sched_getaffinity(0)))
        self._set_threads = torch.set_num_threads
        counts = range(self._cores.max_threads, 0, -1) if self._cores else [fixed or 1]
        model = TorchLlama(str(args["model"]), str(args.get("dtype", "bfloat16")), self.max_len,
                           slots=self._max_batch, a8=knobs.int8_activations)
        heads = tree = None
        if tree_paths is not None and medusa_dir:
            heads = MedusaHeads(medusa_dir, model.weights, num_heads)  # int8 too
            tree = Tree.from_paths(tree_paths)
        decoder = Decoder(model, heads, tree, eos, knobs.grammar_drafts, knobs.lookup_drafts,
                          knobs.max_draft_nodes, knobs.batch_draft_nodes, knobs.history_drafts)
        if decoder.history_drafts and medusa_dir:
            n_seed = decoder.history.seed(self.tokenizer, Path(medusa_dir) / SEED_FILE)
            log.info("plan skeleton: %d training plans counted from %s", n_seed,
                     Path(medusa_dir) / SEED_FILE)
        for n in counts:  # warm-up: allocations, kernels, each team size's threads
            torch.set_num_threads(n)
            list(decoder.generate([int(next(iter(eos)))] * 4, 2))
            decoder.cached = []
        if self._max_batch > 1:  # the packed pass's kernels too
            runs = [decoder.start([int(next(iter(eos)))] * 4, 2, slot=i) for i in range(2)]
            decoder.step(runs)
            decoder.slot_cached = [[] for _ in range(self._max_batch)]
        self._threads = n
        return decoder

    def _pace(self) -> None:
        """Auto threads, on the decoding thread before each pass: one per idle core."""
        if self._cores is not None:
            n = self._cores.threads()
            if n != self._threads:
                self._set_threads(n)
                self._threads = n

    # --------------------------------------------------------------- AsyncLLM surface
    async def generate(self, prompt: Any, params: Any, request_id: str) -> AsyncIterator[Output]:
        from vllm.sampling_params import RequestOutputKind

        so = getattr(params, "structured_outputs", None)
        req = _Request(
            request_id=request_id,
            prompt=list(prompt["prompt_token_ids"]),
            max_tokens=int(params.max_tokens or 16),
            logprobs=int(params.logprobs or 0),
            schema=getattr(so, "json", None) if so is not None else None,
            delta=params.output_kind == RequestOutputKind.DELTA,
        )
        if params.temperature not in (0, 0.0, None):
            raise ValueError("the torch planner engine decodes greedily (temperature 0)")
        if self.errored:
            raise DecoderCrashed(f"torch planner engine is dead: {self.dead_error}")
        req.loop = asyncio.get_running_loop()
        self._pending[request_id] = req
        self._submit(req)
        try:
            while True:
                item = await req.queue.get()
                if isinstance(item, BaseException):
                    raise item
                if item is None:
                    break
                yield item
        finally:
            req.aborted = True
            self._pending.pop(request_id, None)

    async def abort(self, request_id: str) -> None:
        req = self._pending.get(request_id)
        if req is not None:
            req.aborted = True
            req.queue.put_nowait(None)

    def get_num_unfinished_requests(self) -> int:
        return len(self._pending)

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        if self._cores is not None:
            self._cores.close()

    def warm_grammar(self, schema: Any) -> None:
        """Compile a JSON-schema grammar now (~0.3 s) rather than on the first request."""
        self._pool.submit(self._grammar, schema).result()

    # --------------------------------------------------------------- decoding thread
    def _grammar(self, schema: Any) -> Any:
        import xgrammar as xgr

        from rufus.qp.decoder.grammar import (
            Grammar,
            TokenText,
            compile_grammar,
            draft_encoder,
        )

        # keep the schema's property order: xgrammar emits properties in that order, and the
        # planner (and its Medusa heads) were trained on it
        key = schema if isinstance(schema, str) else json.dumps(schema)
        if key not in self._grammars:
            if self._xgr_compiler is None:
                info = xgr.TokenizerInfo.from_huggingface(
                    self.tokenizer, vocab_size=self.decoder.model.vocab_size)
                self._xgr_compiler = xgr.GrammarCompiler(info)
            t0 = time.monotonic()
            self._grammars[key] = compile_grammar(self._xgr_compiler, key)
            log.info("compiled JSON-schema grammar in %.2f s", time.monotonic() - t0)
            if self._token_text is None and (self._copy_fields or self.decoder.lookup_drafts
                                             or self.decoder.history_drafts):
                self._token_text = TokenText.of(self._grammars[key])  # at warm-up, once
        if self._encode is None:
            self._encode = draft_encoder(self.tokenizer)
        return Grammar(self._grammars[key], self.decoder.model.vocab_size, self._encode)

    # --------------------------------------------------------------- scheduling
    def _init_queue(self) -> None:
        self._queue: collections.deque[_Request] = collections.deque()
        self._lock = threading.Lock()
        self._serving = False  # a _serve loop is running or submitted

    def _submit(self, req: _Request) -> None:
        with self._lock:
            self._queue.append(req)
            if self._serving:
                return
            self._serving = True
        self._pool.submit(self._serve)

    def _serve(self) -> None:
        """The decoding thread's loop while requests exist: admit queued requests into free
        cache regions, one forward pass for all active ones, stream, retire the finished."""
        active: list[_Request] = []
        while True:
            with self._lock:
                room = self._max_batch - len(active)
                new = [self._queue.popleft() for _ in range(min(room, len(self._queue)))]
                if not active and not new:
                    self._serving = False
                    return
            for i, req in enumerate(new):
                if self._admit(req, active):
                    active.append(req)
                elif self.errored:
                    return self._fail_all(active + new[i + 1:])
            active = [r for r in active if not self._retire_if_aborted(r)]
            if not active:
                continue
            self._pace()
            try:
                steps = self.decoder.step([r.run for r in active])
            except BaseException as exc:
                log.exception("a forward pass failed in the torch planner engine (%d "
                              "requests); engine is dead", len(active))
                self._die(exc)
                for r in active:
                    r.end(exc)
                return self._fail_all([])
            still = []
            for r, st in zip(active, steps, strict=True):
                if self._emit(r, st):
                    still.append(r)
            active = still

    def _admit(self, req: _Request, active: list[_Request]) -> bool:
        """Grammar, copy constraint and cache region for a queued request. False: it ended
        here (aborted, its schema failed, or the engine is dead)."""
        if req.aborted or self.errored:
            req.end(self.dead_error if self.errored else None)
            return False
        try:
            grammar = self._grammar(req.schema) if req.schema is not None else None
            if grammar is not None and self._copy_fields:
                from rufus.qp.decoder.grammar import CopyConstraint

                grammar.copy = CopyConstraint.for_prompt(self._copy_fields, self.tokenizer,
                                                         req.prompt, self._token_text)
            if grammar is not None and self._token_text is not None and self._encode \
                    and (self.decoder.lookup_drafts or self.decoder.history_drafts):
                from rufus.qp.decoder.grammar import WordDrafts

                grammar.words = WordDrafts.for_prompt(self.tokenizer, req.prompt,
                                                      self._token_text, self._encode)
        except BaseException as exc:  # a request's schema: that request fails, nothing else
            log.exception("request %s: grammar failed in the torch planner engine",
                          req.request_id)
            req.end(exc)
            return False
        try:
            used = {r.slot for r in active}
            req.slot = self.decoder.best_slot(
                req.prompt, [i for i in range(self._max_batch) if i not in used])
            req.run = self.decoder.start(req.prompt, req.max_tokens, grammar, req.logprobs,
                                         slot=req.slot)
        except BaseException as exc:
            log.exception("request %s failed in the torch planner engine; engine is dead",
                          req.request_id)
            self._die(exc)
            req.end(exc)
            return False
        req.t_start = time.monotonic()
        return True

    def _emit(self, req: _Request, step: Any) -> bool:
        """Stream one step of ``req``; False once it is finished (or aborted)."""
        if step.drafted:
            req.steps += 1
            req.drafted += step.drafted
            req.accepted += step.accepted
        req.ids += step.tokens
        if step.logprobs is not None:
            req.lps += [{t: Logprob(lp, rank, self.tokenizer.decode([t]))
                         for t, (lp, rank) in pos.items()} for pos in step.logprobs]
            req.cum += sum(pos[t][0] for pos, t in zip(step.logprobs, step.tokens, strict=True))
        finished = step.finish_reason is not None
        if req.delta or finished:  # final-only: detokenize once, at the end
            text = self.tokenizer.decode(req.ids, skip_special_tokens=True)
            if finished or not text.endswith("\ufffd"):  # else half a UTF-8 character
                # a delta since the last response; final-only sends everything (sent_n == 0)
                req.put(Output([Completion(text[len(req.sent_text):], req.ids[req.sent_n:],
                                           step.finish_reason,
                                           req.cum if req.logprobs else None,
                                           req.lps[req.sent_n:] if req.logprobs else None)],
                               finished, req.request_id))
                req.sent_text, req.sent_n = text, len(req.ids)
        if not finished and not req.aborted:
            return True
        log.debug("request %s: %d tokens, %d Medusa steps, %.0f ms", req.request_id,
                  len(req.ids), req.steps, (time.monotonic() - req.t_start) * 1e3)
        if self.on_stats is not None and req.steps:
            # once per request: each metric update is an IPC round trip to the server
            self.on_stats(req.steps, req.drafted, req.accepted)
        req.end()
        return False

    def _retire_if_aborted(self, req: _Request) -> bool:
        if req.aborted:
            req.end()
        return req.aborted

    def _die(self, exc: BaseException) -> None:
        """Decoding itself failed: the decoder's state can no longer be trusted."""
        self.dead_error = exc if isinstance(exc, DecoderCrashed) else DecoderCrashed(
            f"{type(exc).__name__}: {exc}")
        self.errored = True

    def _fail_all(self, active: list[_Request]) -> None:
        """The engine is dead: every other request (active or queued) ends with its error."""
        with self._lock:
            rest = [*active, *self._queue]
            self._queue.clear()
            self._serving = False
        for r in rest:
            r.aborted = True
            r.end(self.dead_error)
