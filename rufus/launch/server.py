"""Start and stop a real ``tritonserver`` on our model repository.

One launcher for ``make serve``, the tests, the benchmarks and the multi-node rig, so they
all run the server the same way (paths and library settings written by scripts/setup.sh to
``build/triton/env.json``).

    python -m rufus.launch.server [--models rufus_llm,...] [--grpc-port N ...]

Closed by default (SECURITY.md): every Triton API a public client never needs (model
load/unload and uploads, shared memory, statistics, trace, logging) is
restricted with Triton's own ``--grpc-restricted-protocol`` / ``--http-restricted-api`` and
keyed by ``RUFUS_ADMIN_KEY`` (a random key per start when unset, so nobody holds it). The
key is never logged: :meth:`TritonServer.command` shows a placeholder.

Its ports come from rufus/launch/ports.py and the cleanup of what it starts (die with us,
end the whole process group) from rufus/launch/children.py.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from rufus.env import EnvError, env_str, environ, environ_copy, exits_on_env_error
from rufus.launch.children import child_setup, start_reaper, stop_group
from rufus.launch.ports import free_port  # also imported from here (the lab, the tests)
from rufus.serving.settings import env_var, group, help_epilog, read
from rufus.telemetry import tracing
from rufus.telemetry.tracing import TracingSettings
from rufus.wire import CONVERSATION_HEADER

ROOT = Path(__file__).resolve().parents[2]
ENV_FILE = ROOT / "build" / "triton" / "env.json"

# A model whose initialize() returned this long ago and that tritonserver still does not
# report ready is a load tritonserver has given up on without saying so (see
# TritonServer.stalled_loads); the parent takes milliseconds once the stub answers.
LOAD_STALL_S = 60.0
# Where each model's stub marks "initialize() returned" (rufus/serving/triton_backend.py).
INIT_MARKERS_ENV = "RUFUS_INIT_MARKERS"

# Triton API groups a public client never needs: health, metadata, the read-only model
# config and inference stay open (the official backend serves them; perf_analyzer and many
# tritonclient users read a model's config first). ``shared-memory`` also closes the 2.51
# CVEs in the Python backend's shm path.
RESTRICTED_APIS = ("model-repository", "shared-memory", "statistics", "trace", "logging")
# HTTP header carrying the admin key; Triton prefixes the gRPC metadata key itself.
ADMIN_HEADER = "rufus-admin-key"
GRPC_ADMIN_HEADER = "triton-grpc-protocol-" + ADMIN_HEADER
ADMIN_KEY_ENV = "RUFUS_ADMIN_KEY"
_KEY_PLACEHOLDER = "<" + ADMIN_KEY_ENV + ">"


def admin_key_from_env(env: Mapping[str, str] | None = None) -> str:
    """The operator's key, or a fresh random one (model control then closed to everyone)."""
    key = (environ() if env is None else env).get(ADMIN_KEY_ENV, "")
    if key and (len(key) < 16 or any(c in key for c in ",:= \t\n")):
        raise EnvError(f"{ADMIN_KEY_ENV} must be at least 16 characters with no ',', ':', "
                       "'=' or whitespace (e.g. `openssl rand -hex 32`); value not shown")
    return key or secrets.token_hex(32)


def triton_env() -> dict[str, str]:
    if not ENV_FILE.exists():
        raise SystemExit(f"{ENV_FILE} missing: run `make setup` (scripts/setup.sh) first")
    return json.loads(ENV_FILE.read_text())


FORWARDED_HEADERS = f"^({CONVERSATION_HEADER}|traceparent|tracestate)$"


