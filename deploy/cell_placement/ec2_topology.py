"""What EC2's DescribeInstanceTopology says: its instances, its paging, and the files that
hold its responses. Kept apart from the planning so the API's shape is checked in one place."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

# DescribeInstanceTopology: at most 100 results a page, and 100 instance ids a request; the
# API refuses MaxResults together with InstanceIds.
API_MAX_RESULTS = 100
API_MAX_IDS = 100
# the request parameters the real API takes (a typo must fail here, not in the cloud)
API_PARAMS = frozenset({"DryRun", "NextToken", "MaxResults", "InstanceIds", "GroupNames", "Filters"})


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

