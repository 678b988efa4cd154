"""Every command, port, environment variable and health path named in docker/ and deploy/
matches deploy/contract.py, and the contract matches what rufus/, follower/ and proxy/ read
and serve. Runs without Docker, Kubernetes or AWS (they are not available in CI)."""

from __future__ import annotations

import copy
import fnmatch
import json
import re
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

import jsonschema
import pytest
import yaml

from deploy import contract as C
from rufus.serving.config import env_override_name

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = yaml.safe_load((ROOT / "docker/compose.yaml").read_text())
LWS = {p.stem.removeprefix("lws-"): yaml.safe_load(p.read_text())
       for p in sorted((ROOT / "deploy/kubernetes").glob("lws-*.yaml"))}
SERVICE = yaml.safe_load((ROOT / "deploy/kubernetes/service.yaml").read_text())
ECS = {p.stem.removesuffix("-taskdef"): json.loads(p.read_text())
       for p in sorted((ROOT / "deploy/ecs").glob("*-taskdef.json"))}
DOCKERFILE = (ROOT / "docker/Dockerfile").read_text()
SCHEMAS = ROOT / "deploy/schemas"
URL = re.compile(r"https?://[^\s\"',]+")


def code_text(rel: str) -> str | None:
    """Source text of a file, or of every file under a directory; None if absent/empty."""
    p = ROOT / rel
    if p.is_file():
        return p.read_text()
    if p.is_dir():
        files = [f for f in sorted(p.rglob("*")) if f.is_file() and f.suffix in (".py", ".cfg")
                 and "__pycache__" not in f.parts]
        return "\n".join(f.read_text() for f in files) or None
    return None


# ---------------------------------------------------------------- collecting what files name
def k8s_containers() -> list[tuple[str, str, dict]]:
    out = []
    for variant, m in LWS.items():
        t = m["spec"]["leaderWorkerTemplate"]
        for role in ("leaderTemplate", "workerTemplate"):
            out += [(variant, role, c) for c in t[role]["spec"]["containers"]]
    return out


def ecs_containers() -> list[tuple[str, dict]]:
    return [(fam, c) for fam, td in ECS.items() for c in td["containerDefinitions"]]


def compose_services() -> dict[str, dict]:
    return COMPOSE["services"]


def env_names() -> dict[str, set[str]]:
    names: dict[str, set[str]] = {}

    def add(name: str, where: str) -> None:
        names.setdefault(name, set()).add(where)

    for svc, s in compose_services().items():
        for k in s.get("environment", {}):
            add(k, f"compose:{svc}")
    for variant, role, c in k8s_containers():
        for e in c.get("env", []):
            add(e["name"], f"k8s:{variant}:{role}:{c['name']}")
    for fam, c in ecs_containers():
        for e in c.get("environment", []):
            add(e["name"], f"ecs:{fam}:{c['name']}")
    for m in re.finditer(r"^(?:ENV|ARG)\s+(.+?)(?<!\\)$", DOCKERFILE, re.M | re.S):
        for name in re.findall(r"(?:^|\s)([A-Z][A-Z0-9_]*)=", m.group(1)):
            if not name.endswith(("_IMAGE", "_VERSION")):  # build args naming base/apt pins
                add(name, "Dockerfile")
    return names


def all_commands() -> list[tuple[str, list[str]]]:
    cmds = [(f"compose:{n}", s["command"]) for n, s in compose_services().items()
            if "command" in s and n != "haproxy"]
    cmds += [(f"k8s:{v}:{c['name']}", c["command"]) for v, _, c in k8s_containers()]
    cmds += [(f"ecs:{f}:{c['name']}", c["command"]) for f, c in ecs_containers()]
    for m in re.finditer(r"^FROM .* AS (\w+)$(.*?)(?=^FROM |\Z)", DOCKERFILE, re.M | re.S):
        cmd = re.search(r"^CMD (\[.*\])$", m.group(2), re.M)
        if cmd and m.group(1) != "ingress":
            cmds.append((f"Dockerfile:{m.group(1)}", json.loads(cmd.group(1))))
    return cmds


def unwrap(cmd: list[str]) -> tuple[list[str], list[str]]:
    """(watched URLs, node command) of a command that may run under docker/unit_guard.py."""
    if len(cmd) > 1 and cmd[1].endswith("docker/unit_guard.py"):
        split = cmd.index("--")
        urls = [a.split("=", 1)[1] for a in cmd[2:split] if a.startswith("--watch=")]
        return urls, cmd[split + 1:]
    return [], cmd


def endpoint_for(port: int, path: str) -> C.Endpoint | None:
    for ep in C.HEALTH.values():
        if ep.path == path and C.PORTS[ep.port_var] == port:
            return ep
    return None