def triton_trace_args(env: Mapping[str, str]) -> list[str]:
    """tritonserver's own OpenTelemetry tracing (``--trace-config mode=opentelemetry``), from
    the same settings as ours, when ``RUFUS_TRITON_TRACING=1``: its spans (request, compute)
    join the client's ``traceparent`` and the models' spans join Triton's. Its exporter
    speaks OTLP over HTTP only; its sampling is 1 in ``rate`` requests."""
    if env.get("RUFUS_TRITON_TRACING", "0") != "1" or not tracing.endpoint(env):
        return []
    url = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or \
        env["OTEL_EXPORTER_OTLP_ENDPOINT"].rstrip("/") + "/v1/traces"
    if (env.get("OTEL_EXPORTER_OTLP_PROTOCOL") or "http/protobuf") != "http/protobuf":
        print("[rufus.launch.server] RUFUS_TRITON_TRACING=1 needs an OTLP/HTTP endpoint; "
              "tritonserver's own spans stay off (OTEL_EXPORTER_OTLP_PROTOCOL is not "
              "http/protobuf)", file=sys.stderr, flush=True)
        return []
    ratio = tracing.sample_ratio(env)
    rate = max(1, round(1 / ratio)) if ratio > 0 else 0
    if not rate:
        return []
    return ["--trace-config", "mode=opentelemetry", "--trace-config", "level=TIMESTAMPS",
            "--trace-config", f"rate={rate}", "--trace-config", "count=-1",
            "--trace-config", f"opentelemetry,url={url}",
            "--trace-config", "opentelemetry,resource=service.name=tritonserver",
            "--trace-config", f"opentelemetry,resource=service.namespace="
                              f"{tracing.SERVICE_NAMESPACE}"]


