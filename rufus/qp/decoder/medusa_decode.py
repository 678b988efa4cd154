"""Greedy decoding with Medusa tree verification (and the plain autoregressive baseline).

One step: the last emitted token (the root, not yet in the KV cache) plus a trie of
candidates (the tokens the grammar forces next, the Medusa heads' tree, prompt-lookup copies)
go through the model in one forward pass with a tree attention mask. Walking down the trie,
the model's own greedy choice at each node (masked by the JSON-schema grammar when one is
given) is emitted; while that choice is a child of the node, the walk continues. So every
emitted token is exactly the token plain greedy decoding would pick from the same logits:
the output is the autoregressive output (lossless), up to kernels rounding differently for a
different number of query rows (see lab/qp/lossless.py).
The accepted nodes' KV entries are then compacted into consecutive cache slots.

Batch size 1 is what the planner's latency SLA is about; :meth:`Decoder.step` also verifies
several sequences in one pass (each in its own cache region) when plans queue. Each region
keeps the KV of its previous request and reuses its longest common token prefix (the system
prompt is identical for every plan), like vLLM's prefix cache.

What may be emitted (the plan grammar, the copied brand) is decided in
:mod:`rufus.qp.decoder.grammar`; the timing of a verification pass used to size the tree
is setup and lab code (:func:`rufus.qp.tree.time_forward`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from rufus.qp.decoder.grammar import Grammar, WordDrafts
from rufus.qp.decoder.torch_llama import MedusaHeads, Segment, TorchLlama
from rufus.qp.plan import plan_seed
from rufus.qp.settings import MAX_DRAFT_NODES  # draft trie size cap per step


@dataclass
class Tree:
    """Medusa candidate tree from NxDI-style paths (each a list of top-k ranks per head).

    Only the paths are used to decode: each step builds its draft trie from them
    (:meth:`Decoder.draft`); the parent index is kept for validation and ``size``."""

    paths: list[tuple[int, ...]]
    parent: list[int] = field(default_factory=list)  # node index (0 = root) of each node
    depth: list[int] = field(default_factory=list)
    max_rank: int = 0

    @classmethod
    def from_paths(cls, paths: list[list[int]]) -> Tree:
        ps = sorted({tuple(int(r) for r in p) for p in paths}, key=lambda p: (len(p), p))
        index: dict[tuple[int, ...], int] = {(): 0}
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
class Draft:
    """One step's candidates as a trie: node 0 is the last token without KV, node i > 0
    holds ``tokens[i - 1]``."""

    tokens: list[int]
    depth: list[int]
    children: list[list[int]]
    mask: torch.Tensor  # [nodes, nodes]: ancestor-or-self
    # node -> the few tokens the grammar allows after it (sorted), where its text is forced:
    # only those tokens' logits are computed for its row (Decoder.step)
    allowed: dict[int, list[int]] = field(default_factory=dict)


def _no_draft() -> Draft:
    """The trie of a pass near the end of the context: the root alone, no drafts."""
    return Draft([], [0], [[]], torch.ones(1, 1, dtype=torch.bool))


@dataclass
class Step:
    """What one decoding step produced (tokens in order; logprobs when asked)."""

    tokens: list[int]
    logprobs: list[dict[int, tuple[float, int]]] | None
    drafted: int
    accepted: int
    finish_reason: str | None


# the question's words drafted at a time into the skeleton (a query copies a few of them)
WORD_DRAFTS = 6


class PlanHistory:
    """Earlier outputs as a draft source: which token followed the same three tokens in the
    plans this decoder already emitted (suffix decoding over its own outputs), and before
    those, in the planner's training plans (:meth:`seed`).

    Plans share their skeleton (keys, punctuation, the common enum values, an empty filter
    object), so what followed ``"intent": "`` last time is usually right again; the grammar
    forces most of the rest (:meth:`Decoder.draft`). A follower is proposed only when it
    was seen at least ``min_count`` times and is at least ``min_share`` of what followed
    there (0.8: on both CPU classes the fastest of 0.5-0.97, docs/benchmarks.md): the
    drafts stop where plans diverge instead of spending verification rows on guesses.
    Served plans decide wherever they have been seen: the training set's mix of intents is
    not the traffic's. Drafts never change the output, only how many passes it takes.
    """

    CONTEXT = 3

    def __init__(self, min_count: int = 2, min_share: float = 0.8,
                 max_keys: int = 1 << 16) -> None:
        self.min_count, self.min_share, self.max_keys = min_count, min_share, max_keys
        # (question shape or 0, *previous tokens) -> {next token: count}: served plans, seed
        self.next_counts: dict[tuple[int, ...], dict[int, int]] = {}
        self.seed_counts: dict[tuple[int, ...], dict[int, int]] = {}

    def add(self, tokens: list[int], shape: int = 0, *, seed: bool = False) -> None:
        """Count one output (preceded by the prompt's last ``CONTEXT`` tokens), for any
        question and for questions of this ``shape`` (:attr:`WordDrafts.shape`)."""
        table = self.seed_counts if seed else self.next_counts
        if len(table) > self.max_keys:  # bounded: start over, it refills fast
            table.clear()
        n = self.CONTEXT
        for i in range(n, len(tokens)):
            for key in ((0, *tokens[i - n:i]), (shape, *tokens[i - n:i])) if shape else \
                    ((0, *tokens[i - n:i]),):
                after = table.setdefault(key, {})
                after[tokens[i]] = after.get(tokens[i], 0) + 1

    def seed(self, tokenizer: Any, path: str | Path) -> int:
        """Count the plans of a seed file (rufus/qp/build.py ``write_plan_seed``)
        before any is served; returns how many (0: no file)."""
        plans = plan_seed(tokenizer, path)
        for prompt, plan, context in plans:
            self.add(prompt[-self.CONTEXT:] + plan, WordDrafts.shape_of(context), seed=True)
        return len(plans)

    def _followers(self, tail: list[int], shape: int) -> dict[int, int] | None:
        """What followed ``tail``'s last ``CONTEXT`` tokens: after served questions of this
        ``shape``, else any served question, else the same in the seed, whichever has seen
        it ``min_count`` times first; or None."""
        ngram = tuple(tail[-self.CONTEXT:])
        for table in (self.next_counts, self.seed_counts):
            for key in ((shape, *ngram), (0, *ngram)) if shape else ((0, *ngram),):
                after = table.get(key)
                if after and sum(after.values()) >= self.min_count:
                    return after
        return None

    def predict(self, tail: list[int], shape: int = 0) -> int | None:
        """The usual follower of ``tail`` (seen ``min_count`` times and at least
        ``min_share`` of what followed it), or None."""
        after = self._followers(tail, shape)
        if after is None:
            return None
        tok, count = max(after.items(), key=lambda kv: kv[1])
        ok = count >= self.min_count and count >= self.min_share * sum(after.values())
        return tok if ok else None

    def rare(self, tail: list[int], tok: int, shape: int = 0) -> bool:
        """Whether ``tok`` is seldom what followed ``tail`` (under ``1 - min_share`` of
        it): the grammar forces `` {`` after ``"filters":`` but the model writes `` {"``
        or `` {}``, one token for text the grammar splits."""
        after = self._followers(tail, shape)
        return after is not None and \
            after.get(tok, 0) < (1 - self.min_share) * sum(after.values())


def prompt_lookup(seq: list[int], limit: int) -> list[int]:
    """Prompt-lookup drafts: the tokens that followed the latest earlier occurrence of the
    longest (3, 2 or 1 token) suffix of ``seq`` (the prompt, what was emitted and the forced
    chain), at most ``limit``. Plans copy the customer's words, so this drafts them well."""
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


def _pick(logits: torch.Tensor, grammar: Grammar | None, want_lp: int
          ) -> tuple[int, dict[int, tuple[float, int]] | None]:
    """Greedy choice (grammar-masked, and accepted by the grammar) and, if asked, raw top-k
    logprobs with ranks."""
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


def _shared_prefix(a: list[int], b: list[int]) -> int:
    """Length of the longest common prefix of two token lists."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


class Run:
    """One sequence between forward passes: its cache region, the tokens still without KV,
    what it emitted. Made by :meth:`Decoder.start`, advanced by :meth:`Decoder.step`; state
    only, the decoding is the decoder's."""

    def __init__(self, slot: int, prompt: list[int], max_tokens: int,
                 grammar: Grammar | None, logprobs: int, kept: int) -> None:
        self.slot = slot
        self.max_tokens, self.grammar, self.logprobs = max_tokens, grammar, logprobs
        self.cache_len = kept
        self.pend = prompt[kept:]  # accepted tokens without KV yet
        self.seq = list(prompt)  # the prompt and every emitted token (prompt-lookup source)
        self.h_last: torch.Tensor | None = None  # hidden state that predicted pend[-1]
        self.emitted = 0
        self.n_pend = len(self.pend)
        self.draft: Draft | None = None


class Decoder:
    """Owns the model, the heads and the cached prefix; decodes one request at a time."""

    def __init__(self, model: TorchLlama, heads: MedusaHeads | None, tree: Tree | None,
                 eos_ids: set[int], grammar_drafts: int = 0, lookup_drafts: int = 0,
                 max_draft_nodes: int = MAX_DRAFT_NODES,
                 batch_draft_nodes: int = MAX_DRAFT_NODES, history_drafts: int = 0) -> None:
        if (heads is None) != (tree is None):
            raise ValueError("Medusa needs both heads and a tree")
        if tree is not None and heads is not None and tree.max_depth > heads.num_heads:
            raise ValueError(f"tree depth {tree.max_depth} > {heads.num_heads} heads")
        self.model = model
        self.heads = heads
        self.tree = tree
        self.eos_ids = eos_ids
        # per cache region (model.slots): token ids whose KV is in its slots 0..len-1
        self.slot_cached: list[list[int]] = [[] for _ in range(model.slots)]
        # up to this many grammar-forced tokens are verified per step as drafts (0: off)
        self.grammar_drafts = grammar_drafts
        # up to this many prompt-lookup tokens are drafted per step (0: off)
        self.lookup_drafts = lookup_drafts
        self.max_draft_nodes = max_draft_nodes
        # per sequence when several share a pass: rows cost compute once the pass is no
        # longer bound by reading the weights, so each plan drafts less
        self.batch_draft_nodes = batch_draft_nodes
        # up to this many tokens beyond the forced chain are drafted from earlier plans and
        # the grammar's forced text after them (:meth:`_skeleton`; 0: off)
        self.history_drafts = history_drafts
        self.history = PlanHistory()

    def draft(self, seq: list[int], h_last: torch.Tensor | None, grammar: Grammar | None,
              cap: int = 0) -> Draft:
        """This step's candidates as a token trie under the root (the last token without
        KV): the plan skeleton (:meth:`_skeleton`), or without one the chain the grammar
        forces next and the prompt-lookup continuation; then, as branches, the Medusa
        tree's paths where nothing surer drafts (at most ``cap`` nodes if set, else
        ``max_draft_nodes``)."""
        forced: list[int] = []
        if grammar is not None and self.grammar_drafts:
            forced = grammar.forced_tokens(self.grammar_drafts)
        k = len(forced)
        skeleton: list[int] = []
        allowed_at: dict[int, list[int]] = {}
        with_skeleton = grammar is not None and self.history_drafts > 0
        if with_skeleton:  # it starts with the forced text
            assert grammar is not None
            skeleton, allowed_at = self._skeleton(seq, grammar, k + self.history_drafts)
            chains = [skeleton]
        else:
            chains = [forced]
        lookup: list[int] = []
        # prompt lookup where there is no skeleton: the skeleton drafts the question's words
        # on text, and a token-level copy beside it cost rows on structure it cannot know
        if self.lookup_drafts and not with_skeleton:
            words = grammar.words.draft(self.lookup_drafts) \
                if grammar is not None and grammar.words is not None and not forced else []
            lookup = words or prompt_lookup(seq + forced, self.lookup_drafts)
        # the heads draft where nothing surer does: their rows cost more than they gained
        # beside the skeleton and the question's words (docs/benchmarks-history.md, "Plan skeleton")
        if h_last is not None and self.tree is not None and self.heads is not None \
                and k < self.tree.max_depth and not lookup and len(skeleton) <= k:
            top = self.heads.topk(h_last, self.tree.max_rank + 1, self.tree.max_depth)
            for path in self.tree.paths:
                if len(path) > k and not any(path[:k]):
                    chains.append(forced + [top[d][r] for d, r in enumerate(path)][k:])
        if lookup:
            chains.append(forced + lookup)
        tok, depth = [-1], [0]
        children: list[list[int]] = [[]]
        rows: list[list[int]] = [[0]]
        for chain in chains:
            node = 0
            for t in chain:
                if t in self.eos_ids:  # nothing follows a stop token: its row is wasted
                    break
                nxt = next((c for c in children[node] if tok[c] == t), None)
                if nxt is None:
                    if len(tok) > (cap or self.max_draft_nodes):
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
        allowed: dict[int, list[int]] = {}
        at = 0
        for d in range(len(skeleton) + 1):  # the skeleton's nodes: allowed sets by depth
            if d in allowed_at:
                allowed[at] = allowed_at[d]
            if d == len(skeleton):
                break
            child = next((c for c in children[at] if tok[c] == skeleton[d]), None)
            if child is None:
                break
            at = child
        return Draft(tok[1:], depth, children, mask, allowed)

    def _skeleton(self, seq: list[int], grammar: Grammar, limit: int
                  ) -> tuple[list[int], dict[int, list[int]]]:
        """The plan skeleton from here, up to ``limit`` tokens: the text the grammar
        forces; else, inside an open string, the question's continuation
        of what the string holds (:class:`WordDrafts`, at most ``WORD_DRAFTS`` tokens per
        value) and its close where the question's phrase ends; the price the customer
        named after ``"max_price":``; else the token that usually came next in earlier
        plans (:class:`PlanHistory`). Each is checked by the grammar; a forced token the
        model is seen to write otherwise is replaced by what it writes (or ends the chain),
        and the plan's last token is left out (its row would predict nothing). One draft
        chain then spans several forced strings (``product_search", "query_type": "``)
        where the forced chain alone stops at the first choice. Also returns, by depth, the
        few tokens the grammar allows where its text is forced (:meth:`Grammar.few_allowed`).
        The matcher is walked ahead and rolled back: it stays at the sequence's real
        position."""
        m, words = grammar.matcher, grammar.words
        chain: list[int] = []
        allowed: dict[int, list[int]] = {}
        texts = words.vocab.texts if words is not None else None
        shape = words.shape if words is not None else 0
        ctx = seq[-PlanHistory.CONTEXT:]

        def note() -> None:  # the allowed set after chain (where it is small)
            ids = grammar.few_allowed("".join(texts[t] for t in chain) if texts else None)
            if ids is not None:
                allowed[len(chain)] = ids

        def take(t: int) -> bool:  # onto the chain, unless refused or the plan's last
            if not m.accept_token(t):
                return False
            if m.is_completed():
                m.rollback(1)
                return False
            chain.append(t)
            return True

        try:
            words_left = WORD_DRAFTS
            while len(chain) < limit and not m.is_terminated():
                text = m.find_jump_forward_string()
                new = grammar.encode(text) if text and grammar.encode is not None else []
                is_forced = bool(new)
                if not new and words is not None:
                    so_far = "".join(texts[t] for t in chain) if texts else ""
                    new = words.draft(min(limit - len(chain), words_left), so_far)
                    words_left -= len(new)
                    if not new:
                        close = words.closer(so_far) or words.number(so_far) \
                            or words.hint(so_far)
                        new = grammar.encode(close) if close and grammar.encode else []
                        words_left = WORD_DRAFTS
                if not new:
                    if not grammar.allows_few():  # free text: earlier plans cannot know it
                        break
                    tok = self.history.predict(ctx + chain, shape)
                    if tok is None:
                        break
                    new = [tok]
                before = len(chain)
                for t in new[:limit - len(chain)]:
                    healed = is_forced and self.history.rare(ctx + chain, t, shape)
                    if healed:  # the model writes this text otherwise: its usual token
                        usual = self.history.predict(ctx + chain, shape)
                        if usual is None:
                            return chain, allowed
                        t = usual
                    if text:
                        note()
                    if not take(t):
                        break
                    if healed:  # the forced text left is recomputed after it
                        break
                    text = m.find_jump_forward_string()
                if len(chain) == before:
                    break
            if not m.is_terminated():
                note()
            return chain, allowed
        finally:
            m.rollback(len(chain))

    @property
    def cached(self) -> list[int]:
        """Token ids whose KV is in cache region 0 (the batch-1 sequence's)."""
        return self.slot_cached[0]

    @cached.setter
    def cached(self, value: list[int]) -> None:
        self.slot_cached[0] = value

    def best_slot(self, prompt: list[int], free: list[int]) -> int:
        """The free cache region whose kept tokens share the longest prefix with ``prompt``."""
        return max(free, key=lambda slot: _shared_prefix(self.slot_cached[slot], prompt))

    def start(self, prompt: list[int], max_tokens: int, grammar: Grammar | None = None,
              logprobs: int = 0, slot: int = 0) -> Run:
        """A sequence ready for its first pass, in cache region ``slot`` (its kept prefix
        reused); drive it with :meth:`step`."""
        if len(prompt) + max_tokens > self.model.max_len:
            raise ValueError(f"prompt ({len(prompt)}) + max_tokens ({max_tokens}) exceeds "
                             f"the context ({self.model.max_len})")
        # prefix reuse: keep at least one prompt token to compute the first logits from
        p = _shared_prefix(self.slot_cached[slot], prompt[:-1])
        self.slot_cached[slot] = self.slot_cached[slot][:p]
        return Run(slot, prompt, max_tokens, grammar, logprobs, p)

    def step(self, runs: list[Run]) -> list[Step]:
        """One forward pass for every run (each its own draft and cache region): the
        linear layers' weights are read once for all of them. Hot path."""
        cap = min(self.max_draft_nodes, self.batch_draft_nodes) if len(runs) > 1 else 0
        segs = [self._segment(r, cap) for r in runs]
        hs = self.model.forward_many(segs)
        # the rows whose logits are needed: from each run's last pending token on
        picks, row = [], 0
        for r, sg in zip(runs, segs, strict=True):
            picks.append((row + r.n_pend - 1, row + sg.ids.shape[0]))
            row += sg.ids.shape[0]
        # rows whose text the grammar forces (draft.allowed) need only their allowed
        # tokens' logits, where the LM head can compute just those (int8 kernel)
        some = getattr(self.model, "logits_some", None)
        allowed = [r.draft.allowed if some is not None and r.draft is not None
                   and not r.logprobs else {} for r in runs]
        full: list[int] = []
        sub_rows: list[int] = []
        sub_cols: list[int] = []
        for al, (a, b) in zip(allowed, picks, strict=True):
            for i in range(b - a):
                ids = al.get(i)
                if ids is None:
                    full.append(a + i)
                else:
                    sub_rows += [a + i] * len(ids)
                    sub_cols += ids
        logits = self.model.logits(hs[full]) if full else None
        sub = some(hs, torch.tensor(sub_rows), torch.tensor(sub_cols)) \
            if some is not None and sub_rows else None
        out, f_at, s_at = [], 0, 0
        for r, al, (a, b) in zip(runs, allowed, picks, strict=True):
            per_node: list[Any] = []
            for i in range(b - a):
                ids = al.get(i)
                if ids is None:
                    assert logits is not None
                    per_node.append(logits[f_at])
                    f_at += 1
                else:
                    assert sub is not None
                    per_node.append((ids, sub[s_at:s_at + len(ids)]))
                    s_at += len(ids)
            out.append(self._walk(r, hs[a:b], per_node))
        return out

    def generate(self, prompt: list[int], max_tokens: int, grammar: Grammar | None = None,
                 logprobs: int = 0, should_stop: Callable[[], bool] = lambda: False,
                 ) -> Iterator[Step]:
        """Yields one :class:`Step` per forward pass; the last has ``finish_reason`` set.

        Each pass takes the tokens that still lack KV (the new part of the prompt on the
        first pass, then the last emitted token) followed by the step's draft trie
        (:meth:`draft`); the longest branch the model's own greedy choices confirm is kept.
        """
        run = self.start(prompt, max_tokens, grammar, logprobs)
        while True:
            st = self.step([run])[0]
            yield st
            if st.finish_reason is not None or should_stop():
                return

    def _segment(self, run: Run, cap: int = 0) -> Segment:
        """``run``'s input to this pass: its pending tokens, then its draft trie (at most
        ``cap`` nodes if set) under the last one."""
        m = self.model
        draft = self.draft(run.seq, run.h_last, run.grammar, cap)
        n_pend, cache_len = len(run.pend), run.cache_len
        if cache_len + n_pend + len(draft.tokens) > m.max_len:  # near the end: no drafts
            draft = _no_draft()
        run.draft, run.n_pend = draft, n_pend
        ids = run.pend + draft.tokens
        n = len(ids)
        pos = list(range(cache_len, cache_len + n_pend)) + [
            cache_len + n_pend - 1 + dep for dep in draft.depth[1:]]
        mask = None
        if n > 1:
            # pending rows: causal; draft rows: every pending token plus ancestors
            mask = torch.ones(n, cache_len + n, dtype=torch.bool)
            mask[:n_pend, cache_len:] = torch.ones(n_pend, n, dtype=torch.bool).tril()
            mask[n_pend:, cache_len + n_pend:] = draft.mask[1:, 1:]
        return Segment(torch.tensor(ids), torch.tensor(pos), cache_len, mask, run.slot)

    def _walk(self, run: Run, hs: torch.Tensor, logits: list[Any]) -> Step:
        """Walk ``run``'s trie with the model's greedy choices (row i: draft node i, 0 the
        last pending token; its logits, or ``(allowed ids, their logits)`` where the grammar
        leaves only those), keep the accepted path's KV, and report the step."""
        draft, grammar = run.draft, run.grammar
        assert draft is not None
        node_tok = draft.tokens
        node, path, toks, lps = 0, [0], [], []
        finish = None
        while True:
            lg = logits[node]
            if isinstance(lg, tuple):
                assert grammar is not None
                tok, lp = grammar.choose_among(*lg), None
            else:
                tok, lp = _pick(lg, grammar, run.logprobs)
            toks.append(tok)
            if lp is not None:
                lps.append(lp)
            run.emitted += 1
            finish = self._finished(tok, grammar, run.emitted, run.max_tokens)
            if finish is not None:
                break
            nxt = next((c for c in draft.children[node] if node_tok[c - 1] == tok), None)
            if nxt is None:
                break
            node = nxt
            path.append(node)
        if finish is None and grammar is not None and self.grammar_drafts and not run.logprobs:
            finish = self._forced_end(run, grammar, toks)
        base = run.cache_len + run.n_pend - 1  # slot of the last pending token
        self.model.compact([base + i for i in path], base, run.slot)
        self.slot_cached[run.slot] += run.pend + [node_tok[i - 1] for i in path[1:]]
        run.cache_len = base + len(path)
        run.seq += toks
        if finish is not None and self.history_drafts:
            # this output (after the prompt's last tokens) joins the skeleton's history
            words = grammar.words if grammar is not None else None
            self.history.add(run.seq[-(run.emitted + PlanHistory.CONTEXT):],
                             words.shape if words else 0)
        run.h_last = hs[node]
        run.pend = [toks[-1]]
        return Step(toks, lps if run.logprobs else None, len(node_tok), len(path) - 1, finish)

    def _forced_end(self, run: Run, grammar: Grammar, toks: list[int]) -> str | None:
        """If the plan's end is certain (each next token the only one the grammar allows,
        up to completion: ``}}`` closing the plan), emit it now rather than spend a forward
        pass per token on choices that are no choice (plain decoding picks the same tokens
        from any logits)."""
        tail = grammar.certain_end(min(4, run.max_tokens - run.emitted))
        if not tail:
            return None
        toks += tail
        run.emitted += len(tail)
        return "stop"

    def _finished(self, tok: int, grammar: Grammar | None, emitted: int, max_tokens: int
                  ) -> str | None:
        if grammar is not None and grammar.finished:
            return "stop"
        if tok in self.eos_ids:
            return "stop"
        if emitted >= max_tokens:
            return "length"
        return None
