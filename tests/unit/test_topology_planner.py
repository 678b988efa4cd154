"""deploy/cell_placement/: cells paired by EC2 network topology. No cloud call: the API's documented
example response (tests/fixtures/), a fake client for paging, and generated topologies."""

from __future__ import annotations

import json
import random
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from deploy import cell_placement as T
from deploy.cell_placement import Instance

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "tests/fixtures/describe_instance_topology_example.json"
# a Kubernetes label value: at most 63 characters, alphanumeric at both ends
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


def inst(iid: str, nodes: tuple[str, ...], zone: str = "us-west-2a",
         itype: str = "trn1.32xlarge") -> Instance:
    return Instance(iid, itype, zone, nodes)


def cells_by_members(plan: T.Plan) -> dict[tuple[str, ...], int]:
    return {tuple(m.instance_id for m in c.members): c.depth for c in plan.cells}


def check_invariants(plan: T.Plan, instances: list[Instance]) -> None:
    """Every instance is in exactly one cell or stranded; a cell is N nodes of one type in one
    zone, leader first, and its depth is what its members really share."""
    seen: list[str] = []
    for c in plan.cells:
        assert len(c.members) == plan.nodes_per_cell
        assert {m.zone for m in c.members} == {c.zone}
        assert {m.instance_type for m in c.members} == {c.instance_type}
        assert c.depth == T.common_depth(c.members)
        if c.depth:
            assert all(m.network_nodes[c.depth - 1] == c.shared_node for m in c.members)
        assert LABEL_VALUE.match(c.cell_id) and len(c.cell_id) <= 63
        seen += [m.instance_id for m in c.members]
    seen += [s.instance.instance_id for s in plan.stranded]
    assert sorted(seen) == sorted({i.instance_id for i in instances})


# --------------------------------------------------------------------------- the API's example
def test_aws_documented_example() -> None:
    """The response in `aws ec2 describe-instance-topology`'s documentation: two p4d instances
    below the same bottom node pair up; the others have no partner of their type in their zone."""
    pages = T.load_file(str(EXAMPLE))
    instances, warnings = T.instances_from_pages(pages)
    assert [i.instance_id for i in instances] == ["i-1111111111example", "i-2222222222example",
                                                  "i-3333333333example", "i-444444444example"]
    assert instances[0].group_name == "my-ml-cpg" and instances[0].zone_id == "usw2-az2"
    assert instances[0].network_nodes[-1] == "nn-3333333333example"  # bottom layer last
    assert any("NextToken" in w for w in warnings)  # the example ends with a NextToken

    plan = T.plan_cells(instances, 2, warnings=warnings)
    check_invariants(plan, instances)
    [cell] = plan.cells
    assert [m.instance_id for m in cell.members] == ["i-1111111111example", "i-2222222222example"]
    assert cell.depth == 3 and cell.shared_node == "nn-3333333333example"
    assert cell.cell_id == "us-west-2a-p4d-24xlarge-0001"
    reasons = {s.instance.instance_id: s.reason for s in plan.stranded}
    assert set(reasons) == {"i-3333333333example", "i-444444444example"}
    assert "us-west-2d" in reasons["i-3333333333example"]
    assert "trn1.32xlarge" in reasons["i-3333333333example"]
    # i-444 shares a top node with the p4d pair, but is another type: never in their cell
    assert "trn1.2xlarge" in reasons["i-444444444example"]
    assert "fewer than 2" in reasons["i-444444444example"]


def test_instance_round_trips_the_api_shape() -> None:
    raw = json.loads(EXAMPLE.read_text())["Instances"][0]
    assert T.Instance.from_api(raw).to_api() == raw
    with pytest.raises(ValueError, match="InstanceId"):
        T.Instance.from_api({"InstanceType": "p5.48xlarge"})
    with pytest.raises(ValueError, match="NetworkNodes"):
        T.Instance.from_api({"InstanceId": "i-1", "NetworkNodes": "nn-1"})


