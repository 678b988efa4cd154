"""Greedy decoding with Medusa tree verification (and the plain autoregressive baseline).

One step: the last emitted token (the root, not yet in the KV cache) plus a trie of
candidates (the tokens the grammar forces next, the Medusa heads' tree, prompt-lookup copies)
go through the model in one forward pass with a tree attention mask. Walking down the trie,
the model's own greedy choice at each node (masked by the JSON-schema grammar when one is
given) is emitted; while that choice is a child of the node, the walk continues. So every
emitted token is exactly the token plain greedy decoding would pick from the same logits:
the output is the autoregressive output (lossless), up to kernels rounding differently for a
different number of query rows (see rufus/qp/tooling/lossless.py).
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
    """Medusa candidate tree from NxDI-style paths (each a list of top-k ranks per head).

    Only the paths are used to decode: each step builds its draft trie from them
    (:meth:`Decoder._draft`); the parent index is kept for validation and ``size``."""

    paths: list[tuple[int, ...]]
    parent: list[int] = field(default_factory=list)  # node index (0 = root) of each node
    depth: list[int] = field(default_factory=list)
    max_rank: int = 0

    @classmethod
    def from_paths(cls, paths: list[list[int]]) -> Tree:
        ps = sorted({tuple(int(r) for r in p) for p in paths}, key=lambda p: (len(p), p))
        index = {(): 0}
        t = cls(ps, parent=[-1], depth=[0])
        for p in ps:
            if p[:-1] not in index:
                raise ValueError(f"medusa_tree path {list(p)}: parent {list(p[:-1])} missing")
            index[p] = len(t.parent)
            t.parent.append(index[p[:-1]])
            t.depth.append(len(p))
            t.max_rank = max(t.max_rank, p[-1])
        return t

    @property
    def size(self) -> int:
        return len(self.parent)

    @property
    def max_depth(self) -> int:
        return max(self.depth)


@dataclass
class _Draft:
    """One step's candidates as a trie: node 0 is the last token without KV, node i > 0
    holds ``tokens[i - 1]``."""

    tokens: list[int]
    depth: list[int]
    children: list[list[int]]
    mask: torch.Tensor  # [nodes, nodes]: ancestor-or-self


@dataclass
class Step:
    """What one decoding step produced (tokens in order; logprobs when asked)."""

    tokens: list[int]
    logprobs: list[dict[int, tuple[float, int]]] | None
    drafted: int
    accepted: int
    finish_reason: str | None


# draft trie size cap per step (model.json ``max_draft_nodes``)
MAX_DRAFT_NODES = 24

# The plan's exact layout (rufus/qp/plan.py ``render_plan``: what the planner was trained to
# write): no free whitespace, compact separators. Pinned, most of a plan's tokens (keys,
# punctuation, the rest of an enum value; docs/benchmarks.md) are forced by the grammar, which
# ``Decoder(grammar_drafts=...)`` then verifies as drafts instead of decoding one by one.
GRAMMAR_LAYOUT: dict[str, Any] = {"any_whitespace": False, "separators": (", ", ": ")}


def compile_grammar(compiler: Any, schema: str) -> Any:
    """xgrammar JSON-schema grammar in the plan layout (schema property order kept)."""
    return compiler.compile_json_schema(schema, **GRAMMAR_LAYOUT)


def draft_encoder(tokenizer: Any) -> Callable[[str], list[int]]:
    """``Grammar``'s ``encode``: a tokenizer's ids for a forced string, memoized (a plan
    grammar has a few dozen distinct forced strings)."""
    from functools import lru_cache

    @lru_cache(maxsize=4096)
    def encode(text: str) -> list[int]:
        return list(tokenizer.encode(text, add_special_tokens=False))

    return encode


class TokenText:
    """Every token's text, indexed for :class:`CopyConstraint` (built once per engine)."""

    def __init__(self, texts: list[str]) -> None:
        self.texts = texts
        self.by_text: dict[str, list[int]] = {}
        self.closers: dict[str, list[int]] = {}  # text before the token's first '"' -> ids
        for i, t in enumerate(texts):
            if not t:
                continue
            self.by_text.setdefault(t, []).append(i)
            if '"' in t:
                self.closers.setdefault(t.split('"', 1)[0], []).append(i)

    @classmethod
    def of(cls, compiled: Any) -> TokenText:
        """From an xgrammar compiled grammar's tokenizer info (its decoded vocabulary)."""
        return cls([b.decode("utf-8", "replace")
                    for b in compiled.tokenizer_info.decoded_vocab])


