"""Client for rufus_qp_medusa: one question -> one plan (gRPC stream, as the model is decoupled).

    .venv/bin/python scripts/qp_client.py "wireless earbuds under \\$50"
    .venv/bin/python scripts/qp_client.py --history '[{"role":"user","content":"hi"}]' "and for kids?"
"""

from __future__ import annotations

import argparse
import json
import queue
import sys
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from rufus.client import DEFAULT_URL, RequestFailed, _outputs, _status

MODEL = "rufus_qp_medusa"


@dataclass
class PlanResponse:
    text: str
    plan: dict[str, Any]
    fallback: bool
    fallback_reason: str
    token_ids: list[int]
    logprobs: Any
    latency: float


def _s(outputs: dict[str, Any], name: str) -> str:
    arr = outputs.get(name)
    if arr is None or arr.size == 0:
        return ""
    v = arr.reshape(-1)[0]
    return v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)


def plan(url: str, question: str | None, history: list[dict[str, str]] | None = None,
         sampling: dict[str, Any] | None = None, *, raw: dict[str, Any] | None = None,
         model: str = MODEL, timeout: float = 120.0, client: Any = None) -> PlanResponse:
    """Plan one question; raises :class:`RequestFailed` with the server's message on error.

    ``raw`` sends arbitrary tensors (bad-input tests); ``client`` reuses a connection (bench).
    """
    import tritonclient.grpc as grpcclient

    tensors: dict[str, np.ndarray] = {}
    if question is not None:
        tensors["question"] = np.array([question.encode("utf-8")], dtype=np.object_)
    if history is not None:
        tensors["history"] = np.array([json.dumps(history).encode()], dtype=np.object_)
    if sampling is not None:
        tensors["sampling_parameters"] = np.array([json.dumps(sampling).encode()],
                                                  dtype=np.object_)
    tensors.update({k: np.asarray(v) for k, v in (raw or {}).items()})
    inputs = []
    for name, arr in tensors.items():
        inp = grpcclient.InferInput(name, list(arr.shape),
                                    "BYTES" if arr.dtype == np.object_ else "INT32")
        inp.set_data_from_numpy(arr)
        inputs.append(inp)
    own = client is None
    client = client or grpcclient.InferenceServerClient(url)
    q: queue.Queue[Any] = queue.Queue()
    t0 = time.monotonic()
    try:
        client.start_stream(callback=lambda result, error: q.put((result, error)),
                            stream_timeout=timeout)
        client.async_stream_infer(model, inputs, enable_empty_final_response=True)
        outs: dict[str, Any] = {}
        while True:
            result, error = q.get(timeout=timeout)
            if error is not None:
                raise RequestFailed(str(error), _status(error))
            resp = result.get_response()
            if resp.outputs:
                outs = _outputs(result)
            final = resp.parameters.get("triton_final_response")
            if final is not None and final.bool_param:
                break
    finally:
        client.stop_stream(cancel_requests=True)
        if own:
            client.close()
    lp = _s(outs, "logprobs")
    return PlanResponse(
        text=_s(outs, "text_output"),
        plan=json.loads(_s(outs, "plan") or "null"),
        fallback=bool(outs["fallback"].reshape(-1)[0]) if "fallback" in outs else True,
        fallback_reason=_s(outs, "fallback_reason"),
        token_ids=[int(t) for t in outs.get("output_token_ids", np.zeros(0)).reshape(-1)],
        logprobs=json.loads(lp) if lp else None,
        latency=time.monotonic() - t0,
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Ask rufus_qp_medusa for a query plan")
    ap.add_argument("question")
    ap.add_argument("--url", default=DEFAULT_URL)
    ap.add_argument("--model", default=MODEL)
    ap.add_argument("--history", default=None, help="previous turns as a JSON list")
    ap.add_argument("--max-tokens", type=int, default=None)
    a = ap.parse_args(argv)
    try:
        r = plan(a.url, a.question, json.loads(a.history) if a.history else None,
                 {"max_tokens": a.max_tokens} if a.max_tokens else None, model=a.model)
    except RequestFailed as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(json.dumps({"plan": r.plan, "fallback": r.fallback,
                      "fallback_reason": r.fallback_reason, "raw": r.text,
                      "latency_ms": round(r.latency * 1e3, 1)}, indent=1))
    return 0