@dataclass
class TritonServer:
    """A tritonserver process in its own process group (so we can end all of it by pid)."""

    models: list[str] = field(default_factory=lambda: ["rufus_llm"])
    grpc_port: int = 8001
    http_port: int = 8000
    metrics_port: int = 8002
    model_repository: Path = ROOT / "model_repository"
    extra_env: Mapping[str, str] = field(default_factory=dict)
    log_path: Path | None = None
    host: str = "0.0.0.0"
    proc: subprocess.Popen[bytes] | None = None
    reaper: subprocess.Popen[bytes] | None = None
    admin_key: str = field(default_factory=admin_key_from_env, repr=False)
    # per start: one file per model whose initialize() returned (INIT_MARKERS_ENV)
    markers: Path | None = None
    # cores the server and its children may run on (None: all; rufus.launch.fleet)
    cpus: tuple[int, ...] | None = None

    def admin_headers(self, protocol: str = "grpc") -> dict[str, str]:
        """Headers that open the restricted APIs (tritonclient ``headers=``)."""
        return {GRPC_ADMIN_HEADER if protocol == "grpc" else ADMIN_HEADER: self.admin_key}

    def command(self, reveal_key: bool = False) -> list[str]:
        """tritonserver's argv; the admin key is a placeholder unless ``reveal_key`` (only
        for exec), so printing or logging this list never shows it."""
        t = triton_env()
        key = self.admin_key if reveal_key else _KEY_PLACEHOLDER
        apis = ",".join(RESTRICTED_APIS)
        cmd = [
            t["tritonserver"],
            f"--model-repository={self.model_repository}",
            f"--backend-directory={t['backend_directory']}",
            # explicit mode lets a model whose engine died unload itself (-> not ready).
            "--model-control-mode=explicit",
            f"--grpc-port={self.grpc_port}",
            f"--http-port={self.http_port}",
            f"--metrics-port={self.metrics_port}",
            f"--grpc-address={self.host}",
            f"--http-address={self.host}",
            "--allow-metrics=true",
            "--log-info=true",
            "--exit-timeout-secs=20",
            f"--grpc-restricted-protocol={apis}:{ADMIN_HEADER}={key}",
            f"--http-restricted-api={apis}:{ADMIN_HEADER}={key}",
            # the conversation key and the W3C trace headers reach the models as request
            # parameters (the assistant passes them on to its own calls); no other header
            f"--grpc-header-forward-pattern={FORWARDED_HEADERS}",
            f"--http-header-forward-pattern={FORWARDED_HEADERS}",
        ]
        cmd += triton_trace_args(environ_copy(self.extra_env))
        cmd += [f"--load-model={m}" for m in self.models]
        return cmd

    def environment(self) -> dict[str, str]:
        t = triton_env()
        env = environ_copy()
        env["LD_LIBRARY_PATH"] = t["ld_library_path"] + (
            ":" + env["LD_LIBRARY_PATH"] if env.get("LD_LIBRARY_PATH") else "")
        env["PYTHONPATH"] = t["pythonpath"]
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
        env.setdefault("TOKENIZERS_PARALLELISM", "false")
        # rufus_assistant calls the planner and answer models on this same server over gRPC
        host = "127.0.0.1" if self.host in ("0.0.0.0", "::", "") else self.host
        env["RUFUS_TRITON_GRPC_URL"] = f"{host}:{self.grpc_port}"
        if self.markers is not None:
            env[INIT_MARKERS_ENV] = str(self.markers)
        env.update(self.extra_env)
        # the key is on tritonserver's command line; nothing inside the models needs it
        env.pop(ADMIN_KEY_ENV, None)
        return env

    def start(self) -> TritonServer:
        import shutil
        import tempfile

        if self.markers is not None:
            shutil.rmtree(self.markers, ignore_errors=True)
        self.markers = Path(tempfile.mkdtemp(prefix="rufus-init-"))
        out = open(self.log_path, "ab") if self.log_path else None
        self.proc = subprocess.Popen(
            self.command(reveal_key=True), env=self.environment(), stdout=out or None,
            stderr=subprocess.STDOUT if out else None, start_new_session=True,
            preexec_fn=child_setup(self.cpus),
        )
        self.reaper = start_reaper(self.proc.pid)
        return self

    def engine_cores(self) -> list:
        """vLLM EngineCore processes under this server (the death tests and the recovery
        benchmark kill one to simulate engine death)."""
        import psutil

        if self.proc is None:
            return []
        out = []
        for p in psutil.Process(self.proc.pid).children(recursive=True):
            try:
                if "EngineCore" in p.name() or any("EngineCore" in a for a in p.cmdline()):
                    out.append(p)
            except psutil.NoSuchProcess:
                continue
        return out

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.http_port}{path}"

    def is_ready(self, model: str | None = None) -> bool:
        path = f"/v2/models/{model}/ready" if model else "/v2/health/ready"
        try:
            with urllib.request.urlopen(self.url(path), timeout=2) as r:
                return r.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def metrics_text(self) -> str:
        try:
            with urllib.request.urlopen(
                    f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=2) as r:
                return r.read().decode()
        except (urllib.error.URLError, OSError):
            return ""

    def engine_ready(self, model: str) -> bool | None:
        """``rufus_engine_ready`` of ``model`` (None: not published). Triton's model
        readiness only says "loaded": a model whose engine died stays loaded while it
        replaces the engine, and this gauge is what says whether it can serve."""
        return engine_ready_from_metrics(self.metrics_text(), model)

    def serving(self, model: str) -> bool:
        """Loaded and its engine can serve: what a health check should ask."""
        return self.is_ready(model) and self.engine_ready(model) is not False

    def load_failures(self) -> dict[str, str]:
        """Models Triton gave up on (state UNAVAILABLE with a reason), from the index."""
        req = urllib.request.Request(self.url("/v2/repository/index"), data=b"{}", method="POST",
                                     headers=self.admin_headers("http"))
        try:
            with urllib.request.urlopen(req, timeout=2) as r:
                index = json.loads(r.read())
        except (urllib.error.URLError, OSError, ValueError):
            return {}
        return {m["name"]: m.get("reason", "") for m in index
                if m.get("name") in self.models and m.get("state") == "UNAVAILABLE"
                and m.get("reason")}

    def stalled_loads(self, after_s: float = LOAD_STALL_S) -> list[str]:
        """The models tritonserver does not report ready although every model's stub
        finished ``initialize()`` more than ``after_s`` ago (empty otherwise).

        Seen on an oversubscribed 2-core host: the Python backend's parent checks the stub's
        health in 1-s windows while it waits for ``initialize()``; a stub starved for a
        window is declared unhealthy, and the parent then waits for that stub process to
        exit (``StubLauncher::WaitForStubProcess``) while the stub, done with
        ``initialize()``, waits for its next command: the model stays LOADING forever,
        silently (triton-inference-server/server#7192 removes that wait). tritonserver opens
        its HTTP port only once every model given at start has loaded, so the test is on
        all of them: the last ``initialize()`` returned long ago and the server still does
        not answer ready. Only meaningful until the models were first ready."""
        if self.markers is None:
            return []
        now = time.time()
        newest = 0.0
        for m in self.models:
            try:
                newest = max(newest, (self.markers / m).stat().st_mtime)
            except OSError:
                return []  # a model is still in initialize(): slow, not (yet) stalled
        if now - newest <= after_s:
            return []
        return [m for m in self.models if not self.is_ready(m)]

    def stall_message(self, stalled: list[str]) -> str:
        return (f"{', '.join(stalled)}: initialize() returned over {LOAD_STALL_S:.0f} s ago but "
                "tritonserver never marked the model loaded: its Python backend gave up on the "
                "stub (1-s health windows on a starved CPU) and waits forever "
                f"(triton-inference-server/server#7192); log: {self.log_path}")

    def wait_ready(self, timeout: float = 900.0, progress: bool = True) -> float:
        """Block until every model is ready; fail early if the process exits, a model
        fails to load (explicit mode keeps the server up with the model unavailable) or a
        load stalls (:meth:`stalled_loads`)."""
        t0 = time.monotonic()
        last = 0.0
        while time.monotonic() - t0 < timeout:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"tritonserver exited with {self.proc.returncode} "
                                   f"before ready (log: {self.log_path})")
            if all(self.is_ready(m) for m in self.models) and self.is_ready():
                return time.monotonic() - t0
            failed = self.load_failures()
            if failed:
                raise RuntimeError(f"model(s) failed to load: {failed} (log: {self.log_path})")
            stalled = self.stalled_loads()
            if stalled:
                raise RuntimeError(self.stall_message(stalled))
            if progress and time.monotonic() - last > 15:
                last = time.monotonic()
                print(f"[rufus.launch.server] waiting for {self.models} "
                      f"({time.monotonic() - t0:.0f} s)", file=sys.stderr, flush=True)
            time.sleep(0.5)
        raise TimeoutError(f"tritonserver not ready after {timeout:.0f} s (log: {self.log_path})")

    def stop(self, timeout: float = 40.0) -> None:
        self._stop(timeout)
        if self.markers is not None:
            import shutil

            shutil.rmtree(self.markers, ignore_errors=True)
            self.markers = None
        if self.reaper is not None and self.reaper.poll() is None:
            self.reaper.kill()
            self.reaper.wait(5)

    def _stop(self, timeout: float) -> None:
        """SIGTERM tritonserver (it finalizes the models, which stop their engines), then
        SIGKILL whatever is left of its process group (stubs, vLLM engine cores)."""
        if self.proc is None:
            return
        pgid = self.proc.pid
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            pass


