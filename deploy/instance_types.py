"""Per-instance-type cell configuration as data: deploy/instance_types.toml, validated.

A cell (one inference unit) of a given instance type is described once — accelerator,
devices, nodes per cell, tensor/pipeline-parallel degrees, engine arguments — and everything
deployed is rendered from that: the LeaderWorkerSet manifests (deploy/kubernetes/manifests.py)
and the values the compose rig and ECS task definitions must agree with (tests). The cell's
capacity (``engine_args.max_num_seqs``) comes from the same entry, so the weight the ingress
gives a type relative to the others cannot drift from what its engine is configured for.

    python -m deploy.instance_types list                  # types, parallelism, capacity, weight
    python -m deploy.instance_types check [--file F]      # validate; exit 1 naming the field
    python -m deploy.instance_types render TYPE [--format json|env]
                                                          # what a cell of TYPE is deployed with
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import sys
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
DEFAULT_PATH = HERE / "instance_types.toml"


@dataclass(frozen=True)
class Accelerator:
    """What the accelerator kind fixes for every type that uses it."""

    image: str
    python: str
    resource: str | None  # the Kubernetes device resource; None: CPU only
    toleration: str | None  # taint key the device nodes carry


ACCELERATORS: dict[str, Accelerator] = {
    "cpu": Accelerator("rufus-inference:cpu", "python", None, None),
    "cuda": Accelerator("rufus-inference:cuda", "python3", "nvidia.com/gpu", "nvidia.com/gpu"),
    "neuron": Accelerator("rufus-inference:neuron", "python3", "aws.amazon.com/neuron",
                          "aws.amazon.com/neuron"),
}
EFA_RESOURCE = "vpc.amazonaws.com/efa"
# set from the type's own fields (or by the unit's topology at run time), never in engine_args
RESERVED_ENGINE_ARGS = {
    "tensor_parallel_size": "tensor_parallel", "pipeline_parallel_size": "pipeline_parallel",
    "nnodes": "nodes_per_cell", "node_rank": None, "master_addr": None, "master_port": None,
}
_QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(m|Ki|Mi|Gi|Ti)?$")
_MANIFEST = re.compile(r"^[a-z0-9]([a-z0-9-]{0,40}[a-z0-9])?$")


class InstanceTypeError(ValueError):
    """A wrong entry: names the file, the type and the field, and says why."""

    def __init__(self, path: Path | str, type_name: str | None, fld: str | None,
                 reason: str) -> None:
        where = "types" + (f".{_key(type_name)}" if type_name else "") + (f".{fld}" if fld else "")
        super().__init__(f"{path}: {where}: {reason}")
        self.path, self.type_name, self.field, self.reason = str(path), type_name, fld, reason


def _key(name: str) -> str:
    return name if re.fullmatch(r"[A-Za-z0-9_-]+", name) else f'"{name}"'


@dataclass(frozen=True)
class CellType:
    """One instance type's cell, validated (:func:`load`)."""

    name: str
    description: str
    manifest: str
    accelerator: str
    devices_per_node: int
    nodes_per_cell: int
    tensor_parallel: int
    pipeline_parallel: int
    engine_args: dict[str, Any]
    cpu: str
    memory: str
    startup_failures: int
    cores_per_device: int = 1
    efa_per_node: int = 0
    memory_limit: str = ""  # "": the request
    node_selector: dict[str, str] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)

    @property
    def accel(self) -> Accelerator:
        return ACCELERATORS[self.accelerator]

    @property
    def ranks_per_node(self) -> int:
        """Engine ranks (workers) on each node: the parallel world spread over the nodes."""
        return self.tensor_parallel * self.pipeline_parallel // self.nodes_per_cell

    @property
    def slots_per_node(self) -> int:
        """Ranks a node can host: one per device core; a CPU node runs one engine process."""
        return 1 if self.accelerator == "cpu" else self.devices_per_node * self.cores_per_device

    @property
    def capacity(self) -> int:
        """Sequences the cell batches (``max_num_seqs``): its weight relative to other types.

        The unit agent reports the live figure (also bounded by the KV cache the engine
        allocated); Neuron allocates its cache for max_num_seqs x max_model_len, so there
        the two agree."""
        return int(self.engine_args["max_num_seqs"])

    def rendered_engine_args(self) -> dict[str, Any]:
        """rufus_llm's engine arguments for this type (RUFUS_RUFUS_LLM_ENGINE_ARGS): the
        parallel degrees that are not 1, then the type's own arguments."""
        out: dict[str, Any] = {}
        if self.tensor_parallel > 1:
            out["tensor_parallel_size"] = self.tensor_parallel
        if self.pipeline_parallel > 1:
            out["pipeline_parallel_size"] = self.pipeline_parallel
        return {**out, **self.engine_args}

    def engine_args_json(self) -> str:
        return json.dumps(self.rendered_engine_args())

    def resources(self) -> dict[str, Any]:
        """The follower pod's Kubernetes resources (requests and limits)."""
        req: dict[str, str] = {"cpu": self.cpu, "memory": self.memory}
        lim: dict[str, str] = {"memory": self.memory_limit or self.memory}
        if self.accel.resource:
            req[self.accel.resource] = lim[self.accel.resource] = str(self.devices_per_node)
        if self.efa_per_node:
            req[EFA_RESOURCE] = lim[EFA_RESOURCE] = str(self.efa_per_node)
        return {"requests": req, "limits": lim}

    def tolerations(self) -> list[dict[str, str]]:
        key = self.accel.toleration
        return [{"key": key, "operator": "Exists", "effect": "NoSchedule"}] if key else []


