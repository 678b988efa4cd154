"""The multi-region traffic orchestrator: its policy (hysteresis, bounded steps, fail-out and
gradual return, SLA shedding, shares that sum to 100), the process against fake agents and
a fake HAProxy runtime socket, and the seeded Prime Day simulation."""

from __future__ import annotations

import itertools
import json
import logging
import random
import shutil
import socketserver
import threading
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from proxy.orchestrator import (
    Collector,
    Orchestrator,
    OrchestratorConfig,
    RuntimeAPI,
    histogram_delta,
    main,
    parse_histogram,
    render_global,
)
from proxy.orchestrator_policy import (
    PolicyConfig,
    RegionSignals,
    apportion,
    decide,
    initial_state,
    ttft_quantile,
)
from tests.fakes import serve_http

BASE = {"a": 40.0, "b": 35.0, "c": 25.0}
CFG = PolicyConfig()


def sig(name: str, **kw: Any) -> RegionSignals:
    d: dict[str, Any] = {"name": name, "baseline": BASE[name], "healthy_units": 10,
                         "total_units": 10, "load": 0.5, "ttft_p99_s": 0.3}
    d.update(kw)
    return RegionSignals(**d)


def calm() -> dict[str, RegionSignals]:
    return {n: sig(n) for n in BASE}


class Rounds:
    """Feeds rounds of signals to the policy, keeping its state, recording decisions."""

    def __init__(self, cfg: PolicyConfig = CFG) -> None:
        self.cfg = cfg
        self.state = initial_state(BASE)
        self.decisions: list[Any] = []

    def run(self, signals: dict[str, RegionSignals], n: int = 1) -> dict[str, int]:
        for _ in range(n):
            d = decide(list(signals.values()), self.state, self.cfg)
            self.state = d.state
            self.decisions.append(d)
        return self.state.shares


# ----------------------------------------------------------------------- policy
def test_starts_at_baseline_and_holds_when_calm():
    r = Rounds()
    assert r.run(calm(), 5) == {"a": 40, "b": 35, "c": 25}
    d = r.decisions[-1]
    assert not d.changed and set(d.reasons) == set(BASE)
    assert all(d.reasons[n] for n in BASE) and all(k == "hold" for k in d.kinds.values())


def test_one_hot_round_moves_nothing_and_noise_never_moves():
    """Hysteresis: a signal must hold persist_rounds rounds; alternating noise never does."""
    r = Rounds()
    hot = {**calm(), "c": sig("c", ttft_p99_s=1.2, load=0.9)}
    assert r.run(hot) == {"a": 40, "b": 35, "c": 25}
    assert r.decisions[-1].kinds["c"] == "hold_unconfirmed"
    assert "1/2 rounds" in r.decisions[-1].reasons["c"]
    for _ in range(10):
        r.run(calm())
        r.run(hot)
    assert r.state.shares == {"a": 40, "b": 35, "c": 25}


def test_persistent_sla_breach_sheds_in_bounded_steps_to_regions_with_headroom():
    r = Rounds()
    hot = {**calm(), "c": sig("c", ttft_p99_s=1.2, load=0.9)}
    r.run(hot, 2)
    d = r.decisions[-1]
    assert d.shares["c"] == 15 and d.kinds["c"] == "shed_ttft"
    assert "ttft p99 1.20 s > SLA 1.00 s" in d.reasons["c"] and "for 2 rounds" in d.reasons["c"]
    assert d.kinds["a"] == d.kinds["b"] == "receive" and "from c" in d.reasons["a"]
    prev = dict(d.shares)
    for _ in range(5):
        now = r.run(hot)
        assert all(abs(now[n] - prev[n]) <= CFG.max_step for n in BASE)  # bounded steps
        assert sum(now.values()) == 100
        prev = now
    assert now["c"] == 0 and "share already 0" in r.decisions[-1].reasons["c"]


def test_a_p99_over_too_few_first_tokens_moves_nothing():
    """A p99 over five first tokens is the slowest of five: one slow request, not a signal."""
    r = Rounds()
    r.run({**calm(), "c": sig("c", ttft_p99_s=3.0, ttft_samples=5, load=0.4)}, 3)
    assert r.state.shares == {"a": 40, "b": 35, "c": 25}
    r.run({**calm(), "c": sig("c", ttft_p99_s=3.0, ttft_samples=50, load=0.4)})
    assert r.state.shares["c"] == 15


