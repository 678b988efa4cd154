"""The plan: cells of N instances of one type in one zone that share the deepest network node
they can, filled bottom-up, and the instances left in no cell with the reason."""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .ec2_topology import Instance


@dataclass(frozen=True)
class Cell:
    """N instances of one type in one zone; ``members[0]`` is the leader (rank 0)."""

    cell_id: str
    zone: str
    instance_type: str
    depth: int                      # network layers all members share (0: the zone only)
    members: tuple[Instance, ...]

    @property
    def shared_node(self) -> str | None:
        """The deepest network node every member hangs below (None at depth 0)."""
        return self.members[0].network_nodes[self.depth - 1] if self.depth else None

    def to_dict(self) -> dict[str, Any]:
        return {"cell": self.cell_id, "availabilityZone": self.zone,
                "zoneId": self.members[0].zone_id, "instanceType": self.instance_type,
                "sharedLayers": self.depth, "sharedNetworkNode": self.shared_node,
                "members": [{"rank": r, "role": "leader" if r == 0 else "follower",
                             "instanceId": m.instance_id, "networkNodes": list(m.network_nodes)}
                            for r, m in enumerate(self.members)]}


@dataclass(frozen=True)
class Stranded:
    instance: Instance
    reason: str

    def to_dict(self) -> dict[str, Any]:
        i = self.instance
        return {"instanceId": i.instance_id, "availabilityZone": i.zone,
                "instanceType": i.instance_type, "reason": self.reason}


@dataclass
class Plan:
    nodes_per_cell: int
    instance_type: str | None
    strategy: str
    cells: list[Cell]
    stranded: list[Stranded]
    warnings: list[str] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        """Counts for people and the bench: cells per shared depth, stranded nodes."""
        by_depth: dict[int, int] = {}
        for c in self.cells:
            by_depth[c.depth] = by_depth.get(c.depth, 0) + 1
        nodes = sum(len(c.members) for c in self.cells)
        return {"instances": nodes + len(self.stranded), "cells": len(self.cells),
                "nodesInCells": nodes, "stranded": len(self.stranded),
                "cellsBySharedLayers": {str(d): by_depth[d] for d in sorted(by_depth, reverse=True)}}

    def to_dict(self) -> dict[str, Any]:
        return {"nodesPerCell": self.nodes_per_cell, "instanceType": self.instance_type,
                "strategy": self.strategy, "summary": self.summary(), "warnings": list(self.warnings),
                "cells": [c.to_dict() for c in self.cells],
                "stranded": [s.to_dict() for s in self.stranded]}


def common_depth(members: Sequence[Instance]) -> int:
    """How many network layers, from the top, every member shares."""
    first = members[0].network_nodes
    depth = min(len(m.network_nodes) for m in members)
    for m in members[1:]:
        nodes = m.network_nodes
        d = 0
        while d < depth and nodes[d] == first[d]:
            d += 1
        depth = d
    return depth


def _path_key(i: Instance) -> tuple[tuple[str, ...], str]:
    return i.network_nodes, i.instance_id


def _fill_topology(pool: list[Instance], n: int, min_depth: int
                   ) -> tuple[list[list[Instance]], list[Instance]]:
    """Greedy bottom-up: cells under the deepest shared node first, leftovers carried one layer
    up. Sorted by path, every subtree is a contiguous run, so each layer is one linear scan."""
    pending = sorted(pool, key=_path_key)
    groups: list[list[Instance]] = []
    for depth in range(max(len(i.network_nodes) for i in pending), min_depth - 1, -1):
        carry: list[Instance] = []
        short = [i for i in pending if len(i.network_nodes) < depth]  # joins at its own depth
        deep = [i for i in pending if len(i.network_nodes) >= depth] if short else pending
        for _, run in itertools.groupby(deep, key=lambda i: i.network_nodes[:depth]):
            members = list(run)
            full = len(members) - len(members) % n
            groups.extend(members[k:k + n] for k in range(0, full, n))
            carry.extend(members[full:])
        pending = sorted(carry + short, key=_path_key) if short else carry
        if not pending:
            break
    return groups, pending


