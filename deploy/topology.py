"""Cells paired by network topology: group EC2 instances into cells (one leader + followers)
whose nodes share the deepest possible network node, as EC2's DescribeInstanceTopology reports
it, and emit what Kubernetes, ECS and the compose rig need to place a cell on those nodes.

    python -m deploy.topology plan --input topo.json [--nodes-per-cell 2]
                                   [--instance-type trn1.32xlarge] [--format json|k8s|kubectl|ecs|hosts]
    python -m deploy.topology plan --aws [--region us-west-2] ...   # needs boto3 (not a dependency)
    python -m deploy.topology generate --instances 10000 --seed 1 > topo.json
    python -m deploy.topology bench [--instances 10000] [--seed 1]

The input is the API's response (``Instances[]`` with ``InstanceId``, ``InstanceType``,
``NetworkNodes`` from the top layer down, ``AvailabilityZone``, ``ZoneId``, optional
``GroupName``/``CapacityBlockId``; ``NextToken`` between pages), exactly what
``aws ec2 describe-instance-topology`` prints: one response, a JSON list of pages, or JSON lines
of pages. A cell's tensors cross the network at every step, so the fewer layers between its
nodes, the better: cells are filled bottom-up (same bottom node first, then leftovers one layer
up, ...), never across availability zones or instance types. Rufus (``rufus/multinode/``) does
not read this: it is deploy-time planning; ``rufus/multinode/topology.py`` is a unit's rank
layout at run time, something else.
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import re
import shlex
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

# Kubernetes node labels (the same prefix as deploy/kubernetes/render.py's pod labels)
LABEL_PREFIX = "rufus.dev"
# LeaderWorkerSet: one LWS replica (group) per value of this node label, and no other group
# there (lws.sigs.k8s.io/docs/concepts, "Exclusive LWS to Topology Placement")
LWS_EXCLUSIVE_TOPOLOGY = "leaderworkerset.sigs.k8s.io/exclusive-topology"
# ECS container-instance attributes the deployment layer may put (aws ecs put-attributes)
ECS_ATTRIBUTE_PREFIX = "rufus"
# DescribeInstanceTopology: at most 100 results a page, and 100 instance ids a request; the
# API refuses MaxResults together with InstanceIds.
API_MAX_RESULTS = 100
API_MAX_IDS = 100
# the request parameters the real API takes (a typo must fail here, not in the cloud)
API_PARAMS = frozenset({"DryRun", "NextToken", "MaxResults", "InstanceIds", "GroupNames", "Filters"})


# --------------------------------------------------------------------------- the API's data
@dataclass(frozen=True)
class Instance:
    """One ``Instances[]`` entry of a DescribeInstanceTopology response."""

    instance_id: str
    instance_type: str
    zone: str                       # AvailabilityZone (its ZoneId when the name is missing)
    network_nodes: tuple[str, ...]  # top layer first, the bottom (closest) node last
    zone_id: str = ""
    group_name: str | None = None
    capacity_block_id: str | None = None

    @classmethod
    def from_api(cls, d: Mapping[str, Any]) -> Instance:
        iid = d.get("InstanceId")
        if not isinstance(iid, str) or not iid:
            raise ValueError(f"an instance without InstanceId: {dict(d)!r}")
        nodes = d.get("NetworkNodes") or ()  # null or empty: type without topology, not running
        if isinstance(nodes, str) or not all(isinstance(n, str) and n for n in nodes):
            raise ValueError(f"{iid}: NetworkNodes must be a list of node ids, got {nodes!r}")
        zone_id = d.get("ZoneId") or ""
        return cls(instance_id=iid, instance_type=d.get("InstanceType") or "",
                   zone=d.get("AvailabilityZone") or zone_id, network_nodes=tuple(nodes),
                   zone_id=zone_id, group_name=d.get("GroupName") or None,
                   capacity_block_id=d.get("CapacityBlockId") or None)

    def to_api(self) -> dict[str, Any]:
        out: dict[str, Any] = {"InstanceId": self.instance_id, "InstanceType": self.instance_type}
        if self.group_name:
            out["GroupName"] = self.group_name
        out["NetworkNodes"] = list(self.network_nodes)
        if self.capacity_block_id:
            out["CapacityBlockId"] = self.capacity_block_id
        out["ZoneId"] = self.zone_id
        out["AvailabilityZone"] = self.zone
        return out


class TopologyClient(Protocol):
    """What the planner needs of an EC2 client (boto3's ``ec2`` client has this method)."""

    def describe_instance_topology(self, **kwargs: Any) -> Mapping[str, Any]: ...


def fetch_pages(client: TopologyClient, *, instance_ids: Sequence[str] = (),
                instance_types: Sequence[str] = (), group_names: Sequence[str] = (),
                page_size: int = API_MAX_RESULTS, max_pages: int = 100_000) -> Iterator[Mapping[str, Any]]:
    """Every response page, following ``NextToken``.

    Instance types go in the API's ``instance-type`` filter (the request has no InstanceTypes
    parameter); instance ids in batches of 100 without MaxResults, which the API refuses with them.
    """
    if not 1 <= page_size <= API_MAX_RESULTS:
        raise ValueError(f"page_size must be 1..{API_MAX_RESULTS}, got {page_size}")
    base: dict[str, Any] = {}
    if group_names:
        base["GroupNames"] = list(group_names)
    if instance_types:
        base["Filters"] = [{"Name": "instance-type", "Values": list(instance_types)}]
    ids = list(instance_ids)
    batches: list[list[str] | None] = ([ids[i:i + API_MAX_IDS] for i in range(0, len(ids), API_MAX_IDS)]
                                       if ids else [None])
    pages = 0
    for batch in batches:
        request = dict(base)
        if batch is None:
            request["MaxResults"] = page_size
        else:
            request["InstanceIds"] = batch
        token: str | None = None
        seen: set[str] = set()
        while True:
            call = dict(request)
            if token:
                call["NextToken"] = token
            page = client.describe_instance_topology(**call)
            pages += 1
            yield page
            token = page.get("NextToken") or None
            if token is None:
                break
            if token in seen:
                raise RuntimeError(f"DescribeInstanceTopology returned NextToken {token!r} twice")
            if pages >= max_pages:
                raise RuntimeError(f"more than {max_pages} pages: giving up")
            seen.add(token)


def pages_from_text(text: str) -> list[Mapping[str, Any]]:
    """Response pages from a file: one response, a JSON list of pages (or of instances), or
    JSON lines of pages."""
    try:
        doc: Any = json.loads(text)
    except json.JSONDecodeError:
        doc = [json.loads(line) for line in text.splitlines() if line.strip()]
    if isinstance(doc, Mapping):
        doc = [doc]
    if not isinstance(doc, list):
        raise ValueError("expected a DescribeInstanceTopology response, a list of them, or JSON lines")
    if doc and all(isinstance(d, Mapping) and "InstanceId" in d for d in doc):
        return [{"Instances": doc}]  # a bare list of instances
    for i, page in enumerate(doc):
        if not isinstance(page, Mapping) or "Instances" not in page:
            raise ValueError(f"page {i + 1} is not a DescribeInstanceTopology response "
                             "(no Instances key)")
    return doc


def load_file(path: str) -> list[Mapping[str, Any]]:
    text = sys.stdin.read() if path == "-" else Path(path).read_text()
    return pages_from_text(text)


def instances_from_pages(pages: Iterable[Mapping[str, Any]]) -> tuple[list[Instance], list[str]]:
    """The instances of every page (an instance listed twice identically counts once), and
    warnings: a last page that still has a NextToken means the input is not complete."""
    seen: dict[str, Instance] = {}
    warnings: list[str] = []
    last: Mapping[str, Any] | None = None
    for page in pages:
        last = page
        for raw in page.get("Instances") or ():
            inst = Instance.from_api(raw)
            prev = seen.get(inst.instance_id)
            if prev is not None and prev != inst:
                raise ValueError(f"{inst.instance_id} listed twice with different topology")
            seen[inst.instance_id] = inst
    if last is not None and last.get("NextToken"):
        warnings.append("the last page has a NextToken: more pages exist that the input lacks "
                        "(aws ec2 describe-instance-topology pages through them by itself unless "
                        "--max-items or --no-paginate is given)")
    return list(seen.values()), warnings


# --------------------------------------------------------------------------- the plan
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


# --------------------------------------------------------------------------- what each platform needs
def kubernetes_labels(plan: Plan, prefix: str = LABEL_PREFIX) -> dict[str, Any]:
    """Node labels per instance and the LWS annotation that makes one group take one cell.

    ``providerID`` is how an EKS node names its instance (``aws:///<az>/<instance id>``): node
    names are usually DNS names, so the labels are applied by matching that.
    """
    key = f"{prefix}/cell"
    nodes = [{"instanceId": m.instance_id, "providerID": f"aws:///{c.zone}/{m.instance_id}",
              "labels": {key: c.cell_id, f"{prefix}/cell-rank": str(rank),
                         f"{prefix}/cell-layers": str(c.depth)}}
             for c in plan.cells for rank, m in enumerate(c.members)]
    return {"topologyKey": key,
            "annotations": {LWS_EXCLUSIVE_TOPOLOGY: key},
            "groupSize": plan.nodes_per_cell,
            "cells": len(plan.cells),
            "nodes": nodes,
            # nodes in no cell lose stale labels, or LWS could place a group on them; nodes of
            # other types than --instance-type keep theirs (another plan's cells)
            "unlabel": [s.instance.instance_id for s in plan.stranded
                        if plan.instance_type in (None, s.instance.instance_type)]}


def kubectl_script(plan: Plan, prefix: str = LABEL_PREFIX) -> str:
    """A bash script that labels the planned nodes (and unlabels the stranded ones)."""
    k8s = kubernetes_labels(plan, prefix)
    keys = [f"{prefix}/cell", f"{prefix}/cell-rank", f"{prefix}/cell-layers"]
    q = shlex.quote
    lines = [
        "#!/usr/bin/env bash",
        f"# Generated by: python -m deploy.topology plan --format kubectl ({len(plan.cells)} cells "
        f"of {plan.nodes_per_cell}).",
        f"# LeaderWorkerSet: metadata.annotations: {LWS_EXCLUSIVE_TOPOLOGY}: {k8s['topologyKey']}",
        "set -euo pipefail",
        "declare -A NODE  # instance id -> Kubernetes node name, from spec.providerID",
        "nodes=$(kubectl get nodes --no-headers \\",
        "  -o custom-columns=NAME:.metadata.name,PROVIDER:.spec.providerID)",
        "while read -r name provider; do",
        "  if [[ -n ${provider:-} ]]; then NODE[${provider##*/}]=$name; fi",
        "done <<< \"$nodes\"",
        "missing=0",
        "label() {  # label INSTANCE_ID LABEL...: on the node whose providerID ends in it",
        "  local id=$1; shift",
        "  local n=${NODE[$id]:-}",
        "  if [[ -z $n ]]; then",
        "    echo \"no Kubernetes node for $id\" >&2; missing=$((missing + 1)); return 0",
        "  fi",
        "  kubectl label node \"$n\" --overwrite \"$@\" >/dev/null",
        "}",
    ]
    for entry in k8s["nodes"]:
        labels = " ".join(q(f"{k}={v}") for k, v in entry["labels"].items())
        lines.append(f"label {q(entry['instanceId'])} {labels}")
    for iid in k8s["unlabel"]:
        lines.append(f"label {q(iid)} " + " ".join(q(f"{k}-") for k in keys))
    lines.append('echo "done; $missing instance(s) of the plan are not nodes of this cluster" >&2')
    return "\n".join(lines) + "\n"


def ecs_constraints(plan: Plan, prefix: str = ECS_ATTRIBUTE_PREFIX) -> dict[str, Any]:
    """Per cell: a ``memberOf`` constraint per task (leader and followers are separate tasks,
    deploy/ecs/), one for the whole cell, and the attributes a deployment layer may put on the
    container instances to place by ``attribute:`` instead."""
    cells = []
    for c in plan.cells:
        ids = [m.instance_id for m in c.members]
        cells.append({
            "cell": c.cell_id, "availabilityZone": c.zone, "instanceType": c.instance_type,
            "sharedLayers": c.depth,
            "cellConstraint": {"type": "memberOf",
                               "expression": "ec2InstanceId in [" + ", ".join(f"'{i}'" for i in ids) + "]"},
            "tasks": [{"rank": r, "role": "leader" if r == 0 else "follower", "instanceId": iid,
                       "placementConstraints": [{"type": "memberOf",
                                                 "expression": f"ec2InstanceId == {iid}"}],
                       "attributes": [{"name": f"{prefix}.cell", "value": c.cell_id},
                                      {"name": f"{prefix}.cell-rank", "value": str(r)}]}
                      for r, iid in enumerate(ids)],
            "attributeConstraint": {"type": "memberOf",
                                    "expression": f"attribute:{prefix}.cell == {c.cell_id}"},
        })
    return {"nodesPerCell": plan.nodes_per_cell, "cells": cells,
            "stranded": [s.to_dict() for s in plan.stranded]}


def hosts_list(plan: Plan) -> str:
    """The compose/rig host list: ``<cell> <leader> <follower>...``, one line per cell."""
    lines = [f"# cells of {plan.nodes_per_cell} paired by network topology "
             "(python -m deploy.topology): cell, then its hosts, leader first"]
    lines += [" ".join([c.cell_id, *(m.instance_id for m in c.members)]) for c in plan.cells]
    lines += [f"# stranded {s.instance.instance_id}: {s.reason}" for s in plan.stranded]
    return "\n".join(lines) + "\n"


def render(plan: Plan, fmt: str, label_prefix: str = LABEL_PREFIX) -> str:
    if fmt == "json":
        return json.dumps(plan.to_dict(), indent=1) + "\n"
    if fmt == "k8s":
        import yaml  # a dependency already (deploy/kubernetes/render.py); only this format needs it

        dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)  # libyaml when built with it
        return yaml.dump(kubernetes_labels(plan, label_prefix), Dumper=dumper, sort_keys=False,
                         width=100)
    if fmt == "kubectl":
        return kubectl_script(plan, label_prefix)
    if fmt == "ecs":
        return json.dumps(ecs_constraints(plan), indent=1) + "\n"
    if fmt == "hosts":
        return hosts_list(plan)
    raise ValueError(f"unknown format {fmt!r}")