# ---------------------------------------------------------------- environment variables
def test_every_env_var_in_deploy_files_is_in_the_contract():
    unknown = {n: sorted(w) for n, w in env_names().items()
               if n not in C.ENV and n not in C.EXTERNAL_ENV and n not in C.BUILD_ARGS}
    assert not unknown, f"env vars not in deploy/contract.py (typo, or add them): {unknown}"


@pytest.mark.parametrize("name", sorted(C.ENV))
def test_contract_env_var_is_read_by_its_reader(name):
    for reader in C.ENV[name].readers:
        text = code_text(reader)
        assert text is not None, f"{reader} (reader of {name}) does not exist"
        if name == env_override_name(C.MODEL):  # built from the model name at run time
            assert "env_override_name" in text and "_ENGINE_ARGS" in text
        else:
            # a setting read by its config name, which ``RUFUS_<NAME>`` overrides
            # (a ``param`` of rufus/serving/settings.py, e.g. on RestartPolicy)
            setting = name.removeprefix("RUFUS_").lower()
            assert name in text or f'"{setting}"' in text, f"{reader} does not read {name}"


def test_code_env_vars_are_all_in_the_contract():
    """The reverse: a RUFUS_*/LWS_* variable the code reads must be in the table."""
    found: dict[str, str] = {}
    for pkg in ("rufus", "follower", "proxy"):
        for f in (ROOT / pkg).rglob("*.py"):
            for name in re.findall(r"[\"']((?:RUFUS|LWS)_[A-Z0-9_]+)[\"']", f.read_text()):
                found.setdefault(name, str(f.relative_to(ROOT)))
    # a name ending in "_" is a prefix (admission's RUFUS_QP_<FIELD>), not a variable
    missing = {n: f for n, f in found.items() if n not in C.ENV and not n.endswith("_")}
    assert not missing, f"read by code but missing from deploy/contract.py ENV: {missing}"


def test_contract_ports_match_code_defaults():
    from rufus.launch import server
    from rufus.multinode import topology

    assert topology.DEFAULT_LEADER_PORT == C.PORTS["RUFUS_LEADER_PORT"]
    assert topology.DEFAULT_HEALTH_PORT == C.PORTS["RUFUS_HEALTH_PORT"]
    topo = topology.topology_from_env({})
    assert getattr(topo, "leader_control_port", C.PORTS["RUFUS_CONTROL_PORT"]) == C.PORTS[
        "RUFUS_CONTROL_PORT"]
    srv = server.TritonServer()
    assert (srv.grpc_port, srv.http_port, srv.metrics_port) == (
        C.PORTS["GRPC_PORT"], C.PORTS["HTTP_PORT"], C.PORTS["METRICS_PORT"])
    makefile = (ROOT / "Makefile").read_text()
    for var in ("GRPC_PORT", "HTTP_PORT", "METRICS_PORT"):
        assert re.search(rf"{var} \?= {C.PORTS[var]}\b", makefile), var


# ---------------------------------------------------------------- ports and values
@pytest.mark.parametrize("name", ["GRPC_PORT", "HTTP_PORT", "METRICS_PORT", "RUFUS_LEADER_PORT",
                                  "RUFUS_CONTROL_PORT",
                                  "RUFUS_HEALTH_PORT", "RUFUS_AGENT_PORT", "LWS_WORKER_INDEX",
                                  "LWS_GROUP_SIZE", "RUFUS_MODELS", "RUFUS_UNIT_MODELS",
                                  "OPENAI_PORT"])
def test_env_values_agree_with_contract(name):
    want = {**{k: str(v) for k, v in C.PORTS.items()}, "LWS_GROUP_SIZE": "2",
            "RUFUS_MODELS": ",".join(C.LEADER_MODELS),
            "RUFUS_UNIT_MODELS": ",".join(C.LEADER_MODELS)}
    seen = []
    for svc, s in compose_services().items():
        if name in s.get("environment", {}):
            seen.append((f"compose:{svc}", str(s["environment"][name])))
    for v, _role, c in k8s_containers():
        seen += [(f"k8s:{v}:{c['name']}", e["value"]) for e in c.get("env", [])
                 if e["name"] == name]
    for f, c in ecs_containers():
        seen += [(f"ecs:{f}:{c['name']}", e["value"]) for e in c.get("environment", [])
                 if e["name"] == name]
    for where, value in seen:
        if name == "LWS_WORKER_INDEX":
            role = "leader" if ("leader" in where) else "follower"
            assert value == ("0" if role == "leader" else "1"), where
        else:
            assert value == want[name], f"{where}: {name}={value}, contract says {want[name]}"


