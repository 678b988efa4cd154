"""The first minute after ready against the tenth, on one fresh stack (issue 60: "warm from
the first request").

One stack (make serve's three models on free ports) is started; the same Poisson rate is
measured right after ready (no warm-up request, no idle gap) on one half of the held-out
questions, then other traffic (the first half again, at a lower rate) runs until the chosen
minute, and the rate is measured again on the other half. Both windows meet
questions the stack has not seen, so neither is flattered by the prefix cache or the
planner's served plans. How each window is measured: lab/goodput.py.

    .venv/bin/python -m lab.first_minute --rate 0.75 --minute 10
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from lab import goodput

ROOT = Path(__file__).resolve().parent.parent


def halves(path: Path, out_dir: Path) -> tuple[Path, Path]:
    """The question file split in two by line (odd and even), written under ``out_dir``."""
    lines = [x for x in path.read_text().splitlines() if x.strip()]
    a, b = out_dir / "first-minute-a.jsonl", out_dir / "first-minute-b.jsonl"
    a.write_text("\n".join(lines[0::2]) + "\n")
    b.write_text("\n".join(lines[1::2]) + "\n")
    return a, b


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", choices=["assistant", "planner"], default="assistant")
    ap.add_argument("--rate", type=float, default=0.75, help="measured rate, requests/s")
    ap.add_argument("--window", type=float, default=60.0, help="each measured window (s)")
    ap.add_argument("--minute", type=float, default=10.0,
                    help="the second window starts this many minutes after ready")
    ap.add_argument("--filler-rate", type=float, default=0.4,
                    help="requests/s between the two windows (the first half's questions again)")
    ap.add_argument("--out", default=str(ROOT / "build" / "first-minute.json"))
    a = ap.parse_args(argv)
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    first, tenth = halves(goodput.QUESTIONS_PATH, out.parent)

    def window(url: str, questions: Path, rate: float, duration: float, name: str,
               gap: float) -> dict:
        path = out.parent / f"first-minute-{name}.json"
        goodput.main(["--target", a.target, "--url", url, "--rates", f"{rate:g}",
                      "--duration", f"{duration:g}", "--warmup", "0", "--gap", f"{gap:g}",
                      "--questions", str(questions), "--out", str(path)])
        return json.loads(path.read_text())

    log = out.parent / "first-minute-stack.log"
    with goodput.fresh_stack(a.target, log) as (url, _metrics):
        ready = time.monotonic()
        print(f"== minute 1: {a.rate:g}/s right after ready", flush=True)
        one = window(url, first, a.rate, a.window, "1", 0.0)
        rest = ready + a.minute * 60 - time.monotonic() - 15  # the filler's drain
        if rest > 10:
            print(f"== other traffic for {rest:.0f} s at {a.filler_rate:g}/s", flush=True)
            window(url, first, a.filler_rate, rest, "filler", 0.0)
        at = (time.monotonic() - ready) / 60
        print(f"== minute {at:.1f}: {a.rate:g}/s again", flush=True)
        later = window(url, tenth, a.rate, a.window, "later", 2.0)
    keys = ("offered_rate", "arrivals", "share_within_slo", "p50_s", "p99_s", "refused")
    result = {"target": a.target, "rate": a.rate, "window_s": a.window,
              "second_window_minute": round(at, 1),
              "first": {k: one["rows"][0].get(k) for k in keys},
              "later": {k: later["rows"][0].get(k) for k in keys}, "cpu": one.get("cpu")}
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
