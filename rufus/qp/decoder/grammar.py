"""What the planner may emit: the plan grammar and the copied-field constraint.

:class:`Grammar` is one request's xgrammar matcher over the plan's JSON schema (the same
JSON-schema grammar vLLM's structured outputs compile): it masks the greedy choice to what
the schema allows, advances token by token, says which text it forces next (drafted by
:meth:`rufus.qp.decoder.medusa_decode.Decoder.draft`) and when nothing but the stop token
can follow. :class:`CopyConstraint` keeps a copied string value (``copy_fields``: the
brand) to a run of the customer's words. Both act on the choice itself, identically in
plain and Medusa decoding, so decoding stays lossless.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import torch

from rufus.qp.plan import prompt_context

# The plan's exact layout (rufus/qp/plan.py ``render_plan``: what the planner was trained to
# write): no free whitespace, compact separators. Pinned, most of a plan's tokens (keys,
# punctuation, the rest of an enum value; docs/benchmarks.md) are forced by the grammar, which
# the tree decoder (medusa_decode.Decoder, ``grammar_drafts``) then verifies as drafts instead
# of decoding one by one.
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
        text = tokenizer.decode(prompt, skip_special_tokens=False)
        return cls(fields, prompt_context(text), vocab)

    def advance(self, tok: int) -> None:
        self.text += self.vocab.texts[tok]

    def _open_value(self, ahead: str = "") -> str | None:
        text = self.text + ahead
        for op in self.openers:
            i = text.rfind(op)
            if i >= 0 and '"' not in text[i + len(op):]:
                return text[i + len(op):]
        return None

    def open_after(self, ahead: str) -> bool:
        """Whether a copied value is open once ``ahead`` (drafted text) is emitted too."""
        return self._open_value(ahead) is not None

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


# Where a copied run of the customer's words ends: punctuation, a connector between
# compared products ("roomba vs roborock"), a price phrase (it becomes ``max_price``, not
# query words) or the next turn of a follow-up's history
_SEGMENT_END = re.compile(
    r"[?!.,;:\"]|\s(?:vs\.?|versus|or)\s|\s(?:under|below|less than|budget|max|up to)\s*\$?\d"
    r"|\s(?:user|assistant|question):")
_CONNECTOR = re.compile(r"^\s*(?:(?:vs\.?|versus|or|and)\s+|,\s*)?")
# a price the customer wrote: after a currency sign or a price word
_PRICE = re.compile(r"(?:\$\s*|(?:under|below|less than|budget|max|up to|around)\s+\$?)"
                    r"(\d[\d,]*(?:\.\d+)?)")
_NUMBER_KEY = re.compile(r'"max_price":( ?)$')
_WORD_CHARS = "abcdefghijklmnopqrstuvwxyz0123456789'-&+"


class WordDrafts:
    """The customer's words as drafts for the plan being written: the continuation, in the
    question, of the string value being written (a search query, a brand copies them), the
    string's close where the question's phrase ends, and the price the customer named for
    ``max_price``.

    Matched on text, not tokens: the question has `` espresso`` where a query starts
    ``es`` ``presso``, so token-level prompt lookup finds nothing there. Drafts only (the
    model's own choice is kept), so a wrong continuation costs verification rows, never
    the output."""

    MAX_CHARS = 40  # continuation taken from the question, before tokenizing
    SHAPES = 8

    def __init__(self, context: str, vocab: TokenText,
                 encode: Callable[[str], list[int]]) -> None:
        self.context = " ".join(context.lower().split())
        self.vocab, self.encode = vocab, encode
        self.text = ""  # what has been emitted
        self.shape = self.shape_of(context)
        price = _PRICE.search(self.context)
        self.price = price.group(1).replace(",", "") if price else None

    @classmethod
    def shape_of(cls, context: str) -> int:
        """The question's length in words, capped: plans of short questions and of
        sentences differ (``query_type``), so earlier plans are also counted per shape
        (PlanHistory)."""
        return min(len(context.split()), cls.SHAPES)

    @classmethod
    def for_prompt(cls, tokenizer: Any, prompt: list[int], vocab: TokenText,
                   encode: Callable[[str], list[int]]) -> WordDrafts:
        return cls(prompt_context(tokenizer.decode(prompt, skip_special_tokens=False)),
                   vocab, encode)

    def advance(self, tok: int) -> None:
        self.text += self.vocab.texts[tok]

    def _segment(self, at: int) -> tuple[str, str]:
        """The question's text from ``at`` to the end of its phrase, and what ended it:
        the stop's text, "" at the question's end, "~" where cut at ``MAX_CHARS``."""
        rest = self.context[at:at + self.MAX_CHARS + 12]
        stop = _SEGMENT_END.search(rest)
        if stop is not None and stop.start() <= self.MAX_CHARS:
            return rest[:stop.start()], stop.group(0).strip()
        if len(self.context) - at <= self.MAX_CHARS:
            return rest, ""
        return rest[:self.MAX_CHARS], "~"

    def _continuation(self, text: str) -> tuple[str, str] | None:
        """Inside an open string of ``text``: the question's continuation of its value and
        what ends that phrase (see :meth:`_segment`); None where the value is not found."""
        start = text.rfind('"')
        if start < 0 or text.count('"') % 2 == 0:  # not inside a string
            return None
        value = text[start + 1:].lower()
        emitted = text.lower()
        if text[:start].endswith('"brand": '):  # a brand: one word, from the first query
            return self._brand(value, emitted)
        if not value:
            # a further query of a list: the question's next phrase after the last one
            before = text[:start]
            if not before.endswith('", '):
                return None
            prev = before[:-3]
            prev = prev[prev.rfind('"') + 1:].lower()
            i = self.context.rfind(prev) if len(prev) >= 2 else -1
            if i < 0:
                return None
            at = i + len(prev)
            at += _CONNECTOR.match(self.context[at:]).end()  # type: ignore[union-attr]
            return self._segment(at)
        if len(value) == 1:  # a value's first character: a word that starts with it
            return self._after(value, emitted[:start], word_start=True)
        for n in range(min(len(value), 24), 1, -1):  # the longest suffix found, >= 2 chars
            found = self._after(value[-n:], emitted)
            if found is not None:
                return found
        return None

    def _after(self, needle: str, emitted: str, word_start: bool = False
               ) -> tuple[str, str] | None:
        """The question's phrase after ``needle`` (:meth:`_segment`), at its first
        occurrence whose next word (with a one-letter ``needle`` at a word's start: the word
        it starts) is not in ``emitted`` yet, else at its first occurrence; None if absent."""
        found = None
        i = self.context.find(needle)
        while i >= 0:
            if not word_start or i == 0 or self.context[i - 1] == " ":
                seg = self._segment(i + len(needle))
                head = seg[0].split()[0] if seg[0].split() else ""
                found = found or seg
                if word_start:
                    head = needle + (head if not seg[0].startswith(" ") else "")
                if head and head not in emitted:
                    return seg
            i = self.context.find(needle, i + 1)
        return found

    def _brand(self, value: str, emitted: str) -> tuple[str, str] | None:
        """A brand value's continuation: the rest of the word it starts (a brand is a word
        the customer wrote, usually the first query's first word), then its end."""
        if not value:
            first = emitted.split('"search_queries": ["', 1)
            word = first[1].split(" ", 1)[0].split('"', 1)[0] if len(first) > 1 else ""
            return (word, "") if word and f" {word} " in f" {self.context} " else None
        for m in re.finditer(re.escape(value), self.context):
            if m.start() == 0 or self.context[m.start() - 1] == " ":
                rest = self.context[m.end():]
                return rest[:len(rest) - len(rest.lstrip(_WORD_CHARS))], ""
        return None

    def hint(self, extra: str = "") -> str | None:
        """Where the plan chooses its filters: a price the customer named makes them
        ``max_price`` (the grammar then forces the key's end, :meth:`number` the value)."""
        if self.price is None:
            return None
        text = self.text + extra
        if text.endswith('"filters":'):
            return ' {"max_price":'
        if text.endswith('"filters": {"'):
            return 'max_price":'
        return None

    def draft(self, limit: int, extra: str = "") -> list[int]:
        """Up to ``limit`` tokens continuing the open string value (after ``extra``, text
        drafted ahead of it) as the question continues it, or []."""
        cont = self._continuation(self.text + extra)
        return self.encode(cont[0])[:limit] if cont and cont[0] else []

    def closer(self, extra: str = "") -> str | None:
        """Where the open string value (with ``extra``) has reached the end of the
        question's phrase: the text that closes it as plans do (``"],`` after the last
        query, ``",`` before a compared product's query, ``"`` after a brand); else None."""
        text = self.text + extra
        cont = self._continuation(text)
        if cont is None or cont[0].strip() or cont[1] == "~":
            return None
        opener = text[:text.rfind('"')]
        if opener.endswith('"brand": '):
            return '"'
        if opener.endswith(' [') or opener.endswith('", '):
            return '",' if cont[1] in ("vs", "vs.", "versus", "or") else '"],'
        return None

    def number(self, extra: str = "") -> str | None:
        """The price the customer named, as the plan writes it after ``"max_price":``
        (``extra``: text drafted ahead), or None."""
        key = _NUMBER_KEY.search(self.text + extra)
        if key is None or self.price is None:
            return None
        return self.price if key.group(1) else " " + self.price


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
        self.words: WordDrafts | None = None  # drafts from the customer's words

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

    def few_allowed(self, ahead: str | None = None, limit: int = 64) -> list[int] | None:
        """The tokens the grammar allows next (ascending), where its text is forced and they
        are at most ``limit``, else None; also None while a copied value is open (its own
        restriction applies) with ``ahead``, text not yet emitted, counted in."""
        if not self.matcher.find_jump_forward_string():
            return None
        if self.copy is not None and self.copy.open_after(ahead or ""):
            return None
        self.matcher.fill_next_token_bitmask(self.bitmask)
        words = self.bitmask[0].numpy()
        nz = words.nonzero()[0]
        if len(nz) > limit:
            return None
        ids: list[int] = []
        for w in nz.tolist():
            v = int(words[w]) & 0xFFFFFFFF
            while v:
                low = v & -v
                ids.append(w * 32 + low.bit_length() - 1)
                v ^= low
        return ids if len(ids) <= limit else None

    def allows_few(self, limit: int = 64) -> bool:
        """Whether the grammar allows at most about ``limit`` tokens next (an enum value, a
        key, punctuation), not free text."""
        self.matcher.fill_next_token_bitmask(self.bitmask)
        return int(self.bitmask[0].count_nonzero()) <= limit

    def choose_among(self, ids: list[int], logits: torch.Tensor) -> int:
        """:meth:`choose` where ``ids`` (ascending) are all the grammar allows and
        ``logits`` theirs: the same token (the first of the largest), accepted."""
        tok = ids[int(logits.argmax())]
        if not self.matcher.accept_token(tok):
            raise RuntimeError(f"grammar refused token {tok} that its own mask allowed")
        return self._accepted(tok)

    def only_token(self) -> int | None:
        """The one token the grammar allows next, if exactly one is allowed (and no copied
        value is open), else None. Any greedy choice there is that token, whatever the
        logits, so it needs no forward pass."""
        ids = self.few_allowed(limit=1)
        return ids[0] if ids else None

    def certain_end(self, limit: int) -> list[int]:
        """The tokens up to completion (at most ``limit``) when each is the only one
        allowed, accepted; else [] and the matcher unchanged."""
        tail: list[int] = []
        while len(tail) < limit:
            tok = self.only_token()
            if tok is None or not self.matcher.accept_token(tok):
                break
            tail.append(tok)
            if self.finished:
                for t in tail:
                    self._accepted(t)
                return tail
        if tail:
            self.matcher.rollback(len(tail))
        return []

    def _accepted(self, tok: int) -> int:
        if self.copy is not None:
            self.copy.advance(tok)
        if self.words is not None:
            self.words.advance(tok)
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