def test_input_shapes_give_the_same_instances() -> None:
    """One response, a JSON list of pages, JSON lines of pages, a bare list of instances."""
    instances = T.generate(60, seed=3)
    pages = T.as_pages(instances, page_size=25)
    assert [bool(p.get("NextToken")) for p in pages] == [True, True, False]
    shapes = [json.dumps(T.as_pages(instances)[0]), json.dumps(pages),
              "\n".join(json.dumps(p) for p in pages) + "\n",
              json.dumps([i.to_api() for i in instances])]
    want = sorted(i.instance_id for i in instances)
    for text in shapes:
        got, warnings = T.instances_from_pages(T.pages_from_text(text))
        assert sorted(i.instance_id for i in got) == want and warnings == []
    with pytest.raises(ValueError, match="Instances"):
        T.pages_from_text(json.dumps([{"Reservations": []}]))


def test_an_instance_listed_twice_differently_is_an_error() -> None:
    a = {"InstanceId": "i-1", "InstanceType": "p5.48xlarge", "AvailabilityZone": "z",
         "NetworkNodes": ["a", "b", "c"]}
    same, _ = T.instances_from_pages([{"Instances": [a]}, {"Instances": [dict(a)]}])
    assert len(same) == 1
    with pytest.raises(ValueError, match="twice"):
        T.instances_from_pages([{"Instances": [a]},
                                {"Instances": [{**a, "NetworkNodes": ["a", "b", "x"]}]}])


# --------------------------------------------------------------------------- paging a client
class FakeEC2:
    """Serves pages like DescribeInstanceTopology: checks parameter names as the real API
    would, refuses MaxResults with InstanceIds, and pages by NextToken."""

    def __init__(self, instances: list[Instance]) -> None:
        self.instances = instances
        self.calls: list[dict[str, Any]] = []

    def describe_instance_topology(self, **kwargs: Any) -> Mapping[str, Any]:
        self.calls.append(kwargs)
        unknown = set(kwargs) - T.API_PARAMS
        assert not unknown, f"not a DescribeInstanceTopology parameter: {unknown}"
        assert not ("MaxResults" in kwargs and "InstanceIds" in kwargs)
        pool = self.instances
        if "InstanceIds" in kwargs:
            assert len(kwargs["InstanceIds"]) <= T.API_MAX_IDS
            pool = [i for i in pool if i.instance_id in set(kwargs["InstanceIds"])]
        for f in kwargs.get("Filters", ()):
            assert f["Name"] == "instance-type"
            pool = [i for i in pool if i.instance_type in f["Values"]]
        size = kwargs.get("MaxResults", 20)
        start = int(kwargs.get("NextToken", "tok-0").removeprefix("tok-"))
        page: dict[str, Any] = {"Instances": [i.to_api() for i in pool[start:start + size]]}
        if start + size < len(pool):
            page["NextToken"] = f"tok-{start + size}"
        return page


def test_pages_through_a_client_with_next_token() -> None:
    instances = T.generate(530, seed=5)
    ec2 = FakeEC2(instances)
    got, warnings = T.instances_from_pages(T.fetch_pages(ec2))
    assert sorted(i.instance_id for i in got) == sorted(i.instance_id for i in instances)
    assert warnings == []
    assert len(ec2.calls) == 6  # 100 a page
    assert "NextToken" not in ec2.calls[0]
    assert [c.get("NextToken") for c in ec2.calls[1:]] == [f"tok-{k}" for k in range(100, 600, 100)]
    assert all(c["MaxResults"] == 100 for c in ec2.calls)


def test_client_filters_ids_types_and_groups() -> None:
    instances = T.generate(400, seed=6)
    ec2 = FakeEC2(instances)
    ids = [i.instance_id for i in instances[:250]]
    got, _ = T.instances_from_pages(T.fetch_pages(ec2, instance_ids=ids,
                                                  instance_types=["p5.48xlarge"]))
    assert {i.instance_id for i in got} == {i.instance_id for i in instances[:250]
                                            if i.instance_type == "p5.48xlarge"}
    assert [len(c["InstanceIds"]) for c in ec2.calls if "NextToken" not in c] == [100, 100, 50]
    assert all(c["Filters"] == [{"Name": "instance-type", "Values": ["p5.48xlarge"]}]
               for c in ec2.calls)
    ec2.calls.clear()
    list(T.fetch_pages(ec2, group_names=["rufus-us-east-1a"], page_size=50))
    assert all(c["GroupNames"] == ["rufus-us-east-1a"] and c["MaxResults"] == 50 for c in ec2.calls)
    with pytest.raises(ValueError):
        list(T.fetch_pages(ec2, page_size=500))