def _fill_id_order(pool: list[Instance], n: int, min_depth: int
                   ) -> tuple[list[list[Instance]], list[Instance]]:
    """The naive baseline: consecutive instance ids, blind to the network."""
    ordered = sorted(pool, key=lambda i: i.instance_id)
    full = len(ordered) - len(ordered) % n
    groups = [ordered[k:k + n] for k in range(0, full, n)]
    keep = [g for g in groups if common_depth(g) >= min_depth]
    left = [i for g in groups if common_depth(g) < min_depth for i in g] + ordered[full:]
    return keep, left


STRATEGIES: dict[str, Callable[[list[Instance], int, int],
                               tuple[list[list[Instance]], list[Instance]]]] = {
    "topology": _fill_topology,
    "id-order": _fill_id_order,
}


def _label_safe(name: str) -> str:
    """A zone or type name as part of a Kubernetes label value ([a-z0-9-], alphanumeric ends)."""
    return re.sub(r"[^a-z0-9-]+", "-", name.lower()).strip("-") or "x"


def plan_cells(instances: Iterable[Instance], nodes_per_cell: int = 2, *,
               instance_type: str | None = None, min_shared_layers: int = 0,
               strategy: str = "topology", warnings: Sequence[str] = ()) -> Plan:
    """Cells of ``nodes_per_cell`` instances of one type in one zone, sharing as deep a network
    node as possible; everything else is stranded, with the reason. Input order does not
    matter: instances are sorted, and cell ids are given in sorted order."""
    if nodes_per_cell < 1:
        raise ValueError(f"nodes_per_cell must be at least 1, got {nodes_per_cell}")
    if min_shared_layers < 0:
        raise ValueError("min_shared_layers must be >= 0")
    fill = STRATEGIES[strategy]
    unique: dict[str, Instance] = {}
    for i in instances:
        if unique.setdefault(i.instance_id, i) != i:
            raise ValueError(f"{i.instance_id} given twice with different topology")
    stranded: list[Stranded] = []
    pools: dict[tuple[str, str], list[Instance]] = {}
    for inst in sorted(unique.values(), key=lambda i: i.instance_id):
        if instance_type is not None and inst.instance_type != instance_type:
            stranded.append(Stranded(inst, f"instance type {inst.instance_type or '(none)'}, "
                                           f"not {instance_type}"))
        elif not inst.instance_type:
            stranded.append(Stranded(inst, "no InstanceType in the topology"))
        elif not inst.zone:
            stranded.append(Stranded(inst, "no AvailabilityZone or ZoneId in the topology"))
        elif not inst.network_nodes:
            stranded.append(Stranded(inst, "no NetworkNodes (instance type without topology "
                                           "information, or not running)"))
        else:
            pools.setdefault((inst.zone, inst.instance_type), []).append(inst)

    formed: list[tuple[str, str, list[Instance]]] = []
    for (zone, itype), pool in sorted(pools.items()):
        groups, left = fill(pool, nodes_per_cell, min_shared_layers)
        formed.extend((zone, itype, g) for g in groups)
        for inst in left:
            if min_shared_layers == 0:
                why = (f"{zone} has {len(left)} {itype} node(s) left over, fewer than "
                       f"{nodes_per_cell} for a cell")
            else:
                why = (f"fewer than {nodes_per_cell} {itype} nodes left in {zone} share its top "
                       f"{min_shared_layers} network layer(s)")
            stranded.append(Stranded(inst, why))

    formed.sort(key=lambda f: (f[0], f[1], _path_key(f[2][0])))
    cells: list[Cell] = []
    counts: dict[tuple[str, str], int] = {}
    for zone, itype, members in formed:
        # zone and type in the id: plans made per type (--instance-type) never share a label value
        k = counts[zone, itype] = counts.get((zone, itype), 0) + 1
        cells.append(Cell(f"{_label_safe(zone)}-{_label_safe(itype)}-{k:04d}", zone, itype,
                          common_depth(members), tuple(members)))
    stranded.sort(key=lambda s: (s.instance.zone, s.instance.instance_id))
    return Plan(nodes_per_cell, instance_type, strategy, cells, stranded, list(warnings))

