"""The deployment contract: one table of the ports, commands, health paths and environment
variables that docker/, deploy/kubernetes/ and deploy/ecs/ name, and who reads each.

``tests/unit/test_deploy_consistency.py`` checks every deployment file against this table and
this table against the code (``rufus/``, ``follower/``, ``proxy/``). Code may import it
(``from deploy.contract import PORTS``); it has no dependencies.
"""

from __future__ import annotations

from dataclasses import dataclass

# --- ports -----------------------------------------------------------------------------------
PORTS: dict[str, int] = {
    "GRPC_PORT": 8001,           # tritonserver gRPC (leader)      rufus/launch/server.py
    "HTTP_PORT": 8000,           # tritonserver HTTP (leader)      rufus/launch/server.py
    "METRICS_PORT": 8002,        # tritonserver /metrics (leader)  rufus/launch/server.py
    "RUFUS_LEADER_PORT": 29500,  # torch.distributed rendezvous    rufus/multinode/topology.py
    "RUFUS_CONTROL_PORT": 29501,  # leader/follower control channel rufus/multinode/topology.py (+1)
    "RUFUS_HEALTH_PORT": 8081,   # follower /health                rufus/multinode/topology.py
    "RUFUS_AGENT_PORT": 8090,    # unit agent /health, /load       proxy/agent.py
    "RUFUS_AGENT_CHECK_PORT": 8091,  # HAProxy agent-check (load)   proxy/agent.py
    "OPENAI_PORT": 9000,         # OpenAI-compatible HTTP API      rufus/frontend/__main__.py
}

# --- what each role runs (argv after the interpreter) -----------------------------------------
MODEL = "rufus_llm"  # the unit's model: its engine spans every node (pipeline parallel)
# The shopping assistant (issue 16) is no new process: the Triton model rufus_assistant in the
# leader's tritonserver, which calls ASSISTANT_CALLS on that same server over gRPC
# (model_repository/rufus_assistant/config.pbtxt: planner_model, answer_model), plus the
# frontend's hook (model id rufus-assistant), which calls the same two models itself. The
# planner runs on the leader alone; followers serve only MODEL's pipeline stages.
ASSISTANT_MODEL = "rufus_assistant"
ASSISTANT_CALLS: tuple[str, ...] = ("rufus_qp_medusa", MODEL)
# what every leader loads (RUFUS_MODELS) and its unit agent requires ready (RUFUS_UNIT_MODELS)
LEADER_MODELS: tuple[str, ...] = (MODEL, "rufus_qp_medusa", ASSISTANT_MODEL)
# where the images keep the product search index (built in docker/Dockerfile's cpu-build)
CATALOG_INDEX = "/opt/rufus/catalog/catalog.sqlite"
COMMANDS: dict[str, list[str]] = {
    "leader": ["python", "-m", "rufus.launch.server"],
    "follower": ["python", "-m", "follower"],
    "agent": ["python", "-m", "proxy.agent"],
    "openai": ["python", "-m", "rufus.frontend"],
}
# the file that ``python -m <module>`` runs, relative to the repository root
MODULE_FILES: dict[str, str] = {
    "rufus.launch.server": "rufus/launch/server.py",
    "follower": "follower/__main__.py",
    "proxy.agent": "proxy/agent.py",
    "rufus.frontend": "rufus/frontend/__main__.py",
}


# --- health endpoints ------------------------------------------------------------------------
@dataclass(frozen=True)
class Endpoint:
    role: str
    port_var: str
    path: str
    meaning: str


HEALTH: dict[str, Endpoint] = {
    "leader_live": Endpoint("leader", "HTTP_PORT", "/v2/health/live",
                            "tritonserver process is up"),
    "leader_ready": Endpoint("leader", "HTTP_PORT", "/v2/health/ready",
                             "tritonserver ready (all loaded models ready)"),
    "model_ready": Endpoint("leader", "HTTP_PORT", f"/v2/models/{MODEL}/ready",
                            "the multi-node engine serves (unloads itself when it dies)"),
    "metrics": Endpoint("leader", "METRICS_PORT", "/metrics", "Prometheus metrics"),
    "follower_health": Endpoint("follower", "RUFUS_HEALTH_PORT", "/health",
                                "200 JSON {rank, nnodes, leader, state} / 503"),
    "agent_health": Endpoint("agent", "RUFUS_AGENT_PORT", "/health",
                             "200 when every node of the unit is healthy, else 503 naming it"),
    "agent_load": Endpoint("agent", "RUFUS_AGENT_PORT", "/load", "the unit's current load"),
    "openai_health": Endpoint("openai", "OPENAI_PORT", "/health",
                              "200 when Triton and every served model are ready, else 503"),
}
# Triton's own paths: served by tritonserver itself, not by our code.
TRITON_PATHS = frozenset({"/v2/health/live", "/v2/health/ready", f"/v2/models/{MODEL}/ready",
                          "/metrics"})


