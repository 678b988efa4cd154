"""scripts/assistant.py's timings line: seconds as milliseconds, token counts as counts
(it printed "answer_tokens 22000 ms")."""

from rufus.assistant.cli import _timing


def test_timings_keep_their_units():
    assert _timing("plan_s", 0.1234) == "plan 123 ms"
    assert _timing("answer_tokens", 22.0) == "answer_tokens 22"
    assert _timing("answer_prompt_tokens", 163.0) == "answer_prompt_tokens 163"