def test_every_url_in_commands_is_a_contract_endpoint():
    urls = [(w, u) for w, cmd in all_commands() for u in unwrap(cmd)[0]]
    for svc, s in compose_services().items():
        urls += [(f"compose:{svc}", u) for u in URL.findall(json.dumps(s.get("environment", {})))]
    for f, c in ecs_containers():
        urls += [(f"ecs:{f}", u) for u in URL.findall(json.dumps(c.get("environment", [])))]
    for v, _, c in k8s_containers():
        urls += [(f"k8s:{v}", u) for u in URL.findall(json.dumps(c.get("env", [])))]
    assert urls
    for where, u in urls:
        parts = urlsplit(u.replace("$(POD_NAME)", "pod"))
        if parts.path in ("", "/"):  # a base URL: must be the leader's Triton HTTP port
            assert parts.port == C.PORTS["HTTP_PORT"], f"{where}: {u}"
        else:
            assert endpoint_for(parts.port, parts.path), f"{where}: {u} is no contract endpoint"


def test_k8s_probes_hit_contract_endpoints_and_declared_ports():
    for v, _role, c in k8s_containers():
        declared = {p["containerPort"] for p in c.get("ports", [])}
        for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
            if kind not in c:
                continue
            g = c[kind]["httpGet"]
            assert endpoint_for(g["port"], g["path"]), f"{v}/{c['name']} {kind}: {g}"
            assert g["port"] in declared, f"{v}/{c['name']} {kind} port not declared"


def test_service_targets_leader_ports():
    leader_ports = {p["name"]: p["containerPort"] for _, role, c in k8s_containers()
                    if role == "leaderTemplate" for p in c.get("ports", [])}
    for p in SERVICE["spec"]["ports"]:
        assert p["targetPort"] in leader_ports, p
        assert p["port"] == leader_ports[p["targetPort"]], p
    sel = SERVICE["spec"]["selector"]
    # every LWS's leader pods (cells of every instance type), and no follower pod
    for v, m in LWS.items():
        t = m["spec"]["leaderWorkerTemplate"]
        leader = t["leaderTemplate"]["metadata"]["labels"]
        worker = t["workerTemplate"]["metadata"]["labels"]
        assert all(leader.get(k) == val for k, val in sel.items()), (v, leader)
        assert not all(worker.get(k) == val for k, val in sel.items()), (v, worker)
    assert SERVICE["metadata"]["name"] not in {m["metadata"]["name"] for m in LWS.values()}, \
        "LWS creates a headless Service with its own name"


def test_compose_ports_and_ingress():
    s = compose_services()
    assert set(C.COMPOSE_SERVICES.values()) <= set(s)
    published = {int(p.split(":")[-1]) for p in s["haproxy"]["ports"]}
    assert published == set(C.INGRESS_PORTS.values()) | {C.INGRESS_STATS_PORT}
    stats = [p for p in s["haproxy"]["ports"] if p.endswith(f":{C.INGRESS_STATS_PORT}")]
    assert stats == [f"127.0.0.1:{C.INGRESS_STATS_PORT}:{C.INGRESS_STATS_PORT}"], "stats: host only"
    assert f"../{C.HAPROXY_CONFIG}:/etc/haproxy/haproxy.cfg:ro" in s["haproxy"]["volumes"]
    for name in ("leader", "follower", "agent", "leader-b", "follower-b", "agent-b"):
        exposed = {int(p) for p in s[name].get("expose", [])}
        role = name.split("-")[0]
        wanted = {"leader": {"GRPC_PORT", "HTTP_PORT", "METRICS_PORT", "RUFUS_LEADER_PORT",
                             "RUFUS_CONTROL_PORT"},
                  "follower": {"RUFUS_HEALTH_PORT"},
                      "agent": {"RUFUS_AGENT_PORT", "RUFUS_AGENT_CHECK_PORT"}}[role]
        assert exposed == {C.PORTS[w] for w in wanted}, name


def test_compose_openai_frontend_uses_the_ingress():
    svc = compose_services()["openai"]
    assert svc["command"][1:] == C.COMMANDS["openai"][1:]
    env = svc["environment"]
    assert env["TRITON_GRPC_URL"] == f"{C.COMPOSE_SERVICES['ingress']}:{C.INGRESS_PORTS['grpc']}"
    assert env["OPENAI_PORT"] == str(C.PORTS["OPENAI_PORT"])
    assert {int(p.split(":")[-1]) for p in svc["ports"]} == {C.PORTS["OPENAI_PORT"]}