def stop_servers(servers: Iterable[TritonServer], timeout: float = 40.0) -> None:
    """Stop several servers at once: each gets SIGTERM before any is waited for, so their
    exits overlap (a model that never finalizes holds tritonserver for its whole
    ``--exit-timeout-secs``; one after another, a pair of them took 40 s)."""
    servers = list(servers)
    for srv in servers:
        if srv.proc is not None and srv.proc.poll() is None:
            srv.proc.terminate()
    for srv in servers:
        srv.stop(timeout)


def engine_ready_from_metrics(text: str, model: str) -> bool | None:
    """Parse ``rufus_engine_ready{model="<model>",...} <0|1>`` out of Prometheus text."""
    for line in text.splitlines():
        if line.startswith("rufus_engine_ready{") and f'model="{model}"' in line:
            try:
                return float(line.rsplit(" ", 1)[1]) >= 1.0
            except (IndexError, ValueError):
                return None
    return None


# serve(): tritonserver restarts after stalled loads, then this exit code (a supervisor's turn)
MAX_STALL_RESTARTS = 2
EXIT_LOAD_STALLED = 75


class LoadWatch:
    """Polled from a serving loop until every model was ready once: a stalled load
    (:meth:`TritonServer.stalled_loads`) restarts tritonserver, at most
    ``MAX_STALL_RESTARTS`` times (compile caches are warm by then, so the next start is
    shorter and less starved)."""

    def __init__(self, srv: TritonServer, grace_s: float = 6.0, who: str = "rufus.launch.server"
                 ) -> None:
        self.srv, self.grace_s, self.who = srv, grace_s, who
        self.loading, self.restarts, self.checked = True, 0, 0.0

    def poll(self) -> bool:
        """False once it gave up (tritonserver stopped); True otherwise."""
        if not self.loading or time.monotonic() - self.checked < 2.0:
            return True
        self.checked = time.monotonic()
        srv = self.srv
        self.loading = not all(srv.is_ready(m) for m in srv.models)
        stalled = srv.stalled_loads() if self.loading else []
        if not stalled:
            return True
        if self.restarts >= MAX_STALL_RESTARTS:
            print(f"[{self.who}] ERROR {srv.stall_message(stalled)}; giving up after "
                  f"{self.restarts} restarts", file=sys.stderr, flush=True)
            srv.stop(timeout=self.grace_s)
            return False
        self.restarts += 1
        print(f"[{self.who}] ERROR {srv.stall_message(stalled)}; restarting tritonserver "
              f"({self.restarts}/{MAX_STALL_RESTARTS})", file=sys.stderr, flush=True)
        srv.stop(timeout=self.grace_s)
        srv.start()
        return True