FORMATS = ("json", "k8s", "kubectl", "ecs", "hosts")


# --------------------------------------------------------------------------- synthetic topologies
ZONES = (("us-east-1a", "use1-az4"), ("us-east-1b", "use1-az6"), ("us-east-1c", "use1-az1"),
         ("us-east-1d", "use1-az2"))
# instance types with topology information, and how often a synthetic spine hosts each
TYPES = (("p5.48xlarge", 0.6), ("trn1.32xlarge", 0.3), ("p4d.24xlarge", 0.1))


def generate(instances: int, seed: int = 1, layers: int = 3, mixed: float = 0.15
             ) -> list[Instance]:
    """A synthetic account shaped like AWS's fan-out: a few top nodes per zone, tens of
    second-layer nodes under each, bottom ("spine") nodes with 2-16 of our instances each;
    most spines host one instance type, ``mixed`` of them several. Ids are random hex, as
    EC2's are, so id order says nothing about the network."""
    if layers < 2:
        raise ValueError("layers must be >= 2")
    rng = random.Random(seed)
    used: set[str] = set()

    def new_id(prefix: str) -> str:
        while True:
            s = f"{prefix}-{rng.getrandbits(68):017x}"
            if s not in used:
                used.add(s)
                return s

    zone_weights = [rng.uniform(0.5, 1.5) for _ in ZONES]
    # fixed upper layers: a few tops per zone, tens of layer-2 nodes per top, a few per extra layer
    tree: list[list[tuple[str, ...]]] = []
    for _ in ZONES:
        paths: list[tuple[str, ...]] = []
        for _top in range(rng.randint(2, 4)):
            top = (new_id("nn"),)
            mids: list[tuple[str, ...]] = [(*top, new_id("nn")) for _ in range(rng.randint(10, 40))]
            for _extra in range(layers - 3):
                mids = [(*m, new_id("nn")) for m in mids for _ in range(rng.randint(2, 4))]
            paths.extend(mids)
        tree.append(paths)
    names = [name for name, _ in TYPES]
    weights = [weight for _, weight in TYPES]
    out: list[Instance] = []
    while len(out) < instances:
        z = rng.choices(range(len(ZONES)), weights=zone_weights)[0]
        spine = (*rng.choice(tree[z]), new_id("nn"))
        size = min(rng.randint(2, 16), instances - len(out))
        main = rng.choices(names, weights=weights)[0]
        is_mixed = rng.random() < mixed
        zone, zone_id = ZONES[z]
        for _ in range(size):
            itype = rng.choices(names, weights=weights)[0] if is_mixed else main
            out.append(Instance(new_id("i"), itype, zone, spine, zone_id=zone_id,
                                group_name=f"rufus-{zone}"))
    rng.shuffle(out)
    return out


