"""Planner latency per ``torch_threads`` next to a busy or idle answer model.

Why this exists: the torch planner's OpenMP team and vLLM's CPU worker (bound to a core,
busy-polling while it serves) share the cores; with a team of 2 every barrier waits for the
thread that shares the worker's core to be scheduled. This measures that, per setting:

* ``idle``: tritonserver with rufus_llm and rufus_qp_medusa, nothing else running;
* ``same``: the same server while a client loops 64-token streams on rufus_llm;
* ``apart``: the planner alone in one tritonserver, rufus_llm in another with a streaming
  loop, and a second plan loop on the planner (the adversarial test's setup).

Each setting starts its own servers (``RUFUS_RUFUS_QP_MEDUSA_ENGINE_ARGS`` overrides
``torch_threads``), sends ``plans`` sequential plans of rotating questions and reports
p50/max. Driven by scripts/bench_qp_threads.py; figures in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rufus.client import generate
from rufus.launch.server import TritonServer, free_port
from rufus.qp.client import plan

QUESTIONS = ["waterproof hiking boots under 100 dollars",
             "nike running shoes size 10 under 100 dollars", "where is my order",
             "compare kindle and kobo", "gift for a 10 year old who likes science"]
LLM_ARGS = '{"max_num_seqs": 16, "max_model_len": 1024}'


class Loop:
    """A client loop in a thread (the busy neighbour), stopped and joined by ``stop``."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        self._stop = threading.Event()
        self.done = 0

        def run() -> None:
            while not self._stop.is_set():
                fn()
                self.done += 1

        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(300)


def _server(models: list[str], env: dict[str, str], log: Path) -> TritonServer:
    srv = TritonServer(models=models, grpc_port=free_port(), http_port=free_port(),
                       metrics_port=free_port(), log_path=log, extra_env=env)
    srv.start()
    srv.wait_ready(timeout=900, progress=False)
    return srv


def measure(threads: int | str, neighbour: str, plans: int, log_dir: Path) -> dict[str, Any]:
    """One setting: start its servers, run its neighbours, time ``plans`` plans, stop all."""
    env = {"RUFUS_RUFUS_QP_MEDUSA_ENGINE_ARGS": json.dumps({"torch_threads": threads}),
           "RUFUS_RUFUS_LLM_ENGINE_ARGS": LLM_ARGS}
    tag = f"t{threads}-{neighbour}"
    servers: list[TritonServer] = []
    loops: list[Loop] = []
    try:
        if neighbour == "apart":
            llm = _server(["rufus_llm"], env, log_dir / f"{tag}-llm.log")
            servers.append(llm)
            qp = _server(["rufus_qp_medusa"], env, log_dir / f"{tag}-qp.log")
        else:
            qp = llm = _server(["rufus_llm", "rufus_qp_medusa"], env, log_dir / f"{tag}.log")
        servers.append(qp)
        llm_url, qp_url = f"127.0.0.1:{llm.grpc_port}", f"127.0.0.1:{qp.grpc_port}"
        if neighbour in ("same", "apart"):
            loops.append(Loop(lambda: list(generate(
                llm_url, "rufus_llm", "Tell me about tents.",
                sampling={"max_tokens": 64, "temperature": 0}))))
        if neighbour == "apart":
            loops.append(Loop(lambda: plan(qp_url, QUESTIONS[0], timeout=600)))
        time.sleep(3)
        plan(qp_url, QUESTIONS[0], timeout=600)  # warm
        lat = [plan(qp_url, QUESTIONS[i % len(QUESTIONS)], timeout=600).latency
               for i in range(plans)]
    finally:
        for lp in loops:
            lp.stop()
        for s in servers:
            s.stop()
    return {"threads": threads, "neighbour": neighbour, "plans": plans,
            "p50_ms": 1000 * statistics.median(lat), "max_ms": 1000 * max(lat),
            "all_ms": [round(1000 * x) for x in lat]}


def main(argv: list[str] | None = None, doc: str = __doc__) -> None:
    ap = argparse.ArgumentParser(description=doc,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=lambda v: v if v == "auto" else int(v), nargs="+",
                    default=["auto", 2, 1], help='fixed team sizes and/or "auto"')
    ap.add_argument("--neighbours", nargs="+", default=["idle", "same", "apart"],
                    choices=["idle", "same", "apart"])
    ap.add_argument("--plans", type=int, default=20, help="timed plans per setting")
    ap.add_argument("--json", default="")
    a = ap.parse_args(argv)
    log_dir = Path(tempfile.mkdtemp(prefix="bench-qp-threads-"))
    rows = []
    print("| neighbour | torch_threads | plans | p50 ms | max ms |\n|---|---|---|---|---|")
    for nb in a.neighbours:
        for t in a.threads:
            print(f"[bench_qp_threads {time.strftime('%H:%M:%S')}] {nb}, {t} thread(s)",
                  file=sys.stderr, flush=True)
            r = measure(t, nb, a.plans, log_dir)
            rows.append(r)
            print(f"| {nb} | {t} | {r['plans']} | {r['p50_ms']:.0f} | {r['max_ms']:.0f} |",
                  flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))
    print(f"[bench_qp_threads] logs in {log_dir}", file=sys.stderr)

