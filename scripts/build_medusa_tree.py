"""Build the Medusa tree (``medusa_tree``) and the speculation knobs from a calibration set.

The recipe (head accuracies, measured cost model, greedy growth): rufus/qp/tree.py.
This script measures on this machine: head top-k accuracy on data/qp/calib.jsonl (disjoint
from training and eval), and the verification cost of n tokens on the engine that serves the
tree (rufus/qp/decoder/torch_llama.py, the served dtype, batch 1). Writes
model_repository/rufus_qp_medusa/1/medusa_tree.json and updates the knobs in 1/model.json.

    .venv/bin/python scripts/build_medusa_tree.py [--max-nodes 32 --questions 120]
"""

from lab.qp.build_tree import main

if __name__ == "__main__":
    raise SystemExit(main(doc=__doc__))
