"""Plan quality of the query planner on the held-out set: every field scored.

Scoring and the in-process decoder: lab/qp/evaluate.py; the post-decode filter
check: rufus/qp/filter_grounding.py. ``--engine torch`` (default) runs the served path (the torch
decoder, Medusa tree and plan grammar, batch 1) and prints the scores raw and after the
filter check; ``--engine vllm`` runs vLLM in-process for the prompt/decoding variants
compared in docs/architecture.md (un-tuned baselines: lab/qp/prompts.py).

    .venv/bin/python scripts/eval_qp.py [--json build/qp/eval.json]
    .venv/bin/python scripts/eval_qp.py --engine vllm --variants finetuned+grammar,fewshot+grammar
"""

from lab.qp.evaluate import main

if __name__ == "__main__":
    raise SystemExit(main(doc=__doc__))
