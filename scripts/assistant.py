r"""Ask the shopping assistant: product cards first, then the streamed answer.

    python scripts/assistant.py "running shoes under \$80"
    python scripts/assistant.py "any under \$60?" --history '[{"role": "user", "content": "running shoes"}]'
    python scripts/assistant.py --local "65 inch tv"    # pipeline in this process, models on the server

By default the Triton model ``rufus_assistant`` runs the pipeline (gRPC streaming, GRPC_PORT
of ``make serve``); ``--local`` runs rufus.assistant here against the same server's planner
and answer model, with the index from scripts/build_catalog.py.
"""

from rufus.assistant.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
