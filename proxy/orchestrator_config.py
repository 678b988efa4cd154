"""The orchestrator's configuration: the regions (where each one's monitoring is, which
global-ingress server carries it, its baseline share) and the policy's thresholds, read
from JSON or TOML and validated with every wrong entry named (``python -m proxy.orchestrator
--print-example-config`` prints :data:`EXAMPLE_CONFIG`)."""

from __future__ import annotations

import json
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from proxy.orchestrator_policy import PolicyConfig


@dataclass(frozen=True)
class RegionConfig:
    """One region: where its monitoring is, and which global-ingress server carries it."""

    name: str
    baseline: float  # operator-set share (any scale: normalized over regions)
    agents: tuple[str, ...] = ()  # unit agent base URLs, http://host:port
    metrics: tuple[str, ...] = ()  # unit leaders' Prometheus URLs (first-token latency)
    ingress_stats: str = ""  # region HAProxy admin socket: /path, unix:/path or host:port
    ingress_backend: str = "units_lor"
    ingress: str = ""  # the region ingress's gRPC host:port (only to render the global config)
    server: str = ""  # server name in the global backend (default: the region name)
    slots_per_unit: int = 8  # requests a unit runs at once (max_num_seqs): load = outstanding / slots

    @property
    def server_name(self) -> str:
        return self.server or self.name


@dataclass(frozen=True)
class OrchestratorConfig:
    regions: tuple[RegionConfig, ...]
    runtime_api: str = ""  # the global ingress's admin socket
    backend: str = "regions"  # the global ingress's backend whose server weights we set
    interval_s: float = 5.0
    model: str = "rufus_llm"  # whose first-token histogram counts
    probe_timeout_s: float = 1.0
    ttft_window_rounds: int = 1  # p50/p99 over the observations of the last N rounds
    policy: PolicyConfig = field(default_factory=PolicyConfig)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> OrchestratorConfig:
        """Validated; a wrong entry is named (``regions[1].agents: ...``)."""
        known = {f.name for f in fields(cls)}
        extra = set(d) - known
        if extra:
            raise ValueError(f"unknown config keys {sorted(extra)} (known: {sorted(known)})")
        raw_regions = d.get("regions")
        if not isinstance(raw_regions, list) or not raw_regions:
            raise ValueError("regions: a non-empty list of regions is required")
        regions = []
        rkeys = {f.name for f in fields(RegionConfig)}
        for i, r in enumerate(raw_regions):
            where = f"regions[{i}]"
            if not isinstance(r, dict):
                raise ValueError(f"{where}: expected a table/object")
            bad = set(r) - rkeys
            if bad:
                raise ValueError(f"{where}: unknown keys {sorted(bad)} (known: {sorted(rkeys)})")
            if not r.get("name"):
                raise ValueError(f"{where}.name: required")
            try:
                baseline = float(r.get("baseline", 0))
            except (TypeError, ValueError):
                raise ValueError(f"{where}.baseline: expected a number") from None
            if baseline <= 0:
                raise ValueError(f"{where}.baseline: must be > 0 (the operator's share)")
            for key in ("agents", "metrics"):
                if not isinstance(r.get(key, []), list):
                    raise ValueError(f"{where}.{key}: expected a list of URLs")
            rc = RegionConfig(
                name=str(r["name"]), baseline=baseline,
                agents=tuple(str(a).rstrip("/") for a in r.get("agents", [])),
                metrics=tuple(str(m) for m in r.get("metrics", [])),
                ingress_stats=str(r.get("ingress_stats", "")),
                ingress_backend=str(r.get("ingress_backend", "units_lor")),
                ingress=str(r.get("ingress", "")), server=str(r.get("server", "")),
                slots_per_unit=int(r.get("slots_per_unit", 8)))
            if not rc.agents and not rc.ingress_stats:
                raise ValueError(f"{where}: give its unit agents or its ingress_stats (or both)")
            if rc.slots_per_unit < 1:
                raise ValueError(f"{where}.slots_per_unit: must be >= 1")
            regions.append(rc)
        names = [r.name for r in regions]
        if len(set(names)) != len(names):
            raise ValueError(f"regions: names must be unique, got {names}")
        policy = d.get("policy", {})
        if not isinstance(policy, dict):
            raise ValueError("policy: expected a table/object")
        pkeys = {f.name for f in fields(PolicyConfig)}
        if set(policy) - pkeys:
            raise ValueError(f"policy: unknown keys {sorted(set(policy) - pkeys)} (known: {sorted(pkeys)})")
        out = cls(regions=tuple(regions), runtime_api=str(d.get("runtime_api", "")),
                  backend=str(d.get("backend", "regions")),
                  interval_s=float(d.get("interval_s", 5.0)), model=str(d.get("model", "rufus_llm")),
                  probe_timeout_s=float(d.get("probe_timeout_s", 1.0)),
                  ttft_window_rounds=int(d.get("ttft_window_rounds", 1)),
                  policy=PolicyConfig(**policy))
        if out.interval_s <= 0 or out.probe_timeout_s <= 0 or out.ttft_window_rounds < 1:
            raise ValueError("interval_s and probe_timeout_s must be > 0, ttft_window_rounds >= 1")
        return out

    @classmethod
    def load(cls, path: Path) -> OrchestratorConfig:
        text = Path(path).read_text()
        data = tomllib.loads(text) if str(path).endswith(".toml") else json.loads(text)
        return cls.from_dict(data)


EXAMPLE_CONFIG: dict[str, Any] = {
    "runtime_api": "unix:/run/haproxy/global.sock",
    "backend": "regions",
    "interval_s": 5,
    "model": "rufus_llm",
    "regions": [
        {"name": "us-east", "baseline": 40, "ingress": "10.1.0.10:8001",
         "agents": ["http://10.1.0.21:8090", "http://10.1.0.22:8090"],
         "metrics": ["http://10.1.0.21:8002/metrics", "http://10.1.0.22:8002/metrics"],
         "ingress_stats": "10.1.0.10:9999", "slots_per_unit": 8},
        {"name": "us-west", "baseline": 35, "ingress": "10.2.0.10:8001",
         "agents": ["http://10.2.0.21:8090"], "metrics": ["http://10.2.0.21:8002/metrics"]},
        {"name": "eu-west", "baseline": 25, "ingress": "10.3.0.10:8001",
         "ingress_stats": "10.3.0.10:9999"},
    ],
    "policy": {f.name: getattr(PolicyConfig(), f.name) for f in fields(PolicyConfig)},
}
