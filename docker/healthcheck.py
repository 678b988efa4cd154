"""Container health check for the one image (Dockerfile HEALTHCHECK, compose, ECS).

Probes the endpoint of the role given as the argument (leader, the default; follower, agent
or openai), as listed in deploy/contract.py; or a URL. The role is the health check's own
argument (compose's and ECS's health check command), not a setting. Standard library only,
so it runs under the venv's python and under the CUDA/Neuron base images' python3.

    python3 docker/healthcheck.py [ROLE|URL]     exit 0 healthy, 1 not
"""

from __future__ import annotations

import os
import sys
import urllib.error
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from deploy.contract import HEALTH, PORTS

# leader: tritonserver ready (every loaded model ready); follower, agent, openai: their /health
PROBE = {"leader": "leader_ready", "follower": "follower_health", "agent": "agent_health",
         "openai": "openai_health"}


def url_for(role: str, env: dict[str, str] | os._Environ[str] = os.environ) -> str:
    ep = HEALTH[PROBE[role]]
    port = env.get(ep.port_var) or str(PORTS[ep.port_var])
    return f"http://127.0.0.1:{port}{ep.path}"


def main() -> int:
    arg = sys.argv[1] if len(sys.argv) > 1 else "leader"
    if "://" in arg:
        url = arg
    elif arg in PROBE:
        url = url_for(arg)
    else:
        print(f"role {arg[:40]!r}: expected one of {sorted(PROBE)} or a URL", file=sys.stderr)
        return 1
    try:
        with urllib.request.urlopen(url, timeout=4) as r:
            ok = r.status == 200
    except (urllib.error.URLError, OSError) as exc:
        print(f"{url}: {exc}", file=sys.stderr)
        return 1
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