def test_a_repeated_next_token_stops_the_pager() -> None:
    class Stuck:
        def describe_instance_topology(self, **kwargs: Any) -> Mapping[str, Any]:
            return {"Instances": [], "NextToken": "same"}

    with pytest.raises(RuntimeError, match="twice"):
        list(T.fetch_pages(Stuck()))


# --------------------------------------------------------------------------- forming cells
def test_never_across_availability_zones() -> None:
    # the same node ids in two zones (ids are per account, not global): still no cell across them
    nodes = ("top", "mid", "bottom")
    instances = [inst("i-a1", nodes, "us-west-2a"), inst("i-a2", nodes, "us-west-2a"),
                 inst("i-a3", nodes, "us-west-2a"), inst("i-b1", nodes, "us-west-2b")]
    plan = T.plan_cells(instances, 2)
    check_invariants(plan, instances)
    assert cells_by_members(plan) == {("i-a1", "i-a2"): 3}
    reasons = {s.instance.instance_id: s.reason for s in plan.stranded}
    assert set(reasons) == {"i-a3", "i-b1"}
    assert "us-west-2a has 1" in reasons["i-a3"] and "us-west-2b has 1" in reasons["i-b1"]


def test_deepest_shared_node_wins() -> None:
    """Pairs below one bottom node first; a leftover pairs within its layer-2 node before its
    top node, and across top nodes only last (same zone)."""
    instances = [
        inst("i-a", ("T1", "M1", "S1")), inst("i-b", ("T1", "M1", "S1")),
        inst("i-c", ("T1", "M1", "S1")),
        inst("i-d", ("T1", "M1", "S2")),                                   # c's layer-2 sibling
        inst("i-e", ("T1", "M2", "S3")), inst("i-f", ("T1", "M2", "S3")),
        inst("i-g", ("T1", "M2", "S4")),                                   # alone under M2
        inst("i-h", ("T1", "M3", "S5")),                                   # alone under M3
        inst("i-x", ("T2", "M9", "S9")),                                   # another top node
        inst("i-y", ("T3", "M8", "S8")),
    ]
    plan = T.plan_cells(random.Random(1).sample(instances, len(instances)), 2)
    check_invariants(plan, instances)
    assert cells_by_members(plan) == {("i-a", "i-b"): 3, ("i-c", "i-d"): 2, ("i-e", "i-f"): 3,
                                      ("i-g", "i-h"): 1, ("i-x", "i-y"): 0}
    assert plan.stranded == []
    cell = next(c for c in plan.cells if c.members[0].instance_id == "i-c")
    assert cell.shared_node == "M1"


def test_cells_of_three_and_four_layer_nodes() -> None:
    instances = [inst(f"i-{k}", ("T", "M", "S1")) for k in range(4)]
    instances += [inst("i-4", ("T", "M", "S2")), inst("i-5", ("T", "M", "S2"))]
    plan = T.plan_cells(instances, 3)
    check_invariants(plan, instances)
    assert cells_by_members(plan) == {("i-0", "i-1", "i-2"): 3, ("i-3", "i-4", "i-5"): 2}
    # p6-b200 reports 4 layers: a shorter path still joins at the layers it has
    mixed = [inst("i-p", ("T", "M", "L", "S")), inst("i-q", ("T", "M", "L", "S")),
             inst("i-r", ("T", "M", "L", "R")), inst("i-s", ("T", "M", "S3"))]
    plan = T.plan_cells(mixed, 2)
    check_invariants(plan, mixed)
    assert cells_by_members(plan) == {("i-p", "i-q"): 4, ("i-r", "i-s"): 2}


