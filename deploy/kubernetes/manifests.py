"""Render the LeaderWorkerSet manifests, one per instance type of
deploy/instance_types.toml (what kustomize overlays would do, without needing kustomize here).

    python deploy/kubernetes/manifests.py          # rewrite lws-<manifest>.yaml for every type
    python deploy/kubernetes/manifests.py --check  # exit 1 if a committed file is stale

The committed YAML files are what `kubectl apply -f` takes; tests/unit/
test_deploy_consistency.py fails when they differ from this script's output. Each type's
accelerator, nodes per cell (the LWS size), parallel degrees and engine arguments come from
the data file (deploy/instance_types.py validates it); what every type shares is here.
"""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT))
from deploy.contract import HEALTH, LEADER_MODELS, MODEL, PORTS  # noqa: E402
from deploy.instance_types import CellType, InstanceTypes, load  # noqa: E402

NAME = "rufus"


def lws_name(cell: CellType) -> str:
    """The LeaderWorkerSet's name (and its headless Service's): one per type, so cells of
    several types run side by side in one namespace behind one Service."""
    return f"{NAME}-{cell.manifest}"


def probe(endpoint: str, period: int, failures: int) -> dict[str, Any]:
    ep = HEALTH[endpoint]
    return {"httpGet": {"path": ep.path, "port": PORTS[ep.port_var]},
            "periodSeconds": period, "timeoutSeconds": 5, "failureThreshold": failures}


# The leader also runs the query planner (rufus_qp_medusa: 0.27 GB of weights, a 0.5 GiB KV
# cache from its model.json, the Medusa heads) and the assistant's Python stub with the
# product index: about 1.5 GiB more than a follower, rounded up.
LEADER_EXTRA_MEMORY_GI = 2


def with_extra_memory(resources: dict[str, Any], gi: int) -> dict[str, Any]:
    """``resources`` with ``gi`` GiB added to the memory request and limit."""
    out = copy.deepcopy(resources)
    for kind in ("requests", "limits"):
        mem = out[kind]["memory"]
        assert mem.endswith("Gi"), mem
        out[kind]["memory"] = f"{int(mem[:-2]) + gi}Gi"
    return out


def env_list(env: dict[str, str]) -> list[dict[str, Any]]:
    return [{"name": k, "value": v} for k, v in env.items()]


# Secrets come from the Kubernetes Secret SECRET_NAME, created by the operator (SECURITY.md):
#   kubectl create secret generic rufus-secrets \
#     --from-literal=unit-secret="$(openssl rand -hex 32)" \
#     --from-literal=admin-key="$(openssl rand -hex 32)"
SECRET_NAME = "rufus-secrets"


def secret_env(name: str, key: str, optional: bool = False) -> dict[str, Any]:
    ref: dict[str, Any] = {"name": SECRET_NAME, "key": key}
    if optional:
        ref["optional"] = True
    return {"name": name, "valueFrom": {"secretKeyRef": ref}}


# every node of a unit: the control channel's shared secret (rufus/multinode/control.py)
UNIT_SECRET = secret_env("RUFUS_UNIT_SECRET", "unit-secret")
# leader only: opens Triton's restricted APIs (model control); absent -> closed to everyone
ADMIN_KEY = secret_env("RUFUS_ADMIN_KEY", "admin-key", optional=True)
# OpenAI frontend: bearer key for /v1 (optional key: absent -> no key required, SECURITY.md)
OPENAI_API_KEY = secret_env("RUFUS_OPENAI_API_KEY", "openai-api-key", optional=True)
# the frontend runs no model: the cpu image serves every variant's sidecar
OPENAI_IMAGE = "rufus-inference:cpu"


def container_ports(*names: str) -> list[dict[str, Any]]:
    label = {"GRPC_PORT": "grpc", "HTTP_PORT": "http", "METRICS_PORT": "metrics",
             "RUFUS_LEADER_PORT": "rendezvous", "RUFUS_CONTROL_PORT": "control",
             "RUFUS_HEALTH_PORT": "health",
             "RUFUS_AGENT_PORT": "agent", "OPENAI_PORT": "openai"}
    return [{"name": label[n], "containerPort": PORTS[n], "protocol": "TCP"} for n in names]


