"""Open-loop goodput: requests per second answered within a latency SLO, per offered rate.

Seeded Poisson arrivals of the 195 held-out single-turn product questions
(data/assistant/answers_eval.jsonl), each request started at its time however many are in
flight; latency counted from the scheduled time. How it is measured: lab/goodput.py.
Against a running stack, or a new stack per rate with --fresh-stack:

    .venv/bin/python scripts/bench_goodput.py --target assistant --url 127.0.0.1:8001
    .venv/bin/python scripts/bench_goodput.py --target planner --url 127.0.0.1:8001 --rates 1 2 4 8
    .venv/bin/python scripts/bench_goodput.py --target openai --url http://127.0.0.1:9000
    .venv/bin/python scripts/bench_goodput.py --target assistant --fresh-stack --rates 5 6 7 --duration 26

New customers' questions: the warm-up and the rates take one cycle through the questions,
so none is asked twice until all have been; a repeated question is cheaper (its plan is
drafted from the planner's served plans, its answer prompt is in vLLM's prefix cache), and
the "rep" column counts them. For figures on new questions, keep each rate's window within
the questions (rate x duration + warm-up <= 195) on a stack that has not seen them:
--fresh-stack.

Targets and the measured event (default SLO): assistant, rufus_assistant over gRPC, first
answer text (1.0 s); planner, rufus_qp_medusa over gRPC, the plan (0.3 s); openai, the
OpenAI frontend's streaming chat completions of rufus-assistant, the first content after the
product list (1.0 s; the list itself is reported as "cards").

Columns: offered rate, achieved arrivals/s, arrivals, completed, p50/p90/p99 latency (ms) of
the answered requests, share of ALL arrivals within the SLO (%), goodput (within-SLO
requests per second of the window), refused (retryable error before any response) and their
p99 latency, answered later than 2x the SLO, other errors (late included), the client's p99
schedule lag (ms: large means the client itself could not keep up), repeated questions,
load average.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lab.goodput import main

if __name__ == "__main__":
    raise SystemExit(main(doc=__doc__))
