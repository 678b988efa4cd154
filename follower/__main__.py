"""Entrypoint: ``python -m follower`` (configuration from the environment only; ``--help``
lists the variables)."""

import sys

from rufus.env import exits_on_env_error


@exits_on_env_error
def _run() -> int:
    from follower.node import main  # reads its settings once, when it starts

    return main()


if __name__ == "__main__":  # vLLM spawns workers: the guard is required
    sys.exit(_run())
