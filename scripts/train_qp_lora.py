"""Fine-tune the default model into the query planner with a LoRA adapter (seeded).

The training loop and why a LoRA: lab/qp/lora.py. Data: data/qp/train.jsonl
(scripts/make_qp_questions.py). Time on the project's 2-core machine: docs/benchmarks.md.

    .venv/bin/python scripts/train_qp_lora.py [--max-minutes 40]   # data/qp/lora.{safetensors,json}
"""

from lab.qp.lora import main

if __name__ == "__main__":
    raise SystemExit(main(doc=__doc__))
