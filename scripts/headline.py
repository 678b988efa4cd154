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
How it works: rufus/harness/headline.py.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rufus.harness import headline  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true",
                    help="change nothing; exit 1 if a page's table is not what docs/results gives")
    sub = ap.add_subparsers(dest="cmd")
    add = sub.add_parser("add", help="write docs/results/NAME.json from a benchmark's JSON report")
    add.add_argument("name", help="result name (file stem), e.g. assistant-capacity-amx")
    add.add_argument("report", type=Path, help="the benchmark's --json/--out file")
    add.add_argument("--figure", default=None,
                     help="what is measured; the same text as the figure's other classes "
                          "(default: the replaced result's, as for the next three)")
    add.add_argument("--cpu-class", default=None, choices=headline.CPU_CLASSES)
    add.add_argument("--command", default=None, help="the command that reproduces it")
    add.add_argument("--rate", type=float, default=None,
                     help="goodput: the offered rate's row (default: the capacity at the SLO)")
    add.add_argument("--baseline", type=Path, default=None,
                     help="a report of the same run's baseline (values prefixed baseline_)")
    add.add_argument("--baseline-rate", type=float, default=None)
    add.add_argument("--value", default=None, help="value cell template (default per benchmark)")
    add.add_argument("--baseline-text", default=None, help="baseline cell template")
    add.add_argument("--date", default=None, help="YYYY-MM-DD (default: the report's start)")
    add.add_argument("--source", default=None,
                     help="where the run is written up (default: the report's path)")
    args = ap.parse_args(argv)

    if args.cmd == "add":
        raw = json.loads(args.report.read_text())
        base = json.loads(args.baseline.read_text()) if args.baseline else None
        source = args.source or (
            str(args.report) + (f"; baseline {args.baseline}" if args.baseline else ""))
        path = headline.RESULTS_DIR / f"{args.name}.json"
        previous = json.loads(path.read_text()) if path.exists() else None
        data = headline.new_result(
            raw, figure=args.figure, cpu_class=args.cpu_class, command=args.command,
            source=source, rate=args.rate, baseline_raw=base, baseline_rate=args.baseline_rate,
            value=args.value, baseline=args.baseline_text, date=args.date, previous=previous)
        headline.write_result(path, data)
        print(f"wrote {path.relative_to(ROOT)}")
        if args.name not in headline.load_spec():
            print(f"not in the headline yet: add {args.name!r} to docs/results/headline.json")
        return 0

    changed = headline.regenerate(write=not args.check)
    for path in changed:
        print(f"{'stale' if args.check else 'rewrote'}: {path.relative_to(ROOT)}")
    return 1 if args.check and changed else 0


if __name__ == "__main__":
    raise SystemExit(main())
