"""Local "regions" behind a global HAProxy whose weights the orchestrator sets: the real run.

Each region is rufus/launch/fleet.py's fleet with one single-node unit (a real
tritonserver serving only rufus_llm, kept whole by its supervisor), its unit agent and its
own HAProxy ingress. In front of the regions' ingresses: a global HAProxy (weighted round
robin, rendered by proxy/orchestrator.py ``render_global``), and ``python -m
proxy.orchestrator`` reading the regions' agents, leader metrics and ingress stats and
setting the global weights through the runtime API. Every process is its own process group,
ended by pid; every port is chosen free at run time.

``drill`` is the scripted run of docs/benchmarks.md: a closed-loop load through the global
ingress all along; extra load sent straight to region a's ingress for a while (the shares
must follow it); then region b's tritonserver killed by pid (b must leave rotation quickly,
and nothing but b's in-flight streams may be lost; the bounds are the issue's). It records
the timeline (time, shares, reason) from the orchestrator's decision log and the global
HAProxy's weights, sampled several times a second.

    python scripts/regions.py up       # two regions + global ingress + orchestrator; Ctrl-C stops
    python scripts/regions.py drill    # the scripted run; JSON in bench-results/
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import math
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from lab.loadgen import SHOPPING_PROMPTS
from proxy.haproxy import HAProxy
from proxy.orchestrator import RuntimeAPI, render_global
from rufus.launch.children import stop_group
from rufus.launch.fleet import FLEET_ENGINE_ARGS, Fleet, _python
from rufus.launch.server import ROOT, free_port

log = logging.getLogger("lab.regions")
MODEL = "rufus_llm"


def say(msg: str) -> None:
    print(f"[regions] {msg}", file=sys.stderr, flush=True)


@dataclass
class LocalRegion:
    """One region: a one-unit fleet (unit + agent + region ingress)."""

    name: str
    fleet: Fleet

    @property
    def ingress(self) -> str:
        return self.fleet.url

    @property
    def stats_socket(self) -> Path:
        assert self.fleet.haproxy is not None
        return self.fleet.haproxy.stats_socket

    def tritonserver_pid(self) -> int:
        leader = self.fleet.units[0].unit.leader
        if leader is None or leader.proc is None:
            raise RuntimeError(f"region {self.name}: no tritonserver running")
        return leader.proc.pid

    def orchestrator_entry(self, baseline: float) -> dict[str, Any]:
        fu = self.fleet.units[0]
        return {"name": self.name, "baseline": baseline, "ingress": self.ingress,
                "agents": [f"http://127.0.0.1:{fu.ports.agent}"],
                "metrics": [f"http://127.0.0.1:{fu.unit.metrics_port}/metrics"],
                "ingress_stats": str(self.stats_socket), "ingress_backend": "units_lor",
                "slots_per_unit": int(self.fleet.engine_args.get("max_num_seqs", 8))}


@dataclass
class Regions:
    """N local regions, the global ingress and the orchestrator."""

    names: tuple[str, ...] = ("a", "b")
    log_dir: Path = Path(tempfile.gettempdir()) / "rufus-regions"
    interval_s: float = 5.0  # the orchestrator's default round
    engine_args: dict[str, Any] = field(default_factory=lambda: dict(FLEET_ENGINE_ARGS))
    regions: list[LocalRegion] = field(default_factory=list)
    global_port: int = 0
    metrics_port: int = 0
    haproxy: HAProxy | None = None
    orchestrator: subprocess.Popen[bytes] | None = None

    def __post_init__(self) -> None:
        self.log_dir = Path(self.log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.global_port = self.global_port or free_port()
        self.metrics_port = self.metrics_port or free_port()

    @property
    def url(self) -> str:
        return f"127.0.0.1:{self.global_port}"

    @property
    def decisions_log(self) -> Path:
        return self.log_dir / "decisions.jsonl"

    @property
    def global_socket(self) -> Path:
        return self.log_dir / "global" / "haproxy.sock"

    def start_units(self) -> None:
        """Each region's fleet (its unit starts compiling at once; returns at once). One
        core per region's engine, as separate hosts would have."""
        ncpu = os.cpu_count() or 1
        for i, name in enumerate(self.names):
            env = {"RUFUS_MODELS": MODEL,
                   "VLLM_CPU_OMP_THREADS_BIND": str(i % ncpu) if ncpu > 1 else "auto"}
            fleet = Fleet(n_units=1, nnodes=1, engine_args=dict(self.engine_args),
                          log_dir=self.log_dir / f"region-{name}", extra_env=env, first_core=i)
            self.regions.append(LocalRegion(name, fleet))
            fleet.start()

    def wait_ready(self, timeout: float = 960.0) -> float:
        t0 = time.monotonic()
        for r in self.regions:
            r.fleet.wait_ready(max(timeout - (time.monotonic() - t0), 1))
        return time.monotonic() - t0

    def start_global(self) -> None:
        baseline = 100 / len(self.regions)
        text = render_global([(r.name, r.ingress) for r in self.regions],
                             {r.name: round(baseline) for r in self.regions},
                             port=self.global_port, stats_socket=str(self.global_socket),
                             bind="127.0.0.1")
        # assigned before start(): a start that times out leaves a process stop() must end
        self.haproxy = HAProxy(text, self.global_socket.parent, self.log_dir / "global-haproxy.log")
        self.haproxy.start()

    def orchestrator_config(self) -> dict[str, Any]:
        baseline = 100 / len(self.regions)
        return {"runtime_api": f"unix:{self.global_socket}", "backend": "regions",
                "interval_s": self.interval_s, "model": MODEL,
                "regions": [r.orchestrator_entry(baseline) for r in self.regions]}

    def start_orchestrator(self) -> None:
        cfg = self.log_dir / "orchestrator.json"
        cfg.write_text(json.dumps(self.orchestrator_config(), indent=1))
        self.decisions_log.unlink(missing_ok=True)
        out = open(self.log_dir / "orchestrator.log", "ab")
        try:
            self.orchestrator = subprocess.Popen(
                [_python(), "-m", "proxy.orchestrator", "--config", str(cfg),
                 "--metrics-port", str(self.metrics_port), "--metrics-bind", "127.0.0.1",
                 "--decisions-log", str(self.decisions_log)],
                cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=out,
                stderr=subprocess.STDOUT, start_new_session=True)
        finally:
            out.close()
        t0 = time.monotonic()
        while not self.decisions_log.exists() or not self.decisions_log.read_text().strip():
            if self.orchestrator.poll() is not None:
                raise RuntimeError(f"orchestrator exited with {self.orchestrator.returncode} "
                                   f"(log {self.log_dir / 'orchestrator.log'})")
            if time.monotonic() - t0 > 30:
                raise TimeoutError("orchestrator wrote no decision within 30 s")
            time.sleep(0.2)

    def start(self) -> Regions:
        self.start_units()
        say(f"units starting (first start compiles: minutes on 2 cores); logs in {self.log_dir}")
        say(f"regions ready after {self.wait_ready():.0f} s")
        self.start_global()
        self.start_orchestrator()
        return self

    def describe(self) -> str:
        lines = [f"global ingress (gRPC, weighted by the orchestrator): {self.url}",
                 f"global HAProxy admin socket: {self.global_socket}",
                 f"orchestrator metrics: http://127.0.0.1:{self.metrics_port}/metrics; decisions: "
                 f"{self.decisions_log}; log: {self.log_dir / 'orchestrator.log'}"]
        for r in self.regions:
            lines.append(f"region {r.name}: ingress {r.ingress}, stats {r.stats_socket}, unit "
                         f"tritonserver pid {r.tritonserver_pid()}")
        return "\n".join(lines)

    def weights(self) -> dict[str, int]:
        return RuntimeAPI(str(self.global_socket)).weights("regions")

    def stop(self) -> None:
        """Orchestrator, global HAProxy, then every region (HAProxy, agent, unit), by pid."""
        if self.orchestrator is not None:
            stop_group(self.orchestrator, 10.0)
        if self.haproxy is not None:
            self.haproxy.stop()
        threads = [threading.Thread(target=r.fleet.stop, daemon=True) for r in self.regions]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)