def test_haproxy_config_uses_what_compose_provides():
    cfg = ROOT / C.HAPROXY_CONFIG
    assert cfg.exists(), f"{C.HAPROXY_CONFIG} missing"
    text = cfg.read_text()
    services = compose_services()
    used = set(re.findall(r"^\s*server \S+ ([a-z0-9-]+):\d+", text, re.M))
    assert used and used <= set(services), \
        f"haproxy.cfg names hosts compose has no service for: {used - set(services)}"
    binds = {int(m) for m in re.findall(r"^\s*bind\s+\S*:(\d+)", text, re.M)}
    if binds:
        assert set(C.INGRESS_PORTS.values()) & binds, f"haproxy binds {binds}"


# ---------------------------------------------------------------- commands and health paths
def test_commands_run_contract_entrypoints():
    allowed = [cmd[1:] for cmd in C.COMMANDS.values()]
    for where, cmd in all_commands():
        urls, node = unwrap(cmd)
        assert node[0] in ("python", "python3"), where
        assert node[1:3] in allowed, f"{where}: {node}"
        if urls:
            assert cmd[0] in ("python", "python3") and (ROOT / "docker/unit_guard.py").exists()


@pytest.mark.parametrize("module", sorted(C.MODULE_FILES))
def test_entrypoint_modules_exist(module):
    rel = C.MODULE_FILES[module]
    assert (ROOT / rel).exists(), f"{rel} missing (python -m {module})"
    assert "__main__" in (ROOT / rel).read_text()


@pytest.mark.parametrize("key", sorted(C.HEALTH))
def test_health_paths_are_served(key):
    ep = C.HEALTH[key]
    if ep.path in C.TRITON_PATHS:  # tritonserver's own; our launcher polls the same ones
        text = (ROOT / "rufus/launch/server.py").read_text()
        if ep.path.startswith("/v2/models/"):
            assert '"/v2/models/{model}/ready"' in text
        elif ep.path == "/v2/health/ready":
            assert f'"{ep.path}"' in text
        elif ep.path == "/metrics":
            assert "--allow-metrics=true" in text and "--metrics-port" in text
        return
    pkg = {"follower": "follower/", "agent": "proxy/", "openai": "rufus/frontend/"}[ep.role]
    text = code_text(pkg)
    assert text is not None, f"{pkg} missing: {ep.path} unchecked against code"
    assert f'"{ep.path}"' in text or f"'{ep.path}'" in text, f"{pkg} does not serve {ep.path}"


def test_the_prebuild_starts_what_a_leader_loads():
    m = re.search(r"rufus\.launch\.server --prebuild --models (\S+);", DOCKERFILE)
    assert m and m.group(1).split(",") == list(C.LEADER_MODELS)


def role_of(check: list[str]) -> str:
    """The role a health check command probes: docker/healthcheck.py's argument."""
    return check[-1]


def test_healthcheck_script_matches_contract():
    sys.path.insert(0, str(ROOT / "docker"))
    import healthcheck

    assert healthcheck.url_for("leader", {}) == "http://127.0.0.1:8000/v2/health/ready"
    assert healthcheck.url_for("follower", {}) == "http://127.0.0.1:8081/health"
    assert healthcheck.url_for("agent", {"RUFUS_AGENT_PORT": "9"}) == "http://127.0.0.1:9/health"
    assert healthcheck.url_for("openai", {}) == "http://127.0.0.1:9000/health"
    for name, s in compose_services().items():
        if name != "haproxy" and "healthcheck" in s:
            assert s["healthcheck"]["test"][-2] == "/opt/rufus/docker/healthcheck.py"
            assert role_of(s["healthcheck"]["test"]) in healthcheck.PROBE, name
    for f, c in ecs_containers():
        assert c["healthCheck"]["command"][-2] == "/opt/rufus/docker/healthcheck.py", f
        assert role_of(c["healthCheck"]["command"]) == c["name"], f


