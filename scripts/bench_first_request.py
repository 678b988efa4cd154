"""Benchmark: is the first request after "ready" as fast as the hundredth?

Starts a real tritonserver (``make serve``'s three models by default), waits until it reports
ready, then at once sends the first plain chat (rufus_llm, time to first token), the first
plan (rufus_qp_medusa, latency) and the first assistant question (rufus_assistant, time to
first answer text), then ``--steady`` more of each, one at a time, and reports each first
request against the median of the later ones.

Every request of a start carries an input not sent before in that start (each kind has its
own questions from data/qp/eval.jsonl): the hundredth customer asks a new question, and a
repeated one would be served from vLLM's and the planner's prefix caches (measured: the
assistant's answer TTFT 70 ms for a repeat vs 340-400 ms for a new question, 2026-11-25),
which made an earlier version of this benchmark, whose steady set repeated inputs, charge
the first request with the cache's gain. Start ``n`` of a setting sends question ``n`` first
and the others after it, so with ``--starts 2`` or more each first request is also compared
with the same question sent later in the other starts (``first_over_same_elsewhere``):
same input, not first, no cache. Every request is sent 0.5 s after the previous one ended
(``SETTLE_S``), the first ones too, and the benchmark's own gRPC client is imported and
connected before the first one (``client_ready``).

With ``--compare`` the same is done on starts with a baseline setting (``--baseline``: the
warm-up turned off, ``RUFUS_WARMUP=false``; the stubs' heap freeze turned off,
``RUFUS_LAB_OFF=gc_freeze``; or rufus_llm's EngineCore spawned), in the same run, starts of the two
settings alternating. Results: docs/benchmarks.md.

    .venv/bin/python scripts/bench_first_request.py [--steady 15] [--compare]
        [--baseline nowarmup|nofreeze|spawn] [--starts 2] [--repeats 0]
"""

from lab.first_request_bench import main

if __name__ == "__main__":
    raise SystemExit(main(doc=__doc__))