def serve(srv: TritonServer, grace_s: float = 6.0,
          others: list[subprocess.Popen[bytes]] | None = None) -> int:
    """Run tritonserver until it exits or we get SIGINT/SIGTERM/SIGHUP; then end every
    process it started (its own process group: stubs, vLLM engine cores and workers)
    within ``grace_s`` + a moment. tritonserver runs in its own session, so a terminal's
    Ctrl-C reaches only this process, which does the orderly stop. ``others``: more
    children in their own sessions (e.g. a frontend), ended the same way, first.
    A load that stalls (:meth:`TritonServer.stalled_loads`) restarts tritonserver, at most
    ``MAX_STALL_RESTARTS`` times; then the exit code is ``EXIT_LOAD_STALLED``."""
    got: list[int] = []

    def on_signal(signum: int, _frame: object) -> None:
        got.append(signum)

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, on_signal)
    srv.start()
    assert srv.proc is not None
    watch = LoadWatch(srv, grace_s)
    while not got and srv.proc.poll() is None:
        time.sleep(0.2)
        if not watch.poll():
            return EXIT_LOAD_STALLED
    if got:
        print(f"[rufus.launch.server] {signal.Signals(got[0]).name}: stopping tritonserver "
              f"and everything it started (at most {grace_s:.0f} s)", file=sys.stderr,
              flush=True)
    t0 = time.monotonic()
    for p in others or []:
        stop_group(p, 2.0)
    srv.stop(timeout=grace_s)
    code = srv.proc.returncode
    print(f"[rufus.launch.server] stopped in {time.monotonic() - t0:.1f} s "
          f"(tritonserver exit code {code})", file=sys.stderr, flush=True)
    return 0 if got else (code or 0)


def prebuild(models: list[str], timeout: float = 3600.0) -> int:
    """Start, wait for ready (every model warm), stop: what a later start then finds built."""
    from rufus.machine import caches

    dirs = caches.compile_dirs()
    srv = TritonServer(models=models, grpc_port=free_port(), http_port=free_port(),
                       metrics_port=free_port(), extra_env=dirs)
    print(f"[rufus.launch.server] prebuild {models}: caches in "
          f"{Path(dirs['VLLM_CACHE_ROOT']).parent}", file=sys.stderr, flush=True)
    srv.start()
    try:
        took = srv.wait_ready(timeout=timeout)
    finally:
        # the caches are written by the time the models are ready; the grace of serve():
        # a model that never finalizes would hold the image build for the exit timeout
        srv.stop(timeout=6.0)
    print(f"[rufus.launch.server] prebuild done: ready (warm) after {took:.0f} s",
          file=sys.stderr, flush=True)
    return 0


