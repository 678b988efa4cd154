"""The headline figures of docs/benchmarks.md and README.md are what lab/headline.py
renders from docs/results/: a value cannot be edited in one place and not the other, and the
table stays one screen (one row per figure and class, each with its class, command and date)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from lab import headline

ROOT = Path(__file__).resolve().parents[2]


def committed_rows(page: Path) -> list[list[str]]:
    """The cells of each body row of the table between the page's markers."""
    text = page.read_text()
    start, end = headline.find_block(text, str(page))
    lines = [ln for ln in text[start:end].splitlines() if ln.startswith("|")]
    return [[c.strip() for c in re.split(r"(?<!\\)\|", ln)[1:-1]] for ln in lines[2:]]


def test_the_committed_tables_are_what_the_results_give():
    stale = headline.regenerate(ROOT, write=False)
    assert not stale, (f"{[str(p.relative_to(ROOT)) for p in stale]}: run "
                       "`.venv/bin/python scripts/headline.py` after changing docs/results")


def test_every_page_has_the_markers_once():
    for page in headline.pages(ROOT):
        headline.find_block(page.path.read_text(), str(page.path))


def test_the_headline_is_one_screen():
    rows = committed_rows(ROOT / "docs" / "benchmarks.md")
    assert 0 < len(rows) <= 20
    readme = committed_rows(ROOT / "README.md")
    assert 0 < len(readme) <= 10
    # the README's rows are rows of the full table, word for word (figure, class, value, date)
    full = {(r[0], r[1]): (r[2], r[4]) for r in rows}
    assert all(full.get((r[0], r[1])) == (r[2], r[3]) for r in readme), readme


def test_every_row_names_a_cpu_class_a_command_and_a_date():
    for figure, cpu_class, value, _baseline, date, command in committed_rows(
            ROOT / "docs" / "benchmarks.md"):
        assert cpu_class in headline.CPU_CLASSES, figure
        assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", date), figure
        assert command.startswith("`") and len(command) > 4, figure
        assert value, figure


def test_one_row_per_figure_and_class():
    rows = headline.headline_rows(headline.load_results(), headline.load_spec())
    keys = [(r.figure, r.cpu_class) for r in rows]
    assert len(keys) == len(set(keys))


def test_every_result_file_is_in_the_headline():
    """docs/results/ holds what the headline cites; a superseded result is replaced, and its
    run written up in docs/benchmarks-history.md."""
    assert set(headline.load_results()) == set(headline.load_spec())


def test_two_dates_of_one_figure_and_class_are_refused():
    results = headline.load_results()
    first = next(iter(results.values()))
    older = headline.Result(**{**first.__dict__, "name": "older", "date": "2020-01-01"})
    with pytest.raises(ValueError, match="one figure and class"):
        headline.headline_rows({**results, "older": older}, [first.name, "older"])


def test_more_than_twenty_rows_are_refused():
    results = {f"r{i}": headline.Result(name=f"r{i}", figure=f"f{i}",
                                        cpu_class=headline.CPU_CLASSES[0], date="2026-01-01",
                                        command="make x", value="v") for i in range(21)}
    with pytest.raises(ValueError, match="20 at most"):
        headline.headline_rows(results, list(results))


@pytest.mark.parametrize("change, message", [
    ({"cpu_class": "AVX2"}, "cpu_class"),
    ({"date": "28 Nov"}, "date"),
    ({"command": " "}, "empty command"),
    ({"value": "{missing} ms"}, "does not render"),
    ({"colour": "red"}, "unknown keys"),
])
def test_a_bad_result_file_is_refused(change: dict, message: str):
    data = {"figure": "f", "cpu_class": headline.CPU_CLASSES[0], "date": "2026-01-01",
            "command": "make x", "value": "{p99_ms} ms", "values": {"p99_ms": 1}, **change}
    with pytest.raises(ValueError, match=message):
        headline.parse_result("bad.json", data)


def test_only_the_text_between_the_markers_changes():
    text = f"before\n{headline.BEGIN}\nold table\n{headline.END}\nafter\n"
    assert headline.replace_block(text, "\nnew\n") == (
        f"before\n{headline.BEGIN}\nnew\n{headline.END}\nafter\n")
    with pytest.raises(ValueError, match="needs one"):
        headline.replace_block("no markers\n", "x")


GOODPUT = {
    "target": "assistant", "capacity_at_slo": 2.0, "started_utc": "2026-11-28 01:00:00",
    "rows": [
        {"offered_rate": r, "achieved_rate": a, "slo_s": 1.0, "arrivals": n, "duration_s": 60.0,
         "share_within_slo": s, "goodput": g, "p50_s": 0.3, "p99_s": p99, "refused": ref,
         "refusal_p99_s": rp, "over_2x_slo": 0, "errors": 0}
        for r, a, n, s, g, p99, ref, rp in [(2.0, 1.63, 98, 1.0, 1.63, 0.5, 0, None),
                                          (4.0, 3.77, 226, 0.9, 3.39, 1.2, 5, 0.007)]],
    "requests": {"2": [{"huge": "per-request records are not copied"}]},
}


def test_a_goodput_report_becomes_a_small_result():
    data = headline.new_result(GOODPUT, figure="capacity", cpu_class=headline.CPU_CLASSES[0],
                               command="scripts/bench_goodput.py", source="build/g.json")
    assert data["date"] == "2026-11-28" and "requests" not in json.dumps(data)
    assert data["values"]["offered_rate"] == 2.0 and data["values"]["p99_ms"] == 500
    at4 = headline.new_result(GOODPUT, figure="2x", cpu_class=headline.CPU_CLASSES[0],
                              command="c", source="s", rate=4, baseline_raw=GOODPUT,
                              baseline_rate=2)
    result = headline.parse_result("at4", at4)
    assert "**3.39/s**" in result.value_text() and "refused" in result.value_text()
    assert result.baseline_text() == "1.63/s in time at 2/s nominal"
    with pytest.raises(ValueError, match="no row at offered rate"):
        headline.summarise_goodput(GOODPUT, rate=3)


def test_an_answer_eval_report_becomes_a_small_result():
    report = {"started": "2026-11-28T01:39:10", "records": [{"expect_cards": True}] * 3,
              "rates": {"questions": 3, "errors": 0, "loop_rate": 0.0, "invented_rate": 0.0,
                        "contradiction_rate": 1 / 3, "cites_shown_rate": 1.0,
                        "no_cards_when_expected": {"count": 0, "questions": []},
                        "answer_tokens_mean": 25.65, "first_token_p50_s": 0.2832,
                        "first_token_p99_s": 0.4137}}
    data = headline.new_result(report, figure="answers", cpu_class=headline.CPU_CLASSES[0],
                               command="scripts/eval_answers.py", source="build/e.json")
    text = headline.parse_result("e", data).value_text()
    assert "contradicted facts 33%" in text and "**283 / 414 ms**" in text
    assert data["values"]["expect_cards"] == 3 and data["date"] == "2026-11-28"


def test_a_new_run_keeps_the_replaced_results_figure_and_templates():
    previous = json.loads((headline.RESULTS_DIR / "assistant-capacity-amx.json").read_text())
    data = headline.new_result(GOODPUT, source="build/new.json", previous=previous)
    assert {k: data[k] for k in ("figure", "cpu_class", "command", "value")} == {
        k: previous[k] for k in ("figure", "cpu_class", "command", "value")}
    assert "baseline" not in data  # the old baseline was of the old run
    assert "1.63/s arriving" in headline.parse_result("new", data).value_text()  # new numbers
