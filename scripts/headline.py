"""The headline figures of docs/benchmarks.md and README.md, generated from docs/results/.

    .venv/bin/python scripts/headline.py             # rewrite both tables from docs/results
    .venv/bin/python scripts/headline.py --check     # exit 1 if a committed table is stale
    .venv/bin/python scripts/headline.py add assistant-capacity-amx build/goodput.json \\
        --figure "..." --cpu-class "AVX-512 + bf16 + AMX (Intel Xeon, 2 cores)" \\
        --command ".venv/bin/python scripts/bench_goodput.py ..." [--rate 4] \\
        [--baseline build/goodput-before.json --baseline-rate 4]

``add`` summarises a scripts/bench_goodput.py or scripts/eval_answers.py report into
docs/results/NAME.json. An existing NAME is replaced, keeping its figure, class, command and
cell templates unless given (so a new run of a shown figure needs only NAME and the report);
a new NAME must be listed in docs/results/headline.json. Then rerun without arguments.
How it works: lab/headline.py.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lab.headline import main

if __name__ == "__main__":
    raise SystemExit(main(doc=__doc__))
