"""Train the planner's Medusa heads by self-distillation (seeded).

Method: lab/qp/medusa_train.py. Input: the planner model (scripts/setup.sh qp)
and questions from data/qp/train.jsonl (a seeded subset: the heads learn the model's own
plans, which are short and regular). Output: data/qp/medusa_heads.{safetensors,json}.

    .venv/bin/python scripts/train_medusa.py [--heads 6 --epochs 6 --questions 800]
"""

from lab.qp.medusa_train import main

if __name__ == "__main__":
    raise SystemExit(main(doc=__doc__))
