"""The docker compose rig from the outside: what the container tests, the rolling-update
benchmark (lab/roll_bench.py) and an operator's smoke check drive (docker/compose.yaml
through scripts/compose.sh, HAProxy's stats page, real clients through the ingress).

    python -m rufus.launch.containers smoke            # every kind of request, via the ingress
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING, Any

from proxy.haproxy import PANIC_SUFFIX, stat_servers
from rufus.env import env_opt

ROOT = Path(__file__).resolve().parents[2]
GRPC = "localhost:8001"
OPENAI = "http://localhost:9000/v1"
STATS = "http://127.0.0.1:8404/stats;csv"
CELLS = {"a": ("leader", "follower", "agent", "unit0"),
         "b": ("leader-b", "follower-b", "agent-b", "unit1")}

if TYPE_CHECKING:
    from rufus.qp.plan import Plan


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
    out = {name: {"status": row["status"], "scur": row["scur"]} for name, row in servers.items()
           if not name.endswith(PANIC_SUFFIX)}
    # streams sent by panic routing (proxy/haproxy.py) still run on the unit: count them,
    # so a drain waits for them too
    for name, row in servers.items():
        unit = name.removesuffix(PANIC_SUFFIX)
        if name != unit and unit in out:
            out[unit]["scur"] = str(int(out[unit]["scur"] or 0) + int(row["scur"] or 0))
    return out


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


def plan(question: str) -> Plan | None:
    from rufus.qp.client import plan as qp_plan

    return qp_plan(GRPC, question).plan


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

    key = env_opt("RUFUS_OPENAI_API_KEY") or "none"
    client = OpenAI(base_url=OPENAI, api_key=key, timeout=300)
    stream = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": prompt}], max_tokens=max_tokens,
        temperature=0, stream=True)
    return "".join((c.choices[0].delta.content or "") for c in stream if c.choices)


# ------------------------------------------------------------------------------ commands
def cmd_smoke(_: argparse.Namespace) -> int:
    """One of every kind of request through the ingress and the OpenAI frontend."""
    say(f"cells in rotation: {sorted(in_rotation())}")
    r = chat_stream("Suggest a tent for two people.")
    say(f"rufus_llm stream: {r['chunks']} chunks, first token {r['ttft_s']:.2f} s: {r['text'][:60]!r}")
    say(f"plan: {json.dumps(plan('nike running shoes under $100'))[:160]}")
    a = assistant("waterproof bluetooth speaker under $120")
    links = [p["url"] for p in a["products"]]
    say(f"assistant: {len(a['products'])} products, {len(a['text'])} chars, links {links[:2]}")
    say(f"openai chat stream: {openai_chat('Name a good office chair.')[:60]!r}")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="environment: RUFUS_OPENAI_API_KEY (the OpenAI "
                                        "frontend's key, if the rig sets one), RUFUS_UNIT_SECRET "
                                        "(scripts/compose.sh)")
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("smoke", help="every kind of request through the ingress")
    a = ap.parse_args(argv)
    return {"smoke": cmd_smoke}[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main())
