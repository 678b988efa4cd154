"""Client for rufus_qp_medusa: one question -> one plan (gRPC stream, as the model is decoupled).

    .venv/bin/python -m rufus.qp.client "wireless earbuds under \\$50"   (or scripts/qp_client.py)
    .venv/bin/python -m rufus.qp.client --history '[{"role":"user","content":"hi"}]' "and for kids?"
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from rufus.client import (
    RequestFailed,
    bytes_tensor,
    cli_parser,
    default_url,
    infer_inputs,
    output_str,
    stream_outputs,
)
from rufus.env import exits_on_env_error
from rufus.qp.plan import Plan, as_plan

MODEL = "rufus_qp_medusa"


@dataclass
class PlanResponse:
    text: str
    plan: Plan | None  # None: the server sent no plan (an error response)
    fallback: bool
    fallback_reason: str
    token_ids: list[int]
    logprobs: Any
    latency: float


def plan(url: str, question: str | None, history: list[dict[str, str]] | None = None,
         sampling: dict[str, Any] | None = None, *, raw: dict[str, Any] | None = None,
         model: str = MODEL, timeout: float = 120.0, client: Any = None,
         slo_ms: float | None = None) -> PlanResponse:
    """Plan one question; raises :class:`RequestFailed` with the server's message on error.

    ``raw`` sends arbitrary tensors (bad-input tests); ``client`` reuses a connection (bench);
    ``slo_ms``: the plan latency this request accepts (the planner refuses at once, retryable
    UNAVAILABLE, a plan it estimates slower; default: the planner's SLO, 300 ms).
    """
    import tritonclient.grpc as grpcclient

    tensors: dict[str, np.ndarray] = {}
    if question is not None:
        tensors["question"] = bytes_tensor(question)
    if history is not None:
        tensors["history"] = bytes_tensor(history)
    if sampling is not None:
        tensors["sampling_parameters"] = bytes_tensor(sampling)
    tensors.update({k: np.asarray(v) for k, v in (raw or {}).items()})
    t0 = time.monotonic()
    outs: dict[str, Any] = {}
    for response in stream_outputs(url, model, infer_inputs(grpcclient, tensors),
                                   timeout=timeout, client=client,
                                   parameters=None if slo_ms is None else {"slo_ms": slo_ms}):
        outs = response  # the planner answers once; keep the last response's outputs
    lp = output_str(outs, "logprobs")
    return PlanResponse(
        text=output_str(outs, "text_output"),
        plan=as_plan(json.loads(output_str(outs, "plan") or "null")),
        fallback=bool(outs["fallback"].reshape(-1)[0]) if "fallback" in outs else True,
        fallback_reason=output_str(outs, "fallback_reason"),
        token_ids=[int(t) for t in outs.get("output_token_ids", np.zeros(0)).reshape(-1)],
        logprobs=json.loads(lp) if lp else None,
        latency=time.monotonic() - t0,
    )


@exits_on_env_error
def main(argv: list[str] | None = None) -> int:
    ap = cli_parser("Ask rufus_qp_medusa for a query plan")
    ap.add_argument("question")
    ap.add_argument("--model", default=MODEL)
    ap.add_argument("--history", default=None, help="previous turns as a JSON list")
    ap.add_argument("--max-tokens", type=int, default=None)
    ap.add_argument("--slo-ms", type=int, default=None,
                    help="plan latency accepted (default: the planner's SLO)")
    a = ap.parse_args(argv)
    a.url = a.url or default_url()
    try:
        r = plan(a.url, a.question, json.loads(a.history) if a.history else None,
                 {"max_tokens": a.max_tokens} if a.max_tokens else None, model=a.model,
                 slo_ms=a.slo_ms)
    except RequestFailed as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(json.dumps({"plan": r.plan, "fallback": r.fallback,
                      "fallback_reason": r.fallback_reason, "raw": r.text,
                      "latency_ms": round(r.latency * 1e3, 1)}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
