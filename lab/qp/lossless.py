"""Greedy losslessness check: Medusa output vs autoregressive output of the same model.

Speculative decoding with greedy acceptance is exact in exact arithmetic. In bf16 (and, less
often, fp32) the verification pass computes the same logits with a different batch shape
(k+1 positions instead of 1), so a near-tie between the top two tokens can flip and the
outputs diverge from there. An output therefore passes when it is identical, or when at its
first differing token the autoregressive run's logit gap between its own token and the
Medusa token is below ``NEAR_TIE_NATS`` (log-probabilities from the same softmax, so their
difference is the logit difference).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

NEAR_TIE_NATS = 0.25
LOGPROBS_K = 5


@dataclass
class Comparison:
    identical: bool
    first_diff: int = -1
    gap: float | None = None  # AR logit gap at the first difference (None: not in top-k)

    @property
    def ok(self) -> bool:
        return self.identical or (self.gap is not None and self.gap <= NEAR_TIE_NATS)


def first_difference(a: list[int], b: list[int]) -> int:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return -1 if len(a) == len(b) else min(len(a), len(b))


def compare(ar_ids: list[int], md_ids: list[int], ar_logprobs: Any) -> Comparison:
    """``ar_logprobs``: the AR run's per-position ``{token_id: {"logprob": ...}}`` list."""
    i = first_difference(ar_ids, md_ids)
    if i < 0:
        return Comparison(True)
    gap = None
    if ar_logprobs and i < len(ar_logprobs) and i < len(ar_ids) and i < len(md_ids):
        pos = ar_logprobs[i]
        a, m = pos.get(str(ar_ids[i])), pos.get(str(md_ids[i]))
        if a is not None and m is not None:
            gap = float(a["logprob"]) - float(m["logprob"])
    return Comparison(False, i, gap)