def test_stranded_nodes_have_reasons() -> None:
    instances = [inst("i-1", ("T", "M", "S")), inst("i-2", ("T", "M", "S")),
                 inst("i-3", ("T", "M2", "S2")), inst("i-4", ("T2", "M3", "S3")),
                 Instance("i-5", "trn1.32xlarge", "us-west-2a", ()),       # no topology yet
                 Instance("i-6", "", "us-west-2a", ("T", "M", "S")),
                 Instance("i-7", "trn1.32xlarge", "", ("T", "M", "S"))]
    plan = T.plan_cells(instances, 2, min_shared_layers=1)
    check_invariants(plan, instances)
    assert cells_by_members(plan) == {("i-1", "i-2"): 3}
    reasons = {s.instance.instance_id: s.reason for s in plan.stranded}
    assert "share its top 1 network layer" in reasons["i-3"]
    assert "share its top 1 network layer" in reasons["i-4"]
    assert "no NetworkNodes" in reasons["i-5"]
    assert "no InstanceType" in reasons["i-6"]
    assert "no AvailabilityZone" in reasons["i-7"]
    # without the minimum, i-3 and i-4 make a cell sharing only the zone
    assert cells_by_members(T.plan_cells(instances, 2))[("i-3", "i-4")] == 0


def test_instance_type_filter() -> None:
    nodes = ("T", "M", "S")
    instances = [inst("i-1", nodes), inst("i-2", nodes, itype="p5.48xlarge"),
                 inst("i-3", nodes, itype="p5.48xlarge"), inst("i-4", nodes)]
    plan = T.plan_cells(instances, 2, instance_type="p5.48xlarge")
    check_invariants(plan, instances)
    assert cells_by_members(plan) == {("i-2", "i-3"): 3}
    assert {s.instance.instance_id: s.reason for s in plan.stranded} == {
        "i-1": "instance type trn1.32xlarge, not p5.48xlarge",
        "i-4": "instance type trn1.32xlarge, not p5.48xlarge"}
    # other types keep the labels another plan gave them
    assert T.kubernetes_labels(plan)["unlabel"] == []
    # without the filter every type forms its own cells, never a mixed one, with distinct ids
    both = T.plan_cells(instances, 2)
    assert cells_by_members(both) == {("i-1", "i-4"): 3, ("i-2", "i-3"): 3}
    assert [c.cell_id for c in both.cells] == ["us-west-2a-p5-48xlarge-0001",
                                               "us-west-2a-trn1-32xlarge-0001"]


def test_deterministic_under_shuffled_input() -> None:
    instances = T.generate(3000, seed=7)
    want = T.plan_cells(instances, 2).to_dict()
    for seed in range(3):
        shuffled = random.Random(seed).sample(instances, len(instances))
        assert T.plan_cells(shuffled, 2).to_dict() == want
    assert T.generate(3000, seed=7) == instances  # the generator is seeded


