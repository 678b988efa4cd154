"""Multi-region traffic orchestrator: each region's share of global traffic, set on a real HAProxy.

Why a process of its own: the global ingress (HAProxy, weighted round robin over the
regions' own ingresses) balances requests, but it cannot know that a region is slow, full
or has lost its units: that is in the regions' monitoring. This process reads what an
operator's monitoring would read, every ``--interval`` seconds:

- each unit agent (proxy/agent.py): ``GET /health`` (is the unit whole) and ``GET /load``
  (requests outstanding);
- each unit leader's Prometheus endpoint: the ``rufus_time_to_first_token_seconds``
  histogram, differenced between rounds, so p50/p99 are over the last window only;
- optionally the region ingress's HAProxy stats (admin socket): is the ingress reachable,
  and, without agents, which servers are UP and how many streams they carry;

decides the shares with the pure policy in proxy/orchestrator_policy.py (hysteresis,
bounded steps, fail-out at once, gradual return, SLA shedding), and applies them with the
global HAProxy's runtime API, ``set weight <backend>/<server> <share>``. It also serves its
own Prometheus metrics and logs one line per decision that changed something, with the
reason. ``--dry-run`` prints the decisions and touches nothing.

    python -m proxy.orchestrator --print-example-config > regions.json
    python -m proxy.orchestrator --config regions.json --dry-run
    python -m proxy.orchestrator --config regions.json --interval 5 --metrics-port 9300
    python -m proxy.orchestrator --config regions.json --render-global-config  # the global ingress

This module is the process: a round (:class:`Orchestrator`), its metrics and the CLI. By
job: the configuration is in proxy/orchestrator_config.py, the reading of the regions'
monitoring in proxy/orchestrator_signals.py, the global ingress's configuration and
runtime API in proxy/global_ingress.py; their names stay importable here.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import threading
import time
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from proxy.global_ingress import RuntimeAPI, render_global
from proxy.orchestrator_config import EXAMPLE_CONFIG, OrchestratorConfig, RegionConfig
from proxy.orchestrator_policy import Decision, PolicyState, RegionSignals, decide, initial_state
from proxy.orchestrator_signals import (
    TTFT_METRIC,
    Collector,
    UnitReading,
    histogram_delta,
    parse_histogram,
)

__all__ = [  # the orchestrator's API, wherever its piece lives
    "EXAMPLE_CONFIG", "TTFT_METRIC", "Collector", "Metrics", "Orchestrator", "OrchestratorConfig",
    "RegionConfig", "RuntimeAPI", "UnitReading", "histogram_delta", "main", "parse_histogram",
    "render_global",
]

log = logging.getLogger("proxy.orchestrator")


# ----------------------------------------------------------------------- metrics
class Metrics:
    """The orchestrator's own Prometheus series (``rufus_orchestrator_*``)."""

    def __init__(self, regions: Sequence[str], dry_run: bool) -> None:
        self.lock = threading.Lock()
        self.regions = list(regions)
        self.dry_run = dry_run
        self.shares: dict[str, int] = {}
        self.decisions: dict[tuple[str, str], int] = {}
        self.rounds = 0
        self.apply_errors = 0
        self.last_round = 0.0
        self.signals: list[RegionSignals] = []
        self.samples: dict[str, float] = {}

    def update(self, signals: list[RegionSignals], d: Decision, samples: dict[str, float],
               apply_error: bool) -> None:
        with self.lock:
            self.rounds += 1
            self.last_round = time.time()
            self.shares = dict(d.shares)
            self.signals = list(signals)
            self.samples = dict(samples)
            self.apply_errors += int(apply_error)
            for c in d.changes():
                key = (c.region, c.kind)
                self.decisions[key] = self.decisions.get(key, 0) + 1

    def render(self) -> str:
        with self.lock:
            lines = [
                "# HELP rufus_orchestrator_share_percent Each region's share of global traffic "
                "(the global ingress weight).",
                "# TYPE rufus_orchestrator_share_percent gauge",
                *(f'rufus_orchestrator_share_percent{{region="{n}"}} {v}' for n, v in self.shares.items()),
                "# HELP rufus_orchestrator_decisions_total Share changes, by region and kind of "
                "reason (fail_out, shed_ttft, shed_load, receive, return, restore, donate).",
                "# TYPE rufus_orchestrator_decisions_total counter",
                *(f'rufus_orchestrator_decisions_total{{region="{r}",kind="{k}"}} {v}'
                  for (r, k), v in sorted(self.decisions.items())),
                "# HELP rufus_orchestrator_rounds_total Decision rounds run.",
                "# TYPE rufus_orchestrator_rounds_total counter",
                f"rufus_orchestrator_rounds_total {self.rounds}",
                "# HELP rufus_orchestrator_apply_errors_total Rounds whose weights could not be set.",
                "# TYPE rufus_orchestrator_apply_errors_total counter",
                f"rufus_orchestrator_apply_errors_total {self.apply_errors}",
                "# HELP rufus_orchestrator_last_round_timestamp_seconds When the last round ended.",
                "# TYPE rufus_orchestrator_last_round_timestamp_seconds gauge",
                f"rufus_orchestrator_last_round_timestamp_seconds {self.last_round:.3f}",
                "# HELP rufus_orchestrator_dry_run 1 if decisions are printed, not applied.",
                "# TYPE rufus_orchestrator_dry_run gauge",
                f"rufus_orchestrator_dry_run {int(self.dry_run)}",
            ]
            series: list[tuple[str, str, Callable[[RegionSignals], float | None]]] = [
                ("region_up", "1 if the region is reachable and has a healthy unit.",
                 lambda s: float(s.up)),
                ("region_healthy_units", "Healthy units.", lambda s: float(s.healthy_units)),
                ("region_units", "Units known.", lambda s: float(s.total_units)),
                ("region_load_ratio", "Outstanding requests / (healthy units x slots).",
                 lambda s: s.load),
                ("region_ttft_p50_seconds", "First-token p50 over the last window.",
                 lambda s: s.ttft_p50_s),
                ("region_ttft_p99_seconds", "First-token p99 over the last window.",
                 lambda s: s.ttft_p99_s),
            ]
            for name, help_, get in series:
                lines += [f"# HELP rufus_orchestrator_{name} {help_}",
                          f"# TYPE rufus_orchestrator_{name} gauge"]
                for s in self.signals:
                    v = get(s)
                    if v is not None:
                        lines.append(f'rufus_orchestrator_{name}{{region="{s.name}"}} {v:.6g}')
            lines += ["# HELP rufus_orchestrator_region_ttft_samples First-token observations "
                      "in the last window.", "# TYPE rufus_orchestrator_region_ttft_samples gauge"]
            lines += [f'rufus_orchestrator_region_ttft_samples{{region="{n}"}} {v:g}'
                      for n, v in self.samples.items()]
        return "\n".join(lines) + "\n"

    def serve(self, port: int, bind: str) -> ThreadingHTTPServer:
        metrics = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # http.server naming
                ok = self.path.split("?", 1)[0] == "/metrics"
                data = metrics.render().encode() if ok else b"try /metrics\n"
                self.send_response(200 if ok else 404)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, fmt: str, *args: Any) -> None:
                log.debug(fmt, *args)

        class HTTP(ThreadingHTTPServer):
            daemon_threads = True

        srv = HTTP((bind, port), Handler)
        threading.Thread(target=srv.serve_forever, name="orchestrator-metrics", daemon=True).start()
        return srv