# ---------------------------------------------------------------- structure of each path
def test_lws_groups():
    from deploy.instance_types import load

    types = {t.manifest: t for t in load().types.values()}  # one manifest per instance type
    assert set(LWS) == set(types) >= {"cpu", "cuda", "neuron-inf2", "neuron-trn1"}
    assert len({m["metadata"]["name"] for m in LWS.values()}) == len(LWS), "LWS names collide"
    for v, m in LWS.items():
        t = m["spec"]["leaderWorkerTemplate"]
        assert t["size"] == types[v].nodes_per_cell, v
        assert t["restartPolicy"] == "RecreateGroupOnPodRestart", v
        leader = t["leaderTemplate"]["spec"]["containers"][0]
        worker = t["workerTemplate"]["spec"]["containers"][0]
        assert leader["command"][1:] == C.COMMANDS["leader"][1:]
        assert worker["command"][1:] == C.COMMANDS["follower"][1:]
        for c in (leader, worker):
            assert {"startupProbe", "readinessProbe", "livenessProbe"} <= set(c), (v, c["name"])
        accel = {"cpu": None, "cuda": "nvidia.com/gpu",
                 "neuron": "aws.amazon.com/neuron"}[types[v].accelerator]
        for c in (leader, worker):
            if accel:
                assert accel in c["resources"]["limits"], (v, c["name"])
            assert "cpu" in c["resources"]["requests"]
    out = subprocess.run([sys.executable, str(ROOT / "deploy/kubernetes/manifests.py"), "--check"],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


def test_ecs_leader_and_follower():
    assert set(ECS) == {"leader", "follower"}
    leader = {c["name"]: c for c in ECS["leader"]["containerDefinitions"]}
    follower = {c["name"]: c for c in ECS["follower"]["containerDefinitions"]}
    assert unwrap(leader["leader"]["command"])[1][1:] == C.COMMANDS["leader"][1:]
    assert unwrap(follower["follower"]["command"])[1][1:] == C.COMMANDS["follower"][1:]
    assert leader["agent"]["command"][1:] == C.COMMANDS["agent"][1:]
    ports = {p["containerPort"] for c in leader.values() for p in c["portMappings"]}
    assert ports == {C.PORTS[k] for k in ("GRPC_PORT", "HTTP_PORT", "METRICS_PORT",
                                          "RUFUS_LEADER_PORT", "RUFUS_CONTROL_PORT",
                                          "RUFUS_AGENT_PORT", "OPENAI_PORT")}
    # the OpenAI frontend: its own command, gRPC to the leader of its task
    assert leader["openai"]["command"][1:] == C.COMMANDS["openai"][1:]
    openai_env = {e["name"]: e["value"] for e in leader["openai"]["environment"]}
    assert openai_env["TRITON_GRPC_URL"] == f"127.0.0.1:{C.PORTS['GRPC_PORT']}"
    assert {p["containerPort"] for p in follower["follower"]["portMappings"]} == {
        C.PORTS["RUFUS_HEALTH_PORT"]}
    for td in ECS.values():  # same image on every node of a unit (the frontend runs no model)
        assert len({c["image"] for c in td["containerDefinitions"] if c["name"] != "openai"}) == 1
    assert leader["leader"]["image"] == follower["follower"]["image"]


def test_dockerfile_targets_pins_user_and_context():
    stages = re.findall(r"^FROM\s+(\S+)\s+AS\s+(\S+)$", DOCKERFILE, re.M)
    names = [s for _, s in stages]
    assert {"cpu", "cuda", "neuron"} <= set(names), names
    # the default (last) stage is the cpu image; the classic builder builds every stage
    # above its --target, so the ones that need NGC/ECR bases come after cpu
    assert stages[-1] == ("cpu", "default"), "cpu is the default"
    assert names.index("cpu") < min(names.index("cuda"), names.index("neuron")), names
    args = dict(re.findall(r"^ARG\s+(\w+)=(\S+)$", DOCKERFILE, re.M))
    for image, _ in stages:
        ref = args[image[2:-1]] if image.startswith("${") else image
        if ref in names or ref == "scratch":  # scratch: a named build context's default
            continue
        tag = ref.rsplit("/", 1)[-1]
        assert ":" in tag and not tag.endswith(":latest"), f"base image not pinned: {ref}"
    for m in re.finditer(r"^FROM (\S+) AS (\w+)$(.*?)(?=^FROM |\Z)", DOCKERFILE, re.M | re.S):
        base, name, body = m.groups()
        if name.endswith("-build") or base == "scratch" or base in names:
            continue  # build stages; a stage on another stage inherits its USER and health
        assert re.search(r"^USER (?!root|0\b)\S+", body, re.M), f"{name}: no non-root USER"
        assert "HEALTHCHECK" in body, f"{name}: no HEALTHCHECK"
    # every COPY source exists and is let through by .dockerignore
    allowed = [ln[1:].rstrip("/") for ln in (ROOT / ".dockerignore").read_text().splitlines()
               if ln.startswith("!")]
    joined = DOCKERFILE.replace("\\\n", " ")
    for line in re.findall(r"^COPY (?!--from)(?:--\S+ )*(.+)$", joined, re.M):
        for src in line.split()[:-1]:
            if any(c in src for c in "*?["):  # a glob may match nothing (build/wheel[s])
                assert any(fnmatch.fnmatch(a, src.rstrip("/")) for a in allowed), src
                continue
            assert (ROOT / src).exists() or src.rstrip("/") in ("follower", "proxy"), src
            assert any(src.rstrip("/") == a or src.startswith(a + "/") for a in allowed), src
    assert "secret" not in DOCKERFILE.lower().replace("no secrets", "")


def test_compose_restarts_the_unit_as_a_whole():
    s = compose_services()
    for cell in ("", "-b"):
        leader, follower = s[f"leader{cell}"], s[f"follower{cell}"]
        assert leader["restart"] == follower["restart"] == "always"
        dep = follower["depends_on"][f"leader{cell}"]
        assert dep == {"condition": "service_started"}
        lw, _ = unwrap(leader["command"])
        fw, _ = unwrap(follower["command"])
        assert any(f"follower{cell}:" in u for u in lw), "leader must watch its follower"
        assert any(f"leader{cell}:" in u for u in fw), "follower must watch its leader"
        assert leader["environment"]["LWS_LEADER_ADDRESS"] == f"leader{cell}"
        assert follower["environment"]["LWS_LEADER_ADDRESS"] == f"leader{cell}"
    # the ingress starts on its own and takes units in as their agents report healthy
    # (servers resolve through Docker's DNS and may start without an address)
    assert "depends_on" not in s["haproxy"]
    assert "resolvers docker init-addr last,libc,none" in (ROOT / C.HAPROXY_CONFIG).read_text()


# ---------------------------------------------------------------- the schemas are strict
def test_vendored_schemas_reject_mistakes():
    lws_schema = json.loads((SCHEMAS / "leaderworkerset-v1.json").read_text())
    good = LWS["cpu"]
    jsonschema.validate(good, lws_schema)
    bad = copy.deepcopy(good)
    bad["spec"]["leaderWorkerTemplate"]["restartPolicy"] = "RecreateGroup"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, lws_schema)
    bad = copy.deepcopy(good)
    bad["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]["containers"][0]["comand"] = []
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, lws_schema)
    compose_schema = json.loads((SCHEMAS / "compose-spec.json").read_text())
    bad = copy.deepcopy(COMPOSE)
    bad["services"]["leader"]["healthcheck"]["intervall"] = "1s"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, compose_schema)
    ecs_schema = json.loads((SCHEMAS / "ecs-task-definition.json").read_text())
    bad = copy.deepcopy(ECS["leader"])
    bad["networkMode"] = "overlay"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, ecs_schema)


