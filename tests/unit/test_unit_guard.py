"""docker/unit_guard.py against a local HTTP endpoint whose answer the test sets: a unit that
formed and broke stops its node (exit 75); so does one whose URL was up and then failed
before the whole unit was ever seen up (the rig's leader-crash hang on CI); a URL that never
answered 200 enforces nothing but the startup timeout."""

from __future__ import annotations

import importlib.util
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("unit_guard", ROOT / "docker/unit_guard.py")
guard = importlib.util.module_from_spec(spec)
spec.loader.exec_module(guard)  # type: ignore[union-attr]


class Endpoint:
    """GET /<name> answers what ``status[name]`` says (default 503)."""

    def __init__(self) -> None:
        self.status: dict[str, int] = {}
        ep = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.send_response(ep.status.get(self.path.strip("/"), 503))
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/{name}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def ep():
    """The endpoint; the guard's signal handlers are taken back off afterwards."""
    import signal

    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    e = Endpoint()
    yield e
    e.close()
    for sig, handler in saved.items():
        signal.signal(sig, handler)


def run_guard(ep: Endpoint, *extra: str, script: list[tuple[float, dict[str, int]]],
              timeout: float = 30.0) -> int:
    """Run the guard over ``sleep 60`` while a thread applies ``script`` ((delay, status
    changes) in order); its exit code."""
    def apply() -> None:
        import time
        for delay, change in script:
            time.sleep(delay)
            ep.status.update(change)

    threading.Thread(target=apply, daemon=True).start()
    return guard.main(["--watch", ep.url("self"), "--watch", ep.url("peer"), "--period", "0.1",
                       "--failures", "3", "--grace", "2", *extra, "--",
                       sys.executable, "-c", "import time; time.sleep(60)"])


def test_a_formed_unit_that_breaks_stops_the_node(ep):
    rc = run_guard(ep, script=[(0.0, {"self": 200, "peer": 200}), (0.5, {"peer": 503})])
    assert rc == guard.EXIT_UNIT_BROKEN


def test_a_url_up_then_down_before_the_unit_formed_stops_the_node(ep):
    # the leader's model was ready, its follower never seen healthy by the guard, then the
    # model unloads (the unit broke): without this the node waits out the startup timeout
    rc = run_guard(ep, "--startup-timeout", "600",
                   script=[(0.0, {"self": 200}), (0.5, {"self": 503})])
    assert rc == guard.EXIT_UNIT_BROKEN


def test_nothing_up_yet_enforces_only_the_startup_timeout(ep):
    import time

    t0 = time.monotonic()
    rc = run_guard(ep, "--startup-timeout", "1.5", script=[])
    assert rc == guard.EXIT_UNIT_BROKEN and time.monotonic() - t0 >= 1.5


def test_the_command_exiting_is_the_guards_exit(ep):
    rc = guard.main(["--watch", ep.url("self"), "--period", "0.1", "--",
                     sys.executable, "-c", "raise SystemExit(4)"])
    assert rc == 4