def test_far_beyond_the_threshold_acts_at_once():
    r = Rounds()
    r.run({**calm(), "c": sig("c", ttft_p99_s=3.0, load=1.5)})
    d = r.decisions[-1]
    assert d.shares["c"] == 15 and "at once" in d.reasons["c"]


def test_load_alone_sheds_too():
    r = Rounds()
    r.run({**calm(), "a": sig("a", load=0.95, ttft_p99_s=0.4)}, 2)
    d = r.decisions[-1]
    assert d.kinds["a"] == "shed_load" and d.shares["a"] == 30 and "load 0.95 > 0.85" in d.reasons["a"]


def test_no_headroom_anywhere_holds_instead_of_spreading_the_damage():
    r = Rounds()
    full = {n: sig(n, load=0.8, ttft_p99_s=0.9) for n in BASE}  # busy, not hot, no room
    full["c"] = sig("c", ttft_p99_s=1.5, load=1.1)
    r.run(full, 3)
    d = r.decisions[-1]
    assert d.shares == {"a": 40, "b": 35, "c": 25}
    assert d.kinds["c"] == "hold_no_headroom" and "no region has headroom" in d.reasons["c"]


def test_a_receiver_takes_only_what_keeps_it_inside_the_band():
    """No ping-pong: a busy receiver is not pushed to the edge where it would shed back."""
    r = Rounds()
    sigs = {"a": sig("a", load=0.7, ttft_p99_s=0.3), "b": sig("b", load=0.3, ttft_p99_s=0.3),
            "c": sig("c", ttft_p99_s=1.5, load=1.1)}
    r.run(sigs, 2)
    # a at 0.70 with 40 points may grow to the band's middle (0.725): 40 * 0.025 / 0.7 -> 1
    for d in r.decisions:
        assert d.shares["a"] - d.before["a"] <= 1 and d.shares["b"] > d.before["b"]


def test_unhealthy_region_fails_out_at_once_and_comes_back_gradually():
    r = Rounds()
    r.run(calm(), 2)
    down = {**calm(), "b": sig("b", healthy_units=0, load=None, ttft_p99_s=None,
                               detail="leader: unreachable")}
    r.run(down)
    d = r.decisions[-1]
    assert d.shares["b"] == 0 and d.kinds["b"] == "fail_out"
    assert "no healthy unit (0/10): leader: unreachable" in d.reasons["b"]
    assert d.shares["a"] + d.shares["c"] == 100 and d.kinds["a"] == "receive"
    assert "b (fail-out)" in d.reasons["a"]
    r.run(down, 3)
    assert r.decisions[-1].kinds["b"] == "out"
    back = {**calm(), "b": sig("b", load=0.0, ttft_p99_s=None)}
    waited = 0
    while r.run(back)["b"] == 0:
        waited += 1
        assert r.decisions[-1].kinds["b"] == "waiting_return"
    assert waited == CFG.return_after_rounds
    seen = [r.state.shares["b"]]
    while r.state.shares["b"] < 35:
        r.run(back)
        seen.append(r.state.shares["b"])
        assert r.decisions[-1].kinds["b"] == "return"
    assert all(b - a <= CFG.return_step for a, b in itertools.pairwise(seen))
    assert r.state.shares == {"a": 40, "b": 35, "c": 25}
    assert len(seen) == 35 // CFG.return_step


def test_unreachable_region_fails_out_with_its_reason():
    r = Rounds()
    r.run({**calm(), "a": sig("a", reachable=False, detail="ingress stats: refused")})
    d = r.decisions[-1]
    assert d.shares["a"] == 0 and d.reasons["a"] == "fail-out: unreachable (ingress stats: refused)"
    assert "a 40->0 fail-out" in d.summary()


def test_cooled_region_takes_its_share_back_from_regions_above_baseline():
    r = Rounds()
    r.run({**calm(), "c": sig("c", ttft_p99_s=1.5, load=1.1)}, 4)
    assert r.state.shares["c"] < 25
    cool = {**calm(), "c": sig("c", load=0.2, ttft_p99_s=0.2)}
    r.run(cool)
    assert r.decisions[-1].kinds["c"] == "hold"  # cool 1 round: not yet
    r.run(cool, 5)
    assert r.state.shares == {"a": 40, "b": 35, "c": 25}
    assert any(d.kinds["c"] == "restore" for d in r.decisions)
    assert any(d.kinds["a"] == "donate" for d in r.decisions)