def manifest(types: InstanceTypes, type_name: str) -> dict[str, Any]:
    """The LeaderWorkerSet of one instance type: a leader pod (tritonserver, the unit agent,
    the OpenAI frontend) and ``nodes_per_cell - 1`` follower pods per cell."""
    cell = types[type_name]
    name = lws_name(cell)
    # one object in every container: the YAML names it once (an anchor) and refers to it
    security = {"runAsNonRoot": True, "runAsUser": 10001, "runAsGroup": 10001,
                "allowPrivilegeEscalation": False}
    env = node_env(cell)
    leader_pod = pod_template(cell, "leader", [leader_container(cell, env, security),
                                               agent_container(types, cell, name, security),
                                               openai_container(security)])
    return {
        "apiVersion": "leaderworkerset.x-k8s.io/v1",
        "kind": "LeaderWorkerSet",
        "metadata": {"name": name,
                     "labels": {"app.kubernetes.io/name": NAME, "rufus.dev/variant": cell.manifest},
                     "annotations": {
                         "rufus.dev/instance-type": cell.name,
                         # the weight its agents report, idle, relative to the other types
                         "rufus.dev/capacity-sequences": str(cell.capacity),
                         "rufus.dev/relative-weight-percent":
                             str(types.relative_weight(cell.name))}},
        "spec": {
            "replicas": 2,  # units ("cells"); a rolling update replaces one at a time
            "startupPolicy": "LeaderCreated",
            "rolloutStrategy": {"type": "RollingUpdate",
                                "rollingUpdateConfiguration": {"maxUnavailable": 0,
                                                               "maxSurge": 1}},
            "leaderWorkerTemplate": {
                "size": cell.nodes_per_cell,
                "restartPolicy": "RecreateGroupOnPodRestart",
                "leaderTemplate": leader_pod,
                "workerTemplate": pod_template(cell, "follower",
                                               [follower_container(cell, env, security)]),
            },
        },
    }


def node_env(cell: CellType) -> dict[str, str]:
    """The environment of every node of a cell, leader and followers."""
    # LWS injects LWS_LEADER_ADDRESS, LWS_GROUP_SIZE and LWS_WORKER_INDEX into every pod;
    # rufus/multinode/topology.py reads them. Only the ports and engine arguments are ours.
    return {"RUFUS_LEADER_PORT": str(PORTS["RUFUS_LEADER_PORT"]),
            "RUFUS_CONTROL_PORT": str(PORTS["RUFUS_CONTROL_PORT"]),
            "RUFUS_HEALTH_PORT": str(PORTS["RUFUS_HEALTH_PORT"]),
            "RUFUS_RUFUS_LLM_ENGINE_ARGS": cell.engine_args_json(),
            **cell.env}


def node_container(cell: CellType, name: str, module: str, spec: dict[str, Any]
                   ) -> dict[str, Any]:
    """A container of the cell's image that runs ``python -m <module>``; ``spec``: the rest
    of it, in order."""
    return {"name": name, "image": cell.accel.image,
            "command": [cell.accel.python, "-m", module], **spec}


def probes(ready: str, live: str | None = None, startup: str | None = None,
           startup_failures: int = 0) -> dict[str, Any]:
    """A container's probes on contract endpoints, with the periods every container uses:
    startup every 10 s (``startup_failures`` of them: the cell's start-up budget),
    readiness every 5 s (out after 2 failures), liveness every 10 s (restart after 3)."""
    out: dict[str, Any] = {}
    if startup is not None:
        out["startupProbe"] = probe(startup, 10, startup_failures)
    out["readinessProbe"] = probe(ready, 5, 2)
    if live is not None:
        out["livenessProbe"] = probe(live, 10, 3)
    return out


def leader_container(cell: CellType, env: dict[str, str], security: dict[str, Any]
                     ) -> dict[str, Any]:
    return node_container(cell, "leader", "rufus.launch.server", {
        "env": [*env_list({"GRPC_PORT": str(PORTS["GRPC_PORT"]),
                           "HTTP_PORT": str(PORTS["HTTP_PORT"]),
                           "METRICS_PORT": str(PORTS["METRICS_PORT"]),
                           # the unit's model + the planner and the assistant (leader only)
                           "RUFUS_MODELS": ",".join(LEADER_MODELS), **env}),
                copy.deepcopy(UNIT_SECRET), copy.deepcopy(ADMIN_KEY)],
        "ports": container_ports("GRPC_PORT", "HTTP_PORT", "METRICS_PORT", "RUFUS_LEADER_PORT",
                                 "RUFUS_CONTROL_PORT"),
        "resources": with_extra_memory(cell.resources(), LEADER_EXTRA_MEMORY_GI),
        # the model unloads itself when the multi-node engine dies: restart (liveness) ->
        # LWS recreates the whole group (RecreateGroupOnPodRestart)
        **probes("model_ready", live="model_ready", startup="leader_ready",
                 startup_failures=cell.startup_failures),
        "securityContext": security,
        "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}],
    })


