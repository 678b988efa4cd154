"""The one reader of Prometheus text exposition here: the unit agent reads its leader's
load, capacity and engine gauges with it (proxy/capacity.py, proxy/probes.py), the
orchestrator the leaders' first-token histograms (proxy/orchestrator_signals.py)."""

from __future__ import annotations

from collections.abc import Iterator


def prometheus_samples(text: str) -> Iterator[tuple[str, dict[str, str], float]]:
    """(metric name, labels, value) of each sample line in Prometheus text; comments and
    lines whose value does not parse are skipped."""
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        head, _, value = line.rpartition(" ")
        try:
            v = float(value)
        except ValueError:
            continue
        yield head.split("{", 1)[0], dict(prometheus_labels(head)), v


def prometheus_labels(head: str) -> list[tuple[str, str]]:
    if "{" not in head:
        return []
    inner = head[head.index("{") + 1: head.rindex("}")]
    out = []
    for part in inner.split(","):
        if "=" in part:
            k, _, v = part.partition("=")
            out.append((k.strip(), v.strip().strip('"')))
    return out