_EDGE = "\"'.,!?;:()[]{}<>"


def copy_spans(context: str, max_words: int = 4) -> set[str]:
    """Every run of 1..``max_words`` consecutive words of ``context``, lower case, edge
    punctuation stripped ("Levi's" -> "levi's", "pitcher?" -> "pitcher")."""
    words = [w for w in (w.strip(_EDGE) for w in context.lower().replace("\u2019", "'").split())
             if w]
    return {" ".join(words[i:i + n]) for i in range(len(words))
            for n in range(1, max_words + 1) if i + n <= len(words)}


class CopyConstraint:
    """String fields whose value must be copied from the customer's words (``brand``).

    The planner's brand filter is, by the labelling rule, a brand the customer wrote; the
    135M model sometimes garbles a brand it copies ("weber" -> "berber", "brita" ->
    "britney"). While such a value is open, only tokens that keep it a prefix of a run of
    the context's words (or close it on a whole run) are allowed; the model still picks
    among them, greedily, so plain and Medusa decoding stay identical. Which words may be
    copied is decided by :func:`copy_spans`; which fields, by model.json ``copy_fields``.
    """

    def __init__(self, fields: tuple[str, ...] | list[str], context: str,
                 vocab: TokenText) -> None:
        self.openers = tuple(f'"{f}": "' for f in fields)
        self.spans = copy_spans(context)
        self.vocab = vocab
        self.text = ""  # what has been emitted

    @classmethod
    def for_prompt(cls, fields: tuple[str, ...] | list[str], tokenizer: Any,
                   prompt: list[int], vocab: TokenText) -> CopyConstraint:
        """For one planner request: the customer's words are its prompt's user turn."""
        from rufus.qp.plan import prompt_context

        text = tokenizer.decode(prompt, skip_special_tokens=False)
        return cls(fields, prompt_context(text), vocab)

    def advance(self, tok: int) -> None:
        self.text += self.vocab.texts[tok]

    def _open_value(self) -> str | None:
        for op in self.openers:
            i = self.text.rfind(op)
            if i >= 0 and '"' not in self.text[i + len(op):]:
                return self.text[i + len(op):]
        return None

    def allowed(self) -> list[int] | None:
        """Token ids allowed next, or None when no copied value is open."""
        prefix = self._open_value()
        if prefix is None:
            return None
        ids: set[int] = set()
        for span in self.spans:
            if not span.startswith(prefix):
                continue
            rest = span[len(prefix):]
            ids.update(self.vocab.closers.get(rest, ()))
            for n in range(1, len(rest) + 1):
                ids.update(self.vocab.by_text.get(rest[:n], ()))
        return sorted(ids)