def test_in_the_band_a_region_below_baseline_holds():
    r = Rounds()
    r.run({**calm(), "c": sig("c", ttft_p99_s=1.5, load=1.1)}, 3)
    low = r.state.shares["c"]
    r.run({**calm(), "c": sig("c", load=0.7, ttft_p99_s=0.5)}, 5)  # between load_low and load_high
    assert r.state.shares["c"] == low and "until cool" in r.decisions[-1].reasons["c"]


def test_every_region_down_holds_the_last_shares():
    r = Rounds()
    r.run({n: sig(n, reachable=False) for n in BASE})
    d = r.decisions[-1]
    assert d.shares == {"a": 40, "b": 35, "c": 25} and d.kinds["a"] == "hold_all_down"


def test_shares_are_integers_summing_to_100_whatever_the_signals():
    rng = random.Random(5)
    r = Rounds()
    for _ in range(400):
        signals = {}
        for n in BASE:
            healthy = rng.choice([0, 3, 10, 10, 10])
            signals[n] = sig(n, healthy_units=healthy, reachable=rng.random() > 0.05,
                             load=rng.choice([None, rng.uniform(0, 1.6)]),
                             ttft_p99_s=rng.choice([None, rng.uniform(0.05, 3.0)]))
        shares = r.run(signals)
        assert sum(shares.values()) == 100 and all(isinstance(v, int) and v >= 0 for v in shares.values())
        d = r.decisions[-1]
        assert set(d.reasons) == set(BASE) and all(d.reasons.values())
        for n, s in signals.items():
            if not s.up and any(x.up for x in signals.values()):
                assert shares[n] == 0


def test_apportion_is_proportional_capped_and_deterministic():
    assert apportion(100, {"a": 40, "b": 35, "c": 25}) == {"a": 40, "b": 35, "c": 25}
    assert sum(apportion(100, {"a": 1, "b": 1, "c": 1}).values()) == 100
    assert apportion(10, {"a": 1, "b": 1}, {"a": 2}) == {"a": 2, "b": 8}
    assert apportion(10, {"a": 1, "b": 0}, {"a": 4}) == {"a": 4, "b": 0}


def test_policy_config_is_validated():
    with pytest.raises(ValueError, match="load_low < load_high"):
        PolicyConfig(load_low=0.9, load_high=0.8)
    with pytest.raises(ValueError, match="max_step"):
        PolicyConfig(max_step=0)


def test_ttft_quantile_interpolates_like_prometheus():
    buckets = [(0.1, 50.0), (0.5, 90.0), (1.0, 99.0), (float("inf"), 100.0)]
    assert ttft_quantile(buckets, 0.5) == pytest.approx(0.1)
    assert ttft_quantile(buckets, 0.7) == pytest.approx(0.3)
    assert ttft_quantile(buckets, 0.995) == pytest.approx(1.0)  # in +Inf: highest finite bound
    assert ttft_quantile([(0.1, 0.0), (float("inf"), 0.0)], 0.99) is None


# ----------------------------------------------------------------------- fakes for the process
def hist_text(counts: dict[str, int], model: str = "rufus_llm") -> str:
    """rufus_time_to_first_token_seconds buckets as the leader publishes them."""
    lines = ["# TYPE rufus_time_to_first_token_seconds histogram"]
    for le, c in counts.items():
        lines.append(f'rufus_time_to_first_token_seconds_bucket{{le="{le}",model="{model}",'
                     f'version="1"}} {c}')
    return "\n".join(lines) + "\n"


