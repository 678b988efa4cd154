"""The docker compose rig from the outside: what the container tests and the rolling-update
benchmark drive (docker/compose.yaml through scripts/compose.sh, HAProxy's stats page, real
clients through the ingress).

    python -m rufus.harness.containers smoke            # every kind of request, via the ingress
    python -m rufus.harness.containers roll --tag cpu-new [--concurrency 4]

``roll`` retags the current image (or uses ``--image``), streams a closed-loop load through
the ingress, runs scripts/rolling_update.sh under it and reports requests served and failed
and the first-token times before and during the roll (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from proxy.haproxy import stat_servers
from rufus.harness.loadgen import SHOPPING_PROMPTS, pct

ROOT = Path(__file__).resolve().parents[2]
GRPC = "localhost:8001"
OPENAI = "http://localhost:9000/v1"
STATS = "http://127.0.0.1:8404/stats;csv"
CELLS = {"a": ("leader", "follower", "agent", "unit0"),
         "b": ("leader-b", "follower-b", "agent-b", "unit1")}


def say(msg: str) -> None:
    print(f"[containers {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------ the rig
def compose(*args: str, check: bool = True, timeout: float = 600) -> str:
    """``docker compose`` (v2 or 1.29) on the rig, through scripts/compose.sh (secrets)."""
    r = subprocess.run(["bash", str(ROOT / "scripts/compose.sh"), "--", *args],
                       capture_output=True, text=True, timeout=timeout, check=False)
    if check and r.returncode != 0:
        raise RuntimeError(f"compose {' '.join(args)}: {r.stderr.strip()[-2000:]}")
    return r.stdout


def container_id(service: str) -> str:
    return compose("ps", "-q", service).strip()


def inspect(service: str, fmt: str) -> str:
    cid = container_id(service)
    if not cid:
        return ""
    r = subprocess.run(["docker", "inspect", "-f", fmt, cid], capture_output=True, text=True,
                       check=False)
    return r.stdout.strip()


def restarts(service: str) -> int:
    return int(inspect(service, "{{.RestartCount}}") or 0)


def crash(service: str) -> int:
    """SIGKILL the container's main process from the host, as a crash or the kernel's OOM
    killer would: Docker's restart policy applies. (``docker kill`` is an operator stop
    for Docker, and a container stopped that way is not restarted: deploy/README.md.)"""
    pid = int(inspect(service, "{{.State.Pid}}") or 0)
    if pid <= 0:
        raise RuntimeError(f"{service} is not running")
    os.kill(pid, signal.SIGKILL)
    return pid


def docker_kill(service: str) -> None:
    subprocess.run(["docker", "kill", container_id(service)], capture_output=True, check=True)


def ingress_state() -> dict[str, dict[str, str]]:
    """HAProxy's view, per server of the gRPC backend: status (UP/DOWN/...) and streams open."""
    with urllib.request.urlopen(STATS, timeout=5) as r:
        servers = stat_servers(r.read().decode(), "units_lor")
    return {name: {"status": row["status"], "scur": row["scur"]} for name, row in servers.items()}


def in_rotation(strict: bool = False) -> set[str]:
    """Cells HAProxy has UP. An unreadable stats page counts as none, unless ``strict``
    (then it raises: a monitor must not record a stats read that timed out under load as
    "no cell in rotation")."""
    try:
        state = ingress_state()
    except (OSError, ValueError, IndexError):
        if strict:
            raise
        return set()
    return {cell for cell, (*_, unit) in CELLS.items()
            if state.get(unit, {}).get("status", "").startswith("UP")}