@dataclass(frozen=True)
class InstanceTypes:
    """Every type of one data file, in file order."""

    path: Path
    types: dict[str, CellType]

    def __getitem__(self, name: str) -> CellType:
        try:
            return self.types[name]
        except KeyError:
            raise KeyError(f"{self.path}: no instance type {name!r}; known: "
                           f"{', '.join(self.types)}") from None

    @property
    def capacity_reference(self) -> int:
        """The capacity that weighs 100 % at the ingress (the agents' RUFUS_CAPACITY_REFERENCE):
        the largest type's, so every type's weight fits HAProxy's range (at most 256 %)."""
        return max(t.capacity for t in self.types.values())

    def relative_weight(self, name: str) -> int:
        """The type's weight in % of the reference while idle: what its agent reports."""
        return round(100 * self.types[name].capacity / self.capacity_reference)

    def rendered(self, name: str) -> dict[str, Any]:
        """Everything a cell of this type is deployed with, in one dict."""
        t = self[name]
        return {
            "instance_type": t.name, "manifest": t.manifest, "accelerator": t.accelerator,
            "image": t.accel.image, "nodes_per_cell": t.nodes_per_cell,
            "tensor_parallel": t.tensor_parallel, "pipeline_parallel": t.pipeline_parallel,
            "ranks_per_node": t.ranks_per_node, "capacity_sequences": t.capacity,
            "relative_weight_percent": self.relative_weight(name),
            "env": {"RUFUS_RUFUS_LLM_ENGINE_ARGS": t.engine_args_json(), **t.env},
            "agent_env": {"RUFUS_CAPACITY_REFERENCE": str(self.capacity_reference)},
            "resources": t.resources(), "node_selector": t.node_selector,
        }


# ----------------------------------------------------------------------------- validation
_FIELDS: dict[str, tuple[type, bool]] = {  # name -> (type, required)
    "description": (str, True), "manifest": (str, True), "accelerator": (str, True),
    "devices_per_node": (int, True), "cores_per_device": (int, False),
    "nodes_per_cell": (int, True), "tensor_parallel": (int, True),
    "pipeline_parallel": (int, True), "engine_args": (dict, True), "efa_per_node": (int, False),
    "cpu": (str, True), "memory": (str, True), "memory_limit": (str, False),
    "node_selector": (dict, False),
    "env": (dict, False), "startup_failures": (int, True),
}