@dataclass(frozen=True)
class ServerSettings:
    """What the launcher reads from the environment itself (its --help lists it)."""

    models: str = env_var("RUFUS_MODELS", "rufus_llm", "default of --models")
    grpc_port: int = env_var("GRPC_PORT", 8001, "default of --grpc-port", minimum=1,
                             maximum=65535)
    http_port: int = env_var("HTTP_PORT", 8000, "default of --http-port", minimum=1,
                             maximum=65535)
    metrics_port: int = env_var("METRICS_PORT", 8002, "default of --metrics-port", minimum=1,
                                maximum=65535)
    traces: TracingSettings = group(TracingSettings)  # noqa: RUF009 - a default_factory field


# read by the models and the engine (their own declarations: docs/configuration.md)
MODEL_ENVIRONMENT = {
    ADMIN_KEY_ENV: "key for the restricted APIs (random per start when unset; SECURITY.md)",
    "VLLM_CPU_KVCACHE_SPACE": "vLLM CPU KV cache, GiB (default 2)",
    "RUFUS_ENGINE_ARGS, RUFUS_<MODEL>_ENGINE_ARGS": "JSON engine-arg overrides (models)",
    "RUFUS_MODEL_DIR, RUFUS_CACHE_DIR": "where the default model is (models)",
    "RUFUS_COMPILE_CACHE_DIR": "compiled kernels, keyed by CPU class (default "
                               "$RUFUS_CACHE_DIR/compile; rufus/machine/caches.py)",
    "RUFUS_WARMUP": "false: report ready without the warm-up requests (docs/serving.md)",
    "RUFUS_<SETTING>": "backend settings, e.g. RUFUS_MAX_OUTSTANDING_REQUESTS (models)",
    "LWS_GROUP_SIZE, LWS_WORKER_INDEX, ...": "multi-node unit (docs/architecture.md)",
}


def server_parser(description: str, epilog: str, models_help: str,
                  settings: ServerSettings | None = None) -> argparse.ArgumentParser:
    """The launcher's parser: the models and tritonserver's three ports (the stack adds the
    frontend's), with the environment it reads in its help."""
    s = read(ServerSettings) if settings is None else settings
    ap = argparse.ArgumentParser(description=description,
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=epilog)
    ap.add_argument("--models", default=s.models, help=models_help)
    ap.add_argument("--grpc-port", type=int, default=s.grpc_port)
    ap.add_argument("--http-port", type=int, default=s.http_port)
    ap.add_argument("--metrics-port", type=int, default=s.metrics_port)
    return ap


@exits_on_env_error
def main() -> None:
    ap = server_parser("Serve the model repository with tritonserver",
                       help_epilog(ServerSettings, extra=MODEL_ENVIRONMENT),
                          "comma-separated models to load (default: %(default)s)")
    ap.add_argument("--prebuild", action="store_true",
                    help="start on free ports, wait until every model is ready (so warm: "
                    "compiled, docs/serving.md 'What ready guarantees'), stop: fills the compile caches "
                    "of this CPU class, e.g. in an image build (docker/Dockerfile)")
    a = ap.parse_args()
    if a.prebuild:
        raise SystemExit(prebuild([m for m in a.models.split(",") if m]))
    srv = TritonServer(models=[m for m in a.models.split(",") if m], grpc_port=a.grpc_port,
                       http_port=a.http_port, metrics_port=a.metrics_port)
    print("[rufus.launch.server] " + " ".join(srv.command()), file=sys.stderr, flush=True)
    if not env_str(ADMIN_KEY_ENV):
        print(f"[rufus.launch.server] {ADMIN_KEY_ENV} unset: model control, uploads, stats and "
              "shared memory are closed to everyone this run (random key, not shown); set "
              f"{ADMIN_KEY_ENV} to use them (SECURITY.md)", file=sys.stderr, flush=True)
    raise SystemExit(serve(srv))


if __name__ == "__main__":
    main()