# ---------------------------------------------------------------- secrets and CVEs (issue 12)
def test_secrets_are_referenced_never_literal():
    """RUFUS_UNIT_SECRET / RUFUS_ADMIN_KEY come from a secret store or the operator's
    environment; every node of a unit gets the unit secret, only leaders the admin key."""
    for svc, s in compose_services().items():
        env = s.get("environment", {})
        for name in C.SECRET_ENV & set(env):
            assert re.fullmatch(rf"\$\{{{name}(:[-?][^}}]*)?\}}", str(env[name])), (svc, name)
        if svc.startswith(("leader", "follower")):
            assert "RUFUS_UNIT_SECRET" in env, svc
    for v, role, c in k8s_containers():
        refs = {e["name"]: e for e in c.get("env", []) if e["name"] in C.SECRET_ENV}
        for name, e in refs.items():
            assert "value" not in e and "secretKeyRef" in e["valueFrom"], (v, c["name"], name)
        want = {"leader": {"RUFUS_UNIT_SECRET", "RUFUS_ADMIN_KEY"},
                "follower": {"RUFUS_UNIT_SECRET"},
                "openai": {"RUFUS_OPENAI_API_KEY"}}.get(c["name"], set())
        assert set(refs) == want, (v, role, c["name"], set(refs))
    for fam, c in ecs_containers():
        assert not C.SECRET_ENV & {e["name"] for e in c.get("environment", [])}, (fam, c["name"])
        secrets = {e["name"]: e["valueFrom"] for e in c.get("secrets", [])}
        want = {"leader": {"RUFUS_UNIT_SECRET", "RUFUS_ADMIN_KEY"},
                "follower": {"RUFUS_UNIT_SECRET"},
                "openai": {"RUFUS_OPENAI_API_KEY"}}.get(c["name"], set())
        assert set(secrets) == want, (fam, c["name"])
        assert all(v.startswith("arn:aws:") for v in secrets.values()), (fam, c["name"])


def test_cuda_image_pins_a_triton_release_with_the_2025_cve_fixes():
    """CVE-2025-23310/23311/23319/23320/23334 are fixed in Triton 25.07 (SECURITY.md)."""
    args = dict(re.findall(r"^ARG\s+(\w+)=(\S+)$", DOCKERFILE, re.M))
    tag = args["TRITON_VLLM_IMAGE"].rsplit(":", 1)[1]
    year, month = (int(x) for x in re.match(r"(\d+)\.(\d+)-", tag).groups())
    assert (year, month) >= (25, 7), tag


