"""The headline figures: one table generated from small JSON results, so it cannot drift.

docs/benchmarks.md and README.md open with the current value of each figure per CPU class.
Typed by hand, such a table drifted from the runs behind it and kept superseded rows beside
current ones. Here each cited result is one file in docs/results/ (the figure, its CPU
class, the numbers, a baseline measured in the same run where there is one, the command,
the date) and docs/results/headline.json lists which of them the table shows, in order.
The table is rendered between two marker lines in each page; tests/unit/test_headline.py
checks that the committed tables are what this module renders.

A result's cells are format strings over its own ``values`` (``"p99 {p99_ms:,} ms"``), so a
number is written once, in the JSON. :func:`new_result` summarises a benchmark's own JSON
output (``scripts/bench_goodput.py``, ``scripts/eval_answers.py``) into such a file;
figures measured before results were kept are transcribed, their ``source`` naming the
section of docs/benchmarks-history.md they come from.

scripts/headline.py is the CLI (:func:`main`).
"""

from __future__ import annotations

import argparse
import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS_DIR = ROOT / "docs" / "results"
SPEC_NAME = "headline.json"
BEGIN = "<!-- headline:begin -->"
END = "<!-- headline:end -->"
MAX_ROWS = 20

# The classes a figure may be measured on. A fixed list, so that a typo cannot make a second
# "class" of one figure; add a line here for a new machine.
CPU_CLASSES = (
    "AVX-512 + bf16 + AMX (Intel Xeon, 2 cores)",
    "AVX-512 + bf16 (AMD EPYC, 2 cores)",
    "AVX-512 + bf16, no AMX (Intel Xeon, 2 cores)",
    "AVX-512 without bf16 (Intel Xeon, 2 cores)",
    "emulated AVX2 (on the Intel Xeon AMX VM)",
    "emulated AVX2 (on the AMD EPYC VM)",
    "AVX2, no AVX-512 (AMD EPYC, 2 cores)",
)

_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")
_REQUIRED = ("figure", "cpu_class", "date", "command", "value", "values")

# Default value/baseline cells for results summarised from a benchmark's JSON.
TEMPLATES: dict[str, dict[str, str]] = {
    "goodput": {
        "value": ("**{goodput:.2f}/s** in time at {offered_rate:g}/s nominal ({achieved_rate:.2f} "
                  "arriving): {share_within_pct:.1f}% within {slo_ms:,} ms, p50 / p99 {p50_ms:,} / "
                  "{p99_ms:,} ms, {refused} refused, {over_2x_slo} accepted over twice the SLO"),
        "baseline": "{baseline_goodput:.2f}/s in time at {baseline_offered_rate:g}/s nominal",
    },
    "eval_answers": {
        "value": ("loops {loop_pct:.0f}% / invented products {invented_pct:.0f}% / contradicted "
                  "facts {contradicted_pct:.0f}% / cite a shown card {cites_shown_pct:.0f}%; "
                  "first answer text p50 / p99 **{first_text_p50_ms:,} / {first_text_p99_ms:,} ms**"),
        "baseline": ("{baseline_questions} questions: {baseline_loop_pct:.0f}% / "
                     "{baseline_invented_pct:.0f}% / {baseline_contradicted_pct:.0f}% / "
                     "{baseline_cites_shown_pct:.0f}%"),
    },
}


@dataclass(frozen=True)
class Result:
    """One benchmark result the headline may cite (a file in docs/results/)."""

    name: str
    figure: str
    cpu_class: str
    date: str
    command: str
    value: str
    values: Mapping[str, Any] = field(default_factory=dict)
    baseline: str = ""
    source: str = ""

    def value_text(self) -> str:
        return self.value.format_map(self.values)

    def baseline_text(self) -> str:
        return self.baseline.format_map(self.values) if self.baseline else ""