class FakeUnit:
    """One unit's agent (/health, /load) and its leader's /metrics on one HTTP port."""

    def __init__(self) -> None:
        self.healthy = True
        self.outstanding = 2.0
        self.hist = {"0.1": 0, "0.5": 0, "1.0": 0, "2.0": 0, "+Inf": 0}
        self.srv, self.url = serve_http(self._route)

    def _route(self, path: str) -> tuple[int, bytes]:
        if path == "/health":
            return (200 if self.healthy else 503), json.dumps(
                {"healthy": self.healthy, "failing": [] if self.healthy else [
                    {"node": "leader", "check": "server ready", "detail": "unreachable"}]}).encode()
        if path == "/load":
            return 200, json.dumps({"outstanding": self.outstanding}).encode()
        return 200, hist_text(self.hist).encode()

    def observe(self, slow: int, fast: int) -> None:
        """``fast`` first tokens under 0.1 s, ``slow`` between 1 and 2 s."""
        h = self.hist
        self.hist = {"0.1": h["0.1"] + fast, "0.5": h["0.5"] + fast, "1.0": h["1.0"] + fast,
                     "2.0": h["2.0"] + fast + slow, "+Inf": h["+Inf"] + fast + slow}

    def close(self) -> None:
        self.srv.shutdown()
        self.srv.server_close()


