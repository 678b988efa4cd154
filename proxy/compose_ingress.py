"""The deployment flavor of the ingress's haproxy.cfg (docker/compose.yaml mounts the
rendered proxy/haproxy/haproxy.cfg): units by the compose rig's service names, resolved
through Docker's DNS, health-checked through their agents. proxy/haproxy.py holds the parts
both flavors share and renders the local fleet's.

    python -m proxy.compose_ingress > proxy/haproxy/haproxy.cfg
    python -m proxy.compose_ingress --unit GRPC,HTTP,AGENT ...   # other names, one per unit
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from proxy.haproxy import (
    BALANCE,
    HTTP_RETRY,
    PANIC_COMMENT,
    PANIC_SUFFIX,
    Limits,
    _affinity_backend,
    _http_frontend,
    defaults_section,
    global_section,
    grpc_frontend,
    per_source_table,
)

_DNS = "resolvers docker init-addr last,libc,none"
_DUP = "resolve-opts allow-dup-ip"


@dataclass(frozen=True)
class UnitAddress:
    """Where the ingress reaches one unit: its leader's gRPC and HTTP, its agent (host:port)."""

    grpc: str
    http: str
    agent: str


def compose_units(n_units: int) -> list[UnitAddress]:
    """The compose rig's units by service name (docker/compose.yaml): unit 0 is ``leader`` and
    ``agent``, unit i > 0 ``leader-b``, ``agent-b``, ... on the contract's ports."""
    out = []
    for i in range(n_units):
        suffix = "" if i == 0 else f"-{chr(ord('a') + i)}"
        out.append(UnitAddress(f"leader{suffix}:8001", f"leader{suffix}:8000",
                               f"agent{suffix}:8090"))
    return out


def render_compose(n_units: int = 2, *, grpc_port: int = 8001, http_port: int = 8000,
                   stats_port: int = 8404, agent_check_port: int = 8091,
                   check_inter_ms: int = 1000, limits: Limits = Limits(),
                   units: list[UnitAddress] | None = None) -> str:
    """The checked-in proxy/haproxy/haproxy.cfg: the deployment flavor (docker/compose.yaml).

    Units are addressed by name (``units``, default the compose rig's service names,
    :func:`compose_units`), resolved through Docker's DNS; clients reach gRPC on
    ``grpc_port`` and Triton HTTP on ``http_port`` (Triton's own ports, so clients do not
    change). A deployment with other names renders its own (``--unit GRPC,HTTP,AGENT``, repeated).
    The agent runs on its own host there, and HAProxy cannot split a ``host:port``
    address into the check address and port, so health is checked on one server per unit
    *agent* (backend ``unit_health``) and the data-path servers ``track`` it: an agent
    ``down`` or a failed ``/health`` takes the unit out of both frontends at once. Trade-off:
    the agent's *weight* stays on the tracked server (HAProxy does not propagate weights), so
    here routing is plain leastconn on HAProxy's own stream counts; the local fleet, whose
    agents share the leader's host, uses :func:`render` and gets the weights too.
    Only inference, health and metadata pass either frontend (SECURITY.md).
    """
    units = units if units is not None else compose_units(n_units)
    n_units = len(units)
    if n_units < 1:
        raise ValueError("no units to balance")
    out = _compose_sections(grpc_port, http_port, stats_port, check_inter_ms, limits)
    for i in range(n_units):
        out.append(f"    server unit{i} {units[i].agent} check agent-check "
                   f"agent-port {agent_check_port} {_DNS}")
    for name, affinity, kind, proto in (("units_lor", "units_affinity", "grpc", " proto h2"),
                                        ("units_http", "units_http_affinity", "http", "")):
        # a unit's panic server has its primary's name and address: HAProxy's resolver
        # gives each address of a name to one server of a backend unless told otherwise,
        # and kept the panic servers in MAINT (resolution) for good (allow-dup-ip)
        dup = f" {_DUP}" if n_units > 1 else ""
        servers = [f"    server unit{i} {getattr(units[i], kind)}{proto} "
                   f"track unit_health/unit{i} {_DNS}{dup}" for i in range(n_units)]
        if n_units > 1:
            servers += [*PANIC_COMMENT, "    option allbackups"] + [
                f"    server unit{i}{PANIC_SUFFIX} {getattr(units[i], kind)}{proto} backup "
                f"{_DNS}{dup}" for i in range(n_units)]
        retry = HTTP_RETRY if kind == "http" else []
        out += ["", f"backend {name}",
                "    # least outstanding requests: HAProxy counts in-flight streams per unit itself",
                f"    balance {BALANCE}", *retry, *servers,
                "", *_affinity_backend(affinity, servers, retry)]
    return "\n".join(out) + "\n"


def _compose_sections(grpc_port: int, http_port: int, stats_port: int, check_inter_ms: int,
                      limits: Limits) -> list[str]:
    """Everything but the unit servers: global and defaults, Docker's resolver, the two
    frontends and stats, the per-source table and the agents' health backend's header."""
    return [
        "# Rendered by `python -m proxy.compose_ingress`; do not edit by hand.",
        "# Units by the compose rig's service names, resolved through Docker's DNS.",
        *global_section(limits), "", *defaults_section(limits), "",
        "resolvers docker",
        "    # Docker's embedded DNS: a unit's containers get a new address when they are",
        "    # recreated (rolling update, restart); HAProxy follows it instead of keeping the",
        "    # address it resolved at start",
        "    nameserver dns 127.0.0.11:53",
        "    hold valid 1s",
        "    hold nx 1s",
        "    hold obsolete 5s",
        "", *grpc_frontend("grpc_lor", f":{grpc_port}", "units_lor", limits,
                            affinity="units_affinity"), "",
        *_http_frontend("triton_http", f":{http_port}", "units_http", limits,
                        affinity="units_http_affinity"), "",
        "frontend stats",
        "    # read-only state for operators and scripts/rolling_update.sh (which unit is in",
        "    # rotation); compose publishes it on 127.0.0.1 only",
        f"    bind :{stats_port}",
        "    http-request use-service prometheus-exporter if { path /metrics }",
        "    stats enable",
        "    stats uri /stats",
        "",
        *per_source_table(limits), "",
        "backend unit_health",
        "    # one server per unit agent: GET /health (200 iff every node of the unit is ready)",
        "    # and the agent-check line ('down #why' takes the unit out at once)",
        "    option httpchk",
        "    http-check send meth GET uri /health",
        "    http-check expect status 200",
        "    # an agent that answers slowly because its host is busy (a cell next door starting)",
        "    # is not a dead unit: a longer check timeout and a third failure before DOWN; a",
        "    # unit that fails answers 'down' to the agent-check, which takes it out at once",
        "    timeout check 2s",
        f"    default-server inter {check_inter_ms}ms fastinter 500ms downinter {check_inter_ms}ms "
        f"fall 3 rise 2 agent-inter {check_inter_ms}ms",
    ]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m proxy.compose_ingress", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--units", type=int, default=2, help="units of the compose rig (2)")
    ap.add_argument("--unit", action="append", default=[], metavar="GRPC,HTTP,AGENT",
                    help="one unit's host:port addresses (repeat per unit; default: the "
                         "compose rig's service names)")
    a = ap.parse_args(argv)
    parts = [u.split(",") for u in a.unit]
    if any(len(p) != 3 or not all(p) for p in parts):
        ap.error("--unit: three host:port addresses, GRPC,HTTP,AGENT")
    print(render_compose(a.units, units=[UnitAddress(*p) for p in parts] or None), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
