"""Entrypoint: ``python -m follower`` (configuration from the environment only)."""

import sys

from follower.node import main

if __name__ == "__main__":  # vLLM spawns workers: the guard is required
    sys.exit(main())
