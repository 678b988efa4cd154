"""The torch Medusa decoder behind the small slice of vLLM's ``AsyncLLM`` that rufus uses.

:class:`rufus.serving.engine.EngineHost` and :func:`rufus.serving.generation.run_generate` drive an engine
through ``generate(prompt, sampling_params, request_id)`` (an async iterator of
``RequestOutput``-shaped objects), ``abort``, ``tokenizer``, ``model_config.max_model_len``,
``errored`` and ``shutdown``. :class:`TorchPlannerEngine` provides exactly that, so the
planner keeps rufus_llm's admission control, cancellation, metrics and error mapping while
decoding runs on :mod:`rufus.qp.decoder.medusa_decode`.

Requests are decoded one at a time (batch size 1, FIFO) on one worker thread, so the asyncio
loop stays free; each decoding step is streamed back as a delta.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
import os
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from rufus.serving.engine_api import Completion, Logprob, Output

log = logging.getLogger("rufus.qp.torch")

__all__ = ["Completion", "Logprob", "Output", "TorchPlannerEngine"]

# Test-only fault injection (environment of the server, never a request): the N-th request
# decoded in this process fails as if the decoder had crashed, once. Used by the planner
# engine-death test; unset in every shipped configuration.
_FAULT_AT = int(os.environ.get("RUFUS_QP_TORCH_FAULT_AT", "0") or 0)
_decoded = 0


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


class TorchPlannerEngine:
    """Batch-1 greedy planner engine: plain or Medusa-tree decoding in PyTorch."""

    def __init__(self, args: dict[str, Any], *, tree_paths: list[list[int]] | None,
                 medusa_dir: str | None, num_heads: int,
                 on_stats: Callable[[int, int, int], None] | None = None) -> None:
        from transformers import AutoTokenizer

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
        # string fields copied from the customer's words (medusa_decode.CopyConstraint)
        self._copy_fields = tuple(args.get("copy_fields") or ())
        self._token_text: Any = None
        self._pending: dict[str, _Request] = {}
        # Every torch op runs on this one thread, loading included: each thread that enters
        # an OpenMP parallel region gets its own thread team, and two teams on 2 cores made
        # each forward pass markedly slower (docs/benchmarks.md, "Query planner").
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="qp-decode")
        t0 = time.monotonic()
        model_dir = str(args["model"])
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        eos = {int(self.tokenizer.eos_token_id)}
        gen_cfg = Path(model_dir) / "generation_config.json"
        if gen_cfg.exists():
            e = json.loads(gen_cfg.read_text(encoding="utf-8")).get("eos_token_id")
            eos |= set(e if isinstance(e, list) else [e] if e is not None else [])
        self.decoder, threads = self._pool.submit(
            self._load, args, tree_paths, medusa_dir, num_heads, eos).result()
        log.info("torch planner engine: %s, %s, %s, %d threads, ready in %.1f s",
                 model_dir, args.get("dtype"),
                 f"Medusa tree of {self.decoder.tree.size - 1} nodes" if self.decoder.tree
                 else "autoregressive", threads, time.monotonic() - t0)

    def _load(self, args: dict[str, Any], tree_paths: list[list[int]] | None,
              medusa_dir: str | None, num_heads: int, eos: set[int]) -> tuple[Any, int]:
        """On the decoding thread: thread count, weights, heads, one warm-up pass."""
        import torch

        from rufus.qp.decoder.medusa_decode import MAX_DRAFT_NODES, Decoder, Tree
        from rufus.qp.decoder.torch_llama import MedusaHeads, TinyLlama

        # torch_threads unset: every core this process may run on. The shipped model.json sets 1:
        # a 2-thread OpenMP team stalls at every barrier when a busy neighbour (the answer
        # model's vLLM worker) holds the cores (docs/benchmarks.md, "Planner threads").
        threads = int(args.get("torch_threads", 0) or 0) or len(os.sched_getaffinity(0))
        torch.set_num_threads(threads)
        model = TinyLlama(str(args["model"]), str(args.get("dtype", "bfloat16")), self.max_len)
        heads = tree = None
        if tree_paths is not None and medusa_dir:
            heads = MedusaHeads(medusa_dir, model.dtype, num_heads)
            tree = Tree.from_paths(tree_paths)
        decoder = Decoder(model, heads, tree, eos, int(args.get("grammar_drafts", 0) or 0),
                          int(args.get("lookup_drafts", 0) or 0),
                          int(args.get("max_draft_nodes") or MAX_DRAFT_NODES))
        list(decoder.generate([int(next(iter(eos)))] * 4, 2))  # warm-up: allocations, kernels
        decoder.cached = []
        return decoder, threads

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
        loop = asyncio.get_running_loop()
        self._pending[request_id] = req
        fut = loop.run_in_executor(self._pool, self._decode, req, loop)
        try:
            while True:
                item = await req.queue.get()
                if isinstance(item, BaseException):
                    raise item
                if item is None:
                    break
                yield item
            await fut
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

    def warm_grammar(self, schema: Any) -> None:
        """Compile a JSON-schema grammar now (~0.3 s) rather than on the first request."""
        self._pool.submit(self._grammar, schema).result()

    # --------------------------------------------------------------- decoding thread
    def _grammar(self, schema: Any) -> Any:
        import xgrammar as xgr

        from rufus.qp.decoder.medusa_decode import (
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
            if self._copy_fields and self._token_text is None:  # at warm-up, once per engine
                self._token_text = TokenText.of(self._grammars[key])
        if self._encode is None:
            self._encode = draft_encoder(self.tokenizer)
        return Grammar(self._grammars[key], self.decoder.model.vocab_size, self._encode)

    def _decode(self, req: _Request, loop: asyncio.AbstractEventLoop) -> None:
        global _decoded
        put = loop.call_soon_threadsafe
        if req.aborted or self.errored:
            put(req.queue.put_nowait, self.dead_error if self.errored else None)
            put(req.queue.put_nowait, None)
            return
        try:
            grammar = self._grammar(req.schema) if req.schema is not None else None
            if grammar is not None and self._copy_fields:
                from rufus.qp.decoder.medusa_decode import CopyConstraint

                grammar.copy = CopyConstraint.for_prompt(self._copy_fields, self.tokenizer,
                                                         req.prompt, self._token_text)
        except BaseException as exc:  # a request's schema: that request fails, nothing else
            log.exception("request %s: grammar failed in the torch planner engine",
                          req.request_id)
            put(req.queue.put_nowait, exc)
            put(req.queue.put_nowait, None)
            return
        try:
            _decoded += 1
            if _FAULT_AT and _decoded == _FAULT_AT:
                raise DecoderCrashed(f"injected decoder fault (RUFUS_QP_TORCH_FAULT_AT="
                                     f"{_FAULT_AT})")
            all_ids: list[int] = []
            all_lps: list[dict[int, Logprob]] = []
            sent_text, sent_n = "", 0
            cum = 0.0
            steps = drafted = accepted = 0
            t_start = time.monotonic()
            for step in self.decoder.generate(req.prompt, req.max_tokens, grammar, req.logprobs,
                                              should_stop=lambda: req.aborted):
                if step.drafted:
                    steps, drafted, accepted = (steps + 1, drafted + step.drafted,
                                                accepted + step.accepted)
                all_ids += step.tokens
                if step.logprobs is not None:
                    all_lps += [{t: Logprob(lp, rank, self.tokenizer.decode([t]))
                                 for t, (lp, rank) in pos.items()} for pos in step.logprobs]
                    cum += sum(pos[t][0] for pos, t in zip(step.logprobs, step.tokens,
                                                          strict=True))
                finished = step.finish_reason is not None
                if not (req.delta or finished):
                    continue  # final-only: detokenize once, at the end
                text = self.tokenizer.decode(all_ids, skip_special_tokens=True)
                if not finished and text.endswith("\ufffd"):
                    continue  # half a UTF-8 character: wait for the rest
                # a delta since the last response; final-only sends everything (sent_n == 0)
                put(req.queue.put_nowait, Output(
                    [Completion(text[len(sent_text):], all_ids[sent_n:], step.finish_reason,
                                cum if req.logprobs else None,
                                all_lps[sent_n:] if req.logprobs else None)],
                    finished, req.request_id))
                sent_text, sent_n = text, len(all_ids)
            log.debug("request %s: %d tokens, %d Medusa steps, %.0f ms", req.request_id,
                      len(all_ids), steps, (time.monotonic() - t_start) * 1e3)
            if self.on_stats is not None and steps:
                # once per request: each metric update is an IPC round trip to the server
                self.on_stats(steps, drafted, accepted)
        except BaseException as exc:
            log.exception("request %s failed in the torch planner engine; engine is dead",
                          req.request_id)
            self.dead_error = exc if isinstance(exc, DecoderCrashed) else DecoderCrashed(
                f"{type(exc).__name__}: {exc}")
            self.errored = True
            for other in list(self._pending.values()):
                if other is not req:
                    other.aborted = True
                    put(other.queue.put_nowait, self.dead_error)
            put(req.queue.put_nowait, exc)
        finally:
            put(req.queue.put_nowait, None)