def parse_result(name: str, data: Mapping[str, Any]) -> Result:
    """A :class:`Result` from a result file's JSON object; errors name the file and key."""
    missing = [k for k in _REQUIRED if k not in data]
    if missing:
        raise ValueError(f"{name}: missing {missing}")
    unknown = sorted(set(data) - {*_REQUIRED, "baseline", "source"})
    if unknown:
        raise ValueError(f"{name}: unknown keys {unknown}")
    if data["cpu_class"] not in CPU_CLASSES:
        raise ValueError(f"{name}: cpu_class {data['cpu_class']!r} is not one of {CPU_CLASSES}")
    if not _DATE.match(str(data["date"])):
        raise ValueError(f"{name}: date {data['date']!r} is not YYYY-MM-DD")
    if not str(data["command"]).strip():
        raise ValueError(f"{name}: empty command")
    if not isinstance(data["values"], dict):
        raise ValueError(f"{name}: values must be an object")
    result = Result(name=name, figure=data["figure"], cpu_class=data["cpu_class"],
                    date=data["date"], command=data["command"], value=data["value"],
                    values=data["values"], baseline=data.get("baseline", ""),
                    source=data.get("source", ""))
    try:
        result.value_text()
        result.baseline_text()
    except (KeyError, ValueError, IndexError) as e:
        raise ValueError(f"{name}: a template does not render from its values: {e!r}") from e
    return result


def load_results(directory: Path = RESULTS_DIR) -> dict[str, Result]:
    """Every result file in ``directory`` by name (the file's stem); the spec is not one."""
    results = {}
    for path in sorted(directory.glob("*.json")):
        if path.name != SPEC_NAME:
            results[path.stem] = parse_result(path.stem, json.loads(path.read_text()))
    return results


def load_spec(directory: Path = RESULTS_DIR, key: str = "rows") -> list[str]:
    """The names of the results a headline shows, in order (docs/results/headline.json):
    ``rows`` for docs/benchmarks.md, ``readme`` for the README's shorter table (a subset)."""
    spec = json.loads((directory / SPEC_NAME).read_text())
    names = list(spec[key])
    if key != "rows":
        extra = [n for n in names if n not in spec["rows"]]
        if extra:
            raise ValueError(f"{SPEC_NAME}: {key!r} names results that are not in 'rows': {extra}")
    return names


def headline_rows(results: Mapping[str, Result], spec: Sequence[str]) -> list[Result]:
    """The spec's results in order: at most :data:`MAX_ROWS`, one per figure and class."""
    unknown = [n for n in spec if n not in results]
    if unknown:
        raise ValueError(f"{SPEC_NAME} names results that do not exist: {unknown}")
    if len(spec) > MAX_ROWS:
        raise ValueError(f"{SPEC_NAME} has {len(spec)} rows; the headline holds {MAX_ROWS} at most")
    seen: dict[tuple[str, str], str] = {}
    for name in spec:
        key = (results[name].figure, results[name].cpu_class)
        if key in seen:
            raise ValueError(f"{name} and {seen[key]}: two results of one figure and class "
                             f"({key[0]!r}, {key[1]!r}); cite the current one only")
        seen[key] = name
    return [results[n] for n in spec]


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _code(command: str) -> str:
    return "`" + " ".join(command.split()).replace("|", "\\|") + "`"


def render_table(rows: Iterable[Result], *, compact: bool = False) -> str:
    """The markdown table; ``compact`` (the README) leaves out baselines and commands."""
    if compact:
        lines = ["| figure | CPU class | value | date |", "|---|---|---|---|"]
        lines += [f"| {_cell(r.figure)} | {_cell(r.cpu_class)} | {_cell(r.value_text())} | "
                  f"{r.date} |" for r in rows]
    else:
        lines = ["| figure | CPU class | value | compared with (same run unless said) | date | command |",
                 "|---|---|---|---|---|---|"]
        lines += [f"| {_cell(r.figure)} | {_cell(r.cpu_class)} | {_cell(r.value_text())} | "
                  f"{_cell(r.baseline_text()) or '-'} | {r.date} | {_code(r.command)} |"
                  for r in rows]
    return "\n".join(lines)


GENERATED = ("<!-- generated by scripts/headline.py from docs/results/*.json: edit those and "
             "rerun it, not this table -->")


@dataclass(frozen=True)
class Page:
    """A document that holds the headline between the marker lines."""

    path: Path
    compact: bool
    footer: str = ""
    spec: str = "rows"  # which list of headline.json the page shows


