"""Cells paired by network topology: group EC2 instances into cells (one leader + followers)
whose nodes share the deepest possible network node, as EC2's DescribeInstanceTopology reports
it, and emit what Kubernetes, ECS and the compose rig need to place a cell on those nodes.

    python -m deploy.cell_placement plan --input topo.json [--nodes-per-cell 2]
        [--instance-type trn1.32xlarge] [--format json|k8s|kubectl|ecs|hosts]
    python -m deploy.cell_placement plan --aws [--region us-west-2] ...   # needs boto3 (not a dependency)
    python -m deploy.cell_placement generate --instances 10000 --seed 1 > topo.json
    python -m deploy.cell_placement bench [--instances 10000] [--seed 1]

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
import json
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from .cell_formats import FORMATS, LABEL_PREFIX, render
from .cell_plan import STRATEGIES, plan_cells
from .ec2_topology import fetch_pages, instances_from_pages, load_file
from .synthetic_topology import as_pages, bench, generate


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
    ap = argparse.ArgumentParser(prog="python -m deploy.cell_placement", description=__doc__,
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