def wait_until(pred: Any, timeout: float, interval: float = 1.0) -> float | None:
    """Seconds until ``pred()`` held, or None at the timeout."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if pred():
            return time.monotonic() - t0
        time.sleep(interval)
    return None


# ------------------------------------------------------------------------------ clients
def chat_stream(prompt: str, max_tokens: int = 16, timeout: float = 300.0,
                retries: int = 0) -> dict[str, Any]:
    """rufus_llm over gRPC streaming through the ingress."""
    from rufus.client import generate

    t0, first, text, n = time.monotonic(), None, "", 0
    for ch in generate(GRPC, "rufus_llm", messages=[{"role": "user", "content": prompt}],
                       sampling={"max_tokens": max_tokens, "temperature": 0.0},
                       timeout=timeout, retries=retries):
        if ch.text and first is None:
            first = ch.t - t0
        text += ch.text
        n += 1
    return {"text": text, "chunks": n, "ttft_s": first}


def plan(question: str) -> dict[str, Any]:
    from rufus.qp.client import plan as qp_plan

    r = qp_plan(GRPC, question)
    return r.plan if hasattr(r, "plan") else dict(r)


def assistant(question: str, timeout: float = 300.0) -> dict[str, Any]:
    """rufus_assistant over gRPC through the ingress: cards, then the streamed answer."""
    import tritonclient.grpc as grpcclient

    from rufus.client import bytes_tensor, infer_inputs, output_str, stream_outputs

    out: dict[str, Any] = {"text": "", "products": []}
    tensors = {"question": bytes_tensor(question)}
    for outs in stream_outputs(GRPC, "rufus_assistant", infer_inputs(grpcclient, tensors),
                               timeout=timeout):
        if "products" in outs:
            out["products"] = json.loads(output_str(outs, "products"))
        out["text"] += output_str(outs, "text_output")
    return out


def openai_chat(prompt: str, model: str = "rufus_llm", max_tokens: int = 16) -> str:
    from openai import OpenAI

    key = os.environ.get("RUFUS_OPENAI_API_KEY") or "none"
    client = OpenAI(base_url=OPENAI, api_key=key, timeout=300)
    stream = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": prompt}], max_tokens=max_tokens,
        temperature=0, stream=True)
    return "".join((c.choices[0].delta.content or "") for c in stream if c.choices)


# ------------------------------------------------------------------------------ load
@dataclass
class Request:
    start: float
    end: float = 0.0
    ttft: float = float("nan")
    error: str = ""


@dataclass
class Load:
    """Closed-loop gRPC streams through the ingress from a background thread, each request
    timed (first token) and its outcome kept, until :meth:`stop`."""

    concurrency: int = 4
    max_tokens: int = 24
    requests: list[Request] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> Load:
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)
        self._thread.start()
        return self

    def stop(self) -> list[Request]:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=600)
        return self.requests

    async def _run(self) -> None:
        from rufus.client import agenerate

        async def worker(w: int) -> None:
            i = w
            while not self._stop.is_set():
                r = Request(start=time.monotonic())
                self.requests.append(r)
                try:
                    async for ch in agenerate(
                            GRPC, "rufus_llm",
                            messages=[{"role": "user",
                                       "content": SHOPPING_PROMPTS[i % len(SHOPPING_PROMPTS)]}],
                            sampling={"max_tokens": self.max_tokens, "temperature": 0.0,
                                      "ignore_eos": True}, timeout=300):
                        if ch.text and r.ttft != r.ttft:
                            r.ttft = ch.t - r.start
                except Exception as exc:  # noqa: BLE001 - counted and reported
                    r.error = f"{type(exc).__name__}: {str(exc)[:200]}"
                r.end = time.monotonic()
                i += self.concurrency

        await asyncio.gather(*(worker(w) for w in range(self.concurrency)))


def window(reqs: list[Request], t0: float, t1: float) -> dict[str, Any]:
    """Requests that started in [t0, t1): served, failed, first-token p50/p99."""
    sel = [r for r in reqs if t0 <= r.start < t1 and r.end]
    ok = [r for r in sel if not r.error]
    ttfts = [r.ttft for r in ok if r.ttft == r.ttft]

    def ms(q: float) -> int | None:
        return round(pct(ttfts, q) * 1000) if ttfts else None

    return {"served": len(ok), "failed": len(sel) - len(ok),
            "ttft_p50_ms": ms(0.5), "ttft_p99_ms": ms(0.99),
            "errors": sorted({r.error for r in sel if r.error})[:3]}


# ------------------------------------------------------------------------------ commands
def cmd_smoke(_: argparse.Namespace) -> int:
    """One of every kind of request through the ingress and the OpenAI frontend."""
    say(f"cells in rotation: {sorted(in_rotation())}")
    r = chat_stream("Suggest a tent for two people.")
    say(f"rufus_llm stream: {r['chunks']} chunks, first token {r['ttft_s']:.2f} s: {r['text'][:60]!r}")
    say(f"plan: {json.dumps(plan('nike running shoes under $100'))[:160]}")
    a = assistant("waterproof hiking boots under $120")
    links = [p["url"] for p in a["products"]]
    say(f"assistant: {len(a['products'])} products, {len(a['text'])} chars, links {links[:2]}")
    say(f"openai chat stream: {openai_chat('Name a good office chair.')[:60]!r}")
    return 0


def cmd_roll(a: argparse.Namespace) -> int:
    image = a.image or f"rufus-inference:{a.tag}"
    if not a.image:  # the same software under a new tag: what a release changes is the tag
        subprocess.run(["docker", "tag", "rufus-inference:cpu", image], check=True)
    if wait_until(lambda: in_rotation() == set(CELLS), a.ready_timeout, 2) is None:
        say(f"not every cell is in rotation ({sorted(in_rotation())}): run `make compose-up` first")
        return 1
    load = Load(concurrency=a.concurrency, max_tokens=a.max_tokens).start()
    say(f"load: {a.concurrency} closed-loop streams through {GRPC}; baseline {a.baseline_s} s")
    time.sleep(a.baseline_s)
    t_roll = time.monotonic()
    rotation: list[tuple[float, list[str]]] = []
    env = {**os.environ, "RUFUS_IMAGE": image}
    proc = subprocess.Popen(["bash", str(ROOT / "scripts/rolling_update.sh")], env=env)
    while proc.poll() is None:
        try:
            now = sorted(in_rotation(strict=True))
        except (OSError, ValueError, IndexError):
            time.sleep(0.5)
            continue
        if not rotation or rotation[-1][1] != now:
            rotation.append((time.monotonic() - t_roll, now))
        time.sleep(0.5)
    t_done = time.monotonic()
    time.sleep(a.after_s)
    reqs = load.stop()
    before, during = window(reqs, 0, t_roll), window(reqs, t_roll, t_done)
    after = window(reqs, t_done, float("inf"))
    fewest = min((len(cells) for _, cells in rotation), default=len(CELLS))
    images = {svc: inspect(svc, "{{.Config.Image}}") for cell in CELLS.values() for svc in cell[:3]}
    report = {"image": image, "roll_s": round(t_done - t_roll), "exit": proc.returncode,
              "before": before, "during": during, "after": after,
              "fewest_cells_in_rotation": fewest,
              "rotation": [(round(t), c) for t, c in rotation], "images": images}
    print(json.dumps(report, indent=1))
    # Pass: the script finished (it never drains a cell while another is out of rotation),
    # no request failed, every node runs the new image. The rotation timeline is reported,
    # not judged: HAProxy's own health checks can flap a cell for a second on an
    # oversubscribed host (docs/benchmarks-history.md, "Containers").
    ok = (proc.returncode == 0 and before["failed"] == during["failed"] == after["failed"] == 0
          and set(images.values()) == {image})
    if fewest < len(CELLS) - 1:
        say(f"note: at one sample HAProxy had {fewest} cell(s) UP (a health-check flap, or "
            "the drained cell's recreated containers shown UP before their first check)")
    say("rolling update " + ("passed: zero failed requests" if ok else "FAILED"))
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="environment: RUFUS_OPENAI_API_KEY (the OpenAI "
                                        "frontend's key, if the rig sets one), RUFUS_UNIT_SECRET "
                                        "(scripts/compose.sh)")
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("smoke", help="every kind of request through the ingress")
    r = sub.add_parser("roll", help="rolling update under closed-loop load, report failures")
    r.add_argument("--tag", default="cpu-roll", help="tag the current image gets (default %(default)s)")
    r.add_argument("--image", help="roll to this image instead of retagging the current one")
    r.add_argument("--concurrency", type=int, default=4)
    r.add_argument("--max-tokens", type=int, default=24)
    r.add_argument("--baseline-s", type=float, default=60.0, help="load before the roll")
    r.add_argument("--after-s", type=float, default=10.0, help="load after the roll")
    r.add_argument("--ready-timeout", type=float, default=900.0,
                   help="wait this long for every cell to be in rotation first")
    a = ap.parse_args(argv)
    return {"smoke": cmd_smoke, "roll": cmd_roll}[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main())
