"""Where this process sits in a multi-node inference unit, read once from the environment.

Membership uses Kubernetes LeaderWorkerSet's own names, which LWS sets; docker compose and
ECS set the same three, so the same image runs under all of them with one contract:

==========================  ===============================
meaning                     variable (default)
==========================  ===============================
nodes in the unit           ``LWS_GROUP_SIZE`` (1)
this node's rank            ``LWS_WORKER_INDEX`` (0)
leader host                 ``LWS_LEADER_ADDRESS`` (127.0.0.1)
leader's rendezvous port    ``RUFUS_LEADER_PORT`` (29500)
leader's control port       ``RUFUS_CONTROL_PORT`` (+1)
follower health port        ``RUFUS_HEALTH_PORT`` (8081)
==========================  ===============================

The rendezvous port is vLLM's ``master_port`` (torch.distributed); the control port is our
own leader/follower channel (handshake with a config fingerprint, then heartbeats), see
``rufus/multinode/control.py``. :func:`apply_topology` turns a ``Topology`` into vLLM engine arguments
and is the one place both the leader (Triton model) and the follower use.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rufus.env import environ
from rufus.serving.settings import env_var

log = logging.getLogger("rufus.multinode")

DEFAULT_LEADER_PORT = 29500
DEFAULT_HEALTH_PORT = 8081


BIND_ENV = "RUFUS_BIND"
DEFAULT_BIND = "0.0.0.0"
PEER_TIMEOUT_DEFAULT_S = 5.0
HEARTBEAT_MAX_S = 1.0  # a ping at least this often, and five within a peer timeout


def heartbeat_s(peer_timeout_s: float) -> float:
    """The ping period: a second, or a fifth of a shorter peer timeout (not a setting of its
    own: it only has to be well inside the timeout)."""
    return min(HEARTBEAT_MAX_S, peer_timeout_s / 5)


@dataclass(frozen=True)
class ControlSettings:
    """The unit's membership settings (rufus/multinode/control.py, follower/node.py), read
    when a leader or follower starts: ``control.configure``."""

    peer_timeout_s: float = env_var("RUFUS_PEER_TIMEOUT_S", PEER_TIMEOUT_DEFAULT_S,
                                    "control channel: a peer silent this long is lost, s "
                                    "(heartbeats every second, or a fifth of it)", minimum=0.01)
    bind: str = env_var(BIND_ENV, DEFAULT_BIND,
                        "address this node's own listeners bind: the leader's control "
                        "channel, a follower's /health")
    join_wait_s: float = env_var("RUFUS_JOIN_WAIT_S", 600.0,
                                 "how long the unit has to form: the leader waits this long "
                                 "for its followers, a follower for its leader, s", minimum=0.0)


class TopologyError(ValueError):
    """The environment describes an impossible unit (rank >= nodes, bad port, ...)."""


@dataclass(frozen=True)
class Topology:
    nnodes: int
    node_rank: int
    leader_addr: str
    leader_port: int
    health_port: int
    control_port: int = 0  # 0: leader_port + 1

    @property
    def leader_control_port(self) -> int:
        return self.control_port or self.leader_port + 1

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
            "control_port": self.leader_control_port,
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
    env = environ() if env is None else env
    nnodes = _int(env, ("LWS_GROUP_SIZE",), 1)
    rank = _int(env, ("LWS_WORKER_INDEX",), 0)
    leader = env.get("LWS_LEADER_ADDRESS") or "127.0.0.1"
    port = _int(env, ("RUFUS_LEADER_PORT",), DEFAULT_LEADER_PORT)
    health = _int(env, ("RUFUS_HEALTH_PORT",), DEFAULT_HEALTH_PORT)
    control = _int(env, ("RUFUS_CONTROL_PORT",), port + 1)
    if nnodes < 1:
        raise TopologyError(f"node count must be >= 1, got {nnodes}")
    if not 0 <= rank < nnodes:
        raise TopologyError(f"node rank {rank} is outside 0..{nnodes - 1}")
    for name, value in (("leader port", port), ("health port", health),
                        ("control port", control)):
        if not 0 < value < 65536:
            raise TopologyError(f"{name} {value} is not a valid TCP port")
    if nnodes > 1 and control == port:
        raise TopologyError(f"control port {control} must differ from the leader port")
    return Topology(nnodes, rank, leader, port, health, control)


# Engine arguments that may differ between the nodes of one unit (the leader may know its
# own address by another name than its followers do); everything else must match.
NODE_KEYS = ("node_rank", "master_addr")


def apply_topology(engine_args: dict[str, Any], topo: Topology) -> dict[str, Any]:
    """vLLM engine args for this node of the unit (a copy; single node: unchanged).

    Leader and follower call this with the same ``model.json`` so that they agree on
    everything but ``node_rank``; vLLM's own multi-node executor ("mp") does the rest.
    Impossible combinations fail here with a message instead of hanging in rendezvous.
    """
    args = dict(engine_args)
    declared = args.get("nnodes")
    if declared not in (None, topo.nnodes):
        raise TopologyError(
            f"model.json/overrides set nnodes={declared} but the environment describes "
            f"{topo.nnodes} node(s) (LWS_GROUP_SIZE): make them agree")
    if not topo.multi_node:
        return args
    tp = int(args.get("tensor_parallel_size", 1))
    pp = int(args.get("pipeline_parallel_size", 1))
    world = tp * pp
    if world % topo.nnodes != 0 or world < topo.nnodes:
        raise TopologyError(
            f"{topo.nnodes} nodes need a world size (tensor_parallel_size x "
            f"pipeline_parallel_size = {tp} x {pp} = {world}) that they divide; e.g. set "
            f'RUFUS_ENGINE_ARGS=\'{{"pipeline_parallel_size": {topo.nnodes}}}\'')
    if args.pop("speculative_config", None) is not None:
        # measured: a two-node pipeline-parallel unit with ngram drafts never became ready
        # (vLLM 0.32 on CPU); a unit spanning nodes decodes without drafts
        log.warning("speculative_config dropped: a unit spanning %d nodes decodes without "
                    "drafts", topo.nnodes)
    args.update(
        nnodes=topo.nnodes,
        node_rank=topo.node_rank,
        master_addr=topo.leader_addr,
        master_port=topo.leader_port,
        distributed_executor_backend="mp",
    )
    return args
