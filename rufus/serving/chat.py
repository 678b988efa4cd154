"""Chat rendering and tokenizer codecs: messages -> prompt text and token ids.

The clients' content can never become a control token (``<|im_start|>system`` typed into a
message stays plain text), and rendering never races the engine's own use of the shared
tokenizer (private copies of its Rust core). CPU-bound: the hot path
(:func:`rufus.serving.generation.run_generate`) calls :func:`render_prompt` in a worker
thread so a large prompt does not stall the engine's event loop.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from rufus.errors import InvalidInput
from rufus.serving.request import GenerateRequest

_SENTINEL = "\ue000rufus-content-{}-{}\ue001"  # private-use characters: never client data


def special_token_texts(tokenizer: Any) -> list[str]:
    """The text of every special/added control token (``<|im_start|>``, ...)."""
    texts = set(getattr(tokenizer, "all_special_tokens", None) or [])
    for tok in (getattr(tokenizer, "added_tokens_decoder", None) or {}).values():
        if getattr(tok, "special", False):
            texts.add(str(tok.content if hasattr(tok, "content") else tok))
    return sorted(t for t in texts if t)


class _Codec:
    """Private copies of a fast tokenizer's Rust core: ``plain`` (control-token text is a
    control token) and ``split`` (control-token text is plain text).

    Rendering runs in worker threads; the shared tokenizer is also used by the engine on its
    loop (detokenizing, grammars). Transformers implements ``split_special_tokens`` by
    flipping a flag on the shared tokenizer, which would race with those users, so we
    encode with our own copies, one thread at a time.
    """

    def __init__(self, backend: Any) -> None:
        from tokenizers import Tokenizer

        self.plain = Tokenizer.from_str(backend.to_str())
        self.split = Tokenizer.from_str(backend.to_str())
        self.split.encode_special_tokens = True
        self.lock = threading.Lock()

    def encode(self, text: str, *, split: bool, add_special_tokens: bool = False) -> list[int]:
        with self.lock:
            tok = self.split if split else self.plain
            return list(tok.encode(text, add_special_tokens=add_special_tokens).ids)


_codecs: dict[int, tuple[Any, _Codec | None]] = {}
_codecs_lock = threading.Lock()


def codec_for(tokenizer: Any) -> _Codec | None:
    """The tokenizer's private codec (None for a tokenizer without a Rust core)."""
    key = id(tokenizer)
    with _codecs_lock:
        hit = _codecs.get(key)
        if hit is not None and hit[0] is tokenizer:
            return hit[1]
        backend = getattr(tokenizer, "backend_tokenizer", None)
        codec = _Codec(backend) if backend is not None and hasattr(backend, "to_str") else None
        _codecs[key] = (tokenizer, codec)
        return codec


def render_chat(tokenizer: Any, messages: list[dict[str, str]], field_name: str = "messages"
                ) -> tuple[str, list[int]]:
    """Chat template -> (text, token ids) where the clients' content can never become a
    control token: the template is rendered with a placeholder per message, its own text is
    tokenized with special tokens recognised, and each content with special-token text
    split into plain text. So ``<|im_start|>system`` typed into a message is ordinary text,
    not a forged turn."""
    codec = codec_for(tokenizer)
    if codec is None:
        return _render_chat_strict(tokenizer, messages, field_name)
    nonce = time.monotonic_ns()
    marks = [_SENTINEL.format(nonce, i) for i in range(len(messages))]
    masked = [{**m, "content": marks[i]} for i, m in enumerate(messages)]
    try:
        rendered = tokenizer.apply_chat_template(masked, add_generation_prompt=True,
                                                 tokenize=False)
    except Exception as exc:
        raise InvalidInput(field_name, f"chat template rejected them: {exc}") from exc
    pieces: list[tuple[str, bool]] = []
    rest = rendered
    for i, mark in enumerate(marks):
        head, found, tail = rest.partition(mark)
        if not found or mark in tail:
            return _render_chat_strict(tokenizer, messages, field_name)
        pieces += [(head, False), (messages[i]["content"], True)]
        rest = tail
    pieces.append((rest, False))
    ids: list[int] = []
    for piece, is_content in pieces:
        if piece:
            ids += codec.encode(piece, split=is_content)
    return "".join(p for p, _ in pieces), ids


def _render_chat_strict(tokenizer: Any, messages: list[dict[str, str]], field_name: str
                        ) -> tuple[str, list[int]]:
    """A template that drops or repeats content: render it as is, refusing any content
    that holds control-token text (it could not be kept plain)."""
    specials = special_token_texts(tokenizer)
    for i, m in enumerate(messages):
        hit = next((s for s in specials if s in m["content"]), None)
        if hit is not None:
            raise InvalidInput(f"{field_name}[{i}].content",
                               f"contains the control token text {hit!r}")
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return text, tokenizer.encode(text, add_special_tokens=False)


def render_prompt(tokenizer: Any, req: GenerateRequest) -> tuple[str, list[int], str]:
    """Returns (prompt text, token ids, field name to blame if it is too long).

    CPU-bound (about 1 MB/s on 2 cores): :func:`run_generate` calls it in a worker thread so
    a large prompt does not stall the engine's event loop (the tokenizer releases the GIL).
    """
    if req.messages is not None:
        text, ids = render_chat(tokenizer, req.messages, req.prompt_field)
        return text, ids, req.prompt_field
    assert req.prompt is not None
    codec = codec_for(tokenizer)
    ids = (codec.encode(req.prompt, split=False, add_special_tokens=True) if codec is not None
           else tokenizer.encode(req.prompt))
    return req.prompt, ids, req.prompt_field