@pytest.mark.parametrize("n", [2, 4])
def test_ten_thousand_generated_instances_beat_the_id_order_baseline(n: int) -> None:
    instances = T.generate(10_000, seed=1)
    assert len(instances) == 10_000
    assert len({i.zone for i in instances}) >= 3 and len({i.instance_type for i in instances}) >= 2
    topo = T.plan_cells(instances, n)
    naive = T.plan_cells(instances, n, strategy="id-order")
    check_invariants(topo, instances)
    check_invariants(naive, instances)
    assert len(topo.cells) == len(naive.cells)  # the same zones and types: the same capacity

    def mean_depth(p: T.Plan) -> float:
        return sum(c.depth for c in p.cells) / len(p.cells)

    def bottom(p: T.Plan) -> float:
        return sum(c.depth == 3 for c in p.cells) / len(p.cells)

    assert mean_depth(topo) > mean_depth(naive) + 1.0
    assert bottom(topo) > (0.85 if n == 2 else 0.5) > bottom(naive)
    if n == 2:
        # pairs are optimal at every layer: as many cells share >= d layers as the subtrees at
        # layer d (per zone and type) can hold, which no pairing can exceed
        for d in range(4):
            sizes: dict[tuple[Any, ...], int] = {}
            for i in instances:
                key = (i.zone, i.instance_type, i.network_nodes[:d])
                sizes[key] = sizes.get(key, 0) + 1
            assert sum(c.depth >= d for c in topo.cells) == sum(k // 2 for k in sizes.values())


def test_bench_reports_both_plans() -> None:
    out = T.bench(instances=400, seed=2, repeat=1)
    assert "topology-aware" in out and "id order" in out
    rows = [line for line in out.splitlines() if line.startswith("| ") and "%" in line]
    assert len(rows) == 2


# --------------------------------------------------------------------------- what each platform gets
@pytest.fixture(scope="module")
def plan() -> T.Plan:
    return T.plan_cells(T.generate(500, seed=11), 2)


def test_kubernetes_labels_and_lws_annotation(plan: T.Plan) -> None:
    doc = yaml.safe_load(T.render(plan, "k8s"))
    key = doc["topologyKey"]
    assert key == "rufus.dev/cell"
    assert doc["annotations"] == {"leaderworkerset.sigs.k8s.io/exclusive-topology": key}
    assert doc["groupSize"] == 2 and doc["cells"] == len(plan.cells)
    by_cell: dict[str, list[int]] = {}
    for node in doc["nodes"]:
        labels = node["labels"]
        assert node["providerID"].endswith("/" + node["instanceId"])
        assert node["providerID"].startswith("aws:///us-east-1")
        for k, v in labels.items():
            assert isinstance(v, str) and LABEL_VALUE.match(v) and len(v) <= 63, (k, v)
        by_cell.setdefault(labels[key], []).append(int(labels["rufus.dev/cell-rank"]))
    assert all(sorted(r) == [0, 1] for r in by_cell.values()) and len(by_cell) == len(plan.cells)
    leaders = {n["labels"][key]: n["instanceId"] for n in doc["nodes"]
               if n["labels"]["rufus.dev/cell-rank"] == "0"}
    assert leaders == {c.cell_id: c.members[0].instance_id for c in plan.cells}
    assert doc["unlabel"] == [s.instance.instance_id for s in plan.stranded]


@pytest.mark.skipif(shutil.which("bash") is None, reason="no bash")
def test_kubectl_script_is_valid_bash(plan: T.Plan) -> None:
    script = T.render(plan, "kubectl", "example.com")
    assert script.startswith("#!/usr/bin/env bash")
    assert "exclusive-topology: example.com/cell" in script
    first = plan.cells[0]
    assert (f"label {first.members[0].instance_id} example.com/cell={first.cell_id} "
            "example.com/cell-rank=0") in script
    subprocess.run(["bash", "-n"], input=script, text=True, check=True)


@pytest.mark.skipif(shutil.which("bash") is None, reason="no bash")
def test_kubectl_script_labels_nodes_found_by_provider_id(tmp_path: Path) -> None:
    """Run the script against a stand-in kubectl: nodes are named by DNS, found by providerID."""
    small = T.plan_cells(T.generate(9, seed=4), 2)
    known = [m for c in small.cells for m in c.members][:-1] + [s.instance for s in small.stranded]
    listing = "".join(f"ip-10-0-0-{k} aws:///{i.zone}/{i.instance_id}\n" for k, i in enumerate(known))
    (tmp_path / "nodes.txt").write_text(listing)
    fake = tmp_path / "kubectl"
    fake.write_text("#!/usr/bin/env bash\n"
                    f'if [[ $1 == get ]]; then cat {tmp_path}/nodes.txt; '
                    f'else echo "$*" >> {tmp_path}/calls.txt; fi\n')
    fake.chmod(0o755)
    run = subprocess.run(["bash", "-c", T.render(small, "kubectl")], capture_output=True, text=True,
                         env={"PATH": f"{tmp_path}:/usr/bin:/bin"}, check=True)
    calls = (tmp_path / "calls.txt").read_text().splitlines()
    name = {i.instance_id: f"ip-10-0-0-{k}" for k, i in enumerate(known)}
    first = small.cells[0]
    assert (f"label node {name[first.members[0].instance_id]} --overwrite "
            f"rufus.dev/cell={first.cell_id} rufus.dev/cell-rank=0 "
            f"rufus.dev/cell-layers={first.depth}") in calls
    assert len(calls) == len(known)  # the one unknown instance is reported, not labelled
    assert "1 instance(s) of the plan are not nodes" in run.stderr
    for s in small.stranded:
        assert (f"label node {name[s.instance.instance_id]} --overwrite rufus.dev/cell- "
                "rufus.dev/cell-rank- rufus.dev/cell-layers-") in calls


def test_ecs_placement_constraints(plan: T.Plan) -> None:
    doc = json.loads(T.render(plan, "ecs"))
    assert len(doc["cells"]) == len(plan.cells)
    for cell, c in zip(doc["cells"], plan.cells, strict=True):
        ids = [m.instance_id for m in c.members]
        assert cell["cell"] == c.cell_id
        assert cell["cellConstraint"] == {
            "type": "memberOf", "expression": "ec2InstanceId in [" + ", ".join(f"'{i}'" for i in ids) + "]"}
        assert [t["instanceId"] for t in cell["tasks"]] == ids
        assert [t["role"] for t in cell["tasks"]] == ["leader"] + ["follower"] * (len(ids) - 1)
        for t in cell["tasks"]:
            [pc] = t["placementConstraints"]
            assert pc == {"type": "memberOf", "expression": f"ec2InstanceId == {t['instanceId']}"}
            assert {"name": "rufus.cell", "value": c.cell_id} in t["attributes"]
        assert cell["attributeConstraint"]["expression"] == f"attribute:rufus.cell == {c.cell_id}"
        assert all(len(x["expression"]) <= 2000 for x in (cell["cellConstraint"],
                                                           cell["attributeConstraint"]))


def test_hosts_list(plan: T.Plan) -> None:
    text = T.render(plan, "hosts")
    lines = [line.split() for line in text.splitlines() if not line.startswith("#")]
    assert [(f[0], f[1:]) for f in lines] == [(c.cell_id, [m.instance_id for m in c.members])
                                              for c in plan.cells]
    assert sum(line.startswith("# stranded ") for line in text.splitlines()) == len(plan.stranded)


def test_json_plan(plan: T.Plan) -> None:
    doc = json.loads(T.render(plan, "json"))
    assert doc["summary"]["cells"] == len(plan.cells)
    assert doc["summary"]["instances"] == 500
    assert doc["cells"][0]["members"][0]["role"] == "leader"


# --------------------------------------------------------------------------- CLI
def test_cli_plan_generate_and_missing_boto3(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    assert T.main(["plan", "--input", str(EXAMPLE), "--format", "hosts"]) == 0
    out, err = capsys.readouterr()
    assert "us-west-2a-p4d-24xlarge-0001 i-1111111111example i-2222222222example" in out
    assert "1 cells of 2 from 4 instances" in err and "warning" in err

    assert T.main(["generate", "--instances", "300", "--seed", "2", "--page-size", "100"]) == 0
    out, _ = capsys.readouterr()
    (tmp_path / "topo.jsonl").write_text(out)
    assert T.main(["plan", "--input", str(tmp_path / "topo.jsonl"), "--quiet",
                   "--nodes-per-cell", "3", "--instance-type", "p5.48xlarge"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["nodesPerCell"] == 3 and doc["summary"]["instances"] == 300
    assert {c["instanceType"] for c in doc["cells"]} == {"p5.48xlarge"}

    assert T.main(["plan"]) == 2
    monkeypatch.setitem(sys.modules, "boto3", None)  # import boto3 -> ImportError
    with pytest.raises(SystemExit, match="boto3"):
        T.main(["plan", "--aws"])


def test_cli_help_runs_as_a_module() -> None:
    out = subprocess.run([sys.executable, "-m", "deploy.cell_placement", "--help"], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout
    assert "plan" in out and "generate" in out and "bench" in out