class Grammar:
    """xgrammar matcher for one request: masks logits to the schema, advances on tokens.

    ``encode`` (text -> token ids, no special tokens) enables :meth:`forced_tokens`;
    ``copy`` restricts copied string values (:class:`CopyConstraint`).
    """

    def __init__(self, compiled: Any, vocab_size: int,
                 encode: Callable[[str], list[int]] | None = None,
                 copy: CopyConstraint | None = None) -> None:
        import xgrammar as xgr

        self.xgr = xgr
        self.matcher = xgr.GrammarMatcher(compiled)
        self.bitmask = xgr.allocate_token_bitmask(1, vocab_size)
        self.encode = encode
        self.copy = copy

    def forced_tokens(self, limit: int) -> list[int]:
        """Tokens of the text the grammar forces next (its jump-forward string), at most
        ``limit``. They are drafts, verified like Medusa's: the model may tokenize the same
        text differently in context, and then its own choice is kept (lossless)."""
        if self.encode is None:
            return []
        s = self.matcher.find_jump_forward_string()
        if not s:
            return []
        return self.encode(s)[:limit]

    def choose(self, logits: torch.Tensor) -> int:
        """The greedy token among those the grammar allows, accepted into the matcher.

        Fast path: if the unmasked argmax is allowed it is also the masked argmax (masking
        only removes tokens), and ``accept_token`` both checks and advances; a refused token
        leaves the matcher unchanged. Only then is the full vocabulary mask built.
        """
        allow = self.copy.allowed() if self.copy is not None else None
        if allow:
            tok = allow[int(logits[allow].argmax())]
        else:
            tok = int(logits.argmax())
        if self.matcher.accept_token(tok):
            return self._accepted(tok)
        self.matcher.fill_next_token_bitmask(self.bitmask)
        row = logits[None].clone()
        if allow:
            keep = torch.full_like(row, float("-inf"))
            keep[0, allow] = row[0, allow]
            self.xgr.apply_token_bitmask_inplace(keep, self.bitmask)
            if bool(torch.isfinite(keep).any()):  # else: nothing copyable fits, grammar only
                row = keep
        self.xgr.apply_token_bitmask_inplace(row, self.bitmask)
        tok = int(row.argmax())
        if not self.matcher.accept_token(tok):
            raise RuntimeError(f"grammar refused token {tok} that its own mask allowed")
        return self._accepted(tok)

    def _accepted(self, tok: int) -> int:
        if self.copy is not None:
            self.copy.advance(tok)
        return tok

    @property
    def finished(self) -> bool:
        """Terminated, or complete with nothing but a stop token allowed next: the stop
        token is then certain, so decoding ends here instead of spending a forward pass on
        it (the text is the same; the stop token is not in the output ids)."""
        if self.matcher.is_terminated():
            return True
        if not self.matcher.is_completed():
            return False
        self.matcher.fill_next_token_bitmask(self.bitmask)
        row = torch.zeros(1, self.bitmask.shape[1] * 32)
        self.xgr.apply_token_bitmask_inplace(row, self.bitmask)
        allowed = set(torch.nonzero(row[0] == 0).flatten().tolist())
        return allowed <= set(self.matcher.stop_token_ids)


