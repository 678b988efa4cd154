"""rufus_llm outputs -> OpenAI response objects (chat.completion, text_completion, chunks).

Responses are plain dicts serialised once per chunk: building pydantic objects per token
costs CPU that the engine shares on a small machine, and the shapes are fixed.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import numpy as np


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


# ------------------------------------------------------------------- Triton outputs

@dataclass
class Delta:
    """One rufus_llm response: per-choice text, finish reason, token count, logprobs."""

    texts: list[str]
    finish: list[str | None]
    n_out: list[int]
    n_in: int | None = None
    logprobs: list[list[tuple[str, float, list[tuple[str, float]]]] | None] = field(
        default_factory=list)


def _strings(arr: np.ndarray | None) -> list[str]:
    if arr is None:
        return []
    return [v.decode("utf-8", errors="replace") if isinstance(v, bytes) else str(v)
            for v in np.asarray(arr).reshape(-1)]


def _finish(value: str) -> str | None:
    # "" (ours) and "None" (the official backend's str(None)) both mean "not finished"
    return value if value and value != "None" else None


def _token_logprobs(text: str) -> list[tuple[str, float, list[tuple[str, float]]]] | None:
    """rufus_llm's logprobs JSON: one ``{token_id: {logprob, rank, decoded_token}}`` per
    generated token, the sampled token first (vLLM's order), then the top alternatives."""
    positions = json.loads(text)
    if positions is None:
        return None
    out = []
    for pos in positions:
        entries = list(pos.values())
        if not entries:
            continue
        sampled = entries[0]
        top = sorted(entries, key=lambda e: e.get("rank") or 0)
        out.append((sampled.get("decoded_token") or "", float(sampled["logprob"]),
                    [(e.get("decoded_token") or "", float(e["logprob"])) for e in top
                     if (e.get("rank") or 0) >= 1]))
    return out


def parse_outputs(outputs: dict[str, np.ndarray]) -> Delta:
    texts = _strings(outputs.get("text_output"))
    finish = [_finish(v) for v in _strings(outputs.get("finish_reason"))] or [None] * len(texts)
    n_out_arr = outputs.get("num_output_tokens")
    n_out = [int(v) for v in np.asarray(n_out_arr).reshape(-1)] if n_out_arr is not None \
        else [0] * len(texts)
    n_in_arr = outputs.get("num_input_tokens")
    n_in = int(np.asarray(n_in_arr).reshape(-1)[0]) if n_in_arr is not None else None
    lps = [_token_logprobs(v) for v in _strings(outputs.get("logprobs"))]
    return Delta(texts, finish, n_out, n_in, lps)


# ------------------------------------------------------------------- logprobs

def _bytes(token: str) -> list[int]:
    return list(token.encode("utf-8"))


def chat_logprobs(entries: list[tuple[str, float, list[tuple[str, float]]]] | None,
                  top_n: int) -> dict[str, Any] | None:
    if entries is None:
        return None
    return {"content": [
        {"token": tok, "logprob": lp, "bytes": _bytes(tok),
         "top_logprobs": [{"token": t, "logprob": v, "bytes": _bytes(t)} for t, v in top[:top_n]]}
        for tok, lp, top in entries], "refusal": None}


def completion_logprobs(entries: list[tuple[str, float, list[tuple[str, float]]]] | None,
                        top_n: int, offset: int) -> dict[str, Any] | None:
    if entries is None:
        return None
    tokens, lps, tops, offsets = [], [], [], []
    for tok, lp, top in entries:
        tokens.append(tok)
        lps.append(lp)
        tops.append(dict(top[:top_n]) if top_n else None)
        offsets.append(offset)
        offset += len(tok)
    return {"tokens": tokens, "token_logprobs": lps, "top_logprobs": tops,
            "text_offset": offsets}


# ------------------------------------------------------------------- bodies

def usage(prompt: int, completion: int) -> dict[str, int]:
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion}


def chat_completion(rid: str, model: str, choices: list[dict[str, Any]],
                    use: dict[str, int]) -> dict[str, Any]:
    return {"id": rid, "object": "chat.completion", "created": int(time.time()), "model": model,
            "choices": choices, "usage": use, "system_fingerprint": None}


def chat_choice(index: int, text: str, finish: str | None,
                logprobs: dict[str, Any] | None) -> dict[str, Any]:
    return {"index": index, "message": {"role": "assistant", "content": text, "refusal": None},
            "logprobs": logprobs, "finish_reason": finish or "stop"}


def text_completion(rid: str, model: str, choices: list[dict[str, Any]],
                    use: dict[str, int]) -> dict[str, Any]:
    return {"id": rid, "object": "text_completion", "created": int(time.time()), "model": model,
            "choices": choices, "usage": use, "system_fingerprint": None}


def text_choice(index: int, text: str, finish: str | None,
                logprobs: dict[str, Any] | None) -> dict[str, Any]:
    return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish}


class ChunkWriter:
    """Server-sent events of one streamed response (``data: <json>\\n\\n`` ... ``[DONE]``)."""

    def __init__(self, kind: str, model: str, include_usage: bool) -> None:
        self.chat = kind == "chat"
        self.id = new_id("chatcmpl" if self.chat else "cmpl")
        self.object = "chat.completion.chunk" if self.chat else "text_completion"
        self.model = model
        self.created = int(time.time())
        self.include_usage = include_usage

    def _event(self, choices: list[dict[str, Any]], extra: dict[str, Any] | None = None,
               use: dict[str, int] | None = None) -> bytes:
        body: dict[str, Any] = {"id": self.id, "object": self.object, "created": self.created,
                                "model": self.model, "system_fingerprint": None,
                                "choices": choices}
        if self.include_usage:
            body["usage"] = use
        if extra:
            body.update(extra)
        return b"data: " + json.dumps(body, ensure_ascii=False).encode() + b"\n\n"

    def role(self, index: int = 0, extra: dict[str, Any] | None = None) -> bytes:
        """Chat streams start with the assistant role (OpenAI's first chunk)."""
        return self._event([{"index": index, "delta": {"role": "assistant", "content": ""},
                             "logprobs": None, "finish_reason": None}], extra)

    def delta(self, index: int, text: str, finish: str | None,
              logprobs: dict[str, Any] | None = None) -> bytes:
        if self.chat:
            choice = {"index": index, "delta": {"content": text} if text else {},
                      "logprobs": logprobs, "finish_reason": finish}
        else:
            choice = {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish}
        return self._event([choice])

    def usage(self, prompt: int, completion: int) -> bytes:
        return self._event([], use=usage(prompt, completion))

    @staticmethod
    def error(body: dict[str, Any]) -> bytes:
        return b"data: " + json.dumps(body).encode() + b"\n\n"

    @staticmethod
    def done() -> bytes:
        return b"data: [DONE]\n\n"