# ---------------------------------------------------------------- the shopping assistant (issue 16)
def stage_bodies() -> dict[str, str]:
    """Dockerfile stage name -> its instructions, continuation lines joined."""
    joined = DOCKERFILE.replace("\\\n", " ")
    return {m.group(1): m.group(2) for m in
            re.finditer(r"^FROM \S+ AS (\S+)$(.*?)(?=^FROM |\Z)", joined, re.M | re.S)}


def env_of(c: dict) -> dict[str, str]:
    """name -> value of a k8s (env) or ECS (environment) container's plain variables."""
    return {e["name"]: e["value"] for e in c.get("env", c.get("environment", [])) if "value" in e}


def test_assistant_dependencies_match_the_code():
    """C.ASSISTANT_CALLS is what both assistant paths call: the Triton model (its config's
    parameters) and the pipeline the frontend hook builds with its defaults."""
    import inspect

    from rufus.assistant.pipeline import Assistant

    cfg = (ROOT / "model_repository" / C.ASSISTANT_MODEL / "config.pbtxt").read_text()
    params = dict(re.findall(r'key: "(\w+)" value: \{ string_value: "([^"]*)" \}', cfg))
    assert (params["planner_model"], params["answer_model"]) == C.ASSISTANT_CALLS
    sig = inspect.signature(Assistant)
    assert (sig.parameters["planner_model"].default,
            sig.parameters["answer_model"].default) == C.ASSISTANT_CALLS
    hook = (ROOT / "rufus/frontend/assistant_hook.py").read_text()
    assert "Assistant(self.triton_url, retriever, metrics=self.series)" in hook, \
        "hook no longer uses the defaults"
    assert C.MODEL in C.LEADER_MODELS and C.ASSISTANT_MODEL in C.LEADER_MODELS
    assert set(C.ASSISTANT_CALLS) <= set(C.LEADER_MODELS)
    assert len(set(C.LEADER_MODELS)) == len(C.LEADER_MODELS)
    for m in C.LEADER_MODELS:
        assert (ROOT / "model_repository" / m / "config.pbtxt").exists(), m


def test_every_leader_serves_the_assistant_and_what_it_calls():
    """Compose (both cells), every LWS variant and ECS: the leader loads C.LEADER_MODELS, its
    unit agent requires them all ready, and followers (one pipeline stage of rufus_llm each)
    are given no model list."""
    want = list(C.LEADER_MODELS)
    leaders: list[tuple[str, dict[str, str]]] = []
    agents: list[tuple[str, dict[str, str]]] = []
    followers: list[tuple[str, dict[str, str]]] = []
    by_role = {"leader": leaders, "agent": agents, "follower": followers}
    for name, svc in compose_services().items():
        env = {k: str(v) for k, v in svc.get("environment", {}).items()}
        role = role_of(svc["healthcheck"]["test"]) if "healthcheck" in svc else None
        if role in by_role:
            by_role[role].append((f"compose:{name}", env))
    for v, _role, c in k8s_containers():
        if c["name"] in by_role:
            by_role[c["name"]].append((f"k8s:{v}:{c['name']}", env_of(c)))
    for fam, c in ecs_containers():
        if c["name"] in by_role:
            by_role[c["name"]].append((f"ecs:{fam}:{c['name']}", env_of(c)))
    assert len(leaders) == 2 + len(LWS) + 1, leaders
    assert len(agents) == len(leaders) and len(followers) == len(leaders)
    for where, env in leaders:
        assert env.get("RUFUS_MODELS", "").split(",") == want, where
    for where, env in agents:
        assert env.get("RUFUS_UNIT_MODELS", "").split(",") == want, where
    for where, env in followers:
        assert "RUFUS_MODELS" not in env, f"{where}: a follower loads no model list"


def test_frontends_offer_the_assistant():
    """The OpenAI frontend's hook (model rufus-assistant) is on: no --no-hooks anywhere."""
    cmds = [("compose", compose_services()["openai"]["command"])]
    cmds += [(f"k8s:{v}", c["command"]) for v, _, c in k8s_containers() if c["name"] == "openai"]
    cmds += [(f"ecs:{f}", c["command"]) for f, c in ecs_containers() if c["name"] == "openai"]
    assert len(cmds) == 1 + len(LWS) + 1
    for where, cmd in cmds:
        assert "--no-hooks" not in cmd, where