class Decoder:
    """Owns the model, the heads and the cached prefix; decodes one request at a time."""

    def __init__(self, model: TinyLlama, heads: MedusaHeads | None, tree: Tree | None,
                 eos_ids: set[int], grammar_drafts: int = 0, lookup_drafts: int = 0,
                 max_draft_nodes: int = MAX_DRAFT_NODES) -> None:
        if (heads is None) != (tree is None):
            raise ValueError("Medusa needs both heads and a tree")
        if tree is not None and heads is not None and tree.max_depth > heads.num_heads:
            raise ValueError(f"tree depth {tree.max_depth} > {heads.num_heads} heads")
        self.model = model
        self.heads = heads
        self.tree = tree
        self.eos_ids = eos_ids
        self.cached: list[int] = []  # token ids whose KV is in cache slots 0..len-1
        # up to this many grammar-forced tokens are verified per step as drafts (0: off)
        self.grammar_drafts = grammar_drafts
        # up to this many prompt-lookup tokens are drafted per step (0: off)
        self.lookup_drafts = lookup_drafts
        self.max_draft_nodes = max_draft_nodes

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

    def _lookup(self, seq: list[int], limit: int) -> list[int]:
        """Prompt-lookup drafts: the tokens that followed the latest earlier occurrence of
        the longest (3, 2 or 1 token) suffix of ``seq`` (the prompt, what was emitted and
        the forced chain). Plans copy the customer's words, so this drafts them well."""
        if limit <= 0 or len(seq) < 2:
            return []
        for n in (3, 2, 1):
            if len(seq) <= n:
                continue
            pat = seq[-n:]
            first = pat[0]
            for j in range(len(seq) - n - 1, -1, -1):
                if seq[j] == first and seq[j:j + n] == pat:
                    return seq[j + n: j + n + limit]
        return []

    def _draft(self, seq: list[int], h_last: torch.Tensor | None, grammar: Grammar | None
               ) -> _Draft:
        """This step's candidates as a token trie under the root (the last token without
        KV): the chain the grammar forces next, then, as branches after it, the Medusa
        tree's paths and the prompt-lookup continuation."""
        forced: list[int] = []
        if grammar is not None and self.grammar_drafts:
            forced = grammar.forced_tokens(self.grammar_drafts)
        k = len(forced)
        chains = [forced]
        if h_last is not None and self.tree is not None and self.heads is not None \
                and k < self.tree.max_depth:
            top = self.heads.topk(h_last, self.tree.max_rank + 1, self.tree.max_depth)
            for path in self.tree.paths:
                if len(path) > k and not any(path[:k]):
                    chains.append(forced + [top[d][r] for d, r in enumerate(path)][k:])
        if self.lookup_drafts:
            chains.append(forced + self._lookup(seq + forced, self.lookup_drafts))
        tok, depth = [-1], [0]
        children: list[list[int]] = [[]]
        rows: list[list[int]] = [[0]]
        for chain in chains:
            node = 0
            for t in chain:
                nxt = next((c for c in children[node] if tok[c] == t), None)
                if nxt is None:
                    if len(tok) > self.max_draft_nodes:
                        break
                    nxt = len(tok)
                    tok.append(t)
                    depth.append(depth[node] + 1)
                    children.append([])
                    children[node].append(nxt)
                    rows.append(rows[node] + [nxt])
                node = nxt
        n = len(tok)
        mask = torch.zeros(n, n, dtype=torch.bool)
        for i in range(1, n):
            mask[i, rows[i]] = True
        return _Draft(tok[1:], depth, children, mask)

    def generate(self, prompt: list[int], max_tokens: int, grammar: Grammar | None = None,
                 logprobs: int = 0, should_stop: Callable[[], bool] = lambda: False,
                 ) -> Iterator[Step]:
        """Yields one :class:`Step` per forward pass; the last has ``finish_reason`` set.

        Each pass takes the tokens that still lack KV (the new part of the prompt on the
        first pass, then the last emitted token) followed by the step's draft trie
        (:meth:`_draft`); the longest branch the model's own greedy choices confirm is kept.
        """
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
        cache_len = p
        pend = prompt[p:]  # accepted tokens without KV yet
        seq = list(prompt)  # the prompt and every emitted token (prompt-lookup source)
        h_last: torch.Tensor | None = None  # hidden state that predicted pend[-1]
        emitted = 0
        while True:
            draft = self._draft(seq, h_last, grammar)
            n_pend = len(pend)
            if cache_len + n_pend + len(draft.tokens) > m.max_len:  # near the end: no drafts
                draft = _Draft([], [0], [[]], torch.ones(1, 1, dtype=torch.bool))
            node_tok = draft.tokens
            ids = pend + node_tok
            n = len(ids)
            pos = list(range(cache_len, cache_len + n_pend)) + [
                cache_len + n_pend - 1 + dep for dep in draft.depth[1:]]
            mask = None
            if n > 1:
                # pending rows: causal; draft rows: every pending token plus ancestors
                mask = torch.ones(n, cache_len + n, dtype=torch.bool)
                mask[:n_pend, cache_len:] = torch.ones(n_pend, n, dtype=torch.bool).tril()
                mask[n_pend:, cache_len + n_pend:] = draft.mask[1:, 1:]
            hs = m.forward(torch.tensor(ids), torch.tensor(pos), cache_len, mask)
            logits = m.logits(hs[n_pend - 1:])  # row i: draft node i (0: the last pending)
            node, path, toks, lps = 0, [0], [], []
            while True:
                tok, lp = self._pick(logits[node], grammar, logprobs)
                toks.append(tok)
                if lp is not None:
                    lps.append(lp)
                emitted += 1
                finish = self._finished(tok, grammar, emitted, max_tokens)
                if finish is not None:
                    break
                nxt = next((c for c in draft.children[node] if node_tok[c - 1] == tok), None)
                if nxt is None:
                    break
                node = nxt
                path.append(node)
            base = cache_len + n_pend - 1  # slot of the last pending token
            m.compact([base + i for i in path], base)
            self.cached += pend + [node_tok[i - 1] for i in path[1:]]
            cache_len = base + len(path)
            seq += toks
            h_last = hs[n_pend - 1 + node]
            pend = [toks[-1]]
            yield Step(toks, lps if logprobs else None, len(node_tok), len(path) - 1, finish)
            if finish is not None or should_stop():
                return

    def _finished(self, tok: int, grammar: Grammar | None, emitted: int, max_tokens: int
                  ) -> str | None:
        if grammar is not None and grammar.finished:
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
