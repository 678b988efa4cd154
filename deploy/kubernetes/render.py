"""Render the LeaderWorkerSet manifests for the three accelerator variants from one
definition (what kustomize overlays would do, without needing kustomize here).

    python deploy/kubernetes/render.py          # rewrite lws-{cpu,cuda,neuron}.yaml
    python deploy/kubernetes/render.py --check  # exit 1 if a committed file is stale

The committed YAML files are what `kubectl apply -f` takes; tests/unit/
test_deploy_consistency.py fails when they differ from this script's output.
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

NAME = "rufus"

VARIANTS: dict[str, dict[str, Any]] = {
    "cpu": {
        "image": "rufus-inference:cpu",
        "python": "python",
        "resources": {"requests": {"cpu": "2", "memory": "8Gi"},
                      "limits": {"memory": "12Gi"}},
        "engine_args": '{"pipeline_parallel_size": 2}',
        "env": {"VLLM_CPU_KVCACHE_SPACE": "2"},
        "node_selector": {"kubernetes.io/arch": "amd64"},
        "tolerations": [],
        "startup_failures": 120,  # x 10 s: first start compiles with torch.compile
    },
    "cuda": {
        "image": "rufus-inference:cuda",
        "python": "python3",
        "resources": {"requests": {"cpu": "8", "memory": "64Gi", "nvidia.com/gpu": "1"},
                      "limits": {"memory": "64Gi", "nvidia.com/gpu": "1"}},
        "engine_args": '{"pipeline_parallel_size": 2}',
        "env": {"NCCL_SOCKET_IFNAME": "eth0"},
        "node_selector": {"nvidia.com/gpu.present": "true"},
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "startup_failures": 120,
    },
    "neuron": {
        "image": "rufus-inference:neuron",
        "python": "python3",
        # trn1.32xlarge: 16 Trainium chips and 8 EFA interfaces per node
        "resources": {"requests": {"cpu": "96", "memory": "400Gi",
                                   "aws.amazon.com/neuron": "16",
                                   "vpc.amazonaws.com/efa": "8"},
                      "limits": {"memory": "400Gi", "aws.amazon.com/neuron": "16",
                                 "vpc.amazonaws.com/efa": "8"}},
        "engine_args": '{"tensor_parallel_size": 32, "pipeline_parallel_size": 2}',
        "env": {"FI_PROVIDER": "efa", "FI_EFA_USE_DEVICE_RDMA": "1",
                "NEURON_COMPILED_ARTIFACTS": "/opt/rufus/cache/neuron"},
        "node_selector": {"node.kubernetes.io/instance-type": "trn1.32xlarge"},
        "tolerations": [{"key": "aws.amazon.com/neuron", "operator": "Exists",
                         "effect": "NoSchedule"}],
        "startup_failures": 360,  # Neuron compilation of a large model takes long
    },
}


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


def manifest(variant: str) -> dict[str, Any]:
    v = VARIANTS[variant]
    py = v["python"]
    security = {"runAsNonRoot": True, "runAsUser": 10001, "runAsGroup": 10001,
                "allowPrivilegeEscalation": False}
    # LWS injects LWS_LEADER_ADDRESS, LWS_GROUP_SIZE and LWS_WORKER_INDEX into every pod;
    # rufus/multinode/topology.py reads them. Only the ports and engine arguments are ours.
    common_env = {"RUFUS_LEADER_PORT": str(PORTS["RUFUS_LEADER_PORT"]),
                  "RUFUS_CONTROL_PORT": str(PORTS["RUFUS_CONTROL_PORT"]),
                  "RUFUS_HEALTH_PORT": str(PORTS["RUFUS_HEALTH_PORT"]),
                  "RUFUS_RUFUS_LLM_ENGINE_ARGS": v["engine_args"],
                  **v["env"]}
    startup = probe("leader_ready", 10, v["startup_failures"])
    leader = {
        "name": "leader",
        "image": v["image"],
        "command": [py, "-m", "rufus.harness.server"],
        "env": [*env_list({"GRPC_PORT": str(PORTS["GRPC_PORT"]),
                           "HTTP_PORT": str(PORTS["HTTP_PORT"]),
                           "METRICS_PORT": str(PORTS["METRICS_PORT"]),
                           # the unit's model + the planner and the assistant (leader only)
                           "RUFUS_MODELS": ",".join(LEADER_MODELS), **common_env}),
                copy.deepcopy(UNIT_SECRET), copy.deepcopy(ADMIN_KEY)],
        "ports": container_ports("GRPC_PORT", "HTTP_PORT", "METRICS_PORT", "RUFUS_LEADER_PORT",
                                 "RUFUS_CONTROL_PORT"),
        "resources": with_extra_memory(v["resources"], LEADER_EXTRA_MEMORY_GI),
        "startupProbe": startup,
        "readinessProbe": probe("model_ready", 5, 2),
        # the model unloads itself when the multi-node engine dies: restart -> LWS
        # recreates the whole group (RecreateGroupOnPodRestart)
        "livenessProbe": probe("model_ready", 10, 3),
        "securityContext": security,
        "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}],
    }
    agent = {
        "name": "agent",
        "image": v["image"],
        "command": [py, "-m", "proxy.agent"],
        "env": [
            {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "RUFUS_AGENT_PORT", "value": str(PORTS["RUFUS_AGENT_PORT"])},
            {"name": "RUFUS_LEADER_HTTP", "value": f"http://127.0.0.1:{PORTS['HTTP_PORT']}"},
            # the unit is healthy only while everything its leader serves is ready
            {"name": "RUFUS_UNIT_MODELS", "value": ",".join(LEADER_MODELS)},
            # worker pods are <leader pod>-<index> in the LWS headless service <name>
            {"name": "RUFUS_FOLLOWER_HEALTH_URLS",
             "value": f"http://$(POD_NAME)-1.{NAME}:{PORTS['RUFUS_HEALTH_PORT']}"
                      f"{HEALTH['follower_health'].path}"},
        ],
        "ports": container_ports("RUFUS_AGENT_PORT"),
        "resources": {"requests": {"cpu": "100m", "memory": "128Mi"},
                      "limits": {"memory": "256Mi"}},
        # the leader pod is Ready (in the Service) only while the whole unit is healthy
        "readinessProbe": probe("agent_health", 5, 2),
        "livenessProbe": probe("agent_load", 10, 3),
        "securityContext": security,
    }
    # OpenAI-compatible API beside the leader, gRPC to its own tritonserver; Ready once
    # Triton and the model are (no liveness probe: a unit that is down must not restart it)
    openai = {
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
        "readinessProbe": probe("openai_health", 5, 2),
        "securityContext": security,
    }
    worker = {
        "name": "follower",
        "image": v["image"],
        "command": [py, "-m", "follower"],
        "env": [*env_list(common_env), copy.deepcopy(UNIT_SECRET)],
        "ports": container_ports("RUFUS_HEALTH_PORT"),
        "resources": copy.deepcopy(v["resources"]),
        "startupProbe": probe("follower_health", 10, v["startup_failures"]),
        "readinessProbe": probe("follower_health", 5, 2),
        "livenessProbe": probe("follower_health", 10, 3),
        "securityContext": security,
        "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}],
    }
    volumes = [{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "2Gi"}}]

    def pod(role: str, containers: list[dict[str, Any]]) -> dict[str, Any]:
        spec: dict[str, Any] = {"containers": containers, "volumes": copy.deepcopy(volumes),
                                "terminationGracePeriodSeconds": 40,
                                "nodeSelector": dict(v["node_selector"])}
        if v["tolerations"]:
            spec["tolerations"] = copy.deepcopy(v["tolerations"])
        return {"metadata": {"labels": {"app.kubernetes.io/name": NAME,
                                        "app.kubernetes.io/component": role,
                                        "rufus.dev/variant": variant}},
                "spec": spec}

    return {
        "apiVersion": "leaderworkerset.x-k8s.io/v1",
        "kind": "LeaderWorkerSet",
        "metadata": {"name": NAME, "labels": {"app.kubernetes.io/name": NAME,
                                              "rufus.dev/variant": variant}},
        "spec": {
            "replicas": 2,  # units ("cells"); a rolling update replaces one at a time
            "startupPolicy": "LeaderCreated",
            "rolloutStrategy": {"type": "RollingUpdate",
                                "rollingUpdateConfiguration": {"maxUnavailable": 0,
                                                               "maxSurge": 1}},
            "leaderWorkerTemplate": {
                "size": 2,
                "restartPolicy": "RecreateGroupOnPodRestart",
                "leaderTemplate": pod("leader", [leader, agent, openai]),
                "workerTemplate": pod("follower", [worker]),
            },
        },
    }


def render(variant: str) -> str:
    head = (f"# LeaderWorkerSet, {variant} variant. GENERATED by deploy/kubernetes/render.py: "
            "edit that, then run it.\n")
    return head + yaml.safe_dump(manifest(variant), sort_keys=False, width=100)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true")
    a = ap.parse_args()
    stale = []
    for variant in VARIANTS:
        path = HERE / f"lws-{variant}.yaml"
        text = render(variant)
        if a.check:
            if not path.exists() or path.read_text() != text:
                stale.append(path.name)
        else:
            path.write_text(text)
            print(f"wrote {path.relative_to(ROOT)}")
    if stale:
        print(f"stale: {', '.join(stale)}; run python deploy/kubernetes/render.py",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
