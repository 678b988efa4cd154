"""`make rig`: a two-node inference unit on this machine, supervised as one group.

Leader = tritonserver serving rufus_llm as rank 0; follower = `python -m follower` as rank 1;
pipeline_parallel_size=2 splits the default model's layers between them. If any node dies
(or the leader's model goes not-ready), the whole unit is stopped and started again, like
LeaderWorkerSet's RecreateGroupOnPodRestart. Ctrl-C stops everything.

    python scripts/rig.py [--nnodes 2] [--mode loopback|netns] [--grpc-port 8001 ...]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

from rufus.env import env_port, exits_on_env_error, help_text
from rufus.harness.rig import DEFAULT_ENGINE_ARGS, LocalUnit, Supervisor


@exits_on_env_error
def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=help_text({
            "GRPC_PORT, HTTP_PORT, METRICS_PORT": "defaults of the leader's port options",
            "RUFUS_UNIT_SECRET": "control-channel secret shared by the nodes (random if unset)",
            "VLLM_CPU_KVCACHE_SPACE": "KV cache per node, GiB (default 1)"}))
    ap.add_argument("--nnodes", type=int, default=2)
    ap.add_argument("--mode", choices=["loopback", "netns"], default="loopback",
                    help="netns: follower in its own network namespace via a veth pair "
                         "(root + iproute2)")
    ap.add_argument("--engine-args", default=json.dumps(DEFAULT_ENGINE_ARGS),
                    help="JSON engine-arg overrides for both nodes (default: %(default)s)")
    ap.add_argument("--grpc-port", type=int, default=env_port("GRPC_PORT", 8001))
    ap.add_argument("--http-port", type=int, default=env_port("HTTP_PORT", 8000))
    ap.add_argument("--metrics-port", type=int, default=env_port("METRICS_PORT", 8002))
    ap.add_argument("--leader-port", type=int, default=29500)
    ap.add_argument("--control-port", type=int, default=29501)
    ap.add_argument("--health-port", type=int, default=8081,
                    help="first follower's /health port (rank r uses this + r - 1)")
    ap.add_argument("--log-dir", default=os.path.join(tempfile.gettempdir(), "rufus-rig"))
    a = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    unit = LocalUnit(
        nnodes=a.nnodes, engine_args=json.loads(a.engine_args), log_dir=Path(a.log_dir),
        mode=a.mode, grpc_port=a.grpc_port, http_port=a.http_port,
        metrics_port=a.metrics_port, leader_port=a.leader_port, control_port=a.control_port,
        health_ports=[a.health_port + i for i in range(a.nnodes - 1)])
    sup = Supervisor(unit)
    stop = {"flag": False}

    def on_signal(signum: int, _frame: object) -> None:
        stop["flag"] = True

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    print(f"[rig] logs in {a.log_dir}; gRPC on {unit.url}; follower health "
          f"{[unit.health_url(r) for r in range(1, a.nnodes)]}", file=sys.stderr, flush=True)
    sup.start()
    try:
        while not stop["flag"] and sup.running:
            time.sleep(0.5)
    finally:
        print("[rig] stopping the unit", file=sys.stderr, flush=True)
        sup.stop()
    return 0 if stop["flag"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
