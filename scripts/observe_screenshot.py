"""PNGs of what `make observe` shows: Phoenix's traces page and a Prometheus graph.

    .venv/bin/python scripts/observe_screenshot.py [DIR] [--project default] [--expr up]

First checks through Phoenix's API that the project holds spans (and prints their trace ids),
so the picture is never of an empty page; then headless chromium (Debian's package,
installed as root where missing) writes DIR/phoenix-traces.png and DIR/prometheus-graph.png
(default DIR: build/observe/screenshots). Same as
`python -m rufus.launch.observe screenshot`.
"""

import sys

from rufus.launch.observe import main

if __name__ == "__main__":
    raise SystemExit(main(["screenshot", *sys.argv[1:]]))
