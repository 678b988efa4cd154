"""BufferedMetrics replays hot-path updates into the real sink off the event loop."""

from rufus.serving.metrics import BufferedMetrics, Metrics


class Recorder(Metrics):
    def __init__(self):
        self.calls = []
        self.closed = False

    def observe_ttft(self, seconds):
        self.calls.append(("ttft", seconds))

    def add_tokens(self, prompt, generation):
        self.calls.append(("tokens", prompt, generation))

    def set_outstanding(self, n):
        self.calls.append(("outstanding", n))

    def close(self):
        self.closed = True


def test_events_kept_in_order_gauges_keep_latest_value():
    rec = Recorder()
    m = BufferedMetrics(rec, interval=60)  # flush only on close
    m.observe_ttft(0.1)
    m.set_outstanding(3)
    m.add_tokens(5, 7)
    m.set_outstanding(1)
    assert rec.calls == []  # nothing reached the sink on the hot path
    m.close()
    assert rec.calls == [("ttft", 0.1), ("tokens", 5, 7), ("outstanding", 1)]
    assert rec.closed