class FakeRuntime:
    """A unix socket answering like HAProxy's admin socket: ``show stat`` and ``set weight``."""

    def __init__(self, path: Path, backend: str, weights: dict[str, int]) -> None:
        self.path = path
        self.backend = backend
        self.weights = dict(weights)
        self.commands: list[str] = []
        rt = self

        class H(socketserver.StreamRequestHandler):
            def handle(self) -> None:
                cmd = self.rfile.readline().decode().strip()
                rt.commands.append(cmd)
                if cmd == "show stat":
                    rows = ["# pxname,svname,status,weight,uweight,scur,"]
                    rows += [f"{rt.backend},{s},UP,{w},{w},0," for s, w in rt.weights.items()]
                    rows.append(f"{rt.backend},BACKEND,UP,{sum(rt.weights.values())},0,0,")
                    self.wfile.write(("\n".join(rows) + "\n").encode())
                elif cmd.startswith("set weight "):
                    target, w = cmd.split()[2:4]
                    be, _, server = target.partition("/")
                    if be != rt.backend or server not in rt.weights:
                        self.wfile.write(b"No such server.\n")
                    else:
                        rt.weights[server] = int(w)
                        self.wfile.write(b"\n")
                else:
                    self.wfile.write(b"Unknown command.\n")

        class S(socketserver.ThreadingUnixStreamServer):
            daemon_threads = True

        self.srv = S(str(path), H)
        threading.Thread(target=self.srv.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.srv.shutdown()
        self.srv.server_close()


@pytest.fixture
def two_regions(tmp_path):
    units = {"a": FakeUnit(), "b": FakeUnit()}
    rt = FakeRuntime(tmp_path / "global.sock", "regions", {"a": 50, "b": 50})
    cfg = {"runtime_api": f"unix:{tmp_path / 'global.sock'}", "interval_s": 0.1,
           "regions": [{"name": n, "baseline": 50, "agents": [u.url], "metrics": [u.url + "/metrics"],
                        "slots_per_unit": 8} for n, u in units.items()],
           "policy": {"persist_rounds": 2, "return_after_rounds": 1, "jump_ttft": 3.0}}
    path = tmp_path / "regions.json"
    path.write_text(json.dumps(cfg))
    yield units, rt, path
    for u in units.values():
        u.close()
    rt.close()


# ----------------------------------------------------------------------- the process
def test_config_errors_name_the_entry():
    with pytest.raises(ValueError, match="regions: a non-empty list"):
        OrchestratorConfig.from_dict({"regions": []})
    with pytest.raises(ValueError, match=r"regions\[0\].baseline"):
        OrchestratorConfig.from_dict({"regions": [{"name": "a", "baseline": 0, "agents": ["x"]}]})
    with pytest.raises(ValueError, match=r"regions\[0\]: give its unit agents"):
        OrchestratorConfig.from_dict({"regions": [{"name": "a", "baseline": 1}]})
    with pytest.raises(ValueError, match="unknown config keys"):
        OrchestratorConfig.from_dict({"regions": [{"name": "a", "baseline": 1, "agents": ["x"]}],
                                      "polcy": {}})
    with pytest.raises(ValueError, match="load_low < load_high"):
        OrchestratorConfig.from_dict({"regions": [{"name": "a", "baseline": 1, "agents": ["x"]}],
                                      "policy": {"load_low": 0.9}})


def test_toml_config_is_read(tmp_path):
    p = tmp_path / "r.toml"
    p.write_text('runtime_api = "/run/g.sock"\n[[regions]]\nname = "a"\nbaseline = 60\n'
                 'agents = ["http://h:8090"]\n[[regions]]\nname = "b"\nbaseline = 40\n'
                 'ingress_stats = "h:9999"\n[policy]\nmax_step = 5\n')
    cfg = OrchestratorConfig.load(p)
    assert [r.name for r in cfg.regions] == ["a", "b"] and cfg.policy.max_step == 5


def test_dry_run_prints_decisions_and_sets_no_weight(two_regions, capsys):
    _, rt, path = two_regions
    assert main(["--config", str(path), "--dry-run", "--rounds", "3", "--metrics-port", "0"]) == 0
    out = capsys.readouterr().out
    assert out.count("round ") == 3 and "shares a=50 b=50" in out and "hold" in out
    assert not [c for c in rt.commands if c.startswith("set weight")]
    assert rt.weights == {"a": 50, "b": 50}


def test_rounds_apply_weights_fail_out_and_shed(two_regions, tmp_path, caplog):
    units, rt, path = two_regions
    caplog.set_level(logging.INFO, logger="proxy.orchestrator")
    cfg = OrchestratorConfig.load(path)
    log = tmp_path / "decisions.jsonl"
    orch = Orchestrator(cfg, decisions_log=log)
    try:
        d = orch.round()
        assert d.shares == {"a": 50, "b": 50} and rt.weights == {"a": 50, "b": 50}
        assert "set weight regions/a 50" in rt.commands
        # region b slow: first tokens over the SLA for two rounds -> sheds to a
        for _ in range(2):
            units["b"].observe(slow=20, fast=80)
            units["a"].observe(slow=0, fast=100)
            d = orch.round()
        assert d.kinds["b"] == "shed_ttft" and rt.weights == {"a": 60, "b": 40}
        assert any("b 50->40 shed: ttft p99" in r.getMessage() for r in caplog.records)
        # region a's unit goes unhealthy -> out at once, whatever the step bound
        units["a"].healthy = False
        d = orch.round()
        assert rt.weights == {"a": 0, "b": 100} and d.kinds["a"] == "fail_out"
        assert "leader: unreachable" in d.reasons["a"]
        warn = [r for r in caplog.records if r.levelname == "WARNING" and "fail-out" in r.getMessage()]
        assert warn
        text = orch.metrics.render()
        assert 'rufus_orchestrator_share_percent{region="a"} 0' in text
        assert 'rufus_orchestrator_decisions_total{region="a",kind="fail_out"} 1' in text
        assert 'rufus_orchestrator_decisions_total{region="b",kind="shed_ttft"} 1' in text
        assert 'rufus_orchestrator_region_up{region="a"} 0' in text
        assert 'rufus_orchestrator_region_load_ratio{region="b"} 0.25' in text
        recs = [json.loads(line) for line in log.read_text().splitlines()]
        assert len(recs) == 4 and recs[-1]["shares"] == {"a": 0, "b": 100} and recs[-1]["applied"]
    finally:
        orch.close()


def test_a_restarted_orchestrator_continues_from_the_ingress_weights(two_regions):
    _, rt, path = two_regions
    rt.weights = {"a": 70, "b": 30}
    orch = Orchestrator(OrchestratorConfig.load(path))
    try:
        assert orch.state.shares == {"a": 70, "b": 30}
    finally:
        orch.close()


def test_weight_errors_are_reported_and_retried(two_regions, caplog):
    _, _, path = two_regions
    cfg = OrchestratorConfig.load(path)
    orch = Orchestrator(replace(cfg, backend="nope"))
    try:
        orch.round()
        assert any("could not set weights" in r.getMessage() for r in caplog.records)
        assert "rufus_orchestrator_apply_errors_total 1" in orch.metrics.render()
    finally:
        orch.close()


def test_unreachable_region_from_its_ingress_stats(tmp_path):
    units = FakeUnit()
    try:
        cfg = OrchestratorConfig.from_dict({"regions": [
            {"name": "a", "baseline": 1, "agents": [units.url]},
            {"name": "b", "baseline": 1, "ingress_stats": str(tmp_path / "missing.sock")}]})
        signals = Collector(cfg).collect()
        assert signals[0].up and signals[0].load == 0.25
        assert not signals[1].reachable and "ingress stats" in signals[1].detail
    finally:
        units.close()


def test_units_from_ingress_stats_without_agents(tmp_path):
    rt = FakeRuntime(tmp_path / "r.sock", "units_lor", {"unit0": 1, "unit1": 1})
    try:
        cfg = OrchestratorConfig.from_dict({"regions": [
            {"name": "a", "baseline": 1, "ingress_stats": str(tmp_path / "r.sock")}]})
        (s,) = Collector(cfg).collect()
        assert s.reachable and s.healthy_units == 2 and s.total_units == 2 and s.load == 0.0
    finally:
        rt.close()


def test_runtime_api_over_tcp():
    got: list[str] = []

    class H(socketserver.StreamRequestHandler):
        def handle(self) -> None:
            got.append(self.rfile.readline().decode().strip())
            self.wfile.write(b"\n")

    srv = socketserver.ThreadingTCPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        api = RuntimeAPI(f"127.0.0.1:{srv.server_address[1]}")
        assert api.is_tcp and not RuntimeAPI("/run/x.sock").is_tcp
        api.set_weight("regions", "a", 7)
        assert got == ["set weight regions/a 7"]
    finally:
        srv.shutdown()
        srv.server_close()


def test_histogram_window_and_counter_reset():
    t1 = parse_histogram(hist_text({"0.1": 5, "1.0": 9, "+Inf": 10}), "rufus_time_to_first_token_seconds",
                         "rufus_llm")
    t2 = parse_histogram(hist_text({"0.1": 6, "1.0": 10, "+Inf": 20}), "rufus_time_to_first_token_seconds",
                         "rufus_llm")
    assert t1 is not None and t2 is not None
    assert histogram_delta(t2, t1) == {0.1: 1.0, 1.0: 1.0, float("inf"): 10.0}
    assert histogram_delta(t1, t2) == t1  # went down: the leader restarted
    assert parse_histogram(hist_text({"0.1": 1}, model="other"), "rufus_time_to_first_token_seconds",
                           "rufus_llm") is None


def test_help_and_example_config(capsys, tmp_path):
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0 and "--dry-run" in capsys.readouterr().out
    assert main(["--print-example-config"]) == 0
    example = json.loads(capsys.readouterr().out)
    OrchestratorConfig.from_dict(example)  # the example is valid
    p = tmp_path / "bad.json"
    p.write_text('{"regions": []}')
    assert main(["--config", str(p), "--dry-run"]) == 2
    assert "regions: a non-empty list" in capsys.readouterr().err


@pytest.mark.skipif(shutil.which("haproxy") is None and not Path("/usr/sbin/haproxy").exists(),
                    reason="haproxy not installed (scripts/setup.sh proxy)")
def test_rendered_global_config_is_accepted_by_haproxy(tmp_path):
    from proxy.haproxy import check_config

    text = render_global([("a", "127.0.0.1:9001"), ("b", "127.0.0.1:9002")], {"a": 60, "b": 40},
                         port=9000, stats_socket=str(tmp_path / "g.sock"), bind="127.0.0.1")
    assert "balance roundrobin" in text and "server a 127.0.0.1:9001 proto h2 weight 60" in text
    (tmp_path / "g.cfg").write_text(text)
    check_config(tmp_path / "g.cfg")


# ----------------------------------------------------------------------- the simulation
def test_simulation_is_deterministic_and_the_orchestrator_beats_fixed_shares():
    from lab.fleet_sim import ServiceModel
    from lab.region_sim import Scenario, markdown, simulate

    sc = Scenario(scale=0.03, day_s=900.0, interval_s=10.0)
    model = ServiceModel.load()
    one = simulate(sc, model, seed=3)
    two = simulate(sc, model, seed=3)
    strip = [{k: v for k, v in r.items() if k != "timeline"} for r in one.rows]
    assert strip == [{k: v for k, v in r.items() if k != "timeline"} for r in two.rows]
    rows = {r["policy"]: r for r in one.rows}
    assert rows["orchestrator"]["dropped"] < rows["fixed_failover"]["dropped"] < rows["fixed"]["dropped"]
    burst = {p: r["burst"]["over_sla_or_dropped"] for p, r in rows.items()}
    assert burst["orchestrator"] < burst["fixed"]
    assert rows["orchestrator"]["fail_out_after_s"] <= sc.interval_s
    assert rows["orchestrator"]["timeline"] and "| orchestrator |" in markdown(one, sc)