# ----------------------------------------------------------------------- the orchestrator
class Orchestrator:
    """Rounds of read -> decide -> apply; every round recorded, changes logged."""

    def __init__(self, cfg: OrchestratorConfig, *, dry_run: bool = False,
                 collector: Collector | None = None,
                 admin: Callable[[str], RuntimeAPI] = RuntimeAPI,
                 decisions_log: Path | None = None, out: Any = None) -> None:
        if not dry_run and not cfg.runtime_api:
            raise ValueError("runtime_api: the global ingress's admin socket is required "
                             "(or run with --dry-run)")
        self.cfg = cfg
        self.dry_run = dry_run
        self.collector = collector or Collector(cfg, admin=admin)
        self.admin = admin
        self.metrics = Metrics([r.name for r in cfg.regions], dry_run)
        self.decisions_log = decisions_log
        self.out = out if out is not None else sys.stdout
        self.state = self._initial_state()
        self.metrics.shares = dict(self.state.shares)

    def _initial_state(self) -> PolicyState:
        """Continue from the weights the global ingress has now (an orchestrator restart in
        the middle of an incident must not snap back to baseline), else the baselines."""
        baselines = {r.name: r.baseline for r in self.cfg.regions}
        current: dict[str, int] | None = None
        if self.cfg.runtime_api:
            try:
                w = self.admin(self.cfg.runtime_api).weights(self.cfg.backend)
                current = {r.name: w[r.server_name] for r in self.cfg.regions if r.server_name in w}
            except (OSError, RuntimeError, ValueError, KeyError) as exc:
                log.warning("cannot read the global ingress weights (%s); starting from the "
                            "baselines", exc)
        state = initial_state(baselines, current)
        log.info("starting shares %s (%s)", state.shares,
                 "from the global ingress" if current and len(current) == len(baselines)
                 and sum(current.values()) else "baselines")
        return state

    def apply(self, shares: Mapping[str, int]) -> str:
        """Set every region's weight (all of them, every round: a restarted HAProxy or a
        hand edit is put right within one interval). Returns '' or the errors."""
        api = self.admin(self.cfg.runtime_api)
        errors = []
        for r in self.cfg.regions:
            try:
                api.set_weight(self.cfg.backend, r.server_name, int(shares[r.name]))
            except (OSError, RuntimeError) as exc:
                errors.append(f"{r.name}: {type(exc).__name__}: {exc}")
        return "; ".join(errors)

    def round(self) -> Decision:
        signals = self.collector.collect()
        d = decide(signals, self.state, self.cfg.policy)
        self.state = d.state
        error = "" if self.dry_run else self.apply(d.shares)
        if d.changed:
            level = logging.WARNING if any(c.kind == "fail_out" for c in d.changes()) else logging.INFO
            log.log(level, "shares %s -> %s%s: %s", _fmt(d.before), _fmt(d.shares),
                    " (dry run, not applied)" if self.dry_run else "", d.summary())
        else:
            log.debug("round %d: %s", d.state.rounds, d.summary())
        if error:
            log.error("could not set weights on %s: %s (will retry next round)",
                      self.cfg.runtime_api, error)
        if self.dry_run:
            print(f"{time.strftime('%H:%M:%S')} round {d.state.rounds} shares {_fmt(d.shares)}"
                  f"{' CHANGED' if d.changed else ''}: {d.summary()}", file=self.out, flush=True)
        self.metrics.update(signals, d, self.collector.ttft_samples, bool(error))
        if self.decisions_log is not None:
            rec = {"t": round(time.time(), 3), "round": d.state.rounds, "before": d.before,
                   "shares": d.shares, "changed": d.changed, "kinds": d.kinds,
                   "reasons": d.reasons, "signals": [asdict(s) for s in signals],
                   "applied": not self.dry_run and not error, "apply_error": error}
            with open(self.decisions_log, "a") as f:
                f.write(json.dumps(rec) + "\n")
        return d

    def run(self, stop: threading.Event, rounds: int = 0) -> None:
        n = 0
        while not stop.is_set():
            t0 = time.monotonic()
            try:
                self.round()
            except Exception:  # the loop must survive one bad round
                log.exception("round failed; shares unchanged")
            n += 1
            if rounds and n >= rounds:
                return
            stop.wait(max(self.cfg.interval_s - (time.monotonic() - t0), 0.05))

    def close(self) -> None:
        self.collector.close()