def _cell(path: Path, name: str, raw: Any) -> CellType:
    def err(fld: str | None, reason: str) -> InstanceTypeError:
        return InstanceTypeError(path, name, fld, reason)

    if not isinstance(raw, dict):
        raise err(None, f"expected a table, got {type(raw).__name__}")
    for k in raw:
        if k not in _FIELDS:
            raise err(k, f"unknown field (known: {', '.join(_FIELDS)})")
    for k, (kind, required) in _FIELDS.items():
        if k not in raw:
            if required:
                raise err(k, "missing (required)")
            continue
        v = raw[k]
        if not isinstance(v, kind) or (kind is int and isinstance(v, bool)):
            raise err(k, f"expected {kind.__name__}, got {type(v).__name__} {v!r}")
    v = dict(raw)
    if v["accelerator"] not in ACCELERATORS:
        raise err("accelerator", f"unknown accelerator {v['accelerator']!r} "
                                 f"(known: {', '.join(ACCELERATORS)})")
    if not _MANIFEST.match(v["manifest"]):
        raise err("manifest", f"{v['manifest']!r}: lowercase letters, digits and '-' "
                              "(it names lws-<manifest>.yaml and the LeaderWorkerSet)")
    for k in ("nodes_per_cell", "tensor_parallel", "pipeline_parallel", "startup_failures"):
        if v[k] < 1:
            raise err(k, f"must be >= 1, got {v[k]}")
    for k in ("devices_per_node", "efa_per_node"):
        if v.get(k, 0) < 0:
            raise err(k, f"must be >= 0, got {v[k]}")
    if v.get("cores_per_device", 1) < 1:
        raise err("cores_per_device", f"must be >= 1, got {v['cores_per_device']}")
    if v["accelerator"] == "cpu" and v["devices_per_node"] != 0:
        raise err("devices_per_node", "a cpu type has no devices (0)")
    if v["accelerator"] != "cpu" and v["devices_per_node"] < 1:
        raise err("devices_per_node", f"a {v['accelerator']} node needs at least one device")
    for k in ("cpu", "memory", "memory_limit"):
        if k in v and not _QUANTITY.match(v[k]):
            raise err(k, f"{v[k]!r} is not a Kubernetes quantity (e.g. '8', '500m', '64Gi')")
    for k in ("memory", "memory_limit"):
        if k in v and not v[k].endswith("Gi"):
            raise err(k, f"{v[k]!r}: give it in Gi (the leader pod adds whole GiB)")
    if "memory_limit" in v and int(v["memory_limit"][:-2]) < int(v["memory"][:-2]):
        raise err("memory_limit", f"{v['memory_limit']} is below the request {v['memory']}")
    for k in ("node_selector", "env"):
        for kk, vv in v.get(k, {}).items():
            if not isinstance(vv, str):
                raise err(f"{k}.{kk}", f"expected a string, got {type(vv).__name__} {vv!r}")
    args = v["engine_args"]
    for k, own in RESERVED_ENGINE_ARGS.items():
        if k in args:
            raise err(f"engine_args.{k}", f"set by {own!r}" if own else
                      "set by the unit's topology at run time (rufus/multinode/topology.py)")
    seqs = args.get("max_num_seqs")
    if seqs is None:
        raise err("engine_args.max_num_seqs", "missing (required: the cell's capacity)")
    if not isinstance(seqs, int) or isinstance(seqs, bool) or seqs < 1:
        raise err("engine_args.max_num_seqs", f"expected a whole number >= 1, got {seqs!r}")
    cell = CellType(
        name=name, description=v["description"], manifest=v["manifest"],
        accelerator=v["accelerator"], devices_per_node=v["devices_per_node"],
        nodes_per_cell=v["nodes_per_cell"], tensor_parallel=v["tensor_parallel"],
        pipeline_parallel=v["pipeline_parallel"], engine_args=dict(args), cpu=v["cpu"],
        memory=v["memory"], startup_failures=v["startup_failures"],
        cores_per_device=v.get("cores_per_device", 1), efa_per_node=v.get("efa_per_node", 0),
        memory_limit=v.get("memory_limit", ""),
        node_selector=dict(v.get("node_selector") or
                           {"node.kubernetes.io/instance-type": name}),
        env=dict(v.get("env", {})))
    _check_parallelism(cell, err)
    return cell


def _check_parallelism(c: CellType, err: Any) -> None:
    """The degrees must fit the cell: the world (TP x PP) spread evenly over the nodes, no
    node given more ranks than it has cores, no tensor-parallel group across nodes (its
    all-reduce runs at every layer; across the network only pipeline stages go)."""
    world = c.tensor_parallel * c.pipeline_parallel
    if world < c.nodes_per_cell:
        raise err("nodes_per_cell", f"{c.nodes_per_cell} nodes for {world} rank(s): a node "
                                    "would run nothing")
    if world % c.nodes_per_cell:
        raise err("pipeline_parallel",
                  f"tensor_parallel x pipeline_parallel = {c.tensor_parallel} x "
                  f"{c.pipeline_parallel} = {world} ranks cannot be spread evenly over "
                  f"{c.nodes_per_cell} nodes")
    unit = "NeuronCores" if c.accelerator == "neuron" else (
        "GPUs" if c.accelerator == "cuda" else "engine process (CPU)")
    have = c.slots_per_node
    how = f" ({c.devices_per_node} devices x {c.cores_per_device})" if c.cores_per_device > 1 else ""
    if c.tensor_parallel > have or (c.accelerator != "cpu" and have % c.tensor_parallel):
        raise err("tensor_parallel",
                  f"{c.tensor_parallel} does not fit one {c.name} node: it has {have} {unit}"
                  f"{how}; a tensor-parallel group stays inside one node and must divide "
                  f"its {unit}")
    if c.ranks_per_node > have:
        raise err("pipeline_parallel",
                  f"{world} ranks over {c.nodes_per_cell} node(s) put {c.ranks_per_node} on each; "
                  f"a {c.name} node has {have} {unit}")
    if c.accelerator == "neuron" and c.nodes_per_cell > 1 and c.efa_per_node < 1:
        raise err("efa_per_node", f"a neuron cell of {c.nodes_per_cell} nodes needs EFA "
                                  "(cross-node collectives run over it)")