def agent_container(types: InstanceTypes, cell: CellType, name: str,
                    security: dict[str, Any]) -> dict[str, Any]:
    """The unit agent beside the leader; ``name``: the LWS (its followers' service)."""
    agent_env: list[dict[str, Any]] = [
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "RUFUS_AGENT_PORT", "value": str(PORTS["RUFUS_AGENT_PORT"])},
        {"name": "RUFUS_LEADER_HTTP", "value": f"http://127.0.0.1:{PORTS['HTTP_PORT']}"},
        # the unit is healthy only while everything its leader serves is ready
        {"name": "RUFUS_UNIT_MODELS", "value": ",".join(LEADER_MODELS)},
        # the capacity that weighs 100 % at the ingress: the same for every type
        {"name": "RUFUS_CAPACITY_REFERENCE", "value": str(types.capacity_reference)},
    ]
    if cell.nodes_per_cell > 1:
        # worker pods are <leader pod>-<index> in the LWS headless service <name>
        agent_env.append({"name": "RUFUS_FOLLOWER_HEALTH_URLS", "value": ",".join(
            f"http://$(POD_NAME)-{r}.{name}:{PORTS['RUFUS_HEALTH_PORT']}"
            f"{HEALTH['follower_health'].path}" for r in range(1, cell.nodes_per_cell))})
    return node_container(cell, "agent", "proxy.agent", {
        "env": agent_env,
        "ports": container_ports("RUFUS_AGENT_PORT"),
        "resources": {"requests": {"cpu": "100m", "memory": "128Mi"},
                      "limits": {"memory": "256Mi"}},
        # the leader pod is Ready (in the Service) only while the whole unit is healthy
        **probes("agent_health", live="agent_load"),
        "securityContext": security,
    })


def openai_container(security: dict[str, Any]) -> dict[str, Any]:
    """OpenAI-compatible API beside the leader, gRPC to its own tritonserver; Ready once
    Triton and the model are (no liveness probe: a unit that is down must not restart it)."""
    return {
        "name": "openai",
        "image": OPENAI_IMAGE,
        "command": ["python", "-m", "rufus.frontend"],
        "env": [*env_list({"OPENAI_PORT": str(PORTS["OPENAI_PORT"]),
                           "TRITON_GRPC_URL": f"127.0.0.1:{PORTS['GRPC_PORT']}",
                           "RUFUS_OPENAI_MODELS": MODEL}),
                copy.deepcopy(OPENAI_API_KEY)],
        "ports": container_ports("OPENAI_PORT"),
        "resources": {"requests": {"cpu": "500m", "memory": "256Mi"},
                      "limits": {"memory": "1Gi"}},
        **probes("openai_health"),
        "securityContext": security,
    }


def follower_container(cell: CellType, env: dict[str, str], security: dict[str, Any]
                       ) -> dict[str, Any]:
    return node_container(cell, "follower", "follower", {
        "env": [*env_list(env), copy.deepcopy(UNIT_SECRET)],
        "ports": container_ports("RUFUS_HEALTH_PORT"),
        "resources": cell.resources(),
        **probes("follower_health", live="follower_health", startup="follower_health",
                 startup_failures=cell.startup_failures),
        "securityContext": security,
        "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}],
    })


def pod_template(cell: CellType, role: str, containers: list[dict[str, Any]]) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": containers,
                            "volumes": [{"name": "dshm",
                                         "emptyDir": {"medium": "Memory", "sizeLimit": "2Gi"}}],
                            "terminationGracePeriodSeconds": 40,
                            "nodeSelector": dict(cell.node_selector)}
    if cell.tolerations():
        spec["tolerations"] = cell.tolerations()
    return {"metadata": {"labels": {"app.kubernetes.io/name": NAME,
                                    "app.kubernetes.io/component": role,
                                    "rufus.dev/variant": cell.manifest}},
            "spec": spec}


def render(types: InstanceTypes, type_name: str) -> str:
    cell = types[type_name]
    head = (f"# LeaderWorkerSet for instance type {cell.name}. GENERATED by deploy/kubernetes/"
            "manifests.py\n# from deploy/instance_types.toml: edit those, then run it.\n")
    return head + yaml.safe_dump(manifest(types, type_name), sort_keys=False, width=100)


def outputs(types: InstanceTypes) -> dict[Path, str]:
    """Every manifest file and its text."""
    return {HERE / f"lws-{t.manifest}.yaml": render(types, n) for n, t in types.types.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true")
    a = ap.parse_args()
    files = outputs(load())
    stale = []
    for path, text in files.items():
        if a.check:
            if not path.exists() or path.read_text() != text:
                stale.append(path.name)
        else:
            path.write_text(text)
            print(f"wrote {path.relative_to(ROOT)}")
    # a manifest whose type left the data file would still be applied by `kubectl -f dir`
    orphans = sorted(p.name for p in HERE.glob("lws-*.yaml") if p not in files)
    if orphans:
        print(f"no instance type renders {', '.join(orphans)}: delete it or add its type to "
              "deploy/instance_types.toml", file=sys.stderr)
    if stale:
        print(f"stale: {', '.join(stale)}; run python deploy/kubernetes/manifests.py",
              file=sys.stderr)
    return 1 if stale or orphans else 0


if __name__ == "__main__":
    sys.exit(main())