def pages(root: Path = ROOT) -> list[Page]:
    """docs/benchmarks.md (the full table) and README.md (compact, the rows a newcomer asks
    about first: it links to the full one below its block)."""
    return [
        Page(root / "docs" / "benchmarks.md", compact=False),
        Page(root / "README.md", compact=True, spec="readme"),
    ]


def render_block(page: Page, rows: Sequence[Result]) -> str:
    """What goes between the markers of ``page`` (markers excluded)."""
    footer = f"\n{page.footer}\n" if page.footer else ""
    return f"\n{GENERATED}\n\n{render_table(rows, compact=page.compact)}\n{footer}"


def find_block(text: str, where: str = "the page") -> tuple[int, int]:
    """Start and end offsets of the text between the markers; an error if they are not there
    exactly once each, in order."""
    if text.count(BEGIN) != 1 or text.count(END) != 1:
        raise ValueError(f"{where}: needs one {BEGIN} line and one {END} line")
    start = text.index(BEGIN) + len(BEGIN)
    end = text.index(END)
    if end < start:
        raise ValueError(f"{where}: {END} comes before {BEGIN}")
    return start, end


def replace_block(text: str, block: str, where: str = "the page") -> str:
    """``text`` with only what lies between the markers replaced by ``block``."""
    start, end = find_block(text, where)
    return text[:start] + block + text[end:]


def regenerate(root: Path = ROOT, results_dir: Path | None = None, *,
               write: bool = True) -> list[Path]:
    """Render the headline into every page; the pages whose block changed (or, with
    ``write=False``, would change: a check that the committed tables are current)."""
    directory = results_dir or root / "docs" / "results"
    results = load_results(directory)
    changed = []
    for page in pages(root):
        rows = headline_rows(results, load_spec(directory, page.spec))
        text = page.path.read_text()
        new = replace_block(text, render_block(page, rows), str(page.path))
        if new != text:
            changed.append(page.path)
            if write:
                page.path.write_text(new)
    return changed


# --- summarising a benchmark's own JSON into a result's values ---------------------------


def _ms(seconds: float | None) -> int | None:
    return None if seconds is None else round(seconds * 1000)


def _pct(share: float) -> float:
    return round(share * 100, 1)


def summarise_goodput(raw: Mapping[str, Any], rate: float | None = None) -> dict[str, Any]:
    """One row of a ``scripts/bench_goodput.py`` report as flat values: the row at offered
    ``rate``, or at the sweep's capacity at the SLO (the highest rate with >= 99% in time)."""
    rows = raw["rows"]
    want = raw.get("capacity_at_slo") if rate is None else rate
    if want is None:
        raise ValueError("no rate met the SLO in this sweep: name the row with a rate")
    row = next((r for r in rows if math.isclose(r["offered_rate"], float(want))), None)
    if row is None:
        raise ValueError(f"no row at offered rate {want}; rates: {[r['offered_rate'] for r in rows]}")
    return {
        "target": raw.get("target", ""),
        "slo_ms": _ms(row["slo_s"]),
        "offered_rate": row["offered_rate"],
        "achieved_rate": round(row["achieved_rate"], 3),
        "arrivals": row["arrivals"],
        "duration_s": row["duration_s"],
        "share_within_pct": _pct(row["share_within_slo"]),
        "goodput": round(row["goodput"], 3),
        "p50_ms": _ms(row["p50_s"]),
        "p99_ms": _ms(row["p99_s"]),
        "refused": row["refused"],
        "refusal_p99_ms": _ms(row.get("refusal_p99_s")),
        "over_2x_slo": row["over_2x_slo"],
        "errors": row["errors"],
        "capacity_at_slo": raw.get("capacity_at_slo"),
        "started_utc": raw.get("started_utc", ""),
    }


def summarise_eval_answers(raw: Mapping[str, Any]) -> dict[str, Any]:
    """A ``scripts/eval_answers.py`` report's rates as flat values (not its records)."""
    rates = raw["rates"]
    records = raw.get("records", [])
    return {
        "questions": rates["questions"],
        "errors": rates["errors"],
        "loop_pct": _pct(rates["loop_rate"]),
        "invented_pct": _pct(rates["invented_rate"]),
        "contradicted_pct": _pct(rates["contradiction_rate"]),
        "cites_shown_pct": _pct(rates["cites_shown_rate"]),
        "no_cards_when_expected": rates["no_cards_when_expected"]["count"],
        "expect_cards": sum(1 for r in records if r.get("expect_cards")),
        "answer_tokens_mean": round(rates["answer_tokens_mean"], 1),
        "first_text_p50_ms": _ms(rates["first_token_p50_s"]),
        "first_text_p99_ms": _ms(rates["first_token_p99_s"]),
        "started": raw.get("started", ""),
    }


