"""Greedy decoding with Medusa tree verification (and the plain autoregressive baseline).

One step: the last emitted token (the root, not yet in the KV cache) plus the tree of
candidates proposed by the Medusa heads go through the model in one forward pass with a tree
attention mask. Walking down the tree, the model's own greedy choice at each node (masked by
the JSON-schema grammar when one is given) is emitted; while that choice is a child of the
node, the walk continues. So every emitted token is exactly the token plain greedy decoding
would pick from the same logits: the output is the autoregressive output (lossless), up to
kernels rounding differently for a different number of query rows (see rufus/qp/tooling/lossless.py).
The accepted nodes' KV entries are then compacted into consecutive cache slots.

Batch size 1, one sequence at a time: what the planner's latency SLA is about. The KV of the
previous request is kept and its longest common token prefix reused (the system prompt is
identical for every plan), like vLLM's prefix cache.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from rufus.qp.decoder.torch_llama import MedusaHeads, TinyLlama


@dataclass
class Tree:
    """Medusa candidate tree from NxDI-style paths (each a list of top-k ranks per head)."""

    paths: list[tuple[int, ...]]
    parent: list[int] = field(default_factory=list)  # node index (0 = root) of each node
    depth: list[int] = field(default_factory=list)
    children: list[list[int]] = field(default_factory=list)
    max_rank: int = 0
    mask: torch.Tensor | None = None  # [nodes, nodes]: ancestor-or-self

    @classmethod
    def from_paths(cls, paths: list[list[int]]) -> Tree:
        ps = sorted({tuple(int(r) for r in p) for p in paths}, key=lambda p: (len(p), p))
        index = {(): 0}
        t = cls(ps, parent=[-1], depth=[0], children=[[]])
        for p in ps:
            if p[:-1] not in index:
                raise ValueError(f"medusa_tree path {list(p)}: parent {list(p[:-1])} missing")
            i = len(t.parent)
            index[p] = i
            t.parent.append(index[p[:-1]])
            t.depth.append(len(p))
            t.children.append([])
            t.children[index[p[:-1]]].append(i)
            t.max_rank = max(t.max_rank, p[-1])
        n = len(t.parent)
        mask = torch.zeros(n, n, dtype=torch.bool)
        for i in range(n):
            j = i
            while j >= 0:
                mask[i, j] = True
                j = t.parent[j]
        t.mask = mask
        return t

    @property
    def size(self) -> int:
        return len(self.parent)

    @property
    def max_depth(self) -> int:
        return max(self.depth)


@dataclass
class Step:
    """What one decoding step produced (tokens in order; logprobs when asked)."""

    tokens: list[int]
    logprobs: list[dict[int, tuple[float, int]]] | None
    drafted: int
    accepted: int
    finish_reason: str | None


class Grammar:
    """xgrammar matcher for one request: masks logits to the schema, advances on tokens."""

    def __init__(self, compiled: Any, vocab_size: int) -> None:
        import xgrammar as xgr

        self.xgr = xgr
        self.matcher = xgr.GrammarMatcher(compiled)
        self.bitmask = xgr.allocate_token_bitmask(1, vocab_size)

    def choose(self, logits: torch.Tensor) -> int:
        """The greedy token among those the grammar allows, accepted into the matcher.

        Fast path: if the unmasked argmax is allowed it is also the masked argmax (masking
        only removes tokens), and ``accept_token`` both checks and advances; a refused token
        leaves the matcher unchanged. Only then is the full vocabulary mask built.
        """
        tok = int(logits.argmax())
        if self.matcher.accept_token(tok):
            return tok
        self.matcher.fill_next_token_bitmask(self.bitmask)
        row = logits[None].clone()
        self.xgr.apply_token_bitmask_inplace(row, self.bitmask)
        tok = int(row.argmax())
        if not self.matcher.accept_token(tok):
            raise RuntimeError(f"grammar refused token {tok} that its own mask allowed")
        return tok

    @property
    def terminated(self) -> bool:
        return bool(self.matcher.is_terminated())


class Decoder:
    """Owns the model, the heads and the cached prefix; decodes one request at a time."""

    def __init__(self, model: TinyLlama, heads: MedusaHeads | None, tree: Tree | None,
                 eos_ids: set[int]) -> None:
        if (heads is None) != (tree is None):
            raise ValueError("Medusa needs both heads and a tree")
        if tree is not None and heads is not None and tree.max_depth > heads.num_heads:
            raise ValueError(f"tree depth {tree.max_depth} > {heads.num_heads} heads")
        self.model = model
        self.heads = heads
        self.tree = tree
        self.eos_ids = eos_ids
        self.cached: list[int] = []  # token ids whose KV is in cache slots 0..len-1

    def _pick(self, logits: torch.Tensor, grammar: Grammar | None, want_lp: int
              ) -> tuple[int, dict[int, tuple[float, int]] | None]:
        """Greedy choice (grammar-masked, and accepted by the grammar) and, if asked, raw
        top-k logprobs with ranks."""
        tok = grammar.choose(logits) if grammar is not None else int(logits.argmax())
        if not want_lp:
            return tok, None
        lp = torch.log_softmax(logits, dim=-1)
        top = lp.topk(want_lp)
        out = {int(t): (float(v), r + 1) for r, (v, t) in enumerate(zip(top.values, top.indices,
                                                                          strict=True))}
        if tok not in out:
            out[tok] = (float(lp[tok]), int((lp > lp[tok]).sum()) + 1)
        return tok, out

    def generate(self, prompt: list[int], max_tokens: int, grammar: Grammar | None = None,
                 logprobs: int = 0, should_stop: Callable[[], bool] = lambda: False,
                 ) -> Iterator[Step]:
        """Yields one :class:`Step` per forward pass; the last has ``finish_reason`` set."""
        m = self.model
        if len(prompt) + max_tokens > m.max_len:
            raise ValueError(f"prompt ({len(prompt)}) + max_tokens ({max_tokens}) exceeds "
                             f"the context ({m.max_len})")
        # prefix reuse: keep at least one prompt token to compute the first logits from
        p = 0
        for a, b in zip(self.cached, prompt[:-1], strict=False):
            if a != b:
                break
            p += 1
        self.cached = self.cached[:p]
        new = prompt[p:]
        hs = m.forward(torch.tensor(new), torch.arange(p, len(prompt)), p,
                       m.prefill_mask(p, len(new)))
        self.cached = list(prompt)
        h_last = hs[-1]
        tok, lp = self._pick(m.logits(h_last), grammar, logprobs)
        emitted = 1
        finish = self._finished(tok, grammar, emitted, max_tokens)
        yield Step([tok], None if lp is None else [lp], 0, 0, finish)
        cache_len = len(prompt)
        while finish is None:
            if should_stop():
                return
            root = tok
            if self.tree is None or self.heads is None:
                ids, pos, mask = [root], [cache_len], None
                node_tok = [root]
            else:
                top = self.heads.topk(h_last, self.tree.max_rank + 1, self.tree.max_depth)
                # node i's token: rank path[-1] of head len(path) - 1
                node_tok = [root] + [top[len(path) - 1][path[-1]] for path in self.tree.paths]
                ids = node_tok
                pos = [cache_len + d for d in self.tree.depth]
                assert self.tree.mask is not None
                mask = torch.ones(len(ids), cache_len + len(ids), dtype=torch.bool)
                mask[:, cache_len:] = self.tree.mask
            if cache_len + len(ids) > m.max_len:  # near the end of the context: plain step
                ids, pos, mask, node_tok = [root], [cache_len], None, [root]
            hs = m.forward(torch.tensor(ids), torch.tensor(pos), cache_len, mask)
            logits = m.logits(hs)
            node, path, toks, lps = 0, [0], [], []
            while True:
                tok, lp = self._pick(logits[node], grammar, logprobs)
                toks.append(tok)
                if lp is not None:
                    lps.append(lp)
                emitted += 1
                finish = self._finished(tok, grammar, emitted, max_tokens)
                if finish is not None or len(ids) == 1:
                    break
                nxt = next((c for c in self.tree.children[node] if node_tok[c] == tok), None)  # type: ignore[union-attr]
                if nxt is None:
                    break
                node = nxt
                path.append(node)
            m.compact([cache_len + i for i in path], cache_len)
            self.cached += [node_tok[i] for i in path]
            cache_len += len(path)
            h_last = hs[node]
            yield Step(toks, lps if logprobs else None, len(ids) - 1, len(path) - 1, finish)

    def _finished(self, tok: int, grammar: Grammar | None, emitted: int, max_tokens: int
                  ) -> str | None:
        if grammar is not None and grammar.terminated:
            return "stop"
        if tok in self.eos_ids:
            return "stop"
        if emitted >= max_tokens:
            return "length"
        return None


def time_forward(model: TinyLlama, n: int, context: int, reps: int = 20) -> float:
    """Mean seconds of one forward pass verifying ``n`` tokens after ``context`` cached ones
    (the cost model for choosing the tree size)."""
    ids = torch.zeros(n, dtype=torch.long)
    pos = torch.arange(context, context + n)
    mask = None if n == 1 else torch.ones(n, context + n, dtype=torch.bool)
    for _ in range(3):
        model.logits(model.forward(ids, pos, context, mask))
    t0 = time.perf_counter()
    for _ in range(reps):
        model.logits(model.forward(ids, pos, context, mask))
    return (time.perf_counter() - t0) / reps