HAPROXY_CONFIG = "proxy/haproxy/haproxy.cfg"
# per-instance-type cell configuration (deploy/instance_types.py): the LWS manifests are
# rendered from it, the compose rig ("cpu") and the ECS task definitions ("trn1.32xlarge")
# are checked against it
INSTANCE_TYPES = "deploy/instance_types.toml"
# Variables that hold secrets: a deployment file may only reference them (secretKeyRef, ECS
# secrets, ${VAR} from the compose environment), never carry a value.
SECRET_ENV = frozenset({"RUFUS_ADMIN_KEY", "RUFUS_UNIT_SECRET", "RUFUS_OPENAI_API_KEY"})

# --- environment variables -------------------------------------------------------------------
@dataclass(frozen=True)
class Var:
    readers: tuple[str, ...]  # files (or directories) whose code reads it
    meaning: str


ENV: dict[str, Var] = {
    "GRPC_PORT": Var(("rufus/launch/server.py",), "leader gRPC port"),
    "HTTP_PORT": Var(("rufus/launch/server.py",), "leader HTTP port"),
    "METRICS_PORT": Var(("rufus/launch/server.py",), "leader metrics port"),
    "RUFUS_MODELS": Var(("rufus/launch/server.py",), "models tritonserver loads"),
    "RUFUS_CACHE_DIR": Var(("rufus/serving/config.py",), "root of built models and caches"),
    "RUFUS_MODEL_DIR": Var(("rufus/serving/config.py",), "the default model's directory"),
    "RUFUS_COMPILE_CACHE_DIR": Var(("rufus/machine/caches.py",),
                                   "compiled kernels per CPU class (default $RUFUS_CACHE_DIR/compile)"),
    "RUFUS_LOG_LEVEL": Var(("rufus/serving/triton_backend.py",), "Python logging level in the backend"),
    "RUFUS_ENGINE_RESTART": Var(("rufus/serving/engine.py",),
                                "replace a dead engine in place (true) or leave it down"),
    "RUFUS_ENGINE_MAX_FAILURES": Var(("rufus/serving/engine.py",),
                                     "engine deaths allowed in the window before giving up"),
    "RUFUS_ENGINE_RESTART_BACKOFF_S": Var(("rufus/serving/engine.py",),
                                          "first restart backoff, doubled per failure"),
    "RUFUS_ENGINE_RESTART_BACKOFF_MAX_S": Var(("rufus/serving/engine.py",),
                                              "cap of the restart backoff, seconds"),
    "RUFUS_ENGINE_ARGS": Var(("rufus/serving/config.py",), "JSON engine-argument overrides, all models"),
    "RUFUS_RUFUS_LLM_ENGINE_ARGS": Var(("rufus/serving/config.py",),
                                       "JSON engine-argument overrides for rufus_llm"),
    "RUFUS_RUFUS_QP_MEDUSA_ENGINE_ARGS": Var(("lab/qp/plan_bench.py",),
                                             "JSON engine-argument overrides for rufus_qp_medusa"),
    # membership: LeaderWorkerSet's names (LWS sets them; compose and ECS set the same)
    "LWS_GROUP_SIZE": Var(("rufus/multinode/topology.py",), "nodes in the unit"),
    "LWS_WORKER_INDEX": Var(("rufus/multinode/topology.py",), "this node's rank (0 = leader)"),
    "LWS_LEADER_ADDRESS": Var(("rufus/multinode/topology.py",), "leader host"),
    "RUFUS_LEADER_PORT": Var(("rufus/multinode/topology.py",), "leader rendezvous port"),
    "RUFUS_HEALTH_PORT": Var(("rufus/multinode/topology.py",), "follower health port"),
    "RUFUS_CONTROL_PORT": Var(("rufus/multinode/topology.py",),
                              "leader's control port (handshake, heartbeats)"),
    "RUFUS_UNIT_MODEL": Var(("rufus/multinode/control.py",), "the model whose engine spans the unit"),
    "RUFUS_PEER_TIMEOUT_S": Var(("rufus/multinode/topology.py",), "peer declared dead after this "
                                "silence (heartbeats every second, or a fifth of it)"),
    "RUFUS_JOIN_WAIT_S": Var(("rufus/multinode/topology.py",),
                             "how long the unit has to form: the leader waits for its followers, "
                             "a follower for its leader (600)"),
    "RUFUS_MODEL_JSON": Var(("follower/",), "follower: the model.json it shares with the leader"),
    "RUFUS_AGENT_PORT": Var(("proxy/",), "unit agent HTTP port"),
    "RUFUS_LEADER_HTTP": Var(("proxy/",), "unit agent: the leader's Triton HTTP base URL"),
    "RUFUS_FOLLOWER_HEALTH_URLS": Var(("proxy/",),
                                      "unit agent: comma-separated follower /health URLs"),
    "RUFUS_LEADER_METRICS": Var(("proxy/",), "unit agent: the leader's Triton /metrics URL (load)"),
    "RUFUS_UNIT_MODELS": Var(("proxy/",), "unit agent: models that must be ready (default rufus_llm; "
                                 "deployments: LEADER_MODELS)"),
    "RUFUS_AGENT_CHECK_PORT": Var(("proxy/",), "unit agent: HAProxy agent-check TCP port"),
    "RUFUS_CAPACITY_REFERENCE": Var(("proxy/",),
                                    "unit agent: the capacity (sequences) that weighs 100 % at the "
                                    "ingress; the same on every agent (LWS: INSTANCE_TYPES' largest)"),
    "RUFUS_AGENT_DRAIN_S": Var(("proxy/", "rufus/launch/fleet.py"),
                               "unit agent: seconds it answers 'down' on SIGTERM before exiting "
                               "(default 4.5; the local fleet sets 0)"),
    # secrets (SECURITY.md): from a Kubernetes Secret / ECS secrets / the compose environment,
    # never a literal value in a deployment file
    "RUFUS_ADMIN_KEY": Var(("rufus/launch/server.py",),
                           "secret: opens Triton's restricted APIs (model control); unset = random"),
    "RUFUS_UNIT_SECRET": Var(("rufus/multinode/control.py",),
                             "secret: the unit's control-channel HMAC key, same on every node"),
    "RUFUS_BIND": Var(("rufus/multinode/topology.py",),
                      "address a node's own listeners bind: the leader's control channel, a "
                      "follower's /health (default 0.0.0.0)"),
    "RUFUS_CONFIG_VARS": Var(("rufus/serving/config.py",),
                             "extra non-RUFUS_ variables model.json may expand (comma-separated)"),
    # the OpenAI-compatible frontend (python -m rufus.frontend)
    "OPENAI_PORT": Var(("rufus/frontend/__main__.py",), "frontend: HTTP port (9000)"),
    "OPENAI_HOST": Var(("rufus/frontend/__main__.py",), "frontend: bind address (0.0.0.0)"),
    "TRITON_GRPC_URL": Var(("rufus/frontend/__main__.py",),
                           "frontend: Triton gRPC address, one leader or the ingress"),
    # tracing (rufus/telemetry/tracing.py, every process; docs/observability.md)
    "OTEL_EXPORTER_OTLP_ENDPOINT": Var(("rufus/telemetry/tracing.py",),
                                       "tracing on: the OTLP endpoint spans go to (unset: "
                                       "off); OTEL_EXPORTER_OTLP_TRACES_ENDPOINT wins"),
    "OTEL_EXPORTER_OTLP_PROTOCOL": Var(("rufus/telemetry/tracing.py",),
                                       "tracing: http/protobuf (default) or grpc"),
    "OTEL_TRACES_SAMPLER_ARG": Var(("rufus/telemetry/tracing.py",),
                                   "tracing: share of new traces sampled, 0..1 (1); a "
                                   "request's traceparent decides for its own trace"),
    "OTEL_SDK_DISABLED": Var(("rufus/telemetry/tracing.py",),
                             "tracing: true keeps it off whatever else is set"),
    "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT": Var(
        ("rufus/telemetry/tracing.py",),
        "tracing: true puts the request's messages in the model spans (off: no customer text)"),
    "RUFUS_TRITON_TRACING": Var(("rufus/launch/server.py",),
                                "tracing: 1 adds tritonserver's own OpenTelemetry spans "
                                "(OTLP/HTTP only)"),
    "RUFUS_OPENAI_MODELS": Var(("rufus/frontend/__main__.py",),
                               "frontend: Triton models offered as OpenAI model ids"),
    "RUFUS_OPENAI_RETRIES": Var(("rufus/frontend/__main__.py",),
                                "frontend: resends before the first token (UNAVAILABLE)"),
    "RUFUS_OPENAI_API_KEY": Var(("rufus/frontend/__main__.py",),
                                "secret: bearer key the frontend requires on /v1 (unset: open)"),
    # the shopping assistant (rufus_assistant, rufus/assistant/, rufus/retrieval/)
    "RUFUS_TRITON_GRPC_URL": Var(("rufus/launch/server.py",),
                                 "rufus_assistant: the server's own gRPC address (set by the "
                                 "launcher; default 127.0.0.1:8001)"),
    "RUFUS_ASSISTANT_PLAN_TIMEOUT_S": Var(("rufus/assistant/settings.py",),
                                          "assistant: planner time limit before the fallback plan (10)"),
    "RUFUS_ASSISTANT_SLO_S": Var(("rufus/assistant/settings.py",),
                                 "assistant: first answer text SLO in seconds (1.0); turns "
                                 "estimated past margin x SLO are refused UNAVAILABLE / 503 "
                                 "(0 turns admission off)"),
    "RUFUS_ASSISTANT_MARGIN": Var(("rufus/assistant/settings.py",),
                                  "assistant: refuse above this share of the SLO (1.0)"),
    "RUFUS_QP_SLO_S": Var(("rufus/qp/settings.py",),
                          "planner: plan SLO in seconds (0.3); plans estimated past margin x "
                          "SLO are refused UNAVAILABLE (a request's slo_ms replaces it; 0 "
                          "turns admission off)"),
    "RUFUS_QP_MARGIN": Var(("rufus/qp/settings.py",),
                           "planner: refuse above this share of the SLO (1.0)"),
    "RUFUS_CATALOG": Var(("rufus/retrieval/__init__.py",),
                         "assistant: your own catalog (.jsonl/.csv) instead of the generated one"),
    "RUFUS_INIT_MARKERS": Var(("rufus/serving/triton_backend.py", "rufus/launch/server.py"),
                              "set by the launcher, not by operators: where each stub marks "
                              "that its initialize() returned (stalled loads: docs/operations.md)"),
    "RUFUS_WARMUP": Var(("rufus/serving/model_settings.py",),
                        "serve warm-up requests before reporting ready (true; false skips)"),
    "RUFUS_LAB_OFF": Var(("rufus/env.py",),
                         "benchmarks only: optimisations turned off for a baseline, "
                         "comma-separated (gc_freeze, fork, fp32_packed, fused, prewarm, short_warmup)"),
    "RUFUS_CATALOG_INDEX": Var(("rufus/retrieval/__init__.py",),
                               "assistant: search index file (build/retrieval/catalog.sqlite)"),
}
# docker/Dockerfile's own build arguments (`docker build --build-arg`; scripts/image.sh's flags)
BUILD_ARGS: dict[str, str] = {
    "PREBUILD": "the build-time warm-up: 1 starts LEADER_MODELS once so the image ships warm "
                "compile caches; precision measures only; 0 skips (scripts/image.sh --prebuild)",
}
# Read by third-party code (the environment is their documented interface), not by ours.
EXTERNAL_ENV: dict[str, str] = {
    "PATH": "OS",
    "HOME": "OS",
    "PYTHONUNBUFFERED": "CPython",
    "PIP_NO_CACHE_DIR": "pip (build stage only)",
    "PIP_DISABLE_PIP_VERSION_CHECK": "pip (build stage only)",
    "PIP_EXTRA_INDEX_URL": "pip (build stage only): PyTorch CPU wheel index",
    "PYTHON": "scripts/setup.sh: interpreter to build the venv with",
    "VLLM_CPU_KVCACHE_SPACE": "vLLM (CPU): KV cache GiB",
    "VLLM_CPU_OMP_THREADS_BIND": "vLLM (CPU): cores the engine's threads use (auto, 0-3, ...)",
    "VLLM_HOST_IP": "vLLM: address this node advertises to the others",
    "GLOO_SOCKET_IFNAME": "torch.distributed Gloo: network interface",
    "NCCL_SOCKET_IFNAME": "NCCL: network interface",
    "TOKENIZERS_PARALLELISM": "Hugging Face tokenizers",
    "NEURON_RT_VISIBLE_CORES": "Neuron runtime",
    "NEURON_COMPILED_ARTIFACTS": "vLLM Neuron / NxDI: compiled model location",
    "FI_PROVIDER": "libfabric (EFA)",
    "FI_EFA_USE_DEVICE_RDMA": "libfabric (EFA)",
    "POD_NAME": "Kubernetes downward API, used only inside other env values",
    "GF_SECURITY_ADMIN_PASSWORD": "Grafana (compose rig, profile observe): admin's password, "
                                  "from GRAFANA_ADMIN_PASSWORD",
    "GF_AUTH_ANONYMOUS_ENABLED": "Grafana: no anonymous viewers",
    "GF_ANALYTICS_REPORTING_ENABLED": "Grafana: no usage reporting",
    "GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH": "Grafana: the unit dashboard as home",
    "GRAFANA_ADMIN_PASSWORD": "compose rig: Grafana admin's password (a secret: from the "
                              "environment only)",
}

# --- compose rig: service names other files (HAProxy config, scripts) may rely on --------------
COMPOSE_SERVICES = {"leader": "leader", "follower": "follower", "agent": "agent",
                    "ingress": "haproxy"}
# The ingress publishes Triton's ports to clients: gRPC and HTTP.
INGRESS_PORTS = {"grpc": PORTS["GRPC_PORT"], "http": PORTS["HTTP_PORT"]}
# HAProxy's read-only stats page + Prometheus exporter in the compose rig (127.0.0.1 only)
INGRESS_STATS_PORT = 8404