def benchmark_kind(raw: Mapping[str, Any]) -> str:
    """Which benchmark wrote ``raw``: ``goodput`` or ``eval_answers``."""
    if isinstance(raw.get("rows"), list) and "capacity_at_slo" in raw:
        return "goodput"
    if isinstance(raw.get("rates"), dict) and "loop_rate" in raw["rates"]:
        return "eval_answers"
    raise ValueError("not a bench_goodput.py or eval_answers.py report")


def summarise(raw: Mapping[str, Any], rate: float | None = None) -> dict[str, Any]:
    """Flat values from either benchmark's report (``rate``: goodput's row)."""
    if benchmark_kind(raw) == "goodput":
        return summarise_goodput(raw, rate)
    return summarise_eval_answers(raw)


def _run_date(raw: Mapping[str, Any]) -> str:
    stamp = str(raw.get("started_utc") or raw.get("started") or "")
    return stamp[:10] if _DATE.match(stamp[:10]) else ""


def new_result(raw: Mapping[str, Any], *, figure: str | None = None,
               cpu_class: str | None = None, command: str | None = None, source: str,
               rate: float | None = None,
               baseline_raw: Mapping[str, Any] | None = None, baseline_rate: float | None = None,
               value: str | None = None, baseline: str | None = None, date: str | None = None,
               previous: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A result file's JSON object from a benchmark's report (and a baseline report of the
    same run, its values prefixed ``baseline_``). What is not given comes from ``previous``
    (the result this one replaces: its figure, class, command and cell templates), then from
    :data:`TEMPLATES`; a previous baseline cell is kept only with a new baseline report."""
    kind = benchmark_kind(raw)
    prev = previous or {}
    values = summarise(raw, rate)
    if baseline_raw is not None:
        values.update({f"baseline_{k}": v for k, v in summarise(baseline_raw, baseline_rate).items()})
    data: dict[str, Any] = {
        "figure": figure or prev.get("figure", ""),
        "cpu_class": cpu_class or prev.get("cpu_class", ""),
        "date": date or _run_date(raw),
        "command": command or prev.get("command", ""),
        "value": value or prev.get("value") or TEMPLATES[kind]["value"],
        "values": values,
    }
    if baseline:
        data["baseline"] = baseline
    elif baseline_raw is not None:
        data["baseline"] = prev.get("baseline") or TEMPLATES[kind]["baseline"]
    data["source"] = source
    if not data["figure"]:
        raise ValueError("a new result needs a figure")
    parse_result("the new result", data)  # fails here, not at the next regeneration
    return data


def write_result(path: Path, data: Mapping[str, Any]) -> None:
    """One result file, in the layout the committed ones have."""
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n")





def main(argv: list[str] | None = None, doc: str = __doc__) -> int:
    ap = argparse.ArgumentParser(description=doc,
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
    add.add_argument("--cpu-class", default=None, choices=CPU_CLASSES)
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
        path = RESULTS_DIR / f"{args.name}.json"
        previous = json.loads(path.read_text()) if path.exists() else None
        data = new_result(
            raw, figure=args.figure, cpu_class=args.cpu_class, command=args.command,
            source=source, rate=args.rate, baseline_raw=base, baseline_rate=args.baseline_rate,
            value=args.value, baseline=args.baseline_text, date=args.date, previous=previous)
        write_result(path, data)
        print(f"wrote {path.relative_to(ROOT)}")
        if args.name not in load_spec():
            print(f"not in the headline yet: add {args.name!r} to docs/results/headline.json")
        return 0

    changed = regenerate(write=not args.check)
    for path in changed:
        print(f"{'stale' if args.check else 'rewrote'}: {path.relative_to(ROOT)}")
    return 1 if args.check and changed else 0

