"""One follower node: topology -> same engine config as the leader -> vLLM headless worker.

Lifecycle (each step logged, ``/health`` reports the state):

1. topology from the environment (``rufus.multinode.topology``; ours or LeaderWorkerSet's);
2. engine args from the leader's ``model.json`` (``RUFUS_MODEL_JSON``, same env overrides)
   through the same ``apply_topology`` the leader uses;
3. dial the leader's control port with a bounded, logged retry (``RUFUS_JOIN_WAIT_S``);
   the leader compares config fingerprints and rejects a mismatch before any vLLM work;
4. vLLM's headless path (``create_engine_config(headless=True)`` + ``MultiprocExecutor``,
   exactly what ``vllm serve --headless`` does for ``node_rank_within_dp > 0``): the worker
   joins torch.distributed (Gloo on CPU), receives the leader's broadcast inputs and runs its
   pipeline stage in lockstep;
5. exit non-zero when the leader goes away or a local worker dies: the unit is restarted
   whole by its supervisor, never patched up.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from follower.health import HealthState, serve_health
from rufus.env import EnvError, environ
from rufus.machine import caches
from rufus.multinode.control import (
    ControlSettings,
    FollowerControl,
    LeaderUnreachable,
    Rejected,
    UnitError,
    fingerprint,
    kill_vllm_children,
    unit_model_name,
    unit_secret,
)
from rufus.multinode.control import configure as configure_control
from rufus.multinode.topology import Topology, TopologyError, apply_topology, topology_from_env
from rufus.serving.config import ConfigError, load_engine_config
from rufus.serving.settings import env_var, group, help_epilog, read
from rufus.telemetry import tracing
from rufus.telemetry.tracing import TracingSettings

log = logging.getLogger("follower")

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_MODEL_JSON = ROOT / "model_repository" / "rufus_llm" / "1" / "model.json"

# Exit codes an operator (or the rig) can act on.
EXIT_OK = 0
EXIT_CONFIG = 2          # bad topology/model.json, or the leader rejected our config
EXIT_NO_LEADER = 3       # leader not reachable within RUFUS_JOIN_WAIT_S
EXIT_LEADER_LOST = 4     # leader went away after we joined
EXIT_WORKER_DIED = 5     # a local vLLM worker process died
EXIT_JOIN_FAILED = 6     # vLLM raised while joining the unit


def engine_args_for(topo: Topology, env: dict[str, str] | None = None) -> dict[str, Any]:
    """This follower's engine args: the leader's model.json + overrides + topology."""
    env = dict(environ() if env is None else env)
    path = Path(env.get("RUFUS_MODEL_JSON", str(DEFAULT_MODEL_JSON)))
    # "dtype": "measured" resolves as on the leader: one CPU class per unit (deploy/README.md)
    cfg = load_engine_config(path, unit_model_name(env), env)
    return apply_topology(cfg.engine_args, topo)


def _die(code: int, health: HealthState | None, why: str) -> None:
    """Leave now, taking our vLLM workers with us (no orphans), from any thread."""
    log.error("%s; exiting with %d so the unit is restarted as a whole", why, code)
    if health is not None:
        health.set("failed", why)
    killed = kill_vllm_children()
    if killed:
        log.info("killed local vLLM workers %s", killed)
    logging.shutdown()
    os._exit(code)


def build_executor(engine_args: dict[str, Any]) -> Any:
    """vLLM's headless multi-node worker, as in vllm/entrypoints/cli/serve.py run_headless.

    Platform-neutral: vLLM's platform plugin picks the worker class (CPU here, CUDA on GPU
    hosts, Neuron via the vllm-neuron plugin on Trainium; the last is untested).
    """
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.usage.usage_lib import UsageContext
    from vllm.v1.executor.multiproc_executor import MultiprocExecutor

    vllm_config = AsyncEngineArgs(**engine_args).create_engine_config(
        usage_context=UsageContext.OPENAI_API_SERVER, headless=True)
    if vllm_config.parallel_config.node_rank_within_dp <= 0:
        raise TopologyError("this node resolved to the leader's rank within its DP group; "
                            "a follower needs LWS_WORKER_INDEX >= 1")
    return MultiprocExecutor(vllm_config, monitor_workers=False)


@dataclass(frozen=True)
class FollowerSettings:
    """What the follower reads from the environment besides its topology and engine args."""

    log_level: str = env_var("RUFUS_LOG_LEVEL", "INFO", "logging level")
    control: ControlSettings = group(ControlSettings)  # noqa: RUF009 - a default_factory field
    traces: TracingSettings = group(TracingSettings)  # noqa: RUF009 - a default_factory field


# read by the topology's and the engine config's own readers (rufus/multinode/topology.py,
# rufus/serving/config.py)
OTHER_ENVIRONMENT = {
    "LWS_GROUP_SIZE": "nodes in the unit (> 1 for a follower)",
    "LWS_WORKER_INDEX": "this node's rank (>= 1; 0 is the tritonserver leader)",
    "LWS_LEADER_ADDRESS": "leader host (default 127.0.0.1)",
    "RUFUS_LEADER_PORT": "torch.distributed rendezvous port on the leader (default 29500)",
    "RUFUS_CONTROL_PORT": "the leader's control channel (default leader port + 1)",
    "RUFUS_UNIT_SECRET": "control-channel secret, the same on every node (required)",
    "RUFUS_HEALTH_PORT": "this follower's /health port (default 8081)",
    "RUFUS_MODEL_JSON": "the leader's model.json (default model_repository/rufus_llm/1/)",
    "RUFUS_UNIT_MODEL": "the model whose engine spans the unit (default rufus_llm)",
    "RUFUS_ENGINE_ARGS, RUFUS_<MODEL>_ENGINE_ARGS": "JSON engine-arg overrides (as the leader)",
    "RUFUS_MODEL_DIR, RUFUS_CACHE_DIR": "where the default model is (as the leader)",
}


def parse_args(argv: list[str] | None = None) -> None:
    """``--help`` only: every setting comes from the environment (one contract for the
    rig, LeaderWorkerSet and ECS; docs/architecture.md)."""
    import argparse

    argparse.ArgumentParser(
        prog="python -m follower", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="A follower node of a multi-node inference unit: joins the leader's vLLM "
                    "engine as a headless worker and serves /health. Exit codes: 0 stopped, "
                    "2 configuration, 3 no leader, 4 leader lost, 5 worker died, 6 join failed.",
        epilog=help_epilog(FollowerSettings, extra=OTHER_ENVIRONMENT)).parse_args(argv)


def _setup_process(settings: FollowerSettings) -> None:
    """Logging, compile caches and tracing, in that order: caches must be configured before
    vLLM is imported (they are keyed by this CPU), and a bad tracing setting must not stop
    the follower (tracing stays off, logged)."""
    logging.basicConfig(level=settings.log_level,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        stream=sys.stderr)
    caches.configure()  # before vLLM is imported: compile caches keyed by this CPU
    try:
        # its spans (the unit's formation) as service.name rufus-follower; off by default
        tracing.setup("rufus-follower")
    except ValueError as exc:
        log.error("tracing stays off: %s", exc)


def _configuration(settings: FollowerSettings) -> tuple[Topology, dict[str, Any], bytes, float] | None:
    """Topology, engine args, unit secret and leader wait bound from the environment, or
    None (logged) on any configuration error: all of it is checked before any network or
    vLLM work, so a misconfigured follower exits with EXIT_CONFIG at once."""
    try:
        topo = topology_from_env()
        if not topo.multi_node or topo.is_leader:
            raise TopologyError(
                f"a follower needs LWS_GROUP_SIZE > 1 and LWS_WORKER_INDEX >= 1 (got nnodes="
                f"{topo.nnodes}, rank={topo.node_rank}); rank 0 is the tritonserver leader")
        args = engine_args_for(topo)
        secret = unit_secret()
        wait_s = settings.control.join_wait_s
        configure_control(settings.control)
    except (TopologyError, ConfigError, UnitError, EnvError) as exc:
        log.error("follower configuration error: %s", exc)
        return None
    log.info("follower rank %d of %d; leader %s (rendezvous %d, control %d); engine args %s",
             topo.node_rank, topo.nnodes, topo.leader_addr, topo.leader_port,
             topo.leader_control_port, args)
    return topo, args, secret, wait_s


def _start_health(topo: Topology, bind: str) -> HealthState | None:
    """This follower's /health, served before dialling the leader so the supervisor sees
    every lifecycle state; None (logged) when its port cannot be bound."""
    health = HealthState(topo)
    try:
        serve_health(health, topo.health_port, bind)
    except OSError as exc:
        log.error("cannot serve /health on port %d: %s (set RUFUS_HEALTH_PORT / "
                  "RUFUS_BIND)", topo.health_port, exc)
        return None
    return health


def _handle_signals(health: HealthState, stopping: threading.Event) -> None:
    """SIGTERM/SIGINT stop the follower cleanly: the first one marks it stopping (so the
    leader's loss or a worker's death that follows is not reported as a failure) and
    unwinds the main thread with SystemExit(EXIT_OK), running the teardown in main."""
    def on_term(signum: int, _frame: Any) -> None:
        if not stopping.is_set():
            stopping.set()
            health.set("stopping", f"signal {signum}")
            raise SystemExit(EXIT_OK)

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)


def _dial_leader(control: FollowerControl, health: HealthState, wait_s: float,
                 unit_span: Any) -> int | None:
    """Connect to the leader's control port (bounded by ``wait_s``) under its own span;
    the exit code when the leader rejects our config or cannot be reached, else None."""
    dial = tracing.start_span("dial leader", unit_span)
    try:
        control.connect(wait_s)
        tracing.end(dial)
    except Rejected as exc:
        log.error("%s", exc)
        health.set("failed", str(exc))
        tracing.end(dial, exc)
        tracing.end(unit_span, exc)
        return EXIT_CONFIG
    except LeaderUnreachable as exc:
        log.error("%s", exc)
        health.set("failed", str(exc))
        tracing.end(dial, exc)
        tracing.end(unit_span, exc)
        return EXIT_NO_LEADER
    return None


def _watch_leader(control: FollowerControl, health: HealthState,
                  stopping: threading.Event) -> None:
    """Losing the leader after joining ends this node (EXIT_LEADER_LOST) unless we are
    already stopping: the unit is restarted whole, never patched up."""
    def leader_lost(why: str) -> None:
        if not stopping.is_set():
            _die(EXIT_LEADER_LOST, health, f"lost the leader at {control.address}: {why}")

    control.watch(leader_lost)


def _run_unit(args: dict[str, Any], health: HealthState, stopping: threading.Event,
              control: FollowerControl, unit_span: Any) -> int:
    """Join the unit as vLLM's headless worker and block while it runs; whatever ends it
    (a worker's death, a signal, a failed join), flush the spans and take the control
    channel, the executor and every local vLLM worker down with it (no orphans)."""
    health.set("joining")
    t0 = time.monotonic()
    executor = None
    join = tracing.start_span("join unit", unit_span)
    try:
        executor = build_executor(args)
        health.set("running", f"joined in {time.monotonic() - t0:.1f} s")
        log.info("running: worker(s) joined the unit in %.1f s", time.monotonic() - t0)
        tracing.end(join)
        tracing.end(unit_span)
        unit_span = join = None
        # Blocks until a local worker process dies (vLLM's own monitor, inline).
        executor.start_worker_monitor(inline=True)
        if not stopping.is_set():
            _die(EXIT_WORKER_DIED, health, "a local vLLM worker process died")
        return EXIT_OK
    except SystemExit:
        log.info("stopping on signal")
        return EXIT_OK
    except Exception as exc:
        tracing.end(join, exc)
        tracing.end(unit_span, exc)
        if stopping.is_set():
            return EXIT_OK
        log.exception("joining the unit failed")
        _die(EXIT_JOIN_FAILED, health, f"joining the unit failed: {type(exc).__name__}: {exc}")
        return EXIT_JOIN_FAILED
    finally:
        stopping.set()
        tracing.shutdown()  # flush the spans before the process ends
        control.close()
        if executor is not None:
            executor.shutdown()
        kill_vllm_children()


def main(argv: list[str] | None = None) -> int:
    """The follower's lifecycle (module docstring); returns its exit code."""
    parse_args(argv)
    settings = read(FollowerSettings)  # a bad value: exit 2 naming it (follower/__main__.py)
    _setup_process(settings)
    config = _configuration(settings)
    if config is None:
        return EXIT_CONFIG
    topo, args, secret, wait_s = config
    health = _start_health(topo, settings.control.bind)
    if health is None:
        return EXIT_CONFIG

    stopping = threading.Event()
    _handle_signals(health, stopping)

    control = FollowerControl(topo, fingerprint(args), secret)
    health.set("waiting_for_leader", f"dialling {control.address}")
    # the unit's formation, as one trace per start: dialling the leader, then joining
    unit_span = tracing.start_span("follower start", attributes={
        "rufus.node_rank": topo.node_rank, "rufus.nnodes": topo.nnodes})
    failed = _dial_leader(control, health, wait_s, unit_span)
    if failed is not None:
        return failed
    _watch_leader(control, health, stopping)
    return _run_unit(args, health, stopping, control, unit_span)
