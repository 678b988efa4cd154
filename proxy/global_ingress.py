"""The global ingress: the HAProxy in front of the regions' own ingresses. Its
configuration (:func:`render_global`, weights = the regions' shares) and the runtime API
the orchestrator sets those weights through (:class:`RuntimeAPI`, also how it reads a
region ingress's servers)."""

from __future__ import annotations

import socket
from collections.abc import Mapping, Sequence
from pathlib import Path

from proxy.haproxy import (
    HAProxy,
    Limits,
    defaults_section,
    global_section,
    grpc_frontend,
    per_source_table,
    runtime_exchange,
)


class RuntimeAPI(HAProxy):
    """The admin socket of an HAProxy this process did not start (the global ingress, a
    region's ingress). ``show stat`` parsing is :meth:`HAProxy.servers`; this adds TCP
    addresses (``host:port``, ``ipv4@host:port``) beside unix sockets."""

    def __init__(self, address: str, timeout_s: float = 3.0) -> None:
        super().__init__("", Path("."))
        self.address = address
        self.timeout_s = timeout_s

    @property
    def stats_socket(self) -> Path:
        return Path(self.address.removeprefix("unix:").removeprefix("unix@"))

    @property
    def is_tcp(self) -> bool:
        a = self.address.removeprefix("ipv4@")
        return not a.startswith(("/", "unix:", "unix@", ".")) and ":" in a

    def start(self) -> HAProxy:
        raise TypeError("RuntimeAPI talks to a running HAProxy; it starts nothing")

    def stop(self) -> None:
        return None

    def command(self, cmd: str) -> str:
        if not self.is_tcp:
            return super().command(cmd)
        host, _, port = self.address.removeprefix("ipv4@").rpartition(":")
        with socket.create_connection((host, int(port)), timeout=self.timeout_s) as s:
            return runtime_exchange(s, cmd)

    def set_weight(self, backend: str, server: str, weight: int) -> None:
        """HAProxy answers nothing on success and one line of error otherwise."""
        reply = self.command(f"set weight {backend}/{server} {weight}").strip()
        if reply:
            raise RuntimeError(f"set weight {backend}/{server} {weight}: {reply}")

    def weights(self, backend: str) -> dict[str, int]:
        rows = self.servers(backend)
        return {name: int(r.get("uweight") or r.get("weight") or 0) for name, r in rows.items()}


def render_global(regions: Sequence[tuple[str, str]], shares: Mapping[str, int], *, port: int,
                  stats_socket: str, bind: str = "0.0.0.0", backend: str = "regions",
                  limits: Limits = Limits(), l7_retry: bool = True) -> str:
    """haproxy.cfg of the global ingress: one gRPC frontend (the same allow-list and limits
    as a region's), weighted round robin over the regions' ingresses, weights = shares.

    Weighted round robin, not least connections: a share is a fraction of *requests*, and
    a region's own ingress already balances its units by outstanding requests. No health
    checks here: taking a region out is the orchestrator's decision (it sees units, not
    just a listening ingress). Until its next round, a region whose last unit just died
    answers 503 from its own ingress (no server) or resets the stream; the global ingress
    retries those on another region (``retry-on ... 503`` + ``redispatch``). That L7 retry
    needs the whole request in HAProxy's buffer before it is forwarded, so the ingress
    waits for the end of the request (``wait-for-body``). Our contract is one request per
    stream, half-closed with it (rufus.client, tritonclient's ``stream_infer`` with a
    finite iterator): measured, no added latency. A client that keeps one stream open for
    many requests never ends its request: it gets 408 after ``limits.http_request``;
    ``l7_retry=False`` serves such clients, and then the requests a dying region resets
    before the orchestrator's next round are lost (the kill drill lost some that way:
    docs/benchmarks.md). ``time`` is not short on purpose: HAProxy answers 408 when it
    expires, and a CPU-starved client was seen sending its message late.
    """
    if not regions:
        raise ValueError("no regions")
    out = [*global_section(limits, stats_socket), "", *defaults_section(limits), "",
           *grpc_frontend("grpc_global", f"{bind}:{port}", backend, limits), "",
           *per_source_table(limits), "",
           f"backend {backend}",
           "    # each server is a region's ingress; its weight is the region's share of global",
           "    # traffic, set at run time by python -m proxy.orchestrator (set weight)",
           "    balance roundrobin"]
    if l7_retry:
        out += ["    # a region that just lost its units answers 503 (no server) or resets the",
                "    # stream until the orchestrator's next round: send the request to another",
                "    # region. A retry needs the whole request in the buffer: wait for the end of",
                "    # the request (one request per stream, half-closed with it: our client);",
                "    # bounded like a slow client's headers, and HAProxy answers 408 on expiry",
                "    retry-on conn-failure empty-response junk-response 502 503 504",
                f"    http-request wait-for-body time {limits.http_request}"]
    for name, addr in regions:
        out.append(f"    server {name} {addr} proto h2 weight {int(shares.get(name, 0))}")
    return "\n".join(out) + "\n"