def parse(data: Mapping[str, Any], path: Path | str = "<data>") -> InstanceTypes:
    """Validate already-parsed TOML (``{"types": {...}}``)."""
    path = Path(path)
    unknown = set(data) - {"types"}
    if unknown:
        raise InstanceTypeError(path, None, None, f"unknown top-level key(s) {sorted(unknown)}; "
                                                  "only [types.<name>] tables")
    raw = data.get("types")
    if not isinstance(raw, dict) or not raw:
        raise InstanceTypeError(path, None, None, "no [types.<name>] tables")
    types = {name: _cell(path, name, entry) for name, entry in raw.items()}
    seen: dict[str, str] = {}
    for t in types.values():
        if t.manifest in seen:
            raise InstanceTypeError(path, t.name, "manifest",
                                    f"{t.manifest!r} is also {seen[t.manifest]!r}'s")
        seen[t.manifest] = t.name
    return InstanceTypes(path, types)


def load(path: Path | str = DEFAULT_PATH) -> InstanceTypes:
    """Read and validate the data file; :class:`InstanceTypeError` names what is wrong."""
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text())
    except OSError as exc:
        raise InstanceTypeError(path, None, None, f"cannot read: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise InstanceTypeError(path, None, None, f"not valid TOML: {exc}") from None
    return parse(data, _shown(path))


def _shown(path: Path) -> Path:
    """The path as an error shows it: relative to the repository when inside it."""
    try:
        return path.resolve().relative_to(HERE.parent)
    except ValueError:
        return path


# ----------------------------------------------------------------------------------- CLI
def _cmd_list(types: InstanceTypes, as_json: bool) -> int:
    if as_json:
        print(json.dumps({n: types.rendered(n) for n in types.types}, indent=1))
        return 0
    head = ("type", "accel", "nodes", "TP", "PP", "ranks/node", "capacity", "weight %", "manifest")
    rows = [(t.name, t.accelerator, str(t.nodes_per_cell), str(t.tensor_parallel),
             str(t.pipeline_parallel), f"{t.ranks_per_node}/{t.slots_per_node}",
             str(t.capacity), str(types.relative_weight(t.name)), f"lws-{t.manifest}.yaml")
            for t in types.types.values()]
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    for r in [head, *rows]:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())
    print(f"\ncapacity reference (RUFUS_CAPACITY_REFERENCE on every agent): "
          f"{types.capacity_reference} sequences = 100 %")
    return 0


def _cmd_render(types: InstanceTypes, names: Sequence[str], fmt: str) -> int:
    for name in names or list(types.types):
        r = types.rendered(name)
        if fmt == "json":
            print(json.dumps(r, indent=1))
        else:
            print(f"# {name}: every node")
            for k, v in r["env"].items():
                print(f"{k}={shlex.quote(v)}")
            print(f"# {name}: the unit agent")
            for k, v in r["agent_env"].items():
                print(f"{k}={shlex.quote(v)}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m deploy.instance_types", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--file", default=str(DEFAULT_PATH), help="the data file (default %(default)s)")
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("list", help="types, parallelism, capacity and relative weight")
    p.add_argument("--json", action="store_true", help="everything each type renders to")
    sub.add_parser("check", help="validate the file (exit 1 naming the wrong field)")
    p = sub.add_parser("render", help="what a cell of TYPE is deployed with")
    p.add_argument("types", nargs="*", metavar="TYPE", help="default: every type")
    p.add_argument("--format", choices=["json", "env"], default="json")
    a = ap.parse_args(argv)
    try:
        types = load(a.file)
        if a.cmd == "list":
            return _cmd_list(types, a.json)
        if a.cmd == "render":
            for n in a.types:
                _ = types[n]  # an unknown type raises, naming the known ones
            return _cmd_render(types, a.types, a.format)
        print(f"{types.path}: {len(types.types)} instance types valid: "
              f"{', '.join(types.types)}")
        return 0
    except (InstanceTypeError, KeyError) as exc:
        print(f"error: {exc.args[0] if isinstance(exc, KeyError) else exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