def rufus_imports(rel: str) -> set[str]:
    """Repository files a script/module needs (its rufus.* imports, transitively, with each
    package's __init__.py), relative to the root."""
    import ast

    need: set[str] = set()
    todo = [rel]
    while todo:
        f = todo.pop()
        if f in need:
            continue
        need.add(f)
        tree = ast.parse((ROOT / f).read_text())
        # what runs under ``if __name__ == "__main__":`` is the program's, not the importer's
        program = {id(n) for top in tree.body if isinstance(top, ast.If)
                   and "__main__" in ast.unparse(top.test) for n in ast.walk(top)}
        for node in (n for n in ast.walk(tree) if id(n) not in program):
            # ``from rufus.machine import precision`` needs the submodule too: each name is
            # tried as one (a name that is not a module file adds nothing)
            mods = ([a.name for a in node.names] if isinstance(node, ast.Import)
                    else [f"{node.module}.{a.name}" for a in node.names]
                    if isinstance(node, ast.ImportFrom) and node.module else [])
            for mod in mods:
                parts = mod.split(".")
                if parts[0] != "rufus":
                    continue
                for i in range(1, len(parts) + 1):
                    base = "/".join(parts[:i])
                    for cand in (f"{base}/__init__.py", f"{base}.py"):
                        if (ROOT / cand).is_file():
                            todo.append(cand)
    return need


def test_dockerfile_builds_the_planner_and_the_catalog_index():
    """cpu-build runs `setup.sh qp` and `setup.sh catalog` with every file they read copied in
    before; the cpu/cuda/neuron images carry the index and point RUFUS_CATALOG_INDEX at it."""
    bodies = stage_bodies()
    build = bodies["cpu-build"]
    runs = re.findall(r"^RUN bash scripts/setup\.sh (?:--[\w-]+ (?:/\S+ )?)*(\w+)", build, re.M)
    assert runs[:1] == ["triton"] and {"model", "qp", "catalog"} <= set(runs), runs
    assert runs.index("model") < runs.index("qp"), "the planner is merged into the default model"

    def copied_before(step: str) -> set[str]:
        head = build[:build.index(f"RUN bash scripts/setup.sh {step}")]
        out: set[str] = set()
        for line in re.findall(r"^COPY (?!--from)(?:--\S+ )*(.+)$", head, re.M):
            out |= set(line.split()[:-1])
        return out

    from rufus.qp import build as qp_build

    qp_needs = rufus_imports("rufus/qp/build.py") | rufus_imports("rufus/qp/plan.py")
    qp_needs |= {"rufus/qp/plan_schema.json"}
    data = [qp_build.LORA_PATH, qp_build.LORA_PATH.with_suffix(".json"), qp_build.HEADS_PATH,
            qp_build.HEADS_PATH.with_suffix(".json"), qp_build.DATA / "train.jsonl",
            qp_build.DATA / "calib.jsonl"]
    qp_needs |= {str(p.relative_to(ROOT)) for p in data}
    missing = qp_needs - copied_before("qp")
    assert not missing, f"cpu-build runs setup.sh qp without {sorted(missing)}"
    cat_needs = rufus_imports("scripts/build_catalog.py") | {"scripts/setup.sh", "data/catalog/",
                                                             "rufus/retrieval/common_words.txt"}
    missing = cat_needs - copied_before("catalog")
    assert not missing, f"cpu-build runs setup.sh catalog without {sorted(missing)}"

    index_dir = C.CATALOG_INDEX.rsplit("/", 1)[0]
    assert re.search(rf"RUFUS_CATALOG_INDEX={re.escape(C.CATALOG_INDEX)}\b", build)
    # your own catalog: the `catalog` named context (empty by default) and RUFUS_CATALOG
    assert re.search(r"^FROM scratch AS catalog$", DOCKERFILE, re.M)
    assert re.search(r"^COPY --from=catalog ", build, re.M)
    assert re.search(r"^ARG RUFUS_CATALOG=", build, re.M)
    for stage in ("cpu", "cuda", "neuron"):
        body = bodies[stage]
        assert re.search(rf"^COPY --from=cpu-build {index_dir} {index_dir}$", body, re.M), stage
        assert re.search(rf"^ENV .*RUFUS_CATALOG_INDEX={re.escape(C.CATALOG_INDEX)}\b", body,
                         re.M), stage
        assert "/opt/rufus/cache /opt/rufus/cache" in body, stage  # the planner's models
    # the qp model.json finds the planner under the cache dir the images carry
    qp_json = (ROOT / "model_repository/rufus_qp_medusa/1/model.json").read_text()
    assert "${RUFUS_CACHE_DIR}/models/" in qp_json


def test_compose_file_reads_in_docker_compose_1_29_and_v2():
    """Debian 12 ships docker-compose 1.29, whose schema refuses keys compose v2 added."""
    doc = yaml.safe_load((ROOT / "docker" / "compose.yaml").read_text())
    assert "name" not in doc, "top-level name: v2 only (scripts/compose.sh passes -p rufus)"
    for name, svc in doc["services"].items():
        assert "start_interval" not in svc.get("healthcheck", {}), name
        for dep in (svc.get("depends_on") or {}).values():
            assert set(dep) <= {"condition"}, f"{name}: depends_on {dep} (1.29 takes condition only)"