def as_pages(instances: Sequence[Instance], page_size: int | None = None) -> list[dict[str, Any]]:
    """Responses as the API pages them (``NextToken`` on every page but the last)."""
    if not page_size:
        return [{"Instances": [i.to_api() for i in instances]}]
    pages: list[dict[str, Any]] = []
    for k in range(0, len(instances), page_size):
        page: dict[str, Any] = {"Instances": [i.to_api() for i in instances[k:k + page_size]]}
        if k + page_size < len(instances):
            page["NextToken"] = f"page-{k // page_size + 2}"
        pages.append(page)
    return pages


# --------------------------------------------------------------------------- bench
def _best_ms(fn: Callable[[], object], repeat: int) -> tuple[float, float]:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    times.sort()
    return times[0], times[len(times) // 2]


def quality_row(name: str, plan: Plan, layers: int) -> str:
    s = plan.summary()
    total = max(1, s["cells"])
    by = {int(k): v for k, v in s["cellsBySharedLayers"].items()}
    cols = [f"{100 * by.get(d, 0) / total:5.1f}%" for d in range(layers, -1, -1)]
    mean = sum(d * v for d, v in by.items()) / total
    return f"| {name} | {s['cells']} | " + " | ".join(cols) + f" | {mean:.2f} | {s['stranded']} |"


def bench(instances: int = 10_000, seed: int = 1, nodes_per_cell: int = 2, repeat: int = 5,
          layers: int = 3) -> str:
    """Planning time and pairing quality on a generated topology, next to the id-order baseline."""
    import platform

    t0 = time.perf_counter()
    pool = generate(instances, seed, layers=layers)
    gen_ms = (time.perf_counter() - t0) * 1e3
    text = json.dumps(as_pages(pool)[0])
    parse_best, _ = _best_ms(lambda: instances_from_pages(pages_from_text(text)), repeat)
    topo = plan_cells(pool, nodes_per_cell)
    naive = plan_cells(pool, nodes_per_cell, strategy="id-order")
    t_best, t_med = _best_ms(lambda: plan_cells(pool, nodes_per_cell), repeat)
    n_best, n_med = _best_ms(lambda: plan_cells(pool, nodes_per_cell, strategy="id-order"), repeat)
    zones = len({i.zone for i in pool})
    types = len({i.instance_type for i in pool})
    spines = len({i.network_nodes for i in pool})
    head = [f"{'bottom' if d == layers else 'top' if d == 1 else f'layer-{d}'} node ({d})" if d
            else "zone only (0)" for d in range(layers, -1, -1)]
    lines = [
        f"topology bench: {instances} generated instances (seed {seed}: {zones} zones, {layers} layers, "
        f"{spines} bottom nodes, {types} instance types), cells of {nodes_per_cell}; "
        f"Python {platform.python_version()}",
        f"generate {gen_ms:.0f} ms; parse the JSON response (best of {repeat}) {parse_best:.1f} ms",
        f"plan, topology-aware: best {t_best:.1f} ms, median {t_med:.1f} ms (of {repeat})",
        f"plan, id-order baseline: best {n_best:.1f} ms, median {n_med:.1f} ms (of {repeat})",
        "",
        "Cells by the deepest network node their nodes share (layers shared, of "
        f"{layers}), the mean of that, and nodes left in no cell:",
        "",
        "| plan | cells | " + " | ".join(head) + " | mean shared layers | stranded nodes |",
        "|---|---:|" + "---:|" * (len(head) + 2),
        quality_row("topology-aware (bottom-up)", topo, layers),
        quality_row("id order within zone and type", naive, layers),
    ]
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- CLI
def _aws_pages(a: argparse.Namespace) -> list[Mapping[str, Any]]:
    try:
        import boto3  # only here: not a dependency of this project
    except ImportError:
        sys.exit("--aws needs boto3, which is not installed (it is not a dependency of this "
                 "project): pip install boto3, or save `aws ec2 describe-instance-topology "
                 "--region R > topo.json` and pass --input topo.json")
    client = boto3.client("ec2", region_name=a.region) if a.region else boto3.client("ec2")
    types = [a.instance_type] if a.instance_type else []
    return list(fetch_pages(client, instance_ids=a.instance_ids or (), instance_types=types,
                            group_names=a.group_names or ()))


def _cmd_plan(a: argparse.Namespace) -> int:
    if bool(a.input) == bool(a.aws):
        print("plan: give exactly one of --input FILE or --aws", file=sys.stderr)
        return 2
    pages = _aws_pages(a) if a.aws else load_file(a.input)
    instances, warnings = instances_from_pages(pages)
    plan = plan_cells(instances, a.nodes_per_cell, instance_type=a.instance_type,
                      min_shared_layers=a.min_shared_layers, strategy=a.strategy, warnings=warnings)
    sys.stdout.write(render(plan, a.format, a.label_prefix))
    if not a.quiet:
        s = plan.summary()
        print(f"{s['cells']} cells of {a.nodes_per_cell} from {s['instances']} instances, "
              f"by shared layers {s['cellsBySharedLayers']}; {s['stranded']} stranded",
              file=sys.stderr)
        for w in warnings:
            print(f"warning: {w}", file=sys.stderr)
    return 0


def _cmd_generate(a: argparse.Namespace) -> int:
    pages = as_pages(generate(a.instances, a.seed, layers=a.layers), a.page_size)
    if a.page_size:
        sys.stdout.write("".join(json.dumps(p) + "\n" for p in pages))
    else:
        sys.stdout.write(json.dumps(pages[0], indent=1) + "\n")
    return 0


def _cmd_bench(a: argparse.Namespace) -> int:
    sys.stdout.write(bench(a.instances, a.seed, a.nodes_per_cell, a.repeat, a.layers))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m deploy.topology", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)

    p = sub.add_parser("plan", help="form cells from a DescribeInstanceTopology response")
    p.add_argument("--input", help="JSON file: one response, a list of pages or JSON lines ('-': stdin)")
    p.add_argument("--aws", action="store_true", help="call DescribeInstanceTopology (needs boto3)")
    p.add_argument("--region", help="with --aws")
    p.add_argument("--instance-ids", nargs="+", help="with --aws: only these instances")
    p.add_argument("--group-names", nargs="+", help="with --aws: only these placement groups")
    p.add_argument("--nodes-per-cell", type=int, default=2, help="nodes per cell (default 2)")
    p.add_argument("--instance-type", help="only instances of this type (others are stranded)")
    p.add_argument("--min-shared-layers", type=int, default=0,
                   help="form no cell whose nodes share fewer network layers (default 0: the zone)")
    p.add_argument("--strategy", choices=sorted(STRATEGIES), default="topology",
                   help="id-order is the naive baseline, for comparison")
    p.add_argument("--format", choices=FORMATS, default="json",
                   help="json: the plan; k8s: node labels + LWS annotation (YAML); kubectl: a "
                        "labelling script; ecs: placement constraints; hosts: one line per cell")
    p.add_argument("--label-prefix", default=LABEL_PREFIX, help=f"node label prefix ({LABEL_PREFIX})")
    p.add_argument("--quiet", action="store_true", help="no summary on stderr")
    p.set_defaults(fn=_cmd_plan)

    g = sub.add_parser("generate", help="write a synthetic topology (a DescribeInstanceTopology response)")
    g.add_argument("--instances", type=int, default=10_000)
    g.add_argument("--seed", type=int, default=1)
    g.add_argument("--layers", type=int, default=3, choices=(3, 4))
    g.add_argument("--page-size", type=int, default=0,
                   help="write JSON lines of pages of this size with NextToken (default: one response)")
    g.set_defaults(fn=_cmd_generate)

    b = sub.add_parser("bench", help="time planning of a generated topology; pairing quality vs "
                                     "the id-order baseline")
    b.add_argument("--instances", type=int, default=10_000)
    b.add_argument("--seed", type=int, default=1)
    b.add_argument("--nodes-per-cell", type=int, default=2)
    b.add_argument("--layers", type=int, default=3, choices=(3, 4))
    b.add_argument("--repeat", type=int, default=5)
    b.set_defaults(fn=_cmd_bench)

    a = ap.parse_args(argv)
    try:
        return a.fn(a)
    except (ValueError, OSError, RuntimeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
