"""Follower node of a multi-node inference unit (``python -m follower``).

Runs vLLM's own headless multi-node worker (the path of ``vllm serve --headless``) with the
leader's engine configuration, plus our control channel (rufus/multinode/control.py) and a ``/health``
endpoint for the proxy layer.
"""