def _fmt(shares: Mapping[str, int]) -> str:
    return " ".join(f"{k}={v}" for k, v in shares.items())


# ----------------------------------------------------------------------- CLI
EPILOG = """configuration (JSON, or TOML when the file ends in .toml; --print-example-config):
  runtime_api         global ingress admin socket: /path, unix:/path, host:port
  backend             its backend whose server weights are set (default regions)
  interval_s          seconds between rounds (default 5; --interval wins)
  regions[]           name, baseline (operator share), agents (unit agent URLs),
                      metrics (leader Prometheus URLs), ingress_stats (region HAProxy admin
                      socket), ingress_backend, ingress (gRPC host:port, for
                      --render-global-config), server (global server name), slots_per_unit
  policy              thresholds and steps (proxy/orchestrator_policy.py PolicyConfig)

Logs: one line per round that changed a share (WARNING for a fail-out), with the reason;
errors setting weights are retried next round. Metrics: rufus_orchestrator_* on
--metrics-port. environment: none read."""


def cli_parser() -> argparse.ArgumentParser:
    """``python -m proxy.orchestrator``'s options."""
    ap = argparse.ArgumentParser(
        prog="python -m proxy.orchestrator", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Multi-region traffic orchestrator: reads each region's health, load and "
                    "first-token latency, decides its share of global traffic, sets the global "
                    "HAProxy's weights through its runtime API.", epilog=EPILOG)
    ap.add_argument("--config", type=Path, help="regions and policy (JSON or .toml)")
    ap.add_argument("--dry-run", action="store_true",
                    help="print each round's decision; set no weight")
    ap.add_argument("--interval", type=float, default=None,
                    help="seconds between rounds (default: the config's interval_s, 5)")
    ap.add_argument("--runtime-api", default=None,
                    help="global ingress admin socket (overrides the config's runtime_api)")
    ap.add_argument("--metrics-port", type=int, default=9300,
                    help="Prometheus /metrics of the orchestrator (0: off; default %(default)s)")
    ap.add_argument("--metrics-bind", default="0.0.0.0")
    ap.add_argument("--decisions-log", type=Path, default=None,
                    help="append every round (signals, shares, reasons) as a JSON line")
    ap.add_argument("--rounds", type=int, default=0, help="stop after N rounds (0: run until SIGTERM)")
    ap.add_argument("--once", action="store_true", help="one round, then exit (same as --rounds 1)")
    ap.add_argument("--print-example-config", action="store_true",
                    help="print an example JSON config and exit")
    ap.add_argument("--render-global-config", action="store_true",
                    help="print the global ingress's haproxy.cfg for the config's regions and exit")
    ap.add_argument("--global-port", type=int, default=8001,
                    help="gRPC port of the rendered global ingress (default %(default)s)")
    ap.add_argument("--no-l7-retry", action="store_true",
                    help="render the global ingress without retrying a dying region's 503s on "
                         "another region (for clients that keep one stream open for many requests)")
    ap.add_argument("--log-level", default="INFO")
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = cli_parser()
    a = ap.parse_args(argv)
    logging.basicConfig(level=a.log_level.upper(),
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if a.print_example_config:
        print(json.dumps(EXAMPLE_CONFIG, indent=1))
        return 0
    if a.config is None:
        ap.error("--config is required (see --print-example-config)")
    try:
        cfg = OrchestratorConfig.load(a.config)
    except (OSError, ValueError, TypeError, tomllib.TOMLDecodeError) as exc:
        print(f"bad config {a.config}: {exc}", file=sys.stderr)
        return 2
    if a.interval is not None or a.runtime_api is not None:
        d = asdict(cfg)
        d["interval_s"] = a.interval if a.interval is not None else cfg.interval_s
        d["runtime_api"] = a.runtime_api if a.runtime_api is not None else cfg.runtime_api
        d["regions"] = [{k: list(v) if isinstance(v, tuple) else v for k, v in r.items()}
                        for r in d["regions"]]
        try:
            cfg = OrchestratorConfig.from_dict(d)
        except ValueError as exc:
            print(f"bad option: {exc}", file=sys.stderr)
            return 2
    if a.render_global_config:
        missing = [r.name for r in cfg.regions if not r.ingress]
        if missing:
            print(f"regions {missing} have no 'ingress' (host:port) to render", file=sys.stderr)
            return 2
        shares = initial_state({r.name: r.baseline for r in cfg.regions}).shares
        print(render_global([(r.server_name, r.ingress) for r in cfg.regions],
                            {r.server_name: shares[r.name] for r in cfg.regions},
                            port=a.global_port, stats_socket=cfg.runtime_api.removeprefix("unix:")
                            or "/run/haproxy/global.sock", backend=cfg.backend,
                            l7_retry=not a.no_l7_retry), end="")
        return 0
    try:
        orch = Orchestrator(cfg, dry_run=a.dry_run, decisions_log=a.decisions_log)
    except ValueError as exc:
        print(f"bad config {a.config}: {exc}", file=sys.stderr)
        return 2
    srv = None
    if a.metrics_port:
        try:
            srv = orch.metrics.serve(a.metrics_port, a.metrics_bind)
        except OSError as exc:
            log.error("cannot listen on :%d for metrics: %s", a.metrics_port, exc)
            return 1
    stop = threading.Event()
    # set from another thread: a handler calling stop.set() deadlocks when the signal lands
    # while this (main) thread holds the Event's lock inside stop.wait()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: threading.Thread(target=stop.set, daemon=True).start())
    log.info("orchestrating %d region(s) %s every %.1f s%s; global ingress %s backend %s; "
             "metrics %s", len(cfg.regions), [r.name for r in cfg.regions], cfg.interval_s,
             " (DRY RUN: nothing applied)" if a.dry_run else "", cfg.runtime_api or "-",
             cfg.backend, f":{a.metrics_port}/metrics" if srv else "off")
    try:
        orch.run(stop, rounds=1 if a.once else a.rounds)
    finally:
        orch.close()
        if srv is not None:
            srv.shutdown()
            srv.server_close()
    log.info("orchestrator stopped after %d round(s); shares %s", orch.state.rounds,
             _fmt(orch.state.shares))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
