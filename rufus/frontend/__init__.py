"""OpenAI-compatible HTTP API in front of Triton (its own process; see docs/architecture.md).

    python -m rufus.frontend --triton-url localhost:8001 --port 9000
"""