# ---------------------------------------------------------------------------- load
@dataclass
class Request:
    start: float  # wall clock, for the timeline
    mono: float  # monotonic, for latency
    end: float = math.nan
    ttft: float = math.nan
    tokens: int = 0
    error: str = ""


class ClosedLoop:
    """``concurrency`` workers, each sending its next streamed request when the last ends,
    with the client's retry rule (before the first token only), until stopped."""

    def __init__(self, url: str, concurrency: int, max_tokens: int, retries: int, tag: str) -> None:
        self.url = url
        self.concurrency = concurrency
        self.max_tokens = max_tokens
        self.retries = retries
        self.tag = tag
        self.requests: list[Request] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> ClosedLoop:
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()),
                                        name=f"load-{self.tag}", daemon=True)
        self._thread.start()
        return self

    def stop(self, wait_s: float = 120.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(wait_s)

    async def _main(self) -> None:
        await asyncio.gather(*(self._worker(i) for i in range(self.concurrency)))

    async def _worker(self, w: int) -> None:
        from rufus.client import agenerate

        i = w
        while not self._stop.is_set():
            prompt = f"{SHOPPING_PROMPTS[i % len(SHOPPING_PROMPTS)]} ({self.tag} {i})"
            i += self.concurrency
            r = Request(time.time(), time.monotonic())
            self.requests.append(r)
            try:
                async for chunk in agenerate(
                        self.url, MODEL, messages=[{"role": "user", "content": prompt}],
                        sampling={"max_tokens": self.max_tokens, "temperature": 0.0,
                                  "ignore_eos": True},
                        flags={"return_num_output_tokens": True}, retries=self.retries,
                        timeout=180):
                    n = int(chunk.outputs["num_output_tokens"][0])
                    if n and not r.tokens:
                        r.ttft = chunk.t - r.mono
                    r.tokens += n
            except Exception as exc:  # noqa: BLE001 - counted and reported
                r.error = f"{type(exc).__name__}: {str(exc)[:200]}"
            r.end = time.time()

    def summary(self, t0: float) -> dict[str, Any]:
        done = [r for r in self.requests if not math.isnan(r.end)]
        ok = [r for r in done if not r.error]
        failed = [r for r in done if r.error]
        ttfts = sorted(r.ttft for r in ok if not math.isnan(r.ttft))

        def pct(q: float) -> float:
            return ttfts[min(len(ttfts) - 1, round(q * (len(ttfts) - 1)))] if ttfts else math.nan

        return {"url": self.url, "concurrency": self.concurrency, "max_tokens": self.max_tokens,
                "retries": self.retries, "requests": len(done), "ok": len(ok),
                "failed": len(failed),
                "failed_mid_stream": sum(1 for r in failed if r.tokens),
                "failed_before_first_token": sum(1 for r in failed if not r.tokens),
                "ttft_p50_s": pct(0.5), "ttft_p99_s": pct(0.99),
                "failures": [{"start_s": round(r.start - t0, 2), "end_s": round(r.end - t0, 2),
                              "tokens": r.tokens, "error": r.error} for r in failed]}


# ---------------------------------------------------------------------------- the drill
@dataclass
class Sample:
    t: float
    weights: dict[str, int]
    inflight: dict[str, int]  # streams each region's ingress has open to its unit


class Sampler:
    """The global weights and each region ingress's open streams, every ``period_s``."""

    def __init__(self, rg: Regions, period_s: float = 0.25) -> None:
        self.rg = rg
        self.period_s = period_s
        self.samples: list[Sample] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sampler", daemon=True)

    def start(self) -> Sampler:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            try:
                w = self.rg.weights()
            except (OSError, RuntimeError, ValueError):
                continue
            inflight = {}
            for r in self.rg.regions:
                try:
                    rows = RuntimeAPI(str(r.stats_socket)).servers("units_lor")
                    inflight[r.name] = sum(int(x.get("scur") or 0) for x in rows.values())
                except (OSError, RuntimeError, ValueError):
                    inflight[r.name] = -1
            self.samples.append(Sample(time.time(), w, inflight))


@dataclass
class DrillPlan:
    warm_s: float = 20.0
    load_s: float = 60.0
    cool_s: float = 40.0
    after_kill_s: float = 30.0
    recovery_s: float = 0.0  # keep watching this long for the killed unit's restart
    concurrency: int = 4
    extra_concurrency: int = 8
    max_tokens: int = 24
    retries: int = 5
    loaded: str = "a"
    killed: str = "b"


def read_decisions(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def run_drill(rg: Regions, plan: DrillPlan) -> dict[str, Any]:
    """The scripted run; returns events, decisions, samples and request outcomes."""
    loaded = next(r for r in rg.regions if r.name == plan.loaded)
    killed = next(r for r in rg.regions if r.name == plan.killed)
    t0 = time.time()
    mono0 = time.monotonic()
    events: list[dict[str, Any]] = []

    def event(what: str) -> None:
        events.append({"t": round(time.time() - t0, 2), "event": what})
        say(f"t={time.time() - t0:6.1f} s  {what}")

    sampler = Sampler(rg).start()
    base = ClosedLoop(rg.url, plan.concurrency, plan.max_tokens, plan.retries, "global").start()
    event(f"closed-loop load through the global ingress: {plan.concurrency} streams, "
          f"{plan.max_tokens} tokens, retries {plan.retries}")
    time.sleep(plan.warm_s)
    extra = ClosedLoop(loaded.ingress, plan.extra_concurrency, plan.max_tokens, plan.retries,
                       f"direct-{loaded.name}").start()
    t_load = time.time()
    event(f"load change: +{plan.extra_concurrency} streams straight to region "
          f"{loaded.name}'s ingress")
    time.sleep(plan.load_s)
    extra.stop()
    t_unload = time.time()
    event(f"extra load on region {loaded.name} stopped")
    time.sleep(plan.cool_s)
    before = sampler.samples[-1].inflight.get(killed.name, -1) if sampler.samples else -1
    pid = killed.tritonserver_pid()
    os.kill(pid, signal.SIGKILL)
    t_kill = time.time()
    event(f"SIGKILL region {killed.name}'s tritonserver (pid {pid}); {before} stream(s) in "
          f"flight on its ingress")
    time.sleep(plan.after_kill_s)
    if plan.recovery_s:
        sup = killed.fleet.units[0].sup
        deadline = time.monotonic() + plan.recovery_s
        while time.monotonic() < deadline:
            d = read_decisions(rg.decisions_log)
            if d and d[-1]["shares"][killed.name] >= round(100 / len(rg.regions)) - 3 \
                    and sup.ready.is_set():
                break
            time.sleep(1)
    base.stop()
    sampler.stop()
    event("load stopped")
    sup_events = [{"t": round(e.t - mono0, 2), "event": f"region {killed.name} supervisor: "
                   f"{e.kind} {e.detail}".strip()}
                  for e in killed.fleet.units[0].sup.events if e.t >= mono0]
    decisions = read_decisions(rg.decisions_log)
    return analyse(rg, plan, t0, t_load, t_unload, t_kill, before, events + sup_events, decisions,
                   sampler.samples, base.summary(t0), extra.summary(t0))


def analyse(rg: Regions, plan: DrillPlan, t0: float, t_load: float, t_unload: float,
            t_kill: float, inflight_at_kill: int, events: list[dict[str, Any]],
            decisions: list[dict[str, Any]], samples: list[Sample], base: dict[str, Any],
            extra: dict[str, Any]) -> dict[str, Any]:
    a, b = plan.loaded, plan.killed

    def first(pred: Any, items: list[Any]) -> Any:
        return next((x for x in items if pred(x)), None)

    shift = first(lambda d: d["t"] >= t_load and d["shares"][a] < d["before"][a], decisions)
    start_w = next((s.weights.get(a, 0) for s in reversed(samples) if s.t < t_load), 0)
    shift_w = first(lambda s: s.t >= t_load and s.weights.get(a, 0) < start_w, samples)
    out = first(lambda d: d["t"] >= t_kill and d["shares"][b] == 0, decisions)
    out_w = first(lambda s: s.t >= t_kill and s.weights.get(b, 1) == 0, samples)
    low = min((d["shares"][a] for d in decisions if t_load <= d["t"] <= t_unload), default=None)
    back = first(lambda d: d["t"] >= t_kill and d["before"][b] == 0 and d["shares"][b] > 0,
                 decisions)
    changes = [{"t": round(d["t"] - t0, 2), "shares": d["shares"],
                "reasons": {k: v for k, v in d["reasons"].items() if d["shares"][k] != d["before"][k]}}
               for d in decisions if d["changed"] and d["t"] >= t0]
    return {
        "date": time.strftime("%Y-%m-%d %H:%M", time.localtime(t0)),
        "plan": asdict(plan), "interval_s": rg.interval_s,
        "engine_args": rg.engine_args,
        "load_change_at_s": round(t_load - t0, 2), "load_removed_at_s": round(t_unload - t0, 2),
        "kill_at_s": round(t_kill - t0, 2), "inflight_on_killed_at_kill": inflight_at_kill,
        "shift_decision_after_s": None if shift is None else round(shift["t"] - t_load, 2),
        "shift_weight_after_s": None if shift_w is None else round(shift_w.t - t_load, 2),
        "loaded_share_low": low,
        "out_decision_after_s": None if out is None else round(out["t"] - t_kill, 2),
        "out_weight_after_s": None if out_w is None else round(out_w.t - t_kill, 2),
        "back_in_after_kill_s": None if back is None else round(back["t"] - t_kill, 2),
        "events": sorted(events, key=lambda e: e["t"]), "changes": changes,
        "global_load": base, "direct_load": extra,
        "samples": [{"t": round(s.t - t0, 2), "weights": s.weights, "inflight": s.inflight}
                    for s in samples],
    }


def markdown(res: dict[str, Any]) -> str:
    """Timeline and outcome as a docs/benchmarks.md section body."""
    p = res["plan"]
    g, x = res["global_load"], res["direct_load"]
    rows = [(e["t"], "", e["event"]) for e in res["events"]]
    for c in res["changes"]:
        shares = " / ".join(f"{k} {v}" for k, v in c["shares"].items())
        rows.append((c["t"], shares, "; ".join(f"{k}: {v}" for k, v in c["reasons"].items())))
    rows.sort(key=lambda r: r[0])
    out = ["| t (s) | shares | what happened / orchestrator's reason |", "|---|---|---|"]
    out += [f"| {t:.1f} | {s} | {w} |" for t, s, w in rows]
    out += ["",
            f"- Load change at {res['load_change_at_s']:.1f} s: first shed decision "
            f"{res['shift_decision_after_s']} s later, applied in the global HAProxy "
            f"{res['shift_weight_after_s']} s later (sampled every 0.25 s); region "
            f"{p['loaded']}'s share went down to {res['loaded_share_low']}.",
            f"- Kill at {res['kill_at_s']:.1f} s ({res['inflight_on_killed_at_kill']} stream(s) in "
            f"flight on region {p['killed']}): fail-out decision {res['out_decision_after_s']} s "
            f"later, weight 0 in the global HAProxy {res['out_weight_after_s']} s after the kill"
            + (f"; back in rotation {res['back_in_after_kill_s']} s after the kill."
               if res["back_in_after_kill_s"] is not None else "."),
            f"- Global load ({g['concurrency']} streams, {g['max_tokens']} tokens, retries "
            f"{g['retries']}): {g['requests']} requests, {g['ok']} served, {g['failed']} failed "
            f"({g['failed_mid_stream']} mid-stream, {g['failed_before_first_token']} before the "
            f"first token); TTFT p50 {g['ttft_p50_s']:.2f} s, p99 {g['ttft_p99_s']:.2f} s.",
            f"- Extra load straight to region {p['loaded']} ({x['concurrency']} streams): "
            f"{x['requests']} requests, {x['ok']} served, {x['failed']} failed; TTFT p50 "
            f"{x['ttft_p50_s']:.2f} s, p99 {x['ttft_p99_s']:.2f} s."]
    for f in g["failures"]:
        out.append(f"  - failed request started {f['start_s']} s, ended {f['end_s']} s after "
                   f"{f['tokens']} tokens: {f['error']}")
    return "\n".join(out)


# ---------------------------------------------------------------------------- CLI
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m lab.regions", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Local regions (one unit + agent + HAProxy ingress each) behind a global "
                    "HAProxy whose weights python -m proxy.orchestrator sets.",
        epilog="commands:\n  up     start everything, print where it listens; Ctrl-C stops all\n"
               "  drill  the scripted run: load change on one region, then kill another's "
               "tritonserver\n\nEvery process is ended by pid on exit. environment: RUFUS_MODELS "
               "is set to rufus_llm for the units (the units read the serving variables of "
               "docs/architecture.md)")
    ap.add_argument("command", nargs="?", default="up", choices=["up", "drill"])
    ap.add_argument("--regions", default="a,b", help="region names (default %(default)s)")
    ap.add_argument("--interval", type=float, default=5.0,
                    help="orchestrator round, seconds (default %(default)s)")
    ap.add_argument("--log-dir", default=os.path.join(tempfile.gettempdir(), "rufus-regions"))
    ap.add_argument("--engine-args", default="", help="JSON engine-arg overrides for every unit")
    d = ap.add_argument_group("drill")
    plan = DrillPlan()
    d.add_argument("--warm", type=float, default=plan.warm_s)
    d.add_argument("--load", type=float, default=plan.load_s, help="seconds of extra load")
    d.add_argument("--cool", type=float, default=plan.cool_s)
    d.add_argument("--after-kill", type=float, default=plan.after_kill_s)
    d.add_argument("--recovery", type=float, default=plan.recovery_s,
                   help="also wait up to this long for the killed unit's restart and return")
    d.add_argument("--concurrency", type=int, default=plan.concurrency)
    d.add_argument("--extra-concurrency", type=int, default=plan.extra_concurrency)
    d.add_argument("--max-tokens", type=int, default=plan.max_tokens)
    d.add_argument("--out", default="bench-results/regions-drill.json")
    a = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    names = tuple(n for n in a.regions.split(",") if n)
    if len(names) < 2:
        ap.error("--regions: at least two")
    rg = Regions(names=names, log_dir=Path(a.log_dir), interval_s=a.interval)
    if a.engine_args:
        rg.engine_args.update(json.loads(a.engine_args))
    stop = threading.Event()

    def on_signal(*_: Any) -> None:
        if a.command == "up":
            stop.set()
        else:
            raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_signal)
    try:
        rg.start()
        say(rg.describe())
        if a.command == "up":
            signal.signal(signal.SIGINT, on_signal)
            last: dict[str, int] = {}
            while not stop.wait(1.0):
                w = rg.weights()
                if w != last:
                    say(f"global weights {w}")
                    last = w
            return 0
        res = run_drill(rg, DrillPlan(
            warm_s=a.warm, load_s=a.load, cool_s=a.cool, after_kill_s=a.after_kill,
            recovery_s=a.recovery, concurrency=a.concurrency,
            extra_concurrency=a.extra_concurrency, max_tokens=a.max_tokens,
            loaded=names[0], killed=names[1]))
    finally:
        say("stopping orchestrator, global HAProxy and regions")
        rg.stop()
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(res, indent=1))
    print(markdown(res))
    say(f"results in {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
