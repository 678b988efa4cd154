"""Shopping assistant under closed-loop conversations: time to cards and to first answer
token, stage breakdown, conversations/s, at several concurrencies, against a baseline in the
same run (the answer model alone, same prompts, same concurrency).

    python scripts/bench_assistant.py                          # starts its own tritonserver
    python scripts/bench_assistant.py --url 127.0.0.1:8001     # against `make serve`
    python scripts/bench_assistant.py --concurrency 1 4 16 --conversations 12 16 32
    python scripts/bench_assistant.py --concurrency 1 --conversations 60 --questions eval

Conversations are a fixed mix of intents (search with filters, comparison, product
question, recommendation, order status, returns, off-topic), a third of them multi-turn (or,
with ``--questions eval``, the held-out product questions, each once: every prompt cold); each
worker runs them back to back (closed loop), every turn through the Triton model
``rufus_assistant`` with the previous turns as history. Stage times (plan, retrieval,
answer TTFT) come from the server's ``timings``; cards and first-answer-token times are
measured by this client. Baseline phase: the same answer prompts (retrieved locally for the
same questions) sent straight to rufus_llm.
"""

from lab.assistant_bench import main

if __name__ == "__main__":
    raise SystemExit(main(doc=__doc__))
