"""Where this process sits in a multi-node inference unit, read once from the environment.

Our variables win over Kubernetes LeaderWorkerSet's, so the same image runs under
docker compose, ECS and LWS:

==========================  ===============================  =========================
meaning                     ours                             LeaderWorkerSet
==========================  ===============================  =========================
nodes in the unit           ``RUFUS_NNODES``                 ``LWS_GROUP_SIZE``
this node's rank            ``RUFUS_NODE_RANK``              ``LWS_WORKER_INDEX``
leader host                 ``RUFUS_LEADER_ADDR``            ``LWS_LEADER_ADDRESS``
leader's rendezvous port    ``RUFUS_LEADER_PORT`` (29500)    -
follower health port        ``RUFUS_HEALTH_PORT`` (8081)     -
==========================  ===============================  =========================
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

DEFAULT_LEADER_PORT = 29500
DEFAULT_HEALTH_PORT = 8081


class TopologyError(ValueError):
    """The environment describes an impossible unit (rank >= nodes, bad port, ...)."""


@dataclass(frozen=True)
class Topology:
    nnodes: int
    node_rank: int
    leader_addr: str
    leader_port: int
    health_port: int

    @property
    def is_leader(self) -> bool:
        return self.node_rank == 0

    @property
    def multi_node(self) -> bool:
        return self.nnodes > 1

    def as_dict(self) -> dict[str, object]:
        return {
            "nnodes": self.nnodes,
            "rank": self.node_rank,
            "leader": f"{self.leader_addr}:{self.leader_port}",
            "health_port": self.health_port,
        }


def _int(env: Mapping[str, str], names: tuple[str, ...], default: int) -> int:
    for name in names:
        raw = env.get(name)
        if raw not in (None, ""):
            try:
                return int(raw)
            except ValueError as exc:
                raise TopologyError(f"{name}={raw!r} is not an integer") from exc
    return default


def topology_from_env(env: Mapping[str, str] | None = None) -> Topology:
    """The one place that reads topology variables; everything else gets a ``Topology``."""
    env = os.environ if env is None else env
    nnodes = _int(env, ("RUFUS_NNODES", "LWS_GROUP_SIZE"), 1)
    rank = _int(env, ("RUFUS_NODE_RANK", "LWS_WORKER_INDEX"), 0)
    leader = env.get("RUFUS_LEADER_ADDR") or env.get("LWS_LEADER_ADDRESS") or "127.0.0.1"
    port = _int(env, ("RUFUS_LEADER_PORT",), DEFAULT_LEADER_PORT)
    health = _int(env, ("RUFUS_HEALTH_PORT",), DEFAULT_HEALTH_PORT)
    if nnodes < 1:
        raise TopologyError(f"node count must be >= 1, got {nnodes}")
    if not 0 <= rank < nnodes:
        raise TopologyError(f"node rank {rank} is outside 0..{nnodes - 1}")
    for name, value in (("leader port", port), ("health port", health)):
        if not 0 < value < 65536:
            raise TopologyError(f"{name} {value} is not a valid TCP port")
    return Topology(nnodes, rank, leader, port, health)
