"""Ports for servers that bind them long after they are chosen (tritonserver: only once its
models loaded): drawn below the kernel's ephemeral range and never handed out twice, so
neither an outgoing connection nor a second server takes one meanwhile (:func:`free_port`)."""

from __future__ import annotations

import random
import socket
from pathlib import Path

_GIVEN_PORTS: set[int] = set()
_PORT_RANDOM = random.SystemRandom()  # not `random`'s state: a test that seeds it repeats none
_LOW_PORT = 20000  # servers' ports are drawn from here up to the kernel's ephemeral range


def _ephemeral_low() -> int:
    """The first port the kernel hands to outgoing connections (and to a bind to port 0)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port() -> int:
    """A free port for a server that binds it *later*: below the kernel's ephemeral range,
    free on every address now, and never handed out twice by this process.

    tritonserver binds its ports only after loading its models (a minute or more on 2
    cores), and every outgoing connection on the machine (the agents, a multi-node unit's
    Gloo sockets) takes its local port from the ephemeral range: a port drawn there was seen
    taken by such a connection when the server finally bound it ("failed to start Metrics
    service ... already in use", "No address added ... wildcard listeners"). The socket is
    closed again at once, so a later draw could return the same port: two servers (or one
    server's gRPC and HTTP ports) would then collide, for good across a supervisor's
    restarts, hence the set of ports given.
    """
    high = _ephemeral_low()
    for _ in range(200 if high - _LOW_PORT >= 1000 else 0):
        port = _PORT_RANDOM.randrange(_LOW_PORT, high)
        if port in _GIVEN_PORTS:
            continue
        with socket.socket() as s:
            try:
                s.bind(("0.0.0.0", port))
            except OSError:
                continue
        _GIVEN_PORTS.add(port)
        return port
    for _ in range(100):  # no room below the ephemeral range: the kernel's choice
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port not in _GIVEN_PORTS:
            _GIVEN_PORTS.add(port)
            return port
    raise RuntimeError("no free port that was not handed out before")
