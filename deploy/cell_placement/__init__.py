"""Cells paired by network topology, planned at deploy time: EC2 instances grouped into cells
(one leader + followers) whose nodes share the deepest network node DescribeInstanceTopology
reports, and what Kubernetes, ECS and the compose rig need to place each cell on them.

Rufus does not import this; ``rufus/multinode/topology.py`` (a unit's rank layout at run
time) is something else. The command line: ``python -m deploy.cell_placement`` (cell_cli.py).
Everything a caller uses is re-exported here, one namespace as before the split.
"""

from .cell_cli import main
from .cell_formats import (
    ECS_ATTRIBUTE_PREFIX,
    FORMATS,
    LABEL_PREFIX,
    LWS_EXCLUSIVE_TOPOLOGY,
    ecs_constraints,
    hosts_list,
    kubectl_script,
    kubernetes_labels,
    render,
)
from .cell_plan import STRATEGIES, Cell, Plan, Stranded, common_depth, plan_cells
from .ec2_topology import (
    API_MAX_IDS,
    API_MAX_RESULTS,
    API_PARAMS,
    Instance,
    TopologyClient,
    fetch_pages,
    instances_from_pages,
    load_file,
    pages_from_text,
)
from .synthetic_topology import TYPES, ZONES, as_pages, bench, generate, quality_row

__all__ = [
    "API_MAX_IDS", "API_MAX_RESULTS", "API_PARAMS", "ECS_ATTRIBUTE_PREFIX", "FORMATS",
    "LABEL_PREFIX", "LWS_EXCLUSIVE_TOPOLOGY", "STRATEGIES", "TYPES", "ZONES", "Cell", "Instance",
    "Plan", "Stranded", "TopologyClient", "as_pages", "bench", "common_depth", "ecs_constraints",
    "fetch_pages", "generate", "hosts_list", "instances_from_pages", "kubectl_script",
    "kubernetes_labels", "load_file", "main", "pages_from_text", "plan_cells", "quality_row",
    "render",
]
