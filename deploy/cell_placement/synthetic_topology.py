"""Synthetic topologies shaped like AWS's fan-out, and the bench that times planning on one
and compares its pairing with the id-order baseline: no cloud account needed for either."""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable, Sequence
from typing import Any

from .cell_plan import Plan, plan_cells
from .ec2_topology import Instance, instances_from_pages, pages_from_text

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

